/*
 * What a replay prints: the final table, the --json line, the --plot SVG and
 * the progress bar.  The replay (src/engine/replay.c) fills one
 * kvp__replay_run_t per run of the same trace (with the pool, with the pool
 * under load_policy=faster, without the pool) and hands them here; nothing
 * here knows how they were measured.
 */
#ifndef KVP_ENGINE_REPORT_H
#define KVP_ENGINE_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool/status.h"

/* One request's outcome in one run (trace order). */
typedef struct kvp__replay_point {
    double arrival_s;        /* trace time of arrival */
    double ttft_ms;          /* modelled time to first token; < 0: never served (rejected) */
    uint32_t prompt_tokens;
    uint32_t hit_tokens;     /* local prefix-cache hit + tokens loaded from the pool */
} kvp__replay_point_t;

typedef enum kvp__replay_kind {
    KVP__RUN_POOL = 0,       /* the connector on, load_policy=always */
    KVP__RUN_POOL_FASTER,    /* the connector on, load_policy=faster */
    KVP__RUN_NO_POOL,        /* the connector off */
} kvp__replay_kind_t;

typedef struct kvp__replay_run {
    kvp__replay_kind_t kind;
    const char *label;       /* "pool", "pool (faster)", "no pool" */
    uint64_t requests;       /* served */
    uint64_t rejected;       /* longer than an instance's KV cache */
    uint64_t prompt_tokens;
    uint64_t local_hit_tokens;
    uint64_t pool_hit_tokens;
    uint64_t bound_hit_tokens; /* the trace's infinite-cache bound (same for every run) */
    uint64_t blocks_loaded;
    uint64_t blocks_verified;
    uint64_t corruptions;
    uint64_t load_errors;    /* blocks */
    uint64_t save_errors;    /* blocks */
    uint64_t lookup_errors;  /* lookups answered 0 for an error or a timeout */
    uint64_t preemptions;
    uint64_t evictions;      /* pool objects evicted during the run */
    uint64_t bytes_saved, bytes_loaded;
    uint64_t steps;          /* engine steps, all instances */
    double ttft_p50_ms, ttft_p99_ms;
    double virtual_s;        /* modelled time from the first arrival to the last token */
    double wall_s;           /* real time of the run */
    double modelled_gbps;    /* the link (GB/s) the I/O is modelled on */
    double measured_gbps;    /* bytes saved + loaded / the workers' time in put and get calls */
    const kvp__replay_point_t *points; /* requests entries, trace order */
    size_t num_points;
} kvp__replay_run_t;

/* Fractions in [0, 1] (0 when prompt_tokens is 0). */
double kvp__replay_hit_rate(const kvp__replay_run_t *r);
double kvp__replay_bound_rate(const kvp__replay_run_t *r);

/* Percentile q in [0, 1] of the served requests' ttft_ms (nearest rank on a
 * sorted copy; 0 when there is none).  Returns KVP_OK or KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__replay_ttft_percentiles(const kvp__replay_point_t *pts, size_t n, double *p50_p,
                                          double *p99_p);

/* The final table: one column per run, one row per figure (requests, prompt
 * tokens, local hit tokens, pool hit tokens, "hit rate" next to the bound,
 * bytes saved and loaded, blocks loaded and "verified", corruptions, load
 * errors, preemptions, pool evictions, TTFT p50/p99, steps, wall time,
 * requests/s, GB/s measured vs modelled). */
void kvp__replay_print_table(FILE *out, const kvp__replay_run_t *runs, size_t n);

/* The --json line: one compact object (and a newline) with the fields of
 * the issue, from the first KVP__RUN_POOL run and the KVP__RUN_NO_POOL run
 * (ttft_*_no_pool), plus ttft_p50_ms_faster / ttft_p99_ms_faster when a
 * faster run is there.  Numbers only (no NaN/Inf). */
void kvp__replay_print_json(FILE *out, const kvp__replay_run_t *runs, size_t n);

/* The --plot SVG: hit rate and TTFT p50 over trace time (binned), one line
 * per run, axes labelled, self-contained (no scripts or external files).
 * Returns KVP_OK; KVP_ERR_IO (cannot write; logged); KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__replay_plot_svg(const char *path, const kvp__replay_run_t *runs, size_t n,
                                  const char *title);

/* The progress bar on stderr (only when stderr is a terminal; else every
 * call is a no-op).  update: at most ~5 redraws a second. */
typedef struct kvp__progress {
    bool tty;
    const char *label;
    uint64_t total;
    uint64_t t0_ns, last_ns;
} kvp__progress_t;
void kvp__progress_start(kvp__progress_t *p, const char *label, uint64_t total);
void kvp__progress_update(kvp__progress_t *p, uint64_t done, double hit_rate);
void kvp__progress_end(kvp__progress_t *p);

#endif
