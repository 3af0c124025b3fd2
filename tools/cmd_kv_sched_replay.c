/*
 * `kvpool kv-sched-replay`: replays a "kv-sched-replay v1" stream (stdin) through
 * the C KV scheduler and writes its decisions in the canonical form of
 * ../shared/tools/kvsched-ref/README.md (stdout), one line per input line.
 *
 * The stream carries the engine's live Request objects separately (`req`
 * events); this tool keeps one record per id for the whole stream, hands the
 * scheduler a kvp_kv_request_t view of it (the scheduler keeps the pointer, as
 * the original keeps the Request), and answers the scheduler's lookups with a
 * scripted client.  Every event is validated completely before any call, so
 * a BadEvent changes no state, exactly as ref.py does.
 *
 * Known divergences from ref.py, for inputs gen.py never produces: integers
 * outside int64 and request ids containing U+0000 are BadEvent here, and so
 * is a line that is not UTF-8 (ref.py cannot read it); lines are split on
 * '\n' only.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/alloc.h"
#include "common/arena.h"
#include "common/log.h"
#include "common/strmap.h"
#include "common/json.h"
#include "kvpool/kv_connector.h"
#include "support/kv_scripted.h"

typedef kvp__json_t jnode_t;

enum { R_OK = 0, R_BAD, R_UNKNOWN, R_TYPE, R_SCHED };

/* ---- output: the common JSON writer ------------------------------------- */

typedef kvp__jw_t obuf_t;

#define OB_LIT(o, s) kvp__jw_put((o), (s), sizeof(s) - 1)

/* A JSON string as Python's json.dumps (ensure_ascii) writes it. */
static void ob_jstr(obuf_t *o, const char *s) { kvp__jw_str(o, s, strlen(s)); }

/* ---- per-event scratch arena (common/arena.h) ------------------------- */

typedef struct {
    kvp__arena_t arena;
    int oom;
} scratch_t;

static void *sc_alloc(scratch_t *a, size_t n)
{
    void *p = kvp__arena_alloc(&a->arena, n);
    if (!p)
        a->oom = 1;
    return p;
}

static void sc_reset(scratch_t *a, bool all)
{
    if (all)
        kvp__arena_cleanup(&a->arena);
    else
        kvp__arena_reset(&a->arena);
    a->oom = 0;
}

/* ---- live requests ------------------------------------------------------ */

typedef struct rreq {
    kvp_kv_request_t view;
    int64_t *toks;
    size_t toks_cap;
    size_t id_len;
    char id[];
} rreq_t;

typedef struct {
    kvp_kv_sched_t *sched;
    kvp_kv_scripted_t *sc;
    kvp__strmap_t reqs;
    kvp__strmap_t nst;
    kvp__json_parser_t jp;
    scratch_t scr;
    obuf_t out;
    size_t lineno;
} replay_t;

static rreq_t *req_find(replay_t *R, const char *id)
{
    size_t n = strlen(id);
    return kvp__strmap_get_h(&R->reqs, id, n, kvp__strmap_hash(id, n));
}

/* ---- validation (ref.py's _req/_opt/_is) -------------------------------- */

static bool is_int(const jnode_t *n) { return n && n->type == KVP__JSON_INT; }
static bool is_bool(const jnode_t *n)
{
    return n && (n->type == KVP__JSON_TRUE || n->type == KVP__JSON_FALSE);
}
/* A string usable as a C id (no U+0000 inside). */
static bool is_str(const jnode_t *n)
{
    return n && n->type == KVP__JSON_STRING && strlen(n->u.s) == n->n;
}
static bool is_ints(const jnode_t *n)
{
    if (!n || n->type != KVP__JSON_ARRAY)
        return false;
    for (size_t i = 0; i < n->n; i++)
        if (n->u.items[i].type != KVP__JSON_INT)
            return false;
    return true;
}
static bool is_strs(const jnode_t *n)
{
    if (!n || n->type != KVP__JSON_ARRAY)
        return false;
    for (size_t i = 0; i < n->n; i++)
        if (!is_str(&n->u.items[i]))
            return false;
    return true;
}
static bool is_groups(const jnode_t *n)
{
    if (!n || n->type != KVP__JSON_ARRAY)
        return false;
    for (size_t i = 0; i < n->n; i++)
        if (!is_ints(&n->u.items[i]))
            return false;
    return true;
}
static bool is_null(const jnode_t *n) { return n && n->type == KVP__JSON_NULL; }

