/*
 * KV connector scheduler side: rules K1–K18 (connectors-spec §2.6) and the
 * scheduler parts of the §5 scenarios, each test named after what it checks.
 * Defaults as in §5: bs = hash_bs = 16, one group, kv_both, load_async,
 * synchronous lookups.
 */
#include <stdint.h>
#include <string.h>

#include "kvpool/kv_connector.h"
#include "kv_sched_fixture.h"
#include "support/kv_scripted.h"
#include "test.h"

/* ---- get_num_new_matched_tokens ---------------------------------------- */

TEST(test_k1_scenario1_lookup_disabled)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.enable_lookup = false;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 64, 0, false);
    ASSERT_EQ(nlookups(&f), 0);
    fx_close(&f);
}

TEST(test_k2_scenario2_short_prompt_no_lookup)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 15);
    lookup(&f, &r, 0, 64, 0, false);
    ASSERT_EQ(nlookups(&f), 0);
    fx_close(&f);
}

TEST(test_k2_partial_hits_align_is_hash_block)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.hash_block_size = 4;
    cfg.partial_hits = true;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 15);
    lookup(&f, &r, 0, 12, 12, true);
    ASSERT_EQ(nlookups(&f), 1);
    fx_close(&f);
}

TEST(test_k4_scenario3_zero_hit_no_load_spec)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 0, 0, false);
    ASSERT_EQ(nlookups(&f), 1);
    kvp_kv_load_spec_t ls;
    ASSERT_EQ(kvp_kv_sched_load_spec(f.s, "r1", &ls), KVP_ERR_NOT_FOUND);
    fx_close(&f);
}

TEST(test_k5_scenario4_hit_writes_load_spec)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 32, 64, 32, true);
    const kvp_kv_lookup_call_t *c;
    ASSERT_EQ(kvp_kv_scripted_lookups(f.sc, &c), 1);
    ASSERT_EQ(c[0].num_tokens, 100);
    ASSERT_EQ(c[0].num_block_hashes, 6);
    ASSERT_EQ(c[0].non_block, false);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.vllm_cached_tokens, 32);
    ASSERT_EQ(ls.kvpool_cached_tokens, 64);
    ASSERT_EQ(ls.can_load, false);
    fx_close(&f);
}

TEST(test_k4_scenario5_hit_below_local_hit)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 48, 32, 0, false);
    kvp_kv_load_spec_t ls;
    ASSERT_EQ(kvp_kv_sched_load_spec(f.s, "r1", &ls), KVP_ERR_NOT_FOUND);
    fx_close(&f);
}

TEST(test_k4_old_load_spec_is_not_cleared)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 32, 64, 32, true);
    lookup(&f, &r, 48, 32, 0, false);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.kvpool_cached_tokens, 64);
    fx_close(&f);
}

TEST(test_k3_scenario6_async_lookup_not_ready)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.lookup_async = true;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    int64_t n;
    bool la;
    kvp_kv_scripted_set_lookup(f.sc, 0, true);
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(f.s, &r.v, 32, &n, &la));
    ASSERT_EQ(n, -1);
    ASSERT_EQ(la, false);
    const kvp_kv_lookup_call_t *c;
    ASSERT_EQ(kvp_kv_scripted_lookups(f.sc, &c), 1);
    ASSERT_EQ(c[0].non_block, true);
    kvp_kv_load_spec_t ls;
    ASSERT_EQ(kvp_kv_sched_load_spec(f.s, "r1", &ls), KVP_ERR_NOT_FOUND);
    /* next step the future is done */
    lookup(&f, &r, 32, 64, 32, true);
    fx_close(&f);
}

TEST(test_k3_scenario7_lookup_rpc_error_is_zero)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    kvp_kv_scripted_set_lookup_error(f.sc);
    int64_t n;
    bool la;
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(f.s, &r.v, 0, &n, &la));
    ASSERT_EQ(n, 0);
    ASSERT_EQ(la, false);
    fx_close(&f);
}

/* ---- update_state_after_alloc ------------------------------------------ */

TEST(test_k7_scenario12_alloc_matches_can_load)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 32, 64, 32, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 32));
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.can_load, true);
    ASSERT_EQ(kvp_kv_sched_membership(f.s, "r1"), 3);
    fx_close(&f);
}

TEST(test_k7_scenario12_alloc_mismatch_is_assertion)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 32, 64, 32, true);
    ASSERT_EQ(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 16), KVP_ERR_STATE);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_ASSERTION);
    /* K6 ran before the assertion: the request is stored */
    ASSERT_EQ(kvp_kv_sched_membership(f.s, "r1"), 3);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.can_load, false);
    /* the scheduler keeps serving other requests */
    treq_t r2;
    treq_init(&r2, "r2", 40);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r2.v, blocks(&tb, 10, 3), 0));
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_NONE);
    fx_close(&f);
}

