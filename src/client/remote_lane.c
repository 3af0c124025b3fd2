/*
 * The client side of kvpool's TCP transport (net/lane.h; remote.c's
 * opening comment): requests written whole under tx_mu, a put's values
 * straight from the caller's buffers; replies read by whoever holds rx_mu,
 * a get's values straight into the caller's buffers.
 */
#include "client/remote_int.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
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
    pending_t *p = kvp__remote_match_reply(r, hdr, len, &rep);
    if (!p)
        return;
    kvp_status_t st = kvp__remote_reply_parse(p, &rep, data_len);
    p->status = st;
    if (st == KVP_OK && data_len) {
        r->rx_p = p; /* stays in the table until its values are in */
        pthread_mutex_unlock(&r->mu);
        return;
    }
    opctx_t *f = kvp__remote_do_advance(r, p, PEV_REPLIED);
    pthread_mutex_unlock(&r->mu);
    kvp__remote_fire(f);
}

/* Reads what the lane socket has (rx_mu held).  Returns nonzero if it
 * read anything. */
int kvp__remote_lane_rx(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    int fd = kvp__remote_do_ready(r) && atomic_load(&r->lane) ? r->tcp_fd : -1;
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
                kvp__remote_do_disconnect(r, k == 0 ? "the server closed the connection" : "receive failed");
            pthread_mutex_unlock(&r->mu);
            kvp__remote_wake(r);
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
                    kvp__remote_do_disconnect(r, why);
                pthread_mutex_unlock(&r->mu);
                kvp__remote_wake(r);
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
void kvp__remote_lane_post(remote_t *r, pending_t *p, int fd, const void *data, size_t count, int iov)
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
    int stale = r->gen != p->gen || !kvp__remote_do_ready(r);
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
