/*
 * Unit tests of the Mooncake trace reader, the infinite-cache bound and the
 * synthetic trace generator (src/engine/trace.h).  Each skip rule of the
 * reader has its test; the bound is checked on hand-computed cases, against
 * the shared Mooncake synthetic trace (65.1 %, its README) and against a
 * naive recomputation on generated traces.
 */
#include "test.h"

#include <math.h>
#include <time.h>

#include "common/alloc.h"
#include "engine/trace.h"

/* Reads text as a trace file. */
static kvp_status_t read_text(const char *text, size_t limit, kvp__trace_t *t)
{
    FILE *f = fmemopen((void *)text, strlen(text), "r");
    ASSERT(f != NULL);
    kvp_status_t st = kvp__trace_read(f, "test.jsonl", limit, t);
    fclose(f);
    return st;
}

static const int64_t *ids_of(const kvp__trace_t *t, size_t r) { return t->hash_ids + t->reqs[r].hash_off; }

#define GOOD(ts) "{\"timestamp\": " #ts ", \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [1, 2]}\n"

TEST(test_trace_reads_mooncake_lines)
{
    uint64_t before = kvp__alloc_bytes_in_use();
    kvp__trace_t t;
    ASSERT_OK(read_text("{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 0, \"hash_ids\": [7]}\n"
                        "\n"
                        "  \r\n"
                        "{\"hash_ids\":[7,8],\"output_length\":9,\"input_length\":513,\"timestamp\":12,\"x\":[1.5]}\r\n"
                        "{\"timestamp\": 12, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [3]}",
                        0, &t));
    ASSERT_EQ(t.n, 3);
    ASSERT_EQ(t.lines, 5);
    ASSERT_EQ(t.skipped, 0);
    ASSERT_EQ(t.num_hash_ids, 4);
    ASSERT_EQ(t.max_hash_id, 8);
    ASSERT_EQ(t.reqs[0].input_length, 512);
    ASSERT_EQ(t.reqs[0].output_length, 0);
    ASSERT_EQ(t.reqs[0].line, 1);
    ASSERT_EQ(t.reqs[1].timestamp_ms, 12);
    ASSERT_EQ(t.reqs[1].input_length, 513);
    ASSERT_EQ(t.reqs[1].output_length, 9);
    ASSERT_EQ(t.reqs[1].num_hash, 2);
    ASSERT_EQ(t.reqs[1].line, 4);
    ASSERT_EQ(ids_of(&t, 1)[0], 7);
    ASSERT_EQ(ids_of(&t, 1)[1], 8);
    ASSERT_EQ(t.reqs[2].line, 5);
    ASSERT_EQ(ids_of(&t, 2)[0], 3);
    kvp__trace_cleanup(&t);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), before);

    /* limit: stops after that many kept requests. */
    ASSERT_OK(read_text(GOOD(1) "oops\n" GOOD(2) GOOD(3), 2, &t));
    ASSERT_EQ(t.n, 2);
    ASSERT_EQ(t.reqs[1].timestamp_ms, 2);
    ASSERT_EQ(t.skipped, 1);
    kvp__trace_cleanup(&t);

    /* Nothing at all: an empty trace. */
    ASSERT_OK(read_text("", 0, &t));
    ASSERT_EQ(t.n, 0);
    ASSERT_EQ(t.max_hash_id, -1);
    ASSERT(t.reqs == NULL && t.hash_ids == NULL);
    kvp__trace_cleanup(&t);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), before);
}

TEST(test_trace_skips_not_json)
{
    kvp__trace_t t;
    ASSERT_OK(read_text(GOOD(0) "not json\n{\n" GOOD(1) "{\"timestamp\": 1}}\n"
                        "[1, 2]\n\"str\"\n{\"timestamp\": 1, \"input_length\": 600, \"output_length\": 3, "
                        "\"hash_ids\": [1, 2]\n" GOOD(2),
                        0, &t));
    ASSERT_EQ(t.n, 3);
    ASSERT_EQ(t.skipped, 6);
    ASSERT_EQ(t.lines, 9);
    ASSERT_EQ(t.reqs[0].line, 1);
    ASSERT_EQ(t.reqs[1].line, 4);
    ASSERT_EQ(t.reqs[2].line, 9);
    /* A NUL byte inside a line is not JSON either. */
    static const char nul[] = "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\0\n";
    FILE *f = fmemopen((void *)nul, sizeof nul - 1, "r");
    kvp__trace_cleanup(&t);
    ASSERT_OK(kvp__trace_read(f, "nul", 0, &t));
    fclose(f);
    ASSERT_EQ(t.n, 0);
    ASSERT_EQ(t.skipped, 1);
    kvp__trace_cleanup(&t);
}

