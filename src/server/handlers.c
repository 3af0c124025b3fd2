/*
 * Requests and replies.
 *
 * Put over UCX: the request header names the keys and sizes; space for every
 * value is reserved in the arena (invisible to readers) and the AM's data is
 * received straight into those slots (rendezvous: UCX reads the client's
 * buffer into the arena; eager: one copy out of UCX's buffer).  The
 * reservations are committed only when the whole payload has arrived; if the
 * client goes away first, the receive fails (or is given up on, see
 * kvp__conn_abandon) and every reservation is aborted, so no partial object
 * ever becomes visible.  A connection may hold put_resv_max bytes reserved
 * this way at a time (one put larger than that is still taken alone), each
 * put for put_timeout.  (Over kvpool's TCP transport values are reserved as
 * their bytes arrive instead: lane.c.)
 * Get: each found value is leased and the reply is sent straight from the
 * arena (an iov of leased slices); the leases end when the send completes.
 *
 * Every UCX request must come on its connection's reply endpoint: the first
 * binds it, and an endpoint serves one connection only.  A request naming
 * another connection, or none, is dropped and counted.
 */
#include <stdatomic.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/ucx.h"
#include "server/server_int.h"

/*
 * A UCX failure takes the reply endpoint with it.  UCX created each reply
 * endpoint itself (wireup, when the client connected) and counts it as
 * "not exposed to a user": when a transport error hits it (a rendezvous
 * read from a client that died or unmapped its buffer, say), UCX destroys
 * it on its own, after completing what was outstanding on it with that
 * error.  So the first error completion of a connection's request (not a
 * cancellation, which only our close or a worker's end produce) forgets the
 * endpoint (never closed or used again) and ends the connection: its client
 * reconnects.
 */
static void ucx_failed(server_t *s, conn_t *c, ucs_status_t status)
{
    if (status == UCS_OK || status == UCS_ERR_CANCELED || !c || !c->ep)
        return;
    c->ep = NULL;
    kvp__conn_kill(s, c, "a UCX transfer failed (UCX drops its endpoint)");
}

/* ---- replies ---- */

void kvp__reply_drop_leases(reply_t *r)
{
    for (uint32_t i = 0; i < r->nleases; i++)
        kvp__store_release(r->s->store, r->leases[i]);
    r->nleases = 0;
}

/* Ends a reply's claim on its connection: its leases, its count. */
static void reply_detach(reply_t *r)
{
    kvp__reply_drop_leases(r);
    if (r->c) {
        kvp__list_del(&r->link);
        kvp__inflight_end(r->s, r->c, &r->s->inflight_replies);
        r->c = NULL;
    }
}

void kvp__reply_free(reply_t *r)
{
    if (r->abandoned)
        kvp__list_del(&r->link);
    else
        reply_detach(r);
    kvp__free(r->leases, r->cap * sizeof *r->leases);
    kvp__free(r->iov, r->cap * sizeof *r->iov);
    kvp__mpw_free(&r->w);
    kvp__free(r, sizeof *r);
}

static void reply_sent(void *request, ucs_status_t status, void *user_data)
{
    reply_t *r = user_data;
    if (status != UCS_OK && !r->abandoned) {
        kvp_debug("server: reply to conn %llu not delivered: %s", (unsigned long long)r->c->id,
                  ucs_status_string(status));
        ucx_failed(r->s, r->c, status);
    }
    if (!r->abandoned)
        kvp__metrics_observe(&r->s->ctr, r->op, kvp__now_ns() - r->t0);
    kvp__reply_free(r);
    ucp_request_free(request);
}

reply_t *kvp__reply_new(server_t *s, conn_t *c, uint32_t op)
{
    reply_t *r = kvp__calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->s = s;
    r->c = c;
    r->op = op;
    r->t0 = kvp__now_ns();
    kvp__mpw_init(&r->w, r->wbuf, sizeof r->wbuf);
    kvp__list_add_tail(&c->replies, &r->link);
    kvp__inflight_begin(s, c, &s->inflight_replies);
    return r;
}