/* _opt: absent or null -> NULL; present with the wrong type -> *bad. */
static const jnode_t *opt(const jnode_t *ev, const char *name, bool (*ok)(const jnode_t *), bool *bad)
{
    const jnode_t *n = kvp__json_get(ev, name);
    if (!n || is_null(n))
        return NULL;
    if (!ok(n))
        *bad = true;
    return n;
}

static int64_t *ints_copy(replay_t *R, const jnode_t *a)
{
    int64_t *v = sc_alloc(&R->scr, a->n * sizeof(int64_t));
    if (!v)
        return NULL;
    for (size_t i = 0; i < a->n; i++)
        v[i] = a->u.items[i].u.i;
    return v;
}

static bool groups_view(replay_t *R, const jnode_t *a, kvp_kv_blocks_t *b)
{
    b->num_groups = (uint32_t)a->n;
    b->groups = NULL;
    if (a->n == 0)
        return true;
    kvp_kv_ids_t *g = sc_alloc(&R->scr, a->n * sizeof *g);
    if (!g)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        g[i].n = a->u.items[i].n;
        g[i].ids = ints_copy(R, &a->u.items[i]);
        if (!g[i].ids)
            return false;
    }
    b->groups = g;
    return true;
}

/* The live request named by ev.req_id (after every other field). */
static int request_of(replay_t *R, const jnode_t *ev, rreq_t **r_p)
{
    const jnode_t *id = kvp__json_get(ev, "req_id");
    if (!is_str(id))
        return R_BAD;
    *r_p = req_find(R, id->u.s);
    return *r_p ? R_OK : R_UNKNOWN;
}

static int sched_err(replay_t *R)
{
    const char *msg;
    kvp_kv_err_kind_t k = kvp_kv_sched_last_error(R->sched, &msg);
    OB_LIT(&R->out, "{\"error\":");
    ob_jstr(&R->out, kvp_kv_err_kind_name(k == KVP_KV_ERR_NONE ? KVP_KV_ERR_OTHER : k));
    OB_LIT(&R->out, "}");
    return R_SCHED;
}

/* ---- ops ---------------------------------------------------------------- */

static bool set_tokens(rreq_t *r, const jnode_t *a, bool append)
{
    size_t base = append ? r->view.num_all_token_ids : 0;
    size_t need = base + a->n;
    if (need > r->toks_cap) {
        size_t nc = r->toks_cap ? r->toks_cap : 64;
        while (nc < need)
            nc *= 2;
        int64_t *nt = kvp__realloc(r->toks, r->toks_cap * sizeof(int64_t), nc * sizeof(int64_t));
        if (!nt)
            return false;
        r->toks = nt;
        r->toks_cap = nc;
    }
    for (size_t i = 0; i < a->n; i++)
        r->toks[base + i] = a->u.items[i].u.i;
    r->view.all_token_ids = r->toks;
    r->view.num_all_token_ids = need;
    return true;
}

static int op_req(replay_t *R, const jnode_t *ev)
{
    const jnode_t *id = kvp__json_get(ev, "req_id");
    if (!is_str(id))
        return R_BAD;
    rreq_t *r = req_find(R, id->u.s);
    bool bad = false;
    const jnode_t *nt = opt(ev, "num_tokens", is_int, &bad);
    const jnode_t *nc = opt(ev, "num_computed_tokens", is_int, &bad);
    (void)opt(ev, "prompt_token_ids", is_ints, &bad); /* never read by the seed */
    const jnode_t *all = opt(ev, "all_token_ids", is_ints, &bad);
    const jnode_t *hs = opt(ev, "block_hashes", is_strs, &bad);
    const jnode_t *at = opt(ev, "append_token_ids", is_ints, &bad);
    const jnode_t *ah = opt(ev, "append_block_hashes", is_strs, &bad);
    if (bad)
        return R_BAD;
    if (!r && (!nt || !nc || !all || !hs || at || ah))
        return R_BAD;
    if ((at && all) || (ah && hs))
        return R_BAD;
    if (!r) {
        size_t n = id->n;
        r = kvp__calloc(1, sizeof *r + n + 1);
        if (!r)
            return R_TYPE;
        memcpy(r->id, id->u.s, n + 1);
        r->id_len = n;
        r->view.req_id = r->id;
        if (kvp__strmap_put_h(&R->reqs, r->id, n, kvp__strmap_hash(r->id, n), r) != KVP_OK) {
            kvp__free(r, sizeof *r + n + 1);
            return R_TYPE;
        }
    }
    if (nt)
        r->view.num_tokens = nt->u.i;
    if (nc)
        r->view.num_computed_tokens = nc->u.i;
    if (all && !set_tokens(r, all, false))
        return R_TYPE;
    if (at && !set_tokens(r, at, true))
        return R_TYPE;
    if (hs)
        r->view.num_block_hashes = hs->n;
    if (ah)
        r->view.num_block_hashes += ah->n;
    OB_LIT(&R->out, "{\"ret\":null}");
    return R_OK;
}

