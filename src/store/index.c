/*
 * The object index: 2^k shards, each a chained hash table with its own mutex
 * and its own LRU list.  A key hashes (XXH3-64) to one shard by its top bits
 * and to a bucket by its low bits, so threads touching different keys rarely
 * share a lock and no global lock sits on the read path.  Tables grow per
 * shard (doubling, load factor 1); a failed growth allocation just leaves the
 * table denser.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/assert.h"
#include "common/clock.h"
#include "store/store_int.h"

#define INITIAL_BUCKETS 16u

uint64_t kvp__key_hash(const void *key, uint32_t klen) { return XXH3_64bits(key, klen); }

uint32_t kvp__ticks_now(void) { return (uint32_t)(kvp__now_ns() >> 20); /* ~1.05 ms */ }


kvp__obj_t *kvp__do_find(kvp__shard_t *sh, uint64_t h, const void *key, uint32_t klen)
{
    uint32_t h32 = (uint32_t)(h >> 32);
    for (kvp__obj_t *o = sh->buckets[h & (sh->nbuckets - 1)]; o; o = o->hnext)
        if (o->hash32 == h32 && o->klen == klen && memcmp(o->key, key, klen) == 0)
            return o;
    return NULL;
}

static void do_grow(kvp__shard_t *sh)
{
    uint64_t n = sh->nbuckets * 2;
    kvp__obj_t **nb = kvp__calloc(n, sizeof *nb);
    if (!nb)
        return;
    for (uint64_t i = 0; i < sh->nbuckets; i++) {
        kvp__obj_t *o = sh->buckets[i];
        while (o) {
            kvp__obj_t *next = o->hnext;
            uint64_t h = kvp__key_hash(o->key, o->klen);
            o->hnext = nb[h & (n - 1)];
            nb[h & (n - 1)] = o;
            o = next;
        }
    }
    kvp__free(sh->buckets, sh->nbuckets * sizeof *sh->buckets);
    sh->index_bytes += (n - sh->nbuckets) * sizeof *nb;
    /* Atomic stores: batch lookups read these unlocked to prefetch. */
    __atomic_store_n(&sh->buckets, nb, __ATOMIC_RELAXED);
    __atomic_store_n(&sh->nbuckets, n, __ATOMIC_RELAXED);
}

void kvp__do_insert(kvp__shard_t *sh, kvp__obj_t *o, uint64_t h)
{
    if (sh->count >= sh->nbuckets)
        do_grow(sh);
    o->hash32 = (uint32_t)(h >> 32);
    kvp__obj_t **b = &sh->buckets[h & (sh->nbuckets - 1)];
    o->hnext = *b;
    *b = o;
    sh->count++;
    sh->live_bytes += o->size;
    o->atime = kvp__ticks_now();
    if (o->flags & KVP_OBJ_PINNED)
        sh->pinned++;
    else
        kvp__do_lru_push(sh, o);
    if (sh->filter) /* (under the shard lock: before the put is answered) */
        kvp__cfilter_add(sh->filter, h);
}

void kvp__do_unlink(kvp__shard_t *sh, kvp__obj_t *o, uint64_t h)
{
    kvp__obj_t **pp = &sh->buckets[h & (sh->nbuckets - 1)];
    while (*pp && *pp != o)
        pp = &(*pp)->hnext;
    kvp__assert(*pp == o); /* an indexed object is in its own bucket */
    if (*pp)
        *pp = o->hnext;
    o->hnext = NULL;
    if (o->flags & KVP_OBJ_PINNED) {
        kvp__assert(sh->pinned > 0);
        sh->pinned--;
    } else {
        kvp__do_lru_remove(sh, o);
    }
    kvp__assert(sh->count > 0 && sh->live_bytes >= o->size);
    sh->count--;
    sh->live_bytes -= o->size;
    if (sh->filter)
        kvp__cfilter_del(sh->filter, h);
}

void kvp__do_lru_push(kvp__shard_t *sh, kvp__obj_t *o) { kvp__list_add_head(&sh->lru, &o->lru); }

void kvp__do_lru_remove(kvp__shard_t *sh, kvp__obj_t *o)
{
    (void)sh;
    kvp__list_del(&o->lru);
}

void kvp__do_lru_touch(kvp__shard_t *sh, kvp__obj_t *o)
{
    o->atime = kvp__ticks_now();
    if ((o->flags & KVP_OBJ_PINNED) || sh->lru.next == &o->lru)
        return;
    kvp__list_del(&o->lru);
    kvp__list_add_head(&sh->lru, &o->lru);
}

kvp_status_t kvp__shards_init(kvp__store_t *s)
{
    s->shards = aligned_alloc(64, sizeof(kvp__shard_t) * s->nshards);
    if (!s->shards || kvp__alloc_should_fail()) {
        free(s->shards);
        s->shards = NULL;
        return KVP_ERR_NO_MEMORY;
    }
    memset(s->shards, 0, sizeof(kvp__shard_t) * s->nshards);
    uint32_t i;
    for (i = 0; i < s->nshards; i++) {
        kvp__shard_t *sh = &s->shards[i];
        kvp__list_init(&sh->lru);
        sh->buckets = kvp__calloc(INITIAL_BUCKETS, sizeof *sh->buckets);
        if (!sh->buckets)
            goto err_buckets;
        sh->nbuckets = INITIAL_BUCKETS;
        sh->index_bytes = INITIAL_BUCKETS * sizeof *sh->buckets;
        kvp__spin_init(&sh->lock);
    }
    return KVP_OK;

err_buckets:
    while (i-- > 0) {
        kvp__free(s->shards[i].buckets, s->shards[i].nbuckets * sizeof(kvp__obj_t *));
    }
    free(s->shards);
    s->shards = NULL;
    return KVP_ERR_NO_MEMORY;
}

void kvp__shards_destroy(kvp__store_t *s)
{
    if (!s->shards)
        return;
    for (uint32_t i = 0; i < s->nshards; i++) {
        kvp__shard_t *sh = &s->shards[i];
        /* The objects go with the slab (kvp__objslab_destroy). */
        kvp__free(sh->buckets, sh->nbuckets * sizeof(kvp__obj_t *));
    }
    free(s->shards);
    s->shards = NULL;
}
