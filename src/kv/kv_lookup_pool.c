/*
 * The in-process pool lookup (include/kvpool/kv_connector.h, "In-process pool
 * lookup"): the hit the worker rank 0 would answer on the lookup channel,
 * computed here over include/kvpool/pool.h.  The chain is
 *
 *     kv_sched (K3) -> lookup ops -> kv_keys.c (the §2.3 key builder) -> pool.h
 *
 * all inside src/kv.  It follows connectors-spec §2.4, "How the worker
 * computes a hit", for one full-attention group (group id 0):
 *
 *   step 1  token_len = floor(num_tokens / block_size) * block_size; no hashes
 *           or token_len <= 0 gives 0.  (Capacity-only mode is the
 *           scheduler's enable_lookup, K1; partial hits are refused at create.)
 *   step 2  chunks c = 0 .. min(num_chunk_hashes, token_len / block_size) - 1,
 *           where chunk c's hash is block_hashes[(c+1) * ratio - 1] with
 *           ratio = block_size / hash_block_size (§2.3 "chunk_hash": the
 *           chunk's last sub-hash).  One key per chunk and rank namespace; the
 *           namespaces are the cross product of pcp ranks, tp_size / factor
 *           shard ranks and pp ranks (with DCP the factor is 1, so every tp
 *           rank is a shard, and its dcp field is tp % dcp_size).
 *   step 3  a chunk is present only if EVERY namespace stored it (the
 *           every-rank rule); any pool error is returned, and the scheduler
 *           treats it as a hit of 0, as the worker's "any exception returns 0".
 *   step 4  for a single full-attention group the hit is the longest run of
 *           present chunks from chunk 0, times block_size.
 *   step 5  a hit >= num_tokens is cut to align(num_tokens - 1): the last
 *           prompt token is always recomputed (the last-token rule).
 *
 * One batch for all ranks.  The keys go to kvp_pool_prefix chunk-major:
 * chunk 0 of every namespace, then chunk 1 of every namespace, and so on.  If
 * the pool answers a prefix of m keys, chunks 0 .. m/R - 1 (R namespaces) are
 * present on every rank and chunk m/R is missing on at least one, so
 * floor(m / R) is exactly the run of steps 3-4, found in one round trip
 * instead of one per rank.  A request with more than KVP_BATCH_MAX keys is
 * asked in windows of whole chunks, the next window only when the previous
 * one was all present.  The key texts and views of a window live in scratch
 * buffers owned by the lookup and grown as needed (a lookup is used by one
 * thread at a time), so a lookup allocates nothing once warm.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kvpool/kv_connector.h"

struct kvp_kv_lookup_pool {
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_params_t p; /* copy; its strings point at model/prefix below */
    char *model;                   /* the model name (last path component) */
    size_t model_len;
    char *prefix;                  /* NULL: no prefix */
    size_t prefix_len;
    uint32_t num_shards;           /* tp_size / replication factor */
    uint32_t num_ns;               /* rank namespaces: pcp * shards * pp */
    size_t window;                 /* chunks per kvp_pool_prefix batch */
    kvp_key_t *keys;               /* scratch: one window's key views */
    size_t keys_cap;
    char *text;                    /* scratch: one window's key texts */
    size_t text_cap;
    size_t *ends;                  /* scratch: where each key's text ends */
    size_t ends_cap;
};

void kvp_kv_lookup_pool_params_init(kvp_kv_lookup_pool_params_t *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->size = sizeof *params;
    params->tp_size = params->pp_size = params->pcp_size = params->dcp_size = 1;
    params->num_kv_heads = 1;
    params->group_kind = KVP_KV_GROUP_FULL_ATTENTION;
    params->block_size = 16;
    params->hash_block_size = 16;
}

/* The key of chunk hash `h` in rank namespace `ns` (see step 2's order). */
static void ns_key(const kvp_kv_lookup_pool_t *lk, uint32_t ns, kvp_kv_store_key_t *k)
{
    uint32_t pp = ns % lk->p.pp_size, rest = ns / lk->p.pp_size;
    uint32_t shard = rest % lk->num_shards, pcp = rest / lk->num_shards;
    memset(k, 0, sizeof *k);
    k->cache_prefix = lk->prefix;
    k->cache_prefix_len = lk->prefix_len;
    k->model_name = lk->model;
    k->model_name_len = lk->model_len;
    k->tp_rank = shard;
    k->pcp_rank = pcp;
    k->dcp_rank = lk->p.dcp_size > 1 ? shard % lk->p.dcp_size : 0;
    k->pp_rank = pp;
    k->group_id = 0;
}

