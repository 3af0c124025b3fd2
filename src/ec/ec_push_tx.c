/*
 * The EC push producer (ec_push.h): writes an encoder output into a
 * consumer's reserved slot, by UCX RMA or over the receiver's TCP port.
 *
 * Object life and locks.  tx->mu guards the peer map (session string ->
 * peer_t).  A peer is made on a session's first write and lives until
 * destroy (sessions are few: one per consumer shard), so a peer pointer
 * taken under tx->mu stays valid without a reference count.  peer->mu
 * guards the peer's idle TCP connections.  tx->ucx_mu guards the UCX
 * context, its one worker and every peer's endpoint and rkey: UCX writes go
 * one at a time (a put to shared memory is a memcpy inside ucp_put_nbx, so
 * concurrency would buy little on the cores it shares with the encoder).
 * Lock order: tx->mu, then peer->mu; tx->ucx_mu is never held with either.
 *
 * TCP.  A write takes an idle connection of its peer (or connects a new
 * one: concurrent writers use separate connections), sends the frame --
 * lane head, write header and the caller's bytes in one gathered sendmsg as
 * far as the socket takes them -- and waits for the status frame, all
 * within timeout_ms.  The connection goes back to the idle set only after an
 * OK status; anything else closes it.  A cached connection the receiver
 * closed meanwhile (its idle_ms) fails without a status: the write is then
 * tried once more on a fresh connection (rewriting the same bytes into the
 * same slot is harmless).
 *
 * UCX.  The first write to a session with a ucx field unpacks the worker
 * address (checked first by kvp__ucx_addr_check against this worker's own)
 * and the rkey, and keeps the endpoint.  A write is ucp_put_nbx then
 * ucp_ep_flush_nbx, both waited for until the deadline: flush returns only
 * once the bytes are in the target's memory.  A timed-out or failed
 * endpoint is never used again (its requests stay with the worker).
 * Once a session's UCX state is settled (an endpoint, or UCX off for it) a
 * prepare returns without tx->ucx_mu: the control thread that calls it
 * after each reserve never waits behind another session's write of
 * megabytes, which holds that lock until its flush.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/strmap.h"
#include "ec/ec_push.h"
#include "ec/ec_push_ucx.h"
#include "ec/ec_push_wire.h"
#include "net/lane.h"
#include "net/ucx.h"
#include "net/ucx_addr.h"

#define IDLE_MAX 8       /* idle connections kept per session */
#define PEERS_MAX 1024   /* sessions cached; beyond, writes go over TCP uncached */

typedef struct peer {
    char *key;                 /* the session string: the map's key (kvp__strdup'ed) */
    kvp__ec_session_t s;
    pthread_mutex_t mu;        /* guards idle */
    int idle[IDLE_MAX];
    size_t nidle;
    /* under tx->ucx_mu */
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    bool ucx_off;              /* unusable (check failed, error, timeout): TCP only */
    atomic_bool settled;       /* ucx_ready has run: ep set, or UCX off for this peer */
} peer_t;

struct kvp__ec_push_tx {
    kvp__ec_push_tx_params_t p;
    pthread_mutex_t mu;        /* guards peers */
    kvp__strmap_t peers;
    pthread_mutex_t ucx_mu;    /* guards ucx and every peer's ep/rkey */
    kvp__ec_ucx_t ucx;
    bool ucx_tried;
    ucp_address_t *own_addr;
    size_t own_addr_len;
    struct {
        _Atomic uint64_t writes, bytes, failures, ucx_writes, tcp_writes, write_ns, prepares, prepares_settled;
    } st;
};

#define STAT_ADD(tx, f, n) atomic_fetch_add_explicit(&(tx)->st.f, (n), memory_order_relaxed)

