/*
 * The lookup contract (kv_lookup_contract.h) against the scripted client.
 *
 * The scripted client answers what it is told, so "a scripted lookup whose
 * store holds these blocks" is the scripted client driven by a model of the
 * store: before each lookup the factory tells it the hit that connectors-spec
 * §2.4 gives for those blocks (model_hit, a plain loop over chunks and rank
 * namespaces, written apart from src/kv/kv_lookup_pool.c), and a reset that
 * the client ACKs empties the model.  The contract thus checks that the
 * scripted client passes its script through the ops unchanged and records
 * every call, and that the model agrees with the hand-worked expectations
 * that the pool lookup must meet too.
 *
 * This file is the only place that uses the scripted client's API
 * (kvp_kv_scripted_*), so moving it to a test-support library only touches
 * the include below.
 */
#include "kv_lookup_contract.h"

#include "kvpool/kv_connector.h"
#include "support/kv_scripted.h"

typedef struct sc_fixture {
    kvp_kv_scripted_t *sc;
    kvp_kv_lookup_client_t inner; /* the scripted client's own view */
    kvlc_geom_t g;
    kvlc_block_t blocks[16];
    size_t n;
} sc_fixture_t;

/* Whether the model's store holds chunk hash h on namespace (t, pp). */
static bool model_has(const sc_fixture_t *m, const uint8_t *h, uint32_t t, uint32_t pp)
{
    for (size_t i = 0; i < m->n; i++) {
        const kvlc_block_t *b = &m->blocks[i];
        if ((b->tp_rank == KVLC_ALL || (uint32_t)b->tp_rank == t) &&
            (b->pp_rank == KVLC_ALL || (uint32_t)b->pp_rank == pp) &&
            memcmp(b->hash.bytes, h, 32) == 0)
            return true;
    }
    return false;
}

/* §2.4 steps 1-5 for one full-attention group, over the model's store. */
static int64_t model_hit(const sc_fixture_t *m, const kvp_kv_request_t *req)
{
    int64_t bs = m->g.block_size;
    int64_t token_len = req->num_tokens > 0 ? req->num_tokens / bs * bs : 0;
    if (req->num_block_hashes == 0 || token_len <= 0)
        return 0;
    uint32_t factor;
    ASSERT_OK(kvp_kv_store_key_replication_factor(
        m->g.mla ? KVP_KV_GROUP_MLA : KVP_KV_GROUP_FULL_ATTENTION, m->g.tp_size,
        m->g.num_kv_heads, 1, &factor));
    size_t ratio = (size_t)(bs / m->g.hash_block_size);
    int64_t hit = 0;
    for (size_t c = 0; (int64_t)(c + 1) * bs <= token_len; c++) {
        if ((c + 1) * ratio > req->num_block_hashes)
            break;
        const uint8_t *h = req->block_hashes + ((c + 1) * ratio - 1) * req->hash_len;
        bool everywhere = true;
        for (uint32_t t = 0; t < m->g.tp_size / factor; t++)
            for (uint32_t pp = 0; pp < m->g.pp_size; pp++)
                everywhere = everywhere && model_has(m, h, t, pp);
        if (!everywhere)
            break;
        hit += bs;
    }
    return hit >= req->num_tokens ? (req->num_tokens - 1) / bs * bs : hit;
}

static kvp_status_t model_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block,
                                 int64_t *hit_p)
{
    sc_fixture_t *m = ctx;
    kvp_kv_scripted_set_lookup(m->sc, model_hit(m, req), false);
    return m->inner.ops->lookup(m->inner.ctx, req, non_block, hit_p);
}

static void model_discard(void *ctx, const char *req_id)
{
    sc_fixture_t *m = ctx;
    m->inner.ops->discard(m->inner.ctx, req_id);
}

static kvp_status_t model_reset(void *ctx, bool *ack_p)
{
    sc_fixture_t *m = ctx;
    kvp_status_t st = m->inner.ops->reset(m->inner.ctx, ack_p);
    if (st == KVP_OK && *ack_p)
        m->n = 0;
    return st;
}

static const kvp_kv_lookup_ops_t g_model_ops = {model_lookup, model_discard, model_reset};

static void sc_create(const kvlc_geom_t *g, const kvlc_block_t *blocks, size_t n,
                      kvlc_fixture_t *fx)
{
    sc_fixture_t *m = calloc(1, sizeof *m);
    ASSERT(m && n <= sizeof m->blocks / sizeof m->blocks[0]);
    ASSERT_OK(kvp_kv_scripted_create(&m->sc));
    m->inner = kvp_kv_scripted_client(m->sc);
    m->g = *g;
    if (n)
        memcpy(m->blocks, blocks, n * sizeof *blocks);
    m->n = n;
    fx->client = (kvp_kv_lookup_client_t){&g_model_ops, m};
    fx->impl = m;
}

static void sc_destroy(kvlc_fixture_t *fx)
{
    sc_fixture_t *m = fx->impl;
    /* Every ops call reached the scripted client and was recorded there. */
    const kvp_kv_lookup_call_t *calls;
    size_t ncalls = kvp_kv_scripted_lookups(m->sc, &calls);
    ASSERT_GT(ncalls, 0);
    ASSERT_EQ(calls[ncalls - 1].non_block, false);
    kvp_kv_scripted_destroy(m->sc);
    free(m);
}

static const kvlc_factory_t g_factory = {sc_create, sc_destroy};

#define DEF(name) \
    TEST(test_##name) { kvlc_##name(&g_factory); }
KVLC_LIST(DEF)
#undef DEF

/* What the scripted client records of the contract's calls: one lookup with
 * the request's counts, the discards by id, the resets. */
TEST(test_scripted_records_the_contract_calls)
{
    kvlc_geom_t g = kvlc_geom(16, 16);
    kvlc_block_t b[] = {kvlc_everywhere(0)};
    kvlc_fixture_t fx;
    sc_create(&g, b, 1, &fx);
    sc_fixture_t *m = fx.impl;
    kvlc_req_t r;
    kvlc_req_init(&r, 40, 2);
    int64_t hit = -7;
    ASSERT_OK(fx.client.ops->lookup(fx.client.ctx, &r.req, true, &hit));
    ASSERT_EQ(hit, 16);
    fx.client.ops->discard(fx.client.ctx, "req-1");
    bool ack = false;
    ASSERT_OK(fx.client.ops->reset(fx.client.ctx, &ack));
    const kvp_kv_lookup_call_t *calls;
    ASSERT_EQ(kvp_kv_scripted_lookups(m->sc, &calls), 1);
    ASSERT_EQ(calls[0].num_tokens, 40);
    ASSERT_EQ(calls[0].num_block_hashes, 2);
    ASSERT_EQ(calls[0].non_block, true);
    const char *const *ids;
    ASSERT_EQ(kvp_kv_scripted_discards(m->sc, &ids), 1);
    ASSERT_STR_EQ(ids[0], "req-1");
    ASSERT_EQ(kvp_kv_scripted_resets(m->sc), 1);
    ASSERT_OK(fx.client.ops->lookup(fx.client.ctx, &r.req, false, &hit));
    ASSERT_EQ(hit, 0); /* the reset emptied the model */
    sc_destroy(&fx);
}

#define REF(name) T(test_##name),
TEST_LIST(KVLC_LIST(REF) T(test_scripted_records_the_contract_calls))
