/*
 * The EC control client (ec_client.h; control.py ControlClient) over libzmq
 * REQ sockets.
 *
 * Sockets.  The seed keeps one REQ socket per thread and address
 * (threading.local).  Here the sockets of an address sit in a free list
 * instead: a request takes one (or connects a new one), uses it with no lock
 * held, and gives it back, so any thread may use any idle socket and a busy
 * one is never shared.  The client mutex orders each socket's memory between
 * the threads that use it in turn, as libzmq requires of a socket that
 * changes threads.  A REQ socket is a strict send/receive alternation: one
 * whose send or receive failed (a timeout included) is mid-exchange and
 * unusable, so it is closed (LINGER 0: the unsent request dies with it) and
 * the next request connects afresh, which also reaches a server that came
 * back.  A reply that arrived whole leaves the socket in step even when it
 * does not decode, so that socket goes back to the list.  At most
 * KEEP_PER_ADDR idle sockets are kept per address; more are closed.
 *
 * Deadlines: SNDTIMEO and RCVTIMEO are the control timeout, as in the seed
 * (a send to a connected-but-silent peer queues at once; the wait is in the
 * receive).
 *
 * Object life: create -> requests (any thread) -> destroy.  destroy marks
 * the client closing (new requests: KVP_ERR_CLOSED), shuts the context down
 * so that a request blocked in libzmq returns at once (ETERM), waits until
 * no request is in flight, then closes the idle sockets and the context.
 *
 * Lock order: the client mutex only, never held across a send or receive.
 */
#include "ec/ec_client.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/strmap.h"

#define KEEP_PER_ADDR 8u
#define MAX_REPLY (16 * 1024 * 1024) /* a reserve_batch reply of 1024 items is ~200 KiB */
#define MAX_SHARDS KVP__EC_CTL_MAX_ITEMS

typedef struct sockpool {
    char *addr; /* the map key (owned) */
    void *idle[KEEP_PER_ADDR];
    size_t n_idle;
} sockpool_t;

typedef struct topo {
    char *base; /* the map key (owned) */
    char **addrs;
    size_t n;
} topo_t;

struct kvp__ec_client {
    pthread_mutex_t mu;
    pthread_cond_t idle;  /* in_flight dropped to 0 (destroy waits) */
    void *zctx;
    int timeout_ms;
    bool closing;
    size_t in_flight;
    kvp__strmap_t pools;  /* addr -> sockpool_t */
    kvp__strmap_t topos;  /* base addr -> topo_t (discover_shards' cache) */
    kvp__ec_client_stats_t st;
};

kvp_status_t kvp__ec_client_create(int64_t timeout_ms, kvp__ec_client_t **c_p)
{
    *c_p = NULL;
    if (timeout_ms < 1 || timeout_ms > INT_MAX)
        return KVP_ERR_INVALID_ARG;
    kvp__ec_client_t *c = kvp__calloc(1, sizeof *c);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    c->timeout_ms = (int)timeout_ms;
    kvp__strmap_init(&c->pools);
    kvp__strmap_init(&c->topos);
    if (!(c->zctx = zmq_ctx_new())) {
        kvp_error("EC control client: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        kvp__free(c, sizeof *c);
        return KVP_ERR_IO;
    }
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->idle, NULL);
    *c_p = c;
    return KVP_OK;
}

static void topo_free(topo_t *t)
{
    kvp__ec_strv_free(t->addrs, t->n);
    kvp__strfree(t->base);
    kvp__free(t, sizeof *t);
}

void kvp__ec_client_destroy(kvp__ec_client_t *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->closing = true;
    pthread_mutex_unlock(&c->mu);
    zmq_ctx_shutdown(c->zctx); /* blocked sends and receives return ETERM */
    pthread_mutex_lock(&c->mu);
    while (c->in_flight)
        pthread_cond_wait(&c->idle, &c->mu);
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < c->pools.cap; i++) {
        sockpool_t *p = c->pools.slots[i].key ? c->pools.slots[i].val : NULL;
        if (!p)
            continue;
        for (size_t k = 0; k < p->n_idle; k++)
            zmq_close(p->idle[k]);
        kvp__strfree(p->addr);
        kvp__free(p, sizeof *p);
    }
    for (size_t i = 0; i < c->topos.cap; i++)
        if (c->topos.slots[i].key)
            topo_free(c->topos.slots[i].val);
    kvp__strmap_cleanup(&c->pools);
    kvp__strmap_cleanup(&c->topos);
    zmq_ctx_term(c->zctx);
    pthread_cond_destroy(&c->idle);
    pthread_mutex_destroy(&c->mu);
    kvp__free(c, sizeof *c);
}