TEST(test_k7_scenario13_alloc_zero_external_cannot_load)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 32, 64, 32, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 32));
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 0));
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.can_load, false);
    fx_close(&f);
}

/* ---- build_connector_meta ---------------------------------------------- */

TEST(test_k13_scenario14_deferred_async_load)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 32, 64, 32, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 32));
    kvp_kv_sched_output_t so = {0};
    const kvp_kv_meta_t *m = build(&f, &so);
    ASSERT_EQ(m->num_requests, 1);
    const kvp_kv_req_meta_t *q = &m->requests[0];
    ASSERT_STR_EQ(q->req_id, "r1");
    ASSERT_EQ(q->has_load_spec, true);
    ASSERT_EQ(q->load_spec.can_load, true);
    ASSERT_EQ(q->load_spec.vllm_cached_tokens, 32);
    ASSERT_EQ(q->load_spec.kvpool_cached_tokens, 64);
    ASSERT_EQ(q->can_save, false);
    ASSERT_EQ(q->token_len_chunk, 64);
    ASSERT_EQ(q->is_last_chunk, KVP_KV_TRI_NONE);
    ASSERT_EQ(q->block_ids.num_groups, 1);
    ASSERT_EQ(q->block_ids.groups[0].n, 7);
    ASSERT_EQ(q->has_token_ids, false);
    fx_close(&f);
}

TEST(test_k13_quirk_zero_external_deferred_becomes_save)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 0, 40, 40, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 0));
    kvp_kv_sched_output_t so = {0};
    const kvp_kv_meta_t *m = build(&f, &so);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].can_save, true);
    ASSERT_EQ(m->requests[0].has_load_spec, false);
    ASSERT_EQ(m->requests[0].token_len_chunk, 32);
    ASSERT_EQ(m->requests[0].block_ids.num_groups, 0); /* the stored () */
    fx_close(&f);
}

TEST(test_k11_scenario15_sync_load_on_new_request)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.load_async = false;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 32, 64, 32, false);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 32));
    kvp_kv_new_req_t n = new_req(&r, 64, 36, blocks(&tb, 1, 7));
    const kvp_kv_meta_t *m = build_new(&f, &n);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].can_save, false);
    ASSERT_EQ(m->requests[0].has_load_spec, true);
    ASSERT_EQ(m->requests[0].load_spec.can_load, true);
    ASSERT_EQ(m->requests[0].is_last_chunk, 1);
    fx_close(&f);
}

/* Scenarios 16–19: one 100-token prompt in chunks of 40, 40, 7?, ... */
TEST(test_k11_k12_scenarios16_to_19_chunked_prefill)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 3), 0));
    /* 16: 40 of 100 -> token_len_chunk 32, can_save, not last, saved 32 */
    kvp_kv_new_req_t n = new_req(&r, 0, 40, blocks(&tb, 1, 3));
    const kvp_kv_meta_t *m = build_new(&f, &n);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].token_len_chunk, 32);
    ASSERT_EQ(m->requests[0].can_save, true);
    ASSERT_EQ(m->requests[0].is_last_chunk, 0);
    ASSERT_EQ(m->requests[0].num_token_ids, 40);
    ASSERT_EQ(m->requests[0].num_prompt_tokens, 100);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.num_saved_tokens, 32);
    /* 17: 40 more -> 80 */
    r.v.num_computed_tokens = 40;
    kvp_kv_cached_req_t c = cached(&r, 40, 40, blocks(&tb, 4, 2));
    m = build_cached(&f, &c);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].token_len_chunk, 80);
    ASSERT_EQ(m->requests[0].block_ids.groups[0].n, 5);
    ASSERT_EQ(m->requests[0].num_token_ids, 40); /* token_ids never extended */
    /* 18: 7 more (saved 80, token_len 87) crosses no block boundary */
    r.v.num_computed_tokens = 80;
    c = cached(&r, 80, 7, blocks(&tb, 6, 1));
    m = build_cached(&f, &c);
    ASSERT_EQ(m->num_requests, 0);
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.token_len, 87);
    ASSERT_EQ(ti.num_blocks, 6);
    /* 19: the final chunk reaches 100 -> 96, last */
    r.v.num_computed_tokens = 87;
    c = cached(&r, 87, 13, blocks(&tb, 7, 1));
    m = build_cached(&f, &c);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].token_len_chunk, 96);
    ASSERT_EQ(m->requests[0].is_last_chunk, 1);
    fx_close(&f);
}

TEST(test_k12_scenario18_chunk_without_new_boundary)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 3), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 40, blocks(&tb, 1, 3));
    build_new(&f, &n);
    kvp_kv_cached_req_t c = cached(&r, 40, 7, blocks(&tb, 4, 1)); /* saved 32, token_len 47 */
    const kvp_kv_meta_t *m = build_cached(&f, &c);
    ASSERT_EQ(m->num_requests, 0);
    fx_close(&f);
}

