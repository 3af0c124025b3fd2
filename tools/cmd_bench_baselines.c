/*
 * `kvpool bench-baseline`: the baselines bench/compare.sh sets kvpool's
 * numbers against, measured with the same workload shape as `kvpool bench`
 * (count distinct sources of `size` bytes, read into count distinct,
 * pre-faulted destinations; every object moved once).
 *
 *   memcpy   one thread copying the count sources into the destinations, in
 *            the same shuffled order as `kvpool bench`'s baseline (op copy).
 *   tcp-raw  one loopback TCP connection per client carrying a stream of
 *            `size`-byte writes, read by a peer thread into the destinations.
 *            put: the client writes, the peer reads; get: the peer writes,
 *            the client reads.  No framing, no acks: the kernel's best case.
 *   redis    hiredis SET (put) / GET (get), one connection per client thread,
 *            distinct keys, each stored value read exactly once, no
 *            pipelining (pipelining large values collapses Redis here).  get
 *            first stores its keys untimed; everything stored is UNLINKed
 *            after the timed part.
 *
 * Throughput is bytes moved / wall time from the moment all clients start
 * until the last byte has arrived; latency is per op on the client side.
 * Output (--json): one compact object per run with the fields compare.sh
 * reports, system, transport, op, size, clients, gbps, p50_us, p99_us, then
 * count, ops_per_s and errors.
 */
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "commands.h"
#include "common/clock.h"
#include "common/mix.h"
#include "common/units.h"

#define FOOTPRINT_MAX (16ull << 30) /* sources + destinations */

typedef enum { SYS_MEMCPY, SYS_TCP_RAW, SYS_REDIS } bl_system_t;
typedef enum { BL_PUT, BL_GET, BL_COPY } bl_op_t;

typedef struct {
    bl_system_t sys;
    bl_op_t op;
    const char *sys_name, *op_name;
    uint64_t size, count;
    int clients;
    const char *redis_host;
    int redis_port;
    int json;
} bl_cfg_t;

typedef struct bl_run bl_run_t;

typedef struct {
    bl_run_t *run;
    int id;
    uint64_t from, to; /* object range of this client */
    double *lat_us;
    uint64_t nlat;
    int fd;            /* tcp-raw: client end */
    int peer_fd;       /* tcp-raw: peer end */
    redisContext *rc;  /* redis */
    uint64_t t_start, t_end, pt_start, pt_end; /* ns: this client's (and its peer's) timed part */
    char err[256];     /* first error of this client */
} bl_client_t;

struct bl_run {
    const bl_cfg_t *cfg;
    char *src_region, *dst_region;
    uint64_t *order;   /* memcpy: shuffled object order */
    bl_client_t *cl;
    pthread_barrier_t barrier; /* clients (+ peers) + main */
    _Atomic uint64_t errors;
    char key_prefix[64];
};

static void fill(char *p, uint64_t size, uint64_t seed)
{
    uint64_t s = seed, i = 0;
    for (; i + 8 <= size; i += 8) {
        uint64_t v = kvp__splitmix64(&s);
        memcpy(p + i, &v, 8);
    }
    for (; i < size; i++)
        p[i] = (char)seed;
}

static char *src_of(bl_run_t *r, uint64_t i) { return r->src_region + i * r->cfg->size; }
static char *dst_of(bl_run_t *r, uint64_t i) { return r->dst_region + i * r->cfg->size; }

static void client_error(bl_client_t *c, const char *fmt, const char *detail)
{
    atomic_fetch_add(&c->run->errors, 1);
    if (!c->err[0])
        snprintf(c->err, sizeof c->err, fmt, detail);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ------------------------------------------------------------------------ */
/* tcp-raw                                                                   */

static int write_full(int fd, const char *p, uint64_t len)
{
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        len -= (uint64_t)w;
    }
    return 0;
}

