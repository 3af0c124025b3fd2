/*
 * The EC worker end to end over real sockets on 127.0.0.1: the consumer's
 * control server (scenarios 37, 48, 49, bad input, per-peer caps, the event
 * queue) spoken to with raw ZeroMQ REQ sockets, and pushes from a producer
 * worker into consumer workers driven by real schedulers with the ZeroMQ
 * collaborators (scenarios 33, 35, the cross-encoder cache, a producer whose
 * consumer is gone), and faults: the consumer restarted, two shards with
 * one slow (a shard in a process of its own, stopped with SIGSTOP).
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "common/alloc.h"
#include "client/backend.h"
#include "common/clock.h"
#include "ec/ec_worker_int.h"
#include "kvpool/ec_connector.h"
#include "kvpool/pool.h"
#include "server/server.h"
#include "test.h"

/* ---- ports, raw clients ---- */

static int port_free(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* n consecutive free ports (the shards of a consumer). */
static uint16_t free_ports(int n)
{
    static unsigned seed;
    if (!seed)
        seed = (unsigned)getpid() * 2654435761u;
    for (int tries = 0; tries < 1000; tries++) {
        /* below the kernel's ephemeral range (32768..60999 by default), so
         * that no connect() or bind(:0) takes it between here and the bind */
        uint16_t base = (uint16_t)(12000 + (rand_r(&seed) % 20000));
        int ok = 1;
        for (int i = 0; i < n && ok; i++)
            ok = port_free((uint16_t)(base + i));
        if (ok)
            return base;
    }
    ASSERT(0);
    return 0;
}

typedef struct {
    void *ctx, *sock;
    char reply[65536];
} rc_t;

static void rc_open(rc_t *c, const char *addr)
{
    int t = 5000, zero = 0;
    c->ctx = zmq_ctx_new();
    c->sock = zmq_socket(c->ctx, ZMQ_REQ);
    zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &t, sizeof t);
    zmq_setsockopt(c->sock, ZMQ_SNDTIMEO, &t, sizeof t);
    zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
    ASSERT_EQ(zmq_connect(c->sock, addr), 0);
}

static void rc_close(rc_t *c)
{
    zmq_close(c->sock);
    zmq_ctx_term(c->ctx);
}

/* One request; the reply, NUL-terminated, in c->reply. */
static const char *rc_req(rc_t *c, const char *json, size_t len)
{
    ASSERT_EQ(zmq_send(c->sock, json, len, 0), (int)len);
    int n = zmq_recv(c->sock, c->reply, sizeof c->reply - 1, 0);
    ASSERT_GE(n, 0);
    c->reply[n] = 0;
    return c->reply;
}

static const char *rc(rc_t *c, const char *json) { return rc_req(c, json, strlen(json)); }

/* The value of "key":"..." in a reply (first occurrence), into buf. */
static const char *field(const char *json, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(json, pat);
    ASSERT(p);
    p += strlen(pat);
    size_t i = 0;
    while (p[i] && p[i] != '"' && i + 1 < len) {
        buf[i] = p[i];
        i++;
    }
    buf[i] = 0;
    return buf;
}

/* ---- a consumer worker ---- */

static kvp_ec_push_path_t g_path = KVP_EC_PUSH_AUTO; /* both sides' push path */

typedef struct {
    kvp_ec_config_t cfg;
    kvp_ec_worker_t *w;
    char addr[64];
} cons_t;

typedef struct {
    int64_t lease_ms, reap_ms, max_events, peer_max;
    kvp_pool_t *pool;
} cons_opts_t;

static void cons_start(cons_t *c, uint16_t base, int tp, int rank, int64_t pool_size, const cons_opts_t *o)
{
    memset(c, 0, sizeof *c);
    snprintf(c->addr, sizeof c->addr, "tcp://127.0.0.1:%u", (unsigned)base);
    kvp_ec_config_init(&c->cfg);
    c->cfg.is_consumer = true;
    c->cfg.control_addr = c->addr;
    c->cfg.tp_size = tp;
    c->cfg.pool_size = pool_size;
    c->cfg.control_timeout_ms = 500;
    c->cfg.push_wait_timeout_s = 10;
    c->cfg.dtype = KVP_EC_DTYPE_BFLOAT16;
    c->cfg.cross_encoder_cache = o && o->pool;
    kvp_ec_worker_params_t p;
    kvp_ec_worker_params_init(&p);
    p.config = &c->cfg;
    p.tp_rank = rank;
    p.push_path = g_path;
    if (o) {
        p.lease_ms = o->lease_ms;
        p.reap_interval_ms = o->reap_ms;
        p.max_pending_events = o->max_events;
        p.peer_max_reservations = o->peer_max;
        p.pool = o->pool;
        p.model = "m";
    }
    ASSERT_OK(kvp_ec_worker_create(&p, &c->w));
}

static void stats(kvp_ec_worker_t *w, kvp_ec_worker_stats_t *st)
{
    memset(st, 0, sizeof *st);
    st->size = sizeof *st;
    kvp_ec_worker_stats(w, st);
}

static const char *RESERVE_FMT = "{\"op\":\"reserve\",\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"nbytes\":64,"
                                 "\"shape\":[4,8],\"dtype\":\"bfloat16\"}";

static const char *reserve(rc_t *c, const char *tid, const char *hash)
{
    char buf[256];
    snprintf(buf, sizeof buf, RESERVE_FMT, tid, hash);
    return rc(c, buf);
}

/* ---- control server scenarios ---- */

TEST(test_ec_s48_reserve_shape_dtype_mismatch_is_an_error)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, NULL);
    rc_t r;
    rc_open(&r, c.addr);
    ASSERT_STR_EQ(rc(&r, "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"H\",\"nbytes\":100,"
                         "\"shape\":[4,8],\"dtype\":\"bfloat16\"}"),
                  "{\"ok\":false,\"error\":\"shape and dtype do not match nbytes\"}");
    /* the server goes on: the right size reserves a slot to write */
    const char *ok = reserve(&r, "T", "H");
    ASSERT(strstr(ok, "\"ok\":true"));
    ASSERT(strstr(ok, "\"write\":true"));
    ASSERT(strstr(ok, "\"nbytes\":64"));
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_s49_cancel_while_writing_deferred_then_complete_frees)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, NULL);
    rc_t r;
    rc_open(&r, c.addr);
    char rid[64], buf[256];
    field(reserve(&r, "T", "H"), "reservation_id", rid, sizeof rid);
    ASSERT_EQ(strlen(rid), 32);
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.reservations_active, 1);
    ASSERT_GE(st.bytes_reserved, 64);
    /* no abandon while WRITING: deferred, the memory kept for the writer */
    ASSERT_STR_EQ(rc(&r, "{\"op\":\"cancel\",\"transfer_id\":\"T\"}"),
                  "{\"ok\":true,\"result\":{\"cancelled\":true,\"deferred\":true}}");
    stats(c.w, &st);
    ASSERT_GE(st.bytes_reserved, 64);
    snprintf(buf, sizeof buf, "{\"op\":\"complete\",\"transfer_id\":\"T\",\"reservation_id\":\"%s\"}", rid);
    ASSERT_STR_EQ(rc(&r, buf), "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":false}}");
    stats(c.w, &st);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.reservations_active, 0);
    ASSERT_STR_EQ(rc(&r, "{\"op\":\"status\",\"transfer_id\":\"T\"}"), "{\"ok\":true,\"result\":null}");
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_s37_cancel_unknown_leaves_tombstone_reserve_cancelled)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, NULL);
    rc_t r;
    rc_open(&r, c.addr);
    ASSERT_STR_EQ(rc(&r, "{\"op\":\"cancel\",\"transfer_id\":\"T\"}"),
                  "{\"ok\":true,\"result\":{\"cancelled\":true}}");
    const char *rep = reserve(&r, "T", "H");
    ASSERT(strstr(rep, "\"cancelled\":true"));
    ASSERT(strstr(rep, "\"write\":false"));
    ASSERT(strstr(rep, "\"reservation_id\":\"\""));
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.tombstones, 1);
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

/* Threads of this process named name (/proc/self/task/<tid>/comm); into
 * *sleeps (unless NULL) the sum of their voluntary context switches (the
 * times one went to sleep, each of them ended by a wake-up). */
static int threads_named(const char *name, long *sleeps)
{
    if (sleeps)
        *sleeps = 0;
    DIR *d = opendir("/proc/self/task");
    ASSERT(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[300], comm[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread ended meanwhile */
        bool match = false;
        if (fgets(comm, sizeof comm, f)) {
            comm[strcspn(comm, "\n")] = 0;
            match = strcmp(comm, name) == 0;
        }
        fclose(f);
        n += match;
        snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
        char line[128];
        if (match && sleeps && (f = fopen(path, "r")) != NULL) {
            while (fgets(line, sizeof line, f))
                if (!strncmp(line, "voluntary_ctxt_switches:", 24))
                    *sleeps += strtol(line + 24, NULL, 10);
            fclose(f);
        }
    }
    closedir(d);
    return n;
}

TEST(test_ec_control_ops_peers_event_port_status)
{
    uint16_t base = free_ports(2);
    cons_t c;
    cons_start(&c, base, 2, 1, 1 << 20, NULL); /* rank 1 listens on base + 1 */
    char addr[64], want[128];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", (unsigned)(base + 1));
    ASSERT_STR_EQ(kvp_ec_worker_control_addr(c.w), addr);
    rc_t r;
    rc_open(&r, addr);
    snprintf(want, sizeof want, "{\"ok\":true,\"result\":{\"ports\":[%u,%u]}}", (unsigned)base, (unsigned)base + 1);
    ASSERT_STR_EQ(rc(&r, "{\"op\":\"peers\"}"), want);
    const char *ep = rc(&r, "{\"op\":\"event_port\"}");
    ASSERT(strncmp(ep, "{\"ok\":true,\"result\":", 20) == 0);
    long port = strtol(ep + 20, NULL, 10);
    ASSERT(port > 0 && port < 65536);
    char rid[64];
    field(reserve(&r, "T", "H"), "reservation_id", rid, sizeof rid);
    const char *s = rc(&r, "{\"op\":\"status\",\"transfer_id\":\"T\"}");
    ASSERT(strstr(s, "\"mm_hash\":\"H\""));
    ASSERT(strstr(s, "\"ready\":false"));
    ASSERT(strstr(s, rid));
    rc_close(&r);
    /* its threads carry names (top -H, perf sched): the control server's */
    ASSERT_EQ(threads_named("kvp-ec-control", NULL), 1);
    kvp_ec_worker_destroy(c.w);
    ASSERT_EQ(threads_named("kvp-ec-control", NULL), 0);
}

/* What peers hold in a worker is in its metrics page: a reservation and
 * its bytes while it is open, gone once cancelled; the page is sized by a
 * first call without a buffer, refused whole into a short one. */
static double ec_metric(kvp_ec_worker_t *w, const char *series)
{
    size_t len = 0;
    kvp_ec_worker_t *ws[1] = {w};
    ASSERT_EQ(kvp_ec_worker_metrics(ws, 1, NULL, 0, &len), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_GT(len, 1000);
    char *text = malloc(len + 1);
    size_t len2 = 0;
    ASSERT_EQ(kvp_ec_worker_metrics(ws, 1, text, len, &len2), KVP_ERR_BUFFER_TOO_SMALL); /* no room for the NUL */
    ASSERT_OK(kvp_ec_worker_metrics(ws, 1, text, len + 1, &len2));
    ASSERT_EQ(len2, len);
    ASSERT_EQ(strlen(text), len);
    const char *at = strstr(text, series);
    double v = -1;
    if (at && at[strlen(series)] == ' ')
        v = strtod(at + strlen(series) + 1, NULL);
    ASSERT_MSG(strstr(text, "# TYPE kvpool_ec_reservations_active gauge\n"), "%s", text);
    ASSERT(strstr(text, "# TYPE kvpool_ec_reserves_total counter\n"));
    free(text);
    return v;
}

TEST(test_ec_metrics_show_what_peers_hold)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, NULL);
    rc_t r;
    rc_open(&r, c.addr);
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_reservations_active{rank=\"0\"}"), 0);
    char rid[64];
    field(reserve(&r, "TM", "HM"), "reservation_id", rid, sizeof rid);
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_reservations_active{rank=\"0\"}"), 1);
    ASSERT_GE(ec_metric(c.w, "kvpool_ec_bytes_reserved{rank=\"0\"}"), 64); /* (its extent, rounded up) */
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_reserves_total{rank=\"0\"}"), 1);
    ASSERT(strstr(rc(&r, "{\"op\":\"cancel\",\"transfer_id\":\"TM\",\"abandon\":true}"), "\"cancelled\":true"));
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_reservations_active{rank=\"0\"}"), 0);
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_bytes_reserved{rank=\"0\"}"), 0);
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_cancels_total{rank=\"0\"}"), 1);
    /* bad arguments */
    size_t len;
    kvp_ec_worker_t *none[1] = {NULL};
    ASSERT_EQ(kvp_ec_worker_metrics(none, 1, NULL, 0, &len), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_ec_worker_metrics(&c.w, 0, NULL, 0, &len), KVP_ERR_INVALID_ARG);
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

