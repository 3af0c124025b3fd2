/*
 * The EC control protocol (connectors-spec §3.5; the seed's control.py and
 * worker.py win where the spec is silent): JSON requests over ZeroMQ
 * REQ -> REP, their replies, and the readiness events sent PUSH -> PULL.
 * Encoder and decoder side by side; every decoder is reached by a fuzz
 * target (tests/fuzz/fuzz_ec_control.c, fuzz_ec_event.c).
 *
 * Requests ({"op": ...}):
 *   peers | event_port
 *   status          transfer_id
 *   reserve         transfer_id, mm_hash, nbytes, shape [ints], dtype (torch name)
 *   reserve_batch   items: [reserve fields...]
 *   complete        transfer_id, reservation_id
 *   complete_batch  items: [{transfer_id, reservation_id}...]
 *   cancel          transfer_id, reservation_id? ("" = any), abandon?, refresh?
 * Replies: {"ok":true,"result":X} or {"ok":false,"error":"message"}.
 *
 * The decoder is defensive: a frame over KVP__EC_CTL_MAX_FRAME bytes, bad
 * JSON, a non-object, an unknown op, a missing or mistyped field, more than
 * KVP__EC_CTL_MAX_ITEMS items, a shape of more than KVP__EC_MAX_NDIM dims or
 * with a negative dim, an id longer than KVP__EC_CTL_MAX_ID bytes, an
 * unknown dtype, or shape*itemsize != nbytes is an error with a message for
 * the error reply; the server answers it and goes on.  In reserve_batch a
 * bad item is that item's error only (as in the seed).
 *
 * Field conversions follow the seed's str()/int()/bool() where a peer could
 * lean on them: transfer_id and reservation_id accept a string or an
 * integer (written in decimal); nbytes and shape dims must be integers;
 * abandon/refresh take Python truthiness of any JSON value.
 */
#ifndef KVP_EC_CTL_WIRE_H
#define KVP_EC_CTL_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "ec/ec_resv.h"
#include "kvpool/ec_connector.h"

#define KVP__EC_CTL_MAX_FRAME (64u * 1024u)
#define KVP__EC_CTL_MAX_ITEMS 1024u
#define KVP__EC_CTL_MAX_ID 255u

typedef enum kvp__ec_op {
    KVP__EC_OP_PEERS = 0,
    KVP__EC_OP_EVENT_PORT,
    KVP__EC_OP_STATUS,
    KVP__EC_OP_RESERVE,
    KVP__EC_OP_RESERVE_BATCH,
    KVP__EC_OP_COMPLETE,
    KVP__EC_OP_COMPLETE_BATCH,
    KVP__EC_OP_CANCEL,
} kvp__ec_op_t;

const char *kvp__ec_op_name(kvp__ec_op_t op);

/* One reserve (or reserve_batch item).  error != NULL: this item did not
 * decode (the message for its error reply; the other fields are unset). */
typedef struct kvp__ec_wire_reserve {
    const char *transfer_id;
    const char *mm_hash;
    const char *dtype_name; /* as sent, e.g. "bfloat16" */
    kvp__ec_tensor_t t;
    const char *error;
} kvp__ec_wire_reserve_t;

typedef struct kvp__ec_wire_complete {
    const char *transfer_id;
    const char *reservation_id;
} kvp__ec_wire_complete_t;

typedef struct kvp__ec_ctl_req {
    kvp__ec_op_t op;
    /* status, cancel */
    const char *transfer_id;
    const char *reservation_id; /* cancel: "" when absent */
    bool abandon, refresh;      /* cancel */
    /* reserve: n_reserves == 1; reserve_batch: the items */
    kvp__ec_wire_reserve_t *reserves;
    size_t n_reserves;
    /* complete: n_completes == 1; complete_batch: the items */
    kvp__ec_wire_complete_t *completes;
    size_t n_completes;
} kvp__ec_ctl_req_t;

/* A decoder: its parser and arena, reused by every decode.  Strings and
 * arrays of a decoded request stay valid until the next decode or cleanup. */
