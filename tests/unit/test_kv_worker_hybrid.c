/*
 * The worker with hybrid KV-cache groups (connectors-spec §2.7 W4 and W6
 * over the hybrid rule of kv_coord.c), real bytes over an embedded pool.
 *
 * Groups: full attention of 32-token blocks (group 0) and sliding window of
 * 16-token blocks with a 16-token window (group 1); scheduler (lcm) block 32,
 * hash block 16.  Worked by hand from coordinator.py and
 * single_type_kv_cache_manager.py:
 *
 *   store mask, SWA: retention None -> a tail at every 32-token boundary;
 *     per_segment = 32 / 16 = 2 blocks, need = cdiv(16 - 1, 16) = 1 < 2, so
 *     block i is kept iff i % 2 >= 2 - 1: the odd blocks 1, 3, 5, 7 (each
 *     ends on a 32-token boundary).  Full attention keeps every block.
 *   lookup of 129 tokens: token_len = 128; FA chunks 0..3 all present (run
 *     of 4 = 128 tokens); SWA from the right: block 7 present and
 *     (7 + 1) * 16 % 32 == 0, one block is enough -> 128.  The fixed point
 *     holds: 128 (< 129: the last-token rule does not cut).
 *   load mask at 128: FA chunks 0..3; SWA only block 7 (the window's tail:
 *     blocks 0..6 are the null block of the hit).
 *
 * So a save writes 4 + 4 blocks, a load reads 4 + 1, and the SWA blocks
 * outside the window stay untouched in the consumer's cache.
 */
#include <stdint.h>
#include <string.h>

#include "kv_worker_fixture.h"
#include "kvpool/kv_connector.h"
#include "test.h"

#define MODEL "hybrid-model"

static const kvp_kv_cache_group_t GROUPS[2] = {
    {KVP_KV_GROUP_FULL_ATTENTION, 32, false, 0, false},
    {KVP_KV_GROUP_SLIDING_WINDOW, 16, false, 16, false},
};

static kvp_kv_worker_t *mk_worker(kvp_pool_t *pool, fx_cache_t *c, kvp_kv_role_t role)
{
    kvp_kv_worker_params_t p;
    kvp_kv_worker_params_init(&p);
    p.pool = pool;
    p.model_name = MODEL;
    p.role = role;
    p.groups = GROUPS;
    p.num_groups = 2;
    p.block_size = 32;
    p.hash_block_size = 16;
    kvp_kv_worker_t *w = NULL;
    ASSERT_OK(kvp_kv_worker_create(&p, &w));
    ASSERT_OK(kvp_kv_worker_register(w, c->t, (size_t)c->ntensors, (uint64_t)c->nblocks));
    return w;
}

/* A two-group meta over 128 tokens: FA blocks fa[0..4), SWA blocks swa[0..8). */
static void meta2(fx_meta_t *f, const char *id, const int64_t *fa, const int64_t *swa)
{
    fx_meta(f, id, 128, fa, 4, 7, 8);
    memcpy(f->ids[1], swa, 8 * sizeof *swa);
    f->g[1].ids = f->ids[1], f->g[1].n = 8;
    f->m.block_ids.num_groups = 2;
}

