/*
 * The kvpool server: one process, one event-loop thread that owns a UCX
 * worker and the storage engine, serving the wire protocol (net/wire.h) to
 * many clients.  kvp__server_run blocks until SIGTERM/SIGINT (or
 * kvp__server_stop), then refuses new requests, finishes those in flight and
 * returns.
 */
#ifndef KVP_SERVER_SERVER_H
#define KVP_SERVER_SERVER_H

#include <stdint.h>

#include "kvpool/status.h"

typedef struct kvp__server_params {
    const char *host;           /* listen address, e.g. "127.0.0.1" or "0.0.0.0" */
    uint16_t port;              /* 0 = any; the bound port is logged and written to port_file */
    uint64_t memory;            /* arena bytes */
    const char *token;          /* shared secret, NULL = none */
    uint64_t put_timeout_ns;
    int metrics;                /* serve Prometheus text (GET /metrics) */
    uint16_t metrics_port;      /* with metrics: 0 = any free port, written to metrics_port_file */
    const char *port_file;      /* if set, the bound port is written there once listening */
    const char *metrics_port_file; /* if set, the metrics port is written there (before port_file) */
    const char *metrics_host;   /* NULL = host */
    uint32_t max_conns;         /* 0 = 1024 (clamped below the descriptor limit) */
    uint32_t max_conns_per_source; /* without a token: 0 = max_conns / 2; with one: no cap */
    int no_prefault;            /* do not fault the arena in at start */
    int no_local_reads;         /* arena in private memory: clients on this host cannot map it */
    uint64_t filter_bytes;      /* the membership filter for local clients (lreads.c): 0 = sized
                                 * from memory */
    int no_filter;              /* none: every lookup goes to the server */
    int insecure;               /* allow a non-loopback listener without a token */
} kvp__server_params_t;

kvp_status_t kvp__server_run(const kvp__server_params_t *params);

#endif