/* The control server's own time per request (kvp_ec_worker_stats,
 * reserve_busy_ns and reserve_cpu_ns; the replay reports them beside the
 * reserve round trip): every reserve counted once, its service inside the
 * client's round trips, its CPU time inside its wall-clock time, and the
 * page shows the same figures, in seconds. */
TEST(test_ec_control_service_time_inside_the_round_trips)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, NULL);
    rc_t r;
    rc_open(&r, c.addr);
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.reserve_requests, 0);
    ASSERT_EQ(st.reserve_busy_ns, 0);
    uint64_t rtt_ns = 0;
    for (int i = 0; i < 20; i++) {
        char tid[16], hash[16];
        snprintf(tid, sizeof tid, "TS%d", i);
        snprintf(hash, sizeof hash, "HS%d", i);
        uint64_t t0 = kvp__now_ns();
        ASSERT(strstr(reserve(&r, tid, hash), "\"write\":true"));
        rtt_ns += kvp__now_ns() - t0;
    }
    /* a request's figures land just after its reply has gone */
    uint64_t dl = kvp__now_ns() + 5000000000u;
    for (stats(c.w, &st); st.reserve_requests < 20 && kvp__now_ns() < dl; stats(c.w, &st))
        usleep(1000);
    ASSERT_EQ(st.reserve_requests, 20);
    ASSERT_GT(st.reserve_busy_ns, 0);
    ASSERT_LT(st.reserve_busy_ns, rtt_ns);
    ASSERT_GT(st.reserve_cpu_ns, 0);
    ASSERT_LE(st.reserve_cpu_ns, st.reserve_busy_ns + 20 * 1000u); /* 1 us of clock skew per request */
    ASSERT_EQ(st.control_busy_ns, st.reserve_busy_ns);            /* nothing else was asked yet */
    ASSERT(strstr(rc(&r, "{\"op\":\"status\",\"transfer_id\":\"TS0\"}"), "\"ok\":true"));
    kvp_ec_worker_stats_t st2;
    dl = kvp__now_ns() + 5000000000u;
    for (stats(c.w, &st2); st2.control_busy_ns == st.control_busy_ns && kvp__now_ns() < dl; stats(c.w, &st2))
        usleep(1000);
    ASSERT_EQ(st2.reserve_requests, 20);
    ASSERT_EQ(st2.reserve_busy_ns, st.reserve_busy_ns); /* a status is no reserve */
    ASSERT_GT(st2.control_busy_ns, st.control_busy_ns);
    ASSERT_EQ(ec_metric(c.w, "kvpool_ec_reserve_requests_total{rank=\"0\"}"), 20);
    double busy_s = ec_metric(c.w, "kvpool_ec_reserve_busy_seconds_total{rank=\"0\"}");
    ASSERT_MSG(busy_s > 0 && fabs(busy_s - (double)st2.reserve_busy_ns / 1e9) < 2e-9, "%.9f", busy_s);
    double all_s = ec_metric(c.w, "kvpool_ec_control_busy_seconds_total{rank=\"0\"}");
    ASSERT_MSG(all_s > busy_s, "%.9f <= %.9f", all_s, busy_s);
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_control_bad_input_gets_error_replies_server_goes_on)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, NULL);
    rc_t r;
    rc_open(&r, c.addr);
    static const char *bad[] = {
        "not json",
        "[1,2]",
        "{\"op\":\"frobnicate\"}",
        "{\"op\":7}",
        "{\"op\":\"status\"}",
        "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"H\",\"nbytes\":\"64\",\"shape\":[4,8],\"dtype\":\"bfloat16\"}",
        "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"H\",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"quaternion\"}",
        "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"H\",\"nbytes\":64,\"shape\":\"4x8\",\"dtype\":\"bfloat16\"}",
        "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"H\",\"nbytes\":64,\"shape\":[-4,-8],\"dtype\":\"bfloat16\"}",
        "{\"op\":\"complete\",\"transfer_id\":\"T\"}",
        "{\"op\":\"complete_batch\",\"items\":5}",
        "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\"",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *rep = rc(&r, bad[i]);
        ASSERT_MSG(strncmp(rep, "{\"ok\":false,\"error\":\"", 21) == 0, "request %zu: %s", i, rep);
    }
    ASSERT_STR_EQ(rc(&r, "{\"op\":\"frobnicate\"}"), "{\"ok\":false,\"error\":\"unknown control op: 'frobnicate'\"}");
    ASSERT(strstr(rc(&r, "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"H\",\"nbytes\":64,\"shape\":[4,8],"
                         "\"dtype\":\"quaternion\"}"),
                  "Unsupported torch dtype string: 'quaternion'"));
    /* an oversized frame: an error reply, not a dropped connection */
    size_t big = 70 * 1024;
    char *huge = kvp__malloc(big);
    memset(huge, ' ', big);
    huge[0] = '{';
    huge[big - 1] = '}';
    ASSERT(strstr(rc_req(&r, huge, big), "\"ok\":false"));
    kvp__free(huge, big);
    /* a conflicting mm_hash for a transfer id */
    ASSERT(strstr(reserve(&r, "T", "H1"), "\"ok\":true"));
    ASSERT_STR_EQ(reserve(&r, "T", "H2"), "{\"ok\":false,\"error\":\"conflicting reservation for transfer_id\"}");
    /* and the server still serves */
    ASSERT(strstr(rc(&r, "{\"op\":\"peers\"}"), "\"ok\":true"));
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_GE(st.control_errors, 15);
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_control_peer_cap_healthy_peer_served_leases_expire)
{
    cons_opts_t o = {.lease_ms = 300, .reap_ms = 50, .peer_max = 3};
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, &o);
    rc_t hostile, healthy;
    rc_open(&hostile, c.addr);
    rc_open(&healthy, c.addr);
    char tid[32];
    for (int i = 0; i < 3; i++) {
        snprintf(tid, sizeof tid, "A%d", i);
        ASSERT(strstr(reserve(&hostile, tid, tid), "\"ok\":true"));
    }
    ASSERT_STR_EQ(reserve(&hostile, "A3", "A3"), "{\"ok\":false,\"error\":\"peer reservation cap reached\"}");
    ASSERT(strstr(reserve(&healthy, "B0", "B0"), "\"write\":true"));
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.reserves_capped, 1);
    ASSERT_EQ(st.reservations_active, 4);
    /* the hostile peer never writes or completes: its leases run out and the
     * reaper turns its WRITING records into EXPIRE_PENDING (memory kept for a
     * writer that may still be writing) */
    usleep(700 * 1000);
    ASSERT(strstr(reserve(&healthy, "B1", "B1"), "\"ok\":true"));
    stats(c.w, &st);
    ASSERT_GE(st.expired + st.reservations_active, 1);
    rc_close(&hostile);
    rc_close(&healthy);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_events_bounded_queue_drops_oldest)
{
    cons_opts_t o = {.max_events = 2};
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, &o);
    rc_t r;
    rc_open(&r, c.addr);
    char tid[16], rid[64], buf[256];
    for (int i = 0; i < 4; i++) {
        snprintf(tid, sizeof tid, "T%d", i);
        field(reserve(&r, tid, tid), "reservation_id", rid, sizeof rid);
        snprintf(buf, sizeof buf, "{\"op\":\"complete\",\"transfer_id\":\"%s\",\"reservation_id\":\"%s\"}", tid, rid);
        ASSERT_STR_EQ(rc(&r, buf), "{\"ok\":true,\"result\":{\"completed\":true,\"became_ready\":true}}");
    }
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.events_dropped, 2);
    /* the inbox connects now and gets the two newest, whole */
    const char *ep = rc(&r, "{\"op\":\"event_port\"}");
    long port = strtol(ep + 20, NULL, 10);
    void *ctx = zmq_ctx_new(), *pull = zmq_socket(ctx, ZMQ_PULL);
    int t = 3000, zero = 0;
    zmq_setsockopt(pull, ZMQ_RCVTIMEO, &t, sizeof t);
    zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof zero);
    snprintf(buf, sizeof buf, "tcp://127.0.0.1:%ld", port);
    ASSERT_EQ(zmq_connect(pull, buf), 0);
    char ev[1024];
    for (int i = 2; i < 4; i++) {
        int n = zmq_recv(pull, ev, sizeof ev - 1, 0);
        ASSERT_GT(n, 0);
        ev[n] = 0;
        snprintf(tid, sizeof tid, "\"T%d\"", i);
        ASSERT_MSG(strstr(ev, tid), "event %s", ev);
        ASSERT(strstr(ev, "\"ready\":true"));
        ASSERT(strstr(ev, "\"shape\":[4,8]"));
        ASSERT(strstr(ev, "\"dtype\":\"bfloat16\""));
        ASSERT(strstr(ev, "\"nbytes\":64"));
        ASSERT(strstr(ev, "\"shard\":"));
    }
    zmq_close(pull);
    zmq_ctx_term(ctx);
    rc_close(&r);
    kvp_ec_worker_destroy(c.w);
}

/* ---- pushes end to end ---- */

typedef struct {
    char hash[64];
    uint8_t *data; /* owned copy (consumer puts point into its pool; copied here) */
    int64_t nbytes;
} cent_t;

typedef struct {
    cent_t e[16];
    size_t n;
} cache_t;

static bool c_has(void *ctx, const char *h)
{
    cache_t *c = ctx;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].hash, h))
            return true;
    return false;
}

static bool c_get(void *ctx, const char *h, kvp_ec_tensor_t *t)
{
    (void)ctx, (void)h, (void)t;
    return false;
}

static void c_put(void *ctx, const char *h, const kvp_ec_tensor_t *t)
{
    cache_t *c = ctx;
    ASSERT(c->n < 16);
    cent_t *e = &c->e[c->n++];
    snprintf(e->hash, sizeof e->hash, "%s", h);
    e->nbytes = t->nbytes;
    e->data = kvp__malloc((size_t)t->nbytes);
    memcpy(e->data, t->data, (size_t)t->nbytes);
}

static void cache_free(cache_t *c)
{
    for (size_t i = 0; i < c->n; i++)
        kvp__free(c->e[i].data, (size_t)c->e[i].nbytes);
    c->n = 0;
}

static kvp_ec_encoder_cache_t cache_iface(cache_t *c) { return (kvp_ec_encoder_cache_t){c_has, c_get, c_put, c}; }

static void fill(uint8_t *p, size_t n, const char *hash)
{
    uint64_t x = 1469598103934665603ull; /* FNV-1a of the hash, then an LCG */
    for (const char *c = hash; *c; c++)
        x = (x ^ (uint8_t)*c) * 1099511628211ull;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p[i] = (uint8_t)(x >> 56);
    }
}

typedef struct {
    atomic_int n, ok, cached, written;
    kvp_status_t last;
    bool retryable;
    unsigned path;
} pushes_t;

static void on_push(void *ctx, const kvp_ec_push_record_t *r)
{
    pushes_t *p = ctx;
    p->last = r->status;
    p->retryable = r->retryable;
    if (r->written)
        p->path = r->path;
    atomic_fetch_add(&p->written, (int)r->written);
    if (r->status == KVP_OK)
        atomic_fetch_add(&p->ok, 1);
    if (r->cached)
        atomic_fetch_add(&p->cached, 1);
    atomic_fetch_add(&p->n, 1);
}

typedef struct {
    kvp_ec_config_t cfg;
    kvp_ec_zmq_t *z;
    kvp_ec_sched_t *s;
} sched_t;

/* A scheduler's clock for the scenarios that wait out 300 s leases: NULL =
 * the real one. */
static kvp_ec_clock_t *g_clock;
static int64_t g_fake_ms;
static int64_t fake_now(void *ctx)
{
    (void)ctx;
    return g_fake_ms;
}

static void sched_start_x(sched_t *x, bool producer, const char *control_addr, int tp, int64_t pool_size, bool cross)
{
    memset(x, 0, sizeof *x);
    kvp_ec_config_init(&x->cfg);
    x->cfg.is_producer = producer;
    x->cfg.is_consumer = !producer;
    x->cfg.control_addr = control_addr;
    x->cfg.tp_size = producer ? 1 : tp;
    x->cfg.pool_size = pool_size;
    x->cfg.hidden_dim = 1024;
    x->cfg.dtype = KVP_EC_DTYPE_BFLOAT16;
    x->cfg.control_timeout_ms = 2000;
    x->cfg.push_wait_timeout_s = 10;
    x->cfg.cross_encoder_cache = cross;
    ASSERT_OK(kvp_ec_zmq_create(2000, 2, &x->z));
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &x->cfg;
    p.clock = g_clock ? *g_clock : kvp_ec_clock_monotonic();
    p.control = kvp_ec_zmq_control(x->z);
    p.executor = kvp_ec_zmq_executor(x->z);
    p.inbox = kvp_ec_zmq_inbox(x->z);
    ASSERT_OK(kvp_ec_sched_create(&p, &x->s));
}

