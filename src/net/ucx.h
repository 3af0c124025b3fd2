/*
 * UCX set-up shared by the server and the remote client: a context with
 * active messages, a worker, and a readable list of the transports UCX
 * found (logged at start so operators see shm vs rdma).  The server makes
 * its own context (kvp__ucx_open); the kvpool:// handles of a process share
 * one (kvp__ucx_client_open), each with its own worker.  UCX never uses tcp
 * in kvpool (see context_create in ucx.c).
 */
#ifndef KVP_NET_UCX_H
#define KVP_NET_UCX_H

#include <ucp/api/ucp.h>

#include "kvpool/status.h"

typedef enum kvp__ucx_role {
    KVP_UCX_SERVER, /* the worker is used by one thread */
    KVP_UCX_CLIENT, /* the worker is shared by caller threads and a progress thread */
} kvp__ucx_role_t;

/* Creates a context (AM feature) and a worker for that role.  Logs the
 * transports at info level, prefixed with `who`.  KVP_OK or KVP_ERR_IO
 * (logged). */
kvp_status_t kvp__ucx_open(const char *who, kvp__ucx_role_t role, ucp_context_h *ctx_p,
                           ucp_worker_h *worker_p);
void kvp__ucx_close(ucp_context_h ctx, ucp_worker_h worker);
/* The client's: a reference on the process's one client context (made,
 * with UCX's configuration of that moment, by the first open; freed by the
 * last close) and a worker of its own on it, for a thread-shared
 * (KVP_UCX_CLIENT) worker.  Thread-safe.  KVP_OK or KVP_ERR_IO (logged). */
kvp_status_t kvp__ucx_client_open(ucp_context_h *ctx_p, ucp_worker_h *worker_p);
/* Destroys worker (unless NULL) and drops ctx's reference. */
void kvp__ucx_client_close(ucp_context_h ctx, ucp_worker_h worker);
/* References on this process's client context: 0 when none exists. */
unsigned kvp__ucx_context_refs(void);
/* Which kinds of transport ctx has: shared memory (posix, sysv, xpmem, cma,
 * knem), RDMA (rc, dc, ud). */
void kvp__ucx_kinds(ucp_context_h ctx, int *shm_p, int *rdma_p);
/* Does host (a name or an IPv4 address) name this host: loopback, or the
 * address of one of its interfaces? */
int kvp__ucx_host_is_local(const char *host);
/* "posix sysv cma tcp ..." — the transports UCX may use (static buffer). */
const char *kvp__ucx_transports(ucp_context_h ctx);
/* Closes ep by flushing what is outstanding on it first, progressing the
 * worker for up to timeout_ms (0: only starts it); returns 1 when the close
 * completed, 0 otherwise: the close then stays pending and ends with the
 * worker, and so do the requests still outstanding on it, whose callbacks
 * may never run (their owners give them up).  The endpoint must not be used
 * or closed again either way.  (UCX 1.13 cannot force-close: that needs
 * UCP_ERR_HANDLING_MODE_PEER, which its shared-memory transports lack, so
 * an endpoint to a dead peer never flushes.) */
int kvp__ucx_ep_close(ucp_worker_h worker, ucp_ep_h ep, unsigned timeout_ms);
/* Sets the handler of active message `id` on worker (whole messages only:
 * kvpool's headers and values arrive in one piece). */
ucs_status_t kvp__ucx_am_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void *arg);
/* Arming a worker before a wait, for an event loop that may find it
 * un-armable: a worker with events pending cannot be armed, and one with a
 * dead peer's transport can stay "busy" with nothing to progress. */
typedef struct kvp__ucx_armer {
    uint64_t busy_since;  /* un-armable without progress since (0: not) */
    unsigned busy;        /* passes un-armable in a row */
} kvp__ucx_armer_t;
/* Arms worker for a wait of timeout ms (0: a poll, nothing armed).  Returns
 * the timeout to wait with: as given when armed; when un-armable, 0 (poll
 * the sockets and come back) or 1 ms after 1000 idle passes (stop burning
 * the core); -1 when it has been un-armable with no progress for wedge_ns,
 * by this loop (did) nor since last_progress_ns (other threads' progress,
 * 0 if none): the caller replaces the worker. */
int kvp__ucx_arm(ucp_worker_h worker, kvp__ucx_armer_t *a, int timeout, int did, uint64_t now,
                 uint64_t last_progress_ns, uint64_t wedge_ns);
/* Maps a UCX status to kvpool's. */
kvp_status_t kvp__ucx_status(ucs_status_t st);

#endif
