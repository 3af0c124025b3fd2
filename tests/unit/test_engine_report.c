/* Unit tests of src/engine/report.c and plot.c: what `kvpool replay` prints
 * (the rates, the TTFT percentiles, the table, the --json line, the --plot
 * SVG and the progress bar), from runs filled here by hand. */
#include <ctype.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/json.h"
#include "engine/report.h"
#include "test.h"

/* ---- helpers ---- */

/* What fn(out, runs, n) writes, NUL-terminated (free with free()). */
static char *capture(void (*fn)(FILE *, const kvp__replay_run_t *, size_t),
                     const kvp__replay_run_t *runs, size_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ASSERT(f != NULL);
    fn(f, runs, n);
    ASSERT_EQ(fclose(f), 0);
    return buf;
}

static char *read_all(const char *path, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    ASSERT(f != NULL);
    ASSERT_EQ(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    ASSERT_GE(len, 0);
    rewind(f);
    char *buf = malloc((size_t)len + 1);
    ASSERT(buf != NULL);
    ASSERT_EQ(fread(buf, 1, (size_t)len, f), (size_t)len);
    buf[len] = '\0';
    fclose(f);
    if (len_p)
        *len_p = (size_t)len;
    return buf;
}

static size_t count_of(const char *hay, const char *needle)
{
    size_t c = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
        c++;
    return c;
}

static bool contains_ci(const char *hay, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *p = hay; *p; p++)
        if (strncasecmp(p, needle, n) == 0)
            return true;
    return false;
}

static bool rel_close(double got, double want)
{
    double tol = 1e-6 * fmax(fabs(want), 1e-300);
    return fabs(got - want) <= tol || (want == 0.0 && got == 0.0);
}

/* Well-formed enough for a browser: tags nest and close, attribute values
 * are quoted, '&' only starts an entity, '<' only starts markup, and the
 * document is one root element after an optional XML declaration. */
static void assert_well_formed_xml(const char *s)
{
    const char *stack[64];
    size_t depth = 0, roots = 0;
    const char *p = s;
    if (strncmp(p, "<?xml", 5) == 0) {
        p = strstr(p, "?>");
        ASSERT(p != NULL);
        p += 2;
    }
    while (*p) {
        if (*p == '&') {
            ASSERT_MSG(strncmp(p, "&amp;", 5) == 0 || strncmp(p, "&lt;", 4) == 0 ||
                           strncmp(p, "&gt;", 4) == 0 || strncmp(p, "&quot;", 6) == 0 ||
                           strncmp(p, "&apos;", 6) == 0,
                       "a bare '&' at offset %td", p - s);
            p++;
            continue;
        }
        if (*p == '>') /* a '>' in text is legal XML but never written raw by us */
            KVP__FAIL("a raw '>' in text at offset %td", p - s);
        if (*p != '<') {
            ASSERT_MSG(depth > 0 || isspace((unsigned char)*p), "text outside the root at %td",
                       p - s);
            p++;
            continue;
        }
        bool closing = p[1] == '/';
        const char *name = p + (closing ? 2 : 1);
        size_t nl = strcspn(name, " \t\n/>");
        ASSERT_MSG(nl > 0, "an empty tag name at offset %td", p - s);
        const char *q = name + nl;
        while (*q && *q != '>') { /* attributes: name="value" */
            if (*q == '"') {
                const char *end = strchr(q + 1, '"');
                ASSERT(end != NULL);
                ASSERT_MSG(memchr(q + 1, '<', (size_t)(end - q - 1)) == NULL,
                           "a '<' in an attribute at %td", q - s);
                q = end;
            }
            q++;
        }
        ASSERT_MSG(*q == '>', "an unterminated tag at offset %td", p - s);
        bool empty = q[-1] == '/';
        if (closing) {
            ASSERT_MSG(depth > 0, "a closing tag with nothing open at %td", p - s);
            depth--;
            ASSERT_MSG(strncmp(stack[depth], name, nl) == 0 && !isalnum((unsigned char)stack[depth][nl]),
                       "mismatched closing tag at offset %td", p - s);
        } else if (!empty) {
            if (depth == 0)
                roots++;
            ASSERT(depth < 64);
            stack[depth++] = name;
        } else if (depth == 0) {
            roots++;
        }
        p = q + 1;
    }
    ASSERT_EQ(depth, 0);
    ASSERT_EQ(roots, 1);
}

