/*
 * kvpool://HOST:PORT — the pool on a kvpool server, over UCX active messages
 * or kvpool's own TCP transport (net/lane.h).
 *
 * Options: timeout (default call timeout, e.g. 5s), token_file (the shared
 * secret's file; or env KVPOOL_TOKEN), transport (auto, ucx, tcp),
 * local_reads (auto, off).
 *
 * Local reads (client/local_read.h).  Over UCX to a server on this host
 * whose arena this process can map, a get of at least LOCAL_MIN bytes of
 * capacity goes as GET_LOCAL: the reply names each value's offset in the
 * arena, the values are copied out of the mapping (streaming stores), then
 * a RELEASE ends the server's leases.  The copy holds the
 * connection like a sender does, so its socket (whose close would end the
 * leases) stays open until the copy is done.
 *
 * TCP transport.  Requests are written whole, one thread at a time (tx_mu),
 * a put's values straight from the caller's buffers; replies are read by
 * whoever holds rx_mu (a driving caller, else the progress thread), a get's
 * values straight into the caller's buffers.  The socket closes only with
 * both locks held, so no write or read is ever on a closed (or reused)
 * descriptor, and an op fails only after its bytes stopped moving.
 *
 * Threads.  One UCX worker in multi-thread mode.  Callers' threads encode and
 * post requests themselves; a progress thread sleeps on the worker's event fd
 * and runs every callback (replies, send and receive completions), checks
 * deadlines and tears broken connections down.  The client's own mutex is
 * never held across a UCX call (UCX callbacks take it, so holding it around
 * one would invert the lock order).
 *
 * An op completes when both its request send has completed (UCX no longer
 * reads the caller's buffers) and its reply has been fully received (get
 * values are in the caller's buffers), then its callback fires, once.
 *
 * Failures.  When the endpoint fails (server gone) or an op's deadline passes,
 * the connection is torn down with a forced close, which completes every
 * outstanding UCX request; every op of that connection then completes with
 * KVP_ERR_CONN_LOST (KVP_ERR_TIMEOUT for those past their deadline).  The
 * next op reconnects, no sooner than an exponential backoff (100 ms .. 5 s)
 * after the last failed attempt; ops in the backoff window fail at once with
 * KVP_ERR_CONN_LOST.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <ifaddrs.h>
#include <time.h>
#include <unistd.h>

#include "client/backend.h"
#include "client/local_read.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"
#include "net/handshake.h"
#include "net/lane.h"
#include "net/ucx.h"
#include "net/ucx_addr.h"
#include "net/wire.h"

#define NBUCKETS 256

/* One caller op.  Large batches travel as several requests, each a slice of
 * the keys, all posted at once (one round trip): at most KVP_SLICE_KEYS keys
 * per request, so every reply header fits an AM header, and for puts few
 * enough keys that the request header does too (put data are the values). */
#define KVP_SLICE_KEYS 256u
typedef struct opctx {
    kvp_op_t *op;
    uint32_t left;          /* requests not finished */
    kvp_status_t status;    /* first failure */
    size_t prefix;          /* PREFIX: min over slices of off + m where m < cnt */
} opctx_t;

typedef struct pending {
    struct pending *next;
    opctx_t *parent;              /* NULL for internal ops (stats) */
    uint32_t off, cnt;            /* the slice of the op's keys */
    uint64_t payload_bytes;       /* PUT: value bytes this request carries */
    uint64_t req_id;
    uint32_t wop;
    int gen;
    kvp_op_t *op;                 /* parent->op, or NULL */
    int send_done, reply_done, timed_out;
    int recv_active;              /* UCX is receiving its values: only that receive's end finishes it */
    kvp_status_t status;
    uint64_t deadline_ns;
    kvp__mpw_t w;                 /* the request header */
    uint8_t wbuf[512];
    kvp__mpw_t w2;                /* IN_DATA: the short header (w is then the data) */
    uint8_t w2buf[64];
    ucp_dt_iov_t *iov;            /* put sources / get destinations */
    uint32_t niov;
    /* internal ops */
    kvp_pool_stats_t *stats_out;
    uint64_t hello_max_value;
    kvp__arena_info_t hello_arena;
    int hello_has_arena;
    /* GET_LOCAL */
    kvp__lmap_t *lmap;            /* the mapping its offsets are in (a reference) */
    kvp__cpseg_t *segs;           /* what to copy */
    uint32_t nsegs, segs_cap;
    int release;                  /* the server leased something: RELEASE it */
    uint64_t lr_slot, lr_gen;     /* the lease table slot and its generation while leased */
    int repost;                   /* the server was busy: the slice goes again as a GET (progress thread) */
    int copying;                  /* its values are being copied: only that copy's end finishes it */
    int finished;
    int caller_drives;            /* its caller drives the worker: no need to wake the progress thread */
} pending_t;

/* A caller buffer registered with UCX (kvp_pool_register). */
typedef struct reg {
    struct reg *next;
    void *addr;
    ucp_mem_h memh;
} reg_t;

typedef struct remote {
    reg_t *regs;                   /* under mu */
    char host[256];
    uint16_t port;
    char *token;
    uint32_t timeout_ms;
    ucp_context_h ctx;
    ucp_worker_h worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t conn_mu;       /* one connect at a time */
    ucp_ep_h ep;
    int tcp_fd;                    /* the handshake socket: closes when the server dies */
    uint64_t conn_key;
    int epfd;                      /* the progress thread's */
    int connected;
    int gen;                       /* connection generation: bumped when one is lost */
    int senders;                   /* threads inside post() on the current connection */
    struct dead *dead;             /* lost connections the progress thread has yet to close */
    struct cbarg *cb_all, *cb_free; /* UCX callback arguments: all ever made, and the unused */
    pthread_rwlock_t wlock;        /* read: using the worker (drive, send); write: replacing it */
    int replacing;                 /* the worker is being replaced: no new connection meanwhile */
    int replace_req;               /* tests: replace it now (kvp__pool_test_recover) */
    uint64_t recv_active;          /* requests with recv_active set */
    _Atomic uint64_t progressed_ns; /* when any thread's progress last did something */
    int replaced;                  /* how many times it was */
    int wfd;                       /* the worker's event fd, in epfd */
    uint64_t next_retry_ns;
    uint32_t backoff_ms;
    pending_t *bucket[NBUCKETS];
    _Atomic uint64_t npending;     /* written under mu; read without it by drive */
    _Atomic uint64_t next_id;
    pthread_t thr;
    int stop;
    int wake_fd;
    _Atomic int driving;           /* caller threads driving the worker now */
    /* kvpool's TCP transport (net/lane.h) instead of UCX for this connection */
    int transport;                 /* URI option: TRANSPORT_* */
    int use_lane;                  /* decided at open: connect with the lane */
    _Atomic int lane;              /* the current connection is a lane */
    pthread_mutex_t tx_mu;         /* one frame written at a time; held while the socket closes */
    pthread_mutex_t rx_mu;         /* one reader at a time; held while the socket closes */
    int rx_gen;                    /* the connection the receive state below belongs to */
    uint8_t *rx_buf;               /* frame head + reply header */
    size_t rx_cap, rx_len;
    uint32_t rx_hdr_len;
    int rx_data;                   /* reading a reply's values */
    uint64_t rx_left;              /* their bytes still to come */
    pending_t *rx_p;               /* whose values (NULL: dropped into rx_sink) */
    uint32_t rx_i;
    size_t rx_off;
    char *rx_sink;
    uint64_t max_value;
    /* local reads */
    int local_reads;               /* URI option: 1 auto, 0 off */
    kvp__lmap_t *lmap;             /* the server's arena mapped (under mu) */
    int lmap_gen;                  /* the connection it belongs to */
    uint32_t local_inflight;       /* GET_LOCAL requests not finished */
    /* GET_LOCALs copied but not yet released (under mu): they ride on the
     * connection's next request (its released field), or go in a RELEASE
     * of their own once REL_FLUSH_NS has passed or KVP_RELEASED_MAX have
     * gathered; a lost connection drops them (its leases end with it). */
    uint64_t rel[KVP_RELEASED_MAX];
    uint32_t nrel;
    uint64_t rel_since_ns;
    pending_t *reposts;            /* GET_LOCALs the server was too busy for, to go again as GETs (under mu) */
} remote_t;

enum { TRANSPORT_AUTO, TRANSPORT_UCX, TRANSPORT_TCP };
#define LANE_RX_START 4096u
#define LANE_SINK 65536u
#define LANE_IOV_MAX 64
/* A get with less capacity than this goes over UCX even when local reads
 * are possible: below it UCX's eager messages come within 2 us, and the server
 * holds no leases for the client (docs/transport.md §9). */
#define LOCAL_MIN (16u * 1024u)
/* GET_LOCAL requests one connection keeps in flight at most (the server
 * refuses more than 4096 unreleased ones); beyond it gets go over UCX. */
#define LOCAL_INFLIGHT_MAX 1024u
/* How long a copied GET_LOCAL waits for a request to ride on before the
 * progress thread (which looks at least every 10 ms) releases it by a
 * message of its own (a RELEASE costs the client a send and the server a
 * wake-up, ~10 us; docs/transport.md §9). */
#define REL_FLUSH_NS 1000000ull

/* A lost connection, closed by the progress thread once no thread is still
 * sending on it (its endpoint or socket must outlive every send begun on
 * it), after which its requests fail. */
typedef struct dead {
    struct dead *next;
    ucp_ep_h ep;
    int fd;
    int gen;
    int graceful;                  /* close by flushing (kvp_pool_close of a healthy connection) */
    int senders;
} dead_t;

/* What a UCX send or receive callback is given: the request it is for.
 * Owned by the remote (freed at close), not by the callback, because UCX
 * never completes a rendezvous send whose receiver died: its argument
 * would leak. */
typedef struct cbarg {
    struct cbarg *next_all, *next_free;
    struct remote *r;
    uint64_t id;
} cbarg_t;

/* ---- the worker lock ----
 * Readers use the worker (drive it, send on its endpoints, connect on it);
 * the one writer replaces it.  Writers are preferred, or a stream of
 * driving callers would keep the replacement out forever; so a thread that
 * already reads (a completion callback that posts the next request) must
 * not take it again: the depth is kept per thread. */
static __thread const void *t_wlock_held;
static __thread int t_wlock_depth;

/* Returns what wunlock() needs to know. */
static int wlock_rd(pthread_rwlock_t *l)
{
    if (t_wlock_held == l) {
        t_wlock_depth++;
        return 0;
    }
    pthread_rwlock_rdlock(l);
    if (t_wlock_held)
        return 2; /* another remote's lock is held too: not tracked */
    t_wlock_held = l;
    t_wlock_depth = 1;
    return 1;
}

static void wunlock(pthread_rwlock_t *l, int how)
{
    if (how == 0) {
        t_wlock_depth--;
        return;
    }
    if (how == 1)
        t_wlock_held = NULL;
    pthread_rwlock_unlock(l);
}

