/* The engine's block pool and local prefix cache (see blockpool.h). */
#include "engine/blockpool.h"

#include <string.h>

#include "common/alloc.h"

kvp_status_t kvp__bp_init(kvp__bp_t *bp, int64_t num_blocks)
{
    memset(bp, 0, sizeof *bp);
    kvp__list_init(&bp->free_q);
    kvp__strmap_init(&bp->cached);
    if (num_blocks <= 0)
        return KVP_ERR_INVALID_ARG;
    bp->blocks = kvp__calloc((size_t)num_blocks, sizeof *bp->blocks);
    if (!bp->blocks)
        return KVP_ERR_NO_MEMORY;
    bp->num_blocks = bp->num_free = num_blocks;
    for (int64_t i = 0; i < num_blocks; i++)
        kvp__list_add_tail(&bp->free_q, &bp->blocks[i].free_node);
    return KVP_OK;
}

void kvp__bp_cleanup(kvp__bp_t *bp)
{
    kvp__free(bp->blocks, (size_t)bp->num_blocks * sizeof *bp->blocks);
    kvp__strmap_cleanup(&bp->cached);
    memset(bp, 0, sizeof *bp);
}

int64_t kvp__bp_lookup(const kvp__bp_t *bp, const uint8_t *hashes, int64_t n, int64_t *ids)
{
    int64_t i = 0;
    for (; i < n; i++) {
        kvp__bp_block_t *b = kvp__strmap_get(&bp->cached, (const char *)hashes + i * KVP__BP_HASH_LEN,
                                             KVP__BP_HASH_LEN);
        if (!b)
            break;
        if (ids)
            ids[i] = b - bp->blocks;
    }
    return i;
}

void kvp__bp_touch(kvp__bp_t *bp, const int64_t *ids, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        kvp__bp_block_t *b = &bp->blocks[ids[i]];
        if (b->ref++ == 0) {
            kvp__list_del(&b->free_node);
            bp->num_free--;
        }
    }
}

static void uncache(kvp__bp_t *bp, kvp__bp_block_t *b)
{
    if (!b->cached)
        return;
    kvp__strmap_del(&bp->cached, (const char *)b->hash, KVP__BP_HASH_LEN);
    b->cached = false;
    bp->evictions++;
}

kvp_status_t kvp__bp_alloc(kvp__bp_t *bp, int64_t n, int64_t *ids)
{
    if (n > bp->num_free)
        return KVP_ERR_NO_SPACE;
    for (int64_t i = 0; i < n; i++) {
        kvp__bp_block_t *b = KVP_CONTAINER_OF(kvp__list_first(&bp->free_q), kvp__bp_block_t, free_node);
        kvp__list_del(&b->free_node);
        bp->num_free--;
        uncache(bp, b);
        b->ref = 1;
        ids[i] = b - bp->blocks;
    }
    return KVP_OK;
}

void kvp__bp_cache(kvp__bp_t *bp, int64_t id, const uint8_t *hash)
{
    kvp__bp_block_t *b = &bp->blocks[id];
    if (b->cached || kvp__strmap_get(&bp->cached, (const char *)hash, KVP__BP_HASH_LEN))
        return;
    memcpy(b->hash, hash, KVP__BP_HASH_LEN);
    if (kvp__strmap_put(&bp->cached, (const char *)b->hash, KVP__BP_HASH_LEN, b) == KVP_OK)
        b->cached = true; /* out of memory: the block just stays uncached */
}

void kvp__bp_free(kvp__bp_t *bp, const int64_t *ids, int64_t n)
{
    for (int64_t i = n; i-- > 0;) {
        kvp__bp_block_t *b = &bp->blocks[ids[i]];
        if (b->ref > 0 && --b->ref == 0) {
            kvp__list_add_tail(&bp->free_q, &b->free_node);
            bp->num_free++;
        }
    }
}
