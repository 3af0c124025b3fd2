/*
 * The consumer's control server: see ec_ctl_server.h.
 *
 * Object life: create binds both sockets on the server's own thread (a
 * ZeroMQ socket is used by one thread only) and waits for it to report;
 * destroy sets `stop`, and the thread, which polls with a timeout of at
 * most 100 ms, closes the sockets and ends.  The thread alone touches the
 * sockets, the decoder, the reply buffer and the event queue; other
 * threads read only the atomic counters.
 *
 * One pass of the loop: send what the event queue holds (without
 * blocking: PUSH has no peer until the scheduler's inbox connects, and the
 * queue keeps what could not go), expire leases when the reap interval has
 * passed, serve the requests whose cross-encoder cache lookups have all
 * reported, then serve every request that has arrived (at most 64 before
 * the queue and the reaper get their turn again).
 *
 * Parking.  A reserve (or reserve_batch) naming hashes the resident set
 * lacks starts a lookup per hash (one per hash however many requests wait
 * on it: `lookups` maps the hash to its waiters) and is parked: its
 * identity frame and its bytes are kept and no reply goes yet.  A lookup
 * reports from another thread onto `done` and wakes the loop through an
 * eventfd; when a parked request's last lookup has reported it is decoded
 * and served again, with lookups off, so a hit answers cached.  A REQ
 * peer has one request in flight per socket, so parking never reorders one
 * socket's exchanges.  destroy waits until every lookup has reported.
 */
#include "ec/ec_ctl_server.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/list.h"
#include "common/log.h"
#include "common/strmap.h"
#include "common/thread.h"
#include "ec/ec_ctl_wire.h"

#define POLL_MS 100
#define BATCH_PER_PASS 64
#define MAX_FRAMES 4
#define MAX_PARKED_BYTES (16u << 20) /* the bytes of the requests parked at once */

typedef struct {
    char *p;
    size_t n;
} event_t;

typedef struct parked {
    kvp__list_t link; /* on s->parked */
    zmq_msg_t id;     /* the peer's identity frame */
    zmq_msg_t body;   /* the request, as it arrived (moved, not copied) */
    uint64_t peer;
    size_t waiting; /* lookups not yet reported */
} parked_t;

typedef struct lookup {
    struct lookup *next_done; /* on s->done_head once reported */
    kvp__ec_ctl_server_t *s;
    char *hash; /* owned; the key in s->lookups */
    parked_t **w;
    size_t n_w, cap_w;
} lookup_t;

struct kvp__ec_ctl_server {
    char *host;
    uint16_t port;
    uint16_t *peer_ports;
    size_t n_peers;
    kvp__ec_resv_t *resv;
    char *dst_session;
    const uint8_t *slab;
    int64_t reap_ms;
    size_t max_events;
    kvp__ec_xcache_t *xcache;
    size_t max_parked;
    int efd; /* eventfd: a lookup reported */
    pthread_mutex_t lk_mu; /* done_head, lk_inflight */
    pthread_cond_t lk_cv;  /* lk_inflight dropped */
    lookup_t *done_head;
    size_t lk_inflight;    /* lookups started and not yet reported */

    char addr[300];
    uint16_t event_port;

    void *zctx, *router, *push;
    pthread_t thread;
    bool thread_started;
    atomic_bool stop;

    pthread_mutex_t mu; /* the start handshake only */
    pthread_cond_t cv;
    int started;        /* 0 = not yet, 1 = reported */
    kvp_status_t start_status;

    /* thread-only state */
    kvp__ec_ctl_dec_t dec;
    kvp__jw_t out;
    event_t *evq; /* ring of max_events */
    size_t ev_head, ev_len;
    kvp__strmap_t lookups; /* mm_hash -> lookup_t in flight */
    kvp__list_t parked;    /* parked_t, oldest first */
    size_t n_parked, parked_bytes;
    lookup_t *want[KVP__EC_CTL_MAX_ITEMS]; /* the lookups one request waits on */
    size_t n_want;

    atomic_uint_fast64_t n_requests, n_errors, n_bad_env, n_oversized;
    atomic_uint_fast64_t n_ev_queued, n_ev_sent, n_ev_dropped, n_ev_pending;
    atomic_uint_fast64_t n_reaps;
    atomic_uint_fast64_t n_parked_now, n_parked_total, n_parked_over;
    /* the thread's time serving requests (received -> replied or parked),
     * all of them and the reserves' (reserve, reserve_batch) */
    atomic_uint_fast64_t n_busy_ns, n_resv_requests, n_resv_busy_ns, n_resv_cpu_ns;
};