void kvp__ec_reply_init(kvp__ec_reply_t *r)
{
    memset(r, 0, sizeof *r);
    kvp__json_parser_init(&r->json);
}

void kvp__ec_reply_cleanup(kvp__ec_reply_t *r)
{
    kvp__json_parser_cleanup(&r->json);
    memset(r, 0, sizeof *r);
}

void kvp__ec_client_stats(kvp__ec_client_t *c, kvp__ec_client_stats_t *st)
{
    pthread_mutex_lock(&c->mu);
    *st = c->st;
    pthread_mutex_unlock(&c->mu);
}

/* ---- sockets ---- */

/* A new REQ socket connected to addr: KVP_OK, KVP_ERR_INVALID_ARG (the
 * address), KVP_ERR_CLOSED (the context is shutting down), KVP_ERR_IO. */
static kvp_status_t sock_new(kvp__ec_client_t *c, const char *addr, void **s_p)
{
    void *s = zmq_socket(c->zctx, ZMQ_REQ);
    if (!s)
        return zmq_errno() == ETERM ? KVP_ERR_CLOSED : KVP_ERR_IO;
    int on = 1, linger = 0;
    int64_t maxmsg = MAX_REPLY;
    zmq_setsockopt(s, ZMQ_IPV6, &on, sizeof on);
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &c->timeout_ms, sizeof c->timeout_ms);
    zmq_setsockopt(s, ZMQ_SNDTIMEO, &c->timeout_ms, sizeof c->timeout_ms);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (zmq_connect(s, addr) != 0) {
        int e = zmq_errno();
        zmq_close(s);
        kvp_warn_rl("EC control client: connect %s: %s", addr, zmq_strerror(e));
        return e == ETERM ? KVP_ERR_CLOSED : (e == EINVAL || e == EPROTONOSUPPORT) ? KVP_ERR_INVALID_ARG
                                                                                    : KVP_ERR_IO;
    }
    *s_p = s;
    return KVP_OK;
}

/* Takes an idle socket of addr (or none) and counts the request in flight.
 * KVP_ERR_CLOSED once destroy began. */
static kvp_status_t sock_take(kvp__ec_client_t *c, const char *addr, void **s_p)
{
    *s_p = NULL;
    pthread_mutex_lock(&c->mu);
    if (c->closing) {
        pthread_mutex_unlock(&c->mu);
        return KVP_ERR_CLOSED;
    }
    c->in_flight++;
    c->st.requests++;
    sockpool_t *p = kvp__strmap_gets(&c->pools, addr);
    if (p && p->n_idle)
        *s_p = p->idle[--p->n_idle];
    pthread_mutex_unlock(&c->mu);
    return KVP_OK;
}

/* Ends a request: s (NULL: none) goes back to addr's list when keep, else
 * it is closed; `opened` counts a socket the request connected. */
static void sock_give(kvp__ec_client_t *c, const char *addr, void *s, bool keep, bool opened, kvp_status_t st)
{
    pthread_mutex_lock(&c->mu);
    if (opened)
        c->st.sockets_open++;
    if (st != KVP_OK)
        c->st.errors++;
    if (st == KVP_ERR_TIMEOUT)
        c->st.timeouts++;
    if (s && keep && !c->closing) {
        sockpool_t *p = kvp__strmap_gets(&c->pools, addr);
        if (!p && (p = kvp__calloc(1, sizeof *p))) {
            if (!(p->addr = kvp__strdup(addr)) || kvp__strmap_put(&c->pools, p->addr, strlen(p->addr), p) != KVP_OK) {
                kvp__strfree(p->addr);
                kvp__free(p, sizeof *p);
                p = NULL;
            }
        }
        if (p && p->n_idle < KEEP_PER_ADDR) {
            p->idle[p->n_idle++] = s;
            s = NULL;
        }
    }
    if (s) {
        zmq_close(s);
        c->st.sockets_open--;
    }
    if (--c->in_flight == 0 && c->closing)
        pthread_cond_broadcast(&c->idle);
    pthread_mutex_unlock(&c->mu);
}

static kvp_status_t zerr(void)
{
    int e = zmq_errno();
    return e == EAGAIN ? KVP_ERR_TIMEOUT : e == ETERM ? KVP_ERR_CLOSED : KVP_ERR_IO;
}

