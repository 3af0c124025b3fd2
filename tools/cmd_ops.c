/*
 * Operator commands: `kvpool put|get|exists|rm|reset|stats URI ...`, for
 * people and scripts.
 *
 * Contract shared by all of them:
 *   - stdout carries only the answer (exists: one 1/0 per key; reset: the
 *     count; stats: the report), so scripts can read it;
 *   - on failure exactly one line goes to stderr, "kvpool CMD: reason", and
 *     the exit status says what kind of failure it was (EXIT_* below);
 *   - every call is bounded by --timeout MS: pool ops get it as
 *     kvp_op_t.timeout_ms, and a watchdog thread ends the process (one line,
 *     EXIT_ERROR) if opening the pool or a call that has no timeout of its
 *     own (stats) takes longer, or a backend overruns its own timeout.
 *
 * One line on stderr.  The library logs an error where it first detects it
 * (STYLE.md), and UCX may print its own warnings; a CLI that also printed its
 * own line would print two or more.  So while a command runs, fd 2 is
 * redirected into an in-memory file and the real stderr is kept for the
 * command's own line.  On failure the first library error line is folded into
 * that one line as the detail ("cannot open 'kvpool://127.0.0.1:1': connection
 * refused (connect: 127.0.0.1:1: connection refused)"); on success whatever
 * was captured (warnings) is replayed to stderr untouched.  --verbose turns
 * the capture off.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "common/units.h"
#include "kvpool/pool.h"

enum {
    EXIT_OK = 0,
    EXIT_NOT_FOUND = 1, /* get, rm: the key is not in the pool */
    EXIT_USAGE = 2,     /* the command line could not be parsed */
    EXIT_ERROR = 3,     /* anything else: bad URI, unreachable server, I/O, timeout */
};

#define DEFAULT_TIMEOUT_MS 10000u
#define WATCHDOG_GRACE_MS 1000u  /* a backend reports its own timeout first */
#define GET_FIRST_BUF (1u << 20) /* value size is unknown before the first get */

/* ------------------------------------------------------------------------ */
/* Command context: options, stderr capture, watchdog.                       */

typedef struct {
    const char *cmd;     /* "get", ... (for messages) */
    const char *usage;   /* one usage line */
    uint32_t timeout_ms; /* per call */
    int verbose;         /* no stderr capture */
    int json;            /* stats */
    int force;           /* rm -f */
    int npos;            /* positional arguments */
    char **pos;

    int real_err;        /* the real stderr while fd 2 is captured, else -1 */
    int cap_fd;          /* in-memory file behind fd 2, else -1 */

    pthread_t wd_thread;
    int wd_started;
    pthread_mutex_t wd_mu;
    pthread_cond_t wd_cv;
    int wd_stop;
    uint64_t wd_deadline_ns; /* 0 = disarmed */
    uint32_t wd_ms;
    const char *wd_what;
} cli_t;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Writes all of buf to fd (best effort; used for stderr). */
static void write_all_fd(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t w = write(fd, buf, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        buf += w;
        len -= (size_t)w;
    }
}

/* The first library error in the captured output, reduced to its message:
 * "HH:MM:SS.mmm kvpool E file.c:12 msg" -> "msg".  Lines of other shapes
 * (UCX's own) are taken whole when no kvpool error line exists.  Empty when
 * nothing was captured. */
static void captured_detail(const cli_t *cli, char *out, size_t outlen)
{
    out[0] = 0;
    if (cli->cap_fd < 0)
        return;
    fflush(stderr);
    struct stat sb;
    if (fstat(cli->cap_fd, &sb) != 0 || sb.st_size <= 0)
        return;
    size_t len = (size_t)sb.st_size > (1u << 20) ? (1u << 20) : (size_t)sb.st_size;
    char *buf = malloc(len + 1);
    if (!buf)
        return;
    ssize_t got = pread(cli->cap_fd, buf, len, 0);
    if (got <= 0) {
        free(buf);
        return;
    }
    buf[got] = 0;
    const char *best = NULL, *last = NULL;
    size_t best_len = 0, last_len = 0;
    for (char *line = buf; *line;) {
        char *nl = strchr(line, '\n');
        size_t ll = nl ? (size_t)(nl - line) : strlen(line);
        if (ll) {
            /* kvpool's own format: time, "kvpool", level letter, file:line, msg */
            const char *p = strstr(line, " kvpool ");
            if (p && p < line + ll && p[8] && p[9] == ' ') {
                const char *msg = strchr(p + 10, ' ');
                if (msg && msg < line + ll) {
                    msg++;
                    if (p[8] == 'E' && !best) {
                        best = msg;
                        best_len = (size_t)(line + ll - msg);
                    }
                    last = msg;
                    last_len = (size_t)(line + ll - msg);
                }
            } else {
                last = line;
                last_len = ll;
            }
        }
        if (!nl)
            break;
        line = nl + 1;
    }
    if (!best) {
        best = last;
        best_len = last_len;
    }
    if (best) {
        if (best_len >= outlen)
            best_len = outlen - 1;
        memcpy(out, best, best_len);
        out[best_len] = 0;
        for (char *c = out; *c; c++)
            if (*c == '\r' || *c == '\t')
                *c = ' ';
    }
    free(buf);
}

