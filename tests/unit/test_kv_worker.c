/*
 * The worker side of the KV connector (kv_connector.h "Worker side";
 * connectors-spec §2.7 W1-W8 and the worker scenarios of §5) with real
 * bytes over an embedded pool: KV caches filled with a pattern per (layer,
 * block) are saved through the worker and loaded through it into a
 * different, zeroed cache, and every loaded block is compared byte for
 * byte.  Hits are asked of kvp_kv_lookup_pool_query on the same pool.
 */
#include <pthread.h>

#include "kv_worker_fixture.h"
#include "kvpool/pool.h"

#define URI "embedded://?capacity=64MiB"
#define MODEL "/models/Tiny-1/"

static kvp_pool_t *open_pool(const char *uri)
{
    kvp_pool_t *p = NULL;
    ASSERT_OK(kvp_pool_open(uri, &p));
    return p;
}

static kvp_kv_worker_t *mk_worker_p(kvp_kv_worker_params_t *p, fx_cache_t *c)
{
    kvp_kv_worker_t *w = NULL;
    ASSERT_OK(kvp_kv_worker_create(p, &w));
    ASSERT_OK(kvp_kv_worker_register(w, c->t, (size_t)c->ntensors, (uint64_t)c->nblocks));
    return w;
}

static void base_params(kvp_kv_worker_params_t *p, kvp_pool_t *pool)
{
    kvp_kv_worker_params_init(p);
    p->pool = pool;
    p->model_name = MODEL;
}

static kvp_kv_worker_t *mk_worker(kvp_pool_t *pool, fx_cache_t *c)
{
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    return mk_worker_p(&p, c);
}

static int64_t hit_of(kvp_pool_t *pool, uint32_t tp, uint32_t heads, kvp_kv_group_kind_t kind,
                      int64_t num_tokens, uint32_t seed, size_t nhashes)
{
    kvp_kv_lookup_pool_params_t lp;
    kvp_kv_lookup_pool_params_init(&lp);
    lp.model_name = MODEL;
    lp.tp_size = tp;
    lp.num_kv_heads = heads;
    lp.group_kind = kind;
    kvp_kv_lookup_pool_t *lk;
    ASSERT_OK(kvp_kv_lookup_pool_create(pool, &lp, &lk));
    uint8_t h[FX_MAXB * FX_HLEN];
    for (size_t i = 0; i < nhashes; i++)
        fx_hash(seed, i, h + i * FX_HLEN);
    kvp_kv_lookup_result_t r;
    ASSERT_OK(kvp_kv_lookup_pool_query(lk, num_tokens, h, nhashes, FX_HLEN, true, &r));
    kvp_kv_lookup_pool_destroy(lk);
    return r.hit_tokens;
}

/* The store key of chunk i of family seed (tp shard T), by the key format. */
static kvp_key_t key_of(char *buf, uint32_t seed, size_t i, uint32_t T)
{
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    k.model_name = "Tiny-1", k.model_name_len = 6;
    k.tp_rank = T;
    k.hash.len = FX_HLEN;
    fx_hash(seed, i, k.hash.bytes);
    size_t len;
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, KVP_KV_STORE_KEY_MAX + 1, &len));
    return (kvp_key_t){buf, (uint32_t)len};
}

static int exists1(kvp_pool_t *pool, kvp_key_t k)
{
    uint8_t p = 9;
    ASSERT_OK(kvp_pool_exists(pool, &k, 1, &p));
    return p;
}

static const int64_t SRC_IDS[] = {3, 5, 7, 9, 11, 13, 15};
static const int64_t DST_IDS[] = {20, 18, 16, 14, 12, 10, 8};

/* Saves n chunks (seed) from src blocks SRC_IDS, loads them into dst
 * blocks DST_IDS, compares. */
static void roundtrip(fx_layout_t layout, const kvp_kv_copy_ops_t *copy)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, layout, 3, 24);
    fx_cache_init(&dst, layout, 3, 24);
    fx_fill(&src, 11);
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    p.copy = copy;
    kvp_kv_worker_t *ws = mk_worker_p(&p, &src), *wd = mk_worker_p(&p, &dst);
    fx_meta_t f;
    fx_meta(&f, "r1", 64, SRC_IDS, 4, 1, 4);
    fx_save(&f);
    fx_save_now(ws, &f);
    ASSERT_EQ(fx_stats(ws).blocks_saved, 4);
    ASSERT_EQ(fx_stats(ws).bytes_saved, 4 * fx_value_bytes(&src));
    fx_meta(&f, "r2", 64, DST_IDS, 4, 1, 4);
    fx_load(&f, 0, 64);
    fx_load_now(wd, &f);
    int64_t e[8];
    ASSERT_EQ(fx_errors(wd, e, 8), 0);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 4);
    for (int i = 0; i < 4; i++)
        ASSERT_MSG(fx_same(&src, SRC_IDS[i], &dst, DST_IDS[i]), "block %d differs", i);
    ASSERT(fx_zero(&dst, DST_IDS[4])); /* nothing else written */
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

TEST(test_w8_blocks_first_roundtrip) { roundtrip(FX_BLOCKS_FIRST, NULL); }
TEST(test_w8_kv_first_roundtrip) { roundtrip(FX_KV_FIRST, NULL); }
TEST(test_w8_cross_layer_roundtrip) { roundtrip(FX_CROSS, NULL); }

