#include "server/metrics.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"

struct kvp__metrics {
    struct MHD_Daemon *d;
    kvp__metrics_render_fn render;
    void *arg;
    uint16_t port;
};

static const char *const g_op_names[KVP_WOP_MAX + 1] = {
    "invalid", "hello", "exists", "prefix", "put", "get", "remove", "pin", "unpin", "remove_all", "stats",
    "get_local", "release", "local_proof",
};

void kvp__metrics_observe(kvp__server_counters_t *c, uint32_t op, uint64_t ns)
{
    if (op > KVP_WOP_MAX)
        op = 0;
    atomic_fetch_add_explicit(&c->lat_count[op], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->lat_sum_ns[op], ns, memory_order_relaxed);
    int b = 0;
    uint64_t us = ns / 1000;
    while (b < KVP_LAT_BUCKETS && us > (1ull << b))
        b++;
    atomic_fetch_add_explicit(&c->lat_bucket[op][b], 1, memory_order_relaxed);
}

typedef struct {
    char *buf;
    size_t len, cap;
} sbuf_t;

static void out(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(sbuf_t *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = b->buf ? vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap) : -1;
        va_end(ap);
        if (n >= 0 && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        char *nb = kvp__realloc(b->buf, b->cap, cap);
        if (!nb)
            return;
        b->buf = nb;
        b->cap = cap;
    }
}

