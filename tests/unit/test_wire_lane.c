/* Unit tests of kvpool's TCP framing (src/net/lane.c) over a socketpair:
 * the gather writer's frames read back by the incremental reader, byte by
 * byte and in bulk, data into slices and into the sink, and the ways a
 * stream is lost (a bad head, the peer closing mid-frame, no destination). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/lane.h"
#include "test.h"

static void pair(int sv[2])
{
    ASSERT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    ASSERT(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0);
    ASSERT(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0);
}

/* Steps until an event other than PROGRESS. */
static kvp__lane_ev_t next(kvp__lane_rx_t *rx, int fd)
{
    kvp__lane_ev_t ev;
    while ((ev = kvp__lane_rx_step(rx, fd)) == KVP_LANE_PROGRESS)
        ;
    return ev;
}

TEST(test_lane_frame_head_is_big_endian_and_bounded)
{
    uint8_t h[KVP_LANE_HEAD];
    kvp__lane_head_encode(h, 0x01020304u, 0x0506070809ull);
    static const uint8_t want[KVP_LANE_HEAD] = {1, 2, 3, 4, 0, 0, 0, 5, 6, 7, 8, 9};
    ASSERT_MEM_EQ(h, want, sizeof want);
    uint32_t hl;
    uint64_t dl;
    kvp__lane_head_encode(h, 10, 20);
    ASSERT_EQ(kvp__lane_head_decode(h, &hl, &dl), 0);
    ASSERT_EQ(hl, 10);
    ASSERT_EQ(dl, 20);
    kvp__lane_head_encode(h, 0, 0);
    ASSERT_EQ(kvp__lane_head_decode(h, &hl, &dl), -1);
    kvp__lane_head_encode(h, KVP_WIRE_HEADER_MAX + 1, 0);
    ASSERT_EQ(kvp__lane_head_decode(h, &hl, &dl), -1);
    kvp__lane_head_encode(h, 1, KVP_WIRE_PAYLOAD_MAX + 1);
    ASSERT_EQ(kvp__lane_head_decode(h, &hl, &dl), -1);
}

/* A frame of a header and three data slices, written while the reader
 * drains it (the socket buffer is smaller than the frame), read into three
 * other slices of other sizes. */
TEST(test_lane_writer_and_reader_move_a_large_frame_exactly)
{
    int sv[2];
    pair(sv);
    int small = 4096;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    size_t n = 3u << 20;
    uint8_t *src = malloc(n), *dst = calloc(1, n);
    for (size_t i = 0; i < n; i++)
        src[i] = (uint8_t)(i * 7 + 3);
    const char hdr[] = "a request header";
    ucp_dt_iov_t in[3] = {{src, 1}, {src + 1, n / 2}, {src + 1 + n / 2, n - 1 - n / 2}};
    ucp_dt_iov_t out[3] = {{dst, n / 3}, {dst + n / 3, 0}, {dst + n / 3, n - n / 3}};
    kvp__lane_tx_t tx;
    kvp__lane_tx_init(&tx, hdr, sizeof hdr, in, 3);
    ASSERT_EQ(tx.total, KVP_LANE_HEAD + sizeof hdr + n);
    kvp__lane_rx_t rx;
    ASSERT_EQ(kvp__lane_rx_init(&rx, 8, NULL, 0), 0); /* too small for the header: grown */
    ASSERT(kvp__lane_rx_idle(&rx));
    int wrote = 0, saw_head = 0, saw_frame = 0, in_all = 0, partial = 0;
    while (!in_all) {
        if (!wrote) {
            int w = kvp__lane_tx_write(&tx, sv[0]);
            ASSERT(w >= 0);
            wrote = w == 1;
            partial += w == 0;
        }
        kvp__lane_ev_t ev = kvp__lane_rx_step(&rx, sv[1]);
        switch (ev) {
        case KVP_LANE_AGAIN:
        case KVP_LANE_PROGRESS:
            break;
        case KVP_LANE_HEAD_IN:
            ASSERT(!saw_head);
            saw_head = 1;
            ASSERT_EQ(rx.hdr_len, sizeof hdr);
            ASSERT_EQ(rx.data_len, n);
            ASSERT_EQ(kvp__lane_rx_grow(&rx, KVP_LANE_HEAD + rx.hdr_len), 0);
            break;
        case KVP_LANE_FRAME:
            saw_frame = 1;
            ASSERT_MEM_EQ(kvp__lane_rx_header(&rx), hdr, sizeof hdr);
            kvp__lane_rx_into(&rx, out, 1);
            break;
        case KVP_LANE_DATA_IN:
            in_all = 1;
            break;
        default:
            ASSERT_MSG(0, "unexpected reader event %d", (int)ev);
        }
        /* the destination grows as the reader reaches its end */
        if (saw_frame && rx.i >= rx.niov && rx.niov < 3)
            kvp__lane_rx_extend(&rx, 3);
    }
    ASSERT(wrote && saw_head && saw_frame);
    ASSERT_GT(partial, 0); /* the writer did have to wait for room */
    ASSERT_MEM_EQ(dst, src, n);
    ASSERT(kvp__lane_rx_idle(&rx));
    ASSERT_EQ(kvp__lane_rx_shrink(&rx, 16), KVP_LANE_HEAD + sizeof hdr - 16);
    ASSERT_EQ(rx.cap, 16);
    char c;
    ASSERT(recv(sv[1], &c, 1, 0) < 0 && errno == EAGAIN); /* nothing read past the frame */
    kvp__lane_rx_free(&rx);
    free(src);
    free(dst);
    close(sv[0]);
    close(sv[1]);
}

