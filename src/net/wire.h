/*
 * The kvpool wire protocol (docs/protocol.md): one UCX active message per
 * request and one per reply.  The AM header is MessagePack; bulk bytes (put
 * values, get values) travel as the AM's data, never inside the header.
 *
 * Connections start with a handshake over plain TCP on the server's port
 * (net/handshake.h): token check, UCX worker addresses exchanged, and a
 * random 64-bit connection key issued; the TCP socket then stays open as the
 * liveness channel (it closes when either process dies).
 *
 * Request header:  [version, op, req_id, timeout_ms, conn_key, <op fields>, released?]
 * (released: any request may end with an array of up to KVP_RELEASED_MAX
 * req_ids of earlier GET_LOCALs on the connection whose values the client
 * has copied; the server ends their leases before it handles the request)
 * Reply header:    [version, op, req_id, status, <op fields>]
 *
 * A request header longer than KVP_AM_HDR_MAX travels as the AM's data
 * instead, behind a short header [version, KVP_WOP_IN_DATA, req_id, timeout,
 * conn_key] (not for PUT, whose data are the values: clients split such a
 * put into several requests).
 *
 * The decoders here and in net/wire_reply.h (each reply's fields) and
 * net/lane.h (the TCP framing) are the only code that reads bytes from the
 * network; each bounds every count and length before use and returns
 * KVP_ERR_VERSION or KVP_ERR_PROTOCOL for anything else (fuzzed by
 * tests/fuzz/fuzz_wire.c, fuzz_wire_reply.c and fuzz_wire_lane.c).
 */
#ifndef KVP_NET_WIRE_H
#define KVP_NET_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/mp.h"
#include "kvpool/pool.h"
#include "kvpool/status.h"

#define KVP_WIRE_VERSION 1u
#define KVP_AM_REQUEST 11u
#define KVP_AM_REPLY 12u
#define KVP_RELEASED_MAX 64u /* GET_LOCALs one request may release */
/* The longest request or reply header: kvpool's clients send at most 256
 * keys per request (under 140 KB), so 4 MiB leaves room for tools that
 * batch more (65,536 keys of up to 60 bytes) without letting one request
 * make the server hold tens of megabytes. */
#define KVP_WIRE_HEADER_MAX (4u << 20)
#define KVP_WIRE_TOKEN_MAX 256u
#define KVP_AM_HDR_MAX 4096u /* UCX carries AM headers in one segment */
/* Values at least this large always travel by rendezvous (UCP_AM_SEND_FLAG_RNDV):
 * on one host that is a single CMA copy straight between the two processes'
 * buffers, where UCX's eager protocol would copy fragments through shared
 * memory and then once more out of its reassembly buffer. */
#define KVP_RNDV_MIN (64u * 1024u)
#define KVP_WIRE_PAYLOAD_MAX (16ull << 30) /* one batch's value bytes */

typedef enum kvp_wire_op {
    KVP_WOP_IN_DATA = 0, /* the request header is the AM's data */
    KVP_WOP_HELLO = 1,   /* ping: answers the server's limits */
    KVP_WOP_EXISTS = 2,
    KVP_WOP_PREFIX = 3,
    KVP_WOP_PUT = 4,
    KVP_WOP_GET = 5,
    KVP_WOP_REMOVE = 6,
    KVP_WOP_PIN = 7,
    KVP_WOP_UNPIN = 8,
    KVP_WOP_REMOVE_ALL = 9,
    KVP_WOP_STATS = 10,
    KVP_WOP_GET_LOCAL = 11, /* a get whose values the client copies out of the mapped arena */
    KVP_WOP_RELEASE = 12,   /* ends a GET_LOCAL's leases; never answered */
    KVP_WOP_LOCAL_PROOF = 13, /* the client shows it mapped the lease table: keys = [proof] */
    KVP_WOP_MAX = 13
} kvp_wire_op_t;

/* A decoded request.  keys[] and sizes[] point into caller arrays; key bytes
 * and the token point into the message (valid while it is). */