TEST(test_trace_skips_hash_len_mismatch)
{
    kvp__trace_t t;
    ASSERT_OK(read_text("{\"timestamp\": 0, \"input_length\": 513, \"output_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n"
                        "{\"timestamp\": 0, \"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 2]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1025, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}\n",
                        0, &t));
    ASSERT_EQ(t.n, 2);
    ASSERT_EQ(t.skipped, 3);
    ASSERT_EQ(t.reqs[0].line, 4);
    ASSERT_EQ(t.reqs[1].line, 5);
    ASSERT_EQ(t.num_hash_ids, 5);
    kvp__trace_cleanup(&t);
}

TEST(test_trace_skips_negative_lengths)
{
    kvp__trace_t t;
    ASSERT_OK(read_text("{\"timestamp\": 0, \"input_length\": -1, \"output_length\": 1, \"hash_ids\": []}\n"
                        "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": -1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [-1]}\n"
                        "{\"timestamp\": -5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
                        /* absurd: past the limits, or past int64 */
                        "{\"timestamp\": 0, \"input_length\": 16777217, \"output_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1048577, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 99999999999999999999, \"output_length\": 1, "
                        "\"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, "
                        "\"hash_ids\": [99999999999999999999]}\n"
                        /* the edges are kept */
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [0]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1048576, "
                        "\"hash_ids\": [9223372036854775807]}\n",
                        0, &t));
    ASSERT_EQ(t.skipped, 9);
    ASSERT_EQ(t.n, 2);
    ASSERT_EQ(t.reqs[0].line, 10);
    ASSERT_EQ(t.reqs[1].output_length, KVP__TRACE_MAX_OUTPUT);
    ASSERT_EQ(t.max_hash_id, INT64_MAX);
    kvp__trace_cleanup(&t);
}

TEST(test_trace_skips_missing_field)
{
    kvp__trace_t t;
    ASSERT_OK(read_text("{\"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"output_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n"
                        /* mistyped: a float timestamp, a string, a bool, ids not an array or not ints */
                        "{\"timestamp\": 1.0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": \"1\", \"output_length\": 1, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": true, \"hash_ids\": [1]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": 1}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1.5]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [null]}\n"
                        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [[1]]}\n"
                        "{}\n" GOOD(0),
                        0, &t));
    ASSERT_EQ(t.skipped, 12);
    ASSERT_EQ(t.n, 1);
    ASSERT_EQ(t.reqs[0].line, 13);
    ASSERT_EQ(t.num_hash_ids, 2);
    kvp__trace_cleanup(&t);
}

TEST(test_trace_skips_decreasing_timestamp)
{
    kvp__trace_t t;
    ASSERT_OK(read_text(GOOD(5) GOOD(3) GOOD(5) GOOD(4) GOOD(-1) GOOD(6), 0, &t));
    ASSERT_EQ(t.n, 3);
    ASSERT_EQ(t.skipped, 3);
    ASSERT_EQ(t.reqs[0].timestamp_ms, 5);
    ASSERT_EQ(t.reqs[1].timestamp_ms, 5);
    ASSERT_EQ(t.reqs[1].line, 3);
    ASSERT_EQ(t.reqs[2].timestamp_ms, 6);
    ASSERT_EQ(t.reqs[2].line, 6);
    kvp__trace_cleanup(&t);
}

TEST(test_trace_skips_line_over_64mib)
{
    size_t big = (size_t)KVP__TRACE_MAX_LINE + 10;
    const char *good = GOOD(0);
    size_t glen = strlen(good);
    char *text = malloc(big + 2 * glen);
    ASSERT(text != NULL);
    memcpy(text, good, glen);
    memset(text + glen, ' ', big);
    text[glen + big - 1] = '\n';
    memcpy(text + glen + big, good, glen);
    FILE *f = fmemopen(text, big + 2 * glen, "r");
    kvp__trace_t t;
    ASSERT_OK(kvp__trace_read(f, "big", 0, &t));
    fclose(f);
    ASSERT_EQ(t.n, 2);
    ASSERT_EQ(t.skipped, 1);
    ASSERT_EQ(t.lines, 3);
    ASSERT_EQ(t.reqs[1].line, 3);
    kvp__trace_cleanup(&t);
    free(text);
}

