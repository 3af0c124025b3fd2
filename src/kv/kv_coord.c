/*
 * The hybrid hit rule (kv_coord.h).  STAGE 1: full-attention (and MLA)
 * groups only, without partial hits; sliding-window and Mamba groups are
 * refused at create (KVP_ERR_UNSUPPORTED).  The full rule replaces this file.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kv/kv_coord.h"

struct kvp__kv_coord {
    uint32_t n;
    int64_t block_size, hash_block_size;
    bool use_eagle;
    kvp_kv_cache_group_t g[KVP_KV_MAX_GROUPS];
};

void kvp__kv_masks_free(kvp__kv_masks_t *m)
{
    if (!m)
        return;
    for (uint32_t g = 0; g < KVP_KV_MAX_GROUPS; g++)
        if (m->g[g].bits)
            kvp__free(m->g[g].bits, m->g[g].cap);
    memset(m, 0, sizeof *m);
}

kvp_status_t kvp__kv_coord_create(const kvp_kv_cache_group_t *groups, uint32_t n,
                                  int64_t block_size, int64_t hash_block_size, bool use_eagle,
                                  kvp__kv_coord_t **coord_p)
{
    *coord_p = NULL;
    if (n < 1 || n > KVP_KV_MAX_GROUPS || block_size < 1 || hash_block_size < 1 ||
        block_size % hash_block_size) {
        kvp_error("kv coord: %u groups, block %lld, hash block %lld", n, (long long)block_size,
                  (long long)hash_block_size);
        return KVP_ERR_BAD_CONFIG;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (groups[i].kind != KVP_KV_GROUP_FULL_ATTENTION && groups[i].kind != KVP_KV_GROUP_MLA)
            return KVP_ERR_UNSUPPORTED;
        if (groups[i].block_size != block_size)
            return KVP_ERR_UNSUPPORTED;
    }
    kvp__kv_coord_t *c = kvp__calloc(1, sizeof *c);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    c->n = n;
    c->block_size = block_size;
    c->hash_block_size = hash_block_size;
    c->use_eagle = use_eagle;
    memcpy(c->g, groups, n * sizeof *groups);
    *coord_p = c;
    return KVP_OK;
}

void kvp__kv_coord_destroy(kvp__kv_coord_t *c)
{
    if (c)
        kvp__free(c, sizeof *c);
}

uint32_t kvp__kv_coord_num_groups(const kvp__kv_coord_t *c) { return c->n; }
const kvp_kv_cache_group_t *kvp__kv_coord_group(const kvp__kv_coord_t *c, uint32_t g)
{
    return &c->g[g];
}
bool kvp__kv_coord_partial(const kvp__kv_coord_t *c)
{
    (void)c;
    return false;
}
int64_t kvp__kv_coord_align(const kvp__kv_coord_t *c, int64_t len)
{
    return len > 0 ? len / c->block_size * c->block_size : 0;
}
size_t kvp__kv_coord_chunk_hash(const kvp__kv_coord_t *c, uint32_t g, size_t chunk)
{
    size_t ratio = (size_t)(c->g[g].block_size / c->hash_block_size);
    return (chunk + 1) * ratio - 1;
}

static void masks_all(const kvp__kv_coord_t *c, kvp__kv_masks_t *m)
{
    m->num_groups = c->n;
    for (uint32_t g = 0; g < c->n; g++)
        m->g[g].all = true, m->g[g].len = 0;
}

int64_t kvp__kv_coord_find_hit(const kvp__kv_coord_t *c, size_t num_hashes, int64_t max_length,
                               kvp__kv_present_fn present, void *arg, bool apply_eagle,
                               kvp__kv_masks_t *masks, uint32_t *bound_group_p)
{
    size_t ratio = (size_t)(c->block_size / c->hash_block_size);
    size_t nchunks = num_hashes / ratio;
    if (max_length < 0)
        max_length = 0;
    if ((uint64_t)(max_length / c->block_size) < nchunks)
        nchunks = (size_t)(max_length / c->block_size);
    size_t run = 0;
    uint32_t bound = 0;
    for (; run < nchunks; run++) {
        bool ok = true;
        for (uint32_t g = 0; g < c->n && ok; g++)
            if (present && !present(arg, g, kvp__kv_coord_chunk_hash(c, g, run)))
                ok = false, bound = g;
        if (!ok)
            break;
    }
    int64_t hit = (int64_t)run * c->block_size;
    if (apply_eagle && c->use_eagle && hit > 0)
        hit -= c->block_size;
    if (masks)
        masks_all(c, masks);
    if (bound_group_p)
        *bound_group_p = bound;
    return hit;
}

kvp_status_t kvp__kv_coord_lookup_mask(const kvp__kv_coord_t *c, int64_t aligned_len,
                                       kvp__kv_masks_t *masks)
{
    (void)aligned_len;
    masks_all(c, masks);
    return KVP_OK;
}

kvp_status_t kvp__kv_coord_store_mask(const kvp__kv_coord_t *c, int64_t aligned_len,
                                      int64_t start_token, int64_t num_prompt_tokens,
                                      kvp__kv_masks_t *masks)
{
    (void)aligned_len, (void)start_token, (void)num_prompt_tokens;
    masks_all(c, masks);
    return KVP_OK;
}

kvp_status_t kvp__kv_coord_load_mask(const kvp__kv_coord_t *c, size_t num_hashes,
                                     int64_t token_len, kvp__kv_masks_t *masks)
{
    (void)num_hashes, (void)token_len;
    masks_all(c, masks);
    return KVP_OK;
}
