/*
 * The in-process pool lookup (src/kv/kv_lookup_pool.c): the lookup contract
 * (kv_lookup_contract.h) against it over a real embedded:// pool, plus what
 * only it promises: its parameters, the exact keys it asks for (§2.3), its
 * batching, and the scheduler running against a real pool.
 *
 * The factory stores a block the way a worker would: a pool put (through
 * pool.h) under the key that the key builder (kvp_kv_store_key_format) gives
 * for that rank namespace, with the model written as its name while the
 * lookup is given the model path, so the two sides meet only in the store.
 */
#include "kv_lookup_contract.h"

#include <stddef.h>

#include "common/alloc.h"
#include "kvpool/hash.h"
#include "kvpool/pool.h"

#define URI "embedded://?capacity=64MiB"
#define MODEL_PATH "/models/Llama-3-8B/"
#define MODEL "Llama-3-8B"
#define PREFIX "ns"

typedef struct pool_fixture {
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
} pool_fixture_t;

/* Puts one 1-byte value under the NUL-terminated key s. */
static void put_key(kvp_pool_t *pool, const char *s)
{
    static uint8_t one = 1;
    kvp_key_t k = kvp_key_str(s);
    kvp_iov_t iov = {&one, 1};
    kvp_sgl_t v = {&iov, 1};
    kvp_key_result_t res;
    ASSERT_OK(kvp_pool_put(pool, &k, &v, 1, &res));
    ASSERT_OK(res.status);
}

/* The key of hash h of group g on (tp_rank, dcp_rank, pp_rank), from the
 * key builder. */
static void key_of_group(const char *prefix, const kvp_hash_t *h, uint32_t t, uint32_t dcp,
                         uint32_t pp, uint32_t g, char out[KVP_KV_STORE_KEY_MAX + 1])
{
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    k.cache_prefix = prefix;
    k.cache_prefix_len = prefix ? strlen(prefix) : 0;
    k.model_name = MODEL;
    k.model_name_len = strlen(MODEL);
    k.tp_rank = t;
    k.dcp_rank = dcp;
    k.pp_rank = pp;
    k.group_id = g;
    k.hash = *h;
    ASSERT_OK(kvp_kv_store_key_format(&k, out, KVP_KV_STORE_KEY_MAX + 1, NULL));
}

static void key_of(const char *prefix, const kvp_hash_t *h, uint32_t t, uint32_t dcp, uint32_t pp,
                   char out[KVP_KV_STORE_KEY_MAX + 1])
{
    key_of_group(prefix, h, t, dcp, pp, 0, out);
}

static void params_of(const kvlc_geom_t *g, kvp_kv_lookup_pool_params_t *p)
{
    kvp_kv_lookup_pool_params_init(p);
    p->model_name = MODEL_PATH;
    p->cache_prefix = PREFIX;
    p->tp_size = g->tp_size;
    p->pp_size = g->pp_size;
    p->num_kv_heads = g->num_kv_heads;
    p->group_kind = g->mla ? KVP_KV_GROUP_MLA : KVP_KV_GROUP_FULL_ATTENTION;
    p->block_size = g->block_size;
    p->hash_block_size = g->hash_block_size;
}

static void pool_create(const kvlc_geom_t *g, const kvlc_block_t *blocks, size_t n,
                        kvlc_fixture_t *fx)
{
    pool_fixture_t *pf = calloc(1, sizeof *pf);
    ASSERT(pf);
    ASSERT_OK(kvp_pool_open(URI, &pf->pool));
    kvp_kv_lookup_pool_params_t p;
    params_of(g, &p);
    ASSERT_OK(kvp_kv_lookup_pool_create(pf->pool, &p, &pf->lk));
    uint32_t factor;
    ASSERT_OK(kvp_kv_store_key_replication_factor(p.group_kind, g->tp_size, g->num_kv_heads, 1,
                                                  &factor));
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = 0; t < g->tp_size / factor; t++)
            for (uint32_t pp = 0; pp < g->pp_size; pp++) {
                if ((blocks[i].tp_rank != KVLC_ALL && (uint32_t)blocks[i].tp_rank != t) ||
                    (blocks[i].pp_rank != KVLC_ALL && (uint32_t)blocks[i].pp_rank != pp))
                    continue;
                char key[KVP_KV_STORE_KEY_MAX + 1];
                key_of(PREFIX, &blocks[i].hash, t, 0, pp, key);
                put_key(pf->pool, key);
            }
    fx->client = kvp_kv_lookup_pool_client(pf->lk);
    fx->impl = pf;
}

static void pool_destroy(kvlc_fixture_t *fx)
{
    pool_fixture_t *pf = fx->impl;
    kvp_kv_lookup_pool_destroy(pf->lk);
    kvp_pool_close(pf->pool);
    free(pf);
}

static const kvlc_factory_t g_factory = {pool_create, pool_destroy};

