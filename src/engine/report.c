/*
 * What a replay prints (report.h): the rates and percentiles, the final
 * table, the --json line and the progress bar.  The SVG is plot.c.
 *
 * Every figure printed here comes from the kvp__replay_run_t the replay
 * filled; nothing is measured here.  Numbers that reach the JSON line are
 * finite by construction (a NaN or an infinity becomes 0), so the line is
 * always valid JSON whatever the replay measured.
 */
#include "engine/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/log.h"
#include "common/units.h"

static double ratio01(uint64_t num, uint64_t den)
{
    if (den == 0)
        return 0.0;
    double r = (double)num / (double)den;
    return r < 0.0 ? 0.0 : r > 1.0 ? 1.0 : r;
}

double kvp__replay_hit_rate(const kvp__replay_run_t *r)
{
    return ratio01(r->local_hit_tokens + r->pool_hit_tokens, r->prompt_tokens);
}

double kvp__replay_bound_rate(const kvp__replay_run_t *r)
{
    return ratio01(r->bound_hit_tokens, r->prompt_tokens);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest value with at least q of the values at or
 * below it, i.e. sorted[ceil(q * n) - 1] (the first one for q = 0).  The
 * 1e-9 keeps q * n = 198.00000000000003 (0.99 is not exact) at rank 198. */
static double nearest_rank(const double *sorted, size_t n, double q)
{
    size_t rank = (size_t)ceil(q * (double)n - 1e-9);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

kvp_status_t kvp__replay_ttft_percentiles(const kvp__replay_point_t *pts, size_t n, double *p50_p,
                                          double *p99_p)
{
    double p50 = 0.0, p99 = 0.0;
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += pts[i].ttft_ms >= 0.0 && isfinite(pts[i].ttft_ms);
    if (m > 0) {
        double *v = kvp__malloc(m * sizeof *v);
        if (!v)
            return KVP_ERR_NO_MEMORY;
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            if (pts[i].ttft_ms >= 0.0 && isfinite(pts[i].ttft_ms))
                v[k++] = pts[i].ttft_ms;
        qsort(v, m, sizeof *v, cmp_double);
        p50 = nearest_rank(v, m, 0.50);
        p99 = nearest_rank(v, m, 0.99);
        kvp__free(v, m * sizeof *v);
    }
    if (p50_p)
        *p50_p = p50;
    if (p99_p)
        *p99_p = p99;
    return KVP_OK;
}

/* ---- the table ----
 *
 * One row per figure, one right-aligned column per run under its label.
 * The label column is 26 wide and a run column max(14, label) + 2, so three
 * runs ("pool", "pool (faster)", "no pool") fit in 26 + 3 * 16 = 74
 * columns, leaving room for the bound written after the hit-rate row. */

#define TABLE_LABEL_W 26
#define TABLE_CELL_MIN 14
#define CELL_LEN 48

typedef void (*cell_fn)(const kvp__replay_run_t *r, char *buf, size_t len);

/* 145123456 -> "145,123,456". */
static void fmt_count(uint64_t v, char *buf, size_t len)
{
    char digits[32];
    int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
    char tmp[48];
    size_t o = 0;
    for (int i = 0; i < nd; i++) {
        if (i > 0 && (nd - i) % 3 == 0)
            tmp[o++] = ',';
        tmp[o++] = digits[i];
    }
    tmp[o] = '\0';
    snprintf(buf, len, "%s", tmp);
}

static double finite_or_0(double v)
{
    return isfinite(v) ? v : 0.0;
}

static void fmt_ms(double ms, char *buf, size_t len)
{
    ms = finite_or_0(ms);
    snprintf(buf, len, fabs(ms) < 10.0 ? "%.2f" : "%.1f", ms);
}

static void fmt_pct(double frac, char *buf, size_t len)
{
    snprintf(buf, len, "%.1f %%", 100.0 * finite_or_0(frac));
}

#define COUNT_CELL(name, field)                                                 \
    static void cell_##name(const kvp__replay_run_t *r, char *buf, size_t len) \
    {                                                                           \
        fmt_count(r->field, buf, len);                                          \
    }
COUNT_CELL(requests, requests)
COUNT_CELL(rejected, rejected)
COUNT_CELL(prompt, prompt_tokens)
COUNT_CELL(local_hit, local_hit_tokens)
COUNT_CELL(pool_hit, pool_hit_tokens)
COUNT_CELL(blocks_loaded, blocks_loaded)
COUNT_CELL(blocks_verified, blocks_verified)
COUNT_CELL(corruptions, corruptions)
COUNT_CELL(load_errors, load_errors)
COUNT_CELL(save_errors, save_errors)
COUNT_CELL(lookup_errors, lookup_errors)
COUNT_CELL(preemptions, preemptions)
COUNT_CELL(evictions, evictions)
COUNT_CELL(steps, steps)

static void cell_hit_rate(const kvp__replay_run_t *r, char *buf, size_t len)
{
    fmt_pct(kvp__replay_hit_rate(r), buf, len);
}

static void cell_of_bound(const kvp__replay_run_t *r, char *buf, size_t len)
{
    double bound = kvp__replay_bound_rate(r);
    if (bound <= 0.0)
        snprintf(buf, len, "-");
    else
        fmt_pct(kvp__replay_hit_rate(r) / bound, buf, len);
}

static void cell_bytes_saved(const kvp__replay_run_t *r, char *buf, size_t len)
{
    kvp__format_size(r->bytes_saved, buf, (int)len);
}

static void cell_bytes_loaded(const kvp__replay_run_t *r, char *buf, size_t len)
{
    kvp__format_size(r->bytes_loaded, buf, (int)len);
}

static void cell_p50(const kvp__replay_run_t *r, char *buf, size_t len)
{
    fmt_ms(r->ttft_p50_ms, buf, len);
}

static void cell_p99(const kvp__replay_run_t *r, char *buf, size_t len)
{
    fmt_ms(r->ttft_p99_ms, buf, len);
}

static void cell_virtual(const kvp__replay_run_t *r, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f", finite_or_0(r->virtual_s));
}

static void cell_wall(const kvp__replay_run_t *r, char *buf, size_t len)
{
    snprintf(buf, len, "%.2f", finite_or_0(r->wall_s));
}

static void cell_rps(const kvp__replay_run_t *r, char *buf, size_t len)
{
    double w = finite_or_0(r->wall_s);
    snprintf(buf, len, "%.1f", w > 0.0 ? (double)r->requests / w : 0.0);
}

static void cell_gbps(const kvp__replay_run_t *r, char *buf, size_t len)
{
    if (r->bytes_loaded + r->bytes_saved == 0)
        snprintf(buf, len, "-");
    else
        snprintf(buf, len, "%.*f / %.*f", r->measured_gbps < 1000.0 ? 2 : 0,
                 finite_or_0(r->measured_gbps), r->modelled_gbps < 1000.0 ? 2 : 0,
                 finite_or_0(r->modelled_gbps));
}

typedef struct table_row {
    const char *label;
    cell_fn cell;
    bool only_if_nonzero; /* printed only when some run's cell is not "0" */
} table_row_t;

static const table_row_t g_rows[] = {
    {"requests", cell_requests, false},
    {"rejected (too long)", cell_rejected, true},
    {"prompt tokens", cell_prompt, false},
    {"local hit tokens", cell_local_hit, false},
    {"pool hit tokens", cell_pool_hit, false},
    {"hit rate", cell_hit_rate, false},
    {"  share of the bound", cell_of_bound, false},
    {"bytes saved", cell_bytes_saved, false},
    {"bytes loaded", cell_bytes_loaded, false},
    {"blocks loaded", cell_blocks_loaded, false},
    {"blocks verified", cell_blocks_verified, false},
    {"corruptions", cell_corruptions, false},
    {"load errors", cell_load_errors, false},
    {"save errors", cell_save_errors, false},
    {"lookup errors", cell_lookup_errors, false},
    {"preemptions", cell_preemptions, false},
    {"pool evictions", cell_evictions, false},
    {"TTFT p50 (ms)", cell_p50, false},
    {"TTFT p99 (ms)", cell_p99, false},
    {"steps", cell_steps, false},
    {"modelled time (s)", cell_virtual, false},
    {"wall time (s)", cell_wall, false},
    {"requests/s (wall)", cell_rps, false},
    {"GB/s measured / modelled", cell_gbps, false},
};

static int cell_width(const kvp__replay_run_t *r)
{
    size_t w = r->label ? strlen(r->label) : 0;
    return (int)(w > TABLE_CELL_MIN ? w : TABLE_CELL_MIN) + 2;
}

void kvp__replay_print_table(FILE *out, const kvp__replay_run_t *runs, size_t n)
{
    if (n == 0) {
        fprintf(out, "(no runs)\n");
        return;
    }
    char cell[CELL_LEN];
    fprintf(out, "%-*s", TABLE_LABEL_W, "");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%*s", cell_width(&runs[i]), runs[i].label ? runs[i].label : "?");
    fputc('\n', out);
    int total_w = TABLE_LABEL_W;
    for (size_t i = 0; i < n; i++)
        total_w += cell_width(&runs[i]);
    for (int i = 0; i < total_w; i++)
        fputc('-', out);
    fputc('\n', out);
    for (size_t k = 0; k < sizeof g_rows / sizeof g_rows[0]; k++) {
        const table_row_t *row = &g_rows[k];
        if (row->only_if_nonzero) {
            bool any = false;
            for (size_t i = 0; i < n && !any; i++) {
                row->cell(&runs[i], cell, sizeof cell);
                any = strcmp(cell, "0") != 0;
            }
            if (!any)
                continue;
        }
        fprintf(out, "%-*s", TABLE_LABEL_W, row->label);
        for (size_t i = 0; i < n; i++) {
            row->cell(&runs[i], cell, sizeof cell);
            fprintf(out, "%*s", cell_width(&runs[i]), cell);
        }
        /* The bound is the trace's, the same for every run: once, after
         * the hit rates. */
        if (row->cell == cell_hit_rate) {
            fmt_pct(kvp__replay_bound_rate(&runs[0]), cell, sizeof cell);
            fprintf(out, "   bound %s", cell);
        }
        fputc('\n', out);
    }
}

/* ---- the --json line ---- */

static void jw_key(kvp__jw_t *b, const char *key)
{
    kvp__jw_puts(b, b->len > 1 ? ",\"" : "\"");
    kvp__jw_puts(b, key);
    kvp__jw_puts(b, "\":");
}

static void jw_u64(kvp__jw_t *b, const char *key, uint64_t v)
{
    jw_key(b, key);
    kvp__jw_int(b, v > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)v);
}

/* A double as a JSON float: finite (NaN and infinities become 0), 9
 * significant digits (1e-9 relative), always with a '.' or an exponent so
 * that a reader sees a float, never an int. */
static void jw_double(kvp__jw_t *b, const char *key, double v)
{
    char num[40];
    int len = snprintf(num, sizeof num, "%.9g", finite_or_0(v));
    if (len > 0 && (size_t)len < sizeof num - 2 && !strpbrk(num, ".eE"))
        memcpy(num + len, ".0", 3);
    jw_key(b, key);
    kvp__jw_puts(b, num);
}

static const kvp__replay_run_t *find_kind(const kvp__replay_run_t *runs, size_t n,
                                          kvp__replay_kind_t kind)
{
    for (size_t i = 0; i < n; i++)
        if (runs[i].kind == kind)
            return &runs[i];
    return NULL;
}

void kvp__replay_print_json(FILE *out, const kvp__replay_run_t *runs, size_t n)
{
    static const kvp__replay_run_t none;
    const kvp__replay_run_t *p = find_kind(runs, n, KVP__RUN_POOL);
    if (!p)
        p = n > 0 ? &runs[0] : &none;
    const kvp__replay_run_t *np = find_kind(runs, n, KVP__RUN_NO_POOL);
    const kvp__replay_run_t *fast = find_kind(runs, n, KVP__RUN_POOL_FASTER);
    double wall_s = 0.0;
    for (size_t i = 0; i < n; i++)
        wall_s += finite_or_0(runs[i].wall_s);

    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, "{");
    jw_u64(&b, "requests", p->requests);
    jw_u64(&b, "prompt_tokens", p->prompt_tokens);
    jw_u64(&b, "local_hit_tokens", p->local_hit_tokens);
    jw_u64(&b, "pool_hit_tokens", p->pool_hit_tokens);
    jw_double(&b, "hit_rate", kvp__replay_hit_rate(p));
    jw_double(&b, "bound_hit_rate", kvp__replay_bound_rate(p));
    jw_u64(&b, "blocks_loaded", p->blocks_loaded);
    jw_u64(&b, "blocks_verified", p->blocks_verified);
    jw_u64(&b, "corruptions", p->corruptions);
    jw_u64(&b, "load_errors", p->load_errors);
    jw_u64(&b, "preemptions", p->preemptions);
    jw_u64(&b, "evictions", p->evictions);
    jw_u64(&b, "bytes_saved", p->bytes_saved);
    jw_u64(&b, "bytes_loaded", p->bytes_loaded);
    jw_double(&b, "ttft_p50_ms", p->ttft_p50_ms);
    jw_double(&b, "ttft_p50_ms_no_pool", np ? np->ttft_p50_ms : 0.0);
    jw_double(&b, "ttft_p99_ms", p->ttft_p99_ms);
    jw_double(&b, "ttft_p99_ms_no_pool", np ? np->ttft_p99_ms : 0.0);
    jw_double(&b, "wall_s", wall_s);
    jw_u64(&b, "save_errors", p->save_errors);
    jw_u64(&b, "lookup_errors", p->lookup_errors);
    jw_u64(&b, "rejected", p->rejected);
    jw_u64(&b, "steps", p->steps);
    jw_double(&b, "virtual_s", p->virtual_s);
    jw_double(&b, "measured_gbps", p->measured_gbps);
    jw_double(&b, "modelled_gbps", p->modelled_gbps);
    if (fast) {
        jw_double(&b, "ttft_p50_ms_faster", fast->ttft_p50_ms);
        jw_double(&b, "ttft_p99_ms_faster", fast->ttft_p99_ms);
    }
    kvp__jw_puts(&b, "}\n");
    if (b.oom)
        kvp_error("replay: out of memory writing the JSON line");
    else
        fwrite(b.p, 1, b.len, out);
    kvp__jw_cleanup(&b);
}

