/*
 * The producer half of the EC worker (connectors-spec §3.7 "Producer push";
 * the seed's worker.py _push_batch and producer.py ProducerPushManager win
 * where the spec is silent).
 *
 * One record per transfer id, with one state enum and one set-state that
 * rejects transitions not in the table:
 *
 *   WAITING_INPUTS -> WRITING | CANCEL_PENDING | FAILED
 *   WRITING        -> NOTIFYING | FAILED
 *   NOTIFYING      -> DONE | FAILED
 *   CANCEL_PENDING -> CANCELLED | FAILED
 *   DONE, CANCELLED, FAILED: terminal (kept for duplicate detection, at
 *   most 65,536, oldest reaped first)
 *
 * A record waits for two inputs that arrive in either order: its
 * reservations (a reserve on every consumer shard, run by a job) and its
 * source (the encoder output, bound by save_caches; the worker copies it so
 * the engine's buffer is free at once).  When both are there, a push job
 * runs: reservations older than half their lease are refreshed (cancel with
 * abandon+refresh, reserve again), the bytes go to every shard that asked
 * for them (not cached, not cancelled), then complete_batch goes to each of
 * those shards, where any item not completed is an error.  Any failure
 * cancels every reservation the record holds with abandon (two attempts),
 * fails the record and reports its request in failed_saves.  get_finished
 * cancels the reservations of records whose request finished before their
 * source came (orphans).
 *
 * Jobs run on two small pools of threads, as the seed's control executor
 * and transfer threads: control jobs (reserve, cancel: one round trip per
 * shard) on their own, so a reserve is sent the moment it is asked for and
 * never waits behind a push or a pool put of megabytes, and data jobs
 * (push, pool put) on the others.  The lock (mu) guards the records, the
 * sources, the queues and the counters and is never held across a network
 * call.  Lock order: mu only.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/assert.h"
#include "common/clock.h"
#include "common/list.h"
#include "common/log.h"
#include "common/thread.h"
#include "ec/ec_fanout.h"
#include "ec/ec_stage.h"
#include "ec/ec_worker_int.h"

#define TERMINAL_LIMIT 65536u
#define CANCEL_ATTEMPTS 2

typedef enum {
    P_WAITING_INPUTS = 0, /* needs its reservations and its source */
    P_WRITING,            /* bytes moving into the consumer's slots */
    P_NOTIFYING,          /* complete_batch sent to the shards written */
    P_DONE,               /* every shard completed */
    P_CANCEL_PENDING,     /* its request finished first: reservations being cancelled */
    P_CANCELLED,
    P_FAILED,
    P_NUM_STATES
} pstate_t;

static const char *const g_pstate_names[P_NUM_STATES] = {
    "WAITING_INPUTS", "WRITING", "NOTIFYING", "DONE", "CANCEL_PENDING", "CANCELLED", "FAILED",
};

#define B(s) (1u << (s))
static const unsigned g_allowed[P_NUM_STATES] = {
    [P_WAITING_INPUTS] = B(P_WRITING) | B(P_CANCEL_PENDING) | B(P_FAILED),
    [P_WRITING] = B(P_NOTIFYING) | B(P_FAILED),
    [P_NOTIFYING] = B(P_DONE) | B(P_FAILED),
    [P_CANCEL_PENDING] = B(P_CANCELLED) | B(P_FAILED),
};
#undef B

static bool terminal(pstate_t s) { return s == P_DONE || s == P_CANCELLED || s == P_FAILED; }

typedef struct {
    char *addr;
    char rid[KVP__EC_RID_LEN + 1];
    char *session;
    uint64_t dst_ptr, nbytes;
    bool reserved, write, ready, cached, cancelled;
    uint64_t received_ns;
    size_t reply_bytes; /* the reserve reply's frame */
} shard_t;

typedef struct source {
    char *hash;
    kvp__ec_stage_region_t reg; /* the copy: data, nbytes */
    bool pool_put; /* a cross-encoder cache candidate not yet put into the pool */
    uint32_t refs; /* records bound to it */
} source_t;

typedef enum { J_RESERVE, J_PUSH, J_CANCEL, J_POOL_PUT } job_kind_t;

/* The queues: control jobs and data jobs, each with its threads. */
enum { Q_CONTROL, Q_DATA, Q_NUM };
#define CONTROL_THREADS 2
#define SHARD_THREADS 3 /* a reserve's other shards (the first runs on the caller) */

static int queue_of(job_kind_t k) { return k == J_RESERVE || k == J_CANCEL ? Q_CONTROL : Q_DATA; }

typedef struct lane {
    struct kvp__ec_producer *pr;
    kvp__list_t jobs;
    pthread_cond_t cv; /* a job queued, or stopping */
} lane_t;

typedef struct rec {
    char *tid, *hash, *req, *consumer, *dtype_name;
    kvp__ec_tensor_t t;
    pstate_t state;
    bool reserved;   /* the reserve job finished (ok or not) */
    bool busy;       /* a job owns the record now */
    shard_t *shards;
    size_t n_shards;
    source_t *src;
    kvp_ec_push_record_t rep; /* times and outcome, for on_push */
    kvp__list_t link;         /* on pr->terminal once terminal */
} rec_t;