#define DEF(name) \
    TEST(test_##name) { kvlc_##name(&g_factory); }
KVLC_LIST(DEF)
#undef DEF

/* ------------------------------------------------------- pool-only rules */

static kvp_status_t create_with(kvp_kv_lookup_pool_params_t *p)
{
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open(URI, &pool));
    kvp_kv_lookup_pool_t *lk = (kvp_kv_lookup_pool_t *)&pool; /* must be reset to NULL */
    kvp_status_t st = kvp_kv_lookup_pool_create(pool, p, &lk);
    if (st != KVP_OK)
        ASSERT(lk == NULL);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
    return st;
}

/* Scope: every group layout the hybrid rule serves (full attention, MLA,
 * Mamba, several groups); what it refuses (a sliding window without a
 * window, unknown kinds, sizes that do not divide) and malformed parameters
 * are KVP_ERR_BAD_CONFIG; params.size as for kvp_kv_config_t. */
TEST(test_pool_lookup_params_scope_and_refusals)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvp_kv_lookup_pool_params_t p;
    params_of(&g, &p);
    ASSERT_OK(create_with(&p));
    p.group_kind = KVP_KV_GROUP_MLA;
    ASSERT_OK(create_with(&p));
    params_of(&g, &p), p.group_kind = KVP_KV_GROUP_MAMBA;
    ASSERT_OK(create_with(&p));
    kvp_kv_cache_group_t two[2] = {{KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false},
                                   {KVP_KV_GROUP_SLIDING_WINDOW, 16, false, 32, false}};
    params_of(&g, &p), p.groups = two, p.num_groups = 2;
    ASSERT_OK(create_with(&p));
    params_of(&g, &p), p.groups = NULL, p.num_groups = 2; /* a count without groups */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    two[1].sliding_window = 0;
    params_of(&g, &p), p.groups = two, p.num_groups = 2;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.group_kind = KVP_KV_GROUP_SLIDING_WINDOW; /* no window */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);

    params_of(&g, &p), p.group_kind = (kvp_kv_group_kind_t)9;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.size = 0; /* not initialised by kvp_kv_lookup_pool_params_init */
    ASSERT_EQ(create_with(&p), KVP_ERR_INVALID_ARG);
    params_of(&g, &p), p.size = sizeof p + 8; /* a newer caller's header */
    ASSERT_EQ(create_with(&p), KVP_ERR_VERSION);
    params_of(&g, &p), p.tp_size = 0;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.pp_size = 0;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.tp_size = 4, p.dcp_size = 3; /* dcp must divide tp */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.num_kv_heads = 0;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.block_size = 24; /* not a multiple of hash_block_size 16 */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.hash_block_size = 0;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.model_name = "///"; /* no name component */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.model_name = "/m/a@b"; /* the key format refuses '@' in a model */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.model_name = NULL;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.cache_prefix = "a\nb"; /* control character */
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG);
    params_of(&g, &p), p.tp_size = 65536, p.num_kv_heads = 65536, p.pp_size = 2;
    ASSERT_EQ(create_with(&p), KVP_ERR_BAD_CONFIG); /* more namespaces than a batch */

    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open(URI, &pool));
    kvp_kv_lookup_pool_t *lk;
    params_of(&g, &p);
    ASSERT_EQ(kvp_kv_lookup_pool_create(NULL, &p, &lk), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_lookup_pool_create(pool, NULL, &lk), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_lookup_pool_create(pool, &p, NULL), KVP_ERR_NULL_POINTER);
    kvp_pool_close(pool);
    kvp_kv_lookup_pool_destroy(NULL);
}

/* A lookup over a fresh embedded pool for g (the caller closes both). */
static void open_lookup(const kvlc_geom_t *g, uint32_t dcp_size, kvp_pool_t **pool_p,
                        kvp_kv_lookup_pool_t **lk_p)
{
    ASSERT_OK(kvp_pool_open(URI, pool_p));
    kvp_kv_lookup_pool_params_t p;
    params_of(g, &p);
    p.dcp_size = dcp_size;
    ASSERT_OK(kvp_kv_lookup_pool_create(*pool_p, &p, lk_p));
}

static int64_t lookup_now(kvp_kv_lookup_pool_t *lk, const kvp_kv_request_t *req)
{
    kvp_kv_lookup_client_t c = kvp_kv_lookup_pool_client(lk);
    int64_t hit = -7;
    ASSERT_OK(c.ops->lookup(c.ctx, req, false, &hit));
    return hit;
}

/* §2.3, the exact keys: prefix, the model path's last component, T, pcp,
 * dcp = T % dcp_size (DCP 2 over TP 2: factor 1, both ranks), pp, group 0
 * and the lowercase hex, written out here by hand. */
