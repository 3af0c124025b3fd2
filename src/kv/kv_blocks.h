/*
 * Shared, mutable block-id tuples and immutable token-id arrays, reference
 * counted.  They model Python object identity where the original relies on
 * it (kvsched-ref README, "Shared lists"): K13's tracker holds the very tuple
 * stored in _unfinished_requests, RequestTracker.update appends to its lists
 * in place, and a ReqMeta's block_ids/token_ids are the tracker's own objects
 * (read when build_connector_meta returns).  NULL stands for the empty tuple
 * `()` and for token_ids None.
 */
#ifndef KVP_KV_BLOCKS_H
#define KVP_KV_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/kv_connector.h"

typedef struct kvp__kv_glist {
    int64_t *ids;
    size_t n, cap;
} kvp__kv_glist_t;

typedef struct kvp__kv_btuple {
    uint32_t refs;
    uint32_t num_groups; /* >= 1 (zero groups is NULL) */
    kvp__kv_glist_t g[];
} kvp__kv_btuple_t;

typedef struct kvp__kv_tokens {
    uint32_t refs;
    size_t n; /* >= 1 (empty is NULL) */
    int64_t v[];
} kvp__kv_tokens_t;

/* A fresh tuple holding copies of the lists in b; NULL result with KVP_OK when
 * b has zero groups. */
kvp_status_t kvp__kv_btuple_copy(const kvp_kv_blocks_t *b, kvp__kv_btuple_t **t_p);
static inline kvp__kv_btuple_t *kvp__kv_btuple_ref(kvp__kv_btuple_t *t)
{
    if (t)
        t->refs++;
    return t;
}
void kvp__kv_btuple_unref(kvp__kv_btuple_t *t);
/* Appends each non-empty list of b to the matching list of t, in place.
 * The group counts must be equal (checked by the caller). */
kvp_status_t kvp__kv_btuple_extend(kvp__kv_btuple_t *t, const kvp_kv_blocks_t *b);
size_t kvp__kv_btuple_total(const kvp__kv_btuple_t *t);

/* A token array holding v[0..n); NULL result with KVP_OK when n == 0. */
kvp_status_t kvp__kv_tokens_new(const int64_t *v, size_t n, kvp__kv_tokens_t **t_p);
static inline kvp__kv_tokens_t *kvp__kv_tokens_ref(kvp__kv_tokens_t *t)
{
    if (t)
        t->refs++;
    return t;
}
void kvp__kv_tokens_unref(kvp__kv_tokens_t *t);

#endif