static char g_svg_path[64];

/* Plots runs to a temp file, checks what every SVG must be, returns the text. */
static char *plot(const kvp__replay_run_t *runs, size_t n, const char *title, size_t *len_p)
{
    snprintf(g_svg_path, sizeof g_svg_path, "/tmp/kvp_test_report_%d.svg", (int)getpid());
    uint64_t in_use = kvp__alloc_bytes_in_use();
    ASSERT_OK(kvp__replay_plot_svg(g_svg_path, runs, n, title));
    ASSERT_EQ(kvp__alloc_bytes_in_use(), in_use); /* nothing kept or leaked */
    char *svg = read_all(g_svg_path, len_p);
    unlink(g_svg_path);
    ASSERT(strncmp(svg, "<?xml", 5) == 0 || strncmp(svg, "<svg", 4) == 0);
    ASSERT(strstr(svg, "<svg xmlns=\"http://www.w3.org/2000/svg\"") != NULL);
    size_t len = strlen(svg);
    ASSERT(len > 7 && strcmp(svg + len - 7, "</svg>\n") == 0);
    ASSERT_MSG(!contains_ci(svg, "nan") && !contains_ci(svg, "inf"), "a NaN or an infinity in the SVG");
    ASSERT_EQ(count_of(svg, "<polyline"), 2 * n);
    assert_well_formed_xml(svg);
    return svg;
}

/* Three runs of one trace of np requests, arrivals 0.5 s apart. */
typedef struct fixture {
    kvp__replay_run_t runs[3];
    kvp__replay_point_t *pts[3];
    size_t np;
} fixture_t;

static void fixture_init(fixture_t *fx, size_t np)
{
    static const char *labels[3] = {"pool", "pool (faster)", "no pool"};
    static const kvp__replay_kind_t kinds[3] = {KVP__RUN_POOL, KVP__RUN_POOL_FASTER, KVP__RUN_NO_POOL};
    memset(fx, 0, sizeof *fx);
    fx->np = np;
    for (int r = 0; r < 3; r++) {
        fx->pts[r] = calloc(np ? np : 1, sizeof(kvp__replay_point_t));
        ASSERT(fx->pts[r] != NULL);
        for (size_t i = 0; i < np; i++) {
            kvp__replay_point_t *pt = &fx->pts[r][i];
            pt->arrival_s = 0.5 * (double)i;
            pt->prompt_tokens = 1000 + (uint32_t)(i % 7) * 100;
            pt->hit_tokens = r == 2 ? (uint32_t)(i % 3) * 16 : pt->prompt_tokens / 2 + (uint32_t)(i % 5) * 10;
            pt->ttft_ms = (r == 2 ? 40.0 : 12.0) + (double)(i % 11);
        }
        kvp__replay_run_t *run = &fx->runs[r];
        run->kind = kinds[r];
        run->label = labels[r];
        run->points = fx->pts[r];
        run->num_points = np;
        run->requests = np;
    }
}

static void fixture_cleanup(fixture_t *fx)
{
    for (int r = 0; r < 3; r++)
        free(fx->pts[r]);
}

/* ---- rates and percentiles ---- */