typedef struct job {
    job_kind_t kind;
    rec_t *rec;       /* RESERVE, PUSH, CANCEL */
    source_t *src;    /* POOL_PUT */
    kvp__list_t link;
} job_t;

struct kvp__ec_producer {
    kvp__ec_producer_params_t p;
    char *model;
    kvp__ec_client_t *client;
    kvp__ec_fanout_t *fanout; /* the shards' reserves, at once */
    kvp__ec_push_tx_t *tx;
    kvp__ec_stage_t *stage; /* the sources' copies */
    pthread_mutex_t mu;
    bool stopping;
    pthread_t *threads;
    size_t n_threads, cap_threads;
    lane_t lanes[Q_NUM];
    size_t jobs_running;
    kvp__strmap_t recs;    /* tid -> rec */
    kvp__strmap_t sources; /* hash -> source (while records need it) */
    kvp__strset_t cands;   /* cross-encoder cache: identifiers to put into the pool */
    kvp__list_t terminal;  /* terminal records, oldest first */
    size_t n_terminal;
    size_t n_active;
    kvp__ec_names_t failed;
    uint64_t pushes, cached, failures, retryable, bytes, cc_puts;
};

static void set_state(kvp__ec_producer_t *pr, rec_t *r, pstate_t to)
{
    if (!(g_allowed[r->state] & (1u << to))) {
        kvp_error("ec producer: transfer %s: no transition %s -> %s", r->tid, g_pstate_names[r->state],
                  g_pstate_names[to]);
        kvp__assert(0);
        return;
    }
    r->state = to;
    if (terminal(to)) {
        pr->n_active--;
        kvp__list_add_tail(&pr->terminal, &r->link);
        pr->n_terminal++;
    }
}

static bool retryable_status(kvp_status_t st)
{
    return st == KVP_ERR_TIMEOUT || st == KVP_ERR_CONN_LOST || st == KVP_ERR_CONN_REFUSED || st == KVP_ERR_IO ||
           st == KVP_ERR_EXPIRED || st == KVP_ERR_REMOTE || st == KVP_ERR_NO_SPACE || st == KVP_ERR_BUSY;
}

/* ---- records and sources (mu held) ---- */

static kvp_status_t enqueue(kvp__ec_producer_t *pr, job_kind_t kind, rec_t *r, source_t *s);

static void source_free(kvp__ec_producer_t *pr, source_t *s)
{
    kvp__ec_stage_put(pr->stage, &s->reg);
    kvp__strfree(s->hash);
    kvp__free(s, sizeof *s);
}

/* The last record done with a candidate source hands it to its pool put:
 * the put goes after the pushes of that output, so that a consumer's
 * lookup for the transfer under way never finds the producer's own copy
 * (its push would be replaced by a second copy through the pool) and the
 * put never competes with the push it follows. */
static void source_put(kvp__ec_producer_t *pr, source_t *s)
{
    if (!s || --s->refs)
        return;
    if (s->pool_put && !pr->stopping) {
        s->pool_put = false;
        if (enqueue(pr, J_POOL_PUT, NULL, s) == KVP_OK)
            return;
    }
    kvp__strmap_del(&pr->sources, s->hash, strlen(s->hash));
    source_free(pr, s);
}

static void shards_free(rec_t *r)
{
    for (size_t i = 0; i < r->n_shards; i++) {
        kvp__strfree(r->shards[i].addr);
        kvp__strfree(r->shards[i].session);
    }
    kvp__free(r->shards, r->n_shards * sizeof *r->shards);
    r->shards = NULL;
    r->n_shards = 0;
}

static void rec_free(rec_t *r)
{
    shards_free(r);
    kvp__strfree(r->tid);
    kvp__strfree(r->hash);
    kvp__strfree(r->req);
    kvp__strfree(r->consumer);
    kvp__strfree(r->dtype_name);
    kvp__free(r, sizeof *r);
}

static void reap_terminals(kvp__ec_producer_t *pr)
{
    while (pr->n_terminal > TERMINAL_LIMIT) {
        rec_t *r = KVP_CONTAINER_OF(kvp__list_first(&pr->terminal), rec_t, link);
        if (r->busy)
            break;
        kvp__list_del(&r->link);
        pr->n_terminal--;
        kvp__strmap_del(&pr->recs, r->tid, strlen(r->tid));
        rec_free(r);
    }
}

static kvp_status_t enqueue(kvp__ec_producer_t *pr, job_kind_t kind, rec_t *r, source_t *s)
{
    job_t *j = kvp__calloc(1, sizeof *j);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    j->kind = kind;
    j->rec = r;
    j->src = s;
    if (r)
        r->busy = true;
    if (r && kind == J_RESERVE)
        r->rep.reserve_asked_ns = kvp__now_ns();
    if (s)
        s->refs++;
    lane_t *l = &pr->lanes[queue_of(kind)];
    kvp__list_add_tail(&l->jobs, &j->link);
    pthread_cond_signal(&l->cv);
    return KVP_OK;
}

