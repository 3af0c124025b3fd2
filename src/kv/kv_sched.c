/*
 * The KV connector's scheduler hooks (connectors-spec §2.6, K1–K18): the
 * decisions of the original MooncakeStoreScheduler, in its order.
 *
 * Failing like the original.  Where the original raises part-way through a
 * hook (an assert, a dict lookup, RequestTracker.update), the code below does
 * its steps in the same order, so the state changes made before the failing
 * check stay exactly as the original leaves them (a LoadSpec popped, earlier
 * trackers created, num_saved_tokens advanced for metas already built).  The
 * check then logs one line, records which exception the original raises
 * (kvp_kv_sched_last_error) and returns an error status.  No input aborts.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kv/kv_config.h"
#include "kv/kv_sched_int.h"

/* ---- errors ------------------------------------------------------------- */

const char *kvp_kv_err_kind_name(kvp_kv_err_kind_t kind)
{
    switch (kind) {
    case KVP_KV_ERR_NONE: return "";
    case KVP_KV_ERR_ASSERTION: return "AssertionError";
    case KVP_KV_ERR_KEY: return "KeyError";
    case KVP_KV_ERR_VALUE: return "ValueError";
    case KVP_KV_ERR_TYPE: return "TypeError";
    case KVP_KV_ERR_OTHER: return "Error";
    }
    return "Error";
}

__attribute__((format(printf, 4, 5))) static kvp_status_t fail(kvp_kv_sched_t *s, kvp_status_t st,
                                                               kvp_kv_err_kind_t kind,
                                                               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err_msg, sizeof s->err_msg, fmt, ap);
    va_end(ap);
    s->err_kind = kind;
    kvp_warn("kv scheduler: %s (%s)", s->err_msg, kvp_kv_err_kind_name(kind));
    return st;
}

static kvp_status_t oom(kvp_kv_sched_t *s)
{
    return fail(s, KVP_ERR_NO_MEMORY, KVP_KV_ERR_OTHER, "out of memory");
}

kvp_kv_err_kind_t kvp_kv_sched_last_error(const kvp_kv_sched_t *s, const char **msg_p)
{
    if (msg_p)
        *msg_p = s->err_msg;
    return s->err_kind;
}

/* ---- records ------------------------------------------------------------ */

static kvp__kv_rec_t *rec_get(const kvp_kv_sched_t *s, const char *id)
{
    size_t len = strlen(id);
    return kvp__strmap_get_h(&s->map, id, len, kvp__strmap_hash(id, len));
}

static kvp__kv_rec_t *rec_get_or_add(kvp_kv_sched_t *s, const char *id)
{
    size_t len = strlen(id);
    uint64_t h = kvp__strmap_hash(id, len);
    kvp__kv_rec_t *r = kvp__strmap_get_h(&s->map, id, len, h);
    if (r)
        return r;
    r = kvp__calloc(1, sizeof *r + len + 1);
    if (!r)
        return NULL;
    r->hash = h;
    r->uid_idx = SIZE_MAX;
    kvp__list_init(&r->ulink);
    r->id_len = len;
    memcpy(r->id, id, len + 1);
    if (kvp__strmap_put_h(&s->map, r->id, len, h, r) != KVP_OK) {
        kvp__free(r, sizeof *r + len + 1);
        return NULL;
    }
    return r;
}

/* Frees a record that belongs to none of the four containers. */
static void rec_maybe_free(kvp_kv_sched_t *s, kvp__kv_rec_t *r)
{
    if (!r || r->has_ls || r->has_tracker || r->in_unf || r->uid_idx != SIZE_MAX)
        return;
    kvp__strmap_del_h(&s->map, r->id, r->id_len, r->hash);
    kvp__free(r, sizeof *r + r->id_len + 1);
}

static void ls_pop(kvp_kv_sched_t *s, kvp__kv_rec_t *r, bool *had_p, kvp_kv_load_spec_t *ls_p)
{
    *had_p = r && r->has_ls;
    if (*had_p) {
        *ls_p = r->ls;
        r->has_ls = false;
        s->num_ls--;
    }
}

static void tracker_drop(kvp_kv_sched_t *s, kvp__kv_rec_t *r)
{
    if (!r->has_tracker)
        return;
    kvp__kv_tracker_clear(&r->tr);
    r->has_tracker = false;
    s->num_trackers--;
}

/* Replaces r's tracker (the original assigns a new RequestTracker). Takes
 * the references passed in. */
static void tracker_set(kvp_kv_sched_t *s, kvp__kv_rec_t *r, int64_t token_len,
                        kvp__kv_btuple_t *blocks, kvp__kv_tokens_t *token_ids, int64_t prefill_end)
{
    tracker_drop(s, r);
    r->tr.token_len = token_len;
    r->tr.blocks = blocks;
    r->tr.num_saved_tokens = 0;
    r->tr.token_ids = token_ids;
    r->tr.has_pending_offload = false;
    r->tr.prefill_end_tokens = prefill_end;
    r->has_tracker = true;
    s->num_trackers++;
}