TEST(test_percentiles_are_nearest_rank_over_served_requests)
{
    kvp__replay_point_t pts[6] = {{.ttft_ms = 5}, {.ttft_ms = 1}, {.ttft_ms = 4},
                                  {.ttft_ms = -1}, {.ttft_ms = 2}, {.ttft_ms = 3}};
    double p50 = -7, p99 = -7;
    /* served {1,2,3,4,5}: p50 = rank ceil(2.5) = 3 -> 3; p99 = rank ceil(4.95) = 5 -> 5 */
    ASSERT_OK(kvp__replay_ttft_percentiles(pts, 6, &p50, &p99));
    ASSERT(p50 == 3.0 && p99 == 5.0);

    kvp__replay_point_t many[200];
    for (int i = 0; i < 200; i++) /* 1..200 shuffled (37 is coprime with 200) */
        many[i] = (kvp__replay_point_t){.ttft_ms = (double)((i * 37) % 200 + 1)};
    ASSERT_OK(kvp__replay_ttft_percentiles(many, 200, &p50, &p99));
    ASSERT(p50 == 100.0 && p99 == 198.0); /* ranks 100 and 198 */
    ASSERT_OK(kvp__replay_ttft_percentiles(many, 10, &p50, &p99));
    /* the first ten: 1,38,75,112,149,186,23,60,97,134 -> sorted rank 5 = 75, rank 10 = 186 */
    ASSERT(p50 == 75.0 && p99 == 186.0);

    kvp__replay_point_t one = {.ttft_ms = 7.25};
    ASSERT_OK(kvp__replay_ttft_percentiles(&one, 1, &p50, &p99));
    ASSERT(p50 == 7.25 && p99 == 7.25);

    kvp__replay_point_t none[2] = {{.ttft_ms = -1}, {.ttft_ms = -0.5}};
    p50 = p99 = -7;
    ASSERT_OK(kvp__replay_ttft_percentiles(none, 2, &p50, &p99));
    ASSERT(p50 == 0.0 && p99 == 0.0);
    p50 = p99 = -7;
    ASSERT_OK(kvp__replay_ttft_percentiles(NULL, 0, &p50, &p99));
    ASSERT(p50 == 0.0 && p99 == 0.0);

    kvp__alloc_fail_after(0);
    ASSERT_EQ(kvp__replay_ttft_percentiles(pts, 6, &p50, &p99), KVP_ERR_NO_MEMORY);
    kvp__alloc_fail_reset();
}

TEST(test_rates_are_fractions_of_prompt_tokens_and_zero_without_them)
{
    kvp__replay_run_t r = {.prompt_tokens = 1000, .local_hit_tokens = 300, .pool_hit_tokens = 319,
                           .bound_hit_tokens = 651};
    ASSERT(fabs(kvp__replay_hit_rate(&r) - 0.619) < 1e-12);
    ASSERT(fabs(kvp__replay_bound_rate(&r) - 0.651) < 1e-12);
    r.prompt_tokens = 0;
    ASSERT(kvp__replay_hit_rate(&r) == 0.0 && kvp__replay_bound_rate(&r) == 0.0);
    r.prompt_tokens = 500; /* inconsistent counts still give a fraction */
    ASSERT(kvp__replay_hit_rate(&r) == 1.0 && kvp__replay_bound_rate(&r) == 1.0);
}

/* ---- the --json line ---- */

static void fill_figures(kvp__replay_run_t *r, uint64_t base, double fbase)
{
    r->requests = base + 1;
    r->rejected = base + 2;
    r->prompt_tokens = base * 1000 + 3;
    r->local_hit_tokens = base * 100 + 4;
    r->pool_hit_tokens = base * 300 + 5;
    r->bound_hit_tokens = base * 650 + 6;
    r->blocks_loaded = base + 7;
    r->blocks_verified = base + 8;
    r->corruptions = base + 9;
    r->load_errors = base + 10;
    r->save_errors = base + 11;
    r->lookup_errors = base + 12;
    r->preemptions = base + 13;
    r->evictions = base + 14;
    r->bytes_saved = base * 1000000007ull + 15;
    r->bytes_loaded = base * 999999937ull + 16;
    r->steps = base + 17;
    r->ttft_p50_ms = fbase * 1.2345678;
    r->ttft_p99_ms = fbase * 9.8765432;
    r->virtual_s = fbase * 123.456789;
    r->wall_s = fbase * 0.3333333;
    r->modelled_gbps = 25.0;
    r->measured_gbps = fbase * 3.1415926;
}