TEST(test_hybrid_swa_saves_tails_and_loads_the_window)
{
    kvp_pool_t *pool = NULL;
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &pool));
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 48);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 48);
    fx_fill(&src, 11);
    kvp_kv_worker_t *wp = mk_worker(pool, &src, KVP_KV_ROLE_BOTH);
    kvp_kv_worker_t *wc = mk_worker(pool, &dst, KVP_KV_ROLE_CONSUMER);

    const int64_t fa_src[4] = {1, 2, 3, 4}, swa_src[8] = {10, 11, 12, 13, 14, 15, 16, 17};
    fx_meta_t save;
    meta2(&save, "p", fa_src, swa_src);
    fx_save(&save);
    fx_save_now(wp, &save);
    kvp_kv_worker_stats_t st = fx_stats(wp);
    ASSERT_EQ(st.blocks_saved, 4 + 4); /* FA every block, SWA the odd (tail) blocks */
    ASSERT_EQ(st.save_errors, 0);

    /* The lookup service over the same pool finds the whole 128 tokens. */
    kvp_kv_lookup_pool_params_t lp;
    kvp_kv_lookup_pool_params_init(&lp);
    lp.model_name = MODEL;
    lp.groups = GROUPS;
    lp.num_groups = 2;
    lp.block_size = 32;
    lp.hash_block_size = 16;
    kvp_kv_lookup_pool_t *lk;
    ASSERT_OK(kvp_kv_lookup_pool_create(pool, &lp, &lk));
    kvp_kv_lookup_result_t r;
    ASSERT_OK(kvp_kv_lookup_pool_query(lk, 129, save.hashes, 8, FX_HLEN, true, &r));
    ASSERT_EQ(r.hit_tokens, 128);

    /* The consumer loads FA chunks 0..3 and the SWA window's one block. */
    const int64_t fa_dst[4] = {30, 31, 32, 33}, swa_dst[8] = {40, 41, 42, 43, 44, 45, 46, 47};
    fx_meta_t load;
    meta2(&load, "c", fa_dst, swa_dst);
    fx_load(&load, 0, r.hit_tokens);
    fx_load_now(wc, &load);
    int64_t errs[16];
    ASSERT_EQ(fx_errors(wc, errs, 16), 0);
    st = fx_stats(wc);
    ASSERT_EQ(st.blocks_loaded, 4 + 1);
    for (int i = 0; i < 4; i++)
        ASSERT(fx_same(&src, fa_src[i], &dst, fa_dst[i]));
    ASSERT(fx_same(&src, swa_src[7], &dst, swa_dst[7]));
    for (int i = 0; i < 7; i++)
        ASSERT(fx_zero(&dst, swa_dst[i])); /* outside the window: not loaded */

    /* A second request whose SWA tail blocks are gone: the hit falls back
     * to where FA and SWA agree.  Removing SWA block 7's key leaves SWA
     * block 5 (ends at 96, aligned) as the tail: hit 96. */
    char key[KVP_KV_STORE_KEY_MAX + 1];
    kvp_kv_store_key_t k = {.model_name = MODEL, .model_name_len = strlen(MODEL), .group_id = 1};
    k.hash.len = FX_HLEN;
    memcpy(k.hash.bytes, save.hashes + 7 * FX_HLEN, FX_HLEN);
    ASSERT_OK(kvp_kv_store_key_format(&k, key, sizeof key, NULL));
    kvp_key_t kk = kvp_key_str(key);
    kvp_key_result_t res;
    ASSERT_OK(kvp_pool_remove(pool, &kk, 1, &res));
    ASSERT_OK(res.status);
    ASSERT_OK(kvp_kv_lookup_pool_query(lk, 129, save.hashes, 8, FX_HLEN, true, &r));
    ASSERT_EQ(r.hit_tokens, 96);

    kvp_kv_lookup_pool_destroy(lk);
    kvp_kv_worker_destroy(wc);
    kvp_kv_worker_destroy(wp);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

/*
 * W7, the partial-tail offload, with a Mamba group in align mode (partial
 * hits on): full attention of 16-token blocks (group 0), Mamba of 64-token
 * blocks (group 1), hash block 16, scheduler block 64.  A 50-token prompt
 * ends its hashes at 48 tokens (3 hashes).  By hand, from
 * _maybe_offload_partial_tail: boundary 48; FA blocks 0..cdiv(48,16)-1 = 2,
 * keyed by the hashes ending at 16, 32, 48; Mamba block 0 (cdiv(48,64)-1),
 * valid end min(64, 48) = 48 = the boundary and 48 % 64 != 0, so its source
 * is the CoW block and its key the hash ending at 48.  The meta is K14's
 * offload-only meta (token_len_chunk 0), so nothing else is saved.  The
 * lookup of 50 tokens (partial hits: token_len 48): FA's run is 48, Mamba's
 * fine-grained finder finds the hash ending at 48 -> 48.  The load at 48:
 * FA chunks 0..2, Mamba chunk 0 from the key of the hash ending at 48: the
 * CoW block's bytes.
 */
