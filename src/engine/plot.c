/*
 * The --plot SVG (report.h kvp__replay_plot_svg): a standalone SVG 1.1
 * document, two panels stacked over one time axis.
 *
 *   (1) hit rate over trace time: the requests binned by arrival into
 *       PLOT_BINS equal bins over [first arrival, last arrival]; a bin's
 *       value is sum(hit_tokens) / sum(prompt_tokens) of its requests;
 *   (2) TTFT p50 per bin (nearest rank over its served requests, through
 *       kvp__replay_ttft_percentiles), on a log scale when the largest value
 *       is more than 100 times the smallest positive one, else linear.
 *
 * One polyline per run and panel (a bin with nothing to show is skipped,
 * so the line bridges it; a run with a single point also gets a dot), the
 * same colour for a run in both panels, a legend beside each panel.
 *
 * Degenerate inputs still make a valid document: no points (empty
 * polylines), one request or all at the same instant (a span of 0 is drawn
 * as one second), all values 0 (a linear axis from 0 to 1).  Every number
 * written goes through fin(), so no "nan" or "inf" reaches the file.
 * Size: about 2 x 60 points x 15 bytes per run, whatever the request count.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/utf8.h"
#include "engine/report.h"

#define PLOT_BINS 60
#define SVG_W 960
#define SVG_H 700
#define PLOT_X0 80.0  /* plot area, both panels */
#define PLOT_X1 760.0
#define LEGEND_X 780.0

typedef struct panel {
    double top, bottom;
} panel_t;

static const panel_t g_panels[2] = {{70.0, 300.0}, {390.0, 620.0}};

static const char *const g_colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                        "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"};
#define NUM_COLOURS (sizeof g_colours / sizeof g_colours[0])

/* One run's binned values. */
typedef struct series {
    double hit[PLOT_BINS], p50[PLOT_BINS];
    bool has_hit[PLOT_BINS], has_p50[PLOT_BINS];
} series_t;

/* A value axis: [lo, hi], linear or log10. */
typedef struct axis {
    double lo, hi;
    bool log;
} axis_t;

static double fin(double v)
{
    return isfinite(v) ? v : 0.0;
}

/* s as XML character data or attribute text: & < > " ' as entities, the
 * control characters XML 1.0 forbids dropped, a byte that is not UTF-8
 * written as U+FFFD, so the document stays well-formed whatever s holds. */
static void xml_text(FILE *f, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n;) {
        size_t k = kvp__utf8_seq_len(s + i, n - i);
        if (k == 0) {
            fputs("\xef\xbf\xbd", f);
            i++;
            continue;
        }
        if (k > 1) {
            fwrite(s + i, 1, k, f);
            i += k;
            continue;
        }
        unsigned char c = (unsigned char)s[i++];
        switch (c) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&apos;", f); break;
        default:
            if (c >= 0x20 || c == '\t')
                fputc(c, f);
            else if (c == '\n' || c == '\r')
                fputc(' ', f);
        }
    }
}

/* 1, 2 or 5 x 10^k, the smallest at or above raw (> 0). */
static double nice_step(double raw)
{
    if (!(raw > 0.0) || !isfinite(raw))
        return 1.0;
    double mag = pow(10.0, floor(log10(raw)));
    double f = raw / mag;
    return (f <= 1.0 ? 1.0 : f <= 2.0 ? 2.0 : f <= 5.0 ? 5.0 : 10.0) * mag;
}

static double axis_frac(const axis_t *a, double v)
{
    double fr;
    if (a->log) {
        double lv = v > a->lo ? log10(v) : log10(a->lo);
        fr = (lv - log10(a->lo)) / (log10(a->hi) - log10(a->lo));
    } else {
        fr = (v - a->lo) / (a->hi - a->lo);
    }
    fr = fin(fr);
    return fr < 0.0 ? 0.0 : fr > 1.0 ? 1.0 : fr;
}

static double axis_y(const panel_t *p, const axis_t *a, double v)
{
    return p->bottom - axis_frac(a, v) * (p->bottom - p->top);
}