/* ---- pending table (under mu) ---- */

static void do_add(remote_t *r, pending_t *p)
{
    pending_t **b = &r->bucket[p->req_id % NBUCKETS];
    p->next = *b;
    *b = p;
    r->npending++;
}

static pending_t *do_find(remote_t *r, uint64_t id)
{
    for (pending_t *p = r->bucket[id % NBUCKETS]; p; p = p->next)
        if (p->req_id == id)
            return p;
    return NULL;
}

static void do_remove(remote_t *r, pending_t *p)
{
    pending_t **pp = &r->bucket[p->req_id % NBUCKETS];
    while (*pp && *pp != p)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = p->next;
        r->npending--;
    }
}

static void pending_free(pending_t *p)
{
    kvp__lmap_put(p->lmap);
    kvp__free(p->segs, p->segs_cap * sizeof *p->segs);
    kvp__mpw_free(&p->w);
    kvp__mpw_free(&p->w2);
    kvp__free(p->iov, p->niov * sizeof *p->iov);
    kvp__free(p, sizeof *p);
}

static void wake(remote_t *r);

/* Called with mu held when a side of p finished: retires p if both did.
 * Returns the caller op to complete (after unlocking) when p was its last
 * request, else NULL. */
static opctx_t *do_maybe_done(remote_t *r, pending_t *p)
{
    if (!p->send_done || !p->reply_done || p->finished)
        return NULL;
    p->finished = 1;
    do_remove(r, p);
    if (p->wop == KVP_WOP_GET_LOCAL)
        r->local_inflight--;
    if (p->repost && p->parent && !p->timed_out && p->status == KVP_OK) {
        /* (the progress thread posts it again; its op stays open) */
        p->next = r->reposts;
        r->reposts = p;
        wake(r);
        return NULL;
    }
    opctx_t *oc = p->parent;
    if (!oc) {
        pthread_cond_broadcast(&r->cv);
        return NULL; /* an internal op: its waiter frees it */
    }
    if (p->status != KVP_OK && oc->status == KVP_OK)
        oc->status = p->status;
    pending_free(p);
    return --oc->left == 0 ? oc : NULL;
}

static void fire(opctx_t *oc)
{
    if (!oc)
        return;
    kvp_op_t *op = oc->op;
    kvp_status_t st = oc->status;
    if (op->type == KVP_OP_PREFIX && st == KVP_OK)
        *op->prefix_len = oc->prefix;
    kvp__free(oc, sizeof *oc);
    if (op->cb)
        op->cb(op->cb_arg, st);
}

static void do_fail_reply(pending_t *p, kvp_status_t st)
{
    if (p->reply_done)
        return;
    p->reply_done = 1;
    p->status = p->timed_out ? KVP_ERR_TIMEOUT : st;
}

/* ---- UCX callbacks (progress thread) ---- */

/* Takes a callback argument for request id (mu not held); NULL: no memory. */
static cbarg_t *cb_arg(remote_t *r, uint64_t id)
{
    pthread_mutex_lock(&r->mu);
    cbarg_t *a = r->cb_free;
    if (a) {
        r->cb_free = a->next_free;
    } else if ((a = kvp__calloc(1, sizeof *a))) {
        a->next_all = r->cb_all;
        r->cb_all = a;
    }
    if (a) {
        a->r = r;
        a->id = id;
    }
    pthread_mutex_unlock(&r->mu);
    return a;
}

/* Gives a back (mu held). */
static void do_cb_put(remote_t *r, cbarg_t *a)
{
    a->next_free = r->cb_free;
    r->cb_free = a;
}

static void on_send_done(void *request, ucs_status_t status, void *user_data)
{
    cbarg_t *a = user_data;
    remote_t *r = a->r;
    uint64_t id = a->id;
    pthread_mutex_lock(&r->mu);
    do_cb_put(r, a);
    pending_t *p = do_find(r, id);
    opctx_t *f = NULL;
    if (p) {
        p->send_done = 1;
        if (status != UCS_OK) {
            if (status != UCS_ERR_CANCELED)
                kvp_warn("remote: request %llu not sent: %s", (unsigned long long)id,
                         ucs_status_string(status));
            do_fail_reply(p, KVP_ERR_CONN_LOST);
        }
        f = do_maybe_done(r, p);
    }
    pthread_mutex_unlock(&r->mu);
    fire(f);
    if (request)
        ucp_request_free(request);
}

/* The receive of request id's values ended (mu held; unlocks): st, if
 * not OK, is its status unless it already failed otherwise. */
static void do_recv_end(remote_t *r, uint64_t id, kvp_status_t st)
{
    pending_t *p = do_find(r, id);
    opctx_t *f = NULL;
    if (p) {
        if (p->recv_active) {
            p->recv_active = 0;
            r->recv_active--;
        }
        if (st != KVP_OK && p->status == KVP_OK)
            p->status = st;
        p->reply_done = 1;
        f = do_maybe_done(r, p);
    }
    pthread_mutex_unlock(&r->mu);
    fire(f);
}

static void on_recv_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    cbarg_t *a = user_data;
    remote_t *r = a->r;
    uint64_t id = a->id;
    pthread_mutex_lock(&r->mu);
    do_cb_put(r, a);
    do_recv_end(r, id, status == UCS_OK ? KVP_OK : KVP_ERR_CONN_LOST);
    if (request)
        ucp_request_free(request);
}


/* GET_LOCAL's fields: n [status, size, offset].  Builds p->segs, the
 * copies from the mapped arena into the caller's buffers, checking every
 * range against the mapping and the buffers.  A reply that breaks the
 * protocol is still released (the server may hold leases for it). */
static kvp_status_t do_parse_local(pending_t *p, kvp__mpr_t *b)
{
    kvp_op_t *op = p->op;
    uint32_t n = kvp__mpr_array(b, KVP_BATCH_MAX);
    if (b->err || n != p->cnt || !p->lmap)
        goto bad;
    kvp_key_result_t *results = op->results + p->off;
    const kvp_sgl_t *values = op->values + p->off;
    uint32_t most = 0; /* segments, at most one per non-empty buffer piece */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < values[i].iovcnt; j++)
            most += values[i].iov[j].len != 0;
    if (most > p->segs_cap) {
        kvp__free(p->segs, p->segs_cap * sizeof *p->segs);
        p->segs_cap = 0;
        if (!(p->segs = kvp__calloc(most, sizeof *p->segs))) {
            p->release = 1;
            return KVP_ERR_NO_MEMORY;
        }
        p->segs_cap = most;
    }
    const uint8_t *base = kvp__lmap_base(p->lmap);
    uint64_t mapped = kvp__lmap_size(p->lmap);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kvp__mpr_array(b, 3) != 3)
            goto bad;
        int64_t ks = kvp__mpr_int(b);
        uint64_t size = kvp__mpr_uint(b), off = kvp__mpr_uint(b);
        if (b->err || ks > 0 || ks < -1000)
            goto bad;
        results[i].status = (kvp_status_t)ks;
        results[i].size = size;
        results[i].flags = 0;
        if (ks == KVP_ERR_BUSY)
            p->repost = 1; /* (the server holds too much for this connection: over the network then) */
        if (ks != KVP_OK)
            continue;
        p->release = 1;
        if (off > mapped || size > mapped - off)
            goto bad;
        for (uint32_t j = 0; j < values[i].iovcnt && size; j++) {
            size_t len = values[i].iov[j].len < size ? values[i].iov[j].len : (size_t)size;
            if (!len)
                continue;
            p->segs[k++] = (kvp__cpseg_t){values[i].iov[j].base, base + off, len};
            off += len;
            size -= len;
        }
        if (size) /* more than the caller's buffers hold */
            goto bad;
    }
    p->lr_slot = kvp__mpr_uint(b);
    p->lr_gen = kvp__mpr_uint(b);
    if (b->err || (p->release && !kvp__lmap_slot_ok(p->lmap, p->lr_slot)))
        goto bad;
    p->nsegs = k;
    return KVP_OK;
bad:
    p->release = 1;
    p->nsegs = 0;
    return KVP_ERR_PROTOCOL;
}

/* Parses the op fields of a reply into the op (mu held).  For GET, builds
 * p->iov over the caller's buffers for the values that follow. */
static kvp_status_t do_parse_reply(pending_t *p, kvp__wire_reply_t *rep, size_t data_len)
{
    kvp__mpr_t *b = &rep->body;
    kvp_op_t *op = p->op;
    uint32_t off = p->off, cnt = p->cnt;
    /* Only a get's reply carries values: anything else with data is a
     * server breaking the protocol (on the TCP transport those bytes would
     * otherwise land in the op's put sources). */
    if (data_len && (p->wop != KVP_WOP_GET || rep->status != KVP_OK))
        return KVP_ERR_PROTOCOL;
    if (rep->status != KVP_OK)
        return rep->status;
    switch (p->wop) {
    case KVP_WOP_HELLO:
        (void)kvp__mpr_uint(b);
        (void)kvp__mpr_uint(b);
        p->hello_max_value = kvp__mpr_uint(b);
        if (!b->err && b->p < b->end && !kvp__mpr_nil(b)) {
            /* the server's arena and lease table: [pid, fd, size, dev, ino,
             * populated, table fd, size, dev, ino] */
            if (kvp__mpr_array(b, 16) != 10)
                return KVP_ERR_PROTOCOL;
            kvp__arena_info_t *a = &p->hello_arena;
            a->pid = kvp__mpr_uint(b);
            a->fd = kvp__mpr_uint(b);
            a->size = kvp__mpr_uint(b);
            a->dev = kvp__mpr_uint(b);
            a->ino = kvp__mpr_uint(b);
            a->populated = kvp__mpr_uint(b) != 0;
            a->tfd = kvp__mpr_uint(b);
            a->tsize = kvp__mpr_uint(b);
            a->tdev = kvp__mpr_uint(b);
            a->tino = kvp__mpr_uint(b);
            p->hello_has_arena = !b->err;
        }
        break;
    case KVP_WOP_STATS: {
        uint32_t n = kvp__mpr_array(b, 64);
        uint64_t *f = (uint64_t *)p->stats_out;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t v = kvp__mpr_uint(b);
            if (i < KVP_WIRE_NSTATS && f)
                f[i] = v;
        }
        break;
    }
    case KVP_WOP_EXISTS: {
        uint32_t len;
        const uint8_t *bits = kvp__mpr_bytes(b, KVP_BATCH_MAX, &len);
        if (b->err || len != cnt)
            return KVP_ERR_PROTOCOL;
        memcpy(op->present + off, bits, len);
        break;
    }
    case KVP_WOP_PREFIX: {
        uint64_t m = kvp__mpr_uint(b);
        if (b->err || m > cnt)
            return KVP_ERR_PROTOCOL;
        if (m < cnt && off + m < p->parent->prefix)
            p->parent->prefix = off + (size_t)m;
        break;
    }
    case KVP_WOP_REMOVE_ALL: {
        uint64_t m = kvp__mpr_uint(b);
        if (op->removed)
            *op->removed = m;
        break;
    }
    case KVP_WOP_PUT:
    case KVP_WOP_REMOVE:
    case KVP_WOP_PIN:
    case KVP_WOP_UNPIN:
    case KVP_WOP_GET: {
        uint32_t n = kvp__mpr_array(b, KVP_BATCH_MAX);
        if (b->err || n != cnt)
            return KVP_ERR_PROTOCOL;
        kvp_key_result_t *results = op->results + off;
        const kvp_sgl_t *values = op->values ? op->values + off : NULL;
        uint64_t total = 0;
        uint32_t nv = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (kvp__mpr_array(b, 2) != 2)
                return KVP_ERR_PROTOCOL;
            int64_t st = kvp__mpr_int(b);
            uint64_t v = kvp__mpr_uint(b);
            if (b->err || st > 0 || st < -1000)
                return KVP_ERR_PROTOCOL;
            results[i].status = (kvp_status_t)st;
            if (p->wop == KVP_WOP_GET) {
                results[i].size = v;
                results[i].flags = 0;
                if (st == KVP_OK) {
                    total += v;
                    for (uint32_t k = 0; k < values[i].iovcnt; k++)
                        nv++;
                }
            } else {
                results[i].flags = (uint32_t)v;
                if (p->wop != KVP_WOP_PUT)
                    results[i].size = 0;
            }
        }
        if (p->wop != KVP_WOP_GET)
            break;
        if (total != data_len)
            return KVP_ERR_PROTOCOL;
        kvp__free(p->iov, p->niov * sizeof *p->iov);
        p->iov = kvp__calloc(nv ? nv : 1, sizeof *p->iov);
        p->niov = nv ? nv : 1;
        if (!p->iov) {
            p->niov = 0;
            return KVP_ERR_NO_MEMORY;
        }
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (results[i].status != KVP_OK)
                continue;
            uint64_t left = results[i].size;
            for (uint32_t j = 0; j < values[i].iovcnt && left; j++) {
                size_t len = values[i].iov[j].len < left ? values[i].iov[j].len : (size_t)left;
                if (!len)
                    continue;
                p->iov[k].buffer = values[i].iov[j].base;
                p->iov[k].length = len;
                k++;
                left -= len;
            }
            if (left)
                return KVP_ERR_PROTOCOL; /* the server checked capacities; never here */
        }
        p->niov = k ? k : 1;
        if (!k)
            p->iov[0].length = 0;
        break;
    }
    case KVP_WOP_GET_LOCAL:
        return do_parse_local(p, b);
    case KVP_WOP_LOCAL_PROOF:
        break;
    default:
        return KVP_ERR_PROTOCOL;
    }
    return b->err ? KVP_ERR_PROTOCOL : KVP_OK;
}