TEST(test_pool_lookup_s23_exact_keys)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    g.tp_size = 2;
    g.num_kv_heads = 1; /* would be factor 2 without DCP */
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_lookup(&g, 2, &pool, &lk);
    kvlc_req_t r;
    kvlc_req_init(&r, 33, 2);
    char hex0[KVP_HASH_HEX_MAX], hex1[KVP_HASH_HEX_MAX], key[KVP_KV_STORE_KEY_MAX + 1];
    kvp_hash_t h0 = kvlc_hash(0), h1 = kvlc_hash(1);
    kvp_hash_to_hex(&h0, hex0);
    kvp_hash_to_hex(&h1, hex1);

    snprintf(key, sizeof key, "ns@Llama-3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%s", hex0);
    put_key(pool, key);
    ASSERT_EQ(lookup_now(lk, &r.req), 0); /* rank 1 has not stored chunk 0 */
    snprintf(key, sizeof key, "ns@Llama-3-8B@tp_rank:1@pcp0@dcp1@pp_rank:0@group:0@%s", hex0);
    put_key(pool, key);
    ASSERT_EQ(lookup_now(lk, &r.req), 16);
    /* Chunk 1 under near-miss keys: wrong dcp, another group, no prefix. */
    snprintf(key, sizeof key, "ns@Llama-3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%s", hex1);
    put_key(pool, key);
    snprintf(key, sizeof key, "ns@Llama-3-8B@tp_rank:1@pcp0@dcp0@pp_rank:0@group:0@%s", hex1);
    put_key(pool, key);
    snprintf(key, sizeof key, "ns@Llama-3-8B@tp_rank:1@pcp0@dcp1@pp_rank:0@group:1@%s", hex1);
    put_key(pool, key);
    snprintf(key, sizeof key, "Llama-3-8B@tp_rank:1@pcp0@dcp1@pp_rank:0@group:0@%s", hex1);
    put_key(pool, key);
    ASSERT_EQ(lookup_now(lk, &r.req), 16);
    snprintf(key, sizeof key, "ns@Llama-3-8B@tp_rank:1@pcp0@dcp1@pp_rank:0@group:0@%s", hex1);
    put_key(pool, key);
    ASSERT_EQ(lookup_now(lk, &r.req), 32);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* Keys of another cache prefix or of no prefix are another namespace. */
TEST(test_pool_lookup_s23_prefix_is_a_namespace)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_lookup(&g, 1, &pool, &lk);
    kvlc_req_t r;
    kvlc_req_init(&r, 33, 2);
    char key[KVP_KV_STORE_KEY_MAX + 1];
    for (uint32_t i = 0; i < 2; i++) {
        kvp_hash_t h = kvlc_hash(i);
        key_of(NULL, &h, 0, 0, 0, key);
        put_key(pool, key);
        key_of("other", &h, 0, 0, 0, key);
        put_key(pool, key);
    }
    ASSERT_EQ(lookup_now(lk, &r.req), 0);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* Hashes of 16 bytes (xxhash_cbor) key the same way; a hash length the key
 * format cannot hold is refused (the scheduler then treats it as 0). */
TEST(test_pool_lookup_hash_lengths)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_lookup(&g, 1, &pool, &lk);
    kvlc_req_t r;
    kvlc_req_init(&r, 40, 2);
    r.req.hash_len = 16; /* the same bytes, read as 4 hashes of 16 */
    r.req.num_block_hashes = 4;
    char key[KVP_KV_STORE_KEY_MAX + 1];
    for (uint32_t i = 0; i < 2; i++) {
        kvp_hash_t h;
        h.len = 16;
        memcpy(h.bytes, r.hashes + 16 * i, 16);
        key_of(PREFIX, &h, 0, 0, 0, key);
        put_key(pool, key);
    }
    ASSERT_EQ(lookup_now(lk, &r.req), 32);
    r.req.hash_len = KVP_HASH_MAX_LEN + 1;
    r.req.num_block_hashes = 1;
    kvp_kv_lookup_client_t c = kvp_kv_lookup_pool_client(lk);
    int64_t hit = -7;
    ASSERT_EQ(c.ops->lookup(c.ctx, &r.req, false, &hit), KVP_ERR_INVALID_ARG);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* Puts (or, remove set, removes) chunk hash c's key on tp rank t. */
static void put_chunk(kvp_pool_t *pool, uint32_t c, uint32_t t, bool remove)
{
    char key[KVP_KV_STORE_KEY_MAX + 1];
    kvp_hash_t h = kvlc_hash(c);
    key_of(PREFIX, &h, t, 0, 0, key);
    if (!remove) {
        put_key(pool, key);
        return;
    }
    kvp_key_t k = kvp_key_str(key);
    kvp_key_result_t res;
    ASSERT_OK(kvp_pool_remove(pool, &k, 1, &res));
    ASSERT_OK(res.status);
}

/* One batch for all ranks, in windows of KVP_BATCH_MAX keys: 16 namespaces
 * make windows of 4096 chunks; a request of 4100 chunks spans two.  A miss
 * in the first window ends the run even if the second is all there; a miss
 * right at the window boundary, or inside the second window, is found. */