static int64_t now_ms(void) { return (int64_t)(kvp__now_ns() / 1000000u); }

/* This thread's CPU time (ns): what serving costs without the waits for a
 * CPU that the wall-clock time includes. */
static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

typedef struct {
    uint64_t wall, cpu;
} svc_clock_t;

static svc_clock_t svc_start(void) { return (svc_clock_t){kvp__now_ns(), cpu_ns()}; }

/* The time since c serving one request; reserve: a reserve op; done: its
 * reply went (not parked for lookups: it is accounted again when served).
 * A request's figures land after its reply, the count last, so a reader
 * that sees n reserves sees the time of all n. */
static void account(kvp__ec_ctl_server_t *s, bool reserve, bool done, svc_clock_t c)
{
    uint64_t dt = kvp__now_ns() - c.wall, dc = reserve ? cpu_ns() - c.cpu : 0;
    atomic_fetch_add(&s->n_busy_ns, dt);
    if (reserve) {
        atomic_fetch_add(&s->n_resv_busy_ns, dt);
        atomic_fetch_add(&s->n_resv_cpu_ns, dc);
        if (done)
            atomic_fetch_add(&s->n_resv_requests, 1);
    }
}

/* ---- the event queue ---- */

static void queue_event(kvp__ec_ctl_server_t *s, const char *tid)
{
    kvp__ec_status_t st;
    if (kvp__ec_resv_status(s->resv, tid, &st) != KVP_OK)
        return; /* no longer active: nothing to announce */
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_event(&b, tid, &st, s->port);
    if (b.oom) {
        kvp__jw_cleanup(&b);
        kvp_warn_rl("ec control %u: out of memory queueing the event of %s", (unsigned)s->port, tid);
        return;
    }
    if (s->ev_len == s->max_events) {
        event_t *old = &s->evq[s->ev_head];
        kvp_warn_rl("ec control %u: event backlog full (%zu); dropping the oldest", (unsigned)s->port,
                    s->max_events);
        kvp__free(old->p, old->n + 1);
        s->ev_head = (s->ev_head + 1) % s->max_events;
        s->ev_len--;
        atomic_fetch_add(&s->n_ev_dropped, 1);
    }
    /* The writer's buffer becomes the queued copy (its capacity is what was
     * allocated; shrink to n + 1 so the free below names the true size). */
    char *p = kvp__malloc(b.len + 1);
    if (!p) {
        kvp__jw_cleanup(&b);
        return;
    }
    memcpy(p, b.p, b.len);
    p[b.len] = 0;
    event_t *e = &s->evq[(s->ev_head + s->ev_len) % s->max_events];
    e->p = p;
    e->n = b.len;
    s->ev_len++;
    kvp__jw_cleanup(&b);
    atomic_fetch_add(&s->n_ev_queued, 1);
    atomic_store(&s->n_ev_pending, s->ev_len);
}

static void flush_events(kvp__ec_ctl_server_t *s)
{
    while (s->ev_len) {
        event_t *e = &s->evq[s->ev_head];
        if (zmq_send(s->push, e->p, e->n, ZMQ_DONTWAIT) < 0)
            break; /* EAGAIN: no peer or its queue is full; keep it */
        kvp__free(e->p, e->n + 1);
        e->p = NULL;
        s->ev_head = (s->ev_head + 1) % s->max_events;
        s->ev_len--;
        atomic_fetch_add(&s->n_ev_sent, 1);
    }
    atomic_store(&s->n_ev_pending, s->ev_len);
}

/* ---- the ops ---- */

/* ---- cross-encoder cache lookups ---- */

/* done (ec_xcache.h), on a pool or xcache thread. */
static void lookup_done(void *token)
{
    lookup_t *l = token;
    kvp__ec_ctl_server_t *s = l->s;
    pthread_mutex_lock(&s->lk_mu);
    l->next_done = s->done_head;
    s->done_head = l;
    /* the wake-up goes before the count drops: destroy closes efd once
     * the count is 0 */
    uint64_t one = 1;
    if (write(s->efd, &one, sizeof one) < 0) {
        /* the counter is saturated, so the loop is awake already */
    }
    s->lk_inflight--;
    pthread_cond_broadcast(&s->lk_cv);
    pthread_mutex_unlock(&s->lk_mu);
}

static void lookup_free(lookup_t *l)
{
    kvp__strfree(l->hash);
    kvp__free(l->w, l->cap_w * sizeof *l->w);
    kvp__free(l, sizeof *l);
}