/* Decodes a reply header and finds the request it answers: returns it with
 * mu held, or NULL (mu not held) for a reply nobody waits for (logged when
 * it is the server refusing something). */
static pending_t *match_reply(remote_t *r, const void *hdr, size_t len, kvp__wire_reply_t *rep)
{
    if (kvp__wire_reply_decode(hdr, len, rep) != KVP_OK) {
        kvp_warn("remote: undecodable reply dropped (%zu bytes)", len);
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    pending_t *p = do_find(r, rep->req_id);
    if (!p || p->reply_done || p->wop != rep->op) {
        pthread_mutex_unlock(&r->mu);
        if (rep->op == 0)
            kvp_warn("remote: server refused a request: %s", kvp_status_str(rep->status));
        return NULL;
    }
    return p;
}

static int do_hold(remote_t *r, int gen);
static void do_sent(remote_t *r, int gen);
static void queue_release(remote_t *r, int gen, uint64_t req_id);
static int flush_released(remote_t *r, uint64_t now);

/* A GET_LOCAL's reply is parsed (mu held; unlocks): copies the values out
 * of the mapped arena, releases the leases, finishes p. */
static void local_finish(remote_t *r, pending_t *p, kvp_status_t st)
{
    int gen = p->gen;
    uint64_t id = p->req_id;
    if (st == KVP_ERR_BUSY) { /* the server is holding too much: over the network then */
        p->repost = 1;
        st = KVP_OK;
    }
    /* The copy holds the connection: its socket, whose close would end the
     * server's leases, stays open until the copy is done. */
    int copy = st == KVP_OK && p->nsegs > 0 && !p->repost;
    int held = copy && do_hold(r, gen);
    if (copy && !held)
        st = KVP_ERR_CONN_LOST; /* already closed: the bytes may have been reused */
    int release = p->release;
    p->copying = 1;
    pthread_mutex_unlock(&r->mu);
    if (held) {
        kvp__lread_copy(p->segs, p->nsegs);
        /* Still leased all along?  The server bumps the slot's generation
         * before it lets leased bytes go (a lease past its deadline). */
        if (!kvp__lmap_still_leased(p->lmap, p->lr_slot, p->lr_gen)) {
            kvp_warn("remote: a local read outlived its lease (the server's deadline passed mid-copy)");
            st = KVP_ERR_TIMEOUT;
        }
    }
    if (release)
        queue_release(r, gen, id);
    pthread_mutex_lock(&r->mu);
    if (held)
        do_sent(r, gen);
    p->copying = 0;
    p->status = p->timed_out ? KVP_ERR_TIMEOUT : st;
    p->reply_done = 1;
    opctx_t *f = do_maybe_done(r, p);
    pthread_mutex_unlock(&r->mu);
    fire(f);
}

static ucs_status_t on_reply(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    remote_t *r = arg;
    kvp__wire_reply_t rep;
    pending_t *p = match_reply(r, header, header_length, &rep);
    if (!p)
        return UCS_OK;
    kvp_status_t st = do_parse_reply(p, &rep, length);
    if (p->wop == KVP_WOP_GET_LOCAL) {
        local_finish(r, p, st);
        return UCS_OK;
    }
    opctx_t *f = NULL;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (st != KVP_OK || p->wop != KVP_WOP_GET || length == 0 || !rndv) {
        if (st == KVP_OK && p->wop == KVP_WOP_GET && length) {
            const char *src = data;
            for (uint32_t i = 0; i < p->niov; i++) {
                memcpy(p->iov[i].buffer, src, p->iov[i].length);
                src += p->iov[i].length;
            }
        }
        p->status = st;
        p->reply_done = 1;
        f = do_maybe_done(r, p);
        pthread_mutex_unlock(&r->mu);
        fire(f);
        return UCS_OK;
    }
    /* Rendezvous: let UCX move the values straight into the caller's buffers.
     * Until that receive ends, nothing else may finish the op: UCX may
     * still be writing into the caller's buffers (even after the endpoint
     * was force-closed: a CMA copy already queued still runs). */
    uint64_t id = p->req_id;
    ucp_dt_iov_t *iov = p->iov;
    uint32_t niov = p->niov;
    p->recv_active = 1;
    r->recv_active++;
    pthread_mutex_unlock(&r->mu);
    cbarg_t *a = cb_arg(r, id);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = on_recv_done,
        .user_data = a,
    };
    void *buf = iov;
    size_t count = niov;
    if (niov == 1) {
        prm.datatype = ucp_dt_make_contig(1);
        buf = iov[0].buffer;
        count = iov[0].length;
    } else {
        prm.datatype = ucp_dt_make_iov();
    }
    if (!a) { /* no memory: the values are dropped, the op fails */
        pthread_mutex_lock(&r->mu);
        do_recv_end(r, id, KVP_ERR_NO_MEMORY);
        return UCS_OK;
    }
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(r->worker, data, buf, count, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp))
        on_recv_done(NULL, sp ? UCS_PTR_STATUS(sp) : UCS_OK, count, a);
    return UCS_OK;
}

/* Hands the current connection to the progress thread to close (mu held). */
static void do_retire(remote_t *r, int graceful)
{
    dead_t *d = kvp__calloc(1, sizeof *d);
    if (d) {
        *d = (dead_t){r->dead, r->ep, r->tcp_fd, r->gen, graceful, r->senders};
        r->dead = d;
    } else {
        kvp_error("remote: out of memory retiring a connection; its endpoint is leaked");
    }
    r->connected = 0;
    r->senders = 0;
    r->gen++;
    r->nrel = 0; /* the connection's leases end with it */
    r->ep = NULL;
    r->tcp_fd = -1;
}

/* Marks the connection broken (mu held); the progress thread closes it. */
static void do_disconnect(remote_t *r, const char *why)
{
    if (!r->connected)
        return;
    kvp_warn("remote: connection to %s:%u lost (%s)", r->host, r->port, why);
    do_retire(r, 0);
}

/* A thread starts using the connection of generation gen (mu held): it
 * stays open until do_sent.  0 if it is closed already. */
static int do_hold(remote_t *r, int gen)
{
    if (gen == r->gen) {
        if (!r->connected)
            return 0;
        r->senders++;
        return 1;
    }
    for (dead_t *d = r->dead; d; d = d->next)
        if (d->gen == gen) {
            d->senders++;
            return 1;
        }
    return 0;
}

/* A thread is done sending on the connection of generation gen (mu held). */
static void do_sent(remote_t *r, int gen)
{
    if (gen == r->gen) {
        r->senders--;
        return;
    }
    for (dead_t *d = r->dead; d; d = d->next)
        if (d->gen == gen) {
            d->senders--;
            return;
        }
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    remote_t *r = arg;
    pthread_mutex_lock(&r->mu);
    if (ep == r->ep)
        do_disconnect(r, ucs_status_string(status));
    pthread_mutex_unlock(&r->mu);
}

/* ---- kvpool's TCP transport (net/lane.h) ---- */

/* Has a reply's values all arrived, or its frame been handled: finish p. */
static void lane_complete(remote_t *r, pending_t *p)
{
    pthread_mutex_lock(&r->mu);
    p->reply_done = 1;
    opctx_t *f = do_maybe_done(r, p);
    pthread_mutex_unlock(&r->mu);
    fire(f);
}

/* A complete reply header: match it to its request; its values (if any)
 * are read next, into the caller's buffers or, for a reply nobody waits
 * for, into the sink. */
static void lane_reply(remote_t *r, const uint8_t *hdr, uint32_t len, uint64_t data_len)
{
    r->rx_p = NULL;
    r->rx_i = 0;
    r->rx_off = 0;
    r->rx_left = data_len;
    r->rx_data = data_len > 0;
    kvp__wire_reply_t rep;
    pending_t *p = match_reply(r, hdr, len, &rep);
    if (!p)
        return;
    kvp_status_t st = do_parse_reply(p, &rep, data_len);
    p->status = st;
    if (st == KVP_OK && data_len) {
        r->rx_p = p; /* stays in the table until its values are in */
        pthread_mutex_unlock(&r->mu);
        return;
    }
    p->reply_done = 1;
    opctx_t *f = do_maybe_done(r, p);
    pthread_mutex_unlock(&r->mu);
    fire(f);
}

/* Reads what the lane socket has (rx_mu held).  Returns nonzero if it
 * read anything. */
