/*
 * Local reads (docs/transport.md §9, docs/protocol.md §2): a client on the
 * server's host maps the arena and copies get values out of it.  Checked
 * here with real server processes: the values match byte for byte in every
 * shape of get; the leases keep the bytes from being reused until RELEASE
 * or until the connection's socket closes (also when the server drops the
 * connection while its client may still be reading); a client that never
 * releases is refused; the feature switches off on either side.  And the
 * copy and the arena mapping on their own.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "client/local_read.h"
#include "common/mp.h"
#include "server_harness.h"

/* ---- the copy and the mapping, without a server ---- */

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)((i * 131u + seed * 7u) >> 3);
}

/* Copies nseg segments of the given lengths from odd offsets of src into
 * odd offsets of dst, and checks every byte (and that nothing around them
 * was written). */
static void copy_check(const size_t *lens, uint32_t nseg, uint32_t seed)
{
    size_t total = 0;
    for (uint32_t i = 0; i < nseg; i++)
        total += lens[i] + 64;
    uint8_t *src = malloc(total), *dst = malloc(total);
    fill(src, total, seed);
    memset(dst, 0xEE, total);
    kvp__cpseg_t segs[16];
    size_t off = 0;
    for (uint32_t i = 0; i < nseg; i++) {
        size_t so = off + (seed + i) % 61, d = off + (seed * 3 + i) % 59;
        segs[i] = (kvp__cpseg_t){dst + d, src + so, lens[i]};
        off += lens[i] + 64;
    }
    kvp__lread_copy(segs, nseg);
    off = 0;
    for (uint32_t i = 0; i < nseg; i++) {
        size_t so = off + (seed + i) % 61, d = off + (seed * 3 + i) % 59;
        ASSERT_MSG(memcmp(dst + d, src + so, lens[i]) == 0, "segment %u of %zu bytes differs", i, lens[i]);
        for (size_t b = off; b < d; b++)
            ASSERT_EQ(dst[b], 0xEE);
        for (size_t b = d + lens[i]; b < off + lens[i] + 64; b++)
            ASSERT_EQ(dst[b], 0xEE);
        off += lens[i] + 64;
    }
    free(src);
    free(dst);
}

static void copy_checks(void)
{
    const size_t one_small[] = {100};
    const size_t one_large[] = {(1u << 20) + 13};
    const size_t many[] = {3, 70000, 1, 300001, 0, 4095, 513 * 1024, 17};
    const size_t at_min[] = {KVP_STREAM_MIN - 1, 1};
    copy_check(one_small, 1, 1);
    copy_check(one_large, 1, 2);
    copy_check(many, 8, 3);
    copy_check(at_min, 2, 4);
    for (uint32_t s = 5; s < 25; s++) { /* odd lengths and alignments around the streaming size */
        size_t l[3] = {KVP_STREAM_MIN / 3 + s * 101, KVP_STREAM_MIN / 3 + s * 7, s * 977};
        copy_check(l, 3, s);
    }
}

TEST(test_local_read_copy_every_byte_in_place)
{
    for (int wide = 1; wide >= 0; wide--) { /* AVX2 where the CPU has it, then SSE2 */
        kvp__lread_test_wide(wide);
        copy_checks();
    }
    kvp__lread_test_wide(1);
}

static void *copy_thread(void *arg)
{
    uint32_t seed = (uint32_t)(uintptr_t)arg;
    for (uint32_t i = 0; i < 30; i++) {
        size_t l[2] = {(600u << 10) + i * 33 + seed, (200u << 10) + seed};
        copy_check(l, 2, seed * 100 + i);
    }
    return NULL;
}

