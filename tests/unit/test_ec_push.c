/* The EC push data plane (src/ec/ec_push.h): real sockets on 127.0.0.1, a
 * slab in the test and a check callback backed by a table of reservations.
 * TCP writes land byte-exact; out-of-bounds and refused ranges leave the
 * slab untouched; hostile clients (garbage, truncated, silent) are dropped
 * while a healthy writer keeps working; the connection cap; four concurrent
 * writers; a UCX RMA write between two processes; the producer's own bounds
 * check; the session and frame codecs. */
#include "test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "ec/ec_push.h"
#include "ec/ec_push_wire.h"
#include "net/lane.h"

#define SLAB (8u << 20)
#define RID "0123456789abcdef0123456789abcdef"

/* ---- the reservation table behind check() ---- */
typedef struct {
    uint64_t off, len;
    char rid[40];
} resv_t;
typedef struct {
    pthread_mutex_t mu;
    resv_t r[16];
    int n;
    int calls;
} table_t;

static kvp_status_t check(void *ctx, uint64_t off, uint64_t len, const char *rid)
{
    table_t *t = ctx;
    pthread_mutex_lock(&t->mu);
    t->calls++;
    kvp_status_t st = KVP_ERR_INVALID_ARG;
    for (int i = 0; i < t->n; i++)
        if (off >= t->r[i].off && len <= t->r[i].len && off - t->r[i].off <= t->r[i].len - len &&
            (!rid[0] || !strcmp(rid, t->r[i].rid)))
            st = KVP_OK;
    pthread_mutex_unlock(&t->mu);
    return st;
}

static void table_add(table_t *t, uint64_t off, uint64_t len, const char *rid)
{
    pthread_mutex_lock(&t->mu);
    t->r[t->n].off = off;
    t->r[t->n].len = len;
    snprintf(t->r[t->n].rid, sizeof t->r[t->n].rid, "%s", rid);
    t->n++;
    pthread_mutex_unlock(&t->mu);
}

typedef struct {
    uint8_t *slab;
    table_t t;
    kvp__ec_push_rx_t *rx;
    kvp__ec_push_tx_t *tx;
} fix_t;

static void fix_init(fix_t *f, size_t max_conns, int64_t idle_ms)
{
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->t.mu, NULL);
    f->slab = calloc(1, SLAB);
    ASSERT(f->slab);
    kvp__ec_push_rx_params_t p = {
        .host = "127.0.0.1",
        .slab = f->slab,
        .slab_size = SLAB,
        .paths = KVP__EC_PATH_TCP,
        .check = check,
        .check_ctx = &f->t,
        .max_conns = max_conns,
        .idle_ms = idle_ms,
    };
    ASSERT_OK(kvp__ec_push_rx_create(&p, &f->rx));
    kvp__ec_push_tx_params_t tp = {.paths = KVP__EC_PATH_TCP | KVP__EC_PATH_UCX, .timeout_ms = 5000};
    ASSERT_OK(kvp__ec_push_tx_create(&tp, &f->tx));
}

static void fix_fini(fix_t *f)
{
    kvp__ec_push_tx_destroy(f->tx);
    kvp__ec_push_rx_destroy(f->rx);
    free(f->slab);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

static uint8_t *pattern(size_t n, unsigned seed)
{
    uint8_t *p = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 131 + seed * 7 + (i >> 9));
    return p;
}

static bool all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return false;
    return true;
}

static uint64_t dst(fix_t *f, uint64_t off) { return (uint64_t)(uintptr_t)f->slab + off; }

static kvp_status_t push(fix_t *f, const char *rid, uint64_t off, const void *src, uint64_t len)
{
    unsigned path = 0;
    kvp_status_t st = kvp__ec_push_tx_write(f->tx, kvp__ec_push_rx_session(f->rx), rid, dst(f, off), src, len, &path);
    if (st == KVP_OK)
        ASSERT_EQ(path, KVP__EC_PATH_TCP);
    return st;
}

static void stats(fix_t *f, kvp__ec_push_rx_stats_t *s) { kvp__ec_push_rx_stats(f->rx, s); }

/* Waits up to ms for cond on the receiver's stats. */
#define WAIT_STATS(f, s, cond, ms)                                 \
    do {                                                           \
        uint64_t until_ = kvp__now_ns() + (uint64_t)(ms) * 1000000; \
        for (;;) {                                                 \
            stats(f, &s);                                          \
            if ((cond) || kvp__now_ns() > until_)                  \
                break;                                             \
            usleep(2000);                                          \
        }                                                          \
    } while (0)

