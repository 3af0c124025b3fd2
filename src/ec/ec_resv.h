/*
 * The consumer's reservations (connectors-spec §3.6; the seed's own
 * reservation.py ConsumerReservationManager and memory.py
 * ConsumerMemoryPool, ContiguousAllocator and ResidentPool win where the
 * spec is silent or differs).
 *
 * One object owns the receive slab (a caller-provided region of slab_size
 * bytes, registered with the transport by the caller), carves it into
 * aligned extents (first fit, frees coalesce), keeps the reservations of
 * remote pushes (one state enum, one set-state that rejects transitions not
 * in the table), the resident set (mm_hash -> extent kept after a take, for
 * local hand-offs and cross-encoder reuse, with leases and an LRU of
 * evictable entries), tombstones (CANCELLED/EXPIRED records kept for
 * tombstone_ttl_ms, at most max_tombstones) and per-peer caps.
 *
 * Thread-safe: every function takes the object's one mutex (the control
 * server thread, the data-plane thread and the worker's caller all call in).
 * Host memory: a free returns the extent at once (no CUDA events).
 */
#ifndef KVP_EC_RESV_H
#define KVP_EC_RESV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/ec_connector.h"

#define KVP__EC_MAX_NDIM 8
#define KVP__EC_RID_LEN 32 /* reservation ids: 32 lowercase hex digits (uuid4().hex) */
#define KVP__EC_SLAB_ALIGN 256

/* Reservation states (reservation.py ConsumerReservationState). */
typedef enum kvp__ec_rstate {
    KVP__EC_R_WRITING = 0,    /* a remote writer owns the extent; leased */
    KVP__EC_R_READY,          /* written and completed; leased until taken */
    KVP__EC_R_CANCEL_PENDING, /* cancelled while writing: memory kept until complete */
    KVP__EC_R_EXPIRE_PENDING, /* lease ran out while writing: memory kept until complete */
    KVP__EC_R_CANCELLED,      /* tombstone: a later reserve answers cancelled */
    KVP__EC_R_EXPIRED,        /* tombstone: a later reserve starts afresh */
} kvp__ec_rstate_t;
#define KVP__EC_R_NUM_STATES 6

const char *kvp__ec_rstate_name(kvp__ec_rstate_t s);
/* Is from -> to in the table (reservation.py _ALLOWED_TRANSITIONS)? */
bool kvp__ec_rstate_allowed(kvp__ec_rstate_t from, kvp__ec_rstate_t to);

typedef struct kvp__ec_resv_params {
    uint8_t *slab;          /* the receive region (borrowed; outlives the object) */
    uint64_t slab_size;     /* > 0 */
    int64_t lease_ms;       /* lease and tombstone TTL (300000 in the seed) */
    size_t max_tombstones;  /* 65536 in the seed */
    /* What one peer (kvp__ec_reserve_in_t.peer) may hold at once: active
     * reservations and their bytes.  0 = no cap. */
    size_t peer_max_reservations;
    uint64_t peer_max_bytes;
    /* Clock in ms (monotonic); NULL = CLOCK_MONOTONIC. */
    int64_t (*now_ms)(void *ctx);
    void *clock_ctx;
} kvp__ec_resv_params_t;

typedef struct kvp__ec_resv kvp__ec_resv_t;

/* KVP_OK, KVP_ERR_INVALID_ARG (no slab, size 0, lease < 1), KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_resv_create(const kvp__ec_resv_params_t *p, kvp__ec_resv_t **r_p);
void kvp__ec_resv_destroy(kvp__ec_resv_t *r);

typedef struct kvp__ec_tensor {
    uint64_t nbytes;
    int64_t shape[KVP__EC_MAX_NDIM];
    uint32_t ndim;
    kvp_ec_dtype_t dtype;
} kvp__ec_tensor_t;

typedef struct kvp__ec_reserve_in {
    const char *transfer_id; /* non-empty */
    const char *mm_hash;     /* non-empty */
    kvp__ec_tensor_t t;      /* already checked: prod(shape) * itemsize == nbytes */
    uint64_t peer;           /* who asks (for the per-peer caps); 0 = unattributed */
} kvp__ec_reserve_in_t;

typedef struct kvp__ec_reserve_out {
    char reservation_id[KVP__EC_RID_LEN + 1]; /* "" when cancelled */
    uint64_t offset;  /* the extent's offset in the slab (dst_ptr = slab + offset) */
    uint64_t nbytes;  /* the tensor's bytes */
    bool write;       /* the caller must write the bytes (a fresh allocation) */
    bool ready;       /* READY now (cached, or an earlier complete) */
    bool cached;      /* served from the resident set: nothing to write */
    bool cancelled;   /* a CANCELLED tombstone (or CANCEL_PENDING): do not write */
} kvp__ec_reserve_out_t;