/* Prints "kvpool CMD: msg[ (detail)]" as one line on the real stderr and
 * returns rc. */
static int cli_fail(cli_t *cli, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int cli_fail(cli_t *cli, int rc, const char *fmt, ...)
{
    char msg[1024], detail[512], line[1700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    captured_detail(cli, detail, sizeof detail);
    if (detail[0] && !strstr(msg, detail))
        snprintf(line, sizeof line, "kvpool %s: %s (%s)\n", cli->cmd, msg, detail);
    else
        snprintf(line, sizeof line, "kvpool %s: %s\n", cli->cmd, msg);
    /* one line, however long the parts were */
    size_t n = strlen(line);
    if (line[n - 1] != '\n')
        line[n - 1] = '\n';
    fflush(stdout);
    write_all_fd(cli->real_err >= 0 ? cli->real_err : 2, line, n);
    /* What was folded into the line is not replayed at the end. */
    if (cli->cap_fd >= 0 && ftruncate(cli->cap_fd, 0) == 0)
        lseek(cli->cap_fd, 0, SEEK_SET);
    return rc;
}

static void *watchdog_main(void *arg)
{
    cli_t *cli = arg;
    pthread_mutex_lock(&cli->wd_mu);
    while (!cli->wd_stop) {
        if (!cli->wd_deadline_ns) {
            pthread_cond_wait(&cli->wd_cv, &cli->wd_mu);
            continue;
        }
        uint64_t now = mono_ns();
        if (now >= cli->wd_deadline_ns) {
            /* The pool call is stuck past its timeout: report and end the
             * process; nothing it holds needs an orderly close. */
            cli_fail(cli, EXIT_ERROR, "%s: timed out after %" PRIu32 " ms", cli->wd_what, cli->wd_ms);
            _exit(EXIT_ERROR);
        }
        struct timespec ts = {(time_t)(cli->wd_deadline_ns / 1000000000ull),
                              (long)(cli->wd_deadline_ns % 1000000000ull)};
        pthread_cond_timedwait(&cli->wd_cv, &cli->wd_mu, &ts);
    }
    pthread_mutex_unlock(&cli->wd_mu);
    return NULL;
}

/* Bounds what follows by ms (until wd_disarm); `what` names it in the
 * message (a string literal or one that outlives the call). */
static void wd_arm(cli_t *cli, uint32_t ms, const char *what)
{
    if (!cli->wd_started)
        return;
    pthread_mutex_lock(&cli->wd_mu);
    cli->wd_deadline_ns = mono_ns() + (uint64_t)ms * 1000000ull;
    cli->wd_ms = ms;
    cli->wd_what = what;
    pthread_cond_signal(&cli->wd_cv);
    pthread_mutex_unlock(&cli->wd_mu);
}

static void wd_disarm(cli_t *cli)
{
    if (!cli->wd_started)
        return;
    pthread_mutex_lock(&cli->wd_mu);
    cli->wd_deadline_ns = 0;
    pthread_mutex_unlock(&cli->wd_mu);
}

/* In sanitizer builds, reports must reach the real stderr even while fd 2 is
 * captured (a crash never gets to replay the capture).  Weak: absent (NULL)
 * in other builds. */
extern void __sanitizer_set_report_fd(void *fd) __attribute__((weak));
static void sanitizer_report_fd(int fd)
{
    if (__sanitizer_set_report_fd)
        __sanitizer_set_report_fd((void *)(intptr_t)fd);
}

/* Starts capture and watchdog.  Failing to start either is not fatal: the
 * command then runs without it. */
static void cli_start(cli_t *cli)
{
    cli->real_err = -1;
    cli->cap_fd = -1;
    if (!cli->verbose) {
        int cap = memfd_create("kvpool-stderr", MFD_CLOEXEC);
        if (cap >= 0) {
            fflush(stderr);
            int saved = fcntl(2, F_DUPFD_CLOEXEC, 3);
            if (saved >= 0 && dup2(cap, 2) == 2) {
                cli->real_err = saved;
                cli->cap_fd = cap;
                sanitizer_report_fd(saved);
            } else {
                if (saved >= 0)
                    close(saved);
                close(cap);
            }
        }
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&cli->wd_mu, NULL);
    pthread_cond_init(&cli->wd_cv, &ca);
    pthread_condattr_destroy(&ca);
    cli->wd_started = pthread_create(&cli->wd_thread, NULL, watchdog_main, cli) == 0;
}

/* Stops the watchdog, puts stderr back and, when rc is EXIT_OK, replays what
 * was captured (warnings).  On failure cli_fail has printed the one line,
 * with the first library error folded in, and the rest is dropped (run with
 * --verbose to see it).  Returns rc. */
static int cli_finish(cli_t *cli, int rc)
{
    if (cli->wd_started) {
        pthread_mutex_lock(&cli->wd_mu);
        cli->wd_stop = 1;
        pthread_cond_signal(&cli->wd_cv);
        pthread_mutex_unlock(&cli->wd_mu);
        pthread_join(cli->wd_thread, NULL);
        cli->wd_started = 0;
    }
    pthread_mutex_destroy(&cli->wd_mu);
    pthread_cond_destroy(&cli->wd_cv);
    if (cli->cap_fd >= 0) {
        fflush(stderr);
        dup2(cli->real_err, 2);
        sanitizer_report_fd(2);
        close(cli->real_err);
        cli->real_err = -1;
        char buf[8192];
        ssize_t n;
        off_t off = 0;
        /* A failure has said its one line; only success replays. */
        while (rc == EXIT_OK && (n = pread(cli->cap_fd, buf, sizeof buf, off)) > 0) {
            write_all_fd(2, buf, (size_t)n);
            off += n;
        }
        close(cli->cap_fd);
        cli->cap_fd = -1;
    }
    return rc;
}

/* Parses the command line: options anywhere, "--" ends them; a lone "-" is
 * positional (stdin/stdout).  Returns -1 to go on, else an exit status. */
static int cli_parse(cli_t *cli, int argc, char **argv, const char *usage, const char *help,
                     int allow_json, int allow_force)
{
    memset(cli, 0, sizeof *cli);
    cli->cmd = argv[0];
    cli->usage = usage;
    cli->timeout_ms = DEFAULT_TIMEOUT_MS;
    cli->real_err = -1;
    cli->cap_fd = -1;
    cli->pos = calloc((size_t)argc + 1, sizeof *cli->pos);
    if (!cli->pos) {
        fprintf(stderr, "kvpool %s: out of memory\n", cli->cmd);
        return EXIT_ERROR;
    }
    int opts = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!opts || a[0] != '-' || !strcmp(a, "-")) {
            cli->pos[cli->npos++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--")) {
            opts = 0;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: %s\n%s", usage, help);
            return EXIT_OK;
        } else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) {
            cli->verbose = 1;
        } else if (allow_json && !strcmp(a, "--json")) {
            cli->json = 1;
        } else if (allow_force && (!strcmp(a, "--force") || !strcmp(a, "-f"))) {
            cli->force = 1;
        } else if (!strcmp(a, "--timeout") || !strncmp(a, "--timeout=", 10)) {
            const char *v = a[9] == '=' ? a + 10 : (i + 1 < argc ? argv[++i] : NULL);
            char *e = NULL;
            errno = 0;
            unsigned long long ms = v ? strtoull(v, &e, 10) : 0;
            if (!v || !*v || *e || errno || ms == 0 || ms > 86400000ull || v[0] == '-') {
                fprintf(stderr, "kvpool %s: --timeout needs milliseconds, 1..86400000 (got '%s')\n",
                        cli->cmd, v ? v : "");
                return EXIT_USAGE;
            }
            cli->timeout_ms = (uint32_t)ms;
        } else {
            fprintf(stderr, "kvpool %s: unknown option '%s' (usage: %s)\n", cli->cmd, a, usage);
            return EXIT_USAGE;
        }
    }
    return -1;
}