static void unf_remove(kvp_kv_sched_t *s, kvp__kv_rec_t *r)
{
    if (!r->in_unf)
        return;
    kvp__list_del(&r->ulink);
    kvp__kv_btuple_unref(r->ublocks);
    r->ublocks = NULL;
    r->req = NULL;
    r->in_unf = false;
    s->num_unf--;
}

static kvp_status_t uid_add(kvp_kv_sched_t *s, kvp__kv_rec_t *r)
{
    if (r->uid_idx != SIZE_MAX)
        return KVP_OK;
    void *p = kvp__grow(s->uids, &s->uids_cap, s->num_uids + 1, sizeof *s->uids, 64);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    s->uids = p;
    r->uid_idx = s->num_uids;
    s->uids[s->num_uids++] = r;
    return KVP_OK;
}

static void uid_remove(kvp_kv_sched_t *s, kvp__kv_rec_t *r)
{
    if (r->uid_idx == SIZE_MAX)
        return;
    kvp__kv_rec_t *last = s->uids[--s->num_uids];
    s->uids[r->uid_idx] = last;
    last->uid_idx = r->uid_idx;
    r->uid_idx = SIZE_MAX;
}

/* ---- lifecycle ---------------------------------------------------------- */

static char *dup_or_empty(const char *s)
{
    return kvp__strdup(s ? s : "");
}

kvp_status_t kvp_kv_sched_create(const kvp_kv_config_t *cfg, kvp_kv_lookup_client_t client,
                                 kvp_kv_sched_t **sched_p)
{
    if (!cfg || !sched_p || !client.ops || !client.ops->lookup || !client.ops->discard ||
        !client.ops->reset)
        return KVP_ERR_NULL_POINTER;
    *sched_p = NULL;
    kvp_kv_config_t c; /* the caller's config, whatever header it was built with */
    kvp_status_t st = kvp__kv_config_adopt(cfg, &c);
    if (st == KVP_OK)
        st = kvp_kv_config_validate(&c);
    if (st != KVP_OK)
        return st;
    cfg = &c;
    kvp_kv_sched_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    s->cfg = *cfg;
    s->model_name = dup_or_empty(cfg->model_name);
    s->cache_prefix = dup_or_empty(cfg->cache_prefix);
    if (!s->model_name || !s->cache_prefix) {
        kvp_kv_sched_destroy(s);
        return KVP_ERR_NO_MEMORY;
    }
    s->cfg.model_name = s->model_name;
    s->cfg.cache_prefix = s->cache_prefix;
    s->client = client;
    s->align = cfg->partial_hits ? cfg->hash_block_size : cfg->block_size;
    s->load_bw = cfg->load_bytes_per_s;
    kvp__strmap_init(&s->map);
    kvp__list_init(&s->unf);
    *sched_p = s;
    return KVP_OK;
}

void kvp_kv_sched_destroy(kvp_kv_sched_t *s)
{
    if (!s)
        return;
    kvp__kv_metabuf_cleanup(&s->mb);
    for (size_t i = 0; i < s->map.cap; i++) {
        kvp__kv_rec_t *r = s->map.slots[i].val;
        if (!s->map.slots[i].key || !r)
            continue;
        if (r->has_tracker)
            kvp__kv_tracker_clear(&r->tr);
        kvp__kv_btuple_unref(r->ublocks);
        kvp__free(r, sizeof *r + r->id_len + 1);
    }
    kvp__strmap_cleanup(&s->map);
    if (s->uids)
        kvp__free(s->uids, s->uids_cap * sizeof *s->uids);
    if (s->tail_used)
        kvp__free(s->tail_used, s->tail_used_cap);
    if (s->model_name)
        kvp__free(s->model_name, strlen(s->model_name) + 1);
    if (s->cache_prefix)
        kvp__free(s->cache_prefix, strlen(s->cache_prefix) + 1);
    kvp__free(s, sizeof *s);
}

/* ---- K1–K5: get_num_new_matched_tokens ---------------------------------- */

