/*
 * kvpool's TCP transport, the server's side (net/lane.h, docs/protocol.md
 * §3).  Connections on it have no UCX endpoint: the same requests arrive as
 * frames on the connection's socket (read by net/lane.c's reader), a put's
 * values are read from it straight into their arena slots, and replies are
 * queued and written by net/lane.c's writer (get values straight from the
 * leased slices) as the socket takes them.  Same handlers, same rules as
 * over UCX.
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
 *   reservations expire) and its connection closed.  One whose request's
 *   timeout_ms passes first lets its reservations expire and reads the rest
 *   of its values into the sink (put_expire); a get reply queued, not begun,
 *   past its deadline drops its leases (reply_expire).
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
    return kvp__lane_rx_init(&c->rx, LANE_RX_START, NULL, 0) == 0 ? KVP_OK : KVP_ERR_NO_MEMORY;
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
    kvp__lane_tx_init(&r->tx, r->w.buf, (uint32_t)r->w.len, r->iov, r->nleases);
    c->tx_count++;
    c->tx_bytes += r->tx.total;
    kvp__list_add_tail(&c->tx, &r->link);
    if (!c->tx_wait)
        kvp__lane_tx(s, c);
}

void kvp__lane_tx(server_t *s, conn_t *c)
{
    kvp__list_t *first;
    while (kvp__conn_live(c) && (first = kvp__list_first(&c->tx))) {
        reply_t *r = KVP_CONTAINER_OF(first, reply_t, link);
        int done = kvp__lane_tx_write(&r->tx, c->src.fd);
        if (done == 0) {
            lane_watch(s, c, 1, c->rx_paused);
            return;
        }
        if (done < 0) {
            kvp__conn_kill(s, c, "send failed");
            return;
        }
        c->tx_count--;
        c->tx_bytes -= r->tx.total;
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
    const kvp__lane_rx_t *rx = &c->rx;
    for (uint32_t i = rx->i; i < pc->decided; i++)
        ahead += pc->iov[i].length - (i == rx->i ? rx->off : 0);
    while (pc->decided < pc->n && pc->staged < 0 && (pc->decided == rx->i || ahead < LANE_AHEAD)) {
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
    /* (views into rx.buf, which holds this header until the put is done) */
    memcpy(keys, rq.keys, rq.nkeys * sizeof *keys);
    pc->keys = keys;
    c->rx_put = pc;
    kvp__lane_rx_into(&c->rx, pc->iov, 0);
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

/* The header buffer holds need bytes: grown within the server's budget. */
static int rx_grow(server_t *s, conn_t *c, size_t need)
{
    if (need <= c->rx.cap)
        return 0;
    uint64_t extra = need - c->rx.cap;
    if (s->hdr_bytes + extra > s->hdr_max) {
        kvp_warn_rl("server: conn %llu: a %zu-byte request header would pass the server's header budget "
                    "(%llu of %llu bytes in use)", (unsigned long long)c->id, need,
                    (unsigned long long)s->hdr_bytes, (unsigned long long)s->hdr_max);
        return -1;
    }
    if (kvp__lane_rx_grow(&c->rx, need) != 0)
        return -1;
    s->hdr_bytes += extra;
    atomic_store(&s->ctr.header_bytes, s->hdr_bytes);
    return 0;
}

/* A large header was a one-off: the memory goes back. */
static void rx_shrink(server_t *s, conn_t *c)
{
    size_t freed = kvp__lane_rx_shrink(&c->rx, LANE_RX_START);
    if (!freed)
        return;
    s->hdr_bytes -= freed;
    atomic_store(&s->ctr.header_bytes, s->hdr_bytes);
}

/* The put's deadline (its timeout_ms) passed with values still to come:
 * what it reserved or staged expires now, the rest of its bytes go to the
 * sink (the stream stays in step), and it is answered KVP_ERR_TIMEOUT once
 * they are in. */
static void put_expire(server_t *s, conn_t *c, put_ctx_t *pc, uint64_t now)
{
    if (!pc->expires_ns || now <= pc->expires_ns || pc->refuse != KVP_OK)
        return;
    kvp_warn_rl("server: conn %llu: a put's deadline (its request's timeout) passed with its values still "
                "arriving; its reservations expire", (unsigned long long)c->id);
    stage_free(s, pc);
    for (uint32_t i = 0; i < pc->n; i++) {
        if (pc->resv[i]) {
            kvp__store_expire(s->store, pc->resv[i]);
            pc->resv[i] = NULL;
        }
        pc->iov[i].buffer = s->discard;
        pc->res[i].status = KVP_ERR_TIMEOUT;
    }
    pc->refuse = KVP_ERR_TIMEOUT;
    atomic_fetch_add(&s->ctr.put_expired, 1);
}

/* A get's reply waiting, not begun, past its deadline: its leases end, and
 * it goes as a KVP_ERR_TIMEOUT without values.  (One begun is finished:
 * the stream cannot skip bytes.  Over UCX a reply is UCX's once sent.) */
