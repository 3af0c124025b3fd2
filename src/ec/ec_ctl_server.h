/*
 * The consumer's control server (connectors-spec §3.5; the seed's
 * control.py ConsumerControlServer): one thread per TP shard serving the
 * JSON ops over ZeroMQ and publishing readiness events on a PUSH socket.
 *
 * The request socket is a ROUTER that speaks REP's envelope, so every
 * request is attributed to the connection it came on (the per-peer caps of
 * the reservation table); a REQ client sees a plain REP.  Every request is
 * decoded by the one codec (ec_ctl_wire.h); a bad one gets an error reply
 * and the loop goes on.  Frames above KVP__EC_CTL_MAX_FRAME get an error
 * reply; above 16 times that ZeroMQ drops the connection.  Events wait in
 * a bounded queue (max_pending_events; when full the oldest is dropped and
 * counted) and are sent without blocking.  Every reap_interval_ms the
 * server expires leases (kvp__ec_resv_expire).
 *
 * Binding: the configured host only ("0.0.0.0" binds every interface and
 * only when the caller asks for it), the event socket on an ephemeral port
 * of the same host.  create returns once both are bound, or fails within
 * start_timeout_ms.
 */
#ifndef KVP_EC_CTL_SERVER_H
#define KVP_EC_CTL_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "ec/ec_resv.h"
#include "ec/ec_xcache.h"

typedef struct kvp__ec_ctl_server kvp__ec_ctl_server_t;

typedef struct kvp__ec_ctl_server_params {
    const char *host;          /* bind address (an IPv4 address, a name, or "0.0.0.0") */
    uint16_t port;             /* this shard's control port */
    const uint16_t *peer_ports; /* every shard's port (the peers reply), n_peers >= 1 */
    size_t n_peers;
    kvp__ec_resv_t *resv;      /* borrowed; outlives the server */
    const char *dst_session;   /* the data plane's session string (reserve replies) */
    const uint8_t *slab;       /* the receive slab: dst_ptr = slab + offset */
    int64_t reap_interval_ms;  /* > 0 */
    size_t max_pending_events; /* > 0 */
    int64_t start_timeout_ms;  /* > 0 */
    /* Cross-encoder cache (NULL: none): a reserve naming an mm_hash the
     * resident set lacks waits, off the server's thread, for the lookups of
     * its hashes (ec_xcache.h) and is then served; requests behind it are
     * served meanwhile.  At most max_parked requests (0 = 4096) and 16 MiB
     * of them wait at once; beyond that a reserve is served without
     * waiting for its lookups (parked_over_cap). */
    kvp__ec_xcache_t *xcache;
    size_t max_parked;
} kvp__ec_ctl_server_params_t;

/* KVP_OK (bound and serving), KVP_ERR_INVALID_ARG, KVP_ERR_IO (bind failed
 * or not up within start_timeout_ms; logged), KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_ctl_server_create(const kvp__ec_ctl_server_params_t *p, kvp__ec_ctl_server_t **s_p);
/* Stops the thread and closes the sockets.  NULL is a no-op. */
void kvp__ec_ctl_server_destroy(kvp__ec_ctl_server_t *s);
/* "tcp://host:port" of the control socket. */
const char *kvp__ec_ctl_server_addr(const kvp__ec_ctl_server_t *s);
uint16_t kvp__ec_ctl_server_event_port(const kvp__ec_ctl_server_t *s);

typedef struct kvp__ec_ctl_server_stats {
    uint64_t requests, error_replies, bad_envelopes, oversized;
    uint64_t events_queued, events_sent, events_dropped, events_pending;
    uint64_t reaps;
    uint64_t parked;             /* requests waiting for cross-encoder cache lookups now */
    uint64_t parked_total, parked_over_cap;
    /* the thread's time serving requests, from a request received to its
     * reply sent (or to its parking, then from its lookups' end to the
     * reply): all of them, and those of reserve and reserve_batch;
     * reserve_cpu_ns: the thread's CPU time in those (the wall-clock time
     * less its waits for a CPU) */
    uint64_t busy_ns, reserve_requests, reserve_busy_ns, reserve_cpu_ns;
} kvp__ec_ctl_server_stats_t;
void kvp__ec_ctl_server_stats(kvp__ec_ctl_server_t *s, kvp__ec_ctl_server_stats_t *st);

#endif
