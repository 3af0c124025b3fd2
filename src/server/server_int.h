/*
 * Server internals shared by its files:
 *
 *   server.c    the event loop, signals, start-up and shutdown, UCX worker
 *               replacement
 *   conn.c      connections: accepting, the handshake and its caps, the
 *               connection state machine (conn_set_state), deadlines, reaping
 *   handlers.c  requests: decoding, dispatch, replies, puts, gets, the
 *               other ops, the UCX request handler
 *   lane.c      kvpool's TCP transport (net/lane.h): frames in, frames out
 *   lreads.c    local reads: the arena and lease table shared read-only with
 *               clients on this host, GET_LOCAL leases and their deadlines
 *
 * Threads and locks.  Everything here runs on the one event-loop thread:
 * the UCX worker's callbacks, the sockets, the timers.  No lock is taken;
 * nothing may block.  The only other thread is the metrics endpoint's, which
 * reads kvp__server_counters_t (atomics) and the store's stats (the store
 * locks for itself).
 *
 * Trust.  Every byte from a socket or an active message is decoded by
 * kvpool's own bounded decoders (net/handshake.c, net/wire.c, net/lane.c)
 * before use.  UCX never parses a client's address: the server's UCX has no
 * tcp (net/ucx.c), clients create the endpoints, and the server answers on
 * the reply endpoint of each request, which must be the one its connection
 * was bound to.  Every resource a client can hold has a cap and a deadline:
 *
 *   resource                     cap                         deadline
 *   a connection in handshake    HS_MAX, HS_PER_SOURCE       HS_TIMEOUT_NS
 *   an established connection    max_conns, per-source cap   (its socket)
 *   a put's reservations         UCX: put_resv_max per conn; put_timeout (no progress)
 *                                TCP: one chunk ahead of the bytes received
 *   a staged put value (TCP)     one per conn, stage budget  put_timeout (no progress)
 *   a request header (TCP)       KVP_WIRE_HEADER_MAX, hdr_max LANE_FRAME_NS
 *   replies waiting (TCP)        LANE_TX_MAX_*               (backpressure)
 *   local-read leases            LR_GROUPS_MAX, bytes, keys  LR_TTL_NS
 *   (and whatever a request holds past its timeout_ms goes: kvp__req_deadline)
 */
#ifndef KVP_SERVER_SERVER_INT_H
#define KVP_SERVER_SERVER_INT_H

#include <stdint.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>

#include "common/list.h"
#include "net/handshake.h"
#include "net/lane.h"
#include "net/wire.h"
#include "net/wire_reply.h"
#include "server/metrics.h"
#include "server/server.h"
#include "store/store.h"

/* What an epoll event points at. */
typedef enum { SRC_LISTEN, SRC_CONN, SRC_SIGNAL, SRC_TIMER, SRC_WORKER } src_kind_t;
typedef struct evsrc {
    src_kind_t kind;
    int fd;
} evsrc_t;

/* A connection's life (the transitions: conn.c, conn_set_state). */
typedef enum conn_state {
    CONN_HELLO,      /* accepted: reading the client's hello */
    CONN_CHALLENGED, /* version 2: challenge sent, reading the client's response */
    CONN_READY,      /* serving requests, over UCX or the TCP transport */
    CONN_DEAD,       /* peer gone or misbehaved: ends once its requests have, and its socket closed */
    CONN_NSTATES
} conn_state_t;

typedef struct source source_t; /* per peer address: its connections (conn.c) */

