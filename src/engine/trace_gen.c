/*
 * Synthetic Mooncake-format traces (`kvpool trace-gen`, trace.h).
 *
 * The model.  `sessions` conversations share `requests` turns: each gets one
 * turn plus a binomial share of the rest (mean requests / sessions turns,
 * variance about half of (mean - 1)), the sum made exact by moving single
 * turns.  A conversation opens with one of `system_prompts` shared system
 * prompts (1..3 whole blocks, chosen with a skew toward the first ones, so
 * that sessions share a leading run of ids), then its turns:
 *
 *   prompt 1     = system + U1                       U1 ~ 16 + Exp(GEN_FIRST_MEAN)
 *   prompt k + 1 = prompt k + output k + U(k + 1)    U  ~ 16 + Exp(GEN_NEXT_MEAN)
 *   output k     ~ 1 + Exp(GEN_OUT_MEAN), at most GEN_OUT_MAX
 *
 * A prompt that would pass GEN_MAX_PROMPT starts over from the system prompt
 * (the client dropped the history).  Ids are prefix hashes: prompt k + 1
 * repeats the ids of prompt k's full blocks, and every block after them gets
 * a new id, the one holding prompt k's partial last block included (its
 * content now differs).  New ids are numbered in order of first use, so the
 * ids are dense from 0 as in the Mooncake files.
 *
 * Time.  Arrivals are one Poisson process of `rate` requests per second.
 * Each arrival is given to the session that has waited longest since it
 * became ready (its previous turn's arrival + a decode estimate of its output
 * + an exponential think time); when none is ready yet a new session starts;
 * when none is left to start, the earliest ready one takes it anyway.  So
 * turns of a session arrive in order, interleaved with other sessions.
 *
 * The defaults were tuned for `--requests 12000`: about 145 M prompt tokens
 * (12 K a request) and an infinite-cache bound near 37 %, as the Mooncake
 * conversation trace (12,031 requests, 12,035 tokens a request, 37.4 %).
 *
 * Determinism.  Every draw comes from xoshiro256** streams seeded by
 * splitmix64 from the seed (one for the plan, one for the arrivals, one per
 * session), and the exponential variates use a fixed-point logarithm in
 * integer arithmetic: no libm, no floating-point rounding that a compiler or
 * a machine could do differently.  The rate is turned into a mean
 * inter-arrival in microseconds by one IEEE division, which is exact-rounded
 * everywhere.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/mix.h"
#include "engine/trace.h"

#define GEN_FIRST_MEAN 4500u         /* tokens of a first user turn, beyond the minimum */
#define GEN_NEXT_MEAN 10000u          /* tokens of a later user turn */
#define GEN_MIN_USER 16u
#define GEN_OUT_MEAN 340u            /* output tokens */
#define GEN_OUT_MAX 4096u
#define GEN_MAX_PROMPT 131072u       /* a 128 K context */
#define GEN_SYS_MAX_BLOCKS 3u
#define GEN_THINK_MEAN_US 30000000u  /* 30 s */
#define GEN_DECODE_US_PER_TOKEN 20000u
#define GEN_BLOCK KVP__TRACE_BLOCK_TOKENS

/* ---------------------------------------------------------------- random */

typedef struct gen_rng {
    uint64_t s[4];
} gen_rng_t;

static void gen_rng_seed(gen_rng_t *r, uint64_t seed, uint64_t stream)
{
    uint64_t x = seed ^ (stream * 0xd1342543de82ef95ull);
    for (int i = 0; i < 4; i++)
        r->s[i] = kvp__splitmix64(&x);
}

static uint64_t gen_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t gen_next(gen_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = gen_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = gen_rotl(s[3], 45);
    return out;
}

/* Uniform in [0, n), n >= 1 (rejection: no modulo bias). */
static uint64_t gen_below(gen_rng_t *r, uint64_t n)
{
    uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do
        x = gen_next(r);
    while (x >= lim);
    return x % n;
}

/*
 * Exp(1) in Q32.32 as -ln(v / 2^53), v uniform in [1, 2^53].  With
 * v = m * 2^k, m in [1, 2): -ln = (53 - k) ln 2 - ln m, and
 * ln m = 2 atanh(z) = 2 (z + z^3/3 + z^5/5 + ...), z = (m - 1) / (m + 1) < 1/3,
 * summed in Q62 until the terms vanish (about 20).
 */
