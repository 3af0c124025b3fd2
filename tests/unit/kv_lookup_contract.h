/*
 * The lookup contract: what the scheduler may expect of any
 * kvp_kv_lookup_ops_t (include/kvpool/kv_connector.h, "Lookup client
 * interface") when the store holds given blocks, in the terms of
 * connectors-spec §2.4 ("How the worker computes a hit", steps 1-5) and §2.3
 * (chunk hashes, replication).  Written against the ops alone, so that every
 * lookup runs the very same checks: test_kv_lookup_scripted.c runs them
 * against the scripted client, test_kv_lookup_pool.c against the in-process
 * pool lookup over an embedded:// pool; the ZeroMQ client (next issue) will
 * include this header too.
 *
 * A factory builds a lookup for a geometry (block sizes, tp/pp sizes, KV
 * heads) whose store holds exactly the blocks it is given: a block is a chunk
 * hash stored on one rank namespace (T, PP), or on every one (KVLC_ALL).  The
 * expected hits below are worked out by hand from the spec, next to each.
 *
 * Test names: kvlc_<rule>, e.g. kvlc_s24_step3_every_rank (§2.4 step 3).
 */
#ifndef KVP_TESTS_KV_LOOKUP_CONTRACT_H
#define KVP_TESTS_KV_LOOKUP_CONTRACT_H

#include <stdint.h>
#include <string.h>

#include "kvpool/kv_connector.h"
#include "test.h"

#define KVLC_ALL (-1) /* a block stored on every value of that rank */

typedef struct kvlc_geom {
    int64_t block_size, hash_block_size;
    uint32_t tp_size, pp_size, num_kv_heads;
    bool mla; /* the group is pure MLA (else MHA/GQA full attention) */
} kvlc_geom_t;

/* A block in the store: chunk hash `hash` on namespace (tp_rank T, pp_rank). */
typedef struct kvlc_block {
    kvp_hash_t hash;
    int32_t tp_rank; /* the key's T (after replication), or KVLC_ALL */
    int32_t pp_rank; /* or KVLC_ALL */
} kvlc_block_t;

typedef struct kvlc_fixture {
    kvp_kv_lookup_client_t client;
    void *impl; /* the factory's */
} kvlc_fixture_t;

typedef struct kvlc_factory {
    /* Builds a lookup for geometry g whose store holds blocks[0..n). */
    void (*create)(const kvlc_geom_t *g, const kvlc_block_t *blocks, size_t n, kvlc_fixture_t *fx);
    void (*destroy)(kvlc_fixture_t *fx);
} kvlc_factory_t;

/* ---------------------------------------------------------------- helpers */

/* Hash number i: 32 bytes that differ for every i (not a real block hash:
 * the lookup treats hashes as opaque). */
static inline kvp_hash_t kvlc_hash(uint32_t i)
{
    kvp_hash_t h;
    h.len = 32;
    for (uint32_t b = 0; b < 32; b++)
        h.bytes[b] = (uint8_t)(i * 131u + b * 7u + (i >> 8) * 17u + 1u);
    memcpy(h.bytes, &i, sizeof i);
    return h;
}

static inline kvlc_block_t kvlc_on(uint32_t i, int32_t tp_rank, int32_t pp_rank)
{
    kvlc_block_t b = {kvlc_hash(i), tp_rank, pp_rank};
    return b;
}

static inline kvlc_block_t kvlc_everywhere(uint32_t i)
{
    return kvlc_on(i, KVLC_ALL, KVLC_ALL);
}

static inline kvlc_geom_t kvlc_geom(int64_t block_size, int64_t hash_block_size)
{
    kvlc_geom_t g = {block_size, hash_block_size, 1, 1, 1, false};
    return g;
}

/* A request whose block hashes (at hash_block_size) are kvlc_hash(0 .. nh). */
typedef struct kvlc_req {
    kvp_kv_request_t req;
    uint8_t hashes[64 * 32];
} kvlc_req_t;

static inline void kvlc_req_init(kvlc_req_t *r, int64_t num_tokens, size_t nh)
{
    ASSERT(nh <= 64);
    memset(r, 0, sizeof *r);
    for (size_t i = 0; i < nh; i++) {
        kvp_hash_t h = kvlc_hash((uint32_t)i);
        memcpy(r->hashes + 32 * i, h.bytes, 32);
    }
    r->req.req_id = "req-1";
    r->req.num_tokens = num_tokens;
    r->req.block_hashes = nh ? r->hashes : NULL;
    r->req.num_block_hashes = nh;
    r->req.hash_len = nh ? 32 : 0;
}

/* The hit of a blocking lookup of (num_tokens, nh hashes) in a fresh lookup
 * for g holding blocks[0..n). */
