/*
 * The engine's encoder cache manager: vLLM's EncoderCacheManager
 * (vllm/v1/core/encoder_cache_manager.py) rule for rule.  Capacity is in
 * encoder embeddings.  An entry (one mm_hash) is referenced by the requests
 * that allocated it or found it cached; an entry nobody references is
 * *freeable*: it keeps its slots (a later request may still hit it) until an
 * allocation needs them, and then the oldest freeable entries are evicted
 * first and their hashes reported once by get_freed (the scheduler puts
 * them into SchedulerOutput.free_encoder_mm_hashes, and the connector's
 * build_connector_meta sees them).
 *
 * Invariants (kvp__ecm_check):
 *   num_free  = capacity - sum(embeds of every entry)
 *   num_freeable = num_free + sum(embeds of freeable entries)
 *   an entry is on the freeable list  <=>  its reference set is empty
 *
 * What vLLM keeps per request (request_cached_ids) lives in the caller's
 * request as one flag per feature (kvp__ecm_req_t.cached), so the manager
 * keeps no per-request state.  One thread.
 */
#ifndef KVP_ENGINE_MM_CACHE_H
#define KVP_ENGINE_MM_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/list.h"
#include "common/strmap.h"
#include "kvpool/ec_connector.h"

/* A request as the manager sees it (borrowed for each call). */
typedef struct kvp__ecm_req {
    const char *id;
    const kvp_ec_feature_t *features; /* identifier = mm_hash, num_embeds */
    size_t n;
    uint8_t *cached; /* n flags: request_cached_ids (the caller's storage) */
} kvp__ecm_req_t;

typedef struct kvp__ecm {
    int64_t capacity, num_free, num_freeable;
    kvp__strmap_t entries; /* mm_hash -> ecm entry (cached + num_embeds_by_hash) */
    kvp__list_t freeable;  /* entries with no reference, oldest first */
    char **freed;          /* evicted since the last get_freed (owned) */
    size_t n_freed, cap_freed;
    uint64_t evictions;
} kvp__ecm_t;

void kvp__ecm_init(kvp__ecm_t *m, int64_t capacity);
void kvp__ecm_cleanup(kvp__ecm_t *m);

/* check_and_update_cache: is features[i]'s hash cached?  If so the request
 * references it (leaving the freeable list if it was there). */
bool kvp__ecm_check_and_update(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i);
/* get_cached_num_encoder_embeds, or -1 (None). */
int64_t kvp__ecm_cached_embeds(const kvp__ecm_t *m, const char *mm_hash);
/* can_allocate: room for features[i] plus num_to_schedule already planned
 * this step, within the compute budget; evicts freeable entries (oldest
 * first) when the free slots alone do not suffice. */
bool kvp__ecm_can_allocate(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i, int64_t compute_budget,
                           int64_t num_to_schedule);
/* allocate (after can_allocate said yes).  KVP_ERR_NO_MEMORY, or
 * KVP_ERR_INVALID_ARG where vLLM asserts (no room, an embeds mismatch). */
kvp_status_t kvp__ecm_allocate(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i);
/* free_encoder_input / free (every cached input of the request). */
void kvp__ecm_free_input(kvp__ecm_t *m, const kvp__ecm_req_t *r, size_t i);
void kvp__ecm_free(kvp__ecm_t *m, const kvp__ecm_req_t *r);
/* get_freed_mm_hashes: the hashes evicted since the last call and not
 * cached again, moved into *out (owned; kvp_ec_strlist_cleanup). */
kvp_status_t kvp__ecm_get_freed(kvp__ecm_t *m, kvp_ec_strlist_t *out);
/* Is the hash an entry (cached, referenced or freeable)? */
bool kvp__ecm_has(const kvp__ecm_t *m, const char *mm_hash);
/* The invariants above; KVP_OK or KVP_ERR_INTERNAL. */
kvp_status_t kvp__ecm_check(const kvp__ecm_t *m);

#endif
