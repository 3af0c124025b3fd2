/*
 * The producer's staging slab (the seed's memory.py ProducerMemoryPool):
 * where the producer keeps its copy of an encoder output from save_caches
 * until its pushes and its cross-encoder cache put are done.
 *
 * One anonymous mapping of `capacity` bytes (the config's pool_size, as the
 * seed's), with transparent huge pages advised and faulted in only where a
 * copy first lands; extents are carved from it by the receive slab's
 * allocator (ec_slab.h: first fit, lowest offset first, merged on free), so
 * the regions in use stay at the low end and a freed one is the next copy's.
 * The pages a copy lands in are then already mapped: no page faults, no
 * zeroing and no unmap (with its TLB shootdown to the other cores) per
 * encoder output, as a fresh heap buffer of megabytes costs each time, and
 * a transport's registration cache sees the same addresses again.
 *
 * A copy that does not fit (the slab full, or no slab: capacity 0 or the
 * mapping failed) goes to the heap, as the seed falls back to the tensor
 * itself; both are counted.  Thread-safe (one mutex, never held across
 * anything but the allocator).
 */
#ifndef KVP_EC_STAGE_H
#define KVP_EC_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ec/ec_slab.h"
#include "kvpool/status.h"

typedef struct kvp__ec_stage kvp__ec_stage_t;

/* A region given by kvp__ec_stage_get; return it once, with kvp__ec_stage_put. */
typedef struct kvp__ec_stage_region {
    uint8_t *data;     /* nbytes writable bytes (NULL when nbytes is 0) */
    size_t nbytes;
    kvp__ec_ext_t ext; /* the slab's extent, when !heap */
    bool heap;         /* the copy did not fit the slab */
} kvp__ec_stage_region_t;

typedef struct kvp__ec_stage_stats {
    uint64_t capacity;     /* the slab's bytes (0: no slab) */
    uint64_t bytes_staged; /* slab bytes held now (rounded extents) */
    uint64_t heap_bytes;   /* heap bytes held now (copies that did not fit) */
    uint64_t copies;       /* regions given, slab and heap */
    uint64_t fallbacks;    /* of them, on the heap */
} kvp__ec_stage_stats_t;

/* KVP_OK (also when the slab cannot be mapped: logged, heap only) or
 * KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_stage_create(uint64_t capacity, kvp__ec_stage_t **s_p);
/* Every region must have been returned. */
void kvp__ec_stage_destroy(kvp__ec_stage_t *s);
/* A region of nbytes: KVP_OK and *r, or KVP_ERR_NO_MEMORY (nothing given). */
kvp_status_t kvp__ec_stage_get(kvp__ec_stage_t *s, size_t nbytes, kvp__ec_stage_region_t *r);
void kvp__ec_stage_put(kvp__ec_stage_t *s, kvp__ec_stage_region_t *r);
void kvp__ec_stage_stats(kvp__ec_stage_t *s, kvp__ec_stage_stats_t *st);

#endif
