/*
 * The ZeroMQ lookup client (include/kvpool/kv_connector.h, "Lookup service
 * over ZeroMQ"): vLLM's LookupKeyClient in C.
 *
 * One I/O thread owns the REQ socket and runs one RPC at a time, in the
 * order the jobs were queued (the original's one-worker ThreadPoolExecutor).
 * Callers never touch the socket: they queue a job and, unless non_block
 * says not to, wait for it.  A job's life is
 *
 *     NEW -> QUEUED --(the I/O thread takes it)--> RUNNING --(reply/error)--> DONE
 *                  \--(discarded)--> CANCELLED
 *
 * set only by job_set_state() under the client's mutex (NEW -> RUNNING: a
 * blocking caller runs it itself, below).  LOOKUP jobs are kept
 * in `table` by request id (the original's futures dict): the first call for
 * an id queues one, later calls find it and ignore their arguments; the call
 * that sees it DONE takes the answer and deletes it.  discard() removes the
 * entry: a QUEUED job is dropped from the queue at once (cancelled); a
 * RUNNING one cannot be stopped mid-RPC (neither can a running Python
 * future), so it is marked `orphan` and the I/O thread frees it when done.
 * RESET and one-off queries are jobs outside the table, waited for at once.
 *
 * A caller that would only wait (a blocking lookup, a query, a reset) runs
 * its RPC itself when the socket is idle and nothing is queued: the socket
 * is still used by one thread at a time (`busy`, under the mutex, which
 * also orders the socket's memory between threads, as libzmq requires of a
 * socket that changes threads), and the RPC saves the two thread hand-offs
 * (to the I/O thread and back) that cost about as much as the round trip
 * itself on a small machine.  Requests for one id come from one thread (the
 * scheduler's), as in the original.
 *
 * Deadlines.  Every RPC has timeout_ms for send and receive together (poll).
 * REQ is a strict send/receive state machine, so after a timeout or an error
 * the socket cannot be reused: it is closed with ZMQ_LINGER 0 (the unsent
 * request dies with it) and a new one connects to the same endpoint, which
 * also reaches a server that came back.  A job that failed answers a hit of
 * 0 (logged), as the original's "except Exception: return 0".
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/assert.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sized.h"
#include "common/strmap.h"
#include "common/thread.h"
#include "kv/kv_lookup_wire.h"
#include "kvpool/kv_connector.h"

typedef enum { JOB_LOOKUP, JOB_QUERY, JOB_RESET } job_kind_t;
typedef enum { JOB_NEW, JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_CANCELLED } job_state_t;

typedef struct job {
    job_kind_t kind;
    job_state_t state;
    bool orphan;          /* discarded while RUNNING: the I/O thread frees it */
    struct job *next;     /* the queue */
    char *id;             /* LOOKUP: the table key (owned, id_len + 1 bytes) */
    size_t id_len;
    uint8_t hdr[6];       /* u32 num_tokens, u16 hash_len */
    uint8_t *hashes;      /* owned copy */
    size_t hashes_len;
    kvp_status_t st;      /* DONE: the RPC's outcome */
    int64_t hit;          /* DONE + KVP_OK: LOOKUP/QUERY */
    bool ack;             /* DONE + KVP_OK: RESET */
} job_t;

struct kvp_kv_lookup_zmq {
    char *endpoint;
    uint32_t timeout_ms;
    bool send_eagle;
    uint8_t eagle;
    uint32_t max_inflight;
    void *zctx;
    void *sock;           /* I/O thread only (and create/destroy) */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work;  /* the I/O thread waits for a job */
    pthread_cond_t done;  /* callers wait for theirs */
    job_t *head, *tail;   /* QUEUED jobs, FIFO */
    kvp__strmap_t table;  /* req id -> LOOKUP job */
    bool stopping;
    bool busy;            /* an RPC is running (see execute) */
    uint64_t inflight;    /* LOOKUP/QUERY jobs QUEUED or RUNNING */
    _Atomic uint64_t lookups, errors, timeouts, reconnects;
};