TEST(test_k12_scenario20_decode_step_not_saved)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 32);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 2), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 32, blocks(&tb, 1, 2));
    ASSERT_EQ(build_new(&f, &n)->num_requests, 1);
    treq_append(&r, 7);
    kvp_kv_cached_req_t c = cached(&r, 32, 1, blocks(&tb, 3, 1));
    ASSERT_EQ(build_cached(&f, &c)->num_requests, 0);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.token_len, 33);
    ASSERT_EQ(ti.num_blocks, 2); /* no update while decoding */
    fx_close(&f);
}

/* The K12 quirk kept by default, and the documented switch that fixes it. */
static void k12_empty_blocks(bool fix, size_t want_metas, int64_t want_len)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.fix_k12_save_without_new_blocks = fix;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 20, blocks(&tb, 1, 7)); /* all blocks up front */
    ASSERT_EQ(build_new(&f, &n)->num_requests, 1);            /* saves 16 */
    kvp_kv_cached_req_t c = cached(&r, 20, 20, NULL);          /* crosses 32, no new blocks */
    const kvp_kv_meta_t *m = build_cached(&f, &c);
    ASSERT_EQ(m->num_requests, want_metas);
    if (want_metas)
        ASSERT_EQ(m->requests[0].token_len_chunk, 32);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.token_len, want_len);
    fx_close(&f);
}

TEST(test_k12_scenario21_empty_new_blocks_skipped_quirk)
{
    k12_empty_blocks(false, 0, 20);
}

TEST(test_k12_fix_switch_saves_without_new_blocks)
{
    k12_empty_blocks(true, 1, 40);
}

TEST(test_k15_scenario22_consumer_never_saves)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_CONSUMER);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 64, blocks(&tb, 1, 7));
    ASSERT_EQ(build_new(&f, &n)->num_requests, 0);
    kvp_kv_cached_req_t c = cached(&r, 64, 36, blocks(&tb, 8, 1));
    ASSERT_EQ(build_cached(&f, &c)->num_requests, 0);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.token_len, 64); /* cached requests are ignored */
    bool delay = true;
    ASSERT_OK(kvp_kv_sched_request_finished(f.s, "r1", blocks(&tb, 1, 7), &delay));
    ASSERT_EQ(delay, false);
    fx_close(&f);
}

TEST(test_k15_scenario22_consumer_loads)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.kv_role = KVP_KV_ROLE_CONSUMER;
    cfg.load_async = false;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 0, 64, 64, false);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 64));
    kvp_kv_new_req_t n = new_req(&r, 64, 36, blocks(&tb, 1, 7));
    const kvp_kv_meta_t *m = build_new(&f, &n);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].has_load_spec, true);
    ASSERT_EQ(m->requests[0].can_save, false);
    fx_close(&f);
}

TEST(test_k9_scenario23_preemption_and_resume)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 100, blocks(&tb, 1, 7));
    build_new(&f, &n);
    r.v.num_computed_tokens = 100;
    treq_append(&r, 5);
    treq_append(&r, 6);
    /* a stale load spec is dropped by the preemption */
    lookup(&f, &r, 0, 64, 64, true);
    const char *pre[] = {"r1"};
    kvp_kv_sched_output_t so = {0};
    so.preempted_req_ids = pre;
    so.num_preempted = 1;
    const kvp_kv_meta_t *m = build(&f, &so);
    ASSERT(in_ids(m->preempted_req_ids, m->num_preempted, "r1"));
    ASSERT(in_ids(m->unfinished_req_ids, m->num_unfinished, "r1")); /* K9 quirk */
    ASSERT_EQ(kvp_kv_sched_membership(f.s, "r1"), 2);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.num_saved_tokens, 0);
    ASSERT_EQ(ti.token_len, 0);
    ASSERT_EQ(ti.num_groups, 0);
    kvp_kv_load_spec_t ls;
    ASSERT_EQ(kvp_kv_sched_load_spec(f.s, "r1", &ls), KVP_ERR_NOT_FOUND);
    bool delay = true;
    ASSERT_OK(kvp_kv_sched_request_finished(f.s, "r1", blocks(&tb, 1, 7), &delay));
    ASSERT_EQ(delay, false);
    /* resume (MRV1): cached + resumed, all blocks, prefill = all_token_ids */
    r.v.num_computed_tokens = 0;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 20, 7), 0));
    kvp_kv_cached_req_t c = cached(&r, 0, 102, blocks(&tb, 20, 7));
    c.resumed = true;
    m = build_cached(&f, &c);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].token_len_chunk, 96);
    ASSERT_EQ(m->requests[0].num_prompt_tokens, 102);
    ASSERT_EQ(m->requests[0].is_last_chunk, 1);
    ASSERT_EQ(m->requests[0].num_token_ids, 102);
    ASSERT_EQ(m->requests[0].block_ids.groups[0].ids[0], 20);
    fx_close(&f);
}