/* Formats the keys of chunks [first, first + n) of req, chunk-major, into the
 * scratch buffers; lk->keys[0 .. n * num_ns) are their views. */
static kvp_status_t build_window(kvp_kv_lookup_pool_t *lk, const kvp_kv_request_t *req,
                                 size_t first, size_t n)
{
    size_t ratio = (size_t)(lk->p.block_size / lk->p.hash_block_size);
    size_t nkeys = n * lk->num_ns, used = 0;
    if (kvp__grow_in((void **)&lk->keys, &lk->keys_cap, nkeys, sizeof *lk->keys, 64) ||
        kvp__grow_in((void **)&lk->ends, &lk->ends_cap, nkeys, sizeof *lk->ends, 64))
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st;
    for (size_t c = 0; c < n; c++) {
        const uint8_t *h = req->block_hashes + ((first + c + 1) * ratio - 1) * req->hash_len;
        for (uint32_t ns = 0; ns < lk->num_ns; ns++) {
            kvp_kv_store_key_t k;
            ns_key(lk, ns, &k);
            k.hash.len = (uint8_t)req->hash_len;
            memcpy(k.hash.bytes, h, req->hash_len);
            size_t len;
            if (kvp__grow_in((void **)&lk->text, &lk->text_cap, used + KVP_KV_STORE_KEY_MAX + 1, 1, 64))
                return KVP_ERR_NO_MEMORY;
            st = kvp_kv_store_key_format(&k, lk->text + used, lk->text_cap - used, &len);
            if (st != KVP_OK)
                return st;
            used += len;
            lk->ends[c * lk->num_ns + ns] = used;
        }
    }
    /* The text buffer may have moved while growing: take the views now. */
    for (size_t i = 0, start = 0; i < nkeys; start = lk->ends[i++])
        lk->keys[i] = (kvp_key_t){lk->text + start, (uint32_t)(lk->ends[i] - start)};
    return KVP_OK;
}

static kvp_status_t pool_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block,
                                int64_t *hit_p)
{
    (void)non_block; /* the answer is always there: never KVP_INPROGRESS */
    kvp_kv_lookup_pool_t *lk = ctx;
    if (!req || !hit_p)
        return KVP_ERR_NULL_POINTER;
    *hit_p = 0;
    int64_t bs = lk->p.block_size;
    int64_t token_len = req->num_tokens > 0 ? req->num_tokens / bs * bs : 0; /* step 1 */
    if (req->num_block_hashes == 0 || req->hash_len == 0 || token_len <= 0)
        return KVP_OK;
    if (!req->block_hashes || req->hash_len > KVP_HASH_MAX_LEN) {
        kvp_error("kv pool lookup: %s: %zu block hashes of %u bytes", req->req_id,
                  req->num_block_hashes, req->hash_len);
        return KVP_ERR_INVALID_ARG;
    }
    /* Step 2: the chunks that have both a chunk hash and tokens. */
    size_t ratio = (size_t)(bs / lk->p.hash_block_size);
    size_t nchunks = req->num_block_hashes / ratio;
    if ((uint64_t)(token_len / bs) < nchunks)
        nchunks = (size_t)(token_len / bs);
    /* Steps 3-4, one batch for all ranks per window (see the top). */
    size_t run = 0;
    for (size_t first = 0; first < nchunks;) {
        size_t n = nchunks - first < lk->window ? nchunks - first : lk->window;
        kvp_status_t st = build_window(lk, req, first, n);
        size_t m = 0;
        if (st == KVP_OK)
            st = kvp_pool_prefix(lk->pool, lk->keys, n * lk->num_ns, &m);
        if (st != KVP_OK) {
            kvp_warn("kv pool lookup: %s: %s", req->req_id, kvp_status_str(st));
            return st;
        }
        run += m / lk->num_ns;
        if (m < n * lk->num_ns)
            break;
        first += n;
    }
    int64_t hit = (int64_t)run * bs;
    if (hit >= req->num_tokens) /* step 5: the last token is recomputed */
        hit = (req->num_tokens - 1) / bs * bs;
    *hit_p = hit;
    return KVP_OK;
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
    kvp_status_t st = kvp_pool_remove_all(lk->pool, NULL);
    if (st != KVP_OK)
        return st;
    *ack_p = true;
    return KVP_OK;
}