TEST(test_pool_lookup_windows_over_batch_max)
{
    enum { NS = 16, CHUNKS = 4100, WINDOW = KVP_BATCH_MAX / NS };
    kvlc_geom_t g = kvlc_geom(16, 16);
    g.tp_size = NS;
    g.num_kv_heads = NS; /* factor 1: 16 tp namespaces */
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_lookup(&g, 1, &pool, &lk);
    uint8_t *hashes = malloc((size_t)CHUNKS * 32);
    char(*keys)[KVP_KV_STORE_KEY_MAX + 1] = malloc(1024 * sizeof *keys);
    kvp_key_t *kv = malloc(1024 * sizeof *kv);
    kvp_sgl_t *vals = malloc(1024 * sizeof *vals);
    kvp_key_result_t *res = malloc(1024 * sizeof *res);
    ASSERT(hashes && keys && kv && vals && res);
    static uint8_t one = 1;
    kvp_iov_t iov = {&one, 1};
    size_t nb = 0;
    /* Every chunk on every rank, except rank 15 of chunks 5 and WINDOW + 2. */
    for (uint32_t c = 0; c < CHUNKS; c++) {
        kvp_hash_t h = kvlc_hash(c);
        memcpy(hashes + 32 * c, h.bytes, 32);
        for (uint32_t t = 0; t < NS; t++) {
            if (t == NS - 1 && (c == 5 || c == WINDOW + 2))
                continue;
            key_of(PREFIX, &h, t, 0, 0, keys[nb]);
            kv[nb] = kvp_key_str(keys[nb]);
            vals[nb] = (kvp_sgl_t){&iov, 1};
            if (++nb == 1024 || (c == CHUNKS - 1 && t == NS - 1)) {
                ASSERT_OK(kvp_pool_put(pool, kv, vals, nb, res));
                for (size_t i = 0; i < nb; i++)
                    ASSERT_OK(res[i].status);
                nb = 0;
            }
        }
    }
    kvp_kv_request_t req = {"big", (int64_t)CHUNKS * 16 + 1, 0, NULL, 0, hashes, CHUNKS, 32};
    ASSERT_EQ(lookup_now(lk, &req), 5 * 16);
    put_chunk(pool, 5, NS - 1, false);
    ASSERT_EQ(lookup_now(lk, &req), (int64_t)(WINDOW + 2) * 16);
    put_chunk(pool, WINDOW, NS - 1, true); /* a hole at the window boundary */
    ASSERT_EQ(lookup_now(lk, &req), (int64_t)WINDOW * 16);
    put_chunk(pool, WINDOW, NS - 1, false);
    put_chunk(pool, WINDOW + 2, NS - 1, false);
    ASSERT_EQ(lookup_now(lk, &req), (int64_t)CHUNKS * 16);
    free(hashes), free(keys), free(kv), free(vals), free(res);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* The scheduler against a real embedded:// pool: real sha256_cbor block
 * hashes of a prompt, the first blocks put through pool.h under the key
 * builder's keys, and get_num_new_matched_tokens (K3-K5) answers from the
 * pool under the every-rank and last-token rules; reset_store (K18) empties
 * the pool. */
TEST(test_pool_lookup_sched_against_embedded_pool)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    g.tp_size = 2;
    g.num_kv_heads = 2; /* two rank namespaces */
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_lookup(&g, 1, &pool, &lk);
    int64_t tokens[80];
    for (int i = 0; i < 80; i++)
        tokens[i] = 1000 + 7 * i;
    kvp_hash_t none, hs[5];
    size_t nh = 0;
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, "0", 1, &none));
    ASSERT_OK(kvp_hash_request_blocks_i64(KVP_HASH_SHA256_CBOR, &none, tokens, 80, 16, NULL, hs,
                                          5, &nh));
    ASSERT_EQ(nh, 5);
    uint8_t flat[5 * 32];
    for (size_t i = 0; i < 5; i++)
        memcpy(flat + 32 * i, hs[i].bytes, 32);
    kvp_kv_request_t req = {"r1", 80, 0, tokens, 80, flat, 5, 32};

    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.model_name = MODEL_PATH;
    cfg.cache_prefix = PREFIX;
    cfg.tp_size = 2;
    cfg.num_kv_heads = 2;
    kvp_kv_sched_t *s;
    ASSERT_OK(kvp_kv_sched_create(&cfg, kvp_kv_lookup_pool_client(lk), &s));
    int64_t num;
    bool la;
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, 0, &num, &la));
    ASSERT_EQ(num, 0); /* empty pool */

    char key[KVP_KV_STORE_KEY_MAX + 1];
    for (uint32_t i = 0; i < 3; i++)
        for (uint32_t t = 0; t < 2; t++) {
            key_of(PREFIX, &hs[i], t, 0, 0, key);
            put_key(pool, key);
        }
    key_of(PREFIX, &hs[3], 0, 0, 0, key); /* block 3 on rank 0 only */
    put_key(pool, key);
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, 0, &num, &la));
    ASSERT_EQ(num, 48); /* blocks 0-2: block 3 misses rank 1 */
    ASSERT(la);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(s, "r1", &ls));
    ASSERT_EQ(ls.kvpool_cached_tokens, 48);
    ASSERT_EQ(ls.vllm_cached_tokens, 0);
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, 16, &num, &la));
    ASSERT_EQ(num, 32); /* K4: minus what vLLM has computed */

    key_of(PREFIX, &hs[3], 1, 0, 0, key);
    put_key(pool, key);
    for (uint32_t t = 0; t < 2; t++) {
        key_of(PREFIX, &hs[4], t, 0, 0, key);
        put_key(pool, key);
    }
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, 0, &num, &la));
    ASSERT_EQ(num, 64); /* all 80 stored: the last token is recomputed */

    bool ok = false;
    ASSERT_OK(kvp_kv_sched_reset_store(s, &ok));
    ASSERT(ok);
    kvp_pool_stats_t st;
    ASSERT_OK(kvp_pool_stats(pool, &st));
    ASSERT_EQ(st.live, 0);
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, 0, &num, &la));
    ASSERT_EQ(num, 0);
    kvp_kv_sched_destroy(s);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* ------------------------------------------- the wire query and hybrids */