#define GEN_LN2_Q62 3196577161300663915ull

static uint64_t gen_exp_q32(gen_rng_t *r)
{
    uint64_t v = (gen_next(r) >> 11) + 1;
    int k = 63 - __builtin_clzll(v);
    uint64_t m = v << (62 - k); /* Q62, in [2^62, 2^63) */
    uint64_t one = 1ull << 62;
    uint64_t z = (uint64_t)(((unsigned __int128)(m - one) << 62) / (m + one));
    uint64_t z2 = (uint64_t)(((unsigned __int128)z * z) >> 62);
    uint64_t pow = z, sum = 0;
    for (uint64_t j = 1; pow != 0; j += 2) {
        sum += pow / j;
        pow = (uint64_t)(((unsigned __int128)pow * z2) >> 62);
    }
    unsigned __int128 neg = (unsigned __int128)(53 - k) * GEN_LN2_Q62;
    neg -= (unsigned __int128)2 * sum;
    return (uint64_t)(neg >> 30);
}

/* mean x Exp(1), rounded down. */
static uint64_t gen_exp(gen_rng_t *r, uint64_t mean)
{
    return (uint64_t)(((unsigned __int128)mean * gen_exp_q32(r)) >> 32);
}

/* ---------------------------------------------------------------- model */

typedef struct gen_session {
    gen_rng_t rng;
    uint32_t turns_left; /* turns not yet emitted */
    uint32_t sys;        /* its system prompt, or UINT32_MAX for none */
    uint64_t prompt;     /* tokens of its last prompt (0 before its first) */
    uint64_t output;     /* tokens of its last output */
    int64_t ready_us;    /* when its next turn may come */
    int64_t *ids;        /* ids of the last prompt's full blocks */
    size_t nids, cap;
} gen_session_t;

typedef struct gen {
    const kvp__trace_gen_params_t *p;
    FILE *f;
    gen_session_t *ss;
    uint64_t ns;
    uint32_t *sys_blocks;   /* per system prompt: its length in blocks */
    int64_t *sys_first_id;  /* per system prompt: its first id, -1 before first use */
    int64_t next_id;
    uint64_t *heap;         /* sessions waiting for their next turn, by (ready_us, index) */
    size_t nheap;
} gen_t;

static bool gen_heap_less(const gen_t *g, uint64_t a, uint64_t b)
{
    int64_t ra = g->ss[a].ready_us, rb = g->ss[b].ready_us;
    return ra != rb ? ra < rb : a < b;
}

static void gen_heap_push(gen_t *g, uint64_t s)
{
    size_t i = g->nheap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!gen_heap_less(g, s, g->heap[up]))
            break;
        g->heap[i] = g->heap[up];
        i = up;
    }
    g->heap[i] = s;
}

static uint64_t gen_heap_pop(gen_t *g)
{
    uint64_t top = g->heap[0], last = g->heap[--g->nheap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= g->nheap)
            break;
        if (c + 1 < g->nheap && gen_heap_less(g, g->heap[c + 1], g->heap[c]))
            c++;
        if (!gen_heap_less(g, g->heap[c], last))
            break;
        g->heap[i] = g->heap[c];
        i = c;
    }
    if (g->nheap > 0)
        g->heap[i] = last;
    return top;
}

/* Turns per session: 1 + Binomial(n, p) with n = ceil(2 (mean - 1)) and
 * n p = mean - 1, then single turns moved until they sum to requests. */
static void gen_plan_turns(gen_t *g, gen_rng_t *r)
{
    uint64_t R = g->p->requests, S = g->ns, extra = R - S, sum = 0;
    uint64_t n = (2 * extra + S - 1) / S;
    /* p = extra / (S n) as a 53-bit threshold. */
    uint64_t thr = n ? (uint64_t)(((unsigned __int128)extra << 53) / ((unsigned __int128)S * n)) : 0;
    for (uint64_t s = 0; s < S; s++) {
        uint64_t e = 0;
        for (uint64_t j = 0; j < n; j++)
            e += (gen_next(r) >> 11) < thr;
        g->ss[s].turns_left = (uint32_t)(1 + e);
        sum += e;
    }
    while (sum > extra) {
        gen_session_t *s = &g->ss[gen_below(r, S)];
        if (s->turns_left > 1) {
            s->turns_left--;
            sum--;
        }
    }
    while (sum < extra) {
        g->ss[gen_below(r, S)].turns_left++;
        sum++;
    }
}

