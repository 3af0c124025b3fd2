/*
 * The replay: one virtual clock over every instance of a run.
 *
 * The clock moves in windows of one step's fixed cost (step_us, the
 * shortest a step can last).  A window [T0, T0 + step_us) starts at the
 * earliest thing that can happen (an instance's next step or the next
 * arrival); then, in this order:
 *   1. the arrivals inside the window are routed (round-robin, or the
 *      instance with the longest local prefix hit, ties round-robin) -- the
 *      router sees every instance as it stands after all steps begun before
 *      T0;
 *   2. every save whose virtual completion falls inside the window is made
 *      to have really completed (kvp__eng_settle_saves), so that a lookup at
 *      any time in the window finds what the clock says is there;
 *   3. every instance whose next step starts inside the window runs that
 *      one step, all in parallel, on their own threads.
 * An instance runs at most one step per window, since a step lasts at least
 * step_us; and no step of a window can see another's effects, since those
 * are dated after the window (a save completes after its step ends, and a
 * lookup answers only what is visible at its time: visible.c).  So no
 * instance runs a step at virtual time t before every instance has finished
 * its steps before t, and the figures depend only on the trace and the
 * flags, not on the machine (pool evictions aside: which object a full pool
 * evicts depends on the real order of puts).
 */
#include "engine/replay.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/units.h"
#include "engine/content.h"
#include "engine/engine.h"
#include "engine/report.h"
#include "engine/trace.h"

void kvp__replay_params_init(kvp__replay_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->model = "tiny";
    p->instances = 1;
    p->tp = 1;
    p->block_size = 16;
    p->gpu_tokens = 500000;
    p->token_budget = 8192;
    p->max_num_seqs = 256;
    p->prefill_us_per_token = 40.0;
    p->decode_us_per_token = 40.0;
    p->step_us = 5000.0;
    p->link_gbps = 400.0;
    p->lookup_rtt_us = 100.0;
    p->load_async = true;
    p->baseline = true;
    p->pool_timeout_ms = 2000;
    for (uint32_t i = 0; i < KVP__REPLAY_MAX_INSTANCES; i++)
        p->roles[i] = KVP_KV_ROLE_BOTH;
}

/* ---- instance threads -------------------------------------------------- */

typedef struct inst {
    struct run *run;
    uint32_t i;
    kvp__eng_t *eng;
    pthread_t th;
    bool started;
    kvp_status_t st;
} inst_t;

typedef struct run {
    const kvp__replay_params_t *p;
    inst_t *inst;
    pthread_mutex_t mu;
    pthread_cond_t go_cv, done_cv;
    uint64_t gen;
    uint32_t left;
    double wend;
    bool quit;
} run_t;