static inline int64_t kvlc_hit(const kvlc_factory_t *f, const kvlc_geom_t *g,
                               const kvlc_block_t *blocks, size_t n, int64_t num_tokens, size_t nh)
{
    kvlc_fixture_t fx;
    f->create(g, blocks, n, &fx);
    kvlc_req_t r;
    kvlc_req_init(&r, num_tokens, nh);
    int64_t hit = -7;
    ASSERT_OK(fx.client.ops->lookup(fx.client.ctx, &r.req, false, &hit));
    f->destroy(&fx);
    return hit;
}

/* ------------------------------------------------------------------ tests */

/* §2.4 step 1: no hashes, or fewer tokens than a block, is a hit of 0. */
static inline void kvlc_s24_step1_nothing_to_look_up(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvlc_block_t b[] = {kvlc_everywhere(0), kvlc_everywhere(1)};
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 64, 0), 0); /* no hashes */
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 15, 1), 0); /* token_len = 0 */
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 0, 2), 0);
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 33, 2), 32); /* the control: the blocks are there */
}

/* §2.4 step 1-2: token_len = floor(num_tokens / block) * block caps the
 * chunks looked at, and so does the number of hashes. */
static inline void kvlc_s24_step2_chunks_capped(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvlc_block_t b[] = {kvlc_everywhere(0), kvlc_everywhere(1), kvlc_everywhere(2),
                        kvlc_everywhere(3)};
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 50, 4), 48);  /* token_len 48: 3 chunks */
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 100, 2), 32); /* 2 hashes: 2 chunks */
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 65, 4), 64);  /* all 4; 64 < 65 */
}

/* §2.4 step 4: one full-attention group: the longest run of present chunks
 * from chunk 0; a gap ends it, later chunks do not count. */
static inline void kvlc_s24_step4_run_from_chunk0(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvlc_block_t gap[] = {kvlc_everywhere(0), kvlc_everywhere(1), kvlc_everywhere(3),
                          kvlc_everywhere(4)};
    ASSERT_EQ(kvlc_hit(f, &g, gap, 4, 81, 5), 32);
    kvlc_block_t no0[] = {kvlc_everywhere(1), kvlc_everywhere(2)};
    ASSERT_EQ(kvlc_hit(f, &g, no0, 2, 81, 5), 0);
    ASSERT_EQ(kvlc_hit(f, &g, NULL, 0, 81, 5), 0); /* empty store */
}

/* §2.4 step 5: a hit covering the whole prompt is cut to
 * align(num_tokens - 1): the last prompt token is always recomputed. */
static inline void kvlc_s24_step5_last_token_recomputed(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvlc_block_t b[] = {kvlc_everywhere(0), kvlc_everywhere(1), kvlc_everywhere(2),
                        kvlc_everywhere(3)};
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 64, 4), 48); /* full hit, aligned: num_tokens - block */
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 16, 1), 0);
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 48, 4), 32); /* token_len 48 caps, then cut */
}

/* §2.3 chunk_hash: with block_size 32 over hash blocks of 16, chunk c is
 * keyed by sub-hash 2c+1 (the chunk's last); the others are never asked. */
static inline void kvlc_s23_chunk_hash_is_last_subhash(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(32, 16);
    kvlc_block_t last[] = {kvlc_everywhere(1), kvlc_everywhere(3), kvlc_everywhere(5),
                           kvlc_everywhere(6)};
    ASSERT_EQ(kvlc_hit(f, &g, last, 4, 129, 8), 96); /* chunks 0-2; chunk 3 wants 7 */
    kvlc_block_t first[] = {kvlc_everywhere(0), kvlc_everywhere(2), kvlc_everywhere(4)};
    ASSERT_EQ(kvlc_hit(f, &g, first, 3, 129, 8), 0);
    ASSERT_EQ(kvlc_hit(f, &g, last, 4, 129, 5), 64); /* 5 sub-hashes: 2 whole chunks */
}

/* §2.4 step 3, the every-rank rule: with TP 2 and 2 KV heads (factor 1) the
 * namespaces are T=0 and T=1; a chunk only one of them stored is a miss. */
static inline void kvlc_s24_step3_every_tp_rank(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    g.tp_size = 2;
    g.num_kv_heads = 2;
    kvlc_block_t b[] = {kvlc_everywhere(0), kvlc_on(1, 0, KVLC_ALL), kvlc_everywhere(2)};
    ASSERT_EQ(kvlc_hit(f, &g, b, 3, 65, 4), 16);
    kvlc_block_t both[] = {kvlc_everywhere(0), kvlc_on(1, 0, KVLC_ALL), kvlc_on(1, 1, KVLC_ALL)};
    ASSERT_EQ(kvlc_hit(f, &g, both, 3, 65, 4), 32);
}

/* §2.4 step 3 over pipeline ranks: every pp rank must have stored it. */
static inline void kvlc_s24_step3_every_pp_rank(const kvlc_factory_t *f)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    g.pp_size = 2;
    kvlc_block_t b[] = {kvlc_everywhere(0), kvlc_on(1, KVLC_ALL, 0), kvlc_on(2, KVLC_ALL, 0),
                        kvlc_on(2, KVLC_ALL, 1)};
    ASSERT_EQ(kvlc_hit(f, &g, b, 4, 65, 4), 16);
}

