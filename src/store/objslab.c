/*
 * Index objects (kvp__obj_t + key) come from a slab of their own rather than
 * malloc: size classes of 16 bytes, carved from 2 MiB chunks backed by
 * transparent huge pages.  Lookups touch one object per key at random; with
 * 4 KiB pages each such touch is also a TLB miss, with huge pages mostly not
 * (measured: about +20 % exists throughput at 1 M objects), and there is no
 * malloc header per object.  Freed slots go on their class's free list and
 * are reused; chunks go back to the system only when the store is destroyed.
 */
#include <string.h>
#include <sys/mman.h>

#include "common/alloc.h"
#include "common/log.h"
#include "store/store_int.h"

#define CHUNK_BYTES (2u << 20)

static uint32_t class_of(uint32_t klen)
{
    size_t bytes = (sizeof(kvp__obj_t) + klen + KVP_OBJ_STEP - 1) / KVP_OBJ_STEP * KVP_OBJ_STEP;
    return (uint32_t)((bytes - KVP_OBJ_MIN) / KVP_OBJ_STEP);
}

size_t kvp__obj_bytes(uint32_t klen)
{
    return KVP_OBJ_MIN + (size_t)class_of(klen) * KVP_OBJ_STEP;
}

/* A fresh 2 MiB-aligned chunk (so the kernel can back it with one huge page). */
static char *chunk_new(kvp__objslab_t *sl)
{
    if (kvp__alloc_should_fail())
        return NULL;
    size_t span = 2 * (size_t)CHUNK_BYTES;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *c = (char *)(((uintptr_t)raw + CHUNK_BYTES - 1) & ~((uintptr_t)CHUNK_BYTES - 1));
    if (c > raw)
        munmap(raw, (size_t)(c - raw));
    size_t tail = (size_t)(raw + span - (c + CHUNK_BYTES));
    if (tail)
        munmap(c + CHUNK_BYTES, tail);
    (void)madvise(c, CHUNK_BYTES, MADV_HUGEPAGE);
    kvp__spin_lock(&sl->chunk_lock);
    if (sl->nchunks == sl->cap) {
        size_t ncap = sl->cap ? sl->cap * 2 : 16;
        char **nc = kvp__realloc(sl->chunks, sl->cap * sizeof *nc, ncap * sizeof *nc);
        if (!nc) {
            kvp__spin_unlock(&sl->chunk_lock);
            munmap(c, CHUNK_BYTES);
            return NULL;
        }
        sl->chunks = nc;
        sl->cap = ncap;
    }
    sl->chunks[sl->nchunks++] = c;
    kvp__spin_unlock(&sl->chunk_lock);
    return c;
}

kvp__obj_t *kvp__obj_alloc(kvp__store_t *s, uint32_t klen)
{
    kvp__objslab_t *sl = &s->slab;
    uint32_t ci = class_of(klen);
    size_t size = kvp__obj_bytes(klen);
    kvp__objclass_t *c = &sl->cls[ci];
    kvp__spin_lock(&c->lock);
    void *p = c->free;
    if (p) {
        c->free = *(void **)p;
    } else {
        if (!c->bump || c->bump + size > c->end) {
            kvp__spin_unlock(&c->lock);
            char *chunk = chunk_new(sl);
            if (!chunk) {
                kvp_error("store: out of memory for index objects");
                return NULL;
            }
            kvp__spin_lock(&c->lock);
            /* The remainder of the old chunk is abandoned (less than one slot). */
            c->bump = chunk;
            c->end = chunk + CHUNK_BYTES;
        }
        p = c->bump;
        c->bump += size;
    }
    kvp__spin_unlock(&c->lock);
    return p;
}

void kvp__obj_free(kvp__store_t *s, kvp__obj_t *o)
{
    kvp__objclass_t *c = &s->slab.cls[class_of(o->klen)];
    kvp__spin_lock(&c->lock);
    *(void **)o = c->free;
    c->free = o;
    kvp__spin_unlock(&c->lock);
}

void kvp__objslab_init(kvp__objslab_t *sl)
{
    memset(sl, 0, sizeof *sl);
    kvp__spin_init(&sl->chunk_lock);
    for (int i = 0; i < KVP_OBJ_CLASSES; i++)
        kvp__spin_init(&sl->cls[i].lock);
}

void kvp__objslab_destroy(kvp__objslab_t *sl)
{
    for (size_t i = 0; i < sl->nchunks; i++)
        munmap(sl->chunks[i], CHUNK_BYTES);
    kvp__free(sl->chunks, sl->cap * sizeof *sl->chunks);
    memset(sl, 0, sizeof *sl);
}

uint64_t kvp__objslab_bytes(kvp__objslab_t *sl)
{
    kvp__spin_lock(&sl->chunk_lock);
    uint64_t n = (uint64_t)sl->nchunks * CHUNK_BYTES;
    kvp__spin_unlock(&sl->chunk_lock);
    return n;
}
