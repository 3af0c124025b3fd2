/*
 * The pool contract: checks of everything include/kvpool/pool.h promises,
 * written against pool.h alone, so that every backend runs the very same
 * checks unchanged.  test_pool_contract.c and test_pool_bad_input.c run them
 * against embedded:// URIs; the kvpool:// and etcd:// backends (later issues)
 * include this header and run them against their own URIs.
 *
 * Rules every kvp_contract_<name>(uri) follows so that it also holds for a
 * remote pool that other tests used before:
 *   - it opens its own handle from `uri` and starts with kvp_pool_remove_all();
 *   - it never assumes counters start at zero: stats are checked as deltas
 *     between two snapshots, plus the accounting identity in every snapshot;
 *   - sizes are derived from stats.capacity_bytes (tuned for 4-64 MiB pools);
 *   - it closes its handle and leaves nothing pinned.
 *
 * Values are a pattern derived from (key, generation, offset), so every byte
 * read back is checked and a value of one key or one generation can never pass
 * for another.
 *
 * Calls expected to be refused go through KVP_CT_BAD(), which calls the hooks
 * kvp_ct_bad_begin_hook / kvp_ct_bad_end_hook around them (a test file may set
 * them, e.g. to check that each refusal logs one line) and then checks that
 * nothing changed: stats identical, the fixture's objects still readable.
 */
#ifndef KVP_TESTS_POOL_CONTRACT_H
#define KVP_TESTS_POOL_CONTRACT_H

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpool/pool.h"
#include "test.h"

/* ---------------------------------------------------------------- helpers */

static inline uint64_t kvp_ct_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static inline uint64_t kvp_ct_hash(const void *data, size_t n)
{
    const uint8_t *p = (const uint8_t *)data;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001B3ull;
    return kvp_ct_mix(h ^ n);
}

/* The pattern seed of value generation `gen` of key `k`. */
static inline uint64_t kvp_ct_seed(kvp_key_t k, uint64_t gen)
{
    return kvp_ct_hash(k.data, k.len) ^ kvp_ct_mix(gen * 0x2545F4914F6CDD1Dull + 77);
}

/* Byte `off` of the value with pattern seed `seed`. */
static inline uint8_t kvp_ct_byte(uint64_t seed, uint64_t off)
{
    return (uint8_t)(kvp_ct_mix(seed + (off & ~7ull)) >> ((off & 7) * 8));
}

/* Writes bytes [off, off+len) of the value with seed `seed` into buf. */
static inline void kvp_ct_fill_at(void *buf, size_t len, uint64_t seed, uint64_t off)
{
    uint8_t *p = (uint8_t *)buf;
    size_t i = 0;
    while (i < len && ((off + i) & 7))
        p[i] = kvp_ct_byte(seed, off + i), i++;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = kvp_ct_mix(seed + off + i);
        memcpy(p + i, &w, 8); /* little-endian: byte j of w is offset +j */
    }
    for (; i < len; i++)
        p[i] = kvp_ct_byte(seed, off + i);
}

static inline void kvp_ct_fill(void *buf, size_t len, uint64_t seed)
{
    kvp_ct_fill_at(buf, len, seed, 0);
}

/* Index of the first byte of buf that differs from the value's bytes
 * [off, off+len), or SIZE_MAX if all match. */
static inline size_t kvp_ct_check_at(const void *buf, size_t len, uint64_t seed, uint64_t off)
{
    const uint8_t *p = (const uint8_t *)buf;
    size_t i = 0;
    while (i < len && ((off + i) & 7)) {
        if (p[i] != kvp_ct_byte(seed, off + i))
            return i;
        i++;
    }
    for (; i + 8 <= len; i += 8) {
        uint64_t w = kvp_ct_mix(seed + off + i), got;
        memcpy(&got, p + i, 8);
        if (got != w)
            break;
    }
    for (; i < len; i++)
        if (p[i] != kvp_ct_byte(seed, off + i))
            return i;
    return SIZE_MAX;
}

static inline size_t kvp_ct_check(const void *buf, size_t len, uint64_t seed)
{
    return kvp_ct_check_at(buf, len, seed, 0);
}

static inline void *kvp_ct_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    ASSERT_MSG(p != NULL, "test malloc(%zu) failed", n);
    return p;
}

static inline void kvp_ct_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A key whose bytes live in the struct (keys built from printf formats). */
typedef struct kvp_ct_name {
    char s[600];
    kvp_key_t k;
} kvp_ct_name_t;

#define KVP_CT_NAME(nm, ...)                                   \
    do {                                                       \
        snprintf((nm)->s, sizeof (nm)->s, __VA_ARGS__);        \
        (nm)->k = kvp_key_str((nm)->s);                        \
    } while (0)

#define KVP_CT_ST(expr, expected)                                                           \
    do {                                                                                    \
        kvp_status_t kvp_ct_st_ = (expr);                                                   \
        ASSERT_MSG(kvp_ct_st_ == (expected), "%s = %s (%d), expected %s", #expr,            \
                   kvp_status_name(kvp_ct_st_), (int)kvp_ct_st_, kvp_status_name(expected)); \
    } while (0)

/* ------------------------------------------------------------------ stats */

#define KVP_CT_STATS_FIELDS(X)                                                              \
    X(capacity_bytes) X(used_bytes) X(live_bytes) X(live) X(committed) X(evicted) X(removed) \
    X(reset) X(expired_put) X(reserved) X(pinned) X(leased) X(put_existed) X(put_no_space)   \
    X(get_hits) X(get_misses) X(evicted_bytes) X(index_bytes) X(high_watermark_bytes)        \
    X(low_watermark_bytes)

/* The invariants every snapshot must satisfy, except the relation between
 * live_bytes and used_bytes (below). */
static inline void kvp_ct_check_snapshot_counts(const kvp_pool_stats_t *s, const char *where)
{
    ASSERT_MSG(s->committed == s->live + s->evicted + s->removed + s->reset,
               "%s: accounting identity broken: committed %" PRIu64 " != live %" PRIu64
               " + evicted %" PRIu64 " + removed %" PRIu64 " + reset %" PRIu64,
               where, s->committed, s->live, s->evicted, s->removed, s->reset);
    ASSERT_MSG(s->capacity_bytes > 0, "%s: capacity_bytes is 0", where);
    ASSERT_MSG(s->used_bytes <= s->capacity_bytes, "%s: used_bytes %" PRIu64 " > capacity %" PRIu64,
               where, s->used_bytes, s->capacity_bytes);
    ASSERT_MSG(s->live_bytes >= s->live, "%s: live_bytes %" PRIu64 " < live %" PRIu64
               " (every value is >= 1 B)", where, s->live_bytes, s->live);
    /* (leased is not bounded by live: an object mid-copy may already have
     * been removed, and several readers may lease one object.) */
    ASSERT_MSG(s->pinned <= s->live, "%s: pinned %" PRIu64 " > live %" PRIu64, where, s->pinned,
               s->live);
    ASSERT_MSG(s->low_watermark_bytes <= s->high_watermark_bytes &&
                   s->high_watermark_bytes <= s->capacity_bytes,
               "%s: watermarks low %" PRIu64 " high %" PRIu64 " capacity %" PRIu64, where,
               s->low_watermark_bytes, s->high_watermark_bytes, s->capacity_bytes);
    ASSERT_MSG(s->evicted_bytes >= s->evicted, "%s: evicted_bytes %" PRIu64 " < evicted %" PRIu64,
               where, s->evicted_bytes, s->evicted);
}

/* used_bytes counts live + reserved + in-flight frees, so a consistent
 * snapshot has live_bytes <= used_bytes. */
static inline int kvp_ct_snapshot_bytes_ok(const kvp_pool_stats_t *s)
{
    return s->live_bytes <= s->used_bytes;
}

static inline void kvp_ct_check_snapshot(const kvp_pool_stats_t *s, const char *where)
{
    kvp_ct_check_snapshot_counts(s, where);
    ASSERT_MSG(kvp_ct_snapshot_bytes_ok(s), "%s: live_bytes %" PRIu64 " > used_bytes %" PRIu64
               " (inconsistent snapshot)", where, s->live_bytes, s->used_bytes);
}

static inline kvp_pool_stats_t kvp_ct_stats_at(kvp_pool_t *pool, const char *where)
{
    kvp_pool_stats_t s;
    memset(&s, 0xEE, sizeof s);
    KVP_CT_ST(kvp_pool_stats(pool, &s), KVP_OK);
    kvp_ct_check_snapshot(&s, where);
    return s;
}
#define kvp_ct_stats(pool) kvp_ct_stats_at((pool), __func__)

#define KVP_CT__CMP_FIELD(f)                                                                 \
    ASSERT_MSG(a->f == b->f, "%s: stats.%s changed: %" PRIu64 " -> %" PRIu64, what, #f, a->f, \
               b->f);
static inline void kvp_ct_stats_equal(const kvp_pool_stats_t *a, const kvp_pool_stats_t *b,
                                      const char *what)
{
    KVP_CT_STATS_FIELDS(KVP_CT__CMP_FIELD)
}

/* Polls (up to ~5 s) until cond(stats) holds; background work (eviction,
 * deferred frees) may lag.  Returns the last snapshot. */
#define KVP_CT_POLL_STATS(pool, s, cond)                 \
    do {                                                 \
        for (int kvp_ct_i_ = 0; kvp_ct_i_ < 500; kvp_ct_i_++) { \
            (s) = kvp_ct_stats(pool);                    \
            if (cond)                                    \
                break;                                   \
            kvp_ct_sleep_ms(10);                         \
        }                                                \
    } while (0)

/* ---------------------------------------------------------- pool and I/O */

static inline kvp_pool_t *kvp_ct_open(const char *uri)
{
    kvp_pool_t *pool = NULL;
    kvp_status_t st = kvp_pool_open(uri, &pool);
    ASSERT_MSG(st == KVP_OK, "kvp_pool_open(\"%s\") = %s", uri, kvp_status_name(st));
    ASSERT_MSG(pool != NULL, "kvp_pool_open(\"%s\") returned OK but no handle", uri);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    return pool;
}

