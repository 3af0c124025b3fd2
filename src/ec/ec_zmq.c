/*
 * The scheduler's ZeroMQ collaborators (include/kvpool/ec_connector.h, "The
 * ZeroMQ collaborators"): one control client (ec_client.c) shared by
 *
 *   control   discover_shards and cancel, straight onto the client;
 *   executor  a pool of N threads running queued jobs (the seed's
 *             ThreadPoolExecutor of _CONTROL_WORKERS);
 *   inbox     control.py EventInbox: finds the consumer's event endpoints on
 *             the executor, then drains one PULL socket connected to all.
 *
 * Jobs.  A job is a remote cancel (kvp_ec_cancel_remote through the control
 * table) or the inbox's discovery.  Its life, set only by job_set_state()
 * under the mutex:
 *
 *     QUEUED --(a thread takes it)--> RUNNING --> DONE (freed)
 *        \--(shutdown, or the inbox closed)--> CANCELLED (freed)
 *
 * A running job cannot be stopped (neither can a running Python future):
 * shutdown waits for it (join), as the seed's shutdown(wait=True,
 * cancel_futures=True) does.
 *
 * Discovery.  The scheduler's thread owns the PULL socket (control.py
 * _install runs on the caller's thread).  The first drain queues a
 * discovery job (peers, then event_port of every shard, each a blocking
 * request) and returns no events; later drains return none until the job
 * is done, then the drain that sees its result connects the PULL socket to
 * every endpoint and receives at once.  A failed discovery is retried by the
 * next drain (one job at a time).  The job hands its result over in
 * disc_endpoints under the mutex; a result the inbox no longer wants (it
 * closed meanwhile) is freed by the job.
 *
 * Events.  drain() returns every frame received since the last drain, each
 * parsed with kvp_ec_json_parse; a frame that does not parse costs that
 * frame only (a rate-limited warning).  At most MAX_DRAIN frames are taken
 * per drain (the rest wait in the socket for the next one), so a flooding
 * peer cannot hold the scheduler in one drain.
 *
 * Lock order: z->mu, then the client's mutex (inside client calls); z->mu is
 * never held across a client call or a socket operation.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/assert.h"
#include "common/list.h"
#include "common/log.h"
#include "common/thread.h"
#include "ec/ec_client.h"
#include "kvpool/ec_connector.h"

#define DEFAULT_THREADS 8u /* the seed's _CONTROL_WORKERS */
#define MAX_THREADS 256u
#define MAX_DRAIN 16384u
#define EVENT_MAX_DEPTH 32
#define EVENT_MAX_FRAME KVP__EC_CTL_MAX_FRAME

typedef enum { JOB_CANCEL, JOB_DISCOVER } job_kind_t;
typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_CANCELLED } job_state_t;

typedef struct job {
    kvp__list_t link; /* the queue, while QUEUED */
    job_kind_t kind;
    job_state_t state;
    uint64_t id;      /* cancels: the id submit_cancel returned */
    char *addr;       /* the first control address (owned) */
    char *tid;        /* cancels (owned) */
} job_t;

/* The inbox's discovery (scheduler thread reads it under the mutex). */
typedef enum { DISC_IDLE, DISC_PENDING, DISC_DONE } disc_state_t;

struct kvp_ec_zmq {
    kvp__ec_client_t *client;
    atomic_bool control_closed;
    /* executor */
    pthread_mutex_t mu;
    pthread_cond_t work;
    pthread_t *threads;
    size_t n_threads;
    kvp__list_t queue;   /* QUEUED jobs, FIFO */
    uint64_t next_id;    /* the last cancel id handed out */
    bool shut_down;      /* no more jobs; queued ones cancelled */
    bool joined;
    /* inbox: disc_* under mu; the rest is the scheduler thread's */
    disc_state_t disc;
    job_t *disc_job;     /* the discovery QUEUED or RUNNING, or NULL */
    char **disc_endpoints; /* DISC_DONE: the endpoints (NULL: discovery failed) */
    size_t disc_n;
    bool inbox_closed;
    void *pull_ctx, *pull;
    size_t shard_count;
    kvp_ec_value_t **events; /* returned by the last drain */
    size_t n_events, cap_events;
};

