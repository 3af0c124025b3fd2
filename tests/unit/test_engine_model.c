/*
 * The engine model's parts: the block pool and its local prefix cache
 * (vLLM's BlockPool rules), the deterministic tokens, block hashes and KV
 * bytes (content.h), and what lookups may see in virtual time (visible.c).
 */
#include <stdlib.h>
#include <string.h>

#include "engine/blockpool.h"
#include "engine/content.h"
#include "engine/engine.h"
#include "test.h"

static void hash_of(uint8_t *h, int v)
{
    memset(h, 0, KVP__BP_HASH_LEN);
    h[0] = (uint8_t)v;
    h[1] = 0xee;
}

/* A freed cached block stays a hit until allocation reuses it, least
 * recently freed first. */
TEST(test_bp_lru_reuses_least_recently_freed)
{
    kvp__bp_t bp;
    ASSERT_EQ(kvp__bp_init(&bp, 4), KVP_OK);
    int64_t ids[4];
    ASSERT_EQ(kvp__bp_alloc(&bp, 4, ids), KVP_OK);
    ASSERT_EQ(bp.num_free, 0);
    ASSERT_EQ(kvp__bp_alloc(&bp, 1, ids), KVP_ERR_NO_SPACE);
    uint8_t h[4][KVP__BP_HASH_LEN];
    for (int i = 0; i < 4; i++) {
        hash_of(h[i], i);
        kvp__bp_cache(&bp, ids[i], h[i]);
    }
    kvp__bp_free(&bp, ids, 2);     /* frees ids[1] then ids[0] */
    kvp__bp_free(&bp, ids + 2, 2); /* ids[3], ids[2] */
    ASSERT_EQ(bp.num_free, 4);
    int64_t got[4];
    ASSERT_EQ(kvp__bp_lookup(&bp, (uint8_t *)h, 4, got), 4);
    int64_t one;
    ASSERT_EQ(kvp__bp_alloc(&bp, 1, &one), KVP_OK);
    ASSERT_EQ(one, ids[1]); /* the first one freed: a request's tail goes first */
    ASSERT_EQ(bp.evictions, 1u);
    ASSERT_EQ(kvp__bp_lookup(&bp, (uint8_t *)h, 4, got), 1); /* block 1's hash is gone */
    kvp__bp_cleanup(&bp);
}

TEST(test_bp_hit_leaves_the_free_queue)
{
    kvp__bp_t bp;
    ASSERT_EQ(kvp__bp_init(&bp, 2), KVP_OK);
    int64_t a;
    ASSERT_EQ(kvp__bp_alloc(&bp, 1, &a), KVP_OK);
    uint8_t h[KVP__BP_HASH_LEN];
    hash_of(h, 7);
    kvp__bp_cache(&bp, a, h);
    kvp__bp_free(&bp, &a, 1);
    ASSERT_EQ(bp.num_free, 2);
    int64_t hit;
    ASSERT_EQ(kvp__bp_lookup(&bp, h, 1, &hit), 1);
    kvp__bp_touch(&bp, &hit, 1);
    kvp__bp_touch(&bp, &hit, 1); /* a second request shares it */
    ASSERT_EQ(bp.num_free, 1);
    int64_t b;
    ASSERT_EQ(kvp__bp_alloc(&bp, 1, &b), KVP_OK);
    ASSERT_NE(b, hit);
    ASSERT_EQ(kvp__bp_alloc(&bp, 1, &b), KVP_ERR_NO_SPACE);
    kvp__bp_free(&bp, &hit, 1);
    ASSERT_EQ(bp.num_free, 0); /* still referenced once */
    kvp__bp_free(&bp, &hit, 1);
    ASSERT_EQ(bp.num_free, 1);
    ASSERT_EQ(kvp__bp_lookup(&bp, h, 1, NULL), 1);
    kvp__bp_cleanup(&bp);
}