static int check_npos(cli_t *cli, int min, int max)
{
    if (cli->npos >= min && (max < 0 || cli->npos <= max))
        return -1;
    fprintf(stderr, "kvpool %s: %s arguments (usage: %s)\n", cli->cmd,
            cli->npos < min ? "missing" : "too many", cli->usage);
    return EXIT_USAGE;
}

/* A key from an argument; EXIT_USAGE (with the message) if its length is
 * out of range. */
static int arg_key(cli_t *cli, const char *s, kvp_key_t *k)
{
    size_t n = strlen(s);
    if (n == 0 || n > KVP_KEY_MAX) {
        fprintf(stderr, "kvpool %s: a key is 1..%u bytes (got %zu)\n", cli->cmd, KVP_KEY_MAX, n);
        return EXIT_USAGE;
    }
    k->data = s;
    k->len = (uint32_t)n;
    return -1;
}

/* Opens the pool under the watchdog. */
static int cli_open(cli_t *cli, const char *uri, kvp_pool_t **pool_p)
{
    wd_arm(cli, cli->timeout_ms, "opening the pool");
    kvp_status_t st = kvp_pool_open(uri, pool_p);
    wd_disarm(cli);
    if (st != KVP_OK)
        return cli_fail(cli, EXIT_ERROR, "cannot open '%s': %s", uri, kvp_status_str(st));
    return -1;
}

