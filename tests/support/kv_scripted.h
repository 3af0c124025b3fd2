/*
 * A scripted KV lookup client (test support: the unit tests and
 * `kvpool kv-sched-replay`): lookup() answers what it was told, every call is
 * recorded.  Not part of libkvpool or its headers; link kvp_testkit.
 */
#ifndef KVP_TESTKIT_KV_SCRIPTED_H
#define KVP_TESTKIT_KV_SCRIPTED_H

#include "kvpool/kv_connector.h"

typedef struct kvp_kv_scripted kvp_kv_scripted_t;

typedef enum kvp_kv_reset_reply {
    KVP_KV_RESET_ACK = 0,
    KVP_KV_RESET_NACK = 1,
    KVP_KV_RESET_ERROR = 2,
} kvp_kv_reset_reply_t;

typedef struct kvp_kv_lookup_call {
    int64_t num_tokens;
    size_t num_block_hashes;
    bool non_block;
} kvp_kv_lookup_call_t;

kvp_status_t kvp_kv_scripted_create(kvp_kv_scripted_t **sc_p);
void kvp_kv_scripted_destroy(kvp_kv_scripted_t *sc);
/* The client view of it (valid while sc lives). */
kvp_kv_lookup_client_t kvp_kv_scripted_client(kvp_kv_scripted_t *sc);
/* What lookup() answers from now on: a hit, or "not yet" when pending. */
void kvp_kv_scripted_set_lookup(kvp_kv_scripted_t *sc, int64_t hit, bool pending);
/* Make lookup() fail (error status) from now on until set_lookup. */
void kvp_kv_scripted_set_lookup_error(kvp_kv_scripted_t *sc);
void kvp_kv_scripted_set_reset(kvp_kv_scripted_t *sc, kvp_kv_reset_reply_t reply);
/* Calls recorded since the last clear. The pointers stay valid until the next
 * clear or destroy. */
size_t kvp_kv_scripted_lookups(const kvp_kv_scripted_t *sc, const kvp_kv_lookup_call_t **calls_p);
size_t kvp_kv_scripted_discards(const kvp_kv_scripted_t *sc, const char *const **ids_p);
size_t kvp_kv_scripted_resets(const kvp_kv_scripted_t *sc);
void kvp_kv_scripted_clear(kvp_kv_scripted_t *sc);

#endif