/* A lookup over a fresh embedded pool for groups[0..n) (NULL: one group of
 * kind FULL_ATTENTION), TP tp with `heads` KV heads (the caller closes both). */
static void open_groups(const kvp_kv_cache_group_t *groups, uint32_t n, int64_t bs, int64_t hbs,
                        bool eagle, uint32_t tp, uint32_t heads, kvp_pool_t **pool_p,
                        kvp_kv_lookup_pool_t **lk_p)
{
    ASSERT_OK(kvp_pool_open(URI, pool_p));
    kvlc_geom_t g = kvlc_geom(bs, hbs);
    kvp_kv_lookup_pool_params_t p;
    params_of(&g, &p);
    p.groups = groups;
    p.num_groups = n;
    p.use_eagle = eagle;
    p.tp_size = tp;
    p.num_kv_heads = heads;
    ASSERT_OK(kvp_kv_lookup_pool_create(*pool_p, &p, lk_p));
}

/* Stores hash i (kvlc_hash) of group g on tp rank t (pp 0). */
static void put_hash(kvp_pool_t *pool, uint32_t g, uint32_t i, uint32_t t)
{
    char key[KVP_KV_STORE_KEY_MAX + 1];
    kvp_hash_t h = kvlc_hash(i);
    key_of_group(PREFIX, &h, t, 0, 0, g, key);
    put_key(pool, key);
}

/* The wire query of (num_tokens, hashes kvlc_hash(0 .. nh)). */
static kvp_kv_lookup_result_t query(kvp_kv_lookup_pool_t *lk, int64_t num_tokens, size_t nh,
                                    bool apply_eagle)
{
    kvlc_req_t r;
    kvlc_req_init(&r, num_tokens, nh);
    kvp_kv_lookup_result_t res;
    memset(&res, 0x5a, sizeof res);
    ASSERT_OK(kvp_kv_lookup_pool_query(lk, num_tokens, r.req.block_hashes, nh, r.req.hash_len,
                                       apply_eagle, &res));
    return res;
}

static void close_lookup(kvp_pool_t *pool, kvp_kv_lookup_pool_t *lk)
{
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* §5 scenario 8: chunks 0..3 of a 100-token prompt (6 hashes) -> 64, the
 * miss at block 4; chunks 0,1,3 -> 32 (prefix only), the miss at block 2. */
TEST(test_pool_lookup_scenario_8_prefix_only)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(NULL, 0, 16, 16, false, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 4; i++)
        put_hash(pool, 0, i, 0);
    kvp_kv_lookup_result_t r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 64);
    ASSERT_EQ(r.reason, KVP_KV_MISS_MISSING_BLOCK);
    ASSERT_EQ(r.group_id, 0);
    ASSERT_EQ(r.block_index, 4);
    close_lookup(pool, lk);

    open_groups(NULL, 0, 16, 16, false, 1, 1, &pool, &lk);
    put_hash(pool, 0, 0, 0), put_hash(pool, 0, 1, 0), put_hash(pool, 0, 3, 0);
    r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 32);
    ASSERT_EQ(r.reason, KVP_KV_MISS_MISSING_BLOCK);
    ASSERT_EQ(r.block_index, 2);
    close_lookup(pool, lk);
}

/* §5 scenario 9: a 64-token prompt with all 4 chunks -> 48 = align(63): the
 * last token is recomputed. */
TEST(test_pool_lookup_scenario_9_last_token_recomputed)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(NULL, 0, 16, 16, false, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 4; i++)
        put_hash(pool, 0, i, 0);
    kvp_kv_lookup_result_t r = query(lk, 64, 4, true);
    ASSERT_EQ(r.hit_tokens, 48);
    ASSERT_EQ(r.reason, KVP_KV_MISS_CAPPED_LAST_TOKEN);
    ASSERT_EQ(r.block_index, -1);
    close_lookup(pool, lk);
}

/* §5 scenario 10: TP 2 with 2 KV heads (factor 1): a chunk on tp_rank 0 but
 * not tp_rank 1 is absent, and the reason names the namespace lacking it;
 * one on tp_rank 1 only names tp_rank 0 (the prefix stopped at the row's
 * first key, so the row is asked again); one on neither is missing. */
