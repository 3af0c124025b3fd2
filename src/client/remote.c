/*
 * kvpool://HOST:PORT — the pool on a kvpool server, over UCX active messages
 * or kvpool's own TCP transport (net/lane.h).
 *
 * Options: timeout (default call timeout, e.g. 5s), token_file (the shared
 * secret's file; or env KVPOOL_TOKEN), transport (auto, ucx, tcp),
 * local_reads (auto, off).
 *
 * Local reads (client/local_read.h).  Over UCX to a server on this host
 * whose arena this process can map, a get of at least LOCAL_MIN bytes of
 * capacity goes as GET_LOCAL: the reply names each value's offset in the
 * arena, the values are copied out of the mapping (streaming stores), then
 * a RELEASE ends the server's leases.  The copy holds the
 * connection like a sender does, so its socket (whose close would end the
 * leases) stays open until the copy is done.
 *
 * TCP transport.  Requests are written whole, one thread at a time (tx_mu),
 * a put's values straight from the caller's buffers; replies are read by
 * whoever holds rx_mu (a driving caller, else the progress thread), a get's
 * values straight into the caller's buffers.  The socket closes only with
 * both locks held, so no write or read is ever on a closed (or reused)
 * descriptor, and an op fails only after its bytes stopped moving.
 *
 * Threads.  One UCX worker in multi-thread mode (on the process's one client
 * context, net/ucx.h, shared by every handle).  Callers' threads encode and
 * post requests themselves; a progress thread sleeps on the worker's event fd
 * and runs every callback (replies, send and receive completions), checks
 * deadlines and tears broken connections down.  The client's own mutex is
 * never held across a UCX call (UCX callbacks take it, so holding it around
 * one would invert the lock order).
 *
 * An op completes when both its request send has completed (UCX no longer
 * reads the caller's buffers) and its reply has been fully received (get
 * values are in the caller's buffers), then its callback fires, once.
 *
 * Failures.  When the endpoint fails (server gone) or an op's deadline passes,
 * the connection is torn down with a forced close, which completes every
 * outstanding UCX request; every op of that connection then completes with
 * KVP_ERR_CONN_LOST (KVP_ERR_TIMEOUT for those past their deadline).  The
 * next op reconnects, no sooner than an exponential backoff (100 ms .. 5 s)
 * after the last failed attempt; ops in the backoff window fail at once with
 * KVP_ERR_CONN_LOST.  An op's own timeout_ms (when shorter than the call
 * timeout) bounds the connect it needs, its wait for another thread's
 * connect included, and then, from its post, its request.
 *
 * A request's life and the connection's are state machines (remote_req.c,
 * remote_conn.c); remote_int.h lists the files and gives the lock order.
 */
#include "client/remote_int.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "client/backend.h"
#include "common/alloc.h"
#include "common/token.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"
#include "store/store.h"

/* ---- posting requests (caller threads) ---- */

static uint64_t new_id(remote_t *r) { return atomic_fetch_add(&r->next_id, 1) + 1; }

/* Registers p (header already encoded in p->w with p->req_id) and posts it.
 * Returns KVP_INPROGRESS (p now belongs to the table), or an error if
 * nothing was sent (p not registered; the caller still owns it). */