typedef struct conn {
    evsrc_t src;              /* first: epoll data points here */
    kvp__list_t link;         /* s->conns */
    kvp__list_t hs_link;      /* s->handshakes, least recent progress first (HELLO, CHALLENGED) */
    struct conn *hnext;       /* s->by_key chain */
    conn_state_t state;
    uint64_t id;
    uint64_t key;             /* random; every request names it */
    source_t *source;
    int peer_local;           /* the peer's address is this host's */
    int lane;                 /* kvpool's TCP transport (else UCX) */
    /* handshake */
    uint8_t *hs_buf;          /* KVP_HS_BUF_MAX bytes, allocated at the first byte */
    size_t hs_len;
    uint32_t hs_version;
    uint64_t hs_deadline_ns;
    uint64_t hs_progress_ns;  /* accepted, or last completed a handshake message */
    uint8_t hs_cnonce[KVP_HS_NONCE], hs_snonce[KVP_HS_NONCE];
    /* requests */
    ucp_ep_h ep;              /* UCX: the client's reply endpoint, bound by its first request */
    uint64_t inflight;        /* replies being sent + puts being received + headers being received */
    uint64_t dead_since_ns;
    kvp__list_t replies;      /* replies being sent (reply_t.link) */
    kvp__list_t puts;         /* UCX puts whose values are being received (put_ctx_t.link) */
    kvp__list_t in_datas;     /* UCX request headers being received (in_data_t.link) */
    uint64_t put_resv_bytes;  /* their reserved bytes */
    /* kvpool's TCP transport: frames on src.fd */
    kvp__lane_rx_t rx;        /* frames in (rx.buf: NULL until the lane starts) */
    uint64_t rx_frame_ns;     /* when the frame being read began (0: between frames) */
    struct put_ctx *rx_put;   /* a put whose values are being read (into rx_put->iov) */
    uint64_t rx_progress_ns;  /* when its last bytes came */
    kvp__list_t tx;           /* replies waiting for the socket, in order (reply_t.link) */
    uint32_t tx_count;
    uint64_t tx_bytes;        /* their frames' bytes (leased values included) */
    int tx_wait;              /* EPOLLOUT armed */
    int rx_paused;            /* EPOLLIN off: too many replies wait (the client does not read) */
    /* local reads (lreads.c) */
    int lr_proven;            /* the client showed it mapped the arena */
    kvp__list_t lgroups;
    uint32_t nlgroups;
    uint64_t lr_bytes, lr_leases;
    uint32_t lr_bogus;        /* releases naming nothing */
    uint64_t linger_until_ns; /* dead, its client maybe still reading: socket kept until then */
} conn_t;

/* A reply being sent: its header and the leases it reads from. */
typedef struct reply {
    kvp__list_t link;          /* c->replies (UCX) or c->tx (TCP), or s->abandoned */
    int abandoned;             /* the peer is gone: only the struct is left, for UCX's callback */
    struct server *s;
    conn_t *c;
    kvp__mpw_t w;
    uint8_t wbuf[256];
    uint32_t nleases;          /* leases taken (iov entries used) */
    uint32_t cap;              /* entries allocated in leases[] and iov[] */
    kvp__lease_t **leases;
    ucp_dt_iov_t *iov;
    uint64_t t0;
    uint32_t op;
    kvp__lane_tx_t tx;         /* TCP: its frame */
    uint64_t req_id;           /* GET: the request's, and its deadline (0: none; see kvp__req_deadline) */
    uint64_t expires_ns;
} reply_t;

/* A request header arriving as an active message's data (IN_DATA). */
typedef struct in_data {
    kvp__list_t link;       /* c->in_datas, or s->abandoned_in */
    struct server *s;
    conn_t *c;              /* NULL once abandoned */
    void *buf;
    size_t len;
} in_data_t;

/* A put whose values are still arriving. */
typedef struct put_ctx {
    kvp__list_t link;       /* c->puts (UCX), or s->abandoned_puts */
    struct server *s;
    conn_t *c;
    uint64_t req_id;
    uint32_t n;
    uint64_t t0;
    uint64_t deadline_ns;   /* UCX: the values must have arrived by then (put_timeout, or the request's) */
    uint64_t expires_ns;    /* the request's deadline (0: none) */
    kvp__resv_t **resv;     /* NULL entry: key not (yet) being stored */
    kvp_key_result_t *res;
    ucp_dt_iov_t *iov;      /* where each value goes */
    kvp_status_t refuse;    /* the values are dropped, the put answered with this */
    uint64_t resv_bytes;    /* UCX: bytes reserved (c->put_resv_bytes share) */
    int abandoned;          /* UCX may still call back: the reservations are gone */
    int expired;            /* given up for put_timeout: counted as expired_put */
    /* TCP: values are reserved as the bytes come (lane.c) */
    kvp_key_t *keys;        /* views into c->rx.buf */
    uint32_t decided;       /* values [0, decided) have a destination */
    int64_t staged;         /* the value being staged, or -1 */
    void *stage;            /* its bytes (staged mapping) */
} put_ctx_t;

typedef struct lgroup lgroup_t;

/* Local reads (lreads.c). */
typedef struct lreads {
    int fd;                   /* the lease table's memfd, shared read-only, or -1 */
    uint8_t *map;             /* [nonce | nslots | gen[nslots]] */
    size_t size;
    _Atomic uint64_t *gen;
    uint32_t nslots;
    uint32_t *free_slots;
    uint32_t nfree;
    lgroup_t **buckets;       /* by (conn id, req_id) */
    uint32_t nbuckets;
    uint64_t seed;
    kvp__list_t by_age;       /* every lgroup, oldest first */
    uint64_t ngroups;
    uint64_t bytes_max;       /* per connection */
} lreads_t;

