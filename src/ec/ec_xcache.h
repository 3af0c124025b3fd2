/*
 * The cross-encoder cache's pool lookups (issue 16 item 1): a reserve of an
 * mm_hash the consumer does not hold looks in the pool, and a value found
 * there is copied into the receive slab as an unpinned resident, so the
 * reserve answers cached:true, write:false.
 *
 * A lookup runs off the control server's thread, so a reserve waiting on
 * the pool never holds up the requests behind it.  The caller's thread only
 * asks what this process can answer alone (the pool server's membership
 * filter: an image the pool never held is a miss at once); for an image the
 * pool may hold, the xcache's own thread opens an extent of the slab and
 * gets the value straight into it (kvp__ec_resv_fill_begin / fill_end, no
 * bounce copy; an asynchronous pool op, at most a few at once): the value
 * published as a resident is a hit, NOT_FOUND a miss.  A backend with no
 * probe (embedded://) answers an existence check at once, so there only a
 * hit is got.  Each lookup ends, once, within its timeout (a lookup that
 * waited that long for its turn is skipped without asking the pool).
 *
 * A failing pool (down, or answering after the deadline) must not cost
 * every reserve a deadline: after a failure lookups are skipped (a miss at
 * once, counted) for a backoff that starts at 250 ms and doubles up to
 * 10 s while failures go on; the first lookup after the backoff probes the
 * pool again, and a success ends the backoff.  One log line per backoff.
 * At most max_inflight lookups at once; beyond that a lookup is skipped.
 *
 * Thread safety: lookup and stats from any thread; destroy once, after
 * the caller stopped starting lookups: it waits until every lookup has
 * reported.
 */
#ifndef KVP_EC_XCACHE_H
#define KVP_EC_XCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ec/ec_resv.h"

struct kvp_pool;
typedef struct kvp__ec_xcache kvp__ec_xcache_t;

typedef struct kvp__ec_xcache_params {
    struct kvp_pool *pool;      /* borrowed; outlives the xcache */
    const char *model;          /* the store key's namespace (kvp__ec_store_key) */
    kvp__ec_resv_t *resv;       /* borrowed; outlives the xcache */
    uint32_t timeout_ms;        /* a lookup's time, its get included; 0 = 1000 */
    size_t max_inflight;        /* 0 = 64 */
} kvp__ec_xcache_params_t;

/* KVP_OK, KVP_ERR_INVALID_ARG, KVP_ERR_NO_MEMORY, KVP_ERR_IO (no thread). */
kvp_status_t kvp__ec_xcache_create(const kvp__ec_xcache_params_t *p, kvp__ec_xcache_t **x_p);
void kvp__ec_xcache_destroy(kvp__ec_xcache_t *x);

/* done(token): the lookup has ended (on a hit, mm_hash is resident now
 * with tensor t). */
typedef void (*kvp__ec_xcache_done_fn)(void *token);

/* Looks mm_hash up for a reserve of t.  KVP_INPROGRESS: done will be
 * called exactly once, from another thread.  Anything else: the lookup
 * ended now and done is not called: KVP_OK = a hit (resident now),
 * KVP_ERR_NOT_FOUND = a miss, KVP_ERR_BUSY = skipped (over the cap, or the
 * pool in backoff), another error = the pool failed or a bad argument. */
kvp_status_t kvp__ec_xcache_lookup(kvp__ec_xcache_t *x, const char *mm_hash, const kvp__ec_tensor_t *t,
                                   kvp__ec_xcache_done_fn done, void *token);

typedef struct kvp__ec_xcache_stats {
    uint64_t lookups, hits, misses, errors, skipped, inflight;
    uint64_t bytes_fetched;
    uint64_t backoffs; /* times lookups began to be skipped after a failure */
    bool backing_off;  /* now */
} kvp__ec_xcache_stats_t;
void kvp__ec_xcache_stats(kvp__ec_xcache_t *x, kvp__ec_xcache_stats_t *st);

#endif