TEST(test_local_read_copy_concurrent_callers)
{
    /* Streaming copies from several threads at once: each is whole. */
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        ASSERT_EQ(pthread_create(&t[i], NULL, copy_thread, (void *)(i + 1)), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
}

typedef struct {
    const kvp__arena_info_t *ai;
    kvp__lmap_t *m;
} map_arg_t;

static void *map_thread(void *arg)
{
    map_arg_t *a = arg;
    ASSERT_OK(kvp__lmap_get(a->ai, &a->m));
    return NULL;
}

TEST(test_local_read_map_checks_the_file)
{
    size_t size = 4u << 20;
    int fd = memfd_create("test-arena", MFD_CLOEXEC);
    ASSERT(fd >= 0);
    ASSERT_EQ(ftruncate(fd, (off_t)size), 0);
    uint8_t *w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT(w != MAP_FAILED);
    fill(w, size, 9);
    struct stat st, tst;
    ASSERT_EQ(fstat(fd, &st), 0);
    /* the lease table beside it: 16 slots */
    int tfd = memfd_create("test-table", MFD_CLOEXEC);
    ASSERT(tfd >= 0);
    ASSERT_EQ(ftruncate(tfd, 4096), 0);
    uint8_t *tw = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
    ASSERT(tw != MAP_FAILED);
    uint64_t nslots = 16;
    memcpy(tw + KVP_WIRE_LR_NSLOTS_OFF, &nslots, sizeof nslots);
    ASSERT_EQ(fstat(tfd, &tst), 0);
    kvp__arena_info_t ai = {(uint64_t)getpid(), (uint64_t)fd, size, (uint64_t)st.st_dev, (uint64_t)st.st_ino, 1,
                            (uint64_t)tfd, 4096, (uint64_t)tst.st_dev, (uint64_t)tst.st_ino};
    kvp__lmap_t *m = NULL, *m2 = NULL, *bad = NULL;
    ASSERT_OK(kvp__lmap_get(&ai, &m));
    ASSERT_EQ(kvp__lmap_size(m), size);
    ASSERT(kvp__lmap_is(m, &ai));
    ASSERT(memcmp(kvp__lmap_base(m), w, size) == 0);
    w[12345] ^= 0xFF; /* the same memory, not a copy */
    ASSERT_EQ(kvp__lmap_base(m)[12345], w[12345]);
    /* the table's generations, as the server bumps them */
    ASSERT(kvp__lmap_slot_ok(m, 15));
    ASSERT(!kvp__lmap_slot_ok(m, 16));
    ASSERT(kvp__lmap_still_leased(m, 3, 0));
    ((uint64_t *)(void *)(tw + KVP_WIRE_LR_GEN_OFF))[3] = 1;
    ASSERT(!kvp__lmap_still_leased(m, 3, 0));
    ASSERT(kvp__lmap_still_leased(m, 3, 1));
    ASSERT(!kvp__lmap_still_leased(m, 16, 0));
    ASSERT_OK(kvp__lmap_get(&ai, &m2)); /* one mapping per arena per process */
    ASSERT(m2 == m);
    kvp__lmap_put(m2);
    kvp__lmap_put(m);
    /* ... also when handles connect at once (the first maps, the others
     * wait for it) */
    map_arg_t args[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (map_arg_t){&ai, NULL};
        ASSERT_EQ(pthread_create(&t[i], NULL, map_thread, &args[i]), 0);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    for (int i = 1; i < 8; i++)
        ASSERT(args[i].m == args[0].m);
    for (int i = 1; i < 8; i++)
        kvp__lmap_put(args[i].m);
    m = m2 = args[0].m;
    kvp__lmap_ref(m2);
    kvp__arena_info_t wrong = ai;
    wrong.ino++;
    ASSERT_EQ(kvp__lmap_get(&wrong, &bad), KVP_ERR_UNSUPPORTED);
    ASSERT(bad == NULL);
    wrong = ai;
    wrong.size = size * 2; /* larger than the file */
    ASSERT_EQ(kvp__lmap_get(&wrong, &bad), KVP_ERR_UNSUPPORTED);
    wrong = ai;
    wrong.fd = 100000; /* no such descriptor */
    ASSERT_EQ(kvp__lmap_get(&wrong, &bad), KVP_ERR_UNSUPPORTED);
    wrong = ai;
    wrong.tino++; /* not the table */
    ASSERT_EQ(kvp__lmap_get(&wrong, &bad), KVP_ERR_UNSUPPORTED);
    nslots = 1000; /* more slots than the file holds */
    memcpy(tw + KVP_WIRE_LR_NSLOTS_OFF, &nslots, sizeof nslots);
    wrong = ai;
    wrong.fd = (uint64_t)tfd; /* (another arena: a fresh mapping, whose table is checked) */
    wrong.size = 4096;
    wrong.dev = (uint64_t)tst.st_dev;
    wrong.ino = (uint64_t)tst.st_ino;
    ASSERT_EQ(kvp__lmap_get(&wrong, &bad), KVP_ERR_UNSUPPORTED);
    kvp__lmap_put(m2);
    kvp__lmap_put(m);
    munmap(w, size);
    munmap(tw, 4096);
    close(fd);
    close(tfd);
}

/* ---- through the server ---- */

static void pattern(uint8_t *v, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        v[i] = (uint8_t)(seed + i * 7);
}

TEST(test_server_local_reads_values_match)
{
    server_t s = {0};
    server_start_metrics(&s, "64MiB");
    kvp_pool_t *p = open_ok(s.uri);
    char off_uri[200];
    snprintf(off_uri, sizeof off_uri, "%s&local_reads=off", s.uri);
    kvp_pool_t *q = open_ok(off_uri);
    const size_t sizes[] = {65536, 1u << 20, (3u << 20) + 17, 300001, 70000, 100};
    enum { N = sizeof sizes / sizeof sizes[0] };
    kvp_key_t keys[N + 1];
    char names[N + 1][16];
    uint8_t *vals[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "lr-%d", i);
        keys[i] = kvp_key_str(names[i]);
        vals[i] = malloc(sizes[i]);
        pattern(vals[i], sizes[i], (uint8_t)i);
        kvp_iov_t iov = {vals[i], sizes[i]};
        kvp_sgl_t sgl = {&iov, 1};
        kvp_key_result_t r;
        ASSERT_OK(kvp_pool_put(p, &keys[i], &sgl, 1, &r));
        ASSERT_OK(r.status);
    }
    snprintf(names[N], sizeof names[N], "lr-missing");
    keys[N] = kvp_key_str(names[N]);
    double before = metric_now(&s, "kvpool_requests_total{op=\"get_local\"}");

    /* one key at a time, into a buffer at an odd address, over both handles */
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < N; i++) {
            uint8_t *buf = malloc(sizes[i] + 8);
            memset(buf, 0, sizes[i] + 8);
            kvp_iov_t iov = {buf + 3, sizes[i]};
            kvp_sgl_t sgl = {&iov, 1};
            kvp_key_result_t r;
            ASSERT_OK(kvp_pool_get(h ? q : p, &keys[i], &sgl, 1, &r));
            ASSERT_OK(r.status);
            ASSERT_EQ(r.size, sizes[i]);
            ASSERT_MSG(memcmp(buf + 3, vals[i], sizes[i]) == 0, "%s differs (handle %d)", names[i], h);
            ASSERT_EQ(buf[sizes[i] + 3], 0);
            free(buf);
        }
    /* 5 of the 6 single gets had 16 KiB of room or more, on p only */
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get_local\"}"), before + 5);

    /* a batch: values scattered over three pieces each, a missing key, a
     * buffer too small, a capacity far above the value */
    kvp_iov_t iovs[N + 1][3];
    kvp_sgl_t sgls[N + 1];
    uint8_t *bufs[N + 1];
    for (int i = 0; i <= N; i++) {
        size_t cap = i < N ? sizes[i] : 1000;
        if (i == 1)
            cap = sizes[i] - 1; /* too small */
        if (i == 5)
            cap = 1u << 20;     /* 100 bytes into 1 MiB of room */
        bufs[i] = calloc(1, cap + 64);
        size_t a = cap / 3, b = cap / 3 + 1;
        iovs[i][0] = (kvp_iov_t){bufs[i], a};
        iovs[i][1] = (kvp_iov_t){bufs[i] + a + 5, b}; /* a gap of 5 bytes */
        iovs[i][2] = (kvp_iov_t){bufs[i] + a + b + 11, cap - a - b};
        sgls[i] = (kvp_sgl_t){iovs[i], 3};
    }
    kvp_key_result_t res[N + 1];
    ASSERT_OK(kvp_pool_get(p, keys, sgls, N + 1, res));
    for (int i = 0; i <= N; i++) {
        if (i == N) {
            ASSERT_EQ(res[i].status, KVP_ERR_NOT_FOUND);
            continue;
        }
        if (i == 1) {
            ASSERT_EQ(res[i].status, KVP_ERR_BUFFER_TOO_SMALL);
            continue;
        }
        ASSERT_OK(res[i].status);
        ASSERT_EQ(res[i].size, sizes[i]);
        size_t left = sizes[i], pos = 0;
        for (int k = 0; k < 3 && left; k++) {
            size_t len = iovs[i][k].len < left ? iovs[i][k].len : left;
            ASSERT_MSG(memcmp(iovs[i][k].base, vals[i] + pos, len) == 0, "%s piece %d differs", names[i], k);
            pos += len;
            left -= len;
        }
        ASSERT_EQ(bufs[i][iovs[i][0].len], 0); /* the gaps untouched */
    }
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get_local\"}"), before + 6);
    /* every lease given back */
    ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);
    ASSERT_EQ(metric_now(&s, "kvpool_bad_requests_total"), 0);
    for (int i = 0; i <= N; i++)
        free(bufs[i]);
    for (int i = 0; i < N; i++)
        free(vals[i]);
    kvp_pool_close(p);
    kvp_pool_close(q);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* ---- raw frames on the TCP transport: a client that holds leases ---- */

