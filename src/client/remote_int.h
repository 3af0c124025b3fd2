/*
 * Internals of the kvpool:// backend, shared by its files:
 *     remote.c        the backend ops: open, close, submit and slicing, stats, reg, drive
 *     remote_req.c    a request's life (the pending table, pend_state, do_advance)
 *     remote_conn.c   the connection's life (rconn_state), connect, backoff, the dead list,
 *                     deadlines, failing a lost connection's requests
 *     remote_ucx.c    UCX callbacks, the worker lock, worker replacement, the progress thread
 *     remote_lane.c   the client side of kvpool's TCP transport (net/lane.h)
 *     remote_reply.c  reply decoding: a reply's op fields into the request's op
 *     local_read.c    local reads, and the release batching of GET_LOCALs (local_read.h)
 * remote.c's opening comment describes the whole backend.
 *
 * Locking order (never taken in the other direction):
 *     conn_mu  ->  wlock  ->  mu          (connecting: one at a time, on a worker that stays)
 *     tx_mu    ->  rx_mu                  (only to close a lane socket, reap_dead)
 *     tx_mu    ->  mu,   rx_mu  ->  mu
 *     mu       ->  local_read.c's lock   (a mapping's references)
 * mu is the innermost client lock: it is never held across a UCX call, a
 * socket call or a completion callback (UCX callbacks take it, so holding it
 * around one would invert the order).  wlock is a reader/writer lock whose
 * read side a thread may take again while it holds it (a per-thread depth,
 * remote_ucx.c); its only writer is the progress thread replacing the worker.
 * One known exception, as found: a completion callback runs on the thread
 * that ended the request, with that thread's locks held, and pool.h lets it
 * submit the next op from there.  From a driving caller's lane_rx (rx_mu
 * held) a lane write then takes tx_mu (rx_mu -> tx_mu), and from a driving
 * caller's worker progress (wlock read) a reconnect takes conn_mu (wlock ->
 * conn_mu).  Either can deadlock against reap_dead (tx_mu -> rx_mu) or a
 * connecting thread queued behind a worker replacement (conn_mu -> wlock):
 * it takes a callback that submits at exactly that moment.
 *
 * Functions prefixed do_ expect the caller to hold mu (some release it:
 * their comment says so).
 */
#ifndef KVP_CLIENT_REMOTE_INT_H
#define KVP_CLIENT_REMOTE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "client/local_read.h"
#include "client/remote.h"
#include "common/mp.h"
#include "kvpool/pool.h"
#include "net/lane.h"
#include "net/ucx.h"
#include "net/wire.h"
#include "net/wire_reply.h"

#define KVP_REMOTE_NBUCKETS 256

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

/*
 * A request's life (remote_req.c has the table and its one setter).  Two
 * sides end independently, in either order: the send (UCX, or the lane
 * write, no longer reads the caller's buffers) and the reply (its values are
 * in the caller's buffers, or it failed).  Between the reply's header and
 * its end, the values may be moved with mu not held, by UCX (a rendezvous
 * receive) or by the thread that parsed a GET_LOCAL reply (the copy out of
 * the mapped arena): then only that mover ends the reply side.  Once both
 * sides ended the request is DONE: out of the table, its op told.
 */
typedef enum pend_state {
    PEND_POSTED,      /* neither side ended */
    PEND_SENT,        /* the send ended; waiting for the reply */
    PEND_RECV,        /* UCX receives the values (the send has not ended) */
    PEND_RECV_SENT,   /* UCX receives the values; the send ended */
    PEND_COPY,        /* the GET_LOCAL's copy is under way (the send has not ended) */
    PEND_COPY_SENT,   /* the copy is under way; the send ended */
    PEND_REPLIED,     /* the reply side ended; the send has not */
    PEND_DONE,        /* both ended */
    PEND_NUM_STATES
} pend_state_t;