TEST(test_k16_scenario25_finished_never_saved)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 1), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 10, blocks(&tb, 1, 1)); /* < one block */
    ASSERT_EQ(build_new(&f, &n)->num_requests, 0);
    bool delay = true;
    ASSERT_OK(kvp_kv_sched_request_finished(f.s, "r1", blocks(&tb, 1, 1), &delay));
    ASSERT_EQ(delay, false);
    fx_close(&f);
}

TEST(test_k17_scenario24_finished_with_saves_delays)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 3), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 40, blocks(&tb, 1, 3));
    build_new(&f, &n);
    bool delay = false;
    ASSERT_OK(kvp_kv_sched_request_finished(f.s, "r1", blocks(&tb, 1, 3), &delay));
    ASSERT_EQ(delay, true);
    ASSERT_OK(kvp_kv_sched_request_finished_all_groups(f.s, "r1", 0, &delay));
    ASSERT_EQ(delay, false); /* no blocks: nothing to keep */
    fx_close(&f);
}

TEST(test_k8_scenario26_abort_before_scheduling)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 64, 64, true);
    bool delay = true;
    ASSERT_OK(kvp_kv_sched_request_finished_all_groups(f.s, "r1", 4, &delay));
    ASSERT_EQ(delay, false);
    const char *fin[] = {"r1"};
    kvp_kv_sched_output_t so = {0};
    so.finished_req_ids = fin;
    so.num_finished = 1;
    kvp_kv_scripted_clear(f.sc);
    build(&f, &so);
    const char *const *d;
    ASSERT_EQ(kvp_kv_scripted_discards(f.sc, &d), 1);
    ASSERT_STR_EQ(d[0], "r1");
    kvp_kv_sched_stats_t st;
    kvp_kv_sched_stats(f.s, &st);
    ASSERT_EQ(st.num_load_specs, 0);
    ASSERT_EQ(kvp_kv_sched_membership(f.s, "r1"), 0);
    fx_close(&f);
}

TEST(test_k18_scenario29_reset_store_replies)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    bool ok;
    kvp_kv_scripted_set_reset(f.sc, KVP_KV_RESET_ACK);
    ASSERT_OK(kvp_kv_sched_reset_store(f.s, &ok));
    ASSERT_EQ(ok, true);
    kvp_kv_scripted_set_reset(f.sc, KVP_KV_RESET_NACK);
    ASSERT_OK(kvp_kv_sched_reset_store(f.s, &ok));
    ASSERT_EQ(ok, false);
    kvp_kv_scripted_set_reset(f.sc, KVP_KV_RESET_ERROR);
    ASSERT_OK(kvp_kv_sched_reset_store(f.s, &ok));
    ASSERT_EQ(ok, false);
    ASSERT_EQ(kvp_kv_scripted_resets(f.sc), 3);
    fx_close(&f);
}

TEST(test_k18_scenario29_reset_cache_clears_load_specs_first)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r[40];
    char ids[40][8];
    tblocks_t tb;
    for (int i = 0; i < 40; i++) {
        snprintf(ids[i], sizeof ids[i], "r%d", i);
        treq_init(&r[i], ids[i], 100);
        lookup(&f, &r[i], 0, 64, 64, true);
        if (i % 2)
            ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r[i].v, blocks(&tb, 1, 7), 64));
    }
    kvp_kv_sched_stats_t st;
    kvp_kv_sched_stats(f.s, &st);
    ASSERT_EQ(st.num_load_specs, 40);
    bool ok = false;
    kvp_kv_scripted_set_reset(f.sc, KVP_KV_RESET_ACK);
    ASSERT_OK(kvp_kv_sched_reset_cache(f.s, &ok));
    ASSERT_EQ(ok, true);
    kvp_kv_sched_stats(f.s, &st);
    ASSERT_EQ(st.num_load_specs, 0);
    ASSERT_EQ(st.num_unfinished, 20);
    /* no deferred load is emitted afterwards */
    kvp_kv_sched_output_t so = {0};
    ASSERT_EQ(build(&f, &so)->num_requests, 0);
    fx_close(&f);
}

static kvp_kv_config_t partial_cfg(void)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.hash_block_size = 4;
    cfg.partial_hits = true;
    return cfg;
}

