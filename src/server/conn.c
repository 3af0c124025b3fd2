/*
 * Connections: accepting them, the handshake, their life, their deadlines.
 *
 * Life of a connection (one setter, kvp__conn_set_state, checks every move
 * against the table below and keeps the counts that depend on it):
 *
 *   HELLO ------> CHALLENGED ------> READY ------> DEAD
 *     |  (v2 hello)    |  (response ok)  ^             ^
 *     |                |                 |             |
 *     +---- (v1 hello for the TCP transport, no token) +
 *     +------------------ (any failure) ---------------+
 *
 * A dead connection stays until every request it started has ended (UCX
 * may still call back with its sends and receives: ABANDON_AFTER_NS after
 * death they are given up, see kvp__conn_abandon) and its socket is closed
 * (a client that may still be copying local reads keeps it open for up to
 * LINGER_NS, see lreads.c).
 *
 * The handshake gate.  A connection in the handshake costs a descriptor and
 * nothing else (its buffer is allocated at its first byte), and there are
 * at most HS_MAX of them, HS_PER_SOURCE per peer address, each for at most
 * HS_TIMEOUT_NS.  When a new one would pass a cap, the handshake that made
 * progress least recently is dropped (from the same address when that cap
 * is the one), not the newcomer: whoever floods the port with idle sockets
 * only ever displaces their own, while a healthy client, whose messages
 * complete as soon as they arrive, always looks recent; and one that has
 * not even sent a whole hello goes before one that has.  Before a handshake
 * is dropped what it has sent is read, so a complete message waiting in its
 * socket is handled, not thrown away.  Established connections have their
 * own cap (max_conns) and, on a server without a token, a cap per peer
 * address; a client past either is answered KVP_ERR_BUSY.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "net/ucx.h"
#include "server/server_int.h"

#define ACCEPT_BATCH 32     /* connections accepted per wake-up, so their sockets get read in between */
#define FD_PAUSE_NS (100ull * 1000000ull) /* the listener rests this long when descriptors run out */

/* A peer address and how many of the connections come from it. */
struct source {
    source_t *next;
    uint32_t ip;            /* host order */
    uint32_t handshakes;    /* in HELLO or CHALLENGED */
    uint32_t established;   /* READY */
    uint32_t total;         /* every connection pointing here */
};

static source_t *source_get(server_t *s, uint32_t ip)
{
    source_t **b = &s->sources[(ip * 2654435761u) >> 24 & (SOURCE_BUCKETS - 1)];
    for (source_t *x = *b; x; x = x->next)
        if (x->ip == ip) {
            x->total++;
            return x;
        }
    source_t *x = kvp__calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->ip = ip;
    x->total = 1;
    x->next = *b;
    *b = x;
    return x;
}

static void source_put(server_t *s, source_t *x)
{
    if (!x || --x->total)
        return;
    source_t **b = &s->sources[(x->ip * 2654435761u) >> 24 & (SOURCE_BUCKETS - 1)];
    while (*b != x)
        b = &(*b)->next;
    *b = x->next;
    kvp__free(x, sizeof *x);
}

/* ---- the state machine ---- */

#define B(st) (1u << (st))
static const unsigned g_allowed[CONN_NSTATES] = {
    [CONN_HELLO] = B(CONN_CHALLENGED) | B(CONN_READY) | B(CONN_DEAD),
    [CONN_CHALLENGED] = B(CONN_READY) | B(CONN_DEAD),
    [CONN_READY] = B(CONN_DEAD),
    [CONN_DEAD] = 0,
};

static int in_handshake(conn_state_t st) { return st == CONN_HELLO || st == CONN_CHALLENGED; }