static int read_full(int fd, char *p, uint64_t len)
{
    while (len) {
        ssize_t r = read(fd, p, len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        len -= (uint64_t)r;
    }
    return 0;
}

/* The measured side of one connection: writes (put) or reads (get) each of
 * its objects, timing each. */
static void *tcp_client_main(void *arg)
{
    bl_client_t *c = arg;
    bl_run_t *r = c->run;
    uint64_t size = r->cfg->size;
    pthread_barrier_wait(&r->barrier);
    c->t_start = kvp__now_ns();
    for (uint64_t i = c->from; i < c->to; i++) {
        uint64_t t0 = kvp__now_ns();
        int rc = r->cfg->op == BL_PUT ? write_full(c->fd, src_of(r, i), size)
                                      : read_full(c->fd, dst_of(r, i), size);
        if (rc != 0) {
            client_error(c, "tcp-raw: %s", strerror(errno));
            break;
        }
        c->lat_us[c->nlat++] = (double)(kvp__now_ns() - t0) / 1e3;
    }
    c->t_end = kvp__now_ns();
    return NULL;
}

/* The peer of one connection: the other direction of the same stream. */
static void *tcp_peer_main(void *arg)
{
    bl_client_t *c = arg;
    bl_run_t *r = c->run;
    uint64_t size = r->cfg->size;
    pthread_barrier_wait(&r->barrier);
    c->pt_start = kvp__now_ns();
    for (uint64_t i = c->from; i < c->to; i++) {
        int rc = r->cfg->op == BL_PUT ? read_full(c->peer_fd, dst_of(r, i), size)
                                      : write_full(c->peer_fd, src_of(r, i), size);
        if (rc != 0) {
            client_error(c, "tcp-raw peer: %s", strerror(errno));
            break;
        }
    }
    c->pt_end = kvp__now_ns();
    return NULL;
}

/* Connects clients[i].fd to clients[i].peer_fd over 127.0.0.1. */
static int tcp_setup(bl_run_t *r, char *err, size_t errlen)
{
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 256) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &al) != 0) {
        snprintf(err, errlen, "tcp-raw: cannot listen on 127.0.0.1: %s", strerror(errno));
        if (ls >= 0)
            close(ls);
        return -1;
    }
    int one = 1;
    for (int i = 0; i < r->cfg->clients; i++) {
        bl_client_t *c = &r->cl[i];
        c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&a, sizeof a) != 0 ||
            (c->peer_fd = accept4(ls, NULL, NULL, SOCK_CLOEXEC)) < 0) {
            snprintf(err, errlen, "tcp-raw: cannot connect over loopback: %s", strerror(errno));
            close(ls);
            return -1;
        }
        /* a stalled stream fails after a minute instead of hanging */
        struct timeval tv = {60, 0};
        int fds[2] = {c->fd, c->peer_fd};
        for (int k = 0; k < 2; k++) {
            setsockopt(fds[k], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            setsockopt(fds[k], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            setsockopt(fds[k], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        }
    }
    close(ls);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* redis                                                                     */

static int redis_key(bl_run_t *r, uint64_t i, char *buf, size_t len)
{
    return snprintf(buf, len, "%s%" PRIu64, r->key_prefix, i);
}

/* One SET; 0 when the server answered OK. */
static int redis_set(bl_client_t *c, uint64_t i)
{
    bl_run_t *r = c->run;
    char key[96];
    int kl = redis_key(r, i, key, sizeof key);
    const char *argv[3] = {"SET", key, src_of(r, i)};
    size_t lens[3] = {3, (size_t)kl, (size_t)r->cfg->size};
    redisReply *rep = redisCommandArgv(c->rc, 3, argv, lens);
    if (!rep) {
        client_error(c, "redis SET: %s", c->rc->errstr);
        return -1;
    }
    int ok = rep->type == REDIS_REPLY_STATUS && !strcmp(rep->str, "OK");
    if (!ok)
        client_error(c, "redis SET: %s", rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
    freeReplyObject(rep);
    return ok ? 0 : -1;
}

/* One GET; the reply must be the stored value. */
static int redis_get(bl_client_t *c, uint64_t i)
{
    bl_run_t *r = c->run;
    char key[96];
    int kl = redis_key(r, i, key, sizeof key);
    const char *argv[2] = {"GET", key};
    size_t lens[2] = {3, (size_t)kl};
    redisReply *rep = redisCommandArgv(c->rc, 2, argv, lens);
    if (!rep) {
        client_error(c, "redis GET: %s", c->rc->errstr);
        return -1;
    }
    uint64_t size = r->cfg->size;
    int ok = rep->type == REDIS_REPLY_STRING && (uint64_t)rep->len == size &&
             memcmp(rep->str, src_of(r, i), size < 64 ? size : 64) == 0;
    if (!ok)
        client_error(c, "redis GET: %s",
                     rep->type == REDIS_REPLY_ERROR ? rep->str : "missing or wrong value");
    freeReplyObject(rep);
    return ok ? 0 : -1;
}

static void *redis_client_main(void *arg)
{
    bl_client_t *c = arg;
    bl_run_t *r = c->run;
    /* get: store this client's objects first, untimed */
    if (r->cfg->op == BL_GET)
        for (uint64_t i = c->from; i < c->to; i++)
            if (redis_set(c, i) != 0)
                break;
    pthread_barrier_wait(&r->barrier); /* everyone stored */
    pthread_barrier_wait(&r->barrier); /* start */
    c->t_start = c->t_end = kvp__now_ns();
    if (c->err[0])
        return NULL;
    for (uint64_t i = c->from; i < c->to; i++) {
        uint64_t t0 = kvp__now_ns();
        int rc = r->cfg->op == BL_PUT ? redis_set(c, i) : redis_get(c, i);
        if (rc != 0)
            break;
        c->lat_us[c->nlat++] = (double)(kvp__now_ns() - t0) / 1e3;
    }
    c->t_end = kvp__now_ns();
    return NULL;
}

/* Drops this run's keys (untimed; pipelined, the commands are small). */
static void redis_cleanup(bl_client_t *c)
{
    bl_run_t *r = c->run;
    const uint64_t batch = 256;
    for (uint64_t i = c->from; i < c->to; i += batch) {
        uint64_t end = i + batch < c->to ? i + batch : c->to;
        for (uint64_t k = i; k < end; k++) {
            char key[96];
            int kl = redis_key(r, k, key, sizeof key);
            const char *argv[2] = {"UNLINK", key};
            size_t lens[2] = {6, (size_t)kl};
            if (redisAppendCommandArgv(c->rc, 2, argv, lens) != REDIS_OK)
                return;
        }
        for (uint64_t k = i; k < end; k++) {
            void *rep = NULL;
            if (redisGetReply(c->rc, &rep) != REDIS_OK)
                return;
            freeReplyObject(rep);
        }
    }
}

static int redis_setup(bl_run_t *r, char *err, size_t errlen)
{
    struct timeval tv = {5, 0};
    struct timeval io = {120, 0};
    for (int i = 0; i < r->cfg->clients; i++) {
        bl_client_t *c = &r->cl[i];
        c->rc = redisConnectWithTimeout(r->cfg->redis_host, r->cfg->redis_port, tv);
        if (!c->rc || c->rc->err) {
            snprintf(err, errlen, "redis: cannot connect to %s:%d: %s", r->cfg->redis_host,
                     r->cfg->redis_port, c->rc ? c->rc->errstr : "out of memory");
            return -1;
        }
        redisSetTimeout(c->rc, io);
    }
    snprintf(r->key_prefix, sizeof r->key_prefix, "kvpool-baseline:%ld:%" PRIx64 ":", (long)getpid(),
             kvp__now_ns());
    return 0;
}

/* ------------------------------------------------------------------------ */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvpool bench-baseline --system tcp-raw|redis|memcpy --op put|get|copy\n"
            "                             --size BYTES --count N [--clients C]\n"
            "                             [--redis-host H] [--redis-port P] [--json]\n"
            "  memcpy: --op copy, one thread (as `kvpool bench` measures it);\n"
            "  tcp-raw: --op put|get, one loopback TCP stream per client;\n"
            "  redis: --op put|get, hiredis SET/GET, distinct keys, each value read once,\n"
            "         no pipelining, one connection per client (default 127.0.0.1:6379).\n"
            "  sizes accept B, KiB, MiB, GiB.  --json prints one compact object:\n"
            "  system, transport, op, size, clients, gbps, p50_us, p99_us, count, ops_per_s, errors.\n");
}

static int parse(int argc, char **argv, bl_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->sys_name = NULL;
    c->op_name = NULL;
    c->size = 1 << 20;
    c->count = 1000;
    c->clients = 1;
    c->redis_host = "127.0.0.1";
    c->redis_port = 6379;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--json")) {
            c->json = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "kvpool bench-baseline: %s needs a value\n", a);
            return 2;
        }
        i++;
        char *e = NULL;
        if (!strcmp(a, "--system"))
            c->sys_name = v;
        else if (!strcmp(a, "--op"))
            c->op_name = v;
        else if (!strcmp(a, "--redis-host"))
            c->redis_host = v;
        else if (!strcmp(a, "--size")) {
            if (kvp__parse_size(v, &c->size) != KVP_OK || c->size == 0 || c->size > (1ull << 30)) {
                fprintf(stderr, "kvpool bench-baseline: bad --size '%s' (1 B..1 GiB)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--count")) {
            errno = 0;
            c->count = strtoull(v, &e, 10);
            if (*e || !*v || errno || c->count == 0 || v[0] == '-') {
                fprintf(stderr, "kvpool bench-baseline: bad --count '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--clients")) {
            long n = strtol(v, &e, 10);
            if (*e || !*v || n < 1 || n > 256) {
                fprintf(stderr, "kvpool bench-baseline: --clients must be 1..256\n");
                return 2;
            }
            c->clients = (int)n;
        } else if (!strcmp(a, "--redis-port")) {
            long n = strtol(v, &e, 10);
            if (*e || !*v || n < 1 || n > 65535) {
                fprintf(stderr, "kvpool bench-baseline: bad --redis-port '%s'\n", v);
                return 2;
            }
            c->redis_port = (int)n;
        } else {
            fprintf(stderr, "kvpool bench-baseline: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!c->sys_name || !c->op_name) {
        fprintf(stderr, "kvpool bench-baseline: --system and --op are required\n");
        usage(stderr);
        return 2;
    }
    if (!strcmp(c->sys_name, "memcpy"))
        c->sys = SYS_MEMCPY;
    else if (!strcmp(c->sys_name, "tcp-raw"))
        c->sys = SYS_TCP_RAW;
    else if (!strcmp(c->sys_name, "redis"))
        c->sys = SYS_REDIS;
    else {
        fprintf(stderr, "kvpool bench-baseline: unknown --system '%s' (tcp-raw, redis, memcpy)\n",
                c->sys_name);
        return 2;
    }
    if (!strcmp(c->op_name, "put"))
        c->op = BL_PUT;
    else if (!strcmp(c->op_name, "get"))
        c->op = BL_GET;
    else if (!strcmp(c->op_name, "copy"))
        c->op = BL_COPY;
    else {
        fprintf(stderr, "kvpool bench-baseline: unknown --op '%s' (put, get, copy)\n", c->op_name);
        return 2;
    }
    if ((c->sys == SYS_MEMCPY) != (c->op == BL_COPY)) {
        fprintf(stderr, "kvpool bench-baseline: memcpy takes --op copy; tcp-raw and redis take put or get\n");
        return 2;
    }
    if (c->sys == SYS_MEMCPY && c->clients != 1) {
        fprintf(stderr, "kvpool bench-baseline: the memcpy baseline is one thread (--clients 1)\n");
        return 2;
    }
    if ((uint64_t)c->clients > c->count) {
        fprintf(stderr, "kvpool bench-baseline: --count must be at least --clients\n");
        return 2;
    }
    if (c->count > FOOTPRINT_MAX / 2 / c->size) {
        fprintf(stderr, "kvpool bench-baseline: count x size is over %llu GiB of buffers\n",
                (unsigned long long)(FOOTPRINT_MAX >> 31));
        return 2;
    }
    return -1;
}

int kvp_cmd_bench_baseline(int argc, char **argv)
{
    bl_cfg_t cfg;
    int prc = parse(argc, argv, &cfg);
    if (prc >= 0)
        return prc;

    bl_run_t r;
    memset(&r, 0, sizeof r);
    r.cfg = &cfg;
    int rc = 1, nclients = cfg.clients;
    uint64_t n = cfg.count, size = cfg.size, foot = n * size;
    char err[512] = "";
    double *all = NULL;
    pthread_t *tids = NULL, *ptids = NULL;
    int started = 0, pstarted = 0, barrier = 0;

    r.cl = calloc((size_t)nclients, sizeof *r.cl);
    r.order = malloc(sizeof *r.order * n);
    tids = calloc((size_t)nclients, sizeof *tids);
    ptids = calloc((size_t)nclients, sizeof *ptids);
    all = malloc(sizeof *all * (n + 1));
    r.src_region = mmap(NULL, foot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    r.dst_region = mmap(NULL, foot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r.src_region == MAP_FAILED)
        r.src_region = NULL;
    if (r.dst_region == MAP_FAILED)
        r.dst_region = NULL;
    if (!r.cl || !r.order || !tids || !ptids || !all || !r.src_region || !r.dst_region) {
        snprintf(err, sizeof err, "cannot allocate %" PRIu64 " bytes of buffers", 2 * foot);
        goto out;
    }
    /* Distinct contents; destinations faulted in before timing. */
    for (uint64_t i = 0; i < n; i++) {
        fill(src_of(&r, i), size, i + 1);
        memset(dst_of(&r, i), 0, size);
    }
    for (int t = 0; t < nclients; t++) {
        bl_client_t *c = &r.cl[t];
        c->run = &r;
        c->id = t;
        c->fd = c->peer_fd = -1;
        c->from = n * (uint64_t)t / (uint64_t)nclients;
        c->to = n * (uint64_t)(t + 1) / (uint64_t)nclients;
        c->lat_us = all + c->from; /* disjoint slices of one array */
    }

    uint64_t t0 = 0, t1 = 0;
    if (cfg.sys == SYS_MEMCPY) {
        uint64_t seed = 12345;
        for (uint64_t i = 0; i < n; i++)
            r.order[i] = i;
        for (uint64_t i = n; i > 1; i--) {
            uint64_t j = kvp__splitmix64(&seed) % i, tmp = r.order[i - 1];
            r.order[i - 1] = r.order[j];
            r.order[j] = tmp;
        }
        bl_client_t *c = &r.cl[0];
        t0 = kvp__now_ns();
        for (uint64_t i = 0; i < n; i++) {
            uint64_t s = kvp__now_ns(), k = r.order[i];
            memcpy(dst_of(&r, k), src_of(&r, k), size);
            c->lat_us[c->nlat++] = (double)(kvp__now_ns() - s) / 1e3;
        }
        t1 = kvp__now_ns();
        for (uint64_t i = 0; i < n; i += 1 + n / 64)
            if (memcmp(dst_of(&r, i), src_of(&r, i), size) != 0)
                atomic_fetch_add(&r.errors, 1);
    } else if (cfg.sys == SYS_TCP_RAW) {
        if (tcp_setup(&r, err, sizeof err) != 0)
            goto out;
        pthread_barrier_init(&r.barrier, NULL, (unsigned)(2 * nclients + 1));
        barrier = 1;
        for (int t = 0; t < nclients; t++) {
            if (pthread_create(&tids[t], NULL, tcp_client_main, &r.cl[t]) != 0)
                break;
            started++;
            if (pthread_create(&ptids[t], NULL, tcp_peer_main, &r.cl[t]) != 0)
                break;
            pstarted++;
        }
        if (pstarted < nclients) {
            /* cannot run: unblock what started (closing makes I/O fail) */
            snprintf(err, sizeof err, "cannot start %d threads", 2 * nclients);
            goto out;
        }
        pthread_barrier_wait(&r.barrier);
        for (int t = 0; t < nclients; t++) {
            pthread_join(tids[t], NULL);
            pthread_join(ptids[t], NULL);
        }
        started = pstarted = 0;
        /* from the first thread's start to the last byte's arrival */
        t0 = UINT64_MAX;
        for (int t = 0; t < nclients; t++) {
            bl_client_t *c = &r.cl[t];
            t0 = c->t_start < t0 ? c->t_start : t0;
            t0 = c->pt_start < t0 ? c->pt_start : t0;
            t1 = c->t_end > t1 ? c->t_end : t1;
            t1 = c->pt_end > t1 ? c->pt_end : t1;
        }
        for (uint64_t i = 0; i < n; i++)
            if (memcmp(dst_of(&r, i), src_of(&r, i), size < 64 ? size : 64) != 0) {
                atomic_fetch_add(&r.errors, 1);
                break;
            }
    } else {
        if (redis_setup(&r, err, sizeof err) != 0)
            goto out;
        pthread_barrier_init(&r.barrier, NULL, (unsigned)(nclients + 1));
        barrier = 1;
        for (int t = 0; t < nclients; t++) {
            if (pthread_create(&tids[t], NULL, redis_client_main, &r.cl[t]) != 0)
                break;
            started++;
        }
        if (started < nclients) {
            snprintf(err, sizeof err, "cannot start %d threads", nclients);
            goto out;
        }
        pthread_barrier_wait(&r.barrier); /* preload done */
        pthread_barrier_wait(&r.barrier);
        for (int t = 0; t < nclients; t++)
            pthread_join(tids[t], NULL);
        started = 0;
        t0 = UINT64_MAX;
        for (int t = 0; t < nclients; t++) {
            t0 = r.cl[t].t_start < t0 ? r.cl[t].t_start : t0;
            t1 = r.cl[t].t_end > t1 ? r.cl[t].t_end : t1;
        }
        for (int t = 0; t < nclients; t++)
            redis_cleanup(&r.cl[t]);
    }

    uint64_t errors = atomic_load(&r.errors);
    for (int t = 0; t < nclients && !err[0]; t++)
        if (r.cl[t].err[0])
            snprintf(err, sizeof err, "%s", r.cl[t].err);
    if (err[0])
        goto out;
    /* gather the per-client latency slices into one sorted array */
    uint64_t nl = 0;
    for (int t = 0; t < nclients; t++) {
        memmove(all + nl, r.cl[t].lat_us, sizeof *all * r.cl[t].nlat);
        nl += r.cl[t].nlat;
    }
    qsort(all, nl, sizeof *all, cmp_double);
    double p50 = nl ? all[nl / 2] : 0, p99 = nl ? all[(nl * 99) / 100 < nl ? (nl * 99) / 100 : nl - 1] : 0;
    double secs = (double)(t1 - t0) / 1e9;
    if (secs <= 0)
        secs = 1e-9;
    double gbps = (double)(nl * size) / secs / 1e9, ops = (double)nl / secs;
    const char *transport = cfg.sys == SYS_MEMCPY ? "-" : "tcp";
    int clients_out = cfg.sys == SYS_MEMCPY ? 1 : nclients;
    if (cfg.json) {
        printf("{\"system\":\"%s\",\"transport\":\"%s\",\"op\":\"%s\",\"size\":%" PRIu64
               ",\"clients\":%d,\"gbps\":%.3f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"count\":%" PRIu64
               ",\"ops_per_s\":%.1f,\"errors\":%" PRIu64 "}\n",
               cfg.sys_name, transport, cfg.op_name, size, clients_out, gbps, p50, p99, n, ops, errors);
    } else {
        char sz[32];
        kvp__format_size(size, sz, sizeof sz);
        printf("bench-baseline %s (%s) op=%s size=%s count=%" PRIu64 " clients=%d\n"
               "  %.2f GB/s  %.0f ops/s  p50 %.2f us  p99 %.2f us  errors %" PRIu64 "\n",
               cfg.sys_name, transport, cfg.op_name, sz, n, clients_out, gbps, ops, p50, p99, errors);
    }
    rc = errors ? 1 : 0;
    if (errors)
        fprintf(stderr, "kvpool bench-baseline: %" PRIu64 " objects arrived wrong\n", errors);

out:
    if (err[0])
        fprintf(stderr, "kvpool bench-baseline: %s\n", err);
    if (r.cl) {
        /* Threads still running (a failed start) end once their sockets are
         * shut; redis threads never started past the barrier in that case,
         * so the process exit takes them. */
        for (int t = 0; t < nclients; t++) {
            if (r.cl[t].fd >= 0)
                shutdown(r.cl[t].fd, SHUT_RDWR);
            if (r.cl[t].peer_fd >= 0)
                shutdown(r.cl[t].peer_fd, SHUT_RDWR);
        }
        if (started || pstarted) {
            fflush(stdout);
            _exit(1);
        }
        for (int t = 0; t < nclients; t++) {
            if (r.cl[t].fd >= 0)
                close(r.cl[t].fd);
            if (r.cl[t].peer_fd >= 0)
                close(r.cl[t].peer_fd);
            if (r.cl[t].rc)
                redisFree(r.cl[t].rc);
        }
    }
    if (barrier)
        pthread_barrier_destroy(&r.barrier);
    if (r.src_region)
        munmap(r.src_region, foot);
    if (r.dst_region)
        munmap(r.dst_region, foot);
    free(r.cl);
    free(r.order);
    free(tids);
    free(ptids);
    free(all);
    return rc;
}
