/*
 * kvpool's TCP transport, the server's side (net/lane.h, docs/protocol.md
 * §3).  Connections on it have no UCX endpoint: the same requests arrive as
 * frames on the connection's socket, a put's values are read from it
 * straight into their arena slots, and replies are queued and written (get
 * values straight from the leased slices) as the socket takes them.  Same
 * handlers, same rules as over UCX.
 *
 * What a client on a plain network can hold here, and for how long:
 *
 *   Put values are reserved as their bytes arrive, never more than one
 *   chunk (LANE_AHEAD) ahead of them, so eviction follows the bytes
 *   actually received.  A value that fits the arena's free space without
 *   evicting anything is read straight into its slot; one that would need
 *   objects evicted is first read into memory of its own (staged: one value
 *   per connection, stage_max bytes for all of them, one value alone always
 *   allowed), and only once it is whole is its space reserved (evicting then)
 *   and the bytes copied in.  A put that stalls thus evicts nothing, and
 *   one that makes no progress for put_timeout is given up (its
 *   reservations expire) and its connection closed.
 *
 *   A request header is read into a buffer that grows from LANE_RX_START to
 *   at most KVP_WIRE_HEADER_MAX, with hdr_max bytes for the grown part of all
 *   connections together, and must arrive within LANE_FRAME_NS of its first
 *   byte.
 *
 *   Replies nobody reads stop the reading of requests (LANE_TX_MAX_*).
 *
 *   One wake-up reads at most LANE_RX_BUDGET requests of a connection, so a
 *   pipeline of expensive ones cannot hold the loop from the others.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "server/server_int.h"

kvp_status_t kvp__lane_start(server_t *s, conn_t *c)
{
    (void)s;
    c->rx_buf = kvp__malloc(LANE_RX_START);
    if (!c->rx_buf)
        return KVP_ERR_NO_MEMORY;
    c->rx_cap = LANE_RX_START;
    return KVP_OK;
}

/* What the event loop watches on the socket. */
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

/* ---- replies ---- */

void kvp__lane_queue(server_t *s, conn_t *c, reply_t *r)
{
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < r->nleases; i++)
        bytes += r->iov[i].length;
    kvp__lane_head_encode(r->head, (uint32_t)r->w.len, bytes);
    c->tx_count++;
    c->tx_bytes += KVP_LANE_HEAD + r->w.len + bytes;
    kvp__list_add_tail(&c->tx, &r->link);
    if (!c->tx_wait)
        kvp__lane_tx(s, c);
}

void kvp__lane_tx(server_t *s, conn_t *c)
{
    kvp__list_t *first;
    while (kvp__conn_live(c) && (first = kvp__list_first(&c->tx))) {
        reply_t *r = KVP_CONTAINER_OF(first, reply_t, link);
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
            kvp__conn_kill(s, c, "send failed");
            return;
        }
        r->tx_done += (uint64_t)k;
        if (r->tx_done < total)
            continue;
        c->tx_count--;
        c->tx_bytes -= total;
        kvp__metrics_observe(&s->ctr, r->op, kvp__now_ns() - r->t0);
        kvp__reply_free(r);
    }
    /* All written: stop watching for room, and read requests again if that
     * had been paused. */
    if (kvp__conn_live(c))
        lane_watch(s, c, 0, 0);
}

/* ---- put values ---- */

static void stage_free(server_t *s, put_ctx_t *pc)
{
    if (pc->staged < 0)
        return;
    uint64_t size = pc->iov[pc->staged].length;
    munmap(pc->stage, size);
    pc->stage = NULL;
    pc->iov[pc->staged].buffer = s->discard;
    pc->staged = -1;
    s->stage_bytes -= size;
    atomic_store(&s->ctr.staged_bytes, s->stage_bytes);
}

