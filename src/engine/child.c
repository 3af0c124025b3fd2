/* A child process of a replay: see child.h. */
#include "engine/child.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"

#define LINE_MAX_BUF (64u << 20) /* the buffer's cap: a line over 32 MiB is refused */

kvp_status_t kvp__child_spawn(kvp__child_t *c, char *const argv[], bool pipes)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1};
    c->in_fd = c->out_fd = -1;
    if (pipes && (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC)))
        return KVP_ERR_IO;
    pid_t pid = fork();
    if (pid < 0)
        return KVP_ERR_IO;
    if (pid == 0) {
        if (pipes) {
            dup2(in[0], STDIN_FILENO);
            dup2(out[1], STDOUT_FILENO);
        } else {
            int dn = open("/dev/null", O_RDWR);
            dup2(dn, STDIN_FILENO);
            dup2(dn, STDOUT_FILENO);
        }
        execv("/proc/self/exe", argv);
        _exit(127);
    }
    c->pid = pid;
    if (pipes) {
        close(in[0]);
        close(out[1]);
        c->in_fd = in[1];
        c->out_fd = out[0];
        fcntl(c->out_fd, F_SETFL, O_NONBLOCK);
    }
    return KVP_OK;
}

bool kvp__child_send(kvp__child_t *c, const char *s, size_t n)
{
    while (n && c->in_fd >= 0) {
        ssize_t k = write(c->in_fd, s, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        s += k, n -= (size_t)k;
    }
    return n == 0;
}

kvp_status_t kvp__child_read_lines(kvp__child_t *c, void (*fn)(void *ctx, kvp__child_t *c, const char *line, size_t len),
                                   void *ctx)
{
    kvp_status_t st = KVP_OK;
    for (;;) {
        if (c->out_fd < 0)
            return KVP_OK;
        if (c->cap - c->len < 4096) {
            size_t ncap = c->cap ? c->cap * 2 : 1 << 16;
            if (ncap > LINE_MAX_BUF) {
                c->eof = true;
                return KVP_ERR_PROTOCOL;
            }
            char *nb = kvp__realloc(c->buf, c->cap, ncap);
            if (!nb) {
                st = KVP_ERR_NO_MEMORY;
                break;
            }
            c->buf = nb, c->cap = ncap;
        }
        ssize_t k = read(c->out_fd, c->buf + c->len, c->cap - c->len);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno == EAGAIN)
            break;
        if (k <= 0) {
            c->eof = true;
            break;
        }
        c->len += (size_t)k;
    }
    size_t start = 0;
    for (size_t i = 0; i < c->len; i++)
        if (c->buf[i] == '\n') {
            fn(ctx, c, c->buf + start, i - start);
            start = i + 1;
        }
    if (start) {
        memmove(c->buf, c->buf + start, c->len - start);
        c->len -= start;
    }
    return st;
}

void kvp__child_reap(kvp__child_t *c, int ms)
{
    if (!c->pid || c->exited)
        return;
    for (int i = 0; i <= ms / 10; i++) {
        if (waitpid(c->pid, &c->status, WNOHANG) == c->pid) {
            c->exited = true;
            return;
        }
        usleep(10000);
    }
    kill(c->pid, SIGKILL);
    waitpid(c->pid, &c->status, 0);
    c->exited = true;
    c->killed = true;
}

void kvp__child_close(kvp__child_t *c)
{
    if (c->in_fd >= 0)
        close(c->in_fd);
    if (c->out_fd >= 0)
        close(c->out_fd);
    c->in_fd = c->out_fd = -1;
    kvp__free(c->buf, c->cap);
    c->buf = NULL;
    c->len = c->cap = 0;
}