static bool wanted(const kvp__ec_ctl_server_t *s, const lookup_t *l)
{
    for (size_t i = 0; i < s->n_want; i++)
        if (s->want[i] == l)
            return true;
    return false;
}

/* The lookups a reserve must wait for, into s->want: one per hash that is
 * not resident, joined when in flight already, else started.  A lookup
 * that ends at once (a miss, a skip, a failure) is not waited for. */
static void want_lookups(kvp__ec_ctl_server_t *s, const kvp__ec_ctl_req_t *r)
{
    s->n_want = 0;
    if (s->n_parked >= s->max_parked) {
        atomic_fetch_add(&s->n_parked_over, 1);
        kvp_warn_rl("ec control %u: %zu requests wait for the cross-encoder cache; this one goes without",
                    (unsigned)s->port, s->n_parked);
        return;
    }
    for (size_t i = 0; i < r->n_reserves; i++) {
        const kvp__ec_wire_reserve_t *w = &r->reserves[i];
        if (w->error || kvp__ec_resv_has_resident(s->resv, w->mm_hash))
            continue;
        lookup_t *l = kvp__strmap_gets(&s->lookups, w->mm_hash);
        if (l) {
            if (!wanted(s, l))
                s->want[s->n_want++] = l;
            continue;
        }
        l = kvp__calloc(1, sizeof *l);
        if (l)
            l->hash = kvp__strdup(w->mm_hash);
        if (!l || !l->hash || kvp__strmap_put(&s->lookups, l->hash, strlen(l->hash), l) != KVP_OK) {
            if (l)
                lookup_free(l);
            continue;
        }
        l->s = s;
        pthread_mutex_lock(&s->lk_mu);
        s->lk_inflight++;
        pthread_mutex_unlock(&s->lk_mu);
        kvp_status_t st = kvp__ec_xcache_lookup(s->xcache, w->mm_hash, &w->t, lookup_done, l);
        if (st == KVP_INPROGRESS) {
            s->want[s->n_want++] = l;
            continue;
        }
        pthread_mutex_lock(&s->lk_mu);
        s->lk_inflight--;
        pthread_mutex_unlock(&s->lk_mu);
        kvp__strmap_del(&s->lookups, l->hash, strlen(l->hash));
        lookup_free(l);
    }
}

/* One reserve: the seed expires first, then reserves. */
static kvp_status_t reserve_one(kvp__ec_ctl_server_t *s, const kvp__ec_wire_reserve_t *w, uint64_t peer,
                                kvp__ec_reserve_out_t *o, char *err, size_t errlen)
{
    kvp__ec_resv_expire(s->resv);
    kvp__ec_reserve_in_t in = {.transfer_id = w->transfer_id, .mm_hash = w->mm_hash, .t = w->t, .peer = peer};
    return kvp__ec_resv_reserve(s->resv, &in, o, err, errlen);
}

static void put_reserve_ok(kvp__ec_ctl_server_t *s, kvp__jw_t *b, const kvp__ec_reserve_out_t *o)
{
    uint64_t ptr = o->cancelled ? 0 : (uint64_t)(uintptr_t)(s->slab + o->offset);
    kvp__ec_ctl_put_reserve_result(b, o, o->cancelled ? "" : s->dst_session, ptr);
}

static void op_reserve(kvp__ec_ctl_server_t *s, const kvp__ec_ctl_req_t *r, uint64_t peer, kvp__jw_t *b)
{
    char err[256];
    if (r->op == KVP__EC_OP_RESERVE) {
        const kvp__ec_wire_reserve_t *w = &r->reserves[0];
        kvp__ec_reserve_out_t o;
        if (w->error) {
            kvp__ec_ctl_put_error(b, w->error);
            return;
        }
        err[0] = 0;
        if (reserve_one(s, w, peer, &o, err, sizeof err) != KVP_OK) {
            kvp__ec_ctl_put_error(b, err[0] ? err : "EC reservation failed");
            return;
        }
        kvp__ec_ctl_put_ok_begin(b);
        put_reserve_ok(s, b, &o);
        kvp__ec_ctl_put_ok_end(b);
        if (o.ready)
            queue_event(s, w->transfer_id);
        return;
    }
    /* reserve_batch: {"items":[{"ok":true,"result":...} | {"ok":false,"error":...}]} */
    kvp__ec_ctl_put_ok_begin(b);
    kvp__jw_puts(b, "{\"items\":[");
    for (size_t i = 0; i < r->n_reserves; i++) {
        const kvp__ec_wire_reserve_t *w = &r->reserves[i];
        kvp__ec_reserve_out_t o;
        if (i)
            kvp__jw_puts(b, ",");
        if (w->error) {
            kvp__ec_ctl_put_error(b, w->error);
            continue;
        }
        err[0] = 0;
        if (reserve_one(s, w, peer, &o, err, sizeof err) != KVP_OK) {
            kvp__ec_ctl_put_error(b, err[0] ? err : "EC reservation failed");
            continue;
        }
        kvp__ec_ctl_put_ok_begin(b);
        put_reserve_ok(s, b, &o);
        kvp__ec_ctl_put_ok_end(b);
        if (o.ready)
            queue_event(s, w->transfer_id);
    }
    kvp__jw_puts(b, "]}");
    kvp__ec_ctl_put_ok_end(b);
}