/* Value i of the put reached: where its bytes go. */
static void decide(server_t *s, conn_t *c, put_ctx_t *pc, uint32_t i)
{
    uint64_t size = pc->iov[i].length;
    pc->decided = i + 1;
    if (pc->refuse != KVP_OK)
        return; /* to the sink, answered with the refusal */
    if (size > kvp__store_max_value(s->store)) {
        pc->res[i].status = KVP_ERR_VALUE_TOO_LARGE;
        return;
    }
    void *dst = NULL;
    uint32_t flags = 0;
    kvp_status_t st = kvp__store_reserve(s->store, pc->keys[i].data, pc->keys[i].len, size,
                                         KVP_RESV_HELD | KVP_RESV_NO_EVICT, &pc->resv[i], &dst, &flags);
    pc->res[i].status = st;
    pc->res[i].flags = flags;
    if (dst) {
        pc->iov[i].buffer = dst;
        return;
    }
    if (st != KVP_ERR_NO_SPACE)
        return; /* existed (to the sink), or out of memory */
    /* It would evict: staged until whole. */
    if (s->stage_bytes && s->stage_bytes + size > s->stage_max) {
        kvp_warn_rl("server: conn %llu: a %llu-byte put value would evict, and %llu bytes are staged already; "
                    "refused (busy)", (unsigned long long)c->id, (unsigned long long)size,
                    (unsigned long long)s->stage_bytes);
        pc->res[i].status = KVP_ERR_BUSY;
        return;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        pc->res[i].status = KVP_ERR_NO_MEMORY;
        return;
    }
    pc->stage = p;
    pc->staged = i;
    pc->iov[i].buffer = p;
    s->stage_bytes += size;
    atomic_store(&s->ctr.staged_bytes, s->stage_bytes);
}

/* The staged value is whole: into the arena with it (evicting now). */
static void unstage(server_t *s, put_ctx_t *pc)
{
    uint32_t i = (uint32_t)pc->staged;
    uint64_t size = pc->iov[i].length;
    void *dst = NULL;
    uint32_t flags = 0;
    kvp_status_t st = kvp__store_reserve(s->store, pc->keys[i].data, pc->keys[i].len, size, KVP_RESV_HELD,
                                         &pc->resv[i], &dst, &flags);
    pc->res[i].status = st;
    pc->res[i].flags = flags;
    if (dst)
        memcpy(dst, pc->stage, size);
    stage_free(s, pc);
}

/* Gives the next values their destinations, up to LANE_AHEAD bytes ahead
 * of the one being read (always that one), never past a staged one. */
static void decide_ahead(server_t *s, conn_t *c, put_ctx_t *pc)
{
    uint64_t ahead = 0;
    for (uint32_t i = c->rx_i; i < pc->decided; i++)
        ahead += pc->iov[i].length - (i == c->rx_i ? c->rx_off : 0);
    while (pc->decided < pc->n && pc->staged < 0 && (pc->decided == c->rx_i || ahead < LANE_AHEAD)) {
        uint32_t i = pc->decided;
        decide(s, c, pc, i);
        ahead += pc->iov[i].length;
    }
}

/* ---- requests ---- */

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
            kvp_warn_rl("server: conn %llu: %s (%s)", (unsigned long long)c->id, why, kvp_status_str(st));
            kvp__reply_status(s, c, 0, 0, st);
            return;
        }
        kvp__conn_kill(s, c, why);
        return;
    }
    if (rq.op != KVP_WOP_PUT) {
        kvp__dispatch(s, c, &rq);
        return;
    }
    kvp_status_t refuse = kvp__put_begin(s, c, &rq);
    if (!kvp__conn_live(c))
        return;
    put_ctx_t *pc = kvp__put_new(s, c, &rq, refuse);
    kvp_key_t *keys = pc ? kvp__calloc(rq.nkeys ? rq.nkeys : 1, sizeof *keys) : NULL;
    if (!keys) {
        if (pc)
            kvp__put_finish(pc, UCS_ERR_NO_MEMORY);
        kvp__conn_kill(s, c, "out of memory for a put");
        return;
    }
    /* (views into rx_buf, which holds this header until the put is done) */
    memcpy(keys, rq.keys, rq.nkeys * sizeof *keys);
    pc->keys = keys;
    c->rx_put = pc;
    c->rx_left = data_len;
    c->rx_i = 0;
    c->rx_off = 0;
    c->rx_progress_ns = kvp__now_ns();
}