static kvp_status_t post(remote_t *r, pending_t *p, const void *data, size_t count, int iov)
{
    cbarg_t *a = kvp__remote_cb_arg(r, p->req_id);
    if (!a)
        return KVP_ERR_NO_MEMORY;
    pthread_mutex_lock(&r->mu);
    if (!kvp__remote_do_ready(r)) {
        kvp__remote_do_cb_put(r, a);
        pthread_mutex_unlock(&r->mu);
        return KVP_ERR_CONN_LOST;
    }
    ucp_ep_h ep = r->ep;
    int fd = r->tcp_fd, lane = atomic_load(&r->lane), gen = r->gen;
    if (p->wop == KVP_WOP_GET_LOCAL) {
        if (!r->lmap || r->lmap_gen != gen) { /* reconnected meanwhile, to another arena */
            kvp__remote_do_cb_put(r, a);
            pthread_mutex_unlock(&r->mu);
            return KVP_ERR_CONN_LOST;
        }
        p->lmap = r->lmap;
        kvp__lmap_ref(p->lmap);
        r->local_inflight++;
    }
    p->gen = gen;
    if (r->nrel && kvp__wire_req_add_released(&p->w, r->rel, r->nrel) == 0)
        r->nrel = 0; /* (no memory: they wait for the next request or the flush) */
    uint32_t to = p->op && p->op->timeout_ms ? p->op->timeout_ms : r->timeout_ms;
    p->deadline_ns = kvp__now_ns() + (uint64_t)to * 1000000ull;
    kvp__remote_do_add(r, p);
    r->senders++; /* the endpoint and socket stay open until do_sent() */
    pthread_mutex_unlock(&r->mu);
    if (lane) {
        pthread_mutex_lock(&r->mu);
        kvp__remote_do_cb_put(r, a);
        pthread_mutex_unlock(&r->mu);
        kvp__remote_lane_post(r, p, fd, data, count, iov);
        return KVP_INPROGRESS;
    }
    int caller_drives = p->caller_drives; /* (p may be finished and freed once sent) */
    /* The server answers on each request's reply endpoint (it never makes
     * an endpoint from a client's address). */
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
        .cb.send = kvp__remote_on_send_done,
        .user_data = a,
        .flags = UCP_AM_SEND_FLAG_REPLY,
    };
    const void *hdr = p->w.buf;
    size_t hlen = p->w.len;
    if (hlen > KVP_AM_HDR_MAX) {
        /* Too long for an AM header: send it as the data (never a put). */
        kvp__wire_req_encode(&p->w2, KVP_WOP_IN_DATA, p->req_id, 0, r->conn_key, NULL, 0, NULL);
        hdr = p->w2.buf;
        hlen = p->w2.len;
        data = p->w.buf;
        count = p->w.len;
        iov = 0;
    }
    if (iov) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype = ucp_dt_make_iov();
    }
    if (p->wop == KVP_WOP_PUT && p->payload_bytes >= KVP_RNDV_MIN)
        prm.flags |= UCP_AM_SEND_FLAG_RNDV;
    /* ep is open (senders) and its worker stays (wlock) until this is done */
    int wl = kvp__remote_wlock_rd(&r->wlock);
    ucs_status_ptr_t sp = ucp_am_send_nbx(ep, KVP_AM_REQUEST, hdr, hlen, data, count, &prm);
    kvp__remote_wunlock(&r->wlock, wl);
    pthread_mutex_lock(&r->mu);
    kvp__remote_do_sent(r, gen);
    pthread_mutex_unlock(&r->mu);
    if (sp == NULL || UCS_PTR_IS_ERR(sp))
        kvp__remote_on_send_done(NULL, sp ? UCS_PTR_STATUS(sp) : UCS_OK, a);
    /* The progress thread makes progress on it, unless its caller is about
     * to: waking that thread would then only take a core from the server
     * on a small host. */
    if (!caller_drives)
        kvp__remote_wake(r);
    return KVP_INPROGRESS;
}

/* Runs an internal op (hello, stats, proof) to completion on the caller's
 * thread; frees p, unless keep_p (then *keep_p = p, to be freed by the
 * caller). */
static kvp_status_t run_internal(remote_t *r, pending_t *p, pending_t **keep_p)
{
    kvp_status_t st = post(r, p, NULL, 0, 0);
    if (st != KVP_INPROGRESS) {
        kvp__remote_pending_free(p);
        return st;
    }
    pthread_mutex_lock(&r->mu);
    while (p->state != PEND_DONE)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    st = p->status;
    if (keep_p)
        *keep_p = p;
    else
        kvp__remote_pending_free(p);
    return st;
}