static void drain_followers(kvp__ec_ctl_server_t *s)
{
    char **ids = NULL;
    size_t n = 0;
    if (kvp__ec_resv_drain_ready(s->resv, &ids, &n) != KVP_OK)
        return;
    for (size_t i = 0; i < n; i++)
        queue_event(s, ids[i]);
    kvp__ec_strv_free(ids, n);
}

static void op_complete(kvp__ec_ctl_server_t *s, const kvp__ec_ctl_req_t *r, kvp__jw_t *b)
{
    bool batch = r->op == KVP__EC_OP_COMPLETE_BATCH;
    kvp__ec_ctl_put_ok_begin(b);
    if (batch)
        kvp__jw_puts(b, "{\"items\":[");
    for (size_t i = 0; i < r->n_completes; i++) {
        const kvp__ec_wire_complete_t *c = &r->completes[i];
        bool accepted = false, became_ready = false;
        kvp__ec_resv_complete(s->resv, c->transfer_id, c->reservation_id, &accepted, &became_ready);
        drain_followers(s);
        if (i)
            kvp__jw_puts(b, ",");
        kvp__ec_ctl_put_complete_result(b, accepted, became_ready);
        if (became_ready)
            queue_event(s, c->transfer_id);
    }
    if (batch)
        kvp__jw_puts(b, "]}");
    kvp__ec_ctl_put_ok_end(b);
}

/* Serves one request into b, or (lookups on, a reserve that must wait for
 * the cross-encoder cache) starts its lookups, leaves b empty and returns
 * true: the caller parks the request. */
static bool handle(kvp__ec_ctl_server_t *s, const void *payload, size_t len, uint64_t peer, kvp__jw_t *b,
                   bool lookups, bool *reserve_p)
{
    *reserve_p = false;
    char err[256];
    kvp__ec_ctl_req_t r;
    if (lookups)
        atomic_fetch_add(&s->n_requests, 1);
    if (len > KVP__EC_CTL_MAX_FRAME) {
        atomic_fetch_add(&s->n_oversized, 1);
        kvp_warn_rl("ec control %u: a %zu-byte request (limit %u)", (unsigned)s->port, len,
                    KVP__EC_CTL_MAX_FRAME);
        kvp__ec_ctl_put_error(b, "control request too large");
        return false;
    }
    err[0] = 0;
    kvp_status_t st = kvp__ec_ctl_decode(&s->dec, payload, len, &r, err, sizeof err);
    if (st != KVP_OK) {
        kvp_warn_rl("ec control %u: bad request: %s", (unsigned)s->port, err[0] ? err : kvp_status_str(st));
        kvp__ec_ctl_put_error(b, st == KVP_ERR_NO_MEMORY ? "out of memory"
                                 : err[0]                 ? err
                                                          : "malformed control request");
        return false;
    }
    switch (r.op) {
    case KVP__EC_OP_PEERS:
        kvp__ec_ctl_put_ok_begin(b);
        kvp__ec_ctl_put_peers_result(b, s->peer_ports, s->n_peers);
        kvp__ec_ctl_put_ok_end(b);
        break;
    case KVP__EC_OP_EVENT_PORT:
        kvp__ec_ctl_put_ok_begin(b);
        kvp__jw_int(b, s->event_port);
        kvp__ec_ctl_put_ok_end(b);
        break;
    case KVP__EC_OP_STATUS: {
        kvp__ec_status_t stt;
        bool found = kvp__ec_resv_status(s->resv, r.transfer_id, &stt) == KVP_OK;
        kvp__ec_ctl_put_ok_begin(b);
        kvp__ec_ctl_put_status_result(b, found ? &stt : NULL);
        kvp__ec_ctl_put_ok_end(b);
        break;
    }
    case KVP__EC_OP_RESERVE:
    case KVP__EC_OP_RESERVE_BATCH:
        *reserve_p = true;
        if (lookups && s->xcache) {
            want_lookups(s, &r);
            if (s->n_want)
                return true;
        }
        op_reserve(s, &r, peer, b);
        break;
    case KVP__EC_OP_COMPLETE:
    case KVP__EC_OP_COMPLETE_BATCH:
        op_complete(s, &r, b);
        break;
    case KVP__EC_OP_CANCEL: {
        bool cancelled = false, deferred = false;
        kvp__ec_resv_cancel(s->resv, r.transfer_id, r.reservation_id, r.abandon, r.refresh, &cancelled, &deferred);
        kvp__ec_ctl_put_ok_begin(b);
        kvp__ec_ctl_put_cancel_result(b, cancelled, deferred);
        kvp__ec_ctl_put_ok_end(b);
        break;
    }
    default:
        kvp__ec_ctl_put_error(b, "unknown control op");
        break;
    }
    return false;
}

