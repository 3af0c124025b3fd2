/* Unit tests of the storage engine internals: the TLSF allocator, two-phase
 * put and put_timeout reclaim, leases, eviction order, pinning, accounting. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "store/store.h"
#include "store/store_int.h"
#include "store/tlsf.h"
#include "test.h"

/* ---- TLSF ---------------------------------------------------------------- */

TEST(test_tlsf_alloc_free_coalesces)
{
    size_t n = 1 << 20;
    void *region = malloc(n);
    kvp__tlsf_t t;
    ASSERT_EQ(kvp__tlsf_init(&t, region, n), 0);
    uint64_t total = t.size;
    void *a = kvp__tlsf_alloc(&t, 1000), *b = kvp__tlsf_alloc(&t, 5000), *c = kvp__tlsf_alloc(&t, 1);
    ASSERT(a && b && c);
    ASSERT_EQ((uintptr_t)a % KVP_TLSF_ALIGN, 0);
    ASSERT_GE(kvp__tlsf_block_size(a), 1000 + KVP_TLSF_OVERHEAD);
    ASSERT_EQ(kvp__tlsf_check(&t), 0);
    kvp__tlsf_free(&t, b);
    ASSERT_EQ(kvp__tlsf_check(&t), 0);
    kvp__tlsf_free(&t, a);
    kvp__tlsf_free(&t, c);
    ASSERT_EQ(kvp__tlsf_check(&t), 0);
    ASSERT_EQ(t.used, 0);
    /* Everything coalesced back: the whole region is one block again. */
    void *all = kvp__tlsf_alloc(&t, total - KVP_TLSF_OVERHEAD);
    ASSERT(all != NULL);
    ASSERT(kvp__tlsf_alloc(&t, 16) == NULL);
    kvp__tlsf_free(&t, all);
    ASSERT_EQ(kvp__tlsf_check(&t), 0);
    free(region);
}

TEST(test_tlsf_random_against_invariants)
{
    size_t n = 8 << 20;
    void *region = malloc(n);
    kvp__tlsf_t t;
    ASSERT_EQ(kvp__tlsf_init(&t, region, n), 0);
    enum { SLOTS = 512 };
    void *p[SLOTS] = {0};
    uint64_t sz[SLOTS] = {0};
    uint64_t seed = 42;
    for (int step = 0; step < 50000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)((seed >> 33) % SLOTS);
        if (p[i]) {
            /* The payload is still intact: nothing else wrote over it. */
            ASSERT_EQ(((unsigned char *)p[i])[0], (unsigned char)i);
            ASSERT_EQ(((unsigned char *)p[i])[sz[i] - 1], (unsigned char)i);
            kvp__tlsf_free(&t, p[i]);
            p[i] = NULL;
        } else {
            sz[i] = 1 + (seed >> 40) % ((seed & 1) ? 200000 : 3000);
            p[i] = kvp__tlsf_alloc(&t, sz[i]);
            if (p[i]) {
                memset(p[i], i, sz[i]);
                ASSERT_GE(kvp__tlsf_block_size(p[i]), sz[i] + KVP_TLSF_OVERHEAD);
            }
        }
        if (step % 997 == 0)
            ASSERT_EQ(kvp__tlsf_check(&t), 0);
    }
    for (int i = 0; i < SLOTS; i++)
        kvp__tlsf_free(&t, p[i]);
    ASSERT_EQ(kvp__tlsf_check(&t), 0);
    ASSERT_EQ(t.used, 0);
    free(region);
}

/* ---- store helpers -------------------------------------------------------- */

static _Atomic uint64_t g_fake_now = 1000000000ull;
static uint64_t fake_now(void *arg)
{
    (void)arg;
    return atomic_load(&g_fake_now);
}

static kvp__store_t *make_store(uint64_t capacity, int fake_clock)
{
    kvp__store_params_t p;
    kvp__store_params_default(&p);
    p.capacity = capacity;
    p.huge = KVP_HUGE_OFF;
    p.shards = 16;
    p.put_timeout_ns = 5ull * 1000000000ull;
    if (fake_clock)
        p.now_ns = fake_now;
    kvp__store_t *s = NULL;
    ASSERT_OK(kvp__store_create(&p, &s));
    return s;
}

static kvp_status_t put_str(kvp__store_t *s, const char *key, const void *val, size_t len, uint32_t *flags)
{
    kvp_iov_t iov = {(void *)val, len};
    kvp_sgl_t sgl = {&iov, 1};
    return kvp__store_put(s, key, (uint32_t)strlen(key), &sgl, len, flags);
}