/* ---- raw clients ---- */
static int raw_connect(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {.tv_sec = 3};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Reads a status frame: its status, or 1 when the connection closed first. */
static int raw_status(int fd)
{
    uint8_t in[KVP_LANE_HEAD + KVP__EC_PUSH_STATUS_LEN];
    size_t got = 0;
    while (got < sizeof in) {
        ssize_t k = recv(fd, in + got, sizeof in - got, 0);
        if (k <= 0)
            return 1;
        got += (size_t)k;
    }
    uint32_t hl;
    uint64_t dl, landed;
    kvp_status_t st;
    ASSERT_EQ(kvp__lane_head_decode(in, &hl, &dl), 0);
    ASSERT_OK(kvp__ec_push_status_decode(in + KVP_LANE_HEAD, hl, dl, &st, &landed));
    return st;
}

/* After a status (or none), the receiver closes: recv sees EOF. */
static bool raw_closed(int fd)
{
    char c;
    return recv(fd, &c, 1, 0) == 0;
}

static void raw_send(int fd, const void *p, size_t n) { ASSERT_EQ(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n); }

static void raw_write_frame(int fd, uint64_t off, uint64_t len, uint64_t data_len, const char *rid)
{
    uint8_t hdr[KVP__EC_PUSH_WRITE_MAX], head[KVP_LANE_HEAD];
    size_t hl = kvp__ec_push_write_encode(hdr, off, len, rid);
    ASSERT(hl > 0);
    kvp__lane_head_encode(head, (uint32_t)hl, data_len);
    raw_send(fd, head, sizeof head);
    raw_send(fd, hdr, hl);
}

/* ---- tests ---- */

TEST(test_ec_push_tcp_write_lands_byte_exact)
{
    fix_t f;
    fix_init(&f, 0, 0);
    size_t sizes[] = {1, 4096, 65536, 4u << 20, 100003};
    uint64_t off = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        table_add(&f.t, off, sizes[i], RID);
        uint8_t *src = pattern(sizes[i], (unsigned)i);
        ASSERT_OK(push(&f, RID, off, src, sizes[i]));
        ASSERT_MEM_EQ(f.slab + off, src, sizes[i]);
        free(src);
        off += (sizes[i] + 255) & ~(uint64_t)255;
    }
    /* nothing outside the written slots */
    ASSERT(all_zero(f.slab + off, SLAB - off));
    kvp__ec_push_rx_stats_t s;
    stats(&f, &s);
    ASSERT_EQ(s.writes, 5);
    ASSERT_EQ(s.conns_total, 1); /* one cached connection served all five */
    kvp__ec_push_tx_stats_t ts;
    kvp__ec_push_tx_stats(f.tx, &ts);
    ASSERT_EQ(ts.tcp_writes, 5);
    ASSERT_EQ(ts.failures, 0);
    fix_fini(&f);
}

TEST(test_ec_push_refused_range_no_byte_written)
{
    fix_t f;
    fix_init(&f, 0, 0);
    table_add(&f.t, 4096, 4096, RID);
    uint8_t *src = pattern(8192, 3);
    /* past the reservation's end, before its start, another reservation id */
    ASSERT_EQ(push(&f, RID, 4096, src, 4097), KVP_ERR_REMOTE);
    ASSERT_EQ(push(&f, RID, 4095, src, 100), KVP_ERR_REMOTE);
    ASSERT_EQ(push(&f, "ffffffffffffffffffffffffffffffff", 4096, src, 4096), KVP_ERR_REMOTE);
    ASSERT(all_zero(f.slab, SLAB));
    kvp__ec_push_rx_stats_t s;
    stats(&f, &s);
    ASSERT_EQ(s.out_of_bounds, 3);
    ASSERT_EQ(s.bytes, 0);
    /* the right one still lands */
    ASSERT_OK(push(&f, RID, 4096, src, 4096));
    ASSERT_MEM_EQ(f.slab + 4096, src, 4096);
    free(src);
    fix_fini(&f);
}

