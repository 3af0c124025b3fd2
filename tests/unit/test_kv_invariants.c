/*
 * The KV scheduler under a randomized drive: a small vLLM-like engine loop
 * (arrivals, lookups, async and sync loads, chunked prefill, decode,
 * preemption and resume, aborts, finishes) calling the hooks in vLLM's order,
 * checking after every step:
 *   - a meta never both loads and saves;
 *   - saved counts never go backwards except through preemption;
 *   - every finished request's state is gone;
 *   - every meta survives a msgpack round trip unchanged;
 * and at the end that every byte allocated through the shim is freed (the
 * ASan build also checks for leaks).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kvpool/kv_connector.h"
#include "support/kv_scripted.h"
#include "test.h"

#define BS 16
#define MAXR 96

typedef enum { W_NEW, W_LOADING, RUN, W_RESUME, DONE } st_t;

typedef struct {
    kvp_kv_request_t v;
    char id[16];
    int64_t *toks;
    size_t cap;
    int64_t prompt;
    int64_t nc;      /* computed tokens */
    int64_t out_left;
    st_t st;
    int64_t *blocks;
    size_t nblocks, bcap;
    int64_t prev_saved;
    int load_wait;
    bool live;
} rq_t;

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

static void push_tok(rq_t *r, int64_t t)
{
    if (r->v.num_all_token_ids == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 64;
        r->toks = realloc(r->toks, r->cap * sizeof *r->toks);
        ASSERT(r->toks);
    }
    r->toks[r->v.num_all_token_ids++] = t;
    r->v.all_token_ids = r->toks;
    r->v.num_tokens = (int64_t)r->v.num_all_token_ids;
    r->v.num_block_hashes = r->v.num_all_token_ids / BS;
}

static int64_t g_next_block = 1;
/* Grows r's blocks to cover n tokens; returns how many were added. */
static size_t grow_blocks(rq_t *r, int64_t n)
{
    size_t need = (size_t)((n + BS - 1) / BS), added = 0;
    while (r->nblocks < need) {
        if (r->nblocks == r->bcap) {
            r->bcap = r->bcap ? r->bcap * 2 : 16;
            r->blocks = realloc(r->blocks, r->bcap * sizeof *r->blocks);
            ASSERT(r->blocks);
        }
        r->blocks[r->nblocks++] = g_next_block++;
        added++;
    }
    return added;
}

static void check_roundtrip(const kvp_kv_meta_t *m)
{
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(m, &buf, &len));
    kvp_kv_meta_t *d;
    ASSERT_OK(kvp_kv_meta_decode(buf, len, &d));
    ASSERT(kvp_kv_meta_equal(m, d));
    kvp_kv_meta_free(d);
    kvp_kv_meta_buf_free(buf, len);
}

