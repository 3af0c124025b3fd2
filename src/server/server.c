/*
 * The server's event loop and request handlers.
 *
 * Everything runs on one thread: the UCX worker's callbacks (connection
 * requests, request AMs, receive and send completions) and the loop that
 * sleeps on the worker's event fd, a signalfd and a 1 s reap timer.
 *
 * Put: the request header names the keys and sizes; space for every value is
 * reserved in the arena (invisible to readers) and the AM's data is received
 * straight into those slots (rendezvous: UCX reads the client's buffer into
 * the arena; eager: one copy out of UCX's buffer).  The reservations are
 * committed only when the whole payload has arrived; if the client goes away
 * first, the receive fails and every reservation is aborted, so no partial
 * object ever becomes visible.
 * Get: each found value is leased and the reply is sent straight from the
 * arena (an iov of leased slices); the leases end when the send completes.
 *
 * Local reads: the arena is a memfd, and a client on this host may map it
 * read-only (HELLO tells it where).  Its GET_LOCAL is answered with each
 * value's offset instead of the bytes; the leases stay with the connection
 * (lgroup_t) until the client releases it after copying (a RELEASE, or the
 * released field of a later request), or until its socket closes.  A connection the server drops while its client may still
 * be copying (worker replaced, a protocol violation) keeps those leases
 * until the client closes the socket (it is shut down for writing, so the
 * client sees the end) or LINGER_NS passes: space is never reused under a
 * reader.
 *
 * Connections on kvpool's TCP transport (net/lane.h) have no UCX endpoint:
 * the same requests arrive as frames on the connection's socket, a put's
 * values are read from it straight into the reserved slots, and replies
 * are queued and written (get values straight from the leased slices) as
 * the socket takes them.  Same handlers, same rules.
 */
#include "server/server.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/handshake.h"
#include "net/lane.h"
#include "net/ucx.h"
#include "net/wire.h"
#include "server/metrics.h"
#include "store/store.h"

/* What an epoll event points at. */
typedef enum { SRC_LISTEN, SRC_CONN, SRC_SIGNAL, SRC_TIMER, SRC_WORKER } src_kind_t;
typedef struct evsrc {
    src_kind_t kind;
    int fd;
} evsrc_t;

/* A client connection: TCP handshake, then UCX traffic; the TCP socket stays
 * open as the liveness channel. */
typedef enum {
    CONN_HANDSHAKE, /* reading the client's hello on the TCP socket */
    CONN_READY,     /* UCX endpoint up, requests served */
    CONN_DEAD,      /* peer gone or misbehaved: closed once its requests finish */
} conn_state_t;

typedef struct conn {
    evsrc_t src;            /* first: epoll data points here */
    struct conn *next;      /* all connections */
    struct conn *hnext;     /* key hash chain */
    conn_state_t state;
    ucp_ep_h ep;
    uint64_t id;
    uint64_t key;           /* random; every request names it */
    uint64_t hs_deadline_ns;
    uint8_t *hs_buf;
    size_t hs_len;
    uint64_t inflight;
    uint64_t dead_since_ns;
    struct reply *replies;  /* replies being sent to this connection */
    /* kvpool's TCP transport (net/lane.h): no UCX endpoint, frames on src.fd */
    int lane;
    uint8_t *rx_buf;        /* frame head + request header being read */
    size_t rx_cap, rx_len;
    uint32_t rx_hdr_len;
    struct put_ctx *rx_put; /* a put whose values are being read */
    uint64_t rx_left;       /* its bytes still to come */
    uint32_t rx_i;          /* position in rx_put->iov */
    size_t rx_off;
    struct reply *tx_head, *tx_tail; /* replies waiting for the socket, in order */
    uint32_t tx_count;      /* how many */
    uint64_t tx_bytes;      /* their frames' bytes (leased values included) */
    int tx_wait;            /* EPOLLOUT armed */
    int rx_paused;          /* EPOLLIN off: too many replies waiting (the client does not read) */
    struct lgroup *lgroups; /* GET_LOCAL leases the client holds */
    uint32_t nlgroups;
    uint64_t linger_until_ns; /* dead, its client maybe still reading: socket kept until then */
} conn_t;

#define KEY_BUCKETS 1024
#define HS_BUF_MAX (KVP_HS_HELLO_FIXED + KVP_HS_TOKEN_MAX + KVP_HS_ADDR_MAX)
#define HS_TIMEOUT_NS (5ull * 1000000000ull)
#define DRAIN_MAX_NS (10ull * 1000000000ull) /* SIGTERM waits this long at most for requests in flight */
#define LANE_RX_START (64u * 1024u) /* the lane's header buffer grows from this as headers need */
#define LANE_IOV_MAX 64
/* A client that sends requests but does not read the replies makes the
 * server stop reading its requests (backpressure) once this much waits. */
#define LANE_TX_MAX_COUNT 1024u
#define LANE_TX_MAX_BYTES (64ull << 20)
#define WEDGE_NS (1ull * 1000000000ull) /* see worker_rebuild */
#define ABANDON_AFTER_NS (2ull * 1000000000ull) /* see conn_abandon_replies */
#define LGROUPS_MAX 4096u /* GET_LOCALs a connection may hold unreleased */
#define SPIN_NS 50000u    /* the event loop polls this long after activity */
#define LINGER_NS (10ull * 1000000000ull) /* see the local reads above */

typedef struct server {
    kvp__server_params_t p;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int epfd;
    evsrc_t listen_src, signal_src, timer_src, worker_src;
    kvp__store_t *store;
    conn_t *conns;
    conn_t *by_key[KEY_BUCKETS];
    uint64_t nconns, next_conn_id;
    int draining, stop;
    int rebuild;                /* SIGUSR2: replace the UCX worker (see worker_rebuild) */
    uint64_t local_replied;     /* bytes this progress pass let clients copy (GET_LOCAL; see loop) */
    uint64_t drain_deadline_ns;
    uint64_t inflight;          /* requests not yet answered */
    uint64_t inflight_puts, inflight_replies, inflight_in_data; /* its parts, for diagnosis */
    struct reply *abandoned;    /* replies given up on (conn_abandon_replies), freed at exit */
    kvp_key_t *keys_buf;
    uint64_t *sizes_buf;
    char *discard;              /* sink for put bytes of keys not stored (see handle_put) */
    kvp__metrics_t *metrics;
    kvp__server_counters_t ctr;
} server_t;

/* A reply being sent: its header and the leases it reads from. */
typedef struct reply {
    struct reply *prev, *next; /* the connection's replies */
    int abandoned;             /* the peer is gone: only the struct is left */
    server_t *s;
    conn_t *c;
    kvp__mpw_t w;
    uint8_t wbuf[256];
    uint32_t nleases;       /* leases taken (iov entries used) */
    uint32_t cap;           /* entries allocated in leases[] and iov[] */
    kvp__lease_t **leases;
    ucp_dt_iov_t *iov;
    uint64_t t0;
    uint32_t op;
    struct reply *tx_next;     /* lane: the connection's send queue */
    uint64_t tx_done;          /* lane: bytes of the frame written */
    uint8_t head[KVP_LANE_HEAD];
} reply_t;

/* One GET_LOCAL's leases, held for the client until it sends RELEASE. */
typedef struct lgroup {
    struct lgroup *next;
    uint64_t req_id;
    uint64_t bytes;
    uint32_t n, cap;
    kvp__lease_t *leases[];
} lgroup_t;

/* A put whose payload is still arriving. */
typedef struct put_ctx {
    server_t *s;
    conn_t *c;
    uint64_t req_id;
    uint32_t n;
    uint64_t t0;
    kvp__resv_t **resv;     /* NULL entry: key not being stored */
    kvp_key_result_t *res;
    ucp_dt_iov_t *iov;
    kvp_status_t refuse;    /* lane: the values are read and dropped, the put answered with this */
} put_ctx_t;