void kvp__conn_set_state(server_t *s, conn_t *c, conn_state_t to)
{
    if (!(g_allowed[c->state] & B(to))) {
        kvp_error("server: conn %llu: no transition from state %d to %d (internal error)", (unsigned long long)c->id,
                  (int)c->state, (int)to);
        return;
    }
    conn_state_t from = c->state;
    if (in_handshake(from) && !in_handshake(to)) {
        kvp__list_del(&c->hs_link);
        s->nhandshakes--;
        c->source->handshakes--;
        atomic_store(&s->ctr.handshakes, s->nhandshakes);
    }
    if (to == CONN_CHALLENGED) { /* progress: to the young end of the queue */
        kvp__list_del(&c->hs_link);
        kvp__list_add_tail(&s->handshakes, &c->hs_link);
        c->hs_progress_ns = kvp__now_ns();
    }
    if (to == CONN_READY) {
        s->nestablished++;
        c->source->established++;
    }
    if (from == CONN_READY) {
        s->nestablished--;
        c->source->established--;
    }
    if (to == CONN_DEAD)
        c->dead_since_ns = kvp__now_ns();
    c->state = to;
}

conn_t *kvp__conn_by_key(server_t *s, uint64_t key)
{
    for (conn_t *c = s->by_key[key % KEY_BUCKETS]; c; c = c->hnext)
        if (c->key == key)
            return c;
    return NULL;
}

void kvp__conn_close_fd(server_t *s, conn_t *c)
{
    kvp__lr_release_all(s, c);
    if (c->src.fd >= 0) {
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, c->src.fd, NULL);
        close(c->src.fd);
        c->src.fd = -1;
    }
}

void kvp__conn_kill(server_t *s, conn_t *c, const char *why)
{
    if (c->state == CONN_DEAD)
        return;
    if (c->state == CONN_READY)
        kvp_info_rl("server: conn %llu closed: %s", (unsigned long long)c->id, why);
    else
        kvp_info_rl("server: handshake %llu dropped: %s", (unsigned long long)c->id, why);
    kvp__conn_set_state(s, c, CONN_DEAD);
    if (c->lane)
        kvp__lane_drop(s, c);
    char b;
    ssize_t peek = c->nlgroups && c->src.fd >= 0 ? recv(c->src.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) : 0;
    if (peek > 0 || (peek < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))) {
        /* The client is alive and may be copying what it leased: tell it
         * the connection is over, and keep the leases until it closes. */
        shutdown(c->src.fd, SHUT_WR);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->src};
        epoll_ctl(s->epfd, EPOLL_CTL_MOD, c->src.fd, &ev);
        c->linger_until_ns = kvp__now_ns() + LINGER_NS;
    } else {
        kvp__conn_close_fd(s, c);
    }
    kvp__free(c->hs_buf, KVP_HS_BUF_MAX);
    c->hs_buf = NULL;
}

/* One transfer of c's leaves it for a list of the server's (its end still
 * to come from UCX), no longer counted against c. */
static void abandon_one(server_t *s, conn_t *c, kvp__list_t *link, uint64_t *inflight, kvp__list_t *to)
{
    kvp__list_del(link);
    kvp__inflight_end(s, c, inflight);
    kvp__list_add_tail(to, link);
}

void kvp__conn_abandon(server_t *s, conn_t *c)
{
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &c->replies) {
        reply_t *r = KVP_CONTAINER_OF(n, reply_t, link);
        for (uint32_t i = 0; i < r->nleases; i++)
            kvp__store_release(s->store, r->leases[i]);
        r->nleases = 0;
        r->abandoned = 1;
        r->c = NULL;
        atomic_fetch_add(&s->ctr.abandoned[0], 1);
        abandon_one(s, c, &r->link, &s->inflight_replies, &s->abandoned);
    }
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &c->in_datas) {
        in_data_t *d = KVP_CONTAINER_OF(n, in_data_t, link);
        d->c = NULL;
        abandon_one(s, c, &d->link, &s->inflight_in_data, &s->abandoned_in);
    }
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &c->puts) {
        put_ctx_t *pc = KVP_CONTAINER_OF(n, put_ctx_t, link);
        for (uint32_t i = 0; i < pc->n; i++) {
            if (!pc->resv[i])
                continue;
            if (pc->expired)
                kvp__store_expire(s->store, pc->resv[i]);
            else
                kvp__store_abort(s->store, pc->resv[i]);
            pc->resv[i] = NULL;
        }
        c->put_resv_bytes -= pc->resv_bytes;
        atomic_fetch_sub(&s->ctr.put_resv_bytes, pc->resv_bytes);
        pc->resv_bytes = 0;
        pc->abandoned = 1;
        pc->c = NULL;
        atomic_fetch_add(&s->ctr.abandoned[1], 1);
        abandon_one(s, c, &pc->link, &s->inflight_puts, &s->abandoned_puts);
    }
}