/* A record whose two inputs are there gets its push job. */
static void maybe_push(kvp__ec_producer_t *pr, rec_t *r)
{
    if (r->state == P_WAITING_INPUTS && r->reserved && r->src && !r->busy)
        enqueue(pr, J_PUSH, r, NULL);
}

/* Ends a record (mu held): the terminal state, the failed_saves entry and
 * the report (on_push is called with mu released by the caller). */
static void finish(kvp__ec_producer_t *pr, rec_t *r, pstate_t to, kvp_status_t st)
{
    set_state(pr, r, to);
    r->rep.status = st;
    r->rep.retryable = st != KVP_OK && retryable_status(st);
    if (to == P_FAILED) {
        pr->failures++;
        if (r->rep.retryable)
            pr->retryable++;
        kvp__ec_names_add(&pr->failed, r->req);
    } else if (to == P_DONE) {
        pr->pushes++;
        if (r->rep.cached)
            pr->cached++;
    }
    source_put(pr, r->src);
    r->src = NULL;
}

/* on_push, with mu held: the callback must not call into the worker. */
static void report(kvp__ec_producer_t *pr, rec_t *r)
{
    if (!pr->p.on_push)
        return;
    r->rep.transfer_id = r->tid;
    r->rep.mm_hash = r->hash;
    r->rep.request_id = r->req;
    r->rep.nbytes = (int64_t)r->t.nbytes;
    pr->p.on_push(pr->p.on_push_ctx, &r->rep);
}

/* ---- network steps (mu NOT held; the job owns the record) ---- */

/* One shard's reserve (a fanout task): sh[i] filled, st[i] its status. */
typedef struct {
    kvp__ec_producer_t *pr;
    rec_t *r;
    const char *const *addrs;
    shard_t *sh;
    kvp_status_t *st;
    const char *req;
    size_t len;
} reserve_job_t;

static void reserve_shard(void *ctx, size_t i)
{
    reserve_job_t *j = ctx;
    shard_t *sh = &j->sh[i];
    kvp_status_t st;
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    sh->addr = kvp__strdup(j->addrs[i]);
    if (!sh->addr) {
        st = KVP_ERR_NO_MEMORY;
    } else if ((st = kvp__ec_client_request(j->pr->client, j->addrs[i], j->req, j->len, &rep)) == KVP_OK) {
        kvp__ec_reserve_out_t o;
        const char *session = NULL;
        uint64_t ptr = 0;
        st = kvp__ec_ctl_decode_reserve_result(rep.result, &o, &session, &ptr);
        if (st == KVP_OK) {
            memcpy(sh->rid, o.reservation_id, sizeof sh->rid);
            sh->session = kvp__strdup(session ? session : "");
            sh->dst_ptr = ptr;
            sh->nbytes = o.nbytes;
            sh->write = o.write;
            sh->ready = o.ready;
            sh->cached = o.cached;
            sh->cancelled = o.cancelled;
            sh->reserved = true;
            sh->received_ns = kvp__now_ns();
            sh->reply_bytes = rep.bytes;
            if (!sh->session)
                st = KVP_ERR_NO_MEMORY;
        } else {
            kvp_warn_rl("ec producer: malformed reserve reply from %s", j->addrs[i]);
        }
    } else if (st == KVP_ERR_REMOTE) {
        kvp_warn_rl("ec producer: reserve of %s on %s refused: %s", j->r->tid, j->addrs[i],
                    rep.error ? rep.error : "?");
        if (rep.error && strstr(rep.error, "pool is full"))
            st = KVP_ERR_NO_SPACE;
    }
    kvp__ec_reply_cleanup(&rep);
    j->st[i] = st;
}

/* A reserve on every shard of the record's consumer, at once (the seed's
 * fanout); the first failing shard's status, in shard order. */
static kvp_status_t reserve_all(kvp__ec_producer_t *pr, rec_t *r, shard_t **shards_p, size_t *n_p)
{
    const char *const *addrs = NULL;
    size_t n = 0;
    kvp_status_t st = KVP_ERR_NOT_FOUND;
    for (int i = 0; i < CANCEL_ATTEMPTS && st != KVP_OK; i++)
        st = kvp__ec_client_shards(pr->client, r->consumer, &addrs, &n);
    if (st != KVP_OK) {
        kvp_warn_rl("ec producer: could not discover the shards of %s: %s", r->consumer, kvp_status_str(st));
        return st;
    }
    shard_t *sh = kvp__calloc(n, sizeof *sh);
    kvp_status_t *sts = kvp__calloc(n, sizeof *sts);
    if (!sh || !sts) {
        kvp__free(sh, sh ? n * sizeof *sh : 0);
        kvp__free(sts, sts ? n * sizeof *sts : 0);
        return KVP_ERR_NO_MEMORY;
    }
    kvp__jw_t b;
    kvp__jw_init(&b);
    const char *tid = r->tid, *hash = r->hash;
    kvp__ec_ctl_put_reserve(&b, &tid, &hash, &r->t, 1, false);
    st = b.oom ? KVP_ERR_NO_MEMORY : KVP_OK;
    if (st == KVP_OK) {
        reserve_job_t j = {pr, r, addrs, sh, sts, b.p, b.len};
        kvp__ec_fanout_run(pr->fanout, n, reserve_shard, &j);
        for (size_t i = 0; i < n && st == KVP_OK; i++)
            st = sts[i];
    }
    kvp__jw_cleanup(&b);
    kvp__free(sts, n * sizeof *sts);
    *shards_p = sh;
    *n_p = n;
    return st;
}