static int lane_rx(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    int fd = r->connected && atomic_load(&r->lane) ? r->tcp_fd : -1;
    int gen = r->gen;
    pthread_mutex_unlock(&r->mu);
    if (fd < 0)
        return 0;
    if (r->rx_gen != gen) { /* a new connection: whatever was half-read is gone */
        r->rx_gen = gen;
        r->rx_len = 0;
        r->rx_data = 0;
        r->rx_p = NULL;
    }
    int did = 0;
    for (;;) {
        ssize_t k;
        size_t want = 0;
        if (r->rx_data) {
            struct iovec v[LANE_IOV_MAX];
            int n = 0;
            pending_t *p = r->rx_p;
            if (p) {
                n = kvp__lane_iov_fill(v, LANE_IOV_MAX, p->iov, p->niov, r->rx_i, r->rx_off);
            } else {
                v[n++] = (struct iovec){r->rx_sink, r->rx_left < LANE_SINK ? (size_t)r->rx_left : LANE_SINK};
            }
            k = readv(fd, v, n);
        } else {
            want = r->rx_len < KVP_LANE_HEAD ? KVP_LANE_HEAD : KVP_LANE_HEAD + (size_t)r->rx_hdr_len;
            k = recv(fd, r->rx_buf + r->rx_len, want - r->rx_len, MSG_DONTWAIT);
        }
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return did;
            pthread_mutex_lock(&r->mu);
            if (r->gen == gen)
                do_disconnect(r, k == 0 ? "the server closed the connection" : "receive failed");
            pthread_mutex_unlock(&r->mu);
            wake(r);
            return 1;
        }
        did = 1;
        if (r->rx_data) {
            r->rx_left -= (uint64_t)k;
            if (r->rx_p)
                kvp__lane_iov_advance(r->rx_p->iov, &r->rx_i, &r->rx_off, (size_t)k);
            if (r->rx_left == 0) {
                r->rx_data = 0;
                pending_t *p = r->rx_p;
                r->rx_p = NULL;
                if (p)
                    lane_complete(r, p);
            }
            continue;
        }
        r->rx_len += (size_t)k;
        if (r->rx_len < want)
            continue;
        if (want == KVP_LANE_HEAD) {
            uint64_t data_len;
            const char *why = NULL;
            if (kvp__lane_head_decode(r->rx_buf, &r->rx_hdr_len, &data_len) != 0) {
                why = "malformed reply frame";
            } else if (KVP_LANE_HEAD + (size_t)r->rx_hdr_len > r->rx_cap) {
                size_t need = KVP_LANE_HEAD + (size_t)r->rx_hdr_len;
                uint8_t *nb = kvp__malloc(need);
                if (nb) {
                    memcpy(nb, r->rx_buf, KVP_LANE_HEAD);
                    kvp__free(r->rx_buf, r->rx_cap);
                    r->rx_buf = nb;
                    r->rx_cap = need;
                } else {
                    why = "out of memory for a reply header";
                }
            }
            if (why) {
                pthread_mutex_lock(&r->mu);
                if (r->gen == gen)
                    do_disconnect(r, why);
                pthread_mutex_unlock(&r->mu);
                wake(r);
                return 1;
            }
            r->rx_left = data_len;
            continue;
        }
        r->rx_len = 0;
        lane_reply(r, r->rx_buf + KVP_LANE_HEAD, r->rx_hdr_len, r->rx_left);
    }
}

/* Writes p's request frame (header, then a put's values straight from the
 * caller's buffers) on the lane socket fd, whole, before any other frame. */
static void lane_post(remote_t *r, pending_t *p, int fd, const void *data, size_t count, int iov)
{
    int gen = p->gen; /* p may be gone by the time do_sent() runs */
    const ucp_dt_iov_t *src = iov ? data : NULL;
    ucp_dt_iov_t one = {(void *)data, count};
    uint32_t nsrc = iov ? (uint32_t)count : (count ? 1u : 0u);
    if (!iov)
        src = &one;
    uint64_t data_len = 0;
    for (uint32_t i = 0; i < nsrc; i++)
        data_len += src[i].length;
    uint8_t head[KVP_LANE_HEAD];
    kvp__lane_head_encode(head, (uint32_t)p->w.len, data_len);
    uint64_t total = KVP_LANE_HEAD + p->w.len + data_len, done = 0;
    const char *why = NULL;
    int late = 0;
    pthread_mutex_lock(&r->tx_mu);
    /* Still the connection fd belongs to?  (If it was lost meanwhile, the
     * number may already name a newer connection's socket.)  While tx_mu
     * is held it cannot close. */
    pthread_mutex_lock(&r->mu);
    int stale = r->gen != p->gen || !r->connected;
    pthread_mutex_unlock(&r->mu);
    if (stale)
        total = 0;
    while (done < total) {
        struct iovec v[LANE_IOV_MAX];
        int n = 0;
        uint64_t skip = done;
        for (uint32_t i = 0; i < 2 + nsrc && n < LANE_IOV_MAX; i++) {
            const char *b = i == 0 ? (const char *)head : i == 1 ? (const char *)p->w.buf : src[i - 2].buffer;
            size_t l = i == 0 ? KVP_LANE_HEAD : i == 1 ? p->w.len : src[i - 2].length;
            if (skip >= l) {
                skip -= l;
                continue;
            }
            v[n++] = (struct iovec){(void *)(b + skip), l - skip};
            skip = 0;
        }
        struct msghdr m = {.msg_iov = v, .msg_iovlen = (size_t)n};
        ssize_t k = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
            done += (uint64_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* The server reads requests whatever it is sending: wait. */
            uint64_t now = kvp__now_ns();
            if (now >= p->deadline_ns) {
                why = "a request could not be sent in time";
                late = 1;
                break;
            }
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            uint64_t ms = (p->deadline_ns - now) / 1000000ull + 1;
            (void)poll(&pf, 1, ms > 1000 ? 1000 : (int)ms);
            continue;
        }
        why = "send failed";
        break;
    }
    /* p is still ours: its connection is not failed before do_sent(). */
    pthread_mutex_lock(&r->mu);
    p->send_done = 1;
    if (stale)
        do_fail_reply(p, KVP_ERR_CONN_LOST);
    if (why) {
        if (late)
            p->timed_out = 1;
        do_fail_reply(p, KVP_ERR_CONN_LOST);
        if (r->gen == p->gen)
            do_disconnect(r, why);
    }
    opctx_t *f = do_maybe_done(r, p);
    do_sent(r, gen);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->tx_mu);
    if (why)
        wake(r);
    fire(f);
}

/* ---- connection teardown and deadlines (progress thread) ---- */

/* Fails requests (progress thread): those of generation gen whose reply has
 * not come (the forced close has completed their sends), or, with stranded,
 * those still waiting for a receive their (destroyed) worker never ends. */
static void fail_requests(remote_t *r, int gen, int stranded)
{
    opctx_t *done[64];
    int again = 1;
    while (again) {
        int nd = 0;
        again = 0;
        pthread_mutex_lock(&r->mu);
        for (int b = 0; b < NBUCKETS && !again; b++) {
            for (pending_t *p = r->bucket[b], *next; p; p = next) {
                next = p->next;
                if (p->finished || (stranded ? !p->recv_active : p->gen != gen))
                    continue;
                p->send_done = 1;
                if (stranded) {
                    kvp_warn("remote: request %llu: its values never arrived", (unsigned long long)p->req_id);
                    p->recv_active = 0;
                    r->recv_active--;
                } else if (p->recv_active || p->copying) {
                    /* its receive (or copy) ends it (with this status) */
                    if (p->status == KVP_OK)
                        p->status = p->timed_out ? KVP_ERR_TIMEOUT : KVP_ERR_CONN_LOST;
                    continue;
                }
                do_fail_reply(p, KVP_ERR_CONN_LOST);
                opctx_t *f = do_maybe_done(r, p);
                if (f) {
                    done[nd++] = f;
                    if (nd == 64) {
                        again = 1;
                        break;
                    }
                }
            }
        }
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < nd; i++)
            fire(done[i]);
    }
}

static void fail_generation(remote_t *r, int gen) { fail_requests(r, gen, 0); }

static void check_deadlines(remote_t *r)
{
    uint64_t now = kvp__now_ns();
    pthread_mutex_lock(&r->mu);
    int expired = 0, stranded = 0;
    for (int b = 0; b < NBUCKETS; b++)
        for (pending_t *p = r->bucket[b]; p; p = p->next) {
            if (!p->finished && !p->reply_done && p->deadline_ns && now > p->deadline_ns) {
                p->timed_out = 1;
                expired = 1;
            }
            /* a receive its lost connection never ended: only a new worker
             * guarantees UCX writes no more into the caller's buffers */
            if (p->recv_active && p->gen != r->gen && now > p->deadline_ns + 2000000000ull)
                stranded = 1;
        }
    if (expired)
        do_disconnect(r, "a request timed out; resetting the connection");
    if (stranded && !r->replace_req) {
        kvp_warn("remote: a receive on a lost connection never ended; replacing the UCX worker");
        r->replace_req = 1;
    }
    pthread_mutex_unlock(&r->mu);
}

/* Closes one lost connection nobody sends on any more and fails its
 * requests (progress thread).  Returns 1 if it did. */
static int reap_dead(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    dead_t *d = NULL, **dp = &r->dead;
    while (*dp && (*dp)->senders > 0)
        dp = &(*dp)->next;
    if (*dp) {
        d = *dp;
        *dp = d->next;
    }
    pthread_mutex_unlock(&r->mu);
    if (!d)
        return 0;
    /* Endpoint first, socket second: when the server sees the socket
     * close, this side no longer reads or writes its memory. */
    if (d->ep)
        (void)kvp__ucx_ep_close(r->worker, d->ep, d->graceful ? 2000 : 0);
    if (d->fd >= 0) {
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, d->fd, NULL);
        /* No lane reader is using the socket when it closes. */
        pthread_mutex_lock(&r->tx_mu);
        pthread_mutex_lock(&r->rx_mu);
        close(d->fd);
        pthread_mutex_unlock(&r->rx_mu);
        pthread_mutex_unlock(&r->tx_mu);
    }
    fail_generation(r, d->gen);
    kvp__free(d, sizeof *d);
    return 1;
}

/* Gives the current worker the reply handler and a place in epfd. */
static kvp_status_t worker_setup(remote_t *r)
{
    r->wfd = -1;
    if (kvp__ucx_am_handler(r->worker, KVP_AM_REPLY, on_reply, r) != UCS_OK ||
        ucp_worker_get_efd(r->worker, &r->wfd) != UCS_OK)
        return KVP_ERR_IO;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r->wfd};
    epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->wfd, &ev);
    return KVP_OK;
}


/* The worker has had events for a while that its progress cannot take: a
 * server killed in the middle of writing a reply into this process's
 * shared-memory FIFO leaves a slot that is never completed, and every reply
 * behind it waits forever (docs/transport.md §8).  Replaces the worker
 * (progress thread): the UCX connection is retired, and the next call
 * connects from the new worker. */