static void sched_start(sched_t *x, bool producer, const char *control_addr, int tp, int64_t pool_size)
{
    sched_start_x(x, producer, control_addr, tp, pool_size, false);
}

static void sched_stop(sched_t *x)
{
    kvp_ec_sched_close(x->s);
    kvp_ec_sched_destroy(x->s);
    kvp_ec_zmq_destroy(x->z);
}

typedef struct {
    kvp_ec_feature_t feat;
    kvp_ec_item_t item;
    kvp_ec_transfer_params_t params;
    kvp_ec_request_t req;
} one_t;

/* A request with one image of 256 embeddings (256 x 1024 bf16 = 512 KiB). */
static void one(one_t *o, const char *rid, const char *hash, const char *tid, const char *czmq)
{
    memset(o, 0, sizeof *o);
    o->feat = (kvp_ec_feature_t){hash, "image", 0, 256, 256};
    o->item = (kvp_ec_item_t){hash, tid};
    o->params.consumer_zmq = czmq;
    o->params.items = &o->item;
    o->params.n_items = 1;
    o->req = (kvp_ec_request_t){rid, &o->feat, 1, &o->params};
}

#define NBYTES (256 * 1024 * 2)

typedef struct {
    kvp_ec_worker_t *w;
    kvp_ec_config_t cfg;
    sched_t s;
    pushes_t pushes;
} prod_t;

static void prod_start(prod_t *p, const char *consumer_addr, kvp_pool_t *pool, int64_t timeout_ms)
{
    memset(p, 0, sizeof *p);
    sched_start_x(&p->s, true, consumer_addr, 1, 64 << 20, pool != NULL);
    kvp_ec_config_init(&p->cfg);
    p->cfg.is_producer = true;
    p->cfg.control_addr = consumer_addr;
    p->cfg.pool_size = 64 << 20;
    p->cfg.hidden_dim = 1024;
    p->cfg.control_timeout_ms = timeout_ms;
    p->cfg.cross_encoder_cache = pool != NULL;
    kvp_ec_worker_params_t wp;
    kvp_ec_worker_params_init(&wp);
    wp.config = &p->cfg;
    wp.push_path = g_path;
    wp.pool = pool;
    wp.model = "m";
    wp.on_push = on_push;
    wp.on_push_ctx = &p->pushes;
    ASSERT_OK(kvp_ec_worker_create(&wp, &p->w));
}

static void prod_stop(prod_t *p)
{
    kvp_ec_worker_destroy(p->w);
    sched_stop(&p->s);
}

/* The producer's step for a request: alloc -> meta -> start_save -> save,
 * then steps until the worker reports no pending saves. */
static void produce(prod_t *p, one_t *o)
{
    bool ok;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(p->s.s, &o->req, 0, &ok));
    ASSERT_OK(kvp_ec_sched_update_state_after_alloc(p->s.s, &o->req, 0));
    kvp_ec_meta_t m;
    ASSERT_OK(kvp_ec_sched_build_connector_meta(p->s.s, NULL, 0, NULL, 0, &m));
    ASSERT_EQ(m.n_pushes, 1);
    ASSERT_EQ(m.pushes[0].nbytes, NBYTES);
    cache_t none = {0};
    kvp_ec_encoder_cache_t ci = cache_iface(&none);
    ASSERT_OK(kvp_ec_worker_start_save_caches(p->w, &m, &ci));
    kvp_ec_meta_cleanup(&m);
    uint8_t *out = kvp__malloc(NBYTES);
    fill(out, NBYTES, o->feat.identifier);
    int64_t shape[2] = {256, 1024};
    kvp_ec_tensor_t t = {out, NBYTES, shape, 2, KVP_EC_DTYPE_BFLOAT16};
    ASSERT_OK(kvp_ec_worker_save_caches(p->w, o->feat.identifier, &t));
    memset(out, 0, NBYTES); /* the worker copied it */
    kvp__free(out, NBYTES);
    uint64_t dl = kvp__now_ns() + 10000000000ull;
    for (;;) {
        kvp_ec_worker_meta_t wm;
        bool has;
        ASSERT_OK(kvp_ec_worker_build_meta(p->w, &wm, &has));
        ASSERT(has);
        bool pending = wm.pending_saves;
        ASSERT_OK(kvp_ec_sched_update_connector_output(p->s.s, &wm));
        kvp_ec_worker_meta_cleanup(&wm);
        if (!pending)
            break;
        ASSERT(kvp__now_ns() < dl);
        usleep(2000);
    }
}

/* The consumer's steps for a request until its image is in cache (or the
 * deadline).  Returns true when loaded. */
static bool consume(sched_t *s, kvp_ec_worker_t *const *workers, size_t nw, cache_t *caches, one_t *o)
{
    uint64_t dl = kvp__now_ns() + 10000000000ull;
    while (kvp__now_ns() < dl) {
        bool has = false, ready = false;
        ASSERT_OK(kvp_ec_sched_ensure_cache_available(s->s, &o->req, 0, &ready));
        if (ready)
            return true;
        ASSERT_OK(kvp_ec_sched_has_cache_item(s->s, o->feat.identifier, &has));
        (void)has;
        kvp_ec_meta_t m;
        ASSERT_OK(kvp_ec_sched_build_connector_meta(s->s, NULL, 0, NULL, 0, &m));
        kvp_ec_worker_meta_t agg = {0};
        bool have_agg = false;
        for (size_t i = 0; i < nw; i++) {
            kvp_ec_encoder_cache_t ci = cache_iface(&caches[i]);
            ASSERT_OK(kvp_ec_worker_start_load_caches(workers[i], &m, &ci));
            kvp_ec_worker_meta_t wm;
            bool hw;
            ASSERT_OK(kvp_ec_worker_build_meta(workers[i], &wm, &hw));
            ASSERT(hw);
            if (!have_agg) {
                agg = wm;
                have_agg = true;
            } else {
                kvp_ec_worker_meta_t out;
                ASSERT_OK(kvp_ec_worker_meta_aggregate(&agg, &wm, &out));
                kvp_ec_worker_meta_cleanup(&agg);
                kvp_ec_worker_meta_cleanup(&wm);
                agg = out;
            }
        }
        kvp_ec_meta_cleanup(&m);
        ASSERT_OK(kvp_ec_sched_update_connector_output(s->s, &agg));
        kvp_ec_worker_meta_cleanup(&agg);
        usleep(2000);
    }
    return false;
}

static void check_bytes(const cache_t *c, const char *hash)
{
    uint8_t *want = kvp__malloc(NBYTES);
    fill(want, NBYTES, hash);
    bool found = false;
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].hash, hash)) {
            found = true;
            ASSERT_EQ(c->e[i].nbytes, NBYTES);
            ASSERT_MEM_EQ(c->e[i].data, want, NBYTES);
        }
    ASSERT(found);
    kvp__free(want, NBYTES);
}

static void s33(void)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    sched_t cs;
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    prod_t p;
    prod_start(&p, c.addr, NULL, 2000);
    one_t po, co;
    one(&po, "r1", "H1", "T1", c.addr);
    one(&co, "r1", "H1", "T1", NULL);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.ok), 1);
    ASSERT_EQ(atomic_load(&p.pushes.written), 1);
    cache_t cache = {0};
    kvp_ec_worker_t *ws[1] = {c.w};
    ASSERT(consume(&cs, ws, 1, &cache, &co));
    check_bytes(&cache, "H1");
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.takes, 1);
    kvp_ec_worker_stats_t pst;
    stats(p.w, &pst);
    ASSERT_EQ(pst.bytes_pushed, NBYTES); /* the receiver counts TCP writes only: a UCX put is one-sided */
    ASSERT_EQ(pst.pushes, 1);
    /* the producer's copy was held in its staging slab, and is gone once
     * the push ended (on_push is called after the source is let go) */
    ASSERT_EQ(pst.stage_capacity, 64u << 20);
    ASSERT_EQ(pst.stage_copies, 1);
    ASSERT_EQ(pst.stage_fallbacks, 0);
    ASSERT_EQ(pst.stage_bytes, 0);
    ASSERT_EQ(pst.stage_heap_bytes, 0);
    if (g_path != KVP_EC_PUSH_AUTO)
        ASSERT_EQ(p.pushes.path, g_path);
    else
        printf("  (auto push path: %s)\n", p.pushes.path == KVP_EC_PUSH_UCX ? "ucx" : "tcp");
    cache_free(&cache);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_s33_push_then_event_then_load_end_to_end) { s33(); }

TEST(test_ec_s33_over_tcp_stream)
{
    g_path = KVP_EC_PUSH_TCP;
    s33();
    g_path = KVP_EC_PUSH_AUTO;
}

TEST(test_ec_s35_two_shards_both_written_loaded_on_both)
{
    uint16_t base = free_ports(2);
    cons_t c0, c1;
    cons_start(&c0, base, 2, 0, 16 << 20, NULL);
    cons_start(&c1, base, 2, 1, 16 << 20, NULL);
    sched_t cs;
    sched_start(&cs, false, c0.addr, 2, 16 << 20);
    prod_t p;
    prod_start(&p, c0.addr, NULL, 2000);
    one_t po, co;
    one(&po, "r1", "H2", "T2", c0.addr);
    one(&co, "r1", "H2", "T2", NULL);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.written), 2);
    cache_t caches[2];
    memset(caches, 0, sizeof caches);
    kvp_ec_worker_t *ws[2] = {c0.w, c1.w};
    ASSERT(consume(&cs, ws, 2, caches, &co));
    check_bytes(&caches[0], "H2");
    check_bytes(&caches[1], "H2");
    cache_free(&caches[0]);
    cache_free(&caches[1]);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c0.w);
    kvp_ec_worker_destroy(c1.w);
}

TEST(test_ec_s34_no_push_within_wait_unavailable_once_end_to_end)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    sched_t cs;
    memset(&cs, 0, sizeof cs);
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    /* push_wait_timeout 1 s (a new scheduler: the config is read at create) */
    kvp_ec_sched_close(cs.s);
    kvp_ec_sched_destroy(cs.s);
    kvp_ec_zmq_destroy(cs.z);
    cs.cfg.push_wait_timeout_s = 1;
    ASSERT_OK(kvp_ec_zmq_create(500, 2, &cs.z));
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &cs.cfg;
    p.clock = kvp_ec_clock_monotonic();
    p.control = kvp_ec_zmq_control(cs.z);
    p.executor = kvp_ec_zmq_executor(cs.z);
    p.inbox = kvp_ec_zmq_inbox(cs.z);
    ASSERT_OK(kvp_ec_sched_create(&p, &cs.s));
    one_t co;
    one(&co, "r1", "H5", "T5", NULL);
    uint64_t t0 = kvp__now_ns();
    size_t seen = 0;
    while (kvp__now_ns() - t0 < 3000000000ull) {
        bool ready;
        ASSERT_OK(kvp_ec_sched_ensure_cache_available(cs.s, &co.req, 0, &ready));
        ASSERT(!ready);
        kvp_ec_strlist_t l;
        ASSERT_OK(kvp_ec_sched_take_unavailable_requests(cs.s, &l));
        if (l.n) {
            ASSERT_EQ(l.n, 1);
            ASSERT_STR_EQ(l.v[0], "r1");
            ASSERT_GE(kvp__now_ns() - t0, 900000000ull); /* not before the wait */
        }
        seen += l.n;
        kvp_ec_strlist_cleanup(&l);
        usleep(20000);
    }
    ASSERT_EQ(seen, 1); /* once, not again */
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_s36_s37_finished_first_remote_cancel_producer_gets_cancelled)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    sched_t cs;
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    one_t po, co;
    one(&po, "r1", "H6", "T6", c.addr);
    one(&co, "r1", "H6", "T6", NULL);
    /* the consumer's request finishes before any push: the scheduler
     * tombstones T6 and cancels it remotely on the consumer's shard */
    kvp_ec_finished_t fin;
    ASSERT_OK(kvp_ec_sched_request_finished(cs.s, &co.req, &fin));
    kvp_ec_finished_cleanup(&fin);
    kvp_ec_worker_stats_t st;
    uint64_t dl = kvp__now_ns() + 5000000000ull;
    do {
        kvp_ec_meta_t m;
        ASSERT_OK(kvp_ec_sched_build_connector_meta(cs.s, NULL, 0, NULL, 0, &m)); /* runs the cancel jobs' upkeep */
        kvp_ec_meta_cleanup(&m);
        usleep(5000);
        stats(c.w, &st);
    } while (st.tombstones == 0 && kvp__now_ns() < dl);
    ASSERT_EQ(st.tombstones, 1);
    /* the producer's reserve for it comes back cancelled: nothing written */
    prod_t p;
    prod_start(&p, c.addr, NULL, 2000);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.n), 1);
    ASSERT_EQ(atomic_load(&p.pushes.written), 0);
    stats(c.w, &st);
    ASSERT_EQ(st.push_bytes, 0);
    ASSERT_EQ(st.bytes_reserved, 0);
    /* and no record is revived on the consumer's scheduler */
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(cs.s, "H6", &has));
    ASSERT(!has);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_cross_encoder_cache_reserve_hits_pool)
{
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open("embedded://?capacity=64MiB", &pool));
    cons_opts_t o = {.pool = pool};
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, &o);
    sched_t cs;
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    prod_t p;
    prod_start(&p, c.addr, pool, 2000);
    one_t po, co;
    one(&po, "r1", "H3", "T3", c.addr);
    one(&co, "r1", "H3", "T3", NULL);
    produce(&p, &po); /* pushed, and put into the pool */
    cache_t cache = {0};
    kvp_ec_worker_t *ws[1] = {c.w};
    ASSERT(consume(&cs, ws, 1, &cache, &co));
    cache_free(&cache);
    /* the pool put goes after the push (on a data thread): wait for it */
    kvp_ec_worker_stats_t pst;
    uint64_t dl = kvp__now_ns() + 5000000000ull;
    do {
        usleep(2000);
        stats(p.w, &pst);
    } while (pst.cross_cache_puts == 0 && kvp__now_ns() < dl);
    ASSERT_EQ(pst.cross_cache_puts, 1);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
    /* A fresh consumer (nothing resident) sharing the pool: a reserve of H3
     * for another request is served from the pool, nothing is written. */
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, &o);
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    prod_stop(&p);
    prod_start(&p, c.addr, pool, 2000);
    one(&po, "r2", "H3", "T4", c.addr);
    one(&co, "r2", "H3", "T4", NULL);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.written), 0);
    ASSERT_EQ(atomic_load(&p.pushes.cached), 1);
    ws[0] = c.w;
    ASSERT(consume(&cs, ws, 1, &cache, &co));
    check_bytes(&cache, "H3");
    kvp_ec_worker_stats_t cst;
    stats(c.w, &cst);
    ASSERT_EQ(cst.cross_cache_hits, 1);
    ASSERT_EQ(cst.push_bytes, 0);
    cache_free(&cache);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
    kvp_pool_close(pool);
}

