/*
 * The connection handshake, over plain TCP on the server's port, before any
 * request (docs/protocol.md §1).  Integers are big-endian.
 *
 * Version 2 (kvpool's own clients), a challenge-response in two round trips:
 *
 *   client -> server  hello      "KVPH" u16 2  u16 flags(0)  client_nonce[16]
 *   server -> client  challenge  "KVPH" u16 2  i16 status  u16 offers  u32 uid  server_nonce[16]
 *   client -> server  response   u8 transport  u8 0  client_mac[32]
 *   server -> client  reply      "KVPH" u16 2  i16 status  u64 conn_key  server_mac[32]
 *                                u32 addr_len  addr
 *
 * offers: KVP_HS_OFFER_TOKEN (a token is required), KVP_HS_OFFER_UCX (the
 * server has UCX transports a peer may reach: shared memory, RDMA; never
 * tcp); uid: the server's effective uid (UCX shared memory works only
 * between processes of one uid).  transport: KVP_HS_TCP (kvpool's TCP
 * transport: the socket then carries frames, net/lane.h) or KVP_HS_UCX
 * (the reply carries the server's UCX worker address; the client creates
 * the endpoint and the server answers on its reply endpoint).  The macs are
 * HMAC-SHA256 under the token (all zero without one):
 *   client_mac = HMAC(token, "kvpool-v2-client" | server_nonce | client_nonce)
 *   server_mac = HMAC(token, "kvpool-v2-server" | client_nonce | server_nonce | conn_key)
 * so the token never crosses the wire, a recorded exchange replays nowhere
 * (the server's nonce is new each time), and the client knows the server
 * holds the token too.  The client never sends a UCX address: the server
 * never parses one.
 *
 * Version 1 (older clients, tools outside the project):
 *
 *   client -> server  "KVPH" u16 1  u16 token_len  u32 addr_len  token  addr
 *   server -> client  "KVPH" u16 1  i16 status  u64 conn_key  u32 addr_len  addr
 *
 * Still answered, byte for byte as before, for addr_len 0 (kvpool's TCP
 * transport) on a server without a token; a version-1 hello carrying a UCX
 * address, or sent to a server with a token (it would carry the token in
 * clear), is answered with KVP_ERR_VERSION and closed; its address bytes are
 * never read.
 *
 * The socket then stays open: its close tells the other side the peer died.
 */
#ifndef KVP_NET_HANDSHAKE_H
#define KVP_NET_HANDSHAKE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

#define KVP_HS_MAGIC "KVPH"
#define KVP_HS_V1 1u
#define KVP_HS_V2 2u
#define KVP_HS_TOKEN_MAX 256u
#define KVP_HS_ADDR_MAX 65536u    /* a version-1 hello's limit (the bytes are never read) */
#define KVP_HS_NONCE 16u
#define KVP_HS_MAC 32u
#define KVP_HS_V1_FIXED 12u       /* magic + version + token_len + addr_len */
#define KVP_HS_HELLO_V2 24u       /* magic + version + flags + nonce */
#define KVP_HS_CHALLENGE 30u      /* magic + version + status + offers + uid + nonce */
#define KVP_HS_RESPONSE 34u       /* transport + 0 + mac */
#define KVP_HS_REPLY_V1 20u       /* magic + version + status + conn_key + addr_len */
#define KVP_HS_REPLY_V2 52u       /* ... + mac */
/* The most a server ever buffers of a client's handshake. */
#define KVP_HS_BUF_MAX (KVP_HS_V1_FIXED + KVP_HS_TOKEN_MAX)

#define KVP_HS_OFFER_TOKEN 0x1u
#define KVP_HS_OFFER_UCX 0x2u
#define KVP_HS_TCP 0u
#define KVP_HS_UCX 1u

/* A parsed client hello (views into the buffer it was parsed from). */
typedef struct kvp__hs_hello {
    uint32_t version;             /* KVP_HS_V1 or KVP_HS_V2 */
    const uint8_t *token;         /* v1: the token (NULL if none) */
    uint32_t token_len;
    uint32_t addr_len;            /* v1: the announced address length (never read) */
    uint8_t nonce[KVP_HS_NONCE];  /* v2: the client's nonce */
} kvp__hs_hello_t;

typedef struct kvp__hs_response {
    uint32_t transport;           /* KVP_HS_TCP or KVP_HS_UCX */
    uint8_t mac[KVP_HS_MAC];
} kvp__hs_response_t;

/* The server's messages, as the client reads them. */
typedef struct kvp__hs_challenge {
    kvp_status_t status;          /* not OK: the server refuses (and closes) */
    uint32_t offers;              /* KVP_HS_OFFER_* */
    uint32_t uid;
    uint8_t nonce[KVP_HS_NONCE];
} kvp__hs_challenge_t;

typedef struct kvp__hs_reply {
    kvp_status_t status;
    uint64_t conn_key;
    uint8_t mac[KVP_HS_MAC];
    uint32_t addr_len;            /* the address bytes follow */
} kvp__hs_reply_t;