TEST(test_trace_load_errors)
{
    kvp__trace_t t;
    ASSERT_EQ(kvp__trace_load("/nonexistent/trace.jsonl", 0, &t), KVP_ERR_IO);
    ASSERT_EQ(t.n, 0);
    kvp__trace_cleanup(&t);
    ASSERT_EQ(kvp__trace_load(NULL, 0, &t), KVP_ERR_NULL_POINTER);
    kvp__trace_cleanup(&t);
    ASSERT_EQ(kvp__trace_read(NULL, "x", 0, &t), KVP_ERR_NULL_POINTER);
    kvp__trace_cleanup(&t);
}

/* Every allocation failure is KVP_ERR_NO_MEMORY with nothing left allocated. */
TEST(test_trace_read_out_of_memory_frees_all)
{
    uint64_t before = kvp__alloc_bytes_in_use();
    int oks = 0;
    for (long n = 0; n < 64; n++) {
        kvp__trace_t t;
        kvp__alloc_fail_after(n);
        kvp_status_t st = read_text(GOOD(0) GOOD(1) "bad\n" GOOD(2), 0, &t);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "status %d", (int)st);
        if (st == KVP_OK) {
            ASSERT_EQ(t.n, 3);
            oks++;
        } else {
            ASSERT_EQ(t.n, 0);
        }
        kvp__trace_cleanup(&t);
        ASSERT_EQ(kvp__alloc_bytes_in_use(), before);
    }
    ASSERT_GT(oks, 0);
}

/* A trace built by hand: ids[] per request, input lengths. */
static void build(kvp__trace_t *t, const int64_t *const *ids, const uint32_t *nids, const int64_t *inlen,
                  size_t n)
{
    memset(t, 0, sizeof *t);
    size_t m = 0;
    for (size_t r = 0; r < n; r++)
        m += nids[r];
    t->reqs = kvp__calloc(n, sizeof *t->reqs);
    t->hash_ids = kvp__malloc(m * sizeof *t->hash_ids);
    ASSERT(t->reqs && t->hash_ids);
    t->n = n;
    t->max_hash_id = -1;
    for (size_t r = 0; r < n; r++) {
        t->reqs[r].input_length = inlen[r];
        t->reqs[r].hash_off = t->num_hash_ids;
        t->reqs[r].num_hash = nids[r];
        for (uint32_t j = 0; j < nids[r]; j++) {
            t->hash_ids[t->num_hash_ids++] = ids[r][j];
            if (ids[r][j] > t->max_hash_id)
                t->max_hash_id = ids[r][j];
        }
    }
}

/* The prefix rule: leading ids seen in an earlier request x 512, capped by
 * input_length; an id seen earlier but after a new one does not count, nor
 * does an id repeated inside the same request. */
