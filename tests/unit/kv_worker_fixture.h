/*
 * Fixture of the worker tests (test_kv_worker*.c): paged KV caches in host
 * memory in the three layouts of §2.3, filled with a pattern that differs
 * per (tensor, block, byte); the bytes of a block gathered from the layout
 * by this file's own arithmetic (not the worker's); hand-built ReqMetas;
 * and a loop that steps get_finished until a request is reported.
 */
#ifndef KVP_TEST_KV_WORKER_FIXTURE_H
#define KVP_TEST_KV_WORKER_FIXTURE_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpool/kv_connector.h"
#include "test.h"

#define FX_MAXL 8
#define FX_BS 16
#define FX_HALF 128 /* bytes of K (or V) per block per layer: 16 tokens x 4 dims x 2 B */

typedef enum { FX_BLOCKS_FIRST, FX_KV_FIRST, FX_CROSS } fx_layout_t;

typedef struct {
    fx_layout_t layout;
    int layers;
    int64_t nblocks;
    int ntensors;
    uint8_t *mem[FX_MAXL];
    size_t bytes[FX_MAXL];
    kvp_kv_cache_tensor_t t[FX_MAXL];
} fx_cache_t;

/* Contiguous strides (elements) for shape[0..n). */
static inline void fx_strides(kvp_kv_cache_tensor_t *t)
{
    int64_t s = 1;
    for (int d = (int)t->ndim - 1; d >= 0; d--) {
        t->stride[d] = s;
        s *= t->shape[d];
    }
}

/* A zeroed cache: per layer (nblocks, 2, 16, 1, 4) blocks-first, (2,
 * nblocks, 16, 1, 4) K/V-first, or one (nblocks, layers, 2, 16, 1, 4)
 * cross-layer tensor; 2-byte elements. */
static inline void fx_cache_init(fx_cache_t *c, fx_layout_t layout, int layers, int64_t nblocks)
{
    memset(c, 0, sizeof *c);
    c->layout = layout, c->layers = layers, c->nblocks = nblocks;
    c->ntensors = layout == FX_CROSS ? 1 : layers;
    for (int i = 0; i < c->ntensors; i++) {
        kvp_kv_cache_tensor_t *t = &c->t[i];
        t->elem_size = 2;
        if (layout == FX_BLOCKS_FIRST) {
            int64_t sh[] = {nblocks, 2, FX_BS, 1, 4};
            t->ndim = 5, memcpy(t->shape, sh, sizeof sh);
        } else if (layout == FX_KV_FIRST) {
            int64_t sh[] = {2, nblocks, FX_BS, 1, 4};
            t->ndim = 5, memcpy(t->shape, sh, sizeof sh);
        } else {
            int64_t sh[] = {nblocks, layers, 2, FX_BS, 1, 4};
            t->ndim = 6, memcpy(t->shape, sh, sizeof sh);
        }
        fx_strides(t);
        c->bytes[i] = (size_t)nblocks * 2 * FX_HALF * (layout == FX_CROSS ? (size_t)layers : 1);
        c->mem[i] = aligned_alloc(64, c->bytes[i]);
        ASSERT(c->mem[i]);
        memset(c->mem[i], 0, c->bytes[i]);
        t->storage = c->mem[i];
        t->storage_bytes = c->bytes[i];
    }
}

static inline void fx_cache_free(fx_cache_t *c)
{
    for (int i = 0; i < c->ntensors; i++)
        free(c->mem[i]);
}

static inline void fx_fill(fx_cache_t *c, uint32_t seed)
{
    for (int i = 0; i < c->ntensors; i++)
        for (size_t k = 0; k < c->bytes[i]; k++) {
            uint32_t x = seed * 2654435761u ^ (uint32_t)(i * 40503) ^ (uint32_t)k * 2246822519u;
            x ^= x >> 15;
            c->mem[i][k] = (uint8_t)(x * 3266489917u >> 24);
        }
}

static inline size_t fx_value_bytes(const fx_cache_t *c) { return (size_t)c->layers * 2 * FX_HALF; }

/* Block b's value bytes (layer-major, K then V) gathered into out. */
static inline void fx_block(const fx_cache_t *c, int64_t b, uint8_t *out)
{
    size_t o = 0;
    if (c->layout == FX_CROSS) {
        memcpy(out, c->mem[0] + (size_t)b * fx_value_bytes(c), fx_value_bytes(c));
        return;
    }
    for (int l = 0; l < c->layers; l++) {
        if (c->layout == FX_BLOCKS_FIRST) {
            memcpy(out + o, c->mem[l] + (size_t)b * 2 * FX_HALF, 2 * FX_HALF);
            o += 2 * FX_HALF;
        } else {
            for (int kv = 0; kv < 2; kv++, o += FX_HALF)
                memcpy(out + o, c->mem[l] + (size_t)kv * c->nblocks * FX_HALF + (size_t)b * FX_HALF,
                       FX_HALF);
        }
    }
}

/* Block sb of src equals block db of dst, byte for byte. */
static inline int fx_same(const fx_cache_t *src, int64_t sb, const fx_cache_t *dst, int64_t db)
{
    size_t n = fx_value_bytes(src);
    uint8_t *a = malloc(n), *b = malloc(n);
    fx_block(src, sb, a);
    fx_block(dst, db, b);
    int same = memcmp(a, b, n) == 0;
    free(a), free(b);
    return same;
}

