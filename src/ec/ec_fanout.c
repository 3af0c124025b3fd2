/* See ec_fanout.h.  A batch lives on its caller's stack; its tasks wait on
 * the fanout's queue (one entry per batch, with the next index to take), so
 * a task is taken exactly once, by a thread or by the caller. */
#include "ec/ec_fanout.h"

#include <pthread.h>
#include <stdbool.h>

#include "common/alloc.h"
#include "common/list.h"
#include "common/thread.h"

typedef struct batch {
    kvp__list_t link; /* on f->queue while it has tasks not taken */
    void (*fn)(void *ctx, size_t i);
    void *ctx;
    size_t n, next, done;
    pthread_cond_t cv; /* done reached n */
} batch_t;

struct kvp__ec_fanout {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a batch queued, or stopping */
    kvp__list_t queue;
    bool stopping;
    pthread_t *threads;
    size_t n_threads, cap_threads;
};

/* Takes the next task of the queue's first batch (mu held): the batch and
 * its index, or NULL. */
static batch_t *take(kvp__ec_fanout_t *f, batch_t *only, size_t *i_p)
{
    batch_t *b = only ? only : KVP_LIST_FIRST_ENTRY(&f->queue, batch_t, link);
    if (!b || b->next >= b->n)
        return NULL;
    *i_p = b->next++;
    if (b->next == b->n)
        kvp__list_del(&b->link);
    return b;
}

static void finish(batch_t *b)
{
    if (++b->done == b->n)
        pthread_cond_signal(&b->cv);
}

static void *thread_main(void *arg)
{
    kvp__ec_fanout_t *f = arg;
    kvp__thread_name("kvp-ec-fanout");
    pthread_mutex_lock(&f->mu);
    for (;;) {
        size_t i;
        batch_t *b;
        while (!(b = take(f, NULL, &i)) && !f->stopping)
            pthread_cond_wait(&f->cv, &f->mu);
        if (!b)
            break;
        pthread_mutex_unlock(&f->mu);
        b->fn(b->ctx, i);
        pthread_mutex_lock(&f->mu);
        finish(b);
    }
    pthread_mutex_unlock(&f->mu);
    return NULL;
}

kvp_status_t kvp__ec_fanout_create(size_t threads, kvp__ec_fanout_t **f_p)
{
    if (!f_p || threads < 1)
        return KVP_ERR_INVALID_ARG;
    *f_p = NULL;
    kvp__ec_fanout_t *f = kvp__calloc(1, sizeof *f);
    if (!f)
        return KVP_ERR_NO_MEMORY;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->cv, NULL);
    kvp__list_init(&f->queue);
    f->cap_threads = threads;
    f->threads = kvp__calloc(threads, sizeof *f->threads);
    for (size_t i = 0; f->threads && i < threads; i++)
        if (pthread_create(&f->threads[i], NULL, thread_main, f) == 0)
            f->n_threads++;
    if (!f->threads || f->n_threads == 0) {
        kvp__ec_fanout_destroy(f);
        return KVP_ERR_NO_MEMORY;
    }
    *f_p = f;
    return KVP_OK;
}

void kvp__ec_fanout_destroy(kvp__ec_fanout_t *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->mu);
    f->stopping = true;
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    for (size_t i = 0; i < f->n_threads; i++)
        pthread_join(f->threads[i], NULL);
    kvp__free(f->threads, f->cap_threads * sizeof *f->threads);
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    kvp__free(f, sizeof *f);
}

void kvp__ec_fanout_run(kvp__ec_fanout_t *f, size_t n, void (*fn)(void *ctx, size_t i), void *ctx)
{
    if (n == 0)
        return;
    if (!f || n == 1) {
        for (size_t i = 0; i < n; i++)
            fn(ctx, i);
        return;
    }
    batch_t b = {.fn = fn, .ctx = ctx, .n = n, .next = 1, .done = 0};
    pthread_cond_init(&b.cv, NULL);
    pthread_mutex_lock(&f->mu);
    kvp__list_add_tail(&f->queue, &b.link);
    pthread_cond_broadcast(&f->cv);
    pthread_mutex_unlock(&f->mu);
    fn(ctx, 0);
    pthread_mutex_lock(&f->mu);
    finish(&b);
    size_t i;
    while (take(f, &b, &i)) { /* what no thread took yet: ours */
        pthread_mutex_unlock(&f->mu);
        fn(ctx, i);
        pthread_mutex_lock(&f->mu);
        finish(&b);
    }
    while (b.done < b.n)
        pthread_cond_wait(&b.cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    pthread_cond_destroy(&b.cv);
}