static void reply_expire(conn_t *c, reply_t *r, uint64_t now)
{
    if (!r->expires_ns || now <= r->expires_ns || r->tx.done || !r->nleases)
        return;
    kvp__reply_drop_leases(r);
    r->w.len = 0;
    kvp__wire_reply_status_encode(&r->w, r->op, r->req_id, KVP_ERR_TIMEOUT);
    c->tx_bytes -= r->tx.total;
    kvp__lane_tx_init(&r->tx, r->w.buf, (uint32_t)r->w.len, NULL, 0);
    c->tx_bytes += r->tx.total;
}

/* Bytes of a put's values came. */
static void put_progress(server_t *s, conn_t *c, int all_in)
{
    put_ctx_t *pc = c->rx_put;
    c->rx_progress_ns = kvp__now_ns();
    put_expire(s, c, pc, c->rx_progress_ns);
    if (pc->staged >= 0 && c->rx.i > (uint32_t)pc->staged)
        unstage(s, pc);
    if (all_in)
        put_done(s, c);
}

/* Reads what the socket has: frame heads, request headers, put values. */
static void lane_rx(server_t *s, conn_t *c)
{
    unsigned handled = 0;
    kvp__lane_rx_t *rx = &c->rx;
    while (kvp__conn_live(c)) {
        int idle = kvp__lane_rx_idle(rx);
        if (idle && (c->tx_count >= LANE_TX_MAX_COUNT || c->tx_bytes >= LANE_TX_MAX_BYTES)) {
            /* Replies pile up unread: no more requests until they drain. */
            lane_watch(s, c, c->tx_wait, 1);
            return;
        }
        if (idle && handled >= LANE_RX_BUDGET)
            return; /* the rest next time round (the socket stays readable) */
        if (c->rx_put) {
            decide_ahead(s, c, c->rx_put);
            kvp__lane_rx_extend(rx, c->rx_put->decided);
        }
        kvp__lane_ev_t ev = kvp__lane_rx_step(rx, c->src.fd);
        if (idle && ev != KVP_LANE_AGAIN && ev != KVP_LANE_EOF && ev != KVP_LANE_ERROR)
            c->rx_frame_ns = kvp__now_ns();
        switch (ev) {
        case KVP_LANE_AGAIN:
            return;
        case KVP_LANE_EOF:
            kvp__conn_kill(s, c, c->rx_put ? "client closed its connection in the middle of a put"
                                 : idle    ? "client closed its connection"
                                           : "client closed its connection mid-frame");
            return;
        case KVP_LANE_ERROR:
            kvp__conn_kill(s, c, "receive failed");
            return;
        case KVP_LANE_BAD:
            atomic_fetch_add(&s->ctr.bad_requests, 1);
            kvp__conn_kill(s, c, "malformed frame head");
            return;
        case KVP_LANE_HEAD_IN:
            if (rx_grow(s, c, KVP_LANE_HEAD + (size_t)rx->hdr_len) != 0) {
                kvp__conn_kill(s, c, "no memory for a request header");
                return;
            }
            break;
        case KVP_LANE_PROGRESS:
        case KVP_LANE_DATA_IN:
            if (c->rx_put)
                put_progress(s, c, ev == KVP_LANE_DATA_IN);
            if (ev == KVP_LANE_DATA_IN && kvp__conn_live(c))
                rx_shrink(s, c);
            break;
        case KVP_LANE_FRAME:
            c->rx_frame_ns = 0;
            handled++;
            lane_request(s, c, kvp__lane_rx_header(rx), rx->hdr_len, rx->data_len);
            if (kvp__conn_live(c) && !c->rx_put)
                rx_shrink(s, c);
            break;
        }
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
    if (c->rx.buf) {
        if (c->rx.cap > LANE_RX_START) {
            s->hdr_bytes -= c->rx.cap - LANE_RX_START;
            atomic_store(&s->ctr.header_bytes, s->hdr_bytes);
        }
        kvp__lane_rx_free(&c->rx);
    }
}

void kvp__lane_check(server_t *s, conn_t *c, uint64_t now)
{
    uint64_t put_timeout = s->p.put_timeout_ns ? s->p.put_timeout_ns : 30ull * 1000000000ull;
    if (c->rx_put)
        put_expire(s, c, c->rx_put, now);
    KVP_LIST_FOR_EACH(n, &c->tx)
        reply_expire(c, KVP_CONTAINER_OF(n, reply_t, link), now);
    if (c->rx_put && now - c->rx_progress_ns > put_timeout) {
        atomic_fetch_add(&s->ctr.put_expired, 1);
        c->rx_put->expired = 1;
        kvp__conn_kill(s, c, "a put made no progress for put_timeout");
    } else if (c->rx_frame_ns && now - c->rx_frame_ns > LANE_FRAME_NS) {
        kvp__conn_kill(s, c, "a request frame did not complete in time");
    }
}