static int op_gnnmt(replay_t *R, const jnode_t *ev)
{
    const jnode_t *nc = kvp__json_get(ev, "num_computed_tokens");
    if (!is_int(nc))
        return R_BAD;
    const jnode_t *lk = kvp__json_get(ev, "lookup");
    if (!lk || !(is_int(lk) || is_null(lk)))
        return R_BAD;
    rreq_t *r;
    int rc = request_of(R, ev, &r);
    if (rc)
        return rc;
    kvp_kv_scripted_clear(R->sc);
    kvp_kv_scripted_set_lookup(R->sc, is_int(lk) ? lk->u.i : 0, is_null(lk));
    int64_t num;
    bool la;
    if (kvp_kv_sched_get_num_new_matched_tokens(R->sched, &r->view, nc->u.i, &num, &la) != KVP_OK)
        return sched_err(R);
    const kvp_kv_lookup_call_t *calls;
    size_t ncalls = kvp_kv_scripted_lookups(R->sc, &calls);
    OB_LIT(&R->out, "{\"lookup_called\":");
    if (ncalls) {
        OB_LIT(&R->out, "{\"non_block\":");
        kvp__jw_bool(&R->out, calls[0].non_block);
        OB_LIT(&R->out, ",\"num_block_hashes\":");
        kvp__jw_int(&R->out, (int64_t)calls[0].num_block_hashes);
        OB_LIT(&R->out, ",\"num_tokens\":");
        kvp__jw_int(&R->out, calls[0].num_tokens);
        OB_LIT(&R->out, "}");
    } else {
        OB_LIT(&R->out, "null");
    }
    OB_LIT(&R->out, ",\"ret\":[");
    if (num < 0)
        OB_LIT(&R->out, "null");
    else
        kvp__jw_int(&R->out, num);
    OB_LIT(&R->out, ",");
    kvp__jw_bool(&R->out, la);
    OB_LIT(&R->out, "]}");
    return R_OK;
}

static int op_alloc(replay_t *R, const jnode_t *ev)
{
    const jnode_t *b = kvp__json_get(ev, "block_ids");
    const jnode_t *ne = kvp__json_get(ev, "num_external_tokens");
    if (!is_groups(b) || !is_int(ne))
        return R_BAD;
    rreq_t *r;
    int rc = request_of(R, ev, &r);
    if (rc)
        return rc;
    kvp_kv_blocks_t blocks;
    if (!groups_view(R, b, &blocks))
        return R_TYPE;
    if (kvp_kv_sched_update_state_after_alloc(R->sched, &r->view, &blocks, ne->u.i) != KVP_OK)
        return sched_err(R);
    OB_LIT(&R->out, "{\"ret\":null}");
    return R_OK;
}

static int op_finished(replay_t *R, const jnode_t *ev)
{
    const jnode_t *b = kvp__json_get(ev, "block_ids");
    if (!is_groups(b))
        return R_BAD;
    rreq_t *r;
    int rc = request_of(R, ev, &r);
    if (rc)
        return rc;
    size_t total = 0;
    for (size_t i = 0; i < b->n; i++)
        total += b->u.items[i].n;
    bool delay;
    if (kvp_kv_sched_request_finished_all_groups(R->sched, r->id, total, &delay) != KVP_OK)
        return sched_err(R);
    OB_LIT(&R->out, "{\"ret\":[");
    kvp__jw_bool(&R->out, delay);
    OB_LIT(&R->out, ",null]}");
    return R_OK;
}

