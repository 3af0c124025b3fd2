/*
 * kvpool's TCP framing, both ways (net/lane.h): the incremental reader and
 * the gather writer that the server's and the client's TCP transports share.
 */
#include "net/lane.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "common/alloc.h"

int kvp__lane_rx_init(kvp__lane_rx_t *rx, size_t cap, void *sink, size_t sink_len)
{
    memset(rx, 0, sizeof *rx);
    if (cap < KVP_LANE_HEAD)
        cap = KVP_LANE_HEAD;
    rx->buf = kvp__malloc(cap);
    if (!rx->buf)
        return -1;
    rx->cap = cap;
    rx->sink = sink;
    rx->sink_len = sink ? sink_len : 0;
    return 0;
}

void kvp__lane_rx_free(kvp__lane_rx_t *rx)
{
    if (rx->buf)
        kvp__free(rx->buf, rx->cap);
    rx->buf = NULL;
    rx->cap = 0;
    kvp__lane_rx_reset(rx);
}

void kvp__lane_rx_reset(kvp__lane_rx_t *rx)
{
    rx->state = KVP_LANE_RX_HEAD;
    rx->len = 0;
    rx->left = 0;
    rx->iov = NULL;
    rx->niov = 0;
}

int kvp__lane_rx_grow(kvp__lane_rx_t *rx, size_t need)
{
    if (need <= rx->cap)
        return 0;
    uint8_t *nb = kvp__malloc(need);
    if (!nb)
        return -1;
    memcpy(nb, rx->buf, rx->len);
    kvp__free(rx->buf, rx->cap);
    rx->buf = nb;
    rx->cap = need;
    return 0;
}

size_t kvp__lane_rx_shrink(kvp__lane_rx_t *rx, size_t cap)
{
    if (rx->cap <= cap || !kvp__lane_rx_idle(rx))
        return 0;
    uint8_t *nb = kvp__malloc(cap);
    if (!nb)
        return 0;
    size_t freed = rx->cap - cap;
    kvp__free(rx->buf, rx->cap);
    rx->buf = nb;
    rx->cap = cap;
    return freed;
}

/* The header (or head) part: one recv of what the frame still lacks. */
static kvp__lane_ev_t step_header(kvp__lane_rx_t *rx, int fd)
{
    size_t want = rx->state == KVP_LANE_RX_HEAD ? KVP_LANE_HEAD : KVP_LANE_HEAD + (size_t)rx->hdr_len;
    if (want > rx->cap)
        return KVP_LANE_BAD;
    ssize_t k;
    do
        k = recv(fd, rx->buf + rx->len, want - rx->len, MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? KVP_LANE_AGAIN : KVP_LANE_ERROR;
    if (k == 0)
        return KVP_LANE_EOF;
    rx->len += (size_t)k;
    if (rx->len < want)
        return KVP_LANE_PROGRESS;
    if (rx->state == KVP_LANE_RX_HEAD) {
        if (kvp__lane_head_decode(rx->buf, &rx->hdr_len, &rx->data_len) != 0)
            return KVP_LANE_BAD;
        rx->state = KVP_LANE_RX_HEADER;
        return KVP_LANE_HEAD_IN;
    }
    /* The header is whole: the data come next, into the sink unless the
     * caller says otherwise when it sees the frame. */
    rx->len = 0;
    rx->iov = NULL;
    rx->niov = 0;
    rx->left = rx->data_len;
    rx->state = rx->data_len ? KVP_LANE_RX_DATA : KVP_LANE_RX_HEAD;
    return KVP_LANE_FRAME;
}

kvp__lane_ev_t kvp__lane_rx_step(kvp__lane_rx_t *rx, int fd)
{
    if (rx->state != KVP_LANE_RX_DATA)
        return step_header(rx, fd);
    struct iovec v[KVP_LANE_IOV_MAX];
    int n = 0;
    if (rx->iov) {
        /* never past the frame, whatever room the slices have */
        n = kvp__lane_iov_fill(v, KVP_LANE_IOV_MAX, rx->iov, rx->niov, rx->i, rx->off);
        uint64_t room = 0;
        for (int j = 0; j < n; j++) {
            if (room + v[j].iov_len >= rx->left) {
                v[j].iov_len = (size_t)(rx->left - room);
                n = j + 1;
                break;
            }
            room += v[j].iov_len;
        }
    } else if (rx->sink)
        v[n++] = (struct iovec){rx->sink, rx->left < rx->sink_len ? (size_t)rx->left : rx->sink_len};
    if (n == 0)
        return KVP_LANE_BAD; /* data with nowhere to go */
    ssize_t k;
    do
        k = readv(fd, v, n);
    while (k < 0 && errno == EINTR);
    if (k < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK ? KVP_LANE_AGAIN : KVP_LANE_ERROR;
    if (k == 0)
        return KVP_LANE_EOF;
    rx->left -= (uint64_t)k;
    if (rx->iov)
        kvp__lane_iov_advance(rx->iov, &rx->i, &rx->off, (size_t)k);
    if (rx->left)
        return KVP_LANE_PROGRESS;
    rx->state = KVP_LANE_RX_HEAD;
    return KVP_LANE_DATA_IN;
}

void kvp__lane_tx_init(kvp__lane_tx_t *t, const void *hdr, uint32_t hdr_len, const ucp_dt_iov_t *data,
                       uint32_t ndata)
{
    uint64_t data_len = 0;
    for (uint32_t i = 0; i < ndata; i++)
        data_len += data[i].length;
    kvp__lane_head_encode(t->head, hdr_len, data_len);
    t->hdr = hdr;
    t->hdr_len = hdr_len;
    t->data = data;
    t->ndata = ndata;
    t->total = KVP_LANE_HEAD + (uint64_t)hdr_len + data_len;
    t->done = 0;
}

int kvp__lane_tx_write(kvp__lane_tx_t *t, int fd)
{
    while (t->done < t->total) {
        struct iovec v[KVP_LANE_IOV_MAX];
        int n = 0;
        uint64_t skip = t->done;
        for (uint32_t i = 0; i < 2 + t->ndata && n < KVP_LANE_IOV_MAX; i++) {
            const char *b = i == 0 ? (const char *)t->head : i == 1 ? (const char *)t->hdr : t->data[i - 2].buffer;
            size_t l = i == 0 ? KVP_LANE_HEAD : i == 1 ? t->hdr_len : t->data[i - 2].length;
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
            t->done += (uint64_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (k == 0)
            errno = EPIPE;
        return -1;
    }
    return 1;
}