/* A put's values are all in. */
static void put_done(server_t *s, conn_t *c)
{
    put_ctx_t *pc = c->rx_put;
    c->rx_put = NULL;
    if (pc->staged >= 0)
        unstage(s, pc);
    kvp__put_finish(pc, UCS_OK);
}

/* Reads what the socket has of a put's values.  0: go on, -1: stop. */
static int read_values(server_t *s, conn_t *c)
{
    put_ctx_t *pc = c->rx_put;
    decide_ahead(s, c, pc);
    struct iovec v[LANE_IOV_MAX];
    int n = kvp__lane_iov_fill(v, LANE_IOV_MAX, pc->iov, pc->decided, c->rx_i, c->rx_off);
    ssize_t k = readv(c->src.fd, v, n);
    if (k <= 0) {
        if (k < 0 && errno == EINTR)
            return 0;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return -1;
        kvp__conn_kill(s, c, k == 0 ? "client closed its connection in the middle of a put" : "receive failed");
        return -1;
    }
    c->rx_left -= (uint64_t)k;
    c->rx_progress_ns = kvp__now_ns();
    kvp__lane_iov_advance(pc->iov, &c->rx_i, &c->rx_off, (size_t)k);
    if (pc->staged >= 0 && c->rx_i > (uint32_t)pc->staged)
        unstage(s, pc);
    if (c->rx_left == 0)
        put_done(s, c);
    return 0;
}

/* The header buffer holds need bytes: grown within the server's budget. */
static int rx_grow(server_t *s, conn_t *c, size_t need)
{
    if (need <= c->rx_cap)
        return 0;
    uint64_t extra = need - LANE_RX_START;
    if (s->hdr_bytes + extra > s->hdr_max) {
        kvp_warn_rl("server: conn %llu: a %zu-byte request header would pass the server's header budget "
                    "(%llu of %llu bytes in use)", (unsigned long long)c->id, need,
                    (unsigned long long)s->hdr_bytes, (unsigned long long)s->hdr_max);
        return -1;
    }
    uint8_t *nb = kvp__malloc(need);
    if (!nb)
        return -1;
    memcpy(nb, c->rx_buf, KVP_LANE_HEAD);
    kvp__free(c->rx_buf, c->rx_cap);
    c->rx_buf = nb;
    c->rx_cap = need;
    s->hdr_bytes += extra;
    atomic_store(&s->ctr.header_bytes, s->hdr_bytes);
    return 0;
}

/* A large header was a one-off: the memory goes back. */
static void rx_shrink(server_t *s, conn_t *c)
{
    if (c->rx_cap <= LANE_RX_START)
        return;
    uint8_t *nb = kvp__malloc(LANE_RX_START);
    if (!nb)
        return;
    s->hdr_bytes -= c->rx_cap - LANE_RX_START;
    atomic_store(&s->ctr.header_bytes, s->hdr_bytes);
    kvp__free(c->rx_buf, c->rx_cap);
    c->rx_buf = nb;
    c->rx_cap = LANE_RX_START;
}