kvp_status_t kvp__ec_push_tx_create(const kvp__ec_push_tx_params_t *p, kvp__ec_push_tx_t **tx_p)
{
    if (!p || !tx_p || p->timeout_ms < 1 || !(p->paths & (KVP__EC_PATH_TCP | KVP__EC_PATH_UCX)))
        return KVP_ERR_INVALID_ARG;
    kvp__ec_push_tx_t *tx = kvp__calloc(1, sizeof *tx);
    if (!tx)
        return KVP_ERR_NO_MEMORY;
    tx->p = *p;
    pthread_mutex_init(&tx->mu, NULL);
    pthread_mutex_init(&tx->ucx_mu, NULL);
    kvp__strmap_init(&tx->peers);
    *tx_p = tx;
    return KVP_OK;
}

static void peer_free(kvp__ec_push_tx_t *tx, peer_t *pe)
{
    for (size_t i = 0; i < pe->nidle; i++)
        close(pe->idle[i]);
    if (pe->rkey)
        ucp_rkey_destroy(pe->rkey);
    if (pe->ep)
        (void)kvp__ucx_ep_close(tx->ucx.worker, pe->ep, 100);
    pthread_mutex_destroy(&pe->mu);
    kvp__strfree(pe->key);
    kvp__free(pe, sizeof *pe);
}

void kvp__ec_push_tx_destroy(kvp__ec_push_tx_t *tx)
{
    if (!tx)
        return;
    for (size_t i = 0; i < tx->peers.cap; i++)
        if (tx->peers.slots[i].key)
            peer_free(tx, tx->peers.slots[i].val);
    kvp__strmap_cleanup(&tx->peers);
    if (tx->own_addr)
        ucp_worker_release_address(tx->ucx.worker, tx->own_addr);
    kvp__ec_ucx_close(&tx->ucx);
    pthread_mutex_destroy(&tx->mu);
    pthread_mutex_destroy(&tx->ucx_mu);
    kvp__free(tx, sizeof *tx);
}

/* The peer of session (made on first use).  KVP_OK, KVP_ERR_INVALID_ARG
 * (unparsable), KVP_ERR_NO_MEMORY.  *temp_p: the peer is not in the map
 * (PEERS_MAX reached): the caller frees it. */
static kvp_status_t peer_get(kvp__ec_push_tx_t *tx, const char *session, peer_t **pe_p, bool *temp_p)
{
    size_t len = strnlen(session, KVP__EC_SESSION_MAX + 1);
    if (len > KVP__EC_SESSION_MAX)
        return KVP_ERR_INVALID_ARG;
    uint64_t h = kvp__strmap_hash(session, len);
    pthread_mutex_lock(&tx->mu);
    peer_t *pe = tx->peers.n ? kvp__strmap_get_h(&tx->peers, session, len, h) : NULL;
    pthread_mutex_unlock(&tx->mu);
    *temp_p = false;
    if (pe) {
        *pe_p = pe;
        return KVP_OK;
    }
    peer_t *np = kvp__calloc(1, sizeof *np);
    if (!np)
        return KVP_ERR_NO_MEMORY;
    if (kvp__ec_session_decode(session, &np->s) != KVP_OK) {
        kvp__free(np, sizeof *np);
        kvp_warn_rl("ec push tx: malformed session string '%.80s'", session);
        return KVP_ERR_INVALID_ARG;
    }
    if (!(np->key = kvp__strdup(session))) {
        kvp__free(np, sizeof *np);
        return KVP_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&np->mu, NULL);
    atomic_init(&np->settled, false);
    pthread_mutex_lock(&tx->mu);
    pe = tx->peers.n ? kvp__strmap_get_h(&tx->peers, session, len, h) : NULL; /* a racing first write */
    if (!pe && tx->peers.n < PEERS_MAX && kvp__strmap_put_h(&tx->peers, np->key, len, h, np) == KVP_OK) {
        pe = np;
        np = NULL;
    }
    pthread_mutex_unlock(&tx->mu);
    if (pe) {
        if (np)
            peer_free(tx, np);
        *pe_p = pe;
        return KVP_OK;
    }
    np->ucx_off = true; /* an uncached peer: TCP only */
    *pe_p = np;
    *temp_p = true;
    return KVP_OK;
}

