/*
 * `kvpool bench --kv-worker [--uri URI] [--model tiny|small|llama8b-like]
 *                           [--requests N] [--rounds R] [--load-threads T] [--json]`
 *
 * Saves and loads N requests' KV blocks through the worker (kv_connector.h
 * "Worker side": one save thread with dedup and one put of scatter lists
 * per request, two load threads) and, in the same run and on the same
 * pool, the bare pool calls the worker is built on: kvp_pool_put and
 * kvp_pool_get of the same blocks (the same key count per call, the same
 * scatter lists of the same slices), and a one-thread memcpy of the same
 * slices.  Prints GB/s of each and the worker/pool ratios; verifies every
 * block the worker loaded against its source (blocks_verified,
 * load_errors).  Each of the R rounds (default 5) starts from an empty pool
 * (remove_all); the best round of each measure is reported.
 *
 * Model shapes (16-token blocks, per-layer K/V-first tensors as FlashAttn
 * lays them out: each layer gives a K and a V segment):
 *   tiny          2 layers x 1 head x 8 dims x 2 B:   64 B/token, 1 KiB blocks, 4 slices of 256 B
 *   small        24 layers x 2 heads x 64 dims x 2 B: 12 KiB/token, 192 KiB blocks, 48 slices of 4 KiB
 *   llama8b-like 32 layers x 8 heads x 128 dims x 2 B: 128 KiB/token, 2 MiB blocks, 64 slices of 32 KiB
 * Requests are 8 blocks (128 tokens) each.  Without --uri the pool is an
 * embedded one sized to the run.  --json: one compact JSON object as the
 * last line of stdout.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "commands.h"
#include "common/clock.h"
#include "kvpool/kv_connector.h"
#include "kvpool/pool.h"

#define BLOCKS_PER_REQ 8
#define TOKENS 16
#define HLEN 32

typedef struct {
    const char *name;
    int layers;
    size_t seg; /* bytes of K (or V) of one layer per block */
    int default_requests;
} model_t;

static const model_t g_models[] = {
    {"tiny", 2, 16 * 1 * 8 * 2, 256},
    {"small", 24, 16 * 2 * 64 * 2, 64},
    {"llama8b-like", 32, 16 * 8 * 128 * 2, 32},
};

typedef struct {
    const model_t *m;
    int64_t nblocks;
    size_t layer_bytes;      /* one layer's tensor: 2 x nblocks x seg */
    uint8_t **src, **dst;    /* per layer */
    kvp_kv_cache_tensor_t *tsrc, *tdst;
    kvp_iov_t *iov;          /* baseline scatter lists: nblocks x 2 x layers */
    kvp_sgl_t *sgl;
    char (*names)[48];
    kvp_key_t *keys;
    kvp_key_result_t *res;
} bench_t;

static size_t block_bytes(const model_t *m) { return (size_t)m->layers * 2 * m->seg; }

static void tensor(kvp_kv_cache_tensor_t *t, uint8_t *mem, const bench_t *b)
{
    memset(t, 0, sizeof *t);
    t->storage = mem;
    t->storage_bytes = b->layer_bytes;
    t->elem_size = 2;
    t->ndim = 3; /* (2, nblocks, seg / 2 elements) */
    t->shape[0] = 2, t->shape[1] = b->nblocks, t->shape[2] = (int64_t)(b->m->seg / 2);
    t->stride[2] = 1, t->stride[1] = t->shape[2], t->stride[0] = t->shape[1] * t->shape[2];
}

static uint8_t *slice(uint8_t **mem, const bench_t *b, int64_t blk, int l, int kv)
{
    return mem[l] + (size_t)kv * (size_t)b->nblocks * b->m->seg + (size_t)blk * b->m->seg;
}