TEST(test_k14_scenario30_partial_tail_rides_save_meta)
{
    kvp_kv_config_t cfg = partial_cfg();
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 3), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 36, blocks(&tb, 1, 3));
    kvp_kv_tail_offload_t off = {1, 900001, 36};
    kvp_kv_tail_req_t tr = {"r1", &off, 1};
    kvp_kv_sched_output_t so = {0};
    so.new_reqs = &n;
    so.num_new_reqs = 1;
    so.partial_tails = &tr;
    so.num_partial_tails = 1;
    const kvp_kv_meta_t *m = build(&f, &so);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].num_partial_tail_offloads, 1);
    ASSERT_EQ(m->requests[0].partial_tail_offloads[0].cow_block_id, 900001);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.has_pending_offload, true);
    fx_close(&f);
}

TEST(test_k14_scenario30_offload_only_meta_then_finish_delays)
{
    kvp_kv_config_t cfg = partial_cfg();
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 1), 0));
    kvp_kv_new_req_t n = new_req(&r, 0, 12, blocks(&tb, 1, 1)); /* saves nothing */
    kvp_kv_tail_offload_t off = {1, 900001, 12};
    kvp_kv_tail_req_t tr = {"r1", &off, 1};
    kvp_kv_sched_output_t so = {0};
    so.new_reqs = &n;
    so.num_new_reqs = 1;
    so.partial_tails = &tr;
    so.num_partial_tails = 1;
    const kvp_kv_meta_t *m = build(&f, &so);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT_EQ(m->requests[0].token_len_chunk, 0);
    ASSERT_EQ(m->requests[0].can_save, true);
    ASSERT_EQ(m->requests[0].has_token_ids, false);
    ASSERT_EQ(m->requests[0].num_prompt_tokens, 100);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.num_saved_tokens, 0);
    bool delay = false;
    ASSERT_OK(kvp_kv_sched_request_finished(f.s, "r1", blocks(&tb, 1, 1), &delay));
    ASSERT_EQ(delay, true);
    fx_close(&f);
}

TEST(test_k14_scenario31_partial_tail_dropped_or_asserts)
{
    kvp_kv_config_t cfg = partial_cfg();
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r1, r2;
    treq_init(&r1, "r1", 100);
    treq_init(&r2, "r2", 100);
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r1.v, blocks(&tb, 1, 1), 0));
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r2.v, blocks(&tb, 1, 1), 0));
    kvp_kv_new_req_t n[2] = {new_req(&r1, 0, 12, blocks(&tb, 1, 1)), new_req(&r2, 0, 12, blocks(&tb, 2, 1))};
    kvp_kv_sched_output_t so = {0};
    so.new_reqs = n;
    so.num_new_reqs = 2;
    build(&f, &so);
    /* r1 finishes this step: its offload is dropped */
    const char *fin[] = {"r1"};
    kvp_kv_tail_offload_t off1 = {1, 900001, 12};
    kvp_kv_tail_req_t t1 = {"r1", &off1, 1};
    memset(&so, 0, sizeof so);
    so.finished_req_ids = fin;
    so.num_finished = 1;
    so.partial_tails = &t1;
    so.num_partial_tails = 1;
    ASSERT_EQ(build(&f, &so)->num_requests, 0);
    /* two different boundaries for r2: the original's assertion */
    kvp_kv_tail_offload_t off2[2] = {{1, 900002, 12}, {2, 900003, 16}};
    kvp_kv_tail_req_t t2 = {"r2", off2, 2};
    memset(&so, 0, sizeof so);
    so.partial_tails = &t2;
    so.num_partial_tails = 1;
    const kvp_kv_meta_t *m = (const kvp_kv_meta_t *)1;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_STATE);
    ASSERT(m == NULL);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_ASSERTION);
    fx_close(&f);
}

/* ---- failing like the original ------------------------------------------ */

TEST(test_k11_missing_scheduled_tokens_is_key_error_after_pop)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 0, 64, 64, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 64));
    kvp_kv_new_req_t n = new_req(&r, 0, KVP_KV_NO_ENTRY, blocks(&tb, 1, 7));
    kvp_kv_sched_output_t so = {0};
    so.new_reqs = &n;
    so.num_new_reqs = 1;
    const kvp_kv_meta_t *m;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_NOT_FOUND);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_KEY);
    kvp_kv_load_spec_t ls; /* popped before the KeyError, as in the original */
    ASSERT_EQ(kvp_kv_sched_load_spec(f.s, "r1", &ls), KVP_ERR_NOT_FOUND);
    fx_close(&f);
}

TEST(test_k11_unallocated_new_request_is_assertion)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "ghost", 100);
    tblocks_t tb;
    kvp_kv_new_req_t n = new_req(&r, 0, 16, blocks(&tb, 1, 1));
    kvp_kv_sched_output_t so = {0};
    so.new_reqs = &n;
    so.num_new_reqs = 1;
    const kvp_kv_meta_t *m;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_STATE);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_ASSERTION);
    kvp_kv_sched_stats_t st;
    kvp_kv_sched_stats(f.s, &st);
    ASSERT_EQ(st.num_trackers + st.num_unfinished + st.num_load_specs, 0);
    fx_close(&f);
}