static conn_t *conn_by_key(server_t *s, uint64_t key)
{
    for (conn_t *c = s->by_key[key % KEY_BUCKETS]; c; c = c->hnext)
        if (c->key == key)
            return c;
    return NULL;
}

static int conn_live(const conn_t *c) { return c->state == CONN_READY; }

/* ---- local reads: leases held for clients that map the arena ---- */

static void lgroup_free(server_t *s, lgroup_t *g)
{
    for (uint32_t i = 0; i < g->n; i++)
        kvp__store_release(s->store, g->leases[i]);
    atomic_fetch_sub(&s->ctr.local_leases, g->n);
    atomic_fetch_sub(&s->ctr.local_bytes, g->bytes);
    kvp__free(g, sizeof *g + g->cap * sizeof g->leases[0]);
}

/* RELEASE: the client has copied what GET_LOCAL req_id leased. */
static void lgroup_release(server_t *s, conn_t *c, uint64_t req_id)
{
    for (lgroup_t **gp = &c->lgroups; *gp; gp = &(*gp)->next) {
        if ((*gp)->req_id == req_id) {
            lgroup_t *g = *gp;
            *gp = g->next;
            c->nlgroups--;
            lgroup_free(s, g);
            return;
        }
    }
    atomic_fetch_add(&s->ctr.bad_requests, 1);
    kvp_warn("server: conn %llu released request %llu, which holds no leases", (unsigned long long)c->id,
             (unsigned long long)req_id);
}

/* A request's released field: GET_LOCALs the client has copied since. */
static void apply_released(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    for (uint32_t i = 0; i < rq->nreleased; i++)
        lgroup_release(s, c, rq->released[i]);
}

static void lgroup_release_all(server_t *s, conn_t *c)
{
    while (c->lgroups) {
        lgroup_t *g = c->lgroups;
        c->lgroups = g->next;
        lgroup_free(s, g);
    }
    c->nlgroups = 0;
}

/* ---- replies ---- */

/* Ends a reply's claim on its connection: releases its leases and counts it
 * done.  The struct itself stays if UCX may still call back with it. */
static void reply_detach(reply_t *r)
{
    for (uint32_t i = 0; i < r->nleases; i++)
        kvp__store_release(r->s->store, r->leases[i]);
    r->nleases = 0;
    if (r->prev)
        r->prev->next = r->next;
    else
        r->c->replies = r->next;
    if (r->next)
        r->next->prev = r->prev;
    r->c->inflight--;
    r->s->inflight--;
    r->s->inflight_replies--;
    r->c = NULL;
}

static void reply_free(reply_t *r)
{
    if (!r->abandoned) {
        reply_detach(r);
    } else {
        if (r->prev)
            r->prev->next = r->next;
        else
            r->s->abandoned = r->next;
        if (r->next)
            r->next->prev = r->prev;
    }
    kvp__free(r->leases, r->cap * sizeof *r->leases);
    kvp__free(r->iov, r->cap * sizeof *r->iov);
    kvp__mpw_free(&r->w);
    kvp__free(r, sizeof *r);
}

/* The peer of c is gone and its endpoint closed, yet some sends never
 * completed (without peer-failure handling UCX does not purge a rendezvous
 * send whose receiver died): the peer will never read those bytes, so the
 * leases are released now; the structs are freed if UCX ever calls back. */
static void conn_abandon_replies(conn_t *c)
{
    while (c->replies) {
        reply_t *r = c->replies;
        server_t *s = r->s;
        reply_detach(r);
        r->abandoned = 1;
        r->prev = NULL;
        r->next = s->abandoned;
        if (s->abandoned)
            s->abandoned->prev = r;
        s->abandoned = r;
    }
}

static void reply_sent(void *request, ucs_status_t status, void *user_data)
{
    reply_t *r = user_data;
    if (status != UCS_OK && !r->abandoned)
        kvp_debug("server: reply to conn %llu not delivered: %s", (unsigned long long)r->c->id,
                  ucs_status_string(status));
    if (!r->abandoned)
        kvp__metrics_observe(&r->s->ctr, r->op, kvp__now_ns() - r->t0);
    reply_free(r);
    ucp_request_free(request);
}

static reply_t *reply_new(server_t *s, conn_t *c, uint32_t op)
{
    reply_t *r = kvp__calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->s = s;
    r->c = c;
    r->op = op;
    r->t0 = kvp__now_ns();
    kvp__mpw_init(&r->w, r->wbuf, sizeof r->wbuf);
    r->next = c->replies;
    if (c->replies)
        c->replies->prev = r;
    c->replies = r;
    c->inflight++;
    s->inflight++;
    s->inflight_replies++;
    return r;
}

static void lane_tx(server_t *s, conn_t *c);

/* Sends r (its header plus, for get, the leased slices) and takes ownership. */
static void reply_send(reply_t *r)
{
    if (r->w.err || !conn_live(r->c)) {
        if (r->w.err)
            kvp_error("server: out of memory encoding a reply");
        reply_free(r);
        return;
    }
    if (r->c->lane) {
        uint64_t bytes = 0;
        for (uint32_t i = 0; i < r->nleases; i++)
            bytes += r->iov[i].length;
        kvp__lane_head_encode(r->head, (uint32_t)r->w.len, bytes);
        conn_t *c = r->c;
        c->tx_count++;
        c->tx_bytes += KVP_LANE_HEAD + r->w.len + bytes;
        if (c->tx_tail)
            c->tx_tail->tx_next = r;
        else
            c->tx_head = r;
        c->tx_tail = r;
        if (!c->tx_wait)
            lane_tx(r->s, c);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = reply_sent,
        .user_data = r,
    };
    const void *data = NULL;
    size_t count = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < r->nleases; i++)
        bytes += r->iov[i].length;
    if (bytes >= KVP_RNDV_MIN) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_AM_SEND_FLAG_RNDV;
    }
    if (r->nleases == 1) {
        data = r->iov[0].buffer;
        count = r->iov[0].length;
    } else if (r->nleases) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype = ucp_dt_make_iov();
        data = r->iov;
        count = r->nleases;
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(r->c->ep, KVP_AM_REPLY, r->w.buf, r->w.len, data, count, &prm);
    if (sp == NULL) {
        kvp__metrics_observe(&r->s->ctr, r->op, kvp__now_ns() - r->t0);
        reply_free(r);
    } else if (UCS_PTR_IS_ERR(sp)) {
        kvp_debug("server: reply send failed: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
        reply_free(r);
    }
}

static void reply_status(server_t *s, conn_t *c, uint32_t op, uint64_t req_id, kvp_status_t st)
{
    reply_t *r = reply_new(s, c, op);
    if (!r)
        return;
    kvp__wire_reply_begin(&r->w, op, req_id, st, 0);
    reply_send(r);
}

/* A reply's latency is observed when it has been sent, counted from t0
 * (when the request arrived: for a put, before its values did). */
static void reply_results_since(server_t *s, conn_t *c, uint32_t op, uint64_t req_id,
                                const kvp_key_result_t *res, uint32_t n, int sizes, uint64_t t0)
{
    reply_t *r = reply_new(s, c, op);
    if (!r)
        return;
    r->t0 = t0;
    kvp__wire_reply_begin(&r->w, op, req_id, KVP_OK, 1);
    kvp__mpw_array(&r->w, n);
    for (uint32_t i = 0; i < n; i++) {
        kvp__mpw_array(&r->w, 2);
        kvp__mpw_int(&r->w, res[i].status);
        kvp__mpw_uint(&r->w, sizes ? res[i].size : res[i].flags);
    }
    reply_send(r);
}

static void reply_results(server_t *s, conn_t *c, uint32_t op, uint64_t req_id,
                          const kvp_key_result_t *res, uint32_t n, int sizes)
{
    reply_results_since(s, c, op, req_id, res, n, sizes, kvp__now_ns());
}

/* ---- put ---- */