static kvp_status_t get_str(kvp__store_t *s, const char *key, void *buf, size_t cap, uint64_t *size)
{
    kvp_iov_t iov = {buf, cap};
    kvp_sgl_t sgl = {&iov, 1};
    return kvp__store_get(s, key, (uint32_t)strlen(key), &sgl, cap, size);
}

static void assert_identity(kvp__store_t *s)
{
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.committed, st.live + st.evicted + st.removed + st.reset);
    ASSERT_OK(kvp__store_check(s));
}

/* ---- two-phase put ---------------------------------------------------------- */

TEST(test_store_reservation_invisible_until_commit)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    kvp__resv_t *r;
    void *dst;
    uint32_t flags;
    ASSERT_OK(kvp__store_reserve(s, "k1", 2, 100, 1, &r, &dst, &flags));
    ASSERT(r && dst);
    memset(dst, 7, 100);
    ASSERT_EQ(kvp__store_exists(s, "k1", 2), 0);
    char buf[100];
    uint64_t size;
    ASSERT_EQ(get_str(s, "k1", buf, sizeof buf, &size), KVP_ERR_NOT_FOUND);
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.reserved, 1);
    ASSERT_EQ(st.live, 0);
    ASSERT_OK(kvp__store_commit(s, r, &flags));
    ASSERT_EQ(flags, 0);
    ASSERT_EQ(kvp__store_exists(s, "k1", 2), 1);
    ASSERT_OK(get_str(s, "k1", buf, sizeof buf, &size));
    ASSERT_EQ(size, 100);
    ASSERT_EQ(buf[99], 7);
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.reserved, 0);
    ASSERT_EQ(st.committed, 1);
    assert_identity(s);
    kvp__store_destroy(s);
}

TEST(test_store_racing_commits_first_wins)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    kvp__resv_t *r1, *r2;
    void *d1, *d2;
    uint32_t f;
    ASSERT_OK(kvp__store_reserve(s, "same", 4, 64, 1, &r1, &d1, &f));
    ASSERT_OK(kvp__store_reserve(s, "same", 4, 64, 1, &r2, &d2, &f));
    ASSERT(r1 && r2 && d1 != d2);
    memset(d1, 1, 64);
    memset(d2, 2, 64);
    ASSERT_OK(kvp__store_commit(s, r2, &f));
    ASSERT_EQ(f, 0);
    ASSERT_OK(kvp__store_commit(s, r1, &f));
    ASSERT_EQ(f, KVP_RESULT_EXISTED);
    char buf[64];
    uint64_t size;
    ASSERT_OK(get_str(s, "same", buf, sizeof buf, &size));
    ASSERT_EQ(buf[0], 2);
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.committed, 1);
    ASSERT_EQ(st.put_existed, 1);
    /* The loser's space went back: only one object's footprint is used. */
    ASSERT_EQ(st.used_bytes, kvp__tlsf_footprint(64));
    assert_identity(s);
    kvp__store_destroy(s);
}

TEST(test_store_put_timeout_reclaims_unheld_reservation)
{
    kvp__store_t *s = make_store(1 << 20, 1);
    kvp__resv_t *r, *held;
    void *dst;
    uint32_t f;
    ASSERT_OK(kvp__store_reserve(s, "dead-writer", 11, 4096, 0, &r, &dst, &f));
    ASSERT_OK(kvp__store_reserve(s, "slow-writer", 11, 4096, 1, &held, &dst, &f));
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.used_bytes, 2 * kvp__tlsf_footprint(4096));
    atomic_fetch_add(&g_fake_now, 4ull * 1000000000ull);
    ASSERT_EQ(kvp__store_reap(s), 0); /* 4 s < put_timeout 5 s */
    atomic_fetch_add(&g_fake_now, 2ull * 1000000000ull);
    ASSERT_EQ(kvp__store_reap(s), 1); /* only the unheld one */
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.expired_put, 1);
    ASSERT_EQ(st.reserved, 1);
    ASSERT_EQ(st.used_bytes, kvp__tlsf_footprint(4096));
    /* The late commit is refused and nothing becomes visible. */
    ASSERT_EQ(kvp__store_commit(s, r, &f), KVP_ERR_EXPIRED);
    ASSERT_EQ(kvp__store_exists(s, "dead-writer", 11), 0);
    /* The held writer still commits fine. */
    ASSERT_OK(kvp__store_commit(s, held, &f));
    ASSERT_EQ(kvp__store_exists(s, "slow-writer", 11), 1);
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.committed, 1);
    assert_identity(s);
    kvp__store_destroy(s);
}