#define KEY_BUCKETS 1024
#define SOURCE_BUCKETS 256

typedef struct server {
    kvp__server_params_t p;
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    int ucx_offered;            /* the worker reaches other processes (not only self) */
    int epfd;
    evsrc_t listen_src, signal_src, timer_src, worker_src;
    int listen_paused;          /* out of descriptors: the listener is out of epoll */
    uint64_t listen_resume_ns;
    kvp__store_t *store;
    kvp__list_t conns;
    kvp__list_t handshakes;     /* connections in the handshake, least recent progress first */
    uint32_t nhandshakes;
    conn_t *by_key[KEY_BUCKETS];
    source_t *sources[SOURCE_BUCKETS];
    uint64_t nconns, nestablished, next_conn_id;
    uint32_t max_conns, max_per_source;
    int draining, stop;
    int rebuild;                /* SIGUSR2: replace the UCX worker (see worker_rebuild) */
    uint64_t local_replied;     /* bytes this progress pass let clients copy (GET_LOCAL; see loop) */
    uint64_t drain_deadline_ns;
    uint64_t inflight;          /* requests not yet answered */
    uint64_t inflight_puts, inflight_replies, inflight_in_data; /* its parts, for diagnosis */
    kvp__list_t abandoned;      /* replies given up on (conn_abandon), freed with their worker */
    kvp__list_t abandoned_puts; /* puts given up on, freed with their worker */
    kvp__list_t abandoned_in;   /* header receives given up on, freed with their worker */
    uint64_t put_resv_max;      /* reserved-but-unwritten bytes a UCX connection may have */
    uint64_t stage_bytes, stage_max; /* TCP put values staged before eviction; the budget */
    uint64_t hdr_bytes, hdr_max;     /* TCP header buffers beyond their first LANE_RX_START */
    kvp_key_t *keys_buf;
    uint64_t *sizes_buf;
    char *discard;              /* sink for put bytes of keys not stored (see handle_put) */
    lreads_t lr;
    kvp__metrics_t *metrics;
    kvp__server_counters_t ctr;
} server_t;

/* Limits (docs/protocol.md §4). */
#define HS_MAX 64u                                 /* connections in the handshake, all sources */
#define HS_PER_SOURCE 32u                          /* ... from one address */
#define HS_TIMEOUT_NS (2ull * 1000000000ull)       /* the whole handshake */
#define DRAIN_MAX_NS (10ull * 1000000000ull)       /* SIGTERM waits this long at most for requests in flight */
/* A worker un-armable with no progress this long is stuck (see
 * worker_rebuild).  Not shorter: a live writer preempted mid-message on a
 * loaded host, or a client whose replies wait because it does not read,
 * look the same for a moment, and a replacement disconnects every UCX
 * client (at 1 s a loaded 2-core machine produced one in a test run). */
#define WEDGE_NS (3ull * 1000000000ull)
#define ABANDON_AFTER_NS (2ull * 1000000000ull)    /* see conn_abandon */
#define LINGER_NS (10ull * 1000000000ull)          /* see lreads.c */
#define SPIN_NS 50000u                             /* the event loop polls this long after activity */
#define LANE_RX_START 4096u                        /* a TCP connection's header buffer, grown as needed */
#define LANE_FRAME_NS (5ull * 1000000000ull)       /* a frame's head and header must arrive within this */
#define LANE_AHEAD (4ull << 20)                    /* TCP put bytes reserved ahead of those received */
#define LANE_RX_BUDGET 64u                         /* requests one wake-up reads from one connection */
#define LANE_TX_MAX_COUNT 1024u                    /* replies waiting before the server stops reading */
#define LANE_TX_MAX_BYTES (64ull << 20)

/* A request's deadline on the server's clock: timeout_ms after it arrived
 * (now), or 0 when timeout_ms is 0 (none).  The client's own deadline began
 * when it sent the request, so this one passes a little after the client's:
 * by then the client has given up, and what the server still holds for the
 * request (a put's reservations, a get's leases) only blocks others. */
static inline uint64_t kvp__req_deadline(const kvp__wire_req_t *rq, uint64_t now)
{
    return rq->timeout_ms ? now + (uint64_t)rq->timeout_ms * 1000000ull : 0;
}

/* A request of c begins, or ends (or is given up on); part: which kind
 * (s->inflight_puts, _replies, _in_data). */
static inline void kvp__inflight_begin(struct server *s, conn_t *c, uint64_t *part);
static inline void kvp__inflight_end(struct server *s, conn_t *c, uint64_t *part);

