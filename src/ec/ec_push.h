/*
 * The EC push data plane (issue 16 item 3; docs/ec-push.md): how a producer
 * moves an encoder output into the slot a consumer reserved for it.
 *
 * A consumer shard runs one receiver over its receive slab.  Its session
 * string (the reserve reply's dst_session) names every path it offers; a
 * slot is named by dst_ptr, the slot's absolute address in the consumer's
 * address space (as Mooncake's TransferEngine does), so
 * offset = dst_ptr - slab base.
 *
 *   - UCX RMA (shared memory or RDMA reach the consumer): the slab is
 *     mapped with ucp_mem_map; the session carries the consumer worker's
 *     address and the packed rkey (hex); the producer unpacks it and
 *     writes with ucp_put_nbx, then flushes the endpoint (remote
 *     completion) before it returns.
 *   - TCP (only TCP reaches it): the receiver listens on a data port; the
 *     producer streams a header {magic, dst offset, length, reservation id}
 *     and the bytes; the receiver checks the range against the reservation
 *     (check callback, before any byte moves), receives the bytes straight
 *     into the slot and answers one status frame after the last byte
 *     landed.
 *
 * Either way a write returns only once the bytes are in the slot, so the
 * producer's complete (control channel) can never overtake its data.
 *
 * Bounds.  Over TCP the receiver checks every write (slab, then the check
 * callback) before a byte moves.  An RMA put is one-sided: the consumer
 * never sees it, so there the producer's own check -- [dst_ptr, dst_ptr +
 * len) inside the slab the session names -- is the only one; a producer
 * that skipped it could write anywhere in the slab (never outside: the
 * rkey covers the slab only).  Per-reservation rkeys would close that, but
 * on this host a one-sided put needs the slab to be UCX-allocated shared
 * memory (one segment, one rkey), so a sub-range rkey falls back to
 * emulation; docs/ec-push.md has the figures.
 *
 * UCX 1.13 here (docs/ec-push.md): ucp_put_nbx into memory UCX allocated
 * (posix/sysv) is a one-sided copy; into memory the caller allocated it is
 * "software emulation" over active messages, which the receiver's thread
 * progresses (so does UCX's tcp).  Hence the receiver offers UCX only for a
 * slab it allocated itself with UCX (slab == NULL below) over shm, or with
 * RDMA; ucx_force overrides that for measurements.
 *
 * The receiver holds at most max_conns connections, drops one that is idle
 * past idle_ms or sends a bad header (status reply, one rate-limited log
 * line), and counts all of it in its stats.
 */
#ifndef KVP_EC_PUSH_H
#define KVP_EC_PUSH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/ec_connector.h"

/* Paths, as a bit set. */
#define KVP__EC_PATH_TCP 1u
#define KVP__EC_PATH_UCX 2u

typedef struct kvp__ec_push_rx kvp__ec_push_rx_t;

typedef struct kvp__ec_push_rx_params {
    /* The data port's bind address (IPv4 or name); required.  The session
     * advertises advertise_host when given (the address producers reach:
     * needed when binding 0.0.0.0; read during create), else the bound
     * address. */
    const char *host;
    const char *advertise_host;
    uint16_t port;         /* 0 = any */
    /* The receive slab (borrowed; outlives the receiver), or NULL: the
     * receiver allocates slab_size bytes itself (UCX shared memory where UCX
     * offers it, so that RMA puts are one-sided; else anonymous memory) and
     * frees them at destroy (kvp__ec_push_rx_slab). */
    uint8_t *slab;
    uint64_t slab_size;
    unsigned paths;        /* KVP__EC_PATH_*; UCX is offered only where UCX has shm or rdma */
    /* The bounds check (kvp__ec_resv_check_write): KVP_OK if [offset,
     * offset+len) lies in a reservation being written (reservation_id may be
     * "" when the path carries none).  Called from the receiver's thread. */
    kvp_status_t (*check)(void *ctx, uint64_t offset, uint64_t len, const char *reservation_id);
    void *check_ctx;
    size_t max_conns;      /* 0 = 64 */
    int64_t idle_ms;       /* 0 = 30000 */
    /* Measurements only: offer UCX even where puts are emulated (a borrowed
     * slab) and let UCX use its tcp transport (kvpool keeps tcp out of UCX
     * otherwise: net/ucx.c). */
    bool ucx_force;
} kvp__ec_push_rx_params_t;