/*
 * F1, load or recompute (load_policy faster; not in the original).
 *
 * A pool hit of `need` tokens beyond what the engine already has can be
 * loaded or recomputed.  Loading k of them (the first k: a load extends the
 * engine's prefix, it cannot skip a part) costs, in this model,
 *     load(k) = rtt + k * b / B        (k > 0; load(0) = 0)
 * with rtt the lookup round trip (lookup_rtt_us), b the bytes of one token
 * (load_bytes_per_token, every rank and layer the load moves) and B the
 * bandwidth the worker measured recently (kvp_kv_sched_set_load_bandwidth,
 * else the config's load_bytes_per_s), and recomputing the other need - k
 * costs (need - k) * p, p = prefill_us_per_token.  The time to the first
 * token of this request is then, for k > 0,
 *     T(k) = rtt + need * p + k * (b / B - p),   T(0) = need * p,
 * linear in k past the round trip: its minimum over 0..need is at an end.
 * If b / B >= p no k > 0 beats T(0); otherwise T(need) = rtt + need * b / B
 * is the least of the k > 0, to be compared with T(0) = need * p.  So "the
 * part of the prefix worth loading" is all of it or none, and the rule is:
 *     load the whole hit iff rtt + need * b / B < need * p.
 * A tie recomputes: the same predicted time, and the link and the pool, which
 * other instances share, are left to them.  The all-or-nothing answer also
 * keeps K7's contract: a load answers exactly need = kvpool_cached -
 * vllm_cached, the LoadSpec's two ends.
 *
 * rtt stands for the load's fixed cost (the replay models an I/O as its
 * bytes over the link plus one lookup round trip): it is what makes a small
 * hit not worth loading.  When b or B is unknown (0) there is nothing to
 * predict with, and the hit is loaded, as ALWAYS.  Prefill in a real engine
 * costs more per token deeper in the context (attention), so a linear p
 * undercounts recomputing a long prefix: if the model is wrong there, it
 * errs towards recomputing.
 *
 * A declined hit is answered as K4's need <= 0: (0, false), no LoadSpec
 * written and an old one not cleared, and is counted (loads_declined,
 * tokens_declined).  ALWAYS never reaches here: its decisions stay exactly
 * the original's.
 */
static bool f1_recompute_is_faster(const kvp_kv_sched_t *s, int64_t need)
{
    double b = (double)s->cfg.load_bytes_per_token, bw = s->load_bw;
    if (b <= 0 || bw <= 0)
        return false; /* unknown: load */
    double load_us = s->cfg.lookup_rtt_us + (double)need * b / bw * 1e6;
    double recompute_us = (double)need * s->cfg.prefill_us_per_token;
    return load_us >= recompute_us;
}

kvp_status_t kvp_kv_sched_set_load_bandwidth(kvp_kv_sched_t *s, double bytes_per_s)
{
    if (!s)
        return KVP_ERR_NULL_POINTER;
    if (!isfinite(bytes_per_s) || bytes_per_s < 0)
        return KVP_ERR_INVALID_ARG;
    s->load_bw = bytes_per_s;
    return KVP_OK;
}

kvp_status_t kvp_kv_sched_get_num_new_matched_tokens(kvp_kv_sched_t *s, const kvp_kv_request_t *req,
                                                     int64_t num_computed, int64_t *num_p,
                                                     bool *load_async_p)
{
    if (!s || !req || !req->req_id || !num_p || !load_async_p)
        return KVP_ERR_NULL_POINTER;
    s->err_kind = KVP_KV_ERR_NONE;
    *num_p = 0;
    *load_async_p = false;
    if (!s->cfg.enable_lookup) /* K1 */
        return KVP_OK;
    if (req->num_tokens < s->align) /* K2 */
        return KVP_OK;
    int64_t hit = 0; /* K3 */
    kvp_status_t st = s->client.ops->lookup(s->client.ctx, req, s->cfg.lookup_async, &hit);
    if (st == KVP_INPROGRESS) {
        *num_p = -1;
        return KVP_OK;
    }
    if (st != KVP_OK) {
        /* The original client logs the RPC failure and answers 0. */
        kvp_warn("kv scheduler: lookup for %s failed: %s; treating as no hit", req->req_id,
                 kvp_status_str(st));
        hit = 0;
    }
    /* K4 */
    __int128 need = hit < num_computed ? 0 : (__int128)hit - num_computed;
    if (need <= 0)
        return KVP_OK;
    if (need > INT64_MAX)
        return fail(s, KVP_ERR_INVALID_ARG, KVP_KV_ERR_OTHER, "hit length out of range");
    /* F1 (see above): with FASTER, a load no faster than recomputing is K4's (0, false) */
    if (s->cfg.load_policy == KVP_KV_LOAD_FASTER && f1_recompute_is_faster(s, (int64_t)need)) {
        s->loads_declined++;
        s->tokens_declined += (uint64_t)need;
        return KVP_OK;
    }
    /* K5 */
    kvp__kv_rec_t *r = rec_get_or_add(s, req->req_id);
    if (!r)
        return oom(s);
    if (!r->has_ls)
        s->num_ls++;
    r->has_ls = true;
    r->ls = (kvp_kv_load_spec_t){num_computed, hit, false};
    *num_p = (int64_t)need;
    *load_async_p = s->cfg.load_async;
    return KVP_OK;
}

/* ---- K6, K7: update_state_after_alloc ------------------------------------ */