/* Cancel (abandon) every reservation of the record that is not cancelled
 * already: two attempts over the shards still pending. */
static void cancel_all(kvp__ec_producer_t *pr, rec_t *r, shard_t *sh, size_t n, bool refresh)
{
    for (int a = 0; a < CANCEL_ATTEMPTS; a++) {
        bool pending = false;
        for (size_t i = 0; i < n; i++) {
            if (!sh[i].reserved || sh[i].cancelled || !sh[i].addr)
                continue;
            bool ok = false;
            kvp_status_t st = kvp__ec_client_cancel(pr->client, sh[i].addr, r->tid, sh[i].rid, true, refresh, &ok);
            if (st == KVP_OK && ok)
                sh[i].cancelled = true;
            else
                pending = true;
        }
        if (!pending)
            return;
    }
    kvp_warn_rl("ec producer: could not cancel every reservation of transfer %s", r->tid);
}

static void shards_release(shard_t *sh, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvp__strfree(sh[i].addr);
        kvp__strfree(sh[i].session);
    }
    kvp__free(sh, n * sizeof *sh);
}

static void run_reserve(kvp__ec_producer_t *pr, rec_t *r)
{
    shard_t *sh = NULL;
    size_t n = 0;
    r->rep.reserve_sent_ns = kvp__now_ns();
    kvp_status_t st = reserve_all(pr, r, &sh, &n);
    r->rep.reserve_done_ns = kvp__now_ns();
    for (size_t i = 0; st == KVP_OK && i < n; i++) {
        if (sh[i].reply_bytes > r->rep.reserve_reply_bytes)
            r->rep.reserve_reply_bytes = sh[i].reply_bytes;
        if (sh[i].write && !sh[i].cancelled)
            kvp__ec_push_tx_prepare(pr->tx, sh[i].session);
    }
    bool cancel_now = false;
    pthread_mutex_lock(&pr->mu);
    cancel_now = r->state == P_CANCEL_PENDING;
    pthread_mutex_unlock(&pr->mu);
    if (st != KVP_OK || cancel_now)
        cancel_all(pr, r, sh, n, false);
    pthread_mutex_lock(&pr->mu);
    r->busy = false;
    r->reserved = true;
    r->shards = sh;
    r->n_shards = n;
    r->rep.shards = n;
    bool done = false;
    if (r->state == P_CANCEL_PENDING) {
        finish(pr, r, P_CANCELLED, KVP_ERR_CANCELLED);
        done = true;
    } else if (st != KVP_OK) {
        finish(pr, r, P_FAILED, st);
        done = true;
    } else {
        maybe_push(pr, r);
    }
    if (done)
        report(pr, r);
    pthread_mutex_unlock(&pr->mu);
}

static kvp_status_t complete_shard(kvp__ec_producer_t *pr, rec_t *r, shard_t *s)
{
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_wire_complete_t item = {r->tid, s->rid};
    kvp__ec_ctl_put_complete(&b, &item, 1, true);
    if (b.oom) {
        kvp__jw_cleanup(&b);
        return KVP_ERR_NO_MEMORY;
    }
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    kvp_status_t st = kvp__ec_client_request(pr->client, s->addr, b.p, b.len, &rep);
    if (st == KVP_OK) {
        const kvp__json_t *items = rep.result ? kvp__json_get(rep.result, "items") : NULL;
        const kvp__json_t *c = items && items->type == KVP__JSON_ARRAY && items->n == 1 ? &items->u.items[0] : NULL;
        const kvp__json_t *done = c && c->type == KVP__JSON_OBJECT ? kvp__json_get(c, "completed") : NULL;
        if (!done)
            st = KVP_ERR_DECODE;
        else if (done->type != KVP__JSON_TRUE)
            st = KVP_ERR_EXPIRED; /* unknown reservation: it expired or was cancelled */
    }
    if (st != KVP_OK)
        kvp_warn_rl("ec producer: complete of transfer %s on %s failed: %s", r->tid, s->addr, kvp_status_str(st));
    kvp__ec_reply_cleanup(&rep);
    kvp__jw_cleanup(&b);
    return st;
}