/* The value of a number member as the line writes it (the JSON reader keeps
 * only the class of a float, so the text is read with strtod). */
static double number_text(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(line, pat);
    ASSERT_MSG(p != NULL, "no %s", key);
    return strtod(p + strlen(pat), NULL);
}

static void check_int(const kvp__json_t *root, const char *key, uint64_t want)
{
    const kvp__json_t *v = kvp__json_get(root, key);
    ASSERT_MSG(v != NULL, "no member %s", key);
    ASSERT_MSG(v->type == KVP__JSON_INT && (uint64_t)v->u.i == want, "%s: %lld, want %llu", key,
               (long long)(v->type == KVP__JSON_INT ? v->u.i : -1), (unsigned long long)want);
}

static void check_float(const kvp__json_t *root, const char *line, const char *key, double want)
{
    const kvp__json_t *v = kvp__json_get(root, key);
    ASSERT_MSG(v != NULL, "no member %s", key);
    ASSERT_MSG(v->type == KVP__JSON_FLOAT, "%s is not a float", key);
    double got = number_text(line, key);
    ASSERT_MSG(rel_close(got, want), "%s: %.17g, want %.17g", key, got, want);
}

TEST(test_json_line_is_one_object_with_the_pool_runs_figures)
{
    kvp__replay_run_t runs[3] = {{.kind = KVP__RUN_NO_POOL, .label = "no pool"},
                                 {.kind = KVP__RUN_POOL, .label = "pool"},
                                 {.kind = KVP__RUN_POOL_FASTER, .label = "pool (faster)"}};
    fill_figures(&runs[0], 5, 5.0);
    fill_figures(&runs[1], 3, 1.0);
    fill_figures(&runs[2], 7, 2.0);
    char *line = capture(kvp__replay_print_json, runs, 3);
    size_t len = strlen(line);
    ASSERT(len > 2 && line[len - 1] == '\n');
    ASSERT_EQ(count_of(line, "\n"), 1);
    ASSERT(strchr(line, ' ') == NULL); /* compact */

    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    const kvp__json_t *root = NULL;
    ASSERT_OK(kvp__json_parse(&jp, line, len, &root));
    ASSERT_EQ(root->type, KVP__JSON_OBJECT);
    const kvp__replay_run_t *p = &runs[1], *np = &runs[0], *fast = &runs[2];
    check_int(root, "requests", p->requests);
    check_int(root, "prompt_tokens", p->prompt_tokens);
    check_int(root, "local_hit_tokens", p->local_hit_tokens);
    check_int(root, "pool_hit_tokens", p->pool_hit_tokens);
    check_float(root, line, "hit_rate", (double)(p->local_hit_tokens + p->pool_hit_tokens) / (double)p->prompt_tokens);
    check_float(root, line, "bound_hit_rate", (double)p->bound_hit_tokens / (double)p->prompt_tokens);
    check_int(root, "blocks_loaded", p->blocks_loaded);
    check_int(root, "blocks_verified", p->blocks_verified);
    check_int(root, "corruptions", p->corruptions);
    check_int(root, "load_errors", p->load_errors);
    check_int(root, "preemptions", p->preemptions);
    check_int(root, "evictions", p->evictions);
    check_int(root, "bytes_saved", p->bytes_saved);
    check_int(root, "bytes_loaded", p->bytes_loaded);
    check_float(root, line, "ttft_p50_ms", p->ttft_p50_ms);
    check_float(root, line, "ttft_p50_ms_no_pool", np->ttft_p50_ms);
    check_float(root, line, "ttft_p99_ms", p->ttft_p99_ms);
    check_float(root, line, "ttft_p99_ms_no_pool", np->ttft_p99_ms);
    check_float(root, line, "wall_s", runs[0].wall_s + runs[1].wall_s + runs[2].wall_s);
    check_int(root, "save_errors", p->save_errors);
    check_int(root, "lookup_errors", p->lookup_errors);
    check_int(root, "rejected", p->rejected);
    check_int(root, "steps", p->steps);
    check_float(root, line, "virtual_s", p->virtual_s);
    check_float(root, line, "measured_gbps", p->measured_gbps);
    check_float(root, line, "modelled_gbps", p->modelled_gbps);
    check_float(root, line, "ttft_p50_ms_faster", fast->ttft_p50_ms);
    check_float(root, line, "ttft_p99_ms_faster", fast->ttft_p99_ms);
    ASSERT_EQ(root->n, 28); /* nothing else, nothing twice */
    kvp__json_parser_cleanup(&jp);
    free(line);
}

