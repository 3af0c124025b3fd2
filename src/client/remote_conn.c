/*
 * The connection's life (remote_int.h has the states).  A handle is IDLE
 * until an op needs the server; that op's thread takes conn_mu and
 * connects (CONNECTING: the handshake on the TCP socket, then a UCX
 * endpoint or the lane), and the connection is READY once the handshake is
 * done (the HELLO that follows is already posted on it).  A failed attempt
 * leaves it IDLE, and the next attempt waits out an exponential backoff
 * (100 ms .. 5 s).  A READY connection that breaks (endpoint error, socket
 * closed, a request past its deadline, a worker replacement, a failed
 * HELLO) is retired: handed, with its endpoint, socket and the count of
 * threads still sending on it, to the dead list, and the handle is IDLE
 * again with gen bumped.  The progress thread closes a dead connection once
 * nobody sends on it and then fails its requests.  kvp_pool_close retires a
 * READY connection gracefully (flushing) and leaves the handle CLOSED.
 *
 *   IDLE       -> CONNECTING | CLOSED
 *   CONNECTING -> READY | IDLE (failed)
 *   READY      -> IDLE (retired)
 *   CLOSED: none
 *
 * The worker's own life (replacing) is not the connection's: a lane
 * connection stays READY while the UCX worker is replaced, and no
 * connection is begun meanwhile.
 */
#include "client/remote_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/handshake.h"
#include "net/ucx_addr.h"

#define RC_S(s) (1u << (s))
static const uint8_t g_allowed[RCONN_NUM_STATES] = {
    [RCONN_IDLE] = RC_S(RCONN_CONNECTING) | RC_S(RCONN_CLOSED),
    [RCONN_CONNECTING] = RC_S(RCONN_READY) | RC_S(RCONN_IDLE),
    [RCONN_READY] = RC_S(RCONN_IDLE),
    [RCONN_CLOSED] = 0,
};

static const char *const g_state_names[RCONN_NUM_STATES] = {"IDLE", "CONNECTING", "READY", "CLOSED"};

const char *kvp__remote_cstate_name(rconn_state_t s)
{
    return (unsigned)s < RCONN_NUM_STATES ? g_state_names[s] : "UNKNOWN";
}

kvp_status_t kvp__remote_do_set_cstate(remote_t *r, rconn_state_t to)
{
    if ((unsigned)to >= RCONN_NUM_STATES || !(g_allowed[r->cstate] & RC_S(to))) {
        kvp_error("remote: connection to %s:%u: %s -> %s refused", r->host, r->port,
                  kvp__remote_cstate_name(r->cstate), kvp__remote_cstate_name(to));
        return KVP_ERR_STATE;
    }
    r->cstate = to;
    return KVP_OK;
}

/* Hands the current connection to the progress thread to close (mu held). */
void kvp__remote_do_retire(remote_t *r, int graceful)
{
    dead_t *d = kvp__calloc(1, sizeof *d);
    if (d) {
        *d = (dead_t){r->dead, r->ep, r->tcp_fd, r->gen, graceful, r->senders};
        r->dead = d;
    } else {
        kvp_error("remote: out of memory retiring a connection; its endpoint is leaked");
    }
    (void)kvp__remote_do_set_cstate(r, RCONN_IDLE);
    r->senders = 0;
    r->gen++;
    r->nrel = 0; /* the connection's leases end with it */
    r->ep = NULL;
    r->tcp_fd = -1;
}

/* Marks the connection broken (mu held); the progress thread closes it. */
void kvp__remote_do_disconnect(remote_t *r, const char *why)
{
    if (!kvp__remote_do_ready(r))
        return;
    kvp_warn("remote: connection to %s:%u lost (%s)", r->host, r->port, why);
    kvp__remote_do_retire(r, 0);
}

/* A thread starts using the connection of generation gen (mu held): it
 * stays open until do_sent.  0 if it is closed already. */
int kvp__remote_do_hold(remote_t *r, int gen)
{
    if (gen == r->gen) {
        if (!kvp__remote_do_ready(r))
            return 0;
        r->senders++;
        return 1;
    }
    for (dead_t *d = r->dead; d; d = d->next)
        if (d->gen == gen) {
            d->senders++;
            return 1;
        }
    return 0;
}