static void drive_cfg(kvp_kv_role_t role, bool load_async, bool lookup_async, int steps, uint64_t seed,
                      bool fix_k12)
{
    g_rng = seed * 2654435761u + 1;
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_kv_scripted_t *sc;
    kvp_kv_sched_t *s;
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.kv_role = role;
    cfg.load_async = load_async;
    cfg.lookup_async = lookup_async;
    cfg.fix_k12_save_without_new_blocks = fix_k12;
    ASSERT_OK(kvp_kv_scripted_create(&sc));
    ASSERT_OK(kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(sc), &s));
    static rq_t rq[MAXR];
    memset(rq, 0, sizeof rq);
    int nreq = 0;
    const char *finished[MAXR], *preempted[MAXR];
    size_t nfin = 0;
    kvp_kv_new_req_t news[MAXR];
    kvp_kv_cached_req_t cached[MAXR];
    kvp_kv_ids_t gviews[2 * MAXR];
    size_t metas = 0, saves = 0, loads = 0;

    for (int step = 0; step < steps; step++) {
        /* arrivals */
        if (nreq < MAXR && rnd() % 3 == 0) {
            rq_t *r = &rq[nreq++];
            snprintf(r->id, sizeof r->id, "r%d", nreq);
            r->v.req_id = r->id;
            r->prompt = rnd_in(1, 300);
            for (int64_t i = 0; i < r->prompt; i++)
                push_tok(r, rnd_in(1, 50000));
            r->out_left = rnd_in(1, 20);
            r->st = W_NEW;
            r->live = true;
        }
        /* aborts and finishes announced at the end of the previous step */
        size_t nnew = 0, ncached = 0, ngv = 0, npre = 0;
        /* preemption of one running request */
        if (rnd() % 9 == 0) {
            for (int i = 0; i < nreq; i++)
                if (rq[i].live && rq[i].st == RUN) {
                    rq[i].st = W_RESUME;
                    rq[i].nc = 0;
                    rq[i].nblocks = 0;
                    rq[i].prev_saved = 0;
                    rq[i].v.num_computed_tokens = 0;
                    preempted[npre++] = rq[i].id;
                    break;
                }
        }
        int budget = 512;
        /* running requests */
        for (int i = 0; i < nreq && budget > 0; i++) {
            rq_t *r = &rq[i];
            if (!r->live || r->st != RUN)
                continue;
            bool in_pre = false;
            for (size_t k = 0; k < npre; k++)
                in_pre |= preempted[k] == r->id;
            if (in_pre)
                continue;
            int64_t total = (int64_t)r->v.num_all_token_ids;
            int64_t n = r->nc < r->prompt ? (total - r->nc < budget ? total - r->nc : budget) : 1;
            size_t before = r->nblocks;
            size_t added = grow_blocks(r, r->nc + n);
            kvp_kv_cached_req_t *c = &cached[ncached++];
            memset(c, 0, sizeof *c);
            c->req_id = r->id;
            c->num_computed_tokens = r->nc;
            c->num_scheduled_tokens = n;
            if (added) {
                gviews[ngv] = (kvp_kv_ids_t){r->blocks + before, added};
                c->new_block_ids = (kvp_kv_blocks_t){&gviews[ngv++], 1};
            }
            budget -= (int)n;
        }
        /* waiting requests */
        for (int i = 0; i < nreq && budget > 0 && npre == 0; i++) {
            rq_t *r = &rq[i];
            if (!r->live)
                continue;
            if (r->st == W_LOADING) {
                if (--r->load_wait > 0)
                    continue;
                /* load done: schedule with the loaded prefix, no new lookup */
                kvp_kv_blocks_t b = {&(kvp_kv_ids_t){r->blocks, r->nblocks}, 1};
                ASSERT_OK(kvp_kv_sched_update_state_after_alloc(s, &r->v, &b, 0));
            } else if (r->st == W_NEW) {
                int64_t hit = rnd() % 2 ? (rnd_in(0, r->prompt - 1) / BS) * BS : 0;
                kvp_kv_scripted_set_lookup(sc, hit, lookup_async && rnd() % 3 == 0);
                int64_t ext;
                bool la;
                ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &r->v, 0, &ext, &la));
                if (ext < 0)
                    continue; /* ask again next step */
                grow_blocks(r, ext > 0 ? ext : 0);
                grow_blocks(r, 1);
                kvp_kv_blocks_t b = {&(kvp_kv_ids_t){r->blocks, r->nblocks}, 1};
                ASSERT_OK(kvp_kv_sched_update_state_after_alloc(s, &r->v, &b, ext));
                if (ext > 0 && la) {
                    r->st = W_LOADING;
                    r->load_wait = (int)rnd_in(1, 3);
                    r->nc = ext;
                    r->v.num_computed_tokens = ext;
                    continue;
                }
                r->nc = ext;
                r->v.num_computed_tokens = ext;
            } else if (r->st == W_RESUME) {
                kvp_kv_blocks_t b = {NULL, 0};
                ASSERT_OK(kvp_kv_sched_update_state_after_alloc(s, &r->v, &b, 0));
            } else {
                continue;
            }
            int64_t total = (int64_t)r->v.num_all_token_ids;
            int64_t n = total - r->nc < budget ? total - r->nc : budget;
            if (n <= 0)
                n = 1;
            grow_blocks(r, r->nc + n);
            gviews[ngv] = (kvp_kv_ids_t){r->blocks, r->nblocks};
            if (r->st == W_RESUME) {
                kvp_kv_cached_req_t *c = &cached[ncached++];
                memset(c, 0, sizeof *c);
                c->req_id = r->id;
                c->num_computed_tokens = r->nc;
                c->num_scheduled_tokens = n;
                c->new_block_ids = (kvp_kv_blocks_t){&gviews[ngv++], 1};
                c->resumed = true;
            } else {
                kvp_kv_new_req_t *x = &news[nnew++];
                memset(x, 0, sizeof *x);
                x->req_id = r->id;
                x->num_computed_tokens = r->nc;
                x->num_scheduled_tokens = n;
                x->block_ids = (kvp_kv_blocks_t){&gviews[ngv++], 1};
                x->prompt_token_ids = r->toks;
                x->num_prompt_token_ids = (size_t)r->prompt;
            }
            r->st = RUN;
            budget -= (int)n;
        }
        kvp_kv_sched_output_t so = {finished, nfin, preempted, npre, news, nnew, cached, ncached, NULL, 0};
        const kvp_kv_meta_t *m;
        ASSERT_OK(kvp_kv_sched_build_connector_meta(s, &so, &m));
        /* invariants */
        for (size_t i = 0; i < m->num_requests; i++) {
            const kvp_kv_req_meta_t *q = &m->requests[i];
            ASSERT_MSG(!(q->can_save && q->has_load_spec), "meta for %s loads and saves", q->req_id);
            ASSERT_EQ(q->token_len_chunk % BS, 0);
            if (role == KVP_KV_ROLE_CONSUMER)
                ASSERT(!q->can_save);
            saves += q->can_save;
            loads += q->has_load_spec;
        }
        metas += m->num_requests;
        check_roundtrip(m);
        for (size_t i = 0; i < nfin; i++) {
            ASSERT_EQ(kvp_kv_sched_membership(s, finished[i]), 0);
            kvp_kv_tracker_info_t ti;
            kvp_kv_load_spec_t ls;
            ASSERT_EQ(kvp_kv_sched_tracker(s, finished[i], &ti), KVP_ERR_NOT_FOUND);
            ASSERT_EQ(kvp_kv_sched_load_spec(s, finished[i], &ls), KVP_ERR_NOT_FOUND);
        }
        for (int i = 0; i < nreq; i++) {
            kvp_kv_tracker_info_t ti;
            if (!rq[i].live || kvp_kv_sched_tracker(s, rq[i].id, &ti) != KVP_OK)
                continue;
            ASSERT_MSG(ti.num_saved_tokens >= rq[i].prev_saved, "%s saved %lld < %lld", rq[i].id,
                       (long long)ti.num_saved_tokens, (long long)rq[i].prev_saved);
            rq[i].prev_saved = ti.num_saved_tokens;
        }
        /* the step runs: computed tokens advance, outputs are sampled */
        nfin = 0;
        for (size_t i = 0; i < ncached; i++) {
            for (int k = 0; k < nreq; k++)
                if (rq[k].id == cached[i].req_id) {
                    rq[k].nc += cached[i].num_scheduled_tokens;
                    break;
                }
        }
        for (size_t i = 0; i < nnew; i++)
            for (int k = 0; k < nreq; k++)
                if (rq[k].id == news[i].req_id) {
                    rq[k].nc += news[i].num_scheduled_tokens;
                    break;
                }
        for (int i = 0; i < nreq; i++) {
            rq_t *r = &rq[i];
            if (!r->live)
                continue;
            bool abort_now = rnd() % 97 == 0 || step == steps - 1;
            if (r->st == RUN && r->nc >= (int64_t)r->v.num_all_token_ids) {
                push_tok(r, rnd_in(1, 50000));
                if (--r->out_left <= 0)
                    abort_now = true;
            }
            r->v.num_computed_tokens = r->nc;
            if (abort_now) {
                bool delay;
                kvp_kv_blocks_t b = {&(kvp_kv_ids_t){r->blocks, r->nblocks}, 1};
                ASSERT_OK(kvp_kv_sched_request_finished(s, r->id, &b, &delay));
                if (role == KVP_KV_ROLE_CONSUMER)
                    ASSERT(!delay);
                r->live = false;
                r->st = DONE;
                finished[nfin++] = r->id;
            }
        }
    }
    /* the last finishes reach the scheduler */
    kvp_kv_sched_output_t so = {finished, nfin, NULL, 0, NULL, 0, NULL, 0, NULL, 0};
    const kvp_kv_meta_t *m;
    ASSERT_OK(kvp_kv_sched_build_connector_meta(s, &so, &m));
    kvp_kv_sched_stats_t st;
    kvp_kv_sched_stats(s, &st);
    ASSERT_EQ(st.num_load_specs, 0);
    ASSERT_EQ(st.num_trackers, 0);
    ASSERT_EQ(st.num_unfinished, 0);
    ASSERT_EQ(st.num_unfinished_ids, 0);
    ASSERT_GT(metas, 0);
    if (role != KVP_KV_ROLE_CONSUMER)
        ASSERT_GT(saves, 0);
    if (getenv("KVP_TEST_VERBOSE"))
        printf("role %d: %zu metas, %zu saves, %zu loads, %d requests\n", (int)role, metas, saves, loads, nreq);
    kvp_kv_sched_destroy(s);
    kvp_kv_scripted_destroy(sc);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
    for (int i = 0; i < nreq; i++) {
        free(rq[i].toks);
        free(rq[i].blocks);
    }
}

