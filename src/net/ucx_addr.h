/*
 * kvpool's own check of a peer's packed UCX worker address, before the
 * address reaches ucp_ep_create (UCX 1.13 parses it without bounds checks;
 * see the essay in ucx_addr.c).  The handshake (net/handshake.h) carries the
 * address; whoever receives it calls kvp__ucx_addr_check first and refuses
 * the connection when it fails.
 */
#ifndef KVP_NET_UCX_ADDR_H
#define KVP_NET_UCX_ADDR_H

#include <stddef.h>

#include "kvpool/status.h"

/* Longest worker address accepted (bytes); longer ones are refused.  A
 * worker address with every transport of a large RDMA host is under 1 KiB. */
#define KVP_UCX_ADDR_MAX 4096u

/* Checks a peer's packed UCX worker address (from the network) before it is
 * given to UCX, against this process's own worker address `own` (from
 * ucp_worker_get_address on the worker that will create the endpoint).
 * KVP_OK if `peer` is a well-formed address in the same format as `own`
 * (address version, header flags, unified mode or not) that walks to its
 * exact end, and every transport it names is one `own` names too, with the
 * same device-address length, interface-address length and iface-attribute
 * layout as in `own`, and none is tcp; KVP_ERR_PROTOCOL otherwise, with a
 * static reason in *why_p (may be NULL; set to NULL on KVP_OK).  Never
 * reads outside peer[0..peer_len) or own[0..own_len).  The result also says
 * whether the two share a transport at all: an address with no transport in
 * common is refused ("no UCX transport in common").
 *
 * "The same layout" also means: in v2, a segment size at least own's for
 * that transport; for UCX's shared-memory transports, the mode bits inside
 * their device and iface addresses equal own's (see ucx_addr.c).
 * Header flags: the worker-uuid and AM-only flags must equal own's; the
 * debug-info and client-id flags may differ (each only says whether an
 * optional field is present, and the walk reads it either way).  Unified
 * mode (UCX_UNIFIED_MODE=y): such an address carries no iface-address
 * lengths, so it cannot be bounded from its bytes; while the UCX
 * configuration of this process says unified mode, every address is refused.
 * [in] peer, own: not kept after the call.  Thread-safe. */
kvp_status_t kvp__ucx_addr_check(const void *peer, size_t peer_len, const void *own, size_t own_len,
                                 const char **why_p);

#endif
