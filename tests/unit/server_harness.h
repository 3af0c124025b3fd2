/*
 * Test harness for tests against real `kvpool server` processes on
 * 127.0.0.1 (test_server*.c): start and stop a server, open clients,
 * patterned values, its metrics, and raw frames on kvpool's TCP transport.
 */
#ifndef KVP_TEST_SERVER_HARNESS_H
#define KVP_TEST_SERVER_HARNESS_H

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvpool/pool.h"
#include "net/handshake.h"
#include "net/lane.h"
#include "net/wire.h"
#include "test.h"

typedef struct {
    pid_t pid;
    uint16_t port;
    char uri[128];
    char dir[64];
    int metrics;            /* set before server_start: serve Prometheus text on a port the
                             * server picks (--metrics-port 0), read into metrics_port */
    uint16_t metrics_port;  /* with metrics: the port the server chose */
    const char *extra;      /* set before server_start: more server flags, space-separated
                             * (e.g. "--no-local-reads --put-timeout 2s") */
    int nofile;             /* set before server_start: the server's descriptor limit (soft and hard) */
    const char *host;       /* set before server_start: listen address (default 127.0.0.1) */
    const char *netns;      /* set before server_start: run in this network namespace */
} server_t;

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts `kvpool server` (plus s->extra, if set); port 0 = any (read from
 * the port file), else that port; token: required from clients if set. */