static void *inst_main(void *arg)
{
    inst_t *in = arg;
    kvp__thread_name("kvp-instance");
    run_t *r = in->run;
    uint64_t seen = 0;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->quit && r->gen == seen)
            pthread_cond_wait(&r->go_cv, &r->mu);
        if (r->quit)
            break;
        seen = r->gen;
        double wend = r->wend;
        pthread_mutex_unlock(&r->mu);
        if (in->st == KVP_OK && kvp__eng_next_us(in->eng) < wend)
            in->st = kvp__eng_step(in->eng);
        pthread_mutex_lock(&r->mu);
        if (--r->left == 0)
            pthread_cond_signal(&r->done_cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void run_window(run_t *r, double wend)
{
    pthread_mutex_lock(&r->mu);
    r->wend = wend;
    r->left = r->p->instances;
    r->gen++;
    pthread_cond_broadcast(&r->go_cv);
    while (r->left)
        pthread_cond_wait(&r->done_cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* ---- one run ------------------------------------------------------------ */

typedef struct shared {
    const kvp__replay_params_t *p;
    const kvp__eng_model_t *model;
    kvp__trace_t trace;
    uint64_t prompt_tokens, bound_tokens;
    kvp__eng_hashes_t hashes;
    uint64_t unique_blocks;
    uint64_t pool_capacity;
    uint64_t rr;
} shared_t;

static kvp_status_t prepare(shared_t *sh, size_t i, kvp__eng_req_t *q, kvp__replay_point_t *pt)
{
    const kvp__trace_req_t *t = &sh->trace.reqs[i];
    int64_t bs = sh->p->block_size;
    memset(q, 0, sizeof *q);
    q->idx = i;
    q->arrival_us = (double)(t->timestamp_ms - sh->trace.reqs[0].timestamp_ms) * 1000.0;
    q->prompt_len = t->input_length;
    q->output_len = t->output_length > 0 ? t->output_length : 1;
    q->point = pt;
    pt->arrival_s = q->arrival_us / 1e6;
    pt->ttft_ms = -1;
    pt->prompt_tokens = (uint32_t)t->input_length;
    size_t ntok = (size_t)(q->prompt_len + q->output_len);
    q->max_hashes = (int64_t)ntok / bs;
    q->tokens = kvp__malloc(ntok * sizeof *q->tokens);
    q->hashes = kvp__malloc((size_t)(q->max_hashes + 1) * KVP__ENG_HASH_LEN);
    if (!q->tokens || !q->hashes)
        return KVP_ERR_NO_MEMORY;
    return kvp__eng_prompt(&sh->hashes, sh->trace.hash_ids + t->hash_off, t->num_hash,
                           t->input_length, q->tokens, q->hashes);
}

static void unprepare(kvp__eng_req_t *q)
{
    kvp__free(q->tokens, (size_t)(q->prompt_len + q->output_len) * sizeof *q->tokens);
    kvp__free(q->hashes, (size_t)(q->max_hashes + 1) * KVP__ENG_HASH_LEN);
    q->tokens = NULL, q->hashes = NULL;
}

static uint32_t route(shared_t *sh, inst_t *inst, const kvp__eng_req_t *q)
{
    uint32_t n = sh->p->instances;
    uint32_t first = (uint32_t)(sh->rr++ % n);
    if (sh->p->router != KVP__ROUTE_PREFIX)
        return first;
    int64_t nfull = (q->prompt_len - 1) / sh->p->block_size, best = -1;
    uint32_t pick = first;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (first + k) % n;
        int64_t hit = kvp__eng_local_hit(inst[i].eng, q->hashes, nfull);
        if (hit > best)
            best = hit, pick = i;
    }
    return pick;
}

/* Requests admitted (or rejected) so far and the hit rate so far. */
static void show_progress(kvp__progress_t *prog, inst_t *inst, uint32_t n, uint64_t rejected)
{
    uint64_t done = rejected, prompt = 0, hit = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvp__eng_stats_t es;
        kvp__eng_stats(inst[i].eng, &es);
        done += es.requests, prompt += es.prompt_tokens;
        hit += es.local_hit_tokens + es.pool_hit_tokens;
    }
    kvp__progress_update(prog, done, prompt ? (double)hit / (double)prompt : 0);
}

static const char *run_label(kvp__replay_kind_t k)
{
    return k == KVP__RUN_POOL ? "pool" : k == KVP__RUN_POOL_FASTER ? "pool (faster)" : "no pool";
}

typedef struct outcome {
    kvp__replay_run_t run;
    kvp__replay_point_t *points;
    bool fatal;
} outcome_t;

static kvp_status_t open_pool(shared_t *sh, kvp_pool_t **pool_p)
{
    char uri[128];
    const char *u = sh->p->pool_uri;
    if (!u) {
        snprintf(uri, sizeof uri, "embedded://?capacity=%" PRIu64, sh->pool_capacity);
        u = uri;
    }
    kvp_status_t st = kvp_pool_open(u, pool_p);
    if (st != KVP_OK)
        fprintf(stderr, "kvpool replay: cannot open the pool %s: %s\n", u, kvp_status_str(st));
    return st;
}

static kvp_status_t do_run(shared_t *sh, kvp__replay_kind_t kind, outcome_t *out)
{
    const kvp__replay_params_t *p = sh->p;
    size_t n = sh->trace.n;
    memset(out, 0, sizeof *out);
    out->points = kvp__calloc(n ? n : 1, sizeof *out->points);
    kvp__eng_req_t *reqs = kvp__calloc(n ? n : 1, sizeof *reqs);
    inst_t *inst = kvp__calloc(p->instances, sizeof *inst);
    if (!out->points || !reqs || !inst) {
        kvp__free(reqs, (n ? n : 1) * sizeof *reqs);
        kvp__free(inst, p->instances * sizeof *inst);
        return KVP_ERR_NO_MEMORY;
    }
    bool connector = kind != KVP__RUN_NO_POOL;
    kvp_pool_t *pool = NULL;
    kvp__eng_visible_t vis;
    kvp__eng_visible_init(&vis);
    char ipc_dir[] = "/tmp/kvpool-replay-XXXXXX";
    char prefix[64] = "";
    kvp_pool_stats_t ps0 = {0}, ps1 = {0};
    kvp_status_t st = KVP_OK;
    if (connector) {
        st = open_pool(sh, &pool);
        if (st == KVP_OK && !mkdtemp(ipc_dir)) {
            fprintf(stderr, "kvpool replay: mkdtemp: %s\n", strerror(errno));
            st = KVP_ERR_IO;
        }
        if (st == KVP_OK)
            kvp_pool_stats(pool, &ps0);
        /* a server may hold other replays' objects: this run's keys are its own */
        if (p->pool_uri)
            snprintf(prefix, sizeof prefix, "replay%ldr%d", (long)getpid(), (int)kind);
    }
    run_t r = {.p = p, .inst = inst};
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.go_cv, NULL);
    pthread_cond_init(&r.done_cv, NULL);
    for (uint32_t i = 0; st == KVP_OK && i < p->instances; i++) {
        kvp__eng_params_t ep = {
            .model = sh->model,
            .index = i,
            .tp = p->tp,
            .block_size = p->block_size,
            .gpu_tokens = p->gpu_tokens,
            .token_budget = p->token_budget,
            .max_num_seqs = p->max_num_seqs,
            .step_us = p->step_us,
            .prefill_us_per_token = p->prefill_us_per_token,
            .decode_us_per_token = p->decode_us_per_token,
            .link_bytes_per_us = p->link_gbps * 1e9 / 8 / 1e6,
            .lookup_rtt_us = p->lookup_rtt_us,
            .pool = pool,
            .visible = &vis,
            .role = p->roles[i],
            .load_async = p->load_async,
            .lookup_async = p->lookup_async,
            .load_policy = kind == KVP__RUN_POOL_FASTER ? 1 : 0,
            .cache_prefix = prefix[0] ? prefix : NULL,
            .ipc_dir = ipc_dir,
            .pool_timeout_ms = p->pool_timeout_ms,
            .corrupt_every = p->corrupt_every,
        };
        inst[i].run = &r;
        inst[i].i = i;
        st = kvp__eng_create(&ep, &inst[i].eng);
        if (st != KVP_OK)
            fprintf(stderr, "kvpool replay: instance %u: %s\n", i, kvp_status_str(st));
    }
    for (uint32_t i = 0; st == KVP_OK && i < p->instances; i++) {
        if (pthread_create(&inst[i].th, NULL, inst_main, &inst[i]))
            st = KVP_ERR_NO_MEMORY;
        else
            inst[i].started = true;
    }

    kvp__progress_t prog;
    kvp__progress_start(&prog, run_label(kind), n);
    uint64_t t0 = kvp__now_ns(), rejected = 0;
    size_t ai = 0;
    int64_t max_tokens = p->gpu_tokens / p->block_size * p->block_size;
    while (st == KVP_OK) {
        double t = INFINITY;
        for (uint32_t i = 0; i < p->instances; i++) {
            double x = kvp__eng_next_us(inst[i].eng);
            if (x < t)
                t = x;
        }
        if (ai < n) {
            double a = (double)(sh->trace.reqs[ai].timestamp_ms - sh->trace.reqs[0].timestamp_ms) * 1000.0;
            if (a < t)
                t = a;
        }
        if (!isfinite(t))
            break;
        double wend = t + p->step_us;
        for (; ai < n; ai++) {
            const kvp__trace_req_t *tr = &sh->trace.reqs[ai];
            double a = (double)(tr->timestamp_ms - sh->trace.reqs[0].timestamp_ms) * 1000.0;
            if (a >= wend)
                break;
            kvp__eng_req_t *q = &reqs[ai];
            st = prepare(sh, ai, q, &out->points[ai]);
            if (st != KVP_OK) {
                unprepare(q);
                break;
            }
            if (q->prompt_len + q->output_len > max_tokens) {
                unprepare(q);
                rejected++;
                KVP_LOG_RL(KVP_LOG_WARN, "replay: request %zu (%" PRId64 " + %" PRId64
                           " tokens) is longer than an instance's KV cache: rejected", ai,
                           q->prompt_len, q->output_len);
                continue;
            }
            kvp__eng_arrive(inst[route(sh, inst, q)].eng, q);
        }
        if (st != KVP_OK)
            break;
        for (uint32_t i = 0; connector && i < p->instances; i++)
            kvp__eng_settle_saves(inst[i].eng, wend);
        run_window(&r, wend);
        for (uint32_t i = 0; i < p->instances; i++)
            if (inst[i].st != KVP_OK)
                st = inst[i].st;
        if (prog.tty)
            show_progress(&prog, inst, p->instances, rejected);
    }
    if (prog.tty && st == KVP_OK)
        show_progress(&prog, inst, p->instances, rejected);
    kvp__progress_end(&prog);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool replay: the %s run failed: %s\n", run_label(kind), kvp_status_str(st));
        out->fatal = true;
    }
    pthread_mutex_lock(&r.mu);
    r.quit = true;
    pthread_cond_broadcast(&r.go_cv);
    pthread_mutex_unlock(&r.mu);
    kvp__replay_run_t *res = &out->run;
    res->kind = kind;
    res->label = run_label(kind);
    res->rejected = rejected;
    res->bound_hit_tokens = sh->bound_tokens;
    double last_us = 0;
    uint64_t io_ns = 0;
    for (uint32_t i = 0; i < p->instances; i++) {
        if (inst[i].started)
            pthread_join(inst[i].th, NULL);
        if (!inst[i].eng)
            continue;
        kvp__eng_stats_t es;
        kvp__eng_stats(inst[i].eng, &es);
        res->requests += es.requests;
        res->prompt_tokens += es.prompt_tokens;
        res->local_hit_tokens += es.local_hit_tokens;
        res->pool_hit_tokens += es.pool_hit_tokens;
        res->blocks_loaded += es.blocks_loaded;
        res->blocks_verified += es.blocks_verified;
        res->corruptions += es.corruptions;
        res->load_errors += es.load_errors;
        res->save_errors += es.save_errors;
        res->lookup_errors += es.lookup_errors;
        res->preemptions += es.preemptions;
        res->steps += es.steps;
        res->bytes_saved += es.bytes_saved;
        res->bytes_loaded += es.bytes_loaded;
        io_ns += es.io_ns;
        if (es.last_token_us > last_us)
            last_us = es.last_token_us;
        kvp__eng_destroy(inst[i].eng);
    }
    res->wall_s = (double)(kvp__now_ns() - t0) / 1e9;
    res->virtual_s = last_us / 1e6;
    res->modelled_gbps = connector ? p->link_gbps / 8 : 0;
    /* what the pool calls really reached (bytes over the time spent in them) */
    res->measured_gbps = io_ns ? (double)(res->bytes_saved + res->bytes_loaded) / (double)io_ns : 0;
    if (pool) {
        kvp_pool_stats(pool, &ps1);
        res->evictions = ps1.evicted - ps0.evicted;
        kvp_pool_close(pool);
    }
    if (connector)
        rmdir(ipc_dir);
    kvp__eng_visible_cleanup(&vis);
    for (size_t i = 0; i < n; i++)
        unprepare(&reqs[i]); /* the ones never routed (a failed run) */
    kvp__free(reqs, (n ? n : 1) * sizeof *reqs);
    kvp__free(inst, p->instances * sizeof *inst);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.go_cv);
    pthread_cond_destroy(&r.done_cv);
    /* the points of the requests served, in trace order */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (out->points[i].ttft_ms >= 0)
            out->points[k++] = out->points[i];
    res->points = out->points;
    res->num_points = k;
    kvp__replay_ttft_percentiles(out->points, k, &res->ttft_p50_ms, &res->ttft_p99_ms);
    return st;
}