void kvp__reply_send(reply_t *r)
{
    if (r->w.err || !kvp__conn_live(r->c)) {
        if (r->w.err)
            kvp_error("server: out of memory encoding a reply");
        kvp__reply_free(r);
        return;
    }
    conn_t *c = r->c;
    if (c->lane) {
        kvp__list_del(&r->link); /* from the replies to the send queue */
        kvp__lane_queue(r->s, c, r);
        return;
    }
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = reply_sent,
        .user_data = r,
    };
    const void *data = NULL;
    size_t count = 0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < r->nleases; i++)
        bytes += r->iov[i].length;
    if (bytes >= KVP_RNDV_MIN) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_AM_SEND_FLAG_RNDV;
    }
    if (r->nleases == 1) {
        data = r->iov[0].buffer;
        count = r->iov[0].length;
    } else if (r->nleases) {
        prm.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
        prm.datatype = ucp_dt_make_iov();
        data = r->iov;
        count = r->nleases;
    }
    ucs_status_ptr_t sp = ucp_am_send_nbx(c->ep, KVP_AM_REPLY, r->w.buf, r->w.len, data, count, &prm);
    if (sp == NULL) {
        kvp__metrics_observe(&r->s->ctr, r->op, kvp__now_ns() - r->t0);
        kvp__reply_free(r);
    } else if (UCS_PTR_IS_ERR(sp)) {
        kvp_debug("server: reply send failed: %s", ucs_status_string(UCS_PTR_STATUS(sp)));
        ucx_failed(r->s, c, UCS_PTR_STATUS(sp));
        kvp__reply_free(r);
    }
}

void kvp__reply_status(server_t *s, conn_t *c, uint32_t op, uint64_t req_id, kvp_status_t st)
{
    reply_t *r = kvp__reply_new(s, c, op);
    if (!r)
        return;
    kvp__wire_reply_status_encode(&r->w, op, req_id, st);
    kvp__reply_send(r);
}

/* A reply's latency is observed when it has been sent, counted from t0
 * (when the request arrived: for a put, before its values did). */
void kvp__reply_results(server_t *s, conn_t *c, uint32_t op, uint64_t req_id, const kvp_key_result_t *res,
                        uint32_t n, uint64_t t0)
{
    reply_t *r = kvp__reply_new(s, c, op);
    if (!r)
        return;
    r->t0 = t0;
    kvp__wire_reply_results_encode(&r->w, op, req_id, res, n);
    kvp__reply_send(r);
}

/* ---- put ---- */

static void put_free(put_ctx_t *pc)
{
    uint32_t n = pc->n ? pc->n : 1;
    kvp__free(pc->resv, n * sizeof *pc->resv);
    kvp__free(pc->res, n * sizeof *pc->res);
    kvp__free(pc->iov, n * sizeof *pc->iov);
    kvp__free(pc->keys, n * sizeof *pc->keys);
    kvp__free(pc, sizeof *pc);
}

void kvp__put_finish(put_ctx_t *pc, ucs_status_t recv_status)
{
    if (pc->abandoned) { /* its reservations went with it (kvp__conn_abandon) */
        kvp__list_del(&pc->link);
        put_free(pc);
        return;
    }
    server_t *s = pc->s;
    conn_t *c = pc->c;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < pc->n; i++) {
        if (!pc->resv[i])
            continue;
        if (recv_status != UCS_OK) {
            if (pc->expired)
                kvp__store_expire(s->store, pc->resv[i]);
            else
                kvp__store_abort(s->store, pc->resv[i]);
            pc->res[i].status = kvp__ucx_status(recv_status);
            continue;
        }
        uint32_t flags = 0;
        pc->res[i].status = kvp__store_commit(s->store, pc->resv[i], &flags);
        pc->res[i].flags = flags;
        bytes += pc->res[i].size;
    }
    atomic_fetch_add(&s->ctr.bytes_in, bytes);
    if (recv_status != UCS_OK)
        kvp_warn_rl("server: put payload from conn %llu failed (%s); its reservations were %s",
                    (unsigned long long)c->id, ucs_status_string(recv_status), pc->expired ? "expired" : "aborted");
    if (kvp__conn_live(c) && pc->refuse != KVP_OK)
        kvp__reply_status(s, c, KVP_WOP_PUT, pc->req_id, pc->refuse);
    else if (kvp__conn_live(c))
        kvp__reply_results(s, c, KVP_WOP_PUT, pc->req_id, pc->res, pc->n, pc->t0);
    kvp__list_del(&pc->link);
    c->put_resv_bytes -= pc->resv_bytes;
    atomic_fetch_sub(&s->ctr.put_resv_bytes, pc->resv_bytes);
    kvp__inflight_end(s, c, &s->inflight_puts);
    put_free(pc);
}