static int op_reset(replay_t *R, const jnode_t *ev)
{
    const jnode_t *rp = kvp__json_get(ev, "reply");
    if (!is_str(rp))
        return R_BAD;
    kvp_kv_reset_reply_t reply;
    if (strcmp(rp->u.s, "ack") == 0)
        reply = KVP_KV_RESET_ACK;
    else if (strcmp(rp->u.s, "nack") == 0)
        reply = KVP_KV_RESET_NACK;
    else if (strcmp(rp->u.s, "error") == 0)
        reply = KVP_KV_RESET_ERROR;
    else
        return R_BAD;
    kvp_kv_scripted_set_reset(R->sc, reply);
    bool ok;
    if (kvp_kv_sched_reset_store(R->sched, &ok) != KVP_OK)
        return sched_err(R);
    OB_LIT(&R->out, "{\"ret\":");
    kvp__jw_bool(&R->out, ok);
    OB_LIT(&R->out, "}");
    return R_OK;
}

/* A JSON string list as a set: distinct ids, first-seen order. */
static const char **id_set(replay_t *R, const jnode_t *a, size_t *n_p)
{
    const char **v = sc_alloc(&R->scr, (a->n + 1) * sizeof *v);
    size_t n = 0;
    if (!v)
        return NULL;
    for (size_t i = 0; i < a->n; i++) {
        const char *s = a->u.items[i].u.s;
        bool dup = false;
        for (size_t k = 0; k < n && !dup; k++)
            dup = strcmp(v[k], s) == 0;
        if (!dup)
            v[n++] = s;
    }
    *n_p = n;
    return v;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void ob_sorted_ids(replay_t *R, const char *const *ids, size_t n)
{
    const char **v = sc_alloc(&R->scr, (n + 1) * sizeof *v);
    if (!v) {
        R->out.oom = 1;
        return;
    }
    if (n)
        memcpy(v, ids, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_str);
    OB_LIT(&R->out, "[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            OB_LIT(&R->out, ",");
        ob_jstr(&R->out, v[i]);
    }
    OB_LIT(&R->out, "]");
}

static void ob_reqmeta(obuf_t *o, const kvp_kv_req_meta_t *m)
{
    OB_LIT(o, "{\"block_ids\":[");
    for (uint32_t g = 0; g < m->block_ids.num_groups; g++) {
        if (g)
            OB_LIT(o, ",");
        OB_LIT(o, "[");
        const kvp_kv_ids_t *l = &m->block_ids.groups[g];
        for (size_t i = 0; i < l->n; i++) {
            if (i)
                OB_LIT(o, ",");
            kvp__jw_int(o, l->ids[i]);
        }
        OB_LIT(o, "]");
    }
    OB_LIT(o, "],\"can_save\":");
    kvp__jw_bool(o, m->can_save);
    OB_LIT(o, ",\"is_last_chunk\":");
    if (m->is_last_chunk == KVP_KV_TRI_NONE)
        OB_LIT(o, "null");
    else
        kvp__jw_bool(o, m->is_last_chunk != 0);
    OB_LIT(o, ",\"load_spec\":");
    if (m->has_load_spec) {
        OB_LIT(o, "{\"can_load\":");
        kvp__jw_bool(o, m->load_spec.can_load);
        OB_LIT(o, ",\"kvpool_cached_tokens\":");
        kvp__jw_int(o, m->load_spec.kvpool_cached_tokens);
        OB_LIT(o, ",\"vllm_cached_tokens\":");
        kvp__jw_int(o, m->load_spec.vllm_cached_tokens);
        OB_LIT(o, "}");
    } else {
        OB_LIT(o, "null");
    }
    OB_LIT(o, ",\"num_block_hashes\":");
    kvp__jw_int(o, (int64_t)m->num_block_hashes);
    OB_LIT(o, ",\"num_prompt_tokens\":");
    kvp__jw_int(o, m->num_prompt_tokens);
    OB_LIT(o, ",\"num_token_ids\":");
    if (m->has_token_ids)
        kvp__jw_int(o, (int64_t)m->num_token_ids);
    else
        OB_LIT(o, "null");
    OB_LIT(o, ",\"partial_tail_offloads\":");
    if (m->num_partial_tail_offloads) {
        OB_LIT(o, "[");
        for (size_t i = 0; i < m->num_partial_tail_offloads; i++) {
            const kvp_kv_tail_offload_t *t = &m->partial_tail_offloads[i];
            if (i)
                OB_LIT(o, ",");
            OB_LIT(o, "[");
            kvp__jw_int(o, t->group_id);
            OB_LIT(o, ",");
            kvp__jw_int(o, t->cow_block_id);
            OB_LIT(o, ",");
            kvp__jw_int(o, t->boundary_tokens);
            OB_LIT(o, "]");
        }
        OB_LIT(o, "]");
    } else {
        OB_LIT(o, "null");
    }
    OB_LIT(o, ",\"req_id\":");
    ob_jstr(o, m->req_id);
    OB_LIT(o, ",\"token_len_chunk\":");
    kvp__jw_int(o, m->token_len_chunk);
    OB_LIT(o, "}");
}

static int64_t nst_lookup(replay_t *R, const char *id)
{
    size_t n = strlen(id);
    const jnode_t *v = kvp__strmap_get_h(&R->nst, id, n, kvp__strmap_hash(id, n));
    return v ? v->u.i : KVP_KV_NO_ENTRY;
}

static bool in_set(const char *const *set, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(set[i], id) == 0)
            return true;
    return false;
}