static const kvp_kv_lookup_ops_t g_pool_ops = {pool_lookup, pool_discard, pool_reset};

/* KVP_OK when p is in scope and well-formed; logs what is not. */
static kvp_status_t check_params(const kvp_kv_lookup_pool_params_t *p)
{
    if (p->size < sizeof *p) {
        kvp_error("kv pool lookup: params.size %zu < %zu (call kvp_kv_lookup_pool_params_init)",
                  p->size, sizeof *p);
        return KVP_ERR_BAD_CONFIG;
    }
    if ((unsigned)p->group_kind > KVP_KV_GROUP_MLA) {
        kvp_error("kv pool lookup: unknown group kind %d", (int)p->group_kind);
        return KVP_ERR_BAD_CONFIG;
    }
    /* STAGE 1: one full-attention group (the hybrid rule comes with kv_coord.c). */
    kvp_kv_group_kind_t kind = p->groups && p->num_groups ? p->groups[0].kind : p->group_kind;
    if ((p->groups && p->num_groups > 1) ||
        (kind != KVP_KV_GROUP_FULL_ATTENTION && kind != KVP_KV_GROUP_MLA)) {
        kvp_error("kv pool lookup: only one full-attention group is served (%u groups, kind %d)",
                  p->num_groups, (int)kind);
        return KVP_ERR_UNSUPPORTED;
    }
    if (!p->model_name) {
        kvp_error("kv pool lookup: model_name is NULL");
        return KVP_ERR_BAD_CONFIG;
    }
    if (p->tp_size < 1 || p->pp_size < 1 || p->pcp_size < 1 || p->dcp_size < 1 ||
        p->tp_size % p->dcp_size || p->block_size < 1 || p->hash_block_size < 1 ||
        p->block_size % p->hash_block_size) {
        kvp_error("kv pool lookup: tp %u pp %u pcp %u dcp %u block %lld hash block %lld",
                  p->tp_size, p->pp_size, p->pcp_size, p->dcp_size, (long long)p->block_size,
                  (long long)p->hash_block_size);
        return KVP_ERR_BAD_CONFIG;
    }
    return KVP_OK;
}