/* Size for objects so that `per_pool` of them fill the pool. */
static inline size_t kvp_ct_objsize(const kvp_pool_stats_t *s, uint64_t per_pool, size_t lo,
                                    size_t hi)
{
    uint64_t v = s->capacity_bytes / per_pool;
    if (v < lo)
        v = lo;
    if (v > hi)
        v = hi;
    return (size_t)v;
}

/* Puts one value of `size` bytes, generation `gen`; returns the call status
 * and fills *r. */
static inline kvp_status_t kvp_ct_put(kvp_pool_t *pool, kvp_key_t k, size_t size, uint64_t gen,
                                      kvp_key_result_t *r)
{
    void *buf = kvp_ct_xmalloc(size);
    kvp_ct_fill(buf, size, kvp_ct_seed(k, gen));
    kvp_iov_t iov = {buf, size};
    kvp_sgl_t sgl = {&iov, 1};
    memset(r, 0xEE, sizeof *r);
    kvp_status_t st = kvp_pool_put(pool, &k, &sgl, 1, r);
    free(buf);
    return st;
}

/* Puts a new key: must be stored (OK, not EXISTED, size == size). */
static inline void kvp_ct_put_new(kvp_pool_t *pool, kvp_key_t k, size_t size, uint64_t gen)
{
    kvp_key_result_t r;
    KVP_CT_ST(kvp_ct_put(pool, k, size, gen, &r), KVP_OK);
    ASSERT_MSG(r.status == KVP_OK, "put %.*s (%zu B): result %s", (int)k.len, (const char *)k.data,
               size, kvp_status_name(r.status));
    ASSERT_MSG(!(r.flags & KVP_RESULT_EXISTED), "put of new key %.*s flagged EXISTED", (int)k.len,
               (const char *)k.data);
    ASSERT_MSG(r.size == size, "put %.*s: result size %" PRIu64 ", expected %zu", (int)k.len,
               (const char *)k.data, r.size, size);
}

/* Gets k into a buffer of `cap` bytes; returns the per-key status; on KVP_OK
 * checks size and every byte against (size, gen). */
static inline kvp_status_t kvp_ct_get(kvp_pool_t *pool, kvp_key_t k, size_t cap, size_t size,
                                      uint64_t gen)
{
    uint8_t *buf = (uint8_t *)kvp_ct_xmalloc(cap);
    memset(buf, 0xA5, cap);
    kvp_iov_t iov = {buf, cap};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    memset(&r, 0xEE, sizeof r);
    KVP_CT_ST(kvp_pool_get(pool, &k, &sgl, 1, &r), KVP_OK);
    if (r.status == KVP_OK) {
        ASSERT_MSG(r.size == size, "get %.*s: size %" PRIu64 ", expected %zu", (int)k.len,
                   (const char *)k.data, r.size, size);
        size_t bad = kvp_ct_check(buf, size, kvp_ct_seed(k, gen));
        ASSERT_MSG(bad == SIZE_MAX, "get %.*s: byte %zu of %zu differs (gen %" PRIu64 ")",
                   (int)k.len, (const char *)k.data, bad, size, gen);
    }
    free(buf);
    return r.status;
}

/* The key must be readable with exactly this content. */
static inline void kvp_ct_get_ok(kvp_pool_t *pool, kvp_key_t k, size_t size, uint64_t gen)
{
    kvp_status_t st = kvp_ct_get(pool, k, size, size, gen);
    ASSERT_MSG(st == KVP_OK, "get %.*s: %s, expected KVP_OK", (int)k.len, (const char *)k.data,
               kvp_status_name(st));
}

static inline void kvp_ct_get_missing(kvp_pool_t *pool, kvp_key_t k)
{
    kvp_status_t st = kvp_ct_get(pool, k, 64, 0, 0);
    ASSERT_MSG(st == KVP_ERR_NOT_FOUND, "get %.*s: %s, expected KVP_ERR_NOT_FOUND", (int)k.len,
               (const char *)k.data, kvp_status_name(st));
}

static inline int kvp_ct_exists1(kvp_pool_t *pool, kvp_key_t k)
{
    uint8_t present = 0xEE;
    KVP_CT_ST(kvp_pool_exists(pool, &k, 1, &present), KVP_OK);
    ASSERT_MSG(present == 0 || present == 1, "exists wrote %u", present);
    return present;
}

static inline kvp_status_t kvp_ct_pin1(kvp_pool_t *pool, kvp_key_t k, int pin)
{
    kvp_key_result_t r;
    memset(&r, 0xEE, sizeof r);
    KVP_CT_ST(kvp_pool_pin(pool, &k, 1, pin, &r), KVP_OK);
    return r.status;
}

static inline kvp_status_t kvp_ct_remove1(kvp_pool_t *pool, kvp_key_t k)
{
    kvp_key_result_t r;
    memset(&r, 0xEE, sizeof r);
    KVP_CT_ST(kvp_pool_remove(pool, &k, 1, &r), KVP_OK);
    return r.status;
}

/* ------------------------------------------------------------ bad inputs */

/* Set by a test file to observe each refused call (e.g. count log lines). */
static void (*kvp_ct_bad_begin_hook)(void);
/* refused: 1 when the call was refused as a whole (it must have logged one
 * line), 0 when it was answered per key (no log line required). */
static void (*kvp_ct_bad_end_hook)(const char *what, int refused);

/* A pool holding three known objects; every refused call must leave it
 * exactly as it was. */
#define KVP_CT_FIX_N 3
typedef struct kvp_ct_fixture {
    kvp_pool_t *pool;
    kvp_ct_name_t keep[KVP_CT_FIX_N];
    size_t size[KVP_CT_FIX_N];
    kvp_pool_stats_t before;
} kvp_ct_fixture_t;

/* The fixture's stats once its own gets are over: a get by local read
 * holds a read lease until its RELEASE, which the client sends after the
 * copy, so `leased` may still count the last get for a moment (a snapshot
 * taken then made the next check see leased 1 -> 0). */
static inline kvp_pool_stats_t kvp_ct_quiet_stats(kvp_ct_fixture_t *f)
{
    kvp_pool_stats_t s;
    KVP_CT_POLL_STATS(f->pool, s, s.leased == 0);
    return s;
}

static inline void kvp_ct_fixture_open(kvp_ct_fixture_t *f, const char *uri)
{
    static const size_t sizes[KVP_CT_FIX_N] = {1, 5000, 70000};
    memset(f, 0, sizeof *f);
    f->pool = kvp_ct_open(uri);
    for (int i = 0; i < KVP_CT_FIX_N; i++) {
        KVP_CT_NAME(&f->keep[i], "fixture/keep/%d", i);
        f->size[i] = sizes[i];
        kvp_ct_put_new(f->pool, f->keep[i].k, sizes[i], 1);
    }
    f->before = kvp_ct_quiet_stats(f);
}

/* Nothing changed since the last check: stats identical, objects intact. */
static inline void kvp_ct_fixture_check(kvp_ct_fixture_t *f, const char *what)
{
    kvp_pool_stats_t now = kvp_ct_stats(f->pool);
    kvp_ct_stats_equal(&f->before, &now, what);
    for (int i = 0; i < KVP_CT_FIX_N; i++)
        kvp_ct_get_ok(f->pool, f->keep[i].k, f->size[i], 1);
    f->before = kvp_ct_quiet_stats(f);
}

static inline void kvp_ct_fixture_close(kvp_ct_fixture_t *f)
{
    KVP_CT_ST(kvp_pool_remove_all(f->pool, NULL), KVP_OK);
    kvp_pool_close(f->pool);
    f->pool = NULL;
}

/* `call` must be refused with `expected` and change nothing. */
#define KVP_CT_BAD(f, expected, call)                                                        \
    do {                                                                                     \
        if (kvp_ct_bad_begin_hook)                                                           \
            kvp_ct_bad_begin_hook();                                                         \
        kvp_status_t kvp_ct_s_ = (call);                                                     \
        if (kvp_ct_bad_end_hook)                                                             \
            kvp_ct_bad_end_hook(#call, 1);                                                   \
        ASSERT_MSG(kvp_ct_s_ == (expected), "%s = %s (%d), expected %s", #call,              \
                   kvp_status_name(kvp_ct_s_), (int)kvp_ct_s_, kvp_status_name(expected));   \
        kvp_ct_fixture_check((f), #call);                                                    \
    } while (0)

/* ============================================================ contracts */

/* Open, stats, close; close(NULL) is a no-op. */
static inline void kvp_contract_open_close(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_pool_stats_t s = kvp_ct_stats(pool);
    ASSERT_EQ(s.live, 0);
    ASSERT_EQ(s.live_bytes, 0);
    ASSERT_EQ(s.reserved, 0);
    ASSERT_EQ(s.leased, 0);
    ASSERT_EQ(s.pinned, 0);
    kvp_pool_close(pool);
    kvp_pool_close(NULL);
}

/* Single-key round trips: sizes 1 B .. 1 MiB, key lengths 1 and 512. */
static inline void kvp_contract_put_get(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    size_t big = kvp_ct_objsize(&s0, 8, 4096, 1 << 20);
    size_t sizes[] = {1, 7, 8, 9, 4096, 65536 + 3, big};
    const size_t n = sizeof sizes / sizeof sizes[0];
    kvp_ct_name_t names[sizeof sizes / sizeof sizes[0]];
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        KVP_CT_NAME(&names[i], "put_get/%zu", i);
        kvp_ct_put_new(pool, names[i].k, sizes[i], 1);
        total += sizes[i];
        kvp_ct_get_ok(pool, names[i].k, sizes[i], 1);
        ASSERT_EQ(kvp_ct_exists1(pool, names[i].k), 1);
    }
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.committed - s0.committed, n);
    ASSERT_EQ(s1.live - s0.live, n);
    ASSERT_EQ(s1.live_bytes - s0.live_bytes, total);
    ASSERT_EQ(s1.get_hits - s0.get_hits, n);
    ASSERT_EQ(s1.get_misses - s0.get_misses, 0);
    ASSERT_EQ(s1.put_existed - s0.put_existed, 0);
    ASSERT_EQ(s1.evicted - s0.evicted, 0);
    ASSERT_EQ(s1.leased, 0);
    ASSERT_EQ(s1.reserved, 0);
    ASSERT_GE(s1.used_bytes, total);

    /* Key lengths at the limits: 1 byte and KVP_KEY_MAX bytes. */
    char one = 'x';
    kvp_key_t k1 = {&one, 1};
    char *maxkey = (char *)kvp_ct_xmalloc(KVP_KEY_MAX);
    memset(maxkey, 'M', KVP_KEY_MAX);
    kvp_key_t kmax = {maxkey, KVP_KEY_MAX};
    kvp_ct_put_new(pool, k1, 100, 2);
    kvp_ct_put_new(pool, kmax, 200, 3);
    kvp_ct_get_ok(pool, k1, 100, 2);
    kvp_ct_get_ok(pool, kmax, 200, 3);
    /* A miss. */
    kvp_ct_name_t miss;
    KVP_CT_NAME(&miss, "put_get/missing");
    kvp_ct_get_missing(pool, miss.k);
    ASSERT_EQ(kvp_ct_exists1(pool, miss.k), 0);
    free(maxkey);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    kvp_pool_close(pool);
}