kvp_status_t kvp_kv_sched_update_state_after_alloc(kvp_kv_sched_t *s, const kvp_kv_request_t *req,
                                                   const kvp_kv_blocks_t *blocks,
                                                   int64_t num_external)
{
    if (!s || !req || !req->req_id || (!blocks && num_external > 0))
        return KVP_ERR_NULL_POINTER;
    s->err_kind = KVP_KV_ERR_NONE;
    /* K6: the stored ids are always overwritten, () when nothing external. */
    kvp__kv_btuple_t *stored = NULL;
    if (num_external > 0 && kvp__kv_btuple_copy(blocks, &stored) != KVP_OK)
        return oom(s);
    kvp__kv_rec_t *r = rec_get_or_add(s, req->req_id);
    if (!r) {
        kvp__kv_btuple_unref(stored);
        return oom(s);
    }
    if (uid_add(s, r) != KVP_OK) {
        kvp__kv_btuple_unref(stored);
        rec_maybe_free(s, r);
        return oom(s);
    }
    if (r->in_unf) {
        kvp__kv_btuple_unref(r->ublocks); /* keeps its place in the dict */
    } else {
        r->in_unf = true;
        kvp__list_add_tail(&s->unf, &r->ulink);
        s->num_unf++;
    }
    r->req = req;
    r->ublocks = stored;
    /* K7 */
    if (!r->has_ls)
        return KVP_OK;
    if (num_external == 0) {
        r->ls.can_load = false;
        return KVP_OK;
    }
    if (!(num_external > 0 &&
          (__int128)num_external == (__int128)r->ls.kvpool_cached_tokens - r->ls.vllm_cached_tokens))
        return fail(s, KVP_ERR_STATE, KVP_KV_ERR_ASSERTION,
                    "request %s: %lld external tokens but the lookup promised %lld - %lld",
                    req->req_id, (long long)num_external, (long long)r->ls.kvpool_cached_tokens,
                    (long long)r->ls.vllm_cached_tokens);
    r->ls.can_load = true;
    return KVP_OK;
}

/* ---- K8–K14: build_connector_meta ---------------------------------------- */

static int64_t slice_norm(__int128 x, int64_t len)
{
    if (x < 0)
        x += len;
    if (x < 0)
        x = 0;
    if (x > len)
        x = len;
    return (int64_t)x;
}

/* len(list[start:stop]) for a Python list of length len. */
static int64_t py_slice_len(int64_t len, __int128 start, __int128 stop)
{
    int64_t i = slice_norm(start, len), j = slice_norm(stop, len);
    return j > i ? j - i : 0;
}

/* New tracker over prefill[:n] (K11, K12 resumed). */
static kvp_status_t tracker_new_prefill(kvp_kv_sched_t *s, kvp__kv_rec_t *r, int64_t n,
                                        const kvp_kv_blocks_t *blocks, const int64_t *prefill,
                                        size_t prefill_len)
{
    kvp__kv_btuple_t *bt = NULL;
    kvp__kv_tokens_t *tok = NULL;
    int64_t take = py_slice_len((int64_t)prefill_len, 0, n);
    if (kvp__kv_btuple_copy(blocks, &bt) != KVP_OK ||
        kvp__kv_tokens_new(prefill, (size_t)take, &tok) != KVP_OK) {
        kvp__kv_btuple_unref(bt);
        return KVP_ERR_NO_MEMORY;
    }
    tracker_set(s, r, n, bt, tok, (int64_t)prefill_len);
    return KVP_OK;
}