TEST(test_store_abort_frees_space)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    kvp__resv_t *r;
    void *dst;
    uint32_t f;
    ASSERT_OK(kvp__store_reserve(s, "a", 1, 10000, 1, &r, &dst, &f));
    kvp__store_abort(s, r);
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.used_bytes, 0);
    ASSERT_EQ(st.reserved, 0);
    ASSERT_EQ(kvp__store_exists(s, "a", 1), 0);
    kvp__store_destroy(s);
}

TEST(test_store_put_existing_is_idempotent)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    uint32_t f;
    ASSERT_OK(put_str(s, "k", "first", 5, &f));
    ASSERT_EQ(f, 0);
    ASSERT_OK(put_str(s, "k", "other", 5, &f));
    ASSERT_EQ(f, KVP_RESULT_EXISTED);
    char buf[8];
    uint64_t size;
    ASSERT_OK(get_str(s, "k", buf, sizeof buf, &size));
    ASSERT_MEM_EQ(buf, "first", 5);
    kvp__store_destroy(s);
}

/* ---- leases, remove, eviction ----------------------------------------------- */

TEST(test_store_get_short_buffer_reports_size)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    uint32_t f;
    ASSERT_OK(put_str(s, "k", "0123456789", 10, &f));
    char buf[4];
    uint64_t size = 0;
    ASSERT_EQ(get_str(s, "k", buf, sizeof buf, &size), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(size, 10);
    kvp__store_destroy(s);
}

/* How obj00000 .. obj00009 are touched (a get, or a batch lookup). */
typedef void (*touch_fn)(kvp__store_t *s, const kvp_key_t *keys, size_t n);

/* Fills s to just under its high watermark, touches the first 10 objects
 * with touch, then pushes past the watermark: eviction frees down to the low
 * one, and the 10 touched objects (the oldest puts) must survive it. */
static void check_touched_survive_eviction(touch_fn touch)
{
    uint64_t cap = 4 << 20;
    kvp__store_t *s = make_store(cap, 0);
    kvp_pool_stats_t st;
    char *val = calloc(1, 16384);
    char key[32];
    uint32_t f;
    /* Fill to just under the high watermark. */
    int n = 0;
    for (;; n++) {
        kvp__store_stats(s, &st);
        if (st.used_bytes + 2 * kvp__tlsf_footprint(16384) > st.high_watermark_bytes)
            break;
        snprintf(key, sizeof key, "obj%05d", n);
        ASSERT_OK(put_str(s, key, val, 16384, &f));
    }
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.evicted, 0);
    /* Touch the first 10 objects: they become the most recently used. */
    struct timespec ts = {0, 3 * 1000 * 1000};
    nanosleep(&ts, NULL); /* access times are ~1 ms ticks */
    char names[10][16];
    kvp_key_t keys[10];
    for (int i = 0; i < 10; i++) {
        snprintf(names[i], sizeof names[i], "obj%05d", i);
        keys[i] = kvp_key_str(names[i]);
    }
    touch(s, keys, 10);
    nanosleep(&ts, NULL);
    /* Push past the high watermark: eviction frees down to the low one. */
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "new%05d", i);
        ASSERT_OK(put_str(s, key, val, 16384, &f));
    }
    kvp__store_stats(s, &st);
    ASSERT_GT(st.evicted, 10); /* more than the 10: without the touch they would go */
    ASSERT_LE(st.used_bytes, st.high_watermark_bytes);
    ASSERT_LE(st.used_bytes - 4 * kvp__tlsf_footprint(16384), st.low_watermark_bytes);
    /* The recently touched objects survived; the cold ones went first. */
    for (int i = 0; i < 10; i++)
        ASSERT_MSG(kvp__store_exists(s, names[i], (uint32_t)strlen(names[i])),
                   "hot object %s was evicted", names[i]);
    assert_identity(s);
    free(val);
    kvp__store_destroy(s);
}

