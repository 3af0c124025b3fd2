/*
 * A child process of a replay: this binary (/proc/self/exe) run with its
 * own argv, either with pipes (the replay writes lines to its stdin and
 * reads lines from its stdout) or with both on /dev/null.  Used by
 * `replay --epd` for its encoder and prefill nodes and its pool server.
 *
 * Object life: spawn -> send / read_lines -> reap (waits, then SIGKILL)
 * -> close (the pipes and the line buffer).  One thread uses a child.
 */
#ifndef KVP_ENGINE_CHILD_H
#define KVP_ENGINE_CHILD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "kvpool/status.h"

typedef struct kvp__child {
    const char *name; /* for the caller's log lines */
    pid_t pid;
    int in_fd, out_fd; /* its stdin (we write), its stdout (we read, non-blocking); -1 closed */
    char *buf;         /* what it wrote that is not yet a whole line */
    size_t len, cap;
    bool exited, killed, eof;
    int status; /* waitpid's, once exited */
} kvp__child_t;

/* fork + exec /proc/self/exe argv (c zeroed but for name).  KVP_OK,
 * KVP_ERR_IO. */
kvp_status_t kvp__child_spawn(kvp__child_t *c, char *const argv[], bool pipes);
/* Writes s[0..n) to its stdin, all of it; false when it cannot (closed,
 * gone). */
bool kvp__child_send(kvp__child_t *c, const char *s, size_t n);
/* Reads what its stdout holds now and calls fn for every whole line (the
 * line without its '\n', valid during the call).  At EOF c->eof is set.
 * KVP_ERR_PROTOCOL (and c->eof set: nothing more is read) when a line
 * outgrows 32 MiB; KVP_ERR_NO_MEMORY when the buffer cannot grow. */
kvp_status_t kvp__child_read_lines(kvp__child_t *c, void (*fn)(void *ctx, kvp__child_t *c, const char *line, size_t len),
                                   void *ctx);
/* Reaps it, waiting up to ms (then SIGKILL: c->killed). */
void kvp__child_reap(kvp__child_t *c, int ms);
/* Closes its pipes and frees the line buffer. */
void kvp__child_close(kvp__child_t *c);

#endif
