/*
 * The worker's counters (kvp_kv_worker_stats) and their Prometheus text
 * (kvp_kv_worker_metrics, names kvpool_kv_worker_*, in the style of the
 * server's src/server/metrics.c).  Every counter is an atomic written by
 * the engine thread or the I/O threads, so both calls read from any thread
 * without a lock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kv/kv_worker_int.h"

#define LD(x) ((unsigned long long)atomic_load(&(x)))

void kvp_kv_worker_stats(const kvp_kv_worker_t *worker, kvp_kv_worker_stats_t *stats_p)
{
    if (!stats_p)
        return;
    memset(stats_p, 0, sizeof *stats_p);
    if (!worker)
        return;
    kvp__kvw_counters_t *c = (kvp__kvw_counters_t *)&worker->c;
    stats_p->blocks_saved = LD(c->blocks_saved);
    stats_p->blocks_deduped = LD(c->blocks_deduped);
    stats_p->blocks_loaded = LD(c->blocks_loaded);
    stats_p->load_errors = LD(c->load_errors);
    stats_p->save_errors = LD(c->save_errors);
    stats_p->saves_dropped = LD(c->saves_dropped);
    stats_p->pressure_skips = LD(c->pressure_skips);
    stats_p->bytes_saved = LD(c->bytes_saved);
    stats_p->bytes_loaded = LD(c->bytes_loaded);
    stats_p->save_queue_depth = LD(c->save_queue_depth);
    stats_p->save_queue_bytes = LD(c->save_queue_bytes);
    stats_p->load_queue_depth = LD(c->load_queue_depth);
    stats_p->save_ns = LD(c->save_ns);
    stats_p->load_ns = LD(c->load_ns);
}

/* Text into buf[0..cap) that keeps counting past its end. */
typedef struct {
    char *buf;
    size_t cap, len;
} tbuf_t;

static void out(tbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(tbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->len < b->cap ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->buf + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        b->len += (size_t)n;
}

static void metric(tbuf_t *b, const char *name, const char *type, const char *help,
                   unsigned long long v)
{
    out(b, "# HELP kvpool_kv_worker_%s %s\n# TYPE kvpool_kv_worker_%s %s\nkvpool_kv_worker_%s %llu\n",
        name, help, name, type, name, v);
}

kvp_status_t kvp_kv_worker_metrics(const kvp_kv_worker_t *worker, char *buf, size_t buf_size,
                                   size_t *len_p)
{
    if (!worker || !len_p || (!buf && buf_size))
        return KVP_ERR_NULL_POINTER;
    kvp__kvw_counters_t *c = (kvp__kvw_counters_t *)&worker->c;
    tbuf_t b = {buf, buf_size, 0};
    metric(&b, "blocks_saved_total", "counter", "Blocks put into the pool (new).", LD(c->blocks_saved));
    metric(&b, "blocks_deduped_total", "counter", "Blocks a save found already in the pool.",
           LD(c->blocks_deduped));
    metric(&b, "blocks_loaded_total", "counter", "Blocks got from the pool and verified.",
           LD(c->blocks_loaded));
    metric(&b, "load_errors_total", "counter", "Blocks reported as load errors.", LD(c->load_errors));
    metric(&b, "save_errors_total", "counter", "Blocks whose put failed.", LD(c->save_errors));
    metric(&b, "saves_dropped_total", "counter", "Save metas not queued: the save queue was full.",
           LD(c->saves_dropped));
    metric(&b, "pressure_skips_total", "counter", "Save metas skipped for store pressure.",
           LD(c->pressure_skips));
    metric(&b, "bad_metas_total", "counter", "Metas refused (block ids out of range, bad hashes).",
           LD(c->bad_metas));
    metric(&b, "pool_call_failures_total", "counter", "Pool calls that failed as a whole.",
           LD(c->pool_calls_failed));
    metric(&b, "saves_total", "counter", "Save metas handled by the save thread.", LD(c->saves_done));
    metric(&b, "loads_total", "counter", "Load metas handled by the load threads.", LD(c->loads_done));
    out(&b, "# HELP kvpool_kv_worker_bytes_total Value bytes moved.\n"
            "# TYPE kvpool_kv_worker_bytes_total counter\n"
            "kvpool_kv_worker_bytes_total{dir=\"saved\"} %llu\n"
            "kvpool_kv_worker_bytes_total{dir=\"loaded\"} %llu\n",
        LD(c->bytes_saved), LD(c->bytes_loaded));
    out(&b, "# HELP kvpool_kv_worker_io_seconds_total Time spent in the pool's put and get calls.\n"
            "# TYPE kvpool_kv_worker_io_seconds_total counter\n"
            "kvpool_kv_worker_io_seconds_total{dir=\"saved\"} %.6f\n"
            "kvpool_kv_worker_io_seconds_total{dir=\"loaded\"} %.6f\n",
        (double)LD(c->save_ns) / 1e9, (double)LD(c->load_ns) / 1e9);
    metric(&b, "save_queue_depth", "gauge", "Save metas queued now.", LD(c->save_queue_depth));
    metric(&b, "save_queue_bytes", "gauge", "Block bytes of the save metas queued now.",
           LD(c->save_queue_bytes));
    metric(&b, "load_queue_depth", "gauge", "Load metas queued now.", LD(c->load_queue_depth));
    *len_p = b.len;
    if (b.len >= buf_size) {
        if (buf_size)
            buf[0] = '\0';
        return KVP_ERR_BUFFER_TOO_SMALL;
    }
    return KVP_OK;
}
