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
    _Atomic uint64_t local_bytes;     /* their bytes (a value leased twice counts twice) */
    _Atomic uint64_t local_groups;    /* unreleased GET_LOCALs */
    _Atomic uint64_t local_expired;   /* GET_LOCALs whose leases ended at their deadline, unreleased */
    _Atomic uint64_t local_bogus;     /* releases naming nothing */
    _Atomic uint64_t handshakes;      /* connections in the handshake now */
    _Atomic uint64_t hs_dropped[3];   /* handshakes dropped: timed out, displaced by newer ones, malformed */
    _Atomic uint64_t refused[4];      /* connections refused: max_conns, per-source cap, draining, out of fds */
    _Atomic uint64_t put_expired;     /* puts given up for making no progress within put_timeout */
    _Atomic uint64_t abandoned[2];    /* UCX replies, puts given up on after their peer died */
    _Atomic uint64_t put_resv_bytes;  /* bytes reserved for puts whose values are still arriving */
    _Atomic uint64_t staged_bytes;    /* TCP put values staged in memory until they are whole */
    _Atomic uint64_t header_bytes;    /* TCP request header buffers beyond their first page */
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
enum { KVP_HS_DROP_TIMEOUT, KVP_HS_DROP_DISPLACED, KVP_HS_DROP_BAD };
enum { KVP_REFUSE_MAX_CONNS, KVP_REFUSE_PER_SOURCE, KVP_REFUSE_DRAINING, KVP_REFUSE_FDS };

/* What a GET /metrics answers: the text in a heap buffer of *cap_p bytes
 * (kvp__free(buf, *cap_p) after use; NULL: an empty page), its length in
 * *len_p.  Called from the endpoint's thread. */
typedef char *(*kvp__metrics_render_fn)(void *arg, size_t *len_p, size_t *cap_p);

/* Serves GET /metrics on host:port (an IPv4 address; port 0 = any free
 * one) with the text render(arg) returns: the server's (over
 * kvp__metrics_render) and any other program's (kvpool lookup-server's).
 * Its own thread (epoll), at most 64 connections, each closed after 10 s
 * idle. */
kvp_status_t kvp__metrics_start(const char *host, uint16_t port, kvp__metrics_render_fn render,
                                void *arg, kvp__metrics_t **m_p);
/* The port it serves on (the chosen one when started with port 0). */
uint16_t kvp__metrics_port(const kvp__metrics_t *m);
void kvp__metrics_stop(kvp__metrics_t *m);

#endif