/* An image in the cross-encoder cache's pool, as a producer's put leaves
 * it: val under the store key of hash (model "m"). */
static void pool_put_image(kvp_pool_t *pool, const char *hash, const void *val, size_t nb)
{
    char key[KVP_KEY_MAX + 1];
    size_t klen;
    ASSERT_OK(kvp__ec_store_key("m", hash, key, sizeof key, &klen));
    kvp_key_t k = {key, (uint32_t)klen};
    kvp_iov_t iov = {(void *)val, nb};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t kr;
    ASSERT_OK(kvp_pool_put(pool, &k, &sgl, 1, &kr));
    ASSERT_OK(kr.status);
}

/* The cross-encoder cache's lookups do not hold up the control server:
 * reserves of one hash the pool holds, from two peers at once, share one
 * lookup and are both answered cached, byte for byte the pool's; a reserve
 * of a hash the pool lacks is answered write; requests of other kinds are
 * served meanwhile; the worker's stats count it all. */
TEST(test_ec_cross_encoder_cache_parked_reserves_share_one_lookup)
{
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &pool));
    uint8_t val[64];
    for (int i = 0; i < 64; i++)
        val[i] = (uint8_t)(i * 7 + 1);
    pool_put_image(pool, "HP", val, sizeof val);
    cons_opts_t o = {.pool = pool};
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, &o);
    rc_t a, b, q;
    rc_open(&a, c.addr);
    rc_open(&b, c.addr);
    rc_open(&q, c.addr);
    char buf[256];
    snprintf(buf, sizeof buf, RESERVE_FMT, "TPa", "HP");
    ASSERT_EQ(zmq_send(a.sock, buf, strlen(buf), 0), (int)strlen(buf));
    snprintf(buf, sizeof buf, RESERVE_FMT, "TPb", "HP");
    ASSERT_EQ(zmq_send(b.sock, buf, strlen(buf), 0), (int)strlen(buf));
    /* another peer's status is served whatever the lookups are doing */
    ASSERT(strstr(rc(&q, "{\"op\":\"status\",\"transfer_id\":\"none\"}"), "\"ok\":true"));
    for (int i = 0; i < 2; i++) {
        rc_t *x = i ? &b : &a;
        int n = zmq_recv(x->sock, x->reply, sizeof x->reply - 1, 0);
        ASSERT_GE(n, 0);
        x->reply[n] = 0;
        ASSERT(strstr(x->reply, "\"ok\":true"));
        ASSERT(strstr(x->reply, "\"cached\":true"));
        ASSERT(strstr(x->reply, "\"write\":false"));
    }
    /* the slot holds the pool's bytes: the reply's dst_ptr is in this process */
    const char *pp = strstr(a.reply, "\"dst_ptr\":");
    ASSERT(pp);
    const uint8_t *slot = (const uint8_t *)(uintptr_t)strtoull(pp + 10, NULL, 10);
    ASSERT(slot != NULL);
    ASSERT_MEM_EQ(slot, val, sizeof val);
    /* a hash the pool lacks: write */
    ASSERT(strstr(reserve(&q, "TPc", "HQ"), "\"write\":true"));
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.cross_cache_hits, 1);
    ASSERT_EQ(st.cross_cache_misses, 1);
    ASSERT_EQ(st.cross_cache_errors, 0);
    ASSERT_EQ(st.cross_cache_bytes, 64);
    ASSERT_EQ(st.cross_cache_parked, 0);
    ASSERT_EQ(st.reserves_cached, 2);
    rc_close(&a);
    rc_close(&b);
    rc_close(&q);
    kvp_ec_worker_destroy(c.w);
    kvp_pool_close(pool);
}

/* ---- scenarios 38-45 and 47 end to end (real sockets, workers, schedulers) ---- */

static size_t wait_active(kvp_ec_worker_t *w, size_t want);

/* A consumer (worker and scheduler, pool_size of the scheduler given), a
 * producer, and one request's two views (po on the producer, co on the
 * consumer). */
typedef struct {
    cons_t c;
    sched_t cs;
    prod_t p;
    one_t po, co;
} e2e_t;

static void e2e_start(e2e_t *e, int64_t sched_pool_size, const char *rid, const char *hash, const char *tid)
{
    cons_start(&e->c, free_ports(1), 1, 0, 16 << 20, NULL);
    sched_start(&e->cs, false, e->c.addr, 1, sched_pool_size);
    prod_start(&e->p, e->c.addr, NULL, 2000);
    one(&e->po, rid, hash, tid, e->c.addr);
    one(&e->co, rid, hash, tid, NULL);
}

static void e2e_stop(e2e_t *e)
{
    prod_stop(&e->p);
    sched_stop(&e->cs);
    kvp_ec_worker_destroy(e->c.w);
}

typedef struct {
    const char *tid;
    int state; /* -1: no record */
} find_t;

static int find_cb(void *ctx, const kvp_ec_record_view_t *r)
{
    find_t *f = ctx;
    if (strcmp(r->transfer_id, f->tid))
        return 0;
    f->state = (int)r->state;
    return 1;
}

static int rec_state(const sched_t *x, const char *tid)
{
    find_t f = {tid, -1};
    kvp_ec_sched_table_visit(x->s, find_cb, &f);
    return f.state;
}

/* One scheduler step with no request of its own: build meta, run it through
 * the worker, feed the worker meta back. */
static void step(sched_t *x, kvp_ec_worker_t *w, cache_t *cache, const char *const *freed, size_t n_freed)
{
    kvp_ec_meta_t m;
    ASSERT_OK(kvp_ec_sched_build_connector_meta(x->s, freed, n_freed, NULL, 0, &m));
    kvp_ec_encoder_cache_t ci = cache_iface(cache);
    ASSERT_OK(kvp_ec_worker_start_load_caches(w, &m, &ci));
    kvp_ec_meta_cleanup(&m);
    kvp_ec_worker_meta_t wm;
    bool has;
    ASSERT_OK(kvp_ec_worker_build_meta(w, &wm, &has));
    ASSERT_OK(kvp_ec_sched_update_connector_output(x->s, &wm));
    kvp_ec_worker_meta_cleanup(&wm);
}

/* Until the event of tid made it AVAILABLE (the inbox drained by
 * has_cache_item; a fake clock moves 50 ms a try). */
static void wait_available(sched_t *x, const char *hash, const char *tid)
{
    uint64_t dl = kvp__now_ns() + 5000000000ull;
    bool has = false;
    while (kvp__now_ns() < dl) {
        ASSERT_OK(kvp_ec_sched_has_cache_item(x->s, hash, &has));
        if (has && rec_state(x, tid) == KVP_EC_AVAILABLE)
            return;
        usleep(2000);
        g_fake_ms += 50; /* drains are rate-limited on the scheduler's clock */
    }
    ASSERT_MSG(false, "%s never became AVAILABLE (state %d)", tid, rec_state(x, tid));
}

/* 38: AVAILABLE and never loaded for 300 s -> expired, and the remote
 * cancel reaches the consumer's control server (its reservation ends);
 * 300 s later the record is gone. */
TEST(test_ec_s38_available_never_loaded_expires_remote_cancel_end_to_end)
{
    kvp_ec_clock_t fc = {fake_now, NULL};
    g_fake_ms = 1000000;
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    g_clock = &fc;
    sched_t cs;
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    g_clock = NULL;
    prod_t p;
    prod_start(&p, c.addr, NULL, 2000);
    one_t po, co;
    one(&po, "r38", "H38", "T38", c.addr);
    one(&co, "r38", "H38", "T38", NULL);
    bool ok;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(cs.s, &co.req, 0, &ok)); /* waiting for T38 */
    produce(&p, &po);
    wait_available(&cs, "H38", "T38");
    ASSERT_EQ(wait_active(c.w, 1), 1); /* READY at the consumer */
    g_fake_ms += 300 * 1000 + 1;
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(cs.s, "H38", &has)); /* the drain expires first */
    ASSERT(!has);
    /* the seed's state.py: expire makes it EXPIRED, and the scheduler's
     * queued cancel (table.cancel) leaves a CANCELLED tombstone */
    ASSERT_EQ(rec_state(&cs, "T38"), KVP_EC_CANCELLED);
    ASSERT_EQ(wait_active(c.w, 0), 0); /* the remote cancel arrived */
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.cancels, 1);
    ASSERT_EQ(st.takes, 0);
    g_fake_ms += 300 * 1000 + 1;
    ASSERT_OK(kvp_ec_sched_has_cache_item(cs.s, "H38", &has));
    ASSERT_EQ(rec_state(&cs, "T38"), -1);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
}

/* 39: the encoder cache frees H while READY -> RESIDENT; a new request
 * needing H loads it by local hand-off from the consumer's receive pool
 * (no second push), byte for byte. */
TEST(test_ec_s39_freed_ready_becomes_resident_local_handoff_end_to_end)
{
    e2e_t e;
    e2e_start(&e, 16 << 20, "r39", "H39", "T39");
    one_t co2;
    produce(&e.p, &e.po);
    cache_t cache = {0};
    kvp_ec_worker_t *ws[1] = {e.c.w};
    ASSERT(consume(&e.cs, ws, 1, &cache, &e.co));
    ASSERT_EQ(rec_state(&e.cs, "T39"), KVP_EC_READY);
    /* the engine frees it */
    cache_free(&cache);
    ASSERT_OK(kvp_ec_sched_update_state_after_free(e.cs.s, &e.co.req, 0));
    const char *freed[1] = {"H39"};
    step(&e.cs, e.c.w, &cache, freed, 1);
    ASSERT_EQ(rec_state(&e.cs, "T39"), KVP_EC_RESIDENT);
    /* another request for H39, nothing pushed for it */
    one(&co2, "r39b", "H39", "T39b", NULL);
    ASSERT(consume(&e.cs, ws, 1, &cache, &co2));
    check_bytes(&cache, "H39");
    kvp_ec_worker_stats_t st;
    stats(e.c.w, &st);
    ASSERT_EQ(st.takes, 1);
    ASSERT_EQ(atomic_load(&e.p.pushes.n), 1);
    cache_free(&cache);
    e2e_stop(&e);
}

/* 47: while the producer worker reports pending_saves the scheduler has
 * pending push work; once a meta reports none, it has not. */