/* Put of an existing key: KVP_OK + EXISTED, stored value unchanged. */
static inline void kvp_contract_put_existing(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t a, b;
    KVP_CT_NAME(&a, "existing/a");
    KVP_CT_NAME(&b, "existing/b");
    kvp_ct_put_new(pool, a.k, 3000, 1);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);

    /* Same key, different size and content: the first value stays. */
    kvp_key_result_t r;
    KVP_CT_ST(kvp_ct_put(pool, a.k, 5000, 2, &r), KVP_OK);
    ASSERT_MSG(r.status == KVP_OK, "put existing: %s", kvp_status_name(r.status));
    ASSERT_MSG(r.flags & KVP_RESULT_EXISTED, "put existing: EXISTED not set (flags %u)", r.flags);
    kvp_ct_get_ok(pool, a.k, 3000, 1);
    /* Same key, same value. */
    KVP_CT_ST(kvp_ct_put(pool, a.k, 3000, 1, &r), KVP_OK);
    ASSERT_EQ(r.status, KVP_OK);
    ASSERT_MSG(r.flags & KVP_RESULT_EXISTED, "put identical: EXISTED not set (flags %u)", r.flags);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.put_existed - s0.put_existed, 2);
    ASSERT_EQ(s1.committed - s0.committed, 0);
    ASSERT_EQ(s1.live - s0.live, 0);
    ASSERT_EQ(s1.live_bytes - s0.live_bytes, 0);

    /* In a batch: [existing, new] -> [OK+EXISTED, OK]. */
    size_t sz[2] = {777, 888};
    void *buf[2];
    kvp_iov_t iov[2];
    kvp_sgl_t sgl[2];
    kvp_key_t keys[2] = {a.k, b.k};
    for (int i = 0; i < 2; i++) {
        buf[i] = kvp_ct_xmalloc(sz[i]);
        kvp_ct_fill(buf[i], sz[i], kvp_ct_seed(keys[i], 5));
        iov[i].base = buf[i];
        iov[i].len = sz[i];
        sgl[i].iov = &iov[i];
        sgl[i].iovcnt = 1;
    }
    kvp_key_result_t res[2];
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_put(pool, keys, sgl, 2, res), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);
    ASSERT_MSG(res[0].flags & KVP_RESULT_EXISTED, "batch put: existing key not flagged");
    ASSERT_EQ(res[1].status, KVP_OK);
    ASSERT_MSG(!(res[1].flags & KVP_RESULT_EXISTED), "batch put: new key flagged EXISTED");
    ASSERT_EQ(res[1].size, 888);
    kvp_ct_get_ok(pool, a.k, 3000, 1);
    kvp_ct_get_ok(pool, b.k, 888, 5);
    kvp_pool_stats_t s2 = kvp_ct_stats(pool);
    ASSERT_EQ(s2.put_existed - s1.put_existed, 1);
    ASSERT_EQ(s2.committed - s1.committed, 1);
    for (int i = 0; i < 2; i++)
        free(buf[i]);
    kvp_pool_close(pool);
}

/* A value split over several slices, read back into slices cut elsewhere. */
static inline void kvp_contract_scatter_gather(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "sgl/a");
    const size_t size = 100000;
    const uint64_t seed = kvp_ct_seed(a.k, 9);
    /* Put from separate allocations: 1, 0, 4095, 7, 3, rest. */
    size_t plen[] = {1, 0, 4095, 7, 3, size - 4106};
    enum { NP = sizeof plen / sizeof plen[0] };
    kvp_iov_t piov[NP];
    size_t off = 0;
    for (int i = 0; i < NP; i++) {
        piov[i].base = kvp_ct_xmalloc(plen[i]);
        piov[i].len = plen[i];
        kvp_ct_fill_at(piov[i].base, plen[i], seed, off);
        off += plen[i];
    }
    kvp_sgl_t psgl = {piov, NP};
    kvp_key_result_t r;
    memset(&r, 0xEE, sizeof r);
    KVP_CT_ST(kvp_pool_put(pool, &a.k, &psgl, 1, &r), KVP_OK);
    ASSERT_EQ(r.status, KVP_OK);
    ASSERT_EQ(r.size, size);
    /* The whole value, contiguous. */
    kvp_ct_get_ok(pool, a.k, size, 9);

    /* Get into slices 3, 0, 50000, 1, rest+1000 (larger than needed). */
    size_t glen[] = {3, 0, 50000, 1, size - 50004 + 1000};
    enum { NG = sizeof glen / sizeof glen[0] };
    kvp_iov_t giov[NG];
    for (int i = 0; i < NG; i++) {
        giov[i].base = kvp_ct_xmalloc(glen[i]);
        giov[i].len = glen[i];
        memset(giov[i].base, 0x5A, glen[i]);
    }
    kvp_sgl_t gsgl = {giov, NG};
    memset(&r, 0xEE, sizeof r);
    KVP_CT_ST(kvp_pool_get(pool, &a.k, &gsgl, 1, &r), KVP_OK);
    ASSERT_EQ(r.status, KVP_OK);
    ASSERT_EQ(r.size, size);
    off = 0;
    for (int i = 0; i < NG; i++) {
        size_t n = glen[i];
        if (off + n > size)
            n = size - off;
        size_t bad = kvp_ct_check_at(giov[i].base, n, seed, off);
        ASSERT_MSG(bad == SIZE_MAX, "gather slice %d (len %zu at value offset %zu): byte %zu differs",
                   i, glen[i], off, bad);
        off += n;
    }
    ASSERT_EQ(off, size);

    /* Many small slices: 100 x 1000 B exactly. */
    uint8_t *flat = (uint8_t *)kvp_ct_xmalloc(size);
    memset(flat, 0, size);
    kvp_iov_t small[100];
    for (int i = 0; i < 100; i++) {
        small[i].base = flat + (size_t)(99 - i) * 1000; /* slices in reverse memory order */
        small[i].len = 1000;
    }
    kvp_sgl_t ssgl = {small, 100};
    memset(&r, 0xEE, sizeof r);
    KVP_CT_ST(kvp_pool_get(pool, &a.k, &ssgl, 1, &r), KVP_OK);
    ASSERT_EQ(r.status, KVP_OK);
    for (int i = 0; i < 100; i++) {
        size_t bad = kvp_ct_check_at(small[i].base, 1000, seed, (uint64_t)i * 1000);
        ASSERT_MSG(bad == SIZE_MAX, "slice %d of 100: byte %zu differs", i, bad);
    }
    free(flat);
    for (int i = 0; i < NP; i++)
        free(piov[i].base);
    for (int i = 0; i < NG; i++)
        free(giov[i].base);
    kvp_pool_close(pool);
}

/* Batches are not all-or-nothing: per-key results. */
static inline void kvp_contract_batch_partial(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t n[4];
    for (int i = 0; i < 4; i++)
        KVP_CT_NAME(&n[i], "partial/%d", i);
    kvp_ct_put_new(pool, n[0].k, 1000, 1);
    kvp_ct_put_new(pool, n[2].k, 3000, 1);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);

    /* get [present, missing, present, missing]: OK, NOT_FOUND, OK, NOT_FOUND. */
    kvp_key_t keys[4] = {n[0].k, n[1].k, n[2].k, n[3].k};
    uint8_t *buf[4];
    kvp_iov_t iov[4];
    kvp_sgl_t sgl[4];
    for (int i = 0; i < 4; i++) {
        buf[i] = (uint8_t *)kvp_ct_xmalloc(4000);
        iov[i].base = buf[i];
        iov[i].len = 4000;
        sgl[i].iov = &iov[i];
        sgl[i].iovcnt = 1;
    }
    kvp_key_result_t res[4];
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_get(pool, keys, sgl, 4, res), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);
    ASSERT_EQ(res[0].size, 1000);
    ASSERT_EQ(res[1].status, KVP_ERR_NOT_FOUND);
    ASSERT_EQ(res[2].status, KVP_OK);
    ASSERT_EQ(res[2].size, 3000);
    ASSERT_EQ(res[3].status, KVP_ERR_NOT_FOUND);
    ASSERT_EQ(kvp_ct_check(buf[0], 1000, kvp_ct_seed(n[0].k, 1)), SIZE_MAX);
    ASSERT_EQ(kvp_ct_check(buf[2], 3000, kvp_ct_seed(n[2].k, 1)), SIZE_MAX);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.get_hits - s0.get_hits, 2);
    ASSERT_EQ(s1.get_misses - s0.get_misses, 2);

    /* put [existing, new, existing, new]. */
    for (int i = 0; i < 4; i++) {
        iov[i].len = 500 + (size_t)i;
        kvp_ct_fill(buf[i], iov[i].len, kvp_ct_seed(keys[i], 2));
    }
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_put(pool, keys, sgl, 4, res), KVP_OK);
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(res[i].status, KVP_OK);
        ASSERT_EQ(!!(res[i].flags & KVP_RESULT_EXISTED), i % 2 == 0);
    }
    kvp_ct_get_ok(pool, n[0].k, 1000, 1);
    kvp_ct_get_ok(pool, n[1].k, 501, 2);
    kvp_ct_get_ok(pool, n[2].k, 3000, 1);
    kvp_ct_get_ok(pool, n[3].k, 503, 2);
    kvp_pool_stats_t s2 = kvp_ct_stats(pool);
    ASSERT_EQ(s2.committed - s1.committed, 2);
    ASSERT_EQ(s2.put_existed - s1.put_existed, 2);

    /* remove [present, missing-now, present]. */
    kvp_ct_name_t gone;
    KVP_CT_NAME(&gone, "partial/never");
    kvp_key_t rk[3] = {n[1].k, gone.k, n[3].k};
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_remove(pool, rk, 3, res), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);
    ASSERT_EQ(res[1].status, KVP_ERR_NOT_FOUND);
    ASSERT_EQ(res[2].status, KVP_OK);
    for (int i = 0; i < 4; i++)
        free(buf[i]);
    kvp_pool_close(pool);
}