/* ---- TCP ---- */

static int wait_fd(int fd, short events, uint64_t deadline, short *revents_p)
{
    for (;;) {
        uint64_t now = kvp__now_ns();
        if (now >= deadline)
            return 0;
        struct pollfd pf = {.fd = fd, .events = events};
        int ms = (int)((deadline - now + 999999) / 1000000);
        int r = poll(&pf, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0 && revents_p)
            *revents_p = pf.revents;
        return r;
    }
}

static kvp_status_t tcp_connect(const kvp__ec_session_t *s, uint64_t deadline, int *fd_p)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", s->port);
    if (getaddrinfo(s->host, ps, &hints, &ai) != 0 || !ai) {
        kvp_warn_rl("ec push tx: cannot resolve '%s'", s->host);
        return KVP_ERR_HOST_UNKNOWN;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return KVP_ERR_IO;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    kvp_status_t st = KVP_OK;
    if (rc != 0 && errno != EINPROGRESS) {
        st = KVP_ERR_CONN_REFUSED;
    } else if (rc != 0) {
        int w = wait_fd(fd, POLLOUT, deadline, NULL);
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        st = w == 0 ? KVP_ERR_TIMEOUT : (w < 0 || err) ? KVP_ERR_CONN_REFUSED : KVP_OK;
    }
    if (st != KVP_OK) {
        kvp_warn_rl("ec push tx: connect %s:%u: %s", s->host, s->port, kvp_status_str(st));
        close(fd);
        return st;
    }
    *fd_p = fd;
    return KVP_OK;
}

/* Reads the status frame (36 bytes) until deadline.  KVP_OK with the
 * receiver's *remote_p and *landed_p; KVP_ERR_TIMEOUT, KVP_ERR_CONN_LOST,
 * KVP_ERR_PROTOCOL. */
static kvp_status_t read_status(int fd, uint64_t deadline, kvp_status_t *remote_p, uint64_t *landed_p)
{
    uint8_t in[KVP_LANE_HEAD + KVP__EC_PUSH_STATUS_LEN];
    size_t got = 0;
    while (got < sizeof in) {
        ssize_t k = recv(fd, in + got, sizeof in - got, MSG_DONTWAIT);
        if (k > 0) {
            got += (size_t)k;
            continue;
        }
        if (k == 0)
            return KVP_ERR_CONN_LOST;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KVP_ERR_CONN_LOST;
        int w = wait_fd(fd, POLLIN, deadline, NULL);
        if (w == 0)
            return KVP_ERR_TIMEOUT;
        if (w < 0)
            return KVP_ERR_CONN_LOST;
    }
    uint32_t hl;
    uint64_t dl;
    if (kvp__lane_head_decode(in, &hl, &dl) != 0 || hl != KVP__EC_PUSH_STATUS_LEN ||
        kvp__ec_push_status_decode(in + KVP_LANE_HEAD, hl, dl, remote_p, landed_p) != KVP_OK)
        return KVP_ERR_PROTOCOL;
    return KVP_OK;
}

/* One write on fd.  *status_seen_p: a status frame came (the receiver
 * answered, so a retry would not help). */
