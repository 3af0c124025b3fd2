/*
 * An engine instance's KV block pool with its local prefix cache, as vLLM's
 * BlockPool: blocks have a reference count; a full block is cached under its
 * block hash; a block whose count drops to 0 goes to the tail of the free
 * queue still cached, so a later request can hit it; allocation takes the
 * head of the queue (the least recently freed) and evicts its hash.  A
 * request's blocks are freed tail first, so its last blocks are evicted
 * first.  One hash maps to one block (a second block computed with the same
 * hash stays uncached).  Not thread-safe: its instance serialises.
 */
#ifndef KVP_ENGINE_BLOCKPOOL_H
#define KVP_ENGINE_BLOCKPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/list.h"
#include "common/strmap.h"
#include "kvpool/status.h"

#define KVP__BP_HASH_LEN 32u

typedef struct kvp__bp_block {
    kvp__list_t free_node; /* linked while ref == 0 */
    int32_t ref;
    bool cached;
    uint8_t hash[KVP__BP_HASH_LEN];
} kvp__bp_block_t;

typedef struct kvp__bp {
    kvp__bp_block_t *blocks;
    int64_t num_blocks;
    int64_t num_free; /* ref == 0 (cached or not) */
    kvp__list_t free_q;
    kvp__strmap_t cached; /* hash -> block */
    uint64_t evictions;   /* cached blocks reused for new content */
} kvp__bp_t;

kvp_status_t kvp__bp_init(kvp__bp_t *bp, int64_t num_blocks);
void kvp__bp_cleanup(kvp__bp_t *bp);
/* Leading hashes[0..n) (KVP__BP_HASH_LEN bytes each) that are cached, with
 * their blocks into ids (may be NULL); nothing is touched. */
int64_t kvp__bp_lookup(const kvp__bp_t *bp, const uint8_t *hashes, int64_t n, int64_t *ids);
/* Takes a reference on each of ids[0..n) (a hit: out of the free queue). */
void kvp__bp_touch(kvp__bp_t *bp, const int64_t *ids, int64_t n);
/* n fresh blocks (ref 1) into ids, or KVP_ERR_NO_SPACE (nothing taken). */
kvp_status_t kvp__bp_alloc(kvp__bp_t *bp, int64_t n, int64_t *ids);
/* Caches block id under hash (a full block just computed or loaded). */
void kvp__bp_cache(kvp__bp_t *bp, int64_t id, const uint8_t *hash);
/* Drops a reference on each of ids[0..n), last first. */
void kvp__bp_free(kvp__bp_t *bp, const int64_t *ids, int64_t n);

#endif