static void put_finish(put_ctx_t *pc, ucs_status_t recv_status)
{
    server_t *s = pc->s;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < pc->n; i++) {
        if (!pc->resv[i])
            continue;
        if (recv_status != UCS_OK) {
            kvp__store_abort(s->store, pc->resv[i]);
            pc->res[i].status = kvp__ucx_status(recv_status);
            continue;
        }
        uint32_t flags = 0;
        pc->res[i].status = kvp__store_commit(s->store, pc->resv[i], &flags);
        pc->res[i].flags = flags;
        bytes += pc->res[i].size;
    }
    atomic_fetch_add(&s->ctr.bytes_in, bytes);
    if (recv_status != UCS_OK)
        kvp_warn("server: put payload from conn %llu failed (%s); %u reservation(s) aborted",
                 (unsigned long long)pc->c->id, ucs_status_string(recv_status), pc->n);
    if (conn_live(pc->c) && pc->refuse != KVP_OK)
        reply_status(s, pc->c, KVP_WOP_PUT, pc->req_id, pc->refuse);
    else if (conn_live(pc->c))
        reply_results_since(s, pc->c, KVP_WOP_PUT, pc->req_id, pc->res, pc->n, 0, pc->t0);
    pc->c->inflight--;
    s->inflight--;
    s->inflight_puts--;
    kvp__free(pc->resv, pc->n * sizeof *pc->resv);
    kvp__free(pc->res, pc->n * sizeof *pc->res);
    kvp__free(pc->iov, pc->n * sizeof *pc->iov);
    kvp__free(pc, sizeof *pc);
}

static void put_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    put_finish(user_data, status);
    ucp_request_free(request);
}

/* Reserves a slot for every value of a put (none when refuse is an error:
 * the values are then dropped); returns the context whose iov[] says where
 * each value goes, or NULL (out of memory; answered).  *stored_p: how many
 * slots were reserved. */
static put_ctx_t *put_prepare(server_t *s, conn_t *c, const kvp__wire_req_t *rq, kvp_status_t refuse,
                              uint32_t *stored_p)
{
    uint32_t n = rq->nkeys;
    put_ctx_t *pc = kvp__calloc(1, sizeof *pc);
    kvp__resv_t **resv = kvp__calloc(n ? n : 1, sizeof *resv);
    kvp_key_result_t *res = kvp__calloc(n ? n : 1, sizeof *res);
    ucp_dt_iov_t *iov = kvp__calloc(n ? n : 1, sizeof *iov);
    if (!pc || !resv || !res || !iov) {
        kvp__free(pc, sizeof *pc);
        kvp__free(resv, (n ? n : 1) * sizeof *resv);
        kvp__free(res, (n ? n : 1) * sizeof *res);
        kvp__free(iov, (n ? n : 1) * sizeof *iov);
        reply_status(s, c, KVP_WOP_PUT, rq->req_id, KVP_ERR_NO_MEMORY);
        return NULL;
    }
    *pc = (put_ctx_t){s, c, rq->req_id, n, kvp__now_ns(), resv, res, iov, refuse};
    c->inflight++;
    s->inflight++;
    s->inflight_puts++;
    uint32_t stored = 0;
    for (uint32_t i = 0; i < n; i++) {
        void *dst = NULL;
        uint32_t flags = 0;
        res[i].size = rq->sizes[i];
        kvp_status_t st = KVP_OK;
        if (refuse != KVP_OK)
            st = refuse;
        else if (rq->sizes[i] > kvp__store_max_value(s->store))
            st = KVP_ERR_VALUE_TOO_LARGE;
        else
            st = kvp__store_reserve(s->store, rq->keys[i].data, rq->keys[i].len, rq->sizes[i], 1,
                                    &resv[i], &dst, &flags);
        res[i].status = st;
        res[i].flags = flags;
        iov[i].buffer = dst ? dst : s->discard;
        iov[i].length = rq->sizes[i];
        stored += dst != NULL;
    }
    *stored_p = stored;
    return pc;
}

static ucs_status_t handle_put(server_t *s, conn_t *c, const kvp__wire_req_t *rq, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    uint32_t n = rq->nkeys, stored = 0;
    put_ctx_t *pc = put_prepare(s, c, rq, KVP_OK, &stored);
    if (!pc)
        return UCS_OK;
    kvp__resv_t **resv = pc->resv;
    ucp_dt_iov_t *iov = pc->iov;
    if (stored == 0) {
        /* Nothing to keep (every key existed or had no space): returning
         * without receiving drops a rendezvous descriptor, so those bytes
         * never even cross; the reply says what happened to each key. */
        put_finish(pc, UCS_OK);
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        /* Eager: the bytes are here already. */
        const char *src = data;
        for (uint32_t i = 0; i < n; i++) {
            if (resv[i])
                memcpy(iov[i].buffer, src, iov[i].length);
            src += iov[i].length;
        }
        (void)length;
        put_finish(pc, UCS_OK);
        return UCS_OK;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = put_received,
        .user_data = pc,
    };
    void *buf = iov;
    size_t count = n;
    if (n == 1) {
        prm.datatype = ucp_dt_make_contig(1);
        buf = iov[0].buffer;
        count = iov[0].length;
    } else {
        prm.datatype = ucp_dt_make_iov();
    }
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(s->worker, data, buf, count, &prm);
    if (sp == NULL)
        put_finish(pc, UCS_OK);
    else if (UCS_PTR_IS_ERR(sp))
        put_finish(pc, UCS_PTR_STATUS(sp));
    return UCS_OK;
}

/* ---- other ops ---- */

/* GET, or GET_LOCAL: the values' offsets in the arena instead of their
 * bytes, their leases kept for the client (an lgroup) until it releases
 * them. */
static void handle_get(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    uint32_t n = rq->nkeys, cap = n ? n : 1;
    int local = rq->op == KVP_WOP_GET_LOCAL;
    if (local && kvp__store_arena_fd(s->store) < 0) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp_warn("server: conn %llu sent a local read, but this server's arena is private",
                 (unsigned long long)c->id);
        reply_status(s, c, rq->op, rq->req_id, KVP_ERR_PROTOCOL);
        return;
    }
    if (local && c->nlgroups >= LGROUPS_MAX) {
        kvp_warn("server: conn %llu holds %u unreleased local reads; refusing more", (unsigned long long)c->id,
                 c->nlgroups);
        reply_status(s, c, rq->op, rq->req_id, KVP_ERR_BUSY);
        return;
    }
    reply_t *r = reply_new(s, c, rq->op);
    if (!r)
        return;
    lgroup_t *g = NULL;
    if (local) {
        if ((g = kvp__malloc(sizeof *g + cap * sizeof g->leases[0])))
            *g = (lgroup_t){.req_id = rq->req_id, .cap = cap};
    } else {
        r->cap = cap;
        r->leases = kvp__calloc(cap, sizeof *r->leases);
        r->iov = kvp__calloc(cap, sizeof *r->iov);
    }
    if (local ? !g : (!r->leases || !r->iov)) {
        kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_ERR_NO_MEMORY, 0);
        reply_send(r);
        return;
    }
    void *arena = NULL;
    size_t arena_len = 0;
    kvp__store_arena(s->store, &arena, &arena_len);
    kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_OK, 1);
    kvp__mpw_array(&r->w, n);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        const void *p;
        uint64_t size;
        kvp__lease_t *l;
        kvp_status_t st = kvp__store_acquire(s->store, rq->keys[i].data, rq->keys[i].len, &p, &size, &l);
        if (st == KVP_OK && size > rq->sizes[i]) {
            kvp__store_release(s->store, l);
            st = KVP_ERR_BUFFER_TOO_SMALL;
        }
        if (st == KVP_OK && local) {
            g->leases[g->n++] = l;
        } else if (st == KVP_OK) {
            r->leases[r->nleases] = l;
            r->iov[r->nleases].buffer = (void *)p;
            r->iov[r->nleases].length = size;
            r->nleases++;
        }
        if (st == KVP_OK)
            bytes += size;
        kvp__mpw_array(&r->w, local ? 3 : 2);
        kvp__mpw_int(&r->w, st);
        kvp__mpw_uint(&r->w, size);
        if (local)
            kvp__mpw_uint(&r->w, st == KVP_OK ? (uint64_t)((const uint8_t *)p - (const uint8_t *)arena) : 0);
    }
    if (g && g->n) {
        g->bytes = bytes;
        g->next = c->lgroups;
        c->lgroups = g;
        c->nlgroups++;
        atomic_fetch_add(&s->ctr.local_leases, g->n);
        atomic_fetch_add(&s->ctr.local_bytes, bytes);
        s->local_replied += bytes;
    } else if (g) {
        kvp__free(g, sizeof *g + g->cap * sizeof g->leases[0]);
    }
    atomic_fetch_add(&s->ctr.bytes_out, bytes);
    reply_send(r);
}