/* ---- the handshake ---- */

static void hs_send(conn_t *c, const void *buf, size_t n)
{
    /* A fresh socket's buffer holds a handshake message whole. */
    (void)!send(c->src.fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* A handshake that breaks the protocol: counted, closed. */
static void hs_bad(server_t *s, conn_t *c, const char *why)
{
    atomic_fetch_add(&s->ctr.bad_requests, 1);
    atomic_fetch_add(&s->ctr.hs_dropped[KVP_HS_DROP_BAD], 1);
    kvp__conn_kill(s, c, why);
}

/* Answers a hello or response with a refusal, in its version's format. */
static void hs_refuse(server_t *s, conn_t *c, kvp_status_t st, const char *why)
{
    uint8_t out[KVP_HS_REPLY_V2 > KVP_HS_CHALLENGE ? KVP_HS_REPLY_V2 : KVP_HS_CHALLENGE];
    uint8_t zero[KVP_HS_NONCE] = {0};
    size_t n;
    if (c->hs_version == KVP_HS_V2 && c->state == CONN_HELLO)
        n = kvp__hs_encode_challenge(out, st, 0, 0, zero);
    else
        n = kvp__hs_encode_reply(out, c->hs_version == KVP_HS_V2 ? KVP_HS_V2 : KVP_HS_V1, st, 0, NULL, NULL, 0);
    hs_send(c, out, n);
    kvp__conn_kill(s, c, why);
}

/* May c be established now?  KVP_OK, or the refusal (counted). */
static kvp_status_t hs_admit(server_t *s, conn_t *c)
{
    if (s->draining) {
        atomic_fetch_add(&s->ctr.refused[KVP_REFUSE_DRAINING], 1);
        return KVP_ERR_CLOSED;
    }
    if (s->nestablished >= s->max_conns) {
        atomic_fetch_add(&s->ctr.refused[KVP_REFUSE_MAX_CONNS], 1);
        kvp_warn_rl("server: connection refused: %u established already (--max-conns)", s->max_conns);
        return KVP_ERR_BUSY;
    }
    if (!s->p.token && c->source->established >= s->max_per_source) {
        atomic_fetch_add(&s->ctr.refused[KVP_REFUSE_PER_SOURCE], 1);
        char ip[INET_ADDRSTRLEN];
        struct in_addr a = {htonl(c->source->ip)};
        inet_ntop(AF_INET, &a, ip, sizeof ip);
        kvp_warn_rl("server: connection from %s refused: it has %u established already (--max-conns-per-source)",
                    ip, c->source->established);
        return KVP_ERR_BUSY;
    }
    return KVP_OK;
}

/* A fresh random connection key, unique among the connections. */
static kvp_status_t new_key(server_t *s, uint64_t *key_p)
{
    for (int i = 0; i < 8; i++) {
        uint64_t k;
        if (kvp__random_bytes(&k, sizeof k) != KVP_OK)
            return KVP_ERR_IO;
        if (k && !kvp__conn_by_key(s, k)) {
            *key_p = k;
            return KVP_OK;
        }
    }
    return KVP_ERR_IO;
}

/* The handshake succeeded: c serves requests from now on. */
static void hs_establish(server_t *s, conn_t *c, int lane)
{
    uint64_t key;
    if (new_key(s, &key) != KVP_OK) {
        hs_refuse(s, c, KVP_ERR_IO, "no random connection key (getrandom failed)");
        return;
    }
    c->lane = lane;
    if (lane && kvp__lane_start(s, c) != KVP_OK) {
        hs_refuse(s, c, KVP_ERR_NO_MEMORY, "out of memory");
        return;
    }
    uint8_t out[KVP_HS_REPLY_V2 + 4096];
    size_t n;
    if (c->hs_version == KVP_HS_V1) {
        /* (as version 1 always did: the worker address, even for the TCP transport) */
        n = kvp__hs_encode_reply(out, KVP_HS_V1, KVP_OK, key, NULL, s->addr,
                                 s->addr_len <= 4096 ? (uint32_t)s->addr_len : 0);
    } else {
        uint8_t mac[KVP_HS_MAC];
        kvp__hs_server_mac(s->p.token, c->hs_cnonce, c->hs_snonce, key, mac);
        n = kvp__hs_encode_reply(out, KVP_HS_V2, KVP_OK, key, mac, lane ? NULL : s->addr,
                                 lane ? 0 : (uint32_t)s->addr_len);
    }
    if (s->addr_len > 4096 || send(c->src.fd, out, n, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)n) {
        kvp__conn_kill(s, c, "handshake reply not sent");
        return;
    }
    c->key = key;
    c->hnext = s->by_key[key % KEY_BUCKETS];
    s->by_key[key % KEY_BUCKETS] = c;
    kvp__free(c->hs_buf, KVP_HS_BUF_MAX);
    c->hs_buf = NULL;
    kvp__conn_set_state(s, c, CONN_READY);
    if (lane)
        atomic_fetch_add(&s->ctr.accepted_tcp, 1);
    atomic_fetch_add(&s->ctr.accepted, 1);
    kvp_debug("server: conn %llu ready (%s)", (unsigned long long)c->id, lane ? "tcp transport" : "UCX");
}

static void hs_hello(server_t *s, conn_t *c, const kvp__hs_hello_t *h, size_t used)
{
    c->hs_version = h->version;
    if (h->version == KVP_HS_V1 && (h->addr_len || s->p.token)) {
        /* Older clients: only the TCP transport, only without a token (a
         * version-1 hello carries the token in clear, and its UCX address
         * would have to be parsed); its address bytes are never read. */
        hs_refuse(s, c, KVP_ERR_VERSION,
                  h->addr_len ? "version-1 hello with a UCX address (the client must be upgraded)"
                              : "version-1 hello to a server with a token (the client must be upgraded)");
        return;
    }
    if (used != c->hs_len) {
        hs_bad(s, c, "bytes after the hello");
        return;
    }
    if (h->version == KVP_HS_V1) {
        kvp_status_t st = hs_admit(s, c);
        if (st != KVP_OK)
            hs_refuse(s, c, st, kvp_status_str(st));
        else
            hs_establish(s, c, 1);
        return;
    }
    memcpy(c->hs_cnonce, h->nonce, KVP_HS_NONCE);
    if (s->draining) {
        atomic_fetch_add(&s->ctr.refused[KVP_REFUSE_DRAINING], 1);
        hs_refuse(s, c, KVP_ERR_CLOSED, "server shutting down");
        return;
    }
    if (kvp__random_bytes(c->hs_snonce, KVP_HS_NONCE) != KVP_OK) {
        hs_refuse(s, c, KVP_ERR_IO, "no random nonce (getrandom failed)");
        return;
    }
    uint8_t out[KVP_HS_CHALLENGE];
    uint32_t offers = (s->p.token ? KVP_HS_OFFER_TOKEN : 0) | (s->ucx_offered ? KVP_HS_OFFER_UCX : 0);
    hs_send(c, out, kvp__hs_encode_challenge(out, KVP_OK, offers, (uint32_t)geteuid(), c->hs_snonce));
    c->hs_len = 0;
    kvp__conn_set_state(s, c, CONN_CHALLENGED);
}

static void hs_response(server_t *s, conn_t *c, const kvp__hs_response_t *r, size_t used)
{
    if (used != c->hs_len) {
        hs_bad(s, c, "bytes after the response");
        return;
    }
    if (s->p.token) {
        uint8_t want[KVP_HS_MAC];
        kvp__hs_client_mac(s->p.token, c->hs_snonce, c->hs_cnonce, want);
        if (!kvp__hs_mac_eq(want, r->mac)) {
            atomic_fetch_add(&s->ctr.auth_failures, 1);
            hs_refuse(s, c, KVP_ERR_AUTH, "wrong or missing token");
            return;
        }
    }
    if (r->transport == KVP_HS_UCX && !s->ucx_offered) {
        hs_refuse(s, c, KVP_ERR_UNSUPPORTED, "asked for UCX, which this server offers no peer");
        return;
    }
    kvp_status_t st = hs_admit(s, c);
    if (st != KVP_OK) {
        hs_refuse(s, c, st, kvp_status_str(st));
        return;
    }
    hs_establish(s, c, r->transport == KVP_HS_TCP);
}

/* Reads what c's socket has of its handshake and acts on complete
 * messages.  Returns 1 if c completed one (or left the handshake). */
static int hs_read(server_t *s, conn_t *c)
{
    if (!c->hs_buf && !(c->hs_buf = kvp__malloc(KVP_HS_BUF_MAX))) {
        kvp__conn_kill(s, c, "out of memory");
        return 1;
    }
    size_t room = (c->state == CONN_HELLO ? KVP_HS_BUF_MAX : KVP_HS_RESPONSE) - c->hs_len;
    if (room == 0) {
        hs_bad(s, c, "handshake message too long");
        return 1;
    }
    ssize_t k = recv(c->src.fd, c->hs_buf + c->hs_len, room, MSG_DONTWAIT);
    if (k <= 0) {
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            kvp__conn_kill(s, c, "closed during the handshake");
            return 1;
        }
        return 0;
    }
    c->hs_len += (size_t)k;
    size_t used = 0;
    kvp_status_t st;
    if (c->state == CONN_HELLO) {
        kvp__hs_hello_t h;
        st = kvp__hs_parse_hello(c->hs_buf, c->hs_len, &h, &used);
        if (st == KVP_OK) {
            hs_hello(s, c, &h, used);
            return 1;
        }
    } else {
        kvp__hs_response_t r;
        st = kvp__hs_parse_response(c->hs_buf, c->hs_len, &r, &used);
        if (st == KVP_OK) {
            hs_response(s, c, &r, used);
            return 1;
        }
    }
    if (st == KVP_INPROGRESS)
        return 0;
    if (st == KVP_ERR_VERSION) {
        /* an unknown version: answered in version 1's format, which every
         * kvpool client reads */
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        atomic_fetch_add(&s->ctr.hs_dropped[KVP_HS_DROP_BAD], 1);
        c->hs_version = KVP_HS_V1;
        hs_refuse(s, c, KVP_ERR_VERSION, "unsupported handshake version");
    } else {
        hs_bad(s, c, "not a kvpool handshake");
    }
    return 1;
}

/* The handshake to drop to make room (from src, if given): one that has
 * not even completed its hello, least recent first; else the challenged
 * one that progressed least recently. */
static conn_t *hs_victim(server_t *s, const source_t *src)
{
    conn_t *challenged = NULL;
    KVP_LIST_FOR_EACH(n, &s->handshakes) {
        conn_t *c = KVP_CONTAINER_OF(n, conn_t, hs_link);
        if (src && c->source != src)
            continue;
        if (c->state == CONN_HELLO)
            return c;
        if (!challenged)
            challenged = c;
    }
    return challenged;
}

static int hs_over(const server_t *s, const source_t *src)
{
    return s->nhandshakes >= HS_MAX || src->handshakes >= HS_PER_SOURCE;
}

/* Makes room for one more handshake from src. */
static void hs_make_room(server_t *s, source_t *src)
{
    for (int tries = 0; tries < 2 * (int)HS_PER_SOURCE && hs_over(s, src); tries++) {
        conn_t *v = hs_victim(s, src->handshakes >= HS_PER_SOURCE ? src : NULL);
        if (!v)
            return;
        /* What it sent first: a message complete in its socket is handled. */
        if (hs_read(s, v))
            continue;
        atomic_fetch_add(&s->ctr.hs_dropped[KVP_HS_DROP_DISPLACED], 1);
        kvp__conn_kill(s, v, "displaced by newer handshakes (too many in progress)");
    }
}

void kvp__on_accept(server_t *s)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        struct sockaddr_in sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(s->listen_src.fd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            /* Out of descriptors (or memory): the listener stays readable, so
             * it rests a moment instead of spinning the loop. */
            atomic_fetch_add(&s->ctr.refused[KVP_REFUSE_FDS], 1);
            kvp_warn_rl("server: cannot accept connections: %s; pausing the listener for %llu ms", strerror(errno),
                        (unsigned long long)(FD_PAUSE_NS / 1000000ull));
            kvp__listen_pause(s, kvp__now_ns() + FD_PAUSE_NS);
            return;
        }
        if (s->draining) {
            atomic_fetch_add(&s->ctr.refused[KVP_REFUSE_DRAINING], 1);
            close(fd);
            continue;
        }
        uint32_t ip = sa.sin_family == AF_INET ? ntohl(sa.sin_addr.s_addr) : 0;
        source_t *src = source_get(s, ip);
        conn_t *c = src ? kvp__calloc(1, sizeof *c) : NULL;
        if (!c) {
            source_put(s, src);
            close(fd);
            continue;
        }
        hs_make_room(s, src);
        struct sockaddr_in me;
        socklen_t ml = sizeof me;
        c->peer_local = (ip >> 24) == 127 ||
                        (getsockname(fd, (struct sockaddr *)&me, &ml) == 0 && ntohl(me.sin_addr.s_addr) == ip);
        c->src = (evsrc_t){SRC_CONN, fd};
        c->source = src;
        c->state = CONN_HELLO;
        c->id = ++s->next_conn_id;
        uint64_t now = kvp__now_ns();
        c->hs_deadline_ns = now + HS_TIMEOUT_NS;
        c->hs_progress_ns = now;
        kvp__list_init(&c->replies);
        kvp__list_init(&c->puts);
        kvp__list_init(&c->in_datas);
        kvp__list_init(&c->tx);
        kvp__list_init(&c->lgroups);
        kvp__list_add_tail(&s->conns, &c->link);
        kvp__list_add_tail(&s->handshakes, &c->hs_link);
        s->nhandshakes++;
        src->handshakes++;
        s->nconns++;
        atomic_store(&s->ctr.connections, s->nconns);
        atomic_store(&s->ctr.handshakes, s->nhandshakes);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = &c->src};
        epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev);
    }
}