/* A staged copy seam: counts its copies (memcpy underneath). */
static _Atomic int g_to, g_from;
static kvp_status_t cnt_to(void *ctx, void *d, const void *s, size_t n)
{
    (void)ctx;
    g_to++;
    memcpy(d, s, n);
    return KVP_OK;
}
static kvp_status_t cnt_from(void *ctx, void *d, const void *s, size_t n)
{
    (void)ctx;
    g_from++;
    memcpy(d, s, n);
    return KVP_OK;
}

TEST(test_copy_seam_staged_roundtrip)
{
    kvp_kv_copy_ops_t staged = {false, cnt_to, cnt_from, NULL};
    roundtrip(FX_KV_FIRST, &staged);
    ASSERT_EQ(g_to, 4 * 3 * 2); /* 4 blocks x 3 layers x K,V segments */
    ASSERT_EQ(g_from, 4 * 3 * 2);
    ASSERT(kvp_kv_copy_host()->direct);
}

TEST(test_w8_bad_input)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t c;
    fx_cache_init(&c, FX_KV_FIRST, 2, 8);
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    kvp_kv_worker_t *w;
    ASSERT_OK(kvp_kv_worker_create(&p, &w));
    kvp_kv_finished_t out;
    ASSERT_EQ(kvp_kv_worker_get_finished(w, NULL, NULL, 0, &out), KVP_ERR_STATE);
    kvp_kv_cache_tensor_t t[2];
#define BAD(mutate, n, nb)                                                       \
    do {                                                                         \
        memcpy(t, c.t, sizeof t);                                                \
        mutate;                                                                  \
        ASSERT_EQ(kvp_kv_worker_register(w, t, n, nb), KVP_ERR_INVALID_ARG);     \
    } while (0)
    BAD((void)0, 0, 8);                              /* no tensors */
    BAD((void)0, 2, 0);                              /* no blocks */
    BAD(t[0].shape[4] = 5, 2, 8);                    /* the view leaves its storage */
    BAD(t[1].storage_bytes -= 2, 2, 8);              /* not divisible into pages */
    BAD(t[1].storage = c.mem[0] + 64, 2, 8);         /* overlapping storages */
    BAD(t[0].elem_size = 0, 2, 8);                   /* zero sizes */
    BAD(t[0].shape[2] = 0, 2, 8);
    BAD(t[0].storage_bytes = 0, 2, 8);
    BAD(t[0].ndim = 0, 2, 8);                        /* ndim out of range */
    BAD(t[0].ndim = KVP_KV_TENSOR_MAX_DIMS + 1, 2, 8);
    BAD((t[0].storage = c.mem[0] + 1, t[0].storage_bytes -= 8), 2, 8); /* misaligned */
    BAD(t[0].stride[0] = 3 * 8 * 64 + 7, 2, 8);      /* K/V segments that do not split */
#undef BAD
    ASSERT_EQ(kvp_kv_worker_register(w, NULL, 1, 8), KVP_ERR_NULL_POINTER);
    /* Nothing was registered by the refusals: a good call still works, once. */
    ASSERT_OK(kvp_kv_worker_register(w, c.t, 2, 8));
    ASSERT_EQ(kvp_kv_worker_register(w, c.t, 2, 8), KVP_ERR_STATE);
    kvp_kv_worker_destroy(w);
    /* Bad configurations. */
    kvp_kv_worker_params_t q = p;
    q.model_name = NULL;
    ASSERT_EQ(kvp_kv_worker_create(&q, &w), KVP_ERR_BAD_CONFIG);
    q = p, q.tp_rank = 2, q.tp_size = 2;
    ASSERT_EQ(kvp_kv_worker_create(&q, &w), KVP_ERR_BAD_CONFIG);
    q = p, q.size = 0;
    ASSERT_EQ(kvp_kv_worker_create(&q, &w), KVP_ERR_INVALID_ARG);
    q = p, q.size = sizeof q + 8;
    ASSERT_EQ(kvp_kv_worker_create(&q, &w), KVP_ERR_VERSION);
    fx_cache_free(&c);
    kvp_pool_close(pool);
}

/* Block ids outside the registered range fail that meta alone. */
TEST(test_bad_block_ids_fail_the_meta)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t c;
    fx_cache_init(&c, FX_BLOCKS_FIRST, 2, 8);
    fx_fill(&c, 3);
    kvp_kv_worker_t *w = mk_worker(pool, &c);
    int64_t bad[] = {1, 2, 8};
    fx_meta_t s, l;
    fx_meta(&s, "s", 48, bad, 3, 1, 3);
    fx_save(&s);
    fx_meta(&l, "l", 48, bad, 3, 1, 3);
    fx_load(&l, 0, 48);
    fx_meta_t *both[2] = {&s, &l};
    kvp_kv_finished_t out = fx_step(w, both, 2, NULL, 0);
    ASSERT(fx_has(out.recving, out.num_recving, "l")); /* failed, still done */
    int64_t e[8];
    ASSERT_EQ(fx_errors(w, e, 8), 3);
    ASSERT_EQ(e[0], 1);
    ASSERT_EQ(e[1], 2);
    ASSERT_EQ(e[2], 8);
    ASSERT_OK(kvp_kv_worker_drain(w));
    ASSERT_EQ(fx_stats(w).blocks_saved, 0); /* the save meta was skipped ... */
    const char *fin[] = {"s"};
    out = fx_step(w, NULL, 0, fin, 1);
    ASSERT_EQ(out.num_sending, 0); /* ... and never stored */
    /* A caller's NULL id list (with a count) fails its meta the same way:
     * the load still reported, nothing read through the NULL. */
    fx_meta(&l, "n", 48, bad, 3, 1, 3);
    fx_load(&l, 0, 48);
    l.g[0].ids = NULL;
    fx_meta_t *one[1] = {&l};
    out = fx_step(w, one, 1, NULL, 0);
    ASSERT(fx_has(out.recving, out.num_recving, "n"));
    ASSERT_EQ(fx_errors(w, e, 8), 0);
    ASSERT_EQ(fx_stats(w).load_errors, 3); /* (the first meta's three) */
    kvp_kv_worker_destroy(w);
    fx_cache_free(&c);
    kvp_pool_close(pool);
}