TEST(test_ec_push_out_of_bounds_rejected_by_receiver)
{
    /* A client that skips the producer's check: offsets past the slab, a
     * length that wraps -- answered INVALID_ARG before any byte moves, and
     * check() never sees a range outside the slab. */
    fix_t f;
    fix_init(&f, 0, 0);
    table_add(&f.t, 0, SLAB, RID);
    uint16_t port = kvp__ec_push_rx_port(f.rx);
    struct {
        uint64_t off, len;
    } bad[] = {{SLAB, 1}, {SLAB - 10, 11}, {UINT64_MAX - 5, 16}, {1, UINT64_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int fd = raw_connect(port);
        uint64_t dl = bad[i].len > (1u << 20) ? 0 : bad[i].len;
        if (bad[i].len > (1u << 20)) {
            /* a length the lane head itself refuses (over 16 GiB) */
            uint8_t hdr[KVP__EC_PUSH_WRITE_MAX], head[KVP_LANE_HEAD];
            size_t hl = kvp__ec_push_write_encode(hdr, bad[i].off, bad[i].len, RID);
            kvp__lane_head_encode(head, (uint32_t)hl, bad[i].len);
            raw_send(fd, head, sizeof head);
            raw_send(fd, hdr, hl);
            ASSERT_EQ(raw_status(fd), KVP_ERR_PROTOCOL);
        } else {
            raw_write_frame(fd, bad[i].off, bad[i].len, dl, RID);
            uint8_t junk[16] = {0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA, 0xAA};
            raw_send(fd, junk, dl < sizeof junk ? dl : sizeof junk);
            ASSERT_EQ(raw_status(fd), KVP_ERR_INVALID_ARG);
        }
        ASSERT(raw_closed(fd));
        close(fd);
    }
    ASSERT(all_zero(f.slab, SLAB));
    ASSERT_EQ(f.t.calls, 0);
    fix_fini(&f);
}

TEST(test_ec_push_producer_refuses_dst_outside_session)
{
    fix_t f;
    fix_init(&f, 0, 0);
    table_add(&f.t, 0, SLAB, RID);
    uint8_t *src = pattern(4096, 1);
    const char *s = kvp__ec_push_rx_session(f.rx);
    uint64_t base = (uint64_t)(uintptr_t)f.slab;
    ASSERT_EQ(kvp__ec_push_tx_write(f.tx, s, RID, base - 1, src, 16, NULL), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_push_tx_write(f.tx, s, RID, base + SLAB - 15, src, 16, NULL), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_push_tx_write(f.tx, s, RID, UINT64_MAX - 3, src, 16, NULL), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_push_tx_write(f.tx, "kvp-ec1;base=zz;size=10", RID, base, src, 16, NULL), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_push_tx_write(f.tx, "", RID, base, src, 16, NULL), KVP_ERR_INVALID_ARG);
    kvp__ec_push_rx_stats_t st;
    stats(&f, &st);
    ASSERT_EQ(st.conns_total, 0); /* refused before any connection */
    ASSERT(all_zero(f.slab, SLAB));
    ASSERT_OK(kvp__ec_push_tx_write(f.tx, s, RID, base + SLAB - 16, src, 16, NULL));
    ASSERT_MEM_EQ(f.slab + SLAB - 16, src, 16);
    free(src);
    fix_fini(&f);
}

TEST(test_ec_push_hostile_garbage_header_dropped_healthy_continues)
{
    fix_t f;
    fix_init(&f, 0, 0);
    table_add(&f.t, 0, 1u << 20, RID);
    uint16_t port = kvp__ec_push_rx_port(f.rx);
    uint8_t *src = pattern(1u << 20, 9);
    /* 1: bytes that are not a frame at all (head: header length 0xffffffff) */
    int g1 = raw_connect(port);
    uint8_t garbage[64];
    memset(garbage, 0xff, sizeof garbage);
    raw_send(g1, garbage, sizeof garbage);
    /* 2: a well-framed header with a bad magic */
    int g2 = raw_connect(port);
    uint8_t head[KVP_LANE_HEAD], hdr[KVP__EC_PUSH_WRITE_MAX];
    size_t hl = kvp__ec_push_write_encode(hdr, 0, 8, RID);
    hdr[0] = 'X';
    kvp__lane_head_encode(head, (uint32_t)hl, 8);
    raw_send(g2, head, sizeof head);
    raw_send(g2, hdr, hl);
    /* 3: another version */
    int g3 = raw_connect(port);
    hdr[0] = 'K';
    hdr[5] = 9;
    raw_send(g3, head, sizeof head);
    raw_send(g3, hdr, hl);
    /* meanwhile a healthy writer */
    ASSERT_OK(push(&f, RID, 0, src, 1u << 20));
    ASSERT_EQ(raw_status(g1), KVP_ERR_PROTOCOL);
    ASSERT_EQ(raw_status(g2), KVP_ERR_PROTOCOL);
    ASSERT_EQ(raw_status(g3), KVP_ERR_VERSION);
    ASSERT(raw_closed(g1) && raw_closed(g2) && raw_closed(g3));
    close(g1);
    close(g2);
    close(g3);
    ASSERT_MEM_EQ(f.slab, src, 1u << 20);
    ASSERT(all_zero(f.slab + (1u << 20), SLAB - (1u << 20)));
    kvp__ec_push_rx_stats_t s;
    stats(&f, &s);
    ASSERT_EQ(s.bad_headers, 3);
    ASSERT_OK(push(&f, RID, 0, src, 4096));
    free(src);
    fix_fini(&f);
}

TEST(test_ec_push_hostile_truncated_body_and_idle_dropped)
{
    fix_t f;
    fix_init(&f, 0, 300);
    table_add(&f.t, 0, 1u << 20, RID);
    uint16_t port = kvp__ec_push_rx_port(f.rx);
    /* truncated: a header for 64 KiB, 1000 bytes, then silence */
    int tr = raw_connect(port);
    raw_write_frame(tr, 0, 65536, 65536, RID);
    uint8_t *part = pattern(1000, 4);
    raw_send(tr, part, 1000);
    /* truncated and closed: EOF mid-data */
    int tc = raw_connect(port);
    raw_write_frame(tc, 65536, 65536, 65536, RID);
    raw_send(tc, part, 500);
    close(tc);
    /* idle: connects and sends nothing; half a header and nothing more */
    int id = raw_connect(port);
    int hh = raw_connect(port);
    raw_send(hh, "\0\0\0", 3);
    uint8_t *src = pattern(65536, 5);
    for (int i = 0; i < 5; i++) {
        ASSERT_OK(push(&f, RID, 131072, src, 65536));
        usleep(100000); /* the healthy writer's cached connection outlives idle_ms by writing */
    }
    ASSERT_MEM_EQ(f.slab + 131072, src, 65536);
    kvp__ec_push_rx_stats_t s;
    WAIT_STATS(&f, s, s.conns_idle_closed >= 3 && s.conns_open <= 1, 3000);
    ASSERT_GE(s.conns_idle_closed, 3); /* tr, id, hh */
    ASSERT(raw_closed(tr) && raw_closed(id) && raw_closed(hh));
    close(tr);
    close(id);
    close(hh);
    /* what the truncated writers sent landed inside their reservation only */
    ASSERT_MEM_EQ(f.slab, part, 1000);
    ASSERT(all_zero(f.slab + (1u << 20), SLAB - (1u << 20)));
    /* and the producer reconnects after its cached connection idled out */
    usleep(400000);
    ASSERT_OK(push(&f, RID, 131072, src, 65536));
    free(src);
    free(part);
    fix_fini(&f);
}

TEST(test_ec_push_max_conns_cap)
{
    fix_t f;
    fix_init(&f, 3, 0);
    table_add(&f.t, 0, SLAB, RID);
    uint16_t port = kvp__ec_push_rx_port(f.rx);
    int fds[3];
    for (int i = 0; i < 3; i++)
        fds[i] = raw_connect(port);
    kvp__ec_push_rx_stats_t s;
    WAIT_STATS(&f, s, s.conns_open == 3, 2000);
    ASSERT_EQ(s.conns_open, 3);
    int extra = raw_connect(port);
    ASSERT_EQ(raw_status(extra), KVP_ERR_BUSY);
    ASSERT(raw_closed(extra));
    close(extra);
    /* the producer, beyond the cap, fails (busy or the connection lost) */
    uint8_t *src = pattern(4096, 2);
    kvp_status_t st = push(&f, RID, 0, src, 4096);
    ASSERT(st == KVP_ERR_REMOTE || st == KVP_ERR_CONN_LOST);
    stats(&f, &s);
    ASSERT_GE(s.conns_refused, 2);
    ASSERT(all_zero(f.slab, SLAB));
    /* room again once one goes */
    close(fds[0]);
    WAIT_STATS(&f, s, s.conns_open == 2, 2000);
    ASSERT_OK(push(&f, RID, 0, src, 4096));
    ASSERT_MEM_EQ(f.slab, src, 4096);
    close(fds[1]);
    close(fds[2]);
    free(src);
    fix_fini(&f);
}

typedef struct {
    fix_t *f;
    int id;
    int fails;
} worker_t;

#define PER_THREAD (1u << 20)

static void *writer(void *arg)
{
    worker_t *w = arg;
    uint8_t *src = pattern(PER_THREAD, (unsigned)w->id + 100);
    for (int r = 0; r < 8; r++) {
        uint64_t off = (uint64_t)w->id * PER_THREAD + (uint64_t)(r % 2) * 0; /* same slot, rewritten */
        if (push(w->f, RID, off, src, PER_THREAD) != KVP_OK)
            w->fails++;
    }
    free(src);
    return NULL;
}

TEST(test_ec_push_concurrent_writers_4_threads)
{
    fix_t f;
    fix_init(&f, 0, 0);
    table_add(&f.t, 0, 4 * PER_THREAD, RID);
    pthread_t th[4];
    worker_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_t){&f, i, 0};
        pthread_create(&th[i], NULL, writer, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ASSERT_EQ(w[i].fails, 0);
        uint8_t *want = pattern(PER_THREAD, (unsigned)i + 100);
        ASSERT_MEM_EQ(f.slab + (size_t)i * PER_THREAD, want, PER_THREAD);
        free(want);
    }
    kvp__ec_push_rx_stats_t s;
    stats(&f, &s);
    ASSERT_EQ(s.writes, 32);
    ASSERT_EQ(s.bytes, 32ull * PER_THREAD);
    ASSERT_GE(s.conns_total, 2); /* concurrent writers used separate connections */
    ASSERT_LE(s.conns_total, 4);
    fix_fini(&f);
}

