/*
 * The shard fanout (src/ec/ec_fanout.h): every task runs exactly once, at
 * once, the first on the caller; callers sharing one fanout all finish,
 * even with more tasks than threads.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "ec/ec_fanout.h"
#include "test.h"

typedef struct {
    atomic_int runs[64];
    pthread_t caller;
    atomic_bool first_on_caller;
    atomic_int running, max_running;
    int sleep_ms;
} job_t;

static void task(void *ctx, size_t i)
{
    job_t *j = ctx;
    atomic_fetch_add(&j->runs[i], 1);
    if (i == 0 && pthread_equal(pthread_self(), j->caller))
        atomic_store(&j->first_on_caller, true);
    int now = atomic_fetch_add(&j->running, 1) + 1, m = atomic_load(&j->max_running);
    while (now > m && !atomic_compare_exchange_weak(&j->max_running, &m, now)) {
    }
    if (j->sleep_ms)
        usleep((useconds_t)j->sleep_ms * 1000);
    atomic_fetch_sub(&j->running, 1);
}

static void job_init(job_t *j, int sleep_ms)
{
    memset(j, 0, sizeof *j);
    j->caller = pthread_self();
    j->sleep_ms = sleep_ms;
}

TEST(test_ec_fanout_each_task_once_at_once_first_on_caller)
{
    kvp__ec_fanout_t *f;
    ASSERT_OK(kvp__ec_fanout_create(3, &f));
    job_t j;
    job_init(&j, 100);
    kvp__ec_fanout_run(f, 4, task, &j);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(atomic_load(&j.runs[i]), 1);
    ASSERT(atomic_load(&j.first_on_caller));
    ASSERT_GE(atomic_load(&j.max_running), 2); /* not one after another */
    /* more tasks than threads: the caller takes what is left */
    job_init(&j, 0);
    kvp__ec_fanout_run(f, 64, task, &j);
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(atomic_load(&j.runs[i]), 1);
    /* one task, and no fanout: the caller alone */
    job_init(&j, 0);
    kvp__ec_fanout_run(f, 1, task, &j);
    kvp__ec_fanout_run(NULL, 3, task, &j);
    ASSERT_EQ(atomic_load(&j.runs[0]), 2);
    ASSERT_EQ(atomic_load(&j.max_running), 1);
    kvp__ec_fanout_run(f, 0, task, &j);
    kvp__ec_fanout_destroy(f);
    kvp__ec_fanout_destroy(NULL);
    ASSERT_EQ(kvp__ec_fanout_create(0, &f), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

typedef struct {
    kvp__ec_fanout_t *f;
    job_t j;
} caller_t;

static void *caller_main(void *arg)
{
    caller_t *c = arg;
    job_init(&c->j, 2);
    for (int round = 0; round < 20; round++)
        kvp__ec_fanout_run(c->f, 8, task, &c->j);
    return NULL;
}

TEST(test_ec_fanout_shared_by_callers_all_finish)
{
    kvp__ec_fanout_t *f;
    ASSERT_OK(kvp__ec_fanout_create(2, &f));
    caller_t c[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        c[i].f = f;
        ASSERT_EQ(pthread_create(&th[i], NULL, caller_main, &c[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        for (int k = 0; k < 8; k++)
            ASSERT_EQ(atomic_load(&c[i].j.runs[k]), 20);
    }
    kvp__ec_fanout_destroy(f);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST_LIST(T(test_ec_fanout_each_task_once_at_once_first_on_caller), T(test_ec_fanout_shared_by_callers_all_finish))
