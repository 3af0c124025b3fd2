/*
 * Logging.  The function that first detects an error logs it (one line);
 * callers that only pass a status up do not log again.
 * Level from KVP_LOG_LEVEL (error|warn|info|debug; default warn) or
 * kvp__log_set_level().  Output goes to stderr, one line per record.
 */
#ifndef KVP_COMMON_LOG_H
#define KVP_COMMON_LOG_H

#include <stdatomic.h>

typedef enum { KVP_LOG_ERROR = 0, KVP_LOG_WARN, KVP_LOG_INFO, KVP_LOG_DEBUG } kvp_log_level_t;

void kvp__log_set_level(kvp_log_level_t level);
/* Parses "error", "warn", "info", "debug"; returns 0 on success, -1 otherwise. */
int kvp__log_parse_level(const char *s, kvp_log_level_t *level_p);
int kvp__log_enabled(kvp_log_level_t level);
void kvp__log(kvp_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define KVP_LOG(lvl, ...)                                      \
    do {                                                       \
        if (kvp__log_enabled(lvl))                             \
            kvp__log(lvl, __FILE__, __LINE__, __VA_ARGS__);    \
    } while (0)
#define kvp_error(...) KVP_LOG(KVP_LOG_ERROR, __VA_ARGS__)
#define kvp_warn(...) KVP_LOG(KVP_LOG_WARN, __VA_ARGS__)
#define kvp_info(...) KVP_LOG(KVP_LOG_INFO, __VA_ARGS__)
#define kvp_debug(...) KVP_LOG(KVP_LOG_DEBUG, __VA_ARGS__)

/* Rate-limited records, for what a peer can make happen at will (a bad
 * request, a refused connection): at most one line per second from each call
 * site, the next line after a quiet spell saying how many were suppressed.
 * The state is per call site (a static), updated with relaxed atomics:
 * threads racing on one site may each log once in a second. */
typedef struct kvp__log_rl {
    _Atomic unsigned long long last_ns;
    _Atomic unsigned long long suppressed;
} kvp__log_rl_t;
/* 1 if this record may be logged now (*suppressed_p: how many were not
 * since the last one), 0 if it is suppressed (and counted). */
int kvp__log_rl_pass(kvp__log_rl_t *rl, unsigned long long *suppressed_p);
void kvp__log_rl(kvp_log_level_t level, const char *file, int line, unsigned long long suppressed,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#define KVP_LOG_RL(lvl, ...)                                                         \
    do {                                                                             \
        static kvp__log_rl_t kvp__rl;                                                \
        unsigned long long kvp__sup;                                                 \
        if (kvp__log_enabled(lvl) && kvp__log_rl_pass(&kvp__rl, &kvp__sup))          \
            kvp__log_rl(lvl, __FILE__, __LINE__, kvp__sup, __VA_ARGS__);             \
    } while (0)
#define kvp_error_rl(...) KVP_LOG_RL(KVP_LOG_ERROR, __VA_ARGS__)
#define kvp_warn_rl(...) KVP_LOG_RL(KVP_LOG_WARN, __VA_ARGS__)
#define kvp_info_rl(...) KVP_LOG_RL(KVP_LOG_INFO, __VA_ARGS__)

#endif