static uint64_t gen_user_tokens(gen_session_t *s, uint64_t mean)
{
    return GEN_MIN_USER + gen_exp(&s->rng, mean);
}

static kvp_status_t gen_emit(gen_t *g, gen_session_t *s, int64_t t_us)
{
    uint64_t sys_tokens = 0;
    if (s->sys != UINT32_MAX)
        sys_tokens = (uint64_t)g->sys_blocks[s->sys] * GEN_BLOCK;
    uint64_t prompt, keep;
    if (s->prompt == 0 || s->prompt + s->output + GEN_MIN_USER > GEN_MAX_PROMPT) {
        /* A first turn, or the history dropped: system prompt + a user turn. */
        uint64_t u = gen_user_tokens(s, s->prompt == 0 ? GEN_FIRST_MEAN : GEN_NEXT_MEAN);
        if (u > GEN_MAX_PROMPT - sys_tokens)
            u = GEN_MAX_PROMPT - sys_tokens;
        prompt = sys_tokens + u;
        keep = 0;
        if (s->sys != UINT32_MAX) {
            if (g->sys_first_id[s->sys] < 0) {
                g->sys_first_id[s->sys] = g->next_id;
                g->next_id += g->sys_blocks[s->sys];
            }
            keep = g->sys_blocks[s->sys];
            if (kvp__grow_in((void **)&s->ids, &s->cap, keep, sizeof *s->ids, 8) != 0)
                return KVP_ERR_NO_MEMORY;
            for (uint64_t i = 0; i < keep; i++)
                s->ids[i] = g->sys_first_id[s->sys] + (int64_t)i;
        }
    } else {
        uint64_t u = gen_user_tokens(s, GEN_NEXT_MEAN);
        uint64_t room = GEN_MAX_PROMPT - s->prompt - s->output;
        prompt = s->prompt + s->output + (u < room ? u : room);
        keep = s->nids;
    }
    uint64_t nb = (prompt + GEN_BLOCK - 1) / GEN_BLOCK, full = prompt / GEN_BLOCK;
    if (kvp__grow_in((void **)&s->ids, &s->cap, nb, sizeof *s->ids, 8) != 0)
        return KVP_ERR_NO_MEMORY;
    for (uint64_t i = keep; i < nb; i++)
        s->ids[i] = g->next_id++;
    uint64_t out = 1 + gen_exp(&s->rng, GEN_OUT_MEAN - 1);
    if (out > GEN_OUT_MAX)
        out = GEN_OUT_MAX;

    if (fprintf(g->f, "{\"timestamp\": %" PRId64 ", \"input_length\": %" PRIu64
                      ", \"output_length\": %" PRIu64 ", \"hash_ids\": [",
                t_us / 1000, prompt, out) < 0)
        return KVP_ERR_IO;
    for (uint64_t i = 0; i < nb; i++)
        if (fprintf(g->f, i ? ", %" PRId64 : "%" PRId64, s->ids[i]) < 0)
            return KVP_ERR_IO;
    if (fputs("]}\n", g->f) == EOF)
        return KVP_ERR_IO;

    s->prompt = prompt;
    s->output = out;
    s->nids = full; /* the partial last block is not part of the next prompt's prefix */
    s->turns_left--;
    s->ready_us = t_us + (int64_t)(out * GEN_DECODE_US_PER_TOKEN) +
                  (int64_t)gen_exp(&s->rng, GEN_THINK_MEAN_US);
    return KVP_OK;
}

void kvp__trace_gen_params_init(kvp__trace_gen_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->requests = 12000;
    p->sessions = 0;
    p->turns = 2;
    p->system_prompts = 8;
    p->rate = 2.0;
    p->seed = 1;
}

static void gen_cleanup(gen_t *g)
{
    if (g->ss)
        for (uint64_t i = 0; i < g->ns; i++)
            kvp__free(g->ss[i].ids, g->ss[i].cap * sizeof *g->ss[i].ids);
    kvp__free(g->ss, g->ns * sizeof *g->ss);
    kvp__free(g->heap, g->ns * sizeof *g->heap);
    kvp__free(g->sys_blocks, g->p->system_prompts * sizeof *g->sys_blocks);
    kvp__free(g->sys_first_id, g->p->system_prompts * sizeof *g->sys_first_id);
}

