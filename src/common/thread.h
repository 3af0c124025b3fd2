#ifndef KVP_COMMON_THREAD_H
#define KVP_COMMON_THREAD_H
#include <pthread.h>

/* Names the calling thread (at most 15 bytes are kept; longer names are
 * cut), so top -H, perf sched and gdb tell the threads apart: the
 * library's threads and the replay nodes' call it first, with a "kvp-"
 * name (a process's main thread naming itself renames the process). */
static inline void kvp__thread_name(const char *name)
{
    char n[16];
    size_t i = 0;
    for (; name[i] && i < sizeof n - 1; i++)
        n[i] = name[i];
    n[i] = 0;
    (void)pthread_setname_np(pthread_self(), n);
}
#endif
