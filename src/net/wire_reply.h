/*
 * The replies of the kvpool wire protocol (docs/protocol.md §2): for every
 * op, the one encoder (the server's) and the one decoder (the client's) of
 * its fields.  net/wire.h has the envelope every reply starts with,
 *
 *   [version, op, req_id, status, <op fields>]
 *
 * written by kvp__wire_reply_begin() and read by kvp__wire_reply_decode().
 * The op fields, by op (an error status carries none):
 *
 *   HELLO:       protocol(uint), max_batch(uint), max_value(uint), arena
 *                arena: [pid, fd, size, dev, ino, populated, table_fd,
 *                table_size, table_dev, table_ino]: the server's arena memfd
 *                and its lease table (a client on the same host may map both,
 *                read only, for GET_LOCAL), or nil (the client is not on the
 *                server's host, or local reads are off)
 *   LOCAL_PROOF: none (status OK: GET_LOCAL is served on this connection
 *                from now on; KVP_ERR_AUTH: wrong proof)
 *   (a request that could not be decoded is answered with op 0, req_id 0)
 *   EXISTS:      bin of n bytes (0/1)
 *   PREFIX:      uint m
 *   PUT/REMOVE/PIN/UNPIN, GET: array of n [status(int), flags_or_size(uint)]
 *                (GET: the value's size; the others: its kvp_key_result_t flags)
 *   GET_LOCAL:   array of n [status(int), size(uint), offset(uint)], then
 *                slot(uint), gen(uint): each found value lies at offset in the
 *                arena, leased until the client sends RELEASE with the
 *                GET_LOCAL's req_id (or its connection closes, or the lease
 *                deadline passes: then table[slot] != gen)
 *   RELEASE:     none (no reply is sent; the request releases req_id and
 *                whatever its released field names)
 *   REMOVE_ALL:  uint removed
 *   STATS:       array of KVP_WIRE_NSTATS uints (kvp_pool_stats_t field order)
 *
 * Only an OK GET reply carries data (the found values, in key order, their
 * sizes summed); any other reply with data breaks the protocol.
 *
 * Decoders.  Each reads the op fields of an OK reply from rep->body (as
 * kvp__wire_reply_decode() left it) into caller storage, bounding every
 * count by the request's (expect: the number of keys the request named, at
 * most KVP_BATCH_MAX), and returns KVP_OK or KVP_ERR_PROTOCOL.  They accept
 * what kvpool's client has always accepted, no more and no less: a field
 * count in the envelope that does not match, or bytes after the fields, are
 * not checked (older servers' replies stay readable).  What stays the
 * client's to do:
 *   - match the reply to its request (req_id, op) and only then decode; a
 *     reply whose status is not KVP_OK fails the request with that status
 *     and has no fields to decode;
 *   - check the data length first: kvp__wire_reply_data_check();
 *   - GET: scatter the data over the caller's buffers by the sizes decoded;
 *   - GET_LOCAL: check each OK item's [offset, offset+size) against its
 *     mapping of the arena and its buffers, the slot against the lease table
 *     (when any item is OK), and release the req_id even when decoding fails
 *     (the server may hold leases for it);
 *   - STATS: fields past what the reply carries keep their old values.
 * The encoders write into a kvp__mpw_t (a reply header); a writer error is
 * sticky in w->err, as for every kvp__mpw_* call.
 */
#ifndef KVP_NET_WIRE_REPLY_H
#define KVP_NET_WIRE_REPLY_H

#include <stdint.h>

#include "net/wire.h"

/* An error reply (or LOCAL_PROOF's, which has no fields), of any op; op 0
 * and req_id 0 answer a request that could not be decoded. */
void kvp__wire_reply_status_encode(kvp__mpw_t *w, uint32_t op, uint64_t req_id, kvp_status_t status);

/* Is data_len bytes of data right for this reply (before its fields are
 * decoded)?  KVP_OK, or KVP_ERR_PROTOCOL for data on anything but an OK GET. */
kvp_status_t kvp__wire_reply_data_check(const kvp__wire_reply_t *rep, uint64_t data_len);

/* ---- HELLO ---- */
typedef struct kvp__wire_arena {
    uint64_t pid, fd, size, dev, ino;
    int populated; /* its pages are all allocated */
    uint64_t tfd, tsize, tdev, tino; /* the lease table */
} kvp__wire_arena_t;

typedef struct kvp__wire_hello {
    uint64_t protocol, max_batch, max_value;
    int has_arena;
    kvp__wire_arena_t arena;
} kvp__wire_hello_t;