/* UCX RMA between two processes: the child runs the receiver over a slab it
 * lets UCX allocate, the parent writes.  Skipped (with the reason) only
 * when the receiver does not offer UCX here.  prepare: the session is
 * prepared twice before the write and once after it; only the first sets
 * it up (under the UCX lock), the others find it settled. */
static void ucx_case(bool emulated, bool prepare)
{
    int to_parent[2], to_child[2];
    ASSERT_EQ(pipe(to_parent), 0);
    ASSERT_EQ(pipe(to_child), 0);
    pid_t pid = fork();
    if (pid == 0) {
        table_t t = {.n = 0};
        pthread_mutex_init(&t.mu, NULL);
        /* emulated: a borrowed slab, UCX forced: the put is software
         * emulation that the receiver's thread must progress */
        kvp__ec_push_rx_params_t p = {
            .host = "127.0.0.1",
            .slab = emulated ? calloc(1, SLAB) : NULL,
            .slab_size = SLAB,
            .paths = KVP__EC_PATH_TCP | KVP__EC_PATH_UCX,
            .check = check,
            .check_ctx = &t,
            .ucx_force = emulated,
        };
        kvp__ec_push_rx_t *rx;
        if (kvp__ec_push_rx_create(&p, &rx) != KVP_OK)
            _exit(2);
        const char *s = kvp__ec_push_rx_session(rx);
        uint32_t n = (uint32_t)strlen(s);
        if (write(to_parent[1], &n, 4) != 4 || write(to_parent[1], s, n) != (ssize_t)n)
            _exit(3);
        char c;
        if (read(to_child[0], &c, 1) != 1)
            _exit(4);
        uint8_t *want = pattern(4u << 20, 77);
        int ok = memcmp(kvp__ec_push_rx_slab(rx) + 65536, want, 4u << 20) == 0 &&
                 all_zero(kvp__ec_push_rx_slab(rx), 65536) &&
                 all_zero(kvp__ec_push_rx_slab(rx) + 65536 + (4u << 20), SLAB - 65536 - (4u << 20));
        kvp__ec_push_rx_stats_t st;
        kvp__ec_push_rx_stats(rx, &st);
        ok = ok && st.writes == 0; /* nothing came over TCP */
        free(want);
        kvp__ec_push_rx_destroy(rx);
        _exit(ok ? 0 : 1);
    }
    uint32_t n;
    ASSERT_EQ(read(to_parent[0], &n, 4), 4);
    char *s = calloc(1, n + 1);
    ASSERT_EQ(read(to_parent[0], s, n), (ssize_t)n);
    kvp__ec_session_t *ss = calloc(1, sizeof *ss);
    ASSERT_OK(kvp__ec_session_decode(s, ss));
    if (!ss->ucx_addr_len) {
        printf("SKIP: the receiver offers no UCX path here (session %s)\n", s);
        ASSERT_EQ(write(to_child[1], "x", 1), 1);
        waitpid(pid, NULL, 0);
        free(s);
        free(ss);
        return;
    }
    kvp__ec_push_tx_params_t tp = {
        .paths = KVP__EC_PATH_TCP | KVP__EC_PATH_UCX, .timeout_ms = 5000, .ucx_force = emulated};
    kvp__ec_push_tx_t *tx;
    ASSERT_OK(kvp__ec_push_tx_create(&tp, &tx));
    uint8_t *src = pattern(4u << 20, 77);
    unsigned path = 0;
    kvp__ec_push_tx_stats_t ts;
    if (prepare) {
        kvp__ec_push_tx_prepare(tx, s);
        kvp__ec_push_tx_stats(tx, &ts);
        ASSERT_EQ(ts.prepares, 1);
        ASSERT_EQ(ts.prepares_settled, 0);
        kvp__ec_push_tx_prepare(tx, s);
        kvp__ec_push_tx_stats(tx, &ts);
        ASSERT_EQ(ts.prepares, 2);
        ASSERT_EQ(ts.prepares_settled, 1);
    }
    ASSERT_OK(kvp__ec_push_tx_write(tx, s, RID, ss->base + 65536, src, 4u << 20, &path));
    ASSERT_EQ(path, KVP__EC_PATH_UCX);
    if (prepare) {
        kvp__ec_push_tx_prepare(tx, s);
        kvp__ec_push_tx_stats(tx, &ts);
        ASSERT_EQ(ts.prepares, 3);
        ASSERT_EQ(ts.prepares_settled, 2);
    }
    /* outside the slab: refused by the producer, nothing written */
    ASSERT_EQ(kvp__ec_push_tx_write(tx, s, RID, ss->base + SLAB - 100, src, 4096, &path), KVP_ERR_INVALID_ARG);
    kvp__ec_push_tx_stats(tx, &ts);
    ASSERT_EQ(ts.ucx_writes, 1);
    ASSERT_EQ(write(to_child[1], "x", 1), 1);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
    kvp__ec_push_tx_destroy(tx);
    free(src);
    free(s);
    free(ss);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_push_ucx_rma_write_lands_byte_exact) { ucx_case(false, false); }