TEST(test_json_without_a_pool_run_uses_the_first_and_omits_what_is_absent)
{
    kvp__replay_run_t runs[2] = {{.kind = KVP__RUN_POOL_FASTER, .label = "pool (faster)"},
                                 {.kind = KVP__RUN_POOL_FASTER, .label = "again"}};
    fill_figures(&runs[0], 2, 3.0);
    fill_figures(&runs[1], 4, 6.0);
    char *line = capture(kvp__replay_print_json, runs, 2);
    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    const kvp__json_t *root = NULL;
    ASSERT_OK(kvp__json_parse(&jp, line, strlen(line), &root));
    check_int(root, "requests", runs[0].requests);
    check_float(root, line, "ttft_p50_ms", runs[0].ttft_p50_ms);
    check_float(root, line, "ttft_p50_ms_no_pool", 0.0);
    check_float(root, line, "ttft_p99_ms_no_pool", 0.0);
    check_float(root, line, "ttft_p50_ms_faster", runs[0].ttft_p50_ms);
    check_float(root, line, "wall_s", runs[0].wall_s + runs[1].wall_s);
    kvp__json_parser_cleanup(&jp);
    free(line);

    line = capture(kvp__replay_print_json, NULL, 0); /* no run at all: zeros */
    kvp__json_parser_init(&jp);
    ASSERT_OK(kvp__json_parse(&jp, line, strlen(line), &root));
    check_int(root, "requests", 0);
    check_float(root, line, "hit_rate", 0.0);
    ASSERT(kvp__json_get(root, "ttft_p50_ms_faster") == NULL);
    kvp__json_parser_cleanup(&jp);
    free(line);
}

TEST(test_json_numbers_stay_finite_and_in_range)
{
    kvp__replay_run_t r = {.kind = KVP__RUN_POOL, .label = "pool"};
    fill_figures(&r, 1, 1.0);
    r.ttft_p50_ms = NAN;
    r.ttft_p99_ms = INFINITY;
    r.wall_s = -INFINITY;
    r.measured_gbps = 1e300 * 1e300;
    r.virtual_s = 2.0; /* whole: still written as a float */
    r.bytes_loaded = UINT64_MAX;
    char *line = capture(kvp__replay_print_json, &r, 1);
    ASSERT(!contains_ci(line, "nan") && !contains_ci(line, "inf"));
    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    const kvp__json_t *root = NULL;
    ASSERT_OK(kvp__json_parse(&jp, line, strlen(line), &root));
    check_float(root, line, "ttft_p50_ms", 0.0);
    check_float(root, line, "ttft_p99_ms", 0.0);
    check_float(root, line, "wall_s", 0.0);
    check_float(root, line, "measured_gbps", 0.0);
    check_float(root, line, "virtual_s", 2.0);
    check_int(root, "bytes_loaded", (uint64_t)INT64_MAX);
    kvp__json_parser_cleanup(&jp);
    free(line);
}

/* ---- the table ---- */