/* A thread is done sending on the connection of generation gen (mu held). */
void kvp__remote_do_sent(remote_t *r, int gen)
{
    if (gen == r->gen) {
        r->senders--;
        return;
    }
    for (dead_t *d = r->dead; d; d = d->next)
        if (d->gen == gen) {
            d->senders--;
            return;
        }
}

/* ---- connection teardown and deadlines (progress thread) ---- */

/* Fails requests (progress thread): those of generation gen whose reply has
 * not come (the forced close has completed their sends), or, with stranded,
 * those still waiting for a receive their (destroyed) worker never ends. */
void kvp__remote_fail_requests(remote_t *r, int gen, int stranded)
{
    opctx_t *done[64];
    int again = 1;
    while (again) {
        int nd = 0;
        again = 0;
        pthread_mutex_lock(&r->mu);
        for (int b = 0; b < KVP_REMOTE_NBUCKETS && !again; b++) {
            for (pending_t *p = r->bucket[b], *next; p; p = next) {
                next = p->next;
                if (p->state == PEND_DONE || (stranded ? !kvp__remote_receiving(p) : p->gen != gen))
                    continue;
                opctx_t *f;
                if (stranded) {
                    kvp_warn("remote: request %llu: its values never arrived", (unsigned long long)p->req_id);
                    p->status = p->timed_out ? KVP_ERR_TIMEOUT : KVP_ERR_CONN_LOST;
                    f = kvp__remote_do_advance(r, p, PEV_ABANDON);
                } else {
                    /* (a receive or copy under way ends it, with this status) */
                    f = kvp__remote_do_lost(r, p, KVP_ERR_CONN_LOST);
                }
                if (f) {
                    done[nd++] = f;
                    if (nd == 64) {
                        again = 1;
                        break;
                    }
                }
            }
        }
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < nd; i++)
            kvp__remote_fire(done[i]);
    }
}

void kvp__remote_check_deadlines(remote_t *r)
{
    uint64_t now = kvp__now_ns();
    pthread_mutex_lock(&r->mu);
    int expired = 0, stranded = 0;
    for (int b = 0; b < KVP_REMOTE_NBUCKETS; b++)
        for (pending_t *p = r->bucket[b]; p; p = p->next) {
            if (kvp__remote_reply_open(p) && p->deadline_ns && now > p->deadline_ns) {
                p->timed_out = 1;
                expired = 1;
            }
            /* a receive its lost connection never ended: only a new worker
             * guarantees UCX writes no more into the caller's buffers */
            if (kvp__remote_receiving(p) && p->gen != r->gen && now > p->deadline_ns + 2000000000ull)
                stranded = 1;
        }
    if (expired)
        kvp__remote_do_disconnect(r, "a request timed out; resetting the connection");
    if (stranded && !r->replace_req) {
        kvp_warn("remote: a receive on a lost connection never ended; replacing the UCX worker");
        r->replace_req = 1;
    }
    pthread_mutex_unlock(&r->mu);
}

/* Closes one lost connection nobody sends on any more and fails its
 * requests (progress thread).  Returns 1 if it did. */
int kvp__remote_reap_dead(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    dead_t *d = NULL, **dp = &r->dead;
    while (*dp && (*dp)->senders > 0)
        dp = &(*dp)->next;
    if (*dp) {
        d = *dp;
        *dp = d->next;
    }
    pthread_mutex_unlock(&r->mu);
    if (!d)
        return 0;
    /* Endpoint first, socket second: when the server sees the socket
     * close, this side no longer reads or writes its memory. */
    if (d->ep)
        (void)kvp__ucx_ep_close(r->worker, d->ep, d->graceful ? 2000 : 0);
    if (d->fd >= 0) {
        epoll_ctl(r->epfd, EPOLL_CTL_DEL, d->fd, NULL);
        /* No lane reader is using the socket when it closes. */
        pthread_mutex_lock(&r->tx_mu);
        pthread_mutex_lock(&r->rx_mu);
        close(d->fd);
        pthread_mutex_unlock(&r->rx_mu);
        pthread_mutex_unlock(&r->tx_mu);
    }
    kvp__remote_fail_requests(r, d->gen, 0);
    kvp__free(d, sizeof *d);
    return 1;
}