/* With the pool full of pinned objects a batch gets per-key NO_SPACE while
 * its other keys are stored. */
static inline void kvp_contract_batch_no_space(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    const size_t obj = kvp_ct_objsize(&s0, 32, 4096, 8u << 20);
    const int max = (int)(4 * (s0.capacity_bytes / obj)) + 16;
    kvp_ct_name_t *names = (kvp_ct_name_t *)kvp_ct_xmalloc(sizeof(kvp_ct_name_t) * (size_t)max);
    int *pinned = (int *)kvp_ct_xmalloc(sizeof(int) * (size_t)max);
    int npinned = 0, full = 0, i;
    for (i = 0; i < max && !full; i++) {
        KVP_CT_NAME(&names[i], "nospace/fill/%d", i);
        kvp_key_result_t r;
        KVP_CT_ST(kvp_ct_put(pool, names[i].k, obj, 1, &r), KVP_OK);
        if (r.status == KVP_ERR_NO_SPACE) {
            full = 1;
            break;
        }
        ASSERT_MSG(r.status == KVP_OK, "fill put %d: %s", i, kvp_status_name(r.status));
        kvp_status_t ps = kvp_ct_pin1(pool, names[i].k, 1);
        ASSERT_MSG(ps == KVP_OK || ps == KVP_ERR_NOT_FOUND, "pin: %s", kvp_status_name(ps));
        if (ps == KVP_OK)
            pinned[npinned++] = i;
    }
    ASSERT_MSG(full, "no KVP_ERR_NO_SPACE after %d puts of %zu B with every object pinned "
               "(capacity %" PRIu64 ", %d pinned)", i, obj, s0.capacity_bytes, npinned);
    ASSERT_MSG(npinned >= 4, "only %d objects could be pinned", npinned);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.pinned - s0.pinned, npinned);
    ASSERT_EQ(s1.put_no_space - s0.put_no_space, 1);

    /* Unpin one object: room for one more `obj`-sized value, never for 4x. */
    ASSERT_EQ(kvp_ct_pin1(pool, names[pinned[0]].k, 0), KVP_OK);
    kvp_ct_name_t huge, small;
    KVP_CT_NAME(&huge, "nospace/huge");
    KVP_CT_NAME(&small, "nospace/small");
    size_t hsz = 4 * obj, ssz = obj;
    uint8_t *hb = (uint8_t *)kvp_ct_xmalloc(hsz), *sb = (uint8_t *)kvp_ct_xmalloc(ssz);
    kvp_ct_fill(hb, hsz, kvp_ct_seed(huge.k, 1));
    kvp_ct_fill(sb, ssz, kvp_ct_seed(small.k, 1));
    kvp_iov_t iov[2] = {{hb, hsz}, {sb, ssz}};
    kvp_sgl_t sgl[2] = {{&iov[0], 1}, {&iov[1], 1}};
    kvp_key_t keys[2] = {huge.k, small.k};
    kvp_key_result_t res[2];
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_put(pool, keys, sgl, 2, res), KVP_OK);
    ASSERT_MSG(res[0].status == KVP_ERR_NO_SPACE, "huge key: %s, expected KVP_ERR_NO_SPACE",
               kvp_status_name(res[0].status));
    ASSERT_MSG(res[1].status == KVP_OK, "small key: %s, expected KVP_OK (one unpinned object "
               "of its size is evictable)", kvp_status_name(res[1].status));
    kvp_pool_stats_t s2 = kvp_ct_stats(pool);
    ASSERT_EQ(s2.put_no_space - s1.put_no_space, 1);
    ASSERT_EQ(s2.committed - s1.committed, 1);
    ASSERT_EQ(kvp_ct_exists1(pool, huge.k), 0);
    kvp_ct_get_ok(pool, small.k, ssz, 1);
    /* Every still-pinned object survived. */
    for (int j = 1; j < npinned; j++)
        kvp_ct_get_ok(pool, names[pinned[j]].k, obj, 1);
    for (int j = 1; j < npinned; j++)
        ASSERT_EQ(kvp_ct_pin1(pool, names[pinned[j]].k, 0), KVP_OK);
    kvp_pool_stats_t s3 = kvp_ct_stats(pool);
    ASSERT_EQ(s3.pinned, s0.pinned);
    free(hb);
    free(sb);
    free(names);
    free(pinned);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    kvp_pool_close(pool);
}

/* exists: per-key flags, no lease, no effect on the get counters. */
static inline void kvp_contract_exists(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t n[5];
    for (int i = 0; i < 5; i++)
        KVP_CT_NAME(&n[i], "exists/%d", i);
    kvp_ct_put_new(pool, n[0].k, 10, 1);
    kvp_ct_put_new(pool, n[2].k, 20000, 1);
    kvp_ct_put_new(pool, n[3].k, 1, 1);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    kvp_key_t keys[5] = {n[0].k, n[1].k, n[2].k, n[3].k, n[4].k};
    uint8_t present[5];
    for (int round = 0; round < 100; round++) {
        memset(present, 0xEE, sizeof present);
        KVP_CT_ST(kvp_pool_exists(pool, keys, 5, present), KVP_OK);
        ASSERT_EQ(present[0], 1);
        ASSERT_EQ(present[1], 0);
        ASSERT_EQ(present[2], 1);
        ASSERT_EQ(present[3], 1);
        ASSERT_EQ(present[4], 0);
        kvp_pool_stats_t s = kvp_ct_stats(pool);
        ASSERT_MSG(s.leased == 0, "stats.leased = %" PRIu64 " after exists (exists must never "
                   "take a lease)", s.leased);
    }
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.get_hits, s0.get_hits);
    ASSERT_EQ(s1.get_misses, s0.get_misses);
    ASSERT_EQ(s1.live, s0.live);
    ASSERT_EQ(s1.committed, s0.committed);
    ASSERT_EQ(s1.leased, 0);
    /* A removed key is no longer present. */
    ASSERT_EQ(kvp_ct_remove1(pool, n[2].k), KVP_OK);
    KVP_CT_ST(kvp_pool_exists(pool, keys, 5, present), KVP_OK);
    ASSERT_EQ(present[2], 0);
    ASSERT_EQ(present[0] + present[3], 2);
    kvp_pool_close(pool);
}

/* prefix: the longest run keys[0..m) that all exist. */
static inline void kvp_contract_prefix(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    enum { N = 1000 };
    kvp_ct_name_t *n = (kvp_ct_name_t *)kvp_ct_xmalloc(sizeof(kvp_ct_name_t) * N);
    kvp_key_t *keys = (kvp_key_t *)kvp_ct_xmalloc(sizeof(kvp_key_t) * N);
    for (int i = 0; i < N; i++) {
        KVP_CT_NAME(&n[i], "prefix/%d", i);
        keys[i] = n[i].k;
    }
    /* Store 0..9 except 3, and 10..N-1 except 500. */
    for (int i = 0; i < N; i++)
        if (i != 3 && i != 500)
            kvp_ct_put_new(pool, keys[i], 1 + (size_t)(i % 64), 1);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    size_t m;
#define KVP_CT_PREFIX(ks, cnt, expect)                                                     \
    do {                                                                                   \
        m = (size_t)-1;                                                                    \
        KVP_CT_ST(kvp_pool_prefix(pool, (ks), (cnt), &m), KVP_OK);                         \
        ASSERT_MSG(m == (size_t)(expect), "prefix of %zu keys from %.*s: %zu, expected %zu", \
                   (size_t)(cnt), (int)(ks)[0].len, (const char *)(ks)[0].data, m,         \
                   (size_t)(expect));                                                      \
    } while (0)
    KVP_CT_PREFIX(keys, 6, 3);         /* stops at the missing 3 */
    KVP_CT_PREFIX(keys, 3, 3);         /* all present */
    KVP_CT_PREFIX(keys, 1, 1);
    KVP_CT_PREFIX(keys + 3, 5, 0);     /* first key missing */
    KVP_CT_PREFIX(keys + 3, 1, 0);
    KVP_CT_PREFIX(keys + 4, 496, 496); /* 4..499 */
    KVP_CT_PREFIX(keys + 4, 497, 496); /* 4..500: 500 missing */
    KVP_CT_PREFIX(keys + 4, N - 4, 496);
    KVP_CT_PREFIX(keys + 501, N - 501, N - 501);
    /* Keys after the first miss do not count even if present. */
    kvp_key_t mixed[4] = {keys[0], keys[3], keys[1], keys[2]};
    KVP_CT_PREFIX(mixed, 4, 1);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.leased, 0);
    ASSERT_EQ(s1.get_hits, s0.get_hits);
    ASSERT_EQ(s1.get_misses, s0.get_misses);
    ASSERT_EQ(s1.live, s0.live);
    /* After a remove the run ends there. */
    ASSERT_EQ(kvp_ct_remove1(pool, keys[1]), KVP_OK);
    KVP_CT_PREFIX(keys, 3, 1);
#undef KVP_CT_PREFIX
    free(n);
    free(keys);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    kvp_pool_close(pool);
}