static void replace_worker(remote_t *r, int stuck)
{
    if (stuck)
        kvp_warn("remote: UCX worker stuck (events it cannot progress for 1 s, likely a server killed "
                 "mid-message); replacing it");
    for (;;) {
        pthread_mutex_lock(&r->mu);
        r->replacing = 1;
        if (r->connected && !atomic_load(&r->lane))
            do_disconnect(r, "the UCX worker is being replaced");
        pthread_mutex_unlock(&r->mu);
        for (;;) { /* every endpoint of this worker closed */
            if (reap_dead(r))
                continue;
            pthread_mutex_lock(&r->mu);
            int left = r->dead != NULL;
            pthread_mutex_unlock(&r->mu);
            if (!left)
                break;
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        /* Receives in flight end (CMA copies finish, or fail) before the
         * worker goes: 2 s at most. */
        uint64_t until = kvp__now_ns() + 2000000000ull;
        for (;;) {
            pthread_mutex_lock(&r->mu);
            uint64_t n = r->recv_active;
            pthread_mutex_unlock(&r->mu);
            if (!n || kvp__now_ns() > until)
                break;
            int wl = wlock_rd(&r->wlock);
            ucp_worker_progress(r->worker);
            wunlock(&r->wlock, wl);
        }
        pthread_rwlock_wrlock(&r->wlock);
        pthread_mutex_lock(&r->mu);
        int clean = !(r->connected && !atomic_load(&r->lane)) && !r->dead;
        pthread_mutex_unlock(&r->mu);
        if (clean)
            break;
        pthread_rwlock_unlock(&r->wlock); /* a connect slipped in: again */
    }
    epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->wfd, NULL);
    ucp_worker_destroy(r->worker); /* no receive of it can write any more */
    r->worker = NULL;
    fail_requests(r, 0, 1); /* receives it never ended */
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_MULTI};
    if (ucp_worker_create(r->ctx, &wp, &r->worker) != UCS_OK || worker_setup(r) != KVP_OK)
        kvp_error("remote: cannot create a new UCX worker; UCX connections will fail");
    pthread_rwlock_unlock(&r->wlock);
    pthread_mutex_lock(&r->mu);
    r->replacing = r->worker == NULL; /* without a worker, stay unconnectable */
    r->replaced++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static kvp_status_t post_slice(remote_t *r, opctx_t *oc, uint32_t wop, uint32_t off, uint32_t cnt,
                               int will_drive, int local_ok);

/* GET_LOCALs the server was too busy for go again, as plain GETs
 * (progress thread). */
static void run_reposts(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    pending_t *list = r->reposts;
    r->reposts = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        pending_t *p = list;
        list = p->next;
        opctx_t *oc = p->parent;
        uint32_t off = p->off, cnt = p->cnt;
        pending_free(p);
        kvp_status_t st = post_slice(r, oc, KVP_WOP_GET, off, cnt, 0, 0);
        if (st == KVP_INPROGRESS)
            continue;
        pthread_mutex_lock(&r->mu);
        if (oc->status == KVP_OK)
            oc->status = st;
        for (uint32_t k = off; k < off + cnt; k++)
            oc->op->results[k].status = st;
        opctx_t *f = --oc->left == 0 ? oc : NULL;
        pthread_mutex_unlock(&r->mu);
        fire(f);
    }
}

static void *progress_main(void *arg)
{
    remote_t *r = arg;
    uint64_t last_check = 0, spin_until = 0;
    kvp__ucx_armer_t armer = {0};
    for (;;) {
        int did = 0;
        if (!r->worker) { /* replacing it failed: only sockets left */
            struct pollfd pf = {.fd = r->wake_fd, .events = POLLIN};
            (void)poll(&pf, 1, 10);
            if (reap_dead(r))
                continue;
            pthread_mutex_lock(&r->mu);
            int stop = r->stop && !r->dead;
            pthread_mutex_unlock(&r->mu);
            if (stop)
                break;
            continue;
        }
        /* A caller driving the worker makes progress for everyone: stay off
         * the CPU meanwhile (two busy threads per client would crowd out the
         * server on a small host). */
        int driven = atomic_load(&r->driving);
        while (!driven && ucp_worker_progress(r->worker))
            did = 1;
        uint64_t now = kvp__now_ns();
        if (did)
            atomic_store(&r->progressed_ns, now);
        if (reap_dead(r))
            continue;
        run_reposts(r);
        pthread_mutex_lock(&r->mu);
        int req = r->replace_req;
        r->replace_req = 0;
        pthread_mutex_unlock(&r->mu);
        if (req) {
            kvp_info("remote: replacing the UCX worker (test request)");
            replace_worker(r, 0);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        int waiting = r->dead != NULL; /* senders still inside post() */
        int stop = r->stop && r->npending == 0 && !waiting && !r->reposts;
        pthread_mutex_unlock(&r->mu);
        if (stop)
            break;
        if (now - last_check > 10000000ull) {
            check_deadlines(r);
            last_check = now;
        }
        int releasing = flush_released(r, now);
        if (did)
            spin_until = now + 30000;
        if (driven) {
            /* Until the driver leaves (it wakes us) or 1 ms passes,
             * to keep watching for dead connections and deadlines. */
            struct pollfd pf = {.fd = r->wake_fd, .events = POLLIN};
            if (poll(&pf, 1, 1) > 0) {
                uint64_t x;
                (void)!read(r->wake_fd, &x, sizeof x);
            }
            continue;
        }
        int timeout = now < spin_until ? 0 : waiting || releasing ? 1 : 10;
        /* Stuck: un-armable, and no thread (callers drive it too) has made
         * progress for 1 s. */
        timeout = kvp__ucx_arm(r->worker, &armer, timeout, did, now, atomic_load(&r->progressed_ns),
                               1000000000ull);
        if (timeout < 0) {
            replace_worker(r, 1);
            continue;
        }
        struct epoll_event evs[4];
        int n = epoll_wait(r->epfd, evs, 4, timeout);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == r->wake_fd) {
                uint64_t x;
                (void)!read(r->wake_fd, &x, sizeof x);
                continue;
            }
            pthread_mutex_lock(&r->mu);
            if (fd == r->tcp_fd && r->connected && atomic_load(&r->lane)) {
                pthread_mutex_unlock(&r->mu);
                pthread_mutex_lock(&r->rx_mu);
                (void)lane_rx(r);
                pthread_mutex_unlock(&r->rx_mu);
                continue;
            }
            if (fd == r->tcp_fd && r->connected) {
                char junk[64];
                ssize_t k = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) ||
                    (evs[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)))
                    do_disconnect(r, "the server closed the control connection");
            }
            pthread_mutex_unlock(&r->mu);
        }
    }
    return NULL;
}

static void wake(remote_t *r)
{
    uint64_t one = 1;
    (void)!write(r->wake_fd, &one, sizeof one);
}

/* ---- posting requests (caller threads) ---- */

static uint64_t new_id(remote_t *r) { return atomic_fetch_add(&r->next_id, 1) + 1; }

static pending_t *pending_new(uint32_t wop, opctx_t *parent)
{
    pending_t *p = kvp__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->wop = wop;
    p->parent = parent;
    p->op = parent ? parent->op : NULL;
    kvp__mpw_init(&p->w, p->wbuf, sizeof p->wbuf);
    kvp__mpw_init(&p->w2, p->w2buf, sizeof p->w2buf);
    return p;
}

/* Registers p (header already encoded in p->w with p->req_id) and posts it.
 * Returns KVP_INPROGRESS (p now belongs to the table), or an error if
 * nothing was sent (p not registered; the caller still owns it). */
static kvp_status_t post(remote_t *r, pending_t *p, const void *data, size_t count, int iov)
{
    cbarg_t *a = cb_arg(r, p->req_id);
    if (!a)
        return KVP_ERR_NO_MEMORY;
    pthread_mutex_lock(&r->mu);
    if (!r->connected) {
        do_cb_put(r, a);
        pthread_mutex_unlock(&r->mu);
        return KVP_ERR_CONN_LOST;
    }
    ucp_ep_h ep = r->ep;
    int fd = r->tcp_fd, lane = atomic_load(&r->lane), gen = r->gen;
    if (p->wop == KVP_WOP_GET_LOCAL) {
        if (!r->lmap || r->lmap_gen != gen) { /* reconnected meanwhile, to another arena */
            do_cb_put(r, a);
            pthread_mutex_unlock(&r->mu);
            return KVP_ERR_CONN_LOST;
        }
        p->lmap = r->lmap;
        kvp__lmap_ref(p->lmap);
        r->local_inflight++;
    }
    p->gen = gen;
    if (r->nrel && kvp__wire_req_add_released(&p->w, r->rel, r->nrel) == 0)
        r->nrel = 0; /* (no memory: they wait for the next request or the flush) */
    uint32_t to = p->op && p->op->timeout_ms ? p->op->timeout_ms : r->timeout_ms;
    p->deadline_ns = kvp__now_ns() + (uint64_t)to * 1000000ull;
    do_add(r, p);
    r->senders++; /* the endpoint and socket stay open until do_sent() */
    pthread_mutex_unlock(&r->mu);
    if (lane) {
        pthread_mutex_lock(&r->mu);
        do_cb_put(r, a);
        pthread_mutex_unlock(&r->mu);
        lane_post(r, p, fd, data, count, iov);
        return KVP_INPROGRESS;
    }
    int caller_drives = p->caller_drives; /* (p may be finished and freed once sent) */
    /* The server answers on each request's reply endpoint (it never makes
     * an endpoint from a client's address). */
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = on_send_done,
        .user_data = a,
        .flags = UCP_AM_SEND_FLAG_REPLY,
    };
    const void *hdr = p->w.buf;
    size_t hlen = p->w.len;
    if (hlen > KVP_AM_HDR_MAX) {
        /* Too long for an AM header: send it as the data (never a put). */
        kvp__wire_req_encode(&p->w2, KVP_WOP_IN_DATA, p->req_id, 0, r->conn_key, NULL, 0, NULL);
        hdr = p->w2.buf;
        hlen = p->w2.len;
        data = p->w.buf;
        count = p->w.len;
        iov = 0;
    }
    if (iov) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype = ucp_dt_make_iov();
    }
    if (p->wop == KVP_WOP_PUT && p->payload_bytes >= KVP_RNDV_MIN)
        prm.flags |= UCP_AM_SEND_FLAG_RNDV;
    /* ep is open (senders) and its worker stays (wlock) until this is done */
    int wl = wlock_rd(&r->wlock);
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, KVP_AM_REQUEST, hdr, hlen, data, count, &prm);
    wunlock(&r->wlock, wl);
    pthread_mutex_lock(&r->mu);
    do_sent(r, gen);
    pthread_mutex_unlock(&r->mu);
    if (sp == NULL || UCS_PTR_IS_ERR(sp))
        on_send_done(NULL, sp ? UCS_PTR_STATUS(sp) : UCS_OK, a);
    /* The progress thread makes progress on it, unless its caller is about
     * to: waking that thread would then only take a core from the server
     * on a small host. */
    if (!caller_drives)
        wake(r);
    return KVP_INPROGRESS;
}

