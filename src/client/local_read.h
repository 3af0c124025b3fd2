/*
 * Local reads: a client on the server's host maps the server's arena (a
 * memfd, read-only) and copies get values out of it itself, instead of
 * having UCX move them (docs/transport.md §9).  This module owns the
 * process's mappings (one per server arena, shared by every handle that
 * reaches that server, its page tables filled when it is mapped) and the
 * copy itself (streaming stores for large values).
 *
 * Safety: the server leases every value it names in a GET_LOCAL reply until
 * the client releases it, the connection's socket closes or the lease's
 * deadline passes; in the last two cases it bumps the reply's slot in the
 * lease table (mapped beside the arena) before the space can be reused, and
 * the reader checks that slot after copying (kvp__lmap_still_leased), so a
 * copy that may have read reused bytes is never returned.  Both mappings
 * are PROT_READ, and the server seals both files: nobody can write into
 * them or change their size.
 */
#ifndef KVP_CLIENT_LOCAL_READ_H
#define KVP_CLIENT_LOCAL_READ_H

#include <stddef.h>
#include <stdint.h>

#include "common/cfilter.h"
#include "kvpool/status.h"
#include "net/wire_reply.h"

/* What the server's HELLO says about its arena and lease table
 * (net/wire_reply.h; populated: its pages are all allocated, so mapping them
 * in ahead is free of side effects). */
typedef kvp__wire_arena_t kvp__arena_info_t;

typedef struct kvp__lmap kvp__lmap_t;

/* Maps the arena (opening /proc/PID/fd/FD and checking that it is the
 * file named by dev and ino), or takes another reference on this process's
 * existing mapping of it.  KVP_ERR_UNSUPPORTED when it cannot be mapped
 * from here (another host or PID namespace, no permission, a different
 * file): the caller reads over the network instead. */
kvp_status_t kvp__lmap_get(const kvp__arena_info_t *ai, kvp__lmap_t **m_p);
void kvp__lmap_ref(kvp__lmap_t *m);
void kvp__lmap_put(kvp__lmap_t *m);
/* Is m the mapping of the arena ai describes? */
int kvp__lmap_is(const kvp__lmap_t *m, const kvp__arena_info_t *ai);
const uint8_t *kvp__lmap_base(const kvp__lmap_t *m);
uint64_t kvp__lmap_size(const kvp__lmap_t *m);
/* The lease table's nonce (KVP_WIRE_LR_NONCE bytes), for the proof. */
const uint8_t *kvp__lmap_nonce(const kvp__lmap_t *m);
/* The server's membership filter (common/cfilter.h) in the lease table's
 * file, or NULL when it keeps none: a key it calls absent is not live
 * (docs/transport.md §10). */
const kvp__cfilter_t *kvp__lmap_filter(const kvp__lmap_t *m);
/* Is slot a slot of the lease table? */
int kvp__lmap_slot_ok(const kvp__lmap_t *m, uint64_t slot);
/* After a copy: 1 if slot still holds gen (every byte copied was leased). */
int kvp__lmap_still_leased(const kvp__lmap_t *m, uint64_t slot, uint64_t gen);

/* One piece of a copy. */
typedef struct kvp__cpseg {
    void *dst;
    const void *src;
    size_t len;
} kvp__cpseg_t;

/* Copies every segment; from KVP_STREAM_MIN bytes in all on with
 * streaming (non-temporal) stores. */
#define KVP_STREAM_MIN (256u * 1024u)
void kvp__lread_copy(const kvp__cpseg_t *segs, uint32_t n);
/* Tests: 1 = use the widest vector stores this CPU has (the default), 0 =
 * use the baseline (SSE2) ones, so both paths get checked on any host. */
void kvp__lread_test_wide(int on);

/* The kvpool:// handle's side (client/remote_int.h).  After the HELLO of
 * connection gen (conn_key key): maps the arena ai describes, or keeps the
 * mapping of the last connection to it, and proves it to the server, so gets
 * on gen may go as GET_LOCAL. */
struct remote;
struct pending;
void kvp__lread_setup(struct remote *r, int gen, uint64_t key, const kvp__arena_info_t *ai);
/* p's GET_LOCAL reply is parsed with status st (mu held; unlocks): copies
 * the values out of the mapping, queues the release of the leases, ends
 * p's reply side. */
void kvp__lread_finish(struct remote *r, struct pending *p, kvp_status_t st);
/* Progress thread: sends the releases that waited long enough for a request
 * to ride on.  Returns whether any are still queued. */
int kvp__lread_flush_released(struct remote *r, uint64_t now);

#endif