static void run_push(kvp__ec_producer_t *pr, rec_t *r)
{
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&pr->mu);
    set_state(pr, r, P_WRITING);
    source_t *src = r->src;
    src->refs++; /* held across the writes */
    pthread_mutex_unlock(&pr->mu);

    /* Refresh reservations older than half their lease (worker.py). */
    uint64_t now = kvp__now_ns(), half = (uint64_t)pr->p.lease_ms * 1000000u / 2;
    bool stale = false;
    for (size_t i = 0; i < r->n_shards; i++)
        if (!r->shards[i].ready && !r->shards[i].cached && !r->shards[i].cancelled && now - r->shards[i].received_ns >= half)
            stale = true;
    if (stale) {
        cancel_all(pr, r, r->shards, r->n_shards, true);
        shard_t *sh = NULL;
        size_t n = 0;
        st = reserve_all(pr, r, &sh, &n);
        pthread_mutex_lock(&pr->mu);
        shard_t *old = r->shards;
        size_t nold = r->n_shards;
        r->shards = sh;
        r->n_shards = n;
        pthread_mutex_unlock(&pr->mu);
        shards_release(old, nold);
    }

    size_t written = 0, cached = 0;
    for (size_t i = 0; i < r->n_shards && st == KVP_OK; i++) {
        shard_t *s = &r->shards[i];
        if (s->cached || s->cancelled || !s->write) {
            cached += s->cached;
            continue;
        }
        if (s->nbytes != src->reg.nbytes) {
            kvp_warn_rl("ec producer: reserved size %" PRIu64 " does not match the tensor (%zu) for mm_hash=%s",
                        s->nbytes, src->reg.nbytes, r->hash);
            st = KVP_ERR_INVALID_ARG;
            break;
        }
        if (!r->rep.write_start_ns)
            r->rep.write_start_ns = kvp__now_ns();
        unsigned path = 0;
        st = kvp__ec_push_tx_write(pr->tx, s->session, s->rid, s->dst_ptr, src->reg.data, src->reg.nbytes, &path);
        if (st != KVP_OK) {
            kvp_warn_rl("ec producer: write of transfer %s to %s failed: %s", r->tid, s->addr, kvp_status_str(st));
            break;
        }
        r->rep.path = path & KVP__EC_PATH_UCX ? KVP_EC_PUSH_UCX : KVP_EC_PUSH_TCP;
        written++;
    }
    if (written)
        r->rep.write_done_ns = kvp__now_ns();
    r->rep.written = written;
    r->rep.cached = written == 0 && cached > 0;

    if (st == KVP_OK) {
        pthread_mutex_lock(&pr->mu);
        set_state(pr, r, P_NOTIFYING);
        pthread_mutex_unlock(&pr->mu);
        for (size_t i = 0; i < r->n_shards && st == KVP_OK; i++) {
            shard_t *s = &r->shards[i];
            if (s->cached || s->cancelled || !s->write)
                continue;
            st = complete_shard(pr, r, s);
        }
        r->rep.complete_done_ns = kvp__now_ns();
    }
    if (st != KVP_OK)
        cancel_all(pr, r, r->shards, r->n_shards, false);
    pthread_mutex_lock(&pr->mu);
    if (st == KVP_OK)
        pr->bytes += (uint64_t)written * src->reg.nbytes;
    source_put(pr, src);
    r->busy = false;
    finish(pr, r, st == KVP_OK ? P_DONE : P_FAILED, st);
    report(pr, r);
    pthread_mutex_unlock(&pr->mu);
}

static void run_cancel(kvp__ec_producer_t *pr, rec_t *r)
{
    cancel_all(pr, r, r->shards, r->n_shards, false);
    pthread_mutex_lock(&pr->mu);
    r->busy = false;
    finish(pr, r, P_CANCELLED, KVP_ERR_CANCELLED);
    report(pr, r);
    pthread_mutex_unlock(&pr->mu);
}

static void run_pool_put(kvp__ec_producer_t *pr, source_t *s)
{
    char key[KVP_KEY_MAX + 1];
    size_t klen;
    if (kvp__ec_store_key(pr->model, s->hash, key, sizeof key, &klen) == KVP_OK) {
        kvp_key_t k = {key, (uint32_t)klen};
        kvp_iov_t iov = {s->reg.data, s->reg.nbytes};
        kvp_sgl_t sgl = {&iov, 1};
        kvp_key_result_t res;
        kvp_status_t st = kvp_pool_put(pr->p.pool, &k, &sgl, 1, &res);
        if (st == KVP_OK)
            st = res.status;
        if (st == KVP_OK) {
            pthread_mutex_lock(&pr->mu);
            pr->cc_puts++;
            pthread_mutex_unlock(&pr->mu);
        } else {
            kvp_warn_rl("ec producer: cross-encoder cache put of %s failed: %s", s->hash, kvp_status_str(st));
        }
    }
    pthread_mutex_lock(&pr->mu);
    source_put(pr, s);
    pthread_mutex_unlock(&pr->mu);
}