/* remove: NOT_FOUND afterwards, counted under stats.removed, key reusable. */
static inline void kvp_contract_remove(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t a, b, c;
    KVP_CT_NAME(&a, "remove/a");
    KVP_CT_NAME(&b, "remove/b");
    KVP_CT_NAME(&c, "remove/c");
    kvp_ct_put_new(pool, a.k, 10000, 1);
    kvp_ct_put_new(pool, b.k, 20000, 1);
    kvp_ct_put_new(pool, c.k, 30000, 1);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    kvp_key_t keys[2] = {a.k, b.k};
    kvp_key_result_t res[2];
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_remove(pool, keys, 2, res), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);
    ASSERT_EQ(res[1].status, KVP_OK);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.removed - s0.removed, 2);
    ASSERT_EQ(s0.live - s1.live, 2);
    ASSERT_EQ(s0.live_bytes - s1.live_bytes, 30000);
    ASSERT_EQ(s1.committed, s0.committed);
    kvp_ct_get_missing(pool, a.k);
    kvp_ct_get_missing(pool, b.k);
    ASSERT_EQ(kvp_ct_exists1(pool, a.k), 0);
    size_t m = 99;
    KVP_CT_ST(kvp_pool_prefix(pool, &a.k, 1, &m), KVP_OK);
    ASSERT_EQ(m, 0);
    ASSERT_EQ(kvp_ct_remove1(pool, a.k), KVP_ERR_NOT_FOUND);
    kvp_ct_get_ok(pool, c.k, 30000, 1);
    /* The space comes back (possibly after deferred frees). */
    kvp_pool_stats_t s2;
    KVP_CT_POLL_STATS(pool, s2, s2.used_bytes + 30000 <= s0.used_bytes);
    ASSERT_MSG(s2.used_bytes + 30000 <= s0.used_bytes,
               "used_bytes %" PRIu64 " -> %" PRIu64 " after removing 30000 B", s0.used_bytes,
               s2.used_bytes);
    /* The key can be stored again: a new object, new content. */
    kvp_ct_put_new(pool, a.k, 123, 2);
    kvp_ct_get_ok(pool, a.k, 123, 2);
    kvp_pool_stats_t s3 = kvp_ct_stats(pool);
    ASSERT_EQ(s3.committed - s0.committed, 1);
    ASSERT_EQ(s3.removed - s0.removed, 2);
    kvp_pool_close(pool);
}

/* remove_all: everything goes (pinned too), counted under stats.reset. */
static inline void kvp_contract_remove_all(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    enum { N = 40 };
    kvp_ct_name_t n[N];
    for (int i = 0; i < N; i++) {
        KVP_CT_NAME(&n[i], "remove_all/%d", i);
        kvp_ct_put_new(pool, n[i].k, 100 + (size_t)i * 100, 1);
    }
    ASSERT_EQ(kvp_ct_pin1(pool, n[0].k, 1), KVP_OK);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    ASSERT_EQ(s0.live, N);
    uint64_t removed = 12345;
    KVP_CT_ST(kvp_pool_remove_all(pool, &removed), KVP_OK);
    ASSERT_EQ(removed, N);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.reset - s0.reset, N);
    ASSERT_EQ(s1.live, 0);
    ASSERT_EQ(s1.live_bytes, 0);
    ASSERT_EQ(s1.pinned, 0);
    ASSERT_EQ(s1.removed, s0.removed);
    ASSERT_EQ(s1.evicted, s0.evicted);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(kvp_ct_exists1(pool, n[i].k), 0);
        kvp_ct_get_missing(pool, n[i].k);
    }
    kvp_pool_stats_t s2;
    KVP_CT_POLL_STATS(pool, s2, s2.used_bytes == 0);
    ASSERT_MSG(s2.used_bytes == 0, "used_bytes %" PRIu64 " after remove_all", s2.used_bytes);
    /* Empty pool; NULL out-pointer allowed. */
    removed = 12345;
    KVP_CT_ST(kvp_pool_remove_all(pool, &removed), KVP_OK);
    ASSERT_EQ(removed, 0);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    /* Keys are new again. */
    kvp_ct_put_new(pool, n[5].k, 55, 2);
    kvp_ct_get_ok(pool, n[5].k, 55, 2);
    kvp_pool_stats_t s3 = kvp_ct_stats(pool);
    ASSERT_EQ(s3.reset - s0.reset, N);
    ASSERT_EQ(s3.live, 1);
    KVP_CT_ST(kvp_pool_remove_all(pool, &removed), KVP_OK);
    ASSERT_EQ(removed, 1);
    kvp_pool_close(pool);
}

/* Pinned objects survive eviction pressure; unpinned they become evictable. */
static inline void kvp_contract_pin(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    const size_t obj = kvp_ct_objsize(&s0, 64, 4096, 4u << 20);
    enum { NP = 8 };
    kvp_ct_name_t p[NP], miss;
    for (int i = 0; i < NP; i++) {
        KVP_CT_NAME(&p[i], "pin/keep/%d", i);
        kvp_ct_put_new(pool, p[i].k, obj, 1);
    }
    kvp_key_t keys[NP + 1];
    for (int i = 0; i < NP; i++)
        keys[i] = p[i].k;
    KVP_CT_NAME(&miss, "pin/missing");
    keys[NP] = miss.k;
    kvp_key_result_t res[NP + 1];
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_pin(pool, keys, NP + 1, 1, res), KVP_OK);
    for (int i = 0; i < NP; i++)
        ASSERT_EQ(res[i].status, KVP_OK);
    ASSERT_EQ(res[NP].status, KVP_ERR_NOT_FOUND);
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    ASSERT_EQ(s1.pinned - s0.pinned, NP);

    /* Three capacities' worth of other objects. */
    const int fill = (int)(3 * (s0.capacity_bytes / obj));
    kvp_ct_name_t t;
    for (int i = 0; i < fill; i++) {
        KVP_CT_NAME(&t, "pin/fill1/%d", i);
        kvp_key_result_t r;
        KVP_CT_ST(kvp_ct_put(pool, t.k, obj, 1, &r), KVP_OK);
        ASSERT_MSG(r.status == KVP_OK, "fill put %d: %s", i, kvp_status_name(r.status));
    }
    kvp_pool_stats_t s2 = kvp_ct_stats(pool);
    ASSERT_MSG(s2.evicted > s1.evicted, "no eviction after %d puts of %zu B into %" PRIu64 " B",
               fill, obj, s0.capacity_bytes);
    for (int i = 0; i < NP; i++)
        kvp_ct_get_ok(pool, p[i].k, obj, 1);
    ASSERT_EQ(s2.pinned - s0.pinned, NP);

    /* Unpin: evictable again. */
    memset(res, 0xEE, sizeof res);
    KVP_CT_ST(kvp_pool_pin(pool, keys, NP, 0, res), KVP_OK);
    for (int i = 0; i < NP; i++)
        ASSERT_EQ(res[i].status, KVP_OK);
    kvp_pool_stats_t s3 = kvp_ct_stats(pool);
    ASSERT_EQ(s3.pinned, s0.pinned);
    for (int i = 0; i < 4 * fill / 3; i++) {
        KVP_CT_NAME(&t, "pin/fill2/%d", i);
        kvp_key_result_t r;
        KVP_CT_ST(kvp_ct_put(pool, t.k, obj, 1, &r), KVP_OK);
        ASSERT_MSG(r.status == KVP_OK, "fill put %d: %s", i, kvp_status_name(r.status));
    }
    int gone = 0;
    for (int i = 0; i < NP; i++)
        gone += !kvp_ct_exists1(pool, p[i].k);
    ASSERT_MSG(gone >= NP / 2, "only %d of %d unpinned objects evicted after 4 capacities of "
               "new objects", gone, NP);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    kvp_pool_close(pool);
}

/* Eviction starts past high_watermark and frees down to low_watermark. */
static inline void kvp_contract_eviction_watermarks(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    const size_t obj = kvp_ct_objsize(&s0, 64, 4096, 4u << 20);
    const int max = (int)(3 * (s0.capacity_bytes / obj));
    ASSERT_LT(s0.low_watermark_bytes, s0.high_watermark_bytes);
    kvp_ct_name_t t;
    kvp_pool_stats_t prev = s0, s;
    uint64_t alloc_per_obj = 0, min_used_after_evict = UINT64_MAX, max_used = 0;
    int first_evict_at = -1;
    for (int i = 0; i < max; i++) {
        KVP_CT_NAME(&t, "evict/%d", i);
        kvp_key_result_t r;
        KVP_CT_ST(kvp_ct_put(pool, t.k, obj, 1, &r), KVP_OK);
        ASSERT_MSG(r.status == KVP_OK, "put %d: %s", i, kvp_status_name(r.status));
        s = kvp_ct_stats(pool);
        ASSERT_EQ(s.committed - prev.committed, 1);
        if (i == 0)
            alloc_per_obj = s.used_bytes - prev.used_bytes;
        if (s.used_bytes > max_used)
            max_used = s.used_bytes;
        if (s.evicted > s0.evicted) {
            if (first_evict_at < 0) {
                first_evict_at = i;
                /* Nothing was evicted before usage passed the high watermark. */
                ASSERT_MSG(prev.used_bytes + alloc_per_obj > s0.high_watermark_bytes,
                           "eviction at put %d with used_bytes %" PRIu64 " + %" PRIu64
                           " <= high watermark %" PRIu64, i, prev.used_bytes, alloc_per_obj,
                           s0.high_watermark_bytes);
            }
            if (s.used_bytes < min_used_after_evict)
                min_used_after_evict = s.used_bytes;
        }
        /* The newest object is never the victim. */
        ASSERT_MSG(kvp_ct_exists1(pool, t.k), "object %d evicted right after its put", i);
        prev = s;
    }
    ASSERT_MSG(first_evict_at >= 0, "no eviction after %d puts of %zu B (capacity %" PRIu64 ")",
               max, obj, s0.capacity_bytes);
    ASSERT_GT(alloc_per_obj, 0);
    /* Give a background evictor time, then: usage below the high mark, and
     * at some point down to (about) the low mark. */
    KVP_CT_POLL_STATS(pool, s, s.used_bytes <= s.high_watermark_bytes);
    ASSERT_MSG(s.used_bytes <= s.high_watermark_bytes, "used_bytes %" PRIu64
               " stays above high watermark %" PRIu64, s.used_bytes, s.high_watermark_bytes);
    if (s.used_bytes < min_used_after_evict)
        min_used_after_evict = s.used_bytes;
    ASSERT_MSG(min_used_after_evict <= s.low_watermark_bytes + 2 * alloc_per_obj,
               "eviction never brought used_bytes near the low watermark: min %" PRIu64
               ", low %" PRIu64 ", object %" PRIu64 " B", min_used_after_evict,
               s.low_watermark_bytes, alloc_per_obj);
    /* ...and does not evict far below it. */
    ASSERT_MSG(s.used_bytes + 3 * alloc_per_obj >= s.low_watermark_bytes,
               "used_bytes %" PRIu64 " far below low watermark %" PRIu64, s.used_bytes,
               s.low_watermark_bytes);
    uint64_t ev = s.evicted - s0.evicted;
    ASSERT_EQ(s.evicted_bytes - s0.evicted_bytes, ev * obj);
    ASSERT_EQ(s.live + ev, (uint64_t)max + s0.live);
    ASSERT_EQ(s.live_bytes, s.live * obj);
    kvp_pool_close(pool);
}