static void touch_by_get(kvp__store_t *s, const kvp_key_t *keys, size_t n)
{
    char buf[16384];
    kvp_iov_t iov = {buf, sizeof buf};
    kvp_sgl_t sgl = {&iov, 1};
    uint64_t size;
    for (size_t i = 0; i < n; i++)
        ASSERT_OK(kvp__store_get(s, keys[i].data, keys[i].len, &sgl, sizeof buf, &size));
}

TEST(test_store_eviction_between_watermarks_lru_order)
{
    check_touched_survive_eviction(touch_by_get);
}

/* Lookups refresh recency (no lease: eviction is never blocked): the first 5
 * through an exists batch, the next 5 through a prefix batch. */
static void touch_by_lookup(kvp__store_t *s, const kvp_key_t *keys, size_t n)
{
    uint8_t present[10];
    ASSERT(n == 10);
    kvp__store_exists_batch(s, keys, 5, present);
    for (int i = 0; i < 5; i++)
        ASSERT(present[i]);
    ASSERT_EQ(kvp__store_prefix(s, keys + 5, 5), 5);
}

TEST(test_store_lookup_refreshes_recency_so_looked_up_objects_outlive_eviction)
{
    check_touched_survive_eviction(touch_by_lookup);
}

/* No lease: a store whose every object a lookup has found still evicts
 * (the second chances are bounded per victim; nothing is pinned by them). */
TEST(test_store_lookups_never_block_eviction)
{
    kvp__store_t *s = make_store(4 << 20, 0);
    char *val = calloc(1, 16384);
    char(*names)[16] = calloc(1024, sizeof *names);
    kvp_key_t *keys = calloc(1024, sizeof *keys);
    uint8_t *present = calloc(1024, 1);
    ASSERT(val && names && keys && present);
    kvp_pool_stats_t st;
    uint32_t f;
    int n = 0;
    for (; n < 1024; n++) {
        kvp__store_stats(s, &st);
        if (st.used_bytes + 2 * kvp__tlsf_footprint(16384) > st.high_watermark_bytes)
            break;
        snprintf(names[n], sizeof names[n], "obj%05d", n);
        keys[n] = kvp_key_str(names[n]);
        ASSERT_OK(put_str(s, names[n], val, 16384, &f));
    }
    kvp__store_exists_batch(s, keys, (size_t)n, present);
    ASSERT_EQ(kvp__store_prefix(s, keys, (size_t)n), (size_t)n);
    for (int i = 0; i < 8; i++) {
        char key[32];
        snprintf(key, sizeof key, "new%05d", i);
        ASSERT_OK(put_str(s, key, val, 16384, &f));
    }
    kvp__store_stats(s, &st);
    ASSERT_GT(st.evicted, 0);
    ASSERT_LE(st.used_bytes, st.high_watermark_bytes);
    assert_identity(s);
    free(val), free(names), free(keys), free(present);
    kvp__store_destroy(s);
}

TEST(test_store_pinned_never_evicted_and_no_space)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    char *val = calloc(1, 200000);
    uint32_t f;
    char key[32];
    int stored = 0;
    for (int i = 0; i < 9; i++) {
        snprintf(key, sizeof key, "pin%d", i);
        if (put_str(s, key, val, 100000, &f) == KVP_OK) {
            ASSERT_OK(kvp__store_pin(s, key, (uint32_t)strlen(key), 1));
            stored++;
        }
    }
    ASSERT_GE(stored, 8);
    /* Everything is pinned: a put that needs space gets NO_SPACE, nothing lost. */
    kvp_status_t st = put_str(s, "big", val, 200000, &f);
    ASSERT_EQ(st, KVP_ERR_NO_SPACE);
    for (int i = 0; i < stored; i++) {
        snprintf(key, sizeof key, "pin%d", i);
        ASSERT(kvp__store_exists(s, key, (uint32_t)strlen(key)));
    }
    /* Unpin two: now they can make room. */
    ASSERT_OK(kvp__store_pin(s, "pin0", 4, 0));
    ASSERT_OK(kvp__store_pin(s, "pin1", 4, 0));
    ASSERT_OK(put_str(s, "big", val, 150000, &f));
    kvp_pool_stats_t stats;
    kvp__store_stats(s, &stats);
    ASSERT_GE(stats.evicted, 1);
    ASSERT_EQ(stats.put_no_space, 1);
    ASSERT_EQ(stats.pinned, (uint64_t)stored - 2);
    for (int i = 2; i < stored; i++) {
        snprintf(key, sizeof key, "pin%d", i);
        ASSERT(kvp__store_exists(s, key, (uint32_t)strlen(key)));
    }
    assert_identity(s);
    free(val);
    kvp__store_destroy(s);
}