kvp_status_t kvp__ec_client_exchange(kvp__ec_client_t *c, const char *addr, const char *req, size_t len,
                                     kvp__ec_reply_t *rep)
{
    rep->ok = false;
    rep->result = NULL;
    rep->error = NULL;
    rep->bytes = 0;
    void *s;
    kvp_status_t st = sock_take(c, addr, &s);
    if (st != KVP_OK)
        return st;
    bool opened = false, keep = false;
    if (!s) {
        if ((st = sock_new(c, addr, &s)) != KVP_OK) {
            sock_give(c, addr, NULL, false, false, st);
            return st;
        }
        opened = true;
    }
    int r;
    while ((r = zmq_send(s, req, len, 0)) < 0 && zmq_errno() == EINTR)
        ;
    if (r < 0) {
        st = zerr();
        goto out;
    }
    zmq_msg_t m;
    zmq_msg_init(&m);
    while ((r = zmq_msg_recv(&m, s, 0)) < 0 && zmq_errno() == EINTR)
        ;
    if (r < 0) {
        st = zerr();
        zmq_msg_close(&m);
        goto out;
    }
    if (zmq_msg_more(&m)) {
        /* never ours: the socket is replaced rather than drained */
        zmq_msg_close(&m);
        st = KVP_ERR_DECODE;
        kvp_warn_rl("EC control client: %s sent a multipart reply", addr);
        goto out;
    }
    keep = true;
    rep->bytes = zmq_msg_size(&m);
    st = kvp__ec_ctl_decode_reply(&rep->json, zmq_msg_data(&m), zmq_msg_size(&m), &rep->ok, &rep->result,
                                  &rep->error);
    if (st == KVP_ERR_DECODE)
        kvp_warn_rl("EC control client: %s sent a reply that is not a JSON object (%zu bytes)", addr,
                    zmq_msg_size(&m));
    zmq_msg_close(&m);
out:
    if (st == KVP_ERR_TIMEOUT)
        kvp_warn_rl("EC control client: no reply from %s within %d ms", addr, c->timeout_ms);
    else if (st == KVP_ERR_IO)
        kvp_warn_rl("EC control client: %s: %s", addr, zmq_strerror(zmq_errno()));
    sock_give(c, addr, s, keep, opened, st);
    return st;
}

kvp_status_t kvp__ec_client_request(kvp__ec_client_t *c, const char *addr, const char *req, size_t len,
                                    kvp__ec_reply_t *rep)
{
    kvp_status_t st = kvp__ec_client_exchange(c, addr, req, len, rep);
    if (st == KVP_OK && !rep->ok)
        return KVP_ERR_REMOTE;
    return st;
}

/* A request built in b (out of memory is sticky in b). */
static kvp_status_t request_jw(kvp__ec_client_t *c, const char *addr, kvp__jw_t *b, kvp__ec_reply_t *rep)
{
    if (b->oom)
        return KVP_ERR_NO_MEMORY;
    return kvp__ec_client_request(c, addr, b->p, b->len, rep);
}

/* ---- the ops ---- */

/* addr's host part, as Python's addr.rsplit(":", 1)[0]: its length. */
static size_t prefix_len(const char *addr)
{
    const char *colon = strrchr(addr, ':');
    return colon ? (size_t)(colon - addr) : strlen(addr);
}

/* The port of a result: an int in 1..65535. */
static bool port_of(const kvp__json_t *v, uint16_t *port_p)
{
    if (!v || v->type != KVP__JSON_INT || v->u.i < 1 || v->u.i > 65535)
        return false;
    *port_p = (uint16_t)v->u.i;
    return true;
}