/* ---- jobs ---- */

/* The one setter of a job's state (z->mu held); see the top. */
static void job_set_state(job_t *j, job_state_t to)
{
    static const unsigned legal[] = {
        [JOB_QUEUED] = 1u << JOB_RUNNING | 1u << JOB_CANCELLED,
        [JOB_RUNNING] = 1u << JOB_DONE,
        [JOB_DONE] = 0,
        [JOB_CANCELLED] = 0,
    };
    kvp__assert(legal[j->state] & 1u << to);
    (void)legal;
    j->state = to;
}

static void job_free(job_t *j)
{
    kvp__strfree(j->addr);
    kvp__strfree(j->tid);
    kvp__free(j, sizeof *j);
}

static job_t *job_new(job_kind_t kind, const char *addr, const char *tid)
{
    job_t *j = kvp__calloc(1, sizeof *j);
    if (!j)
        return NULL;
    kvp__list_init(&j->link);
    j->kind = kind;
    j->state = JOB_QUEUED;
    j->addr = kvp__strdup(addr);
    j->tid = tid ? kvp__strdup(tid) : NULL;
    if (!j->addr || (tid && !j->tid)) {
        job_free(j);
        return NULL;
    }
    return j;
}

static void endpoints_free(char **v, size_t n)
{
    if (v)
        kvp__ec_strv_free(v, n);
}

/* The event endpoints behind base (control.py EventInbox._endpoints), or
 * NULL when discovery failed (logged).  Blocking: executor threads only. */
static char **discover_endpoints(kvp_ec_zmq_t *z, const char *base, size_t *n_p)
{
    *n_p = 0;
    if (atomic_load(&z->control_closed))
        return NULL;
    const char *const *shards;
    size_t n;
    if (kvp__ec_client_shards(z->client, base, &shards, &n) != KVP_OK)
        return NULL; /* (logged by the client) */
    char **eps = kvp__calloc(n, sizeof *eps);
    if (!eps)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint16_t port;
        kvp_status_t st = kvp__ec_client_event_port(z->client, shards[i], &port);
        if (st != KVP_OK) {
            kvp_warn_rl("EC Mooncake could not subscribe to the event channel of consumer shard %s (%s); "
                        "retrying the complete topology later.",
                        shards[i], kvp_status_str(st));
            kvp__ec_strv_free(eps, n);
            return NULL;
        }
        const char *colon = strrchr(shards[i], ':');
        size_t pl = colon ? (size_t)(colon - shards[i]) : strlen(shards[i]);
        char tmp[16];
        int tl = snprintf(tmp, sizeof tmp, ":%u", (unsigned)port);
        if (!(eps[i] = kvp__malloc(pl + (size_t)tl + 1))) {
            kvp__ec_strv_free(eps, n);
            return NULL;
        }
        memcpy(eps[i], shards[i], pl);
        memcpy(eps[i] + pl, tmp, (size_t)tl + 1);
    }
    *n_p = n;
    return eps;
}

static void run_job(kvp_ec_zmq_t *z, job_t *j)
{
    if (j->kind == JOB_CANCEL) {
        kvp_ec_control_t ctl = kvp_ec_zmq_control(z);
        bool cancelled = false;
        kvp_status_t st = kvp_ec_cancel_remote(&ctl, j->addr, j->tid, &cancelled);
        if (st != KVP_OK)
            kvp_warn_rl("EC Mooncake reservation cancellation failed for transfer_id=%s: %s", j->tid,
                        kvp_status_str(st));
        return;
    }
    size_t n;
    char **eps = discover_endpoints(z, j->addr, &n);
    pthread_mutex_lock(&z->mu);
    if (z->disc_job == j) {
        z->disc_job = NULL;
        z->disc = DISC_DONE;
        z->disc_endpoints = eps;
        z->disc_n = n;
        eps = NULL;
    }
    pthread_mutex_unlock(&z->mu);
    endpoints_free(eps, n); /* the inbox closed meanwhile */
}