/* Scenario 8: chunks 0..3 of a 100-token prompt stored -> hit 64; 0, 1, 3
 * -> 32 (prefix only); the 32 tokens load byte for byte. */
TEST(test_scenario_8_prefix_hit_from_worker_saves)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 8);
    kvp_kv_worker_t *ws = mk_worker(pool, &src), *wd = mk_worker(pool, &dst);
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 7, 8, 6); /* 100 tokens: 7 blocks, 6 hashes; saved up to 64 */
    fx_save(&f);
    f.m.num_prompt_tokens = 100;
    fx_save_now(ws, &f);
    ASSERT_EQ(fx_stats(ws).blocks_saved, 4);
    ASSERT_EQ(hit_of(pool, 1, 1, KVP_KV_GROUP_FULL_ATTENTION, 100, 8, 6), 64);
    char kb[KVP_KV_STORE_KEY_MAX + 1];
    kvp_key_t k2 = key_of(kb, 8, 2, 0);
    kvp_key_result_t r;
    ASSERT_OK(kvp_pool_remove(pool, &k2, 1, &r));
    ASSERT_OK(r.status);
    ASSERT_EQ(hit_of(pool, 1, 1, KVP_KV_GROUP_FULL_ATTENTION, 100, 8, 6), 32);
    fx_meta(&f, "c", 100, DST_IDS, 7, 8, 6);
    fx_load(&f, 0, 32);
    fx_load_now(wd, &f);
    int64_t e[8];
    ASSERT_EQ(fx_errors(wd, e, 8), 0);
    ASSERT(fx_same(&src, SRC_IDS[0], &dst, DST_IDS[0]));
    ASSERT(fx_same(&src, SRC_IDS[1], &dst, DST_IDS[1]));
    ASSERT(fx_zero(&dst, DST_IDS[2]));
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* Scenario 9: a 64-token prompt with all 4 chunks -> hit 48 (the last
 * token is recomputed); loading 48 moves exactly 3 blocks. */
TEST(test_scenario_9_full_prompt_hit_capped)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 24);
    fx_cache_init(&dst, FX_BLOCKS_FIRST, 2, 24);
    fx_fill(&src, 9);
    kvp_kv_worker_t *ws = mk_worker(pool, &src), *wd = mk_worker(pool, &dst);
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 4, 9, 4);
    fx_save(&f);
    fx_save_now(ws, &f);
    int64_t hit = hit_of(pool, 1, 1, KVP_KV_GROUP_FULL_ATTENTION, 64, 9, 4);
    ASSERT_EQ(hit, 48);
    fx_meta(&f, "c", 64, DST_IDS, 4, 9, 4);
    fx_load(&f, 0, hit);
    fx_load_now(wd, &f);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 3);
    for (int i = 0; i < 3; i++)
        ASSERT(fx_same(&src, SRC_IDS[i], &dst, DST_IDS[i]));
    ASSERT(fx_zero(&dst, DST_IDS[3]));
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* Scenario 10: TP=2 GQA with 2 KV heads: each rank has its own namespace
 * (tp_rank:0, tp_rank:1); a chunk rank 1 lacks counts as absent; each
 * rank loads its own shard's bytes. */
TEST(test_scenario_10_tp2_gqa_namespaces)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src[2], dst[2];
    kvp_kv_worker_t *ws[2], *wd[2];
    for (uint32_t r = 0; r < 2; r++) {
        fx_cache_init(&src[r], FX_KV_FIRST, 2, 24);
        fx_cache_init(&dst[r], FX_KV_FIRST, 2, 24);
        fx_fill(&src[r], 100 + r); /* different shards, different bytes */
        kvp_kv_worker_params_t p;
        base_params(&p, pool);
        p.tp_size = 2, p.tp_rank = r, p.num_kv_heads = 2;
        ws[r] = mk_worker_p(&p, &src[r]);
        wd[r] = mk_worker_p(&p, &dst[r]);
    }
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 4, 10, 5);
    fx_save(&f);
    fx_save_now(ws[0], &f);
    fx_meta(&f, "p", 16, SRC_IDS, 4, 10, 5); /* rank 1 saved chunk 0 only */
    fx_save(&f);
    fx_save_now(ws[1], &f);
    char kb[KVP_KV_STORE_KEY_MAX + 1];
    ASSERT_EQ(exists1(pool, key_of(kb, 10, 1, 0)), 1);
    ASSERT_EQ(exists1(pool, key_of(kb, 10, 1, 1)), 0);
    ASSERT_EQ(hit_of(pool, 2, 2, KVP_KV_GROUP_FULL_ATTENTION, 80, 10, 5), 16);
    fx_meta(&f, "p", 64, SRC_IDS, 4, 10, 5); /* rank 1 completes: hit 64 */
    fx_save(&f);
    fx_save_now(ws[1], &f);
    ASSERT_EQ(fx_stats(ws[1]).blocks_saved, 4);
    ASSERT_EQ(hit_of(pool, 2, 2, KVP_KV_GROUP_FULL_ATTENTION, 80, 10, 5), 64);
    for (uint32_t r = 0; r < 2; r++) {
        fx_meta(&f, "c", 80, DST_IDS, 5, 10, 5);
        fx_load(&f, 0, 64);
        fx_load_now(wd[r], &f);
        for (int i = 0; i < 4; i++)
            ASSERT_MSG(fx_same(&src[r], SRC_IDS[i], &dst[r], DST_IDS[i]), "rank %u block %d", r, i);
        ASSERT(!fx_same(&src[1 - r], SRC_IDS[0], &dst[r], DST_IDS[0]));
    }
    for (uint32_t r = 0; r < 2; r++) {
        kvp_kv_worker_destroy(ws[r]);
        kvp_kv_worker_destroy(wd[r]);
        fx_cache_free(&src[r]);
        fx_cache_free(&dst[r]);
    }
    kvp_pool_close(pool);
}