typedef struct {
    uint8_t *hdr;
    kvp__wire_reply_t rep;
} raw_reply_t;

/* Reads the next reply frame (within 5 s); 0 if the server closed. */
static int raw_reply(int fd, raw_reply_t *out)
{
    uint64_t dl;
    if (!lane_raw_reply(fd, &out->hdr, &out->rep, &dl))
        return 0;
    ASSERT_EQ(dl, 0); /* no values in any reply here */
    return 1;
}

static void raw_request(int fd, uint32_t op, uint64_t req_id, uint64_t key, const char *name, uint64_t cap)
{
    uint8_t buf[256];
    kvp__mpw_t w;
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp_key_t k = kvp_key_str(name ? name : "x");
    kvp__wire_req_encode(&w, op, req_id, 1000, key, name ? &k : NULL, name ? 1 : 0, name ? &cap : NULL);
    ASSERT(!w.err);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, 0, NULL, 0);
    kvp__mpw_free(&w);
}

/* HELLO: the arena the server offers (0 if none). */
static int raw_hello(int fd, uint64_t key, kvp__arena_info_t *ai)
{
    raw_request(fd, KVP_WOP_HELLO, 1, key, NULL, 0);
    raw_reply_t r;
    ASSERT_EQ(raw_reply(fd, &r), 1);
    ASSERT_EQ(r.rep.op, KVP_WOP_HELLO);
    ASSERT_OK(r.rep.status);
    /* fields: protocol, max_batch, max_value, arena */
    (void)kvp__mpr_uint(&r.rep.body);
    (void)kvp__mpr_uint(&r.rep.body);
    (void)kvp__mpr_uint(&r.rep.body);
    int has = !kvp__mpr_nil(&r.rep.body);
    if (has) {
        ASSERT_EQ(kvp__mpr_array(&r.rep.body, 16), 10);
        ai->pid = kvp__mpr_uint(&r.rep.body);
        ai->fd = kvp__mpr_uint(&r.rep.body);
        ai->size = kvp__mpr_uint(&r.rep.body);
        ai->dev = kvp__mpr_uint(&r.rep.body);
        ai->ino = kvp__mpr_uint(&r.rep.body);
        ai->populated = kvp__mpr_uint(&r.rep.body) != 0;
        ai->tfd = kvp__mpr_uint(&r.rep.body);
        ai->tsize = kvp__mpr_uint(&r.rep.body);
        ai->tdev = kvp__mpr_uint(&r.rep.body);
        ai->tino = kvp__mpr_uint(&r.rep.body);
    }
    ASSERT(kvp__mpr_ok(&r.rep.body));
    free(r.hdr);
    return has;
}