static void put_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    put_ctx_t *pc = user_data;
    if (!pc->abandoned)
        ucx_failed(pc->s, pc->c, status);
    kvp__put_finish(pc, status);
    ucp_request_free(request);
}

kvp_status_t kvp__put_begin(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    for (uint32_t i = 0; i < rq->nreleased; i++)
        kvp__lr_release(s, c, rq->released[i]);
    atomic_fetch_add(&s->ctr.ops[rq->op], 1);
    return s->draining ? KVP_ERR_CLOSED : KVP_OK;
}

put_ctx_t *kvp__put_new(server_t *s, conn_t *c, const kvp__wire_req_t *rq, kvp_status_t refuse)
{
    uint32_t n = rq->nkeys, cap = n ? n : 1;
    put_ctx_t *pc = kvp__calloc(1, sizeof *pc);
    kvp__resv_t **resv = kvp__calloc(cap, sizeof *resv);
    kvp_key_result_t *res = kvp__calloc(cap, sizeof *res);
    ucp_dt_iov_t *iov = kvp__calloc(cap, sizeof *iov);
    if (!pc || !resv || !res || !iov) {
        kvp__free(pc, sizeof *pc);
        kvp__free(resv, cap * sizeof *resv);
        kvp__free(res, cap * sizeof *res);
        kvp__free(iov, cap * sizeof *iov);
        return NULL;
    }
    uint64_t now = kvp__now_ns();
    *pc = (put_ctx_t){.s = s, .c = c, .req_id = rq->req_id, .n = n, .t0 = now, .resv = resv, .res = res,
                      .iov = iov, .refuse = refuse, .staged = -1};
    pc->deadline_ns = now + (s->p.put_timeout_ns ? s->p.put_timeout_ns : 30ull * 1000000000ull);
    pc->expires_ns = kvp__req_deadline(rq, now);
    if (pc->expires_ns && pc->expires_ns < pc->deadline_ns)
        pc->deadline_ns = pc->expires_ns;
    kvp__list_init(&pc->link);
    for (uint32_t i = 0; i < n; i++) {
        res[i].size = rq->sizes[i];
        res[i].status = refuse;
        iov[i].buffer = s->discard;
        iov[i].length = rq->sizes[i];
    }
    kvp__inflight_begin(s, c, &s->inflight_puts);
    return pc;
}

static ucs_status_t handle_put(server_t *s, conn_t *c, const kvp__wire_req_t *rq, void *data,
                               const ucp_am_recv_param_t *param)
{
    kvp_status_t refuse = kvp__put_begin(s, c, rq);
    if (!kvp__conn_live(c))
        return UCS_OK; /* (its released field named too many nothings: closed) */
    if (refuse == KVP_OK && c->put_resv_bytes && c->put_resv_bytes + rq->payload > s->put_resv_max) {
        kvp_warn_rl("server: conn %llu has %llu bytes of puts arriving; refusing more until they have",
                    (unsigned long long)c->id, (unsigned long long)c->put_resv_bytes);
        refuse = KVP_ERR_BUSY;
    }
    put_ctx_t *pc = kvp__put_new(s, c, rq, refuse);
    if (!pc) {
        kvp__reply_status(s, c, KVP_WOP_PUT, rq->req_id, KVP_ERR_NO_MEMORY);
        return UCS_OK;
    }
    uint32_t n = rq->nkeys, stored = 0;
    for (uint32_t i = 0; refuse == KVP_OK && i < n; i++) {
        void *dst = NULL;
        uint32_t flags = 0;
        kvp_status_t st;
        if (rq->sizes[i] > kvp__store_max_value(s->store))
            st = KVP_ERR_VALUE_TOO_LARGE;
        else
            st = kvp__store_reserve(s->store, rq->keys[i].data, rq->keys[i].len, rq->sizes[i], KVP_RESV_HELD,
                                    &pc->resv[i], &dst, &flags);
        pc->res[i].status = st;
        pc->res[i].flags = flags;
        if (dst) {
            pc->iov[i].buffer = dst;
            pc->resv_bytes += rq->sizes[i];
            stored++;
        }
    }
    c->put_resv_bytes += pc->resv_bytes;
    atomic_fetch_add(&s->ctr.put_resv_bytes, pc->resv_bytes);
    if (stored == 0) {
        /* Nothing to keep (refused, or every key existed or had no space):
         * returning without receiving drops a rendezvous descriptor, so
         * those bytes never even cross; the reply says what happened. */
        kvp__put_finish(pc, UCS_OK);
        return UCS_OK;
    }
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        /* Eager: the bytes are here already. */
        const char *src = data;
        for (uint32_t i = 0; i < n; i++) {
            if (pc->resv[i])
                memcpy(pc->iov[i].buffer, src, pc->iov[i].length);
            src += pc->iov[i].length;
        }
        kvp__put_finish(pc, UCS_OK);
        return UCS_OK;
    }
    kvp__list_add_tail(&c->puts, &pc->link);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = put_received,
        .user_data = pc,
    };
    void *buf = pc->iov;
    size_t count = n;
    if (n == 1) {
        prm.datatype = ucp_dt_make_contig(1);
        buf = pc->iov[0].buffer;
        count = pc->iov[0].length;
    } else {
        prm.datatype = ucp_dt_make_iov();
    }
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(s->worker, data, buf, count, &prm);
    if (sp == NULL) {
        kvp__put_finish(pc, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
        ucx_failed(s, c, UCS_PTR_STATUS(sp));
        kvp__put_finish(pc, UCS_PTR_STATUS(sp));
    }
    return UCS_OK;
}