TEST(test_bp_one_hash_one_block)
{
    kvp__bp_t bp;
    ASSERT_EQ(kvp__bp_init(&bp, 2), KVP_OK);
    int64_t ids[2];
    ASSERT_EQ(kvp__bp_alloc(&bp, 2, ids), KVP_OK);
    uint8_t h[KVP__BP_HASH_LEN];
    hash_of(h, 1);
    kvp__bp_cache(&bp, ids[0], h);
    kvp__bp_cache(&bp, ids[1], h); /* the same content computed twice */
    int64_t got;
    ASSERT_EQ(kvp__bp_lookup(&bp, h, 1, &got), 1);
    ASSERT_EQ(got, ids[0]);
    kvp__bp_free(&bp, ids, 2);
    int64_t x[2];
    ASSERT_EQ(kvp__bp_alloc(&bp, 2, x), KVP_OK);
    ASSERT_EQ(bp.evictions, 1u); /* only the cached one counted */
    ASSERT_EQ(kvp__bp_lookup(&bp, h, 1, NULL), 0);
    kvp__bp_cleanup(&bp);
}

/* The prompt's hashes are vLLM's request block hashes of its tokens. */
TEST(test_content_prompt_hashes_are_vllms)
{
    for (uint32_t bs = 16; bs <= 512; bs *= 4) {
        kvp__eng_hashes_t c;
        ASSERT_EQ(kvp__eng_hashes_init(&c, bs), KVP_OK);
        int64_t ids[3] = {5, 9, 11};
        int64_t len = 2 * 512 + 300;
        int64_t *tok = malloc((size_t)len * sizeof *tok);
        uint8_t *h = malloc((size_t)(len / bs + 1) * 32);
        ASSERT_EQ(kvp__eng_prompt(&c, ids, 3, len, tok, h), KVP_OK);
        for (int64_t i = 0; i < len; i++)
            ASSERT_EQ(tok[i], kvp__eng_trace_token(ids[i / 512], (uint32_t)(i % 512)));
        kvp_hash_t none, ref[128];
        size_t n = 0;
        ASSERT_EQ(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, NULL, 0, &none), KVP_OK);
        ASSERT_EQ(kvp_hash_request_blocks_i64(KVP_HASH_SHA256_CBOR, &none, tok, (size_t)len, bs, NULL,
                                              ref, 128, &n),
                  KVP_OK);
        ASSERT_EQ(n, (size_t)(len / bs));
        for (size_t i = 0; i < n; i++)
            ASSERT(memcmp(h + i * 32, ref[i].bytes, 32) == 0);
        /* the same ids again come from the cache, equal */
        uint8_t *h2 = malloc((size_t)(len / bs + 1) * 32);
        ASSERT_EQ(kvp__eng_prompt(&c, ids, 3, len, tok, h2), KVP_OK);
        ASSERT(memcmp(h, h2, n * 32) == 0);
        free(tok), free(h), free(h2);
        kvp__eng_hashes_cleanup(&c);
    }
}

/* Equal leading ids give equal hashes; a partial block is a prefix of the
 * full one; an id reused after another prefix is not served a wrong hash. */
TEST(test_content_shared_prefix_and_reused_ids)
{
    kvp__eng_hashes_t c;
    ASSERT_EQ(kvp__eng_hashes_init(&c, 64), KVP_OK);
    int64_t a[2] = {1, 2}, b[3] = {1, 2, 3}, d[2] = {4, 2};
    int64_t ta[1024], tb[1536], td[1024];
    uint8_t ha[16 * 32], hb[24 * 32], hd[16 * 32], hp[16 * 32];
    ASSERT_EQ(kvp__eng_prompt(&c, a, 2, 1000, ta, ha), KVP_OK); /* 15 full blocks */
    ASSERT_EQ(kvp__eng_prompt(&c, b, 3, 1536, tb, hb), KVP_OK);
    ASSERT(memcmp(ta, tb, 1000 * sizeof *ta) == 0);
    ASSERT(memcmp(ha, hb, 15 * 32) == 0);
    ASSERT_EQ(kvp__eng_prompt(&c, a, 2, 1024, ta, hp), KVP_OK);
    ASSERT(memcmp(hp, ha, 15 * 32) == 0);
    ASSERT_EQ(kvp__eng_prompt(&c, d, 2, 1024, td, hd), KVP_OK);
    ASSERT(memcmp(hd + 8 * 32, hp + 8 * 32, 32) != 0); /* id 2 after 4, not after 1 */
    uint8_t ref;
    ASSERT_EQ(kvp__eng_block_hash(hd + 7 * 32, td + 512, 64, hp), KVP_OK);
    ref = memcmp(hp, hd + 8 * 32, 32) == 0;
    ASSERT(ref);
    kvp__eng_hashes_cleanup(&c);
}

