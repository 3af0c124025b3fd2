/*
 * The UCX side of the kvpool:// backend: the worker lock, the callbacks
 * UCX runs (send and receive completions, replies, endpoint errors), worker
 * replacement and the progress thread (remote.c's opening comment).
 */
#include "client/remote_int.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"

/* ---- the worker lock ----
 * Readers use the worker (drive it, send on its endpoints, connect on it);
 * the one writer replaces it.  Writers are preferred, or a stream of
 * driving callers would keep the replacement out forever; so a thread that
 * already reads (a completion callback that posts the next request) must
 * not take it again: the depth is kept per thread. */
__thread const void *kvp__remote_t_wlock_held;
static __thread int t_wlock_depth;

/* Returns what wunlock() needs to know. */
int kvp__remote_wlock_rd(pthread_rwlock_t *l)
{
    if (kvp__remote_t_wlock_held == l) {
        t_wlock_depth++;
        return 0;
    }
    pthread_rwlock_rdlock(l);
    if (kvp__remote_t_wlock_held)
        return 2; /* another remote's lock is held too: not tracked */
    kvp__remote_t_wlock_held = l;
    t_wlock_depth = 1;
    return 1;
}

void kvp__remote_wunlock(pthread_rwlock_t *l, int how)
{
    if (how == 0) {
        t_wlock_depth--;
        return;
    }
    if (how == 1)
        kvp__remote_t_wlock_held = NULL;
    pthread_rwlock_unlock(l);
}

/* ---- UCX callbacks (progress thread) ---- */

/* Takes a callback argument for request id (mu not held); NULL: no memory. */
cbarg_t *kvp__remote_cb_arg(remote_t *r, uint64_t id)
{
    pthread_mutex_lock(&r->mu);
    cbarg_t *a = r->cb_free;
    if (a) {
        r->cb_free = a->next_free;
    } else if ((a = kvp__calloc(1, sizeof *a))) {
        a->next_all = r->cb_all;
        r->cb_all = a;
    }
    if (a) {
        a->r = r;
        a->id = id;
    }
    pthread_mutex_unlock(&r->mu);
    return a;
}

/* Gives a back (mu held). */
void kvp__remote_do_cb_put(remote_t *r, cbarg_t *a)
{
    a->next_free = r->cb_free;
    r->cb_free = a;
}

void kvp__remote_on_send_done(void *request, ucs_status_t status, void *user_data)
{
    cbarg_t *a = user_data;
    remote_t *r = a->r;
    uint64_t id = a->id;
    pthread_mutex_lock(&r->mu);
    kvp__remote_do_cb_put(r, a);
    pending_t *p = kvp__remote_do_find(r, id);
    opctx_t *f = NULL;
    if (p && status != UCS_OK) {
        if (status != UCS_ERR_CANCELED)
            kvp_warn("remote: request %llu not sent: %s", (unsigned long long)id, ucs_status_string(status));
        f = kvp__remote_do_lost(r, p, KVP_ERR_CONN_LOST);
    } else if (p) {
        f = kvp__remote_do_advance(r, p, PEV_SENT);
    }
    pthread_mutex_unlock(&r->mu);
    kvp__remote_fire(f);
    if (request)
        ucp_request_free(request);
}

/* The receive of request id's values ended (mu held; unlocks): st, if
 * not OK, is its status unless it already failed otherwise. */
static void do_recv_end(remote_t *r, uint64_t id, kvp_status_t st)
{
    pending_t *p = kvp__remote_do_find(r, id);
    opctx_t *f = NULL;
    if (p) {
        if (st != KVP_OK && p->status == KVP_OK)
            p->status = st;
        f = kvp__remote_do_advance(r, p, PEV_REPLIED);
    }
    pthread_mutex_unlock(&r->mu);
    kvp__remote_fire(f);
}