TEST(test_trace_bound_prefix_rule)
{
    static const int64_t r0[] = {0, 1}, r1[] = {0, 1, 2}, r2[] = {0, 1}, r3[] = {5, 2, 1},
                         r4[] = {2, 5, 9}, r5[] = {7, 7}, r6[] = {7, 7, 3}, r7[] = {1000000000000};
    static const int64_t *const ids[] = {r0, r1, r2, r3, r4, r5, r6, r7};
    static const uint32_t nids[] = {2, 3, 2, 3, 3, 2, 3, 1};
    static const int64_t inlen[] = {1000, 1100, 700, 1500, 1536, 1024, 1100, 10};
    /* r0: nothing seen; r1: 0, 1 (2 new) = 1024; r2: 0, 1 = 1024 capped to
     * 700 (a partial last block); r3: 5 is new, so 2 and 1 do not count;
     * r4: 2 (r1) and 5 (r3), 9 new = 1024; r5: 7 twice, never before = 0;
     * r6: 7, 7 (r5) = 1024, 3 new; r7: a huge new id = 0. */
    static const uint64_t want[] = {0, 1024, 700, 0, 1024, 0, 1024, 0};
    uint64_t before = kvp__alloc_bytes_in_use();
    kvp__trace_t t;
    build(&t, ids, nids, inlen, 8);
    uint64_t per[8], prompt = 0, bound = 0;
    ASSERT_OK(kvp__trace_bound(&t, &prompt, &bound, per));
    uint64_t sum = 0, psum = 0;
    for (int r = 0; r < 8; r++) {
        ASSERT_MSG(per[r] == want[r], "request %d: %llu tokens, want %llu", r, (unsigned long long)per[r],
                   (unsigned long long)want[r]);
        sum += want[r];
        psum += (uint64_t)inlen[r];
    }
    ASSERT_EQ(bound, sum);
    ASSERT_EQ(prompt, psum);
    ASSERT_OK(kvp__trace_bound(&t, NULL, &bound, NULL));
    ASSERT_EQ(bound, sum);
    kvp__trace_cleanup(&t);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), before);

    /* The empty trace. */
    memset(&t, 0, sizeof t);
    ASSERT_OK(kvp__trace_bound(&t, &prompt, &bound, NULL));
    ASSERT_EQ(prompt, 0);
    ASSERT_EQ(bound, 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The shared Mooncake synthetic trace: 3,993 requests, ids 0..43,923, an
 * infinite-cache bound of 65.1 % (../shared/data/mooncake-traces/README.md). */
TEST(test_trace_synthetic_bound)
{
    const char *dir = getenv("KVP_SHARED_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/data/mooncake-traces/synthetic_trace.jsonl", dir ? dir : "../shared");
    if (access(path, R_OK) != 0) {
        printf("note: %s is absent; test_trace_synthetic_bound checked nothing\n", path);
        return;
    }
    kvp__trace_t t;
    double t0 = now_s();
    ASSERT_OK(kvp__trace_load(path, 0, &t));
    double read_s = now_s() - t0;
    uint64_t prompt = 0, bound = 0;
    ASSERT_OK(kvp__trace_bound(&t, &prompt, &bound, NULL));
    double all_s = now_s() - t0;
    double pct = 100.0 * (double)bound / (double)prompt;
    printf("synthetic_trace.jsonl: %zu requests, %llu prompt tokens, bound %.2f %%, read %.3f s, "
           "read + bound %.3f s\n",
           t.n, (unsigned long long)prompt, pct, read_s, all_s);
    ASSERT_EQ(t.n, 3993);
    ASSERT_EQ(t.skipped, 0);
    ASSERT_EQ(t.max_hash_id, 43923);
    ASSERT_EQ(prompt / t.n, 15325); /* the README's average input */
    ASSERT_MSG(fabs(pct - 65.1) <= 0.05, "bound %.3f %%, want 65.1 +- 0.05", pct);
    ASSERT_MSG(all_s < 1.0, "%.3f s to read and bound it", all_s);
    kvp__trace_cleanup(&t);
}

/* Generates p's trace into a malloc'ed buffer (*len_p bytes). */
static char *gen_text(const kvp__trace_gen_params_t *p, size_t *len_p)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ASSERT(f != NULL);
    ASSERT_OK(kvp__trace_gen(p, f));
    fclose(f);
    *len_p = len;
    return buf;
}

TEST(test_trace_gen_deterministic)
{
    uint64_t before = kvp__alloc_bytes_in_use();
    kvp__trace_gen_params_t p;
    kvp__trace_gen_params_init(&p);
    p.requests = 400;
    p.sessions = 90;
    size_t la, lb, lc, ld;
    char *a = gen_text(&p, &la), *b = gen_text(&p, &lb);
    ASSERT(la > 0);
    ASSERT_EQ(la, lb);
    ASSERT_MEM_EQ(a, b, la);
    p.seed = 2;
    char *c = gen_text(&p, &lc);
    ASSERT(lc != la || memcmp(a, c, la) != 0);
    p.seed = 1;
    p.rate = 5.0;
    char *d = gen_text(&p, &ld);
    ASSERT(ld != la || memcmp(a, d, la) != 0);
    free(a);
    free(b);
    free(c);
    free(d);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), before);

    /* The first lines of the default seed's trace are pinned: a change of
     * the model, the PRNG or the fixed-point logarithm shows here (and a
     * machine that computed them differently would too). */
    p.rate = 2.0;
    p.requests = 3;
    p.sessions = 0;
    size_t le;
    char *e = gen_text(&p, &le);
    static const char want[] =
        "{\"timestamp\": 0, \"input_length\": 1347, \"output_length\": 616, \"hash_ids\": [0, 1, 2]}\n"
        "{\"timestamp\": 1088, \"input_length\": 5408, \"output_length\": 276, "
        "\"hash_ids\": [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}\n";
    ASSERT_MSG(le > strlen(want) && memcmp(e, want, strlen(want)) == 0, "got:\n%.*s", (int)le, e);
    free(e);
}

