/*
 * The client side of kvpool's TCP transport (net/lane.h's framing, its
 * reader and writer; remote.c's opening comment): requests written whole
 * under tx_mu, a put's values straight from the caller's buffers; replies
 * read by whoever holds rx_mu, a get's values straight into the caller's
 * buffers.
 */
#include "client/remote_int.h"

#include <poll.h>

#include "common/clock.h"
#include "net/lane.h"

/* Has a reply's values all arrived, or its frame been handled: finish p. */
static void lane_complete(remote_t *r, pending_t *p)
{
    pthread_mutex_lock(&r->mu);
    opctx_t *f = kvp__remote_do_advance(r, p, PEV_REPLIED);
    pthread_mutex_unlock(&r->mu);
    kvp__remote_fire(f);
}

/* A complete reply header: match it to its request; its values (if any)
 * are read next, into the caller's buffers (p->iov, which the reply's
 * parse sized to exactly data_len bytes) or, for a reply nobody waits for
 * or one that failed, into the sink. */
static void lane_reply(remote_t *r, const uint8_t *hdr, uint32_t len, uint64_t data_len)
{
    r->rx_p = NULL;
    kvp__wire_reply_t rep;
    pending_t *p = kvp__remote_match_reply(r, hdr, len, &rep);
    if (!p)
        return;
    kvp_status_t st = kvp__remote_reply_parse(p, &rep, data_len);
    p->status = st;
    if (st == KVP_OK && data_len) {
        r->rx_p = p; /* stays in the table until its values are in */
        kvp__lane_rx_into(&r->rx, p->iov, p->niov);
        pthread_mutex_unlock(&r->mu);
        return;
    }
    opctx_t *f = kvp__remote_do_advance(r, p, PEV_REPLIED);
    pthread_mutex_unlock(&r->mu);
    kvp__remote_fire(f);
}

/* The lane of connection gen is lost (why): retires it, unless it went
 * already. */
static void lane_lost(remote_t *r, int gen, const char *why)
{
    pthread_mutex_lock(&r->mu);
    if (r->gen == gen)
        kvp__remote_do_disconnect(r, why);
    pthread_mutex_unlock(&r->mu);
    kvp__remote_wake(r);
}

/* Reads what the lane socket has (rx_mu held), frame by frame
 * (net/lane.h's reader).  Returns nonzero if it read anything. */
int kvp__remote_lane_rx(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    int fd = kvp__remote_do_ready(r) && atomic_load(&r->lane) ? r->tcp_fd : -1;
    int gen = r->gen;
    pthread_mutex_unlock(&r->mu);
    if (fd < 0)
        return 0;
    kvp__lane_rx_t *rx = &r->rx;
    if (r->rx_gen != gen) { /* a new connection: whatever was half-read is gone */
        r->rx_gen = gen;
        kvp__lane_rx_reset(rx);
        r->rx_p = NULL;
    }
    int did = 0;
    for (;;) {
        kvp__lane_ev_t ev = kvp__lane_rx_step(rx, fd);
        switch (ev) {
        case KVP_LANE_AGAIN:
            return did;
        case KVP_LANE_EOF:
            lane_lost(r, gen, "the server closed the connection");
            return 1;
        case KVP_LANE_ERROR:
            lane_lost(r, gen, "receive failed");
            return 1;
        case KVP_LANE_BAD:
            lane_lost(r, gen, "malformed reply frame");
            return 1;
        case KVP_LANE_HEAD_IN:
            if (kvp__lane_rx_grow(rx, KVP_LANE_HEAD + (size_t)rx->hdr_len) != 0) {
                lane_lost(r, gen, "out of memory for a reply header");
                return 1;
            }
            break;
        case KVP_LANE_PROGRESS:
            break;
        case KVP_LANE_FRAME:
            lane_reply(r, kvp__lane_rx_header(rx), rx->hdr_len, rx->data_len);
            break;
        case KVP_LANE_DATA_IN: {
            pending_t *p = r->rx_p;
            r->rx_p = NULL;
            if (p)
                lane_complete(r, p);
            break;
        }
        }
        did = 1;
    }
}

/* Writes p's request frame (header, then a put's values straight from the
 * caller's buffers) on the lane socket fd, whole, before any other frame. */
void kvp__remote_lane_post(remote_t *r, pending_t *p, int fd, const void *data, size_t count, int iov)
{
    int gen = p->gen; /* p may be gone by the time do_sent() runs */
    const ucp_dt_iov_t *src = iov ? data : NULL;
    ucp_dt_iov_t one = {(void *)data, count};
    uint32_t nsrc = iov ? (uint32_t)count : (count ? 1u : 0u);
    if (!iov)
        src = &one;
    kvp__lane_tx_t tx;
    kvp__lane_tx_init(&tx, p->w.buf, (uint32_t)p->w.len, src, nsrc);
    const char *why = NULL;
    int late = 0;
    pthread_mutex_lock(&r->tx_mu);
    /* Still the connection fd belongs to?  (If it was lost meanwhile, the
     * number may already name a newer connection's socket.)  While tx_mu
     * is held it cannot close. */
    pthread_mutex_lock(&r->mu);
    int stale = r->gen != p->gen || !kvp__remote_do_ready(r);
    pthread_mutex_unlock(&r->mu);
    while (!stale) {
        int done = kvp__lane_tx_write(&tx, fd);
        if (done > 0)
            break;
        if (done < 0) {
            why = "send failed";
            break;
        }
        /* The socket is full.  The server reads requests whatever it is
         * sending: wait. */
        uint64_t now = kvp__now_ns();
        if (now >= p->deadline_ns) {
            why = "a request could not be sent in time";
            late = 1;
            break;
        }
        struct pollfd pf = {.fd = fd, .events = POLLOUT};
        uint64_t ms = (p->deadline_ns - now) / 1000000ull + 1;
        (void)poll(&pf, 1, ms > 1000 ? 1000 : (int)ms);
    }
    /* p is still ours: its connection is not failed before do_sent(). */
    pthread_mutex_lock(&r->mu);
    if (why) {
        if (late)
            p->timed_out = 1;
        if (r->gen == gen)
            kvp__remote_do_disconnect(r, why);
    }
    opctx_t *f = stale || why ? kvp__remote_do_lost(r, p, KVP_ERR_CONN_LOST) : kvp__remote_do_advance(r, p, PEV_SENT);
    kvp__remote_do_sent(r, gen);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_unlock(&r->tx_mu);
    if (why)
        kvp__remote_wake(r);
    kvp__remote_fire(f);
}