static int op_build(replay_t *R, const jnode_t *ev)
{
    /* Validate everything first (a BadEvent changes no state). */
    const jnode_t *fin = kvp__json_get(ev, "finished_req_ids");
    if (!is_strs(fin))
        return R_BAD;
    const jnode_t *pre = kvp__json_get(ev, "preempted_req_ids");
    if (!pre || !(is_strs(pre) || is_null(pre)))
        return R_BAD;
    const jnode_t *news = kvp__json_get(ev, "scheduled_new_reqs");
    if (!news || news->type != KVP__JSON_ARRAY)
        return R_BAD;
    for (size_t i = 0; i < news->n; i++) {
        const jnode_t *nr = &news->u.items[i];
        if (nr->type != KVP__JSON_OBJECT || !is_str(kvp__json_get(nr, "req_id")) ||
            !is_int(kvp__json_get(nr, "num_computed_tokens")) ||
            !is_groups(kvp__json_get(nr, "block_ids")) ||
            !is_ints(kvp__json_get(nr, "prompt_token_ids")))
            return R_BAD;
        const jnode_t *pf = kvp__json_get(nr, "prefill_token_ids");
        if (pf && !is_null(pf) && !is_ints(pf))
            return R_BAD;
    }
    const jnode_t *cr = kvp__json_get(ev, "scheduled_cached_reqs");
    if (!cr || cr->type != KVP__JSON_OBJECT)
        return R_BAD;
    const jnode_t *cids = kvp__json_get(cr, "req_ids");
    const jnode_t *nbi = kvp__json_get(cr, "new_block_ids");
    const jnode_t *ncs = kvp__json_get(cr, "num_computed_tokens");
    const jnode_t *res = kvp__json_get(cr, "resumed_req_ids");
    if (!is_strs(cids) || !nbi || nbi->type != KVP__JSON_ARRAY || !is_ints(ncs) || !is_strs(res))
        return R_BAD;
    for (size_t i = 0; i < nbi->n; i++)
        if (!is_null(&nbi->u.items[i]) && !is_groups(&nbi->u.items[i]))
            return R_BAD;
    if (cids->n != nbi->n || cids->n != ncs->n)
        return R_BAD;
    const jnode_t *nst = kvp__json_get(ev, "num_scheduled_tokens");
    if (!nst || nst->type != KVP__JSON_OBJECT)
        return R_BAD;
    for (size_t i = 0; i < nst->n; i++)
        if (nst->u.items[i].type != KVP__JSON_INT)
            return R_BAD;
    const jnode_t *pto = kvp__json_get(ev, "partial_tail_offloads");
    if (pto && !is_null(pto)) {
        if (pto->type != KVP__JSON_ARRAY)
            return R_BAD;
        for (size_t i = 0; i < pto->n; i++) {
            const jnode_t *e = &pto->u.items[i];
            if (e->type != KVP__JSON_OBJECT)
                return R_BAD;
            const jnode_t *rid = kvp__json_get(e, "req_id");
            const jnode_t *offs = kvp__json_get(e, "offloads");
            if (!is_str(rid) || !offs || offs->type != KVP__JSON_ARRAY)
                return R_BAD;
            for (size_t k = 0; k < offs->n; k++)
                if (!is_ints(&offs->u.items[k]) || offs->u.items[k].n != 3)
                    return R_BAD;
            for (size_t k = 0; k < i; k++)
                if (strcmp(kvp__json_get(&pto->u.items[k], "req_id")->u.s, rid->u.s) == 0)
                    return R_BAD;
        }
    } else {
        pto = NULL;
    }

    /* Build the scheduler output view. */
    kvp_kv_sched_output_t so;
    memset(&so, 0, sizeof so);
    so.finished_req_ids = id_set(R, fin, &so.num_finished);
    if (is_strs(pre))
        so.preempted_req_ids = id_set(R, pre, &so.num_preempted);
    size_t nres = 0;
    const char **resumed = id_set(R, res, &nres);
    kvp__strmap_cleanup(&R->nst);
    for (size_t i = 0; i < nst->n; i++) {
        const jnode_t *m = &nst->u.items[i];
        uint64_t h = kvp__strmap_hash(m->key, m->key_len);
        kvp__strmap_del_h(&R->nst, m->key, m->key_len, h); /* last one wins */
        if (kvp__strmap_put_h(&R->nst, m->key, m->key_len, h, (void *)m) != KVP_OK)
            return R_TYPE;
    }
    kvp_kv_new_req_t *nrs = sc_alloc(&R->scr, (news->n + 1) * sizeof *nrs);
    kvp_kv_cached_req_t *crs = sc_alloc(&R->scr, (cids->n + 1) * sizeof *crs);
    if (!nrs || !crs)
        return R_TYPE;
    for (size_t i = 0; i < news->n; i++) {
        const jnode_t *nr = &news->u.items[i];
        kvp_kv_new_req_t *x = &nrs[i];
        memset(x, 0, sizeof *x);
        x->req_id = kvp__json_get(nr, "req_id")->u.s;
        x->num_computed_tokens = kvp__json_get(nr, "num_computed_tokens")->u.i;
        x->num_scheduled_tokens = nst_lookup(R, x->req_id);
        if (!groups_view(R, kvp__json_get(nr, "block_ids"), &x->block_ids))
            return R_TYPE;
        const jnode_t *pt = kvp__json_get(nr, "prompt_token_ids");
        x->prompt_token_ids = ints_copy(R, pt);
        x->num_prompt_token_ids = pt->n;
        const jnode_t *pf = kvp__json_get(nr, "prefill_token_ids");
        if (pf && !is_null(pf)) {
            x->has_prefill_token_ids = true;
            x->prefill_token_ids = ints_copy(R, pf);
            x->num_prefill_token_ids = pf->n;
        }
    }
    for (size_t i = 0; i < cids->n; i++) {
        kvp_kv_cached_req_t *x = &crs[i];
        memset(x, 0, sizeof *x);
        x->req_id = cids->u.items[i].u.s;
        x->num_computed_tokens = ncs->u.items[i].u.i;
        x->num_scheduled_tokens = nst_lookup(R, x->req_id);
        if (!is_null(&nbi->u.items[i]) && !groups_view(R, &nbi->u.items[i], &x->new_block_ids))
            return R_TYPE;
        x->resumed = in_set(resumed, nres, x->req_id);
    }
    so.new_reqs = nrs;
    so.num_new_reqs = news->n;
    so.cached_reqs = crs;
    so.num_cached_reqs = cids->n;
    if (pto) {
        kvp_kv_tail_req_t *t = sc_alloc(&R->scr, (pto->n + 1) * sizeof *t);
        if (!t)
            return R_TYPE;
        for (size_t i = 0; i < pto->n; i++) {
            const jnode_t *e = &pto->u.items[i];
            const jnode_t *offs = kvp__json_get(e, "offloads");
            t[i].req_id = kvp__json_get(e, "req_id")->u.s;
            t[i].num_offloads = offs->n;
            kvp_kv_tail_offload_t *o = sc_alloc(&R->scr, (offs->n + 1) * sizeof *o);
            if (!o)
                return R_TYPE;
            for (size_t k = 0; k < offs->n; k++) {
                const jnode_t *tr = &offs->u.items[k];
                o[k] = (kvp_kv_tail_offload_t){tr->u.items[0].u.i, tr->u.items[1].u.i,
                                               tr->u.items[2].u.i};
            }
            t[i].offloads = o;
        }
        so.partial_tails = t;
        so.num_partial_tails = pto->n;
    }
    if (R->scr.oom)
        return R_TYPE;

    kvp_kv_scripted_clear(R->sc);
    const kvp_kv_meta_t *meta;
    if (kvp_kv_sched_build_connector_meta(R->sched, &so, &meta) != KVP_OK)
        return sched_err(R);
    const char *const *disc;
    size_t ndisc = kvp_kv_scripted_discards(R->sc, &disc);
    obuf_t *o = &R->out;
    OB_LIT(o, "{\"discarded\":");
    ob_sorted_ids(R, disc, ndisc);
    OB_LIT(o, ",\"ret\":{\"preempted_req_ids\":");
    ob_sorted_ids(R, meta->preempted_req_ids, meta->num_preempted);
    OB_LIT(o, ",\"requests\":[");
    for (size_t i = 0; i < meta->num_requests; i++) {
        if (i)
            OB_LIT(o, ",");
        ob_reqmeta(o, &meta->requests[i]);
    }
    OB_LIT(o, "],\"unfinished_request_ids\":");
    ob_sorted_ids(R, meta->unfinished_req_ids, meta->num_unfinished);
    OB_LIT(o, "}}");
    return R_OK;
}

