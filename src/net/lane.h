/*
 * kvpool's TCP transport ("the lane"): when UCX would move bytes over TCP
 * anyway, the handshake socket itself carries requests and replies, and
 * values go between the caller's buffers and the arena slots with one
 * sendmsg/readv each way, without UCX's staging buffers or rendezvous round
 * trips (docs/transport.md §4, docs/protocol.md §3).
 *
 * Every message, either way, is one frame:
 *
 *   u32 header_len  u64 data_len  header  data
 *
 * (integers big-endian).  header is the same MessagePack request or reply
 * header as a UCX active message carries (net/wire.h), of 1 to
 * KVP_WIRE_HEADER_MAX bytes; data is a put's values (requests) or a get's
 * values (replies), concatenated in key order, and empty for every other op.
 * A frame breaking these rules closes the connection: with a byte stream
 * there is no way to find the next frame.
 */
#ifndef KVP_NET_LANE_H
#define KVP_NET_LANE_H

#include <stdint.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>

#include "net/wire.h"

#define KVP_LANE_HEAD 12u

static inline void kvp__lane_head_encode(uint8_t out[KVP_LANE_HEAD], uint32_t hdr_len, uint64_t data_len)
{
    for (int i = 0; i < 4; i++)
        out[i] = (uint8_t)(hdr_len >> (24 - 8 * i));
    for (int i = 0; i < 8; i++)
        out[4 + i] = (uint8_t)(data_len >> (56 - 8 * i));
}

/* Returns 0 and the lengths if the head is well-formed, -1 if not. */
static inline int kvp__lane_head_decode(const uint8_t in[KVP_LANE_HEAD], uint32_t *hdr_len, uint64_t *data_len)
{
    uint32_t h = 0;
    uint64_t d = 0;
    for (int i = 0; i < 4; i++)
        h = h << 8 | in[i];
    for (int i = 0; i < 8; i++)
        d = d << 8 | in[4 + i];
    if (h == 0 || h > KVP_WIRE_HEADER_MAX || d > KVP_WIRE_PAYLOAD_MAX)
        return -1;
    *hdr_len = h;
    *data_len = d;
    return 0;
}

/* A position in a list of destination (or source) slices: slice i, byte
 * off of it.  kvp__lane_iov_fill() describes what is left from there as at
 * most max iovecs (empty slices skipped); kvp__lane_iov_advance() moves the
 * position on by the k bytes a readv/sendmsg moved. */
static inline int kvp__lane_iov_fill(struct iovec *out, int max, const ucp_dt_iov_t *iov, uint32_t n, uint32_t i,
                                     size_t off)
{
    int k = 0;
    for (; i < n && k < max; i++, off = 0)
        if (iov[i].length > off)
            out[k++] = (struct iovec){(char *)iov[i].buffer + off, iov[i].length - off};
    return k;
}

static inline void kvp__lane_iov_advance(const ucp_dt_iov_t *iov, uint32_t *i, size_t *off, size_t k)
{
    while (k) {
        size_t left = iov[*i].length - *off;
        if (k >= left) {
            k -= left;
            (*i)++;
            *off = 0;
        } else {
            *off += k;
            k = 0;
        }
    }
}


/* ---- the reader ----
 *
 * One frame at a time off a non-blocking stream socket, never a byte past
 * it (the next frame's data may have to go straight to another caller's
 * buffers, so nothing is read ahead):
 *
 *   HEAD    the 12 bytes of the head into buf; decoded, checked
 *           (kvp__lane_head_decode), then           -> KVP_LANE_HEAD_IN
 *   HEADER  hdr_len bytes into buf after the head   -> KVP_LANE_FRAME
 *           (the header is at kvp__lane_rx_header(), valid until the
 *           next frame's head is read: through the data, that is)
 *   DATA    data_len bytes into the destination the caller set when the
 *           header came (kvp__lane_rx_into: a list of slices, which may
 *           lengthen as the caller decides where later bytes go), or else
 *           into the sink (bytes nobody wants), -> KVP_LANE_DATA_IN
 *
 * kvp__lane_rx_step() does one read (recv or readv) and says what it
 * brought.  buf is the caller's to size: at KVP_LANE_HEAD_IN it must hold
 * KVP_LANE_HEAD + hdr_len bytes before the next step (kvp__lane_rx_grow;
 * the server checks its header budget first); a step finding it too small
 * answers KVP_LANE_BAD.  Between frames (kvp__lane_rx_idle) the caller may
 * shrink it again.
 */
#define KVP_LANE_IOV_MAX 64 /* iovecs one readv or sendmsg moves */

typedef enum kvp__lane_rx_state {
    KVP_LANE_RX_HEAD,   /* reading a frame head (len 0: between frames) */
    KVP_LANE_RX_HEADER, /* reading the header */
    KVP_LANE_RX_DATA    /* reading the frame's data */
} kvp__lane_rx_state_t;

