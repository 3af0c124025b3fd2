#ifndef KVP_COMMON_CLOCK_H
#define KVP_COMMON_CLOCK_H
#include <stdint.h>
#include <time.h>

/* Monotonic time in nanoseconds. */
static inline uint64_t kvp__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
#endif
