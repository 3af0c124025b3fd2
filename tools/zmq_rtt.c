/*
 * The bare ZeroMQ REQ/REP round trip (zmq_rtt.h): the echo, the pinger,
 * the sampler and its pairing with the measured operations.
 */
#include "zmq_rtt.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/thread.h"

/* ---- frames: the reply size a ping asks for ---- */

static size_t frame_asks(const char *f, size_t len)
{
    if (len < 4)
        return 0;
    uint32_t v = (uint32_t)(uint8_t)f[0] | (uint32_t)(uint8_t)f[1] << 8 | (uint32_t)(uint8_t)f[2] << 16 |
                 (uint32_t)(uint8_t)f[3] << 24;
    return v >= 1 && v <= KVP_TOOL_ECHO_MAX ? v : 0;
}

static void frame_ask(char *f, size_t len, size_t reply_bytes)
{
    if (len < 4)
        return;
    if (!reply_bytes) {
        memset(f, 'x', 4);
        return;
    }
    for (int i = 0; i < 4; i++)
        f[i] = (char)(uint8_t)(reply_bytes >> (8 * i));
}

/* ---- the echo ---- */

static void *echo_main(void *arg)
{
    kvp_tool_echo_t *e = arg;
    kvp__thread_name("kvp-rtt-echo");
    /* zeroed: a reply longer than the frame it answers sends the buffer's
     * bytes past the frame, which must never be uninitialised memory */
    char *buf = kvp__calloc(1, KVP_TOOL_ECHO_MAX);
    while (buf && !atomic_load(&e->quit)) {
        zmq_pollitem_t it = {e->rep, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 100) <= 0)
            continue;
        int k = zmq_recv(e->rep, buf, KVP_TOOL_ECHO_MAX, ZMQ_DONTWAIT);
        if (k < 0)
            continue;
        size_t got = (size_t)k > KVP_TOOL_ECHO_MAX ? KVP_TOOL_ECHO_MAX : (size_t)k;
        size_t asked = frame_asks(buf, got);
        zmq_send(e->rep, buf, asked ? asked : got, 0);
    }
    kvp__free(buf, KVP_TOOL_ECHO_MAX);
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

/* ---- the pinger ---- */