/* ---- other ops ---- */

/* GET: each found value leased and sent straight from the arena. */
static void handle_get(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    uint32_t n = rq->nkeys, cap = n ? n : 1;
    reply_t *r = kvp__reply_new(s, c, rq->op);
    if (!r)
        return;
    r->req_id = rq->req_id;
    r->expires_ns = kvp__req_deadline(rq, r->t0);
    r->cap = cap;
    r->leases = kvp__calloc(cap, sizeof *r->leases);
    r->iov = kvp__calloc(cap, sizeof *r->iov);
    if (!r->leases || !r->iov) {
        kvp__wire_reply_status_encode(&r->w, rq->op, rq->req_id, KVP_ERR_NO_MEMORY);
        kvp__reply_send(r);
        return;
    }
    kvp__wire_reply_keys_begin(&r->w, rq->op, rq->req_id, n);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++) {
        const void *p;
        uint64_t size;
        kvp__lease_t *l;
        kvp_status_t st = kvp__store_acquire(s->store, rq->keys[i].data, rq->keys[i].len, &p, &size, &l);
        if (st == KVP_OK && size > rq->sizes[i]) {
            kvp__store_release(s->store, l);
            st = KVP_ERR_BUFFER_TOO_SMALL;
        }
        if (st == KVP_OK) {
            r->leases[r->nleases] = l;
            r->iov[r->nleases].buffer = (void *)p;
            r->iov[r->nleases].length = size;
            r->nleases++;
            bytes += size;
        }
        kvp__wire_reply_key(&r->w, st, size);
    }
    atomic_fetch_add(&s->ctr.bytes_out, bytes);
    kvp__reply_send(r);
}

static void handle_simple(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    uint32_t n = rq->nkeys;
    reply_t *r;
    switch (rq->op) {
    case KVP_WOP_EXISTS: {
        r = kvp__reply_new(s, c, rq->op);
        if (!r)
            return;
        uint8_t *present = kvp__malloc(n ? n : 1);
        if (!present) {
            kvp__wire_reply_status_encode(&r->w, rq->op, rq->req_id, KVP_ERR_NO_MEMORY);
        } else {
            kvp__store_exists_batch(s->store, rq->keys, n, present);
            kvp__wire_reply_exists_encode(&r->w, rq->req_id, present, n);
            kvp__free(present, n ? n : 1);
        }
        kvp__reply_send(r);
        return;
    }
    case KVP_WOP_PREFIX:
        r = kvp__reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_prefix_encode(&r->w, rq->req_id, kvp__store_prefix(s->store, rq->keys, n));
        kvp__reply_send(r);
        return;
    case KVP_WOP_REMOVE:
    case KVP_WOP_PIN:
    case KVP_WOP_UNPIN: {
        kvp_key_result_t *res = kvp__calloc(n ? n : 1, sizeof *res);
        if (!res) {
            kvp__reply_status(s, c, rq->op, rq->req_id, KVP_ERR_NO_MEMORY);
            return;
        }
        for (uint32_t i = 0; i < n; i++)
            res[i].status = rq->op == KVP_WOP_REMOVE
                                ? kvp__store_remove(s->store, rq->keys[i].data, rq->keys[i].len)
                                : kvp__store_pin(s->store, rq->keys[i].data, rq->keys[i].len, rq->op == KVP_WOP_PIN);
        kvp__reply_results(s, c, rq->op, rq->req_id, res, n, kvp__now_ns());
        kvp__free(res, (n ? n : 1) * sizeof *res);
        return;
    }
    case KVP_WOP_REMOVE_ALL: {
        uint64_t removed = kvp__store_remove_all(s->store);
        kvp_info("server: remove_all from conn %llu dropped %llu objects", (unsigned long long)c->id,
                 (unsigned long long)removed);
        r = kvp__reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_remove_all_encode(&r->w, rq->req_id, removed);
        kvp__reply_send(r);
        return;
    }
    case KVP_WOP_STATS: {
        kvp_pool_stats_t st;
        kvp__store_stats(s->store, &st);
        r = kvp__reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_reply_stats_encode(&r->w, rq->req_id, &st);
        kvp__reply_send(r);
        return;
    }
    default:
        kvp__reply_status(s, c, rq->op, rq->req_id, KVP_ERR_PROTOCOL);
    }
}