/* Runs an internal request (no keys but `proof`) on the caller's thread. */
kvp_status_t kvp__remote_run_request(remote_t *r, uint32_t wop, uint64_t key, const kvp_key_t *proof,
                                     pending_t **keep_p)
{
    pending_t *p = kvp__remote_pending_new(wop, NULL);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    p->req_id = new_id(r);
    kvp__wire_req_encode(&p->w, wop, p->req_id, r->timeout_ms, key, proof, proof ? 1 : 0, NULL);
    if (p->w.err) {
        kvp__remote_pending_free(p);
        return KVP_ERR_NO_MEMORY;
    }
    return run_internal(r, p, keep_p);
}

/* ---- the backend ---- */

static uint32_t wire_op(kvp_op_type_t t)
{
    switch (t) {
    case KVP_OP_EXISTS: return KVP_WOP_EXISTS;
    case KVP_OP_PREFIX: return KVP_WOP_PREFIX;
    case KVP_OP_PUT: return KVP_WOP_PUT;
    case KVP_OP_GET: return KVP_WOP_GET;
    case KVP_OP_REMOVE: return KVP_WOP_REMOVE;
    case KVP_OP_PIN: return KVP_WOP_PIN;
    case KVP_OP_UNPIN: return KVP_WOP_UNPIN;
    case KVP_OP_REMOVE_ALL: return KVP_WOP_REMOVE_ALL;
    }
    return 0;
}

static uint64_t sgl_len(const kvp_sgl_t *v)
{
    uint64_t t = 0;
    for (uint32_t j = 0; j < v->iovcnt; j++)
        t += v->iov[j].len;
    return t;
}

/* Builds and posts the request for keys [off, off+cnt) of the op. */
kvp_status_t kvp__remote_post_slice(remote_t *r, opctx_t *oc, uint32_t wop, uint32_t off, uint32_t cnt,
                                    int will_drive, int local_ok)
{
    kvp_op_t *op = oc->op;
    if (wop == KVP_WOP_GET && r->local_reads && local_ok) {
        uint64_t cap = 0;
        for (uint32_t i = 0; i < cnt; i++)
            cap += sgl_len(&op->values[off + i]);
        pthread_mutex_lock(&r->mu);
        if (cap >= LOCAL_MIN && r->lmap && r->lmap_gen == r->gen && kvp__remote_do_ready(r) &&
            r->local_inflight < LOCAL_INFLIGHT_MAX)
            wop = KVP_WOP_GET_LOCAL;
        pthread_mutex_unlock(&r->mu);
    }
    /* (a slice is at most KVP_SLICE_KEYS keys: slice_len; its value sizes
     * live on the stack while the request is encoded) */
    if (cnt > KVP_SLICE_KEYS)
        return KVP_ERR_INVALID_ARG;
    uint64_t sizes_buf[KVP_SLICE_KEYS], *sizes = NULL;
    pending_t *p = kvp__remote_pending_new(wop, oc);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    p->off = off;
    p->cnt = cnt;
    p->caller_drives = will_drive;
    p->req_id = new_id(r);
    const void *data = NULL;
    size_t count = 0;
    int iov = 0;
    if (wop == KVP_WOP_PUT || wop == KVP_WOP_GET || wop == KVP_WOP_GET_LOCAL) {
        sizes = sizes_buf;
        uint32_t nv = 0;
        for (uint32_t i = 0; i < cnt; i++) {
            const kvp_sgl_t *v = &op->values[off + i];
            sizes[i] = sgl_len(v);
            for (uint32_t j = 0; j < v->iovcnt; j++)
                nv += v->iov[j].len != 0;
        }
        if (wop == KVP_WOP_PUT) {
            p->iov = kvp__calloc(nv ? nv : 1, sizeof *p->iov);
            if (!p->iov)
                goto nomem;
            p->niov = nv ? nv : 1;
            uint32_t k = 0;
            for (uint32_t i = 0; i < cnt; i++) {
                const kvp_sgl_t *v = &op->values[off + i];
                op->results[off + i].size = sizes[i];
                p->payload_bytes += sizes[i];
                for (uint32_t j = 0; j < v->iovcnt; j++)
                    if (v->iov[j].len) {
                        p->iov[k].buffer = v->iov[j].base;
                        p->iov[k].length = v->iov[j].len;
                        k++;
                    }
            }
            if (k == 1) {
                data = p->iov[0].buffer;
                count = p->iov[0].length;
            } else {
                data = p->iov;
                count = k;
                iov = 1;
            }
        }
    }
    kvp__wire_req_encode(&p->w, wop, p->req_id, op->timeout_ms ? op->timeout_ms : r->timeout_ms,
                         r->conn_key, op->keys ? op->keys + off : NULL, cnt, sizes);
    if (p->w.err)
        goto nomem;
    kvp_status_t st = post(r, p, data, count, iov);
    if (st != KVP_INPROGRESS)
        kvp__remote_pending_free(p);
    return st;
nomem:
    kvp__remote_pending_free(p);
    return KVP_ERR_NO_MEMORY;
}

