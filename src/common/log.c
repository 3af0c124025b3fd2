#include "common/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Atomic int g_level = -1; /* -1: not initialised yet */

int kvp__log_parse_level(const char *s, kvp_log_level_t *level_p)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (s && strcmp(s, names[i]) == 0) {
            *level_p = (kvp_log_level_t)i;
            return 0;
        }
    }
    return -1;
}

void kvp__log_set_level(kvp_log_level_t level) { atomic_store(&g_level, (int)level); }

int kvp__log_enabled(kvp_log_level_t level)
{
    int cur = atomic_load_explicit(&g_level, memory_order_relaxed);
    if (cur < 0) {
        kvp_log_level_t l = KVP_LOG_WARN;
        const char *env = getenv("KVP_LOG_LEVEL");
        if (env)
            (void)kvp__log_parse_level(env, &l);
        cur = (int)l;
        atomic_store(&g_level, cur);
    }
    return (int)level <= cur;
}

static void emit(kvp_log_level_t level, const char *file, int line, const char *msg)
{
    static const char tag[] = "EWID";
    const char *base = strrchr(file, '/');
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld kvpool %c %s:%d %s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000, tag[level], base ? base + 1 : file, line, msg);
}

void kvp__log(kvp_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit(level, file, line, msg);
}

#define RL_WINDOW_NS 1000000000ull

int kvp__log_rl_pass(kvp__log_rl_t *rl, unsigned long long *suppressed_p)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
    unsigned long long last = atomic_load_explicit(&rl->last_ns, memory_order_relaxed);
    if (last && now - last < RL_WINDOW_NS) {
        atomic_fetch_add_explicit(&rl->suppressed, 1, memory_order_relaxed);
        return 0;
    }
    atomic_store_explicit(&rl->last_ns, now, memory_order_relaxed);
    *suppressed_p = atomic_exchange_explicit(&rl->suppressed, 0, memory_order_relaxed);
    return 1;
}

void kvp__log_rl(kvp_log_level_t level, const char *file, int line, unsigned long long suppressed,
                 const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (suppressed && n >= 0 && (size_t)n < sizeof msg)
        snprintf(msg + n, sizeof msg - (size_t)n, " (and %llu more like it, not logged)", suppressed);
    emit(level, file, line, msg);
}