/* The reply in b to the peer with identity id (REP's envelope). */
static void send_reply(kvp__ec_ctl_server_t *s, zmq_msg_t *id, kvp__jw_t *b)
{
    if (b->oom) {
        b->len = 0;
        b->oom = false;
        kvp__ec_ctl_put_error(b, "out of memory");
    }
    int err_reply = b->len > 9 && memcmp(b->p, "{\"ok\":false", 11) == 0;
    if (err_reply)
        atomic_fetch_add(&s->n_errors, 1);
    /* A ROUTER never blocks a send: an unroutable or full peer drops it. */
    zmq_send(s->router, zmq_msg_data(id), zmq_msg_size(id), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s->router, b->p ? b->p : "", b->len, ZMQ_DONTWAIT);
}

/* No longer waiting: off the list and the gauge (before its reply goes, so
 * a client that has the reply sees it gone). */
static void unpark(kvp__ec_ctl_server_t *s, parked_t *p)
{
    kvp__list_del(&p->link);
    s->n_parked--;
    s->parked_bytes -= zmq_msg_size(&p->body);
    atomic_store(&s->n_parked_now, s->n_parked);
}

static void parked_release(parked_t *p)
{
    zmq_msg_close(&p->id);
    zmq_msg_close(&p->body);
    kvp__free(p, sizeof *p);
}

/* Keeps the request (its identity and body frames moved out of id and
 * body) until the lookups in s->want have reported.  false: over the byte
 * cap or out of memory (the caller serves it now, without waiting). */
static bool park(kvp__ec_ctl_server_t *s, zmq_msg_t *id, zmq_msg_t *body, uint64_t peer)
{
    size_t len = zmq_msg_size(body);
    if (s->parked_bytes + len > MAX_PARKED_BYTES) {
        atomic_fetch_add(&s->n_parked_over, 1);
        kvp_warn_rl("ec control %u: %zu bytes of requests wait for the cross-encoder cache; this one goes without",
                    (unsigned)s->port, s->parked_bytes);
        return false;
    }
    parked_t *p = kvp__calloc(1, sizeof *p);
    if (!p)
        return false;
    for (size_t i = 0; i < s->n_want; i++) {
        lookup_t *l = s->want[i];
        if (l->n_w < l->cap_w)
            continue;
        size_t nc = l->cap_w ? 2 * l->cap_w : 4;
        parked_t **nw = kvp__realloc(l->w, l->cap_w * sizeof *nw, nc * sizeof *nw);
        if (!nw) {
            kvp__free(p, sizeof *p);
            return false;
        }
        l->w = nw;
        l->cap_w = nc;
    }
    p->peer = peer;
    p->waiting = s->n_want;
    zmq_msg_init(&p->id);
    zmq_msg_move(&p->id, id);
    zmq_msg_init(&p->body);
    zmq_msg_move(&p->body, body);
    for (size_t i = 0; i < s->n_want; i++)
        s->want[i]->w[s->want[i]->n_w++] = p;
    kvp__list_add_tail(&s->parked, &p->link);
    s->n_parked++;
    s->parked_bytes += len;
    atomic_store(&s->n_parked_now, s->n_parked);
    atomic_fetch_add(&s->n_parked_total, 1);
    return true;
}

/* Every lookup that has reported: its waiters lose one; those with none
 * left are served (lookups off). */