/* Keys in the request starting at `off`. */
static uint32_t slice_len(const kvp_op_t *op, uint32_t off)
{
    uint32_t left = (uint32_t)op->n - off;
    uint32_t n = left < KVP_SLICE_KEYS ? left : KVP_SLICE_KEYS;
    if (op->type != KVP_OP_PUT)
        return n;
    size_t bytes = 64;
    for (uint32_t i = 0; i < n; i++) {
        bytes += op->keys[off + i].len + 16u;
        if (i && bytes > KVP_AM_HDR_MAX)
            return i;
    }
    return n;
}

/* The server's membership filter (docs/transport.md §10), where this
 * connection mapped it: an EXISTS whose keys it calls absent, every one, or
 * a PREFIX whose first key it calls absent, ends here, without a round
 * trip (present all 0, or prefix 0): returns 1.  Only the first key of a
 * PREFIX is looked at, and an EXISTS stops at its first maybe-present key,
 * so a lookup that goes to the server pays for one probe, about.  (Not a
 * GET: the server counts its misses.)  Under mu, which keeps the mapping. */
static int filter_answers(remote_t *r, kvp_op_t *op, uint32_t n)
{
    if (op->type != KVP_OP_EXISTS && op->type != KVP_OP_PREFIX)
        return 0;
    pthread_mutex_lock(&r->mu);
    const kvp__cfilter_t *f =
        r->lmap && r->lmap_gen == r->gen && kvp__remote_do_ready(r) ? kvp__lmap_filter(r->lmap) : NULL;
    uint32_t i = 0, upto = op->type == KVP_OP_PREFIX ? 1 : n;
    while (f && i < upto && !kvp__cfilter_maybe(f, kvp__key_hash(op->keys[i].data, op->keys[i].len)))
        i++;
    pthread_mutex_unlock(&r->mu);
    if (!f || i < upto)
        return 0;
    if (op->type == KVP_OP_PREFIX)
        *op->prefix_len = 0;
    else
        memset(op->present, 0, n);
    return 1;
}

static int remote_probe(void *impl, kvp_op_t *op)
{
    uint32_t n = (uint32_t)op->n;
    return n && filter_answers(impl, op, n);
}