/* The endpoint to the server's worker address, which is checked first
 * (UCX would parse it unchecked). */
static kvp_status_t ucx_endpoint(remote_t *r, const kvp__hs_result_t *hs, int quiet, ucp_ep_h *ep_p)
{
    ucp_address_t *my = NULL;
    size_t my_len = 0;
    if (ucp_worker_get_address(r->worker, &my, &my_len) != UCS_OK)
        return KVP_ERR_IO;
    const char *why = NULL;
    kvp_status_t st = kvp__ucx_addr_check(hs->addr, hs->addr_len, my, my_len, &why);
    ucp_worker_release_address(r->worker, my);
    if (st != KVP_OK) {
        if (quiet)
            kvp_info("remote: %s:%u's UCX address refused (%s); using kvpool's TCP transport", r->host, r->port, why);
        else
            kvp_error("remote: %s:%u's UCX address refused: %s", r->host, r->port, why);
        return KVP_ERR_UNSUPPORTED;
    }
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = hs->addr,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = kvp__remote_on_ep_error, .arg = r},
    };
    ucs_status_t us = ucp_ep_create(r->worker, &ep, ep_p);
    if (us != UCS_OK) {
        if (quiet)
            kvp_info("remote: no UCX endpoint to %s:%u (%s); using kvpool's TCP transport", r->host, r->port,
                     ucs_status_string(us));
        else
            kvp_error("remote: UCX endpoint to %s:%u: %s", r->host, r->port, ucs_status_string(us));
        return KVP_ERR_UNSUPPORTED;
    }
    return KVP_OK;
}

static kvp_status_t connect_locked(remote_t *r, uint32_t timeout_ms)
{
    /* The worker may not be replaced while this connects on it. */
    int wl = kvp__remote_wlock_rd(&r->wlock);
    pthread_mutex_lock(&r->mu);
    int refused = r->replacing || kvp__remote_do_set_cstate(r, RCONN_CONNECTING) != KVP_OK;
    pthread_mutex_unlock(&r->mu);
    if (refused) {
        kvp__remote_wunlock(&r->wlock, wl);
        return KVP_ERR_CONN_LOST;
    }
    kvp__hs_want_t want = r->use_lane ? KVP_HS_WANT_TCP
                          : r->transport == KVP_REMOTE_UCX ? KVP_HS_WANT_UCX_ONLY
                                                          : KVP_HS_WANT_UCX;
    kvp__hs_result_t hs;
    kvp_status_t st = kvp__hs_client(r->host, r->port, r->token, want, timeout_ms, &hs);
    ucp_ep_h h = NULL;
    if (st == KVP_OK && hs.transport == KVP_HS_UCX) {
        st = ucx_endpoint(r, &hs, want == KVP_HS_WANT_UCX, &h);
        kvp__free(hs.addr, hs.addr_len);
        if (st != KVP_OK) {
            close(hs.fd);
            /* transport=auto: the server is still there, over TCP */
            if (want == KVP_HS_WANT_UCX)
                st = kvp__hs_client(r->host, r->port, r->token, KVP_HS_WANT_TCP, timeout_ms, &hs);
        }
    }
    if (st != KVP_OK) {
        pthread_mutex_lock(&r->mu);
        (void)kvp__remote_do_set_cstate(r, RCONN_IDLE);
        pthread_mutex_unlock(&r->mu);
        kvp__remote_wunlock(&r->wlock, wl);
        return st;
    }
    int fd = hs.fd, lane = hs.transport == KVP_HS_TCP;
    uint64_t key = hs.conn_key;
    pthread_mutex_lock(&r->mu);
    r->ep = h;
    r->tcp_fd = fd;
    r->conn_key = key;
    atomic_store(&r->lane, lane);
    (void)kvp__remote_do_set_cstate(r, RCONN_READY);
    int my_gen = r->gen;
    pthread_mutex_unlock(&r->mu);
    kvp__remote_wunlock(&r->wlock, wl); /* (the replacer retires this connection if it waited) */
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd};
    epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev);
    kvp__remote_wake(r);
    /* A ping: proves the data path works and learns the limits. */
    pending_t *p = NULL;
    kvp_status_t s = kvp__remote_run_request(r, KVP_WOP_HELLO, key, NULL, &p);
    if (s == KVP_OK)
        r->max_value = p->hello.max_value;
    if (s == KVP_OK && !lane && r->local_reads && p->hello.has_arena)
        kvp__lread_setup(r, my_gen, key, &p->hello.arena);
    if (p)
        kvp__remote_pending_free(p);
    if (s != KVP_OK) {
        kvp_error("remote: %s:%u does not answer over %s: %s", r->host, r->port,
                  lane ? "the TCP transport" : "UCX", kvp_status_str(s));
        pthread_mutex_lock(&r->mu);
        if (r->tcp_fd == fd)
            kvp__remote_do_disconnect(r, "ping failed");
        pthread_mutex_unlock(&r->mu);
        kvp__remote_wake(r);
        return s == KVP_ERR_TIMEOUT ? KVP_ERR_TIMEOUT : KVP_ERR_CONN_REFUSED;
    }
    kvp_info("remote: connected to %s:%u (%s)", r->host, r->port, lane ? "kvpool TCP transport" : "UCX");
    if (!lane && kvp__log_enabled(KVP_LOG_INFO)) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f) {
            ucp_ep_print_info(h, f);
            fclose(f);
            for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
                if (strstr(line, "lane["))
                    kvp_info("remote: %s", line);
            free(text);
        }
    }
    return KVP_OK;
}