static void handle_simple(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    uint32_t n = rq->nkeys;
    reply_t *r;
    switch (rq->op) {
    case KVP_WOP_EXISTS: {
        r = reply_new(s, c, rq->op);
        if (!r)
            return;
        uint8_t *present = kvp__malloc(n ? n : 1);
        if (!present) {
            kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_ERR_NO_MEMORY, 0);
        } else {
            kvp__store_exists_batch(s->store, rq->keys, n, present);
            kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_OK, 1);
            kvp__mpw_bin(&r->w, present, n);
            kvp__free(present, n ? n : 1);
        }
        reply_send(r);
        return;
    }
    case KVP_WOP_PREFIX:
        r = reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_OK, 1);
        kvp__mpw_uint(&r->w, kvp__store_prefix(s->store, rq->keys, n));
        reply_send(r);
        return;
    case KVP_WOP_REMOVE:
    case KVP_WOP_PIN:
    case KVP_WOP_UNPIN: {
        kvp_key_result_t *res = kvp__calloc(n ? n : 1, sizeof *res);
        if (!res) {
            reply_status(s, c, rq->op, rq->req_id, KVP_ERR_NO_MEMORY);
            return;
        }
        for (uint32_t i = 0; i < n; i++)
            res[i].status = rq->op == KVP_WOP_REMOVE
                                ? kvp__store_remove(s->store, rq->keys[i].data, rq->keys[i].len)
                                : kvp__store_pin(s->store, rq->keys[i].data, rq->keys[i].len,
                                                 rq->op == KVP_WOP_PIN);
        reply_results(s, c, rq->op, rq->req_id, res, n, 0);
        kvp__free(res, (n ? n : 1) * sizeof *res);
        return;
    }
    case KVP_WOP_REMOVE_ALL: {
        uint64_t removed = kvp__store_remove_all(s->store);
        kvp_info("server: remove_all from conn %llu dropped %llu objects", (unsigned long long)c->id,
                 (unsigned long long)removed);
        r = reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_OK, 1);
        kvp__mpw_uint(&r->w, removed);
        reply_send(r);
        return;
    }
    case KVP_WOP_STATS: {
        kvp_pool_stats_t st;
        kvp__store_stats(s->store, &st);
        r = reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_OK, 1);
        const uint64_t *f = (const uint64_t *)&st;
        kvp__mpw_array(&r->w, (uint32_t)KVP_WIRE_NSTATS);
        for (size_t i = 0; i < KVP_WIRE_NSTATS; i++)
            kvp__mpw_uint(&r->w, f[i]);
        reply_send(r);
        return;
    }
    default:
        reply_status(s, c, rq->op, rq->req_id, KVP_ERR_PROTOCOL);
    }
}

static int token_ok(const server_t *s, const uint8_t *tok, uint32_t len)
{
    size_t want = strlen(s->p.token);
    unsigned diff = (unsigned)(want ^ len);
    for (size_t i = 0; i < want; i++)
        diff |= (unsigned)(s->p.token[i] ^ (i < len ? tok[i] : 0));
    return diff == 0;
}

/* Closes a connection's socket; its client holds no leases any more. */
static void conn_close_fd(server_t *s, conn_t *c)
{
    lgroup_release_all(s, c);
    if (c->src.fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->src.fd, NULL);
        close(c->src.fd);
        c->src.fd = -1;
    }
}

static void conn_kill(server_t *s, conn_t *c, const char *why)
{
    if (c->state == CONN_DEAD)
        return;
    if (c->state == CONN_READY)
        kvp_info("server: conn %llu closed: %s", (unsigned long long)c->id, why);
    else
        kvp_warn("server: handshake %llu dropped: %s", (unsigned long long)c->id, why);
    c->state = CONN_DEAD;
    c->dead_since_ns = kvp__now_ns();
    if (c->rx_put) {
        /* Values cut off mid-way: every reservation of that put is aborted. */
        put_ctx_t *pc = c->rx_put;
        c->rx_put = NULL;
        put_finish(pc, UCS_ERR_CONNECTION_RESET);
    }
    while (c->tx_head) {
        reply_t *r = c->tx_head;
        c->tx_head = r->tx_next;
        reply_free(r);
    }
    c->tx_tail = NULL;
    c->tx_count = 0;
    c->tx_bytes = 0;
    kvp__free(c->rx_buf, c->rx_cap);
    c->rx_buf = NULL;
    char b;
    ssize_t peek = c->lgroups && c->src.fd >= 0 ? recv(c->src.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) : 0;
    if (peek > 0 || (peek < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
        /* The client is alive and may be copying what it leased: tell it
         * the connection is over, and keep the leases until it closes. */
        shutdown(c->src.fd, SHUT_WR);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->src};
        epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->src.fd, &ev);
        c->linger_until_ns = kvp__now_ns() + LINGER_NS;
    } else {
        conn_close_fd(s, c);
    }
    kvp__free(c->hs_buf, HS_BUF_MAX);
    c->hs_buf = NULL;
}

/* HELLO's arena field: where a client on this host finds the arena's
 * memfd (/proc/PID/fd/FD, checked against dev and ino), or nil. */
static void hello_arena(server_t *s, kvp__mpw_t *w)
{
    int fd = kvp__store_arena_fd(s->store);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        kvp__mpw_nil(w);
        return;
    }
    void *base;
    size_t len;
    kvp__store_arena(s->store, &base, &len);
    kvp__mpw_array(w, 6);
    kvp__mpw_uint(w, (uint64_t)getpid());
    kvp__mpw_uint(w, (uint64_t)fd);
    kvp__mpw_uint(w, len);
    kvp__mpw_uint(w, (uint64_t)st.st_dev);
    kvp__mpw_uint(w, (uint64_t)st.st_ino);
    kvp__mpw_uint(w, s->p.no_prefault ? 0 : 1);
}

static void dispatch(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    apply_released(s, c, rq);
    atomic_fetch_add(&s->ctr.ops[rq->op], 1);
    if (rq->op == KVP_WOP_HELLO) {
        reply_t *r = reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_begin(&r->w, rq->op, rq->req_id, KVP_OK, 4);
        kvp__mpw_uint(&r->w, KVP_WIRE_VERSION);
        kvp__mpw_uint(&r->w, KVP_BATCH_MAX);
        kvp__mpw_uint(&r->w, kvp__store_max_value(s->store));
        hello_arena(s, &r->w);
        reply_send(r);
    } else if (rq->op == KVP_WOP_RELEASE) {
        lgroup_release(s, c, rq->req_id); /* (also while draining; never answered) */
    } else if (s->draining) {
        reply_status(s, c, rq->op, rq->req_id, KVP_ERR_CLOSED);
    } else if (rq->op == KVP_WOP_GET || rq->op == KVP_WOP_GET_LOCAL) {
        handle_get(s, c, rq);
    } else {
        handle_simple(s, c, rq);
    }
}

