/*
 * The consumer's receive slab: its allocator and its resident set (the
 * seed's memory.py ContiguousAllocator and ResidentPool, less the CUDA
 * events: host memory is free the moment it is freed).  Internal to the
 * reservation object (ec_resv.c), which serialises every call under its one
 * mutex; nothing here locks.
 *
 * Allocator.  The slab is [0, size).  Extents are carved first fit from a
 * free list kept sorted by offset, each rounded up to KVP__EC_SLAB_ALIGN
 * bytes (at least one unit, so a zero-byte tensor still has an extent of
 * its own); a freed extent is merged with the free neighbours it touches,
 * so no two free extents are adjacent.  Therefore there are at most
 * used + 1 free extents (one gap before each allocated extent, one at the
 * end), and the list's array is kept at least that large: a free never
 * allocates and never fails; an allocation grows the array first and may
 * fail with KVP_ERR_NO_MEMORY.
 *
 * Resident set.  mm_hash -> an extent holding that tensor, kept after a take
 * (for local hand-offs) and filled by the cross-encoder cache.  An entry is
 * pinned while the engine holds its tensor, leased while reservations read
 * it (cached reserves, followers of a completed writer), and evictable --
 * on the LRU list, oldest first -- exactly when it is neither:
 *     on_lru  <=>  !pinned && leases == 0
 * Entries are never displaced while they exist (see ec_resv.c "Residents"),
 * so a lease always names an entry that is in the map.
 */
#ifndef KVP_EC_SLAB_H
#define KVP_EC_SLAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/list.h"
#include "common/strmap.h"
#include "ec/ec_resv.h"

/* ---- allocator ------------------------------------------------------------ */

typedef struct kvp__ec_ext {
    uint64_t off, size; /* size: the rounded size, a multiple of the alignment */
} kvp__ec_ext_t;

typedef struct kvp__ec_alloc {
    uint64_t size;        /* the slab's bytes */
    kvp__ec_ext_t *free;  /* sorted by off, never two adjacent */
    size_t n_free, cap_free;
    size_t n_used;        /* allocated extents */
    uint64_t free_bytes;
} kvp__ec_alloc_t;

/* KVP_OK or KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_alloc_init(kvp__ec_alloc_t *a, uint64_t size);
void kvp__ec_alloc_cleanup(kvp__ec_alloc_t *a);
/* nbytes rounded up to the alignment (at least one unit); 0 on overflow. */
uint64_t kvp__ec_alloc_round(uint64_t nbytes);
/* First fit.  KVP_OK and *ext_p; KVP_ERR_NO_SPACE (no free extent is large
 * enough); KVP_ERR_NO_MEMORY (the free list could not grow). */
kvp_status_t kvp__ec_alloc_get(kvp__ec_alloc_t *a, uint64_t nbytes, kvp__ec_ext_t *ext_p);
/* Returns an extent that kvp__ec_alloc_get gave (exactly once). */
void kvp__ec_alloc_put(kvp__ec_alloc_t *a, kvp__ec_ext_t ext);

/* ---- resident set --------------------------------------------------------- */

typedef struct kvp__ec_res {
    char *hash; /* owned; the map's key */
    size_t hash_len;
    kvp__ec_ext_t ext;
    kvp__ec_tensor_t t;
    bool pinned;
    uint32_t leases;
    kvp__list_t lru; /* on kvp__ec_resset_t.lru iff !pinned && leases == 0 */
} kvp__ec_res_t;

typedef struct kvp__ec_resset {
    kvp__strmap_t map; /* hash -> kvp__ec_res_t */
    kvp__list_t lru;   /* evictable entries, least recently released first */
    size_t n;
    uint64_t bytes;    /* sum of the entries' ext.size */
    /* hashes evicted under pressure since the last drain, in order, each
     * once (the set indexes the array's strings) */
    char **reclaimed;
    size_t n_reclaimed, cap_reclaimed;
    kvp__strmap_t reclaimed_set;
} kvp__ec_resset_t;

void kvp__ec_resset_init(kvp__ec_resset_t *s);
/* Frees every entry (their extents are not returned: the slab goes too). */
void kvp__ec_resset_cleanup(kvp__ec_resset_t *s);
kvp__ec_res_t *kvp__ec_resset_get(kvp__ec_resset_t *s, const char *hash);
/* Same shape (ndim and dims) and dtype. */
bool kvp__ec_tensor_same(const kvp__ec_tensor_t *a, const kvp__ec_tensor_t *b);
/* A new entry (hash not present) owning ext; pinned, or evictable at the
 * LRU's tail.  NULL: out of memory (ext not taken). */
kvp__ec_res_t *kvp__ec_resset_insert(kvp__ec_resset_t *s, const char *hash, kvp__ec_ext_t ext,
                                     const kvp__ec_tensor_t *t, bool pinned);
void kvp__ec_res_acquire(kvp__ec_resset_t *s, kvp__ec_res_t *e);
void kvp__ec_res_release(kvp__ec_resset_t *s, kvp__ec_res_t *e);
void kvp__ec_res_pin(kvp__ec_resset_t *s, kvp__ec_res_t *e);
/* Unpins; evictable at the LRU's tail if not leased (an entry already on
 * the LRU keeps its place, as memory.py's OrderedDict assignment does). */
void kvp__ec_res_retire(kvp__ec_resset_t *s, kvp__ec_res_t *e);
/* Evicts the least recently released evictable entry: its extent goes back
 * to a, its hash joins the reclaimed list.  1 evicted, 0 nothing evictable,
 * KVP_ERR_NO_MEMORY (the reclaimed list could not grow; nothing evicted). */
int kvp__ec_resset_evict_lru(kvp__ec_resset_t *s, kvp__ec_alloc_t *a);
/* Moves the reclaimed hashes out (*v_p owned, kvp__ec_strv_free). */
kvp_status_t kvp__ec_resset_drain_reclaimed(kvp__ec_resset_t *s, char ***v_p, size_t *n_p);

#endif