void kvp__on_conn_event(server_t *s, conn_t *c, uint32_t events)
{
    if (c->src.fd < 0)
        return; /* (closed earlier in this batch of events) */
    if (c->state == CONN_DEAD) {
        /* Lingering (see kvp__conn_kill): wait for the client's close. */
        char junk[4096];
        ssize_t k = recv(c->src.fd, junk, sizeof junk, MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) || (events & (EPOLLHUP | EPOLLERR)))
            kvp__conn_close_fd(s, c);
        return;
    }
    if (in_handshake(c->state)) {
        (void)hs_read(s, c);
        return;
    }
    if (c->lane) {
        kvp__lane_event(s, c, events);
        return;
    }
    /* UCX: nothing may arrive on the socket; EOF means the client died. */
    char junk[256];
    ssize_t k = recv(c->src.fd, junk, sizeof junk, MSG_DONTWAIT);
    if (k == 0 || (events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)))
        kvp__conn_kill(s, c, "client closed its connection");
    else if (k > 0)
        kvp__conn_kill(s, c, "unexpected bytes on the control socket");
}

static void conn_free(server_t *s, conn_t *c)
{
    kvp__list_del(&c->link);
    conn_t **hp = &s->by_key[c->key % KEY_BUCKETS];
    while (*hp && *hp != c)
        hp = &(*hp)->hnext;
    if (*hp)
        *hp = c->hnext;
    source_put(s, c->source);
    s->nconns--;
    atomic_store(&s->ctr.connections, s->nconns);
    kvp__free(c, sizeof *c);
}