/* MLA: the one latent is shared (key tp_rank:0 on both ranks) and the put
 * stride splits the writes: rank r writes chunks c with c % 2 == r. */
TEST(test_w4_mla_put_stride)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src[2], dst;
    kvp_kv_worker_t *ws[2];
    for (uint32_t r = 0; r < 2; r++) {
        fx_cache_init(&src[r], FX_BLOCKS_FIRST, 2, 24);
        fx_fill(&src[r], 77); /* MLA: every rank holds the same bytes */
        kvp_kv_worker_params_t p;
        base_params(&p, pool);
        p.tp_size = 2, p.tp_rank = r, p.group_kind = KVP_KV_GROUP_MLA;
        ws[r] = mk_worker_p(&p, &src[r]);
    }
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 4, 12, 4);
    fx_save(&f);
    fx_save_now(ws[0], &f);
    char kb[KVP_KV_STORE_KEY_MAX + 1];
    ASSERT_EQ(fx_stats(ws[0]).blocks_saved, 2);
    ASSERT_EQ(exists1(pool, key_of(kb, 12, 0, 0)), 1);
    ASSERT_EQ(exists1(pool, key_of(kb, 12, 1, 0)), 0);
    ASSERT_EQ(exists1(pool, key_of(kb, 12, 2, 0)), 1);
    fx_save_now(ws[1], &f);
    ASSERT_EQ(fx_stats(ws[1]).blocks_saved, 2);
    ASSERT_EQ(fx_stats(ws[1]).blocks_deduped, 0); /* it never probed rank 0's chunks */
    ASSERT_EQ(hit_of(pool, 2, 1, KVP_KV_GROUP_MLA, 80, 12, 4), 64);
    /* Rank 1 loads all four (the rotation starts it on the second key). */
    fx_cache_init(&dst, FX_BLOCKS_FIRST, 2, 24);
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    p.tp_size = 2, p.tp_rank = 1, p.group_kind = KVP_KV_GROUP_MLA;
    kvp_kv_worker_t *wd = mk_worker_p(&p, &dst);
    fx_meta(&f, "c", 80, DST_IDS, 5, 12, 5);
    fx_load(&f, 0, 64);
    fx_load_now(wd, &f);
    for (int i = 0; i < 4; i++)
        ASSERT(fx_same(&src[0], SRC_IDS[i], &dst, DST_IDS[i]));
    kvp_kv_worker_destroy(wd);
    for (int r = 0; r < 2; r++) {
        kvp_kv_worker_destroy(ws[r]);
        fx_cache_free(&src[r]);
    }
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* Scenario 14: an async load with vllm_cached 32 of a 64-token hit loads
 * from mask_num = 32: chunks 2, 3 only; the request is done_recving. */
TEST(test_scenario_14_async_load_from_mask_num)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 14);
    kvp_kv_worker_t *ws = mk_worker(pool, &src), *wd = mk_worker(pool, &dst);
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 4, 14, 4);
    fx_save(&f);
    fx_save_now(ws, &f);
    fx_meta(&f, "c", 64, DST_IDS, 4, 14, 4);
    fx_load(&f, 32, 64);
    fx_load_now(wd, &f);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 2);
    ASSERT(fx_zero(&dst, DST_IDS[0]) && fx_zero(&dst, DST_IDS[1]));
    ASSERT(fx_same(&src, SRC_IDS[2], &dst, DST_IDS[2]));
    ASSERT(fx_same(&src, SRC_IDS[3], &dst, DST_IDS[3]));
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* Scenario 17: chunked prefill: a save of 32 then of 80 tokens writes
 * chunks 0, 1 and then only 2..4 (resuming at _saved_offset = 32, the
 * first two not even probed). */