void kvp__dispatch(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    for (uint32_t i = 0; i < rq->nreleased && kvp__conn_live(c); i++)
        kvp__lr_release(s, c, rq->released[i]);
    if (!kvp__conn_live(c))
        return; /* (too many bogus releases) */
    atomic_fetch_add(&s->ctr.ops[rq->op], 1);
    if (rq->op == KVP_WOP_HELLO) {
        reply_t *r = kvp__reply_new(s, c, rq->op);
        if (!r)
            return;
        kvp__wire_arena_t arena;
        kvp__wire_reply_hello_encode(&r->w, rq->req_id, KVP_BATCH_MAX, kvp__store_max_value(s->store),
                                     kvp__lr_hello(s, c, &arena));
        kvp__reply_send(r);
    } else if (rq->op == KVP_WOP_RELEASE) {
        kvp__lr_release(s, c, rq->req_id); /* (also while draining; never answered) */
    } else if (rq->op == KVP_WOP_LOCAL_PROOF) {
        kvp__lr_prove(s, c, rq->nkeys == 1 ? &rq->keys[0] : NULL);
        if (kvp__conn_live(c))
            kvp__reply_status(s, c, rq->op, rq->req_id, c->lr_proven ? KVP_OK : KVP_ERR_AUTH);
    } else if (s->draining) {
        kvp__reply_status(s, c, rq->op, rq->req_id, KVP_ERR_CLOSED);
    } else if (rq->op == KVP_WOP_GET_LOCAL) {
        kvp__lr_get(s, c, rq);
    } else if (rq->op == KVP_WOP_GET) {
        handle_get(s, c, rq);
    } else {
        handle_simple(s, c, rq);
    }
}

/* ---- UCX ---- */

/* A request whose header came as the AM's data. */
static void handle_in_data(server_t *s, conn_t *c, const void *buf, size_t len)
{
    kvp__wire_req_t rq;
    kvp_status_t st = kvp__wire_req_decode(buf, len, &rq, s->keys_buf, s->sizes_buf, KVP_BATCH_MAX);
    if (st == KVP_OK && (rq.op == KVP_WOP_PUT || rq.op == KVP_WOP_IN_DATA || rq.conn_key != c->key))
        st = KVP_ERR_PROTOCOL;
    if (st != KVP_OK) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp__reply_status(s, c, 0, 0, st);
        return;
    }
    kvp__dispatch(s, c, &rq);
}

static void in_data_received(void *request, ucs_status_t status, size_t length, void *user_data)
{
    in_data_t *d = user_data;
    (void)length;
    kvp__list_del(&d->link);
    if (d->c) {
        ucx_failed(d->s, d->c, status);
        kvp__inflight_end(d->s, d->c, &d->s->inflight_in_data);
        if (status == UCS_OK && kvp__conn_live(d->c))
            handle_in_data(d->s, d->c, d->buf, d->len);
    }
    kvp__free(d->buf, d->len);
    kvp__free(d, sizeof *d);
    if (request)
        ucp_request_free(request);
}

/* Is ep some live connection's reply endpoint? */
static int ep_taken(server_t *s, ucp_ep_h ep)
{
    KVP_LIST_FOR_EACH(n, &s->conns) {
        conn_t *c = KVP_CONTAINER_OF(n, conn_t, link);
        if (c->ep == ep)
            return 1;
    }
    return 0;
}