/* ------------------------------------------------------------------- jobs */

/* The one setter of a job's state (client mutex held); it also keeps the
 * count of lookups in flight (leaving NEW: one more; reaching DONE or
 * CANCELLED: one less).  The legal moves:
 *   NEW -> QUEUED | RUNNING (run in the caller),  QUEUED -> RUNNING | CANCELLED,
 *   RUNNING -> DONE. */
static void job_set_state(kvp_kv_lookup_zmq_t *c, job_t *j, job_state_t to)
{
    static const unsigned legal[] = {
        [JOB_NEW] = 1u << JOB_QUEUED | 1u << JOB_RUNNING,
        [JOB_QUEUED] = 1u << JOB_RUNNING | 1u << JOB_CANCELLED,
        [JOB_RUNNING] = 1u << JOB_DONE,
        [JOB_DONE] = 0,
        [JOB_CANCELLED] = 0,
    };
    kvp__assert(legal[j->state] & 1u << to);
    if (j->kind != JOB_RESET) {
        if (j->state == JOB_NEW)
            c->inflight++;
        if (to == JOB_DONE || to == JOB_CANCELLED)
            c->inflight--;
    }
    j->state = to;
}

static void job_free(job_t *j)
{
    if (j->id)
        kvp__free(j->id, j->id_len + 1);
    if (j->hashes)
        kvp__free(j->hashes, j->hashes_len);
    kvp__free(j, sizeof *j);
}

static void enqueue(kvp_kv_lookup_zmq_t *c, job_t *j)
{
    job_set_state(c, j, JOB_QUEUED);
    j->next = NULL;
    if (c->tail)
        c->tail->next = j;
    else
        c->head = j;
    c->tail = j;
    pthread_cond_signal(&c->work);
}

static void unqueue(kvp_kv_lookup_zmq_t *c, job_t *j)
{
    job_t **pp = &c->head, *prev = NULL;
    while (*pp && *pp != j) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return;
    *pp = j->next;
    if (c->tail == j)
        c->tail = prev;
    job_set_state(c, j, JOB_CANCELLED);
}

/* A LOOKUP/QUERY job of the request's wire frames into *j_p: KVP_OK;
 * KVP_ERR_INVALID_ARG when they do not fit the wire (logged);
 * KVP_ERR_NO_MEMORY. */
static kvp_status_t lookup_job(job_kind_t kind, const char *id, int64_t num_tokens,
                               const uint8_t *hashes, size_t num_hashes, uint32_t hash_len,
                               job_t **j_p)
{
    *j_p = NULL;
    if (num_tokens < 0 || num_tokens > (int64_t)UINT32_MAX || hash_len > UINT16_MAX ||
        (num_hashes && !hashes) || num_hashes > SIZE_MAX / (hash_len ? hash_len : 1)) {
        kvp_warn_rl("kv lookup client: %s: %lld tokens, %zu hashes of %u bytes do not fit the wire",
                    id ? id : "query", (long long)num_tokens, num_hashes, hash_len);
        return KVP_ERR_INVALID_ARG;
    }
    job_t *j = kvp__calloc(1, sizeof *j);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    j->kind = kind;
    j->hashes_len = hash_len ? num_hashes * hash_len : 0;
    if (id) {
        j->id_len = strlen(id);
        j->id = kvp__malloc(j->id_len + 1);
        if (j->id)
            memcpy(j->id, id, j->id_len + 1);
    }
    if (j->hashes_len)
        j->hashes = kvp__malloc(j->hashes_len);
    if ((id && !j->id) || (j->hashes_len && !j->hashes)) {
        job_free(j);
        return KVP_ERR_NO_MEMORY;
    }
    if (j->hashes_len)
        memcpy(j->hashes, hashes, j->hashes_len);
    kvp__lw_put_u32(j->hdr, (uint32_t)num_tokens);
    kvp__lw_put_u16(j->hdr + 4, (uint16_t)hash_len);
    *j_p = j;
    return KVP_OK;
}