TEST(test_k12_errors_key_value_type)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    const kvp_kv_meta_t *m;
    /* running without a tracker: KeyError */
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 3), 0));
    kvp_kv_cached_req_t c = cached(&r, 0, 16, blocks(&tb, 4, 1));
    kvp_kv_sched_output_t so = {0};
    so.cached_reqs = &c;
    so.num_cached_reqs = 1;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_NOT_FOUND);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_KEY);
    /* group-count mismatch: ValueError after token_len grew */
    kvp_kv_new_req_t n = new_req(&r, 0, 20, blocks(&tb, 1, 3));
    build_new(&f, &n);
    kvp_kv_ids_t two[2] = {{tb.ids, 1}, {tb.ids, 1}};
    kvp_kv_blocks_t b2 = {two, 2};
    c = cached(&r, 20, 10, &b2);
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_VALUE);
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.token_len, 30);
    /* preempted then scheduled as running: ValueError (not unfinished) */
    const char *pre[] = {"r1"};
    kvp_kv_sched_output_t sp = {0};
    sp.preempted_req_ids = pre;
    sp.num_preempted = 1;
    build(&f, &sp);
    c = cached(&r, 30, 10, blocks(&tb, 5, 1));
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_STATE);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_VALUE);
    /* resumed but not unfinished: TypeError */
    c.resumed = true;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_STATE);
    ASSERT_EQ(kvp_kv_sched_last_error(f.s, NULL), KVP_KV_ERR_TYPE);
    fx_close(&f);
}

TEST(test_k13_shares_unfinished_block_tuple)
{
    /* K13's tracker holds the tuple stored by K6; a later running update
     * appends to it in place (the original's shared lists). */
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 0, 64, 64, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 4), 64));
    kvp_kv_sched_output_t so = {0};
    ASSERT_EQ(build(&f, &so)->num_requests, 1); /* the deferred load */
    /* the load completes: the request runs as cached with num_computed 64 */
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.prefill_end_tokens, 0);
    r.v.num_computed_tokens = 64;
    kvp_kv_cached_req_t c = cached(&r, 64, 36, blocks(&tb, 5, 3));
    /* prefill_end 0 -> "decoding": skipped, token_len grows */
    ASSERT_EQ(build_cached(&f, &c)->num_requests, 0);
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.token_len, 100);
    fx_close(&f);
}

TEST(test_from_request_tracker_never_loads_and_saves)
{
    /* sync load on a new request with enough tokens to save: the meta loads
     * only and num_saved_tokens does not move */
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.load_async = false;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 0, 48, 48, false);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 48));
    kvp_kv_new_req_t n = new_req(&r, 48, 52, blocks(&tb, 1, 7));
    const kvp_kv_meta_t *m = build_new(&f, &n);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT(!(m->requests[0].can_save && m->requests[0].has_load_spec));
    kvp_kv_tracker_info_t ti;
    ASSERT_OK(kvp_kv_sched_tracker(f.s, "r1", &ti));
    ASSERT_EQ(ti.num_saved_tokens, 0);
    fx_close(&f);
}

TEST(test_config_validate_and_defaults)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    ASSERT_EQ(cfg.kv_role, KVP_KV_ROLE_BOTH);
    ASSERT_EQ(cfg.load_async, true);
    ASSERT_EQ(cfg.lookup_async, false);
    ASSERT_EQ(cfg.enable_lookup, true);
    ASSERT_OK(kvp_kv_config_validate(&cfg));
    cfg.hash_block_size = 5;
    ASSERT_EQ(kvp_kv_config_validate(&cfg), KVP_ERR_BAD_CONFIG);
    cfg.hash_block_size = 16;
    cfg.partial_hits = true;
    ASSERT_EQ(kvp_kv_config_validate(&cfg), KVP_ERR_BAD_CONFIG);
    kvp_kv_role_t role;
    ASSERT_OK(kvp_kv_role_parse("kv_consumer", &role));
    ASSERT_EQ(role, KVP_KV_ROLE_CONSUMER);
    ASSERT_EQ(kvp_kv_role_parse("kv_both ", &role), KVP_ERR_BAD_CONFIG);
    ASSERT_STR_EQ(kvp_kv_role_name(KVP_KV_ROLE_PRODUCER), "kv_producer");
}

TEST(test_block_sizes_one_group_times_dcp_pcp)
{
    kvp_kv_cache_group_t g = {KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false};
    kvp_kv_block_params_t p = {sizeof p, 16, 0, 2, 2, true, true};
    kvp_kv_block_sizes_t out;
    ASSERT_OK(kvp_kv_resolve_block_sizes(&g, 1, &p, &out));
    ASSERT_EQ(out.block_size, 64);
    ASSERT_EQ(out.hash_block_size, 64);
    ASSERT_EQ(out.partial_hits, false);
    ASSERT_OK(kvp_kv_resolve_block_sizes(NULL, 0, &p, &out));
    ASSERT_EQ(out.block_size, 64);
}