TEST(test_table_shows_every_figure_under_each_run_label)
{
    kvp__replay_run_t runs[3] = {{.kind = KVP__RUN_POOL, .label = "pool"},
                                 {.kind = KVP__RUN_POOL_FASTER, .label = "pool (faster)"},
                                 {.kind = KVP__RUN_NO_POOL, .label = "no pool"}};
    for (int i = 0; i < 3; i++) {
        fill_figures(&runs[i], 1000000 * (uint64_t)(i + 1), 1000.0);
        runs[i].rejected = 0;
        runs[i].prompt_tokens = 145123456;
        runs[i].local_hit_tokens = 40000000;
        runs[i].pool_hit_tokens = 49832580;
        runs[i].bound_hit_tokens = 94475370; /* 65.1 % */
        runs[i].bytes_saved = 3ull << 30;
        runs[i].bytes_loaded = 5ull << 29;
    }
    char *t = capture(kvp__replay_print_table, runs, 3);
    ASSERT(strstr(t, "hit rate") != NULL);
    ASSERT(strstr(t, "verified") != NULL);
    for (int i = 0; i < 3; i++)
        ASSERT_MSG(strstr(t, runs[i].label) != NULL, "no column %s", runs[i].label);
    ASSERT(strstr(t, "61.9 %") != NULL);         /* (40000000 + 49832580) / 145123456 */
    ASSERT(strstr(t, "bound 65.1 %") != NULL);
    ASSERT(strstr(t, "95.1 %") != NULL);         /* 61.9 / 65.1 */
    ASSERT(strstr(t, "145,123,456") != NULL);
    ASSERT(strstr(t, "rejected") == NULL);       /* only when some run rejected */
    const char *rows[] = {"requests", "prompt tokens", "local hit tokens", "pool hit tokens",
                          "bytes saved", "bytes loaded", "blocks loaded", "corruptions",
                          "load errors", "save errors", "lookup errors", "preemptions",
                          "pool evictions", "TTFT p50 (ms)", "TTFT p99 (ms)", "steps",
                          "modelled time", "wall time (s)", "requests/s", "GB/s"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        ASSERT_MSG(strstr(t, rows[i]) != NULL, "no row %s", rows[i]);
    ASSERT(strstr(t, "3.0 GiB") != NULL && strstr(t, "2.5 GiB") != NULL); /* human units */
    for (const char *l = t; *l;) { /* fits a 100-column terminal */
        size_t w = strcspn(l, "\n");
        ASSERT_MSG(w <= 100, "a %zu-column line", w);
        l += w + (l[w] == '\n');
    }
    free(t);

    runs[2].rejected = 3;
    t = capture(kvp__replay_print_table, runs, 3);
    ASSERT(strstr(t, "rejected") != NULL);
    free(t);
}

/* ---- the SVG ---- */

TEST(test_svg_has_one_line_per_run_in_each_panel_with_labelled_axes)
{
    fixture_t fx;
    fixture_init(&fx, 1200);
    char *svg = plot(fx.runs, 3, "replay of synthetic_trace.jsonl", NULL);
    ASSERT(strstr(svg, "replay of synthetic_trace.jsonl") != NULL);
    ASSERT(strstr(svg, "trace time (s)") != NULL);
    ASSERT(strstr(svg, ">hit rate<") != NULL);
    ASSERT(strstr(svg, ">TTFT p50 (ms)<") != NULL);
    ASSERT(strstr(svg, "linear scale") != NULL); /* 12..50 ms: under 100x */
    for (int r = 0; r < 3; r++)
        ASSERT(strstr(svg, fx.runs[r].label) != NULL);
    /* 60 bins: every polyline has 60 points */
    for (const char *p = strstr(svg, "points=\""); p; p = strstr(p + 1, "points=\"")) {
        size_t w = strcspn(p + 8, "\"");
        size_t pairs = 0;
        for (size_t i = 0; i < w; i++)
            pairs += p[8 + i] == ',';
        ASSERT_EQ(pairs, 60);
    }
    free(svg);
    fixture_cleanup(&fx);
}

TEST(test_svg_uses_a_log_scale_when_ttft_spans_over_100x)
{
    fixture_t fx;
    fixture_init(&fx, 600);
    for (size_t i = 0; i < fx.np; i++)
        fx.pts[2][i].ttft_ms = i < 300 ? 0.5 : 5000.0;
    char *svg = plot(fx.runs, 3, "t", NULL);
    ASSERT(strstr(svg, "(log scale)") != NULL);
    ASSERT(strstr(svg, ">0.1<") != NULL && strstr(svg, ">10000<") != NULL); /* decade ticks */
    ASSERT(strstr(svg, "e+") == NULL);
    free(svg);
    fixture_cleanup(&fx);
}

TEST(test_svg_escapes_the_title_and_labels)
{
    fixture_t fx;
    fixture_init(&fx, 10);
    fx.runs[0].label = "a&b";
    char *svg = plot(fx.runs, 3, "x <&> \"y\" 'z' \x01 caf\xc3\xa9 \xff", NULL);
    ASSERT(strstr(svg, "x &lt;&amp;&gt; &quot;y&quot; &apos;z&apos;") != NULL);
    ASSERT(strstr(svg, "<&>") == NULL);
    ASSERT(strstr(svg, "caf\xc3\xa9") != NULL);  /* UTF-8 kept */
    ASSERT(strstr(svg, "\xef\xbf\xbd") != NULL); /* a stray byte replaced */
    ASSERT(strchr(svg, '\x01') == NULL && strchr(svg, '\xff') == NULL);
    ASSERT(strstr(svg, ">a&amp;b<") != NULL);
    free(svg);
    fixture_cleanup(&fx);
}

TEST(test_svg_of_degenerate_runs_is_still_valid)
{
    fixture_t fx;
    fixture_init(&fx, 0); /* no points */
    free(plot(fx.runs, 3, "empty", NULL));
    free(plot(NULL, 0, "no runs", NULL));
    fixture_cleanup(&fx);

    fixture_init(&fx, 1); /* one request: one point and a dot per run and panel */
    char *svg = plot(fx.runs, 3, "one", NULL);
    ASSERT_EQ(count_of(svg, "<circle"), 6);
    free(svg);
    fixture_cleanup(&fx);

    fixture_init(&fx, 50); /* all at one instant, all values zero */
    for (int r = 0; r < 3; r++)
        for (size_t i = 0; i < fx.np; i++)
            fx.pts[r][i] = (kvp__replay_point_t){.arrival_s = 42.0};
    free(plot(fx.runs, 3, "zeros", NULL));
    for (size_t i = 0; i < fx.np; i++) { /* none served, NaN arrivals, negative times */
        fx.pts[0][i].ttft_ms = -1.0;
        fx.pts[1][i].arrival_s = NAN;
        fx.pts[2][i].arrival_s = -1e9 * (double)i;
        fx.pts[2][i].ttft_ms = INFINITY;
    }
    free(plot(fx.runs, 3, NULL, NULL));
    fixture_cleanup(&fx);
}

TEST(test_svg_stays_small_for_12000_requests)
{
    fixture_t fx;
    fixture_init(&fx, 12000);
    size_t len = 0;
    free(plot(fx.runs, 3, "12k", &len));
    ASSERT_LT(len, 200 * 1024);
    fixture_cleanup(&fx);
}

TEST(test_svg_failures_are_reported_not_hidden)
{
    fixture_t fx;
    fixture_init(&fx, 100);
    uint64_t in_use = kvp__alloc_bytes_in_use();
    ASSERT_EQ(kvp__replay_plot_svg("/nonexistent-dir-kvp/x.svg", fx.runs, 3, "t"), KVP_ERR_IO);
    struct stat full;
    if (stat("/dev/full", &full) == 0 && S_ISCHR(full.st_mode)) /* every write: ENOSPC */
        ASSERT_EQ(kvp__replay_plot_svg("/dev/full", fx.runs, 3, "t"), KVP_ERR_IO);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), in_use);
    snprintf(g_svg_path, sizeof g_svg_path, "/tmp/kvp_test_report_oom_%d.svg", (int)getpid());
    for (long k = 0; k < 8; k++) { /* out of memory at each allocation in turn */
        kvp__alloc_fail_after(k);
        kvp_status_t st = kvp__replay_plot_svg(g_svg_path, fx.runs, 3, "t");
        kvp__alloc_fail_reset();
        ASSERT(st == KVP_ERR_NO_MEMORY || st == KVP_OK);
        ASSERT_EQ(kvp__alloc_bytes_in_use(), in_use);
    }
    unlink(g_svg_path);
    fixture_cleanup(&fx);
}