int kvp_tool_ping_open(kvp_tool_ping_t *p, const char *addr, size_t bytes, size_t reply_bytes, int timeout_ms)
{
    memset(p, 0, sizeof *p);
    if (bytes < 1 || bytes > KVP_TOOL_ECHO_MAX || reply_bytes > KVP_TOOL_ECHO_MAX)
        return -1;
    int zero = 0;
    p->bytes = bytes;
    p->ctx = zmq_ctx_new();
    p->req = p->ctx ? zmq_socket(p->ctx, ZMQ_REQ) : NULL;
    p->buf = kvp__malloc(p->bytes);
    p->rb = kvp__malloc(KVP_TOOL_ECHO_MAX + 16);
    if (!p->req || !p->buf || !p->rb || zmq_setsockopt(p->req, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(p->req, ZMQ_RCVTIMEO, &timeout_ms, sizeof timeout_ms) || zmq_connect(p->req, addr)) {
        kvp_tool_ping_close(p);
        return -1;
    }
    memset(p->buf, 'x', p->bytes);
    kvp_tool_ping_reply_bytes(p, reply_bytes);
    return 0;
}

void kvp_tool_ping_reply_bytes(kvp_tool_ping_t *p, size_t reply_bytes)
{
    if (reply_bytes > KVP_TOOL_ECHO_MAX || p->bytes < 4)
        reply_bytes = 0;
    p->reply_bytes = reply_bytes;
    frame_ask(p->buf, p->bytes, reply_bytes);
}

uint64_t kvp_tool_ping(kvp_tool_ping_t *p)
{
    size_t want = p->reply_bytes ? p->reply_bytes : p->bytes;
    uint64_t t0 = kvp__now_ns();
    if (zmq_send(p->req, p->buf, p->bytes, 0) < 0)
        return 0;
    int k = zmq_recv(p->req, p->rb, KVP_TOOL_ECHO_MAX + 16, 0);
    uint64_t dt = kvp__now_ns() - t0;
    if (k < 0 || (size_t)k != want)
        return 0;
    return dt ? dt : 1;
}

void kvp_tool_ping_close(kvp_tool_ping_t *p)
{
    if (p->req)
        zmq_close(p->req);
    if (p->ctx)
        zmq_ctx_term(p->ctx);
    kvp__free(p->buf, p->buf ? p->bytes : 0);
    kvp__free(p->rb, p->rb ? KVP_TOOL_ECHO_MAX + 16 : 0);
    memset(p, 0, sizeof *p);
}

uint64_t kvp_tool_ping_p50(const char *addr, size_t bytes, size_t reply_bytes, size_t count)
{
    kvp_tool_ping_t p;
    uint64_t *lat = kvp__calloc(count, sizeof *lat), p50 = 0;
    if (!lat || kvp_tool_ping_open(&p, addr, bytes, reply_bytes, 2000) != 0) {
        kvp__free(lat, lat ? count * sizeof *lat : 0);
        return 0;
    }
    size_t i = 0;
    for (; i < count + 50; i++) {
        uint64_t dt = kvp_tool_ping(&p);
        if (!dt)
            break;
        if (i >= 50)
            lat[i - 50] = dt;
    }
    if (i == count + 50)
        p50 = kvp_tool_quantile(lat, count, 0.5);
    kvp_tool_ping_close(&p);
    kvp__free(lat, count * sizeof *lat);
    return p50;
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

/* ---- the sampler ---- */

/* Appends x: false when full (KVP_TOOL_SAMPLES) or out of memory (x is
 * dropped). */
static bool spans_push(kvp_tool_spans_t *s, kvp_tool_span_t x)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? 2 * s->cap : 4096;
        kvp_tool_span_t *nv = nc <= KVP_TOOL_SAMPLES ? kvp__realloc(s->v, s->cap * sizeof *nv, nc * sizeof *nv) : NULL;
        if (!nv)
            return false;
        s->v = nv;
        s->cap = nc;
    }
    s->v[s->n++] = x;
    return true;
}

static void spans_free(kvp_tool_spans_t *s)
{
    kvp__free(s->v, s->cap * sizeof *s->v);
    memset(s, 0, sizeof *s);
}

void kvp_tool_sampler_init(kvp_tool_sampler_t *s)
{
    memset(s, 0, sizeof *s);
    atomic_init(&s->quit, false);
    atomic_init(&s->reply_bytes, 0);
    pthread_mutex_init(&s->mu, NULL);
}

static void *sampler_main(void *arg)
{
    kvp_tool_sampler_t *s = arg;
    kvp__thread_name("kvp-rtt-ping");
    kvp_tool_ping_t p;
    if (kvp_tool_ping_open(&p, s->addr, s->bytes, atomic_load(&s->reply_bytes), 2000) != 0)
        return NULL;
    while (!atomic_load(&s->quit)) {
        size_t rb = atomic_load(&s->reply_bytes);
        if (rb != p.reply_bytes)
            kvp_tool_ping_reply_bytes(&p, rb);
        uint64_t t0 = kvp__now_ns(), dt = kvp_tool_ping(&p);
        if (!dt)
            break;
        spans_push(&s->samp, (kvp_tool_span_t){t0, t0 + dt});
        usleep((useconds_t)s->interval_us);
    }
    kvp_tool_ping_close(&p);
    return NULL;
}

