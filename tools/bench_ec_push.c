/*
 * `kvpool bench --ec-push [--runs N (3)] [--sizes a,b,c] [--json]`
 *
 * The EC push data plane between two processes on 127.0.0.1: a receiver
 * process (forked per path, so each gets the UCX configuration of its
 * phase) and this process writing through kvp__ec_push_tx_write.  For each
 * size (default 64 KiB, 4 MiB, 64 MiB) and each path, writes go to
 * rotating slots of a 128 MiB slab, about 256 MiB per measurement; the
 * figure is the median over --runs measurements, GB/s = bytes / time from
 * the start of the first write to the return of the last (each write
 * returns only once its bytes are in the slot).
 *
 * Paths:
 *   tcp        the receiver's data port (kvpool's stream; UCX off)
 *   ucx        UCX RMA into a UCX-allocated slab (one-sided over posix/sysv)
 *   auto       both offered; the producer's own choice (reported)
 *   ucx_emul   UCX RMA into a borrowed (malloc'd) slab: UCX's software
 *              emulation, progressed by the receiver's thread (forced)
 *   ucx_tcp    UCX_TLS=tcp, UCX RMA over UCX's tcp (forced: kvpool keeps
 *              tcp out of UCX otherwise)
 *   auto_tcp   UCX_TLS=tcp, both paths asked: what AUTO picks there
 * Baselines measured in the same run: memcpy (one thread, same sizes and
 * rotating destinations), raw loopback TCP (plain send/recv of the same
 * sizes, one-byte acknowledgement per message, as the push's status).
 * Ratios: ucx / memcpy (issue target >= 0.60), tcp / raw TCP and auto_tcp /
 * raw TCP (>= 0.70).
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "common/clock.h"
#include "common/log.h"
#include "support/ec_push_drive.h"

#define SLAB_BYTES (128ull << 20)
#define TARGET_BYTES (256ull << 20)
#define MAX_RUNS 9
#define MAX_SIZES 4

static uint64_t iters_for(uint64_t size)
{
    uint64_t n = TARGET_BYTES / size;
    return n < 4 ? 4 : n;
}

static double memcpy_gbps(uint64_t size, uint8_t *src, uint8_t *dst)
{
    uint64_t n = iters_for(size), slots = SLAB_BYTES / size;
    uint64_t t0 = kvp__now_ns();
    for (uint64_t i = 0; i < n; i++)
        memcpy(dst + (i % slots) * size, src, size);
    return (double)(n * size) / (double)(kvp__now_ns() - t0);
}

/* ---- raw loopback TCP ---- */
static int listen_any(uint16_t *port_p)
{
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 4) || getsockname(ls, (struct sockaddr *)&sa, &sl))
        return -1;
    *port_p = ntohs(sa.sin_port);
    return ls;
}

static double raw_tcp_gbps(uint64_t size, uint8_t *src)
{
    uint16_t port;
    int ls = listen_any(&port);
    if (ls < 0)
        return 0;
    uint64_t n = iters_for(size), slots = SLAB_BYTES / size;
    pid_t pid = fork();
    if (pid == 0) {
        uint8_t *buf = kvp__pd_big(SLAB_BYTES);
        int fd = accept(ls, NULL, NULL);
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (send(fd, "r", 1, MSG_NOSIGNAL) != 1) /* ready: buffer faulted in */
            _exit(1);
        for (uint64_t i = 0; i < n && buf; i++) {
            uint8_t *at = buf + (i % slots) * size;
            for (uint64_t got = 0; got < size;) {
                ssize_t k = recv(fd, at + got, size - got, 0);
                if (k <= 0)
                    _exit(1);
                got += (uint64_t)k;
            }
            if (send(fd, "k", 1, MSG_NOSIGNAL) != 1)
                _exit(1);
        }
        _exit(0);
    }
    close(ls);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    double gbps = 0;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char rdy;
        uint64_t i = recv(fd, &rdy, 1, 0) == 1 ? 0 : n + 1;
        uint64_t t0 = kvp__now_ns();
        for (; i < n; i++) {
            uint64_t sent = 0;
            while (sent < size) {
                ssize_t k = send(fd, src + sent, size - sent, MSG_NOSIGNAL);
                if (k <= 0)
                    break;
                sent += (uint64_t)k;
            }
            char c;
            if (sent < size || recv(fd, &c, 1, 0) != 1)
                break;
        }
        if (i == n)
            gbps = (double)(n * size) / (double)(kvp__now_ns() - t0);
    }
    close(fd);
    waitpid(pid, NULL, 0);
    return gbps;
}

/* ---- the push paths ---- */
static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void size_name(uint64_t s, char *buf, size_t n)
{
    if (s >= (1u << 20) && s % (1u << 20) == 0)
        snprintf(buf, n, "%lluMiB", (unsigned long long)(s >> 20));
    else if (s >= 1024 && s % 1024 == 0)
        snprintf(buf, n, "%lluKiB", (unsigned long long)(s >> 10));
    else
        snprintf(buf, n, "%lluB", (unsigned long long)s);
}