TEST(test_scenario_17_chunked_save_resumes_from_offset)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 17);
    kvp_kv_worker_t *w = mk_worker(pool, &src);
    fx_meta_t f;
    fx_meta(&f, "p", 32, SRC_IDS, 3, 17, 6);
    fx_save(&f);
    fx_save_now(w, &f);
    ASSERT_EQ(fx_stats(w).blocks_saved, 2);
    fx_meta(&f, "p", 80, SRC_IDS, 5, 17, 6);
    fx_save(&f);
    fx_save_now(w, &f);
    kvp_kv_worker_stats_t s = fx_stats(w);
    ASSERT_EQ(s.blocks_saved, 5);
    ASSERT_EQ(s.blocks_deduped, 0);
    ASSERT_EQ(hit_of(pool, 1, 1, KVP_KV_GROUP_FULL_ATTENTION, 100, 17, 6), 80);
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* W4 dedup: a second request with the same blocks puts nothing. */
TEST(test_w4_dedup_second_save_puts_nothing)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 24);
    fx_fill(&src, 4);
    kvp_kv_worker_t *w = mk_worker(pool, &src);
    fx_meta_t f;
    fx_meta(&f, "a", 64, SRC_IDS, 4, 4, 4);
    fx_save(&f);
    fx_save_now(w, &f);
    kvp_pool_stats_t ps0;
    ASSERT_OK(kvp_pool_stats(pool, &ps0));
    fx_meta(&f, "b", 64, SRC_IDS, 4, 4, 4);
    fx_save(&f);
    fx_save_now(w, &f);
    kvp_kv_worker_stats_t s = fx_stats(w);
    ASSERT_EQ(s.blocks_saved, 4);
    ASSERT_EQ(s.blocks_deduped, 4);
    kvp_pool_stats_t ps1;
    ASSERT_OK(kvp_pool_stats(pool, &ps1));
    ASSERT_EQ(ps1.committed, ps0.committed);
    ASSERT_EQ(ps1.put_existed, ps0.put_existed); /* not even a put that existed */
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* Scenario 23: a preempted request's stored counter is dropped: its finish
 * is never reported, and a new save starts again from token 0. */
TEST(test_scenario_23_preemption_drops_counter)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 24);
    fx_fill(&src, 23);
    kvp_kv_worker_t *w = mk_worker(pool, &src);
    fx_meta_t f;
    fx_meta(&f, "r", 32, SRC_IDS, 2, 23, 4);
    fx_save(&f);
    fx_save_now(w, &f);
    const char *pre[] = {"r"};
    kvp_kv_meta_t meta = {.preempted_req_ids = pre, .num_preempted = 1,
                          .unfinished_req_ids = pre, .num_unfinished = 1};
    kvp_kv_finished_t out;
    ASSERT_OK(kvp_kv_worker_get_finished(w, &meta, NULL, 0, &out));
    out = fx_step(w, NULL, 0, pre, 1);
    ASSERT_EQ(out.num_sending, 0); /* never stored (any more) */
    fx_meta(&f, "r", 64, SRC_IDS, 4, 23, 4); /* resumed: saved from 0 again */
    fx_save(&f);
    fx_save_now(w, &f);
    kvp_kv_worker_stats_t s = fx_stats(w);
    ASSERT_EQ(s.blocks_deduped, 2);
    ASSERT_EQ(s.blocks_saved, 4);
    out = fx_step(w, NULL, 0, pre, 1);
    ASSERT_EQ(out.num_sending, 1);
    ASSERT_STR_EQ(out.sending[0], "r");
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* A copy seam whose to_host waits at a gate: a save held in flight. */
static pthread_mutex_t g_gmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gcv = PTHREAD_COND_INITIALIZER;
static int g_open, g_waiting;
static kvp_status_t gated_to(void *ctx, void *d, const void *s, size_t n)
{
    (void)ctx;
    pthread_mutex_lock(&g_gmu);
    g_waiting++;
    pthread_cond_broadcast(&g_gcv);
    while (!g_open)
        pthread_cond_wait(&g_gcv, &g_gmu);
    pthread_mutex_unlock(&g_gmu);
    memcpy(d, s, n);
    return KVP_OK;
}
static void gate_set(int open)
{
    pthread_mutex_lock(&g_gmu);
    g_open = open;
    pthread_cond_broadcast(&g_gcv);
    pthread_mutex_unlock(&g_gmu);
}
static void gate_await_waiter(void)
{
    pthread_mutex_lock(&g_gmu);
    while (!g_waiting)
        pthread_cond_wait(&g_gcv, &g_gmu);
    pthread_mutex_unlock(&g_gmu);
}

/* Scenario 24 and W5: a request finished with a save in flight is reported
 * in done_sending only once its stored count reaches 0; one with count 0
 * at its finish is reported at once; one never stored, never. */
TEST(test_scenario_24_done_sending_after_saves)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 24);
    kvp_kv_copy_ops_t gated = {false, gated_to, cnt_from, NULL};
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    p.copy = &gated;
    kvp_kv_worker_t *w = mk_worker_p(&p, &src);
    fx_meta_t a, b;
    fx_meta(&a, "a", 32, SRC_IDS, 2, 24, 4);
    fx_save(&a);
    fx_meta_t *one[1] = {&a};
    fx_step(w, one, 1, NULL, 0);
    gate_await_waiter(); /* a's save is in flight, held */
    const char *fa[] = {"a", "never"};
    kvp_kv_finished_t out = fx_step(w, NULL, 0, fa, 2);
    ASSERT_EQ(out.num_sending, 0);
    out = fx_step(w, NULL, 0, NULL, 0);
    ASSERT_EQ(out.num_sending, 0);
    ASSERT_EQ(fx_stats(w).save_queue_depth, 0);
    gate_set(1);
    ASSERT_OK(kvp_kv_worker_drain(w));
    out = fx_step(w, NULL, 0, NULL, 0); /* W5 step 2: remembered, count 0 */
    ASSERT_EQ(out.num_sending, 1);
    ASSERT_STR_EQ(out.sending[0], "a");
    out = fx_step(w, NULL, 0, NULL, 0);
    ASSERT_EQ(out.num_sending, 0); /* reported once */
    fx_meta(&b, "b", 32, SRC_IDS + 2, 2, 25, 4);
    fx_save(&b);
    one[0] = &b;
    fx_step(w, one, 1, NULL, 0);
    ASSERT_OK(kvp_kv_worker_drain(w));
    const char *fb[] = {"b"};
    out = fx_step(w, NULL, 0, fb, 1); /* W5 step 3: count 0 at its finish */
    ASSERT_EQ(out.num_sending, 1);
    ASSERT_STR_EQ(out.sending[0], "b");
    ASSERT_EQ(fx_stats(w).blocks_saved, 4);
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* W5 order within one call: the preempted id's entry goes first, so the
 * same call's finish of it reports nothing; a remembered id done in the
 * same call as a fresh finish is reported once. */