static void handle(replay_t *R, const char *line, size_t len)
{
    size_t mark = R->out.len;
    const jnode_t *ev = NULL;
    int rc;
    if (kvp__json_parse(&R->jp, line, len, &ev) != KVP_OK || ev->type != KVP__JSON_OBJECT) {
        rc = R_BAD;
    } else {
        const jnode_t *op = kvp__json_get(ev, "op");
        if (op && (op->type == KVP__JSON_ARRAY || op->type == KVP__JSON_OBJECT))
            rc = R_TYPE; /* dict.get(unhashable) raises TypeError in ref.py */
        else if (!op || op->type != KVP__JSON_STRING)
            rc = R_BAD;
        else if (strcmp(op->u.s, "req") == 0)
            rc = op_req(R, ev);
        else if (strcmp(op->u.s, "get_num_new_matched_tokens") == 0)
            rc = op_gnnmt(R, ev);
        else if (strcmp(op->u.s, "update_state_after_alloc") == 0)
            rc = op_alloc(R, ev);
        else if (strcmp(op->u.s, "build_connector_meta") == 0)
            rc = op_build(R, ev);
        else if (strcmp(op->u.s, "request_finished") == 0)
            rc = op_finished(R, ev);
        else if (strcmp(op->u.s, "reset_store") == 0)
            rc = op_reset(R, ev);
        else
            rc = R_BAD;
    }
    if (rc != R_OK && rc != R_SCHED) {
        R->out.len = mark;
        if (rc == R_BAD) {
            kvp_warn("kv-sched-replay: line %zu is not a valid v1 event (BadEvent)", R->lineno);
            OB_LIT(&R->out, "{\"error\":\"BadEvent\"}");
        } else if (rc == R_UNKNOWN) {
            kvp_warn("kv-sched-replay: line %zu names an unknown request", R->lineno);
            OB_LIT(&R->out, "{\"error\":\"UnknownRequest\"}");
        } else {
            kvp_warn("kv-sched-replay: line %zu: op is not hashable or out of memory (TypeError)",
                     R->lineno);
            OB_LIT(&R->out, "{\"error\":\"TypeError\"}");
        }
    }
    OB_LIT(&R->out, "\n");
    sc_reset(&R->scr, false);
}