/* See remote_int.h. */
kvp_status_t kvp__remote_ensure_connected(remote_t *r, uint32_t timeout_ms)
{
    pthread_mutex_lock(&r->mu);
    int ok = kvp__remote_do_ready(r);
    pthread_mutex_unlock(&r->mu);
    if (ok)
        return KVP_OK;
    if (!timeout_ms || timeout_ms > r->timeout_ms)
        timeout_ms = r->timeout_ms;
    uint64_t until = kvp__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    /* Another thread's connect holds conn_mu for as long as its handshake
     * takes: wait for it no longer than this op may. */
    struct timespec abs = {.tv_sec = (time_t)(until / 1000000000ull), .tv_nsec = (long)(until % 1000000000ull)};
    if (pthread_mutex_clocklock(&r->conn_mu, CLOCK_MONOTONIC, &abs) != 0)
        return KVP_ERR_TIMEOUT;
    pthread_mutex_lock(&r->mu);
    /* A worker being replaced is back within a few seconds: wait for it
     * (within the op's time) rather than fail. */
    /* (not from inside the worker's progress: the replacement waits for that) */
    while (r->replacing && !r->stop && kvp__remote_t_wlock_held != &r->wlock && kvp__now_ns() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    ok = kvp__remote_do_ready(r);
    uint64_t retry = r->next_retry_ns;
    int replacing = r->replacing;
    pthread_mutex_unlock(&r->mu);
    kvp_status_t st = KVP_OK;
    if (!ok) {
        uint64_t now = kvp__now_ns();
        if (now < retry || replacing) {
            st = KVP_ERR_CONN_LOST;
        } else if (now >= until) {
            st = KVP_ERR_TIMEOUT;
        } else {
            st = connect_locked(r, (uint32_t)((until - now + 999999u) / 1000000u));
            pthread_mutex_lock(&r->mu);
            if (st == KVP_OK) {
                r->backoff_ms = 0;
            } else {
                r->backoff_ms = r->backoff_ms ? (r->backoff_ms * 2 > 5000 ? 5000 : r->backoff_ms * 2) : 100;
                r->next_retry_ns = kvp__now_ns() + (uint64_t)r->backoff_ms * 1000000ull;
            }
            pthread_mutex_unlock(&r->mu);
        }
    }
    pthread_mutex_unlock(&r->conn_mu);
    return st;
}
