/*
 * Fixture of the scheduler tests (test_kv_sched*.c): request views with
 * their own tokens, a scheduler over the scripted lookup client
 * (support/kv_scripted.h), one-group block lists, step outputs of one new or
 * cached request, and a lookup that checks get_num_new_matched_tokens'
 * answer.  Defaults as in §5: bs = hash_bs = 16, one group, kv_both,
 * load_async, synchronous lookups.
 */
#ifndef KVP_TEST_KV_SCHED_FIXTURE_H
#define KVP_TEST_KV_SCHED_FIXTURE_H

#include <stdint.h>
#include <string.h>

#include "kvpool/kv_connector.h"
#include "support/kv_scripted.h"
#include "test.h"

typedef struct {
    kvp_kv_request_t v;
    int64_t toks[1024];
} treq_t;

static inline void treq_init(treq_t *r, const char *id, int64_t ntok)
{
    memset(r, 0, sizeof *r);
    for (int64_t i = 0; i < ntok; i++)
        r->toks[i] = 1000 + i;
    r->v.req_id = id;
    r->v.num_tokens = ntok;
    r->v.all_token_ids = r->toks;
    r->v.num_all_token_ids = (size_t)ntok;
    r->v.num_block_hashes = (size_t)ntok / 16;
}

/* Decode step: one more token. */
static inline void treq_append(treq_t *r, int64_t tok)
{
    r->toks[r->v.num_all_token_ids++] = tok;
    r->v.num_tokens++;
}

typedef struct {
    kvp_kv_scripted_t *sc;
    kvp_kv_sched_t *s;
} fx_t;

static inline void fx_open_cfg(fx_t *f, const kvp_kv_config_t *cfg)
{
    ASSERT_OK(kvp_kv_scripted_create(&f->sc));
    ASSERT_OK(kvp_kv_sched_create(cfg, kvp_kv_scripted_client(f->sc), &f->s));
}

static inline void fx_open(fx_t *f, kvp_kv_role_t role)
{
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.kv_role = role;
    fx_open_cfg(f, &cfg);
}

static inline void fx_close(fx_t *f)
{
    kvp_kv_sched_destroy(f->s);
    kvp_kv_scripted_destroy(f->sc);
}

static inline size_t nlookups(fx_t *f)
{
    const kvp_kv_lookup_call_t *c;
    return kvp_kv_scripted_lookups(f->sc, &c);
}

/* A one-group block list. */
typedef struct {
    kvp_kv_ids_t g;
    kvp_kv_blocks_t b;
    int64_t ids[64];
} tblocks_t;

static inline const kvp_kv_blocks_t *blocks(tblocks_t *t, int64_t first, size_t n)
{
    for (size_t i = 0; i < n; i++)
        t->ids[i] = first + (int64_t)i;
    t->g = (kvp_kv_ids_t){t->ids, n};
    t->b = (kvp_kv_blocks_t){&t->g, 1};
    return &t->b;
}

static inline kvp_kv_new_req_t new_req(const treq_t *r, int64_t nc, int64_t sched, const kvp_kv_blocks_t *b)
{
    kvp_kv_new_req_t n;
    memset(&n, 0, sizeof n);
    n.req_id = r->v.req_id;
    n.num_computed_tokens = nc;
    n.num_scheduled_tokens = sched;
    n.block_ids = *b;
    n.prompt_token_ids = r->toks;
    n.num_prompt_token_ids = r->v.num_all_token_ids;
    return n;
}

static inline kvp_kv_cached_req_t cached(const treq_t *r, int64_t nc, int64_t sched, const kvp_kv_blocks_t *b)
{
    kvp_kv_cached_req_t c;
    memset(&c, 0, sizeof c);
    c.req_id = r->v.req_id;
    c.num_computed_tokens = nc;
    c.num_scheduled_tokens = sched;
    if (b)
        c.new_block_ids = *b;
    return c;
}

static inline const kvp_kv_meta_t *build(fx_t *f, const kvp_kv_sched_output_t *so)
{
    const kvp_kv_meta_t *m = NULL;
    ASSERT_OK(kvp_kv_sched_build_connector_meta(f->s, so, &m));
    ASSERT(m != NULL);
    return m;
}

static inline const kvp_kv_meta_t *build_new(fx_t *f, const kvp_kv_new_req_t *n)
{
    kvp_kv_sched_output_t so = {0};
    so.new_reqs = n;
    so.num_new_reqs = 1;
    return build(f, &so);
}

static inline const kvp_kv_meta_t *build_cached(fx_t *f, const kvp_kv_cached_req_t *c)
{
    kvp_kv_sched_output_t so = {0};
    so.cached_reqs = c;
    so.num_cached_reqs = 1;
    return build(f, &so);
}

static inline void lookup(fx_t *f, treq_t *r, int64_t nc, int64_t hit, int64_t want_n, bool want_async)
{
    int64_t n;
    bool la;
    kvp_kv_scripted_set_lookup(f->sc, hit, false);
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(f->s, &r->v, nc, &n, &la));
    ASSERT_EQ(n, want_n);
    ASSERT_EQ(la, want_async);
}

static inline bool in_ids(const char *const *ids, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0)
            return true;
    return false;
}

#endif