TEST(test_w5_done_sending_order)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 5);
    kvp_kv_worker_t *w = mk_worker(pool, &src);
    fx_meta_t a, b;
    fx_meta(&a, "a", 32, SRC_IDS, 2, 51, 4);
    fx_save(&a);
    fx_meta(&b, "b", 32, SRC_IDS + 2, 2, 52, 4);
    fx_save(&b);
    fx_meta_t *two[2] = {&a, &b};
    fx_step(w, two, 2, NULL, 0);
    ASSERT_OK(kvp_kv_worker_drain(w));
    const char *pre[] = {"a"};
    const char *fin[] = {"a", "b"};
    kvp_kv_meta_t meta = {.preempted_req_ids = pre, .num_preempted = 1};
    kvp_kv_finished_t out;
    ASSERT_OK(kvp_kv_worker_get_finished(w, &meta, fin, 2, &out));
    ASSERT_EQ(out.num_sending, 1);
    ASSERT_STR_EQ(out.sending[0], "b");
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* Fills the pool with pinned objects until a put of `size` gets no space. */
static int fill_pinned(kvp_pool_t *pool, size_t size, int start)
{
    uint8_t *buf = calloc(1, size);
    int i = start;
    for (;; i++) {
        char name[32];
        snprintf(name, sizeof name, "fill/%d", i);
        kvp_key_t k = kvp_key_str(name);
        kvp_iov_t iov = {buf, size};
        kvp_sgl_t sgl = {&iov, 1};
        kvp_key_result_t r;
        ASSERT_OK(kvp_pool_put(pool, &k, &sgl, 1, &r));
        if (r.status == KVP_ERR_NO_SPACE)
            break;
        ASSERT_OK(r.status);
        ASSERT_OK(kvp_pool_pin(pool, &k, 1, 1, &r));
    }
    free(buf);
    return i;
}

static void unfill(kvp_pool_t *pool, int n)
{
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof name, "fill/%d", i);
        kvp_key_t k = kvp_key_str(name);
        kvp_key_result_t r;
        kvp_pool_pin(pool, &k, 1, 0, &r);
        kvp_pool_remove(pool, &k, 1, &r);
    }
}

/* Scenario 27 (W4 store pressure): a put answered KVP_ERR_NO_SPACE marks
 * the request pressure-skipped: its later metas are skipped and its
 * high-water mark stays, until another request's batch succeeds; then its
 * whole range is saved. */
TEST(test_w4_pressure_skip)
{
    kvp_pool_t *pool = open_pool("embedded://?capacity=4MiB");
    fx_cache_t src;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 24);
    fx_fill(&src, 27);
    kvp_kv_worker_t *w = mk_worker(pool, &src);
    int n = fill_pinned(pool, 64 << 10, 0);
    n = fill_pinned(pool, 4096, n);
    n = fill_pinned(pool, fx_value_bytes(&src), n);
    fx_meta_t f;
    fx_meta(&f, "r", 32, SRC_IDS, 2, 27, 4);
    fx_save(&f);
    fx_save_now(w, &f);
    kvp_kv_worker_stats_t s = fx_stats(w);
    ASSERT_EQ(s.blocks_saved, 0);
    ASSERT_GE(s.save_errors, 1);
    ASSERT_EQ(s.pressure_skips, 0);
    unfill(pool, n); /* room again, but r stays paused ... */
    fx_meta(&f, "r", 48, SRC_IDS, 3, 27, 4);
    fx_save(&f);
    fx_save_now(w, &f);
    s = fx_stats(w);
    ASSERT_EQ(s.pressure_skips, 1);
    ASSERT_EQ(s.blocks_saved, 0);
    fx_meta_t g; /* ... until another request's batch succeeds */
    fx_meta(&g, "other", 16, SRC_IDS + 5, 1, 270, 1);
    fx_save(&g);
    fx_save_now(w, &g);
    ASSERT_EQ(fx_stats(w).blocks_saved, 1);
    fx_meta(&f, "r", 64, SRC_IDS, 4, 27, 4);
    fx_save(&f);
    fx_save_now(w, &f);
    s = fx_stats(w);
    ASSERT_EQ(s.blocks_saved, 1 + 4); /* the range from 0, retried whole */
    ASSERT_EQ(s.pressure_skips, 1);
    ASSERT_EQ(hit_of(pool, 1, 1, KVP_KV_GROUP_FULL_ATTENTION, 80, 27, 4), 64);
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* Scenario 28: a missing key and a value of the wrong size are load errors
 * (their block ids), the good block is loaded, and the request is done. */