TEST(test_pool_lookup_scenario_10_every_tp_rank)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(NULL, 0, 16, 16, false, 2, 2, &pool, &lk);
    put_hash(pool, 0, 0, 0), put_hash(pool, 0, 0, 1);
    put_hash(pool, 0, 1, 0);
    kvp_kv_lookup_result_t r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 16);
    ASSERT_EQ(r.reason, KVP_KV_MISS_RANK_MISSING);
    ASSERT_EQ(r.block_index, 1);
    ASSERT_EQ(r.tp_rank, 1);
    ASSERT_EQ(r.pp_rank, 0);
    close_lookup(pool, lk);

    open_groups(NULL, 0, 16, 16, false, 2, 2, &pool, &lk);
    put_hash(pool, 0, 0, 0), put_hash(pool, 0, 0, 1);
    put_hash(pool, 0, 1, 1);
    r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 16);
    ASSERT_EQ(r.reason, KVP_KV_MISS_RANK_MISSING);
    ASSERT_EQ(r.tp_rank, 0);
    r = query(lk, 100, 1, true); /* the control: chunk 0 alone is whole */
    ASSERT_EQ(r.hit_tokens, 16);
    ASSERT_EQ(r.reason, KVP_KV_MISS_NONE);
    close_lookup(pool, lk);

    open_groups(NULL, 0, 16, 16, false, 2, 2, &pool, &lk);
    put_hash(pool, 0, 0, 0), put_hash(pool, 0, 0, 1);
    r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 16);
    ASSERT_EQ(r.reason, KVP_KV_MISS_MISSING_BLOCK);
    ASSERT_EQ(r.block_index, 1);
    close_lookup(pool, lk);
}

/* A hybrid FA + SWA model (both block 16, window 32: the SWA group needs
 * the 2 blocks before the hit), keys written per group (group id 0 and 1).
 * FA group: chunks 0..5; SWA group: chunks 2,3 only.  100 tokens, 6
 * hashes: FA 96; SWA at 96: 5,4 absent, 3,2 present -> 64 (simple hybrid:
 * one round).  The SWA group bounded it: its block 4 is missing.  The SWA
 * keys stored under group 0 instead are not the SWA group's: a miss. */
TEST(test_pool_lookup_hybrid_full_and_sliding_window)
{
    kvp_kv_cache_group_t gs[] = {{KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false},
                                 {KVP_KV_GROUP_SLIDING_WINDOW, 16, false, 32, false}};
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(gs, 2, 16, 16, false, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 6; i++)
        put_hash(pool, 0, i, 0);
    put_hash(pool, 1, 2, 0), put_hash(pool, 1, 3, 0);
    kvp_kv_lookup_result_t r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 64);
    ASSERT_EQ(r.reason, KVP_KV_MISS_MISSING_BLOCK);
    ASSERT_EQ(r.group_id, 1);
    ASSERT_EQ(r.block_index, 4);
    ASSERT_EQ(r.keys_probed, 12); /* 6 chunks x 2 groups, one namespace */
    close_lookup(pool, lk);

    open_groups(gs, 2, 16, 16, false, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 6; i++)
        put_hash(pool, 0, i, 0);
    r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 0);
    ASSERT_EQ(r.group_id, 1);
    close_lookup(pool, lk);
}

/* FA 64 + SWA 16 (window 32: 2 blocks) over hash 16, lcm 64: the lookup
 * mask keeps the 2 SWA blocks before each 64 boundary (2,3,6,7), so only
 * those are asked: FA chunks 0,1 (hashes 3, 7) and SWA blocks 2,3,6,7 = 6
 * keys for 8 hashes.  FA 128; SWA at 128: 7 (edge 128), 6 -> 128.  A
 * num_tokens far past the hashes asks the same 6 keys (the mask is only
 * built as far as the hashes go). */
TEST(test_pool_lookup_swa_probes_only_reachable_tails)
{
    kvp_kv_cache_group_t gs[] = {{KVP_KV_GROUP_FULL_ATTENTION, 64, false, 0, false},
                                 {KVP_KV_GROUP_SLIDING_WINDOW, 16, false, 32, false}};
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(gs, 2, 64, 16, false, 1, 1, &pool, &lk);
    put_hash(pool, 0, 3, 0), put_hash(pool, 0, 7, 0);
    uint32_t swa[] = {2, 3, 6, 7};
    for (int i = 0; i < 4; i++)
        put_hash(pool, 1, swa[i], 0);
    kvp_kv_lookup_result_t r = query(lk, 129, 8, true);
    ASSERT_EQ(r.hit_tokens, 128);
    ASSERT_EQ(r.keys_probed, 6);
    ASSERT_EQ(r.reason, KVP_KV_MISS_NONE);
    r = query(lk, 4000000000ll, 8, true);
    ASSERT_EQ(r.hit_tokens, 128);
    ASSERT_EQ(r.keys_probed, 6);
    close_lookup(pool, lk);
}