static void serve_reported(kvp__ec_ctl_server_t *s)
{
    uint64_t cnt;
    if (read(s->efd, &cnt, sizeof cnt) < 0) {
        /* EAGAIN: nothing new (the list is read anyway) */
    }
    pthread_mutex_lock(&s->lk_mu);
    lookup_t *l = s->done_head;
    s->done_head = NULL;
    pthread_mutex_unlock(&s->lk_mu);
    while (l) {
        lookup_t *next = l->next_done;
        kvp__strmap_del(&s->lookups, l->hash, strlen(l->hash));
        for (size_t i = 0; i < l->n_w; i++) {
            parked_t *p = l->w[i];
            if (--p->waiting)
                continue;
            kvp__jw_t *b = &s->out;
            b->len = 0;
            b->oom = false;
            svc_clock_t t0 = svc_start();
            bool reserve;
            unpark(s, p);
            handle(s, zmq_msg_data(&p->body), zmq_msg_size(&p->body), p->peer, b, false, &reserve);
            send_reply(s, &p->id, b);
            account(s, reserve, true, t0);
            parked_release(p);
        }
        lookup_free(l);
        l = next;
    }
    drain_followers(s);
}

/* Receives one message from the ROUTER (the caller saw POLLIN or loops
 * with DONTWAIT).  Returns 1 when a message was served, 0 when none was
 * waiting, -1 when the context is ending. */
static int serve_one(kvp__ec_ctl_server_t *s)
{
    zmq_msg_t parts[MAX_FRAMES];
    size_t kept = 0, frames = 0;
    int more = 1;
    while (more) {
        zmq_msg_t spill, *m = kept < MAX_FRAMES ? &parts[kept] : &spill;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, s->router, frames == 0 ? ZMQ_DONTWAIT : 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(m);
            for (size_t i = 0; i < kept; i++)
                zmq_msg_close(&parts[i]);
            if (e == EAGAIN && frames == 0)
                return 0;
            return e == ETERM ? -1 : 0;
        }
        frames++;
        more = zmq_msg_more(m);
        if (m == &spill)
            zmq_msg_close(m);
        else
            kept++;
    }
    svc_clock_t t0 = svc_start(); /* received: its service starts */
    /* REQ's envelope through a ROUTER: [identity][empty][request]. */
    if (frames != 3 || zmq_msg_size(&parts[1]) != 0) {
        atomic_fetch_add(&s->n_bad_env, 1);
        kvp_warn_rl("ec control %u: a message of %zu frames without REQ's envelope; dropped", (unsigned)s->port,
                    frames);
        for (size_t i = 0; i < kept; i++)
            zmq_msg_close(&parts[i]);
        return 1;
    }
    uint64_t peer = kvp__strmap_hash((const char *)zmq_msg_data(&parts[0]), zmq_msg_size(&parts[0])) | 1u;
    kvp__jw_t *b = &s->out;
    b->len = 0;
    b->oom = false;
    const void *req = zmq_msg_data(&parts[2]);
    size_t len = zmq_msg_size(&parts[2]);
    bool served = true, reserve;
    if (handle(s, req, len, peer, b, true, &reserve)) { /* it waits for lookups */
        served = !park(s, &parts[0], &parts[2], peer);
        if (served) /* parking refused: serve it without waiting */
            handle(s, req, len, peer, b, false, &reserve);
    }
    if (served)
        send_reply(s, &parts[0], b);
    account(s, reserve, served, t0);
    for (size_t i = 0; i < kept; i++)
        zmq_msg_close(&parts[i]);
    return 1;
}