/* A RELEASE in flight (its header must live until UCX is done with it). */
typedef struct release_msg {
    kvp__mpw_t w;
    uint8_t buf[64];
} release_msg_t;

static void release_sent(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    release_msg_t *m = user_data;
    kvp__mpw_free(&m->w);
    kvp__free(m, sizeof *m);
    if (request)
        ucp_request_free(request);
}

/* Tells the server that GET_LOCALs ids[0..n) are copied, in one RELEASE
 * (never answered): req_id ids[0], the rest in its released field.  On a
 * connection that is gone there is nothing to tell: its leases end with
 * its socket. */
static void post_release(remote_t *r, int gen, const uint64_t *ids, uint32_t n)
{
    pthread_mutex_lock(&r->mu);
    if (gen != r->gen || !r->connected) {
        pthread_mutex_unlock(&r->mu);
        return;
    }
    ucp_ep_h ep = r->ep;
    uint64_t key = r->conn_key;
    r->senders++;
    pthread_mutex_unlock(&r->mu);
    release_msg_t *m = kvp__malloc(sizeof *m);
    if (m) {
        kvp__mpw_init(&m->w, m->buf, sizeof m->buf);
        kvp__wire_req_encode(&m->w, KVP_WOP_RELEASE, ids[0], 0, key, NULL, 0, NULL);
        if (n > 1 && kvp__wire_req_add_released(&m->w, ids + 1, n - 1) != 0)
            m->w.err = 1;
    }
    if (m && !m->w.err) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
            .cb.send = release_sent,
            .user_data = m,
            .flags = UCP_AM_SEND_FLAG_REPLY,
        };
        int wl = wlock_rd(&r->wlock);
        ucs_status_ptr_t sp = ucp_am_send_nbx(ep, KVP_AM_REQUEST, m->w.buf, m->w.len, NULL, 0, &prm);
        wunlock(&r->wlock, wl);
        if (sp == NULL || UCS_PTR_IS_ERR(sp))
            release_sent(NULL, UCS_OK, m);
    } else {
        if (m)
            release_sent(NULL, UCS_OK, m);
        kvp_error("remote: out of memory releasing %u local reads; the server keeps their values until "
                  "the connection closes", n);
    }
    pthread_mutex_lock(&r->mu);
    do_sent(r, gen);
    pthread_mutex_unlock(&r->mu);
}

/* Takes the queued releases (mu held); returns how many. */
static uint32_t do_take_released(remote_t *r, uint64_t *ids)
{
    uint32_t n = r->nrel;
    memcpy(ids, r->rel, n * sizeof *ids);
    r->nrel = 0;
    return n;
}

/* GET_LOCAL req_id's values are copied: queues its release. */
static void queue_release(remote_t *r, int gen, uint64_t req_id)
{
    uint64_t ids[KVP_RELEASED_MAX];
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    if (gen == r->gen && r->connected) {
        if (r->nrel == 0)
            r->rel_since_ns = kvp__now_ns();
        r->rel[r->nrel++] = req_id;
        if (r->nrel == KVP_RELEASED_MAX)
            n = do_take_released(r, ids);
    }
    pthread_mutex_unlock(&r->mu);
    if (n)
        post_release(r, gen, ids, n);
}

/* Progress thread: sends the releases that waited REL_FLUSH_NS for a
 * request to ride on.  Returns whether any are still queued. */
static int flush_released(remote_t *r, uint64_t now)
{
    uint64_t ids[KVP_RELEASED_MAX];
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    int gen = r->gen;
    if (r->nrel && now - r->rel_since_ns >= REL_FLUSH_NS)
        n = do_take_released(r, ids);
    int left = r->nrel > 0;
    pthread_mutex_unlock(&r->mu);
    if (n)
        post_release(r, gen, ids, n);
    return left;
}

/* Runs an internal op (hello, stats, proof) to completion on the caller's
 * thread; frees p, unless keep_p (then *keep_p = p, to be freed by the
 * caller). */
static kvp_status_t run_internal(remote_t *r, pending_t *p, pending_t **keep_p)
{
    kvp_status_t st = post(r, p, NULL, 0, 0);
    if (st != KVP_INPROGRESS) {
        pending_free(p);
        return st;
    }
    pthread_mutex_lock(&r->mu);
    while (!p->finished)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    st = p->status;
    if (keep_p)
        *keep_p = p;
    else
        pending_free(p);
    return st;
}

/* Runs an internal request (no keys but `proof`) on the caller's thread. */
static kvp_status_t run_request(remote_t *r, uint32_t wop, uint64_t key, const kvp_key_t *proof,
                                pending_t **keep_p)
{
    pending_t *p = pending_new(wop, NULL);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    p->req_id = new_id(r);
    kvp__wire_req_encode(&p->w, wop, p->req_id, r->timeout_ms, key, proof, proof ? 1 : 0, NULL);
    if (p->w.err) {
        pending_free(p);
        return KVP_ERR_NO_MEMORY;
    }
    return run_internal(r, p, keep_p);
}

/* After the HELLO of connection gen: maps the server's arena and lease
 * table when it offers them (or keeps the mapping of the last connection
 * to the same server) and proves it to the server, so gets on gen can read
 * locally. */
static void local_setup(remote_t *r, int gen, uint64_t key, const kvp__arena_info_t *ai)
{
    pthread_mutex_lock(&r->mu);
    kvp__lmap_t *have = r->lmap;
    int same = ai && have && kvp__lmap_is(have, ai);
    pthread_mutex_unlock(&r->mu);
    kvp__lmap_t *m = NULL;
    if (ai && !same && kvp__lmap_get(ai, &m) != KVP_OK)
        m = NULL;
    pthread_mutex_lock(&r->mu);
    kvp__lmap_t *old = NULL;
    if (!same) {
        old = r->lmap;
        r->lmap = m;
    }
    m = r->lmap;
    if (m)
        kvp__lmap_ref(m);
    pthread_mutex_unlock(&r->mu);
    kvp__lmap_put(old);
    if (!m)
        return;
    uint8_t proof[KVP_WIRE_LR_PROOF];
    kvp__wire_lr_proof(kvp__lmap_nonce(m), key, proof);
    kvp_key_t pk = {proof, sizeof proof};
    kvp_status_t st = run_request(r, KVP_WOP_LOCAL_PROOF, key, &pk, NULL);
    kvp__lmap_put(m);
    if (st != KVP_OK) {
        kvp_info("remote: the server did not take this process's local-read proof (%s); reading over UCX",
                 kvp_status_str(st));
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (r->lmap && r->gen == gen && r->connected)
        r->lmap_gen = gen;
    pthread_mutex_unlock(&r->mu);
}

/* The endpoint to the server's worker address, which is checked first
 * (UCX would parse it unchecked). */
static kvp_status_t ucx_endpoint(remote_t *r, const kvp__hs_result_t *hs, int quiet, ucp_ep_h *ep_p)
{
    ucp_address_t *my = NULL;
    size_t my_len = 0;
    if (ucp_worker_get_address(r->worker, &my, &my_len) != UCS_OK)
        return KVP_ERR_IO;
    const char *why = NULL;
    kvp_status_t st = kvp__ucx_addr_check(hs->addr, hs->addr_len, my, my_len, &why);
    ucp_worker_release_address(r->worker, my);
    if (st != KVP_OK) {
        if (quiet)
            kvp_info("remote: %s:%u's UCX address refused (%s); using kvpool's TCP transport", r->host, r->port, why);
        else
            kvp_error("remote: %s:%u's UCX address refused: %s", r->host, r->port, why);
        return KVP_ERR_UNSUPPORTED;
    }
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = hs->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = on_ep_error, .arg = r},
    };
    ucs_status_t us = ucp_ep_create(r->worker, &ep, ep_p);
    if (us != UCS_OK) {
        if (quiet)
            kvp_info("remote: no UCX endpoint to %s:%u (%s); using kvpool's TCP transport", r->host, r->port,
                     ucs_status_string(us));
        else
            kvp_error("remote: UCX endpoint to %s:%u: %s", r->host, r->port, ucs_status_string(us));
        return KVP_ERR_UNSUPPORTED;
    }
    return KVP_OK;
}

static kvp_status_t connect_locked(remote_t *r)
{
    /* The worker may not be replaced while this connects on it. */
    int wl = wlock_rd(&r->wlock);
    pthread_mutex_lock(&r->mu);
    int replacing = r->replacing;
    pthread_mutex_unlock(&r->mu);
    if (replacing) {
        wunlock(&r->wlock, wl);
        return KVP_ERR_CONN_LOST;
    }
    kvp__hs_want_t want = r->use_lane ? KVP_HS_WANT_TCP
                          : r->transport == TRANSPORT_UCX ? KVP_HS_WANT_UCX_ONLY
                                                          : KVP_HS_WANT_UCX;
    kvp__hs_result_t hs;
    kvp_status_t st = kvp__hs_client(r->host, r->port, r->token, want, r->timeout_ms, &hs);
    ucp_ep_h h = NULL;
    if (st == KVP_OK && hs.transport == KVP_HS_UCX) {
        st = ucx_endpoint(r, &hs, want == KVP_HS_WANT_UCX, &h);
        kvp__free(hs.addr, hs.addr_len);
        if (st != KVP_OK) {
            close(hs.fd);
            /* transport=auto: the server is still there, over TCP */
            if (want == KVP_HS_WANT_UCX)
                st = kvp__hs_client(r->host, r->port, r->token, KVP_HS_WANT_TCP, r->timeout_ms, &hs);
        }
    }
    if (st != KVP_OK) {
        wunlock(&r->wlock, wl);
        return st;
    }
    int fd = hs.fd, lane = hs.transport == KVP_HS_TCP;
    uint64_t key = hs.conn_key;
    pthread_mutex_lock(&r->mu);
    r->ep = h;
    r->tcp_fd = fd;
    r->conn_key = key;
    atomic_store(&r->lane, lane);
    r->connected = 1;
    int my_gen = r->gen;
    pthread_mutex_unlock(&r->mu);
    wunlock(&r->wlock, wl); /* (the replacer retires this connection if it waited) */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
    epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev);
    wake(r);
    /* A ping: proves the data path works and learns the limits. */
    pending_t *p = NULL;
    kvp_status_t s = run_request(r, KVP_WOP_HELLO, key, NULL, &p);
    if (s == KVP_OK)
        r->max_value = p->hello_max_value;
    if (s == KVP_OK && !lane && r->local_reads && p->hello_has_arena)
        local_setup(r, my_gen, key, &p->hello_arena);
    if (p)
        pending_free(p);
    if (s != KVP_OK) {
        kvp_error("remote: %s:%u does not answer over %s: %s", r->host, r->port,
                  lane ? "the TCP transport" : "UCX", kvp_status_str(s));
        pthread_mutex_lock(&r->mu);
        if (r->tcp_fd == fd)
            do_disconnect(r, "ping failed");
        pthread_mutex_unlock(&r->mu);
        wake(r);
        return s == KVP_ERR_TIMEOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONN_REFUSED;
    }
    kvp_info("remote: connected to %s:%u (%s)", r->host, r->port, lane ? "kvpool TCP transport" : "UCX");
    if (!lane && kvp__log_enabled(KVP_LOG_INFO)) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) {
            ucp_ep_print_info(h, f);
            fclose(f);
            for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
                if (strstr(line, "lane["))
                    kvp_info("remote: %s", line);
            free(text);
        }
    }
    return KVP_OK;
}