/* The async contract through kvp_pool_submit: completes now (callback never
 * fires), fails now (callback never fires) or INPROGRESS + exactly one call. */
typedef struct kvp_ct_cb {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fired;
    kvp_status_t status;
} kvp_ct_cb_t;

static inline void kvp_ct_cb_fn(void *arg, kvp_status_t status)
{
    kvp_ct_cb_t *c = (kvp_ct_cb_t *)arg;
    pthread_mutex_lock(&c->mu);
    c->fired++;
    c->status = status;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Submits op and returns its final status; checks the callback rule. */
static inline kvp_status_t kvp_ct_submit_wait(kvp_pool_t *pool, kvp_op_t *op)
{
    kvp_ct_cb_t c;
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    c.fired = 0;
    c.status = KVP_OK;
    op->cb = kvp_ct_cb_fn;
    op->cb_arg = &c;
    kvp_status_t st = kvp_pool_submit(pool, op);
    int async = st == KVP_INPROGRESS;
    if (async) {
        pthread_mutex_lock(&c.mu);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 30;
        while (!c.fired)
            if (pthread_cond_timedwait(&c.cv, &c.mu, &dl) == ETIMEDOUT)
                break;
        pthread_mutex_unlock(&c.mu);
        ASSERT_MSG(c.fired == 1, "submit returned KVP_INPROGRESS, callback fired %d times in 30 s",
                   c.fired);
        st = c.status;
        ASSERT_NE(st, KVP_INPROGRESS);
    }
    kvp_ct_sleep_ms(2);
    pthread_mutex_lock(&c.mu);
    int fired = c.fired;
    pthread_mutex_unlock(&c.mu);
    ASSERT_MSG(fired == async, "submit %s: callback fired %d times, expected %d",
               async ? "returned KVP_INPROGRESS" : "completed or failed now", fired, async);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    return st;
}

static inline void kvp_contract_submit(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t a, b;
    KVP_CT_NAME(&a, "submit/a");
    KVP_CT_NAME(&b, "submit/b");
    kvp_key_t keys[2] = {a.k, b.k};
    uint8_t src[2][300], dst[2][400];
    kvp_ct_fill(src[0], 300, kvp_ct_seed(a.k, 1));
    kvp_ct_fill(src[1], 300, kvp_ct_seed(b.k, 1));
    kvp_iov_t piov[2] = {{src[0], 300}, {src[1], 300}};
    kvp_iov_t giov[2] = {{dst[0], 400}, {dst[1], 400}};
    kvp_sgl_t psgl[2] = {{&piov[0], 1}, {&piov[1], 1}};
    kvp_sgl_t gsgl[2] = {{&giov[0], 1}, {&giov[1], 1}};
    kvp_key_result_t res[2];
    uint8_t present[2];
    size_t plen = 99;
    uint64_t removed = 99;
    kvp_op_t op;

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_PUT, op.keys = keys, op.n = 2, op.values = psgl, op.results = res;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);
    ASSERT_EQ(res[1].status, KVP_OK);

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_EXISTS, op.keys = keys, op.n = 2, op.present = present;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(present[0] + present[1], 2);

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_PREFIX, op.keys = keys, op.n = 2, op.prefix_len = &plen;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(plen, 2);

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_GET, op.keys = keys, op.n = 2, op.values = gsgl, op.results = res;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(res[i].status, KVP_OK);
        ASSERT_EQ(res[i].size, 300);
        ASSERT_MEM_EQ(dst[i], src[i], 300);
    }

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_PIN, op.keys = keys, op.n = 1, op.results = res;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);
    op.type = KVP_OP_UNPIN;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_REMOVE, op.keys = keys + 1, op.n = 1, op.results = res;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(res[0].status, KVP_OK);

    memset(&op, 0, sizeof op);
    op.type = KVP_OP_REMOVE_ALL, op.removed = &removed;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_OK);
    ASSERT_EQ(removed, 1);

    /* Fails now: the callback never fires (checked inside submit_wait). */
    memset(&op, 0, sizeof op);
    op.type = KVP_OP_EXISTS, op.keys = NULL, op.n = 1, op.present = present;
    KVP_CT_ST(kvp_ct_submit_wait(pool, &op), KVP_ERR_NULL_POINTER);
    memset(&op, 0, sizeof op);
    op.type = (kvp_op_type_t)99, op.keys = keys, op.n = 1, op.results = res;
    kvp_status_t st = kvp_ct_submit_wait(pool, &op);
    ASSERT_MSG(st == KVP_ERR_INVALID_ARG || st == KVP_ERR_UNSUPPORTED,
               "submit of op type 99: %s", kvp_status_name(st));
    kvp_pool_close(pool);
}

/* register/deregister a buffer and use it. */
static inline void kvp_contract_register(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    const size_t len = 1 << 20;
    uint8_t *buf = (uint8_t *)kvp_ct_xmalloc(len);
    KVP_CT_ST(kvp_pool_register(pool, buf, len), KVP_OK);
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "register/a");
    kvp_ct_fill(buf, 5000, kvp_ct_seed(a.k, 1));
    kvp_iov_t iov = {buf, 5000};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    KVP_CT_ST(kvp_pool_put(pool, &a.k, &sgl, 1, &r), KVP_OK);
    ASSERT_EQ(r.status, KVP_OK);
    iov.base = buf + 4096;
    KVP_CT_ST(kvp_pool_get(pool, &a.k, &sgl, 1, &r), KVP_OK);
    ASSERT_EQ(r.status, KVP_OK);
    ASSERT_EQ(kvp_ct_check(buf + 4096, 5000, kvp_ct_seed(a.k, 1)), SIZE_MAX);
    KVP_CT_ST(kvp_pool_deregister(pool, buf), KVP_OK);
    free(buf);
    kvp_pool_close(pool);
}

/* Keys are arbitrary bytes: NULs, 0xff, keys that are prefixes of others. */
static inline void kvp_contract_keys_binary(const char *uri)
{
    kvp_pool_t *pool = kvp_ct_open(uri);
    static const char z[4] = {0, 0, 0, 0};
    char *ff = (char *)kvp_ct_xmalloc(KVP_KEY_MAX);
    char *ff2 = (char *)kvp_ct_xmalloc(KVP_KEY_MAX);
    memset(ff, 0xff, KVP_KEY_MAX);
    memset(ff2, 0xff, KVP_KEY_MAX);
    ff2[KVP_KEY_MAX - 1] = (char)0xfe;
    kvp_key_t keys[] = {
        {"a", 1}, {"a\0", 2}, {"ab", 2}, {"aba", 3}, {z, 1}, {z, 2}, {z, 4},
        {ff, 1}, {ff, KVP_KEY_MAX - 1}, {ff, KVP_KEY_MAX}, {ff2, KVP_KEY_MAX},
    };
    const size_t n = sizeof keys / sizeof keys[0];
    for (size_t i = 0; i < n; i++)
        kvp_ct_put_new(pool, keys[i], 10 + i, i + 1);
    for (size_t i = 0; i < n; i++)
        kvp_ct_get_ok(pool, keys[i], 10 + i, i + 1);
    size_t m = 0;
    KVP_CT_ST(kvp_pool_prefix(pool, keys, n, &m), KVP_OK);
    ASSERT_EQ(m, n);
    ASSERT_EQ(kvp_ct_remove1(pool, keys[5]), KVP_OK);
    ASSERT_EQ(kvp_ct_exists1(pool, keys[4]), 1);
    ASSERT_EQ(kvp_ct_exists1(pool, keys[5]), 0);
    ASSERT_EQ(kvp_ct_exists1(pool, keys[6]), 1);
    free(ff);
    free(ff2);
    KVP_CT_ST(kvp_pool_remove_all(pool, NULL), KVP_OK);
    kvp_pool_close(pool);
}

/* ----------------------------------------------------- contracts: bad input */

/* Builds a one-slice sgl over a fresh pattern buffer for key k. */
typedef struct kvp_ct_val {
    void *buf;
    kvp_iov_t iov;
    kvp_sgl_t sgl;
} kvp_ct_val_t;

static inline void kvp_ct_val_init(kvp_ct_val_t *v, kvp_key_t k, size_t size, uint64_t gen)
{
    v->buf = kvp_ct_xmalloc(size);
    kvp_ct_fill(v->buf, size, kvp_ct_seed(k, gen));
    v->iov.base = v->buf;
    v->iov.len = size;
    v->sgl.iov = &v->iov;
    v->sgl.iovcnt = 1;
}

/* Runs each data operation on batch {good, bad}: all must fail with `want`.
 * keys[0] is a fresh key, keys[1] the bad one. */
static inline void kvp_ct_bad_all_ops(kvp_ct_fixture_t *f, const kvp_key_t keys[2],
                                      kvp_status_t want)
{
    kvp_ct_val_t v[2];
    kvp_ct_val_init(&v[0], keys[0], 100, 1);
    kvp_ct_val_init(&v[1], keys[0], 100, 1);
    kvp_sgl_t sgl[2] = {v[0].sgl, v[1].sgl};
    kvp_key_result_t res[2];
    uint8_t present[2];
    size_t m;
    KVP_CT_BAD(f, want, kvp_pool_put(f->pool, keys, sgl, 2, res));
    ASSERT_EQ(kvp_ct_exists1(f->pool, keys[0]), 0);
    KVP_CT_BAD(f, want, kvp_pool_get(f->pool, keys, sgl, 2, res));
    KVP_CT_BAD(f, want, kvp_pool_exists(f->pool, keys, 2, present));
    KVP_CT_BAD(f, want, kvp_pool_prefix(f->pool, keys, 2, &m));
    KVP_CT_BAD(f, want, kvp_pool_remove(f->pool, keys, 2, res));
    KVP_CT_BAD(f, want, kvp_pool_pin(f->pool, keys, 2, 1, res));
    KVP_CT_BAD(f, want, kvp_pool_pin(f->pool, keys, 2, 0, res));
    /* Bad key in first position, an existing key second. */
    kvp_key_t rev[2] = {keys[1], f->keep[0].k};
    KVP_CT_BAD(f, want, kvp_pool_put(f->pool, rev, sgl, 2, res));
    KVP_CT_BAD(f, want, kvp_pool_remove(f->pool, rev, 2, res));
    KVP_CT_BAD(f, want, kvp_pool_exists(f->pool, rev, 2, present));
    KVP_CT_BAD(f, want, kvp_pool_prefix(f->pool, rev, 2, &m));
    free(v[0].buf);
    free(v[1].buf);
}