int kvp_bench_ec_push(int argc, char **argv);
int kvp_bench_ec_push(int argc, char **argv)
{
    int runs = 3, json = 0, nsizes = 3;
    uint64_t sizes[MAX_SIZES] = {64u << 10, 4u << 20, 64u << 20};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes") && i + 1 < argc) {
            nsizes = 0;
            for (char *t = strtok(argv[++i], ","); t && nsizes < MAX_SIZES; t = strtok(NULL, ","))
                sizes[nsizes++] = strtoull(t, NULL, 0);
        } else if (strcmp(argv[i], "--ec-push") != 0) {
            fprintf(stderr, "usage: kvpool bench --ec-push [--runs N] [--sizes BYTES,...] [--json]\n");
            return 2;
        }
    }
    if (runs < 1 || runs > MAX_RUNS)
        runs = 3;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] == 0 || sizes[i] > SLAB_BYTES)
            return fprintf(stderr, "bench --ec-push: sizes 1..128 MiB\n"), 2;
    signal(SIGPIPE, SIG_IGN);
    uint8_t *src = kvp__pd_big(64u << 20 > sizes[nsizes - 1] ? 64u << 20 : sizes[nsizes - 1]);
    uint8_t *dst = kvp__pd_big(SLAB_BYTES);
    if (!src || !dst)
        return fprintf(stderr, "bench --ec-push: out of memory\n"), 1;
    const char *tls0 = getenv("UCX_TLS");
    char *saved_tls = tls0 ? strdup(tls0) : NULL;
    char jbuf[8192];
    size_t jl = (size_t)snprintf(jbuf, sizeof jbuf, "{\"runs\":%d,\"sizes\":[", runs);
    if (!json)
        printf("EC push, two processes on 127.0.0.1, medians of %d runs (GB/s)\n", runs);
    for (int si = 0; si < nsizes; si++) {
        uint64_t size = sizes[si];
        char sn[32];
        size_name(size, sn, sizeof sn);
        double mc[MAX_RUNS], raw[MAX_RUNS], med[KVP__PD_NUM] = {0};
        const char *used[KVP__PD_NUM];
        for (int r = 0; r < runs; r++) {
            mc[r] = memcpy_gbps(size, src, dst);
            raw[r] = raw_tcp_gbps(size, src);
        }
        double mcm = median(mc, runs), rawm = median(raw, runs);
        for (int p = 0; p < KVP__PD_NUM; p++) {
            if (p == KVP__PD_UCX_TCP || p == KVP__PD_AUTO_TCP)
                setenv("UCX_TLS", "tcp", 1);
            else if (saved_tls)
                setenv("UCX_TLS", saved_tls, 1);
            else
                unsetenv("UCX_TLS");
            double g[MAX_RUNS];
            if (kvp__pd_push_runs((kvp__pd_path_t)p, size, SLAB_BYTES, iters_for(size), runs, src, g, &used[p]) == 0)
                med[p] = median(g, runs);
        }
        if (saved_tls)
            setenv("UCX_TLS", saved_tls, 1);
        else
            unsetenv("UCX_TLS");
        if (!json) {
            printf("%s: memcpy %.2f  raw_tcp %.2f\n", sn, mcm, rawm);
            for (int p = 0; p < KVP__PD_NUM; p++)
                printf("  %-9s %6.2f  (path %s)%s\n", kvp__pd_path_names[p], med[p], used[p],
                       med[p] == 0 ? "  [not measured: the path failed]" : "");
            printf("  ratios: ucx/memcpy %.2f  auto/memcpy %.2f  tcp/raw_tcp %.2f  auto_tcp/raw_tcp %.2f  "
                   "ucx_tcp/raw_tcp %.2f\n",
                   med[KVP__PD_UCX] / mcm, med[KVP__PD_AUTO] / mcm, med[KVP__PD_TCP] / rawm, med[KVP__PD_AUTO_TCP] / rawm,
                   med[KVP__PD_UCX_TCP] / rawm);
        }
        jl += (size_t)snprintf(jbuf + jl, sizeof jbuf - jl,
                               "%s{\"size\":%llu,\"memcpy_gbps\":%.3f,\"raw_tcp_gbps\":%.3f", si ? "," : "",
                               (unsigned long long)size, mcm, rawm);
        for (int p = 0; p < KVP__PD_NUM && jl < sizeof jbuf; p++)
            jl += (size_t)snprintf(jbuf + jl, sizeof jbuf - jl, ",\"%s_gbps\":%.3f,\"%s_path\":\"%s\"",
                                   kvp__pd_path_names[p], med[p], kvp__pd_path_names[p], used[p]);
        if (jl < sizeof jbuf)
            jl += (size_t)snprintf(jbuf + jl, sizeof jbuf - jl, "}");
        fflush(stdout);
    }
    if (jl < sizeof jbuf)
        snprintf(jbuf + jl, sizeof jbuf - jl, "]}");
    if (json)
        printf("%s\n", jbuf);
    free(saved_tls);
    return 0;
}