/* Makes sure a connection is up: reconnects after the backoff. */
static kvp_status_t ensure_connected(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    int ok = r->connected;
    pthread_mutex_unlock(&r->mu);
    if (ok)
        return KVP_OK;
    pthread_mutex_lock(&r->conn_mu);
    pthread_mutex_lock(&r->mu);
    /* A worker being replaced is back within a few seconds: wait for it
     * (within the call timeout) rather than fail. */
    uint64_t until = kvp__now_ns() + (uint64_t)r->timeout_ms * 1000000ull;
    /* (not from inside the worker's progress: the replacement waits for that) */
    while (r->replacing && !r->stop && t_wlock_held != &r->wlock && kvp__now_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    ok = r->connected;
    uint64_t retry = r->next_retry_ns;
    int replacing = r->replacing;
    pthread_mutex_unlock(&r->mu);
    kvp_status_t st = KVP_OK;
    if (!ok) {
        if (kvp__now_ns() < retry || replacing) {
            st = KVP_ERR_CONN_LOST;
        } else {
            st = connect_locked(r);
            pthread_mutex_lock(&r->mu);
            if (st == KVP_OK) {
                r->backoff_ms = 0;
            } else {
                r->backoff_ms = r->backoff_ms ? (r->backoff_ms * 2 > 5000 ? 5000 : r->backoff_ms * 2) : 100;
                r->next_retry_ns = kvp__now_ns() + (uint64_t)r->backoff_ms * 1000000ull;
            }
            pthread_mutex_unlock(&r->mu);
        }
    }
    pthread_mutex_unlock(&r->conn_mu);
    return st;
}

/* ---- the backend ---- */

static uint32_t wire_op(kvp_op_type_t t)
{
    switch (t) {
    case KVP_OP_EXISTS: return KVP_WOP_EXISTS;
    case KVP_OP_PREFIX: return KVP_WOP_PREFIX;
    case KVP_OP_PUT: return KVP_WOP_PUT;
    case KVP_OP_GET: return KVP_WOP_GET;
    case KVP_OP_REMOVE: return KVP_WOP_REMOVE;
    case KVP_OP_PIN: return KVP_WOP_PIN;
    case KVP_OP_UNPIN: return KVP_WOP_UNPIN;
    case KVP_OP_REMOVE_ALL: return KVP_WOP_REMOVE_ALL;
    }
    return 0;
}

static uint64_t sgl_len(const kvp_sgl_t *v)
{
    uint64_t t = 0;
    for (uint32_t j = 0; j < v->iovcnt; j++)
        t += v->iov[j].len;
    return t;
}

/* Builds and posts the request for keys [off, off+cnt) of the op. */
static kvp_status_t post_slice(remote_t *r, opctx_t *oc, uint32_t wop, uint32_t off, uint32_t cnt,
                               int will_drive, int local_ok)
{
    kvp_op_t *op = oc->op;
    if (wop == KVP_WOP_GET && r->local_reads && local_ok) {
        uint64_t cap = 0;
        for (uint32_t i = 0; i < cnt; i++)
            cap += sgl_len(&op->values[off + i]);
        pthread_mutex_lock(&r->mu);
        if (cap >= LOCAL_MIN && r->lmap && r->lmap_gen == r->gen && r->connected &&
            r->local_inflight < LOCAL_INFLIGHT_MAX)
            wop = KVP_WOP_GET_LOCAL;
        pthread_mutex_unlock(&r->mu);
    }
    pending_t *p = pending_new(wop, oc);
    uint64_t *sizes = NULL;
    if (!p)
        return KVP_ERR_NO_MEMORY;
    p->off = off;
    p->cnt = cnt;
    p->caller_drives = will_drive;
    p->req_id = new_id(r);
    const void *data = NULL;
    size_t count = 0;
    int iov = 0;
    if (wop == KVP_WOP_PUT || wop == KVP_WOP_GET || wop == KVP_WOP_GET_LOCAL) {
        sizes = kvp__malloc((cnt ? cnt : 1) * sizeof *sizes);
        if (!sizes)
            goto nomem;
        uint32_t nv = 0;
        for (uint32_t i = 0; i < cnt; i++) {
            const kvp_sgl_t *v = &op->values[off + i];
            sizes[i] = sgl_len(v);
            for (uint32_t j = 0; j < v->iovcnt; j++)
                nv += v->iov[j].len != 0;
        }
        if (wop == KVP_WOP_PUT) {
            p->iov = kvp__calloc(nv ? nv : 1, sizeof *p->iov);
            if (!p->iov)
                goto nomem;
            p->niov = nv ? nv : 1;
            uint32_t k = 0;
            for (uint32_t i = 0; i < cnt; i++) {
                const kvp_sgl_t *v = &op->values[off + i];
                op->results[off + i].size = sizes[i];
                p->payload_bytes += sizes[i];
                for (uint32_t j = 0; j < v->iovcnt; j++)
                    if (v->iov[j].len) {
                        p->iov[k].buffer = v->iov[j].base;
                        p->iov[k].length = v->iov[j].len;
                        k++;
                    }
            }
            if (k == 1) {
                data = p->iov[0].buffer;
                count = p->iov[0].length;
            } else {
                data = p->iov;
                count = k;
                iov = 1;
            }
        }
    }
    kvp__wire_req_encode(&p->w, wop, p->req_id, op->timeout_ms ? op->timeout_ms : r->timeout_ms,
                         r->conn_key, op->keys ? op->keys + off : NULL, cnt, sizes);
    kvp__free(sizes, (cnt ? cnt : 1) * sizeof *sizes);
    sizes = NULL;
    if (p->w.err)
        goto nomem;
    kvp_status_t st = post(r, p, data, count, iov);
    if (st != KVP_INPROGRESS)
        pending_free(p);
    return st;
nomem:
    kvp__free(sizes, (cnt ? cnt : 1) * sizeof *sizes);
    pending_free(p);
    return KVP_ERR_NO_MEMORY;
}

/* Keys in the request starting at `off`. */
static uint32_t slice_len(const kvp_op_t *op, uint32_t off)
{
    uint32_t left = (uint32_t)op->n - off;
    uint32_t n = left < KVP_SLICE_KEYS ? left : KVP_SLICE_KEYS;
    if (op->type != KVP_OP_PUT)
        return n;
    size_t bytes = 64;
    for (uint32_t i = 0; i < n; i++) {
        bytes += op->keys[off + i].len + 16u;
        if (i && bytes > KVP_AM_HDR_MAX)
            return i;
    }
    return n;
}

static kvp_status_t remote_submit(void *impl, kvp_op_t *op, int will_drive)
{
    remote_t *r = impl;
    kvp_status_t st = ensure_connected(r);
    if (st != KVP_OK)
        return st;
    uint32_t wop = wire_op(op->type);
    uint32_t n = (uint32_t)op->n;
    if (op->type == KVP_OP_PREFIX && n == 0) {
        *op->prefix_len = 0;
        return KVP_OK;
    }
    if (n == 0 && op->type != KVP_OP_REMOVE_ALL)
        return KVP_OK;
    opctx_t *oc = kvp__calloc(1, sizeof *oc);
    if (!oc)
        return KVP_ERR_NO_MEMORY;
    oc->op = op;
    oc->prefix = n;
    uint32_t nslices = 1;
    if (n) {
        nslices = 0;
        for (uint32_t off = 0; off < n; off += slice_len(op, off))
            nslices++;
    }
    oc->left = nslices;
    uint32_t off = 0, posted = 0;
    for (uint32_t i = 0; i < nslices; i++) {
        uint32_t cnt = n ? slice_len(op, off) : 0;
        st = post_slice(r, oc, wop, off, cnt, will_drive, 1);
        if (st != KVP_INPROGRESS)
            break;
        posted++;
        off += cnt;
    }
    if (posted == nslices)
        return KVP_INPROGRESS;
    /* Some slices were not sent: they count as finished with this error. */
    pthread_mutex_lock(&r->mu);
    if (oc->status == KVP_OK)
        oc->status = st;
    for (uint32_t k = off; k < n && op->results; k++)
        op->results[k].status = st;
    oc->left -= nslices - posted;
    int last = oc->left == 0;
    pthread_mutex_unlock(&r->mu);
    if (posted == 0) {
        kvp__free(oc, sizeof *oc);
        return st; /* nothing in flight: fail now, no callback */
    }
    if (last)
        fire(oc);
    return KVP_INPROGRESS;
}

static kvp_status_t remote_stats(void *impl, kvp_pool_stats_t *stp)
{
    remote_t *r = impl;
    kvp_status_t st = ensure_connected(r);
    if (st != KVP_OK)
        return st;
    pending_t *p = pending_new(KVP_WOP_STATS, NULL);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    memset(stp, 0, sizeof *stp);
    p->stats_out = stp;
    p->req_id = new_id(r);
    kvp__wire_req_encode(&p->w, KVP_WOP_STATS, p->req_id, r->timeout_ms, r->conn_key, NULL, 0, NULL);
    return run_internal(r, p, NULL); /* fills *stp from the reply */
}

static uint64_t remote_max_value(void *impl)
{
    remote_t *r = impl;
    return r->max_value ? r->max_value : KVP_VALUE_MAX;
}

static void remote_close(void *impl)
{
    remote_t *r = impl;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    /* A healthy connection closes by flushing, so the last messages owed to
     * the server (rendezvous acknowledgements) still go out. */
    if (r->ep || r->tcp_fd >= 0)
        do_retire(r, r->connected);
    r->connected = 0;
    pthread_mutex_unlock(&r->mu);
    wake(r);
    pthread_join(r->thr, NULL);
    while (r->regs) {
        reg_t *g = r->regs;
        r->regs = g->next;
        ucp_mem_unmap(r->ctx, g->memh);
        kvp__free(g, sizeof *g);
    }
    kvp__ucx_close(r->ctx, r->worker);
    while (r->cb_all) { /* UCX calls back no more */
        cbarg_t *a = r->cb_all;
        r->cb_all = a->next_all;
        kvp__free(a, sizeof *a);
    }
    close(r->wake_fd);
    close(r->epfd);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->conn_mu);
    pthread_mutex_destroy(&r->tx_mu);
    pthread_mutex_destroy(&r->rx_mu);
    pthread_rwlock_destroy(&r->wlock);
    pthread_cond_destroy(&r->cv);
    kvp__free(r->rx_buf, r->rx_cap);
    kvp__free(r->rx_sink, LANE_SINK);
    kvp__lmap_put(r->lmap);
    if (r->token)
        kvp__free(r->token, strlen(r->token) + 1);
    kvp__free(r, sizeof *r);
}