/* Two frames back to back, fed one byte at a time: the first's data go to
 * the sink, the second has none. */
TEST(test_lane_reader_takes_frames_byte_by_byte_and_sinks_unwanted_data)
{
    int sv[2];
    pair(sv);
    uint8_t data[100];
    memset(data, 0x5a, sizeof data);
    ucp_dt_iov_t d = {data, sizeof data};
    kvp__lane_tx_t a, b;
    kvp__lane_tx_init(&a, "h1", 2, &d, 1);
    kvp__lane_tx_init(&b, "hdr2", 4, NULL, 0);
    uint8_t stream[256];
    size_t len = 0;
    int sv2[2];
    pair(sv2);
    ASSERT_EQ(kvp__lane_tx_write(&a, sv2[0]), 1);
    ASSERT_EQ(kvp__lane_tx_write(&b, sv2[0]), 1);
    ssize_t k = recv(sv2[1], stream, sizeof stream, 0);
    ASSERT_EQ(k, (ssize_t)(2 * KVP_LANE_HEAD + 2 + 100 + 4));
    len = (size_t)k;
    char sink[7] = {0};
    kvp__lane_rx_t rx;
    ASSERT_EQ(kvp__lane_rx_init(&rx, 64, sink, sizeof sink), 0);
    int frames = 0, data_in = 0;
    for (size_t i = 0; i < len; i++) {
        ASSERT_EQ(send(sv[0], stream + i, 1, 0), 1);
        kvp__lane_ev_t ev = next(&rx, sv[1]);
        if (ev == KVP_LANE_AGAIN || ev == KVP_LANE_HEAD_IN) {
            ASSERT_EQ(kvp__lane_rx_step(&rx, sv[1]), KVP_LANE_AGAIN);
            continue;
        }
        if (ev == KVP_LANE_FRAME) {
            frames++;
            ASSERT_MEM_EQ(kvp__lane_rx_header(&rx), frames == 1 ? "h1" : "hdr2", frames == 1 ? 2 : 4);
            ASSERT_EQ(rx.data_len, frames == 1 ? 100u : 0u);
            ASSERT(frames == 2 ? kvp__lane_rx_idle(&rx) : !kvp__lane_rx_idle(&rx));
        } else {
            ASSERT_EQ(ev, KVP_LANE_DATA_IN);
            data_in++;
        }
    }
    ASSERT_EQ(frames, 2);
    ASSERT_EQ(data_in, 1);
    ASSERT_EQ(sink[0], 0x5a); /* (one byte at a time: each into the sink's start) */
    ASSERT_EQ(sink[1], 0);
    ASSERT(kvp__lane_rx_idle(&rx));
    kvp__lane_rx_free(&rx);
    close(sv[0]);
    close(sv[1]);
    close(sv2[0]);
    close(sv2[1]);
}

/* Slices with more room than the frame's data: the reader stops at the
 * frame's end, and the next frame reads whole. */
