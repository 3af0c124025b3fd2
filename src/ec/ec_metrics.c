/*
 * The EC worker's metrics page (kvp_ec_worker_metrics): every figure of
 * kvp_ec_worker_stats as Prometheus text, so what peers hold in a worker
 * (reservations and their bytes, push connections, reserves waiting on the
 * cross-encoder cache's pool) can be watched where the worker runs
 * (`kvpool epd-node --metrics-port`, or a host program's own endpoint).
 */
#include <stddef.h>
#include <stdio.h>

#include "common/prom.h"
#include "kvpool/ec_connector.h"

typedef enum { COUNTER, GAUGE, SECONDS } kind_t; /* SECONDS: a counter of ns, shown in seconds */

typedef struct {
    const char *name, *help;
    size_t off;
    kind_t kind;
} series_t;

#define S(field, gauge, help) {"kvpool_ec_" #field, help, offsetof(kvp_ec_worker_stats_t, field), gauge ? GAUGE : COUNTER}
#define T(field, name, help) {"kvpool_ec_" name, help, offsetof(kvp_ec_worker_stats_t, field), SECONDS}

static const series_t g_series[] = {
    S(reservations_active, 1, "Consumer reservations open now (reserved, writing or ready)."),
    S(bytes_reserved, 1, "Bytes of the receive pool those reservations hold."),
    S(tombstones, 1, "Ended transfer ids remembered (duplicate detection)."),
    S(residents, 1, "Encoder outputs resident in the receive pool."),
    S(resident_bytes, 1, "Bytes those residents hold."),
    S(push_conns_open, 1, "Producer connections to the push data port open now."),
    S(pushes_pending, 1, "Producer transfers not finished yet."),
    S(stage_capacity, 1, "Bytes of the producer's staging slab (0: none, copies go to the heap)."),
    S(stage_bytes, 1, "Bytes of encoder outputs the producer holds in its staging slab now."),
    S(stage_heap_bytes, 1, "Bytes of encoder outputs the producer holds on the heap now (did not fit the slab)."),
    S(cross_cache_parked, 1, "Reserves waiting now for their cross-encoder cache lookup."),
    S(reserves, 0, "Reserves answered."),
    S(reserves_cached, 0, "Reserves answered cached (no write needed)."),
    S(reserves_full, 0, "Reserves refused: the receive pool is full."),
    S(reserves_capped, 0, "Reserves refused: the peer is at its cap."),
    S(completes, 0, "Completes accepted."),
    S(cancels, 0, "Cancels accepted."),
    S(takes, 0, "Pushed outputs taken into the encoder cache."),
    S(takes_failed, 0, "Takes of outputs that were not ready."),
    S(expired, 0, "Reservations ended by their lease."),
    S(reclaimed, 0, "Unpinned residents evicted to make room in the receive pool."),
    S(writers_abandoned, 0, "Reservations ended because their writer never completed nor abandoned."),
    S(events_sent, 0, "Readiness events sent."),
    S(events_dropped, 0, "Readiness events dropped (the queue was full: the oldest went)."),
    S(control_requests, 0, "Control requests received."),
    S(control_errors, 0, "Control requests answered with an error."),
    T(control_busy_ns, "control_busy_seconds", "Time the control server spent serving requests (received to replied)."),
    S(reserve_requests, 0, "Reserve and reserve_batch requests served."),
    T(reserve_busy_ns, "reserve_busy_seconds", "Time the control server spent serving reserve requests."),
    T(reserve_cpu_ns, "reserve_cpu_seconds", "CPU time the control server's thread used serving reserve requests."),
    S(push_writes, 0, "Writes received on the push data port."),
    S(push_bytes, 0, "Bytes received on the push data port."),
    S(push_bad_headers, 0, "Push frames refused before any byte moved."),
    S(cross_cache_hits, 0, "Reserves answered from the cross-encoder cache's pool."),
    S(cross_cache_misses, 0, "Cross-encoder cache lookups that missed."),
    S(cross_cache_skipped, 0, "Cross-encoder cache lookups skipped (pool backing off, or at the cap)."),
    S(cross_cache_errors, 0, "Cross-encoder cache lookups that failed."),
    S(cross_cache_bytes, 0, "Bytes copied in from the cross-encoder cache's pool."),
    S(pushes, 0, "Producer transfers done."),
    S(pushes_cached, 0, "Producer transfers done without a write: every shard had the output."),
    S(pushes_failed, 0, "Producer transfers failed."),
    S(pushes_retryable, 0, "Producer transfers failed with a retryable error."),
    S(bytes_pushed, 0, "Bytes the producer wrote into reserved slots."),
    S(cross_cache_puts, 0, "Encoder outputs the producer put into the cross-encoder cache's pool."),
    S(stage_copies, 0, "Encoder outputs the producer copied to hold until pushed."),
    S(stage_fallbacks, 0, "Of those copies, the ones that did not fit the staging slab (on the heap)."),
};

#define MAX_WORKERS 64

kvp_status_t kvp_ec_worker_metrics(kvp_ec_worker_t *const *w, size_t n, char *buf, size_t buf_size, size_t *len_p)
{
    if (!w || !len_p || (!buf && buf_size))
        return KVP_ERR_NULL_POINTER;
    if (n == 0 || n > MAX_WORKERS)
        return KVP_ERR_INVALID_ARG;
    kvp_ec_worker_stats_t st[MAX_WORKERS];
    for (size_t r = 0; r < n; r++) {
        if (!w[r])
            return KVP_ERR_NULL_POINTER;
        st[r] = (kvp_ec_worker_stats_t){.size = sizeof st[r]};
        kvp_ec_worker_stats(w[r], &st[r]);
    }
    kvp__prom_t b = {buf, buf_size, 0};
    for (size_t i = 0; i < sizeof g_series / sizeof g_series[0]; i++) {
        const series_t *s = &g_series[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", s->name, s->kind == GAUGE ? "" : "_total");
        kvp__prom_head(&b, name, s->kind == GAUGE ? "gauge" : "counter", s->help);
        for (size_t r = 0; r < n; r++) {
            uint64_t v = *(const uint64_t *)(const void *)((const char *)&st[r] + s->off);
            if (s->kind == SECONDS)
                kvp__prom_printf(&b, "%s{rank=\"%zu\"} %.9f\n", name, r, (double)v / 1e9);
            else
                kvp__prom_printf(&b, "%s{rank=\"%zu\"} %llu\n", name, r, (unsigned long long)v);
        }
    }
    *len_p = b.len;
    return b.len < buf_size ? KVP_OK : KVP_ERR_BUFFER_TOO_SMALL;
}