TEST(test_ec_s47_pending_saves_pending_push_work_end_to_end)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    prod_t p;
    prod_start(&p, c.addr, NULL, 2000);
    one_t po;
    one(&po, "r47", "H47", "T47", c.addr);
    bool ok;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(p.s.s, &po.req, 0, &ok));
    ASSERT_OK(kvp_ec_sched_update_state_after_alloc(p.s.s, &po.req, 0));
    kvp_ec_meta_t m;
    ASSERT_OK(kvp_ec_sched_build_connector_meta(p.s.s, NULL, 0, NULL, 0, &m));
    cache_t none = {0};
    kvp_ec_encoder_cache_t ci = cache_iface(&none);
    ASSERT_OK(kvp_ec_worker_start_save_caches(p.w, &m, &ci));
    kvp_ec_meta_cleanup(&m);
    /* reserved, source not yet bound: the worker has a save pending */
    kvp_ec_worker_meta_t wm;
    bool has;
    ASSERT_OK(kvp_ec_worker_build_meta(p.w, &wm, &has));
    ASSERT(wm.pending_saves);
    ASSERT_OK(kvp_ec_sched_update_connector_output(p.s.s, &wm));
    kvp_ec_worker_meta_cleanup(&wm);
    ASSERT(kvp_ec_sched_has_pending_push_work(p.s.s));
    uint8_t *out = kvp__malloc(NBYTES);
    fill(out, NBYTES, "H47");
    int64_t shape[2] = {256, 1024};
    kvp_ec_tensor_t t = {out, NBYTES, shape, 2, KVP_EC_DTYPE_BFLOAT16};
    ASSERT_OK(kvp_ec_worker_save_caches(p.w, "H47", &t));
    kvp__free(out, NBYTES);
    uint64_t dl = kvp__now_ns() + 10000000000ull;
    bool pending = true;
    while (pending && kvp__now_ns() < dl) {
        ASSERT_OK(kvp_ec_worker_build_meta(p.w, &wm, &has));
        pending = wm.pending_saves;
        ASSERT_OK(kvp_ec_sched_update_connector_output(p.s.s, &wm));
        kvp_ec_worker_meta_cleanup(&wm);
        ASSERT_EQ(kvp_ec_sched_has_pending_push_work(p.s.s), pending);
        usleep(2000);
    }
    ASSERT(!pending);
    ASSERT(!kvp_ec_sched_has_pending_push_work(p.s.s));
    ASSERT_EQ(atomic_load(&p.pushes.ok), 1);
    prod_stop(&p);
    kvp_ec_worker_destroy(c.w);
}

/* 43: a producer request without ec_items pushes under the fallback id
 * "<request>:0" when consumer_zmq is set; the consumer holds a READY
 * reservation under that id. */
TEST(test_ec_s43_no_ec_items_fallback_transfer_id_end_to_end)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    prod_t p;
    prod_start(&p, c.addr, NULL, 2000);
    one_t po;
    one(&po, "r43", "H43", "unused", c.addr);
    po.params.items = NULL;
    po.params.n_items = 0;
    ASSERT(kvp_ec_request_transfer_id(&po.req, 0) == NULL); /* unresolved: the fallback applies */
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.ok), 1);
    rc_t q;
    rc_open(&q, c.addr);
    const char *rep = rc(&q, "{\"op\":\"status\",\"transfer_id\":\"r43:0\"}");
    ASSERT(strstr(rep, "\"mm_hash\":\"H43\""));
    ASSERT(strstr(rep, "\"ready\":true"));
    rc_close(&q);
    prod_stop(&p);
    kvp_ec_worker_destroy(c.w);
}

/* 44: a consumer request whose ec_items carry no mm_hash is matched by
 * position: the producer's push under that transfer id loads. */
TEST(test_ec_s44_ec_items_without_mm_hash_matched_by_position_end_to_end)
{
    e2e_t e;
    e2e_start(&e, 16 << 20, "r44", "H44", "T44");
    e.co.item.mm_hash = NULL;
    ASSERT_STR_EQ(kvp_ec_request_transfer_id(&e.co.req, 0), "T44");
    produce(&e.p, &e.po);
    cache_t cache = {0};
    kvp_ec_worker_t *ws[1] = {e.c.w};
    ASSERT(consume(&e.cs, ws, 1, &cache, &e.co));
    check_bytes(&cache, "H44");
    cache_free(&cache);
    e2e_stop(&e);
}

/* 40: RESIDENT bytes above pool_size -> the oldest RESIDENT records expire
 * (the scheduler's pool_size is two images here). */
TEST(test_ec_s40_resident_over_pool_size_oldest_expire_end_to_end)
{
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 16 << 20, NULL);
    sched_t cs;
    sched_start(&cs, false, c.addr, 1, 2 * NBYTES);
    prod_t p;
    prod_start(&p, c.addr, NULL, 2000);
    kvp_ec_worker_t *ws[1] = {c.w};
    static const char *const hs[3] = {"H40a", "H40b", "H40c"}, *const ts[3] = {"T40a", "T40b", "T40c"};
    for (int i = 0; i < 3; i++) {
        one_t po, co;
        char rid[8];
        snprintf(rid, sizeof rid, "r40%d", i);
        one(&po, rid, hs[i], ts[i], c.addr);
        one(&co, rid, hs[i], ts[i], NULL);
        produce(&p, &po);
        cache_t cache = {0};
        ASSERT(consume(&cs, ws, 1, &cache, &co));
        cache_free(&cache);
        ASSERT_OK(kvp_ec_sched_update_state_after_free(cs.s, &co.req, 0));
        const char *freed[1] = {hs[i]};
        step(&cs, c.w, &cache, freed, 1);
        bool has;
        ASSERT_OK(kvp_ec_sched_has_cache_item(cs.s, hs[i], &has));
    }
    /* the seed's state.py: EXPIRED, then as an orphan (expired from READY or
     * RESIDENT) cancelled by the scheduler: a CANCELLED tombstone */
    ASSERT_EQ(rec_state(&cs, "T40a"), KVP_EC_CANCELLED);
    ASSERT_EQ(rec_state(&cs, "T40b"), KVP_EC_RESIDENT);
    ASSERT_EQ(rec_state(&cs, "T40c"), KVP_EC_RESIDENT);
    ASSERT_EQ(kvp_ec_sched_resident_bytes(cs.s), 2 * NBYTES);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
}

/* 41: the worker fails the load (the consumer's reservation was abandoned
 * after the event) -> failed_loads={H} -> FAILED; finishing the request
 * then cancels nothing: no request reaches the control server. */
TEST(test_ec_s41_failed_load_failed_then_cancel_sends_nothing_end_to_end)
{
    e2e_t e;
    e2e_start(&e, 16 << 20, "r41", "H41", "T41");
    bool ready;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(e.cs.s, &e.co.req, 0, &ready));
    produce(&e.p, &e.po);
    wait_available(&e.cs, "H41", "T41");
    rc_t q;
    rc_open(&q, e.c.addr);
    ASSERT(strstr(rc(&q, "{\"op\":\"cancel\",\"transfer_id\":\"T41\",\"abandon\":true}"), "\"cancelled\":true"));
    rc_close(&q);
    cache_t cache = {0};
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(e.cs.s, &e.co.req, 0, &ready)); /* begin_load */
    ASSERT(!ready);
    step(&e.cs, e.c.w, &cache, NULL, 0); /* the load fails: failed_loads={H41} */
    ASSERT_EQ(rec_state(&e.cs, "T41"), KVP_EC_FAILED);
    ASSERT_EQ(cache.n, 0);
    kvp_ec_worker_stats_t st0, st1;
    stats(e.c.w, &st0);
    ASSERT_EQ(st0.takes_failed, 1);
    kvp_ec_finished_t fin;
    ASSERT_OK(kvp_ec_sched_request_finished(e.cs.s, &e.co.req, &fin));
    kvp_ec_finished_cleanup(&fin);
    usleep(300000); /* a remote cancel, were one queued, runs on the executor by now */
    stats(e.c.w, &st1);
    ASSERT_EQ(st1.control_requests, st0.control_requests);
    ASSERT_EQ(rec_state(&e.cs, "T41"), KVP_EC_FAILED);
    e2e_stop(&e);
}

/* 45: request_finished on the producer gives (False, {identifier:
 * {metadata, transfer_id}}); on the consumer (False, None) and its
 * unfinished transfer is cancelled at the consumer's control server. */
TEST(test_ec_s45_request_finished_producer_items_consumer_cancels_end_to_end)
{
    e2e_t e;
    e2e_start(&e, 16 << 20, "r45", "H45", "T45");
    produce(&e.p, &e.po);
    kvp_ec_finished_t fin;
    ASSERT_OK(kvp_ec_sched_request_finished(e.p.s.s, &e.po.req, &fin));
    ASSERT(!fin.delay_free);
    ASSERT(fin.has_items);
    ASSERT_EQ(fin.n_items, 1);
    ASSERT_STR_EQ(fin.items[0].identifier, "H45");
    ASSERT_STR_EQ(fin.items[0].modality, "image");
    ASSERT_EQ(fin.items[0].length, 256);
    ASSERT_STR_EQ(fin.items[0].transfer_id, "T45");
    kvp_ec_finished_cleanup(&fin);
    /* the consumer: its request waits on T45, pushed and READY there */
    bool ready;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(e.cs.s, &e.co.req, 0, &ready));
    ASSERT_EQ(wait_active(e.c.w, 1), 1);
    ASSERT_OK(kvp_ec_sched_request_finished(e.cs.s, &e.co.req, &fin));
    ASSERT(!fin.delay_free);
    ASSERT(!fin.has_items);
    kvp_ec_finished_cleanup(&fin);
    ASSERT_EQ(wait_active(e.c.w, 0), 0); /* the remote cancel ended the reservation */
    kvp_ec_worker_stats_t st;
    stats(e.c.w, &st);
    ASSERT_EQ(st.cancels, 1);
    ASSERT_EQ(st.takes, 0);
    e2e_stop(&e);
}

/* A hostile shard for 42: a bare ZeroMQ ROUTER that answers peers and
 * event_port like a control server and a PUSH that sends what it is given,
 * malformed or not (a misbehaving peer, not a stand-in for our server). */
typedef struct {
    uint16_t port;
    const char *const *events;
    size_t n_events;
    atomic_bool quit;
    atomic_int sent;
} hostile_t;

static void *hostile_main(void *arg)
{
    hostile_t *h = arg;
    void *ctx = zmq_ctx_new();
    void *router = zmq_socket(ctx, ZMQ_ROUTER), *push = zmq_socket(ctx, ZMQ_PUSH);
    int zero = 0, tmo = 5000;
    zmq_setsockopt(router, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof zero);
    zmq_setsockopt(push, ZMQ_SNDTIMEO, &tmo, sizeof tmo);
    char ep[64], last[64];
    snprintf(ep, sizeof ep, "tcp://127.0.0.1:%u", (unsigned)h->port);
    ASSERT_EQ(zmq_bind(router, ep), 0);
    ASSERT_EQ(zmq_bind(push, "tcp://127.0.0.1:*"), 0);
    size_t ll = sizeof last;
    ASSERT_EQ(zmq_getsockopt(push, ZMQ_LAST_ENDPOINT, last, &ll), 0);
    unsigned eport = (unsigned)atoi(strrchr(last, ':') + 1);
    bool events_out = false;
    while (!atomic_load(&h->quit)) {
        zmq_pollitem_t it = {router, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&it, 1, 20) > 0) {
            char id[256], req[1024], rep[128];
            int idn = zmq_recv(router, id, sizeof id, 0);
            zmq_recv(router, req, 0, 0); /* the empty delimiter */
            int n = zmq_recv(router, req, sizeof req - 1, 0);
            req[n > 0 ? n : 0] = 0;
            if (strstr(req, "\"peers\""))
                snprintf(rep, sizeof rep, "{\"ok\":true,\"result\":{\"ports\":[%u]}}", (unsigned)h->port);
            else if (strstr(req, "\"event_port\""))
                snprintf(rep, sizeof rep, "{\"ok\":true,\"result\":%u}", eport);
            else
                snprintf(rep, sizeof rep, "{\"ok\":true,\"result\":null}");
            zmq_send(router, id, (size_t)idn, ZMQ_SNDMORE);
            zmq_send(router, "", 0, ZMQ_SNDMORE);
            zmq_send(router, rep, strlen(rep), 0);
        }
        if (!events_out && strstr(last, "tcp://")) {
            /* PUSH waits for the inbox to connect (up to SNDTIMEO) */
            for (size_t i = 0; i < h->n_events; i++)
                if (zmq_send(push, h->events[i], strlen(h->events[i]), ZMQ_DONTWAIT) >= 0)
                    atomic_fetch_add(&h->sent, 1);
            events_out = atomic_load(&h->sent) == (int)h->n_events;
            if (!events_out)
                atomic_store(&h->sent, 0); /* no peer yet: all again next pass */
        }
    }
    zmq_close(router);
    zmq_close(push);
    zmq_ctx_term(ctx);
    return NULL;
}