TEST(test_lane_reader_never_reads_past_a_frame_into_roomy_slices)
{
    int sv[2];
    pair(sv);
    uint8_t v[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    ucp_dt_iov_t d = {v, sizeof v};
    kvp__lane_tx_t a, b;
    kvp__lane_tx_init(&a, "one", 3, &d, 1);
    kvp__lane_tx_init(&b, "two", 3, NULL, 0);
    ASSERT_EQ(kvp__lane_tx_write(&a, sv[0]), 1);
    ASSERT_EQ(kvp__lane_tx_write(&b, sv[0]), 1);
    kvp__lane_rx_t rx;
    ASSERT_EQ(kvp__lane_rx_init(&rx, 64, NULL, 0), 0);
    uint8_t room[100] = {0};
    ucp_dt_iov_t dst = {room, sizeof room};
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_HEAD_IN);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_FRAME);
    kvp__lane_rx_into(&rx, &dst, 1);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_DATA_IN);
    ASSERT_MEM_EQ(room, v, sizeof v);
    ASSERT_EQ(room[sizeof v], 0);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_HEAD_IN);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_FRAME);
    ASSERT_MEM_EQ(kvp__lane_rx_header(&rx), "two", 3);
    ASSERT(kvp__lane_rx_idle(&rx));
    kvp__lane_rx_free(&rx);
    close(sv[0]);
    close(sv[1]);
}

TEST(test_lane_reader_loses_the_stream_on_a_bad_head_eof_or_nowhere_to_put_data)
{
    int sv[2];
    kvp__lane_rx_t rx;
    /* a head with header length 0 */
    pair(sv);
    ASSERT_EQ(kvp__lane_rx_init(&rx, 64, NULL, 0), 0);
    uint8_t h[KVP_LANE_HEAD] = {0};
    ASSERT_EQ(send(sv[0], h, sizeof h, 0), (ssize_t)sizeof h);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_BAD);
    close(sv[0]);
    close(sv[1]);
    /* a header longer than buf, not grown */
    pair(sv);
    kvp__lane_rx_reset(&rx);
    kvp__lane_head_encode(h, 100, 0);
    ASSERT_EQ(send(sv[0], h, sizeof h, 0), (ssize_t)sizeof h);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_HEAD_IN);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_BAD);
    close(sv[0]);
    close(sv[1]);
    /* data and neither a destination nor a sink */
    pair(sv);
    kvp__lane_rx_reset(&rx);
    kvp__lane_tx_t tx;
    uint8_t v[4] = {1, 2, 3, 4};
    ucp_dt_iov_t d = {v, 4};
    kvp__lane_tx_init(&tx, "x", 1, &d, 1);
    ASSERT_EQ(kvp__lane_tx_write(&tx, sv[0]), 1);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_HEAD_IN);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_FRAME);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_BAD);
    close(sv[0]);
    close(sv[1]);
    /* the peer closes mid-header, and between frames */
    pair(sv);
    kvp__lane_rx_reset(&rx);
    ASSERT(kvp__lane_rx_idle(&rx));
    kvp__lane_head_encode(h, 10, 0);
    ASSERT_EQ(send(sv[0], h, sizeof h, 0), (ssize_t)sizeof h);
    close(sv[0]);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_HEAD_IN);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_EOF);
    ASSERT(!kvp__lane_rx_idle(&rx));
    kvp__lane_rx_reset(&rx);
    ASSERT_EQ(next(&rx, sv[1]), KVP_LANE_EOF);
    ASSERT(kvp__lane_rx_idle(&rx));
    close(sv[1]);
    /* the writer: a closed peer is an error, not a full socket */
    pair(sv);
    close(sv[1]);
    kvp__lane_tx_init(&tx, "x", 1, &d, 1);
    ASSERT_EQ(kvp__lane_tx_write(&tx, sv[0]), -1);
    close(sv[0]);
    kvp__lane_rx_free(&rx);
}

TEST_LIST(T(test_lane_frame_head_is_big_endian_and_bounded), T(test_lane_writer_and_reader_move_a_large_frame_exactly),
          T(test_lane_reader_takes_frames_byte_by_byte_and_sinks_unwanted_data),
          T(test_lane_reader_never_reads_past_a_frame_into_roomy_slices),
          T(test_lane_reader_loses_the_stream_on_a_bad_head_eof_or_nowhere_to_put_data))
