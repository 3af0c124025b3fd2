/*
 * Server counters and the Prometheus text endpoint (libmicrohttpd, its own
 * thread).  Counters are atomics written by the event loop and read by the
 * HTTP thread; the store's own stats are read through kvp__store_stats.
 */
#ifndef KVP_SERVER_METRICS_H
#define KVP_SERVER_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include "kvpool/status.h"
#include "net/wire.h"
#include "store/store.h"

#define KVP_LAT_BUCKETS 16 /* 1 us .. 32 ms, powers of two, then +Inf */

typedef struct kvp__server_counters {
    _Atomic uint64_t requests, bad_requests, auth_failures, accepted, connections;
    _Atomic uint64_t accepted_tcp; /* of accepted: on kvpool's TCP transport */
    _Atomic uint64_t worker_rebuilds; /* UCX workers replaced because they were stuck */
    _Atomic uint64_t bytes_in, bytes_out;
    _Atomic uint64_t local_leases;    /* values leased to local readers (GET_LOCAL) now */
    _Atomic uint64_t local_bytes;     /* their bytes */
    _Atomic uint64_t ops[KVP_WOP_MAX + 1];
    _Atomic uint64_t lat_count[KVP_WOP_MAX + 1];
    _Atomic uint64_t lat_sum_ns[KVP_WOP_MAX + 1];
    _Atomic uint64_t lat_bucket[KVP_WOP_MAX + 1][KVP_LAT_BUCKETS + 1];
} kvp__server_counters_t;

typedef struct kvp__metrics kvp__metrics_t;

/* Records one finished request of `op` taking `ns`. */
void kvp__metrics_observe(kvp__server_counters_t *c, uint32_t op, uint64_t ns);
/* Renders the Prometheus text into a heap buffer (kvp__free(buf, *cap_p)). */
char *kvp__metrics_render(kvp__store_t *store, kvp__server_counters_t *c, size_t *len_p, size_t *cap_p);
kvp_status_t kvp__metrics_start(uint16_t port, kvp__store_t *store, kvp__server_counters_t *c,
                                kvp__metrics_t **m_p);
void kvp__metrics_stop(kvp__metrics_t *m);

#endif