/* A request whose header came as the AM's data. */
static void handle_in_data(server_t *s, conn_t *c, const void *buf, size_t len)
{
    kvp__wire_req_t rq;
    kvp_status_t st = kvp__wire_req_decode(buf, len, &rq, s->keys_buf, s->sizes_buf, KVP_BATCH_MAX);
    if (st == KVP_OK && (rq.op == KVP_WOP_PUT || rq.op == KVP_WOP_IN_DATA || rq.conn_key != c->key))
        st = KVP_ERR_PROTOCOL;
    if (st != KVP_OK) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        reply_status(s, c, 0, 0, st);
        return;
    }
    dispatch(s, c, &rq);
}

typedef struct in_data {
    server_t *s;
    conn_t *c;
    void *buf;
    size_t len;
} in_data_t;

static void in_data_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    in_data_t *d = user_data;
    (void)length;
    d->c->inflight--;
    d->s->inflight--;
    d->s->inflight_in_data--;
    if (status == UCS_OK && conn_live(d->c))
        handle_in_data(d->s, d->c, d->buf, d->len);
    kvp__free(d->buf, d->len);
    kvp__free(d, sizeof *d);
    if (request)
        ucp_request_free(request);
}

static ucs_status_t on_request(void *arg, const void *header, size_t header_length, void *data,
                               size_t length, const ucp_am_recv_param_t *param)
{
    server_t *s = arg;
    atomic_fetch_add(&s->ctr.requests, 1);
    kvp__wire_req_t rq;
    kvp_status_t st = kvp__wire_req_decode(header, header_length, &rq, s->keys_buf, s->sizes_buf,
                                           KVP_BATCH_MAX);
    conn_t *c = st == KVP_OK ? conn_by_key(s, rq.conn_key) : NULL;
    if (!c || !conn_live(c)) {
        /* No connection to answer on: an undecodable header or an unknown
         * key (a closed connection's late message, or a forged one). */
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp_warn("server: request dropped (%s)", st != KVP_OK ? kvp_status_str(st) : "unknown connection key");
        return UCS_OK;
    }
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (rq.op == KVP_WOP_IN_DATA) {
        if (length == 0 || length > KVP_WIRE_HEADER_MAX) {
            atomic_fetch_add(&s->ctr.bad_requests, 1);
            reply_status(s, c, 0, rq.req_id, KVP_ERR_PROTOCOL);
            return UCS_OK;
        }
        if (!rndv) {
            handle_in_data(s, c, data, length);
            return UCS_OK;
        }
        in_data_t *d = kvp__calloc(1, sizeof *d);
        void *buf = kvp__malloc(length);
        if (!d || !buf) {
            kvp__free(d, sizeof *d);
            kvp__free(buf, length);
            reply_status(s, c, 0, rq.req_id, KVP_ERR_NO_MEMORY);
            return UCS_OK;
        }
        *d = (in_data_t){s, c, buf, length};
        c->inflight++;
        s->inflight++;
        s->inflight_in_data++;
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_DATATYPE,
            .cb.recv_am = in_data_received,
            .user_data = d,
            .datatype = ucp_dt_make_contig(1),
        };
        ucs_status_ptr_t sp = ucp_am_recv_data_nbx(s->worker, data, buf, length, &prm);
        if (sp == NULL || UCS_PTR_IS_ERR(sp))
            in_data_received(NULL, sp ? UCS_PTR_STATUS(sp) : UCS_OK, length, d);
        return UCS_OK;
    }
    if ((rq.op == KVP_WOP_PUT) != (length > 0) || (rq.op == KVP_WOP_PUT && length != rq.payload)) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp_warn("server: conn %llu sent %zu data bytes for a %s needing %llu",
                 (unsigned long long)c->id, length, rq.op == KVP_WOP_PUT ? "put" : "non-put",
                 (unsigned long long)rq.payload);
        reply_status(s, c, rq.op, rq.req_id, KVP_ERR_PROTOCOL);
        return UCS_OK;
    }
    if (rq.op == KVP_WOP_PUT) {
        apply_released(s, c, &rq);
        atomic_fetch_add(&s->ctr.ops[rq.op], 1);
        if (s->draining) {
            reply_status(s, c, rq.op, rq.req_id, KVP_ERR_CLOSED);
            return UCS_OK;
        }
        return handle_put(s, c, &rq, data, length, param);
    }
    dispatch(s, c, &rq);
    return UCS_OK;
}

/* ---- kvpool's TCP transport (net/lane.h) ---- */

/* What the event loop watches on a lane connection's socket. */
static void lane_watch(server_t *s, conn_t *c, int want_out, int paused)
{
    if (c->tx_wait == want_out && c->rx_paused == paused)
        return;
    c->tx_wait = want_out;
    c->rx_paused = paused;
    struct epoll_event ev = {.events = (paused ? 0u : EPOLLIN | EPOLLRDHUP) | (want_out ? EPOLLOUT : 0u),
                             .data.ptr = &c->src};
    epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->src.fd, &ev);
}

/* Writes queued replies (frame head, header, leased values) until the
 * socket is full; a written reply releases its leases. */
static void lane_tx(server_t *s, conn_t *c)
{
    while (c->tx_head && conn_live(c)) {
        reply_t *r = c->tx_head;
        struct iovec v[LANE_IOV_MAX];
        int n = 0;
        uint64_t skip = r->tx_done, total = 0;
        for (uint32_t i = 0; i < 2 + r->nleases; i++) {
            const char *b = i == 0 ? (const char *)r->head : i == 1 ? (const char *)r->w.buf : r->iov[i - 2].buffer;
            size_t l = i == 0 ? KVP_LANE_HEAD : i == 1 ? r->w.len : r->iov[i - 2].length;
            total += l;
            if (skip >= l) {
                skip -= l;
                continue;
            }
            if (n < LANE_IOV_MAX)
                v[n++] = (struct iovec){(void *)(b + skip), l - skip};
            skip = 0;
        }
        struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(c->src.fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                lane_watch(s, c, 1, c->rx_paused);
                return;
            }
            conn_kill(s, c, "send failed");
            return;
        }
        r->tx_done += (uint64_t)k;
        if (r->tx_done < total)
            continue;
        c->tx_head = r->tx_next;
        if (!c->tx_head)
            c->tx_tail = NULL;
        c->tx_count--;
        c->tx_bytes -= total;
        kvp__metrics_observe(&s->ctr, r->op, kvp__now_ns() - r->t0);
        reply_free(r);
    }
    /* All written: stop watching for room, and read requests again if that
     * had been paused. */
    if (conn_live(c))
        lane_watch(s, c, 0, 0);
}

/* One complete request frame header; data_len bytes of values follow. */
static void lane_request(server_t *s, conn_t *c, const uint8_t *hdr, uint32_t len, uint64_t data_len)
{
    atomic_fetch_add(&s->ctr.requests, 1);
    kvp__wire_req_t rq;
    kvp_status_t st = kvp__wire_req_decode(hdr, len, &rq, s->keys_buf, s->sizes_buf, KVP_BATCH_MAX);
    const char *why = NULL;
    if (st != KVP_OK)
        why = "undecodable request";
    else if (rq.op == KVP_WOP_IN_DATA || rq.conn_key != c->key)
        why = "request not valid on this connection";
    else if ((rq.op == KVP_WOP_PUT) != (data_len > 0) || (rq.op == KVP_WOP_PUT && data_len != rq.payload))
        why = "frame data do not match the request";
    if (why) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        if (st != KVP_OK && data_len == 0) {
            /* A header alone: answer it, the stream is still in step. */
            kvp_warn("server: conn %llu: %s (%s)", (unsigned long long)c->id, why, kvp_status_str(st));
            reply_status(s, c, 0, 0, st);
            return;
        }
        conn_kill(s, c, why);
        return;
    }
    if (rq.op != KVP_WOP_PUT) {
        dispatch(s, c, &rq);
        return;
    }
    apply_released(s, c, &rq);
    atomic_fetch_add(&s->ctr.ops[rq.op], 1);
    uint32_t stored;
    put_ctx_t *pc = put_prepare(s, c, &rq, s->draining ? KVP_ERR_CLOSED : KVP_OK, &stored);
    if (!pc) {
        conn_kill(s, c, "out of memory for a put");
        return;
    }
    /* The values are read next, straight into their slots (or dropped). */
    c->rx_put = pc;
    c->rx_left = data_len;
    c->rx_i = 0;
    c->rx_off = 0;
}