TEST(test_scenario_28_load_errors_missing_and_wrong_size)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 28);
    kvp_kv_worker_t *ws = mk_worker(pool, &src), *wd = mk_worker(pool, &dst);
    fx_meta_t f;
    fx_meta(&f, "p", 16, SRC_IDS, 1, 28, 4);
    fx_save(&f);
    fx_save_now(ws, &f);
    char kb[KVP_KV_STORE_KEY_MAX + 1];
    kvp_key_t k1 = key_of(kb, 28, 1, 0);
    uint8_t small[100] = {1};
    kvp_iov_t iov = {small, sizeof small};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    ASSERT_OK(kvp_pool_put(pool, &k1, &sgl, 1, &r));
    ASSERT_OK(r.status);
    fx_meta(&f, "c", 48, DST_IDS, 3, 28, 4);
    fx_load(&f, 0, 48);
    fx_load_now(wd, &f);
    int64_t e[8];
    ASSERT_EQ(fx_errors(wd, e, 8), 2);
    ASSERT_EQ(e[0], DST_IDS[2]); /* sorted: 16 then 18 */
    ASSERT_EQ(e[1], DST_IDS[1]);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 1);
    ASSERT_EQ(fx_stats(wd).load_errors, 2);
    ASSERT(fx_same(&src, SRC_IDS[0], &dst, DST_IDS[0]));
    ASSERT_EQ(fx_errors(wd, e, 8), 0); /* cleared by the call */
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* The bounded save queue: beyond max_save_bytes a save is dropped and
 * counted, and the request's finish is not delayed by it. */
TEST(test_bounded_save_queue_drops_without_delaying_done_sending)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 31);
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    p.max_save_bytes = 3 * fx_value_bytes(&src);
    kvp_kv_worker_t *w = mk_worker_p(&p, &src);
    fx_meta_t f;
    fx_meta(&f, "big", 64, SRC_IDS, 4, 31, 4); /* 4 blocks > 3 */
    fx_save(&f);
    fx_meta_t *one[1] = {&f};
    const char *fin[] = {"big"};
    kvp_kv_finished_t out = fx_step(w, one, 1, fin, 1);
    ASSERT_EQ(fx_stats(w).saves_dropped, 1);
    ASSERT_EQ(out.num_sending, 1); /* reported at once */
    ASSERT_OK(kvp_kv_worker_drain(w));
    ASSERT_EQ(fx_stats(w).blocks_saved, 0);
    fx_meta(&f, "ok", 48, SRC_IDS, 3, 32, 4); /* 3 blocks fit */
    fx_save(&f);
    fx_save_now(w, &f);
    ASSERT_EQ(fx_stats(w).blocks_saved, 3);
    ASSERT_EQ(fx_stats(w).saves_dropped, 1);
    kvp_kv_worker_destroy(w);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* W6 staging budget: batches of at most the budget all load; a value over
 * it fails the whole request (every block an error). */
TEST(test_w6_staging_budget)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 24);
    fx_cache_init(&dst, FX_BLOCKS_FIRST, 2, 24);
    fx_fill(&src, 6);
    kvp_kv_worker_t *ws = mk_worker(pool, &src);
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 4, 6, 4);
    fx_save(&f);
    fx_save_now(ws, &f);
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    p.staging_budget_bytes = 2 * fx_value_bytes(&src) + 1;
    kvp_kv_worker_t *wd = mk_worker_p(&p, &dst);
    fx_meta(&f, "c", 64, DST_IDS, 4, 6, 4);
    fx_load(&f, 0, 64);
    fx_load_now(wd, &f);
    int64_t e[8];
    ASSERT_EQ(fx_errors(wd, e, 8), 0);
    for (int i = 0; i < 4; i++)
        ASSERT(fx_same(&src, SRC_IDS[i], &dst, DST_IDS[i]));
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&dst);
    fx_cache_init(&dst, FX_BLOCKS_FIRST, 2, 24);
    p.staging_budget_bytes = fx_value_bytes(&src) - 1;
    wd = mk_worker_p(&p, &dst);
    fx_load_now(wd, &f);
    ASSERT_EQ(fx_errors(wd, e, 8), 4);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 0);
    for (int i = 0; i < 4; i++)
        ASSERT(fx_zero(&dst, DST_IDS[i]));
    kvp_kv_worker_destroy(wd);
    kvp_kv_worker_destroy(ws);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* A consumer never saves, and loads with several load threads in flight. */