/* Reads what the socket has: frame heads, request headers, put values. */
static void lane_rx(server_t *s, conn_t *c)
{
    unsigned handled = 0;
    while (kvp__conn_live(c)) {
        if (c->rx_put) {
            if (read_values(s, c) < 0)
                return;
            continue;
        }
        if (c->rx_len == 0 && (c->tx_count >= LANE_TX_MAX_COUNT || c->tx_bytes >= LANE_TX_MAX_BYTES)) {
            /* Replies pile up unread: no more requests until they drain. */
            lane_watch(s, c, c->tx_wait, 1);
            return;
        }
        if (c->rx_len == 0 && handled >= LANE_RX_BUDGET)
            return; /* the rest next time round (the socket stays readable) */
        size_t want = c->rx_len < KVP_LANE_HEAD ? KVP_LANE_HEAD : KVP_LANE_HEAD + (size_t)c->rx_hdr_len;
        ssize_t k = recv(c->src.fd, c->rx_buf + c->rx_len, want - c->rx_len, MSG_DONTWAIT);
        if (k <= 0) {
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return;
            kvp__conn_kill(s, c, k == 0 ? (c->rx_len ? "client closed its connection mid-frame"
                                                      : "client closed its connection")
                                        : "receive failed");
            return;
        }
        if (c->rx_len == 0)
            c->rx_frame_ns = kvp__now_ns();
        c->rx_len += (size_t)k;
        if (c->rx_len < want)
            continue;
        if (want == KVP_LANE_HEAD) {
            if (kvp__lane_head_decode(c->rx_buf, &c->rx_hdr_len, &c->rx_data_len) != 0) {
                atomic_fetch_add(&s->ctr.bad_requests, 1);
                kvp__conn_kill(s, c, "malformed frame head");
                return;
            }
            if (rx_grow(s, c, KVP_LANE_HEAD + (size_t)c->rx_hdr_len) != 0) {
                kvp__conn_kill(s, c, "no memory for a request header");
                return;
            }
            continue;
        }
        c->rx_len = 0;
        c->rx_frame_ns = 0;
        handled++;
        lane_request(s, c, c->rx_buf + KVP_LANE_HEAD, c->rx_hdr_len, c->rx_data_len);
        if (kvp__conn_live(c) && !c->rx_put)
            rx_shrink(s, c);
    }
}

void kvp__lane_event(server_t *s, conn_t *c, uint32_t events)
{
    if (events & (EPOLLHUP | EPOLLERR)) {
        kvp__conn_kill(s, c, "connection reset");
        return;
    }
    if (events & EPOLLOUT)
        kvp__lane_tx(s, c);
    if (events & (EPOLLIN | EPOLLRDHUP))
        lane_rx(s, c);
}

void kvp__lane_drop(server_t *s, conn_t *c)
{
    if (c->rx_put) {
        /* Values cut off mid-way: every reservation of that put ends. */
        put_ctx_t *pc = c->rx_put;
        c->rx_put = NULL;
        stage_free(s, pc);
        kvp__put_finish(pc, pc->expired ? UCS_ERR_TIMED_OUT : UCS_ERR_CONNECTION_RESET);
    }
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &c->tx)
        kvp__reply_free(KVP_CONTAINER_OF(n, reply_t, link));
    c->tx_count = 0;
    c->tx_bytes = 0;
    if (c->rx_buf) {
        if (c->rx_cap > LANE_RX_START) {
            s->hdr_bytes -= c->rx_cap - LANE_RX_START;
            atomic_store(&s->ctr.header_bytes, s->hdr_bytes);
        }
        kvp__free(c->rx_buf, c->rx_cap);
        c->rx_buf = NULL;
        c->rx_cap = 0;
    }
}

void kvp__lane_check(server_t *s, conn_t *c, uint64_t now)
{
    uint64_t put_timeout = s->p.put_timeout_ns ? s->p.put_timeout_ns : 30ull * 1000000000ull;
    if (c->rx_put && now - c->rx_progress_ns > put_timeout) {
        atomic_fetch_add(&s->ctr.put_expired, 1);
        c->rx_put->expired = 1;
        kvp__conn_kill(s, c, "a put made no progress for put_timeout");
    } else if (c->rx_frame_ns && now - c->rx_frame_ns > LANE_FRAME_NS) {
        kvp__conn_kill(s, c, "a request frame did not complete in time");
    }
}