/* ---- conn.c ---- */
void kvp__conn_set_state(server_t *s, conn_t *c, conn_state_t to);
void kvp__conn_kill(server_t *s, conn_t *c, const char *why);
/* Closes a connection's socket; its client holds no leases any more. */
void kvp__conn_close_fd(server_t *s, conn_t *c);
conn_t *kvp__conn_by_key(server_t *s, uint64_t key);
static inline int kvp__conn_live(const conn_t *c) { return c->state == CONN_READY; }
void kvp__on_accept(server_t *s);
void kvp__on_conn_event(server_t *s, conn_t *c, uint32_t events);
/* Deadlines (check_deadlines, the 1 s timer) and freeing what has ended. */
void kvp__reap_conns(server_t *s, int check_deadlines);
/* Gives up a dead connection's UCX sends and receives: their leases and
 * reservations go now, the structs when UCX calls back or its worker goes. */
void kvp__conn_abandon(server_t *s, conn_t *c);
void kvp__conns_init(server_t *s);
void kvp__conns_destroy(server_t *s);

/* ---- handlers.c ---- */
reply_t *kvp__reply_new(server_t *s, conn_t *c, uint32_t op);
void kvp__reply_send(reply_t *r);
void kvp__reply_free(reply_t *r);
/* Ends the leases a reply reads from (it carries no values any more). */
void kvp__reply_drop_leases(reply_t *r);
void kvp__reply_status(server_t *s, conn_t *c, uint32_t op, uint64_t req_id, kvp_status_t st);
void kvp__reply_results(server_t *s, conn_t *c, uint32_t op, uint64_t req_id, const kvp_key_result_t *res,
                        uint32_t n, uint64_t t0);
/* A decoded request of connection c (any op but PUT and IN_DATA). */
void kvp__dispatch(server_t *s, conn_t *c, const kvp__wire_req_t *rq);
/* Counts a PUT, applies its released field; the status to refuse it
 * with (draining), or KVP_OK. */
kvp_status_t kvp__put_begin(server_t *s, conn_t *c, const kvp__wire_req_t *rq);
put_ctx_t *kvp__put_new(server_t *s, conn_t *c, const kvp__wire_req_t *rq, kvp_status_t refuse);
/* Ends a put: commits (status OK) or aborts its reservations, answers, frees. */
void kvp__put_finish(put_ctx_t *pc, ucs_status_t status);
ucs_status_t kvp__on_request(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param);

/* ---- lane.c ---- */
kvp_status_t kvp__lane_start(server_t *s, conn_t *c);
void kvp__lane_event(server_t *s, conn_t *c, uint32_t events);
void kvp__lane_tx(server_t *s, conn_t *c);
void kvp__lane_queue(server_t *s, conn_t *c, reply_t *r);
/* What a dead TCP connection holds goes: its put (aborted, or expired if
 * it was given up for put_timeout), queued replies, buffers. */
void kvp__lane_drop(server_t *s, conn_t *c);
/* Deadlines of a TCP connection: a frame that does not complete, a put
 * that makes no progress, requests past their timeout_ms (see lane.c). */
void kvp__lane_check(server_t *s, conn_t *c, uint64_t now);

/* ---- lreads.c ---- */
kvp_status_t kvp__lr_init(server_t *s);
void kvp__lr_destroy(server_t *s);
/* HELLO's arena field for c, filled into *a: a, or NULL (nil) unless c
 * can map it. */
const kvp__wire_arena_t *kvp__lr_hello(server_t *s, conn_t *c, kvp__wire_arena_t *a);
/* A HELLO carrying the proof that its client mapped the arena. */
void kvp__lr_prove(server_t *s, conn_t *c, const kvp_key_t *proof);
void kvp__lr_get(server_t *s, conn_t *c, const kvp__wire_req_t *rq);
void kvp__lr_release(server_t *s, conn_t *c, uint64_t req_id);
void kvp__lr_release_all(server_t *s, conn_t *c);
/* Ends leases past their deadline. */
void kvp__lr_reap(server_t *s, uint64_t now);

/* Frees what was given up on with the worker that may still call back
 * about it (after that worker is destroyed). */
void kvp__abandoned_free(server_t *s);

static inline void kvp__inflight_begin(server_t *s, conn_t *c, uint64_t *part)
{
    c->inflight++;
    s->inflight++;
    (*part)++;
}

static inline void kvp__inflight_end(server_t *s, conn_t *c, uint64_t *part)
{
    c->inflight--;
    s->inflight--;
    (*part)--;
}

/* ---- server.c ---- */
/* Is the listener (once paused for want of descriptors) to be resumed? */
void kvp__listen_pause(server_t *s, uint64_t until_ns);

#endif
