/*
 * The EC control plane's reserve, for `kvpool bench --ec-reserve`
 * (tools/bench_ec_reserve.c): one timed reserve through the control client
 * and the cross-encoder cache's store entries, which use src/ec/ internals
 * that tools may not include themselves (scripts/check-layers.sh).  Test
 * support: not part of libkvpool; link kvp_testkit.
 */
#ifndef KVP_TESTKIT_EC_RESERVE_DRIVE_H
#define KVP_TESTKIT_EC_RESERVE_DRIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef struct kvp__ec_client kvp__rd_client_t;

/* A control client with this timeout (KVP_OK or the create's status). */
kvp_status_t kvp__rd_client_create(int64_t timeout_ms, kvp__rd_client_t **c_p);
void kvp__rd_client_destroy(kvp__rd_client_t *c);

/* One reserve of (tid, hash) for a bfloat16 tensor of [size / (2 * hidden),
 * hidden] at the control address addr, timed from send to reply (*ns_p);
 * the reservation is then cancelled with abandon, untimed, so the receive
 * pool never fills.  *cached_p: the reply's cached; *frame_p and *reply_p
 * (may be NULL): the request's and the reply's lengths in bytes.  KVP_OK,
 * or the first failing status. */
kvp_status_t kvp__rd_reserve_once(kvp__rd_client_t *c, const char *addr, const char *tid, const char *hash,
                                  uint64_t size, int64_t hidden, uint64_t *ns_p, bool *cached_p, size_t *frame_p,
                                  size_t *reply_p);

/* Puts n values of `size` bytes into the pool at uri under the consumer's
 * store keys of model and hash_of(i) (the cross-encoder cache's entries). */
kvp_status_t kvp__rd_put_entries(const char *uri, const char *model, uint64_t n, uint64_t size,
                                 void (*hash_of)(char *buf, size_t len, uint64_t i));

#endif
