/* Fuzz target: the TCP framing's incremental reader (net/lane.c) on an
 * arbitrary byte stream, through a socketpair.  Frames' data go alternately
 * into slices and into the sink.  The reader must never write past a
 * destination or its buffer, and must end in EOF or a lost stream. */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/lane.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 65536)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 0;
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    if (size && send(sv[0], data, size, MSG_NOSIGNAL) != (ssize_t)size)
        abort();
    close(sv[0]);
    static uint8_t a[3], b[100], sink[7];
    ucp_dt_iov_t iov[2] = {{a, sizeof a}, {b, sizeof b}};
    kvp__lane_rx_t rx;
    if (kvp__lane_rx_init(&rx, 16, sink, sizeof sink) != 0)
        abort();
    uint64_t got = 0;
    int frames = 0;
    for (;;) {
        kvp__lane_ev_t ev = kvp__lane_rx_step(&rx, sv[1]);
        if (ev == KVP_LANE_EOF || ev == KVP_LANE_BAD)
            break;
        if (ev == KVP_LANE_AGAIN || ev == KVP_LANE_ERROR)
            abort(); /* all bytes were written, then the peer closed */
        if (ev == KVP_LANE_HEAD_IN) {
            if (rx.hdr_len == 0 || rx.hdr_len > KVP_WIRE_HEADER_MAX || rx.data_len > KVP_WIRE_PAYLOAD_MAX)
                abort();
            if (rx.hdr_len > size || kvp__lane_rx_grow(&rx, KVP_LANE_HEAD + rx.hdr_len) != 0)
                break; /* (more than the input could hold: as if out of budget) */
        } else if (ev == KVP_LANE_FRAME) {
            frames++;
            got = 0;
            /* odd frames into the slices (more room than data, or less:
             * then the rest would have nowhere to go), even ones into the sink */
            if (rx.data_len && (frames & 1))
                kvp__lane_rx_into(&rx, iov, 2);
        } else if (ev == KVP_LANE_DATA_IN) {
            if (rx.left != 0 || !kvp__lane_rx_idle(&rx))
                abort();
        } else if (ev == KVP_LANE_PROGRESS && rx.state == KVP_LANE_RX_DATA) {
            if (rx.left == 0 || rx.left > rx.data_len || rx.data_len - rx.left < got)
                abort(); /* data only ever advance, within the frame */
            got = rx.data_len - rx.left;
        }
    }
    kvp__lane_rx_free(&rx);
    close(sv[1]);
    return 0;
}
