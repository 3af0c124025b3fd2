/*
 * The cross-encoder cache's pool lookups: see ec_xcache.h.
 *
 * A lookup is a job:
 *   PROBE  on the caller's thread (the control server's): the pool answers
 *          from what this process holds (kvp__pool_probe: the pool
 *          server's membership filter), no I/O.  Absent: a miss, ended now.
 *          Present, or it cannot tell: the job goes to the thread, for its
 *          get.  A backend with no probe (embedded://) answers an EXISTS at
 *          once: submitted right there, and only a hit goes to the thread.
 *   GET    the thread opens a fill extent of the slab and submits the get
 *          straight into it (an asynchronous pool op, whose callback runs
 *          on the pool's thread, or inline): a hit publishes the extent, a
 *          NOT_FOUND is a miss and frees it.  No EXISTS first: where the
 *          probe could not rule the key out, the value is asked for at
 *          once, which costs a miss no more than an EXISTS would and saves
 *          a hit a round trip to the pool server.
 * and then finish (done(token), counters, backoff, free).  At most
 * MAX_GETS gets are in flight (each holds a fill extent of the slab); the
 * rest wait on the queue.  `inflight` counts jobs started and not
 * finished; destroy waits for 0.
 *
 * Lock order: x->mu, then the reservation table's (fill_begin/fill_end are
 * never called with x->mu held, so in practice the two never nest).
 */
#include "ec/ec_xcache.h"

#include <inttypes.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "client/backend.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/list.h"
#include "common/log.h"
#include "common/thread.h"
#include "ec/ec_worker_int.h"
#include "kvpool/pool.h"

#define BACKOFF_MIN_MS 250
#define BACKOFF_MAX_MS 10000
#define MAX_GETS 2 /* gets in flight at once, each holding a fill extent (KVP__EC_MAX_FILLS) */

typedef struct job {
    kvp__list_t link; /* on x->queue while it waits for the thread */
    kvp__ec_xcache_t *x;
    char hash[256];
    kvp__ec_tensor_t t;
    char key[KVP_KEY_MAX + 1];
    kvp_key_t k;
    uint8_t present;
    kvp_op_t op;
    /* the get, while in flight */
    uint64_t fill_id;
    kvp_iov_t iov;
    kvp_sgl_t sgl;
    kvp_key_result_t res;
    kvp__ec_xcache_done_fn done;
    void *token;
    uint64_t deadline_ns; /* kvp__now_ns(): the lookup's start + timeout */
    bool holds_get;       /* counted in x->gets (taken by the thread) */
} job_t;

struct kvp__ec_xcache {
    kvp__ec_xcache_params_t p;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the get thread's: a job queued, a get slot freed with jobs queued, or
                        * closing with nothing in flight (wake it for nothing else: a lookup
                        * the filter answers ends on the control thread, which must not
                        * wake the idle get thread for it) */
    kvp__list_t queue; /* jobs for the get thread */
    size_t gets;       /* gets in flight */
    bool closing;
    pthread_t thread;
    bool thread_started;
    /* backoff */
    uint64_t fails;         /* failures in a row */
    uint64_t backoff_until; /* kvp__now_ns() */
    kvp__ec_xcache_stats_t st;
};

static int64_t backoff_ms(uint64_t fails)
{
    int64_t ms = BACKOFF_MIN_MS;
    for (uint64_t i = 1; i < fails && ms < BACKOFF_MAX_MS; i++)
        ms *= 2;
    return ms < BACKOFF_MAX_MS ? ms : BACKOFF_MAX_MS;
}

/* The outcome of a pool call for the backoff (x->mu held): a lookup that
 * reached the pool (hit or miss) ends it; a failure starts or lengthens it. */
static void note_pool_locked(kvp__ec_xcache_t *x, kvp_status_t st)
{
    if (st == KVP_OK || st == KVP_ERR_NOT_FOUND) {
        x->fails = 0;
        return;
    }
    x->st.errors++;
    x->fails++;
    int64_t ms = backoff_ms(x->fails);
    x->backoff_until = kvp__now_ns() + (uint64_t)ms * 1000000u;
    x->st.backoffs++;
    kvp_warn_rl("ec cross-encoder cache: pool lookup failed (%s); skipping lookups for %" PRId64
                " ms (pushes go ahead)",
                kvp_status_str(st), ms);
}

/* Ends the job: pool_st is the pool's answer (KVP_OK or NOT_FOUND: it
 * answered; KVP_ERR_BUSY: not asked, skipped; anything else: it failed). */