static kvp_status_t tcp_write_on(int fd, const kvp__ec_session_t *s, const uint8_t *hdr, uint32_t hl,
                                 const void *src, uint64_t len, uint64_t deadline, bool *status_seen_p)
{
    ucp_dt_iov_t d = {(void *)src, (size_t)len};
    kvp__lane_tx_t t;
    kvp__lane_tx_init(&t, hdr, hl, &d, len ? 1 : 0);
    kvp_status_t st = KVP_OK;
    for (;;) {
        int w = kvp__lane_tx_write(&t, fd);
        if (w == 1)
            break;
        short rev = 0;
        int r = w < 0 ? 1 : wait_fd(fd, POLLOUT | POLLIN, deadline, &rev);
        if (r == 0)
            return KVP_ERR_TIMEOUT;
        if (w < 0 || r < 0 || (rev & (POLLIN | POLLERR | POLLHUP))) {
            /* the receiver answered early (a refusal) or closed: its status,
             * if it sent one, says why */
            st = KVP_ERR_CONN_LOST;
            break;
        }
    }
    kvp_status_t remote = KVP_OK;
    uint64_t landed = 0;
    kvp_status_t rs = read_status(fd, st == KVP_OK ? deadline : kvp__now_ns() + 100000000ull, &remote, &landed);
    if (rs != KVP_OK)
        return st != KVP_OK ? st : rs == KVP_ERR_PROTOCOL ? KVP_ERR_IO : rs;
    *status_seen_p = true;
    if (remote != KVP_OK) {
        kvp_warn_rl("ec push tx: %s:%u refused a write of %llu bytes: %s", s->host, s->port,
                    (unsigned long long)len, kvp_status_str(remote));
        return KVP_ERR_REMOTE;
    }
    if (st != KVP_OK || landed != len)
        return KVP_ERR_IO; /* an OK status before all was sent, or a wrong count: not our receiver */
    return KVP_OK;
}

/* A connection for pe: an idle one still open (*reused_p), else a new one. */
static kvp_status_t tcp_take(peer_t *pe, uint64_t deadline, int *fd_p, bool *reused_p)
{
    for (;;) {
        pthread_mutex_lock(&pe->mu);
        int fd = pe->nidle ? pe->idle[--pe->nidle] : -1;
        pthread_mutex_unlock(&pe->mu);
        if (fd < 0)
            break;
        char c;
        ssize_t k = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            *fd_p = fd;
            *reused_p = true;
            return KVP_OK;
        }
        close(fd); /* closed by the receiver (or it sent what it should not) */
    }
    *reused_p = false;
    return tcp_connect(&pe->s, deadline, fd_p);
}

static void tcp_give_back(peer_t *pe, int fd, bool temp)
{
    if (!temp) {
        pthread_mutex_lock(&pe->mu);
        if (pe->nidle < IDLE_MAX) {
            pe->idle[pe->nidle++] = fd;
            fd = -1;
        }
        pthread_mutex_unlock(&pe->mu);
    }
    if (fd >= 0)
        close(fd);
}

static kvp_status_t tcp_write(peer_t *pe, bool temp, const char *rid, uint64_t offset, const void *src,
                              uint64_t len, uint64_t deadline)
{
    uint8_t hdr[KVP__EC_PUSH_WRITE_MAX];
    size_t hl = kvp__ec_push_write_encode(hdr, offset, len, rid);
    if (hl == 0)
        return KVP_ERR_INVALID_ARG;
    for (int attempt = 0;; attempt++) {
        int fd;
        bool reused;
        kvp_status_t st = tcp_take(pe, deadline, &fd, &reused);
        if (st != KVP_OK)
            return st;
        bool seen = false;
        st = tcp_write_on(fd, &pe->s, hdr, (uint32_t)hl, src, len, deadline, &seen);
        if (st == KVP_OK) {
            tcp_give_back(pe, fd, temp);
            return KVP_OK;
        }
        close(fd);
        if (!(reused && !seen && st == KVP_ERR_CONN_LOST && attempt == 0))
            return st;
    }
}

/* ---- UCX ---- */

/* Under ucx_mu: the context (opened on first use) and pe's endpoint and
 * rkey.  false: UCX is not usable for pe (TCP then).  Either answer is
 * final for pe, so pe is settled after it. */