/* LOCAL_PROOF with this proof: the server's answer. */
static kvp_status_t raw_proof(int fd, uint64_t key, const uint8_t *proof, uint32_t len)
{
    uint8_t buf[128];
    kvp__mpw_t w;
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp_key_t k = {proof, len};
    kvp__wire_req_encode(&w, KVP_WOP_LOCAL_PROOF, 2, 1000, key, &k, 1, NULL);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, 0, NULL, 0);
    raw_reply_t r;
    ASSERT_EQ(raw_reply(fd, &r), 1);
    ASSERT_EQ(r.rep.op, KVP_WOP_LOCAL_PROOF);
    free(r.hdr);
    return r.rep.status;
}

/* Maps what HELLO named and proves it to the server. */
static void raw_prove(int fd, uint64_t key, const kvp__arena_info_t *ai)
{
    kvp__lmap_t *m = NULL;
    ASSERT_OK(kvp__lmap_get(ai, &m));
    uint8_t proof[KVP_WIRE_LR_PROOF];
    kvp__wire_lr_proof(kvp__lmap_nonce(m), key, proof);
    ASSERT_OK(raw_proof(fd, key, proof, sizeof proof));
    kvp__lmap_put(m);
}

/* GET_LOCAL of one key: its status, and its size and offset if found
 * (*slot_p, *gen_p: where its lease's generation is, if not NULL). */
