/*
 * `kvpool bench --kv-scheduler [--json] [--steps N] [--warmup N] [--seed S]
 *                              [--emit-stream FILE] [--ref DIR]`
 *
 * Times build_connector_meta on a steady serving workload: 256 running
 * requests, about a quarter in chunked prefill (256-token chunks of
 * 2048..6144-token prompts) and the rest decoding one token per step, with 4
 * arrivals (lookup + allocation, as vLLM calls them) and 4 finishes every
 * step.  Only build_connector_meta is timed, once per step.
 *
 * --emit-stream FILE writes the same workload as a kv-sched-replay v1 stream;
 * --ref DIR (the kvsched-ref folder) then runs the original scheduler
 * (ref.py's Replayer) over that stream, times its build_connector_meta the
 * same way, and reports the ratio.  --json prints one compact JSON object as
 * the last line of stdout.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "common/clock.h"
#include "kvpool/kv_connector.h"
#include "support/kv_scripted.h"

#define BS 16
#define RUNNING 256
#define ARRIVALS 4
#define CHUNK 256
#define HASH_LEN 32

typedef struct {
    kvp_kv_request_t v;
    char id[24];
    int64_t *toks;
    size_t cap;
    int64_t prompt, nc, out_left, sched;
    int64_t *blocks;
    size_t nblocks, bcap, new_from;
    bool live;
} breq_t;

typedef struct {
    uint64_t rng;
    breq_t *reqs;
    size_t nreqs, cap;
    int64_t next_block;
    uint8_t *hashes; /* shared dummy hash bytes for every request view */
    FILE *emit;
} bench_t;

static uint64_t rnd(bench_t *b)
{
    b->rng ^= b->rng << 13;
    b->rng ^= b->rng >> 7;
    b->rng ^= b->rng << 17;
    return b->rng;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n);
    if (!q) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    return q;
}

static void push_tok(breq_t *r, int64_t t)
{
    if (r->v.num_all_token_ids == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 1024;
        r->toks = xrealloc(r->toks, r->cap * sizeof *r->toks);
    }
    r->toks[r->v.num_all_token_ids++] = t;
    r->v.all_token_ids = r->toks;
    r->v.num_tokens = (int64_t)r->v.num_all_token_ids;
    r->v.num_block_hashes = r->v.num_all_token_ids / BS;
}

static void grow_blocks(bench_t *b, breq_t *r, int64_t tokens)
{
    size_t need = (size_t)((tokens + BS - 1) / BS);
    r->new_from = r->nblocks;
    while (r->nblocks < need) {
        if (r->nblocks == r->bcap) {
            r->bcap = r->bcap ? r->bcap * 2 : 64;
            r->blocks = xrealloc(r->blocks, r->bcap * sizeof *r->blocks);
        }
        r->blocks[r->nblocks++] = b->next_block++;
    }
}

/* ---- stream emission (kv-sched-replay v1) -------------------------------- */

static void emit_ints(FILE *f, const int64_t *v, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, i ? ",%lld" : "%lld", (long long)v[i]);
    fputc(']', f);
}

static void emit_hashes(FILE *f, size_t from, size_t to)
{
    fputc('[', f);
    for (size_t i = from; i < to; i++)
        fprintf(f, i > from ? ",\"%zx\"" : "\"%zx\"", i);
    fputc(']', f);
}

static void emit_req_full(FILE *f, const breq_t *r)
{
    fprintf(f, "{\"op\":\"req\",\"req_id\":\"%s\",\"num_tokens\":%lld,\"num_computed_tokens\":%lld,"
               "\"all_token_ids\":",
            r->id, (long long)r->v.num_tokens, (long long)r->v.num_computed_tokens);
    emit_ints(f, r->toks, r->v.num_all_token_ids);
    fputs(",\"block_hashes\":", f);
    emit_hashes(f, 0, r->v.num_block_hashes);
    fputs("}\n", f);
}

/* ---- the workload ---------------------------------------------------------- */