static bool ucx_setup(kvp__ec_push_tx_t *tx, peer_t *pe)
{
    if (!tx->ucx_tried) {
        tx->ucx_tried = true;
        if (kvp__ec_ucx_open("ec push tx", tx->p.ucx_force, &tx->ucx) == KVP_OK &&
            ucp_worker_get_address(tx->ucx.worker, &tx->own_addr, &tx->own_addr_len) != UCS_OK) {
            tx->own_addr = NULL;
            kvp__ec_ucx_close(&tx->ucx);
        }
    }
    if (!tx->ucx.ctx || pe->ucx_off || !(tx->ucx.shm || tx->ucx.rdma || tx->p.ucx_force))
        return false;
    if (pe->ep)
        return true;
    const char *why = NULL;
    if (!tx->p.ucx_force &&
        kvp__ucx_addr_check(pe->s.ucx_addr, pe->s.ucx_addr_len, tx->own_addr, tx->own_addr_len, &why) != KVP_OK) {
        kvp_warn_rl("ec push tx: session's UCX address refused (%s): using TCP", why ? why : "?");
        pe->ucx_off = true;
        return false;
    }
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = (const ucp_address_t *)pe->s.ucx_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
    };
    ucs_status_t us = ucp_ep_create(tx->ucx.worker, &ep, &pe->ep);
    if (us == UCS_OK && (us = ucp_ep_rkey_unpack(pe->ep, pe->s.rkey, &pe->rkey)) != UCS_OK) {
        (void)kvp__ucx_ep_close(tx->ucx.worker, pe->ep, 0);
        pe->rkey = NULL;
    }
    if (us == UCS_OK) {
        /* Where the slab is mapped into this process (shared memory), map
         * its page tables now, once per session, instead of one fault per
         * page inside the first write to each slot. */
        void *local = NULL;
        if (ucp_rkey_ptr(pe->rkey, pe->s.base, &local) == UCS_OK && local) {
            uintptr_t a = (uintptr_t)local & ~(uintptr_t)4095;
            (void)madvise((void *)a, pe->s.size + ((uintptr_t)local - a), MADV_POPULATE_WRITE);
        }
    }
    if (us != UCS_OK) {
        kvp_warn_rl("ec push tx: UCX endpoint to the session: %s: using TCP", ucs_status_string(us));
        pe->ep = NULL;
        pe->ucx_off = true;
        return false;
    }
    return true;
}

static bool ucx_ready(kvp__ec_push_tx_t *tx, peer_t *pe)
{
    bool ok = ucx_setup(tx, pe);
    atomic_store(&pe->settled, true);
    return ok;
}

/* KVP_ERR_UNSUPPORTED: UCX not usable for pe (nothing was written). */
static kvp_status_t ucx_write(kvp__ec_push_tx_t *tx, peer_t *pe, uint64_t dst_ptr, const void *src, uint64_t len,
                              uint64_t deadline)
{
    pthread_mutex_lock(&tx->ucx_mu);
    if (!ucx_ready(tx, pe)) {
        pthread_mutex_unlock(&tx->ucx_mu);
        return KVP_ERR_UNSUPPORTED;
    }
    ucp_request_param_t prm = {.op_attr_mask = 0};
    kvp_status_t st = kvp__ec_ucx_wait(tx->ucx.worker, ucp_put_nbx(pe->ep, src, (size_t)len, dst_ptr, pe->rkey, &prm),
                                       deadline);
    if (st == KVP_OK)
        st = kvp__ec_ucx_wait(tx->ucx.worker, ucp_ep_flush_nbx(pe->ep, &prm), deadline);
    if (st != KVP_OK) {
        /* the endpoint may hold an unfinished request: never again */
        kvp_warn_rl("ec push tx: UCX put of %llu bytes: %s; the session uses TCP from now on",
                    (unsigned long long)len, kvp_status_str(st));
        pe->ucx_off = true;
        if (st == KVP_ERR_UNSUPPORTED)
            st = KVP_ERR_IO;
    }
    pthread_mutex_unlock(&tx->ucx_mu);
    return st;
}