/* ------------------------------------------------------------- the socket */

static void *new_socket(kvp_kv_lookup_zmq_t *c)
{
    void *s = zmq_socket(c->zctx, ZMQ_REQ);
    if (!s)
        return NULL;
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(s, c->endpoint) != 0) {
        kvp_error("kv lookup client: connect %s: %s", c->endpoint, zmq_strerror(zmq_errno()));
        zmq_close(s);
        return NULL;
    }
    return s;
}

/* Waits for `events` on the socket until deadline_ns: 0, or a status. */
static kvp_status_t wait_for(void *sock, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvp__now_ns();
        if (now >= deadline_ns)
            return KVP_ERR_TIMEOUT;
        zmq_pollitem_t it = {sock, 0, events, 0};
        long ms = (long)((deadline_ns - now + 999999) / 1000000);
        int r = zmq_poll(&it, 1, ms);
        if (r > 0)
            return KVP_OK;
        if (r < 0 && zmq_errno() != EINTR)
            return KVP_ERR_IO;
    }
}

static kvp_status_t send_frame(void *sock, const void *data, size_t len, bool more,
                               uint64_t deadline_ns)
{
    for (;;) {
        if (zmq_send(sock, data, len, ZMQ_DONTWAIT | (more ? ZMQ_SNDMORE : 0)) >= 0)
            return KVP_OK;
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
            return KVP_ERR_IO;
        kvp_status_t st = wait_for(sock, ZMQ_POLLOUT, deadline_ns);
        if (st != KVP_OK)
            return st;
    }
}

/* One RPC of job j on the socket (I/O thread; no lock held). */
static kvp_status_t rpc(kvp_kv_lookup_zmq_t *c, job_t *j)
{
    if (!c->sock && !(c->sock = new_socket(c)))
        return KVP_ERR_IO;
    uint64_t deadline = kvp__now_ns() + (uint64_t)c->timeout_ms * 1000000u;
    kvp_status_t st;
    if (j->kind == JOB_RESET) {
        st = send_frame(c->sock, KVP__LW_TAG_RESET, strlen(KVP__LW_TAG_RESET), false, deadline);
    } else {
        st = send_frame(c->sock, KVP__LW_TAG_LOOKUP, strlen(KVP__LW_TAG_LOOKUP), true, deadline);
        if (st == KVP_OK)
            st = send_frame(c->sock, j->hdr, 4, true, deadline);
        if (st == KVP_OK)
            st = send_frame(c->sock, j->hdr + 4, 2, true, deadline);
        if (st == KVP_OK)
            st = send_frame(c->sock, j->hashes, j->hashes_len, c->send_eagle, deadline);
        if (st == KVP_OK && c->send_eagle)
            st = send_frame(c->sock, &c->eagle, 1, false, deadline);
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (st == KVP_OK)
        st = wait_for(c->sock, ZMQ_POLLIN, deadline);
    if (st == KVP_OK && zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) < 0)
        st = KVP_ERR_IO;
    /* A REQ socket that did not complete send + receive is mid-exchange, and
     * one that got a multipart reply (never ours) too: both are replaced
     * (see the top).  A one-frame bad reply leaves it in step. */
    bool replace = st != KVP_OK;
    if (st == KVP_OK && zmq_msg_more(&m)) {
        st = KVP_ERR_DECODE;
        replace = true;
    } else if (st == KVP_OK) {
        const uint8_t *d = zmq_msg_data(&m);
        size_t n = zmq_msg_size(&m);
        st = j->kind == JOB_RESET ? kvp__lw_decode_ack(d, n, &j->ack)
                                  : kvp__lw_decode_hit(d, n, &j->hit);
    }
    if (st == KVP_ERR_DECODE)
        kvp_warn_rl("kv lookup client: %s: bad reply of %zu bytes", c->endpoint, zmq_msg_size(&m));
    zmq_msg_close(&m);
    if (replace) {
        zmq_close(c->sock);
        c->sock = new_socket(c);
        atomic_fetch_add_explicit(&c->reconnects, 1, memory_order_relaxed);
    }
    if (st == KVP_ERR_TIMEOUT)
        atomic_fetch_add_explicit(&c->timeouts, 1, memory_order_relaxed);
    return st;
}