typedef struct kvp__wire_req {
    uint32_t op;
    uint64_t req_id;
    uint32_t timeout_ms;
    uint32_t nkeys;
    kvp_key_t *keys;
    uint64_t *sizes;        /* PUT: value sizes; GET, GET_LOCAL: destination capacities */
    uint64_t payload;       /* PUT: sum of sizes */
    uint64_t conn_key;
    uint32_t nreleased;     /* GET_LOCALs this request releases */
    uint64_t released[KVP_RELEASED_MAX];
} kvp__wire_req_t;

/* Encodes a request header.  sizes: PUT/GET only (else NULL). */
void kvp__wire_req_encode(kvp__mpw_t *w, uint32_t op, uint64_t req_id, uint32_t timeout_ms,
                          uint64_t conn_key, const kvp_key_t *keys, uint32_t nkeys,
                          const uint64_t *sizes);
/* Appends the released field (n: 1..KVP_RELEASED_MAX) to a request header
 * that kvp__wire_req_encode wrote into w.  0, or -1 with w unchanged (no
 * memory). */
int kvp__wire_req_add_released(kvp__mpw_t *w, const uint64_t *ids, uint32_t n);
/* Decodes a request header into *req using keys_buf/sizes_buf (max_keys
 * entries each).  An IN_DATA header decodes with op KVP_WOP_IN_DATA and no
 * keys.  KVP_OK, KVP_ERR_VERSION, KVP_ERR_PROTOCOL. */
kvp_status_t kvp__wire_req_decode(const void *hdr, size_t len, kvp__wire_req_t *req,
                                  kvp_key_t *keys_buf, uint64_t *sizes_buf, uint32_t max_keys);

/* Local reads.  The server's lease table is a second memfd, mapped
 * read-only by clients next to the arena:
 *   [0, 32)   nonce: a client proves it mapped the table (so sits on this
 *             host, with the server's uid) by a LOCAL_PROOF request whose
 *             one key is kvp__wire_lr_proof(nonce, conn_key); only then are
 *             its GET_LOCALs served
 *   [32, 40)  the number of slots (u64, host order)
 *   [40, 48)  the membership filter's offset in the file (u64, host order;
 *             a multiple of 64 past the generations), 0 = no filter
 *   [48, 56)  its blocks (u64): common/cfilter.h, the server's live keys
 *             (docs/transport.md §10)
 *   [64, ...) one u64 generation per slot (host order): a GET_LOCAL's reply
 *             names its slot and generation; the server bumps the
 *             generation before it ends the leases of an unreleased
 *             GET_LOCAL (deadline, connection gone), so a client that reads
 *             the generation unchanged after copying knows it copied bytes
 *             still leased to it. */
#define KVP_WIRE_LR_NONCE 32u
#define KVP_WIRE_LR_PROOF 16u
#define KVP_WIRE_LR_NSLOTS_OFF 32u
#define KVP_WIRE_LR_FILTER_OFF 40u
#define KVP_WIRE_LR_FILTER_BLOCKS_OFF 48u
#define KVP_WIRE_LR_GEN_OFF 64u
void kvp__wire_lr_proof(const uint8_t nonce[KVP_WIRE_LR_NONCE], uint64_t conn_key,
                        uint8_t out[KVP_WIRE_LR_PROOF]);

/* Reply header, first part: [version, op, req_id, status, ...]; the op's
 * fields follow (net/wire_reply.h: their formats, encoders and decoders). */
void kvp__wire_reply_begin(kvp__mpw_t *w, uint32_t op, uint64_t req_id, kvp_status_t status,
                           uint32_t nfields);

#define KVP_WIRE_NSTATS (sizeof(kvp_pool_stats_t) / sizeof(uint64_t))

typedef struct kvp__wire_reply {
    uint32_t op;
    uint64_t req_id;
    kvp_status_t status;
    kvp__mpr_t body;        /* positioned at the op fields */
} kvp__wire_reply_t;

/* Decodes the common part of a reply.  KVP_OK, KVP_ERR_VERSION, KVP_ERR_PROTOCOL. */
kvp_status_t kvp__wire_reply_decode(const void *hdr, size_t len, kvp__wire_reply_t *rep);

#endif
