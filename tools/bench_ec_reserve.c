/*
 * `kvpool bench --ec-reserve [--rounds N (40)] [--per-round K (25)]
 *                           [--size BYTES (4 MiB)] [--pool URI] [--json]`
 *
 * The EC control plane's `reserve` round trip against a bare ZeroMQ
 * REQ/REP round trip between the same two processes (issue 16's
 * reserve_p50 <= 1.5 x zmq_rtt).  A child process runs a real consumer
 * worker (kvp_ec_worker_create: receive pool, push receiver, control
 * server; with --pool, the cross-encoder cache over that pool) and a bare
 * ZeroMQ REP echo; this process sends, round after round, K echo requests
 * with frames of a reserve's size (request and reply), then K reserves of fresh transfer ids
 * and fresh mm_hashes (each then cancelled with abandon, untimed), and
 * with --pool K reserves of hashes it put into the pool before the run
 * (cross-encoder cache hits, reported apart).  Interleaving the kinds round
 * by round gives them the same machine: the figures are medians over all
 * rounds, and the ratios are of medians measured in this run.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "commands.h"
#include "zmq_rtt.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"
#include "kvpool/ec_connector.h"
#include "kvpool/pool.h"
#include "support/ec_reserve_drive.h"

#define MODEL "bench-model"
#define HIDDEN 2048

typedef struct {
    uint64_t rounds, per_round, size;
    uint64_t gap_us; /* idle time before each timed op (the replay's sparse ops) */
    const char *pool_uri;
    bool json;
} opts_t;

/* ---- the child: a consumer worker and an echo ---- */

static volatile sig_atomic_t child_quit;
static void on_term(int sig)
{
    (void)sig;
    child_quit = 1;
}

/* Writes "<control addr> <echo addr>\n" (or "error\n") to fd, then serves
 * until SIGTERM or the parent's end of `quit_fd` closes. */
static int child_main(const opts_t *o, int fd, int quit_fd)
{
    signal(SIGTERM, on_term);
    kvp_pool_t *pool = NULL;
    kvp_ec_worker_t *w = NULL;
    kvp_tool_echo_t echo;
    char line[512] = "error\n";
    bool serving = false;
    memset(&echo, 0, sizeof echo);
    if (o->pool_uri && kvp_pool_open(o->pool_uri, &pool) != KVP_OK)
        goto report;
    for (int attempt = 0; attempt < 8 && !w; attempt++) {
        int base = kvp_tool_free_ports(1);
        if (base < 0)
            break;
        kvp_ec_config_t cfg;
        kvp_ec_config_init(&cfg);
        cfg.is_consumer = true;
        cfg.cross_encoder_cache = pool != NULL;
        cfg.ec_ip = "127.0.0.1";
        cfg.ec_port = base;
        cfg.pool_size = (int64_t)(o->size * 64 < (256u << 20) ? (256u << 20) : o->size * 64);
        cfg.hidden_dim = HIDDEN;
        cfg.dtype = KVP_EC_DTYPE_BFLOAT16;
        kvp_ec_worker_params_t wp;
        kvp_ec_worker_params_init(&wp);
        wp.config = &cfg;
        wp.bind_host = "127.0.0.1";
        wp.pool = pool;
        wp.model = MODEL;
        if (kvp_ec_worker_create(&wp, &w) != KVP_OK)
            w = NULL;
    }
    if (!w || kvp_tool_echo_start(&echo) != 0)
        goto report;
    serving = true;
    snprintf(line, sizeof line, "%s %s\n", kvp_ec_worker_control_addr(w), echo.addr);
report:
    if (write(fd, line, strlen(line)) < 0)
        child_quit = 1;
    close(fd);
    while (!child_quit && serving) {
        struct pollfd p = {quit_fd, POLLIN, 0};
        if (poll(&p, 1, 200) > 0)
            break; /* EOF: the parent is done */
    }
    kvp_tool_echo_stop(&echo);
    kvp_ec_worker_destroy(w);
    kvp_pool_close(pool);
    return serving ? 0 : 1;
}

/* ---- the parent ---- */

static double q_us(uint64_t *v, size_t n, double q) { return (double)kvp_tool_quantile(v, n, q) / 1e3; }

static void hash_name(char *buf, size_t len, const char *kind, uint64_t i)
{
    snprintf(buf, len, "bench-%s-%d-%" PRIu64, kind, (int)getpid(), i);
}