static inline void server_start(server_t *s, const char *memory, uint16_t port, const char *token)
{
    const char *bin = getenv("KVP_BIN");
    ASSERT_MSG(bin != NULL, "KVP_BIN not set (run through ctest)");
    if (!s->dir[0]) {
        snprintf(s->dir, sizeof s->dir, "/tmp/kvp-test-XXXXXX");
        ASSERT(mkdtemp(s->dir) != NULL);
    }
    char portfile[128], mportfile[128], listen[64], tokfile[128];
    snprintf(portfile, sizeof portfile, "%s/port", s->dir);
    snprintf(mportfile, sizeof mportfile, "%s/metrics-port", s->dir);
    snprintf(tokfile, sizeof tokfile, "%s/token", s->dir);
    unlink(portfile);
    unlink(mportfile);
    const char *host = s->host ? s->host : "127.0.0.1";
    snprintf(listen, sizeof listen, "%s:%u", host, port);
    if (token) {
        FILE *f = fopen(tokfile, "w");
        ASSERT(f);
        fprintf(f, "%s\n", token);
        fclose(f);
    }
    s->pid = fork();
    ASSERT(s->pid >= 0);
    if (s->pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        /* The server's log goes to <dir>/server.log (kept for post-mortems),
         * or to the test's stderr with KVP_TEST_SERVER_LOG=1. */
        char logf[160];
        snprintf(logf, sizeof logf, "%s/server.log", s->dir);
        int logfd = open(logf, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (!getenv("KVP_TEST_SERVER_LOG") && logfd >= 0)
            dup2(logfd, 2);
        if (s->nofile) {
            struct rlimit rl = {(rlim_t)s->nofile, (rlim_t)s->nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        const char *argv[44] = {bin, "server", "--listen", listen, "--memory", memory, "--port-file", portfile,
                                "--log-level", "warn"};
        int argc = 10;
        if (s->netns) { /* ip netns exec NS kvpool server ... */
            memmove(argv + 4, argv, (size_t)argc * sizeof *argv);
            argv[0] = "/usr/sbin/ip";
            argv[1] = "netns";
            argv[2] = "exec";
            argv[3] = s->netns;
            argc += 4;
        }
        if (token) {
            argv[argc++] = "--token-file";
            argv[argc++] = tokfile;
        }
        if (s->metrics) {
            argv[argc++] = "--metrics-port";
            argv[argc++] = "0";
            argv[argc++] = "--metrics-port-file";
            argv[argc++] = mportfile;
        }
        static char extra[512];
        snprintf(extra, sizeof extra, "%s", s->extra ? s->extra : "");
        for (char *save = NULL, *t = strtok_r(extra, " ", &save); t && argc < 38; t = strtok_r(NULL, " ", &save))
            argv[argc++] = t;
        argv[argc] = NULL;
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(portfile, "r");
        unsigned p = 0;
        if (f && fscanf(f, "%u", &p) == 1) {
            fclose(f);
            s->port = (uint16_t)p;
            if (s->metrics) { /* written before the port file */
                f = fopen(mportfile, "r");
                ASSERT_MSG(f && fscanf(f, "%u", &p) == 1 && p > 0 && p < 65536, "no metrics port in %s", mportfile);
                fclose(f);
                s->metrics_port = (uint16_t)p;
            }
            snprintf(s->uri, sizeof s->uri, "kvpool://%s:%u?timeout=%s", host, s->port,
                     getenv("KVP_TEST_CALL_TIMEOUT") ? getenv("KVP_TEST_CALL_TIMEOUT") : "30s");
            return;
        }
        if (f)
            fclose(f);
        int st;
        ASSERT_MSG(waitpid(s->pid, &st, WNOHANG) == 0, "server exited at start");
        sleep_ms(10);
    }
    ASSERT_MSG(0, "server did not start");
}

/* A server with a metrics endpoint on a port it picks, no token. */
static inline void server_start_metrics(server_t *s, const char *memory)
{
    s->metrics = 1;
    server_start(s, memory, 0, NULL);
}

/* Prints the server's log when it ended other than by the signal we sent. */
static inline void server_postmortem(server_t *s, int st, int sig)
{
    if (WIFSIGNALED(st) && WTERMSIG(st) == sig)
        return;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "tail -n 40 %s/server.log >&2", s->dir);
    fprintf(stderr, "  server ended with status 0x%x; its log:\n", st);
    (void)!system(cmd);
}

/* Removes the server's directory (port file, log, token). */
static inline void server_dir_remove(server_t *s)
{
    const char *files[] = {"port", "port.tmp", "metrics-port", "metrics-port.tmp", "server.log", "token"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char f[160];
        snprintf(f, sizeof f, "%s/%s", s->dir, files[i]);
        unlink(f);
    }
    rmdir(s->dir);
    s->dir[0] = 0;
}

static inline int server_stop(server_t *s, int sig)
{
    int st = 0;
    if (s->pid > 0) {
        kill(s->pid, sig);
        waitpid(s->pid, &st, 0);
        server_postmortem(s, st, sig);
        s->pid = 0;
        /* An expected end: the log is not needed any more (an unexpected
         * one keeps the directory for the post-mortem). */
        if ((WIFSIGNALED(st) && WTERMSIG(st) == sig) || (WIFEXITED(st) && WEXITSTATUS(st) == 0))
            server_dir_remove(s);
    }
    return st;
}

static inline kvp_pool_t *open_ok(const char *uri)
{
    kvp_pool_t *p = NULL;
    kvp_status_t st = kvp_pool_open(uri, &p);
    ASSERT_MSG(st == KVP_OK, "open %s: %s", uri, kvp_status_name(st));
    return p;
}

/* ... and against kvpool's TCP transport (net/lane.h) instead of UCX. */
static inline const char *lane_uri(const server_t *s)
{
    static char uri[sizeof s->uri + 32];
    snprintf(uri, sizeof uri, "%s&transport=tcp", s->uri);
    return uri;
}

static inline void put_pattern(kvp_pool_t *p, const char *key, size_t size, uint8_t seed, kvp_status_t *st_p)
{
    char *v = malloc(size);
    for (size_t i = 0; i < size; i++)
        v[i] = (char)(seed + i * 7);
    kvp_key_t k = kvp_key_str(key);
    kvp_iov_t iov = {v, size};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    kvp_status_t st = kvp_pool_put(p, &k, &sgl, 1, &r);
    *st_p = st != KVP_OK ? st : r.status;
    free(v);
}

/* Waits (up to 3 s) until the pool holds no reservation (a killed client's
 * put has been aborted), then checks that every committed object is
 * accounted for; *st: the last stats. */
static inline void await_reservations_gone(kvp_pool_t *p, kvp_pool_stats_t *st)
{
    for (int i = 0; i < 300; i++) {
        ASSERT_OK(kvp_pool_stats(p, st));
        if (st->reserved == 0)
            break;
        sleep_ms(10);
    }
    ASSERT_EQ(st->reserved, 0);
    ASSERT_EQ(st->committed, st->live + st->evicted + st->removed + st->reset);
}

/* 1 if key holds the full pattern, 0 if absent; fails on a partial value. */
static inline int check_pattern(kvp_pool_t *p, const char *key, size_t size, uint8_t seed)
{
    char *v = malloc(size);
    kvp_key_t k = kvp_key_str(key);
    kvp_iov_t iov = {v, size};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    ASSERT_OK(kvp_pool_get(p, &k, &sgl, 1, &r));
    if (r.status == KVP_ERR_NOT_FOUND) {
        free(v);
        return 0;
    }
    ASSERT_EQ(r.status, KVP_OK);
    ASSERT_EQ(r.size, size);
    for (size_t i = 0; i < size; i++)
        ASSERT_MSG(v[i] == (char)(seed + i * 7), "%s: byte %zu wrong", key, i);
    free(v);
    return 1;
}

static inline int tcp_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(0x7f000001)};
    ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    return fd;
}

static inline int lane_raw_connect(uint16_t port, uint64_t *key)
{
    kvp__hs_result_t hs;
    ASSERT_OK(kvp__hs_client("127.0.0.1", port, NULL, KVP_HS_WANT_TCP, 5000, &hs));
    ASSERT_EQ(hs.transport, KVP_HS_TCP);
    fcntl(hs.fd, F_SETFL, fcntl(hs.fd, F_GETFL) & ~O_NONBLOCK);
    *key = hs.conn_key;
    return hs.fd;
}