static kvp_status_t raw_get_local_gen(int fd, uint64_t key, uint64_t req_id, const char *name, uint64_t cap,
                                      uint64_t *size_p, uint64_t *off_p, uint64_t *slot_p, uint64_t *gen_p)
{
    raw_request(fd, KVP_WOP_GET_LOCAL, req_id, key, name, cap);
    raw_reply_t r;
    ASSERT_EQ(raw_reply(fd, &r), 1);
    ASSERT_EQ(r.rep.op, KVP_WOP_GET_LOCAL);
    ASSERT_EQ(r.rep.req_id, req_id);
    kvp_status_t st = r.rep.status;
    if (st == KVP_OK) {
        ASSERT_EQ(kvp__mpr_array(&r.rep.body, 8), 1);
        ASSERT_EQ(kvp__mpr_array(&r.rep.body, 8), 3);
        st = (kvp_status_t)kvp__mpr_int(&r.rep.body);
        *size_p = kvp__mpr_uint(&r.rep.body);
        *off_p = kvp__mpr_uint(&r.rep.body);
        uint64_t slot = kvp__mpr_uint(&r.rep.body), gen = kvp__mpr_uint(&r.rep.body);
        ASSERT(kvp__mpr_done(&r.rep.body));
        if (slot_p)
            *slot_p = slot;
        if (gen_p)
            *gen_p = gen;
    }
    free(r.hdr);
    return st;
}

static kvp_status_t raw_get_local(int fd, uint64_t key, uint64_t req_id, const char *name, uint64_t cap,
                                  uint64_t *size_p, uint64_t *off_p)
{
    return raw_get_local_gen(fd, key, req_id, name, cap, size_p, off_p, NULL, NULL);
}

/* GET_LOCALs first..last of key "k" (cap bytes of room), all found and
 * left unreleased. */
static void hold_local_reads(int fd, uint64_t key, uint64_t first, uint64_t last, uint64_t cap)
{
    uint64_t size, off;
    for (uint64_t id = first; id <= last; id++)
        ASSERT_OK(raw_get_local(fd, key, id, "k", cap, &size, &off));
}

static void put_value(kvp_pool_t *p, const char *name, size_t size, uint8_t seed)
{
    uint8_t *v = malloc(size);
    pattern(v, size, seed);
    kvp_key_t k = kvp_key_str(name);
    kvp_iov_t iov = {v, size};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    ASSERT_OK(kvp_pool_put(p, &k, &sgl, 1, &r));
    ASSERT_OK(r.status);
    free(v);
}

/* A server with metrics, a client on the TCP transport that stored one
 * value (pattern 42), and a raw connection past its HELLO (returned; *key_p
 * its key, *ai_p the arena HELLO named). */
static int raw_start(server_t *s, kvp_pool_t **p_p, const char *name, size_t size, uint64_t *key_p,
                     kvp__arena_info_t *ai_p)
{
    server_start_metrics(s, "8MiB");
    *p_p = open_ok(lane_uri(s)); /* (its own gets stay off the arena) */
    put_value(*p_p, name, size, 42);
    int fd = lane_raw_connect(s->port, key_p);
    ASSERT_EQ(raw_hello(fd, *key_p, ai_p), 1);
    ASSERT_EQ(ai_p->pid, (uint64_t)s->pid);
    raw_prove(fd, *key_p, ai_p);
    return fd;
}

static int matches(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (uint8_t)(seed + i * 7))
            return 0;
    return 1;
}

TEST(test_server_local_reads_lease_keeps_bytes_until_release)
{
    server_t s = {0};
    kvp_pool_t *p;
    uint64_t key;
    const size_t sz = 1u << 20;
    kvp__arena_info_t ai;
    int fd = raw_start(&s, &p, "held", sz, &key, &ai);
    kvp__lmap_t *m = NULL;
    ASSERT_OK(kvp__lmap_get(&ai, &m));
    uint64_t size = 0, off = 0;
    ASSERT_OK(raw_get_local(fd, key, 7, "held", sz, &size, &off));
    ASSERT_EQ(size, sz);
    ASSERT(off + size <= kvp__lmap_size(m));
    const uint8_t *v = kvp__lmap_base(m) + off;
    ASSERT(matches(v, sz, 42));
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 1);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leased_bytes"), (double)sz);

    /* Removed, then 16 MiB more into the 8 MiB arena: its space is not
     * reused while the lease lasts. */
    kvp_key_t hk = kvp_key_str("held");
    kvp_key_result_t rr;
    ASSERT_OK(kvp_pool_remove(p, &hk, 1, &rr));
    ASSERT_OK(rr.status);
    for (int i = 0; i < 16; i++) {
        char name[16];
        snprintf(name, sizeof name, "fill-%d", i);
        put_value(p, name, sz, (uint8_t)(100 + i));
    }
    kvp_pool_stats_t st;
    ASSERT_OK(kvp_pool_stats(p, &st));
    ASSERT(st.evicted > 0);
    ASSERT_MSG(matches(v, sz, 42), "a leased value was overwritten");

    /* RELEASE is never answered: the next frame is the next HELLO's reply;
     * an unknown id is counted as a bad request, the connection lives on. */
    raw_request(fd, KVP_WOP_RELEASE, 7, key, NULL, 0);
    raw_request(fd, KVP_WOP_RELEASE, 999, key, NULL, 0);
    ASSERT_EQ(raw_hello(fd, key, &ai), 1);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 0);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leased_bytes"), 0);
    ASSERT_EQ(metric_now(&s, "kvpool_bad_requests_total"), 1); /* the unknown id */

    /* ... and once released, the space is used again. */
    for (int i = 16; i < 40 && matches(v, sz, 42); i++) {
        char name[16];
        snprintf(name, sizeof name, "fill-%d", i);
        put_value(p, name, sz, (uint8_t)(100 + i));
    }
    ASSERT_MSG(!matches(v, sz, 42), "the released space was never reused");
    kvp__lmap_put(m);
    close(fd);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* A request's released field ends leases like a RELEASE does, whatever the
 * request (protocol.md §2): here an EXISTS, a PUT and a RELEASE. */