/* arena NULL: nil (no local reads for this client). */
void kvp__wire_reply_hello_encode(kvp__mpw_t *w, uint64_t req_id, uint64_t max_batch, uint64_t max_value,
                                  const kvp__wire_arena_t *arena);
kvp_status_t kvp__wire_reply_hello_decode(kvp__wire_reply_t *rep, kvp__wire_hello_t *out);

/* ---- EXISTS, PREFIX, REMOVE_ALL, STATS ---- */
void kvp__wire_reply_exists_encode(kvp__mpw_t *w, uint64_t req_id, const uint8_t *present, uint32_t n);
/* present: expect bytes, each 0 or 1 as the server wrote them. */
kvp_status_t kvp__wire_reply_exists_decode(kvp__wire_reply_t *rep, uint32_t expect, uint8_t *present);

void kvp__wire_reply_prefix_encode(kvp__mpw_t *w, uint64_t req_id, uint64_t m);
/* *m: at most expect. */
kvp_status_t kvp__wire_reply_prefix_decode(kvp__wire_reply_t *rep, uint32_t expect, uint64_t *m);

void kvp__wire_reply_remove_all_encode(kvp__mpw_t *w, uint64_t req_id, uint64_t removed);
kvp_status_t kvp__wire_reply_remove_all_decode(kvp__wire_reply_t *rep, uint64_t *removed);

void kvp__wire_reply_stats_encode(kvp__mpw_t *w, uint64_t req_id, const kvp_pool_stats_t *st);
/* Fills the first *nfields fields of *st (fewer if the reply has fewer;
 * more than KVP_WIRE_NSTATS, up to 64, are read and ignored); st and
 * nfields may be NULL (the fields are checked, not kept). */
kvp_status_t kvp__wire_reply_stats_decode(kvp__wire_reply_t *rep, kvp_pool_stats_t *st, uint32_t *nfields);

/* ---- per-key results: PUT, REMOVE, PIN, UNPIN, GET ---- */
/* Streaming (a GET encodes as it leases): begin with the key count, then
 * one item per key. */
void kvp__wire_reply_keys_begin(kvp__mpw_t *w, uint32_t op, uint64_t req_id, uint32_t n);
static inline void kvp__wire_reply_key(kvp__mpw_t *w, kvp_status_t status, uint64_t flags_or_size)
{
    kvp__mpw_array(w, 2);
    kvp__mpw_int(w, status);
    kvp__mpw_uint(w, flags_or_size);
}
/* All at once: res[i].size for GET, res[i].flags for the others. */
void kvp__wire_reply_results_encode(kvp__mpw_t *w, uint32_t op, uint64_t req_id, const kvp_key_result_t *res,
                                    uint32_t n);
/* Into res[0, expect) (the reply must have exactly expect items): status
 * always; GET: size (flags 0); PUT: flags (size untouched: it is the
 * caller's own value size); REMOVE/PIN/UNPIN: flags (size 0).  GET:
 * *total is the sum of the OK items' sizes, which the reply's data must
 * have (the caller compares); NULL for the other ops.  On KVP_ERR_PROTOCOL
 * res may be partly written. */
kvp_status_t kvp__wire_reply_results_decode(kvp__wire_reply_t *rep, uint32_t expect, kvp_key_result_t *res,
                                            uint64_t *total);

/* ---- GET_LOCAL ---- */
typedef struct kvp__wire_local_item {
    kvp_status_t status;
    uint64_t size;
    uint64_t offset; /* in the arena (0 unless status is OK) */
} kvp__wire_local_item_t;

void kvp__wire_reply_local_begin(kvp__mpw_t *w, uint64_t req_id, uint32_t n);
static inline void kvp__wire_reply_local_item(kvp__mpw_t *w, kvp_status_t status, uint64_t size, uint64_t offset)
{
    kvp__mpw_array(w, 3);
    kvp__mpw_int(w, status);
    kvp__mpw_uint(w, size);
    kvp__mpw_uint(w, offset);
}
/* After the n items: the lease table slot and its generation (0, 0 when
 * no item is OK). */
void kvp__wire_reply_local_end(kvp__mpw_t *w, uint64_t slot, uint64_t gen);
/* Into items[0, expect) (exactly expect items), *slot, *gen; *nok: how
 * many items are OK (the client holds leases to release when > 0). */
kvp_status_t kvp__wire_reply_local_decode(kvp__wire_reply_t *rep, uint32_t expect, kvp__wire_local_item_t *items,
                                          uint64_t *slot, uint64_t *gen, uint32_t *nok);

#endif