typedef struct {
    double *samples;
    size_t n;
} timings_t;

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, size_t n, double p)
{
    if (!n)
        return 0;
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static const char *g_ref_script =
    "import sys, time, statistics\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "sys.dont_write_bytecode = True\n"
    "import ref, json\n"
    "warm = int(sys.argv[3])\n"
    "rep = None; t = []; steps = 0\n"
    "for line in open(sys.argv[2]):\n"
    "    line = line.strip()\n"
    "    if not line: continue\n"
    "    ev = json.loads(line)\n"
    "    if rep is None:\n"
    "        rep = ref.Replayer(ref.parse_config(ev)); inner = rep.sched.build_connector_meta\n"
    "        def timed(so, inner=inner):\n"
    "            t0 = time.perf_counter(); m = inner(so); t.append(time.perf_counter() - t0); return m\n"
    "        rep.sched.build_connector_meta = timed\n"
    "        continue\n"
    "    out = rep.handle(ev)\n"
    "    if 'error' in out: sys.exit('ref.py error: %r' % out)\n"
    "t = sorted(x * 1e6 for x in t[warm:])\n"
    "print('%.3f %.3f %d' % (statistics.median(t), t[int(0.99 * (len(t) - 1))], len(t)))\n";

typedef struct {
    double med, p99;
    size_t live, prefill, nm;
    double metas_per_step;
} result_t;

/* Runs the workload once; times build_connector_meta unless emitting. */
static int run_workload(uint64_t seed, long warmup, long steps, const char *emit_path, result_t *res)
{
    bench_t b;
    memset(&b, 0, sizeof b);
    b.rng = seed * 0x9E3779B97F4A7C15ull + 7;
    b.next_block = 1;
    b.hashes = calloc(8192 / BS + 64, HASH_LEN);
    if (emit_path) {
        b.emit = fopen(emit_path, "w");
        if (!b.emit) {
            perror(emit_path);
            free(b.hashes);
            return 1;
        }
        fprintf(b.emit, "{\"op\":\"config\",\"version\":1,\"kv_role\":\"kv_both\",\"load_async\":true,"
                        "\"lookup_async\":false,\"enable_lookup\":true,\"block_size\":%d,"
                        "\"hash_block_size\":%d,\"partial_hits\":false}\n",
                BS, BS);
    }
    kvp_kv_scripted_t *sc;
    kvp_kv_sched_t *s;
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    if (kvp_kv_scripted_create(&sc) != KVP_OK ||
        kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(sc), &s) != KVP_OK) {
        fprintf(stderr, "bench: cannot create the scheduler\n");
        return 1;
    }
    long total = warmup + steps;
    /* request records never move: the scheduler keeps pointers to their views */
    b.cap = RUNNING + (size_t)(total + 1) * (ARRIVALS * 4) + 64;
    b.reqs = calloc(b.cap, sizeof *b.reqs);
    timings_t tm = {calloc((size_t)total, sizeof(double)), 0};
    const char **finished = calloc(b.cap, sizeof *finished);
    size_t nfin = 0;
    size_t *fin_idx = calloc(b.cap, sizeof *fin_idx);
    kvp_kv_cached_req_t *cached = calloc(RUNNING + 64, sizeof *cached);
    kvp_kv_new_req_t *news = calloc(RUNNING + 64, sizeof *news);
    kvp_kv_ids_t *gv = calloc(2 * RUNNING + 128, sizeof *gv);
    if (!b.reqs || !tm.samples || !finished || !fin_idx || !cached || !news || !gv || !b.hashes) {
        fprintf(stderr, "bench: out of memory\n");
        return 1;
    }
    size_t first_live = 0;
    uint64_t metas = 0;
    int rc = 0;
    for (long step = 0; step < total && rc == 0; step++) {
        size_t ncached = 0, nnew = 0, ngv = 0;
        /* running requests, in arrival order */
        for (size_t i = first_live; i < b.nreqs; i++) {
            breq_t *r = &b.reqs[i];
            if (!r->live)
                continue;
            int64_t total_toks = (int64_t)r->v.num_all_token_ids;
            r->sched = r->nc < r->prompt ? (r->prompt - r->nc < CHUNK ? r->prompt - r->nc : CHUNK)
                                         : total_toks - r->nc;
            grow_blocks(&b, r, r->nc + r->sched);
            kvp_kv_cached_req_t *c = &cached[ncached++];
            memset(c, 0, sizeof *c);
            c->req_id = r->id;
            c->num_computed_tokens = r->nc;
            c->num_scheduled_tokens = r->sched;
            if (r->nblocks > r->new_from) {
                gv[ngv] = (kvp_kv_ids_t){r->blocks + r->new_from, r->nblocks - r->new_from};
                c->new_block_ids = (kvp_kv_blocks_t){&gv[ngv++], 1};
            }
        }
        /* arrivals keep RUNNING requests scheduled */
        size_t want = step == 0 ? RUNNING : (ncached < RUNNING ? RUNNING - ncached : 0);
        if (want > 64 && step > 0)
            want = 64;
        if (b.nreqs + want > b.cap) {
            fprintf(stderr, "bench: request table full\n");
            rc = 1;
            break;
        }
        for (size_t k = 0; k < want; k++) {
            breq_t *r = &b.reqs[b.nreqs++];
            memset(r, 0, sizeof *r);
            snprintf(r->id, sizeof r->id, "r%zu", b.nreqs);
            r->v.req_id = r->id;
            r->v.block_hashes = b.hashes;
            r->v.hash_len = HASH_LEN;
            r->prompt = 2048 + (int64_t)(rnd(&b) % 4097);
            for (int64_t t = 0; t < r->prompt; t++)
                push_tok(r, (int64_t)(rnd(&b) % 50000));
            r->out_left = 40 + (int64_t)(rnd(&b) % 17);
            r->live = true;
            if (step == 0) {
                /* initial population spread over its lifetime: most decoding,
                 * some mid-prefill, so the steady mix is reached quickly */
                int64_t phase = (int64_t)(rnd(&b) % 64);
                if (phase < 48) {
                    r->nc = r->prompt;
                    push_tok(r, 1);
                    r->out_left = 1 + phase;
                } else {
                    r->nc = (r->prompt / CHUNK) * CHUNK * (phase - 48) / 16;
                }
            }
            r->v.num_computed_tokens = r->nc;
            if (b.emit) {
                emit_req_full(b.emit, r);
                fprintf(b.emit, "{\"op\":\"get_num_new_matched_tokens\",\"req_id\":\"%s\","
                                "\"num_computed_tokens\":%lld,\"lookup\":0}\n",
                        r->id, (long long)r->nc);
            }
            int64_t ext;
            bool la;
            kvp_kv_scripted_set_lookup(sc, 0, false);
            if (kvp_kv_sched_get_num_new_matched_tokens(s, &r->v, r->nc, &ext, &la) != KVP_OK)
                rc = 1;
            int64_t total_toks = (int64_t)r->v.num_all_token_ids;
            r->sched = r->nc < r->prompt ? (r->prompt - r->nc < CHUNK ? r->prompt - r->nc : CHUNK)
                                         : total_toks - r->nc;
            grow_blocks(&b, r, r->nc + r->sched);
            r->new_from = r->nblocks;
            gv[ngv] = (kvp_kv_ids_t){r->blocks, r->nblocks};
            kvp_kv_blocks_t blk = {&gv[ngv++], 1};
            if (b.emit) {
                fprintf(b.emit, "{\"op\":\"update_state_after_alloc\",\"req_id\":\"%s\",\"block_ids\":[",
                        r->id);
                emit_ints(b.emit, r->blocks, r->nblocks);
                fputs("],\"num_external_tokens\":0}\n", b.emit);
            }
            if (kvp_kv_sched_update_state_after_alloc(s, &r->v, &blk, 0) != KVP_OK)
                rc = 1;
            kvp_kv_new_req_t *x = &news[nnew++];
            memset(x, 0, sizeof *x);
            x->req_id = r->id;
            x->num_computed_tokens = r->nc;
            x->num_scheduled_tokens = r->sched;
            x->block_ids = blk;
            x->prompt_token_ids = r->toks;
            x->num_prompt_token_ids = (size_t)r->prompt;
        }
        if (b.emit) {
            FILE *f = b.emit;
            fputs("{\"op\":\"build_connector_meta\",\"finished_req_ids\":[", f);
            for (size_t i = 0; i < nfin; i++)
                fprintf(f, "%s\"%s\"", i ? "," : "", finished[i]);
            fputs("],\"preempted_req_ids\":null,\"scheduled_new_reqs\":[", f);
            for (size_t i = 0; i < nnew; i++) {
                fprintf(f, "%s{\"req_id\":\"%s\",\"num_computed_tokens\":%lld,\"block_ids\":[",
                        i ? "," : "", news[i].req_id, (long long)news[i].num_computed_tokens);
                emit_ints(f, news[i].block_ids.groups[0].ids, news[i].block_ids.groups[0].n);
                fputs("],\"prompt_token_ids\":", f);
                emit_ints(f, news[i].prompt_token_ids, news[i].num_prompt_token_ids);
                fputs("}", f);
            }
            fputs("],\"scheduled_cached_reqs\":{\"req_ids\":[", f);
            for (size_t i = 0; i < ncached; i++)
                fprintf(f, "%s\"%s\"", i ? "," : "", cached[i].req_id);
            fputs("],\"new_block_ids\":[", f);
            for (size_t i = 0; i < ncached; i++) {
                if (i)
                    fputc(',', f);
                if (cached[i].new_block_ids.num_groups) {
                    fputc('[', f);
                    emit_ints(f, cached[i].new_block_ids.groups[0].ids, cached[i].new_block_ids.groups[0].n);
                    fputc(']', f);
                } else {
                    fputs("null", f);
                }
            }
            fputs("],\"num_computed_tokens\":[", f);
            for (size_t i = 0; i < ncached; i++)
                fprintf(f, i ? ",%lld" : "%lld", (long long)cached[i].num_computed_tokens);
            fputs("],\"resumed_req_ids\":[]},\"num_scheduled_tokens\":{", f);
            for (size_t i = 0; i < ncached; i++)
                fprintf(f, "%s\"%s\":%lld", i ? "," : "", cached[i].req_id,
                        (long long)cached[i].num_scheduled_tokens);
            for (size_t i = 0; i < nnew; i++)
                fprintf(f, "%s\"%s\":%lld", ncached + i ? "," : "", news[i].req_id,
                        (long long)news[i].num_scheduled_tokens);
            fputs("}}\n", f);
        }
        kvp_kv_sched_output_t so = {finished, nfin, NULL, 0, news, nnew, cached, ncached, NULL, 0};
        const kvp_kv_meta_t *m;
        uint64_t t0 = kvp__now_ns();
        kvp_status_t st = kvp_kv_sched_build_connector_meta(s, &so, &m);
        uint64_t t1 = kvp__now_ns();
        if (st != KVP_OK) {
            fprintf(stderr, "bench: build_connector_meta failed: %s\n", kvp_status_str(st));
            rc = 1;
            break;
        }
        if (step > 0) { /* step 0 admits the initial population: not timed */
            metas += m->num_requests;
            tm.samples[tm.n++] = (double)(t1 - t0) / 1e3;
        }
        /* the scheduler has forgotten last step's finished requests */
        for (size_t i = 0; i < nfin; i++) {
            breq_t *r = &b.reqs[fin_idx[i]];
            free(r->toks);
            free(r->blocks);
            r->toks = NULL;
            r->blocks = NULL;
        }
        /* the step runs: tokens computed, outputs sampled, finishes */
        nfin = 0;
        for (size_t i = first_live; i < b.nreqs; i++) {
            breq_t *r = &b.reqs[i];
            if (!r->live)
                continue;
            size_t hashes_before = r->v.num_block_hashes;
            r->nc += r->sched;
            r->v.num_computed_tokens = r->nc;
            bool sampled = r->nc >= (int64_t)r->v.num_all_token_ids;
            if (sampled) {
                push_tok(r, (int64_t)(rnd(&b) % 50000));
                r->out_left--;
            }
            if (b.emit && sampled) {
                fprintf(b.emit, "{\"op\":\"req\",\"req_id\":\"%s\",\"num_tokens\":%lld,"
                                "\"num_computed_tokens\":%lld,\"append_token_ids\":[%lld]",
                        r->id, (long long)r->v.num_tokens, (long long)r->nc,
                        (long long)r->toks[r->v.num_all_token_ids - 1]);
                if (r->v.num_block_hashes > hashes_before) {
                    fputs(",\"append_block_hashes\":", b.emit);
                    emit_hashes(b.emit, hashes_before, r->v.num_block_hashes);
                }
                fputs("}\n", b.emit);
            }
            if (r->out_left <= 0) {
                bool delay;
                kvp_kv_ids_t g = {r->blocks, r->nblocks};
                kvp_kv_blocks_t blk = {&g, 1};
                if (b.emit) {
                    fprintf(b.emit, "{\"op\":\"request_finished\",\"req_id\":\"%s\",\"block_ids\":[", r->id);
                    emit_ints(b.emit, r->blocks, r->nblocks);
                    fputs("]}\n", b.emit);
                }
                if (kvp_kv_sched_request_finished(s, r->id, &blk, &delay) != KVP_OK)
                    rc = 1;
                r->live = false;
                fin_idx[nfin] = i;
                finished[nfin++] = r->id;
            }
        }
        while (first_live < b.nreqs && !b.reqs[first_live].live)
            first_live++;
    }
    if (b.emit)
        fclose(b.emit);
    size_t live = 0, prefill = 0;
    for (size_t i = 0; i < b.nreqs; i++)
        if (b.reqs[i].live) {
            live++;
            prefill += b.reqs[i].nc < b.reqs[i].prompt;
        }
    double *meas = tm.samples + (tm.n > (size_t)warmup ? (size_t)warmup : 0);
    size_t nm = tm.n > (size_t)warmup ? tm.n - (size_t)warmup : tm.n;
    qsort(meas, nm, sizeof *meas, cmp_d);
    double med = pct(meas, nm, 0.5), p99 = pct(meas, nm, 0.99);
    res->med = med;
    res->p99 = p99;
    res->live = live;
    res->prefill = prefill;
    res->nm = nm;
    res->metas_per_step = (double)metas / (double)(tm.n ? tm.n : 1);
    kvp_kv_sched_destroy(s);
    kvp_kv_scripted_destroy(sc);
    for (size_t i = 0; i < b.nreqs; i++) {
        free(b.reqs[i].toks);
        free(b.reqs[i].blocks);
    }
    free(b.reqs);
    free(fin_idx);
    free(b.hashes);
    free(tm.samples);
    free(finished);
    free(cached);
    free(news);
    free(gv);
    return rc;
}