static void on_recv_done(void *request, ucs_status_t status, size_t length, void *user_data)
{
    (void)length;
    cbarg_t *a = user_data;
    remote_t *r = a->r;
    uint64_t id = a->id;
    pthread_mutex_lock(&r->mu);
    kvp__remote_do_cb_put(r, a);
    do_recv_end(r, id, status == UCS_OK ? KVP_OK : KVP_ERR_CONN_LOST);
    if (request)
        ucp_request_free(request);
}


static ucs_status_t on_reply(void *arg, const void *header, size_t header_length, void *data,
                             size_t length, const ucp_am_recv_param_t *param)
{
    remote_t *r = arg;
    kvp__wire_reply_t rep;
    pending_t *p = kvp__remote_match_reply(r, header, header_length, &rep);
    if (!p)
        return UCS_OK;
    kvp_status_t st = kvp__remote_reply_parse(p, &rep, length);
    if (p->wop == KVP_WOP_GET_LOCAL) {
        kvp__lread_finish(r, p, st);
        return UCS_OK;
    }
    opctx_t *f = NULL;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    if (st != KVP_OK || p->wop != KVP_WOP_GET || length == 0 || !rndv) {
        if (st == KVP_OK && p->wop == KVP_WOP_GET && length) {
            const char *src = data;
            for (uint32_t i = 0; i < p->niov; i++) {
                memcpy(p->iov[i].buffer, src, p->iov[i].length);
                src += p->iov[i].length;
            }
        }
        p->status = st;
        f = kvp__remote_do_advance(r, p, PEV_REPLIED);
        pthread_mutex_unlock(&r->mu);
        kvp__remote_fire(f);
        return UCS_OK;
    }
    /* Rendezvous: let UCX move the values straight into the caller's buffers.
     * Until that receive ends, nothing else may finish the op: UCX may
     * still be writing into the caller's buffers (even after the endpoint
     * was force-closed: a CMA copy already queued still runs). */
    uint64_t id = p->req_id;
    ucp_dt_iov_t *iov = p->iov;
    uint32_t niov = p->niov;
    (void)kvp__remote_do_advance(r, p, PEV_RECV); /* (never DONE) */
    pthread_mutex_unlock(&r->mu);
    cbarg_t *a = kvp__remote_cb_arg(r, id);
    ucp_request_param_t prm = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_DATATYPE,
        .cb.recv_am = on_recv_done,
        .user_data = a,
    };
    void *buf = iov;
    size_t count = niov;
    if (niov == 1) {
        prm.datatype = ucp_dt_make_contig(1);
        buf = iov[0].buffer;
        count = iov[0].length;
    } else {
        prm.datatype = ucp_dt_make_iov();
    }
    if (!a) { /* no memory: the values are dropped, the op fails */
        pthread_mutex_lock(&r->mu);
        do_recv_end(r, id, KVP_ERR_NO_MEMORY);
        return UCS_OK;
    }
    ucs_status_ptr_t sp = ucp_am_recv_data_nbx(r->worker, data, buf, count, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp))
        on_recv_done(NULL, sp ? UCS_PTR_STATUS(sp) : UCS_OK, count, a);
    return UCS_OK;
}

void kvp__remote_on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    remote_t *r = arg;
    pthread_mutex_lock(&r->mu);
    if (ep == r->ep)
        kvp__remote_do_disconnect(r, ucs_status_string(status));
    pthread_mutex_unlock(&r->mu);
}

/* Gives the current worker the reply handler and a place in epfd. */
kvp_status_t kvp__remote_worker_setup(remote_t *r)
{
    r->wfd = -1;
    if (kvp__ucx_am_handler(r->worker, KVP_AM_REPLY, on_reply, r) != UCS_OK ||
        ucp_worker_get_efd(r->worker, &r->wfd) != UCS_OK)
        return KVP_ERR_IO;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = r->wfd};
    epoll_ctl(r->epfd, EPOLL_CTL_ADD, r->wfd, &ev);
    return KVP_OK;
}