/* A reader copying a large value while another thread removes it and resets
 * the pool: the copy completes with the right bytes, and the space is freed
 * only after the lease ends. */
typedef struct {
    kvp__store_t *s;
    _Atomic int stop;
    _Atomic uint64_t gets;
    _Atomic int bad;
} lease_ctx_t;

static void *lease_reader(void *arg)
{
    lease_ctx_t *c = arg;
    char *buf = malloc(1 << 20);
    while (!atomic_load(&c->stop)) {
        uint64_t size;
        if (get_str(c->s, "big", buf, 1 << 20, &size) == KVP_OK) {
            for (uint64_t i = 0; i < size; i += 4099)
                if (buf[i] != (char)0x5a)
                    atomic_store(&c->bad, 1);
            atomic_fetch_add(&c->gets, 1);
        }
    }
    free(buf);
    return NULL;
}

TEST(test_store_lease_survives_remove_and_reset)
{
    kvp__store_t *s = make_store(16 << 20, 0);
    char *val = malloc(1 << 20);
    memset(val, 0x5a, 1 << 20);
    lease_ctx_t c = {.s = s};
    pthread_t t;
    pthread_create(&t, NULL, lease_reader, &c);
    uint32_t f;
    for (int i = 0; i < 300; i++) {
        ASSERT_OK(put_str(s, "big", val, 1 << 20, &f));
        if (i & 1)
            (void)kvp__store_remove(s, "big", 3);
        else
            (void)kvp__store_remove_all(s);
    }
    atomic_store(&c.stop, 1);
    pthread_join(t, NULL);
    ASSERT_EQ(atomic_load(&c.bad), 0);
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.live, 0);
    ASSERT_EQ(st.used_bytes, 0); /* every leased object was freed when its copy ended */
    ASSERT_EQ(st.leased, 0);
    assert_identity(s);
    free(val);
    kvp__store_destroy(s);
}

TEST(test_store_exists_takes_no_lease_and_no_lru_touch)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    uint32_t f;
    ASSERT_OK(put_str(s, "k", "v", 1, &f));
    for (int i = 0; i < 1000; i++)
        ASSERT(kvp__store_exists(s, "k", 1));
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_EQ(st.leased, 0);
    ASSERT_EQ(st.get_hits, 0);
    kvp__store_destroy(s);
}

TEST(test_store_prefix_early_exit)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    uint32_t f;
    const char *names[] = {"a", "b", "c", "d", "e"};
    kvp_key_t keys[5];
    for (int i = 0; i < 5; i++)
        keys[i] = kvp_key_str(names[i]);
    ASSERT_OK(put_str(s, "a", "1", 1, &f));
    ASSERT_OK(put_str(s, "b", "1", 1, &f));
    ASSERT_OK(put_str(s, "d", "1", 1, &f));
    ASSERT_EQ(kvp__store_prefix(s, keys, 5), 2);
    ASSERT_EQ(kvp__store_prefix(s, keys + 3, 1), 1);
    ASSERT_EQ(kvp__store_prefix(s, keys + 2, 3), 0);
    kvp__store_destroy(s);
}

TEST(test_store_create_bad_params)
{
    kvp__store_params_t p;
    kvp__store_params_default(&p);
    kvp__store_t *s = (kvp__store_t *)1;
    p.capacity = 0;
    ASSERT_EQ(kvp__store_create(&p, &s), KVP_ERR_BAD_OPTION);
    ASSERT(s == NULL);
    p.capacity = 1 << 20;
    p.low_watermark = 0.96;
    ASSERT_EQ(kvp__store_create(&p, &s), KVP_ERR_BAD_OPTION);
    p.low_watermark = 0.9;
    p.shards = 3;
    ASSERT_EQ(kvp__store_create(&p, &s), KVP_ERR_BAD_OPTION);
}

TEST(test_store_create_alloc_failure_leaks_nothing)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp__store_params_t p;
    kvp__store_params_default(&p);
    p.capacity = 1 << 20;
    p.shards = 8;
    int failures = 0;
    for (long n = 0;; n++) {
        kvp__store_t *s = NULL;
        kvp__alloc_fail_after(n);
        kvp_status_t st = kvp__store_create(&p, &s);
        kvp__alloc_fail_reset();
        if (st == KVP_OK) {
            kvp__store_destroy(s);
            break;
        }
        ASSERT_EQ(st, KVP_ERR_NO_MEMORY);
        ASSERT(s == NULL);
        ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
        failures++;
        ASSERT_LT(n, 10000);
    }
    ASSERT_GT(failures, 3);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
}