/* Reads what the socket has: frame heads, request headers, put values. */
static void lane_rx(server_t *s, conn_t *c)
{
    while (conn_live(c)) {
        ssize_t k;
        if (!c->rx_put && c->rx_len == 0 &&
            (c->tx_count >= LANE_TX_MAX_COUNT || c->tx_bytes >= LANE_TX_MAX_BYTES)) {
            /* Replies pile up unread: no more requests until they drain. */
            lane_watch(s, c, c->tx_wait, 1);
            return;
        }
        if (c->rx_put) {
            put_ctx_t *pc = c->rx_put;
            struct iovec v[LANE_IOV_MAX];
            int n = kvp__lane_iov_fill(v, LANE_IOV_MAX, pc->iov, pc->n, c->rx_i, c->rx_off);
            k = readv(c->src.fd, v, n);
            if (k <= 0) {
                if (k < 0 && errno == EINTR)
                    continue;
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    return;
                conn_kill(s, c, k == 0 ? "client closed its connection in the middle of a put" : "receive failed");
                return;
            }
            c->rx_left -= (uint64_t)k;
            kvp__lane_iov_advance(pc->iov, &c->rx_i, &c->rx_off, (size_t)k);
            if (c->rx_left == 0) {
                c->rx_put = NULL;
                put_finish(pc, UCS_OK);
            }
            continue;
        }
        size_t want = c->rx_len < KVP_LANE_HEAD ? KVP_LANE_HEAD : KVP_LANE_HEAD + (size_t)c->rx_hdr_len;
        k = recv(c->src.fd, c->rx_buf + c->rx_len, want - c->rx_len, 0);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            conn_kill(s, c, k == 0 ? (c->rx_len ? "client closed its connection mid-frame" : "client closed its connection")
                                   : "receive failed");
            return;
        }
        c->rx_len += (size_t)k;
        if (c->rx_len < want)
            continue;
        if (want == KVP_LANE_HEAD) {
            uint64_t data_len;
            if (kvp__lane_head_decode(c->rx_buf, &c->rx_hdr_len, &data_len) != 0) {
                atomic_fetch_add(&s->ctr.bad_requests, 1);
                conn_kill(s, c, "malformed frame head");
                return;
            }
            c->rx_left = data_len;
            size_t need = KVP_LANE_HEAD + (size_t)c->rx_hdr_len;
            if (need > c->rx_cap) {
                uint8_t *nb = kvp__malloc(need);
                if (!nb) {
                    conn_kill(s, c, "out of memory for a request header");
                    return;
                }
                memcpy(nb, c->rx_buf, KVP_LANE_HEAD);
                kvp__free(c->rx_buf, c->rx_cap);
                c->rx_buf = nb;
                c->rx_cap = need;
            }
            continue;
        }
        c->rx_len = 0;
        lane_request(s, c, c->rx_buf + KVP_LANE_HEAD, c->rx_hdr_len, c->rx_left);
        if (c->rx_cap > LANE_RX_START && conn_live(c) && !c->rx_put) {
            /* a large header was a one-off: give the memory back */
            uint8_t *nb = kvp__malloc(LANE_RX_START);
            if (nb) {
                kvp__free(c->rx_buf, c->rx_cap);
                c->rx_buf = nb;
                c->rx_cap = LANE_RX_START;
            }
        }
    }
}

/* ---- connections ---- */

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    server_t *s = arg;
    for (conn_t *c = s->conns; c; c = c->next)
        if (c->ep == ep && c->state == CONN_READY) {
            kvp_info("server: conn %llu endpoint failed (%s)", (unsigned long long)c->id,
                     ucs_status_string(status));
            conn_kill(s, c, "UCX endpoint failed");
        }
}

static uint64_t random_key(void)
{
    uint64_t k = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(&k, sizeof k, 1, f) != 1)
            k = 0;
        fclose(f);
    }
    k ^= kvp__now_ns() * 0x9e3779b97f4a7c15ull;
    return k ? k : 1;
}

/* The client's hello is complete in c->hs_buf: check it, open the endpoint,
 * answer. */
static void finish_handshake(server_t *s, conn_t *c, const kvp__hs_hello_t *h)
{
    uint8_t reply[KVP_HS_REPLY_FIXED + 4096];
    const uint8_t *a = (const uint8_t *)s->addr;
    if (s->p.token && (!h->token || !token_ok(s, h->token, h->token_len))) {
        atomic_fetch_add(&s->ctr.auth_failures, 1);
        size_t n = kvp__hs_encode_reply(reply, KVP_ERR_AUTH, 0, NULL, 0);
        (void)!send(c->src.fd, reply, n, MSG_NOSIGNAL);
        conn_kill(s, c, "wrong or missing token");
        return;
    }
    if (s->draining) {
        size_t n = kvp__hs_encode_reply(reply, KVP_ERR_CLOSED, 0, NULL, 0);
        (void)!send(c->src.fd, reply, n, MSG_NOSIGNAL);
        conn_kill(s, c, "server shutting down");
        return;
    }
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)h->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = on_ep_error, .arg = s},
    };
    /* No worker address: the client asks for kvpool's TCP transport. */
    c->lane = h->addr_len == 0;
    ucs_status_t st = UCS_OK;
    if (c->lane) {
        c->rx_buf = kvp__malloc(LANE_RX_START);
        c->rx_cap = LANE_RX_START;
        if (!c->rx_buf) {
            size_t n = kvp__hs_encode_reply(reply, KVP_ERR_NO_MEMORY, 0, NULL, 0);
            (void)!send(c->src.fd, reply, n, MSG_NOSIGNAL);
            conn_kill(s, c, "out of memory");
            return;
        }
    } else {
        st = ucp_ep_create(s->worker, &ep, &c->ep);
    }
    if (st != UCS_OK) {
        size_t n = kvp__hs_encode_reply(reply, KVP_ERR_IO, 0, NULL, 0);
        (void)!send(c->src.fd, reply, n, MSG_NOSIGNAL);
        c->ep = NULL;
        conn_kill(s, c, "cannot create a UCX endpoint to the client's address");
        return;
    }
    c->key = random_key();
    c->hnext = s->by_key[c->key % KEY_BUCKETS];
    s->by_key[c->key % KEY_BUCKETS] = c;
    size_t n = kvp__hs_encode_reply(reply, KVP_OK, c->key, a, (uint32_t)s->addr_len);
    if (s->addr_len > sizeof reply - KVP_HS_REPLY_FIXED ||
        send(c->src.fd, reply, n, MSG_NOSIGNAL) != (ssize_t)n) {
        conn_kill(s, c, "handshake reply not sent");
        return;
    }
    kvp__free(c->hs_buf, HS_BUF_MAX);
    c->hs_buf = NULL;
    c->state = CONN_READY;
    if (c->lane)
        atomic_fetch_add(&s->ctr.accepted_tcp, 1);
    atomic_fetch_add(&s->ctr.accepted, 1);
    kvp_debug("server: conn %llu ready (%s)", (unsigned long long)c->id, c->lane ? "tcp transport" : "UCX");
}