/* The worker has had events for a while that its progress cannot take: a
 * server killed in the middle of writing a reply into this process's
 * shared-memory FIFO leaves a slot that is never completed, and every reply
 * behind it waits forever (docs/transport.md §8).  Replaces the worker
 * (progress thread): the UCX connection is retired, and the next call
 * connects from the new worker. */
static void replace_worker(remote_t *r, int stuck)
{
    if (stuck)
        kvp_warn("remote: UCX worker stuck (events it cannot progress for 1 s, likely a server killed "
                 "mid-message); replacing it");
    for (;;) {
        pthread_mutex_lock(&r->mu);
        r->replacing = 1;
        if (kvp__remote_do_ready(r) && !atomic_load(&r->lane))
            kvp__remote_do_disconnect(r, "the UCX worker is being replaced");
        pthread_mutex_unlock(&r->mu);
        for (;;) { /* every endpoint of this worker closed */
            if (kvp__remote_reap_dead(r))
                continue;
            pthread_mutex_lock(&r->mu);
            int left = r->dead != NULL;
            pthread_mutex_unlock(&r->mu);
            if (!left)
                break;
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        /* Receives in flight end (CMA copies finish, or fail) before the
         * worker goes: 2 s at most. */
        uint64_t until = kvp__now_ns() + 2000000000ull;
        for (;;) {
            pthread_mutex_lock(&r->mu);
            uint64_t n = r->recv_active;
            pthread_mutex_unlock(&r->mu);
            if (!n || kvp__now_ns() > until)
                break;
            int wl = kvp__remote_wlock_rd(&r->wlock);
            ucp_worker_progress(r->worker);
            kvp__remote_wunlock(&r->wlock, wl);
        }
        pthread_rwlock_wrlock(&r->wlock);
        pthread_mutex_lock(&r->mu);
        int clean = !(kvp__remote_do_ready(r) && !atomic_load(&r->lane)) && !r->dead;
        pthread_mutex_unlock(&r->mu);
        if (clean)
            break;
        pthread_rwlock_unlock(&r->wlock); /* a connect slipped in: again */
    }
    epoll_ctl(r->epfd, EPOLL_CTL_DEL, r->wfd, NULL);
    ucp_worker_destroy(r->worker); /* no receive of it can write any more */
    r->worker = NULL;
    kvp__remote_fail_requests(r, 0, 1); /* receives it never ended */
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_MULTI};
    if (ucp_worker_create(r->ctx, &wp, &r->worker) != UCS_OK || kvp__remote_worker_setup(r) != KVP_OK)
        kvp_error("remote: cannot create a new UCX worker; UCX connections will fail");
    pthread_rwlock_unlock(&r->wlock);
    pthread_mutex_lock(&r->mu);
    r->replacing = r->worker == NULL; /* without a worker, stay unconnectable */
    r->replaced++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* GET_LOCALs the server was too busy for go again, as plain GETs
 * (progress thread). */
static void run_reposts(remote_t *r)
{
    pthread_mutex_lock(&r->mu);
    pending_t *list = r->reposts;
    r->reposts = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        pending_t *p = list;
        list = p->next;
        opctx_t *oc = p->parent;
        uint32_t off = p->off, cnt = p->cnt;
        kvp__remote_pending_free(p);
        kvp_status_t st = kvp__remote_post_slice(r, oc, KVP_WOP_GET, off, cnt, 0, 0);
        if (st == KVP_INPROGRESS)
            continue;
        pthread_mutex_lock(&r->mu);
        if (oc->status == KVP_OK)
            oc->status = st;
        for (uint32_t k = off; k < off + cnt; k++)
            oc->op->results[k].status = st;
        opctx_t *f = --oc->left == 0 ? oc : NULL;
        pthread_mutex_unlock(&r->mu);
        kvp__remote_fire(f);
    }
}