/* Runs j's RPC: entered and left with the mutex held, released meanwhile.
 * `busy` keeps the socket to one RPC at a time, whichever thread runs it. */
static void execute(kvp_kv_lookup_zmq_t *c, job_t *j)
{
    c->busy = true;
    job_set_state(c, j, JOB_RUNNING);
    pthread_mutex_unlock(&c->mu);
    kvp_status_t st = rpc(c, j);
    if (j->kind != JOB_RESET)
        atomic_fetch_add_explicit(&c->lookups, 1, memory_order_relaxed);
    if (st != KVP_OK)
        atomic_fetch_add_explicit(&c->errors, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->mu);
    j->st = st;
    c->busy = false;
    job_set_state(c, j, JOB_DONE);
    pthread_cond_broadcast(&c->done);
    if (c->head)
        pthread_cond_signal(&c->work);
}

/* Queues j for the I/O thread -- or, for a caller that would only wait for
 * it, runs it here when the socket is idle and nothing is queued (see the
 * top: two thread hand-offs fewer per blocking RPC).  Mutex held. */
static void submit(kvp_kv_lookup_zmq_t *c, job_t *j, bool may_inline)
{
    if (!may_inline || c->busy || c->head) {
        enqueue(c, j);
        return;
    }
    execute(c, j);
}

static void *io_main(void *arg)
{
    kvp_kv_lookup_zmq_t *c = arg;
    kvp__thread_name("kvp-kv-lkp-io");
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while ((!c->head || c->busy) && !c->stopping)
            pthread_cond_wait(&c->work, &c->mu);
        if (!c->head)
            break; /* stopping, nothing left */
        job_t *j = c->head;
        c->head = j->next;
        if (!c->head)
            c->tail = NULL;
        execute(c, j);
        if (j->orphan)
            job_free(j);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Waits until j is DONE (mutex held). */
static void wait_done(kvp_kv_lookup_zmq_t *c, job_t *j)
{
    while (j->state != JOB_DONE)
        pthread_cond_wait(&c->done, &c->mu);
}

/* ------------------------------------------------------------ the client */

static kvp_status_t zmq_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block,
                               int64_t *hit_p)
{
    kvp_kv_lookup_zmq_t *c = ctx;
    if (!req || !req->req_id || !hit_p)
        return KVP_ERR_NULL_POINTER;
    *hit_p = 0;
    size_t id_len = strlen(req->req_id);
    pthread_mutex_lock(&c->mu);
    job_t *j = kvp__strmap_get(&c->table, req->req_id, id_len);
    if (!j) {
        if (c->inflight >= c->max_inflight) {
            pthread_mutex_unlock(&c->mu);
            kvp_warn_rl("kv lookup client: %s: %u lookups in flight already: a hit of 0",
                        req->req_id, c->max_inflight);
            return KVP_OK;
        }
        lookup_job(JOB_LOOKUP, req->req_id, req->num_tokens, req->block_hashes,
                   req->hash_len ? req->num_block_hashes : 0, req->hash_len, &j);
        if (!j || kvp__strmap_put(&c->table, j->id, j->id_len, j) != KVP_OK) {
            pthread_mutex_unlock(&c->mu);
            if (j)
                job_free(j);
            return KVP_OK; /* a hit of 0 (logged, or out of memory) */
        }
        submit(c, j, !non_block);
        if (j->orphan) { /* discarded by another thread while it ran here */
            pthread_mutex_unlock(&c->mu);
            job_free(j);
            return KVP_OK;
        }
    }
    if (non_block && j->state != JOB_DONE) {
        pthread_mutex_unlock(&c->mu);
        return KVP_INPROGRESS;
    }
    wait_done(c, j);
    kvp__strmap_del(&c->table, j->id, j->id_len);
    pthread_mutex_unlock(&c->mu);
    if (j->st == KVP_OK)
        *hit_p = j->hit;
    else
        kvp_warn_rl("kv lookup client: lookup of %s failed: %s (a hit of 0)", j->id,
                    kvp_status_str(j->st));
    job_free(j);
    return KVP_OK;
}