void kvp__ec_push_tx_prepare(kvp__ec_push_tx_t *tx, const char *session)
{
    peer_t *pe;
    bool temp;
    if (!tx || !session || !session[0] || peer_get(tx, session, &pe, &temp) != KVP_OK)
        return;
    if ((tx->p.paths & KVP__EC_PATH_UCX) && pe->s.ucx_addr_len) {
        STAT_ADD(tx, prepares, 1);
        if (atomic_load(&pe->settled)) {
            STAT_ADD(tx, prepares_settled, 1);
        } else {
            pthread_mutex_lock(&tx->ucx_mu);
            (void)ucx_ready(tx, pe);
            pthread_mutex_unlock(&tx->ucx_mu);
        }
    }
    if (temp)
        peer_free(tx, pe);
}

kvp_status_t kvp__ec_push_tx_write(kvp__ec_push_tx_t *tx, const char *session, const char *reservation_id,
                                   uint64_t dst_ptr, const void *src, uint64_t len, unsigned *path_p)
{
    if (path_p)
        *path_p = 0;
    if (!tx || !session || (!src && len))
        return KVP_ERR_INVALID_ARG;
    uint64_t t0 = kvp__now_ns(), deadline = t0 + (uint64_t)tx->p.timeout_ms * 1000000ull;
    peer_t *pe;
    bool temp;
    kvp_status_t st = peer_get(tx, session, &pe, &temp);
    if (st != KVP_OK)
        goto out;
    uint64_t offset;
    if ((st = kvp__ec_session_range(&pe->s, dst_ptr, len, &offset)) != KVP_OK) {
        kvp_warn_rl("ec push tx: dst_ptr 0x%llx + %llu bytes lies outside the session's slab [0x%llx, +%llu)",
                    (unsigned long long)dst_ptr, (unsigned long long)len, (unsigned long long)pe->s.base,
                    (unsigned long long)pe->s.size);
        goto out_peer;
    }
    st = KVP_ERR_UNSUPPORTED;
    if ((tx->p.paths & KVP__EC_PATH_UCX) && pe->s.ucx_addr_len && len) {
        st = ucx_write(tx, pe, dst_ptr, src, len, deadline);
        if (st != KVP_ERR_UNSUPPORTED && path_p)
            *path_p = KVP__EC_PATH_UCX;
        if (st == KVP_OK)
            STAT_ADD(tx, ucx_writes, 1);
    }
    if (st == KVP_ERR_UNSUPPORTED) {
        if (!(tx->p.paths & KVP__EC_PATH_TCP) || !pe->s.port) {
            kvp_warn_rl("ec push tx: no path to the session both sides offer");
            st = KVP_ERR_UNSUPPORTED;
            goto out_peer;
        }
        if (path_p)
            *path_p = KVP__EC_PATH_TCP;
        st = tcp_write(pe, temp, reservation_id ? reservation_id : "", offset, src, len, deadline);
        if (st == KVP_OK)
            STAT_ADD(tx, tcp_writes, 1);
    }
out_peer:
    if (temp)
        peer_free(tx, pe);
out:
    STAT_ADD(tx, write_ns, kvp__now_ns() - t0);
    if (st == KVP_OK) {
        STAT_ADD(tx, writes, 1);
        STAT_ADD(tx, bytes, len);
    } else {
        STAT_ADD(tx, failures, 1);
    }
    return st;
}

void kvp__ec_push_tx_stats(kvp__ec_push_tx_t *tx, kvp__ec_push_tx_stats_t *st)
{
    st->writes = atomic_load(&tx->st.writes);
    st->bytes = atomic_load(&tx->st.bytes);
    st->failures = atomic_load(&tx->st.failures);
    st->ucx_writes = atomic_load(&tx->st.ucx_writes);
    st->tcp_writes = atomic_load(&tx->st.tcp_writes);
    st->write_ns = atomic_load(&tx->st.write_ns);
    st->prepares = atomic_load(&tx->st.prepares);
    st->prepares_settled = atomic_load(&tx->st.prepares_settled);
}