typedef struct kvp__ec_ctl_dec {
    kvp__json_parser_t json;
    kvp__ec_wire_reserve_t *reserves;
    size_t cap_reserves;
    kvp__ec_wire_complete_t *completes;
    size_t cap_completes;
    char *scratch; /* integer ids written in decimal, error texts */
    size_t scratch_len, scratch_cap;
} kvp__ec_ctl_dec_t;

void kvp__ec_ctl_dec_init(kvp__ec_ctl_dec_t *d);
void kvp__ec_ctl_dec_cleanup(kvp__ec_ctl_dec_t *d);
/* KVP_OK and *req; KVP_ERR_DECODE with the message for the error reply in
 * err (e.g. "malformed control request", "unknown control op: 'x'",
 * "missing field 'transfer_id'", "Unsupported torch dtype string: 'x'",
 * "shape and dtype do not match nbytes"); KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_ctl_decode(kvp__ec_ctl_dec_t *d, const void *buf, size_t len, kvp__ec_ctl_req_t *req,
                                char *err, size_t errlen);

/* ---- encoders (all through the common JSON writer; oom is sticky in b) ---- */

/* Requests, as the producer and the scheduler send them. */
void kvp__ec_ctl_put_simple(kvp__jw_t *b, kvp__ec_op_t op); /* peers, event_port */
void kvp__ec_ctl_put_status(kvp__jw_t *b, const char *transfer_id);
void kvp__ec_ctl_put_reserve(kvp__jw_t *b, const char *const *transfer_ids, const char *const *mm_hashes,
                             const kvp__ec_tensor_t *ts, size_t n, bool batch);
void kvp__ec_ctl_put_complete(kvp__jw_t *b, const kvp__ec_wire_complete_t *items, size_t n, bool batch);
void kvp__ec_ctl_put_cancel(kvp__jw_t *b, const char *transfer_id, const char *reservation_id, bool abandon,
                            bool refresh);

/* Replies.  begin/end wrap a result written by the caller between them. */
void kvp__ec_ctl_put_ok_begin(kvp__jw_t *b); /* {"ok":true,"result": */
void kvp__ec_ctl_put_ok_end(kvp__jw_t *b);   /* } */
void kvp__ec_ctl_put_error(kvp__jw_t *b, const char *msg);
/* The result objects of §3.5. */
void kvp__ec_ctl_put_peers_result(kvp__jw_t *b, const uint16_t *ports, size_t n);
void kvp__ec_ctl_put_reserve_result(kvp__jw_t *b, const kvp__ec_reserve_out_t *o, const char *dst_session,
                                    uint64_t dst_ptr);
void kvp__ec_ctl_put_status_result(kvp__jw_t *b, const kvp__ec_status_t *st); /* NULL st: null */
void kvp__ec_ctl_put_complete_result(kvp__jw_t *b, bool completed, bool became_ready);
/* {"cancelled":b}, plus "deferred":true when the cancel was deferred (a
 * WRITING record went to CANCEL_PENDING: memory kept until complete). */
void kvp__ec_ctl_put_cancel_result(kvp__jw_t *b, bool cancelled, bool deferred);

/* A readiness event: {"transfer_id","mm_hash","ready":true,"reservation_id",
 * "nbytes","shape","dtype","shard"} in that order (control.py queue_ready). */
void kvp__ec_ctl_put_event(kvp__jw_t *b, const char *transfer_id, const kvp__ec_status_t *st, uint16_t shard);

/* ---- reply decoders (the client side) ---- */

/* A reply frame: KVP_OK with *ok_p and either *result_p (ok) or *error_p
 * (not ok; "EC control request failed" when the reply carries none), both
 * in the parser's arena.  KVP_ERR_DECODE when it is not a JSON object. */
kvp_status_t kvp__ec_ctl_decode_reply(kvp__json_parser_t *p, const void *buf, size_t len, bool *ok_p,
                                      const kvp__json_t **result_p, const char **error_p);
/* The result of a reserve (one item): KVP_OK and *o, *dst_session_p (arena),
 * *dst_ptr_p; KVP_ERR_DECODE when a field is missing or mistyped. */
kvp_status_t kvp__ec_ctl_decode_reserve_result(const kvp__json_t *result, kvp__ec_reserve_out_t *o,
                                               const char **dst_session_p, uint64_t *dst_ptr_p);

#endif