/* FA 16 + Mamba 64 in align mode over hash blocks of 16 (scheduler block
 * 64): partial hits, every hash unit probed for both groups with the raw
 * hashes.  FA hashes 0..5, the Mamba state at unit 2 only; 100 tokens:
 * token_len = 96 (hash granularity).  FA 96; Mamba at 96: the rightmost
 * present unit is 2 -> 48, not a multiple of 64.  The Mamba group bounded
 * it: unit 3 (in its block 0) is missing.  With the state at unit 5 too:
 * 96; with apply_eagle and use_eagle: FA drops one unit (bound 96 + 16
 * capped at 96 -> 80), Mamba at 80 (no margin, no drop): unit 2 -> 48 ... and
 * the state at unit 4 gives 80. */
TEST(test_pool_lookup_mamba_align_partial_hits)
{
    kvp_kv_cache_group_t gs[] = {{KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false},
                                 {KVP_KV_GROUP_MAMBA, 64, true, 0, false}};
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(gs, 2, 64, 16, false, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 6; i++)
        put_hash(pool, 0, i, 0);
    put_hash(pool, 1, 2, 0);
    kvp_kv_lookup_result_t r = query(lk, 100, 6, true);
    ASSERT_EQ(r.hit_tokens, 48);
    ASSERT_EQ(r.reason, KVP_KV_MISS_MISSING_BLOCK);
    ASSERT_EQ(r.group_id, 1);
    ASSERT_EQ(r.block_index, 0);
    put_hash(pool, 1, 5, 0);
    ASSERT_EQ(query(lk, 100, 6, true).hit_tokens, 96);
    close_lookup(pool, lk);

    open_groups(gs, 2, 64, 16, true, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 6; i++)
        put_hash(pool, 0, i, 0);
    put_hash(pool, 1, 2, 0), put_hash(pool, 1, 5, 0);
    ASSERT_EQ(query(lk, 100, 6, true).hit_tokens, 48);
    ASSERT_EQ(query(lk, 100, 6, false).hit_tokens, 96);
    put_hash(pool, 1, 4, 0);
    ASSERT_EQ(query(lk, 100, 6, true).hit_tokens, 80);
    close_lookup(pool, lk);
}

/* The wire's apply_eagle: with use_eagle a full-attention hit drops its last
 * block only when the frame asks for it; the scheduler's lookup always does. */
TEST(test_pool_lookup_apply_eagle_drops_the_last_block)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(NULL, 0, 16, 16, true, 1, 1, &pool, &lk);
    for (uint32_t i = 0; i < 4; i++)
        put_hash(pool, 0, i, 0);
    ASSERT_EQ(query(lk, 100, 6, true).hit_tokens, 48);
    ASSERT_EQ(query(lk, 100, 6, false).hit_tokens, 64);
    kvlc_req_t q;
    kvlc_req_init(&q, 100, 6);
    ASSERT_EQ(lookup_now(lk, &q.req), 48);
    close_lookup(pool, lk);
}

/* Every miss reason, and the stats that count them (lookups, hit and asked
 * tokens, keys, reasons, resets). */
TEST(test_pool_lookup_miss_reasons_and_stats)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    open_groups(NULL, 0, 16, 16, false, 1, 1, &pool, &lk);
    put_hash(pool, 0, 0, 0), put_hash(pool, 0, 1, 0);
    kvp_kv_lookup_result_t r = query(lk, 100, 0, true);
    ASSERT_EQ(r.reason, KVP_KV_MISS_NO_HASHES);
    ASSERT_EQ(r.hit_tokens, 0);
    ASSERT_EQ(query(lk, 15, 2, true).reason, KVP_KV_MISS_TOO_SHORT);
    r = query(lk, 100, 2, true); /* the hashes end: nothing missing */
    ASSERT_EQ(r.hit_tokens, 32);
    ASSERT_EQ(r.reason, KVP_KV_MISS_NONE);
    ASSERT_EQ(r.block_index, -1);
    ASSERT_EQ(r.keys_probed, 2);
    ASSERT_EQ(query(lk, 100, 4, true).reason, KVP_KV_MISS_MISSING_BLOCK);
    ASSERT_EQ(query(lk, 32, 2, true).reason, KVP_KV_MISS_CAPPED_LAST_TOKEN);
    ASSERT_EQ(kvp_kv_lookup_pool_query(lk, 100, (const uint8_t *)"x", 1, 0, true, &r),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_lookup_pool_query(lk, 100, NULL, 1, 32, true, &r), KVP_ERR_NULL_POINTER);
    ASSERT_STR_EQ(kvp_kv_miss_reason_name(KVP_KV_MISS_RANK_MISSING), "rank_missing");
    ASSERT_STR_EQ(kvp_kv_miss_reason_name(KVP_KV_MISS_POOL_ERROR), "pool_error");
    ASSERT_STR_EQ(kvp_kv_miss_reason_name(KVP_KV_MISS__COUNT), "unknown");

    /* Warm, a lookup allocates nothing: it still answers when every
     * allocation fails. */
    kvp__alloc_fail_after(0);
    r = query(lk, 100, 4, true);
    kvp__alloc_fail_reset();
    ASSERT_EQ(r.hit_tokens, 32);

    kvp_kv_lookup_stats_t st;
    kvp_kv_lookup_pool_stats(lk, &st);
    ASSERT_EQ(st.lookups, 6);
    ASSERT_EQ(st.hit_tokens, 32 + 32 + 16 + 32);
    ASSERT_EQ(st.queried_tokens, 100 + 15 + 100 + 100 + 32 + 100);
    ASSERT_EQ(st.keys_probed, 2 + 4 + 2 + 4);
    ASSERT_EQ(st.reasons[KVP_KV_MISS_NO_HASHES], 1);
    ASSERT_EQ(st.reasons[KVP_KV_MISS_TOO_SHORT], 1);
    ASSERT_EQ(st.reasons[KVP_KV_MISS_NONE], 1);
    ASSERT_EQ(st.reasons[KVP_KV_MISS_MISSING_BLOCK], 2);
    ASSERT_EQ(st.reasons[KVP_KV_MISS_CAPPED_LAST_TOKEN], 1);
    ASSERT_EQ(st.resets, 0);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_pool_client(lk);
    bool ack = false;
    ASSERT_OK(c.ops->reset(c.ctx, &ack));
    kvp_kv_lookup_pool_stats(lk, &st);
    ASSERT_EQ(st.resets, 1);
    close_lookup(pool, lk);

    /* A failing lookup (here: no memory for its keys) is a hit of 0. */
    open_groups(NULL, 0, 16, 16, false, 1, 1, &pool, &lk);
    put_hash(pool, 0, 0, 0);
    kvp__alloc_fail_after(0);
    r = query(lk, 100, 4, true);
    kvp__alloc_fail_reset();
    ASSERT_EQ(r.reason, KVP_KV_MISS_POOL_ERROR);
    ASSERT_EQ(r.hit_tokens, 0);
    kvp_kv_lookup_pool_stats(lk, &st);
    ASSERT_EQ(st.reasons[KVP_KV_MISS_POOL_ERROR], 1);
    close_lookup(pool, lk);
}