/* §2.3 replication: TP 4 with 1 KV head has factor 4, so every rank's key is
 * T=0 and one copy suffices; with 4 heads (factor 1) T=0 alone is a miss.
 * Pure MLA shares T=0 whatever the heads. */
static inline void kvlc_s23_replicated_ranks_share_keys(const kvlc_factory_t *f)
{
    kvlc_block_t b[] = {kvlc_on(0, 0, KVLC_ALL), kvlc_on(1, 0, KVLC_ALL)};
    kvlc_geom_t g = kvlc_geom(16, 16);
    g.tp_size = 4;
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 33, 2), 32);
    g.num_kv_heads = 4;
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 33, 2), 0);
    g.mla = true;
    ASSERT_EQ(kvlc_hit(f, &g, b, 2, 33, 2), 32);
}

/* A lookup over two 16-token blocks stored by every rank, and a request of
 * 40 tokens over them (hit: 32), for the ops-contract tests below. */
static inline void kvlc_two_blocks(const kvlc_factory_t *f, kvlc_fixture_t *fx, kvlc_req_t *r)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvlc_block_t b[] = {kvlc_everywhere(0), kvlc_everywhere(1)};
    f->create(&g, b, 2, fx);
    kvlc_req_init(r, 40, 2);
}

/* The blocking answer for r: KVP_OK and the hit. */
static inline int64_t kvlc_blocking_hit(kvlc_fixture_t *fx, kvlc_req_t *r)
{
    int64_t hit = -7;
    ASSERT_OK(fx->client.ops->lookup(fx->client.ctx, &r->req, false, &hit));
    return hit;
}

/* Ops contract (K3): a non-blocking lookup answers now (KVP_OK) or "not yet"
 * (KVP_INPROGRESS); a later blocking call for the same id gets the hit. */
static inline void kvlc_k3_non_block_answers_or_asks_again(const kvlc_factory_t *f)
{
    kvlc_fixture_t fx;
    kvlc_req_t r;
    kvlc_two_blocks(f, &fx, &r);
    int64_t hit = -7;
    kvp_status_t st = fx.client.ops->lookup(fx.client.ctx, &r.req, true, &hit);
    ASSERT(st == KVP_OK || st == KVP_INPROGRESS);
    if (st == KVP_OK)
        ASSERT_EQ(hit, 32);
    ASSERT_EQ(kvlc_blocking_hit(&fx, &r), 32);
    f->destroy(&fx);
}

/* Ops contract: discarding an id that has no lookup in flight is harmless,
 * and lookups go on answering after it. */
static inline void kvlc_discard_is_harmless(const kvlc_factory_t *f)
{
    kvlc_fixture_t fx;
    kvlc_req_t r;
    kvlc_two_blocks(f, &fx, &r);
    fx.client.ops->discard(fx.client.ctx, "never-asked");
    ASSERT_EQ(kvlc_blocking_hit(&fx, &r), 32);
    fx.client.ops->discard(fx.client.ctx, "req-1");
    ASSERT_EQ(kvlc_blocking_hit(&fx, &r), 32);
    f->destroy(&fx);
}

/* K18 / §2.4 RESET: reset ACKs and empties the store: the same lookup then
 * finds nothing. */
static inline void kvlc_k18_reset_acks_and_empties(const kvlc_factory_t *f)
{
    kvlc_fixture_t fx;
    kvlc_req_t r;
    kvlc_two_blocks(f, &fx, &r);
    ASSERT_EQ(kvlc_blocking_hit(&fx, &r), 32);
    bool ack = false;
    ASSERT_OK(fx.client.ops->reset(fx.client.ctx, &ack));
    ASSERT(ack);
    ASSERT_EQ(kvlc_blocking_hit(&fx, &r), 0);
    f->destroy(&fx);
}

/* Every test of the contract, for a runner:
 *   #define DEF(name) TEST(test_##name) { kvlc_##name(&factory); }
 *   KVLC_LIST(DEF)
 *   #define REF(name) T(test_##name),
 *   TEST_LIST(KVLC_LIST(REF) ...)                                          */
#define KVLC_LIST(X)                                                                          \
    X(s24_step1_nothing_to_look_up) X(s24_step2_chunks_capped) X(s24_step4_run_from_chunk0)   \
    X(s24_step5_last_token_recomputed) X(s23_chunk_hash_is_last_subhash)                      \
    X(s24_step3_every_tp_rank) X(s24_step3_every_pp_rank)                                     \
    X(s23_replicated_ranks_share_keys) X(k3_non_block_answers_or_asks_again)                  \
    X(discard_is_harmless) X(k18_reset_acks_and_empties)

#endif /* KVP_TESTS_KV_LOOKUP_CONTRACT_H */