static double time_x(double t, double t0, double span)
{
    double fr = fin((t - t0) / span);
    fr = fr < 0.0 ? 0.0 : fr > 1.0 ? 1.0 : fr;
    return PLOT_X0 + fr * (PLOT_X1 - PLOT_X0);
}

/* The TTFT axis from every run's binned p50s (see the essay above). */
static axis_t ttft_axis(const series_t *s, size_t n)
{
    double vmax = 0.0, vmin_pos = 0.0;
    for (size_t r = 0; r < n; r++)
        for (int b = 0; b < PLOT_BINS; b++) {
            if (!s[r].has_p50[b])
                continue;
            double v = s[r].p50[b];
            if (v > vmax)
                vmax = v;
            if (v > 0.0 && (vmin_pos == 0.0 || v < vmin_pos))
                vmin_pos = v;
        }
    axis_t a = {0.0, 1.0, false};
    if (vmin_pos > 0.0 && vmax / vmin_pos > 100.0) {
        a.log = true;
        a.lo = pow(10.0, floor(log10(vmin_pos)));
        a.hi = pow(10.0, ceil(log10(vmax)));
        if (!(a.hi > a.lo))
            a.hi = a.lo * 10.0;
    } else if (vmax > 0.0) {
        double step = nice_step(vmax / 5.0);
        a.hi = ceil(vmax / step) * step;
        if (!(a.hi > 0.0))
            a.hi = 1.0;
    }
    return a;
}

/* Bins run r's points into s: counts and token sums per bin for the hit
 * rate, and the bin's points gathered in tmp (room for num_points) for
 * its TTFT p50. */
static kvp_status_t bin_run(const kvp__replay_run_t *run, double t0, double span, series_t *s,
                            kvp__replay_point_t *tmp)
{
    double num[PLOT_BINS] = {0}, den[PLOT_BINS] = {0};
    size_t count[PLOT_BINS] = {0}, served[PLOT_BINS] = {0}, off[PLOT_BINS + 1];
    const kvp__replay_point_t *pts = run->points;
    size_t n = pts ? run->num_points : 0;
    int *bin_of = NULL;
    if (n > 0) {
        bin_of = kvp__malloc(n * sizeof *bin_of);
        if (!bin_of)
            return KVP_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        bin_of[i] = -1;
        if (!isfinite(pts[i].arrival_s))
            continue;
        double fr = (pts[i].arrival_s - t0) / span * PLOT_BINS;
        int b = fr <= 0.0 ? 0 : fr >= PLOT_BINS - 1 ? PLOT_BINS - 1 : (int)fr;
        bin_of[i] = b;
        num[b] += (double)(pts[i].hit_tokens < pts[i].prompt_tokens ? pts[i].hit_tokens
                                                                     : pts[i].prompt_tokens);
        den[b] += (double)pts[i].prompt_tokens;
        count[b]++;
        served[b] += pts[i].ttft_ms >= 0.0 && isfinite(pts[i].ttft_ms);
    }
    off[0] = 0;
    for (int b = 0; b < PLOT_BINS; b++)
        off[b + 1] = off[b] + count[b];
    size_t fill[PLOT_BINS];
    memcpy(fill, off, sizeof fill);
    for (size_t i = 0; i < n; i++)
        if (bin_of[i] >= 0)
            tmp[fill[bin_of[i]]++] = pts[i];
    if (bin_of)
        kvp__free(bin_of, n * sizeof *bin_of);
    for (int b = 0; b < PLOT_BINS; b++) {
        s->has_hit[b] = den[b] > 0.0;
        s->hit[b] = s->has_hit[b] ? num[b] / den[b] : 0.0;
        s->has_p50[b] = served[b] > 0;
        s->p50[b] = 0.0;
        if (served[b] > 0) {
            kvp_status_t st = kvp__replay_ttft_percentiles(tmp + off[b], count[b], &s->p50[b], NULL);
            if (st != KVP_OK)
                return st;
        }
    }
    return KVP_OK;
}