/* Closes the pool under the watchdog (close waits for ops in flight). */
static void cli_close(cli_t *cli, kvp_pool_t *pool)
{
    if (!pool)
        return;
    wd_arm(cli, cli->timeout_ms, "closing the pool");
    kvp_pool_close(pool);
    wd_disarm(cli);
}

/* Runs one op to completion with the command's timeout. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    kvp_status_t status;
} waiter_t;

static void waiter_cb(void *arg, kvp_status_t status)
{
    waiter_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static kvp_status_t run_op(cli_t *cli, kvp_pool_t *pool, kvp_op_t *op, const char *what)
{
    waiter_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    op->timeout_ms = cli->timeout_ms;
    op->cb = waiter_cb;
    op->cb_arg = &w;
    uint64_t wd_ms = (uint64_t)cli->timeout_ms + WATCHDOG_GRACE_MS;
    wd_arm(cli, wd_ms > UINT32_MAX ? UINT32_MAX : (uint32_t)wd_ms, what);
    kvp_status_t st = kvp_pool_submit(pool, op);
    if (st == KVP_INPROGRESS) {
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        st = w.status;
    }
    wd_disarm(cli);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    return st;
}

/* "key" for messages: printable keys as they are, others shortened. */
static const char *key_for_msg(const kvp_key_t *k, char *buf, size_t len)
{
    size_t n = k->len < len - 4 ? k->len : len - 4;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = ((const unsigned char *)k->data)[i];
        buf[j++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    if (n < k->len) {
        memcpy(buf + j, "...", 3);
        j += 3;
    }
    buf[j] = 0;
    return buf;
}

/* ------------------------------------------------------------------------ */
/* Files.                                                                    */

/* Reads all of `path` ("-" = stdin) into a malloc'd buffer of at most
 * KVP_VALUE_MAX bytes.  Returns -1 on success, else the exit status (one
 * line printed). */
static int read_value(cli_t *cli, const char *path, char **buf_p, size_t *len_p)
{
    int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : 0;
    const char *name = strcmp(path, "-") ? path : "stdin";
    if (fd < 0)
        return cli_fail(cli, EXIT_ERROR, "cannot open %s: %s", name, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (fd)
            close(fd);
        return cli_fail(cli, EXIT_ERROR, "%s is a directory", name);
    }
    size_t cap = S_ISREG(sb.st_mode) && sb.st_size > 0 ? (size_t)sb.st_size + 1 : 65536;
    if (cap > KVP_VALUE_MAX + 1)
        cap = KVP_VALUE_MAX + 1;
    char *buf = malloc(cap);
    size_t len = 0;
    int rc = -1;
    if (!buf) {
        rc = cli_fail(cli, EXIT_ERROR, "out of memory reading %s", name);
        goto out;
    }
    for (;;) {
        if (len == cap) {
            if (cap > KVP_VALUE_MAX) {
                rc = cli_fail(cli, EXIT_ERROR, "%s is larger than the largest value (256 MiB)", name);
                goto out;
            }
            size_t ncap = cap * 2 > KVP_VALUE_MAX + 1 ? KVP_VALUE_MAX + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                rc = cli_fail(cli, EXIT_ERROR, "out of memory reading %s", name);
                goto out;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = cli_fail(cli, EXIT_ERROR, "cannot read %s: %s", name, strerror(errno));
            goto out;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    if (len == 0) {
        rc = cli_fail(cli, EXIT_ERROR, "%s is empty (a value is 1 B..256 MiB)", name);
        goto out;
    }
    *buf_p = buf;
    *len_p = len;
    buf = NULL;
out:
    free(buf);
    if (fd)
        close(fd);
    return rc;
}

/* Writes buf to `path` atomically: a temporary file in the same directory,
 * renamed over `path` only once every byte is written, so a failure never
 * leaves a partial file.  "-" writes stdout.  Returns -1 or an exit status. */
static int write_value(cli_t *cli, const char *path, const char *buf, size_t len)
{
    if (!strcmp(path, "-")) {
        if (fwrite(buf, 1, len, stdout) != len || fflush(stdout) != 0)
            return cli_fail(cli, EXIT_ERROR, "cannot write stdout: %s", strerror(errno));
        return -1;
    }
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 32);
    if (!tmp)
        return cli_fail(cli, EXIT_ERROR, "out of memory");
    snprintf(tmp, pl + 32, "%s.kvpool-tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(tmp);
        return cli_fail(cli, EXIT_ERROR, "cannot create a file beside %s: %s", path, strerror(e));
    }
    /* mkstemp makes 0600; the result gets what open(2) would give it. */
    mode_t um = umask(0);
    umask(um);
    const char *p = buf;
    size_t left = len;
    int err = 0;
    while (left && !err) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            err = w < 0 ? errno : EIO;
        else {
            p += w;
            left -= (size_t)w;
        }
    }
    if (!err && fchmod(fd, 0666 & ~um) != 0)
        err = errno;
    if (close(fd) != 0 && !err)
        err = errno;
    if (!err && rename(tmp, path) != 0)
        err = errno;
    if (err) {
        unlink(tmp);
        free(tmp);
        return cli_fail(cli, EXIT_ERROR, "cannot write %s: %s", path, strerror(err));
    }
    free(tmp);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Commands.                                                                 */

static const char common_help[] =
    "  --timeout MS   limit for each pool call (default 10000)\n"
    "  --verbose      show library log lines as they happen\n"
    "exit status: 0 ok, 1 key not found (get, rm), 2 bad command line,\n"
    "             3 any other error (bad URI, server unreachable, I/O, timeout);\n"
    "a failure prints one line on stderr.\n";

int kvp_cmd_put(int argc, char **argv)
{
    cli_t cli;
    static const char usage[] = "kvpool put URI KEY FILE [--timeout MS]";
    char help[1024];
    snprintf(help, sizeof help,
             "Stores the contents of FILE (\"-\" = stdin; 1 B..256 MiB) under KEY.\n"
             "A key that already exists is left as it is and the command succeeds.\n%s",
             common_help);
    int rc = cli_parse(&cli, argc, argv, usage, help, 0, 0);
    if (rc < 0)
        rc = check_npos(&cli, 3, 3);
    if (rc >= 0) {
        free(cli.pos);
        return rc;
    }
    kvp_key_t key;
    char *val = NULL;
    size_t len = 0;
    kvp_pool_t *pool = NULL;
    if ((rc = arg_key(&cli, cli.pos[1], &key)) >= 0)
        goto out_args;
    cli_start(&cli);
    if ((rc = read_value(&cli, cli.pos[2], &val, &len)) >= 0)
        goto out;
    if ((rc = cli_open(&cli, cli.pos[0], &pool)) >= 0)
        goto out;
    kvp_iov_t iov = {val, len};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t res = {0};
    kvp_op_t op = {.type = KVP_OP_PUT, .keys = &key, .n = 1, .values = &sgl, .results = &res};
    kvp_status_t st = run_op(&cli, pool, &op, "put");
    if (st == KVP_OK)
        st = res.status;
    char kb[80];
    if (st != KVP_OK)
        rc = cli_fail(&cli, EXIT_ERROR, "%s: %s", key_for_msg(&key, kb, sizeof kb), kvp_status_str(st));
    else
        rc = EXIT_OK;
out:
    cli_close(&cli, pool);
    free(val);
    rc = cli_finish(&cli, rc);
out_args:
    free(cli.pos);
    return rc;
}

int kvp_cmd_get(int argc, char **argv)
{
    cli_t cli;
    static const char usage[] = "kvpool get URI KEY FILE [--timeout MS]";
    char help[1024];
    snprintf(help, sizeof help,
             "Writes the value stored under KEY to FILE (\"-\" = stdout).  FILE is replaced\n"
             "atomically: on any failure it is left as it was.\n%s",
             common_help);
    int rc = cli_parse(&cli, argc, argv, usage, help, 0, 0);
    if (rc < 0)
        rc = check_npos(&cli, 3, 3);
    if (rc >= 0) {
        free(cli.pos);
        return rc;
    }
    kvp_key_t key;
    char *buf = NULL;
    kvp_pool_t *pool = NULL;
    char kb[80];
    if ((rc = arg_key(&cli, cli.pos[1], &key)) >= 0)
        goto out_args;
    cli_start(&cli);
    if ((rc = cli_open(&cli, cli.pos[0], &pool)) >= 0)
        goto out;
    /* The size is known only once the pool answers: try a buffer, and on
     * BUFFER_TOO_SMALL retry with the size it reports.  Values are immutable,
     * but the key may be removed and stored again in between, hence a few
     * rounds. */
    size_t cap = GET_FIRST_BUF;
    kvp_key_result_t res = {0};
    kvp_status_t st = KVP_OK;
    for (int round = 0; round < 4; round++) {
        free(buf);
        buf = malloc(cap);
        if (!buf) {
            rc = cli_fail(&cli, EXIT_ERROR, "out of memory for a %zu-byte value", cap);
            goto out;
        }
        kvp_iov_t iov = {buf, cap};
        kvp_sgl_t sgl = {&iov, 1};
        memset(&res, 0, sizeof res);
        kvp_op_t op = {.type = KVP_OP_GET, .keys = &key, .n = 1, .values = &sgl, .results = &res};
        st = run_op(&cli, pool, &op, "get");
        if (st == KVP_OK)
            st = res.status;
        if (st != KVP_ERR_BUFFER_TOO_SMALL)
            break;
        if (res.size <= cap || res.size > KVP_VALUE_MAX) {
            rc = cli_fail(&cli, EXIT_ERROR, "%s: the pool reported an impossible size %" PRIu64,
                          key_for_msg(&key, kb, sizeof kb), res.size);
            goto out;
        }
        cap = (size_t)res.size;
    }
    if (st == KVP_ERR_NOT_FOUND) {
        rc = cli_fail(&cli, EXIT_NOT_FOUND, "%s: not found", key_for_msg(&key, kb, sizeof kb));
        goto out;
    }
    if (st != KVP_OK) {
        rc = cli_fail(&cli, EXIT_ERROR, "%s: %s", key_for_msg(&key, kb, sizeof kb), kvp_status_str(st));
        goto out;
    }
    if (res.size == 0 || res.size > cap) {
        rc = cli_fail(&cli, EXIT_ERROR, "%s: the pool reported an impossible size %" PRIu64,
                      key_for_msg(&key, kb, sizeof kb), res.size);
        goto out;
    }
    rc = write_value(&cli, cli.pos[2], buf, (size_t)res.size);
    if (rc < 0)
        rc = EXIT_OK;
out:
    cli_close(&cli, pool);
    free(buf);
    rc = cli_finish(&cli, rc);
out_args:
    free(cli.pos);
    return rc;
}

/* Sorts key indices so duplicates are adjacent (pool batches refuse a key
 * given twice; the command answers for every argument in order). */
static const kvp_key_t *g_sort_keys;
static int key_cmp(const kvp_key_t *x, const kvp_key_t *y)
{
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return memcmp(x->data, y->data, x->len);
}
static int cmp_key_idx(const void *a, const void *b)
{
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    int c = key_cmp(&g_sort_keys[i], &g_sort_keys[j]);
    return c ? c : (i < j ? -1 : i > j);
}

int kvp_cmd_exists(int argc, char **argv)
{
    cli_t cli;
    static const char usage[] = "kvpool exists URI KEY... [--timeout MS]";
    char help[1024];
    snprintf(help, sizeof help,
             "Prints 1 or 0 for each KEY, one per line, in order: whether it is in the pool.\n"
             "Exits 0 whether or not the keys exist.\n%s",
             common_help);
    int rc = cli_parse(&cli, argc, argv, usage, help, 0, 0);
    if (rc < 0)
        rc = check_npos(&cli, 2, -1);
    if (rc >= 0) {
        free(cli.pos);
        return rc;
    }
    size_t n = (size_t)cli.npos - 1;
    kvp_key_t *keys = calloc(n, sizeof *keys), *uniq = calloc(n, sizeof *uniq);
    size_t *idx = calloc(n, sizeof *idx), *map = calloc(n, sizeof *map);
    uint8_t *present = calloc(n, 1);
    kvp_pool_t *pool = NULL;
    if (!keys || !uniq || !idx || !map || !present) {
        fprintf(stderr, "kvpool exists: out of memory\n");
        rc = EXIT_ERROR;
        goto out_args;
    }
    for (size_t i = 0; i < n; i++) {
        if ((rc = arg_key(&cli, cli.pos[i + 1], &keys[i])) >= 0)
            goto out_args;
        idx[i] = i;
    }
    g_sort_keys = keys;
    qsort(idx, n, sizeof *idx, cmp_key_idx);
    size_t nu = 0;
    for (size_t j = 0; j < n; j++) {
        size_t i = idx[j];
        if (j == 0 || key_cmp(&keys[idx[j - 1]], &keys[i]) != 0)
            uniq[nu++] = keys[i];
        map[i] = nu - 1;
    }
    cli_start(&cli);
    if ((rc = cli_open(&cli, cli.pos[0], &pool)) >= 0)
        goto out;
    for (size_t off = 0; off < nu; off += KVP_BATCH_MAX) {
        size_t m = nu - off < KVP_BATCH_MAX ? nu - off : KVP_BATCH_MAX;
        kvp_op_t op = {.type = KVP_OP_EXISTS, .keys = uniq + off, .n = m, .present = present + off};
        kvp_status_t st = run_op(&cli, pool, &op, "exists");
        if (st != KVP_OK) {
            rc = cli_fail(&cli, EXIT_ERROR, "%s", kvp_status_str(st));
            goto out;
        }
    }
    for (size_t i = 0; i < n; i++)
        printf("%d\n", present[map[i]] ? 1 : 0);
    if (fflush(stdout) != 0)
        rc = cli_fail(&cli, EXIT_ERROR, "cannot write stdout: %s", strerror(errno));
    else
        rc = EXIT_OK;
out:
    cli_close(&cli, pool);
    rc = cli_finish(&cli, rc);
out_args:
    free(keys);
    free(uniq);
    free(idx);
    free(map);
    free(present);
    free(cli.pos);
    return rc;
}

int kvp_cmd_rm(int argc, char **argv)
{
    cli_t cli;
    static const char usage[] = "kvpool rm URI KEY [-f] [--timeout MS]";
    char help[1024];
    snprintf(help, sizeof help,
             "Removes KEY from the pool.  A missing key exits 1, unless -f (--force) is given.\n%s",
             common_help);
    int rc = cli_parse(&cli, argc, argv, usage, help, 0, 1);
    if (rc < 0)
        rc = check_npos(&cli, 2, 2);
    if (rc >= 0) {
        free(cli.pos);
        return rc;
    }
    kvp_key_t key;
    kvp_pool_t *pool = NULL;
    char kb[80];
    if ((rc = arg_key(&cli, cli.pos[1], &key)) >= 0)
        goto out_args;
    cli_start(&cli);
    if ((rc = cli_open(&cli, cli.pos[0], &pool)) >= 0)
        goto out;
    kvp_key_result_t res = {0};
    kvp_op_t op = {.type = KVP_OP_REMOVE, .keys = &key, .n = 1, .results = &res};
    kvp_status_t st = run_op(&cli, pool, &op, "rm");
    if (st == KVP_OK)
        st = res.status;
    if (st == KVP_OK || (st == KVP_ERR_NOT_FOUND && cli.force))
        rc = EXIT_OK;
    else if (st == KVP_ERR_NOT_FOUND)
        rc = cli_fail(&cli, EXIT_NOT_FOUND, "%s: not found", key_for_msg(&key, kb, sizeof kb));
    else
        rc = cli_fail(&cli, EXIT_ERROR, "%s: %s", key_for_msg(&key, kb, sizeof kb), kvp_status_str(st));
out:
    cli_close(&cli, pool);
    rc = cli_finish(&cli, rc);
out_args:
    free(cli.pos);
    return rc;
}

int kvp_cmd_reset(int argc, char **argv)
{
    cli_t cli;
    static const char usage[] = "kvpool reset URI [--timeout MS]";
    char help[1024];
    snprintf(help, sizeof help,
             "Drops every object in the pool (counted under `reset` in its stats) and\n"
             "prints how many were dropped.\n%s",
             common_help);
    int rc = cli_parse(&cli, argc, argv, usage, help, 0, 0);
    if (rc < 0)
        rc = check_npos(&cli, 1, 1);
    if (rc >= 0) {
        free(cli.pos);
        return rc;
    }
    kvp_pool_t *pool = NULL;
    cli_start(&cli);
    if ((rc = cli_open(&cli, cli.pos[0], &pool)) >= 0)
        goto out;
    uint64_t removed = 0;
    kvp_op_t op = {.type = KVP_OP_REMOVE_ALL, .removed = &removed};
    kvp_status_t st = run_op(&cli, pool, &op, "reset");
    if (st != KVP_OK) {
        rc = cli_fail(&cli, EXIT_ERROR, "%s", kvp_status_str(st));
        goto out;
    }
    printf("%" PRIu64 "\n", removed);
    rc = fflush(stdout) == 0 ? EXIT_OK : cli_fail(&cli, EXIT_ERROR, "cannot write stdout: %s", strerror(errno));
out:
    cli_close(&cli, pool);
    rc = cli_finish(&cli, rc);
    free(cli.pos);
    return rc;
}

/* kvp_pool_stats_t, field by field, for --json and for people. */
#define STATS_FIELDS(X)                                                               \
    X(capacity_bytes, 1, "arena size")                                                \
    X(used_bytes, 1, "arena bytes allocated (live + reserved + in-flight frees)")     \
    X(live_bytes, 1, "value bytes of live objects")                                   \
    X(high_watermark_bytes, 1, "eviction starts above")                               \
    X(low_watermark_bytes, 1, "eviction frees down to")                               \
    X(index_bytes, 1, "heap bytes held by the index")                                 \
    X(evicted_bytes, 1, "value bytes evicted")                                        \
    X(live, 0, "committed objects now visible")                                       \
    X(committed, 0, "puts that created an object")                                    \
    X(evicted, 0, "left through eviction")                                            \
    X(removed, 0, "left through remove")                                              \
    X(reset, 0, "left through reset (remove_all)")                                    \
    X(expired_put, 0, "reservations reclaimed after put_timeout")                     \
    X(reserved, 0, "reservations open now (not visible)")                             \
    X(pinned, 0, "live objects pinned")                                               \
    X(leased, 0, "live objects under a read lease now")                               \
    X(put_existed, 0, "puts answered \"existed\"")                                    \
    X(put_no_space, 0, "puts refused for lack of space")                              \
    X(get_hits, 0, "gets that found their key")                                       \
    X(get_misses, 0, "gets that did not")

int kvp_cmd_stats(int argc, char **argv)
{
    cli_t cli;
    static const char usage[] = "kvpool stats URI [--json] [--timeout MS]";
    char help[1536];
    snprintf(help, sizeof help,
             "Prints the pool's statistics: every field of kvp_pool_stats_t, sizes\n"
             "human-readable, and the accounting identity\n"
             "  committed = live + evicted + removed + reset.\n"
             "  --json   one compact JSON object instead (sizes in bytes), with\n"
             "           \"identity_holds\": true|false\n"
             "A snapshot whose identity does not hold is reported and exits 3.\n%s",
             common_help);
    int rc = cli_parse(&cli, argc, argv, usage, help, 1, 0);
    if (rc < 0)
        rc = check_npos(&cli, 1, 1);
    if (rc >= 0) {
        free(cli.pos);
        return rc;
    }
    kvp_pool_t *pool = NULL;
    kvp_pool_stats_t s;
    memset(&s, 0, sizeof s);
    cli_start(&cli);
    if ((rc = cli_open(&cli, cli.pos[0], &pool)) >= 0)
        goto out;
    /* kvp_pool_stats takes no timeout: the watchdog bounds it. */
    wd_arm(&cli, cli.timeout_ms, "stats");
    kvp_status_t st = kvp_pool_stats(pool, &s);
    wd_disarm(&cli);
    if (st != KVP_OK) {
        rc = cli_fail(&cli, EXIT_ERROR, "%s", kvp_status_str(st));
        goto out;
    }
    uint64_t gone = s.live + s.evicted + s.removed + s.reset;
    int holds = s.committed == gone;
    if (cli.json) {
        printf("{");
#define X(f, sz, d) printf("\"%s\":%" PRIu64 ",", #f, s.f);
        STATS_FIELDS(X)
#undef X
        printf("\"identity_holds\":%s}\n", holds ? "true" : "false");
    } else {
        printf("pool %s\n", cli.pos[0]);
        char a[32], b[32];
        kvp__format_size(s.used_bytes, a, sizeof a);
        kvp__format_size(s.capacity_bytes, b, sizeof b);
        double pct = s.capacity_bytes ? 100.0 * (double)s.used_bytes / (double)s.capacity_bytes : 0.0;
        printf("  memory      %s of %s used (%.1f %%)\n", a, b, pct);
#define X(f, sz, d)                                                                  \
    do {                                                                             \
        char v[48];                                                                  \
        if (sz) {                                                                    \
            char h[32];                                                              \
            kvp__format_size(s.f, h, sizeof h);                                      \
            snprintf(v, sizeof v, "%s", h);                                          \
        } else {                                                                     \
            snprintf(v, sizeof v, "%" PRIu64, s.f);                                  \
        }                                                                            \
        printf("  %-22s %14s   %s\n", #f, v, d);                                     \
    } while (0);
        STATS_FIELDS(X)
#undef X
        printf("  accounting  committed %" PRIu64 " = live %" PRIu64 " + evicted %" PRIu64
               " + removed %" PRIu64 " + reset %" PRIu64 "   %s\n",
               s.committed, s.live, s.evicted, s.removed, s.reset,
               holds ? "(holds)" : "(DOES NOT HOLD)");
    }
    if (fflush(stdout) != 0) {
        rc = cli_fail(&cli, EXIT_ERROR, "cannot write stdout: %s", strerror(errno));
        goto out;
    }
    if (!holds) {
        rc = cli_fail(&cli, EXIT_ERROR,
                      "accounting identity violated: committed %" PRIu64 " != live + evicted + removed + reset = %" PRIu64,
                      s.committed, gone);
        goto out;
    }
    rc = EXIT_OK;
out:
    cli_close(&cli, pool);
    rc = cli_finish(&cli, rc);
    free(cli.pos);
    return rc;
}