TEST(test_server_local_reads_released_field_ends_leases)
{
    server_t s = {0};
    kvp_pool_t *p;
    uint64_t key;
    kvp__arena_info_t ai;
    int fd = raw_start(&s, &p, "k", 100000, &key, &ai);
    hold_local_reads(fd, key, 1, 5, 100000);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 5);

    /* EXISTS releasing 1 and 2: answered as usual. */
    uint8_t buf[512];
    kvp__mpw_t w;
    kvp_key_t k = kvp_key_str("k");
    uint64_t two[2] = {1, 2};
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp__wire_req_encode(&w, KVP_WOP_EXISTS, 30, 1000, key, &k, 1, NULL);
    ASSERT_EQ(kvp__wire_req_add_released(&w, two, 2), 0);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, 0, NULL, 0);
    raw_reply_t r;
    ASSERT_EQ(raw_reply(fd, &r), 1);
    ASSERT_EQ(r.rep.op, KVP_WOP_EXISTS);
    ASSERT_EQ(r.rep.req_id, 30);
    ASSERT_OK(r.rep.status);
    free(r.hdr);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 3);

    /* A PUT releasing 3: stored, and released. */
    char val[1000];
    memset(val, 'v', sizeof val);
    kvp_key_t nk = kvp_key_str("new");
    uint64_t vsz = sizeof val, three = 3;
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp__wire_req_encode(&w, KVP_WOP_PUT, 31, 1000, key, &nk, 1, &vsz);
    ASSERT_EQ(kvp__wire_req_add_released(&w, &three, 1), 0);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, sizeof val, val, sizeof val);
    ASSERT_EQ(raw_reply(fd, &r), 1);
    ASSERT_EQ(r.rep.op, KVP_WOP_PUT);
    ASSERT_OK(r.rep.status);
    free(r.hdr);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 2);

    /* A RELEASE of 4 that also releases 5 and an unknown 77 (counted as a
     * bad request, nothing else): never answered, the next reply is the
     * HELLO's. */
    uint64_t more[2] = {5, 77};
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp__wire_req_encode(&w, KVP_WOP_RELEASE, 4, 0, key, NULL, 0, NULL);
    ASSERT_EQ(kvp__wire_req_add_released(&w, more, 2), 0);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, 0, NULL, 0);
    ASSERT_EQ(raw_hello(fd, key, &ai), 1);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 0);
    ASSERT_EQ(metric_now(&s, "kvpool_bad_requests_total"), 1);
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"release\"}"), 1);
    char back[1000];
    kvp_iov_t biov = {back, sizeof back};
    kvp_sgl_t bsgl = {&biov, 1};
    kvp_key_result_t br;
    ASSERT_OK(kvp_pool_get(p, &nk, &bsgl, 1, &br));
    ASSERT_OK(br.status);
    ASSERT_MEM_EQ(back, val, sizeof val);
    close(fd);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* The kvpool client releases what it copied on its next request, not in a
 * message of its own; what nothing follows is released within
 * milliseconds all the same. */
