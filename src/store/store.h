/*
 * The storage engine: an arena of value bytes, a sharded index of committed
 * objects, two-phase puts, read leases, approximate-LRU eviction and the
 * counters behind kvp_pool_stats.  The embedded backend calls it directly;
 * the server (later) calls it from its event loop.  All functions are
 * thread-safe unless noted.
 *
 * Arguments are assumed valid (the pool layer validates batches); the engine
 * still never trusts sizes for memory safety.
 */
#ifndef KVP_STORE_STORE_H
#define KVP_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "common/cfilter.h"
#include "kvpool/pool.h"
#include "kvpool/status.h"
#include "store/provider.h"

typedef struct kvp__store kvp__store_t;
typedef struct kvp__resv kvp__resv_t;

typedef struct kvp__store_params {
    uint64_t capacity;          /* arena bytes (> 0) */
    double high_watermark;      /* start evicting above this fraction (0 < lw < hw <= 1) */
    double low_watermark;       /* ... and stop at this fraction */
    uint64_t put_timeout_ns;    /* reservations older than this are reclaimed */
    uint32_t shards;            /* index shards, a power of two (0 = default 256) */
    kvp_mem_kind_t mem_kind;
    kvp_huge_mode_t huge;
    int prefault;               /* touch the whole arena at create */
    /* Time source for reservations (tests); NULL = monotonic clock. */
    uint64_t (*now_ns)(void *arg);
    void *now_arg;
} kvp__store_params_t;

/* Fills p with the defaults (capacity must still be set). */
void kvp__store_params_default(kvp__store_params_t *p);

kvp_status_t kvp__store_create(const kvp__store_params_t *params, kvp__store_t **store_p);
void kvp__store_destroy(kvp__store_t *store);

/* The index's hash of a key (XXH3-64): also the membership filter's. */
uint64_t kvp__key_hash(const void *key, uint32_t klen);

/* Keeps a membership filter (common/cfilter.h) over the live keys in
 * mem (nblocks blocks, zeroed here): every key committed from now on is
 * added before its put is answered, every key that leaves is deleted once
 * it is gone.  Only on an empty store (KVP_ERR_INVALID_ARG otherwise),
 * before other threads use it; mem outlives the store. */
kvp_status_t kvp__store_set_filter(kvp__store_t *s, void *mem, uint64_t nblocks);
/* The filter (c == NULL: none), for its figures. */
const kvp__cfilter_t *kvp__store_filter(const kvp__store_t *s);

/* Largest value the store can ever hold. */
uint64_t kvp__store_max_value(const kvp__store_t *store);

/* One-phase operations (the embedded backend). */
int kvp__store_exists(kvp__store_t *s, const void *key, uint32_t klen);
size_t kvp__store_prefix(kvp__store_t *s, const kvp_key_t *keys, size_t n);
void kvp__store_exists_batch(kvp__store_t *s, const kvp_key_t *keys, size_t n, uint8_t *present);
kvp_status_t kvp__store_put(kvp__store_t *s, const void *key, uint32_t klen, const kvp_sgl_t *val,
                            uint64_t total, uint32_t *flags_p);
/* Copies the value into dst under a read lease.  *size_p = value size (also
 * on KVP_ERR_BUFFER_TOO_SMALL). */
kvp_status_t kvp__store_get(kvp__store_t *s, const void *key, uint32_t klen, const kvp_sgl_t *dst,
                            uint64_t dst_cap, uint64_t *size_p);
/* Zero-copy read (the server sends straight from the arena): takes a read
 * lease on the object and returns its bytes.  *lease_p must be given back
 * with kvp__store_release once the bytes are no longer read; until then the
 * object's space is never reused (it may be removed or evicted from the
 * index meanwhile, but its bytes stay valid).  KVP_OK, KVP_ERR_NOT_FOUND, or
 * KVP_ERR_BUSY when the object already holds KVP_LEASES_MAX leases (its
 * 32-bit reference count is never allowed near overflow). */
#define KVP_LEASES_MAX (1u << 31)
typedef struct kvp__obj kvp__lease_t;
kvp_status_t kvp__store_acquire(kvp__store_t *s, const void *key, uint32_t klen,
                                const void **data_p, uint64_t *size_p, kvp__lease_t **lease_p);
void kvp__store_release(kvp__store_t *s, kvp__lease_t *lease);
/* The arena region, for registering it with a transport. */
void kvp__store_arena(kvp__store_t *s, void **base_p, size_t *len_p);
/* The arena's memfd (another process on the host may map it), or -1. */
int kvp__store_arena_fd(const kvp__store_t *s);
kvp_status_t kvp__store_remove(kvp__store_t *s, const void *key, uint32_t klen);
kvp_status_t kvp__store_pin(kvp__store_t *s, const void *key, uint32_t klen, int pin);
uint64_t kvp__store_remove_all(kvp__store_t *s);
void kvp__store_stats(kvp__store_t *s, kvp_pool_stats_t *st);

/*
 * Two-phase put (what the server uses): reserve space, fill it, commit.
 * reserve: KVP_OK with *resv_p and *dst_p (size bytes to fill), or KVP_OK
 * with *resv_p == NULL and KVP_RESULT_EXISTED in *flags_p when the key is
 * already committed, or KVP_ERR_NO_SPACE / KVP_ERR_NO_MEMORY.  A reservation
 * is invisible to readers.  flags: KVP_RESV_HELD (the owner is filling it
 * now and applies its own deadline: never reclaimed here; else it is
 * reclaimed once older than put_timeout, counted in expired_put), and
 * KVP_RESV_NO_EVICT (only free space is taken: nothing is evicted for it;
 * KVP_ERR_NO_SPACE, not counted as a failed put, when it does not fit).
 * commit: makes the object visible (KVP_OK), or KVP_OK + EXISTED when another
 * writer committed the key first (ours is discarded), or KVP_ERR_EXPIRED.
 * commit and abort always release the reservation.
 */
#define KVP_RESV_HELD 0x1u
#define KVP_RESV_NO_EVICT 0x2u
kvp_status_t kvp__store_reserve(kvp__store_t *s, const void *key, uint32_t klen, uint64_t size,
                                unsigned flags, kvp__resv_t **resv_p, void **dst_p, uint32_t *flags_p);
void kvp__store_resv_hold(kvp__store_t *s, kvp__resv_t *r, int held);
kvp_status_t kvp__store_commit(kvp__store_t *s, kvp__resv_t *r, uint32_t *flags_p);
void kvp__store_abort(kvp__store_t *s, kvp__resv_t *r);
/* Aborts a held reservation its owner gave up on for being too slow (the
 * owner's put_timeout passed): as abort, counted in expired_put. */
void kvp__store_expire(kvp__store_t *s, kvp__resv_t *r);
/* Reclaims expired, unheld reservations now; returns how many. */
uint64_t kvp__store_reap(kvp__store_t *s);

/* Checks internal invariants (tests): allocator sound, counts consistent. */
kvp_status_t kvp__store_check(kvp__store_t *s);

#endif