static inline int fx_zero(const fx_cache_t *c, int64_t b)
{
    size_t n = fx_value_bytes(c);
    uint8_t *a = malloc(n);
    fx_block(c, b, a);
    int z = 1;
    for (size_t i = 0; i < n; i++)
        z &= a[i] == 0;
    free(a);
    return z;
}

/* ---- metas ---- */

#define FX_MAXB 64
#define FX_HLEN 32

typedef struct {
    kvp_kv_req_meta_t m;
    kvp_kv_ids_t g[2];
    int64_t ids[2][FX_MAXB];
    uint8_t hashes[FX_MAXB * FX_HLEN];
} fx_meta_t;

/* Hash i of the request family `seed` (equal seeds: equal prefixes). */
static inline void fx_hash(uint32_t seed, size_t i, uint8_t *out)
{
    for (int k = 0; k < FX_HLEN; k++)
        out[k] = (uint8_t)((seed * 131u + (uint32_t)i * 7u + (uint32_t)k * 13u) ^ (seed >> 3) ^ 0x5a);
}

/* A meta of one group: ids[0..nids), nhashes hashes of family seed. */
static inline void fx_meta(fx_meta_t *f, const char *id, int64_t token_len_chunk, const int64_t *ids,
                           size_t nids, uint32_t seed, size_t nhashes)
{
    memset(f, 0, sizeof *f);
    memcpy(f->ids[0], ids, nids * sizeof *ids);
    f->g[0].ids = f->ids[0], f->g[0].n = nids;
    for (size_t i = 0; i < nhashes; i++)
        fx_hash(seed, i, f->hashes + i * FX_HLEN);
    f->m.req_id = id;
    f->m.token_len_chunk = token_len_chunk;
    f->m.block_ids.groups = f->g, f->m.block_ids.num_groups = 1;
    f->m.block_hashes = f->hashes, f->m.num_block_hashes = nhashes, f->m.hash_len = FX_HLEN;
    f->m.is_last_chunk = KVP_KV_TRI_NONE;
    f->m.num_prompt_tokens = token_len_chunk;
}

static inline void fx_save(fx_meta_t *f) { f->m.can_save = true; }
static inline void fx_load(fx_meta_t *f, int64_t vllm_cached, int64_t pool_cached)
{
    f->m.can_save = false;
    f->m.has_load_spec = true;
    f->m.load_spec.vllm_cached_tokens = vllm_cached;
    f->m.load_spec.kvpool_cached_tokens = pool_cached;
    f->m.load_spec.can_load = true;
}

/* get_finished with these metas (and finished ids). */
static inline kvp_kv_finished_t fx_step(kvp_kv_worker_t *w, fx_meta_t *const *metas, size_t n,
                                        const char *const *fin, size_t nfin)
{
    kvp_kv_req_meta_t reqs[16];
    for (size_t i = 0; i < n; i++)
        reqs[i] = metas[i]->m;
    kvp_kv_meta_t meta = {.requests = reqs, .num_requests = n};
    kvp_kv_finished_t out;
    ASSERT_OK(kvp_kv_worker_get_finished(w, &meta, fin, nfin, &out));
    return out;
}

static inline int fx_has(const char *const *v, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(v[i], id))
            return 1;
    return 0;
}

static inline void fx_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Steps get_finished (no metas) until id is in done_recving; fails after
 * limit_ms. */
static inline void fx_await_recv(kvp_kv_worker_t *w, const char *id, int limit_ms)
{
    for (int t = 0; t < limit_ms; t += 2) {
        kvp_kv_finished_t out;
        ASSERT_OK(kvp_kv_worker_get_finished(w, NULL, NULL, 0, &out));
        if (fx_has(out.recving, out.num_recving, id))
            return;
        fx_sleep_ms(2);
    }
    KVP__FAIL("%s never reported in done_recving", id);
}

/* A load of meta f: queued, awaited. */
static inline void fx_load_now(kvp_kv_worker_t *w, fx_meta_t *f)
{
    fx_meta_t *one[1] = {f};
    kvp_kv_finished_t out = fx_step(w, one, 1, NULL, 0);
    if (fx_has(out.recving, out.num_recving, f->m.req_id))
        return;
    fx_await_recv(w, f->m.req_id, 10000);
}

/* A save of meta f: queued, drained. */
static inline void fx_save_now(kvp_kv_worker_t *w, fx_meta_t *f)
{
    fx_meta_t *one[1] = {f};
    fx_step(w, one, 1, NULL, 0);
    ASSERT_OK(kvp_kv_worker_drain(w));
}

static inline kvp_kv_worker_stats_t fx_stats(const kvp_kv_worker_t *w)
{
    kvp_kv_worker_stats_t s;
    kvp_kv_worker_stats(w, &s);
    return s;
}

/* The load errors now, into ids (at most cap); their count. */
static inline size_t fx_errors(kvp_kv_worker_t *w, int64_t *ids, size_t cap)
{
    const int64_t *v;
    size_t n;
    ASSERT_OK(kvp_kv_worker_load_errors(w, &v, &n));
    for (size_t i = 0; i < n && i < cap; i++)
        ids[i] = v[i];
    return n;
}

#endif