TEST(test_server_local_reads_release_rides_on_the_next_request)
{
    server_t s = {0};
    server_start_metrics(&s, "64MiB");
    kvp_pool_t *p = open_ok(s.uri);
    const size_t sz = 65536;
    put_value(p, "v", sz, 9);
    const int n = 40;
    uint8_t *got = malloc(sz * n);
    kvp_key_t k = kvp_key_str("v");
    for (int i = 0; i < n; i++) {
        kvp_iov_t iov = {got + (size_t)i * sz, sz};
        kvp_sgl_t sgl = {&iov, 1};
        kvp_key_result_t r;
        ASSERT_OK(kvp_pool_get(p, &k, &sgl, 1, &r));
        ASSERT_OK(r.status);
    }
    for (int i = 0; i < n; i++)
        ASSERT(matches(got + (size_t)i * sz, sz, 9));
    free(got);
    /* The last one waits for a request to ride on; none comes: it goes on
     * its own. */
    ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get_local\"}"), n);
    double rel = metric_now(&s, "kvpool_requests_total{op=\"release\"}");
    ASSERT(rel >= 1);
    ASSERT_MSG(rel <= n / 4, "%.0f RELEASE messages for %d local reads", rel, n);
    ASSERT_EQ(metric_now(&s, "kvpool_bad_requests_total"), 0);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST(test_server_local_reads_leases_end_with_the_connection)
{
    server_t s = {0};
    kvp_pool_t *p;
    uint64_t key, size, off;
    kvp__arena_info_t ai;

    /* The client closes its socket: every lease it held ends. */
    int fd = raw_start(&s, &p, "k", 200000, &key, &ai);
    hold_local_reads(fd, key, 10, 12, 200000);
    ASSERT_EQ(raw_get_local(fd, key, 13, "nope", 200000, &size, &off), KVP_ERR_NOT_FOUND);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 3);
    close(fd);
    ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);

    /* The server drops a connection whose client is alive (here for a
     * frame that breaks the protocol): the client sees the end of the
     * stream, and the leases last until it closes its side. */
    fd = lane_raw_connect(s.port, &key);
    ASSERT_EQ(raw_hello(fd, key, &ai), 1);
    raw_prove(fd, key, &ai);
    ASSERT_OK(raw_get_local(fd, key, 20, "k", 200000, &size, &off));
    char junk[8] = {0};
    lane_raw_frame(fd, NULL, 0, sizeof junk, junk, sizeof junk); /* data without a header */
    uint32_t op;
    kvp_status_t rst;
    ASSERT_EQ(lane_raw_next(fd, &op, &rst), 0); /* end of stream */
    sleep_ms(200);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 1);
    kvp_key_t k = kvp_key_str("k");
    kvp_key_result_t rr;
    ASSERT_OK(kvp_pool_remove(p, &k, 1, &rr)); /* others are served meanwhile */
    ASSERT_OK(rr.status);
    close(fd);
    ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST(test_server_local_reads_refused_past_the_cap)
{
    /* A client that never releases gets KVP_ERR_BUSY past 1024 held reads. */
    server_t s = {0};
    kvp_pool_t *p;
    uint64_t key, size, off;
    kvp__arena_info_t ai;
    int fd = raw_start(&s, &p, "k", 1000, &key, &ai);
    hold_local_reads(fd, key, 1, 1024, 1000);
    ASSERT_EQ(raw_get_local(fd, key, 5000, "k", 1000, &size, &off), KVP_ERR_BUSY);
    raw_request(fd, KVP_WOP_RELEASE, 1024, key, NULL, 0);
    ASSERT_OK(raw_get_local(fd, key, 5001, "k", 1000, &size, &off));
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_leases"), 1024);
    ASSERT_EQ(metric_now(&s, "kvpool_local_read_groups"), 1024);
    close(fd);
    ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* A get the server has no lease room for (here 4 MiB in one batch past the
 * 2 MiB a connection may hold leased on an 8 MiB arena) is answered busy
 * for those keys, and the client fetches the slice over UCX instead: the
 * caller sees every value, whole. */
TEST(test_server_local_reads_busy_falls_back_to_a_plain_get)
{
    server_t s = {0};
    server_start_metrics(&s, "8MiB");
    kvp_pool_t *p = open_ok(s.uri);
    const size_t sz = 1u << 20;
    kvp_key_t keys[4];
    char names[4][8];
    uint8_t *bufs[4];
    kvp_iov_t iov[4];
    kvp_sgl_t sgl[4];
    kvp_key_result_t res[4];
    for (int i = 0; i < 4; i++) {
        snprintf(names[i], sizeof names[i], "b%d", i);
        put_value(p, names[i], sz, (uint8_t)(30 + i));
        keys[i] = kvp_key_str(names[i]);
        bufs[i] = malloc(sz);
        iov[i] = (kvp_iov_t){bufs[i], sz};
        sgl[i] = (kvp_sgl_t){&iov[i], 1};
    }
    ASSERT_OK(kvp_pool_get(p, keys, sgl, 4, res));
    for (int i = 0; i < 4; i++) {
        ASSERT_OK(res[i].status);
        ASSERT_EQ(res[i].size, sz);
        ASSERT(matches(bufs[i], sz, (uint8_t)(30 + i)));
        free(bufs[i]);
    }
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get_local\"}"), 1);
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get\"}"), 1); /* the same slice again */
    ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST(test_server_local_reads_switched_off)
{
    /* Server side: --no-local-reads offers no arena; gets go over UCX. */
    server_t s = {0};
    s.extra = "--no-local-reads";
    server_start_metrics(&s, "8MiB");
    uint64_t key;
    kvp__arena_info_t ai;
    int fd = lane_raw_connect(s.port, &key);
    ASSERT_EQ(raw_hello(fd, key, &ai), 0);
    uint64_t size, off;
    ASSERT_EQ(raw_get_local(fd, key, 3, "k", 1000, &size, &off), KVP_ERR_PROTOCOL);
    close(fd);
    kvp_pool_t *p = open_ok(s.uri);
    put_value(p, "big", 1u << 20, 5);
    ASSERT_EQ(check_pattern(p, "big", 1u << 20, 5), 1);
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get_local\"}"), 1); /* the raw one */
    ASSERT_EQ(metric_now(&s, "kvpool_requests_total{op=\"get\"}"), 1);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);

    /* Client side: local_reads=off; a bad value is refused at open. */
    server_t t = {0};
    server_start_metrics(&t, "8MiB");
    char uri[200];
    snprintf(uri, sizeof uri, "%s&local_reads=off", t.uri);
    p = open_ok(uri);
    put_value(p, "big", 1u << 20, 6);
    ASSERT_EQ(check_pattern(p, "big", 1u << 20, 6), 1);
    ASSERT_EQ(metric_now(&t, "kvpool_requests_total{op=\"get_local\"}"), 0);
    kvp_pool_close(p);
    snprintf(uri, sizeof uri, "%s&local_reads=maybe", t.uri);
    kvp_pool_t *bad = NULL;
    ASSERT_EQ(kvp_pool_open(uri, &bad), KVP_ERR_BAD_OPTION);
    ASSERT_EQ(server_stop(&t, SIGTERM), 0);
}