static kvp_status_t remote_submit(void *impl, kvp_op_t *op, int will_drive)
{
    remote_t *r = impl;
    kvp_status_t st = kvp__remote_ensure_connected(r, op->timeout_ms);
    if (st != KVP_OK)
        return st;
    uint32_t wop = wire_op(op->type);
    uint32_t n = (uint32_t)op->n;
    if (op->type == KVP_OP_PREFIX && n == 0) {
        *op->prefix_len = 0;
        return KVP_OK;
    }
    if (n == 0 && op->type != KVP_OP_REMOVE_ALL)
        return KVP_OK;
    if (n && filter_answers(r, op, n))
        return KVP_OK;
    opctx_t *oc = kvp__calloc(1, sizeof *oc);
    if (!oc)
        return KVP_ERR_NO_MEMORY;
    oc->op = op;
    oc->prefix = n;
    uint32_t nslices = 1;
    if (n) {
        nslices = 0;
        for (uint32_t off = 0; off < n; off += slice_len(op, off))
            nslices++;
    }
    oc->left = nslices;
    uint32_t off = 0, posted = 0;
    for (uint32_t i = 0; i < nslices; i++) {
        uint32_t cnt = n ? slice_len(op, off) : 0;
        st = kvp__remote_post_slice(r, oc, wop, off, cnt, will_drive, 1);
        if (st != KVP_INPROGRESS)
            break;
        posted++;
        off += cnt;
    }
    if (posted == nslices)
        return KVP_INPROGRESS;
    /* Some slices were not sent: they count as finished with this error. */
    pthread_mutex_lock(&r->mu);
    if (oc->status == KVP_OK)
        oc->status = st;
    for (uint32_t k = off; k < n && op->results; k++)
        op->results[k].status = st;
    oc->left -= nslices - posted;
    int last = oc->left == 0;
    pthread_mutex_unlock(&r->mu);
    if (posted == 0) {
        kvp__free(oc, sizeof *oc);
        return st; /* nothing in flight: fail now, no callback */
    }
    if (last)
        kvp__remote_fire(oc);
    return KVP_INPROGRESS;
}

static kvp_status_t remote_stats(void *impl, kvp_pool_stats_t *stp)
{
    remote_t *r = impl;
    kvp_status_t st = kvp__remote_ensure_connected(r, 0);
    if (st != KVP_OK)
        return st;
    pending_t *p = kvp__remote_pending_new(KVP_WOP_STATS, NULL);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    memset(stp, 0, sizeof *stp);
    p->stats_out = stp;
    p->req_id = new_id(r);
    kvp__wire_req_encode(&p->w, KVP_WOP_STATS, p->req_id, r->timeout_ms, r->conn_key, NULL, 0, NULL);
    return run_internal(r, p, NULL); /* fills *stp from the reply */
}

static uint64_t remote_max_value(void *impl)
{
    remote_t *r = impl;
    return r->max_value ? r->max_value : KVP_VALUE_MAX;
}

static void remote_close(void *impl)
{
    remote_t *r = impl;
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    /* A healthy connection closes by flushing, so the last messages owed to
     * the server (rendezvous acknowledgements) still go out. */
    if (kvp__remote_do_ready(r))
        kvp__remote_do_retire(r, 1);
    (void)kvp__remote_do_set_cstate(r, RCONN_CLOSED);
    pthread_mutex_unlock(&r->mu);
    kvp__remote_wake(r);
    pthread_join(r->thr, NULL);
    while (r->regs) {
        reg_t *g = r->regs;
        r->regs = g->next;
        ucp_mem_unmap(r->ctx, g->memh);
        kvp__free(g, sizeof *g);
    }
    kvp__ucx_client_close(r->ctx, r->worker);
    while (r->cb_all) { /* UCX calls back no more */
        cbarg_t *a = r->cb_all;
        r->cb_all = a->next_all;
        kvp__free(a, sizeof *a);
    }
    close(r->wake_fd);
    close(r->epfd);
    pthread_mutex_destroy(&r->mu);
    pthread_mutex_destroy(&r->conn_mu);
    pthread_mutex_destroy(&r->tx_mu);
    pthread_mutex_destroy(&r->rx_mu);
    pthread_rwlock_destroy(&r->wlock);
    pthread_cond_destroy(&r->cv);
    kvp__lane_rx_free(&r->rx);
    kvp__free(r->rx_sink, LANE_SINK);
    kvp__lmap_put(r->lmap);
    if (r->token)
        kvp__free(r->token, strlen(r->token) + 1);
    kvp__free(r, sizeof *r);
}