/* ---- the progress bar ---- */

TEST(test_progress_is_silent_when_stderr_is_not_a_terminal)
{
    FILE *f = tmpfile();
    ASSERT(f != NULL);
    int saved = dup(2);
    ASSERT(dup2(fileno(f), 2) == 2);
    kvp__progress_t p;
    kvp__progress_start(&p, "replay", 10);
    bool tty = p.tty;
    for (uint64_t i = 0; i <= 10; i++)
        kvp__progress_update(&p, i, 0.5);
    kvp__progress_end(&p);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ASSERT(!tty);
    struct stat st;
    ASSERT_EQ(fstat(fileno(f), &st), 0);
    ASSERT_EQ(st.st_size, 0);
    fclose(f);
}

TEST(test_progress_redraws_one_line_at_most_5_times_a_second_on_a_terminal)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
        printf("  (no pseudo-terminal here: the terminal case is not checked)\n");
        return;
    }
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    ASSERT(slave >= 0);
    fflush(stderr);
    int saved = dup(2);
    ASSERT(dup2(slave, 2) == 2);
    kvp__progress_t p;
    kvp__progress_start(&p, "replay pool", 10);
    bool tty = p.tty;
    kvp__progress_update(&p, 5, 0.25);  /* drawn: the first */
    kvp__progress_update(&p, 6, 0.30);  /* within 200 ms: not drawn */
    kvp__progress_update(&p, 10, 0.619); /* drawn: done == total */
    kvp__progress_end(&p);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(slave);
    char out[4096];
    size_t len = 0;
    fcntl(master, F_SETFL, O_NONBLOCK);
    for (;;) {
        ssize_t k = read(master, out + len, sizeof out - 1 - len);
        if (k <= 0)
            break;
        len += (size_t)k;
    }
    out[len] = '\0';
    close(master);
    ASSERT(tty);
    ASSERT_EQ(count_of(out, "\r"), 2 + count_of(out, "\r\n")); /* two redraws (+ the tty's CR LF) */
    ASSERT(strstr(out, "replay pool [") != NULL);
    ASSERT(strstr(out, " 5/10 ") != NULL && strstr(out, "hit 25.0 %") != NULL);
    ASSERT(strstr(out, "6/10") == NULL);
    ASSERT(strstr(out, "10/10") != NULL && strstr(out, "hit 61.9 %") != NULL);
    ASSERT(strstr(out, "[########################]") != NULL); /* full bar at the end */
    ASSERT(strstr(out, "ETA") != NULL);
    ASSERT(len > 0 && out[len - 1] == '\n'); /* the line finished */
}

TEST_LIST(T(test_percentiles_are_nearest_rank_over_served_requests),
          T(test_rates_are_fractions_of_prompt_tokens_and_zero_without_them),
          T(test_json_line_is_one_object_with_the_pool_runs_figures),
          T(test_json_without_a_pool_run_uses_the_first_and_omits_what_is_absent),
          T(test_json_numbers_stay_finite_and_in_range),
          T(test_table_shows_every_figure_under_each_run_label),
          T(test_svg_has_one_line_per_run_in_each_panel_with_labelled_axes),
          T(test_svg_uses_a_log_scale_when_ttft_spans_over_100x),
          T(test_svg_escapes_the_title_and_labels),
          T(test_svg_of_degenerate_runs_is_still_valid),
          T(test_svg_stays_small_for_12000_requests),
          T(test_svg_failures_are_reported_not_hidden),
          T(test_progress_is_silent_when_stderr_is_not_a_terminal),
          T(test_progress_redraws_one_line_at_most_5_times_a_second_on_a_terminal))
