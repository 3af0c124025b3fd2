/*
 * The EC push's UCX context (ec_push_ucx.c): a context and a worker of its
 * own, with the RMA feature (kvpool's pool transport opens AM only,
 * net/ucx.c), shared by the receiver (ec_push_rx.c) and the producer
 * (ec_push_tx.c).  What UCX 1.13 does with it on one host is in
 * docs/ec-push.md §"UCX RMA": a put into memory UCX allocated (posix or sysv
 * shared memory) is a one-sided copy into the mapped segment; a put into
 * memory the caller allocated is "software emulation" (active messages the
 * target must progress), also over cma, which UCX 1.13 uses only for
 * rendezvous reads; over UCX's tcp, puts are emulated too.
 */
#ifndef KVP_EC_PUSH_UCX_H
#define KVP_EC_PUSH_UCX_H

#include <stdbool.h>
#include <ucp/api/ucp.h>

#include "kvpool/status.h"

typedef struct kvp__ec_ucx {
    ucp_context_h ctx;
    ucp_worker_h worker;   /* single-threaded: its owner serialises calls */
    bool shm;              /* posix, sysv or xpmem: one-sided puts into UCX-allocated memory */
    bool rdma;             /* rc, dc or ud: one-sided puts into registered memory */
    bool tcp;              /* UCX's tcp is among the transports (only when allow_tcp) */
    char tls[256];         /* the transports, for logs */
} kvp__ec_ucx_t;

/* Opens the context and worker.  allow_tcp false (the rule): UCX_TLS unset
 * or "all" becomes "^tcp"; a UCX_TLS that still yields tcp makes the open
 * fail with KVP_ERR_UNSUPPORTED (logged at info: the TCP stream serves;
 * kvpool keeps tcp out of UCX, see net/ucx.c).  allow_tcp true
 * (measurements): UCX_TLS as the environment says.  KVP_OK,
 * KVP_ERR_UNSUPPORTED, KVP_ERR_IO (logged). */
kvp_status_t kvp__ec_ucx_open(const char *who, bool allow_tcp, kvp__ec_ucx_t *u);
void kvp__ec_ucx_close(kvp__ec_ucx_t *u);
/* Waits for the request sp (from a *_nbx call) up to deadline_ns,
 * progressing the worker.  KVP_OK, KVP_ERR_TIMEOUT (the request is left
 * outstanding: its endpoint must not be used again), or the request's
 * failure. */
kvp_status_t kvp__ec_ucx_wait(ucp_worker_h w, ucs_status_ptr_t sp, uint64_t deadline_ns);

#endif
