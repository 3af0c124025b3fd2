/*
 * Logging.  The function that first detects an error logs it (one line);
 * callers that only pass a status up do not log again.
 * Level from KVP_LOG_LEVEL (error|warn|info|debug; default warn) or
 * kvp__log_set_level().  Output goes to stderr, one line per record.
 */
#ifndef KVP_COMMON_LOG_H
#define KVP_COMMON_LOG_H

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

#endif