/* ---- the progress bar ----
 *
 * One line on stderr, redrawn in place with '\r' and cleared to its end
 * with ESC [ K (every terminal kvpool runs on knows it):
 *
 *   replay pool [###########.........]  5400/12000  hit 61.9 %  12 s  ETA 15 s
 *
 * Redrawn at most every 200 ms (and always for done == total, so the last
 * picture is complete); last_ns == 0 means nothing is drawn yet. */

#define PROGRESS_BAR_W 24
#define PROGRESS_MIN_NS 200000000ull

static void fmt_secs(double s, char *buf, size_t len)
{
    s = finite_or_0(s);
    if (s < 0.0)
        s = 0.0;
    if (s < 60.0)
        snprintf(buf, len, "%.0f s", s);
    else if (s < 360000.0)
        snprintf(buf, len, "%dm%02ds", (int)(s / 60.0), (int)fmod(s, 60.0));
    else
        snprintf(buf, len, "%.0f h", s / 3600.0);
}

void kvp__progress_start(kvp__progress_t *p, const char *label, uint64_t total)
{
    memset(p, 0, sizeof *p);
    p->tty = isatty(2) == 1;
    p->label = label ? label : "";
    p->total = total;
    p->t0_ns = kvp__now_ns();
}

void kvp__progress_update(kvp__progress_t *p, uint64_t done, double hit_rate)
{
    if (!p->tty)
        return;
    uint64_t now = kvp__now_ns();
    if (p->last_ns != 0 && now - p->last_ns < PROGRESS_MIN_NS && done < p->total)
        return;
    p->last_ns = now ? now : 1;
    if (done > p->total)
        done = p->total;
    int fill = p->total ? (int)((double)done / (double)p->total * PROGRESS_BAR_W) : PROGRESS_BAR_W;
    char bar[PROGRESS_BAR_W + 1];
    for (int i = 0; i < PROGRESS_BAR_W; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[PROGRESS_BAR_W] = '\0';
    double elapsed = (double)(now - p->t0_ns) / 1e9;
    char el[24], eta[24];
    fmt_secs(elapsed, el, sizeof el);
    if (done > 0)
        fmt_secs(elapsed * (double)(p->total - done) / (double)done, eta, sizeof eta);
    else
        snprintf(eta, sizeof eta, "?");
    double hr = finite_or_0(hit_rate);
    fprintf(stderr, "\r%s [%s] %llu/%llu  hit %.1f %%  %s  ETA %s\033[K", p->label, bar,
            (unsigned long long)done, (unsigned long long)p->total, 100.0 * hr, el, eta);
    fflush(stderr);
}

void kvp__progress_end(kvp__progress_t *p)
{
    if (p->tty && p->last_ns != 0) {
        fputc('\n', stderr);
        fflush(stderr);
    }
    p->last_ns = 0;
}