kvp_status_t kvp_kv_lookup_pool_create(kvp_pool_t *pool, const kvp_kv_lookup_pool_params_t *params,
                                       kvp_kv_lookup_pool_t **lookup_p)
{
    if (!pool || !params || !lookup_p)
        return KVP_ERR_NULL_POINTER;
    *lookup_p = NULL;
    kvp_status_t st = check_params(params);
    if (st != KVP_OK)
        return st;
    uint32_t factor;
    st = kvp_kv_store_key_replication_factor(params->groups && params->num_groups
                                                 ? params->groups[0].kind
                                                 : params->group_kind, params->tp_size,
                                             params->num_kv_heads, params->dcp_size, &factor);
    if (st != KVP_OK)
        return KVP_ERR_BAD_CONFIG;
    uint64_t shards = params->tp_size / factor;
    uint64_t ns = (uint64_t)params->pcp_size * shards * params->pp_size;
    if (ns > KVP_BATCH_MAX) {
        kvp_error("kv pool lookup: %llu rank namespaces, more than a batch (%u)",
                  (unsigned long long)ns, KVP_BATCH_MAX);
        return KVP_ERR_BAD_CONFIG;
    }
    const char *name;
    size_t name_len;
    if (kvp_kv_store_key_model_name(params->model_name, strlen(params->model_name), &name,
                                    &name_len) != KVP_OK)
        return KVP_ERR_BAD_CONFIG;

    kvp_kv_lookup_pool_t *lk = kvp__calloc(1, sizeof *lk);
    if (!lk)
        return KVP_ERR_NO_MEMORY;
    lk->pool = pool;
    lk->p = *params;
    lk->p.size = sizeof lk->p;
    lk->num_shards = (uint32_t)shards;
    lk->num_ns = (uint32_t)ns;
    lk->window = KVP_BATCH_MAX / lk->num_ns;
    lk->model_len = name_len;
    lk->model = kvp__malloc(name_len + 1);
    const char *prefix = params->cache_prefix ? params->cache_prefix : "";
    lk->prefix_len = strlen(prefix);
    if (lk->prefix_len)
        lk->prefix = kvp__strdup(prefix);
    if (!lk->model || (lk->prefix_len && !lk->prefix)) {
        kvp_kv_lookup_pool_destroy(lk);
        return KVP_ERR_NO_MEMORY;
    }
    memcpy(lk->model, name, name_len);
    lk->model[name_len] = '\0';
    lk->p.model_name = lk->model;
    lk->p.cache_prefix = lk->prefix;
    lk->p.groups = NULL; /* (stage 1: the one group's kind is all that is kept) */
    /* The longest key this lookup can build (the largest rank of every field,
     * a 32-byte hash) must pass the key format: it also checks model and
     * prefix once here, so a lookup never fails on them. */
    kvp_kv_store_key_t k;
    ns_key(lk, lk->num_ns - 1, &k);
    k.hash.len = KVP_HASH_MAX_LEN;
    char probe[KVP_KV_STORE_KEY_MAX + 1];
    if (kvp_kv_store_key_format(&k, probe, sizeof probe, NULL) != KVP_OK) {
        kvp_kv_lookup_pool_destroy(lk);
        return KVP_ERR_BAD_CONFIG;
    }
    *lookup_p = lk;
    return KVP_OK;
}

void kvp_kv_lookup_pool_destroy(kvp_kv_lookup_pool_t *lk)
{
    if (!lk)
        return;
    if (lk->model)
        kvp__free(lk->model, lk->model_len + 1);
    if (lk->prefix)
        kvp__free(lk->prefix, lk->prefix_len + 1);
    if (lk->keys)
        kvp__free(lk->keys, lk->keys_cap * sizeof *lk->keys);
    if (lk->ends)
        kvp__free(lk->ends, lk->ends_cap * sizeof *lk->ends);
    if (lk->text)
        kvp__free(lk->text, lk->text_cap);
    kvp__free(lk, sizeof *lk);
}

kvp_kv_lookup_client_t kvp_kv_lookup_pool_client(kvp_kv_lookup_pool_t *lk)
{
    return (kvp_kv_lookup_client_t){&g_pool_ops, lk};
}

/* STAGE 1 of the wire lookup: the one-group rule above, reasons coarse. */
kvp_status_t kvp_kv_lookup_pool_query(kvp_kv_lookup_pool_t *lk, int64_t num_tokens,
                                      const uint8_t *hashes, size_t num_hashes, uint32_t hash_len,
                                      bool apply_eagle, kvp_kv_lookup_result_t *res_p)
{
    (void)apply_eagle;
    if (!lk || !res_p || (num_hashes && !hashes))
        return KVP_ERR_NULL_POINTER;
    memset(res_p, 0, sizeof *res_p);
    res_p->block_index = -1;
    if (num_hashes && (hash_len == 0 || hash_len > KVP_HASH_MAX_LEN))
        return KVP_ERR_INVALID_ARG;
    kvp_kv_request_t req = {.req_id = "lookup", .num_tokens = num_tokens,
                            .block_hashes = hashes, .num_block_hashes = num_hashes,
                            .hash_len = hash_len};
    int64_t hit = 0;
    kvp_status_t st = pool_lookup(lk, &req, false, &hit);
    res_p->hit_tokens = st == KVP_OK ? hit : 0;
    res_p->reason = st != KVP_OK ? KVP_KV_MISS_POOL_ERROR
                    : num_hashes == 0 ? KVP_KV_MISS_NO_HASHES
                                      : KVP_KV_MISS_NONE;
    return KVP_OK;
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
    (void)lk;
    if (stats_p)
        memset(stats_p, 0, sizeof *stats_p);
}