int kvp_bench_kv_scheduler(int argc, char **argv)
{
    int json = 0;
    long steps = 2000, warmup = 200;
    uint64_t seed = 1;
    const char *emit_path = NULL, *ref_dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kv-scheduler"))
            continue;
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atol(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atol(argv[++i]);
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc)
            seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--emit-stream") && i + 1 < argc)
            emit_path = argv[++i];
        else if (!strcmp(argv[i], "--ref") && i + 1 < argc)
            ref_dir = argv[++i];
        else {
            fprintf(stderr, "usage: kvpool bench --kv-scheduler [--json] [--steps N] [--warmup N] "
                            "[--seed S] [--emit-stream FILE] [--ref KVSCHED_REF_DIR]\n");
            return 2;
        }
    }
    if (steps < 1 || warmup < 0) {
        fprintf(stderr, "bench: --steps must be >= 1\n");
        return 2;
    }
    char tmp_stream[64] = "";
    if (ref_dir && !emit_path) {
        snprintf(tmp_stream, sizeof tmp_stream, "/tmp/kvp-bench-kv-%d.jsonl", (int)getpid());
        emit_path = tmp_stream;
    }
    result_t res, ignore;
    int rc = run_workload(seed, warmup, steps, NULL, &res);
    double med = res.med, p99 = res.p99;
    /* the stream for ref.py comes from a second, untimed run of the same
     * workload (writing it while timing would distort the C numbers) */
    if (rc == 0 && emit_path)
        rc = run_workload(seed, warmup, steps, emit_path, &ignore);
    double ref_med = 0, ref_p99 = 0;
    int have_ref = 0;
    if (rc == 0 && ref_dir) {
        char script_path[64], cmd[1024];
        snprintf(script_path, sizeof script_path, "/tmp/kvp-bench-kv-ref-%d.py", (int)getpid());
        FILE *f = fopen(script_path, "w");
        if (f) {
            fputs(g_ref_script, f);
            fclose(f);
            snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s '%s' '%s' %ld", script_path, ref_dir,
                     emit_path, warmup);
            FILE *p = popen(cmd, "r");
            long n = 0;
            if (p && fscanf(p, "%lf %lf %ld", &ref_med, &ref_p99, &n) == 3)
                have_ref = 1;
            if (p)
                pclose(p);
            remove(script_path);
        }
        if (!have_ref)
            fprintf(stderr, "bench: running ref.py failed\n");
    }
    if (tmp_stream[0])
        remove(tmp_stream);
    printf("kv scheduler: build_connector_meta, %zu running (%zu in prefill), %d arrivals/step, "
           "%ld steps measured\n",
           res.live, res.prefill, ARRIVALS, (long)res.nm);
    printf("  C:      median %.2f us/step, p99 %.2f us/step (%.1f metas/step)\n", med, p99,
           res.metas_per_step);
    if (have_ref)
        printf("  ref.py: median %.2f us/step, p99 %.2f us/step -> C is %.0fx faster (median)\n",
               ref_med, ref_p99, med > 0 ? ref_med / med : 0);
    printf("  target: <= 50 us/step median: %s\n", med <= 50.0 ? "met" : "NOT met");
    if (json) {
        printf("{\"bench\":\"kv-scheduler\",\"running\":%zu,\"prefill\":%zu,\"steps\":%zu,"
               "\"meta_us_per_step\":%.3f,\"meta_us_p99\":%.3f",
               res.live, res.prefill, res.nm, med, p99);
        if (have_ref)
            printf(",\"ref_us_per_step\":%.3f,\"ref_us_p99\":%.3f,\"ref_ratio\":%.1f", ref_med, ref_p99,
                   med > 0 ? ref_med / med : 0);
        printf("}\n");
    }
    return rc;
}