/* A UCX put whose values have not arrived by its deadline. */
static int ucx_put_late(const conn_t *c, uint64_t now)
{
    KVP_LIST_FOR_EACH(n, &c->puts) {
        put_ctx_t *pc = KVP_CONTAINER_OF(n, put_ctx_t, link);
        if (now > pc->deadline_ns)
            return 1;
    }
    return 0;
}

void kvp__reap_conns(server_t *s, int check_deadlines)
{
    uint64_t now = kvp__now_ns();
    if (check_deadlines)
        kvp__lr_reap(s, now);
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &s->conns) {
        conn_t *c = KVP_CONTAINER_OF(n, conn_t, link);
        if (check_deadlines && in_handshake(c->state) && now > c->hs_deadline_ns) {
            atomic_fetch_add(&s->ctr.hs_dropped[KVP_HS_DROP_TIMEOUT], 1);
            kvp__conn_kill(s, c, "handshake timed out");
        }
        if (check_deadlines && c->state == CONN_READY && c->lane)
            kvp__lane_check(s, c, now);
        if (check_deadlines && c->state == CONN_READY && !c->lane && ucx_put_late(c, now)) {
            KVP_LIST_FOR_EACH(p, &c->puts)
                KVP_CONTAINER_OF(p, put_ctx_t, link)->expired = 1;
            atomic_fetch_add(&s->ctr.put_expired, 1);
            kvp__conn_kill(s, c, "a put's values did not arrive within put_timeout or the request's timeout");
        }
        if (c->state == CONN_DEAD && c->ep) {
            /* Started, not waited for: a dead peer never lets it flush
             * (what is outstanding on it is given up below). */
            ucp_ep_h ep = c->ep;
            c->ep = NULL;
            (void)kvp__ucx_ep_close(s->worker, ep, 0);
        }
        if (c->state == CONN_DEAD &&
            (!kvp__list_empty(&c->replies) || !kvp__list_empty(&c->puts) || !kvp__list_empty(&c->in_datas)) &&
            now - c->dead_since_ns > ABANDON_AFTER_NS) {
            kvp_warn_rl("server: conn %llu: %llu transfer(s) with the departed peer never completed; "
                        "giving them up", (unsigned long long)c->id, (unsigned long long)c->inflight);
            kvp__conn_abandon(s, c);
        }
        if (c->state == CONN_DEAD && c->src.fd >= 0 && check_deadlines && now > c->linger_until_ns) {
            kvp_warn_rl("server: conn %llu: its client never closed; releasing %u local read(s)",
                        (unsigned long long)c->id, c->nlgroups);
            kvp__conn_close_fd(s, c);
        }
        if (c->state == CONN_DEAD && c->inflight == 0 && c->src.fd < 0)
            conn_free(s, c);
    }
}

void kvp__conns_init(server_t *s)
{
    kvp__list_init(&s->conns);
    kvp__list_init(&s->handshakes);
    kvp__list_init(&s->abandoned);
    kvp__list_init(&s->abandoned_puts);
    kvp__list_init(&s->abandoned_in);
}

void kvp__conns_destroy(server_t *s)
{
    KVP_LIST_FOR_EACH(n, &s->conns) {
        conn_t *c = KVP_CONTAINER_OF(n, conn_t, link);
        kvp__conn_kill(s, c, "server stopping");
        kvp__conn_close_fd(s, c); /* (a lingering one too: the process ends) */
        c->ep = NULL;             /* (ends with the worker) */
        kvp__conn_abandon(s, c);
    }
    kvp__reap_conns(s, 0);
}