/* ---- sizing ------------------------------------------------------------- */

/* Full blocks of each distinct hash id (its largest use): the pool's share
 * of the trace, before the key namespaces.  Sorted pairs, so any id values
 * work. */
typedef struct id_use {
    int64_t id;
    int64_t full;
} id_use_t;

static int id_use_cmp(const void *a, const void *b)
{
    const id_use_t *x = a, *y = b;
    return x->id < y->id ? -1 : x->id > y->id ? 1 : (x->full > y->full) - (x->full < y->full);
}

static kvp_status_t count_unique(shared_t *sh)
{
    const kvp__trace_t *t = &sh->trace;
    size_t n = t->num_hash_ids, k = 0;
    if (n == 0)
        return KVP_OK;
    id_use_t *u = kvp__malloc(n * sizeof *u);
    if (!u)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < t->n; i++) {
        const kvp__trace_req_t *q = &t->reqs[i];
        for (uint32_t j = 0; j < q->num_hash; j++) {
            int64_t left = q->input_length - (int64_t)j * KVP__TRACE_BLOCK_TOKENS;
            if (left > KVP__TRACE_BLOCK_TOKENS)
                left = KVP__TRACE_BLOCK_TOKENS;
            u[k++] = (id_use_t){t->hash_ids[q->hash_off + j], left / sh->p->block_size};
        }
    }
    qsort(u, k, sizeof *u, id_use_cmp);
    for (size_t i = 0; i < k; i++)
        if (i + 1 == k || u[i + 1].id != u[i].id)
            sh->unique_blocks += (uint64_t)u[i].full; /* the largest use of this id */
    kvp__free(u, n * sizeof *u);
    return KVP_OK;
}

