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

#endif