/* Incremental parse of a client hello in buf[0..len): KVP_OK (complete;
 * *used_p bytes: for v1 the fixed part and the token, not the address),
 * KVP_INPROGRESS (need more bytes), KVP_ERR_PROTOCOL or KVP_ERR_VERSION
 * (answer, if at all, and close). */
kvp_status_t kvp__hs_parse_hello(const uint8_t *buf, size_t len, kvp__hs_hello_t *h, size_t *used_p);
/* The same for the v2 response (exactly KVP_HS_RESPONSE bytes). */
kvp_status_t kvp__hs_parse_response(const uint8_t *buf, size_t len, kvp__hs_response_t *r, size_t *used_p);
/* The challenge, or a refusal in its place: KVP_OK (*used_p bytes: 8 for a
 * refusal, KVP_HS_CHALLENGE otherwise), KVP_INPROGRESS, KVP_ERR_PROTOCOL
 * (not a kvpool server), KVP_ERR_VERSION (another handshake version). */
kvp_status_t kvp__hs_parse_challenge(const uint8_t *buf, size_t len, kvp__hs_challenge_t *c, size_t *used_p);
/* The version-2 reply's fixed part (KVP_HS_REPLY_V2 bytes; the address
 * follows): KVP_OK, KVP_INPROGRESS, KVP_ERR_PROTOCOL.  A status outside the
 * error list becomes KVP_ERR_PROTOCOL; addr_len is bounded by
 * KVP_HS_ADDR_MAX. */
kvp_status_t kvp__hs_parse_reply(const uint8_t *buf, size_t len, kvp__hs_reply_t *r, size_t *used_p);
/* Encoders; return the bytes written to out. */
size_t kvp__hs_encode_challenge(uint8_t out[KVP_HS_CHALLENGE], kvp_status_t status, uint32_t offers, uint32_t uid,
                                const uint8_t nonce[KVP_HS_NONCE]);
/* version KVP_HS_V1: mac ignored; KVP_HS_V2: mac (NULL = zeros).  out holds
 * KVP_HS_REPLY_V2 + addr_len bytes at least. */
size_t kvp__hs_encode_reply(uint8_t *out, uint32_t version, kvp_status_t status, uint64_t conn_key,
                            const uint8_t *mac, const void *addr, uint32_t addr_len);

/* The macs above (token NULL or "": all zero). */
void kvp__hs_client_mac(const char *token, const uint8_t snonce[KVP_HS_NONCE], const uint8_t cnonce[KVP_HS_NONCE],
                        uint8_t out[KVP_HS_MAC]);
void kvp__hs_server_mac(const char *token, const uint8_t cnonce[KVP_HS_NONCE], const uint8_t snonce[KVP_HS_NONCE],
                        uint64_t conn_key, uint8_t out[KVP_HS_MAC]);
/* Constant-time comparison of two macs: 1 if equal. */
int kvp__hs_mac_eq(const uint8_t a[KVP_HS_MAC], const uint8_t b[KVP_HS_MAC]);

/* Client side, blocking with a deadline. */
typedef enum kvp__hs_want {
    KVP_HS_WANT_TCP,      /* kvpool's TCP transport */
    KVP_HS_WANT_UCX,      /* UCX where the server offers it to this process (same uid), else TCP */
    KVP_HS_WANT_UCX_ONLY, /* UCX or KVP_ERR_UNSUPPORTED */
} kvp__hs_want_t;

typedef struct kvp__hs_result {
    int fd;                       /* the connected socket (non-blocking) */
    uint64_t conn_key;
    uint32_t transport;           /* KVP_HS_TCP or KVP_HS_UCX */
    void *addr;                   /* UCX: the server's worker address (kvp__free(addr, addr_len)) */
    uint32_t addr_len;
} kvp__hs_result_t;

/* Connects to host:port and runs the version-2 handshake.  KVP_OK and *res;
 * else KVP_ERR_HOST_UNKNOWN (the name does not resolve), KVP_ERR_CONN_REFUSED,
 * KVP_ERR_TIMEOUT, KVP_ERR_AUTH (the server refused the token, or could not
 * prove it holds it), KVP_ERR_VERSION, KVP_ERR_PROTOCOL (not a kvpool
 * server), KVP_ERR_UNSUPPORTED (UCX_ONLY, not offered), or the server's
 * refusal (KVP_ERR_BUSY, KVP_ERR_CLOSED, ...); logged.  A handshake the
 * server closes midway (it displaces the least recent one when too many
 * are in progress) is tried again, up to 3 times within timeout_ms;
 * KVP_ERR_CONN_LOST when it is still lost. */
kvp_status_t kvp__hs_client(const char *host, uint16_t port, const char *token, kvp__hs_want_t want,
                            uint32_t timeout_ms, kvp__hs_result_t *res);

#endif