static void *worker_main(void *arg)
{
    kvp_ec_zmq_t *z = arg;
    kvp__thread_name("kvp-ec-exec");
    pthread_mutex_lock(&z->mu);
    for (;;) {
        while (kvp__list_empty(&z->queue) && !z->shut_down)
            pthread_cond_wait(&z->work, &z->mu);
        if (kvp__list_empty(&z->queue))
            break; /* shut down, nothing left */
        job_t *j = KVP_CONTAINER_OF(z->queue.next, job_t, link);
        kvp__list_del(&j->link);
        job_set_state(j, JOB_RUNNING);
        pthread_mutex_unlock(&z->mu);
        run_job(z, j);
        pthread_mutex_lock(&z->mu);
        job_set_state(j, JOB_DONE);
        job_free(j);
    }
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* Queues j (mutex held).  KVP_ERR_CLOSED after shutdown (j not taken). */
static kvp_status_t do_submit(kvp_ec_zmq_t *z, job_t *j)
{
    if (z->shut_down)
        return KVP_ERR_CLOSED;
    kvp__list_add_tail(&z->queue, &j->link);
    pthread_cond_signal(&z->work);
    return KVP_OK;
}

/* ---- the executor table ---- */

static kvp_status_t exec_submit_cancel(void *ctx, const char *addr, const char *transfer_id, uint64_t *job_p)
{
    kvp_ec_zmq_t *z = ctx;
    job_t *j = job_new(JOB_CANCEL, addr, transfer_id);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    pthread_mutex_lock(&z->mu);
    kvp_status_t st = do_submit(z, j);
    if (st == KVP_OK)
        *job_p = j->id = ++z->next_id;
    pthread_mutex_unlock(&z->mu);
    if (st != KVP_OK)
        job_free(j);
    return st;
}

static void exec_shutdown(void *ctx)
{
    kvp_ec_zmq_t *z = ctx;
    pthread_mutex_lock(&z->mu);
    z->shut_down = true;
    while (!kvp__list_empty(&z->queue)) {
        job_t *j = KVP_CONTAINER_OF(z->queue.next, job_t, link);
        kvp__list_del(&j->link);
        job_set_state(j, JOB_CANCELLED);
        if (j == z->disc_job) {
            z->disc_job = NULL;
            z->disc = DISC_IDLE;
        }
        job_free(j);
    }
    pthread_cond_broadcast(&z->work);
    bool join = !z->joined;
    z->joined = true;
    pthread_mutex_unlock(&z->mu);
    if (join)
        for (size_t i = 0; i < z->n_threads; i++)
            pthread_join(z->threads[i], NULL);
}

kvp_ec_executor_t kvp_ec_zmq_executor(kvp_ec_zmq_t *z)
{
    kvp_ec_executor_t e = {exec_submit_cancel, exec_shutdown, z};
    return e;
}

/* ---- the control table ---- */

static kvp_status_t ctl_discover(void *ctx, const char *addr, const char *const **addrs_p, size_t *n_p)
{
    kvp_ec_zmq_t *z = ctx;
    *addrs_p = NULL;
    *n_p = 0;
    if (atomic_load(&z->control_closed))
        return KVP_ERR_CLOSED;
    return kvp__ec_client_shards(z->client, addr, addrs_p, n_p);
}

static kvp_status_t ctl_cancel(void *ctx, const char *addr, const char *transfer_id, bool *cancelled_p)
{
    kvp_ec_zmq_t *z = ctx;
    *cancelled_p = false;
    if (atomic_load(&z->control_closed))
        return KVP_ERR_CLOSED;
    /* the seed's scheduler sends the transfer id only */
    return kvp__ec_client_cancel(z->client, addr, transfer_id, NULL, false, false, cancelled_p);
}

static void ctl_close(void *ctx)
{
    kvp_ec_zmq_t *z = ctx;
    atomic_store(&z->control_closed, true);
}

kvp_ec_control_t kvp_ec_zmq_control(kvp_ec_zmq_t *z)
{
    kvp_ec_control_t c = {ctl_discover, ctl_cancel, ctl_close, z};
    return c;
}

/* ---- the inbox table ---- */

static void events_clear(kvp_ec_zmq_t *z)
{
    for (size_t i = 0; i < z->n_events; i++)
        kvp_ec_value_free(z->events[i]);
    z->n_events = 0;
}

/* control.py _install: one PULL socket connected to every endpoint
 * (scheduler thread).  A failure leaves the inbox unconnected (logged); the
 * next drain discovers again. */
static void install(kvp_ec_zmq_t *z, char **eps, size_t n)
{
    if (!z->pull_ctx && !(z->pull_ctx = zmq_ctx_new())) {
        kvp_warn_rl("EC Mooncake event channel: zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return;
    }
    void *s = zmq_socket(z->pull_ctx, ZMQ_PULL);
    if (!s) {
        kvp_warn_rl("EC Mooncake event channel: zmq_socket: %s", zmq_strerror(zmq_errno()));
        return;
    }
    int on = 1, linger = 0;
    int64_t maxmsg = EVENT_MAX_FRAME;
    zmq_setsockopt(s, ZMQ_IPV6, &on, sizeof on);
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    for (size_t i = 0; i < n; i++)
        if (zmq_connect(s, eps[i]) != 0) {
            kvp_warn_rl("EC Mooncake event channel: connect %s: %s", eps[i], zmq_strerror(zmq_errno()));
            zmq_close(s);
            return;
        }
    z->pull = s;
    z->shard_count = n;
}

/* control.py _connect (scheduler thread). */
static void inbox_connect(kvp_ec_zmq_t *z, const char *base)
{
    char **eps = NULL;
    size_t n = 0;
    pthread_mutex_lock(&z->mu);
    if (z->disc == DISC_IDLE) {
        job_t *j = z->shut_down ? NULL : job_new(JOB_DISCOVER, base, NULL);
        if (j && do_submit(z, j) == KVP_OK) {
            z->disc_job = j;
            z->disc = DISC_PENDING;
        } else if (j) {
            job_free(j);
        }
    } else if (z->disc == DISC_DONE) {
        eps = z->disc_endpoints;
        n = z->disc_n;
        z->disc_endpoints = NULL;
        z->disc_n = 0;
        z->disc = DISC_IDLE;
    }
    pthread_mutex_unlock(&z->mu);
    if (eps && n)
        install(z, eps, n);
    endpoints_free(eps, n);
}

static size_t inbox_shard_count(void *ctx)
{
    kvp_ec_zmq_t *z = ctx;
    return z->inbox_closed ? 0 : z->shard_count;
}

static kvp_status_t inbox_drain(void *ctx, const char *control_addr, const kvp_ec_value_t *const **events_p,
                                size_t *n_p)
{
    kvp_ec_zmq_t *z = ctx;
    events_clear(z);
    *events_p = NULL;
    *n_p = 0;
    if (z->inbox_closed)
        return KVP_OK;
    if (!z->pull)
        inbox_connect(z, control_addr);
    if (!z->pull)
        return KVP_OK;
    for (size_t got = 0; got < MAX_DRAIN; got++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, z->pull, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (e == EINTR)
                continue;
            if (e != EAGAIN)
                kvp_warn_rl("EC Mooncake event channel failed: %s", zmq_strerror(e));
            break;
        }
        kvp_ec_value_t *v = NULL;
        kvp_status_t st = kvp_ec_json_parse(zmq_msg_data(&m), zmq_msg_size(&m), EVENT_MAX_DEPTH, &v);
        size_t size = zmq_msg_size(&m);
        zmq_msg_close(&m);
        if (st == KVP_OK &&
            kvp__grow_in((void **)&z->events, &z->cap_events, z->n_events + 1, sizeof *z->events, 16) != 0) {
            kvp_ec_value_free(v);
            st = KVP_ERR_NO_MEMORY;
        }
        if (st != KVP_OK) {
            kvp_warn_rl("Discarding an undecodable EC Mooncake event (%zu bytes: %s).", size, kvp_status_str(st));
            continue;
        }
        z->events[z->n_events++] = v;
    }
    *events_p = (const kvp_ec_value_t *const *)z->events;
    *n_p = z->n_events;
    return KVP_OK;
}

static void inbox_close(void *ctx)
{
    kvp_ec_zmq_t *z = ctx;
    if (z->inbox_closed)
        return;
    z->inbox_closed = true;
    pthread_mutex_lock(&z->mu);
    job_t *j = z->disc_job;
    if (j && j->state == JOB_QUEUED) {
        kvp__list_del(&j->link);
        job_set_state(j, JOB_CANCELLED);
        job_free(j);
    }
    z->disc_job = NULL; /* a running discovery frees its own result */
    endpoints_free(z->disc_endpoints, z->disc_n);
    z->disc_endpoints = NULL;
    z->disc_n = 0;
    z->disc = DISC_IDLE;
    pthread_mutex_unlock(&z->mu);
    if (z->pull)
        zmq_close(z->pull);
    z->pull = NULL;
    if (z->pull_ctx)
        zmq_ctx_term(z->pull_ctx);
    z->pull_ctx = NULL;
    events_clear(z);
    if (z->events)
        kvp__free(z->events, z->cap_events * sizeof *z->events);
    z->events = NULL;
    z->cap_events = 0;
}

kvp_ec_inbox_t kvp_ec_zmq_inbox(kvp_ec_zmq_t *z)
{
    kvp_ec_inbox_t b = {inbox_shard_count, inbox_drain, inbox_close, z};
    return b;
}

/* ---- life ---- */

kvp_status_t kvp_ec_zmq_create(int64_t control_timeout_ms, size_t threads, kvp_ec_zmq_t **z_p)
{
    if (!z_p)
        return KVP_ERR_INVALID_ARG;
    *z_p = NULL;
    if (threads == 0)
        threads = DEFAULT_THREADS;
    if (control_timeout_ms < 1 || threads > MAX_THREADS)
        return KVP_ERR_INVALID_ARG;
    kvp_ec_zmq_t *z = kvp__calloc(1, sizeof *z);
    if (!z)
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__ec_client_create(control_timeout_ms, &z->client);
    if (st != KVP_OK)
        goto err_free;
    if (!(z->threads = kvp__calloc(threads, sizeof *z->threads))) {
        st = KVP_ERR_NO_MEMORY;
        goto err_client;
    }
    atomic_init(&z->control_closed, false);
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->work, NULL);
    kvp__list_init(&z->queue);
    for (; z->n_threads < threads; z->n_threads++)
        if (pthread_create(&z->threads[z->n_threads], NULL, worker_main, z) != 0) {
            kvp_error("EC executor: could not start thread %zu of %zu", z->n_threads + 1, threads);
            st = KVP_ERR_NO_MEMORY;
            goto err_threads;
        }
    *z_p = z;
    return KVP_OK;
err_threads:
    exec_shutdown(z); /* joins the n_threads started */
    pthread_cond_destroy(&z->work);
    pthread_mutex_destroy(&z->mu);
    kvp__free(z->threads, threads * sizeof *z->threads);
err_client:
    kvp__ec_client_destroy(z->client);
err_free:
    kvp__free(z, sizeof *z);
    return st;
}

void kvp_ec_zmq_destroy(kvp_ec_zmq_t *z)
{
    if (!z)
        return;
    exec_shutdown(z);
    inbox_close(z);
    kvp__ec_client_destroy(z->client);
    pthread_cond_destroy(&z->work);
    pthread_mutex_destroy(&z->mu);
    /* threads was allocated for the count asked; n_threads are those started */
    kvp__free(z->threads, z->n_threads * sizeof *z->threads);
    kvp__free(z, sizeof *z);
}
