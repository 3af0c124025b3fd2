/*
 * A bump arena: many small allocations freed together.  Chunks grow
 * geometrically (4 KiB doubling up to 1 MiB steps, or the request's size),
 * so a small job costs one small block and a long-running user settles on
 * one chunk: kvp__arena_reset keeps the largest chunk, emptied, and frees the
 * rest.  Every pointer is 16-byte aligned.  Not thread-safe.
 */
#ifndef KVP_COMMON_ARENA_H
#define KVP_COMMON_ARENA_H

#include <stddef.h>

typedef struct kvp__arena_chunk kvp__arena_chunk_t;

typedef struct kvp__arena {
    kvp__arena_chunk_t *chunks; /* newest first */
} kvp__arena_t;

static inline void kvp__arena_init(kvp__arena_t *a) { a->chunks = NULL; }
/* n bytes (n == 0 still gives a distinct pointer), or NULL when out of memory. */
void *kvp__arena_alloc(kvp__arena_t *a, size_t n);
/* Frees everything allocated; keeps the largest chunk for reuse. */
void kvp__arena_reset(kvp__arena_t *a);
/* Frees everything, chunks included. */
void kvp__arena_cleanup(kvp__arena_t *a);

#endif
