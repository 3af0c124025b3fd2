#include "common/arena.h"

#include "common/alloc.h"

#define CHUNK_FIRST (4u << 10)
#define CHUNK_MAX_STEP (1u << 20)

struct kvp__arena_chunk {
    kvp__arena_chunk_t *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

void *kvp__arena_alloc(kvp__arena_t *a, size_t n)
{
    n = n ? (n + 15) & ~(size_t)15 : 16;
    kvp__arena_chunk_t *c = a->chunks;
    if (!c || c->size - c->used < n) {
        size_t sz = !c ? CHUNK_FIRST : c->size < CHUNK_MAX_STEP ? c->size * 2 : CHUNK_MAX_STEP;
        if (sz < n)
            sz = n;
        kvp__arena_chunk_t *nc = kvp__malloc(sizeof *nc + sz);
        if (!nc)
            return NULL;
        nc->size = sz;
        nc->used = 0;
        nc->next = c;
        a->chunks = c = nc;
    }
    void *r = c->data + c->used;
    c->used += n;
    return r;
}

void kvp__arena_reset(kvp__arena_t *a)
{
    kvp__arena_chunk_t *best = NULL, *c = a->chunks;
    while (c) {
        kvp__arena_chunk_t *n = c->next;
        if (!best || c->size > best->size) {
            if (best)
                kvp__free(best, sizeof *best + best->size);
            best = c;
        } else {
            kvp__free(c, sizeof *c + c->size);
        }
        c = n;
    }
    if (best) {
        best->next = NULL;
        best->used = 0;
    }
    a->chunks = best;
}

void kvp__arena_cleanup(kvp__arena_t *a)
{
    kvp__arena_chunk_t *c = a->chunks;
    while (c) {
        kvp__arena_chunk_t *n = c->next;
        kvp__free(c, sizeof *c + c->size);
        c = n;
    }
    a->chunks = NULL;
}
