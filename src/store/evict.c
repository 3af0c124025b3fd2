/*
 * Approximate-LRU eviction.
 *
 * Each index shard keeps an exact LRU list of its unpinned objects (a get
 * moves the object to the head under the shard lock it already holds).  A
 * global LRU would need one lock on every read, so eviction approximates it:
 * it samples SAMPLE shards from a rotating cursor, looks at the tail of each
 * (the shard's least recently used evictable object, skipping a few that are
 * under a read lease), and evicts the oldest of those by access time.  With
 * uniform hashing every shard's tail is a sample of the global cold end, so
 * the victim is among the globally coldest objects with high probability,
 * the way Redis samples keys, but in O(SAMPLE) lock acquisitions per victim
 * instead of one global lock per access.
 *
 * Objects under a read lease (refs > 1) are skipped: their bytes are being
 * copied.  Pinned objects are not on any LRU list at all.  When the sample
 * finds nothing, every shard is scanned once before eviction gives up, so
 * "nothing evictable" is a fact, not a sampling accident.
 *
 * Eviction runs in the putting thread, under evict_lock, when a put would
 * push arena usage past the high watermark; it frees down to the low
 * watermark.  The victim is unlinked under its shard lock (so no new lease
 * can start) and, having refs == 1, its space is freed at once.
 */
#include "store/store_int.h"

#define SAMPLE 8u
#define TAIL_WALK 8u
#define SECOND_CHANCES 64u

/* The coldest evictable object near the shard's LRU tail, or NULL.  A tail
 * object a lookup has found since (KVP_OBJ_LOOKED, store.c exists_hashed)
 * gets its second chance: unmarked and moved to the head, as a get would
 * have moved it, without counting as a step of the walk (at most
 * SECOND_CHANCES per call, so a shard of marked objects costs bounded work;
 * past that they are taken as they come). */
static kvp__obj_t *do_tail_victim(kvp__shard_t *sh)
{
    kvp__list_t *n = sh->lru.prev;
    for (uint32_t i = 0, moved = 0; n != &sh->lru && i < TAIL_WALK;) {
        kvp__obj_t *o = KVP_CONTAINER_OF(n, kvp__obj_t, lru);
        n = n->prev;
        if ((o->flags & KVP_OBJ_LOOKED) && moved < SECOND_CHANCES) {
            o->flags &= (uint8_t)~KVP_OBJ_LOOKED;
            kvp__do_lru_touch(sh, o);
            moved++;
            if (n == &sh->lru) /* every object walked had its chance: the tail again */
                n = sh->lru.prev;
            continue;
        }
        if (atomic_load_explicit(&o->refs, memory_order_acquire) == 1)
            return o;
        i++;
    }
    return NULL;
}

/* Picks a shard whose tail holds an old evictable object; UINT32_MAX if none. */
static uint32_t pick_shard(kvp__store_t *s, uint32_t now, int full_scan)
{
    uint32_t best = UINT32_MAX, best_age = 0;
    uint32_t tries = full_scan ? s->nshards : (SAMPLE < s->nshards ? SAMPLE : s->nshards);
    for (uint32_t k = 0; k < tries; k++) {
        uint32_t i = s->evict_cursor++ & (s->nshards - 1);
        kvp__shard_t *sh = &s->shards[i];
        kvp__spin_lock(&sh->lock);
        kvp__obj_t *o = do_tail_victim(sh);
        uint32_t age = o ? now - o->atime : 0;
        kvp__spin_unlock(&sh->lock);
        if (o && (best == UINT32_MAX || age > best_age)) {
            best = i;
            best_age = age;
            if (full_scan)
                break;
        }
    }
    return best;
}

/* Evicts one object; returns 1 on success, 0 if nothing is evictable. */
static int evict_one(kvp__store_t *s)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        uint32_t i = pick_shard(s, kvp__ticks_now(), attempt > 0);
        if (i == UINT32_MAX) {
            if (attempt > 0)
                return 0; /* a full scan found nothing evictable */
            continue;     /* the sample was unlucky: scan every shard */
        }
        kvp__shard_t *sh = &s->shards[i];
        kvp__spin_lock(&sh->lock);
        kvp__obj_t *o = do_tail_victim(sh);
        if (o) {
            kvp__do_unlink(sh, o, kvp__key_hash(o->key, o->klen));
            sh->evicted++;
            sh->evicted_bytes += o->size;
        }
        kvp__spin_unlock(&sh->lock);
        if (o) {
            kvp__obj_unref(s, o);
            return 1;
        }
        /* The tail changed between sampling and locking: sample again. */
    }
    return 0;
}

int kvp__evict_until(kvp__store_t *s, uint64_t need, uint64_t target)
{
    int reached = 1;
    pthread_mutex_lock(&s->evict_lock);
    while (atomic_load(&s->used_bytes) + need > target) {
        if (!evict_one(s)) {
            reached = 0;
            break;
        }
    }
    pthread_mutex_unlock(&s->evict_lock);
    return reached;
}