kvp_status_t kvp__trace_gen(const kvp__trace_gen_params_t *p, FILE *f)
{
    if (!p || !f)
        return KVP_ERR_NULL_POINTER;
    uint64_t ns = p->sessions ? p->sessions : (p->turns ? (p->requests + p->turns - 1) / p->turns : 0);
    bool rate_ok = p->rate >= 1e-3 && p->rate <= 1e6;
    /* One exact-rounded IEEE division, at most 1e9 us; the clock (int64 us)
     * must hold every gap at its longest draw (36.7 x the mean, < 64 x). */
    uint64_t gap_us = rate_ok ? (uint64_t)(1e6 / p->rate) : 0;
    if (p->requests == 0 || p->requests > UINT32_MAX || p->turns == 0 || ns > p->requests || !rate_ok ||
        (unsigned __int128)p->requests * gap_us * 64 > INT64_MAX) {
        kvp_error("trace-gen: bad parameters (requests %" PRIu64 ", sessions %" PRIu64
                  ", turns %u, rate %g)",
                  p->requests, p->sessions, p->turns, p->rate);
        return KVP_ERR_INVALID_ARG;
    }
    gen_t g;
    memset(&g, 0, sizeof g);
    g.p = p;
    g.f = f;
    g.ns = ns;
    g.ss = kvp__calloc(ns, sizeof *g.ss);
    g.heap = kvp__malloc(ns * sizeof *g.heap);
    if (p->system_prompts) {
        g.sys_blocks = kvp__malloc(p->system_prompts * sizeof *g.sys_blocks);
        g.sys_first_id = kvp__malloc(p->system_prompts * sizeof *g.sys_first_id);
    }
    kvp_status_t st = KVP_OK;
    if (!g.ss || !g.heap || (p->system_prompts && (!g.sys_blocks || !g.sys_first_id))) {
        st = KVP_ERR_NO_MEMORY;
        goto out;
    }

    gen_rng_t plan, arrivals;
    gen_rng_seed(&plan, p->seed, 0);
    gen_rng_seed(&arrivals, p->seed, 1);
    for (uint32_t i = 0; i < p->system_prompts; i++) {
        g.sys_blocks[i] = 1 + (uint32_t)gen_below(&plan, GEN_SYS_MAX_BLOCKS);
        g.sys_first_id[i] = -1;
    }
    gen_plan_turns(&g, &plan);
    for (uint64_t s = 0; s < ns; s++) {
        gen_rng_seed(&g.ss[s].rng, p->seed, 2 + s);
        g.ss[s].sys = UINT32_MAX;
        if (p->system_prompts) {
            /* u^2 skews the choice toward the first prompts. */
            uint64_t u = gen_next(&plan) >> 32;
            g.ss[s].sys = (uint32_t)((((u * u) >> 32) * p->system_prompts) >> 32);
        }
    }

    int64_t t_us = 0;
    uint64_t next_new = 0;
    for (uint64_t i = 0; i < p->requests && st == KVP_OK; i++) {
        if (i > 0)
            t_us += (int64_t)gen_exp(&arrivals, gap_us);
        uint64_t s;
        if (g.nheap > 0 && g.ss[g.heap[0]].ready_us <= t_us)
            s = gen_heap_pop(&g);
        else if (next_new < ns)
            s = next_new++;
        else
            s = gen_heap_pop(&g);
        st = gen_emit(&g, &g.ss[s], t_us);
        if (st != KVP_OK)
            break;
        if (g.ss[s].turns_left > 0) {
            gen_heap_push(&g, s);
        } else {
            kvp__free(g.ss[s].ids, g.ss[s].cap * sizeof *g.ss[s].ids);
            g.ss[s].ids = NULL;
            g.ss[s].cap = g.ss[s].nids = 0;
        }
    }
    if (st == KVP_OK && (fflush(f) != 0 || ferror(f)))
        st = KVP_ERR_IO;
    if (st == KVP_ERR_IO)
        kvp_error("trace-gen: write error");
out:
    if (st == KVP_ERR_NO_MEMORY)
        kvp_error("trace-gen: out of memory");
    gen_cleanup(&g);
    return st;
}
