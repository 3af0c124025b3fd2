/*
 * The EC control client (control.py ControlClient) and the scheduler's
 * ZeroMQ collaborators built on it: the remote-cancel executor and the
 * readiness-event inbox (EventInbox).
 *
 * The client is thread-safe.  It keeps, per address, a small free list of
 * REQ sockets (RCVTIMEO = SNDTIMEO = timeout_ms, LINGER 0, IPv6 on): a
 * request takes one (or makes one), sends, receives and gives it back; any
 * send or receive error closes that socket instead (a REQ socket that missed
 * a reply is unusable) and fails the request, as the seed does.
 *
 * Lock order: client mutex only (never held across a send or receive).
 */
#ifndef KVP_EC_CLIENT_H
#define KVP_EC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "ec/ec_ctl_wire.h"
#include "kvpool/ec_connector.h"

typedef struct kvp__ec_client kvp__ec_client_t;

/* timeout_ms >= 1.  KVP_OK, KVP_ERR_INVALID_ARG, KVP_ERR_NO_MEMORY, KVP_ERR_IO. */
kvp_status_t kvp__ec_client_create(int64_t timeout_ms, kvp__ec_client_t **c_p);
/* Closes every socket and the context (linger 0).  NULL is a no-op. */
void kvp__ec_client_destroy(kvp__ec_client_t *c);

/* A reply, decoded: valid until kvp__ec_reply_cleanup. */
typedef struct kvp__ec_reply {
    kvp__json_parser_t json;
    bool ok;
    const kvp__json_t *result; /* ok */
    const char *error;         /* !ok: the server's message */
    size_t bytes;              /* the reply frame's size (0: none came) */
} kvp__ec_reply_t;

void kvp__ec_reply_init(kvp__ec_reply_t *r);
void kvp__ec_reply_cleanup(kvp__ec_reply_t *r);

/* One request/reply exchange of the JSON document req[0..len) with addr
 * ("tcp://host:port").  KVP_OK with rep filled (rep->ok tells the server's
 * verdict); KVP_ERR_TIMEOUT (no reply within the timeout), KVP_ERR_IO,
 * KVP_ERR_DECODE (a reply that is not a JSON object), KVP_ERR_INVALID_ARG
 * (a bad address), KVP_ERR_CLOSED (after destroy began). */
kvp_status_t kvp__ec_client_exchange(kvp__ec_client_t *c, const char *addr, const char *req, size_t len,
                                     kvp__ec_reply_t *rep);
/* exchange + "not ok is an error": KVP_ERR_REMOTE when !rep->ok (the
 * message is in rep->error). */
kvp_status_t kvp__ec_client_request(kvp__ec_client_t *c, const char *addr, const char *req, size_t len,
                                    kvp__ec_reply_t *rep);

/* The shard addresses behind base_addr (op peers), cached per base address
 * once found (control.py discover_shards).  KVP_OK and *addrs_p (owned by
 * the client, valid until destroy), or the request's error (KVP_ERR_DECODE
 * for a reply that is not a non-empty list of ports 1..65535). */
kvp_status_t kvp__ec_client_shards(kvp__ec_client_t *c, const char *base_addr, const char *const **addrs_p,
                                   size_t *n_p);
/* op event_port of one shard: KVP_OK and *port_p (1..65535). */
kvp_status_t kvp__ec_client_event_port(kvp__ec_client_t *c, const char *addr, uint16_t *port_p);
/* op cancel: KVP_OK and *cancelled_p (the result's "cancelled", truthy).
 * reservation_id NULL leaves the key out (the scheduler's cancel). */
kvp_status_t kvp__ec_client_cancel(kvp__ec_client_t *c, const char *addr, const char *transfer_id,
                                   const char *reservation_id, bool abandon, bool refresh, bool *cancelled_p);

typedef struct kvp__ec_client_stats {
    uint64_t requests, timeouts, errors, sockets_open;
} kvp__ec_client_stats_t;
void kvp__ec_client_stats(kvp__ec_client_t *c, kvp__ec_client_stats_t *st);

#endif