/* Line 1.  Returns 0 and fills cfg, or -1 with a reason. */
static int parse_config(replay_t *R, const char *line, size_t len, kvp_kv_config_t *cfg,
                        const char **why)
{
    const jnode_t *ev;
    *why = "first line must be the config";
    if (kvp__json_parse(&R->jp, line, len, &ev) != KVP_OK || ev->type != KVP__JSON_OBJECT)
        return -1;
    const jnode_t *op = kvp__json_get(ev, "op");
    if (!op || op->type != KVP__JSON_STRING || strcmp(op->u.s, "config") != 0)
        return -1;
    const jnode_t *v = kvp__json_get(ev, "version");
    *why = "unsupported version";
    if (!v || !((v->type == KVP__JSON_INT && v->u.i == 1) || v->type == KVP__JSON_TRUE))
        return -1;
    const jnode_t *role = kvp__json_get(ev, "kv_role");
    const jnode_t *la = kvp__json_get(ev, "load_async");
    const jnode_t *lk = kvp__json_get(ev, "lookup_async");
    const jnode_t *el = kvp__json_get(ev, "enable_lookup");
    const jnode_t *bs = kvp__json_get(ev, "block_size");
    const jnode_t *hbs = kvp__json_get(ev, "hash_block_size");
    const jnode_t *ph = kvp__json_get(ev, "partial_hits");
    *why = "missing field or wrong type";
    if (!is_str(role) || !is_bool(la) || !is_bool(lk) || !is_bool(el) || !is_int(bs) ||
        !is_int(hbs) || !is_bool(ph))
        return -1;
    kvp_kv_config_init(cfg);
    *why = "bad kv_role";
    if (strcmp(role->u.s, "kv_producer") == 0)
        cfg->kv_role = KVP_KV_ROLE_PRODUCER;
    else if (strcmp(role->u.s, "kv_consumer") == 0)
        cfg->kv_role = KVP_KV_ROLE_CONSUMER;
    else if (strcmp(role->u.s, "kv_both") == 0)
        cfg->kv_role = KVP_KV_ROLE_BOTH;
    else
        return -1;
    cfg->load_async = la->type == KVP__JSON_TRUE;
    cfg->lookup_async = lk->type == KVP__JSON_TRUE;
    cfg->enable_lookup = el->type == KVP__JSON_TRUE;
    cfg->block_size = bs->u.i;
    cfg->hash_block_size = hbs->u.i;
    cfg->partial_hits = ph->type == KVP__JSON_TRUE;
    *why = "block_size must be a positive multiple of hash_block_size";
    if (cfg->block_size < 1 || cfg->hash_block_size < 1 || cfg->block_size % cfg->hash_block_size)
        return -1;
    *why = "partial_hits needs block_size > hash_block_size";
    if (cfg->partial_hits && !(cfg->block_size > cfg->hash_block_size))
        return -1;
    return 0;
}

