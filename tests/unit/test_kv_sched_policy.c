/*
 * KV connector scheduler, load or recompute (rule F1, kv_sched.c; issue 15
 * item 4): with load_policy faster a pool hit of need tokens is loaded only
 * when lookup_rtt_us + need * load_bytes_per_token / bandwidth * 1e6 is
 * below need * prefill_us_per_token; otherwise get_num_new_matched_tokens
 * answers (0, false) and writes no LoadSpec, as K4, and counts the decline.
 * ALWAYS (the default) keeps the original's decisions.
 *
 * The figures: 128 KiB of KV per token (llama8b-like), prefill 40 us per
 * token (the default), a 1 GB/s link (131 us per token: slower than
 * recomputing) and a 50 GB/s one (2.6 us per token: faster).
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kv_sched_fixture.h"
#include "kvpool/kv_connector.h"
#include "support/kv_scripted.h"
#include "test.h"

#define F1_BYTES_PER_TOKEN 131072u
#define F1_SLOW 1e9
#define F1_FAST 50e9

static kvp_kv_config_t faster_cfg(double bytes_per_s)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.load_policy = KVP_KV_LOAD_FASTER;
    cfg.load_bytes_per_token = F1_BYTES_PER_TOKEN;
    cfg.load_bytes_per_s = bytes_per_s;
    return cfg;
}

static void stats(fx_t *f, uint64_t want_loads, uint64_t want_tokens)
{
    kvp_kv_sched_stats_t st;
    kvp_kv_sched_stats(f->s, &st);
    ASSERT_EQ(st.loads_declined, want_loads);
    ASSERT_EQ(st.tokens_declined, want_tokens);
}

static bool has_spec(fx_t *f, const char *id)
{
    kvp_kv_load_spec_t ls;
    return kvp_kv_sched_load_spec(f->s, id, &ls) == KVP_OK;
}

TEST(test_f1_faster_declines_slow_load)
{
    kvp_kv_config_t cfg = faster_cfg(F1_SLOW);
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    /* 64 tokens: 100 + 64 * 131.072 = 8488.6 us to load, 2560 us to recompute */
    lookup(&f, &r, 16, 80, 0, false);
    ASSERT_EQ(nlookups(&f), 1);
    ASSERT(!has_spec(&f, "r1"));
    stats(&f, 1, 64);
    kvp_kv_sched_stats_t st;
    kvp_kv_sched_stats(f.s, &st);
    ASSERT_EQ(st.num_load_specs, 0);
    /* the engine goes on as after K4: nothing external, and the new request
     * is scheduled for its whole prompt, saved, and loads nothing */
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 0, 7), 0));
    kvp_kv_new_req_t n = new_req(&r, 16, 84, blocks(&tb, 0, 7));
    const kvp_kv_meta_t *m = build_new(&f, &n);
    ASSERT_EQ(m->num_requests, 1);
    ASSERT(!m->requests[0].has_load_spec);
    ASSERT(m->requests[0].can_save);
    /* a second decline adds to the counts */
    treq_t r2;
    treq_init(&r2, "r2", 100);
    lookup(&f, &r2, 0, 96, 0, false);
    stats(&f, 2, 64 + 96);
    fx_close(&f);
}

TEST(test_f1_faster_accepts_fast_load)
{
    kvp_kv_config_t cfg = faster_cfg(F1_FAST);
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    /* 64 tokens: 100 + 64 * 2.62 = 267.8 us to load, 2560 us to recompute */
    lookup(&f, &r, 16, 80, 64, true);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.vllm_cached_tokens, 16);
    ASSERT_EQ(ls.kvpool_cached_tokens, 80);
    ASSERT_EQ(ls.can_load, false);
    stats(&f, 0, 0);
    /* and the load goes through K7 as any other */
    tblocks_t tb;
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(f.s, &r.v, blocks(&tb, 0, 7), 64));
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.can_load, true);
    fx_close(&f);
}

TEST(test_f1_small_hit_rtt_dominates)
{
    kvp_kv_config_t cfg = faster_cfg(F1_FAST);
    cfg.lookup_rtt_us = 1000.0;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t a, b;
    treq_init(&a, "small", 100);
    treq_init(&b, "large", 100);
    /* 16 tokens: 1000 + 41.9 us to load > 640 us to recompute */
    lookup(&f, &a, 0, 16, 0, false);
    ASSERT(!has_spec(&f, "small"));
    /* 64 tokens over the same link: 1000 + 167.8 us < 2560 us */
    lookup(&f, &b, 0, 64, 64, true);
    ASSERT(has_spec(&f, "large"));
    stats(&f, 1, 16);
    fx_close(&f);
}

TEST(test_f1_tie_recomputes)
{
    /* exact doubles: 1 MiB per token at 1 MiB/s is 1e6 us per token, the
     * prefill cost; no round trip: a tie, which recomputes */
    kvp_kv_config_t cfg = faster_cfg(1048576.0);
    cfg.load_bytes_per_token = 1048576u;
    cfg.prefill_us_per_token = 1e6;
    cfg.lookup_rtt_us = 0;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 32, 0, false);
    stats(&f, 1, 32);
    fx_close(&f);
    /* a hair slower prefill: the load wins */
    cfg.prefill_us_per_token = 1e6 + 1;
    fx_open_cfg(&f, &cfg);
    lookup(&f, &r, 0, 32, 32, true);
    stats(&f, 0, 0);
    fx_close(&f);
}