/* The token_file option: its first line, 1..256 bytes (common/token.h). */
static char *read_token_file(const char *path)
{
    char buf[KVP__TOKEN_MAX + 1];
    size_t len;
    kvp_status_t st = kvp__token_file_read(path, buf, sizeof buf, &len);
    if (st != KVP_OK) {
        kvp_error("remote: token file %s: %s", path,
                  st == KVP_ERR_IO ? "cannot be read" : "its first line must be a token of 1..256 bytes");
        return NULL;
    }
    return kvp__strdup(buf);
}

/* transport=auto: kvpool's TCP transport where UCX could only reach the
 * server over tcp anyway (no RDMA transport here, and shared memory either
 * unavailable or useless because the server is on another host). */
static int lane_by_default(remote_t *r, int shm, int rdma)
{
    if (rdma)
        return 0;
    return !shm || !kvp__ucx_host_is_local(r->host);
}

/* A first connect's failure that says the server is not there (rather
 * than there and refusing us): what connect=lazy tolerates. */
static int unreachable(kvp_status_t st)
{
    return st == KVP_ERR_CONN_REFUSED || st == KVP_ERR_CONN_LOST || st == KVP_ERR_TIMEOUT || st == KVP_ERR_IO;
}

kvp_status_t kvp__remote_open(const char *host, uint16_t port, const kvp__remote_opts_t *o, void **impl_p)
{
    size_t hlen = strlen(host);
    if (hlen == 0 || hlen >= sizeof ((remote_t *)0)->host || port == 0 || o->timeout_ms == 0)
        return KVP_ERR_INVALID_ARG;
    remote_t *r = kvp__calloc(1, sizeof *r);
    if (!r)
        return KVP_ERR_NO_MEMORY;
    if (o->token && !(r->token = kvp__strdup(o->token))) {
        kvp__free(r, sizeof *r);
        return KVP_ERR_NO_MEMORY;
    }
    memcpy(r->host, host, hlen);
    r->port = port;
    r->timeout_ms = o->timeout_ms;
    r->tcp_fd = -1;
    r->cstate = RCONN_IDLE;
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->conn_mu, NULL);
    pthread_mutex_init(&r->tx_mu, NULL);
    pthread_mutex_init(&r->rx_mu, NULL);
    pthread_rwlockattr_t wa;
    pthread_rwlockattr_init(&wa);
    pthread_rwlockattr_setkind_np(&wa, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r->wlock, &wa);
    pthread_rwlockattr_destroy(&wa);
    pthread_cond_init(&r->cv, NULL);
    r->transport = o->transport;
    r->local_reads = o->local_reads;
    r->lmap_gen = -1;
    r->rx_gen = -1;
    r->rx_sink = kvp__malloc(LANE_SINK);
    int rx_ok = r->rx_sink && kvp__lane_rx_init(&r->rx, LANE_RX_START, r->rx_sink, LANE_SINK) == 0;
    r->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    r->epfd = epoll_create1(EPOLL_CLOEXEC);
    kvp_status_t st = rx_ok ? kvp__ucx_client_open(&r->ctx, &r->worker) : KVP_ERR_NO_MEMORY;
    if (st != KVP_OK)
        goto err;
    int shm, rdma;
    kvp__ucx_kinds(r->ctx, &shm, &rdma);
    r->use_lane = o->transport == KVP_REMOTE_TCP ||
                  (o->transport == KVP_REMOTE_AUTO && lane_by_default(r, shm, rdma));
    /* Local reads are shared memory: not where UCX was told to keep off it
     * (UCX_TLS=tcp means the bytes should cross TCP). */
    r->local_reads = r->local_reads && shm;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r->wake_fd};
    epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->wake_fd, &ev);
    if (kvp__remote_worker_setup(r) != KVP_OK) {
        st = KVP_ERR_IO;
        goto err_ucx;
    }
    if (pthread_create(&r->thr, NULL, kvp__remote_progress_main, r) != 0) {
        st = KVP_ERR_NO_MEMORY;
        goto err_ucx;
    }
    /* Connect now so a bad address or token fails open, not the first op
     * (with lazy_connect: unless the server is just not there yet). */
    st = kvp__remote_ensure_connected(r, 0);
    if (st != KVP_OK && o->lazy_connect && unreachable(st)) {
        kvp_warn("remote: %s:%u cannot be reached (%s); connect=lazy: its ops fail until it can, retried with "
                 "backoff",
                 r->host, (unsigned)r->port, kvp_status_str(st));
        st = KVP_OK;
    }
    if (st != KVP_OK) {
        remote_close(r);
        return st;
    }
    *impl_p = r;
    return KVP_OK;