static inline void kvp_contract_bad_key_empty(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t good;
    KVP_CT_NAME(&good, "bad/good");
    kvp_key_t keys[2] = {good.k, {"x", 0}};
    kvp_ct_bad_all_ops(&f, keys, KVP_ERR_KEY_LENGTH);
    kvp_ct_fixture_close(&f);
}

static inline void kvp_contract_bad_key_too_long(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    char *longkey = (char *)kvp_ct_xmalloc(KVP_KEY_MAX + 1);
    memset(longkey, 'L', KVP_KEY_MAX + 1);
    kvp_ct_name_t good;
    KVP_CT_NAME(&good, "bad/good");
    kvp_key_t keys[2] = {good.k, {longkey, KVP_KEY_MAX + 1}};
    kvp_ct_bad_all_ops(&f, keys, KVP_ERR_KEY_LENGTH);
    /* A length far past the buffer: must be refused before it is read. */
    keys[1].len = UINT32_MAX;
    kvp_ct_bad_all_ops(&f, keys, KVP_ERR_KEY_LENGTH);
    free(longkey);
    kvp_ct_fixture_close(&f);
}

static inline void kvp_contract_bad_value_empty(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t a, b;
    KVP_CT_NAME(&a, "bad/a");
    KVP_CT_NAME(&b, "bad/b");
    kvp_key_t keys[2] = {a.k, b.k};
    kvp_ct_val_t v;
    kvp_ct_val_init(&v, a.k, 100, 1);
    kvp_key_result_t res[2];
    char dummy[8] = {0};
    kvp_iov_t zero[2] = {{dummy, 0}, {dummy, 0}};
    /* No slices; only zero-length slices; in second position of a batch. */
    kvp_sgl_t sgl[2] = {{zero, 0}, v.sgl};
    KVP_CT_BAD(&f, KVP_ERR_VALUE_EMPTY, kvp_pool_put(f.pool, keys, sgl, 1, res));
    sgl[0].iovcnt = 2;
    KVP_CT_BAD(&f, KVP_ERR_VALUE_EMPTY, kvp_pool_put(f.pool, keys, sgl, 1, res));
    kvp_sgl_t sgl2[2] = {v.sgl, {zero, 2}};
    KVP_CT_BAD(&f, KVP_ERR_VALUE_EMPTY, kvp_pool_put(f.pool, keys, sgl2, 2, res));
    ASSERT_EQ(kvp_ct_exists1(f.pool, a.k), 0);
    free(v.buf);
    kvp_ct_fixture_close(&f);
}

static inline void kvp_contract_bad_value_too_large(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t a, b;
    KVP_CT_NAME(&a, "bad/a");
    KVP_CT_NAME(&b, "bad/b");
    kvp_key_t keys[2] = {a.k, b.k};
    kvp_ct_val_t v;
    kvp_ct_val_init(&v, a.k, 100, 1);
    kvp_key_result_t res[2];
    /* capacity + 1 bytes, made of 1 MiB slices that all point at one buffer. */
    const size_t chunk = 1 << 20;
    uint8_t *one = (uint8_t *)kvp_ct_xmalloc(chunk);
    memset(one, 0x3C, chunk);
    uint64_t cap = f.before.capacity_bytes;
    size_t nio = (size_t)(cap / chunk) + 1;
    kvp_iov_t *iov = (kvp_iov_t *)kvp_ct_xmalloc(sizeof(kvp_iov_t) * (nio + 1));
    for (size_t i = 0; i < nio; i++)
        iov[i].base = one, iov[i].len = chunk;
    iov[nio - 1].len = (size_t)(cap - (uint64_t)(nio - 1) * chunk) + 1;
    kvp_sgl_t big = {iov, (uint32_t)nio};
    kvp_sgl_t sgl[2] = {v.sgl, big};
    KVP_CT_BAD(&f, KVP_ERR_VALUE_TOO_LARGE, kvp_pool_put(f.pool, keys + 1, &big, 1, res));
    KVP_CT_BAD(&f, KVP_ERR_VALUE_TOO_LARGE, kvp_pool_put(f.pool, keys, sgl, 2, res));
    ASSERT_EQ(kvp_ct_exists1(f.pool, a.k), 0);
    ASSERT_EQ(kvp_ct_exists1(f.pool, b.k), 0);
    /* Past KVP_VALUE_MAX (whatever the capacity). */
    size_t nmax = (size_t)(KVP_VALUE_MAX / chunk) + 1;
    kvp_iov_t *iov2 = (kvp_iov_t *)kvp_ct_xmalloc(sizeof(kvp_iov_t) * nmax);
    for (size_t i = 0; i < nmax; i++)
        iov2[i].base = one, iov2[i].len = chunk;
    iov2[nmax - 1].len = 1;
    kvp_sgl_t huge = {iov2, (uint32_t)nmax};
    KVP_CT_BAD(&f, KVP_ERR_VALUE_TOO_LARGE, kvp_pool_put(f.pool, keys + 1, &huge, 1, res));
    free(iov);
    free(iov2);
    free(one);
    free(v.buf);
    kvp_ct_fixture_close(&f);
}

/* Slice lengths whose sum wraps around 2^64: refused as too large, never
 * summed into a small value (put) or a small capacity (get). */
static inline void kvp_contract_bad_value_length_overflow(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "bad/wrap");
    kvp_key_result_t res[1];
    uint8_t one[64];
    memset(one, 0x3C, sizeof one);
    kvp_iov_t wrap[2] = {{one, SIZE_MAX}, {one, 2}}; /* sums to 1 */
    kvp_sgl_t wsgl = {wrap, 2};
    KVP_CT_BAD(&f, KVP_ERR_VALUE_TOO_LARGE, kvp_pool_put(f.pool, &a.k, &wsgl, 1, res));
    ASSERT_EQ(kvp_ct_exists1(f.pool, a.k), 0);
    kvp_iov_t wrap3[3] = {{one, SIZE_MAX / 2 + 1}, {one, SIZE_MAX / 2 + 1}, {one, 16}};
    kvp_sgl_t wsgl3 = {wrap3, 3}; /* sums to 16 */
    KVP_CT_BAD(&f, KVP_ERR_VALUE_TOO_LARGE, kvp_pool_put(f.pool, &a.k, &wsgl3, 1, res));
    ASSERT_EQ(kvp_ct_exists1(f.pool, a.k), 0);
    kvp_ct_fixture_close(&f);
}

