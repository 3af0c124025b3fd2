/*
 * A process's CPU time and page faults, read from /proc/<pid>/stat (the
 * replays' per-process figures).  Linux only; elsewhere, or for a process
 * that is gone, `have` is false.
 */
#ifndef KVP_ENGINE_PROC_USAGE_H
#define KVP_ENGINE_PROC_USAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvp__proc_usage {
    bool have;
    uint64_t cpu_ns, faults; /* user + system; minor + major */
} kvp__proc_usage_t;

/* pid's figures now (have false when they cannot be read). */
kvp__proc_usage_t kvp__proc_usage(pid_t pid);
/* b - a, have only when both have. */
kvp__proc_usage_t kvp__proc_usage_since(kvp__proc_usage_t a, kvp__proc_usage_t b);

#endif
