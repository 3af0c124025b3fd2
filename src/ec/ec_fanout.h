/*
 * A fan-out over a consumer's shards (the seed's worker.py _run_fanout on
 * its shard executor): n tasks run at once, task 0 on the caller's thread,
 * the others on a few threads of the fanout's own; run returns when every
 * task has run.  The caller also runs tasks of its own batch that no
 * thread has taken yet, so a batch always finishes, however busy the
 * threads are (several callers may share one fanout).
 */
#ifndef KVP_EC_FANOUT_H
#define KVP_EC_FANOUT_H

#include <stddef.h>

#include "kvpool/status.h"

typedef struct kvp__ec_fanout kvp__ec_fanout_t;

/* threads >= 1.  KVP_OK, KVP_ERR_INVALID_ARG, KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_fanout_create(size_t threads, kvp__ec_fanout_t **f_p);
/* Waits for the threads to end (no batch may be running).  NULL: no-op. */
void kvp__ec_fanout_destroy(kvp__ec_fanout_t *f);
/* fn(ctx, i) for every i in [0, n), at once; returns when all returned.
 * n == 1 (or f NULL) runs on the caller alone. */
void kvp__ec_fanout_run(kvp__ec_fanout_t *f, size_t n, void (*fn)(void *ctx, size_t i), void *ctx);

#endif