static void hit_name(char *buf, size_t len, uint64_t i) { hash_name(buf, len, "hit", i); }

static void gap(const opts_t *o)
{
    if (o->gap_us)
        usleep((useconds_t)o->gap_us);
}

static int usage(void)
{
    fprintf(stderr, "usage: kvpool bench --ec-reserve [--rounds N] [--per-round K] [--size BYTES] [--pool URI] "
                    "[--gap-us US] [--json]\n"
                    "  --gap-us: idle this long before each timed round trip (default 0: back to back; the\n"
                    "  replay's reserves come a few ms apart, to threads that went to sleep)\n");
    return 2;
}

int kvp_bench_ec_reserve(int argc, char **argv)
{
    opts_t o = {.rounds = 40, .per_round = 25, .size = 4u << 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ec-reserve") || !strcmp(a, "bench"))
            continue;
        if (!strcmp(a, "--json")) {
            o.json = true;
            continue;
        }
        if (!v)
            return usage();
        i++;
        if (!strcmp(a, "--pool"))
            o.pool_uri = strcmp(v, "none") ? v : NULL;
        else if (!strcmp(a, "--rounds") && kvp__parse_u64(v, 1, 100000, &o.rounds) == KVP_OK)
            ;
        else if (!strcmp(a, "--per-round") && kvp__parse_u64(v, 1, 10000, &o.per_round) == KVP_OK)
            ;
        else if (!strcmp(a, "--gap-us") && kvp__parse_u64(v, 0, 1000000, &o.gap_us) == KVP_OK)
            ;
        else if (!strcmp(a, "--size") && kvp__parse_size(v, &o.size) == KVP_OK && o.size >= 4 * HIDDEN &&
                 o.size <= (256u << 20))
            ;
        else
            return usage();
    }
    uint64_t total = o.rounds * o.per_round;
    if (o.pool_uri && kvp__rd_put_entries(o.pool_uri, MODEL, total, o.size, hit_name) != KVP_OK) {
        fprintf(stderr, "kvpool bench --ec-reserve: could not put the hit entries into %s\n", o.pool_uri);
        return 1;
    }
    int rp[2], qp[2];
    if (pipe(rp) || pipe(qp))
        return 1;
    pid_t pid = fork();
    if (pid < 0)
        return 1;
    if (pid == 0) {
        close(rp[0]);
        close(qp[1]);
        _exit(child_main(&o, rp[1], qp[0]));
    }
    close(rp[1]);
    close(qp[0]);
    char line[512] = {0}, ctl[256] = {0}, echo[256] = {0};
    size_t got = 0;
    while (got + 1 < sizeof line && !strchr(line, '\n')) {
        ssize_t n = read(rp[0], line + got, sizeof line - 1 - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(rp[0]);
    int rc = 1;
    uint64_t *ping = kvp__calloc(total, sizeof *ping), *miss = kvp__calloc(total, sizeof *miss),
             *hit = kvp__calloc(total, sizeof *hit);
    kvp__rd_client_t *c = NULL;
    kvp_tool_ping_t pinger;
    bool pinging = false;
    size_t n_hit = 0, n_hit_cached = 0;
    if (sscanf(line, "%255s %255s", ctl, echo) != 2 || !strncmp(line, "error", 5)) {
        fprintf(stderr, "kvpool bench --ec-reserve: the consumer process did not start\n");
        goto out;
    }
    if (!ping || !miss || !hit || kvp__rd_client_create(5000, &c) != KVP_OK)
        goto out;
    /* The echo's frames: a reserve's request and reply, of this run's ids. */
    size_t frame = 0, reply = 0;
    {
        char tid[96], hash[96];
        uint64_t ns;
        bool cached;
        for (int i = 0; i < 50; i++) { /* warm-up: sockets, the table's first allocations */
            snprintf(tid, sizeof tid, "warm-%d", i);
            hash_name(hash, sizeof hash, "warm", (uint64_t)i);
            if (kvp__rd_reserve_once(c, ctl, tid, hash, o.size, HIDDEN, &ns, &cached, &frame, &reply) != KVP_OK) {
                fprintf(stderr, "kvpool bench --ec-reserve: reserve failed in the warm-up\n");
                goto out;
            }
        }
    }
    if (kvp_tool_ping_open(&pinger, echo, frame, reply, 5000) != 0)
        goto out;
    pinging = true;
    kvp_status_t st = KVP_OK;
    for (int i = 0; i < 50 && st == KVP_OK; i++) /* warm-up */
        st = kvp_tool_ping(&pinger) ? KVP_OK : KVP_ERR_IO;
    for (uint64_t r = 0; r < o.rounds && st == KVP_OK; r++) {
        for (uint64_t k = 0; k < o.per_round && st == KVP_OK; k++) {
            gap(&o);
            if (!(ping[r * o.per_round + k] = kvp_tool_ping(&pinger)))
                st = KVP_ERR_IO;
        }
        for (uint64_t k = 0; k < o.per_round && st == KVP_OK; k++) {
            char tid[96], hash[96];
            bool cached = false;
            uint64_t i = r * o.per_round + k;
            snprintf(tid, sizeof tid, "miss-%" PRIu64, i);
            hash_name(hash, sizeof hash, "miss", i);
            gap(&o);
            st = kvp__rd_reserve_once(c, ctl, tid, hash, o.size, HIDDEN, &miss[i], &cached, NULL, NULL);
            if (st == KVP_OK && cached)
                st = KVP_ERR_INVALID_ARG; /* a fresh hash cannot be cached */
        }
        for (uint64_t k = 0; o.pool_uri && k < o.per_round && st == KVP_OK; k++) {
            char tid[96], hash[96];
            bool cached = false;
            uint64_t i = r * o.per_round + k;
            snprintf(tid, sizeof tid, "hit-%" PRIu64, i);
            hash_name(hash, sizeof hash, "hit", i);
            gap(&o);
            st = kvp__rd_reserve_once(c, ctl, tid, hash, o.size, HIDDEN, &hit[n_hit++], &cached, NULL, NULL);
            n_hit_cached += cached;
        }
    }
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool bench --ec-reserve: %s\n", kvp_status_str(st));
        goto out;
    }
    double pg = q_us(ping, total, 0.5), pm = q_us(miss, total, 0.5), ph = q_us(hit, n_hit, 0.5);
    double pg99 = q_us(ping, total, 0.99), pm99 = q_us(miss, total, 0.99);
    if (o.json) {
        printf("{\"rounds\":%" PRIu64 ",\"per_round\":%" PRIu64 ",\"size\":%" PRIu64 ",\"frame\":%zu,"
               "\"reply_frame\":%zu,\"pool\":%s,\"zmq_rtt_us\":%.1f,\"zmq_rtt_p99_us\":%.1f,\"reserve_p50_us\":%.1f,"
               "\"reserve_p99_us\":%.1f,\"reserve_over_rtt\":%.3f,\"hit_p50_us\":%.1f,\"hits_cached\":%zu}\n",
               o.rounds, o.per_round, o.size, frame, reply, o.pool_uri ? "true" : "false", pg, pg99, pm, pm99,
               pg > 0 ? pm / pg : 0, ph, n_hit_cached);
    } else {
        printf("ec reserve round trip, %" PRIu64 " rounds x %" PRIu64 ", %" PRIu64
               "-byte tensors, frames %zu B and %zu B back%s\n",
               o.rounds, o.per_round, o.size, frame, reply, o.pool_uri ? ", cross-encoder cache on" : "");
        printf("  bare zmq REQ/REP   p50 %8.1f us  p99 %8.1f us\n", pg, pg99);
        printf("  reserve (writes)   p50 %8.1f us  p99 %8.1f us   %.2fx the bare round trip (target <= 1.5x)\n", pm,
               pm99, pg > 0 ? pm / pg : 0);
        if (o.pool_uri)
            printf("  reserve (pool hit) p50 %8.1f us  (%zu of %zu answered cached)\n", ph, n_hit_cached, n_hit);
    }
    rc = 0;
out:
    if (pinging)
        kvp_tool_ping_close(&pinger);
    kvp__rd_client_destroy(c);
    kvp__free(ping, total * sizeof *ping);
    kvp__free(miss, total * sizeof *miss);
    kvp__free(hit, total * sizeof *hit);
    close(qp[1]);
    int status = 0;
    if (waitpid(pid, &status, 0) == pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0) && rc == 0) {
        fprintf(stderr, "kvpool bench --ec-reserve: the consumer process ended badly\n");
        rc = 1;
    }
    return rc;
}