/* What happens to a request (the events of the table in remote_req.c). */
typedef enum pend_ev {
    PEV_SENT,         /* its send ended */
    PEV_RECV,         /* its reply came and UCX receives the values (rendezvous) */
    PEV_COPY,         /* its GET_LOCAL reply came and is copied, mu not held */
    PEV_REPLIED,      /* its reply side ended: values in, copy done, or failed */
    PEV_LOST,         /* its connection failed it: its send ended and no reply is coming
                       * (a receive or copy under way still ends the reply side) */
    PEV_ABANDON,      /* its receive will never end: the worker that ran it is gone */
    PEV_NUM
} pend_ev_t;

typedef struct pending {
    struct pending *next;
    opctx_t *parent;              /* NULL for internal ops (stats) */
    uint32_t off, cnt;            /* the slice of the op's keys */
    uint64_t payload_bytes;       /* PUT: value bytes this request carries */
    uint64_t req_id;
    uint32_t wop;
    int gen;
    kvp_op_t *op;                 /* parent->op, or NULL */
    pend_state_t state;           /* under mu; written by kvp__remote_do_advance only */
    int timed_out;                /* its deadline passed: it ends with KVP_ERR_TIMEOUT */
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
    kvp__wire_hello_t hello;
    /* GET_LOCAL */
    kvp__lmap_t *lmap;            /* the mapping its offsets are in (a reference) */
    kvp__cpseg_t *segs;           /* what to copy */
    uint32_t nsegs, segs_cap;
    int release;                  /* the server leased something: RELEASE it */
    uint64_t lr_slot, lr_gen;     /* the lease table slot and its generation while leased */
    int repost;                   /* the server was busy: the slice goes again as a GET (progress thread) */
    int caller_drives;            /* its caller drives the worker: no need to wake the progress thread */
} pending_t;

/* A caller buffer registered with UCX (kvp_pool_register). */
typedef struct reg {
    struct reg *next;
    void *addr;
    ucp_mem_h memh;
} reg_t;

/*
 * The connection's life (remote_conn.c has the table and its one setter).
 * A handle has at most one current connection; a lost one is retired to the
 * dead list (dead_t) and the handle is IDLE again, the next op connecting
 * (after the backoff).  gen names the current connection (bumped when one is
 * retired), so a thread that began on an older one can tell.
 */
typedef enum rconn_state {
    RCONN_IDLE,       /* no connection: the next op connects, after the backoff */
    RCONN_CONNECTING, /* a thread holding conn_mu is connecting */
    RCONN_READY,      /* connected: requests may be posted on it */
    RCONN_CLOSED,     /* kvp_pool_close: never connects again */
    RCONN_NUM_STATES
} rconn_state_t;

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

#define LANE_RX_START 4096u
#define LANE_SINK 65536u
/* A get with less capacity than this goes over UCX even when local reads
 * are possible: below it UCX's eager messages come within 2 us, and the server
 * holds no leases for the client (docs/transport.md §9). */
#define LOCAL_MIN (16u * 1024u)
/* GET_LOCAL requests one connection keeps in flight at most (the server
 * refuses more than 4096 unreleased ones); beyond it gets go over UCX. */
#define LOCAL_INFLIGHT_MAX 1024u