static void *worker_main(void *arg)
{
    lane_t *l = arg;
    kvp__ec_producer_t *pr = l->pr;
    kvp__thread_name(l == &pr->lanes[Q_CONTROL] ? "kvp-ec-prod-ctl" : "kvp-ec-prod-dat");
    pthread_mutex_lock(&pr->mu);
    for (;;) {
        while (kvp__list_empty(&l->jobs) && !pr->stopping)
            pthread_cond_wait(&l->cv, &pr->mu);
        if (kvp__list_empty(&l->jobs))
            break; /* stopping and drained */
        job_t *j = KVP_CONTAINER_OF(kvp__list_first(&l->jobs), job_t, link);
        kvp__list_del(&j->link);
        pr->jobs_running++;
        pthread_mutex_unlock(&pr->mu);
        switch (j->kind) {
        case J_RESERVE:
            run_reserve(pr, j->rec);
            break;
        case J_PUSH:
            run_push(pr, j->rec);
            break;
        case J_CANCEL:
            run_cancel(pr, j->rec);
            break;
        case J_POOL_PUT:
            run_pool_put(pr, j->src);
            break;
        }
        kvp__free(j, sizeof *j);
        pthread_mutex_lock(&pr->mu);
        pr->jobs_running--;
        reap_terminals(pr);
    }
    pthread_mutex_unlock(&pr->mu);
    return NULL;
}

/* ---- the hooks ---- */

kvp_status_t kvp__ec_producer_create(const kvp__ec_producer_params_t *p, kvp__ec_producer_t **pr_p)
{
    kvp__ec_producer_t *pr = kvp__calloc(1, sizeof *pr);
    if (!pr)
        return KVP_ERR_NO_MEMORY;
    pr->p = *p;
    pthread_mutex_init(&pr->mu, NULL);
    for (int q = 0; q < Q_NUM; q++) {
        pr->lanes[q].pr = pr;
        kvp__list_init(&pr->lanes[q].jobs);
        pthread_cond_init(&pr->lanes[q].cv, NULL);
    }
    kvp__list_init(&pr->terminal);
    kvp__strmap_init(&pr->recs);
    kvp__strmap_init(&pr->sources);
    kvp__strmap_init(&pr->cands);
    kvp__ec_names_init(&pr->failed);
    pr->model = kvp__strdup(p->model ? p->model : "");
    kvp_status_t st = pr->model ? KVP_OK : KVP_ERR_NO_MEMORY;
    if (st == KVP_OK)
        st = kvp__ec_client_create(p->control_timeout_ms, &pr->client);
    if (st == KVP_OK)
        st = kvp__ec_fanout_create(SHARD_THREADS, &pr->fanout);
    kvp__ec_push_tx_params_t tp = {.paths = p->paths, .timeout_ms = p->control_timeout_ms};
    if (st == KVP_OK)
        st = kvp__ec_push_tx_create(&tp, &pr->tx);
    if (st == KVP_OK)
        st = kvp__ec_stage_create(p->stage_bytes, &pr->stage);
    size_t n_data = p->threads ? p->threads : 4;
    pr->cap_threads = n_data + CONTROL_THREADS;
    if (st == KVP_OK && !(pr->threads = kvp__calloc(pr->cap_threads, sizeof *pr->threads)))
        st = KVP_ERR_NO_MEMORY;
    for (size_t i = 0; st == KVP_OK && i < pr->cap_threads; i++) {
        lane_t *l = &pr->lanes[i < CONTROL_THREADS ? Q_CONTROL : Q_DATA];
        if (pthread_create(&pr->threads[i], NULL, worker_main, l) != 0)
            st = KVP_ERR_NO_MEMORY;
        else
            pr->n_threads++;
    }
    if (st != KVP_OK) {
        kvp__ec_producer_destroy(pr);
        return st;
    }
    *pr_p = pr;
    return KVP_OK;
}

void kvp__ec_producer_destroy(kvp__ec_producer_t *pr)
{
    if (!pr)
        return;
    /* Records still waiting for a source are orphans now: cancel them,
     * then let the threads drain the queue and stop. */
    kvp__ec_producer_finished(pr, NULL, 0);
    pthread_mutex_lock(&pr->mu);
    pr->stopping = true;
    for (int q = 0; q < Q_NUM; q++)
        pthread_cond_broadcast(&pr->lanes[q].cv);
    pthread_mutex_unlock(&pr->mu);
    for (size_t i = 0; i < pr->n_threads; i++)
        pthread_join(pr->threads[i], NULL);
    kvp__free(pr->threads, pr->cap_threads * sizeof *pr->threads);
    for (size_t i = 0; i < pr->recs.cap; i++)
        if (pr->recs.slots[i].key)
            rec_free(pr->recs.slots[i].val);
    kvp__strmap_cleanup(&pr->recs);
    for (size_t i = 0; i < pr->sources.cap; i++) {
        source_t *src = pr->sources.slots[i].key ? pr->sources.slots[i].val : NULL;
        if (src)
            source_free(pr, src);
    }
    kvp__strmap_cleanup(&pr->sources);
    kvp__strset_cleanup(&pr->cands);
    kvp__ec_names_cleanup(&pr->failed);
    kvp__ec_stage_destroy(pr->stage);
    kvp__ec_push_tx_destroy(pr->tx);
    kvp__ec_fanout_destroy(pr->fanout);
    kvp__ec_client_destroy(pr->client);
    kvp__strfree(pr->model);
    pthread_mutex_destroy(&pr->mu);
    for (int q = 0; q < Q_NUM; q++)
        pthread_cond_destroy(&pr->lanes[q].cv);
    kvp__free(pr, sizeof *pr);
}