TEST(test_w2_consumer_loads_many_in_parallel)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 64);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 64);
    fx_fill(&src, 2);
    kvp_kv_worker_t *ws = mk_worker(pool, &src);
    kvp_kv_worker_params_t p;
    base_params(&p, pool);
    p.role = KVP_KV_ROLE_CONSUMER;
    p.num_load_threads = 4;
    kvp_kv_worker_t *wd = mk_worker_p(&p, &dst);
    fx_meta_t fs[8], *ms[8];
    char ids[8][8];
    for (int r = 0; r < 8; r++) {
        int64_t b[4] = {r * 4, r * 4 + 1, r * 4 + 2, r * 4 + 3};
        snprintf(ids[r], sizeof ids[r], "r%d", r);
        fx_meta(&fs[r], ids[r], 64, b, 4, 200 + (uint32_t)r, 4);
        fx_save(&fs[r]);
        ms[r] = &fs[r];
    }
    fx_step(ws, ms, 8, NULL, 0);
    ASSERT_OK(kvp_kv_worker_drain(ws));
    ASSERT_EQ(fx_stats(ws).blocks_saved, 32);
    for (int r = 0; r < 8; r++) {
        int64_t b[4] = {63 - r * 4, 62 - r * 4, 61 - r * 4, 60 - r * 4};
        fx_meta(&fs[r], ids[r], 64, b, 4, 200 + (uint32_t)r, 4);
        fx_load(&fs[r], 0, 64);
        fs[r].m.can_save = true; /* ignored by a consumer */
    }
    kvp_kv_finished_t out = fx_step(wd, ms, 8, NULL, 0);
    size_t seen = out.num_recving;
    for (int t = 0; seen < 8 && t < 5000; t++) {
        fx_sleep_ms(1);
        out = fx_step(wd, NULL, 0, NULL, 0);
        seen += out.num_recving;
    }
    ASSERT_EQ(seen, 8);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 32);
    ASSERT_EQ(fx_stats(wd).blocks_saved, 0);
    for (int r = 0; r < 8; r++)
        for (int i = 0; i < 4; i++)
            ASSERT(fx_same(&src, r * 4 + i, &dst, 63 - r * 4 - i));
    char text[4096];
    size_t len;
    ASSERT_OK(kvp_kv_worker_metrics(wd, text, sizeof text, &len));
    ASSERT_EQ(len, strlen(text));
    ASSERT(strstr(text, "kvpool_kv_worker_blocks_loaded_total 32\n"));
    ASSERT(strstr(text, "# TYPE kvpool_kv_worker_load_queue_depth gauge\n"));
    ASSERT_EQ(kvp_kv_worker_metrics(wd, text, 10, &len), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_GT(len, 10);
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/* Destroy finishes queued work first (the threads drain their queues). */
TEST(test_destroy_finishes_queued_saves)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 24);
    fx_fill(&src, 40);
    kvp_kv_worker_t *w = mk_worker(pool, &src);
    fx_meta_t f;
    fx_meta(&f, "p", 64, SRC_IDS, 4, 40, 4);
    fx_save(&f);
    fx_meta_t *one[1] = {&f};
    fx_step(w, one, 1, NULL, 0);
    kvp_kv_worker_destroy(w);
    ASSERT_EQ(hit_of(pool, 1, 1, KVP_KV_GROUP_FULL_ATTENTION, 80, 40, 4), 64);
    fx_cache_free(&src);
    kvp_pool_close(pool);
}

/* Synchronous loads (load_async=False): load_now returns with the bytes in
 * place and the missing block reported as a load error; the request is never
 * in done_recving, and get_finished with the same meta loads nothing again. */
TEST(test_sync_load_now_before_forward)
{
    kvp_pool_t *pool = open_pool(URI);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 24);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 24);
    fx_fill(&src, 31);
    kvp_kv_worker_t *ws = mk_worker(pool, &src), *wd = mk_worker(pool, &dst);
    fx_meta_t f;
    fx_meta(&f, "p", 48, SRC_IDS, 3, 31, 4);
    fx_save(&f);
    fx_save_now(ws, &f);
    fx_meta(&f, "c", 64, DST_IDS, 4, 31, 4);
    fx_load(&f, 0, 64); /* block 3 was never saved */
    kvp_kv_req_meta_t reqs[1] = {f.m};
    kvp_kv_meta_t meta = {.requests = reqs, .num_requests = 1};
    ASSERT_OK(kvp_kv_worker_load_now(wd, &meta));
    for (int i = 0; i < 3; i++)
        ASSERT(fx_same(&src, SRC_IDS[i], &dst, DST_IDS[i]));
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 3);
    int64_t e[4];
    ASSERT_EQ(fx_errors(wd, e, 4), 1);
    ASSERT_EQ(e[0], DST_IDS[3]);
    kvp_kv_finished_t out;
    ASSERT_OK(kvp_kv_worker_get_finished(wd, &meta, NULL, 0, &out));
    ASSERT_EQ(out.num_recving, 0);
    fx_sleep_ms(50);
    ASSERT_OK(kvp_kv_worker_get_finished(wd, NULL, NULL, 0, &out));
    ASSERT_EQ(out.num_recving, 0);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 3); /* not loaded twice */
    /* The next step's async load of the same id is queued and reported again. */
    fx_load_now(wd, &f);
    ASSERT_EQ(fx_stats(wd).blocks_loaded, 6);
    ASSERT_EQ(kvp_kv_worker_load_now(NULL, &meta), KVP_ERR_NULL_POINTER);
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

TEST_LIST(T(test_w8_blocks_first_roundtrip), T(test_w8_kv_first_roundtrip),
          T(test_w8_cross_layer_roundtrip), T(test_copy_seam_staged_roundtrip),
          T(test_w8_bad_input), T(test_bad_block_ids_fail_the_meta),
          T(test_scenario_8_prefix_hit_from_worker_saves), T(test_scenario_9_full_prompt_hit_capped),
          T(test_scenario_10_tp2_gqa_namespaces), T(test_w4_mla_put_stride),
          T(test_scenario_14_async_load_from_mask_num),
          T(test_scenario_17_chunked_save_resumes_from_offset),
          T(test_w4_dedup_second_save_puts_nothing), T(test_scenario_23_preemption_drops_counter),
          T(test_scenario_24_done_sending_after_saves), T(test_w5_done_sending_order),
          T(test_w4_pressure_skip), T(test_scenario_28_load_errors_missing_and_wrong_size),
          T(test_bounded_save_queue_drops_without_delaying_done_sending), T(test_w6_staging_budget),
          T(test_w2_consumer_loads_many_in_parallel), T(test_destroy_finishes_queued_saves),
          T(test_sync_load_now_before_forward))