static void fmt_tick(double v, char *buf, size_t len)
{
    v = fin(v);
    if (fabs(v) < 1e-12)
        v = 0.0;
    snprintf(buf, len, "%.10g", v); /* 1000000, not 1e+06 */
}

static void draw_time_axis(FILE *f, const panel_t *p, double t0, double span)
{
    double step = nice_step(span / 8.0);
    double first = ceil(t0 / step) * step;
    char lab[32];
    for (int k = 0; k < 40; k++) {
        double t = first + k * step;
        if (t > t0 + span * (1.0 + 1e-9))
            break;
        double x = time_x(t, t0, span);
        fmt_tick(t, lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", x,
                p->bottom, x, p->bottom + 5.0);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x,
                p->bottom + 18.0, lab);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">trace time (s)</text>\n",
            (PLOT_X0 + PLOT_X1) / 2.0, p->bottom + 38.0);
}

/* Horizontal grid lines with their labels; pct: labels as percentages. */
static void draw_value_axis(FILE *f, const panel_t *p, const axis_t *a, bool pct,
                            const char *title)
{
    char lab[32];
    for (int k = 0; k < 40; k++) {
        double v;
        if (a->log) {
            v = a->lo * pow(10.0, k);
            if (v > a->hi * (1.0 + 1e-9))
                break;
        } else {
            double step = pct ? 0.2 : nice_step((a->hi - a->lo) / 5.0);
            v = a->lo + k * step;
            if (v > a->hi + step * 1e-9)
                break;
        }
        double y = axis_y(p, a, v);
        if (pct)
            snprintf(lab, sizeof lab, "%.0f %%", 100.0 * v);
        else
            fmt_tick(v, lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n",
                PLOT_X0, y, PLOT_X1, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", PLOT_X0 - 6.0,
                y + 4.0, lab);
    }
    double ym = (p->top + p->bottom) / 2.0;
    fprintf(f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">%s</text>\n",
            PLOT_X0 - 55.0, ym, PLOT_X0 - 55.0, ym, title);
}

static void draw_legend(FILE *f, const panel_t *p, const kvp__replay_run_t *runs, size_t n)
{
    for (size_t r = 0; r < n; r++) {
        double y = p->top + 12.0 + 20.0 * (double)r;
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                "stroke-width=\"2\"%s/>\n",
                LEGEND_X, y, LEGEND_X + 24.0, y, g_colours[r % NUM_COLOURS],
                runs[r].kind == KVP__RUN_NO_POOL ? " stroke-dasharray=\"5,3\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", LEGEND_X + 30.0, y + 4.0);
        xml_text(f, runs[r].label ? runs[r].label : "?");
        fputs("</text>\n", f);
    }
}

/* Run r's line in panel p: the bins that have a value (hit rate or p50). */
static void draw_series(FILE *f, const panel_t *p, const axis_t *a, const series_t *s, bool p50,
                        size_t r, kvp__replay_kind_t kind, double t0, double span)
{
    const char *colour = g_colours[r % NUM_COLOURS];
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", colour,
            kind == KVP__RUN_NO_POOL ? " stroke-dasharray=\"5,3\"" : "");
    int npts = 0;
    double lx = 0.0, ly = 0.0;
    for (int b = 0; b < PLOT_BINS; b++) {
        if (!(p50 ? s->has_p50[b] : s->has_hit[b]))
            continue;
        double x = time_x(t0 + span * (b + 0.5) / PLOT_BINS, t0, span);
        double y = axis_y(p, a, p50 ? s->p50[b] : s->hit[b]);
        fprintf(f, "%s%.1f,%.1f", npts ? " " : "", x, y);
        lx = x;
        ly = y;
        npts++;
    }
    fputs("\"/>\n", f);
    if (npts == 1)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", lx, ly, colour);
}