static inline void kvp_contract_bad_null_buffer(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "bad/a");
    kvp_key_t keys[2] = {a.k, f.keep[1].k};
    kvp_ct_val_t v[2];
    kvp_ct_val_init(&v[0], a.k, 100, 1);
    kvp_ct_val_init(&v[1], a.k, 8000, 1);
    kvp_sgl_t sgl[2] = {v[0].sgl, v[1].sgl};
    kvp_key_result_t res[2];
    uint8_t present[2];
    size_t m;
    kvp_pool_stats_t st;
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(NULL, keys, sgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(NULL, keys, sgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_exists(NULL, keys, 2, present));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_prefix(NULL, keys, 2, &m));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_remove(NULL, keys, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_pin(NULL, keys, 2, 1, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_remove_all(NULL, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_stats(NULL, &st));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_stats(f.pool, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_submit(f.pool, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_submit(NULL, NULL));
    /* NULL arrays. */
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(f.pool, NULL, sgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(f.pool, keys, NULL, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(f.pool, keys, sgl, 2, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(f.pool, NULL, sgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(f.pool, keys, NULL, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(f.pool, keys, sgl, 2, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_exists(f.pool, NULL, 2, present));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_exists(f.pool, keys, 2, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_prefix(f.pool, NULL, 2, &m));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_prefix(f.pool, keys, 2, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_remove(f.pool, NULL, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_remove(f.pool, keys, 2, NULL));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_pin(f.pool, NULL, 2, 1, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_pin(f.pool, keys, 2, 1, NULL));
    /* A key with NULL bytes. */
    kvp_key_t nk[2] = {a.k, {NULL, 5}};
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(f.pool, nk, sgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(f.pool, nk, sgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_exists(f.pool, nk, 2, present));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_prefix(f.pool, nk, 2, &m));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_remove(f.pool, nk, 2, res));
    /* An sgl with a NULL slice array, a slice with a NULL base. */
    kvp_sgl_t nsgl[2] = {v[0].sgl, {NULL, 1}};
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(f.pool, keys, nsgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(f.pool, keys, nsgl, 2, res));
    kvp_iov_t nb[2] = {{v[1].buf, 10}, {NULL, 100}};
    kvp_sgl_t bsgl[2] = {v[0].sgl, {nb, 2}};
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_put(f.pool, keys, bsgl, 2, res));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_get(f.pool, keys, bsgl, 2, res));
    ASSERT_EQ(kvp_ct_exists1(f.pool, a.k), 0);
    /* register. */
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_register(f.pool, NULL, 100));
    KVP_CT_BAD(&f, KVP_ERR_NULL_POINTER, kvp_pool_register(NULL, v[0].buf, 100));
    free(v[0].buf);
    free(v[1].buf);
    kvp_ct_fixture_close(&f);
}

/* A get destination shorter than the value.  pool.h says both "a short
 * buffer fails the whole call" (batch validation) and "GET: per-key
 * KVP_ERR_BUFFER_TOO_SMALL, nothing copied, size = length needed"; either is
 * accepted, but whichever it is must be complete and change nothing else. */
static inline void kvp_contract_bad_short_buffer(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    const size_t need = f.size[2]; /* 70000 */
    uint8_t *b0 = (uint8_t *)kvp_ct_xmalloc(need), *b1 = (uint8_t *)kvp_ct_xmalloc(need);
    for (int form = 0; form < 3; form++) {
        /* 0: one slice of need-1; 1: three slices summing to need-1;
         * 2: batch {keep[1] with a big buffer, keep[2] short}. */
        kvp_iov_t iov[3];
        kvp_sgl_t sgl[2];
        kvp_key_t keys[2];
        size_t n;
        memset(b0, 0x77, need);
        memset(b1, 0x77, need);
        if (form == 0) {
            iov[0].base = b0, iov[0].len = need - 1;
            sgl[0].iov = iov, sgl[0].iovcnt = 1;
            keys[0] = f.keep[2].k;
            n = 1;
        } else if (form == 1) {
            iov[0].base = b0, iov[0].len = 1000;
            iov[1].base = b0 + 2000, iov[1].len = 0;
            iov[2].base = b1, iov[2].len = need - 1 - 1000;
            sgl[0].iov = iov, sgl[0].iovcnt = 3;
            keys[0] = f.keep[2].k;
            n = 1;
        } else {
            iov[0].base = b0, iov[0].len = need;
            iov[1].base = b1, iov[1].len = need - 1;
            sgl[0].iov = &iov[0], sgl[0].iovcnt = 1;
            sgl[1].iov = &iov[1], sgl[1].iovcnt = 1;
            keys[0] = f.keep[1].k;
            keys[1] = f.keep[2].k;
            n = 2;
        }
        kvp_key_result_t res[2];
        memset(res, 0xEE, sizeof res);
        if (kvp_ct_bad_begin_hook)
            kvp_ct_bad_begin_hook();
        kvp_status_t st = kvp_pool_get(f.pool, keys, sgl, n, res);
        if (kvp_ct_bad_end_hook)
            kvp_ct_bad_end_hook("kvp_pool_get(short buffer)", st != KVP_OK);
        kvp_pool_stats_t now = kvp_ct_stats(f.pool);
        if (st == KVP_ERR_BUFFER_TOO_SMALL) {
            /* Whole call refused: nothing changed, nothing copied. */
            kvp_ct_stats_equal(&f.before, &now, "get with a short buffer");
            for (size_t i = 0; i < need; i++)
                ASSERT_MSG(b0[i] == 0x77 && b1[i] == 0x77, "form %d: refused get wrote byte %zu",
                           form, i);
        } else {
            ASSERT_MSG(st == KVP_OK, "form %d: get with short buffer returned %s", form,
                       kvp_status_name(st));
            size_t bad = n - 1;
            ASSERT_MSG(res[bad].status == KVP_ERR_BUFFER_TOO_SMALL,
                       "form %d: short key result %s, expected KVP_ERR_BUFFER_TOO_SMALL", form,
                       kvp_status_name(res[bad].status));
            ASSERT_EQ(res[bad].size, need);
            uint8_t *sb = form == 2 ? b1 : b0;
            for (size_t i = 0; i < need; i++)
                ASSERT_MSG(sb[i] == 0x77 && (form != 1 || b1[i] == 0x77),
                           "form %d: byte %zu written for a key reported too small", form, i);
            if (form == 2) {
                ASSERT_EQ(res[0].status, KVP_OK);
                ASSERT_EQ(res[0].size, f.size[1]);
                ASSERT_EQ(kvp_ct_check(b0, f.size[1], kvp_ct_seed(f.keep[1].k, 1)), SIZE_MAX);
            }
            ASSERT_EQ(now.committed, f.before.committed);
            ASSERT_EQ(now.live, f.before.live);
            ASSERT_EQ(now.live_bytes, f.before.live_bytes);
            ASSERT_EQ(now.leased, 0);
            f.before = now; /* get counters may have moved */
        }
        kvp_ct_fixture_check(&f, "after short-buffer get");
    }
    free(b0);
    free(b1);
    kvp_ct_fixture_close(&f);
}

/* The same key twice in one put/get/remove/pin batch. */
static inline void kvp_contract_bad_duplicate_keys(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t a, a2, b;
    KVP_CT_NAME(&a, "bad/dup");
    KVP_CT_NAME(&a2, "bad/dup"); /* same bytes, another buffer */
    KVP_CT_NAME(&b, "bad/other");
    kvp_key_t keys[3] = {a.k, b.k, a2.k};
    kvp_ct_val_t v[3];
    for (int i = 0; i < 3; i++)
        kvp_ct_val_init(&v[i], keys[i], 100000, 1);
    kvp_sgl_t sgl[3] = {v[0].sgl, v[1].sgl, v[2].sgl};
    kvp_key_result_t res[3];
    KVP_CT_BAD(&f, KVP_ERR_DUPLICATE_KEY, kvp_pool_put(f.pool, keys, sgl, 3, res));
    ASSERT_EQ(kvp_ct_exists1(f.pool, a.k), 0);
    ASSERT_EQ(kvp_ct_exists1(f.pool, b.k), 0);
    kvp_key_t kk[3] = {f.keep[0].k, f.keep[1].k, f.keep[0].k};
    KVP_CT_BAD(&f, KVP_ERR_DUPLICATE_KEY, kvp_pool_put(f.pool, kk, sgl, 3, res));
    KVP_CT_BAD(&f, KVP_ERR_DUPLICATE_KEY, kvp_pool_get(f.pool, kk, sgl, 3, res));
    KVP_CT_BAD(&f, KVP_ERR_DUPLICATE_KEY, kvp_pool_remove(f.pool, kk, 3, res));
    KVP_CT_BAD(&f, KVP_ERR_DUPLICATE_KEY, kvp_pool_pin(f.pool, kk, 3, 1, res));
    KVP_CT_BAD(&f, KVP_ERR_DUPLICATE_KEY, kvp_pool_pin(f.pool, kk, 3, 0, res));
    for (int i = 0; i < 3; i++)
        free(v[i].buf);
    kvp_ct_fixture_close(&f);
}

/* The same key twice in one exists/prefix batch ("a key repeated in the
 * batch fails the whole call" applies to every data operation). */
/* pool.h: lookups (EXISTS, PREFIX) accept a repeated key and answer per
 * position; they change nothing. */
static inline void kvp_contract_bad_duplicate_keys_lookup(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    kvp_ct_name_t gone;
    KVP_CT_NAME(&gone, "dup/absent");
    kvp_key_t kk[4] = {f.keep[0].k, f.keep[1].k, f.keep[0].k, gone.k};
    uint8_t present[4] = {9, 9, 9, 9};
    size_t m = 99;
    kvp_pool_stats_t before = kvp_ct_stats(f.pool);
    ASSERT_OK(kvp_pool_exists(f.pool, kk, 4, present));
    ASSERT_EQ(present[0], 1);
    ASSERT_EQ(present[1], 1);
    ASSERT_EQ(present[2], 1);
    ASSERT_EQ(present[3], 0);
    ASSERT_OK(kvp_pool_prefix(f.pool, kk, 4, &m));
    ASSERT_EQ(m, 3);
    kvp_pool_stats_t after = kvp_ct_stats(f.pool);
    ASSERT_EQ(after.committed, before.committed);
    ASSERT_EQ(after.live, before.live);
    kvp_ct_fixture_close(&f);
}

/* More than KVP_BATCH_MAX keys; exactly KVP_BATCH_MAX is fine. */
static inline void kvp_contract_bad_batch_too_large(const char *uri)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, uri);
    const size_t n = KVP_BATCH_MAX + 1;
    char *text = (char *)kvp_ct_xmalloc(n * 16);
    kvp_key_t *keys = (kvp_key_t *)kvp_ct_xmalloc(sizeof(kvp_key_t) * n);
    uint8_t *present = (uint8_t *)kvp_ct_xmalloc(n);
    kvp_key_result_t *res = (kvp_key_result_t *)kvp_ct_xmalloc(sizeof(kvp_key_result_t) * n);
    for (size_t i = 0; i < n; i++) {
        int len = snprintf(text + i * 16, 16, "bt/%zu", i);
        keys[i].data = text + i * 16;
        keys[i].len = (uint32_t)len;
    }
    size_t m;
    KVP_CT_BAD(&f, KVP_ERR_BATCH_TOO_LARGE, kvp_pool_exists(f.pool, keys, n, present));
    KVP_CT_BAD(&f, KVP_ERR_BATCH_TOO_LARGE, kvp_pool_prefix(f.pool, keys, n, &m));
    KVP_CT_BAD(&f, KVP_ERR_BATCH_TOO_LARGE, kvp_pool_remove(f.pool, keys, n, res));
    memset(present, 0xEE, n);
    KVP_CT_ST(kvp_pool_exists(f.pool, keys, n - 1, present), KVP_OK);
    for (size_t i = 0; i < n - 1; i++)
        ASSERT_EQ(present[i], 0);
    free(text);
    free(keys);
    free(present);
    free(res);
    kvp_ct_fixture_close(&f);
}

/* Every contract, for backends' test files:
 *   #define DEF(name) TEST(test_contract_##name) { kvp_contract_##name(MY_URI); }
 *   KVP_CONTRACT_LIST(DEF)
 *   #define REF(name) T(test_contract_##name),
 *   TEST_LIST(KVP_CONTRACT_LIST(REF))                                     */
#define KVP_CONTRACT_LIST(X)                                                                \
    X(open_close) X(put_get) X(put_existing) X(scatter_gather) X(batch_partial)             \
    X(batch_no_space) X(exists) X(prefix) X(remove) X(remove_all) X(pin)                    \
    X(eviction_watermarks) X(submit) X(register) X(keys_binary) X(bad_key_empty)            \
    X(bad_key_too_long) X(bad_value_empty) X(bad_value_too_large)                           \
    X(bad_value_length_overflow) X(bad_null_buffer) X(bad_short_buffer)                     \
    X(bad_duplicate_keys) X(bad_duplicate_keys_lookup) X(bad_batch_too_large)

#endif /* KVP_TESTS_POOL_CONTRACT_H */