TEST(test_f1_unknown_bandwidth_loads)
{
    /* no bandwidth known: the slowest bytes still load, as ALWAYS */
    kvp_kv_config_t cfg = faster_cfg(0);
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 64, 64, true);
    fx_close(&f);
    /* the bytes per token unknown: the same, even on a slow link */
    cfg = faster_cfg(1.0);
    cfg.load_bytes_per_token = 0;
    fx_open_cfg(&f, &cfg);
    lookup(&f, &r, 0, 64, 64, true);
    stats(&f, 0, 0);
    fx_close(&f);
    /* a measured bandwidth of 0 is unknown too: it loads */
    cfg = faster_cfg(F1_SLOW);
    fx_open_cfg(&f, &cfg);
    ASSERT_OK(kvp_kv_sched_set_load_bandwidth(f.s, 0));
    lookup(&f, &r, 0, 64, 64, true);
    stats(&f, 0, 0);
    fx_close(&f);
}

TEST(test_f1_set_bandwidth_changes_decision)
{
    kvp_kv_config_t cfg = faster_cfg(F1_SLOW);
    fx_t f;
    fx_open_cfg(&f, &cfg);
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 64, 0, false); /* the config's slow link */
    ASSERT_OK(kvp_kv_sched_set_load_bandwidth(f.s, F1_FAST));
    lookup(&f, &r, 0, 64, 64, true); /* the measured fast one */
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.kvpool_cached_tokens, 64);
    /* the link slows down: declined, and as K4 the old LoadSpec stays */
    ASSERT_OK(kvp_kv_sched_set_load_bandwidth(f.s, F1_SLOW));
    lookup(&f, &r, 16, 80, 0, false);
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.vllm_cached_tokens, 0);
    ASSERT_EQ(ls.kvpool_cached_tokens, 64);
    stats(&f, 2, 64 + 64);
    /* bad bandwidths are refused and change nothing */
    ASSERT_EQ(kvp_kv_sched_set_load_bandwidth(f.s, -1.0), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_sched_set_load_bandwidth(f.s, NAN), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_sched_set_load_bandwidth(f.s, INFINITY), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_sched_set_load_bandwidth(NULL, F1_FAST), KVP_ERR_NULL_POINTER);
    treq_t r2;
    treq_init(&r2, "r2", 100);
    lookup(&f, &r2, 0, 64, 0, false);
    stats(&f, 3, 64 * 3);
    fx_close(&f);
}

TEST(test_f1_always_ignores_costs)
{
    /* the slowest link and the costliest bytes: ALWAYS loads every hit */
    kvp_kv_config_t cfg = faster_cfg(1.0);
    cfg.load_policy = KVP_KV_LOAD_ALWAYS;
    cfg.lookup_rtt_us = 1e12;
    fx_t f;
    fx_open_cfg(&f, &cfg);
    ASSERT_OK(kvp_kv_sched_set_load_bandwidth(f.s, 1.0));
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 16, 80, 64, true);
    kvp_kv_load_spec_t ls;
    ASSERT_OK(kvp_kv_sched_load_spec(f.s, "r1", &ls));
    ASSERT_EQ(ls.kvpool_cached_tokens, 80);
    stats(&f, 0, 0);
    fx_close(&f);
    /* and K4 is untouched: need <= 0 is (0, false) under both policies */
    cfg.load_policy = KVP_KV_LOAD_FASTER;
    fx_open_cfg(&f, &cfg);
    lookup(&f, &r, 64, 48, 0, false);
    stats(&f, 0, 0); /* K4, not a decline */
    fx_close(&f);
}