static bool same_destination(const rec_t *r, const kvp_ec_push_spec_t *s)
{
    if (strcmp(r->hash, s->mm_hash) || strcmp(r->consumer, s->consumer_zmq) || r->t.nbytes != (uint64_t)s->nbytes ||
        r->t.ndim != s->ndim || strcmp(r->dtype_name, s->dtype))
        return false;
    for (size_t i = 0; i < s->ndim; i++)
        if (r->t.shape[i] != s->shape[i])
            return false;
    return true;
}

static kvp_status_t bind_source(kvp__ec_producer_t *pr, const char *hash, const kvp_ec_tensor_t *t);

kvp_status_t kvp__ec_producer_start_save(kvp__ec_producer_t *pr, const kvp_ec_meta_t *meta,
                                         const kvp_ec_encoder_cache_t *cache)
{
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&pr->mu);
    for (size_t i = 0; i < meta->n_pushes && st == KVP_OK; i++) {
        const kvp_ec_push_spec_t *s = &meta->pushes[i];
        if (!s->transfer_id || !s->mm_hash || !s->consumer_zmq || !s->dtype || s->ndim > KVP__EC_MAX_NDIM ||
            s->nbytes <= 0)
            continue;
        rec_t *old = kvp__strmap_gets(&pr->recs, s->transfer_id);
        if (old) {
            if (!same_destination(old, s)) {
                kvp_warn_rl("ec producer: conflicting EC destination for transfer_id=%s", s->transfer_id);
                st = kvp__ec_names_add(&pr->failed, s->request_id ? s->request_id : "");
            }
            continue;
        }
        rec_t *r = kvp__calloc(1, sizeof *r);
        if (!r) {
            st = KVP_ERR_NO_MEMORY;
            break;
        }
        kvp__list_init(&r->link);
        r->tid = kvp__strdup(s->transfer_id);
        r->hash = kvp__strdup(s->mm_hash);
        r->req = kvp__strdup(s->request_id ? s->request_id : "");
        r->consumer = kvp__strdup(s->consumer_zmq);
        r->dtype_name = kvp__strdup(s->dtype);
        r->t.nbytes = (uint64_t)s->nbytes;
        r->t.ndim = (uint32_t)s->ndim;
        for (size_t d = 0; d < s->ndim; d++)
            r->t.shape[d] = s->shape[d];
        if (kvp_ec_dtype_parse(s->dtype, &r->t.dtype) != KVP_OK)
            r->t.dtype = KVP_EC_DTYPE_BFLOAT16; /* the consumer judges the name it is sent */
        r->state = P_WAITING_INPUTS;
        if (!r->tid || !r->hash || !r->req || !r->consumer || !r->dtype_name ||
            kvp__strmap_put(&pr->recs, r->tid, strlen(r->tid), r) != KVP_OK) {
            rec_free(r);
            st = KVP_ERR_NO_MEMORY;
            break;
        }
        pr->n_active++;
        /* A source saved before this spec arrived. */
        source_t *src = kvp__strmap_gets(&pr->sources, r->hash);
        if (src && src->reg.nbytes == r->t.nbytes) {
            r->src = src;
            src->refs++;
        }
        st = enqueue(pr, J_RESERVE, r, NULL);
    }
    for (size_t i = 0; i < meta->n_store_candidates && st == KVP_OK && pr->p.cross_encoder_cache; i++)
        st = kvp__strset_add(&pr->cands, meta->store_candidates[i].identifier, NULL);
    pthread_mutex_unlock(&pr->mu);
    if (st != KVP_OK || !cache || !cache->get)
        return st;
    for (size_t i = 0; i < meta->n_pushes && st == KVP_OK; i++) {
        kvp_ec_tensor_t t;
        if (meta->pushes[i].mm_hash && cache->get(cache->ctx, meta->pushes[i].mm_hash, &t))
            st = bind_source(pr, meta->pushes[i].mm_hash, &t);
    }
    return st;
}

/* A new source holding a copy of t (no lock held: megabytes move). */
static kvp_status_t source_new(kvp__ec_producer_t *pr, const char *hash, const kvp_ec_tensor_t *t, source_t **s_p)
{
    source_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    if (!(s->hash = kvp__strdup(hash)) || kvp__ec_stage_get(pr->stage, (size_t)t->nbytes, &s->reg) != KVP_OK) {
        source_free(pr, s);
        return KVP_ERR_NO_MEMORY;
    }
    if (t->nbytes)
        memcpy(s->reg.data, t->data, (size_t)t->nbytes); /* the caller's bytes are ours only until we return */
    *s_p = s;
    return KVP_OK;
}