static bool setup(bench_t *b, const model_t *m, int nreq)
{
    memset(b, 0, sizeof *b);
    b->m = m;
    b->nblocks = (int64_t)nreq * BLOCKS_PER_REQ;
    b->layer_bytes = 2 * (size_t)b->nblocks * m->seg;
    b->src = calloc((size_t)m->layers, sizeof *b->src);
    b->dst = calloc((size_t)m->layers, sizeof *b->dst);
    b->tsrc = calloc((size_t)m->layers, sizeof *b->tsrc);
    b->tdst = calloc((size_t)m->layers, sizeof *b->tdst);
    size_t nsl = (size_t)b->nblocks * 2 * (size_t)m->layers;
    b->iov = calloc(nsl, sizeof *b->iov);
    b->sgl = calloc((size_t)b->nblocks, sizeof *b->sgl);
    b->names = calloc((size_t)b->nblocks, sizeof *b->names);
    b->keys = calloc((size_t)b->nblocks, sizeof *b->keys);
    b->res = calloc((size_t)b->nblocks, sizeof *b->res);
    if (!b->src || !b->dst || !b->tsrc || !b->tdst || !b->iov || !b->sgl || !b->names || !b->keys ||
        !b->res)
        return false;
    for (int l = 0; l < m->layers; l++) {
        b->src[l] = aligned_alloc(4096, (b->layer_bytes + 4095) / 4096 * 4096);
        b->dst[l] = aligned_alloc(4096, (b->layer_bytes + 4095) / 4096 * 4096);
        if (!b->src[l] || !b->dst[l])
            return false;
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(l + 1);
        for (size_t i = 0; i + 8 <= b->layer_bytes; i += 8) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            memcpy(b->src[l] + i, &x, 8);
        }
        memset(b->dst[l], 0, b->layer_bytes);
        tensor(&b->tsrc[l], b->src[l], b);
        tensor(&b->tdst[l], b->dst[l], b);
    }
    return true;
}

static void teardown(bench_t *b)
{
    for (int l = 0; b->src && l < b->m->layers; l++)
        free(b->src[l]), free(b->dst[l]);
    free(b->src), free(b->dst), free(b->tsrc), free(b->tdst);
    free(b->iov), free(b->sgl), free(b->names), free(b->keys), free(b->res);
}

/* The baseline scatter lists of every block in mem (layer-major, K, V). */
static void baseline_sgls(bench_t *b, uint8_t **mem)
{
    int L = b->m->layers;
    for (int64_t blk = 0; blk < b->nblocks; blk++) {
        kvp_iov_t *iov = b->iov + (size_t)blk * 2 * (size_t)L;
        for (int l = 0; l < L; l++)
            for (int kv = 0; kv < 2; kv++)
                iov[l * 2 + kv] = (kvp_iov_t){slice(mem, b, blk, l, kv), b->m->seg};
        b->sgl[blk] = (kvp_sgl_t){iov, (uint32_t)(2 * L)};
    }
}

static double gbps(uint64_t bytes, uint64_t ns) { return ns ? (double)bytes / (double)ns : 0; }

/* kvp_pool_put or _get of every block, one call per request's blocks. */
static double pool_pass(bench_t *b, kvp_pool_t *pool, int round, bool put, int nreq)
{
    baseline_sgls(b, put ? b->src : b->dst);
    for (int64_t i = 0; i < b->nblocks; i++) {
        snprintf(b->names[i], sizeof b->names[i], "bench/%d/%" PRId64, round, i);
        b->keys[i] = kvp_key_str(b->names[i]);
    }
    uint64_t t0 = kvp__now_ns();
    for (int r = 0; r < nreq; r++) {
        size_t o = (size_t)r * BLOCKS_PER_REQ;
        kvp_status_t st = put ? kvp_pool_put(pool, b->keys + o, b->sgl + o, BLOCKS_PER_REQ, b->res + o)
                              : kvp_pool_get(pool, b->keys + o, b->sgl + o, BLOCKS_PER_REQ, b->res + o);
        if (st != KVP_OK)
            fprintf(stderr, "bench --kv-worker: pool %s: %s\n", put ? "put" : "get", kvp_status_str(st));
    }
    uint64_t ns = kvp__now_ns() - t0;
    return gbps((uint64_t)b->nblocks * block_bytes(b->m), ns);
}