/* Starts the receiver (its thread, the TCP listener, the UCX mapping).
 * KVP_OK, KVP_ERR_INVALID_ARG, KVP_ERR_IO (bind failed, logged),
 * KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_push_rx_create(const kvp__ec_push_rx_params_t *p, kvp__ec_push_rx_t **rx_p);
/* Stops the thread, closes connections, unmaps.  NULL is a no-op. */
void kvp__ec_push_rx_destroy(kvp__ec_push_rx_t *rx);
/* The slab (the borrowed one, or the receiver's own; valid until destroy). */
uint8_t *kvp__ec_push_rx_slab(const kvp__ec_push_rx_t *rx);
/* The session string for reserve replies (valid until destroy). */
const char *kvp__ec_push_rx_session(const kvp__ec_push_rx_t *rx);
uint16_t kvp__ec_push_rx_port(const kvp__ec_push_rx_t *rx);

typedef struct kvp__ec_push_rx_stats {
    uint64_t conns_open, conns_total, conns_refused, conns_idle_closed;
    uint64_t writes, bytes, bad_headers, out_of_bounds;
} kvp__ec_push_rx_stats_t;
void kvp__ec_push_rx_stats(kvp__ec_push_rx_t *rx, kvp__ec_push_rx_stats_t *st);

typedef struct kvp__ec_push_tx kvp__ec_push_tx_t;

typedef struct kvp__ec_push_tx_params {
    unsigned paths;     /* the paths this producer may use (KVP__EC_PATH_*) */
    int64_t timeout_ms; /* per write; >= 1 */
    /* Measurements only: let UCX use its tcp transport and skip the tcp
     * rule of the peer-address check (kvp__ucx_addr_check). */
    bool ucx_force;
} kvp__ec_push_tx_params_t;

kvp_status_t kvp__ec_push_tx_create(const kvp__ec_push_tx_params_t *p, kvp__ec_push_tx_t **tx_p);
void kvp__ec_push_tx_destroy(kvp__ec_push_tx_t *tx);

/* Writes src[0..len) into the slot at dst_ptr of the consumer behind
 * session, by the best path both sides offer (UCX RMA first when this
 * process reaches it over shm or rdma, else TCP).  Blocking; thread-safe
 * (concurrent writes to one session use separate connections or
 * serialise: UCX writes go one at a time through the producer's one
 * worker).  Returns once the bytes are in the slot.  KVP_OK,
 * KVP_ERR_INVALID_ARG (a session it cannot parse, or [dst_ptr, dst_ptr +
 * len) not inside the session's slab: nothing is written), KVP_ERR_REMOTE
 * (the receiver refused the write: range, header, connection cap; logged),
 * KVP_ERR_TIMEOUT, KVP_ERR_CONN_REFUSED, KVP_ERR_CONN_LOST, KVP_ERR_IO,
 * KVP_ERR_UNSUPPORTED (no path both sides offer).
 * *path_p (may be NULL): the path used (0 when none was).  The timeout
 * bounds waits (connect, socket room, status, UCX completion); a one-sided
 * UCX put to shared memory is a copy inside ucp_put_nbx that it cannot
 * interrupt. */
kvp_status_t kvp__ec_push_tx_write(kvp__ec_push_tx_t *tx, const char *session, const char *reservation_id,
                                   uint64_t dst_ptr, const void *src, uint64_t len, unsigned *path_p);

/* Sets up what a write to session needs (the UCX endpoint, the rkey and
 * this process's page tables over a shared-memory slab) ahead of the
 * first write, so a write's time is the transfer's.  Best effort: a write
 * still sets up whatever this could not.  Once the session is set up (by
 * a prepare or a write) it returns at once, without waiting for the UCX
 * lock that a write in progress holds. */
void kvp__ec_push_tx_prepare(kvp__ec_push_tx_t *tx, const char *session);

typedef struct kvp__ec_push_tx_stats {
    uint64_t writes, bytes, failures, ucx_writes, tcp_writes;
    uint64_t write_ns; /* summed time inside writes */
    uint64_t prepares, prepares_settled; /* prepares of a UCX session; of them, found set up (no lock) */
} kvp__ec_push_tx_stats_t;
void kvp__ec_push_tx_stats(kvp__ec_push_tx_t *tx, kvp__ec_push_tx_stats_t *st);

#endif