static bool blank_char(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
           (c >= 0x1c && c <= 0x1f);
}

static void replay_cleanup(replay_t *R)
{
    kvp_kv_sched_destroy(R->sched);
    kvp_kv_scripted_destroy(R->sc);
    for (size_t i = 0; i < R->reqs.cap; i++) {
        rreq_t *r = R->reqs.slots[i].val;
        if (!R->reqs.slots[i].key || !r)
            continue;
        if (r->toks)
            kvp__free(r->toks, r->toks_cap * sizeof(int64_t));
        kvp__free(r, sizeof *r + r->id_len + 1);
    }
    kvp__strmap_cleanup(&R->reqs);
    kvp__strmap_cleanup(&R->nst);
    kvp__json_parser_cleanup(&R->jp);
    sc_reset(&R->scr, true);
    kvp__jw_cleanup(&R->out);
}

static int flush_out(replay_t *R)
{
    if (R->out.oom) {
        fprintf(stderr, "kv-sched-replay: out of memory\n");
        return -1;
    }
    if (R->out.len && fwrite(R->out.p, 1, R->out.len, stdout) != R->out.len)
        return -1;
    R->out.len = 0;
    return 0;
}

int kvp_cmd_kv_sched_replay(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: kvpool kv-sched-replay < events.jsonl > outputs.jsonl\n"
                   "Replays a kv-sched-replay v1 stream through the C KV scheduler and writes\n"
                   "one canonical JSON line per event (see shared/tools/kvsched-ref/README.md).\n");
            return 0;
        }
        fprintf(stderr, "kv-sched-replay: unknown argument '%s'\n", argv[i]);
        return 2;
    }
    replay_t R;
    memset(&R, 0, sizeof R);
    kvp__strmap_init(&R.reqs);
    kvp__strmap_init(&R.nst);
    kvp__json_parser_init(&R.jp);
    char *line = NULL;
    size_t lcap = 0;
    ssize_t got;
    int rc = 0;
    while ((got = getline(&line, &lcap, stdin)) >= 0) {
        R.lineno++;
        size_t b = 0, e = (size_t)got;
        while (b < e && blank_char(line[b]))
            b++;
        while (e > b && blank_char(line[e - 1]))
            e--;
        if (b == e)
            continue;
        if (!R.sched) {
            kvp_kv_config_t cfg;
            const char *why;
            if (parse_config(&R, line + b, e - b, &cfg, &why) != 0) {
                fprintf(stderr, "kv-sched-replay: bad config line: %s\n", why);
                rc = 2;
                break;
            }
            if (kvp_kv_scripted_create(&R.sc) != KVP_OK ||
                kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(R.sc), &R.sched) != KVP_OK) {
                fprintf(stderr, "kv-sched-replay: cannot create the scheduler\n");
                rc = 2;
                break;
            }
            OB_LIT(&R.out, "{\"ret\":null}\n");
            continue;
        }
        handle(&R, line + b, e - b);
        if (R.out.len > (1u << 20) && flush_out(&R) != 0) {
            rc = 1;
            break;
        }
    }
    if (rc == 0 && flush_out(&R) != 0)
        rc = 1;
    fflush(stdout);
    free(line);
    replay_cleanup(&R);
    return rc;
}