/* reserve (§3.6 and reservation.py reserve, including the in-flight writer
 * sharing: a second transfer id of an mm_hash being written follows that
 * writer and becomes READY with it).  Errors, with the original's message in
 * err (NUL-terminated, truncated to errlen):
 *   KVP_ERR_INVALID_ARG "conflicting reservation for transfer_id",
 *                       "conflicting in-flight tensor for mm_hash",
 *                       "conflicting cached tensor for mm_hash";
 *   KVP_ERR_STATE       "Transfer 'T' still has an active writer";
 *   KVP_ERR_NO_SPACE    "EC consumer buffer pool is full";
 *   KVP_ERR_BUSY        "peer reservation cap reached" (kvpool's cap);
 *   KVP_ERR_CLOSED      "Consumer reservation manager is shutting down";
 *   KVP_ERR_NO_MEMORY.
 * When out->ready is true the caller queues a readiness event. */
kvp_status_t kvp__ec_resv_reserve(kvp__ec_resv_t *r, const kvp__ec_reserve_in_t *in,
                                  kvp__ec_reserve_out_t *out, char *err, size_t errlen);

typedef struct kvp__ec_status {
    char mm_hash[256];
    bool ready;
    char reservation_id[KVP__EC_RID_LEN + 1];
    kvp__ec_tensor_t t;
} kvp__ec_status_t;

/* status: KVP_OK and *st for an active record (WRITING, READY, *_PENDING),
 * KVP_ERR_NOT_FOUND otherwise (the reply's null). */
kvp_status_t kvp__ec_resv_status(kvp__ec_resv_t *r, const char *transfer_id, kvp__ec_status_t *st);

/* complete (reservation.py complete): *accepted_p, *became_ready_p. */
void kvp__ec_resv_complete(kvp__ec_resv_t *r, const char *transfer_id, const char *reservation_id,
                           bool *accepted_p, bool *became_ready_p);
/* Transfer ids that became READY as followers of a completed writer since the
 * last call, in order; *ids_p is an array of owned strings freed with
 * kvp__ec_strv_free. */
kvp_status_t kvp__ec_resv_drain_ready(kvp__ec_resv_t *r, char ***ids_p, size_t *n_p);
void kvp__ec_strv_free(char **v, size_t n);

/* cancel (reservation.py cancel; reservation_id "" = any).  *cancelled_p is
 * false only when rejected.  *deferred_p (may be NULL): the record went to or
 * stays in CANCEL_PENDING, or stays in EXPIRE_PENDING (memory kept while a
 * writer may still write; its complete frees it). */
kvp_status_t kvp__ec_resv_cancel(kvp__ec_resv_t *r, const char *transfer_id, const char *reservation_id,
                                 bool abandon, bool refresh, bool *cancelled_p, bool *deferred_p);

/* A tensor in the slab, for the engine's encoder cache.  ptr stays valid
 * while the mm_hash is pinned in the resident set (until it is retired and
 * then evicted, or the object is destroyed). */
typedef struct kvp__ec_view {
    uint8_t *ptr;
    kvp__ec_tensor_t t;
} kvp__ec_view_t;

/* take (§3.6): READY with a matching hash -> published to the resident set
 * (pinned) and the record removed.  KVP_ERR_STATE "Pushed EC tensor is not
 * ready for mm_hash=H" otherwise (a failed load). */
kvp_status_t kvp__ec_resv_take(kvp__ec_resv_t *r, const char *transfer_id, const char *mm_hash,
                               kvp__ec_view_t *v, char *err, size_t errlen);
/* take_resident (memory.py): the resident entry of mm_hash with that shape
 * and dtype, pinned.  KVP_ERR_NOT_FOUND otherwise. */
kvp_status_t kvp__ec_resv_take_resident(kvp__ec_resv_t *r, const char *mm_hash, const kvp__ec_tensor_t *t,
                                        kvp__ec_view_t *v);
/* Puts bytes into the resident set under mm_hash, unpinned (evictable):
 * fill_begin + a copy of t->nbytes from src + fill_end.  KVP_OK (also when
 * the hash is resident already with that tensor), KVP_ERR_NO_SPACE,
 * KVP_ERR_INVALID_ARG (conflicting entry), KVP_ERR_BUSY (no fill free). */
kvp_status_t kvp__ec_resv_put_resident(kvp__ec_resv_t *r, const char *mm_hash, const kvp__ec_tensor_t *t,
                                       const void *src);
