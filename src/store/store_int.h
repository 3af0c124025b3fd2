/*
 * Storage-engine internals shared by store.c, index.c and evict.c.
 *
 * Locking order (never taken in the other direction):
 *     evict_lock  ->  shard lock  ->  alloc_lock
 *     resv_lock   ->  alloc_lock
 * Functions prefixed do_ expect the caller to hold the named shard's lock.
 */
#ifndef KVP_STORE_STORE_INT_H
#define KVP_STORE_STORE_INT_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "common/list.h"
#include "store/store.h"
#include "store/tlsf.h"

#define KVP_OBJ_PINNED 0x1u
/* Found by a lookup (exists / prefix) since it last left the LRU tail:
 * eviction gives it a second chance (evict.c). */
#define KVP_OBJ_LOOKED 0x2u

/* One committed object (or, before commit, the object a reservation will
 * become).  56 bytes + key: with the bucket slot this keeps the index under
 * 96 bytes per object plus the key (measured by the bench). */
typedef struct kvp__obj {
    struct kvp__obj *hnext;            /* hash chain */
    kvp__list_t lru;                   /* on the shard LRU; pinned objects are not on it */
    uint64_t off;                      /* payload offset from the arena base */
    _Atomic uint32_t refs;             /* 1 while indexed, +1 per read lease */
    uint32_t size;                     /* value bytes (<= 256 MiB) */
    uint32_t hash32;                   /* upper key-hash bits, to skip memcmp */
    uint32_t atime;                    /* last access, coarse ms ticks (wraps) */
    uint16_t klen;
    uint8_t flags;                     /* KVP_OBJ_* */
    uint8_t unused;
    char key[];
} kvp__obj_t;

/* The shard lock: a test-and-test-and-set spinlock.  Its critical sections
 * are a few dozen instructions (a hash-chain walk, a list splice), so an
 * uncontended acquire+release (~10 ns) beats a mutex pair (~40 ns), which
 * matters at 2-3 lock pairs per looked-up key.  A waiter that spins too long
 * yields the CPU, so a holder preempted on a small machine is not starved. */
typedef struct {
    _Atomic int held;
} kvp__spin_t;

static inline void kvp__spin_init(kvp__spin_t *l) { atomic_init(&l->held, 0); }

static inline void kvp__spin_lock(kvp__spin_t *l)
{
    for (unsigned n = 0;; n++) {
        if (!atomic_load_explicit(&l->held, memory_order_relaxed) &&
            !atomic_exchange_explicit(&l->held, 1, memory_order_acquire))
            return;
        if (n < 100)
            __builtin_ia32_pause();
        else
            sched_yield();
    }
}

static inline void kvp__spin_unlock(kvp__spin_t *l)
{
    atomic_store_explicit(&l->held, 0, memory_order_release);
}

typedef struct kvp__shard {
    kvp__spin_t lock;
    kvp__obj_t **buckets;
    uint64_t nbuckets;                 /* power of two */
    uint64_t count;                    /* live objects */
    kvp__list_t lru;                   /* kvp__obj_t.lru, most recently used first */
    /* Counters, changed only under `lock`, summed by kvp__store_stats with
     * every shard locked, so a snapshot is consistent. */
    uint64_t committed, evicted, removed, reset;
    uint64_t live_bytes, pinned, put_existed, hits, misses, evicted_bytes;
    uint64_t index_bytes;
    kvp__cfilter_t *filter;            /* the store's membership filter, or NULL */
} __attribute__((aligned(64))) kvp__shard_t;

/* The object slab (objslab.c): size classes of KVP_OBJ_STEP bytes from
 * KVP_OBJ_MIN up to an object with a KVP_KEY_MAX-byte key. */
#define KVP_OBJ_STEP 16u
#define KVP_OBJ_MIN 64u
#define KVP_OBJ_CLASSES (int)(((sizeof(kvp__obj_t) + KVP_KEY_MAX + 15u) / 16u * 16u - KVP_OBJ_MIN) / 16u + 1u)