/* A 2 MiB store on a memfd arena (as the server's). */
static kvp__store_t *make_memfd_store(void)
{
    kvp__store_params_t p;
    kvp__store_params_default(&p);
    p.capacity = 2 << 20;
    p.mem_kind = KVP_MEM_MEMFD;
    p.huge = KVP_HUGE_OFF;
    kvp__store_t *s = NULL;
    ASSERT_OK(kvp__store_create(&p, &s));
    return s;
}

TEST(test_store_memfd_provider)
{
    kvp__store_t *s = make_memfd_store();
    uint32_t f;
    ASSERT_OK(put_str(s, "m", "memfd", 5, &f));
    char buf[5];
    uint64_t size;
    ASSERT_OK(get_str(s, "m", buf, 5, &size));
    ASSERT_MEM_EQ(buf, "memfd", 5);
    kvp__store_destroy(s);
}

/* The memfd is sealed once mapped: no write, resize or writable mapping
 * through any descriptor of it (another process reopens /proc/PID/fd/N). */
TEST(test_store_memfd_arena_is_sealed)
{
    kvp__store_t *s = make_memfd_store();
    int fd = kvp__store_arena_fd(s);
    ASSERT(fd >= 0);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    int rw = open(path, O_RDWR);
    ASSERT(rw >= 0);
    ASSERT_EQ(pwrite(rw, "x", 1, 0), -1);
    ASSERT_EQ(errno, EPERM);
    ASSERT_EQ(ftruncate(rw, 4096), -1);
    ASSERT_EQ(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0), MAP_FAILED);
    close(rw);
    uint32_t f;
    ASSERT_OK(put_str(s, "still", "writable here", 13, &f)); /* the store's own mapping writes */
    kvp__store_destroy(s);
}

/* A lease count near the 32-bit limit is refused, never wrapped. */
TEST(test_store_lease_count_never_wraps)
{
    kvp__store_t *s = make_store(1 << 20, 0);
    uint32_t f;
    ASSERT_OK(put_str(s, "hot", "v", 1, &f));
    uint64_t h = kvp__key_hash("hot", 3);
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__obj_t *o = kvp__do_find(sh, h, "hot", 3);
    ASSERT(o != NULL);
    atomic_store(&o->refs, KVP_LEASES_MAX - 1); /* as if 2^31 - 2 readers held it */
    const void *d;
    uint64_t size;
    kvp__lease_t *l = NULL, *l2 = NULL;
    ASSERT_OK(kvp__store_acquire(s, "hot", 3, &d, &size, &l));
    ASSERT_EQ(kvp__store_acquire(s, "hot", 3, &d, &size, &l2), KVP_ERR_BUSY);
    ASSERT(l2 == NULL);
    ASSERT_EQ(atomic_load(&o->refs), KVP_LEASES_MAX);
    kvp__store_release(s, l);
    atomic_store(&o->refs, 1);
    ASSERT_OK(kvp__store_acquire(s, "hot", 3, &d, &size, &l));
    kvp__store_release(s, l);
    kvp__store_destroy(s);
}

TEST_LIST(T(test_store_memfd_arena_is_sealed), T(test_store_lease_count_never_wraps),
          T(test_tlsf_alloc_free_coalesces), T(test_tlsf_random_against_invariants),
          T(test_store_reservation_invisible_until_commit), T(test_store_racing_commits_first_wins),
          T(test_store_put_timeout_reclaims_unheld_reservation), T(test_store_abort_frees_space),
          T(test_store_put_existing_is_idempotent), T(test_store_get_short_buffer_reports_size),
          T(test_store_eviction_between_watermarks_lru_order),
          T(test_store_lookup_refreshes_recency_so_looked_up_objects_outlive_eviction),
          T(test_store_lookups_never_block_eviction),
          T(test_store_pinned_never_evicted_and_no_space),
          T(test_store_lease_survives_remove_and_reset),
          T(test_store_exists_takes_no_lease_and_no_lru_touch), T(test_store_prefix_early_exit),
          T(test_store_create_bad_params), T(test_store_create_alloc_failure_leaks_nothing),
          T(test_store_memfd_provider))