static inline void lane_raw_frame(int fd, const void *hdr, uint32_t hlen, uint64_t data_claimed, const void *data,
                           size_t dlen)
{
    uint8_t head[KVP_LANE_HEAD];
    kvp__lane_head_encode(head, hlen, data_claimed);
    (void)!send(fd, head, sizeof head, MSG_NOSIGNAL);
    if (hlen)
        (void)!send(fd, hdr, hlen, MSG_NOSIGNAL);
    if (dlen)
        (void)!send(fd, data, dlen, MSG_NOSIGNAL);
}

/* The next frame on fd within 5 s: 1 = a reply (*hdr_p: its header,
 * malloc'd, decoded into *rep; *data_p: the bytes of values that follow,
 * still unread), 0 = the server closed the connection. */
static inline int lane_raw_reply(int fd, uint8_t **hdr_p, kvp__wire_reply_t *rep, uint64_t *data_p)
{
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    ASSERT_MSG(poll(&pf, 1, 5000) == 1, "no answer and no close within 5 s");
    uint8_t head[KVP_LANE_HEAD];
    ssize_t k = recv(fd, head, sizeof head, MSG_WAITALL);
    if (k <= 0)
        return 0;
    ASSERT_EQ(k, (ssize_t)sizeof head);
    uint32_t hl;
    ASSERT_EQ(kvp__lane_head_decode(head, &hl, data_p), 0);
    *hdr_p = malloc(hl);
    ASSERT_EQ(recv(fd, *hdr_p, hl, MSG_WAITALL), (ssize_t)hl);
    ASSERT_OK(kvp__wire_reply_decode(*hdr_p, hl, rep));
    return 1;
}

/* The next event on fd within 5 s: 1 = a reply frame (its op and status
 * returned, its values read and dropped), 0 = the server closed the
 * connection. */
static inline int lane_raw_next(int fd, uint32_t *op, kvp_status_t *status)
{
    uint8_t *hdr;
    kvp__wire_reply_t rep;
    uint64_t dl;
    if (!lane_raw_reply(fd, &hdr, &rep, &dl))
        return 0;
    free(hdr);
    for (uint64_t left = dl; left;) {
        char sink[4096];
        ssize_t r = recv(fd, sink, left < sizeof sink ? left : sizeof sink, 0);
        ASSERT(r > 0);
        left -= (uint64_t)r;
    }
    *op = rep.op;
    *status = rep.status;
    return 1;
}

static inline void lane_expect_closed(int fd)
{
    uint32_t op;
    kvp_status_t st;
    ASSERT_EQ(lane_raw_next(fd, &op, &st), 0);
    close(fd);
}

/* GET /metrics; returns the body (malloc'd) or NULL. */
static inline char *http_metrics(uint16_t port)
{
    int fd = tcp_connect(port);
    const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    ASSERT_EQ(send(fd, req, sizeof req - 1, MSG_NOSIGNAL), (ssize_t)(sizeof req - 1));
    size_t cap = 1 << 20, len = 0;
    char *buf = malloc(cap);
    ssize_t k;
    while ((k = recv(fd, buf + len, cap - 1 - len, 0)) > 0)
        len += (size_t)k;
    close(fd);
    buf[len] = 0;
    ASSERT_MSG(strstr(buf, " 200 ") != NULL, "metrics answered: %.80s", buf);
    char *body = strstr(buf, "\r\n\r\n");
    ASSERT(body != NULL);
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* The value of the sample line that starts with `series ` (-1 if none). */
static inline double metric(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, series, n) && l[n] == ' ')
            return strtod(l + n + 1, NULL);
    return -1;
}

/* The server's metrics text (malloc'd), waiting (4 s at most) for the
 * endpoint to come up. */
static inline char *metrics_get(const server_t *s)
{
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(s->metrics_port),
                                 .sin_addr.s_addr = htonl(0x7f000001)};
        int up = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0;
        close(fd);
        if (up)
            return http_metrics(s->metrics_port);
        sleep_ms(20);
    }
    ASSERT_MSG(0, "no metrics endpoint on port %u", s->metrics_port);
    return NULL;
}

static inline double metric_now(const server_t *s, const char *series)
{
    char *m = metrics_get(s);
    double v = metric(m, series);
    free(m);
    return v;
}

/* Waits up to ms for a series to reach want; returns its last value. */
static inline double metric_until(const server_t *s, const char *series, double want, int ms)
{
    double v = -1;
    for (int i = 0; i <= ms / 50; i++) {
        if ((v = metric_now(s, series)) == want)
            return v;
        sleep_ms(50);
    }
    return v;
}

/* A listening socket on 127.0.0.1 (a fake server's); *port_p its port. */
static inline int listen_loopback(uint16_t *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t sl = sizeof sa;
    ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ASSERT_EQ(listen(fd, 4), 0);
    ASSERT_EQ(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    *port_p = ntohs(sa.sin_port);
    return fd;
}

#endif