static void write_svg(FILE *f, const kvp__replay_run_t *runs, size_t n, const series_t *s,
                      const char *title, double t0, double span)
{
    const axis_t hit_axis = {0.0, 1.0, false};
    const axis_t tt_axis = ttft_axis(s, n);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%d\" "
               "height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
            SVG_W, SVG_H, SVG_W, SVG_H);
    fputs("<title>", f);
    xml_text(f, title);
    fputs("</title>\n", f);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", SVG_W, SVG_H);
    fprintf(f, "<text x=\"%.1f\" y=\"30\" text-anchor=\"middle\" font-size=\"16\">",
            SVG_W / 2.0);
    xml_text(f, title);
    fputs("</text>\n", f);
    for (int k = 0; k < 2; k++) {
        const panel_t *p = &g_panels[k];
        const axis_t *a = k == 0 ? &hit_axis : &tt_axis;
        fprintf(f, "<g>\n<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">%s</text>\n", PLOT_X0,
                p->top - 10.0,
                k == 0 ? "prefix hit rate per time bin"
                : tt_axis.log ? "modelled TTFT p50 per time bin (log scale)"
                              : "modelled TTFT p50 per time bin (linear scale)");
        draw_value_axis(f, p, a, k == 0, k == 0 ? "hit rate" : "TTFT p50 (ms)");
        draw_time_axis(f, p, t0, span);
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
                "stroke=\"#888\"/>\n",
                PLOT_X0, p->top, PLOT_X1 - PLOT_X0, p->bottom - p->top);
        for (size_t r = 0; r < n; r++)
            draw_series(f, p, a, &s[r], k == 1, r, runs[r].kind, t0, span);
        draw_legend(f, p, runs, n);
        fputs("</g>\n", f);
    }
    fputs("</svg>\n", f);
}

kvp_status_t kvp__replay_plot_svg(const char *path, const kvp__replay_run_t *runs, size_t n,
                                  const char *title)
{
    if (!path || (n > 0 && !runs))
        return KVP_ERR_NULL_POINTER;
    /* The time span: every run's finite arrivals (the runs replay one trace,
     * so they agree; taking all keeps the panels aligned if not). */
    double t0 = 0.0, t1 = 0.0;
    bool any = false;
    size_t max_pts = 0;
    for (size_t r = 0; r < n; r++) {
        size_t np = runs[r].points ? runs[r].num_points : 0;
        if (np > max_pts)
            max_pts = np;
        for (size_t i = 0; i < np; i++) {
            double t = runs[r].points[i].arrival_s;
            if (!isfinite(t))
                continue;
            if (!any || t < t0)
                t0 = t;
            if (!any || t > t1)
                t1 = t;
            any = true;
        }
    }
    double span = t1 - t0;
    if (!(span > 0.0) || !isfinite(span))
        span = 1.0;

    kvp_status_t st = KVP_OK;
    series_t *s = n ? kvp__calloc(n, sizeof *s) : NULL;
    kvp__replay_point_t *tmp = max_pts ? kvp__malloc(max_pts * sizeof *tmp) : NULL;
    if ((n && !s) || (max_pts && !tmp)) {
        st = KVP_ERR_NO_MEMORY;
        goto out_free;
    }
    for (size_t r = 0; r < n && st == KVP_OK; r++)
        st = bin_run(&runs[r], t0, span, &s[r], tmp);
    if (st != KVP_OK)
        goto out_free;

    FILE *f = fopen(path, "w");
    if (!f) {
        kvp_error("replay: cannot write the plot %s: %s", path, strerror(errno));
        st = KVP_ERR_IO;
        goto out_free;
    }
    write_svg(f, runs, n, s, title ? title : "kvpool replay", t0, span);
    int werr = ferror(f);
    if (fclose(f) != 0 || werr) {
        kvp_error("replay: writing the plot %s failed: %s", path, strerror(errno));
        st = KVP_ERR_IO;
    }
out_free:
    if (tmp)
        kvp__free(tmp, max_pts * sizeof *tmp);
    if (s)
        kvp__free(s, n * sizeof *s);
    return st;
}
