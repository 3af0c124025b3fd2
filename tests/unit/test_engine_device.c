/* Unit tests of src/engine/device.c: the replays' stand-in for a GPU runs
 * each job on a thread of its own at nice 19 under SCHED_IDLE, one at a time, and returns
 * to the caller only when the job is done. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/device.h"
#include "test.h"

static pid_t my_tid(void) { return (pid_t)syscall(SYS_gettid); }

typedef struct {
    pid_t tid;
    int nice, policy;
    char name[16];
} where_t;

static void where_job(void *arg)
{
    where_t *w = arg;
    w->tid = my_tid();
    errno = 0;
    w->nice = getpriority(PRIO_PROCESS, (id_t)w->tid);
    w->policy = sched_getscheduler(0);
    pthread_getname_np(pthread_self(), w->name, sizeof w->name);
}

TEST(test_device_runs_the_job_on_its_own_thread_at_nice_19_sched_idle)
{
    errno = 0;
    int caller_nice = getpriority(PRIO_PROCESS, (id_t)my_tid());
    int caller_policy = sched_getscheduler(0);
    kvp__device_t *d;
    ASSERT_EQ(kvp__device_create(&d), KVP_OK);
    where_t w = {0};
    kvp__device_run(d, where_job, &w);
    ASSERT(w.tid != 0 && w.tid != my_tid());
    ASSERT_EQ(w.nice, 19);
    ASSERT_EQ(kvp__device_nice(d), 19);
    ASSERT_EQ(w.policy, SCHED_IDLE);
    ASSERT(kvp__device_sched_idle(d));
    ASSERT_STR_EQ(w.name, "kvp-device");
    /* the caller's priority and class are its own */
    ASSERT_EQ(getpriority(PRIO_PROCESS, (id_t)my_tid()), caller_nice);
    ASSERT_EQ(sched_getscheduler(0), caller_policy);
    kvp__device_destroy(d);
}

TEST(test_device_null_runs_the_job_on_the_caller)
{
    where_t w = {0};
    kvp__device_run(NULL, where_job, &w);
    ASSERT_EQ(w.tid, my_tid());
    ASSERT_EQ(kvp__device_nice(NULL), -100);
    ASSERT(!kvp__device_sched_idle(NULL));
    kvp__device_destroy(NULL);
}

typedef struct {
    int *log;
    int n, i;
} append_t;

static void append_job(void *arg)
{
    append_t *a = arg;
    usleep(a->i % 7 == 0 ? 200 : 0); /* some jobs take a while */
    a->log[a->n++] = a->i;
}

TEST(test_device_run_returns_once_the_job_is_done_in_order)
{
    kvp__device_t *d;
    ASSERT_EQ(kvp__device_create(&d), KVP_OK);
    int log[64];
    append_t a = {.log = log};
    for (int i = 0; i < 64; i++) {
        a.i = i;
        kvp__device_run(d, append_job, &a);
        ASSERT_EQ(a.n, i + 1); /* done, and its writes seen, when run returns */
        ASSERT_EQ(log[i], i);
    }
    kvp__device_destroy(d);
}

typedef struct {
    kvp__device_t *d;
    atomic_int inside, overlaps;
    long count; /* written by jobs only: one at a time */
} turns_t;

static void turn_job(void *arg)
{
    turns_t *t = arg;
    if (atomic_fetch_add(&t->inside, 1) != 0)
        atomic_fetch_add(&t->overlaps, 1);
    long c = t->count;
    sched_yield();
    t->count = c + 1;
    atomic_fetch_sub(&t->inside, 1);
}

static void *caller_main(void *arg)
{
    turns_t *t = arg;
    for (int i = 0; i < 300; i++)
        kvp__device_run(t->d, turn_job, t);
    return NULL;
}

TEST(test_device_two_callers_take_turns)
{
    turns_t t = {0};
    ASSERT_EQ(kvp__device_create(&t.d), KVP_OK);
    pthread_t a, b;
    ASSERT_EQ(pthread_create(&a, NULL, caller_main, &t), 0);
    ASSERT_EQ(pthread_create(&b, NULL, caller_main, &t), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ASSERT_EQ(atomic_load(&t.overlaps), 0);
    ASSERT_EQ(t.count, 600);
    kvp__device_destroy(t.d);
}

TEST_LIST(T(test_device_runs_the_job_on_its_own_thread_at_nice_19_sched_idle), T(test_device_null_runs_the_job_on_the_caller),
          T(test_device_run_returns_once_the_job_is_done_in_order), T(test_device_two_callers_take_turns))
