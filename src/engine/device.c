/* The replays' stand-in for an accelerator (device.h). */
#include "engine/device.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/thread.h"

#define DEVICE_NICE 19

struct kvp__device {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* a job was posted, one finished, or stopping */
    void (*fn)(void *arg);
    void *arg;
    bool busy, stop;
    uint64_t posted, done; /* jobs posted, jobs finished: a caller waits for its own */
    int nice;              /* set by the thread before create returns */
    bool sched_idle;       /* likewise */
};

static void *device_main(void *p)
{
    kvp__device_t *d = p;
    kvp__thread_name("kvp-device");
    /* Linux keeps a nice value per thread: this one only. */
    id_t tid = (id_t)syscall(SYS_gettid);
    if (setpriority(PRIO_PROCESS, tid, DEVICE_NICE) != 0)
        kvp_warn("device: cannot lower the stand-in's priority to nice %d: %s", DEVICE_NICE, strerror(errno));
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, tid);
    nice = errno ? 0 : nice;
    /* Then the idle class (the calling thread only): a core running only
     * SCHED_IDLE work is where the kernel puts a thread that wakes up. */
    struct sched_param sp = {.sched_priority = 0};
    if (sched_setscheduler(0, SCHED_IDLE, &sp) != 0)
        kvp_warn("device: cannot move the stand-in to SCHED_IDLE: %s", strerror(errno));
    bool idle = sched_getscheduler(0) == SCHED_IDLE;
    pthread_mutex_lock(&d->mu);
    d->sched_idle = idle;
    d->nice = nice;
    pthread_cond_broadcast(&d->cv);
    for (;;) {
        while (!d->busy && !d->stop)
            pthread_cond_wait(&d->cv, &d->mu);
        if (!d->busy)
            break;
        pthread_mutex_unlock(&d->mu);
        d->fn(d->arg);
        pthread_mutex_lock(&d->mu);
        d->busy = false;
        d->done++;
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

kvp_status_t kvp__device_create(kvp__device_t **d_p)
{
    *d_p = NULL;
    kvp__device_t *d = kvp__calloc(1, sizeof *d);
    if (!d)
        return KVP_ERR_NO_MEMORY;
    d->nice = -100;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    if (pthread_create(&d->thread, NULL, device_main, d) != 0) {
        pthread_cond_destroy(&d->cv);
        pthread_mutex_destroy(&d->mu);
        kvp__free(d, sizeof *d);
        return KVP_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&d->mu);
    while (d->nice == -100)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    *d_p = d;
    return KVP_OK;
}

void kvp__device_run(kvp__device_t *d, void (*fn)(void *arg), void *arg)
{
    if (!d) {
        fn(arg);
        return;
    }
    pthread_mutex_lock(&d->mu);
    while (d->busy) /* one caller at a time; a second one waits its turn */
        pthread_cond_wait(&d->cv, &d->mu);
    d->fn = fn;
    d->arg = arg;
    d->busy = true;
    uint64_t mine = ++d->posted;
    pthread_cond_broadcast(&d->cv);
    while (d->done < mine) /* (not busy: another caller's job may be running by then) */
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

int kvp__device_nice(const kvp__device_t *d) { return d ? d->nice : -100; }

bool kvp__device_sched_idle(const kvp__device_t *d) { return d && d->sched_idle; }

void kvp__device_destroy(kvp__device_t *d)
{
    if (!d)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    kvp__free(d, sizeof *d);
}