err_ucx:
    kvp__ucx_client_close(r->ctx, r->worker);
err:
    close(r->wake_fd);
    close(r->epfd);
    kvp__lane_rx_free(&r->rx);
    kvp__free(r->rx_sink, LANE_SINK);
    if (r->token)
        kvp__free(r->token, strlen(r->token) + 1);
    kvp__free(r, sizeof *r);
    return st;
}

static kvp_status_t remote_open(kvp__uri_t *u, void **impl_p)
{
    const char *auth = u->authority;
    const char *colon = strrchr(auth, ':');
    char *end;
    long port = colon ? strtol(colon + 1, &end, 10) : -1;
    if (!colon || colon == auth || (size_t)(colon - auth) >= 256 || *end || port < 1 || port > 65535 || u->path[0]) {
        kvp_error("remote: URI must be kvpool://HOST:PORT (got authority '%s')", auth);
        return KVP_ERR_BAD_URI;
    }
    uint64_t timeout_ns = 5ull * 1000000000ull;
    const char *v = kvp__uri_opt(u, "timeout");
    if (v && (kvp__parse_duration_ns(v, &timeout_ns) != KVP_OK || timeout_ns < 1000000ull)) {
        kvp_error("remote: timeout=%s is not a duration of at least 1ms", v);
        return KVP_ERR_BAD_OPTION;
    }
    kvp__remote_opts_t o = {.timeout_ms = (uint32_t)(timeout_ns / 1000000ull),
                            .transport = KVP_REMOTE_AUTO,
                            .local_reads = 1};
    if ((v = kvp__uri_opt(u, "transport"))) {
        if (!strcmp(v, "ucx"))
            o.transport = KVP_REMOTE_UCX;
        else if (!strcmp(v, "tcp"))
            o.transport = KVP_REMOTE_TCP;
        else if (strcmp(v, "auto") != 0) {
            kvp_error("remote: transport=%s: expected auto, ucx or tcp", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    if ((v = kvp__uri_opt(u, "local_reads"))) {
        if (!strcmp(v, "off"))
            o.local_reads = 0;
        else if (strcmp(v, "auto") != 0) {
            kvp_error("remote: local_reads=%s: expected auto or off", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    if ((v = kvp__uri_opt(u, "connect"))) {
        if (!strcmp(v, "lazy"))
            o.lazy_connect = 1;
        else if (strcmp(v, "now") != 0) {
            kvp_error("remote: connect=%s: expected now or lazy", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    char *token = NULL;
    if ((v = kvp__uri_opt(u, "token_file"))) {
        if (!(token = read_token_file(v)))
            return KVP_ERR_BAD_OPTION;
    }
    o.token = token ? token : getenv("KVPOOL_TOKEN");
    kvp_status_t st = kvp__uri_check_unused(u);
    if (st == KVP_OK) {
        char host[256];
        memcpy(host, auth, (size_t)(colon - auth));
        host[colon - auth] = 0;
        st = kvp__remote_open(host, (uint16_t)port, &o, impl_p);
    }
    if (token)
        kvp__free(token, strlen(token) + 1);
    return st;
}

/* Registration maps the buffer with UCX once, so transfers to and from it
 * skip UCX's per-transfer registration (matters for RDMA; shared memory via
 * CMA needs none). */
static kvp_status_t remote_reg(void *impl, void *addr, size_t len)
{
    remote_t *r = impl;
    reg_t *g = kvp__calloc(1, sizeof *g);
    if (!g)
        return KVP_ERR_NO_MEMORY;
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = len,
    };
    ucs_status_t us = ucp_mem_map(r->ctx, &mp, &g->memh);
    if (us != UCS_OK) {
        kvp_error("remote: cannot register %zu bytes: %s", len, ucs_status_string(us));
        kvp__free(g, sizeof *g);
        return KVP_ERR_IO;
    }
    g->addr = addr;
    pthread_mutex_lock(&r->mu);
    g->next = r->regs;
    r->regs = g;
    pthread_mutex_unlock(&r->mu);
    return KVP_OK;
}

static kvp_status_t remote_dereg(void *impl, void *addr)
{
    remote_t *r = impl;
    pthread_mutex_lock(&r->mu);
    reg_t **pp = &r->regs, *g = NULL;
    while (*pp && (*pp)->addr != addr)
        pp = &(*pp)->next;
    if (*pp) {
        g = *pp;
        *pp = g->next;
    }
    pthread_mutex_unlock(&r->mu);
    if (!g) {
        kvp_error("remote: deregister of %p, which is not registered", addr);
        return KVP_ERR_NOT_FOUND;
    }
    ucp_mem_unmap(r->ctx, g->memh);
    kvp__free(g, sizeof *g);
    return KVP_OK;
}

#define DRIVE_YIELD_AFTER_NS 50000ull

static void remote_drive(void *impl, _Atomic int *done, uint64_t until_ns)
{
    remote_t *r = impl;
    /* Every waiting caller may drive (a UCX worker in multi-thread mode
     * serialises them); while any does, the progress thread sleeps. */
    atomic_fetch_add(&r->driving, 1);
    uint64_t last_work = kvp__now_ns();
    for (;;) {
        if (atomic_load(done))
            break;
        int did;
        if (atomic_load(&r->lane)) {
            did = 0;
            if (pthread_mutex_trylock(&r->rx_mu) == 0) {
                did = kvp__remote_lane_rx(r);
                pthread_mutex_unlock(&r->rx_mu);
            }
        } else {
            int wl = kvp__remote_wlock_rd(&r->wlock);
            did = r->worker ? (int)ucp_worker_progress(r->worker) : 0;
            kvp__remote_wunlock(&r->wlock, wl);
            if (did)
                atomic_store(&r->progressed_ns, kvp__now_ns());
        }
        if (did) {
            last_work = kvp__now_ns();
            continue;
        }
        uint64_t now = kvp__now_ns();
        if (now >= until_ns)
            break;
        /* Idle for a while: the other side is busy moving bytes (a large
         * transfer).  Let a runnable thread, the server on a small host,
         * have this core meanwhile; returns at once when none is. */
        if (now - last_work > DRIVE_YIELD_AFTER_NS)
            sched_yield();
    }
    if (atomic_fetch_sub(&r->driving, 1) != 1)
        return;
    /* Hand the worker back to the progress thread if anyone still waits. */
    if (atomic_load(&r->npending) > 0)
        kvp__remote_wake(r);
}

static kvp_status_t remote_test_recover(void *impl)
{
    remote_t *r = impl;
    pthread_mutex_lock(&r->mu);
    int want = r->replaced + 1;
    r->replace_req = 1;
    pthread_mutex_unlock(&r->mu);
    kvp__remote_wake(r);
    pthread_mutex_lock(&r->mu);
    while (r->replaced < want)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    return KVP_OK;
}

const kvp__backend_ops_t kvp__remote_backend = {
    .test_recover = remote_test_recover,
    .drive = remote_drive,
    .reg = remote_reg,
    .dereg = remote_dereg,
    .scheme = "kvpool",
    .open = remote_open,
    .close = remote_close,
    .submit = remote_submit,
    .stats = remote_stats,
    .max_value = remote_max_value,
    .probe = remote_probe,
};