/* A new topology of base from the ports of a peers reply. */
static kvp_status_t topo_of(const char *base, const kvp__json_t *result, topo_t **t_p)
{
    *t_p = NULL;
    const kvp__json_t *ports = result && result->type == KVP__JSON_OBJECT ? kvp__json_get(result, "ports") : NULL;
    if (!ports || ports->type != KVP__JSON_ARRAY || ports->n == 0 || ports->n > MAX_SHARDS)
        return KVP_ERR_DECODE;
    uint16_t port;
    for (size_t i = 0; i < ports->n; i++)
        if (!port_of(&ports->u.items[i], &port))
            return KVP_ERR_DECODE;
    topo_t *t = kvp__calloc(1, sizeof *t);
    if (!t)
        return KVP_ERR_NO_MEMORY;
    size_t pl = prefix_len(base);
    if (!(t->base = kvp__strdup(base)) || !(t->addrs = kvp__calloc(ports->n, sizeof *t->addrs))) {
        topo_free(t);
        return KVP_ERR_NO_MEMORY;
    }
    t->n = ports->n;
    for (size_t i = 0; i < ports->n; i++) {
        port_of(&ports->u.items[i], &port);
        size_t n = pl + 2 + (port >= 10000 ? 5 : port >= 1000 ? 4 : port >= 100 ? 3 : port >= 10 ? 2 : 1);
        if (!(t->addrs[i] = kvp__malloc(n))) {
            topo_free(t);
            return KVP_ERR_NO_MEMORY;
        }
        snprintf(t->addrs[i], n, "%.*s:%u", (int)pl, base, (unsigned)port); /* exactly n - 1 chars */
    }
    *t_p = t;
    return KVP_OK;
}

kvp_status_t kvp__ec_client_shards(kvp__ec_client_t *c, const char *base_addr, const char *const **addrs_p,
                                   size_t *n_p)
{
    *addrs_p = NULL;
    *n_p = 0;
    pthread_mutex_lock(&c->mu);
    topo_t *t = kvp__strmap_gets(&c->topos, base_addr);
    pthread_mutex_unlock(&c->mu);
    if (t) {
        *addrs_p = (const char *const *)t->addrs;
        *n_p = t->n;
        return KVP_OK;
    }
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_simple(&b, KVP__EC_OP_PEERS);
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    kvp_status_t st = request_jw(c, base_addr, &b, &rep);
    kvp__jw_cleanup(&b);
    if (st == KVP_OK)
        st = topo_of(base_addr, rep.result, &t);
    kvp__ec_reply_cleanup(&rep);
    if (st != KVP_OK) {
        kvp_warn_rl("EC Mooncake consumer at %s did not report its shards (%s)", base_addr, kvp_status_str(st));
        return st;
    }
    pthread_mutex_lock(&c->mu);
    topo_t *had = kvp__strmap_gets(&c->topos, base_addr);
    if (had) {
        /* another thread found it meanwhile: keep the first */
        topo_free(t);
        t = had;
    } else if (kvp__strmap_put(&c->topos, t->base, strlen(t->base), t) != KVP_OK) {
        pthread_mutex_unlock(&c->mu);
        topo_free(t);
        return KVP_ERR_NO_MEMORY;
    }
    pthread_mutex_unlock(&c->mu);
    *addrs_p = (const char *const *)t->addrs;
    *n_p = t->n;
    return KVP_OK;
}

kvp_status_t kvp__ec_client_event_port(kvp__ec_client_t *c, const char *addr, uint16_t *port_p)
{
    *port_p = 0;
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_simple(&b, KVP__EC_OP_EVENT_PORT);
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    kvp_status_t st = request_jw(c, addr, &b, &rep);
    kvp__jw_cleanup(&b);
    if (st == KVP_OK && !port_of(rep.result, port_p))
        st = KVP_ERR_DECODE;
    kvp__ec_reply_cleanup(&rep);
    return st;
}

kvp_status_t kvp__ec_client_cancel(kvp__ec_client_t *c, const char *addr, const char *transfer_id,
                                   const char *reservation_id, bool abandon, bool refresh, bool *cancelled_p)
{
    *cancelled_p = false;
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_cancel(&b, transfer_id, reservation_id, abandon, refresh);
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    kvp_status_t st = request_jw(c, addr, &b, &rep);
    kvp__jw_cleanup(&b);
    if (st == KVP_OK && rep.result->type == KVP__JSON_OBJECT) {
        /* bool(result.get("cancelled")); a float's value is not kept */
        const kvp__json_t *v = kvp__json_get(rep.result, "cancelled");
        if (v && v->type == KVP__JSON_FLOAT)
            st = KVP_ERR_DECODE;
        else if (v)
            *cancelled_p = v->type == KVP__JSON_TRUE || v->type == KVP__JSON_BIGINT ||
                           (v->type == KVP__JSON_INT && v->u.i != 0) ||
                           ((v->type == KVP__JSON_STRING || v->type == KVP__JSON_ARRAY ||
                             v->type == KVP__JSON_OBJECT) && v->n != 0);
    }
    kvp__ec_reply_cleanup(&rep);
    return st;
}