/* A prepared session is set up once; later prepares (and those after a
 * write) take no UCX lock, so a control thread never waits behind a write
 * in progress; the write after the prepares still lands by UCX. */
TEST(test_ec_push_prepare_sets_up_once_then_takes_no_lock) { ucx_case(false, true); }

/* The receiver offers no UCX for a borrowed slab (the put would be
 * emulated); forced, the emulated put completes because the receiver's
 * thread progresses its worker. */
TEST(test_ec_push_ucx_emulated_put_progressed_by_receiver) { ucx_case(true, false); }

TEST(test_ec_push_borrowed_slab_offers_tcp_only)
{
    fix_t f;
    memset(&f, 0, sizeof f);
    f.slab = calloc(1, SLAB);
    kvp__ec_push_rx_params_t p = {
        .host = "127.0.0.1", .slab = f.slab, .slab_size = SLAB,
        .paths = KVP__EC_PATH_TCP | KVP__EC_PATH_UCX, .check = check, .check_ctx = &f.t};
    ASSERT_OK(kvp__ec_push_rx_create(&p, &f.rx));
    kvp__ec_session_t *s = calloc(1, sizeof *s);
    ASSERT_OK(kvp__ec_session_decode(kvp__ec_push_rx_session(f.rx), s));
    ASSERT_EQ(s->ucx_addr_len, 0);
    ASSERT(s->port != 0);
    ASSERT_EQ(s->base, (uint64_t)(uintptr_t)f.slab);
    free(s);
    kvp__ec_push_rx_destroy(f.rx);
    free(f.slab);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* A data port bound to every interface advertises the address producers
 * reach (advertise_host), not 0.0.0.0, and a write through it lands. */
TEST(test_ec_push_any_interface_advertises_given_host)
{
    fix_t f;
    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.t.mu, NULL);
    f.slab = calloc(1, SLAB);
    kvp__ec_push_rx_params_t p = {.host = "0.0.0.0", .advertise_host = "127.0.0.1", .slab = f.slab,
                                  .slab_size = SLAB, .paths = KVP__EC_PATH_TCP, .check = check, .check_ctx = &f.t};
    ASSERT_OK(kvp__ec_push_rx_create(&p, &f.rx));
    kvp__ec_session_t *s = calloc(1, sizeof *s);
    ASSERT_OK(kvp__ec_session_decode(kvp__ec_push_rx_session(f.rx), s));
    ASSERT_STR_EQ(s->host, "127.0.0.1");
    ASSERT(s->port != 0);
    free(s);
    kvp__ec_push_tx_params_t tp = {.paths = KVP__EC_PATH_TCP, .timeout_ms = 5000};
    ASSERT_OK(kvp__ec_push_tx_create(&tp, &f.tx));
    table_add(&f.t, 4096, 4096, RID);
    uint8_t *src = pattern(4096, 3);
    ASSERT_OK(kvp__ec_push_tx_write(f.tx, kvp__ec_push_rx_session(f.rx), RID, (uint64_t)(uintptr_t)f.slab + 4096,
                                    src, 4096, NULL));
    ASSERT_MEM_EQ(f.slab + 4096, src, 4096);
    free(src);
    fix_fini(&f);
}