/* Parameters gen refuses. */
TEST(test_trace_gen_bad_params)
{
    kvp__trace_gen_params_t p;
    kvp__trace_gen_params_init(&p);
    FILE *f = fopen("/dev/null", "w");
    ASSERT(f != NULL);
    p.requests = 0;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    kvp__trace_gen_params_init(&p);
    p.requests = 10;
    p.sessions = 11;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    kvp__trace_gen_params_init(&p);
    p.turns = 0;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    kvp__trace_gen_params_init(&p);
    p.rate = 0;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    p.rate = NAN;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    p.rate = -1;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    p.rate = 1e-300; /* its mean gap would not fit the clock */
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    p.rate = 1e6 * 1.5;
    ASSERT_EQ(kvp__trace_gen(&p, f), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__trace_gen(NULL, f), KVP_ERR_NULL_POINTER);
    fclose(f);
}

/* What a generated trace must be: it reads back without a bad line,
 * len(hash_ids) == ceil(input / 512), timestamps non-decreasing, ids dense
 * from 0 in order of first use; the bound agrees with a naive count; each
 * later turn's leading ids are exactly an earlier prompt's full blocks and it
 * extends that prompt; sessions share system prompts as a leading run. */
static void check_generated(const kvp__trace_gen_params_t *p, uint64_t *first_ids_p, double *bound_p,
                            uint64_t *extends_p)
{
    size_t len;
    char *text = gen_text(p, &len);
    FILE *f = fmemopen(text, len, "r");
    kvp__trace_t t;
    ASSERT_OK(kvp__trace_read(f, "gen", 0, &t));
    fclose(f);
    ASSERT_EQ(t.skipped, 0);
    ASSERT_EQ(t.n, p->requests);
    ASSERT_EQ(t.lines, p->requests);

    int64_t next = 0;
    uint8_t *seen = calloc((size_t)t.max_hash_id + 1, 1);
    uint64_t *per = calloc(t.n, sizeof *per);
    ASSERT(seen && per);
    uint64_t prompt = 0, bound = 0, naive = 0, extends = 0;
    for (size_t r = 0; r < t.n; r++) {
        const kvp__trace_req_t *q = &t.reqs[r];
        ASSERT_EQ(q->num_hash, (q->input_length + 511) / 512);
        ASSERT(q->input_length <= 131072);
        ASSERT(q->output_length >= 1 && q->output_length <= 4096);
        if (r)
            ASSERT(q->timestamp_ms >= t.reqs[r - 1].timestamp_ms);
        const int64_t *ids = ids_of(&t, r);
        for (uint32_t j = 0; j < q->num_hash; j++)
            if (ids[j] >= next) {
                ASSERT_EQ(ids[j], next); /* dense, numbered in order of first use */
                next++;
            }
        uint32_t k = 0;
        while (k < q->num_hash && seen[ids[k]])
            k++;
        uint64_t hit = (uint64_t)k * 512 < (uint64_t)q->input_length ? (uint64_t)k * 512
                                                                      : (uint64_t)q->input_length;
        naive += hit;
        for (uint32_t j = 0; j < q->num_hash; j++)
            seen[ids[j]] = 1;
        /* An earlier prompt whose full blocks are exactly this one's leading run. */
        for (size_t e = r; k > 0 && e-- > 0;) {
            const kvp__trace_req_t *o = &t.reqs[e];
            if ((uint64_t)o->input_length / 512 == k && o->input_length < q->input_length &&
                memcmp(ids_of(&t, e), ids, k * sizeof *ids) == 0) {
                extends++;
                break;
            }
        }
    }
    ASSERT_EQ(next, t.max_hash_id + 1);
    ASSERT_OK(kvp__trace_bound(&t, &prompt, &bound, per));
    ASSERT_EQ(bound, naive);
    uint64_t sessions = p->sessions ? p->sessions : (p->requests + p->turns - 1) / p->turns;
    /* Every turn after a session's first extends its previous prompt (a
     * history restarted at 128 K does not; first turns can, by chance, when
     * an earlier prompt held only their system prompt's blocks). */
    ASSERT_MSG(extends >= (p->requests - sessions) * 95 / 100, "%llu extending turns of %llu later turns",
               (unsigned long long)extends, (unsigned long long)(p->requests - sessions));

    /* Distinct leading ids: one per system prompt used, or one per session without. */
    uint8_t *lead = calloc((size_t)t.max_hash_id + 1, 1);
    uint64_t first_ids = 0;
    for (size_t r = 0; r < t.n; r++)
        if (!lead[ids_of(&t, r)[0]]) {
            lead[ids_of(&t, r)[0]] = 1;
            first_ids++;
        }
    *first_ids_p = first_ids;
    *extends_p = extends;
    *bound_p = (double)bound / (double)prompt;
    printf("requests %zu sessions %llu: %llu prompt tokens, bound %.1f %%, %llu extending turns, "
           "%llu distinct first ids\n",
           t.n, (unsigned long long)sessions, (unsigned long long)prompt, 100 * *bound_p,
           (unsigned long long)extends, (unsigned long long)first_ids);
    free(lead);
    free(seen);
    free(per);
    kvp__trace_cleanup(&t);
    free(text);
}