/* params.size: a caller built against an older header (its size ends before
 * use_eagle) gets use_eagle's default (off), whatever lies past its size. */
TEST(test_pool_lookup_params_older_size_takes_defaults)
{
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open(URI, &pool));
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvp_kv_lookup_pool_params_t p;
    params_of(&g, &p);
    p.use_eagle = true;
    p.size = offsetof(kvp_kv_lookup_pool_params_t, use_eagle);
    kvp_kv_lookup_pool_t *lk;
    ASSERT_OK(kvp_kv_lookup_pool_create(pool, &p, &lk));
    for (uint32_t i = 0; i < 4; i++)
        put_hash(pool, 0, i, 0);
    ASSERT_EQ(query(lk, 100, 6, true).hit_tokens, 64); /* no EAGLE drop */
    close_lookup(pool, lk);
}

#include "kv_coord_ref_cases.h"

/* Against the original worker: for every case of kv_coord_ref_cases.h
 * (tests/integration/kv_coord_ref.py ran MooncakeStoreWorker.lookup over
 * the same stored (group, hash) pairs, one namespace per group), the wire
 * lookup with apply_eagle (the original's default) gives the same hit. */
TEST(test_pool_lookup_matches_the_original_worker_lookup)
{
    size_t n = sizeof g_ref_cases / sizeof g_ref_cases[0];
    for (size_t i = 0; i < n; i++) {
        const kvcr_case_t *k = &g_ref_cases[i];
        kvp_pool_t *pool;
        kvp_kv_lookup_pool_t *lk;
        open_groups(k->g, k->n, k->bs, k->hbs, k->use_eagle, 1, 1, &pool, &lk);
        for (uint32_t g = 0; g < k->n; g++)
            for (uint32_t h = 0; h < k->nh; h++)
                if (k->pres[g][h] == '1')
                    put_hash(pool, g, h, 0);
        kvp_kv_lookup_result_t r = query(lk, k->num_tokens, k->nh, true);
        ASSERT_MSG(r.hit_tokens == k->lookup_hit, "case %zu: hit %lld, the original %lld", i,
                   (long long)r.hit_tokens, (long long)k->lookup_hit);
        close_lookup(pool, lk);
    }
}

#define REF(name) T(test_##name),
TEST_LIST(KVLC_LIST(REF) T(test_pool_lookup_params_scope_and_refusals),
          T(test_pool_lookup_s23_exact_keys), T(test_pool_lookup_s23_prefix_is_a_namespace),
          T(test_pool_lookup_hash_lengths), T(test_pool_lookup_windows_over_batch_max),
          T(test_pool_lookup_sched_against_embedded_pool),
          T(test_pool_lookup_scenario_8_prefix_only),
          T(test_pool_lookup_scenario_9_last_token_recomputed),
          T(test_pool_lookup_scenario_10_every_tp_rank),
          T(test_pool_lookup_hybrid_full_and_sliding_window),
          T(test_pool_lookup_swa_probes_only_reachable_tails),
          T(test_pool_lookup_mamba_align_partial_hits),
          T(test_pool_lookup_apply_eagle_drops_the_last_block),
          T(test_pool_lookup_miss_reasons_and_stats),
          T(test_pool_lookup_params_older_size_takes_defaults),
          T(test_pool_lookup_matches_the_original_worker_lookup))
