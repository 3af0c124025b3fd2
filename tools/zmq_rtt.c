/*
 * The bare ZeroMQ REQ/REP round trip that the EC figures are measured
 * against (commands.h): an echo (a REP on 127.0.0.1 served by a thread of
 * its own), a pinger (a REQ sending frames of a given size), and the
 * percentile of a set of samples.  Used by `kvpool epd-node` (the replay's
 * baseline) and `kvpool bench --ec-reserve`.
 */
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "commands.h"
#include "common/alloc.h"
#include "common/clock.h"

#define ECHO_MAX 65536

static void *echo_main(void *arg)
{
    kvp_tool_echo_t *e = arg;
    char *buf = kvp__malloc(ECHO_MAX);
    while (buf && !atomic_load(&e->quit)) {
        zmq_pollitem_t it = {e->rep, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        int k = zmq_recv(e->rep, buf, ECHO_MAX, ZMQ_DONTWAIT);
        if (k >= 0)
            zmq_send(e->rep, buf, k > ECHO_MAX ? ECHO_MAX : (size_t)k, 0);
    }
    kvp__free(buf, ECHO_MAX);
    return NULL;
}

int kvp_tool_echo_start(kvp_tool_echo_t *e)
{
    memset(e, 0, sizeof *e);
    atomic_init(&e->quit, false);
    int zero = 0;
    size_t len = sizeof e->addr;
    e->ctx = zmq_ctx_new();
    e->rep = e->ctx ? zmq_socket(e->ctx, ZMQ_REP) : NULL;
    if (!e->rep || zmq_setsockopt(e->rep, ZMQ_LINGER, &zero, sizeof zero) || zmq_bind(e->rep, "tcp://127.0.0.1:*") ||
        zmq_getsockopt(e->rep, ZMQ_LAST_ENDPOINT, e->addr, &len) ||
        pthread_create(&e->thread, NULL, echo_main, e) != 0) {
        kvp_tool_echo_stop(e);
        return -1;
    }
    e->started = true;
    return 0;
}

void kvp_tool_echo_stop(kvp_tool_echo_t *e)
{
    atomic_store(&e->quit, true);
    if (e->started)
        pthread_join(e->thread, NULL);
    e->started = false;
    if (e->rep)
        zmq_close(e->rep);
    if (e->ctx)
        zmq_ctx_term(e->ctx);
    e->rep = e->ctx = NULL;
}

int kvp_tool_ping_open(kvp_tool_ping_t *p, const char *addr, size_t bytes, int timeout_ms)
{
    memset(p, 0, sizeof *p);
    int zero = 0;
    p->bytes = bytes ? bytes : 1;
    p->ctx = zmq_ctx_new();
    p->req = p->ctx ? zmq_socket(p->ctx, ZMQ_REQ) : NULL;
    p->buf = kvp__malloc(p->bytes);
    p->rb = kvp__malloc(p->bytes + 16);
    if (!p->req || !p->buf || !p->rb || zmq_setsockopt(p->req, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(p->req, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms) || zmq_connect(p->req, addr)) {
        kvp_tool_ping_close(p);
        return -1;
    }
    memset(p->buf, 'x', p->bytes);
    return 0;
}

uint64_t kvp_tool_ping(kvp_tool_ping_t *p)
{
    uint64_t t0 = kvp__now_ns();
    if (zmq_send(p->req, p->buf, p->bytes, 0) < 0 || zmq_recv(p->req, p->rb, p->bytes + 16, 0) < 0)
        return 0;
    uint64_t dt = kvp__now_ns() - t0;
    return dt ? dt : 1;
}

void kvp_tool_ping_close(kvp_tool_ping_t *p)
{
    if (p->req)
        zmq_close(p->req);
    if (p->ctx)
        zmq_ctx_term(p->ctx);
    kvp__free(p->buf, p->buf ? p->bytes : 0);
    kvp__free(p->rb, p->rb ? p->bytes + 16 : 0);
    memset(p, 0, sizeof *p);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t kvp_tool_quantile(uint64_t *v, size_t n, double q)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i = (size_t)((double)n * q);
    return v[i < n ? i : n - 1];
}