TEST(test_block_sizes_hybrid_groups)
{
    kvp_kv_cache_group_t g[2] = {{KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false},
                                 {KVP_KV_GROUP_SLIDING_WINDOW, 32, false, 128, false}};
    kvp_kv_block_params_t p = {sizeof p, 16, 0, 1, 1, true, true};
    kvp_kv_block_sizes_t out;
    ASSERT_OK(kvp_kv_resolve_block_sizes(g, 2, &p, &out));
    ASSERT_EQ(out.block_size, 32); /* lcm */
    ASSERT_EQ(out.hash_block_size, 16); /* gcd */
    ASSERT_EQ(out.partial_hits, false);
    p.prefix_caching = p.kv_connector = false;
    ASSERT_OK(kvp_kv_resolve_block_sizes(g, 2, &p, &out));
    ASSERT_EQ(out.hash_block_size, 32);
    p.prefix_caching = true;
    p.dcp_size = 2;
    ASSERT_EQ(kvp_kv_resolve_block_sizes(g, 2, &p, &out), KVP_ERR_BAD_CONFIG);
    p.dcp_size = 1;
    p.hash_block_size = 5; /* must divide every group size */
    ASSERT_EQ(kvp_kv_resolve_block_sizes(g, 2, &p, &out), KVP_ERR_BAD_CONFIG);
}

TEST(test_block_sizes_mamba_partial_hits)
{
    /* align mode: the Mamba group's block size is the cache block size */
    kvp_kv_cache_group_t g[2] = {{KVP_KV_GROUP_FULL_ATTENTION, 16, false, 0, false},
                                 {KVP_KV_GROUP_MAMBA, 64, true, 0, false}};
    kvp_kv_block_params_t p = {sizeof p, 64, 0, 1, 1, true, true};
    kvp_kv_block_sizes_t out;
    ASSERT_OK(kvp_kv_resolve_block_sizes(g, 2, &p, &out));
    ASSERT_EQ(out.block_size, 64);
    ASSERT_EQ(out.hash_block_size, 16);
    ASSERT_EQ(out.partial_hits, true);
    /* a Mamba block size that differs from the cache block size: no finer hashing */
    p.cache_block_size = 16;
    g[1].mamba_align_mode = false;
    ASSERT_OK(kvp_kv_resolve_block_sizes(g, 2, &p, &out));
    ASSERT_EQ(out.hash_block_size, 64);
    ASSERT_EQ(out.partial_hits, false);
}

/* Any lookup client plugs in through kvp_kv_lookup_ops_t: here an
 * in-process one answering from a set of stored chunk hashes (longest stored
 * prefix, the last prompt token always recomputed). */
typedef struct {
    uint8_t stored[8];
    size_t nstored;
    size_t discards, resets;
} memclient_t;

static kvp_status_t mem_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block, int64_t *hit_p)
{
    memclient_t *c = ctx;
    (void)non_block;
    size_t m = 0;
    while (m < req->num_block_hashes) {
        bool found = false;
        for (size_t k = 0; k < c->nstored; k++)
            found |= req->block_hashes[m * req->hash_len] == c->stored[k];
        if (!found)
            break;
        m++;
    }
    int64_t hit = (int64_t)m * 16;
    if (hit >= req->num_tokens)
        hit = (req->num_tokens - 1) / 16 * 16;
    *hit_p = hit;
    return KVP_OK;
}
static void mem_discard(void *ctx, const char *req_id)
{
    (void)req_id;
    ((memclient_t *)ctx)->discards++;
}
static kvp_status_t mem_reset(void *ctx, bool *ack_p)
{
    memclient_t *c = ctx;
    c->resets++;
    c->nstored = 0;
    *ack_p = true;
    return KVP_OK;
}

