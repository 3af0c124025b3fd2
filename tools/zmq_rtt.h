/*
 * The bare ZeroMQ REQ/REP round trip that the EC figures are measured
 * against (zmq_rtt.c): an echo, a pinger, a sampler that takes round trips
 * through a workload and pairs them with the operations it measures, and
 * the quantile of a set of samples.  Used by `kvpool epd-node` (the
 * replay's baseline) and `kvpool bench --ec-reserve`.
 *
 * Frames of a reserve's size both ways: a ping's frame is the size of a
 * reserve request, and its first four bytes (little-endian) ask the echo
 * for a reply of a reserve reply's size (1..KVP_TOOL_ECHO_MAX bytes; any
 * other value, the filler 'xxxx' included, is answered with the frame
 * itself).
 */
#ifndef KVP_TOOLS_ZMQ_RTT_H
#define KVP_TOOLS_ZMQ_RTT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_TOOL_ECHO_MAX 65536u

/* An echo: a REP on 127.0.0.1 (any port; its endpoint in addr) answered by
 * a thread of its own.  start: 0, or -1 (nothing left running).  stop: also
 * after a failed start. */
typedef struct kvp_tool_echo {
    void *ctx, *rep;
    pthread_t thread;
    bool started;
    atomic_bool quit;
    char addr[64];
} kvp_tool_echo_t;
int kvp_tool_echo_start(kvp_tool_echo_t *e);
void kvp_tool_echo_stop(kvp_tool_echo_t *e);

/* A pinger: a REQ to addr sending frames of `bytes` bytes (1..ECHO_MAX)
 * and asking for replies of reply_bytes (0: the frame's own size; a frame
 * under 4 bytes cannot ask), receive timeout timeout_ms.  open: 0 or -1
 * (closed again).  ping: one round trip's ns, or 0 when it failed or the
 * reply was not of the size asked for (the socket is then out of step:
 * close it). */
typedef struct kvp_tool_ping {
    void *ctx, *req;
    char *buf, *rb;
    size_t bytes, reply_bytes;
} kvp_tool_ping_t;
int kvp_tool_ping_open(kvp_tool_ping_t *p, const char *addr, size_t bytes, size_t reply_bytes, int timeout_ms);
/* The size later replies are asked for (as at open). */
void kvp_tool_ping_reply_bytes(kvp_tool_ping_t *p, size_t reply_bytes);
uint64_t kvp_tool_ping(kvp_tool_ping_t *p);
void kvp_tool_ping_close(kvp_tool_ping_t *p);
/* count round trips (after 50 to warm up) on a pinger of its own: their
 * p50 in ns, or 0 when one failed. */
uint64_t kvp_tool_ping_p50(const char *addr, size_t bytes, size_t reply_bytes, size_t count);

/* Sorts v[0..n) and returns its q-quantile (v[n*q]), 0 for n == 0. */
uint64_t kvp_tool_quantile(uint64_t *v, size_t n, double q);

/* A sampler: from start to stop, one bare round trip every interval_us on
 * a thread of its own, each kept as [sent, answered], so the baseline sees
 * the machine the measured operations see.  Any thread may report an
 * operation (kvp_tool_sampler_op: its [sent, answered] and its reply's
 * size; later pings ask the echo for the largest so far).  At stop, the p50 of all the
 * samples, and that of the samples paired with the operations: for each
 * operation, the sample that started nearest its start (within
 * KVP_TOOL_PAIR_MAX_NS), chosen by start time alone, which neither round
 * trip's length decides (a sample chosen for overlapping an operation
 * would favour the long ones).  At most KVP_TOOL_SAMPLES of each are kept.
 * init before any other call, destroy once. */
#define KVP_TOOL_PAIR_MAX_NS 2000000u
#define KVP_TOOL_SAMPLES 1000000u

typedef struct kvp_tool_span {
    uint64_t a, b; /* CLOCK_MONOTONIC ns */
} kvp_tool_span_t;

typedef struct kvp_tool_spans {
    kvp_tool_span_t *v;
    size_t n, cap;
} kvp_tool_spans_t;

typedef struct kvp_tool_sampler {
    pthread_t thread;
    bool started;
    atomic_bool quit;
    atomic_size_t reply_bytes; /* the largest operation reply (0: none yet) */
    char addr[128];
    size_t bytes;
    uint64_t interval_us;
    kvp_tool_spans_t samp; /* the thread's; read after it ended */
    pthread_mutex_t mu;    /* ops */
    kvp_tool_spans_t ops;
} kvp_tool_sampler_t;

typedef struct kvp_tool_sampler_result {
    uint64_t p50_ns, paired_p50_ns; /* 0: none */
    size_t count, paired_count;
} kvp_tool_sampler_result_t;

void kvp_tool_sampler_init(kvp_tool_sampler_t *s);
/* 0, or -1 (a bad argument, started already, or no thread). */
int kvp_tool_sampler_start(kvp_tool_sampler_t *s, const char *addr, size_t bytes, uint64_t interval_us);
void kvp_tool_sampler_op(kvp_tool_sampler_t *s, uint64_t sent_ns, uint64_t answered_ns, size_t reply_bytes);
/* The largest operation reply so far (0: none yet). */
size_t kvp_tool_sampler_reply_bytes(kvp_tool_sampler_t *s);
/* Ends the thread (if started) and fills *out (zeros when never started). */
void kvp_tool_sampler_stop(kvp_tool_sampler_t *s, kvp_tool_sampler_result_t *out);
void kvp_tool_sampler_destroy(kvp_tool_sampler_t *s);

#endif