char *kvp__metrics_render(kvp__store_t *store, kvp__server_counters_t *c, size_t *len_p, size_t *cap_p)
{
    sbuf_t b = {0};
    kvp_pool_stats_t st;
    kvp__store_stats(store, &st);
    out(&b, "# HELP kvpool_requests_total Requests received, by operation.\n# TYPE kvpool_requests_total counter\n");
    for (int op = 1; op <= KVP_WOP_MAX; op++)
        out(&b, "kvpool_requests_total{op=\"%s\"} %llu\n", g_op_names[op],
            (unsigned long long)atomic_load(&c->ops[op]));
    out(&b, "# TYPE kvpool_bad_requests_total counter\nkvpool_bad_requests_total %llu\n",
        (unsigned long long)atomic_load(&c->bad_requests));
    out(&b, "# TYPE kvpool_auth_failures_total counter\nkvpool_auth_failures_total %llu\n",
        (unsigned long long)atomic_load(&c->auth_failures));
    out(&b, "# TYPE kvpool_bytes_total counter\nkvpool_bytes_total{dir=\"in\"} %llu\nkvpool_bytes_total{dir=\"out\"} %llu\n",
        (unsigned long long)atomic_load(&c->bytes_in), (unsigned long long)atomic_load(&c->bytes_out));
    out(&b, "# HELP kvpool_local_read_leases Values leased to clients reading the arena directly.\n"
            "# TYPE kvpool_local_read_leases gauge\nkvpool_local_read_leases %llu\n"
            "# TYPE kvpool_local_read_leased_bytes gauge\nkvpool_local_read_leased_bytes %llu\n",
        (unsigned long long)atomic_load(&c->local_leases), (unsigned long long)atomic_load(&c->local_bytes));
    out(&b, "# HELP kvpool_local_read_groups GET_LOCAL requests whose leases are not released yet.\n"
            "# TYPE kvpool_local_read_groups gauge\nkvpool_local_read_groups %llu\n"
            "# TYPE kvpool_local_read_expired_total counter\nkvpool_local_read_expired_total %llu\n"
            "# TYPE kvpool_local_read_bogus_releases_total counter\nkvpool_local_read_bogus_releases_total %llu\n",
        (unsigned long long)atomic_load(&c->local_groups), (unsigned long long)atomic_load(&c->local_expired),
        (unsigned long long)atomic_load(&c->local_bogus));
    out(&b, "# HELP kvpool_connections Connections the server holds (in the handshake, established, closing).\n"
            "# TYPE kvpool_connections gauge\nkvpool_connections %llu\n",
        (unsigned long long)atomic_load(&c->connections));
    out(&b, "# TYPE kvpool_handshakes gauge\nkvpool_handshakes %llu\n"
            "# TYPE kvpool_handshakes_dropped_total counter\n"
            "kvpool_handshakes_dropped_total{reason=\"timeout\"} %llu\n"
            "kvpool_handshakes_dropped_total{reason=\"displaced\"} %llu\n"
            "kvpool_handshakes_dropped_total{reason=\"malformed\"} %llu\n",
        (unsigned long long)atomic_load(&c->handshakes), (unsigned long long)atomic_load(&c->hs_dropped[0]),
        (unsigned long long)atomic_load(&c->hs_dropped[1]), (unsigned long long)atomic_load(&c->hs_dropped[2]));
    out(&b, "# TYPE kvpool_connections_refused_total counter\n"
            "kvpool_connections_refused_total{reason=\"max_conns\"} %llu\n"
            "kvpool_connections_refused_total{reason=\"per_source\"} %llu\n"
            "kvpool_connections_refused_total{reason=\"draining\"} %llu\n"
            "kvpool_connections_refused_total{reason=\"fd_limit\"} %llu\n",
        (unsigned long long)atomic_load(&c->refused[0]), (unsigned long long)atomic_load(&c->refused[1]),
        (unsigned long long)atomic_load(&c->refused[2]), (unsigned long long)atomic_load(&c->refused[3]));
    out(&b, "# TYPE kvpool_put_expired_total counter\nkvpool_put_expired_total %llu\n"
            "# TYPE kvpool_abandoned_total counter\nkvpool_abandoned_total{kind=\"reply\"} %llu\n"
            "kvpool_abandoned_total{kind=\"put\"} %llu\n",
        (unsigned long long)atomic_load(&c->put_expired), (unsigned long long)atomic_load(&c->abandoned[0]),
        (unsigned long long)atomic_load(&c->abandoned[1]));
    out(&b, "# HELP kvpool_held_bytes Memory clients hold in the server while their requests arrive.\n"
            "# TYPE kvpool_held_bytes gauge\nkvpool_held_bytes{kind=\"put_reserved\"} %llu\n"
            "kvpool_held_bytes{kind=\"put_staged\"} %llu\nkvpool_held_bytes{kind=\"request_headers\"} %llu\n",
        (unsigned long long)atomic_load(&c->put_resv_bytes), (unsigned long long)atomic_load(&c->staged_bytes),
        (unsigned long long)atomic_load(&c->header_bytes));
    uint64_t acc = atomic_load(&c->accepted), acc_tcp = atomic_load(&c->accepted_tcp);
    out(&b, "# TYPE kvpool_connections_accepted_total counter\n"
            "kvpool_connections_accepted_total{transport=\"ucx\"} %llu\n"
            "kvpool_connections_accepted_total{transport=\"tcp\"} %llu\n",
        (unsigned long long)(acc - acc_tcp), (unsigned long long)acc_tcp);
    out(&b, "# TYPE kvpool_ucx_worker_rebuilds_total counter\nkvpool_ucx_worker_rebuilds_total %llu\n",
        (unsigned long long)atomic_load(&c->worker_rebuilds));
    out(&b, "# HELP kvpool_request_seconds Request latency in the server.\n# TYPE kvpool_request_seconds histogram\n");
    for (int op = 1; op <= KVP_WOP_MAX; op++) {
        uint64_t cum = 0;
        for (int i = 0; i <= KVP_LAT_BUCKETS; i++) {
            cum += atomic_load(&c->lat_bucket[op][i]);
            if (i < KVP_LAT_BUCKETS)
                out(&b, "kvpool_request_seconds_bucket{op=\"%s\",le=\"%g\"} %llu\n", g_op_names[op],
                    (double)(1ull << i) / 1e6, (unsigned long long)cum);
            else
                out(&b, "kvpool_request_seconds_bucket{op=\"%s\",le=\"+Inf\"} %llu\n", g_op_names[op],
                    (unsigned long long)cum);
        }
        out(&b, "kvpool_request_seconds_sum{op=\"%s\"} %.9f\nkvpool_request_seconds_count{op=\"%s\"} %llu\n",
            g_op_names[op], (double)atomic_load(&c->lat_sum_ns[op]) / 1e9, g_op_names[op],
            (unsigned long long)atomic_load(&c->lat_count[op]));
    }
    out(&b, "# TYPE kvpool_arena_bytes gauge\nkvpool_arena_bytes{kind=\"capacity\"} %llu\n"
            "kvpool_arena_bytes{kind=\"used\"} %llu\nkvpool_arena_bytes{kind=\"live\"} %llu\n",
        (unsigned long long)st.capacity_bytes, (unsigned long long)st.used_bytes,
        (unsigned long long)st.live_bytes);
    out(&b, "# TYPE kvpool_objects gauge\nkvpool_objects{state=\"live\"} %llu\nkvpool_objects{state=\"reserved\"} %llu\n"
            "kvpool_objects{state=\"pinned\"} %llu\nkvpool_objects{state=\"leased\"} %llu\n",
        (unsigned long long)st.live, (unsigned long long)st.reserved, (unsigned long long)st.pinned,
        (unsigned long long)st.leased);
    out(&b, "# TYPE kvpool_objects_committed_total counter\nkvpool_objects_committed_total %llu\n",
        (unsigned long long)st.committed);
    out(&b, "# TYPE kvpool_objects_left_total counter\nkvpool_objects_left_total{reason=\"evicted\"} %llu\n"
            "kvpool_objects_left_total{reason=\"removed\"} %llu\nkvpool_objects_left_total{reason=\"reset\"} %llu\n"
            "kvpool_objects_left_total{reason=\"expired_put\"} %llu\n",
        (unsigned long long)st.evicted, (unsigned long long)st.removed, (unsigned long long)st.reset,
        (unsigned long long)st.expired_put);
    out(&b, "# TYPE kvpool_get_total counter\nkvpool_get_total{result=\"hit\"} %llu\nkvpool_get_total{result=\"miss\"} %llu\n",
        (unsigned long long)st.get_hits, (unsigned long long)st.get_misses);
    out(&b, "# TYPE kvpool_put_total counter\nkvpool_put_total{result=\"existed\"} %llu\nkvpool_put_total{result=\"no_space\"} %llu\n",
        (unsigned long long)st.put_existed, (unsigned long long)st.put_no_space);
    const kvp__cfilter_t *f = kvp__store_filter(store);
    out(&b, "# HELP kvpool_filter_counters The membership filter local clients map (0: none).\n"
            "# TYPE kvpool_filter_counters gauge\nkvpool_filter_counters %llu\n"
            "# HELP kvpool_filter_keys Keys in the membership filter (the live objects).\n"
            "# TYPE kvpool_filter_keys gauge\nkvpool_filter_keys %llu\n"
            "# HELP kvpool_filter_saturated Counters stuck at their maximum (each a source of false positives).\n"
            "# TYPE kvpool_filter_saturated gauge\nkvpool_filter_saturated %llu\n",
        (unsigned long long)(f->c ? f->nblocks * KVP_CF_BLOCK : 0),
        (unsigned long long)atomic_load_explicit(&f->keys, memory_order_relaxed),
        (unsigned long long)atomic_load_explicit(&f->saturated, memory_order_relaxed));
    *len_p = b.len;
    *cap_p = b.cap;
    return b.buf;
}