typedef struct remote {
    reg_t *regs;                   /* under mu */
    char host[256];
    uint16_t port;
    char *token;
    uint32_t timeout_ms;
    ucp_context_h ctx;             /* the process's shared client context (net/ucx.h) */
    ucp_worker_h worker;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_mutex_t conn_mu;       /* one connect at a time */
    /* the current connection (under mu) */
    rconn_state_t cstate;          /* written by kvp__remote_do_set_cstate only */
    ucp_ep_h ep;
    int tcp_fd;                    /* the handshake socket: closes when the server dies */
    uint64_t conn_key;
    int gen;                       /* connection generation: bumped when one is lost */
    int senders;                   /* threads inside post() on the current connection */
    struct dead *dead;             /* lost connections the progress thread has yet to close */
    uint64_t next_retry_ns;
    uint32_t backoff_ms;
    int epfd;                      /* the progress thread's */
    struct cbarg *cb_all, *cb_free; /* UCX callback arguments: all ever made, and the unused */
    /* the worker (remote_ucx.c) */
    pthread_rwlock_t wlock;        /* read: using the worker (drive, send); write: replacing it */
    int replacing;                 /* the worker is being replaced (or could not be): no new connection */
    int replace_req;               /* tests: replace it now (kvp__pool_test_recover) */
    uint64_t recv_active;          /* requests in PEND_RECV or PEND_RECV_SENT */
    _Atomic uint64_t progressed_ns; /* when any thread's progress last did something */
    int replaced;                  /* how many times it was */
    int wfd;                       /* the worker's event fd, in epfd */
    pending_t *bucket[KVP_REMOTE_NBUCKETS];
    _Atomic uint64_t npending;     /* written under mu; read without it by drive */
    _Atomic uint64_t next_id;
    pthread_t thr;
    int stop;
    int wake_fd;
    _Atomic int driving;           /* caller threads driving the worker now */
    /* kvpool's TCP transport (net/lane.h) instead of UCX for this connection */
    int transport;                 /* kvp__remote_transport_t */
    int use_lane;                  /* decided at open: connect with the lane */
    _Atomic int lane;              /* the current connection is a lane */
    pthread_mutex_t tx_mu;         /* one frame written at a time; held while the socket closes */
    pthread_mutex_t rx_mu;         /* one reader at a time; held while the socket closes */
    int rx_gen;                    /* the connection the receive state below belongs to */
    kvp__lane_rx_t rx;             /* the reply frame being read (under rx_mu) */
    pending_t *rx_p;               /* whose values it reads, into p->iov (NULL: into rx_sink) */
    char *rx_sink;                 /* LANE_SINK bytes: values nobody waits for */
    uint64_t max_value;
    /* local reads */
    int local_reads;               /* URI option: 1 auto, 0 off */
    kvp__lmap_t *lmap;             /* the server's arena mapped (under mu) */
    int lmap_gen;                  /* the connection it belongs to */
    uint32_t local_inflight;       /* GET_LOCAL requests not finished */
    /* GET_LOCALs copied but not yet released (under mu; local_read.c) */
    uint64_t rel[KVP_RELEASED_MAX];
    uint32_t nrel;
    uint64_t rel_since_ns;
    pending_t *reposts;            /* GET_LOCALs the server was too busy for, to go again as GETs (under mu) */
} remote_t;

/* ---- the worker lock (remote_ucx.c) ---- */
extern __thread const void *kvp__remote_t_wlock_held;
/* Takes wlock for reading (again, if this thread holds it); returns what
 * kvp__remote_wunlock needs. */
int kvp__remote_wlock_rd(pthread_rwlock_t *l);
void kvp__remote_wunlock(pthread_rwlock_t *l, int how);

static inline void kvp__remote_wake(remote_t *r)
{
    uint64_t one = 1;
    (void)!write(r->wake_fd, &one, sizeof one);
}

/* ---- a request's life (remote_req.c) ---- */
static inline pending_t *kvp__remote_do_find(remote_t *r, uint64_t id)
{
    for (pending_t *p = r->bucket[id % KVP_REMOTE_NBUCKETS]; p; p = p->next)
        if (p->req_id == id)
            return p;
    return NULL;
}
void kvp__remote_do_add(remote_t *r, pending_t *p);
pending_t *kvp__remote_pending_new(uint32_t wop, opctx_t *parent);
void kvp__remote_pending_free(pending_t *p);
/* Applies ev to p: its one state setter (an event its state does not take
 * is refused and logged, p unchanged).  When p becomes DONE it leaves the
 * table; returns the caller op to complete (kvp__remote_fire, after
 * unlocking) when p was its last request, else NULL.  A DONE p may have
 * been freed. */
opctx_t *kvp__remote_do_advance(remote_t *r, pending_t *p, pend_ev_t ev);
/* PEV_LOST with status st (KVP_ERR_TIMEOUT if its deadline passed): the
 * status is p's unless its reply side ended already (or, during a receive
 * or copy, another failure came first). */