TEST(test_trace_gen_valid)
{
    uint64_t before = kvp__alloc_bytes_in_use();
    kvp__trace_gen_params_t p;
    kvp__trace_gen_params_init(&p);
    p.requests = 500;
    p.sessions = 100;
    p.system_prompts = 4;
    uint64_t first, ext;
    double bound;
    check_generated(&p, &first, &bound, &ext);
    ASSERT_LE(first, 4); /* every session starts with a shared system prompt */
    ASSERT_GE(first, 2);
    ASSERT(bound > 0.40 && bound < 0.70);

    p.system_prompts = 0;
    check_generated(&p, &first, &bound, &ext);
    /* No system prompts: each session its own first id (and a history
     * restarted at 128 K a new one). */
    ASSERT_GE(first, 100);
    ASSERT_LE(first, 150);
    /* and then every other request extends an earlier prompt, exactly. */
    ASSERT_EQ(ext, 500 - first);

    /* Edges: one session (its history restarts at 128 K), one turn each. */
    kvp__trace_gen_params_init(&p);
    p.requests = 200;
    p.sessions = 1;
    check_generated(&p, &first, &bound, &ext);
    ASSERT_EQ(first, 1);
    p.sessions = 200;
    check_generated(&p, &first, &bound, &ext);
    ASSERT_LE(first, 8);
    ASSERT(bound > 0.05 && bound < 0.30); /* single turns share only system prompts */
    ASSERT_EQ(kvp__alloc_bytes_in_use(), before);
}

/* The defaults: about 145 M prompt tokens over 12,000 requests, a bound
 * near the Mooncake conversation trace's 37.4 %. */
TEST(test_trace_gen_defaults_like_conversation_trace)
{
    kvp__trace_gen_params_t p;
    kvp__trace_gen_params_init(&p);
    size_t len;
    char *text = gen_text(&p, &len);
    FILE *f = fmemopen(text, len, "r");
    kvp__trace_t t;
    ASSERT_OK(kvp__trace_read(f, "gen", 0, &t));
    fclose(f);
    uint64_t prompt, bound;
    ASSERT_OK(kvp__trace_bound(&t, &prompt, &bound, NULL));
    double pct = 100.0 * (double)bound / (double)prompt;
    printf("defaults: %zu requests, %llu prompt tokens, bound %.2f %%\n", t.n, (unsigned long long)prompt,
           pct);
    ASSERT_EQ(t.n, 12000);
    ASSERT(prompt > 135000000ull && prompt < 155000000ull);
    ASSERT(pct > 35.0 && pct < 40.0);
    kvp__trace_cleanup(&t);
    free(text);
}

TEST_LIST(T(test_trace_reads_mooncake_lines), T(test_trace_skips_not_json), T(test_trace_skips_hash_len_mismatch),
          T(test_trace_skips_negative_lengths), T(test_trace_skips_missing_field),
          T(test_trace_skips_decreasing_timestamp), T(test_trace_skips_line_over_64mib),
          T(test_trace_load_errors), T(test_trace_read_out_of_memory_frees_all),
          T(test_trace_bound_prefix_rule), T(test_trace_synthetic_bound), T(test_trace_gen_deterministic),
          T(test_trace_gen_bad_params), T(test_trace_gen_valid),
          T(test_trace_gen_defaults_like_conversation_trace))