static double memcpy_pass(bench_t *b)
{
    uint64_t t0 = kvp__now_ns();
    for (int64_t blk = 0; blk < b->nblocks; blk++)
        for (int l = 0; l < b->m->layers; l++)
            for (int kv = 0; kv < 2; kv++)
                memcpy(slice(b->dst, b, blk, l, kv), slice(b->src, b, blk, l, kv), b->m->seg);
    return gbps((uint64_t)b->nblocks * block_bytes(b->m), kvp__now_ns() - t0);
}

typedef struct {
    char id[32];
    int64_t ids[BLOCKS_PER_REQ];
    uint8_t hashes[BLOCKS_PER_REQ * HLEN];
    kvp_kv_ids_t g;
} breq_t;

static void metas(breq_t *rq, kvp_kv_req_meta_t *m, int nreq, int round, bool load)
{
    for (int r = 0; r < nreq; r++) {
        snprintf(rq[r].id, sizeof rq[r].id, "%s%d.%d", load ? "l" : "s", round, r);
        for (int i = 0; i < BLOCKS_PER_REQ; i++) {
            int64_t blk = (int64_t)r * BLOCKS_PER_REQ + i;
            rq[r].ids[i] = load ? (int64_t)nreq * BLOCKS_PER_REQ - 1 - blk : blk; /* other blocks */
            for (int k = 0; k < HLEN; k++)
                rq[r].hashes[i * HLEN + k] = (uint8_t)(round * 31 + r * 7 + i * 3 + k * 11);
            memcpy(rq[r].hashes + i * HLEN, &round, sizeof round);
            memcpy(rq[r].hashes + i * HLEN + 4, &r, sizeof r);
            memcpy(rq[r].hashes + i * HLEN + 8, &i, sizeof i);
        }
        rq[r].g = (kvp_kv_ids_t){rq[r].ids, BLOCKS_PER_REQ};
        memset(&m[r], 0, sizeof m[r]);
        m[r].req_id = rq[r].id;
        m[r].token_len_chunk = BLOCKS_PER_REQ * TOKENS;
        m[r].block_ids = (kvp_kv_blocks_t){&rq[r].g, 1};
        m[r].block_hashes = rq[r].hashes, m[r].num_block_hashes = BLOCKS_PER_REQ, m[r].hash_len = HLEN;
        m[r].num_prompt_tokens = BLOCKS_PER_REQ * TOKENS + 1;
        m[r].is_last_chunk = KVP_KV_TRI_NONE;
        if (load) {
            m[r].has_load_spec = true;
            m[r].load_spec = (kvp_kv_load_spec_t){0, BLOCKS_PER_REQ * TOKENS, true};
        } else {
            m[r].can_save = true;
        }
    }
}

/* Verifies every block the worker loaded against its source. */
static uint64_t verify(bench_t *b, int nreq)
{
    uint64_t ok = 0;
    int64_t n = (int64_t)nreq * BLOCKS_PER_REQ;
    for (int64_t blk = 0; blk < n; blk++) {
        bool same = true;
        for (int l = 0; l < b->m->layers && same; l++)
            for (int kv = 0; kv < 2 && same; kv++)
                same = !memcmp(slice(b->src, b, blk, l, kv), slice(b->dst, b, n - 1 - blk, l, kv),
                               b->m->seg);
        ok += same;
    }
    return ok;
}

typedef struct {
    double save, load;
    uint64_t verified, errors;
    kvp_kv_worker_stats_t ss, ls; /* the workers' counters after the pass */
} wres_t;