/* 42: a malformed readiness event (no nbytes) on the real event channel is
 * dropped with a warning; the other event of the same drain still makes its
 * transfer AVAILABLE. */
TEST(test_ec_s42_malformed_event_dropped_others_processed_end_to_end)
{
    uint16_t port = free_ports(1);
    char e0[256], e1[256]; /* "shard" is the shard's control port, as our server sends it */
    snprintf(e0, sizeof e0,
             "{\"transfer_id\":\"T42a\",\"mm_hash\":\"H42a\",\"ready\":true,\"reservation_id\":\"x\","
             "\"shape\":[256,1024],\"dtype\":\"bfloat16\",\"shard\":%u}",
             (unsigned)port);
    snprintf(e1, sizeof e1,
             "{\"transfer_id\":\"T42b\",\"mm_hash\":\"H42b\",\"ready\":true,\"reservation_id\":\"y\","
             "\"nbytes\":524288,\"shape\":[256,1024],\"dtype\":\"bfloat16\",\"shard\":%u}",
             (unsigned)port);
    const char *const evs[] = {e0, e1};
    hostile_t h = {.port = port, .events = evs, .n_events = 2};
    atomic_init(&h.quit, false);
    atomic_init(&h.sent, 0);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, hostile_main, &h), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", (unsigned)h.port);
    sched_t cs;
    sched_start(&cs, false, addr, 1, 16 << 20);
    one_t a, b;
    one(&a, "r42a", "H42a", "T42a", NULL);
    one(&b, "r42b", "H42b", "T42b", NULL);
    bool ready;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(cs.s, &a.req, 0, &ready));
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(cs.s, &b.req, 0, &ready));
    wait_available(&cs, "H42b", "T42b");
    ASSERT_EQ(atomic_load(&h.sent), 2);
    ASSERT_EQ(rec_state(&cs, "T42a"), KVP_EC_WAITING_EVENT); /* its event counted for nothing */
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(cs.s, "H42a", &has));
    ASSERT(!has);
    atomic_store(&h.quit, true);
    pthread_join(th, NULL);
    sched_stop(&cs);
}

TEST(test_ec_producer_consumer_gone_retryable_failed_save)
{
    char addr[64];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", (unsigned)free_ports(1)); /* nobody listens */
    prod_t p;
    prod_start(&p, addr, NULL, 300);
    one_t po;
    one(&po, "r9", "H9", "T9", addr);
    bool ok;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(p.s.s, &po.req, 0, &ok));
    ASSERT_OK(kvp_ec_sched_update_state_after_alloc(p.s.s, &po.req, 0));
    kvp_ec_meta_t m;
    ASSERT_OK(kvp_ec_sched_build_connector_meta(p.s.s, NULL, 0, NULL, 0, &m));
    cache_t none = {0};
    kvp_ec_encoder_cache_t ci = cache_iface(&none);
    ASSERT_OK(kvp_ec_worker_start_save_caches(p.w, &m, &ci));
    kvp_ec_meta_cleanup(&m);
    uint64_t dl = kvp__now_ns() + 10000000000ull;
    bool failed = false;
    while (!failed && kvp__now_ns() < dl) {
        kvp_ec_worker_meta_t wm;
        bool has;
        ASSERT_OK(kvp_ec_worker_build_meta(p.w, &wm, &has));
        for (size_t i = 0; i < wm.n_failed_saves; i++)
            if (!strcmp(wm.failed_saves[i], "r9"))
                failed = true;
        ASSERT_OK(kvp_ec_sched_update_connector_output(p.s.s, &wm));
        kvp_ec_worker_meta_cleanup(&wm);
        usleep(5000);
    }
    ASSERT(failed);
    ASSERT_EQ(atomic_load(&p.pushes.n), 1);
    ASSERT(p.pushes.last != KVP_OK);
    ASSERT(p.pushes.retryable);
    kvp_ec_strlist_t l;
    ASSERT_OK(kvp_ec_sched_take_unavailable_requests(p.s.s, &l));
    ASSERT_EQ(l.n, 1);
    ASSERT_STR_EQ(l.v[0], "r9");
    kvp_ec_strlist_cleanup(&l);
    prod_stop(&p);
}

/* Fault: the consumer restarted.  A push while it is down fails with a
 * retryable error and leaves nothing pending at the producer; once a new
 * consumer (worker and scheduler) listens on the same port the same
 * producer pushes to it again (its control sockets reconnect, the push
 * transport connects to the new data endpoint), byte for byte. */
TEST(test_ec_fault_consumer_restarted)
{
    uint16_t port = free_ports(1);
    cons_t c;
    cons_start(&c, port, 1, 0, 16 << 20, NULL);
    sched_t cs;
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    prod_t p;
    prod_start(&p, c.addr, NULL, 400);
    one_t po, co;
    cache_t cache = {0};
    kvp_ec_worker_t *ws[1] = {c.w};
    one(&po, "r1", "HR1", "TR1", c.addr);
    one(&co, "r1", "HR1", "TR1", NULL);
    produce(&p, &po);
    ASSERT(consume(&cs, ws, 1, &cache, &co));
    check_bytes(&cache, "HR1");
    cache_free(&cache);
    /* down */
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
    one(&po, "r2", "HR2", "TR2", c.addr);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.n), 2);
    ASSERT_EQ(atomic_load(&p.pushes.ok), 1);
    ASSERT(p.pushes.last != KVP_OK);
    ASSERT(p.pushes.retryable);
    kvp_ec_worker_stats_t pst;
    stats(p.w, &pst);
    ASSERT_EQ(pst.pushes_pending, 0);
    ASSERT_EQ(pst.pushes_retryable, 1);
    /* back, on the same port */
    cons_start(&c, port, 1, 0, 16 << 20, NULL);
    sched_start(&cs, false, c.addr, 1, 16 << 20);
    ws[0] = c.w;
    one(&po, "r3", "HR3", "TR3", c.addr);
    one(&co, "r3", "HR3", "TR3", NULL);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.n), 3);
    ASSERT_EQ(atomic_load(&p.pushes.ok), 2);
    ASSERT(consume(&cs, ws, 1, &cache, &co));
    check_bytes(&cache, "HR3");
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_EQ(st.takes, 1);
    ASSERT_EQ(st.reservations_active, 0);
    cache_free(&cache);
    prod_stop(&p);
    sched_stop(&cs);
    kvp_ec_worker_destroy(c.w);
}

/* ---- a consumer shard in a process of its own (the slow-shard fault) ---- */

/* This binary run with KVP_TEST_EC_SHARD="base:tp:rank:lease_ms" is one
 * consumer shard: it says "ready" on stdout and serves until stdin closes
 * (before main: the test list never runs). */
__attribute__((constructor)) static void shard_child(void)
{
    const char *spec = getenv("KVP_TEST_EC_SHARD");
    unsigned base, tp, rank, lease;
    if (!spec || sscanf(spec, "%u:%u:%u:%u", &base, &tp, &rank, &lease) != 4)
        return;
    char addr[64];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", base);
    kvp_ec_config_t cfg;
    kvp_ec_config_init(&cfg);
    cfg.is_consumer = true;
    cfg.control_addr = addr;
    cfg.tp_size = tp;
    cfg.pool_size = 16 << 20;
    cfg.control_timeout_ms = 500;
    cfg.dtype = KVP_EC_DTYPE_BFLOAT16;
    kvp_ec_worker_params_t p;
    kvp_ec_worker_params_init(&p);
    p.config = &cfg;
    p.tp_rank = rank;
    p.lease_ms = lease;
    p.reap_interval_ms = lease / 4 ? lease / 4 : 1;
    kvp_ec_worker_t *w = NULL;
    if (kvp_ec_worker_create(&p, &w) != KVP_OK)
        _exit(3);
    if (write(STDOUT_FILENO, "ready\n", 6) != 6)
        _exit(4);
    char c;
    while (read(STDIN_FILENO, &c, 1) > 0) {
    }
    kvp_ec_worker_destroy(w);
    _exit(0);
}

/* ... and with KVP_TEST_POOL_SERVER="port_file" a kvpool server on
 * 127.0.0.1 (the port KVP_TEST_POOL_PORT names, else any; written to
 * port_file) until SIGTERM; KVP_TEST_POOL_NO_FILTER=1: without the
 * membership filter (every lookup goes to it). */
__attribute__((constructor)) static void pool_server_child(void)
{
    const char *pf = getenv("KVP_TEST_POOL_SERVER");
    if (!pf)
        return;
    const char *port = getenv("KVP_TEST_POOL_PORT");
    kvp__server_params_t p = {.host = "127.0.0.1", .memory = 64u << 20, .put_timeout_ns = 5000000000ull,
                              .port_file = pf, .no_prefault = 1, .port = port ? (uint16_t)atoi(port) : 0,
                              .no_filter = getenv("KVP_TEST_POOL_NO_FILTER") != NULL};
    _exit(kvp__server_run(&p) == KVP_OK ? 0 : 5);
}

typedef struct {
    pid_t pid;
    int in_fd; /* its stdin: closing it ends the shard */
} shard_proc_t;

