/*
 * A two-level segregated-fit allocator (TLSF) over one arena region.
 *
 * Why TLSF: allocation and free are O(1) with bounded worst case, any size
 * from a few bytes to the whole arena is served from one region, and free
 * blocks coalesce immediately, so uniform KV blocks and odd sizes mix without
 * a size-class table to tune.  Block headers (16 bytes) live in the arena in
 * front of each payload; payloads are 16-byte aligned.
 *
 * Not thread-safe: the store serialises calls with its allocator lock.
 */
#ifndef KVP_STORE_TLSF_H
#define KVP_STORE_TLSF_H

#include <stddef.h>
#include <stdint.h>

#define KVP_TLSF_SL_LOG2 5
#define KVP_TLSF_SL_COUNT (1 << KVP_TLSF_SL_LOG2)
#define KVP_TLSF_ALIGN 16u
#define KVP_TLSF_FL_SHIFT (KVP_TLSF_SL_LOG2 + 4) /* sizes below 512 B: one linear level */
#define KVP_TLSF_FL_MAX 42                      /* arenas up to 4 TiB */
#define KVP_TLSF_FL_COUNT (KVP_TLSF_FL_MAX - KVP_TLSF_FL_SHIFT + 1)
#define KVP_TLSF_OVERHEAD 16u                   /* header bytes per block */

struct kvp__tlsf_blk;

typedef struct kvp__tlsf {
    char *base;
    uint64_t size;        /* managed bytes (region rounded down, minus the end sentinel) */
    uint64_t used;        /* bytes in allocated blocks, headers included */
    uint64_t fl_bitmap;
    uint32_t sl_bitmap[KVP_TLSF_FL_COUNT];
    struct kvp__tlsf_blk *free[KVP_TLSF_FL_COUNT][KVP_TLSF_SL_COUNT];
} kvp__tlsf_t;

/* Manages [base, base+size).  Returns 0, or -1 if the region is too small. */
int kvp__tlsf_init(kvp__tlsf_t *t, void *base, uint64_t size);
/* A payload of at least `size` bytes, or NULL when no free block fits. */
void *kvp__tlsf_alloc(kvp__tlsf_t *t, uint64_t size);
/* Frees a payload returned by kvp__tlsf_alloc. */
void kvp__tlsf_free(kvp__tlsf_t *t, void *payload);
/* Bytes the block holding `payload` occupies (header included). */
uint64_t kvp__tlsf_block_size(const void *payload);
/* Arena bytes a payload of `size` bytes will occupy. */
uint64_t kvp__tlsf_footprint(uint64_t size);
/* Walks every block checking the invariants (tests); returns 0 when sound. */
int kvp__tlsf_check(const kvp__tlsf_t *t);

#endif