/* The connection a UCX request belongs to, or NULL (dropped, counted). */
static conn_t *request_conn(server_t *s, kvp_status_t st, const kvp__wire_req_t *rq,
                            const ucp_am_recv_param_t *param)
{
    const char *why = NULL;
    conn_t *c = st == KVP_OK ? kvp__conn_by_key(s, rq->conn_key) : NULL;
    ucp_ep_h ep = (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ? param->reply_ep : NULL;
    if (st != KVP_OK)
        why = kvp_status_str(st);
    else if (!c || !kvp__conn_live(c))
        why = "unknown connection key";
    else if (c->lane)
        why = "a TCP-transport connection's key over UCX";
    else if (!ep)
        why = "no reply endpoint";
    else if (c->ep && c->ep != ep)
        why = "another endpoint than its connection's";
    else if (!c->ep && ep_taken(s, ep))
        why = "an endpoint bound to another connection";
    if (why) {
        /* No connection to answer on: an undecodable header, or one that
         * is not its sender's to send (a closed connection's late message,
         * or a forged one). */
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp_warn_rl("server: request dropped (%s)", why);
        return NULL;
    }
    c->ep = ep;
    return c;
}

ucs_status_t kvp__on_request(void *arg, const void *header, size_t header_length, void *data, size_t length,
                             const ucp_am_recv_param_t *param)
{
    server_t *s = arg;
    atomic_fetch_add(&s->ctr.requests, 1);
    kvp__wire_req_t rq;
    kvp_status_t st = kvp__wire_req_decode(header, header_length, &rq, s->keys_buf, s->sizes_buf, KVP_BATCH_MAX);
    conn_t *c = request_conn(s, st, &rq, param);
    if (!c)
        return UCS_OK;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (rq.op == KVP_WOP_IN_DATA) {
        if (length == 0 || length > KVP_WIRE_HEADER_MAX) {
            atomic_fetch_add(&s->ctr.bad_requests, 1);
            kvp__reply_status(s, c, 0, rq.req_id, KVP_ERR_PROTOCOL);
            return UCS_OK;
        }
        if (!rndv) {
            handle_in_data(s, c, data, length);
            return UCS_OK;
        }
        in_data_t *d = kvp__calloc(1, sizeof *d);
        void *buf = kvp__malloc(length);
        if (!d || !buf) {
            kvp__free(d, sizeof *d);
            kvp__free(buf, length);
            kvp__reply_status(s, c, 0, rq.req_id, KVP_ERR_NO_MEMORY);
            return UCS_OK;
        }
        *d = (in_data_t){.s = s, .c = c, .buf = buf, .len = length};
        kvp__list_add_tail(&c->in_datas, &d->link);
        kvp__inflight_begin(s, c, &s->inflight_in_data);
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
            .cb.recv_am = in_data_received,
            .user_data = d,
            .datatype = ucp_dt_make_contig(1),
        };
        ucs_status_ptr_t sp = ucp_am_recv_data_nbx(s->worker, data, buf, length, &prm);
        if (sp == NULL || UCS_PTR_IS_ERR(sp))
            in_data_received(NULL, sp ? UCS_PTR_STATUS(sp) : UCS_OK, length, d);
        return UCS_OK;
    }
    if ((rq.op == KVP_WOP_PUT) != (length > 0) || (rq.op == KVP_WOP_PUT && length != rq.payload)) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp_warn_rl("server: conn %llu sent %zu data bytes for a %s needing %llu", (unsigned long long)c->id, length,
                    rq.op == KVP_WOP_PUT ? "put" : "non-put", (unsigned long long)rq.payload);
        kvp__reply_status(s, c, rq.op, rq.req_id, KVP_ERR_PROTOCOL);
        return UCS_OK;
    }
    if (rq.op == KVP_WOP_PUT)
        return handle_put(s, c, &rq, data, param);
    kvp__dispatch(s, c, &rq);
    return UCS_OK;
}

void kvp__abandoned_free(server_t *s)
{
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &s->abandoned)
        kvp__reply_free(KVP_CONTAINER_OF(n, reply_t, link));
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &s->abandoned_puts) {
        put_ctx_t *pc = KVP_CONTAINER_OF(n, put_ctx_t, link);
        kvp__list_del(&pc->link);
        put_free(pc);
    }
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &s->abandoned_in) {
        in_data_t *d = KVP_CONTAINER_OF(n, in_data_t, link);
        kvp__list_del(&d->link);
        kvp__free(d->buf, d->len);
        kvp__free(d, sizeof *d);
    }
}