static char *read_token_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[300];
    if (!f || !fgets(buf, sizeof buf, f)) {
        if (f)
            fclose(f);
        kvp_error("remote: cannot read token file %s", path);
        return NULL;
    }
    fclose(f);
    buf[strcspn(buf, "\r\n")] = 0;
    return kvp__strdup(buf);
}

static int host_is_local(const char *host)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai)
        return 0;
    struct in_addr a = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    freeaddrinfo(ai);
    if ((ntohl(a.s_addr) >> 24) == 127)
        return 1;
    struct ifaddrs *ifs = NULL;
    int local = 0;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
            local = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr;
        freeifaddrs(ifs);
    }
    return local;
}

/* Which kinds of transport the client's UCX context has. */
static void ucx_kinds(remote_t *r, int *shm_p, int *rdma_p)
{
    char tls[512];
    snprintf(tls, sizeof tls, "%s", kvp__ucx_transports(r->ctx));
    int shm = 0, rdma = 0;
    char *save = NULL;
    for (char *t = strtok_r(tls, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (!strcmp(t, "posix") || !strcmp(t, "sysv") || !strcmp(t, "xpmem") || !strcmp(t, "cma") ||
            !strcmp(t, "knem"))
            shm = 1;
        else if (!strncmp(t, "rc", 2) || !strncmp(t, "dc", 2) || !strncmp(t, "ud", 2))
            rdma = 1;
    }
    *shm_p = shm;
    *rdma_p = rdma;
}

/* transport=auto: kvpool's TCP transport where UCX could only reach the
 * server over tcp anyway (no RDMA transport here, and shared memory either
 * unavailable or useless because the server is on another host). */
static int lane_by_default(remote_t *r)
{
    int shm, rdma;
    ucx_kinds(r, &shm, &rdma);
    if (rdma)
        return 0;
    return !shm || !host_is_local(r->host);
}

static kvp_status_t remote_open(kvp__uri_t *u, void **impl_p)
{
    const char *auth = u->authority;
    const char *colon = strrchr(auth, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == auth || (size_t)(colon - auth) >= 256 || *end || port < 1 || port > 65535 || u->path[0]) {
        kvp_error("remote: URI must be kvpool://HOST:PORT (got authority '%s')", auth);
        return KVP_ERR_BAD_URI;
    }
    uint64_t timeout_ns = 5ull * 1000000000ull;
    const char *v = kvp__uri_opt(u, "timeout");
    if (v && (kvp__parse_duration_ns(v, &timeout_ns) != KVP_OK || timeout_ns < 1000000ull)) {
        kvp_error("remote: timeout=%s is not a duration of at least 1ms", v);
        return KVP_ERR_BAD_OPTION;
    }
    int transport = TRANSPORT_AUTO;
    if ((v = kvp__uri_opt(u, "transport"))) {
        if (!strcmp(v, "ucx"))
            transport = TRANSPORT_UCX;
        else if (!strcmp(v, "tcp"))
            transport = TRANSPORT_TCP;
        else if (strcmp(v, "auto") != 0) {
            kvp_error("remote: transport=%s: expected auto, ucx or tcp", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    int local_reads = 1;
    if ((v = kvp__uri_opt(u, "local_reads"))) {
        if (!strcmp(v, "off"))
            local_reads = 0;
        else if (strcmp(v, "auto") != 0) {
            kvp_error("remote: local_reads=%s: expected auto or off", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    char *token = NULL;
    if ((v = kvp__uri_opt(u, "token_file"))) {
        if (!(token = read_token_file(v)))
            return KVP_ERR_BAD_OPTION;
    } else if (getenv("KVPOOL_TOKEN")) {
        token = kvp__strdup(getenv("KVPOOL_TOKEN"));
    }
    kvp_status_t st = kvp__uri_check_unused(u);
    remote_t *r = st == KVP_OK ? kvp__calloc(1, sizeof *r) : NULL;
    if (!r) {
        if (token)
            kvp__free(token, strlen(token) + 1);
        return st == KVP_OK ? KVP_ERR_NO_MEMORY : st;
    }
    memcpy(r->host, auth, (size_t)(colon - auth));
    r->port = (uint16_t)port;
    r->token = token;
    r->timeout_ms = (uint32_t)(timeout_ns / 1000000ull);
    r->tcp_fd = -1;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->conn_mu, NULL);
    pthread_mutex_init(&r->tx_mu, NULL);
    pthread_mutex_init(&r->rx_mu, NULL);
    pthread_rwlockattr_t wa;
    pthread_rwlockattr_init(&wa);
    pthread_rwlockattr_setkind_np(&wa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r->wlock, &wa);
    pthread_rwlockattr_destroy(&wa);
    pthread_cond_init(&r->cv, NULL);
    r->transport = transport;
    r->local_reads = local_reads;
    r->lmap_gen = -1;
    r->rx_gen = -1;
    r->rx_buf = kvp__malloc(LANE_RX_START);
    r->rx_cap = LANE_RX_START;
    r->rx_sink = kvp__malloc(LANE_SINK);
    r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    st = r->rx_buf && r->rx_sink ? kvp__ucx_open("client", KVP_UCX_CLIENT, &r->ctx, &r->worker)
                                  : KVP_ERR_NO_MEMORY;
    if (st != KVP_OK)
        goto err;
    r->use_lane = transport == TRANSPORT_TCP || (transport == TRANSPORT_AUTO && lane_by_default(r));
    /* Local reads are shared memory: not where UCX was told to keep off it
     * (UCX_TLS=tcp means the bytes should cross TCP). */
    int shm, rdma;
    ucx_kinds(r, &shm, &rdma);
    r->local_reads = r->local_reads && shm;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r->wake_fd};
    epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->wake_fd, &ev);
    if (worker_setup(r) != KVP_OK) {
        st = KVP_ERR_IO;
        kvp__ucx_close(r->ctx, r->worker);
        goto err;
    }
    if (pthread_create(&r->thr, NULL, progress_main, r) != 0) {
        st = KVP_ERR_NO_MEMORY;
        kvp__ucx_close(r->ctx, r->worker);
        goto err;
    }
    /* Connect now so a bad address or token fails open, not the first op. */
    st = ensure_connected(r);
    if (st != KVP_OK) {
        remote_close(r);
        return st;
    }
    *impl_p = r;
    return KVP_OK;
err:
    close(r->wake_fd);
    close(r->epfd);
    kvp__free(r->rx_buf, r->rx_cap);
    kvp__free(r->rx_sink, LANE_SINK);
    if (r->token)
        kvp__free(r->token, strlen(r->token) + 1);
    kvp__free(r, sizeof *r);
    return st;
}

/* Registration maps the buffer with UCX once, so transfers to and from it
 * skip UCX's per-transfer registration (matters for RDMA; shared memory via
 * CMA needs none). */
static kvp_status_t remote_reg(void *impl, void *addr, size_t len)
{
    remote_t *r = impl;
    reg_t *g = kvp__calloc(1, sizeof *g);
    if (!g)
        return KVP_ERR_NO_MEMORY;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = len,
    };
    ucs_status_t us = ucp_mem_map(r->ctx, &mp, &g->memh);
    if (us != UCS_OK) {
        kvp_error("remote: cannot register %zu bytes: %s", len, ucs_status_string(us));
        kvp__free(g, sizeof *g);
        return KVP_ERR_IO;
    }
    g->addr = addr;
    pthread_mutex_lock(&r->mu);
    g->next = r->regs;
    r->regs = g;
    pthread_mutex_unlock(&r->mu);
    return KVP_OK;
}

static kvp_status_t remote_dereg(void *impl, void *addr)
{
    remote_t *r = impl;
    pthread_mutex_lock(&r->mu);
    reg_t **pp = &r->regs, *g = NULL;
    while (*pp && (*pp)->addr != addr)
        pp = &(*pp)->next;
    if (*pp) {
        g = *pp;
        *pp = g->next;
    }
    pthread_mutex_unlock(&r->mu);
    if (!g) {
        kvp_error("remote: deregister of %p, which is not registered", addr);
        return KVP_ERR_NOT_FOUND;
    }
    ucp_mem_unmap(r->ctx, g->memh);
    kvp__free(g, sizeof *g);
    return KVP_OK;
}

#define DRIVE_YIELD_AFTER_NS 50000ull

static void remote_drive(void *impl, _Atomic int *done, uint64_t until_ns)
{
    remote_t *r = impl;
    /* Every waiting caller may drive (a UCX worker in multi-thread mode
     * serialises them); while any does, the progress thread sleeps. */
    atomic_fetch_add(&r->driving, 1);
    uint64_t last_work = kvp__now_ns();
    for (;;) {
        if (atomic_load(done))
            break;
        int did;
        if (atomic_load(&r->lane)) {
            did = 0;
            if (pthread_mutex_trylock(&r->rx_mu) == 0) {
                did = lane_rx(r);
                pthread_mutex_unlock(&r->rx_mu);
            }
        } else {
            int wl = wlock_rd(&r->wlock);
            did = r->worker ? (int)ucp_worker_progress(r->worker) : 0;
            wunlock(&r->wlock, wl);
            if (did)
                atomic_store(&r->progressed_ns, kvp__now_ns());
        }
        if (did) {
            last_work = kvp__now_ns();
            continue;
        }
        uint64_t now = kvp__now_ns();
        if (now >= until_ns)
            break;
        /* Idle for a while: the other side is busy moving bytes (a large
         * transfer).  Let a runnable thread, the server on a small host,
         * have this core meanwhile; returns at once when none is. */
        if (now - last_work > DRIVE_YIELD_AFTER_NS)
            sched_yield();
    }
    if (atomic_fetch_sub(&r->driving, 1) != 1)
        return;
    /* Hand the worker back to the progress thread if anyone still waits. */
    if (atomic_load(&r->npending) > 0)
        wake(r);
}

static kvp_status_t remote_test_recover(void *impl)
{
    remote_t *r = impl;
    pthread_mutex_lock(&r->mu);
    int want = r->replaced + 1;
    r->replace_req = 1;
    pthread_mutex_unlock(&r->mu);
    wake(r);
    pthread_mutex_lock(&r->mu);
    while (r->replaced < want)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return KVP_OK;
}

const kvp__backend_ops_t kvp__remote_backend = {
    .test_recover = remote_test_recover,
    .drive = remote_drive,
    .reg = remote_reg,
    .dereg = remote_dereg,
    .scheme = "kvpool",
    .open = remote_open,
    .close = remote_close,
    .submit = remote_submit,
    .stats = remote_stats,
    .max_value = remote_max_value,
};