typedef struct kvp__objclass {
    kvp__spin_t lock;
    void *free;     /* freed slots, linked through their first word */
    char *bump;     /* next never-used slot in the current chunk */
    char *end;
} kvp__objclass_t;

typedef struct kvp__objslab {
    kvp__objclass_t cls[40];
    kvp__spin_t chunk_lock;
    char **chunks;
    size_t nchunks, cap;
} kvp__objslab_t;

struct kvp__resv {
    kvp__list_t link;                  /* on the open-reservation list while open */
    kvp__obj_t *obj;                   /* not yet indexed */
    uint64_t hash;
    uint64_t deadline_ns;
    int held;                          /* owner filling now: never reclaimed */
    int expired;                       /* reclaimed: commit answers EXPIRED */
};

struct kvp__store {
    kvp__store_params_t params;
    kvp__mem_t mem;
    char *base;                        /* == mem.base */

    pthread_mutex_t alloc_lock;
    kvp__tlsf_t tlsf;
    _Atomic uint64_t used_bytes;       /* mirror of tlsf.used for lock-free reads */
    uint64_t high_bytes, low_bytes;

    pthread_mutex_t evict_lock;
    uint32_t evict_cursor;             /* under evict_lock */

    pthread_mutex_t resv_lock;
    kvp__list_t resv;                  /* open reservations (kvp__resv_t.link), oldest first */
    uint64_t resv_count;               /* under resv_lock */
    _Atomic uint64_t resv_oldest_ns;   /* deadline of the oldest (UINT64_MAX if none), for unlocked checks */
    uint64_t expired_put;              /* under resv_lock */

    _Atomic uint64_t put_no_space;
    _Atomic uint64_t leases;           /* read leases held now */

    uint32_t nshards;
    uint32_t shard_shift;              /* 64 - log2(nshards) */
    kvp__shard_t *shards;
    kvp__objslab_t slab;
    kvp__cfilter_t filter;             /* kvp__store_set_filter; c == NULL: none */
};

/* objslab.c */
void kvp__objslab_init(kvp__objslab_t *sl);
void kvp__objslab_destroy(kvp__objslab_t *sl);
uint64_t kvp__objslab_bytes(kvp__objslab_t *sl); /* bytes of chunks held */
kvp__obj_t *kvp__obj_alloc(kvp__store_t *s, uint32_t klen); /* NULL when out of memory */
void kvp__obj_free(kvp__store_t *s, kvp__obj_t *o);
_Static_assert(KVP_OBJ_CLASSES <= 40, "objslab class table too small");

/* index.c (kvp__key_hash: store.h) */
static inline kvp__shard_t *kvp__shard_of(kvp__store_t *s, uint64_t h)
{
    return &s->shards[s->shard_shift >= 64 ? 0 : (h >> s->shard_shift)];
}
uint32_t kvp__ticks_now(void);
kvp__obj_t *kvp__do_find(kvp__shard_t *sh, uint64_t h, const void *key, uint32_t klen);
void kvp__do_insert(kvp__shard_t *sh, kvp__obj_t *o, uint64_t h);
void kvp__do_unlink(kvp__shard_t *sh, kvp__obj_t *o, uint64_t h);
void kvp__do_lru_push(kvp__shard_t *sh, kvp__obj_t *o);
void kvp__do_lru_remove(kvp__shard_t *sh, kvp__obj_t *o);
void kvp__do_lru_touch(kvp__shard_t *sh, kvp__obj_t *o);
size_t kvp__obj_bytes(uint32_t klen);
kvp_status_t kvp__shards_init(kvp__store_t *s);
void kvp__shards_destroy(kvp__store_t *s);

/* store.c */
void kvp__obj_unref(kvp__store_t *s, kvp__obj_t *o);

/* evict.c */
/* Evicts until used + need <= target (bytes).  Returns 1 if it reached the
 * target, 0 if nothing evictable was left first. */
int kvp__evict_until(kvp__store_t *s, uint64_t need, uint64_t target);

#endif