static enum MHD_Result on_http(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **con_cls)
{
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    kvp__metrics_t *m = cls;
    struct MHD_Response *resp;
    enum MHD_Result ret;
    if (strcmp(method, "GET") != 0 || (strcmp(url, "/metrics") != 0 && strcmp(url, "/") != 0)) {
        static const char nf[] = "not found: GET /metrics\n";
        resp = MHD_create_response_from_buffer(sizeof nf - 1, (void *)nf, MHD_RESPMEM_PERSISTENT);
        ret = MHD_queue_response(conn, MHD_HTTP_NOT_FOUND, resp);
        MHD_destroy_response(resp);
        return ret;
    }
    size_t len = 0, cap = 0;
    char *text = m->render(m->arg, &len, &cap);
    resp = MHD_create_response_from_buffer(len, text ? text : (char *)"", MHD_RESPMEM_MUST_COPY);
    kvp__free(text, cap);
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4");
    ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return ret;
}

kvp_status_t kvp__metrics_start(const char *host, uint16_t port, kvp__metrics_render_fn render,
                                void *arg, kvp__metrics_t **m_p)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        kvp_error("metrics: '%s' is not an IPv4 address", host);
        return KVP_ERR_INVALID_ARG;
    }
    kvp__metrics_t *m = kvp__calloc(1, sizeof *m);
    if (!m)
        return KVP_ERR_NO_MEMORY;
    m->render = render;
    m->arg = arg;
    /* epoll, not select: the server may hold more than 1,024 descriptors
     * (the endpoint must stay up exactly when something floods it); idle
     * connections are closed after 10 s, so 64 of them cannot blind it. */
    m->d = MHD_start_daemon(MHD_USE_EPOLL_INTERNAL_THREAD, port, NULL, NULL, on_http, m,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, 64u,
                            MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
    if (!m->d) {
        kvp_error("metrics: cannot serve on %s:%u", host, port);
        kvp__free(m, sizeof *m);
        return KVP_ERR_IO;
    }
    const union MHD_DaemonInfo *bound = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    m->port = bound && bound->port ? bound->port : port;
    kvp_info("metrics: Prometheus text on http://%s:%u/metrics", host, m->port);
    *m_p = m;
    return KVP_OK;
}

uint16_t kvp__metrics_port(const kvp__metrics_t *m)
{
    return m->port;
}

void kvp__metrics_stop(kvp__metrics_t *m)
{
    if (!m)
        return;
    MHD_stop_daemon(m->d);
    kvp__free(m, sizeof *m);
}