TEST(test_w7_partial_tail_offload_mamba_align)
{
    static const kvp_kv_cache_group_t groups[2] = {
        {KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false},
        {KVP_KV_GROUP_MAMBA, 64, true, 0, false},
    };
    kvp_pool_t *pool = NULL;
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &pool));
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_BLOCKS_FIRST, 2, 32);
    fx_cache_init(&dst, FX_BLOCKS_FIRST, 2, 32);
    fx_fill(&src, 5);
    kvp_kv_worker_t *w[2];
    fx_cache_t *caches[2] = {&src, &dst};
    for (int i = 0; i < 2; i++) {
        kvp_kv_worker_params_t p;
        kvp_kv_worker_params_init(&p);
        p.pool = pool;
        p.model_name = MODEL;
        p.role = i ? KVP_KV_ROLE_CONSUMER : KVP_KV_ROLE_BOTH;
        p.groups = groups;
        p.num_groups = 2;
        p.block_size = 64;
        p.hash_block_size = 16;
        ASSERT_OK(kvp_kv_worker_create(&p, &w[i]));
        ASSERT_OK(kvp_kv_worker_register(w[i], caches[i]->t, (size_t)caches[i]->ntensors,
                                         (uint64_t)caches[i]->nblocks));
    }
    const int64_t fa_src[4] = {1, 2, 3, 4}, mamba_src = 9, cow = 12;
    fx_meta_t save;
    fx_meta(&save, "p", 0, fa_src, 4, 3, 3);
    save.ids[1][0] = mamba_src;
    save.g[1].ids = save.ids[1], save.g[1].n = 1;
    save.m.block_ids.num_groups = 2;
    save.m.num_prompt_tokens = 50;
    kvp_kv_tail_offload_t tail = {1, cow, 48};
    save.m.partial_tail_offloads = &tail;
    save.m.num_partial_tail_offloads = 1;
    fx_save(&save);
    fx_save_now(w[0], &save);
    kvp_kv_worker_stats_t st = fx_stats(w[0]);
    ASSERT_EQ(st.blocks_saved, 3 + 1);
    ASSERT_EQ(st.save_errors, 0);

    kvp_kv_lookup_pool_params_t lp;
    kvp_kv_lookup_pool_params_init(&lp);
    lp.model_name = MODEL;
    lp.groups = groups;
    lp.num_groups = 2;
    lp.block_size = 64;
    lp.hash_block_size = 16;
    kvp_kv_lookup_pool_t *lk;
    ASSERT_OK(kvp_kv_lookup_pool_create(pool, &lp, &lk));
    kvp_kv_lookup_result_t r;
    ASSERT_OK(kvp_kv_lookup_pool_query(lk, 50, save.hashes, 3, FX_HLEN, true, &r));
    ASSERT_EQ(r.hit_tokens, 48);

    const int64_t fa_dst[4] = {20, 21, 22, 23}, mamba_dst = 27;
    fx_meta_t load;
    fx_meta(&load, "c", 0, fa_dst, 4, 3, 3);
    load.ids[1][0] = mamba_dst;
    load.g[1].ids = load.ids[1], load.g[1].n = 1;
    load.m.block_ids.num_groups = 2;
    fx_load(&load, 0, r.hit_tokens);
    fx_load_now(w[1], &load);
    int64_t errs[8];
    ASSERT_EQ(fx_errors(w[1], errs, 8), 0);
    ASSERT_EQ(fx_stats(w[1]).blocks_loaded, 3 + 1);
    for (int i = 0; i < 3; i++)
        ASSERT(fx_same(&src, fa_src[i], &dst, fa_dst[i]));
    ASSERT(fx_zero(&dst, fa_dst[3]));
    ASSERT(fx_same(&src, cow, &dst, mamba_dst)); /* the CoW block, not the group's block 0 */
    ASSERT(!fx_same(&src, mamba_src, &dst, mamba_dst));

    kvp_kv_lookup_pool_destroy(lk);
    kvp_kv_worker_destroy(w[1]);
    kvp_kv_worker_destroy(w[0]);
    fx_cache_free(&src);
    fx_cache_free(&dst);
    kvp_pool_close(pool);
}

TEST_LIST(T(test_hybrid_swa_saves_tails_and_loads_the_window),
          T(test_w7_partial_tail_offload_mamba_align))