/* Binds a copy of t to every record of hash waiting for one.  The copy is
 * made outside the lock, so the control and data threads go on meanwhile
 * (a second copy made by a racing call is dropped). */
static kvp_status_t bind_source(kvp__ec_producer_t *pr, const char *hash, const kvp_ec_tensor_t *t)
{
    source_t *src, *mine = NULL;
    for (;;) {
        pthread_mutex_lock(&pr->mu);
        if ((src = kvp__strmap_gets(&pr->sources, hash)) || mine)
            break;
        pthread_mutex_unlock(&pr->mu);
        kvp_status_t st = source_new(pr, hash, t, &mine);
        if (st != KVP_OK)
            return st;
    }
    bool fresh = false;
    if (!src) {
        if (kvp__strmap_put(&pr->sources, mine->hash, strlen(mine->hash), mine) != KVP_OK) {
            pthread_mutex_unlock(&pr->mu);
            source_free(pr, mine);
            return KVP_ERR_NO_MEMORY;
        }
        src = mine;
        mine = NULL;
        src->refs = 1; /* the map's until the visit below */
        fresh = true;
    }
    /* Every record waiting for this hash. */
    for (size_t i = 0; i < pr->recs.cap; i++) {
        rec_t *r = pr->recs.slots[i].key ? pr->recs.slots[i].val : NULL;
        if (!r || r->state != P_WAITING_INPUTS || r->src || strcmp(r->hash, hash) || r->t.nbytes != src->reg.nbytes)
            continue;
        r->src = src;
        src->refs++;
        maybe_push(pr, r);
    }
    if (fresh && pr->p.pool && kvp__strset_has(&pr->cands, hash))
        src->pool_put = true;
    if (fresh)
        source_put(pr, src); /* drop the map's own reference: records hold it now */
    pthread_mutex_unlock(&pr->mu);
    if (mine)
        source_free(pr, mine);
    return KVP_OK;
}

kvp_status_t kvp__ec_producer_save(kvp__ec_producer_t *pr, const char *mm_hash, const kvp_ec_tensor_t *t)
{
    return bind_source(pr, mm_hash, t);
}

kvp_status_t kvp__ec_producer_finished(kvp__ec_producer_t *pr, const char *const *ids, size_t n)
{
    kvp__strset_t want;
    kvp__strmap_init(&want);
    kvp_status_t st = KVP_OK;
    for (size_t i = 0; i < n && st == KVP_OK; i++)
        st = kvp__strset_add(&want, ids[i], NULL);
    pthread_mutex_lock(&pr->mu);
    for (size_t i = 0; i < pr->recs.cap && st == KVP_OK; i++) {
        rec_t *r = pr->recs.slots[i].key ? pr->recs.slots[i].val : NULL;
        if (!r || r->state != P_WAITING_INPUTS || r->src)
            continue;
        if (ids && !kvp__strset_has(&want, r->req))
            continue;
        set_state(pr, r, P_CANCEL_PENDING);
        if (!r->busy)
            st = enqueue(pr, J_CANCEL, r, NULL); /* else the reserve job cancels when it ends */
    }
    pthread_mutex_unlock(&pr->mu);
    kvp__strset_cleanup(&want);
    return st;
}

bool kvp__ec_producer_pending(kvp__ec_producer_t *pr)
{
    pthread_mutex_lock(&pr->mu);
    bool p = pr->n_active > 0 || pr->jobs_running > 0 || !kvp__list_empty(&pr->lanes[Q_CONTROL].jobs) ||
             !kvp__list_empty(&pr->lanes[Q_DATA].jobs);
    pthread_mutex_unlock(&pr->mu);
    return p;
}

void kvp__ec_producer_take_failed(kvp__ec_producer_t *pr, char ***v_p, size_t *n_p)
{
    pthread_mutex_lock(&pr->mu);
    kvp__ec_names_take(&pr->failed, v_p, n_p);
    pthread_mutex_unlock(&pr->mu);
}

void kvp__ec_producer_stats(kvp__ec_producer_t *pr, kvp_ec_worker_stats_t *st)
{
    pthread_mutex_lock(&pr->mu);
    st->pushes = pr->pushes;
    st->pushes_cached = pr->cached;
    st->pushes_failed = pr->failures;
    st->pushes_retryable = pr->retryable;
    st->bytes_pushed = pr->bytes;
    st->pushes_pending = pr->n_active;
    st->cross_cache_puts = pr->cc_puts;
    pthread_mutex_unlock(&pr->mu);
    kvp__ec_stage_stats_t ss;
    kvp__ec_stage_stats(pr->stage, &ss);
    st->stage_capacity = ss.capacity;
    st->stage_bytes = ss.bytes_staged;
    st->stage_heap_bytes = ss.heap_bytes;
    st->stage_copies = ss.copies;
    st->stage_fallbacks = ss.fallbacks;
}
