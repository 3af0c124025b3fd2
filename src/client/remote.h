/*
 * The kvpool:// backend's constructor for one server connection, for
 * backends built of several servers (a cluster backend): it opens a handle
 * to HOST:PORT that the ops of kvp__remote_backend (client/backend.h) then
 * take as their impl.  remote_open (the kvpool://HOST:PORT URI) is one
 * caller: it parses the URI's options into a kvp__remote_opts_t.
 */
#ifndef KVP_CLIENT_REMOTE_H
#define KVP_CLIENT_REMOTE_H

#include <stdint.h>

#include "kvpool/status.h"

typedef enum kvp__remote_transport {
    KVP_REMOTE_AUTO, /* kvpool's TCP transport where UCX would only have tcp, else UCX */
    KVP_REMOTE_UCX,  /* UCX only */
    KVP_REMOTE_TCP,  /* kvpool's TCP transport only */
} kvp__remote_transport_t;

typedef struct kvp__remote_opts {
    uint32_t timeout_ms;              /* default call timeout (>= 1) */
    kvp__remote_transport_t transport;
    int local_reads;                  /* 1: read a same-host server's arena directly when it can; 0: never */
    const char *token;                /* the shared secret (copied), or NULL */
    int lazy_connect;                 /* 1: a server not reachable at open is not an error (connect=lazy) */
} kvp__remote_opts_t;

/* Opens a handle to the server at host:port and connects (so a bad address
 * or token fails here, not at the first op).  With lazy_connect, a server
 * that cannot be reached (refused, unreachable, no answer within the
 * timeout) does not fail the open: the handle's ops fail with
 * KVP_ERR_CONN_LOST until a connect succeeds, tried again with the usual
 * backoff; a server that answers and refuses (authentication, version)
 * still fails it.  *impl_p is for the ops of
 * kvp__remote_backend; kvp__remote_backend.close closes it.  host: at most
 * 255 bytes. */
kvp_status_t kvp__remote_open(const char *host, uint16_t port, const kvp__remote_opts_t *opts, void **impl_p);

#endif