static void zmq_discard(void *ctx, const char *req_id)
{
    kvp_kv_lookup_zmq_t *c = ctx;
    if (!req_id)
        return;
    pthread_mutex_lock(&c->mu);
    job_t *j = kvp__strmap_del(&c->table, req_id, strlen(req_id));
    if (j && j->state == JOB_QUEUED) {
        unqueue(c, j);
        job_free(j);
    } else if (j && j->state == JOB_RUNNING) {
        j->orphan = true;
    } else if (j) {
        job_free(j);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Queues j (outside the table), waits for it, takes it back. */
static void run_job(kvp_kv_lookup_zmq_t *c, job_t *j)
{
    pthread_mutex_lock(&c->mu);
    submit(c, j, true);
    wait_done(c, j);
    pthread_mutex_unlock(&c->mu);
}

static kvp_status_t zmq_reset(void *ctx, bool *ack_p)
{
    kvp_kv_lookup_zmq_t *c = ctx;
    if (!ack_p)
        return KVP_ERR_NULL_POINTER;
    *ack_p = false;
    job_t *j = kvp__calloc(1, sizeof *j);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    j->kind = JOB_RESET;
    run_job(c, j);
    kvp_status_t st = j->st;
    if (st == KVP_OK)
        *ack_p = j->ack;
    else
        kvp_error("kv lookup client: reset via %s failed: %s", c->endpoint, kvp_status_str(st));
    job_free(j);
    return st;
}

static const kvp_kv_lookup_ops_t g_zmq_ops = {zmq_lookup, zmq_discard, zmq_reset};

kvp_status_t kvp_kv_lookup_zmq_query(kvp_kv_lookup_zmq_t *c, int64_t num_tokens,
                                     const uint8_t *hashes, size_t num_hashes, uint32_t hash_len,
                                     int64_t *hit_p)
{
    if (!c || !hit_p)
        return KVP_ERR_NULL_POINTER;
    job_t *j;
    kvp_status_t st = lookup_job(JOB_QUERY, NULL, num_tokens, hashes, hash_len ? num_hashes : 0,
                                 hash_len, &j);
    if (st != KVP_OK)
        return st;
    run_job(c, j);
    st = j->st;
    if (st == KVP_OK)
        *hit_p = j->hit;
    job_free(j);
    return st;
}

void kvp_kv_lookup_zmq_params_init(kvp_kv_lookup_zmq_params_t *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->size = (uint32_t)sizeof *params;
    params->timeout_ms = 2000;
    params->max_inflight = 4096;
}

kvp_status_t kvp_kv_lookup_zmq_create(const kvp_kv_lookup_zmq_params_t *params,
                                      kvp_kv_lookup_zmq_t **client_p)
{
    if (!params || !client_p)
        return KVP_ERR_NULL_POINTER;
    *client_p = NULL;
    kvp_kv_lookup_zmq_params_t pp;
    kvp_kv_lookup_zmq_params_init(&pp);
    kvp_status_t ast = kvp__sized_adopt(&pp, sizeof pp, params);
    if (ast != KVP_OK) {
        kvp_error("kv lookup client: params.size %u (call kvp_kv_lookup_zmq_params_init)",
                  params->size);
        return ast;
    }
    params = &pp;
    if (!params->endpoint)
        return KVP_ERR_NULL_POINTER;
    const char *ep = params->endpoint;
    if (params->timeout_ms == 0 || params->max_inflight == 0 ||
        (strncmp(ep, "ipc://", 6) != 0 && strncmp(ep, "tcp://", 6) != 0) || !ep[6]) {
        kvp_error("kv lookup client: bad params (endpoint '%s', timeout %u ms, max_inflight %u)",
                  ep, params->timeout_ms, params->max_inflight);
        return KVP_ERR_BAD_CONFIG;
    }
    kvp_kv_lookup_zmq_t *c = kvp__calloc(1, sizeof *c);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    c->timeout_ms = params->timeout_ms;
    c->send_eagle = params->send_eagle;
    c->eagle = params->apply_eagle ? 1 : 0;
    c->max_inflight = params->max_inflight;
    kvp__strmap_init(&c->table);
    c->endpoint = kvp__strdup(ep);
    c->zctx = c->endpoint ? zmq_ctx_new() : NULL;
    kvp_status_t st = c->zctx ? KVP_OK : KVP_ERR_NO_MEMORY;
    if (st == KVP_OK && !(c->sock = new_socket(c)))
        st = KVP_ERR_BAD_CONFIG; /* (logged) */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work, NULL);
    pthread_cond_init(&c->done, NULL);
    if (st == KVP_OK && pthread_create(&c->thread, NULL, io_main, c) != 0)
        st = KVP_ERR_NO_MEMORY;
    if (st != KVP_OK) {
        c->thread = 0;
        c->stopping = true;
        kvp_kv_lookup_zmq_destroy(c);
        return st;
    }
    *client_p = c;
    return KVP_OK;
}

void kvp_kv_lookup_zmq_destroy(kvp_kv_lookup_zmq_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    bool started = !c->stopping;
    c->stopping = true;
    /* Queued jobs are cancelled: the table's are freed below, and no caller
     * waits on others (destroy is not called concurrently with calls). */
    c->head = c->tail = NULL;
    pthread_cond_signal(&c->work);
    pthread_mutex_unlock(&c->mu);
    if (started)
        pthread_join(c->thread, NULL);
    for (size_t i = 0; i < c->table.cap; i++)
        if (c->table.slots[i].key)
            job_free(c->table.slots[i].val);
    kvp__strmap_cleanup(&c->table);
    if (c->sock)
        zmq_close(c->sock);
    if (c->zctx)
        zmq_ctx_term(c->zctx);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->work);
    pthread_mutex_destroy(&c->mu);
    kvp__strfree(c->endpoint);
    kvp__free(c, sizeof *c);
}

kvp_kv_lookup_client_t kvp_kv_lookup_zmq_client(kvp_kv_lookup_zmq_t *c)
{
    return (kvp_kv_lookup_client_t){&g_zmq_ops, c};
}

void kvp_kv_lookup_zmq_stats(const kvp_kv_lookup_zmq_t *c, kvp_kv_lookup_zmq_stats_t *stats_p)
{
    if (!stats_p)
        return;
    memset(stats_p, 0, sizeof *stats_p);
    if (!c)
        return;
    kvp_kv_lookup_zmq_t *m = (kvp_kv_lookup_zmq_t *)c; /* the mutex, for inflight */
    stats_p->lookups = atomic_load_explicit(&c->lookups, memory_order_relaxed);
    stats_p->errors = atomic_load_explicit(&c->errors, memory_order_relaxed);
    stats_p->timeouts = atomic_load_explicit(&c->timeouts, memory_order_relaxed);
    stats_p->reconnects = atomic_load_explicit(&c->reconnects, memory_order_relaxed);
    pthread_mutex_lock(&m->mu);
    stats_p->inflight = m->inflight;
    pthread_mutex_unlock(&m->mu);
}