typedef enum kvp__lane_ev {
    KVP_LANE_AGAIN,    /* nothing to read now (EAGAIN): wait for the socket */
    KVP_LANE_PROGRESS, /* some bytes came; step again */
    KVP_LANE_HEAD_IN,  /* the head is in: hdr_len, data_len (size buf now) */
    KVP_LANE_FRAME,    /* the header is in; data_len bytes of data follow (set their destination now) */
    KVP_LANE_DATA_IN,  /* the frame's last data bytes came: between frames again */
    KVP_LANE_EOF,      /* the peer closed (mid-frame unless kvp__lane_rx_idle) */
    KVP_LANE_ERROR,    /* the read failed (errno) */
    KVP_LANE_BAD       /* a malformed head, buf too small, data without a destination: the stream is lost */
} kvp__lane_ev_t;

typedef struct kvp__lane_rx {
    kvp__lane_rx_state_t state;
    uint8_t *buf;              /* head + header (kvp__malloc'd, cap bytes) */
    size_t cap, len;           /* len: bytes of head + header read */
    uint32_t hdr_len;          /* from HEAD_IN on */
    uint64_t data_len;         /* from HEAD_IN on */
    uint64_t left;             /* DATA: bytes still to come */
    const ucp_dt_iov_t *iov;   /* DATA: where they go (NULL: the sink) */
    uint32_t niov;             /* entries of iov usable now */
    uint32_t i;                /* position in iov: entry i, byte off of it */
    size_t off;
    void *sink;                /* the caller's, sink_len bytes (or NULL: none) */
    size_t sink_len;
} kvp__lane_rx_t;

/* buf of cap bytes (at least KVP_LANE_HEAD); sink may be NULL.  0, or -1
 * (no memory). */
int kvp__lane_rx_init(kvp__lane_rx_t *rx, size_t cap, void *sink, size_t sink_len);
void kvp__lane_rx_free(kvp__lane_rx_t *rx);
/* A new stream: whatever was half-read is forgotten (buf kept). */
void kvp__lane_rx_reset(kvp__lane_rx_t *rx);
kvp__lane_ev_t kvp__lane_rx_step(kvp__lane_rx_t *rx, int fd);
/* buf holds at least need bytes (the head kept).  0, or -1 (no memory). */
int kvp__lane_rx_grow(kvp__lane_rx_t *rx, size_t need);
/* Between frames: buf back to cap bytes if larger.  The bytes freed, or 0
 * (nothing to do, or no memory for the smaller buffer). */
size_t kvp__lane_rx_shrink(kvp__lane_rx_t *rx, size_t cap);
static inline int kvp__lane_rx_idle(const kvp__lane_rx_t *rx) { return rx->state == KVP_LANE_RX_HEAD && rx->len == 0; }
static inline const uint8_t *kvp__lane_rx_header(const kvp__lane_rx_t *rx) { return rx->buf + KVP_LANE_HEAD; }
/* At KVP_LANE_FRAME: the data go to iov[0, n) (n may grow later:
 * kvp__lane_rx_extend), from its start. */
static inline void kvp__lane_rx_into(kvp__lane_rx_t *rx, const ucp_dt_iov_t *iov, uint32_t n)
{
    rx->iov = iov;
    rx->niov = n;
    rx->i = 0;
    rx->off = 0;
}
static inline void kvp__lane_rx_extend(kvp__lane_rx_t *rx, uint32_t n) { rx->niov = n; }

/* ---- the writer ----
 *
 * One frame, gathered: the head, the header and the data slices (a put's
 * values straight from the caller's buffers, a get's from the leased arena
 * slices), written with sendmsg as far as the socket takes them; the
 * writer remembers how far it got, for the next call when the socket has
 * room.  Nothing is copied: hdr and data must stay put until the frame is
 * written.
 */
typedef struct kvp__lane_tx {
    uint8_t head[KVP_LANE_HEAD];
    const uint8_t *hdr;
    uint32_t hdr_len;
    const ucp_dt_iov_t *data;
    uint32_t ndata;
    uint64_t total;            /* the frame's bytes */
    uint64_t done;             /* of them written */
} kvp__lane_tx_t;

void kvp__lane_tx_init(kvp__lane_tx_t *t, const void *hdr, uint32_t hdr_len, const ucp_dt_iov_t *data,
                       uint32_t ndata);
/* Writes what the socket takes (MSG_DONTWAIT, MSG_NOSIGNAL; EINTR retried).
 * 1: the whole frame is written; 0: the socket is full (wait for EPOLLOUT
 * or POLLOUT, then call again); -1: the send failed (errno). */
int kvp__lane_tx_write(kvp__lane_tx_t *t, int fd);

#endif