TEST(test_f1_config_validate)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    ASSERT_EQ(cfg.load_policy, KVP_KV_LOAD_ALWAYS);
    ASSERT(cfg.prefill_us_per_token == 40.0);
    ASSERT_EQ(cfg.load_bytes_per_token, 0);
    ASSERT(cfg.load_bytes_per_s == 0.0);
    ASSERT(cfg.lookup_rtt_us == 100.0);
    ASSERT_OK(kvp_kv_config_validate(&cfg));
    /* ALWAYS does not read the costs */
    cfg.prefill_us_per_token = -1;
    cfg.lookup_rtt_us = NAN;
    ASSERT_OK(kvp_kv_config_validate(&cfg));
    cfg.load_policy = (kvp_kv_load_policy_t)2;
    ASSERT_EQ(kvp_kv_config_validate(&cfg), KVP_ERR_BAD_CONFIG);
    /* FASTER does */
    const double bad_prefill[] = {0, -1, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_prefill / sizeof bad_prefill[0]; i++) {
        cfg = faster_cfg(F1_FAST);
        ASSERT_OK(kvp_kv_config_validate(&cfg));
        cfg.prefill_us_per_token = bad_prefill[i];
        ASSERT_EQ(kvp_kv_config_validate(&cfg), KVP_ERR_BAD_CONFIG);
    }
    const double bad_other[] = {-1, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad_other / sizeof bad_other[0]; i++) {
        cfg = faster_cfg(F1_FAST);
        cfg.load_bytes_per_s = bad_other[i];
        ASSERT_EQ(kvp_kv_config_validate(&cfg), KVP_ERR_BAD_CONFIG);
        cfg = faster_cfg(F1_FAST);
        cfg.lookup_rtt_us = bad_other[i];
        ASSERT_EQ(kvp_kv_config_validate(&cfg), KVP_ERR_BAD_CONFIG);
    }
    /* zeros are fine: unknown bandwidth, no round trip */
    cfg = faster_cfg(0);
    cfg.lookup_rtt_us = 0;
    ASSERT_OK(kvp_kv_config_validate(&cfg));
    /* create refuses what validate refuses */
    cfg.prefill_us_per_token = 0;
    kvp_kv_scripted_t *sc;
    ASSERT_OK(kvp_kv_scripted_create(&sc));
    kvp_kv_sched_t *s = (kvp_kv_sched_t *)&cfg;
    ASSERT_EQ(kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(sc), &s), KVP_ERR_BAD_CONFIG);
    ASSERT(s == NULL);
    kvp_kv_scripted_destroy(sc);
    /* the names */
    kvp_kv_load_policy_t p = KVP_KV_LOAD_ALWAYS;
    ASSERT_OK(kvp_kv_load_policy_parse("faster", &p));
    ASSERT_EQ(p, KVP_KV_LOAD_FASTER);
    ASSERT_OK(kvp_kv_load_policy_parse("always", &p));
    ASSERT_EQ(p, KVP_KV_LOAD_ALWAYS);
    ASSERT_EQ(kvp_kv_load_policy_parse("Faster", &p), KVP_ERR_BAD_CONFIG);
    ASSERT_EQ(kvp_kv_load_policy_parse("", &p), KVP_ERR_BAD_CONFIG);
    ASSERT_EQ(kvp_kv_load_policy_parse(NULL, &p), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(p, KVP_KV_LOAD_ALWAYS);
    ASSERT_STR_EQ(kvp_kv_load_policy_name(KVP_KV_LOAD_ALWAYS), "always");
    ASSERT_STR_EQ(kvp_kv_load_policy_name(KVP_KV_LOAD_FASTER), "faster");
    ASSERT_STR_EQ(kvp_kv_load_policy_name((kvp_kv_load_policy_t)7), "unknown");
}

#define GARBAGE 0xA5

TEST(test_f1_old_config_size_defaults_always)
{
    /* a caller of the header before F1: its struct ends where load_policy
     * begins; past it, garbage (0xA5: a bad load_policy, negative costs) */
    const size_t old = offsetof(kvp_kv_config_t, load_policy);
    kvp_kv_config_t c;
    memset(&c, GARBAGE, sizeof c);
    kvp_kv_config_init_size(&c, old);
    ASSERT_EQ(c.size, old);
    const unsigned char *bytes = (const unsigned char *)&c;
    for (size_t i = old; i < sizeof c; i++)
        ASSERT_EQ(bytes[i], GARBAGE); /* init stayed inside the old struct */
    ASSERT_OK(kvp_kv_config_validate(&c));
    fx_t f;
    fx_open_cfg(&f, &c);
    ASSERT_OK(kvp_kv_sched_set_load_bandwidth(f.s, 1.0));
    treq_t r;
    treq_init(&r, "r1", 100);
    lookup(&f, &r, 0, 64, 64, true); /* ALWAYS */
    stats(&f, 0, 0);
    fx_close(&f);
    /* the control: read as a current caller's, the garbage is refused */
    c.size = sizeof c;
    ASSERT_EQ(kvp_kv_config_validate(&c), KVP_ERR_BAD_CONFIG);

    /* a caller whose struct stops after load_policy: FASTER, and the
     * library's default costs (the garbage past it would be refused) */
    const size_t mid = offsetof(kvp_kv_config_t, prefill_us_per_token);
    memset(&c, GARBAGE, sizeof c);
    kvp_kv_config_init_size(&c, mid);
    ASSERT_EQ(c.load_policy, KVP_KV_LOAD_ALWAYS);
    c.load_policy = KVP_KV_LOAD_FASTER;
    ASSERT_OK(kvp_kv_config_validate(&c));
    c.size = sizeof c;
    ASSERT_EQ(kvp_kv_config_validate(&c), KVP_ERR_BAD_CONFIG);
}

TEST_LIST(T(test_f1_faster_declines_slow_load), T(test_f1_faster_accepts_fast_load),
          T(test_f1_small_hit_rtt_dominates), T(test_f1_tie_recomputes),
          T(test_f1_unknown_bandwidth_loads), T(test_f1_set_bandwidth_changes_decision),
          T(test_f1_always_ignores_costs), T(test_f1_config_validate),
          T(test_f1_old_config_size_defaults_always))