TEST(test_lookup_interface_custom_client)
{
    static const kvp_kv_lookup_ops_t ops = {mem_lookup, mem_discard, mem_reset};
    memclient_t mc = {{1, 2, 3, 4}, 4, 0, 0};
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    kvp_kv_sched_t *s;
    kvp_kv_lookup_client_t bad = {NULL, &mc};
    ASSERT_EQ(kvp_kv_sched_create(&cfg, bad, &s), KVP_ERR_NULL_POINTER);
    ASSERT_OK(kvp_kv_sched_create(&cfg, (kvp_kv_lookup_client_t){&ops, &mc}, &s));
    /* 64-token prompt, chunks 1,2,3,4 stored: full hit capped to 48 (scenario 9) */
    uint8_t h64[4] = {1, 2, 3, 4};
    kvp_kv_request_t r = {"a", 64, 0, NULL, 0, h64, 4, 1};
    int64_t n;
    bool la;
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &r, 0, &n, &la));
    ASSERT_EQ(n, 48);
    /* 100 tokens, chunks 1,2,9,4: prefix only -> 32 (scenario 8) */
    uint8_t h100[6] = {1, 2, 9, 4, 5, 6};
    kvp_kv_request_t r2 = {"b", 100, 0, NULL, 0, h100, 6, 1};
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &r2, 16, &n, &la));
    ASSERT_EQ(n, 16);
    const char *fin[] = {"a", "b"};
    kvp_kv_sched_output_t so = {0};
    so.finished_req_ids = fin;
    so.num_finished = 2;
    build(&(fx_t){NULL, s}, &so);
    ASSERT_EQ(mc.discards, 2);
    bool ok;
    ASSERT_OK(kvp_kv_sched_reset_cache(s, &ok));
    ASSERT_EQ(ok, true);
    ASSERT_EQ(mc.resets, 1);
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &r, 0, &n, &la));
    ASSERT_EQ(n, 0);
    kvp_kv_sched_destroy(s);
}

TEST(test_bad_output_view_changes_nothing)
{
    fx_t f;
    fx_open(&f, KVP_KV_ROLE_BOTH);
    treq_t r;
    treq_init(&r, "r1", 100);
    tblocks_t tb;
    lookup(&f, &r, 0, 64, 64, true);
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 1, 7), 64));
    const char *fin[] = {"r1"};
    kvp_kv_new_req_t n = new_req(&r, 0, 16, blocks(&tb, 1, 7));
    n.block_ids.groups = NULL; /* one group announced, no array */
    kvp_kv_sched_output_t so = {0};
    so.finished_req_ids = fin;
    so.num_finished = 1;
    so.new_reqs = &n;
    so.num_new_reqs = 1;
    const kvp_kv_meta_t *m;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_sched_membership(f.s, "r1"), 3); /* K8 did not run */
    so.num_new_reqs = 0;
    so.finished_req_ids = NULL;
    ASSERT_EQ(kvp_kv_sched_build_connector_meta(f.s, &so, &m), KVP_ERR_NULL_POINTER);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    fx_close(&f);
}

TEST_LIST(T(test_k1_scenario1_lookup_disabled), T(test_k2_scenario2_short_prompt_no_lookup),
          T(test_k2_partial_hits_align_is_hash_block), T(test_k4_scenario3_zero_hit_no_load_spec),
          T(test_k5_scenario4_hit_writes_load_spec), T(test_k4_scenario5_hit_below_local_hit),
          T(test_k4_old_load_spec_is_not_cleared), T(test_k3_scenario6_async_lookup_not_ready),
          T(test_k3_scenario7_lookup_rpc_error_is_zero), T(test_k7_scenario12_alloc_matches_can_load),
          T(test_k7_scenario12_alloc_mismatch_is_assertion),
          T(test_k7_scenario13_alloc_zero_external_cannot_load),
          T(test_k13_scenario14_deferred_async_load),
          T(test_k13_quirk_zero_external_deferred_becomes_save),
          T(test_k11_scenario15_sync_load_on_new_request),
          T(test_k11_k12_scenarios16_to_19_chunked_prefill),
          T(test_k12_scenario18_chunk_without_new_boundary), T(test_k12_scenario20_decode_step_not_saved),
          T(test_k12_scenario21_empty_new_blocks_skipped_quirk),
          T(test_k12_fix_switch_saves_without_new_blocks), T(test_k15_scenario22_consumer_never_saves),
          T(test_k15_scenario22_consumer_loads), T(test_k9_scenario23_preemption_and_resume),
          T(test_k16_scenario25_finished_never_saved), T(test_k17_scenario24_finished_with_saves_delays),
          T(test_k8_scenario26_abort_before_scheduling), T(test_k18_scenario29_reset_store_replies),
          T(test_k18_scenario29_reset_cache_clears_load_specs_first),
          T(test_k14_scenario30_partial_tail_rides_save_meta),
          T(test_k14_scenario30_offload_only_meta_then_finish_delays),
          T(test_k14_scenario31_partial_tail_dropped_or_asserts),
          T(test_k11_missing_scheduled_tokens_is_key_error_after_pop),
          T(test_k11_unallocated_new_request_is_assertion), T(test_k12_errors_key_value_type),
          T(test_k13_shares_unfinished_block_tuple), T(test_from_request_tracker_never_loads_and_saves),
          T(test_config_validate_and_defaults), T(test_block_sizes_one_group_times_dcp_pcp),
          T(test_block_sizes_hybrid_groups), T(test_block_sizes_mamba_partial_hits),
          T(test_lookup_interface_custom_client), T(test_bad_output_view_changes_nothing))