static void drive(kvp_kv_role_t role, bool load_async, bool lookup_async, int steps, uint64_t seed)
{
    drive_cfg(role, load_async, lookup_async, steps, seed, false);
}

TEST(test_invariants_random_drive_k12_fix_switch)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        drive_cfg(KVP_KV_ROLE_BOTH, seed % 2, true, 150, seed, true);
}

TEST(test_invariants_random_drive_both)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        drive(KVP_KV_ROLE_BOTH, true, false, 150, seed);
}

TEST(test_invariants_random_drive_both_sync_lookup_async)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        drive(KVP_KV_ROLE_BOTH, false, true, 150, seed);
}

TEST(test_invariants_random_drive_producer)
{
    for (uint64_t seed = 7; seed <= 10; seed++)
        drive(KVP_KV_ROLE_PRODUCER, true, true, 150, seed);
}

TEST(test_invariants_random_drive_consumer)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        drive(KVP_KV_ROLE_CONSUMER, seed % 2, false, 150, seed);
}

TEST(test_invariants_no_leak_on_destroy_mid_stream)
{
    /* destroy with live state: everything is released */
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_kv_scripted_t *sc;
    kvp_kv_sched_t *s;
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    ASSERT_OK(kvp_kv_scripted_create(&sc));
    ASSERT_OK(kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(sc), &s));
    static rq_t r[8];
    memset(r, 0, sizeof r);
    kvp_kv_new_req_t news[8];
    for (int i = 0; i < 8; i++) {
        snprintf(r[i].id, sizeof r[i].id, "q%d", i);
        r[i].v.req_id = r[i].id;
        for (int k = 0; k < 70; k++)
            push_tok(&r[i], k);
        kvp_kv_scripted_set_lookup(sc, 32, false);
        int64_t n;
        bool la;
        ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &r[i].v, 0, &n, &la));
        grow_blocks(&r[i], 70);
        kvp_kv_blocks_t b = {&(kvp_kv_ids_t){r[i].blocks, r[i].nblocks}, 1};
        ASSERT_OK(kvp_kv_sched_update_state_after_alloc(s, &r[i].v, &b, i % 2 ? 32 : 0));
        memset(&news[i], 0, sizeof news[i]);
        news[i].req_id = r[i].id;
        news[i].num_computed_tokens = 0;
        news[i].num_scheduled_tokens = 40;
        news[i].block_ids = b;
        news[i].prompt_token_ids = r[i].toks;
        news[i].num_prompt_token_ids = 70;
    }
    kvp_kv_sched_output_t so = {NULL, 0, NULL, 0, news, 4, NULL, 0, NULL, 0};
    const kvp_kv_meta_t *m;
    ASSERT_OK(kvp_kv_sched_build_connector_meta(s, &so, &m));
    ASSERT_GT(m->num_requests, 0);
    kvp_kv_sched_destroy(s);
    kvp_kv_scripted_destroy(sc);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
    for (int i = 0; i < 8; i++) {
        free(r[i].toks);
        free(r[i].blocks);
    }
}