static void on_conn_readable(server_t *s, conn_t *c, uint32_t events)
{
    if (c->state == CONN_DEAD) {
        /* Lingering (see conn_kill): wait for the client's close. */
        char junk[4096];
        ssize_t k = recv(c->src.fd, junk, sizeof junk, 0);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) || (events & (EPOLLHUP | EPOLLERR)))
            conn_close_fd(s, c);
        return;
    }
    if (c->state == CONN_HANDSHAKE) {
        ssize_t k = recv(c->src.fd, c->hs_buf + c->hs_len, HS_BUF_MAX - c->hs_len, 0);
        if (k <= 0) {
            if (k == 0 || (errno != EAGAIN && errno != EINTR))
                conn_kill(s, c, "closed during the handshake");
            return;
        }
        c->hs_len += (size_t)k;
        kvp__hs_hello_t h;
        size_t used;
        kvp_status_t st = kvp__hs_parse_hello(c->hs_buf, c->hs_len, &h, &used);
        if (st == KVP_INPROGRESS)
            return;
        if (st != KVP_OK || used != c->hs_len) {
            atomic_fetch_add(&s->ctr.bad_requests, 1);
            conn_kill(s, c, st == KVP_ERR_VERSION ? "unsupported handshake version" : "not a kvpool handshake");
            return;
        }
        finish_handshake(s, c, &h);
        return;
    }
    if (c->lane) {
        if (events & (EPOLLHUP | EPOLLERR)) {
            conn_kill(s, c, "connection reset");
            return;
        }
        if (events & EPOLLOUT)
            lane_tx(s, c);
        if (events & (EPOLLIN | EPOLLRDHUP))
            lane_rx(s, c);
        return;
    }
    /* Ready: nothing may arrive on the socket; EOF means the client died. */
    char junk[256];
    ssize_t k = recv(c->src.fd, junk, sizeof junk, 0);
    if (k == 0 || (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)))
        conn_kill(s, c, "client closed its connection");
    else if (k > 0)
        conn_kill(s, c, "unexpected bytes on the control socket");
}

static void on_accept(server_t *s)
{
    for (;;) {
        int fd = accept4(s->listen_src.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        uint32_t maxc = s->p.max_conns ? s->p.max_conns : 1024;
        if (s->draining || s->nconns >= maxc) {
            kvp_warn("server: connection refused (%s)", s->draining ? "shutting down" : "too many connections");
            close(fd);
            continue;
        }
        conn_t *c = kvp__calloc(1, sizeof *c);
        uint8_t *buf = kvp__malloc(HS_BUF_MAX);
        if (!c || !buf) {
            kvp__free(c, sizeof *c);
            kvp__free(buf, HS_BUF_MAX);
            close(fd);
            continue;
        }
        c->src = (evsrc_t){SRC_CONN, fd};
        c->state = CONN_HANDSHAKE;
        c->hs_buf = buf;
        c->hs_deadline_ns = kvp__now_ns() + HS_TIMEOUT_NS;
        c->id = ++s->next_conn_id;
        c->next = s->conns;
        s->conns = c;
        s->nconns++;
        atomic_store(&s->ctr.connections, s->nconns);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->src};
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev);
    }
}

/* Frees dead connections whose requests have all finished; drops
 * handshakes that outlived their deadline (half-open connections). */
static void reap_conns(server_t *s, int check_deadlines)
{
    uint64_t now = check_deadlines ? kvp__now_ns() : 0;
    conn_t **pp = &s->conns;
    while (*pp) {
        conn_t *c = *pp;
        if (check_deadlines && c->state == CONN_HANDSHAKE && now > c->hs_deadline_ns)
            conn_kill(s, c, "handshake timed out");
        if (c->state == CONN_DEAD && c->ep) {
            /* A forced close cancels the connection's transfers in flight;
             * their callbacks run (and finish the requests) right here. */
            ucp_ep_h ep = c->ep;
            c->ep = NULL;
            kvp__ucx_ep_close_force(s->worker, ep);
        }
        if (c->state == CONN_DEAD && c->inflight && c->replies &&
            kvp__now_ns() - c->dead_since_ns > ABANDON_AFTER_NS) {
            kvp_warn("server: conn %llu: %llu send(s) to the departed peer never completed; "
                     "releasing their leases", (unsigned long long)c->id, (unsigned long long)c->inflight);
            conn_abandon_replies(c);
        }
        if (c->state == CONN_DEAD && c->src.fd >= 0 && check_deadlines && now > c->linger_until_ns) {
            kvp_warn("server: conn %llu: its client never closed; releasing %u local read(s)",
                     (unsigned long long)c->id, c->nlgroups);
            conn_close_fd(s, c);
        }
        if (c->state == CONN_DEAD && c->inflight == 0 && c->src.fd < 0) {
            *pp = c->next;
            conn_t **hp = &s->by_key[c->key % KEY_BUCKETS];
            while (*hp && *hp != c)
                hp = &(*hp)->hnext;
            if (*hp)
                *hp = c->hnext;
            s->nconns--;
            atomic_store(&s->ctr.connections, s->nconns);
            kvp__free(c, sizeof *c);
            continue;
        }
        pp = &c->next;
    }
}

static kvp_status_t start_listener(server_t *s)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(s->p.port)};
    if (inet_pton(AF_INET, s->p.host, &sa.sin_addr) != 1) {
        kvp_error("server: --listen host '%s' is not an IPv4 address", s->p.host);
        return KVP_ERR_INVALID_ARG;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0) {
        kvp_error("server: cannot listen on %s:%u: %s", s->p.host, s->p.port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return KVP_ERR_IO;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    s->p.port = ntohs(sa.sin_port);
    s->listen_src = (evsrc_t){SRC_LISTEN, fd};
    kvp_info("server: listening on %s:%u", s->p.host, s->p.port);
    return KVP_OK;
}

/* Writes the bound port to --port-file (atomically), once everything the
 * server serves is up: the file's appearance means ready. */
static void write_port_file(const server_t *s)
{
    if (!s->p.port_file)
        return;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->p.port_file);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%u\n", s->p.port);
        fclose(f);
        rename(tmp, s->p.port_file);
    }
}

static void add_fd(server_t *s, evsrc_t *src, src_kind_t kind, int fd)
{
    *src = (evsrc_t){kind, fd};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = src};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void on_signal(server_t *s)
{
    struct signalfd_siginfo si;
    while (read(s->signal_src.fd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGUSR2) { /* operator: replace the UCX worker */
            s->rebuild = 1;
            continue;
        }
        if (!s->draining) {
            kvp_info("server: signal %u: finishing %llu request(s) in flight, refusing new ones",
                     si.ssi_signo, (unsigned long long)s->inflight);
            s->drain_deadline_ns = kvp__now_ns() + DRAIN_MAX_NS;
        }
        s->draining = 1;
    }
}

/* Gives the current worker its request handler and address, and (once the
 * event loop exists) a place in it. */
static kvp_status_t worker_setup(server_t *s)
{
    if (kvp__ucx_am_handler(s->worker, KVP_AM_REQUEST, on_request, s) != UCS_OK ||
        ucp_worker_get_address(s->worker, &s->addr, &s->addr_len) != UCS_OK) {
        kvp_error("server: cannot set up the UCX worker");
        return KVP_ERR_IO;
    }
    if (s->epfd >= 0) {
        int wfd = -1;
        ucp_worker_get_efd(s->worker, &wfd);
        add_fd(s, &s->worker_src, SRC_WORKER, wfd);
    }
    return KVP_OK;
}

/* The worker has had events for a while that its progress cannot take: a
 * client killed in the middle of writing a message into the server's
 * shared-memory FIFO leaves a slot that is never completed, and every
 * message behind it, from every client, waits forever.  The only way out is
 * a new worker: its UCX connections are closed (those clients see the
 * connection lost and reconnect to the new worker's address), connections
 * on kvpool's TCP transport are not touched. */