static uint64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* Refuses a setting this machine cannot hold, with the figure it needs. */
static bool fits(shared_t *sh)
{
    const kvp__replay_params_t *p = sh->p;
    uint64_t tok = kvp__eng_model_token_bytes(sh->model, p->tp);
    uint32_t factor = 1;
    kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, p->tp, sh->model->kv_heads, 1,
                                        &factor);
    uint64_t spaces = p->tp / factor ? p->tp / factor : 1;
    uint64_t block = (uint64_t)p->block_size * tok;
    uint64_t unique = sh->unique_blocks * block * spaces;
    uint64_t cap = unique + unique / 4 + (64ull << 20);
    sh->pool_capacity = cap < (16ull << 30) ? cap : (16ull << 30);
    uint64_t kv = (uint64_t)p->instances * p->tp * (uint64_t)p->gpu_tokens * tok;
    uint64_t pool = p->pool_uri ? 0 : (unique < sh->pool_capacity ? unique : sh->pool_capacity);
    uint64_t need = kv + pool + sh->hashes.bytes + (256ull << 20);
    uint64_t have = mem_available();
    if (have && need > have / 10 * 9) {
        char a[32], b[32], c[32], d[32];
        kvp__format_size(need, a, sizeof a);
        kvp__format_size(have, b, sizeof b);
        kvp__format_size(kv, c, sizeof c);
        kvp__format_size(pool, d, sizeof d);
        fprintf(stderr,
                "kvpool replay: this setting needs about %s of memory (KV caches %s: %u instance(s)"
                " x %u rank(s) x %" PRId64 " tokens x %" PRIu64 " B; pool %s); %s is available."
                " Lower --gpu-tokens or --instances, or pick a smaller --model.\n",
                a, c, p->instances, p->tp, p->gpu_tokens, tok, d, b);
        return false;
    }
    return true;
}