/* The cross-encoder cache's put in two steps, so that the bytes can land
 * straight in the slab without the lock held: fill_begin allocates an
 * extent for t (reclaiming evictable residents if needed) that nobody else
 * sees, *ptr_p its start and *id_p its handle; the caller writes the bytes,
 * then fill_end publishes the extent as an unpinned resident (ok) or frees
 * it (!ok).  A hash resident by then keeps its entry and the fill's extent
 * is freed (KVP_OK if the tensors agree, else KVP_ERR_INVALID_ARG).  At
 * most KVP__EC_MAX_FILLS at once; filling bytes count in fill_bytes.
 * fill_begin: KVP_OK (*id_p 0 and *ptr_p NULL when the hash is resident
 * already with that tensor: nothing to fill), KVP_ERR_NO_SPACE,
 * KVP_ERR_BUSY (every fill in use), KVP_ERR_INVALID_ARG (a bad tensor, or
 * resident with another tensor), KVP_ERR_CLOSED (shutting down).  fill_end: KVP_ERR_NOT_FOUND for an
 * unknown handle. */
#define KVP__EC_MAX_FILLS 16
kvp_status_t kvp__ec_resv_fill_begin(kvp__ec_resv_t *r, const char *mm_hash, const kvp__ec_tensor_t *t,
                                     uint8_t **ptr_p, uint64_t *id_p);
kvp_status_t kvp__ec_resv_fill_end(kvp__ec_resv_t *r, uint64_t id, bool ok);
/* Is mm_hash in the resident set (any shape)? */
bool kvp__ec_resv_has_resident(kvp__ec_resv_t *r, const char *mm_hash);

/* retire_stale (memory.py): each hash of freed (all pinned residents when
 * freed == NULL) whose tensor the engine no longer holds (in_cache(ctx,
 * hash, ptr) false; in_cache NULL = holds nothing) becomes evictable. */
void kvp__ec_resv_retire(kvp__ec_resv_t *r, const char *const *freed, size_t n_freed,
                         bool (*in_cache)(void *ctx, const char *mm_hash, const uint8_t *ptr), void *ctx);
/* Hashes evicted from the resident set under pressure since the last call
 * (metadata "reclaimed"). */
kvp_status_t kvp__ec_resv_drain_reclaimed(kvp__ec_resv_t *r, char ***ids_p, size_t *n_p);

/* expire (reservation.py _expire_locked + tombstone reaping): READY past its
 * lease -> EXPIRED (freed); WRITING past its lease -> EXPIRE_PENDING (a
 * follower: CANCELLED).  Returns the number of READY records expired. */
size_t kvp__ec_resv_expire(kvp__ec_resv_t *r);

/* The data plane's bounds check, before any byte moves: is [offset,
 * offset + len) inside the extent of a WRITING (or *_PENDING) reservation
 * that owns its memory (not a follower)?  reservation_id, when not NULL,
 * must name that reservation.  KVP_OK or KVP_ERR_INVALID_ARG.  The answer
 * can go stale only through a cancel with abandon or refresh, which the
 * producer sends after its own write has stopped. */
kvp_status_t kvp__ec_resv_check_write(kvp__ec_resv_t *r, uint64_t offset, uint64_t len,
                                      const char *reservation_id);

/* Shutdown (reservation.py begin_shutdown / wait_for_writers). */
void kvp__ec_resv_begin_shutdown(kvp__ec_resv_t *r);
bool kvp__ec_resv_wait_for_writers(kvp__ec_resv_t *r, int64_t timeout_ms);

/* Byte figures are extents (rounded up to KVP__EC_SLAB_ALIGN), so
 * slab_free_bytes + bytes_reserved + resident_bytes + fill_bytes ==
 * slab_size always.
 * Counters: reserves = reserve calls (every outcome); completes and cancels
 * = accepted ones; expired = records whose lease ran out (READY -> EXPIRED,
 * WRITING -> EXPIRE_PENDING, a follower -> CANCELLED); reclaimed = resident
 * entries evicted under pressure. */
typedef struct kvp__ec_resv_stats {
    uint64_t records;           /* every record, tombstones included */
    uint64_t active;            /* WRITING, READY, *_PENDING */
    uint64_t by_state[KVP__EC_R_NUM_STATES];
    uint64_t tombstones;
    uint64_t bytes_reserved;    /* extents owned by active records */
    uint64_t residents, resident_bytes;
    uint64_t slab_free_bytes;
    uint64_t fill_bytes;        /* extents being filled from the pool (fill_begin .. fill_end) */
    uint64_t reserves, reserves_cached, reserves_full, reserves_capped;
    uint64_t completes, cancels, takes, takes_failed, expired, reclaimed;
    uint64_t writers_abandoned; /* parked records ended after one more lease (a dead writer) */
} kvp__ec_resv_stats_t;

void kvp__ec_resv_stats(kvp__ec_resv_t *r, kvp__ec_resv_stats_t *st);
/* What one peer holds now: its active records (followers and cached ones
 * included) and the extents they own (a writer's, until it is published to
 * the resident set; followers and cached records own none).  Peer 0 is
 * counted but never capped. */
void kvp__ec_resv_peer_usage(kvp__ec_resv_t *r, uint64_t peer, size_t *reservations_p, uint64_t *bytes_p);

#endif