static void finish(job_t *j, kvp_status_t pool_st, bool hit)
{
    kvp__ec_xcache_t *x = j->x;
    kvp__ec_xcache_done_fn done = j->done;
    void *token = j->token;
    pthread_mutex_lock(&x->mu);
    if (pool_st == KVP_ERR_BUSY)
        x->st.skipped++;
    else
        note_pool_locked(x, pool_st);
    /* the get's slot goes with its outcome noted: a job the thread takes
     * next sees the backoff a failure started */
    if (j->holds_get) {
        x->gets--;
        if (!kvp__list_empty(&x->queue) || x->closing)
            pthread_cond_signal(&x->cv);
    }
    if (hit) {
        x->st.hits++;
        x->st.bytes_fetched += j->t.nbytes;
    } else if (pool_st == KVP_OK || pool_st == KVP_ERR_NOT_FOUND) {
        x->st.misses++;
    }
    pthread_mutex_unlock(&x->mu);
    kvp__free(j, sizeof *j);
    if (done)
        done(token);
    pthread_mutex_lock(&x->mu);
    x->st.inflight--;
    if (x->closing && x->st.inflight == 0)
        pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* The job to the thread, for its get. */
static void queue_get(job_t *j)
{
    kvp__ec_xcache_t *x = j->x;
    pthread_mutex_lock(&x->mu);
    kvp__list_add_tail(&x->queue, &j->link);
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
}

/* After an EXISTS (a backend without a probe): a miss or a failure ends
 * the job; a hit queues the get. */
static void after_exists(job_t *j, kvp_status_t st)
{
    if (st == KVP_OK && !j->present)
        st = KVP_ERR_NOT_FOUND;
    if (st != KVP_OK) {
        finish(j, st, false);
        return;
    }
    queue_get(j);
}

static void exists_cb(void *arg, kvp_status_t st) { after_exists(arg, st); }

/* The get ended (any thread): publish the extent or free it, then finish.
 * NOT_FOUND is the pool answering (a miss), and so is a value of another
 * size: neither is a pool failure. */
static void after_get(job_t *j, kvp_status_t st)
{
    kvp__ec_xcache_t *x = j->x;
    kvp_status_t kst = st == KVP_OK ? j->res.status : st;
    bool ok = kst == KVP_OK && j->res.size == j->t.nbytes;
    if (kst == KVP_OK && !ok)
        kvp_warn_rl("ec cross-encoder cache: pool value of %s has %" PRIu64 " bytes, the reserve %" PRIu64, j->hash,
                    j->res.size, j->t.nbytes);
    if (kst == KVP_ERR_BUFFER_TOO_SMALL)
        kvp_warn_rl("ec cross-encoder cache: pool value of %s is larger than the reserve's %" PRIu64 " bytes",
                    j->hash, j->t.nbytes);
    kvp_status_t fst = kvp__ec_resv_fill_end(x->p.resv, j->fill_id, ok);
    bool pool_failed = st != KVP_OK || (kst != KVP_OK && kst != KVP_ERR_NOT_FOUND && kst != KVP_ERR_BUFFER_TOO_SMALL);
    finish(j, pool_failed ? kst : KVP_OK, ok && fst == KVP_OK);
}

static void get_cb(void *arg, kvp_status_t st) { after_get(arg, st); }

/* The thread's step (x->gets counts the job already): the value straight into
 * a fill of the slab, submitted with what is left of the lookup's time.
 * A job whose time ran out on the queue, or taken while the pool is
 * backing off (a get queued with it failed), is skipped instead. */
static void run_get(job_t *j)
{
    kvp__ec_xcache_t *x = j->x;
    uint64_t now = kvp__now_ns();
    pthread_mutex_lock(&x->mu);
    bool skip = now >= j->deadline_ns || (x->fails && now < x->backoff_until);
    pthread_mutex_unlock(&x->mu);
    if (skip) {
        finish(j, KVP_ERR_BUSY, false);
        return;
    }
    uint8_t *dst = NULL;
    kvp_status_t st = kvp__ec_resv_fill_begin(x->p.resv, j->hash, &j->t, &dst, &j->fill_id);
    if (st != KVP_OK || j->fill_id == 0) {
        /* resident already (a hit), or no room / a conflict / closing (a
         * miss that is nobody's pool failure) */
        finish(j, KVP_OK, st == KVP_OK);
        return;
    }
    j->iov = (kvp_iov_t){dst, j->t.nbytes};
    j->sgl = (kvp_sgl_t){&j->iov, 1};
    uint64_t left_ms = (j->deadline_ns - now + 999999u) / 1000000u;
    j->op = (kvp_op_t){.type = KVP_OP_GET, .keys = &j->k, .n = 1, .values = &j->sgl, .results = &j->res,
                       .timeout_ms = (uint32_t)left_ms, .cb = get_cb, .cb_arg = j};
    st = kvp_pool_submit(x->p.pool, &j->op);
    if (st != KVP_INPROGRESS)
        after_get(j, st); /* done now (inline, or refused) */
}

static void *get_main(void *arg)
{
    kvp__ec_xcache_t *x = arg;
    kvp__thread_name("kvp-ec-xcache");
    pthread_mutex_lock(&x->mu);
    for (;;) {
        while ((kvp__list_empty(&x->queue) || x->gets >= MAX_GETS) && !(x->closing && x->st.inflight == 0))
            pthread_cond_wait(&x->cv, &x->mu);
        if (kvp__list_empty(&x->queue))
            break; /* closing, and nothing in flight */
        job_t *j = KVP_LIST_FIRST_ENTRY(&x->queue, job_t, link);
        kvp__list_del(&j->link);
        x->gets++;
        j->holds_get = true;
        pthread_mutex_unlock(&x->mu);
        run_get(j);
        pthread_mutex_lock(&x->mu);
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

kvp_status_t kvp__ec_xcache_create(const kvp__ec_xcache_params_t *p, kvp__ec_xcache_t **x_p)
{
    if (!p || !x_p || !p->pool || !p->model || !p->resv)
        return KVP_ERR_INVALID_ARG;
    *x_p = NULL;
    kvp__ec_xcache_t *x = kvp__calloc(1, sizeof *x);
    if (!x)
        return KVP_ERR_NO_MEMORY;
    x->p = *p;
    if (!x->p.timeout_ms)
        x->p.timeout_ms = 1000;
    if (!x->p.max_inflight)
        x->p.max_inflight = 64;
    x->p.model = kvp__strdup(p->model);
    if (!x->p.model) {
        kvp__free(x, sizeof *x);
        return KVP_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&x->mu, NULL);
    pthread_cond_init(&x->cv, NULL);
    kvp__list_init(&x->queue);
    if (pthread_create(&x->thread, NULL, get_main, x) != 0) {
        kvp__ec_xcache_destroy(x);
        return KVP_ERR_IO;
    }
    x->thread_started = true;
    *x_p = x;
    return KVP_OK;
}

void kvp__ec_xcache_destroy(kvp__ec_xcache_t *x)
{
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    x->closing = true;
    pthread_cond_broadcast(&x->cv);
    pthread_mutex_unlock(&x->mu);
    /* The get thread ends once nothing is queued or in flight: every
     * lookup has a deadline. */
    if (x->thread_started)
        pthread_join(x->thread, NULL);
    pthread_mutex_destroy(&x->mu);
    pthread_cond_destroy(&x->cv);
    kvp__strfree((char *)x->p.model);
    kvp__free(x, sizeof *x);
}

kvp_status_t kvp__ec_xcache_lookup(kvp__ec_xcache_t *x, const char *mm_hash, const kvp__ec_tensor_t *t,
                                   kvp__ec_xcache_done_fn done, void *token)
{
    if (!x || !mm_hash || !mm_hash[0] || strlen(mm_hash) >= sizeof(((job_t *)0)->hash) || !t || t->nbytes == 0)
        return KVP_ERR_INVALID_ARG;
    job_t *j = kvp__calloc(1, sizeof *j);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    size_t klen;
    if (kvp__ec_store_key(x->p.model, mm_hash, j->key, sizeof j->key, &klen) != KVP_OK) {
        kvp__free(j, sizeof *j);
        return KVP_ERR_KEY_LENGTH;
    }
    pthread_mutex_lock(&x->mu);
    x->st.lookups++;
    bool skip = x->closing || x->st.inflight >= x->p.max_inflight ||
                (x->fails && kvp__now_ns() < x->backoff_until);
    if (skip)
        x->st.skipped++;
    else
        x->st.inflight++;
    pthread_mutex_unlock(&x->mu);
    if (skip) {
        kvp__free(j, sizeof *j);
        return KVP_ERR_BUSY;
    }
    j->x = x;
    strcpy(j->hash, mm_hash);
    j->t = *t;
    j->k = (kvp_key_t){j->key, (uint32_t)klen};
    j->done = done;
    j->token = token;
    j->deadline_ns = kvp__now_ns() + (uint64_t)x->p.timeout_ms * 1000000u;
    j->op = (kvp_op_t){.type = KVP_OP_EXISTS, .keys = &j->k, .n = 1, .present = &j->present,
                       .timeout_ms = x->p.timeout_ms, .cb = exists_cb, .cb_arg = j};
    kvp_status_t st;
    switch (kvp__pool_probe(x->p.pool, &j->op)) {
    case 1: /* answered here */
        st = KVP_OK;
        if (j->present) { /* maybe held: the get goes to the thread */
            queue_get(j);
            return KVP_INPROGRESS;
        }
        break;
    case 0: /* the pool server must answer: ask it for the value at once */
        queue_get(j);
        return KVP_INPROGRESS;
    default: /* no probe: a backend that answers at once */
        st = kvp_pool_submit(x->p.pool, &j->op);
        if (st == KVP_INPROGRESS)
            return KVP_INPROGRESS;
        if (st == KVP_OK && j->present) {
            after_exists(j, KVP_OK);
            return KVP_INPROGRESS;
        }
        break;
    }
    /* done now: a miss or a failure, reported here (done is not called) */
    if (st == KVP_OK)
        st = KVP_ERR_NOT_FOUND;
    j->done = NULL;
    finish(j, st, false);
    return st;
}

void kvp__ec_xcache_stats(kvp__ec_xcache_t *x, kvp__ec_xcache_stats_t *st)
{
    memset(st, 0, sizeof *st);
    if (!x)
        return;
    pthread_mutex_lock(&x->mu);
    *st = x->st;
    st->backing_off = x->fails && kvp__now_ns() < x->backoff_until;
    pthread_mutex_unlock(&x->mu);
}