static void shard_proc_start(shard_proc_t *sp, uint16_t base, int tp, int rank, int lease_ms)
{
    char env[96];
    snprintf(env, sizeof env, "KVP_TEST_EC_SHARD=%u:%d:%d:%d", (unsigned)base, tp, rank, lease_ms);
    char *envp[] = {env, NULL};
    int in[2], out[2];
    ASSERT_EQ(pipe(in), 0);
    ASSERT_EQ(pipe(out), 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        dup2(in[0], STDIN_FILENO);
        dup2(out[1], STDOUT_FILENO);
        close(in[1]);
        close(out[0]);
        execle("/proc/self/exe", "test_ec_worker", (char *)NULL, envp);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    char buf[8] = {0};
    ASSERT_EQ(read(out[0], buf, 6), 6);
    ASSERT_STR_EQ(buf, "ready\n");
    close(out[0]);
    sp->pid = pid;
    sp->in_fd = in[1];
}

static void shard_proc_stop(shard_proc_t *sp)
{
    kill(sp->pid, SIGCONT);
    close(sp->in_fd);
    int status = 0;
    ASSERT_EQ(waitpid(sp->pid, &status, 0), sp->pid);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

typedef struct {
    pid_t pid;
    int ms;
} cont_t;

static void *cont_after(void *arg)
{
    cont_t *c = arg;
    usleep((useconds_t)c->ms * 1000);
    kill(c->pid, SIGCONT);
    return NULL;
}

static size_t wait_active(kvp_ec_worker_t *w, size_t want)
{
    kvp_ec_worker_stats_t st;
    uint64_t dl = kvp__now_ns() + 5000000000ull;
    do {
        stats(w, &st);
        if (st.reservations_active == want)
            break;
        usleep(5000);
    } while (kvp__now_ns() < dl);
    return st.reservations_active;
}

/* A pool server in a child process, on port (0 = any), with the
 * membership filter or not; its URI into uri. */
static pid_t pool_server_start_with(uint16_t want, bool filter, char *uri, size_t len)
{
    char pf[64], env[96], penv[48];
    snprintf(pf, sizeof pf, "/tmp/kvp-ec-pool-%d.port", (int)getpid());
    unlink(pf);
    snprintf(env, sizeof env, "KVP_TEST_POOL_SERVER=%s", pf);
    snprintf(penv, sizeof penv, "KVP_TEST_POOL_PORT=%u", (unsigned)want);
    char *envp[5] = {env, "KVP_LOG_LEVEL=error"};
    int ne = 2;
    if (!filter)
        envp[ne++] = "KVP_TEST_POOL_NO_FILTER=1";
    if (want)
        envp[ne++] = penv;
    envp[ne] = NULL;
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
        execle("/proc/self/exe", "test_ec_worker", (char *)NULL, envp);
        _exit(127);
    }
    unsigned port = 0;
    for (int i = 0; i < 200 && !port; i++) {
        FILE *f = fopen(pf, "r");
        if (f) {
            if (fscanf(f, "%u", &port) != 1)
                port = 0;
            fclose(f);
        }
        if (!port)
            usleep(20000);
    }
    unlink(pf);
    ASSERT(port > 0);
    snprintf(uri, len, "kvpool://127.0.0.1:%u", port);
    return pid;
}

static pid_t pool_server_start_on(uint16_t want, char *uri, size_t len)
{
    return pool_server_start_with(want, true, uri, len);
}
static pid_t pool_server_start(char *uri, size_t len) { return pool_server_start_on(0, uri, len); }

static void pool_server_stop(pid_t pid)
{
    kill(pid, SIGCONT);
    kill(pid, SIGTERM);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
}

/* A consumer (64 MiB receive pool) whose cross-encoder cache is a pool
 * server in a child process (with the membership filter or not), and one
 * control peer. */
typedef struct {
    pid_t srv;
    kvp_pool_t *pool;
    cons_t c;
    rc_t peer;
} xc_t;

static void xc_start(xc_t *x, bool filter)
{
    char uri[64];
    x->srv = pool_server_start_with(0, filter, uri, sizeof uri);
    ASSERT_OK(kvp_pool_open(uri, &x->pool));
    cons_opts_t o = {.pool = x->pool};
    cons_start(&x->c, free_ports(1), 1, 0, 64 << 20, &o);
    rc_open(&x->peer, x->c.addr);
}

static void xc_stop(xc_t *x)
{
    rc_close(&x->peer);
    kvp_ec_worker_destroy(x->c.w);
    kvp_pool_close(x->pool);
    pool_server_stop(x->srv);
}

/* The pool server's membership filter answers a miss on this host: with
 * the pool server stopped (SIGSTOP), a reserve of an image the pool has
 * never held is answered write:true at once, a miss, not a pool error, and
 * nothing parks; a reserve of an image it holds still asks it (and waits
 * for it: answered once it runs again, cached). */
TEST(test_ec_cross_encoder_cache_miss_answered_by_the_filter)
{
    xc_t x;
    xc_start(&x, true);
    /* an image the pool holds (put there through a first reserve's miss
     * and the producer's put, as in a run: here straight into the pool) */
    uint8_t val[64] = {0}; /* RESERVE_FMT's tensor: [4, 8] bf16 */
    pool_put_image(x.pool, "HF1", val, sizeof val);
    ASSERT_EQ(kill(x.srv, SIGSTOP), 0);
    uint64_t t0 = kvp__now_ns();
    ASSERT(strstr(reserve(&x.peer, "TF0", "HF0"), "\"write\":true"));
    ASSERT_LT((kvp__now_ns() - t0) / 1000000u, 200); /* no lookup deadline waited */
    kvp_ec_worker_stats_t st;
    stats(x.c.w, &st);
    ASSERT_EQ(st.cross_cache_misses, 1);
    ASSERT_EQ(st.cross_cache_errors, 0);
    ASSERT_EQ(st.cross_cache_parked, 0);
    /* the held image: its lookup goes to the stopped server and parks */
    char buf[256];
    snprintf(buf, sizeof buf, RESERVE_FMT, "TF1", "HF1");
    ASSERT_EQ(zmq_send(x.peer.sock, buf, strlen(buf), 0), (int)strlen(buf));
    usleep(100000);
    stats(x.c.w, &st);
    ASSERT_EQ(st.cross_cache_parked, 1);
    ASSERT_EQ(kill(x.srv, SIGCONT), 0);
    int n = zmq_recv(x.peer.sock, x.peer.reply, sizeof x.peer.reply - 1, 0);
    ASSERT_GE(n, 0);
    x.peer.reply[n] = 0;
    ASSERT_MSG(strstr(x.peer.reply, "\"cached\":true"), "reply %s", x.peer.reply);
    stats(x.c.w, &st);
    ASSERT_EQ(st.cross_cache_hits, 1);
    xc_stop(&x);
}

/* A reserve whose lookup the pool's membership filter answers ends on the
 * control thread: the cross-encoder cache's get thread sleeps through it.
 * (It used to be woken for every one -- a futex call, and a thread taking
 * a core on a small host, in the middle of the reserve's service.) */
TEST(test_ec_cross_encoder_cache_filter_miss_leaves_the_get_thread_asleep)
{
    xc_t x;
    xc_start(&x, true);
    ASSERT(strstr(reserve(&x.peer, "TW", "HW"), "\"write\":true"));
    long before, after;
    ASSERT_EQ(threads_named("kvp-ec-xcache", &before), 1);
    for (int i = 0; i < 100; i++) {
        char tid[16], hash[16];
        snprintf(tid, sizeof tid, "TW%d", i);
        snprintf(hash, sizeof hash, "HW%d", i);
        ASSERT(strstr(reserve(&x.peer, tid, hash), "\"write\":true"));
    }
    ASSERT_EQ(threads_named("kvp-ec-xcache", &after), 1);
    ASSERT_MSG(after - before <= 3, "the get thread woke %ld times for 100 misses", after - before);
    kvp_ec_worker_stats_t st;
    stats(x.c.w, &st);
    ASSERT_EQ(st.cross_cache_misses, 101);
    ASSERT_EQ(st.cross_cache_hits, 0);
    xc_stop(&x);
}

/* The probe the cross-encoder cache asks on the control thread
 * (kvp__pool_probe): against a pool server on this host it answers an
 * EXISTS of a key the server never held from its membership filter, with
 * the server stopped (no I/O); a key it holds, or a server without the
 * filter, needs the server (0); a backend without a probe, or an op that
 * is not a lookup, is not probed (-1). */
TEST(test_ec_cross_encoder_cache_probe_answers_from_the_filter_only)
{
    char uri[64];
    pid_t srv = pool_server_start(uri, sizeof uri);
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open(uri, &pool));
    uint8_t val[64] = {1};
    kvp_key_t held = {"probe-held", 10}, never = {"probe-never", 11};
    kvp_iov_t iov = {val, sizeof val};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t kr;
    ASSERT_OK(kvp_pool_put(pool, &held, &sgl, 1, &kr));
    ASSERT_OK(kr.status);
    ASSERT_EQ(kill(srv, SIGSTOP), 0);
    uint8_t present = 7;
    kvp_op_t op = {.type = KVP_OP_EXISTS, .keys = &never, .n = 1, .present = &present};
    uint64_t t0 = kvp__now_ns();
    ASSERT_EQ(kvp__pool_probe(pool, &op), 1);
    ASSERT_EQ(present, 0);
    ASSERT_LT((kvp__now_ns() - t0) / 1000000u, 100);
    present = 7;
    op.keys = &held;
    ASSERT_EQ(kvp__pool_probe(pool, &op), 0);
    ASSERT_EQ(present, 7); /* not answered: untouched */
    kvp_op_t put = {.type = KVP_OP_PUT, .keys = &held, .n = 1, .values = &sgl, .results = &kr};
    ASSERT_EQ(kvp__pool_probe(pool, &put), -1);
    ASSERT_EQ(kill(srv, SIGCONT), 0);
    kvp_pool_close(pool);
    pool_server_stop(srv);
    /* a server without the filter: every lookup needs it */
    srv = pool_server_start_with(0, false, uri, sizeof uri);
    ASSERT_OK(kvp_pool_open(uri, &pool));
    op.keys = &never;
    ASSERT_EQ(kvp__pool_probe(pool, &op), 0);
    kvp_pool_close(pool);
    pool_server_stop(srv);
    /* embedded://: no probe (its submit answers at once) */
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &pool));
    ASSERT_EQ(kvp__pool_probe(pool, &op), -1);
    kvp_pool_close(pool);
}

/* A lookup the probe cannot answer (a pool server without the membership
 * filter) asks the pool for the value at once, straight into the slab, with
 * no existence check first: an image the pool lacks is the get's NOT_FOUND
 * (a miss, not an error; the server counts a get miss), one it holds is
 * that get's hit (answered cached, with the pool's bytes). */
TEST(test_ec_cross_encoder_cache_lookup_asks_for_the_value_at_once)
{
    xc_t x;
    xc_start(&x, false);
    uint8_t val[64]; /* RESERVE_FMT's tensor: [4, 8] bf16 */
    for (size_t i = 0; i < sizeof val; i++)
        val[i] = (uint8_t)(0xA0 + i);
    pool_put_image(x.pool, "HG1", val, sizeof val);
    kvp_pool_stats_t p0, p1, p2;
    ASSERT_OK(kvp_pool_stats(x.pool, &p0));
    ASSERT(strstr(reserve(&x.peer, "TG0", "HG0"), "\"write\":true"));
    ASSERT_OK(kvp_pool_stats(x.pool, &p1));
    ASSERT_EQ(p1.get_misses, p0.get_misses + 1); /* the lookup was a get */
    ASSERT_EQ(p1.get_hits, p0.get_hits);
    kvp_ec_worker_stats_t st;
    stats(x.c.w, &st);
    ASSERT_EQ(st.cross_cache_misses, 1);
    ASSERT_EQ(st.cross_cache_errors, 0);
    const char *rep = reserve(&x.peer, "TG1", "HG1");
    ASSERT_MSG(strstr(rep, "\"cached\":true") && strstr(rep, "\"write\":false"), "reply %s", rep);
    ASSERT_OK(kvp_pool_stats(x.pool, &p2));
    ASSERT_EQ(p2.get_hits, p1.get_hits + 1);
    ASSERT_EQ(p2.get_misses, p1.get_misses);
    stats(x.c.w, &st);
    ASSERT_EQ(st.cross_cache_hits, 1);
    ASSERT_EQ(st.cross_cache_misses, 1);
    /* the slot holds the pool's bytes: the reply's dst_ptr is in this process */
    const char *pp = strstr(rep, "\"dst_ptr\":");
    ASSERT(pp);
    const uint8_t *slot = (const uint8_t *)(uintptr_t)strtoull(pp + 10, NULL, 10);
    ASSERT(slot != NULL);
    ASSERT_MEM_EQ(slot, val, sizeof val);
    xc_stop(&x);
}

/* A peer that can hold parked reserves against a stopped pool: 40 reserves
 * of fresh hashes from 40 sockets while the cross-encoder cache's pool
 * server (without the membership filter, so that every lookup asks it) is
 * stopped (SIGSTOP) park for their lookups; meanwhile a healthy
 * peer's request is served at once; every parked reserve is answered
 * (write) once the lookups' deadline passes (those queued behind the
 * failing ones skipped, not asked in turn), nothing stays parked, the
 * failure counts, and the reserves after it skip the pool (backoff) and are
 * answered at once. */
TEST(test_ec_cross_encoder_cache_pool_stopped_reserves_not_held)
{
    char uri[64];
    pid_t srv = pool_server_start_with(0, false, uri, sizeof uri);
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open(uri, &pool));
    cons_opts_t o = {.pool = pool};
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 64 << 20, &o);
    ASSERT_EQ(kill(srv, SIGSTOP), 0);
    uint64_t t_sent = kvp__now_ns();
    enum { N = 40 };
    rc_t *bad = calloc(N, sizeof *bad);
    char buf[256];
    for (int i = 0; i < N; i++) {
        rc_open(&bad[i], c.addr);
        char tid[16], hash[16];
        snprintf(tid, sizeof tid, "TX%d", i);
        snprintf(hash, sizeof hash, "HX%d", i);
        snprintf(buf, sizeof buf, RESERVE_FMT, tid, hash);
        ASSERT_EQ(zmq_send(bad[i].sock, buf, strlen(buf), 0), (int)strlen(buf));
    }
    usleep(100000);
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_GT(st.cross_cache_parked, 0); /* visible while they wait */
    rc_t healthy;
    rc_open(&healthy, c.addr);
    uint64_t t0 = kvp__now_ns();
    ASSERT(strstr(rc(&healthy, "{\"op\":\"status\",\"transfer_id\":\"TX0\"}"), "\"ok\":true"));
    ASSERT_LT((kvp__now_ns() - t0) / 1000000u, 500); /* not behind the parked ones */
    for (int i = 0; i < N; i++) {
        int n = zmq_recv(bad[i].sock, bad[i].reply, sizeof bad[i].reply - 1, 0); /* RCVTIMEO 5 s */
        ASSERT_GE(n, 0);
        bad[i].reply[n] = 0;
        ASSERT(strstr(bad[i].reply, "\"write\":true"));
        rc_close(&bad[i]);
    }
    /* each within its lookup's 1 s: those queued behind the gets in flight
     * were skipped once those failed, not asked in turn (40 asked a few at
     * a time would take several seconds) */
    ASSERT_LT((kvp__now_ns() - t_sent) / 1000000u, 3000);
    free(bad);
    stats(c.w, &st);
    ASSERT_EQ(st.cross_cache_parked, 0);
    ASSERT_GE(st.cross_cache_errors, 1);
    ASSERT_GE(st.cross_cache_skipped, 1);
    ASSERT_EQ(st.cross_cache_hits, 0);
    /* backing off: a reserve now does not wait for the stopped pool */
    t0 = kvp__now_ns();
    ASSERT(strstr(reserve(&healthy, "TY", "HY"), "\"write\":true"));
    ASSERT_LT((kvp__now_ns() - t0) / 1000000u, 500);
    stats(c.w, &st);
    ASSERT_GE(st.cross_cache_skipped, 1);
    rc_close(&healthy);
    kvp_ec_worker_destroy(c.w);
    kill(srv, SIGCONT);
    kvp_pool_close(pool);
    kill(srv, SIGTERM);
    int status = 0;
    ASSERT_EQ(waitpid(srv, &status, 0), srv);
}