/* ---- main ---------------------------------------------------------------- */

int kvp__replay_main(const kvp__replay_params_t *p)
{
    shared_t sh = {.p = p};
    int rc = 0;
    sh.model = kvp__eng_model_find(p->model);
    if (!sh.model) {
        fprintf(stderr, "kvpool replay: unknown --model %s (tiny, small, llama8b-like)\n", p->model);
        return 2;
    }
    if (p->block_size <= 0 || KVP__TRACE_BLOCK_TOKENS % p->block_size) {
        fprintf(stderr, "kvpool replay: --block-size %" PRId64 " must divide 512\n", p->block_size);
        return 2;
    }
    if (p->tp == 0 || (sh.model->kv_heads % p->tp && p->tp % sh.model->kv_heads)) {
        fprintf(stderr, "kvpool replay: --tp %u must divide the model's %u KV heads or be a multiple of them\n",
                p->tp, sh.model->kv_heads);
        return 2;
    }
    if (p->gpu_tokens < p->block_size || p->instances == 0 || p->instances > KVP__REPLAY_MAX_INSTANCES) {
        fprintf(stderr, "kvpool replay: --gpu-tokens below one block, or --instances out of 1..%d\n",
                KVP__REPLAY_MAX_INSTANCES);
        return 2;
    }
    kvp_status_t st = kvp__trace_load(p->trace, p->limit, &sh.trace);
    if (st == KVP_OK && sh.trace.n == 0) {
        fprintf(stderr, "kvpool replay: %s holds no usable request\n", p->trace);
        st = KVP_ERR_INVALID_ARG;
    }
    if (st == KVP_OK)
        st = kvp__trace_bound(&sh.trace, &sh.prompt_tokens, &sh.bound_tokens, NULL);
    if (st == KVP_OK)
        st = kvp__eng_hashes_init(&sh.hashes, (uint32_t)p->block_size);
    if (st == KVP_OK)
        st = count_unique(&sh);
    if (st != KVP_OK) {
        rc = st == KVP_ERR_INVALID_ARG || st == KVP_ERR_IO ? 2 : 1;
        goto out;
    }
    if (!fits(&sh)) {
        rc = 2;
        goto out;
    }
    if (sh.trace.skipped)
        fprintf(stderr, "kvpool replay: %" PRIu64 " trace line(s) skipped (see the warnings)\n",
                sh.trace.skipped);

    kvp__replay_kind_t kinds[3];
    size_t nk = 0;
    if (p->policy != KVP__POLICY_FASTER)
        kinds[nk++] = KVP__RUN_POOL;
    if (p->policy != KVP__POLICY_ALWAYS)
        kinds[nk++] = KVP__RUN_POOL_FASTER;
    if (p->baseline)
        kinds[nk++] = KVP__RUN_NO_POOL;
    outcome_t outs[3];
    kvp__replay_run_t runs[3];
    size_t done = 0;
    for (size_t k = 0; k < nk; k++, done++) {
        st = do_run(&sh, kinds[k], &outs[k]);
        runs[k] = outs[k].run;
        if (outs[k].fatal || st != KVP_OK) {
            rc = 1;
            done++;
            break;
        }
    }
    kvp__replay_print_table(stdout, runs, done);
    if (p->plot && kvp__replay_plot_svg(p->plot, runs, done, p->trace) != KVP_OK)
        rc = rc ? rc : 1;
    if (p->json)
        kvp__replay_print_json(stdout, runs, done);
    for (size_t k = 0; k < done; k++) {
        if (runs[k].corruptions) {
            fprintf(stderr, "kvpool replay: %" PRIu64 " corrupted block(s) in the %s run\n",
                    runs[k].corruptions, runs[k].label);
            rc = 1;
        }
        kvp__free(outs[k].points, (sh.trace.n ? sh.trace.n : 1) * sizeof *outs[k].points);
    }
out:
    kvp__eng_hashes_cleanup(&sh.hashes);
    kvp__trace_cleanup(&sh.trace);
    return rc;
}