TEST(test_invariants_out_of_memory_never_aborts)
{
    /* every allocation point fails once: each call returns a status, and
     * destroy still frees everything */
    for (long fail_at = 0; fail_at < 60; fail_at++) {
        uint64_t base = kvp__alloc_bytes_in_use();
        kvp_kv_scripted_t *sc = NULL;
        kvp_kv_sched_t *s = NULL;
        kvp_kv_config_t cfg;
        kvp_kv_config_init(&cfg);
        ASSERT_OK(kvp_kv_scripted_create(&sc));
        kvp__alloc_fail_after(fail_at);
        if (kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(sc), &s) != KVP_OK) {
            kvp__alloc_fail_reset();
            kvp_kv_scripted_destroy(sc);
            ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
            continue;
        }
        static rq_t r[4];
        memset(r, 0, sizeof r);
        for (int i = 0; i < 4; i++) {
            snprintf(r[i].id, sizeof r[i].id, "o%d", i);
            r[i].v.req_id = r[i].id;
            for (int k = 0; k < 50; k++)
                push_tok(&r[i], k);
            grow_blocks(&r[i], 50);
            kvp_kv_scripted_set_lookup(sc, 32, false);
            int64_t n;
            bool la;
            (void)kvp_kv_sched_get_num_new_matched_tokens(s, &r[i].v, 0, &n, &la);
            kvp_kv_blocks_t b = {&(kvp_kv_ids_t){r[i].blocks, r[i].nblocks}, 1};
            (void)kvp_kv_sched_update_state_after_alloc(s, &r[i].v, &b, 32);
        }
        kvp_kv_new_req_t nr = {"o0", 32, 18, {&(kvp_kv_ids_t){r[0].blocks, r[0].nblocks}, 1},
                               r[0].toks, 50, NULL, 0, false};
        kvp_kv_sched_output_t so = {NULL, 0, NULL, 0, &nr, 1, NULL, 0, NULL, 0};
        const kvp_kv_meta_t *m;
        (void)kvp_kv_sched_build_connector_meta(s, &so, &m);
        kvp__alloc_fail_reset();
        kvp_kv_sched_destroy(s);
        kvp_kv_scripted_destroy(sc);
        ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
        for (int i = 0; i < 4; i++) {
            free(r[i].toks);
            free(r[i].blocks);
        }
    }
}

TEST_LIST(T(test_invariants_random_drive_both), T(test_invariants_random_drive_k12_fix_switch), T(test_invariants_random_drive_both_sync_lookup_async),
          T(test_invariants_random_drive_producer), T(test_invariants_random_drive_consumer),
          T(test_invariants_no_leak_on_destroy_mid_stream), T(test_invariants_out_of_memory_never_aborts))
