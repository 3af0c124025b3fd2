/*
 * `kvpool trace-gen`: a synthetic Mooncake-format trace on stdout
 * (src/engine/trace_gen.c has the model), deterministic for its flags, and a
 * one-line summary on stderr: requests, prompt tokens and the trace's
 * infinite-cache bound, read back from the very bytes written.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/units.h"
#include "engine/trace.h"

#define TG_MAX_REQUESTS 10000000ull /* ten million: about 4 GB of trace */
#define TG_MAX_SYSTEM_PROMPTS 1000000ull

static void trace_gen_usage(FILE *out)
{
    fprintf(out,
            "usage: kvpool trace-gen [--requests N] [--sessions N] [--turns N]\n"
            "                        [--system-prompts N] [--rate R] [--seed S] > FILE\n"
            "\n"
            "Writes a synthetic Mooncake-format trace (JSON Lines: timestamp ms, input_length,\n"
            "output_length, hash_ids of 512-token prefix blocks) to stdout: multi-turn sessions\n"
            "whose every turn extends the previous prompt and its output, shared system\n"
            "prompts, Poisson arrivals.  The same flags give the same bytes.  A summary\n"
            "(requests, prompt tokens, infinite-cache bound) goes to stderr.\n"
            "\n"
            "  --requests N        requests (lines), 1..%llu (default 12000)\n"
            "  --sessions N        conversations sharing them, 1..requests\n"
            "                      (default requests / turns)\n"
            "  --turns N           mean turns per session when --sessions is not given (default 2)\n"
            "  --system-prompts N  shared system prompts of 1-3 blocks, 0..%llu (default 8)\n"
            "  --rate R            mean arrivals per second, 0.001..1000000 (default 2)\n"
            "  --seed S            any unsigned 64-bit integer (default 1)\n"
            "\n"
            "Per session: a first user turn of 16 + Exp(4,500) tokens, later ones of\n"
            "16 + Exp(10,000), outputs of 1 + Exp(339) (at most 4,096), a 128 K context (a\n"
            "longer history restarts from the system prompt), 30 s mean think time.  The\n"
            "defaults give about 145 M prompt tokens and a bound near 37 %%, as the Mooncake\n"
            "conversation trace; --requests 300 --sessions 100 about 4.8 M tokens and 50 %%.\n",
            TG_MAX_REQUESTS, TG_MAX_SYSTEM_PROMPTS);
}

static int tg_bad(const char *what, const char *v)
{
    fprintf(stderr, "kvpool trace-gen: bad %s '%s' (see kvpool trace-gen --help)\n", what, v);
    return 2;
}

/* A plain decimal number (digits, one optional '.', optional exponent), finite. */
static int tg_parse_rate(const char *s, double *v_p)
{
    if (!((s[0] >= '0' && s[0] <= '9') || s[0] == '.'))
        return -1;
    for (const char *c = s; *c; c++)
        if (!strchr("0123456789.eE+-", *c))
            return -1; /* no hex, inf or nan */
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || !(v >= 1e-3) || v > 1e6)
        return -1;
    *v_p = v;
    return 0;
}

/* The summary: the bytes written, read back as the replay reads them. */
static int tg_summary(const char *buf, size_t len, uint64_t sessions)
{
    FILE *f = fmemopen((void *)buf, len, "r");
    if (!f) {
        fprintf(stderr, "kvpool trace-gen: cannot read the trace back: %s\n", strerror(errno));
        return 1;
    }
    kvp__trace_t t;
    kvp_status_t st = kvp__trace_read(f, "trace-gen", 0, &t);
    fclose(f);
    uint64_t prompt = 0, bound = 0;
    if (st == KVP_OK)
        st = kvp__trace_bound(&t, &prompt, &bound, NULL);
    if (st != KVP_OK || t.skipped) {
        fprintf(stderr, "kvpool trace-gen: the trace does not read back (%s, %" PRIu64 " bad lines)\n",
                kvp_status_str(st), t.skipped);
        kvp__trace_cleanup(&t);
        return 1;
    }
    double span_s = t.n ? (double)t.reqs[t.n - 1].timestamp_ms / 1e3 : 0;
    fprintf(stderr,
            "trace-gen: %zu requests, %" PRIu64 " sessions, %" PRIu64 " prompt tokens (%.0f a request), "
            "%" PRId64 " unique blocks, infinite-cache bound %.1f %%, span %.0f s\n",
            t.n, sessions, prompt, t.n ? (double)prompt / (double)t.n : 0.0, t.max_hash_id + 1,
            prompt ? 100.0 * (double)bound / (double)prompt : 0.0, span_s);
    kvp__trace_cleanup(&t);
    return 0;
}

int kvp_cmd_trace_gen(int argc, char **argv)
{
    kvp__trace_gen_params_t p;
    kvp__trace_gen_params_init(&p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            trace_gen_usage(stdout);
            return 0;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "kvpool trace-gen: unexpected argument '%s' (the trace goes to stdout)\n", a);
            trace_gen_usage(stderr);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvpool trace-gen: %s needs a value\n", a);
            trace_gen_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        uint64_t n;
        if (!strcmp(a, "--requests")) {
            if (kvp__parse_u64(v, 1, TG_MAX_REQUESTS, &p.requests))
                return tg_bad("--requests", v);
        } else if (!strcmp(a, "--sessions")) {
            if (kvp__parse_u64(v, 1, TG_MAX_REQUESTS, &p.sessions))
                return tg_bad("--sessions", v);
        } else if (!strcmp(a, "--turns")) {
            if (kvp__parse_u64(v, 1, TG_MAX_REQUESTS, &n))
                return tg_bad("--turns", v);
            p.turns = (uint32_t)n;
        } else if (!strcmp(a, "--system-prompts")) {
            if (kvp__parse_u64(v, 0, TG_MAX_SYSTEM_PROMPTS, &n))
                return tg_bad("--system-prompts", v);
            p.system_prompts = (uint32_t)n;
        } else if (!strcmp(a, "--rate")) {
            if (tg_parse_rate(v, &p.rate))
                return tg_bad("--rate", v);
        } else if (!strcmp(a, "--seed")) {
            if (kvp__parse_u64(v, 0, UINT64_MAX, &p.seed))
                return tg_bad("--seed", v);
        } else {
            fprintf(stderr, "kvpool trace-gen: unknown option '%s'\n", a);
            trace_gen_usage(stderr);
            return 2;
        }
    }
    if (p.sessions > p.requests) {
        fprintf(stderr, "kvpool trace-gen: --sessions %" PRIu64 " is more than --requests %" PRIu64 "\n",
                p.sessions, p.requests);
        return 2;
    }
    uint64_t sessions = p.sessions ? p.sessions : (p.requests + p.turns - 1) / p.turns;

    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem) {
        fprintf(stderr, "kvpool trace-gen: %s\n", strerror(errno));
        return 1;
    }
    kvp_status_t st = kvp__trace_gen(&p, mem);
    fclose(mem);
    int rc = 1;
    if (st != KVP_OK)
        fprintf(stderr, "kvpool trace-gen: %s\n", kvp_status_str(st));
    else if (fwrite(buf, 1, len, stdout) != len || fflush(stdout) != 0)
        fprintf(stderr, "kvpool trace-gen: cannot write the trace: %s\n", strerror(errno));
    else
        rc = tg_summary(buf, len, sessions);
    free(buf);
    return rc;
}