static bool add64(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

static kvp_status_t k11_new_requests(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so)
{
    bool consumer = s->cfg.kv_role == KVP_KV_ROLE_CONSUMER;
    int64_t bs = s->cfg.block_size;
    for (size_t i = 0; i < so->num_new_reqs; i++) {
        const kvp_kv_new_req_t *nr = &so->new_reqs[i];
        kvp__kv_rec_t *r = rec_get(s, nr->req_id);
        bool had_ls;
        kvp_kv_load_spec_t ls;
        ls_pop(s, r, &had_ls, &ls);
        if (nr->num_scheduled_tokens == KVP_KV_NO_ENTRY) {
            rec_maybe_free(s, r);
            return fail(s, KVP_ERR_NOT_FOUND, KVP_KV_ERR_KEY,
                        "new request %s has no num_scheduled_tokens entry", nr->req_id);
        }
        int64_t n;
        if (!add64(nr->num_computed_tokens, nr->num_scheduled_tokens, &n)) {
            rec_maybe_free(s, r);
            return fail(s, KVP_ERR_INVALID_ARG, KVP_KV_ERR_OTHER, "token count overflow");
        }
        if (!r || !r->in_unf) {
            rec_maybe_free(s, r);
            return fail(s, KVP_ERR_STATE, KVP_KV_ERR_ASSERTION,
                        "new request %s was never allocated (not in _unfinished_requests)",
                        nr->req_id);
        }
        const kvp_kv_request_t *req = r->req;
        const int64_t *prefill = nr->has_prefill_token_ids ? nr->prefill_token_ids : nr->prompt_token_ids;
        size_t plen = nr->has_prefill_token_ids ? nr->num_prefill_token_ids : nr->num_prompt_token_ids;
        if (tracker_new_prefill(s, r, n, &nr->block_ids, prefill, plen) != KVP_OK)
            return oom(s);
        int64_t last = kvp__floordiv((int64_t)plen, bs) * bs;
        kvp_status_t st = kvp__kv_from_tracker(s, r, had_ls ? &ls : NULL, consumer, req, n >= last);
        if (st != KVP_OK)
            return oom(s);
    }
    return KVP_OK;
}

static kvp_status_t k12_resumed(kvp_kv_sched_t *s, const kvp_kv_cached_req_t *c, kvp__kv_rec_t *r)
{
    int64_t bs = s->cfg.block_size;
    bool had_ls;
    kvp_kv_load_spec_t ls;
    ls_pop(s, r, &had_ls, &ls);
    if (!r || !r->in_unf) {
        rec_maybe_free(s, r);
        return fail(s, KVP_ERR_STATE, KVP_KV_ERR_TYPE,
                    "resumed request %s is not in _unfinished_requests", c->req_id);
    }
    const kvp_kv_request_t *req = r->req;
    if (c->num_scheduled_tokens == KVP_KV_NO_ENTRY)
        return fail(s, KVP_ERR_NOT_FOUND, KVP_KV_ERR_KEY,
                    "resumed request %s has no num_scheduled_tokens entry", c->req_id);
    int64_t n;
    if (!add64(req->num_computed_tokens, c->num_scheduled_tokens, &n))
        return fail(s, KVP_ERR_INVALID_ARG, KVP_KV_ERR_OTHER, "token count overflow");
    /* On resume the request re-prefills prompt + generated tokens. */
    size_t plen = req->num_all_token_ids;
    if (tracker_new_prefill(s, r, n, &c->new_block_ids, req->all_token_ids, plen) != KVP_OK)
        return oom(s);
    int64_t last = kvp__floordiv((int64_t)plen, bs) * bs;
    if (kvp__kv_from_tracker(s, r, had_ls ? &ls : NULL, false, req, n >= last) != KVP_OK)
        return oom(s);
    return KVP_OK;
}

static kvp_status_t k12_running(kvp_kv_sched_t *s, const kvp_kv_cached_req_t *c, kvp__kv_rec_t *r)
{
    int64_t bs = s->cfg.block_size;
    if (!r || !r->has_tracker)
        return fail(s, KVP_ERR_NOT_FOUND, KVP_KV_ERR_KEY, "running request %s has no tracker",
                    c->req_id);
    if (c->num_scheduled_tokens == KVP_KV_NO_ENTRY)
        return fail(s, KVP_ERR_NOT_FOUND, KVP_KV_ERR_KEY,
                    "running request %s has no num_scheduled_tokens entry", c->req_id);
    if (!r->in_unf)
        return fail(s, KVP_ERR_STATE, KVP_KV_ERR_VALUE,
                    "Request %s is not in _unfinished_requests", c->req_id);
    kvp__kv_tracker_t *tr = &r->tr;
    const kvp_kv_request_t *req = r->req;
    /* token_len grows by the tokens actually present in all_token_ids. */
    tr->token_len += py_slice_len((int64_t)req->num_all_token_ids, tr->token_len,
                                  (__int128)tr->token_len + c->num_scheduled_tokens);
    if (c->num_computed_tokens >= tr->prefill_end_tokens)
        return KVP_OK; /* decoding: never saved (the original) */
    if (c->new_block_ids.num_groups > 0) {
        uint32_t have = tr->blocks ? tr->blocks->num_groups : 0;
        if (c->new_block_ids.num_groups != have)
            return fail(s, KVP_ERR_INVALID_ARG, KVP_KV_ERR_VALUE,
                        "request %s: %u block groups, tracker has %u", c->req_id,
                        c->new_block_ids.num_groups, have);
        if (kvp__kv_btuple_extend(tr->blocks, &c->new_block_ids) != KVP_OK)
            return oom(s);
    }
    int64_t last = kvp__floordiv(tr->prefill_end_tokens, bs) * bs;
    if (kvp__kv_from_tracker(s, r, NULL, false, req, tr->token_len >= last) != KVP_OK)
        return oom(s);
    return KVP_OK;
}

/*
 * K12 quirk.  The original skips a cached request whose new_block_ids is
 * empty before anything else, so a chunk that crosses a block boundary using
 * blocks allocated earlier is never saved in that step, and token_len lags
 * (the next step's slice starts from the stale token_len).  Newer upstream
 * code processes such requests.  With cfg.fix_k12_save_without_new_blocks the
 * running (not resumed) request is processed as any other running request,
 * only without appending blocks.
 */
static kvp_status_t k12_cached_requests(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so)
{
    for (size_t i = 0; i < so->num_cached_reqs; i++) {
        const kvp_kv_cached_req_t *c = &so->cached_reqs[i];
        if (c->new_block_ids.num_groups == 0 && (c->resumed || !s->cfg.fix_k12_save_without_new_blocks))
            continue;
        kvp__kv_rec_t *r = rec_get(s, c->req_id);
        kvp_status_t st = c->resumed ? k12_resumed(s, c, r) : k12_running(s, c, r);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

static kvp_status_t k13_deferred_loads(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so)
{
    if (s->num_ls == 0)
        return KVP_OK; /* nothing can be popped: the walk would emit nothing */
    uint64_t stamp = ++s->stamp;
    for (size_t i = 0; i < so->num_new_reqs; i++) {
        kvp__kv_rec_t *r = rec_get(s, so->new_reqs[i].req_id);
        if (r)
            r->seen_stamp = stamp;
    }
    for (size_t i = 0; i < so->num_cached_reqs; i++) {
        kvp__kv_rec_t *r = rec_get(s, so->cached_reqs[i].req_id);
        if (r)
            r->seen_stamp = stamp;
    }
    KVP_LIST_FOR_EACH_ENTRY(r, &s->unf, kvp__kv_rec_t, ulink) {
        if (r->seen_stamp == stamp || !r->has_ls)
            continue;
        bool had;
        kvp_kv_load_spec_t ls;
        ls_pop(s, r, &had, &ls);
        /* The tracker shares the tuple stored in _unfinished_requests. */
        tracker_set(s, r, ls.kvpool_cached_tokens, kvp__kv_btuple_ref(r->ublocks), NULL, 0);
        if (kvp__kv_from_tracker(s, r, &ls, false, r->req, KVP_KV_TRI_NONE) != KVP_OK)
            return oom(s);
    }
    return KVP_OK;
}

static kvp_status_t k14_partial_tails(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so)
{
    size_t nt = so->num_partial_tails;
    if (nt == 0 || s->cfg.kv_role == KVP_KV_ROLE_CONSUMER)
        return KVP_OK;
    if (nt > s->tail_used_cap) {
        void *p = kvp__realloc(s->tail_used, s->tail_used_cap, nt);
        if (!p)
            return oom(s);
        s->tail_used = p;
        s->tail_used_cap = nt;
    }
    memset(s->tail_used, 0, nt);
    uint64_t stamp = ++s->stamp;
    for (size_t i = 0; i < nt; i++) {
        kvp__kv_rec_t *r = rec_get(s, so->partial_tails[i].req_id);
        if (r) {
            r->tail_stamp = stamp;
            r->tail_idx = i;
        }
    }
    /* Ride the first can_save meta of the request. */
    size_t nmeta = s->mb.npm;
    for (size_t m = 0; m < nmeta; m++) {
        kvp__kv_pmeta_t *pm = &s->mb.pm[m];
        kvp__kv_rec_t *r = pm->rec;
        if (!pm->can_save || r->tail_stamp != stamp || s->tail_used[r->tail_idx])
            continue;
        const kvp_kv_tail_req_t *t = &so->partial_tails[r->tail_idx];
        s->tail_used[r->tail_idx] = true;
        if (t->num_offloads == 0)
            continue; /* consumed but empty: dropped silently */
        pm->tails = t->offloads;
        pm->ntails = t->num_offloads;
        if (r->has_tracker)
            r->tr.has_pending_offload = true;
    }
    /* The rest: offload-only metas for live requests. */
    for (size_t i = 0; i < nt; i++) {
        if (s->tail_used[i])
            continue;
        const kvp_kv_tail_req_t *t = &so->partial_tails[i];
        kvp__kv_rec_t *r = rec_get(s, t->req_id);
        if (!r || !r->has_tracker || !r->in_unf) {
            kvp_debug("kv scheduler: dropping partial-tail offload for request %s", t->req_id);
            continue;
        }
        bool one = t->num_offloads > 0;
        for (size_t k = 1; one && k < t->num_offloads; k++)
            one = t->offloads[k].boundary_tokens == t->offloads[0].boundary_tokens;
        if (!one)
            return fail(s, KVP_ERR_STATE, KVP_KV_ERR_ASSERTION,
                        "request %s: partial-tail offloads need exactly one boundary", t->req_id);
        r->tr.has_pending_offload = true;
        kvp__kv_pmeta_t pm = {
            .rec = r,
            .req = r->req,
            .token_len_chunk = 0,
            .blocks = kvp__kv_btuple_ref(r->tr.blocks),
            .token_ids = NULL,
            .can_save = true,
            .is_last_chunk = KVP_KV_TRI_NONE,
            .num_prompt_tokens = r->tr.prefill_end_tokens,
            .tails = t->offloads,
            .ntails = t->num_offloads,
        };
        if (kvp__kv_pmeta_push(s, &pm) != KVP_OK)
            return oom(s);
    }
    return KVP_OK;
}

/* Every array and id the step output names is there (checked before any
 * change, so a malformed view changes nothing). */
static bool blocks_ok(const kvp_kv_blocks_t *b)
{
    if (b->num_groups && !b->groups)
        return false;
    for (uint32_t g = 0; g < b->num_groups; g++)
        if (b->groups[g].n && !b->groups[g].ids)
            return false;
    return true;
}

static bool output_ok(const kvp_kv_sched_output_t *so)
{
    if ((so->num_finished && !so->finished_req_ids) || (so->num_preempted && !so->preempted_req_ids) ||
        (so->num_new_reqs && !so->new_reqs) || (so->num_cached_reqs && !so->cached_reqs) ||
        (so->num_partial_tails && !so->partial_tails))
        return false;
    for (size_t i = 0; i < so->num_finished; i++)
        if (!so->finished_req_ids[i])
            return false;
    for (size_t i = 0; i < so->num_preempted; i++)
        if (!so->preempted_req_ids[i])
            return false;
    for (size_t i = 0; i < so->num_new_reqs; i++) {
        const kvp_kv_new_req_t *n = &so->new_reqs[i];
        if (!n->req_id || !blocks_ok(&n->block_ids) ||
            (n->num_prompt_token_ids && !n->prompt_token_ids) ||
            (n->has_prefill_token_ids && n->num_prefill_token_ids && !n->prefill_token_ids))
            return false;
    }
    for (size_t i = 0; i < so->num_cached_reqs; i++)
        if (!so->cached_reqs[i].req_id || !blocks_ok(&so->cached_reqs[i].new_block_ids))
            return false;
    for (size_t i = 0; i < so->num_partial_tails; i++)
        if (!so->partial_tails[i].req_id ||
            (so->partial_tails[i].num_offloads && !so->partial_tails[i].offloads))
            return false;
    return true;
}

kvp_status_t kvp_kv_sched_build_connector_meta(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so,
                                               const kvp_kv_meta_t **meta_p)
{
    if (!s || !so || !meta_p)
        return KVP_ERR_NULL_POINTER;
    *meta_p = NULL;
    if (!output_ok(so))
        return fail(s, KVP_ERR_NULL_POINTER, KVP_KV_ERR_OTHER,
                    "scheduler output view has a NULL array or id");
    s->err_kind = KVP_KV_ERR_NONE;
    kvp__kv_metabuf_release(&s->mb);
    /* K8: finished requests leave every container. */
    for (size_t i = 0; i < so->num_finished; i++) {
        const char *id = so->finished_req_ids[i];
        s->client.ops->discard(s->client.ctx, id);
        kvp__kv_rec_t *r = rec_get(s, id);
        if (!r)
            continue;
        bool had;
        kvp_kv_load_spec_t ls;
        ls_pop(s, r, &had, &ls);
        tracker_drop(s, r);
        unf_remove(s, r);
        uid_remove(s, r);
        rec_maybe_free(s, r);
    }
    /* K9 quirk (kept): a preempted request's tracker is reset in place, its
     * load spec and unfinished entry dropped, but its id stays in the
     * unfinished-id set that the metadata carries. */
    for (size_t i = 0; i < so->num_preempted; i++) {
        kvp__kv_rec_t *r = rec_get(s, so->preempted_req_ids[i]);
        if (!r)
            continue;
        bool had;
        kvp_kv_load_spec_t ls;
        ls_pop(s, r, &had, &ls);
        if (r->has_tracker) {
            kvp__kv_tracker_clear(&r->tr); /* reset(): all fields zero, stays in the dict */
        }
        unf_remove(s, r);
        rec_maybe_free(s, r);
    }
    /* K10: the meta reads the live unfinished-id set when the call returns. */
    kvp_status_t st = k11_new_requests(s, so);
    if (st == KVP_OK && s->cfg.kv_role != KVP_KV_ROLE_CONSUMER)
        st = k12_cached_requests(s, so);
    if (st == KVP_OK)
        st = k13_deferred_loads(s, so);
    if (st == KVP_OK)
        st = k14_partial_tails(s, so);
    if (st == KVP_OK && kvp__kv_metabuf_snapshot(s, so) != KVP_OK)
        st = oom(s);
    if (st != KVP_OK)
        return st;
    *meta_p = &s->mb.meta;
    return KVP_OK;
}

/* ---- K15–K17: request_finished ------------------------------------------ */

kvp_status_t kvp_kv_sched_request_finished_all_groups(kvp_kv_sched_t *s, const char *req_id,
                                                      size_t total_blocks, bool *delay_p)
{
    if (!s || !req_id || !delay_p)
        return KVP_ERR_NULL_POINTER;
    s->err_kind = KVP_KV_ERR_NONE;
    *delay_p = false;
    if (s->cfg.kv_role == KVP_KV_ROLE_CONSUMER) /* K15 */
        return KVP_OK;
    kvp__kv_rec_t *r = rec_get(s, req_id);
    /* K16: aborted before the connector saw it, preempted, or nothing saved. */
    if (!r || !r->has_tracker ||
        (r->tr.num_saved_tokens <= 0 && !r->tr.has_pending_offload))
        return KVP_OK;
    *delay_p = total_blocks > 0; /* K17 */
    return KVP_OK;
}

kvp_status_t kvp_kv_sched_request_finished(kvp_kv_sched_t *s, const char *req_id,
                                           const kvp_kv_blocks_t *block_ids, bool *delay_p)
{
    size_t total = 0;
    for (uint32_t g = 0; block_ids && g < block_ids->num_groups; g++)
        total += block_ids->groups[g].n;
    return kvp_kv_sched_request_finished_all_groups(s, req_id, total, delay_p);
}

/* ---- K18: reset --------------------------------------------------------- */

kvp_status_t kvp_kv_sched_reset_store(kvp_kv_sched_t *s, bool *ok_p)
{
    if (!s || !ok_p)
        return KVP_ERR_NULL_POINTER;
    s->err_kind = KVP_KV_ERR_NONE;
    bool ack = false;
    kvp_status_t st = s->client.ops->reset(s->client.ctx, &ack);
    if (st != KVP_OK) {
        kvp_error("kv scheduler: reset_store RPC failed: %s", kvp_status_str(st));
        *ok_p = false;
    } else {
        if (ack)
            kvp_info("kv scheduler: store reset via remove_all succeeded");
        else
            kvp_warn("kv scheduler: store reset returned NACK from the worker");
        *ok_p = ack;
    }
    return KVP_OK;
}

kvp_status_t kvp_kv_sched_reset_cache(kvp_kv_sched_t *s, bool *ok_p)
{
    if (!s || !ok_p)
        return KVP_ERR_NULL_POINTER;
    /* Pending load specs would load from a store about to be emptied. */
    kvp__kv_metabuf_release(&s->mb);
    for (size_t i = 0; i < s->map.cap && s->num_ls; i++) {
        kvp__kv_rec_t *r = s->map.slots[i].val;
        if (!s->map.slots[i].key || !r || !r->has_ls)
            continue;
        r->has_ls = false;
        s->num_ls--;
        if (!r->has_tracker && !r->in_unf && r->uid_idx == SIZE_MAX) {
            /* freeing shifts slots back: revisit this slot */
            rec_maybe_free(s, r);
            i--;
        }
    }
    return kvp_kv_sched_reset_store(s, ok_p);
}

/* ---- introspection ------------------------------------------------------ */

void kvp_kv_sched_stats(const kvp_kv_sched_t *s, kvp_kv_sched_stats_t *st)
{
    st->num_load_specs = s->num_ls;
    st->num_trackers = s->num_trackers;
    st->num_unfinished = s->num_unf;
    st->num_unfinished_ids = s->num_uids;
    st->loads_declined = s->loads_declined;
    st->tokens_declined = s->tokens_declined;
}

kvp_status_t kvp_kv_sched_tracker(const kvp_kv_sched_t *s, const char *req_id,
                                  kvp_kv_tracker_info_t *info)
{
    kvp__kv_rec_t *r = rec_get(s, req_id);
    if (!r || !r->has_tracker)
        return KVP_ERR_NOT_FOUND;
    info->token_len = r->tr.token_len;
    info->num_saved_tokens = r->tr.num_saved_tokens;
    info->prefill_end_tokens = r->tr.prefill_end_tokens;
    info->num_token_ids = r->tr.token_ids ? r->tr.token_ids->n : 0;
    info->num_groups = r->tr.blocks ? r->tr.blocks->num_groups : 0;
    info->num_blocks = kvp__kv_btuple_total(r->tr.blocks);
    info->has_pending_offload = r->tr.has_pending_offload;
    return KVP_OK;
}

kvp_status_t kvp_kv_sched_load_spec(const kvp_kv_sched_t *s, const char *req_id,
                                    kvp_kv_load_spec_t *spec)
{
    kvp__kv_rec_t *r = rec_get(s, req_id);
    if (!r || !r->has_ls)
        return KVP_ERR_NOT_FOUND;
    *spec = r->ls;
    return KVP_OK;
}

int kvp_kv_sched_membership(const kvp_kv_sched_t *s, const char *req_id)
{
    kvp__kv_rec_t *r = rec_get(s, req_id);
    if (!r)
        return 0;
    return (r->in_unf ? 1 : 0) | (r->uid_idx != SIZE_MAX ? 2 : 0);
}