static void report_start(kvp__ec_ctl_server_t *s, kvp_status_t st)
{
    pthread_mutex_lock(&s->mu);
    s->started = 1;
    s->start_status = st;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static kvp_status_t bind_sockets(kvp__ec_ctl_server_t *s)
{
    int on = 1, zero = 0;
    int64_t maxmsg = 16 * (int64_t)KVP__EC_CTL_MAX_FRAME;
    char ep[300];
    s->router = zmq_socket(s->zctx, ZMQ_ROUTER);
    s->push = zmq_socket(s->zctx, ZMQ_PUSH);
    if (!s->router || !s->push)
        return KVP_ERR_IO;
    zmq_setsockopt(s->router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->push, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(s->router, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    if (strchr(s->host, ':')) {
        zmq_setsockopt(s->router, ZMQ_IPV6, &on, sizeof on);
        zmq_setsockopt(s->push, ZMQ_IPV6, &on, sizeof on);
    }
    const char *h = strcmp(s->host, "0.0.0.0") == 0 ? "*" : s->host;
    int v6 = strchr(h, ':') != NULL;
    snprintf(ep, sizeof ep, v6 ? "tcp://[%s]:%u" : "tcp://%s:%u", h, (unsigned)s->port);
    if (zmq_bind(s->router, ep) != 0) {
        kvp_error("ec control: bind %s: %s", ep, zmq_strerror(zmq_errno()));
        return KVP_ERR_IO;
    }
    snprintf(ep, sizeof ep, v6 ? "tcp://[%s]:*" : "tcp://%s:*", h);
    if (zmq_bind(s->push, ep) != 0) {
        kvp_error("ec control: bind %s: %s", ep, zmq_strerror(zmq_errno()));
        return KVP_ERR_IO;
    }
    char last[300];
    size_t n = sizeof last;
    if (zmq_getsockopt(s->push, ZMQ_LAST_ENDPOINT, last, &n) != 0)
        return KVP_ERR_IO;
    const char *colon = strrchr(last, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (port < 1 || port > 65535)
        return KVP_ERR_IO;
    s->event_port = (uint16_t)port;
    return KVP_OK;
}

static void *server_main(void *arg)
{
    kvp__ec_ctl_server_t *s = arg;
    kvp__thread_name("kvp-ec-control");
    kvp_status_t st = bind_sockets(s);
    report_start(s, st);
    if (st != KVP_OK)
        return NULL;
    int64_t last_reap = now_ms();
    while (!atomic_load(&s->stop)) {
        flush_events(s);
        int64_t now = now_ms();
        if (now - last_reap >= s->reap_ms) {
            kvp__ec_resv_expire(s->resv);
            atomic_fetch_add(&s->n_reaps, 1);
            last_reap = now;
        }
        int64_t wait = s->reap_ms - (now - last_reap);
        if (wait > POLL_MS)
            wait = POLL_MS;
        if (wait < 0)
            wait = 0;
        /* With events waiting and no peer to take them, poll for POLLOUT too
         * so they go as soon as the inbox connects. */
        zmq_pollitem_t items[3] = {{s->router, 0, ZMQ_POLLIN, 0},
                                   {NULL, s->efd, ZMQ_POLLIN, 0},
                                   {s->push, 0, ZMQ_POLLOUT, 0}};
        int rc = zmq_poll(items, s->ev_len ? 3 : 2, (long)wait);
        if (rc < 0) {
            if (zmq_errno() == ETERM)
                break;
            continue;
        }
        if (items[1].revents & ZMQ_POLLIN) {
            serve_reported(s);
            flush_events(s);
        }
        if (items[0].revents & ZMQ_POLLIN) {
            for (int i = 0; i < BATCH_PER_PASS; i++) {
                int r = serve_one(s);
                if (r <= 0) {
                    if (r < 0)
                        goto out;
                    break;
                }
                flush_events(s);
            }
        }
    }
out:
    flush_events(s);
    return NULL;
}

kvp_status_t kvp__ec_ctl_server_create(const kvp__ec_ctl_server_params_t *p, kvp__ec_ctl_server_t **s_p)
{
    if (!p || !s_p || !p->host || !p->host[0] || !p->resv || !p->dst_session || !p->slab || p->port == 0 ||
        !p->peer_ports || p->n_peers == 0 || p->reap_interval_ms <= 0 || p->max_pending_events == 0 ||
        p->start_timeout_ms <= 0 || strlen(p->host) > 255)
        return KVP_ERR_INVALID_ARG;
    *s_p = NULL;
    kvp__ec_ctl_server_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    s->host = kvp__strdup(p->host);
    s->dst_session = kvp__strdup(p->dst_session);
    s->peer_ports = kvp__malloc(p->n_peers * sizeof *s->peer_ports);
    s->evq = kvp__calloc(p->max_pending_events, sizeof *s->evq);
    if (!s->host || !s->dst_session || !s->peer_ports || !s->evq) {
        kvp__strfree(s->host);
        kvp__strfree(s->dst_session);
        kvp__free(s->peer_ports, p->n_peers * sizeof *s->peer_ports);
        kvp__free(s->evq, p->max_pending_events * sizeof *s->evq);
        kvp__free(s, sizeof *s);
        return KVP_ERR_NO_MEMORY;
    }
    memcpy(s->peer_ports, p->peer_ports, p->n_peers * sizeof *s->peer_ports);
    s->n_peers = p->n_peers;
    s->port = p->port;
    s->resv = p->resv;
    s->slab = p->slab;
    s->reap_ms = p->reap_interval_ms;
    s->max_events = p->max_pending_events;
    s->xcache = p->xcache;
    s->max_parked = p->max_parked ? p->max_parked : 4096;
    kvp__strmap_init(&s->lookups);
    kvp__list_init(&s->parked);
    pthread_mutex_init(&s->lk_mu, NULL);
    pthread_cond_init(&s->lk_cv, NULL);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    snprintf(s->addr, sizeof s->addr, strchr(p->host, ':') ? "tcp://[%s]:%u" : "tcp://%s:%u", p->host,
             (unsigned)p->port);
    kvp__ec_ctl_dec_init(&s->dec);
    kvp__jw_init(&s->out);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&s->stop, false);

    kvp_status_t st = KVP_ERR_IO;
    s->zctx = s->efd >= 0 ? zmq_ctx_new() : NULL;
    if (!s->zctx)
        goto fail;
    if (pthread_create(&s->thread, NULL, server_main, s) != 0)
        goto fail;
    s->thread_started = true;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += p->start_timeout_ms / 1000;
    dl.tv_nsec += (p->start_timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&s->mu);
    while (!s->started)
        if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT)
            break;
    int started = s->started;
    st = started ? s->start_status : KVP_ERR_IO;
    pthread_mutex_unlock(&s->mu);
    if (!started)
        kvp_error("ec control: the server on %s did not start within %" PRId64 " ms", s->addr,
                  p->start_timeout_ms);
    if (st != KVP_OK)
        goto fail;
    kvp_info("ec control listening on %s (events on port %u)", s->addr, (unsigned)s->event_port);
    *s_p = s;
    return KVP_OK;
fail:
    kvp__ec_ctl_server_destroy(s);
    return st;
}

void kvp__ec_ctl_server_destroy(kvp__ec_ctl_server_t *s)
{
    if (!s)
        return;
    atomic_store(&s->stop, true);
    if (s->thread_started)
        pthread_join(s->thread, NULL);
    /* Every lookup reports (each has a deadline); then nothing refers to s. */
    pthread_mutex_lock(&s->lk_mu);
    while (s->lk_inflight)
        pthread_cond_wait(&s->lk_cv, &s->lk_mu);
    pthread_mutex_unlock(&s->lk_mu);
    /* The map holds every lookup not yet served (those on the done list
     * included). */
    for (size_t i = 0; i < s->lookups.cap; i++)
        if (s->lookups.slots[i].key)
            lookup_free(s->lookups.slots[i].val);
    kvp__strmap_cleanup(&s->lookups);
    KVP_LIST_FOR_EACH_ENTRY_SAFE(p, tmp, &s->parked, parked_t, link) {
        unpark(s, p);
        parked_release(p);
    }
    if (s->efd >= 0)
        close(s->efd);
    pthread_mutex_destroy(&s->lk_mu);
    pthread_cond_destroy(&s->lk_cv);
    if (s->router)
        zmq_close(s->router);
    if (s->push)
        zmq_close(s->push);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    while (s->ev_len) {
        event_t *e = &s->evq[s->ev_head];
        kvp__free(e->p, e->n + 1);
        s->ev_head = (s->ev_head + 1) % s->max_events;
        s->ev_len--;
    }
    kvp__ec_ctl_dec_cleanup(&s->dec);
    kvp__jw_cleanup(&s->out);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    kvp__strfree(s->host);
    kvp__strfree(s->dst_session);
    kvp__free(s->peer_ports, s->n_peers * sizeof *s->peer_ports);
    kvp__free(s->evq, s->max_events * sizeof *s->evq);
    kvp__free(s, sizeof *s);
}

const char *kvp__ec_ctl_server_addr(const kvp__ec_ctl_server_t *s) { return s->addr; }
uint16_t kvp__ec_ctl_server_event_port(const kvp__ec_ctl_server_t *s) { return s->event_port; }

void kvp__ec_ctl_server_stats(kvp__ec_ctl_server_t *s, kvp__ec_ctl_server_stats_t *st)
{
    st->requests = atomic_load(&s->n_requests);
    st->error_replies = atomic_load(&s->n_errors);
    st->bad_envelopes = atomic_load(&s->n_bad_env);
    st->oversized = atomic_load(&s->n_oversized);
    st->events_queued = atomic_load(&s->n_ev_queued);
    st->events_sent = atomic_load(&s->n_ev_sent);
    st->events_dropped = atomic_load(&s->n_ev_dropped);
    st->events_pending = atomic_load(&s->n_ev_pending);
    st->reaps = atomic_load(&s->n_reaps);
    st->parked = atomic_load(&s->n_parked_now);
    st->parked_total = atomic_load(&s->n_parked_total);
    st->parked_over_cap = atomic_load(&s->n_parked_over);
    st->reserve_requests = atomic_load(&s->n_resv_requests); /* first: the time of these is in */
    st->busy_ns = atomic_load(&s->n_busy_ns);
    st->reserve_busy_ns = atomic_load(&s->n_resv_busy_ns);
    st->reserve_cpu_ns = atomic_load(&s->n_resv_cpu_ns);
}