static void worker_rebuild(server_t *s, int stuck)
{
    if (stuck)
        kvp_error("server: UCX worker stuck (events it cannot progress for %llu ms, likely a client killed "
                  "mid-message); replacing it, UCX clients reconnect",
                  (unsigned long long)(WEDGE_NS / 1000000ull));
    atomic_fetch_add(&s->ctr.worker_rebuilds, 1);
    for (conn_t *c = s->conns; c; c = c->next)
        if (!c->lane && c->state == CONN_READY)
            conn_kill(s, c, "UCX worker replaced");
    for (conn_t *c = s->conns; c; c = c->next) {
        if (c->ep) {
            ucp_ep_h ep = c->ep;
            c->ep = NULL;
            kvp__ucx_ep_close_force(s->worker, ep);
        }
        if (!c->lane)
            conn_abandon_replies(c); /* their sends die with the worker */
    }
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->worker_src.fd, NULL);
    ucp_worker_release_address(s->worker, s->addr);
    s->addr = NULL;
    ucp_worker_destroy(s->worker);
    s->worker = NULL;
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(s->ctx, &wp, &s->worker) != UCS_OK || worker_setup(s) != KVP_OK) {
        kvp_error("server: cannot create a new UCX worker; stopping");
        s->draining = 1;
        s->stop = 1;
    }
}

/* How long a client takes to copy bytes out of the arena: at 4 GB/s (a
 * slow single-core copy), never counted past 1 ms. */
static uint64_t copy_ns(uint64_t bytes)
{
    uint64_t ns = bytes / 4u;
    return ns < 1000000u ? ns : 1000000u;
}

static void loop(server_t *s)
{
    uint64_t spin_until = 0;
    kvp__ucx_armer_t armer = {0};
    for (;;) {
        if (s->stop)
            return;
        if (s->rebuild) {
            s->rebuild = 0;
            kvp_warn("server: SIGUSR2: replacing the UCX worker");
            worker_rebuild(s, 0);
            continue;
        }
        int did = 0;
        while (ucp_worker_progress(s->worker))
            did = 1;
        uint64_t now = kvp__now_ns();
        /* Keep polling 50 us after activity: lower latency.  After
         * answering local reads, for as long as their clients take to copy
         * the bytes as well: they send their next request (which releases
         * the leases) right after, and a sleeping server would add its
         * wake-up to every such get (docs/transport.md §9). */
        if (did)
            spin_until = now + SPIN_NS + copy_ns(s->local_replied);
        s->local_replied = 0;
        int timeout = now < spin_until ? 0 : (s->draining ? 10 : 1000);
        timeout = kvp__ucx_arm(s->worker, &armer, timeout, did, now, 0, WEDGE_NS);
        if (timeout < 0) {
            worker_rebuild(s, 1);
            continue;
        }
        struct epoll_event evs[16];
        int n = epoll_wait(s->epfd, evs, 16, timeout);
        for (int i = 0; i < n; i++) {
            evsrc_t *src = evs[i].data.ptr;
            switch (src->kind) {
            case SRC_LISTEN: on_accept(s); break;
            case SRC_CONN: on_conn_readable(s, (conn_t *)src, evs[i].events); break;
            case SRC_SIGNAL: on_signal(s); break;
            case SRC_TIMER: {
                uint64_t x;
                (void)!read(src->fd, &x, sizeof x);
                (void)kvp__store_reap(s->store);
                reap_conns(s, 1);
                break;
            }
            case SRC_WORKER: break;
            }
        }
        if (n == 0 || s->draining)
            reap_conns(s, 0);
        if (s->draining && s->inflight == 0)
            return;
        if (s->draining && kvp__now_ns() > s->drain_deadline_ns) {
            /* Transfers with peers that stopped answering: do not wait forever. */
            kvp_warn("server: gave up on %llu request(s) after %llu s of draining (puts %llu, "
                     "replies %llu, headers %llu)",
                     (unsigned long long)s->inflight, (unsigned long long)(DRAIN_MAX_NS / 1000000000ull),
                     (unsigned long long)s->inflight_puts, (unsigned long long)s->inflight_replies,
                     (unsigned long long)s->inflight_in_data);
            return;
        }
    }
}

kvp_status_t kvp__server_run(const kvp__server_params_t *params)
{
    kvp_status_t st;
    /* Block the stop signals before any thread exists (UCX starts some), so
     * every thread inherits the mask and they arrive only via the signalfd. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    server_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    s->p = *params;
    s->epfd = -1;
    s->keys_buf = kvp__calloc(KVP_BATCH_MAX, sizeof *s->keys_buf);
    s->sizes_buf = kvp__calloc(KVP_BATCH_MAX, sizeof *s->sizes_buf);
    /* The sink for the bytes of keys a batch put does not store (they
     * existed): one address range as large as the largest value, reserved
     * but never backed until written, and never freed while the server
     * runs, so receives in flight can always write into it. */
    s->discard = mmap(NULL, KVP_VALUE_MAX, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (s->discard == MAP_FAILED)
        s->discard = NULL;
    if (!s->keys_buf || !s->sizes_buf || !s->discard) {
        st = KVP_ERR_NO_MEMORY;
        goto err_bufs;
    }
    kvp__store_params_t sp;
    kvp__store_params_default(&sp);
    sp.capacity = params->memory;
    /* Faulted in at start: a server's arena is its whole reason to exist,
     * and first-touch page faults on the put path cost more than the copy
     * itself.  A memfd, so that clients on this host can map it and copy
     * values out themselves (local reads; docs/transport.md §9); else
     * anonymous memory with transparent huge pages. */
    sp.mem_kind = params->no_local_reads ? KVP_MEM_ANON : KVP_MEM_MEMFD;
    sp.huge = KVP_HUGE_AUTO;
    sp.prefault = !params->no_prefault;
    if (params->put_timeout_ns)
        sp.put_timeout_ns = params->put_timeout_ns;
    st = kvp__store_create(&sp, &s->store);
    if (st != KVP_OK)
        goto err_bufs;
    st = kvp__ucx_open("server", KVP_UCX_SERVER, &s->ctx, &s->worker);
    if (st != KVP_OK)
        goto err_store;
    st = worker_setup(s);
    if (st != KVP_OK)
        goto err_ucx;
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    st = start_listener(s);
    if (st != KVP_OK)
        goto err_addr;
    if (params->metrics_port) {
        st = kvp__metrics_start(params->metrics_port, s->store, &s->ctr, &s->metrics);
        if (st != KVP_OK)
            goto err_listener;
    }
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    struct itimerspec its = {{1, 0}, {1, 0}};
    timerfd_settime(tfd, 0, &its, NULL);
    int wfd = -1;
    ucp_worker_get_efd(s->worker, &wfd);
    add_fd(s, &s->signal_src, SRC_SIGNAL, sfd);
    add_fd(s, &s->timer_src, SRC_TIMER, tfd);
    add_fd(s, &s->worker_src, SRC_WORKER, wfd);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &s->listen_src};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_src.fd, &lev);
    write_port_file(s);
    kvp_info("server: ready (arena %llu bytes, UCX transports %s, token %s)",
             (unsigned long long)params->memory, kvp__ucx_transports(s->ctx),
             params->token ? "required" : "none");

    loop(s);

    kvp_info("server: stopped");
    close(tfd);
    close(sfd);
    for (conn_t *c = s->conns; c; c = c->next) {
        conn_kill(s, c, "server stopping");
        conn_close_fd(s, c); /* (a lingering one too: the process ends) */
    }
    reap_conns(s, 0);
    kvp__metrics_stop(s->metrics);
    st = KVP_OK;
err_listener:
    close(s->listen_src.fd);
err_addr:
    if (s->epfd >= 0)
        close(s->epfd);
    ucp_worker_release_address(s->worker, s->addr);
err_ucx:
    kvp__ucx_close(s->ctx, s->worker);
    /* The worker is gone, so no callback can still come for these. */
    while (s->abandoned)
        reply_free(s->abandoned);
err_store:
    kvp__store_destroy(s->store);
err_bufs:
    if (s->discard)
        munmap(s->discard, KVP_VALUE_MAX);
    kvp__free(s->keys_buf, KVP_BATCH_MAX * sizeof *s->keys_buf);
    kvp__free(s->sizes_buf, KVP_BATCH_MAX * sizeof *s->sizes_buf);
    kvp__free(s, sizeof *s);
    return st;
}