int kvp_tool_sampler_start(kvp_tool_sampler_t *s, const char *addr, size_t bytes, uint64_t interval_us)
{
    size_t alen = addr ? strlen(addr) : 0;
    if (s->started || !addr || alen >= sizeof s->addr || bytes < 1 || bytes > KVP_TOOL_ECHO_MAX)
        return -1;
    memcpy(s->addr, addr, alen + 1);
    s->bytes = bytes;
    s->interval_us = interval_us;
    atomic_store(&s->quit, false);
    if (pthread_create(&s->thread, NULL, sampler_main, s) != 0)
        return -1;
    s->started = true;
    return 0;
}

void kvp_tool_sampler_op(kvp_tool_sampler_t *s, uint64_t sent_ns, uint64_t answered_ns, size_t reply_bytes)
{
    if (answered_ns < sent_ns)
        return;
    pthread_mutex_lock(&s->mu);
    if (reply_bytes <= KVP_TOOL_ECHO_MAX && reply_bytes > atomic_load(&s->reply_bytes))
        atomic_store(&s->reply_bytes, reply_bytes);
    spans_push(&s->ops, (kvp_tool_span_t){sent_ns, answered_ns});
    pthread_mutex_unlock(&s->mu);
}

size_t kvp_tool_sampler_reply_bytes(kvp_tool_sampler_t *s) { return atomic_load(&s->reply_bytes); }

static int span_cmp(const void *x, const void *y)
{
    const kvp_tool_span_t *a = x, *b = y;
    return a->a < b->a ? -1 : a->a > b->a;
}

/* The p50 of the samples paired with the operations (samp in start order:
 * one thread took them in turn); *count_p pairs.  mu held. */
static uint64_t pair_p50(kvp_tool_sampler_t *s, size_t *count_p)
{
    const kvp_tool_spans_t *sa = &s->samp;
    qsort(s->ops.v, s->ops.n, sizeof *s->ops.v, span_cmp);
    uint64_t *out = kvp__calloc(s->ops.n + 1, sizeof *out);
    size_t m = 0, j = 0;
    for (size_t i = 0; out && i < s->ops.n && sa->n; i++) {
        uint64_t t = s->ops.v[i].a;
        while (j + 1 < sa->n && sa->v[j + 1].a <= t)
            j++;
        /* v[j] is the last sample that started by t (or the first of all),
         * v[j + 1] the first after it */
        size_t k = j;
        uint64_t d = t > sa->v[j].a ? t - sa->v[j].a : sa->v[j].a - t;
        if (j + 1 < sa->n && sa->v[j + 1].a - t < d) {
            k = j + 1;
            d = sa->v[k].a - t;
        }
        if (d <= KVP_TOOL_PAIR_MAX_NS)
            out[m++] = sa->v[k].b - sa->v[k].a;
    }
    uint64_t p50 = kvp_tool_quantile(out, m, 0.5);
    kvp__free(out, out ? (s->ops.n + 1) * sizeof *out : 0);
    *count_p = m;
    return p50;
}

void kvp_tool_sampler_stop(kvp_tool_sampler_t *s, kvp_tool_sampler_result_t *out)
{
    memset(out, 0, sizeof *out);
    if (!s->started)
        return;
    atomic_store(&s->quit, true);
    pthread_join(s->thread, NULL);
    s->started = false;
    size_t n = s->samp.n;
    uint64_t *all = kvp__calloc(n + 1, sizeof *all);
    for (size_t i = 0; all && i < n; i++)
        all[i] = s->samp.v[i].b - s->samp.v[i].a;
    out->p50_ns = all ? kvp_tool_quantile(all, n, 0.5) : 0;
    out->count = n;
    kvp__free(all, all ? (n + 1) * sizeof *all : 0);
    pthread_mutex_lock(&s->mu);
    out->paired_p50_ns = pair_p50(s, &out->paired_count);
    pthread_mutex_unlock(&s->mu);
}

void kvp_tool_sampler_destroy(kvp_tool_sampler_t *s)
{
    kvp_tool_sampler_result_t r;
    kvp_tool_sampler_stop(s, &r);
    spans_free(&s->samp);
    spans_free(&s->ops);
    pthread_mutex_destroy(&s->mu);
}