static int worker_pass(bench_t *b, kvp_pool_t *pool, kvp_kv_worker_t *ws, kvp_kv_worker_t *wd,
                       int nreq, int round, wres_t *out)
{
    breq_t *rq = calloc((size_t)nreq, sizeof *rq);
    kvp_kv_req_meta_t *m = calloc((size_t)nreq, sizeof *m);
    if (!rq || !m)
        return 1;
    for (int l = 0; l < b->m->layers; l++)
        memset(b->dst[l], 0, b->layer_bytes);
    uint64_t bytes = (uint64_t)nreq * BLOCKS_PER_REQ * block_bytes(b->m);
    kvp_kv_finished_t fin;
    metas(rq, m, nreq, round, false);
    kvp_kv_meta_t meta = {.requests = m, .num_requests = (size_t)nreq};
    uint64_t t0 = kvp__now_ns();
    if (kvp_kv_worker_get_finished(ws, &meta, NULL, 0, &fin) != KVP_OK ||
        kvp_kv_worker_drain(ws) != KVP_OK)
        return 1;
    out->save = gbps(bytes, kvp__now_ns() - t0);
    const char **fids = calloc((size_t)nreq, sizeof *fids); /* finished: their entries go */
    for (int r = 0; fids && r < nreq; r++)
        fids[r] = rq[r].id;
    if (fids)
        kvp_kv_worker_get_finished(ws, NULL, fids, (size_t)nreq, &fin);
    free(fids);
    metas(rq, m, nreq, round, true);
    size_t done = 0;
    t0 = kvp__now_ns();
    if (kvp_kv_worker_get_finished(wd, &meta, NULL, 0, &fin) != KVP_OK)
        return 1;
    for (done = fin.num_recving; done < (size_t)nreq;) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        if (kvp_kv_worker_get_finished(wd, NULL, NULL, 0, &fin) != KVP_OK)
            return 1;
        done += fin.num_recving;
    }
    out->load = gbps(bytes, kvp__now_ns() - t0);
    kvp_kv_worker_stats(ws, &out->ss);
    kvp_kv_worker_stats(wd, &out->ls);
    const int64_t *e;
    size_t ne;
    kvp_kv_worker_load_errors(wd, &e, &ne);
    out->errors = ne;
    out->verified = verify(b, nreq);
    (void)pool;
    free(rq);
    free(m);
    return 0;
}

static uint32_t g_load_threads = 2;

static kvp_kv_worker_t *worker(kvp_pool_t *pool, kvp_kv_role_t role, kvp_kv_cache_tensor_t *t,
                               const bench_t *b)
{
    kvp_kv_worker_params_t p;
    kvp_kv_worker_params_init(&p);
    p.pool = pool;
    p.role = role;
    p.model_name = "bench/llama";
    p.num_load_threads = g_load_threads;
    kvp_kv_worker_t *w = NULL;
    if (kvp_kv_worker_create(&p, &w) != KVP_OK)
        return NULL;
    if (kvp_kv_worker_register(w, t, (size_t)b->m->layers, (uint64_t)b->nblocks) != KVP_OK) {
        kvp_kv_worker_destroy(w);
        return NULL;
    }
    return w;
}

static int usage(void)
{
    fprintf(stderr, "usage: kvpool bench --kv-worker [--uri URI] [--model tiny|small|llama8b-like]\n"
                    "                    [--requests N] [--rounds R] [--load-threads T] [--json]\n");
    return 2;
}