opctx_t *kvp__remote_do_lost(remote_t *r, pending_t *p, kvp_status_t st);
/* Has p's reply not come yet (POSTED or SENT)? */
static inline int kvp__remote_awaits_reply(const pending_t *p)
{
    return p->state == PEND_POSTED || p->state == PEND_SENT;
}
/* Is p's reply side still open (not REPLIED, not DONE)? */
static inline int kvp__remote_reply_open(const pending_t *p)
{
    return p->state != PEND_REPLIED && p->state != PEND_DONE;
}
static inline int kvp__remote_receiving(const pending_t *p)
{
    return p->state == PEND_RECV || p->state == PEND_RECV_SENT;
}
static inline int kvp__remote_copying(const pending_t *p)
{
    return p->state == PEND_COPY || p->state == PEND_COPY_SENT;
}
const char *kvp__remote_pend_state_name(pend_state_t s);
/* Completes a caller op (mu not held). */
void kvp__remote_fire(opctx_t *oc);

/* ---- reply decoding (remote_reply.c) ---- */
/* Decodes a reply header and finds the request it answers, one whose reply
 * has not come (kvp__remote_awaits_reply): returns it with mu held, or NULL
 * (mu not held) for a reply nobody waits for (logged when it is the server
 * refusing something). */
pending_t *kvp__remote_match_reply(remote_t *r, const void *hdr, size_t len, kvp__wire_reply_t *rep);
/* Parses the op fields of p's reply rep, whose values are data_len bytes,
 * into p's op (mu held).  GET: builds p->iov over the caller's buffers for
 * the values.  GET_LOCAL: builds p->segs (the copies out of the mapping),
 * p->release, p->repost, p->lr_slot/lr_gen.  HELLO, STATS: p's internal
 * fields.  KVP_OK, the reply's own failure, or KVP_ERR_PROTOCOL /
 * KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__remote_reply_parse(pending_t *p, kvp__wire_reply_t *rep, size_t data_len);

/* ---- the connection's life (remote_conn.c) ---- */
/* The one setter of r->cstate: KVP_ERR_STATE (logged, nothing changed)
 * for a transition the table does not have. */
kvp_status_t kvp__remote_do_set_cstate(remote_t *r, rconn_state_t to);
const char *kvp__remote_cstate_name(rconn_state_t s);
static inline int kvp__remote_do_ready(const remote_t *r) { return r->cstate == RCONN_READY; }
void kvp__remote_do_retire(remote_t *r, int graceful);
void kvp__remote_do_disconnect(remote_t *r, const char *why);
int kvp__remote_do_hold(remote_t *r, int gen);
void kvp__remote_do_sent(remote_t *r, int gen);
void kvp__remote_fail_requests(remote_t *r, int gen, int stranded);
void kvp__remote_check_deadlines(remote_t *r);
int kvp__remote_reap_dead(remote_t *r);
/* Makes sure a connection is up (reconnects after the backoff), within
 * timeout_ms (0 or more than the handle's: the handle's call timeout), so
 * that an op's own timeout bounds the connect it needs: waiting for
 * another thread's connect or a worker replacement, and the handshake.
 * KVP_OK, KVP_ERR_CONN_LOST (in the backoff, or a replacement), or the
 * connect's failure (KVP_ERR_TIMEOUT when the time ran out). */
kvp_status_t kvp__remote_ensure_connected(remote_t *r, uint32_t timeout_ms);

/* ---- UCX (remote_ucx.c) ---- */
cbarg_t *kvp__remote_cb_arg(remote_t *r, uint64_t id);
void kvp__remote_do_cb_put(remote_t *r, cbarg_t *a);
void kvp__remote_on_send_done(void *request, ucs_status_t status, void *user_data);
void kvp__remote_on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status);
kvp_status_t kvp__remote_worker_setup(remote_t *r);
void *kvp__remote_progress_main(void *arg);

/* ---- the TCP transport (remote_lane.c) ---- */
int kvp__remote_lane_rx(remote_t *r);
void kvp__remote_lane_post(remote_t *r, pending_t *p, int fd, const void *data, size_t count, int iov);

/* ---- posting (remote.c) ---- */
kvp_status_t kvp__remote_post_slice(remote_t *r, opctx_t *oc, uint32_t wop, uint32_t off, uint32_t cnt,
                                    int will_drive, int local_ok);
kvp_status_t kvp__remote_run_request(remote_t *r, uint32_t wop, uint64_t key, const kvp_key_t *proof,
                                     pending_t **keep_p);

#endif