void *kvp__remote_progress_main(void *arg)
{
    remote_t *r = arg;
    kvp__thread_name("kvp-client-prog");
    uint64_t last_check = 0, spin_until = 0;
    kvp__ucx_armer_t armer = {0};
    for (;;) {
        int did = 0;
        if (!r->worker) { /* replacing it failed: only sockets left */
            struct pollfd pf = {.fd = r->wake_fd, .events = POLLIN};
            (void)poll(&pf, 1, 10);
            if (kvp__remote_reap_dead(r))
                continue;
            pthread_mutex_lock(&r->mu);
            int stop = r->stop && !r->dead;
            pthread_mutex_unlock(&r->mu);
            if (stop)
                break;
            continue;
        }
        /* A caller driving the worker makes progress for everyone: stay off
         * the CPU meanwhile (two busy threads per client would crowd out the
         * server on a small host). */
        int driven = atomic_load(&r->driving);
        while (!driven && ucp_worker_progress(r->worker))
            did = 1;
        uint64_t now = kvp__now_ns();
        if (did)
            atomic_store(&r->progressed_ns, now);
        if (kvp__remote_reap_dead(r))
            continue;
        run_reposts(r);
        pthread_mutex_lock(&r->mu);
        int req = r->replace_req;
        r->replace_req = 0;
        pthread_mutex_unlock(&r->mu);
        if (req) {
            kvp_info("remote: replacing the UCX worker (test request)");
            replace_worker(r, 0);
            continue;
        }
        pthread_mutex_lock(&r->mu);
        int waiting = r->dead != NULL; /* senders still inside post() */
        int stop = r->stop && r->npending == 0 && !waiting && !r->reposts;
        pthread_mutex_unlock(&r->mu);
        if (stop)
            break;
        if (now - last_check > 10000000ull) {
            kvp__remote_check_deadlines(r);
            last_check = now;
        }
        int releasing = kvp__lread_flush_released(r, now);
        if (did)
            spin_until = now + 30000;
        if (driven) {
            /* Until the driver leaves (it wakes us) or 1 ms passes,
             * to keep watching for dead connections and deadlines. */
            struct pollfd pf = {.fd = r->wake_fd, .events = POLLIN};
            if (poll(&pf, 1, 1) > 0) {
                uint64_t x;
                (void)!read(r->wake_fd, &x, sizeof x);
            }
            continue;
        }
        int timeout = now < spin_until ? 0 : waiting || releasing ? 1 : 10;
        /* Stuck: un-armable, and no thread (callers drive it too) has made
         * progress for 1 s. */
        timeout = kvp__ucx_arm(r->worker, &armer, timeout, did, now, atomic_load(&r->progressed_ns),
                               1000000000ull);
        if (timeout < 0) {
            replace_worker(r, 1);
            continue;
        }
        struct epoll_event evs[4];
        int n = epoll_wait(r->epfd, evs, 4, timeout);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == r->wake_fd) {
                uint64_t x;
                (void)!read(r->wake_fd, &x, sizeof x);
                continue;
            }
            pthread_mutex_lock(&r->mu);
            if (fd == r->tcp_fd && kvp__remote_do_ready(r) && atomic_load(&r->lane)) {
                pthread_mutex_unlock(&r->mu);
                pthread_mutex_lock(&r->rx_mu);
                (void)kvp__remote_lane_rx(r);
                pthread_mutex_unlock(&r->rx_mu);
                continue;
            }
            if (fd == r->tcp_fd && kvp__remote_do_ready(r)) {
                char junk[64];
                ssize_t k = recv(fd, junk, sizeof junk, MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR) ||
                    (evs[i].events & (EPOLLHUP | EPOLLRDHUP | EPOLLERR)))
                    kvp__remote_do_disconnect(r, "the server closed the control connection");
            }
            pthread_mutex_unlock(&r->mu);
        }
    }
    return NULL;
}