/* The pool down when the consumer starts (connect=lazy: the open does not
 * wait for it): reserves are answered write at once while the lookups fail
 * (counted, the pool backed off); once a pool server answers on that
 * address the client connects by itself, and a reserve of a hash the pool
 * holds is answered cached with the pool's bytes. */
TEST(test_ec_cross_encoder_cache_pool_down_at_start_then_up)
{
    char uri[64], lazy[96];
    pid_t srv = pool_server_start(uri, sizeof uri); /* for a port that is free again once it ends */
    pool_server_stop(srv);
    uint16_t port = (uint16_t)atoi(strrchr(uri, ':') + 1);
    snprintf(lazy, sizeof lazy, "%s?connect=lazy&timeout=500ms", uri);
    kvp_pool_t *pool;
    ASSERT_EQ(kvp_pool_open(uri, &pool), KVP_ERR_CONN_REFUSED); /* connect=now (the default): the open fails */
    ASSERT_OK(kvp_pool_open(lazy, &pool));
    cons_opts_t o = {.pool = pool};
    cons_t c;
    cons_start(&c, free_ports(1), 1, 0, 1 << 20, &o);
    rc_t q;
    rc_open(&q, c.addr);
    uint64_t t0 = kvp__now_ns();
    ASSERT(strstr(reserve(&q, "TD0", "HD0"), "\"write\":true"));
    ASSERT_LT((kvp__now_ns() - t0) / 1000000u, 500);
    kvp_ec_worker_stats_t st;
    stats(c.w, &st);
    ASSERT_GE(st.cross_cache_errors, 1);
    ASSERT_EQ(st.cross_cache_hits, 0);
    /* the pool comes up on that address, and holds HD */
    srv = pool_server_start_on(port, uri, sizeof uri);
    uint8_t val[64];
    for (int i = 0; i < 64; i++)
        val[i] = (uint8_t)(i * 5 + 3);
    const char *key = "ec@m@HD"; /* kvp__ec_store_key("m", "HD") */
    kvp_key_t k = {key, (uint32_t)strlen(key)};
    kvp_iov_t iov = {val, sizeof val};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t res = {0};
    kvp_status_t pst = KVP_ERR_CONN_LOST;
    uint64_t dl = kvp__now_ns() + 15000000000ull;
    while (kvp__now_ns() < dl && (pst != KVP_OK || res.status != KVP_OK)) {
        pst = kvp_pool_put(pool, &k, &sgl, 1, &res); /* fails at once until the client reconnects */
        if (pst != KVP_OK || res.status != KVP_OK)
            usleep(50000);
    }
    ASSERT_OK(pst);
    ASSERT_OK(res.status);
    /* reserves for other transfers of HD until the pool's backoff has passed */
    const char *r = NULL;
    char tid[16];
    for (int i = 1; i < 200; i++) {
        snprintf(tid, sizeof tid, "TD%d", i);
        r = reserve(&q, tid, "HD");
        if (strstr(r, "\"cached\":true"))
            break;
        ASSERT(strstr(r, "\"write\":true"));
        /* abandoned, so the next reserve of HD is not this one's follower */
        char cbuf[128];
        snprintf(cbuf, sizeof cbuf, "{\"op\":\"cancel\",\"transfer_id\":\"%s\",\"abandon\":true}", tid);
        ASSERT(strstr(rc(&q, cbuf), "\"cancelled\":true"));
        usleep(50000);
    }
    ASSERT(strstr(r, "\"cached\":true"));
    ASSERT(strstr(r, "\"write\":false"));
    const char *pp = strstr(r, "\"dst_ptr\":");
    ASSERT(pp);
    const uint8_t *slot = (const uint8_t *)(uintptr_t)strtoull(pp + 10, NULL, 10);
    ASSERT(slot != NULL);
    ASSERT_MEM_EQ(slot, val, sizeof val);
    stats(c.w, &st);
    ASSERT_EQ(st.cross_cache_hits, 1);
    ASSERT_EQ(st.cross_cache_parked, 0);
    rc_close(&q);
    kvp_ec_worker_destroy(c.w);
    kvp_pool_close(pool);
    pool_server_stop(srv);
}

/* Fault: two shards, one slow (its process stopped with SIGSTOP).  Slow
 * within the control timeout: the push waits for it, goes to both shards,
 * and the request loads once both events are in.  Slower than the timeout:
 * the push fails with a retryable error, the producer cancels with abandon
 * and the fast shard is left holding nothing; the slow shard, once it runs
 * again, frees what it reserved by its lease. */
TEST(test_ec_fault_two_shards_one_slow)
{
    uint16_t base = free_ports(2);
    cons_t c;
    cons_start(&c, base, 2, 0, 16 << 20, NULL);
    shard_proc_t slow;
    shard_proc_start(&slow, base, 2, 1, 1500);
    sched_t cs;
    sched_start(&cs, false, c.addr, 2, 16 << 20);
    prod_t p;
    prod_start(&p, c.addr, NULL, 1200);
    one_t po, co;
    /* slow, within the timeout: 400 ms stopped */
    one(&po, "r1", "HS1", "TS1", c.addr);
    one(&co, "r1", "HS1", "TS1", NULL);
    ASSERT_EQ(kill(slow.pid, SIGSTOP), 0);
    cont_t ct = {slow.pid, 400};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, cont_after, &ct), 0);
    uint64_t t0 = kvp__now_ns();
    produce(&p, &po);
    uint64_t took_ms = (kvp__now_ns() - t0) / 1000000u;
    pthread_join(th, NULL);
    ASSERT_EQ(atomic_load(&p.pushes.ok), 1);
    ASSERT_EQ(atomic_load(&p.pushes.written), 2); /* both shards */
    ASSERT_GE(took_ms, 300);                      /* it did wait for the slow one */
    cache_t cache = {0};
    kvp_ec_worker_t *ws[1] = {c.w};
    ASSERT(consume(&cs, ws, 1, &cache, &co)); /* needs the events of both shards */
    check_bytes(&cache, "HS1");
    cache_free(&cache);
    /* slower than the control timeout: 3 s stopped */
    one(&po, "r2", "HS2", "TS2", c.addr);
    ASSERT_EQ(kill(slow.pid, SIGSTOP), 0);
    ct.ms = 3000;
    ASSERT_EQ(pthread_create(&th, NULL, cont_after, &ct), 0);
    produce(&p, &po);
    ASSERT_EQ(atomic_load(&p.pushes.n), 2);
    ASSERT(p.pushes.last != KVP_OK);
    ASSERT(p.pushes.retryable);
    ASSERT_EQ(wait_active(c.w, 0), 0); /* the fast shard's reservation was abandoned */
    kvp_ec_worker_stats_t pst;
    stats(p.w, &pst);
    ASSERT_EQ(pst.pushes_pending, 0);
    ASSERT_EQ(pst.pushes_retryable, 1);
    pthread_join(th, NULL);
    /* the slow shard, running again, holds nothing for TS2 by its lease
     * (a cancel that reached it, or expiry) */
    char addr1[64];
    snprintf(addr1, sizeof addr1, "tcp://127.0.0.1:%u", (unsigned)(base + 1));
    rc_t q;
    rc_open(&q, addr1);
    bool gone = false;
    uint64_t dl = kvp__now_ns() + 8000000000ull;
    while (!gone && kvp__now_ns() < dl) {
        gone = strstr(rc(&q, "{\"op\":\"status\",\"transfer_id\":\"TS2\"}"), "\"result\":null") != NULL;
        if (!gone)
            usleep(50000);
    }
    ASSERT(gone);
    rc_close(&q);
    prod_stop(&p);
    sched_stop(&cs);
    shard_proc_stop(&slow);
    kvp_ec_worker_destroy(c.w);
}

TEST(test_ec_worker_meta_aggregate_intersects_loaded_unites_rest)
{
    char *l1[] = {"A", "B"}, *l2[] = {"B", "C"}, *f1[] = {"X"}, *f2[] = {"Y"};
    kvp_ec_worker_meta_t a = {.loaded = l1, .n_loaded = 2, .failed_loads = f1, .n_failed_loads = 1};
    kvp_ec_worker_meta_t b = {.loaded = l2, .n_loaded = 2, .failed_loads = f2, .n_failed_loads = 1,
                              .pending_saves = true};
    kvp_ec_worker_meta_t o;
    ASSERT_OK(kvp_ec_worker_meta_aggregate(&a, &b, &o));
    ASSERT_EQ(o.n_loaded, 1);
    ASSERT_STR_EQ(o.loaded[0], "B");
    ASSERT_EQ(o.n_failed_loads, 2);
    ASSERT(o.pending_saves);
    kvp_ec_worker_meta_cleanup(&o);
}

TEST(test_ec_worker_config_validation_scenario_46)
{
    kvp_ec_config_t c;
    kvp_ec_config_init(&c);
    c.is_producer = true;
    c.tp_size = 2;
    c.control_addr = "tcp://127.0.0.1:5000";
    c.pool_size = 1 << 20;
    c.hidden_dim = 8;
    kvp_ec_worker_params_t p;
    kvp_ec_worker_params_init(&p);
    p.config = &c;
    kvp_ec_worker_t *w = NULL;
    ASSERT_EQ(kvp_ec_worker_create(&p, &w), KVP_ERR_BAD_CONFIG);
    ASSERT(!w);
    c.is_producer = false;
    c.is_consumer = true;
    c.control_addr = "tcp://127.0.0.1:65535";
    ASSERT_EQ(kvp_ec_worker_create(&p, &w), KVP_ERR_BAD_CONFIG);
    c.control_addr = NULL;
    c.ec_ip = "127.0.0.1";
    c.ec_port = 65535;
    ASSERT_EQ(kvp_ec_worker_create(&p, &w), KVP_ERR_BAD_CONFIG);
    c.tp_size = 1;
    c.control_timeout_ms = 0;
    ASSERT_EQ(kvp_ec_worker_create(&p, &w), KVP_ERR_BAD_CONFIG);
}

TEST_LIST(T(test_ec_s48_reserve_shape_dtype_mismatch_is_an_error),
          T(test_ec_s49_cancel_while_writing_deferred_then_complete_frees),
          T(test_ec_s37_cancel_unknown_leaves_tombstone_reserve_cancelled), T(test_ec_control_ops_peers_event_port_status),
          T(test_ec_control_bad_input_gets_error_replies_server_goes_on),
          T(test_ec_control_peer_cap_healthy_peer_served_leases_expire), T(test_ec_events_bounded_queue_drops_oldest),
          T(test_ec_s33_push_then_event_then_load_end_to_end), T(test_ec_s33_over_tcp_stream), T(test_ec_s35_two_shards_both_written_loaded_on_both),
          T(test_ec_s34_no_push_within_wait_unavailable_once_end_to_end),
          T(test_ec_s36_s37_finished_first_remote_cancel_producer_gets_cancelled),
          T(test_ec_cross_encoder_cache_reserve_hits_pool), T(test_ec_cross_encoder_cache_parked_reserves_share_one_lookup),
          T(test_ec_cross_encoder_cache_pool_stopped_reserves_not_held),
          T(test_ec_cross_encoder_cache_miss_answered_by_the_filter),
          T(test_ec_cross_encoder_cache_filter_miss_leaves_the_get_thread_asleep),
          T(test_ec_cross_encoder_cache_probe_answers_from_the_filter_only),
          T(test_ec_cross_encoder_cache_lookup_asks_for_the_value_at_once), T(test_ec_metrics_show_what_peers_hold),
          T(test_ec_control_service_time_inside_the_round_trips),
          T(test_ec_cross_encoder_cache_pool_down_at_start_then_up),
          T(test_ec_s38_available_never_loaded_expires_remote_cancel_end_to_end),
          T(test_ec_s39_freed_ready_becomes_resident_local_handoff_end_to_end),
          T(test_ec_s47_pending_saves_pending_push_work_end_to_end),
          T(test_ec_s42_malformed_event_dropped_others_processed_end_to_end),
          T(test_ec_s40_resident_over_pool_size_oldest_expire_end_to_end),
          T(test_ec_s41_failed_load_failed_then_cancel_sends_nothing_end_to_end),
          T(test_ec_s45_request_finished_producer_items_consumer_cancels_end_to_end),
          T(test_ec_s43_no_ec_items_fallback_transfer_id_end_to_end),
          T(test_ec_s44_ec_items_without_mm_hash_matched_by_position_end_to_end),
          T(test_ec_producer_consumer_gone_retryable_failed_save),
          T(test_ec_fault_consumer_restarted), T(test_ec_fault_two_shards_one_slow), T(test_ec_worker_meta_aggregate_intersects_loaded_unites_rest),
          T(test_ec_worker_config_validation_scenario_46))