TEST(test_server_local_reads_client_killed_while_reading)
{
    /* A process doing local reads in a loop is killed: its leases end with
     * its socket, and the server serves on. */
    server_t s = {0};
    server_start_metrics(&s, "64MiB");
    kvp_pool_t *p = open_ok(s.uri);
    for (int i = 0; i < 8; i++) {
        char name[16];
        snprintf(name, sizeof name, "v%d", i);
        put_value(p, name, 1u << 20, (uint8_t)i);
    }
    for (int round = 0; round < 3; round++) {
        pid_t c = fork();
        ASSERT(c >= 0);
        if (c == 0) {
            kvp_pool_t *cp = NULL;
            if (kvp_pool_open(s.uri, &cp) != KVP_OK)
                _exit(2);
            for (uint64_t i = 0;; i++) {
                char name[16];
                snprintf(name, sizeof name, "v%d", (int)(i % 8));
                if (check_pattern(cp, name, 1u << 20, (uint8_t)(i % 8)) != 1)
                    _exit(3);
            }
        }
        sleep_ms(150 + round * 70);
        kill(c, SIGKILL);
        int st;
        waitpid(c, &st, 0);
        ASSERT(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
        ASSERT_EQ(metric_until(&s, "kvpool_local_read_leases", 0, 5000), 0);
        ASSERT_EQ(check_pattern(p, "v3", 1u << 20, 3), 1);
    }
    ASSERT(metric_now(&s, "kvpool_requests_total{op=\"get_local\"}") > 10);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST_LIST(T(test_local_read_copy_every_byte_in_place), T(test_local_read_copy_concurrent_callers),
          T(test_local_read_map_checks_the_file), T(test_server_local_reads_values_match),
          T(test_server_local_reads_lease_keeps_bytes_until_release),
          T(test_server_local_reads_released_field_ends_leases),
          T(test_server_local_reads_release_rides_on_the_next_request),
          T(test_server_local_reads_leases_end_with_the_connection),
          T(test_server_local_reads_refused_past_the_cap), T(test_server_local_reads_busy_falls_back_to_a_plain_get),
          T(test_server_local_reads_switched_off),
          T(test_server_local_reads_client_killed_while_reading))