TEST(test_content_kv_check_detects_a_flipped_byte)
{
    uint8_t buf[1000];
    kvp__eng_kv_fill(buf, sizeof buf, 42, 3, 1);
    ASSERT(kvp__eng_kv_check(buf, sizeof buf, 42, 3, 1));
    ASSERT(!kvp__eng_kv_check(buf, sizeof buf, 43, 3, 1)); /* another key */
    ASSERT(!kvp__eng_kv_check(buf, sizeof buf, 42, 2, 1)); /* another layer */
    ASSERT(!kvp__eng_kv_check(buf, sizeof buf, 42, 3, 0)); /* K, not V */
    for (size_t i = 0; i < sizeof buf; i += 97) {
        buf[i] ^= 1;
        ASSERT(!kvp__eng_kv_check(buf, sizeof buf, 42, 3, 1));
        buf[i] ^= 1;
    }
    buf[sizeof buf - 1] ^= 0x80; /* the tail after the last whole word */
    ASSERT(!kvp__eng_kv_check(buf, sizeof buf, 42, 3, 1));
    ASSERT_NE(kvp__eng_key_seed("a@b", 3), kvp__eng_key_seed("a@c", 3));
}

TEST(test_visible_from_the_first_save_completion)
{
    kvp__eng_visible_t v;
    ASSERT_EQ(kvp__eng_visible_init(&v), KVP_OK);
    uint8_t h[3][32];
    for (int i = 0; i < 3; i++)
        hash_of(h[i], i);
    ASSERT_EQ(kvp__eng_visible_prefix(&v, (uint8_t *)h, 3, 1e9), 0);
    kvp__eng_visible_mark(&v, (uint8_t *)h, 2, 100.0);
    kvp__eng_visible_mark(&v, h[2], 1, 300.0);
    ASSERT_EQ(kvp__eng_visible_prefix(&v, (uint8_t *)h, 3, 99.0), 0);
    ASSERT_EQ(kvp__eng_visible_prefix(&v, (uint8_t *)h, 3, 100.0), 2);
    ASSERT_EQ(kvp__eng_visible_prefix(&v, (uint8_t *)h, 3, 300.0), 3);
    kvp__eng_visible_mark(&v, h[2], 1, 150.0); /* saved again, earlier */
    ASSERT_EQ(kvp__eng_visible_prefix(&v, (uint8_t *)h, 3, 200.0), 3);
    kvp__eng_visible_mark(&v, h[0], 1, 500.0); /* a later save changes nothing */
    ASSERT_EQ(kvp__eng_visible_prefix(&v, (uint8_t *)h, 3, 200.0), 3);
    kvp__eng_visible_cleanup(&v);
}

TEST(test_model_presets_bytes_per_token)
{
    ASSERT_EQ(kvp__eng_model_token_bytes(kvp__eng_model_find("tiny"), 1), 64u);
    ASSERT_EQ(kvp__eng_model_token_bytes(kvp__eng_model_find("small"), 1), 12288u);
    ASSERT_EQ(kvp__eng_model_token_bytes(kvp__eng_model_find("llama8b-like"), 1), 131072u);
    ASSERT_EQ(kvp__eng_model_token_bytes(kvp__eng_model_find("llama8b-like"), 2), 65536u);
    ASSERT_EQ(kvp__eng_model_token_bytes(kvp__eng_model_find("tiny"), 2), 64u); /* 1 head: replicated */
    ASSERT(kvp__eng_model_find("huge") == NULL);
}

TEST_LIST(T(test_bp_lru_reuses_least_recently_freed), T(test_bp_hit_leaves_the_free_queue),
          T(test_bp_one_hash_one_block), T(test_content_prompt_hashes_are_vllms),
          T(test_content_shared_prefix_and_reused_ids), T(test_content_kv_check_detects_a_flipped_byte),
          T(test_visible_from_the_first_save_completion), T(test_model_presets_bytes_per_token))
