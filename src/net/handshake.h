/*
 * The connection handshake, over plain TCP on the server's port, before any
 * UCX traffic (docs/protocol.md §1):
 *
 *   client -> server  "KVPH" u16 version  u16 token_len  u32 addr_len  token  addr
 *   server -> client  "KVPH" u16 version  i16 status     u64 conn_key  u32 addr_len  addr
 *
 * (integers big-endian; addr = the sender's UCX worker address).  A client
 * hello with addr_len 0 asks for kvpool's TCP transport instead of UCX: the
 * socket itself then carries requests and replies as frames (net/lane.h).
 * The token
 * is checked here, so an unauthorised client never gets a UCX endpoint.
 * Exchanging worker addresses (instead of UCX's sockaddr connection mode)
 * lets UCX pick every transport both sides reach, shared memory included.
 * The socket then stays open: its close tells the other side the peer died.
 */
#ifndef KVP_NET_HANDSHAKE_H
#define KVP_NET_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

#define KVP_HS_MAGIC "KVPH"
#define KVP_HS_VERSION 1u
#define KVP_HS_TOKEN_MAX 256u
#define KVP_HS_ADDR_MAX 65536u
#define KVP_HS_HELLO_FIXED 12u  /* magic + version + token_len + addr_len */
#define KVP_HS_REPLY_FIXED 20u  /* magic + version + status + conn_key + addr_len */

/* A parsed client hello (views into the buffer it was parsed from). */
typedef struct kvp__hs_hello {
    const uint8_t *token;
    uint32_t token_len;
    const uint8_t *addr;
    uint32_t addr_len;
} kvp__hs_hello_t;

/* Incremental parse of a client hello in buf[0..len): KVP_OK (complete;
 * *used_p bytes), KVP_INPROGRESS (need more bytes), KVP_ERR_PROTOCOL or
 * KVP_ERR_VERSION (close the socket). */
kvp_status_t kvp__hs_parse_hello(const uint8_t *buf, size_t len, kvp__hs_hello_t *h, size_t *used_p);
/* Encodes the server reply into out (KVP_HS_REPLY_FIXED + addr_len bytes). */
size_t kvp__hs_encode_reply(uint8_t *out, kvp_status_t status, uint64_t conn_key, const void *addr,
                            uint32_t addr_len);

/* Client side, blocking with a deadline: connects to host:port, sends the
 * hello, reads the reply.  On KVP_OK returns the socket, the conn key and the
 * server's worker address (heap, kvp__free(addr, len)). */
kvp_status_t kvp__hs_client(const char *host, uint16_t port, const char *token, const void *addr,
                            uint32_t addr_len, uint32_t timeout_ms, int *fd_p, uint64_t *key_p,
                            void **srv_addr_p, uint32_t *srv_addr_len_p);

#endif