TEST(test_ec_push_producer_times_out_on_silent_receiver)
{
    /* a listener that accepts (the kernel does) but never reads or answers */
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    ASSERT_EQ(bind(ls, (struct sockaddr *)&sa, sizeof sa), 0);
    ASSERT_EQ(listen(ls, 4), 0);
    ASSERT_EQ(getsockname(ls, (struct sockaddr *)&sa, &sl), 0);
    char session[128];
    snprintf(session, sizeof session, "kvp-ec1;tcp=127.0.0.1:%u;base=10000;size=10000000", ntohs(sa.sin_port));
    kvp__ec_push_tx_params_t tp = {.paths = KVP__EC_PATH_TCP, .timeout_ms = 300};
    kvp__ec_push_tx_t *tx;
    ASSERT_OK(kvp__ec_push_tx_create(&tp, &tx));
    uint8_t *src = pattern(8u << 20, 1);
    uint64_t t0 = kvp__now_ns();
    ASSERT_EQ(kvp__ec_push_tx_write(tx, session, RID, 0x10000, src, 8u << 20, NULL), KVP_ERR_TIMEOUT); /* socket full */
    ASSERT_EQ(kvp__ec_push_tx_write(tx, session, RID, 0x10000, src, 16, NULL), KVP_ERR_TIMEOUT); /* no status */
    uint64_t ms = (kvp__now_ns() - t0) / 1000000;
    ASSERT_GE(ms, 580);
    ASSERT_LT(ms, 2000);
    kvp__ec_push_tx_stats_t ts;
    kvp__ec_push_tx_stats(tx, &ts);
    ASSERT_EQ(ts.failures, 2);
    kvp__ec_push_tx_destroy(tx);
    close(ls);
    free(src);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_push_session_codec)
{
    kvp__ec_session_t *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    snprintf(a->host, sizeof a->host, "127.0.0.1");
    a->port = 4242;
    a->base = 0x7f0012340000ull;
    a->size = 1ull << 30;
    a->ucx_addr_len = 3;
    memcpy(a->ucx_addr, "\x01\xab\xff", 3);
    a->rkey_len = 2;
    memcpy(a->rkey, "\x00\x10", 2);
    char buf[512];
    size_t n = kvp__ec_session_encode(a, buf, sizeof buf);
    ASSERT(n > 0);
    ASSERT_STR_EQ(buf, "kvp-ec1;tcp=127.0.0.1:4242;base=7f0012340000;size=40000000;ucx=01abff;rkey=0010");
    ASSERT_OK(kvp__ec_session_decode(buf, b));
    ASSERT_STR_EQ(b->host, "127.0.0.1");
    ASSERT_EQ(b->port, 4242);
    ASSERT_EQ(b->base, a->base);
    ASSERT_EQ(b->size, a->size);
    ASSERT_EQ(b->ucx_addr_len, 3);
    ASSERT_MEM_EQ(b->ucx_addr, a->ucx_addr, 3);
    ASSERT_EQ(b->rkey_len, 2);
    ASSERT_OK(kvp__ec_session_decode("kvp-ec1;tcp=h:1;base=0;size=1", b));
    const char *bad[] = {
        "", "kvp-ec2;tcp=h:1;base=0;size=1", "kvp-ec1", "kvp-ec1;base=0;size=1", /* no path */
        "kvp-ec1;tcp=h:1;base=0;size=0",                                          /* size 0 */
        "kvp-ec1;tcp=h:1;base=ffffffffffffffff;size=2",                           /* wraps */
        "kvp-ec1;tcp=h:0;base=0;size=1", "kvp-ec1;tcp=h:65536;base=0;size=1", "kvp-ec1;tcp=h:01;base=0;size=1",
        "kvp-ec1;tcp=:1;base=0;size=1", "kvp-ec1;tcp=h h:1;base=0;size=1", "kvp-ec1;base=0;tcp=h:1;size=1",
        "kvp-ec1;tcp=h:1;tcp=h:1;base=0;size=1", "kvp-ec1;tcp=h:1;base=0;size=1;x=1",
        "kvp-ec1;tcp=h:1;base=0;size=1;ucx=00", /* ucx without rkey */
        "kvp-ec1;tcp=h:1;base=0;size=1;ucx=0;rkey=00", "kvp-ec1;tcp=h:1;base=0;size=1;ucx=zz;rkey=00",
        "kvp-ec1;tcp=h:1;base=00000000000000000;size=1", "kvp-ec1;tcp=h:1;base=0;size=1;", "kvp-ec1x;tcp=h:1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_MSG(kvp__ec_session_decode(bad[i], b) == KVP_ERR_DECODE, "accepted '%s'", bad[i]);
    uint64_t off;
    a->base = 1000;
    a->size = 100;
    ASSERT_OK(kvp__ec_session_range(a, 1000, 100, &off));
    ASSERT_EQ(off, 0);
    ASSERT_OK(kvp__ec_session_range(a, 1099, 1, &off));
    ASSERT_EQ(off, 99);
    ASSERT_EQ(kvp__ec_session_range(a, 999, 1, &off), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_session_range(a, 1001, 100, &off), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_session_range(a, 1000, UINT64_MAX, &off), KVP_ERR_INVALID_ARG);
    free(a);
    free(b);
}

TEST(test_ec_push_frame_codec)
{
    uint8_t h[KVP__EC_PUSH_WRITE_MAX];
    size_t n = kvp__ec_push_write_encode(h, 77, 1234, RID);
    ASSERT_EQ(n, KVP__EC_PUSH_WRITE_FIXED + 32);
    kvp__ec_push_write_hdr_t w;
    ASSERT_OK(kvp__ec_push_write_decode(h, n, 1234, &w));
    ASSERT_EQ(w.offset, 77);
    ASSERT_EQ(w.length, 1234);
    ASSERT_STR_EQ(w.rid, RID);
    ASSERT_EQ(kvp__ec_push_write_decode(h, n, 1235, &w), KVP_ERR_PROTOCOL); /* length != data_len */
    ASSERT_EQ(kvp__ec_push_write_decode(h, n - 1, 1234, &w), KVP_ERR_PROTOCOL);
    ASSERT_EQ(kvp__ec_push_write_decode(h, 7, 1234, &w), KVP_ERR_PROTOCOL);
    h[7] = 200;
    ASSERT_EQ(kvp__ec_push_write_decode(h, n, 1234, &w), KVP_ERR_PROTOCOL);
    ASSERT_EQ(kvp__ec_push_write_encode(h, 0, 0, "has space"), 0);
    ASSERT_EQ(kvp__ec_push_write_encode(h, 0, 0, ""), KVP__EC_PUSH_WRITE_FIXED);
    uint8_t s[KVP__EC_PUSH_STATUS_LEN];
    kvp__ec_push_status_encode(s, KVP_ERR_BUSY, 9);
    kvp_status_t st;
    uint64_t landed;
    ASSERT_OK(kvp__ec_push_status_decode(s, sizeof s, 0, &st, &landed));
    ASSERT_EQ(st, KVP_ERR_BUSY);
    ASSERT_EQ(landed, 9);
    ASSERT_EQ(kvp__ec_push_status_decode(s, sizeof s, 1, &st, &landed), KVP_ERR_PROTOCOL);
    kvp__ec_push_status_encode(s, KVP_ERR_INTERNAL, 0);
    ASSERT_EQ(kvp__ec_push_status_decode(s, sizeof s, 0, &st, &landed), KVP_ERR_PROTOCOL);
    ASSERT_EQ(kvp__ec_push_status_decode(h, sizeof s, 0, &st, &landed), KVP_ERR_PROTOCOL); /* a write header */
}

TEST_LIST(T(test_ec_push_tcp_write_lands_byte_exact), T(test_ec_push_refused_range_no_byte_written),
          T(test_ec_push_out_of_bounds_rejected_by_receiver), T(test_ec_push_producer_refuses_dst_outside_session),
          T(test_ec_push_hostile_garbage_header_dropped_healthy_continues),
          T(test_ec_push_hostile_truncated_body_and_idle_dropped), T(test_ec_push_max_conns_cap),
          T(test_ec_push_concurrent_writers_4_threads), T(test_ec_push_ucx_rma_write_lands_byte_exact), T(test_ec_push_prepare_sets_up_once_then_takes_no_lock),
          T(test_ec_push_ucx_emulated_put_progressed_by_receiver), T(test_ec_push_borrowed_slab_offers_tcp_only), T(test_ec_push_any_interface_advertises_given_host),
          T(test_ec_push_producer_times_out_on_silent_receiver),
          T(test_ec_push_session_codec), T(test_ec_push_frame_codec))