int kvp_bench_kv_worker(int argc, char **argv)
{
    const char *uri = NULL, *model = "llama8b-like";
    int nreq = 0, rounds = 5;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kv-worker"))
            continue;
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--uri") && i + 1 < argc)
            uri = argv[++i];
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--requests") && i + 1 < argc)
            nreq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--load-threads") && i + 1 < argc)
            g_load_threads = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else
            return usage();
    }
    const model_t *m = NULL;
    for (size_t i = 0; i < sizeof g_models / sizeof *g_models; i++)
        if (!strcmp(model, g_models[i].name))
            m = &g_models[i];
    if (!m || nreq < 0 || nreq > 4096 || rounds < 1 || rounds > 100)
        return usage();
    if (!nreq)
        nreq = m->default_requests;
    bench_t b;
    if (!setup(&b, m, nreq)) {
        fprintf(stderr, "bench --kv-worker: out of memory\n");
        teardown(&b);
        return 1;
    }
    uint64_t data = (uint64_t)b.nblocks * block_bytes(m);
    char ubuf[128];
    if (!uri) { /* room for one set of blocks and then some, prefaulted */
        snprintf(ubuf, sizeof ubuf, "embedded://?capacity=%" PRIu64 "MiB&prefault=true",
                 (data * 3 / 2 >> 20) + 64);
        uri = ubuf;
    }
    kvp_pool_t *pool = NULL;
    kvp_status_t st = kvp_pool_open(uri, &pool);
    if (st != KVP_OK) {
        fprintf(stderr, "bench --kv-worker: open %s: %s\n", uri, kvp_status_str(st));
        teardown(&b);
        return 1;
    }
    kvp_kv_worker_t *ws = worker(pool, KVP_KV_ROLE_PRODUCER, b.tsrc, &b);
    kvp_kv_worker_t *wd = worker(pool, KVP_KV_ROLE_CONSUMER, b.tdst, &b);
    int rc = ws && wd ? 0 : 1;
    double best_put = 0, best_get = 0, best_mc = 0;
    wres_t best = {0};
    uint64_t verified = UINT64_MAX, errors = 0;
    for (int r = 0; r < rounds && !rc; r++) {
        double mc = memcpy_pass(&b);
        kvp_pool_remove_all(pool, NULL);
        double put = pool_pass(&b, pool, r, true, nreq), get = pool_pass(&b, pool, r, false, nreq);
        kvp_pool_remove_all(pool, NULL);
        wres_t w = {0};
        rc = worker_pass(&b, pool, ws, wd, nreq, r, &w);
        best_mc = mc > best_mc ? mc : best_mc;
        best_put = put > best_put ? put : best_put;
        best_get = get > best_get ? get : best_get;
        best.save = w.save > best.save ? w.save : best.save;
        best.load = w.load > best.load ? w.load : best.load;
        verified = w.verified < verified ? w.verified : verified;
        errors += w.errors;
        if (r == rounds - 1)
            printf("  worker counters: saved %" PRIu64 " deduped %" PRIu64 " save errors %" PRIu64
                   " dropped %" PRIu64 " loaded %" PRIu64 " load errors %" PRIu64 "\n",
                   w.ss.blocks_saved, w.ss.blocks_deduped, w.ss.save_errors, w.ss.saves_dropped,
                   w.ls.blocks_loaded, w.ls.load_errors);
    }
    if (!rc) {
        printf("kv-worker bench: %s, %" PRId64 " blocks of %zu B (%d slices), %s\n", m->name,
               b.nblocks, block_bytes(m), 2 * m->layers, uri);
        printf("  worker save %.2f GB/s   pool put %.2f GB/s   ratio %.2f\n", best.save, best_put,
               best_put ? best.save / best_put : 0);
        printf("  worker load %.2f GB/s   pool get %.2f GB/s   ratio %.2f\n", best.load, best_get,
               best_get ? best.load / best_get : 0);
        printf("  memcpy %.2f GB/s   blocks verified %" PRIu64 "/%" PRId64 "   load errors %" PRIu64
               "\n", best_mc, verified, b.nblocks, errors);
        if (json)
            printf("{\"model\":\"%s\",\"uri\":\"%s\",\"block_bytes\":%zu,\"save_gbps\":%.3f,"
                   "\"load_gbps\":%.3f,\"put_gbps\":%.3f,\"get_gbps\":%.3f,\"memcpy_gbps\":%.3f,"
                   "\"blocks_verified\":%" PRIu64 ",\"load_errors\":%" PRIu64 "}\n",
                   m->name, uri, block_bytes(m), best.save, best.load, best_put, best_get, best_mc,
                   verified, errors);
        if (verified != (uint64_t)b.nblocks || errors)
            rc = 1;
    } else {
        fprintf(stderr, "bench --kv-worker: the worker failed\n");
    }
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    kvp_pool_close(pool);
    teardown(&b);
    return rc;
}
