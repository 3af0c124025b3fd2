/*
 * What a pool backend implements.  pool.c validates every op before it
 * reaches a backend, so backends see well-formed batches only.
 */
#ifndef KVP_CLIENT_BACKEND_H
#define KVP_CLIENT_BACKEND_H

#include "client/uri.h"
#include "kvpool/pool.h"

typedef struct kvp__backend_ops {
    const char *scheme;
    /* Opens the backend from a parsed URI; *impl_p is passed to the others. */
    kvp_status_t (*open)(kvp__uri_t *uri, void **impl_p);
    void (*close)(void *impl);
    /* Runs a validated op (async contract of pool.h).  will_drive: the
     * caller calls drive() for it right away (no other thread need be woken
     * to make progress on it). */
    kvp_status_t (*submit)(void *impl, kvp_op_t *op, int will_drive);
    kvp_status_t (*stats)(void *impl, kvp_pool_stats_t *st);
    /* Largest value this backend accepts (for validation). */
    uint64_t (*max_value)(void *impl);
    /* Optional: a thread waiting for its own op drives the transport itself
     * until *done is set or the clock passes until_ns, instead of sleeping
     * (saves two thread wake-ups per round trip).  While any thread drives,
     * the backend's own progress thread stays off the CPU, so one waiting
     * caller costs one busy thread, not two. */
    void (*drive)(void *impl, _Atomic int *done, uint64_t until_ns);
    /* Optional, for tests: make the transport recover as it would from a
     * stuck state (kvpool://: replace the UCX worker).  KVP_OK once done. */
    kvp_status_t (*test_recover)(void *impl);
    /* Optional: registers/deregisters caller memory with the transport. */
    kvp_status_t (*reg)(void *impl, void *addr, size_t len);
    kvp_status_t (*dereg)(void *impl, void *addr);
    /* Optional: answers a validated EXISTS or PREFIX from what this process
     * holds alone (kvpool://: the server's membership filter, where mapped),
     * with no I/O and no wait on the transport: 1 answered (the op's
     * outputs filled), 0 it needs the server. */
    int (*probe)(void *impl, kvp_op_t *op);
} kvp__backend_ops_t;

/* The backend's probe on a validated op: 1 answered, 0 the server must
 * answer (submit it), -1 the backend has no probe or the op is not valid
 * (submit it, and its submit answers). */
int kvp__pool_probe(kvp_pool_t *pool, kvp_op_t *op);

/* Tests: the backend's test_recover on pool (KVP_ERR_UNSUPPORTED without). */
kvp_status_t kvp__pool_test_recover(kvp_pool_t *pool);

extern const kvp__backend_ops_t kvp__embedded_backend;
extern const kvp__backend_ops_t kvp__remote_backend;

#endif
