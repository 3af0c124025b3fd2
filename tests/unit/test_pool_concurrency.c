/*
 * Eight threads sharing one pool handle.
 *
 * Every value is derived from its key alone (size and bytes), so whichever
 * thread stored a key, a successful get must return exactly those bytes.
 * Each thread tallies what it saw (objects created, existed, refused, hits,
 * misses, removes); at the end the pool's counters must equal the sums, the
 * accounting identity must hold, and exists() over every key must count
 * stats.live objects.  Threads also take stats snapshots while the others
 * work: each must satisfy the identity (kvp_pool_stats is consistent).
 * A hang fails through an alarm.
 *
 * KVP_TEST_SEED=<n> fixes the per-thread random streams.
 */
#include <stdatomic.h>

#include "pool_contract.h"

#define NTHREADS 8
#define NKEYS 512
#define CAPACITY_URI "embedded://?capacity=2MiB"

static uint64_t g_seed;
static atomic_ulong g_bytes_inconsistent; /* snapshots with live_bytes > used_bytes */
static kvp_pool_t *g_pool;
static char g_keytext[NKEYS][32];
static kvp_key_t g_key[NKEYS];

/* The one value key k ever has: 1 B .. 16 KiB, some 16..64 KiB. */
static size_t key_size(int k)
{
    uint64_t h = kvp_ct_mix((uint64_t)k ^ 0xC0FFEE);
    if (h % 16 == 0)
        return 16384 + (size_t)(h >> 8) % 49152;
    return 1 + (size_t)((h >> 8) % 16384);
}

static void keys_init(const char *prefix)
{
    for (int k = 0; k < NKEYS; k++) {
        snprintf(g_keytext[k], sizeof g_keytext[k], "%s/%d", prefix, k);
        g_key[k] = kvp_key_str(g_keytext[k]);
    }
}

typedef struct tally {
    uint64_t committed, existed, no_space, hits, misses, removed, reset, stats;
    uint64_t rng;
    int id;
    long ops;
} tally_t;

static uint64_t trnd(tally_t *t)
{
    t->rng ^= t->rng >> 12;
    t->rng ^= t->rng << 25;
    t->rng ^= t->rng >> 27;
    return t->rng * 0x2545F4914F6CDD1Dull;
}

static size_t tkeys(tally_t *t, int *idx, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int k, dup;
        do {
            k = (int)(trnd(t) % NKEYS);
            dup = 0;
            for (size_t j = 0; j < i; j++)
                dup |= idx[j] == k;
        } while (dup);
        idx[i] = k;
    }
    return n;
}

#define TCHECK(t, cond, ...)                                                                \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "thread %d (KVP_TEST_SEED=%" PRIu64 "): ", (t)->id, g_seed);    \
            KVP__FAIL(__VA_ARGS__);                                                         \
        }                                                                                   \
    } while (0)

static void t_put(tally_t *t, uint8_t *buf)
{
    int idx[4];
    size_t n = tkeys(t, idx, 1 + trnd(t) % 4), off = 0;
    kvp_key_t keys[4];
    kvp_iov_t iov[4][2];
    kvp_sgl_t sgl[4];
    kvp_key_result_t res[4];
    for (size_t i = 0; i < n; i++) {
        size_t sz = key_size(idx[i]), cut = (size_t)(trnd(t) % (sz + 1));
        keys[i] = g_key[idx[i]];
        kvp_ct_fill(buf + off, sz, kvp_ct_seed(keys[i], 0));
        iov[i][0].base = buf + off, iov[i][0].len = cut;
        iov[i][1].base = buf + off + cut, iov[i][1].len = sz - cut;
        sgl[i].iov = iov[i], sgl[i].iovcnt = 2;
        off += sz;
    }
    memset(res, 0xEE, sizeof res);
    kvp_status_t st = kvp_pool_put(g_pool, keys, sgl, n, res);
    TCHECK(t, st == KVP_OK, "put: %s", kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        if (res[i].status == KVP_OK && (res[i].flags & KVP_RESULT_EXISTED))
            t->existed++;
        else if (res[i].status == KVP_OK)
            t->committed++;
        else if (res[i].status == KVP_ERR_NO_SPACE)
            t->no_space++;
        else
            TCHECK(t, 0, "put key %d: %s", idx[i], kvp_status_name(res[i].status));
    }
}

static void t_get(tally_t *t, uint8_t *buf)
{
    int idx[4];
    size_t n = tkeys(t, idx, 1 + trnd(t) % 4), off[4], o = 0;
    kvp_key_t keys[4];
    kvp_iov_t iov[4][3];
    kvp_sgl_t sgl[4];
    kvp_key_result_t res[4];
    for (size_t i = 0; i < n; i++) {
        size_t cap = key_size(idx[i]) + (size_t)(trnd(t) % 3), a = (size_t)(trnd(t) % (cap + 1));
        size_t b = (size_t)(trnd(t) % (cap - a + 1));
        keys[i] = g_key[idx[i]];
        memset(buf + o, 0xA5, cap);
        iov[i][0].base = buf + o, iov[i][0].len = a;
        iov[i][1].base = buf + o + a, iov[i][1].len = b;
        iov[i][2].base = buf + o + a + b, iov[i][2].len = cap - a - b;
        sgl[i].iov = iov[i], sgl[i].iovcnt = 3;
        off[i] = o;
        o += cap;
    }
    memset(res, 0xEE, sizeof res);
    kvp_status_t st = kvp_pool_get(g_pool, keys, sgl, n, res);
    TCHECK(t, st == KVP_OK, "get: %s", kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        if (res[i].status == KVP_ERR_NOT_FOUND) {
            t->misses++;
            continue;
        }
        TCHECK(t, res[i].status == KVP_OK, "get key %d: %s", idx[i], kvp_status_name(res[i].status));
        t->hits++;
        size_t sz = key_size(idx[i]);
        TCHECK(t, res[i].size == sz, "get key %d: size %" PRIu64 ", expected %zu", idx[i],
               res[i].size, sz);
        size_t bad = kvp_ct_check(buf + off[i], sz, kvp_ct_seed(keys[i], 0));
        TCHECK(t, bad == SIZE_MAX, "get key %d: byte %zu of %zu differs", idx[i], bad, sz);
    }
}

static void t_exists(tally_t *t)
{
    int idx[16];
    size_t n = tkeys(t, idx, 1 + trnd(t) % 16);
    kvp_key_t keys[16];
    uint8_t present[16];
    for (size_t i = 0; i < n; i++)
        keys[i] = g_key[idx[i]];
    memset(present, 0xEE, sizeof present);
    kvp_status_t st = kvp_pool_exists(g_pool, keys, n, present);
    TCHECK(t, st == KVP_OK, "exists: %s", kvp_status_name(st));
    for (size_t i = 0; i < n; i++)
        TCHECK(t, present[i] <= 1, "exists flag %u", present[i]);
}

static void t_prefix(tally_t *t)
{
    size_t n = 1 + trnd(t) % 32;
    int k0 = (int)(trnd(t) % (NKEYS - 32));
    size_t m = (size_t)-1;
    kvp_status_t st = kvp_pool_prefix(g_pool, g_key + k0, n, &m);
    TCHECK(t, st == KVP_OK, "prefix: %s", kvp_status_name(st));
    TCHECK(t, m <= n, "prefix %zu of %zu keys", m, n);
}

static void t_remove(tally_t *t)
{
    int idx[2];
    size_t n = tkeys(t, idx, 1 + trnd(t) % 2);
    kvp_key_t keys[2];
    kvp_key_result_t res[2];
    for (size_t i = 0; i < n; i++)
        keys[i] = g_key[idx[i]];
    memset(res, 0xEE, sizeof res);
    kvp_status_t st = kvp_pool_remove(g_pool, keys, n, res);
    TCHECK(t, st == KVP_OK, "remove: %s", kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        TCHECK(t, res[i].status == KVP_OK || res[i].status == KVP_ERR_NOT_FOUND, "remove: %s",
               kvp_status_name(res[i].status));
        t->removed += res[i].status == KVP_OK;
    }
}

static void t_stats(tally_t *t)
{
    kvp_pool_stats_t s;
    kvp_status_t st = kvp_pool_stats(g_pool, &s);
    TCHECK(t, st == KVP_OK, "stats: %s", kvp_status_name(st));
    kvp_ct_check_snapshot_counts(&s, "concurrent snapshot");
    /* Counted, not asserted here: test_concurrent_stats_consistent checks it,
     * so that the other tests still check everything else. */
    if (!kvp_ct_snapshot_bytes_ok(&s))
        atomic_fetch_add(&g_bytes_inconsistent, 1);
    TCHECK(t, s.live <= NKEYS, "live %" PRIu64 " > %d keys", s.live, NKEYS);
    t->stats++;
}

static void *mixed_thread(void *arg)
{
    tally_t *t = (tally_t *)arg;
    uint8_t *buf = (uint8_t *)kvp_ct_xmalloc(4 * 65536 + 16);
    for (long i = 0; i < t->ops; i++) {
        unsigned r = (unsigned)(trnd(t) % 100);
        if (r < 35)
            t_put(t, buf);
        else if (r < 70)
            t_get(t, buf);
        else if (r < 80)
            t_exists(t);
        else if (r < 90)
            t_prefix(t);
        else if (r < 97)
            t_remove(t);
        else
            t_stats(t);
    }
    free(buf);
    return NULL;
}

static void seed_init(void)
{
    const char *env = getenv("KVP_TEST_SEED");
    g_seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    fprintf(stderr, "test_pool_concurrency: KVP_TEST_SEED=%" PRIu64 "\n", g_seed);
}

/* The pool's counters against the threads' tallies; exists() over all keys. */
static void final_check(const kvp_pool_stats_t *s0, const tally_t *t, int nt, const char *what)
{
    tally_t sum;
    memset(&sum, 0, sizeof sum);
    for (int i = 0; i < nt; i++) {
        sum.committed += t[i].committed, sum.existed += t[i].existed;
        sum.no_space += t[i].no_space, sum.hits += t[i].hits, sum.misses += t[i].misses;
        sum.removed += t[i].removed, sum.reset += t[i].reset;
    }
    kvp_pool_stats_t s = kvp_ct_stats(g_pool);
    fprintf(stderr, "%s: committed %" PRIu64 " existed %" PRIu64 " no_space %" PRIu64 " hits %"
            PRIu64 " misses %" PRIu64 " removed %" PRIu64 " reset %" PRIu64 " evicted %" PRIu64
            " live %" PRIu64 "\n", what, sum.committed, sum.existed, sum.no_space, sum.hits,
            sum.misses, sum.removed, sum.reset, s.evicted - s0->evicted, s.live);
    ASSERT_EQ(s.committed - s0->committed, sum.committed);
    ASSERT_EQ(s.put_existed - s0->put_existed, sum.existed);
    ASSERT_EQ(s.put_no_space - s0->put_no_space, sum.no_space);
    ASSERT_EQ(s.get_hits - s0->get_hits, sum.hits);
    ASSERT_EQ(s.get_misses - s0->get_misses, sum.misses);
    ASSERT_EQ(s.removed - s0->removed, sum.removed);
    ASSERT_EQ(s.reset - s0->reset, sum.reset);
    ASSERT_EQ(s.leased, 0);
    ASSERT_EQ(s.reserved, 0);
    ASSERT_EQ(s.pinned, 0);
    uint8_t present[NKEYS];
    KVP_CT_ST(kvp_pool_exists(g_pool, g_key, NKEYS, present), KVP_OK);
    uint64_t n = 0;
    for (int k = 0; k < NKEYS; k++)
        n += present[k];
    ASSERT_EQ(n, s.live);
    /* Every live object is intact. */
    for (int k = 0; k < NKEYS; k++)
        if (present[k])
            kvp_ct_get_ok(g_pool, g_key[k], key_size(k), 0);
}

static long ops_from_env(long dflt)
{
    const char *e = getenv("KVP_TEST_OPS");
    return e ? atol(e) : dflt;
}

static void run_mixed(const char *uri, long ops)
{
    alarm(240);
    seed_init();
    keys_init("mix");
    g_pool = kvp_ct_open(uri);
    kvp_pool_stats_t s0 = kvp_ct_stats(g_pool);
    pthread_t th[NTHREADS];
    tally_t t[NTHREADS];
    memset(t, 0, sizeof t);
    for (int i = 0; i < NTHREADS; i++) {
        t[i].id = i;
        t[i].rng = kvp_ct_mix(g_seed + (uint64_t)i) | 1;
        t[i].ops = ops;
        ASSERT_EQ(pthread_create(&th[i], NULL, mixed_thread, &t[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    final_check(&s0, t, NTHREADS, uri);
    kvp_pool_stats_t s = kvp_ct_stats(g_pool);
    ASSERT_MSG(s.evicted > s0.evicted, "no eviction: the test did not exercise capacity pressure");
    kvp_pool_close(g_pool);
}

TEST(test_concurrent_mixed)
{
    run_mixed(CAPACITY_URI, ops_from_env(6000));
}

TEST(test_concurrent_mixed_shards)
{
    run_mixed(CAPACITY_URI "&shards=2&provider=memfd", ops_from_env(6000) / 2);
}

/* ---- readers while another thread runs remove_all over and over */

static atomic_int g_stop;

static void *reader_thread(void *arg)
{
    tally_t *t = (tally_t *)arg;
    uint8_t *buf = (uint8_t *)kvp_ct_xmalloc(4 * 65536 + 16);
    while (!atomic_load(&g_stop)) {
        t_get(t, buf);
        if (trnd(t) % 8 == 0)
            t_prefix(t);
        if (trnd(t) % 32 == 0)
            t_stats(t);
    }
    free(buf);
    return NULL;
}

static void *writer_thread(void *arg)
{
    tally_t *t = (tally_t *)arg;
    uint8_t *buf = (uint8_t *)kvp_ct_xmalloc(4 * 65536 + 16);
    while (!atomic_load(&g_stop))
        t_put(t, buf);
    free(buf);
    return NULL;
}

static void *reset_thread(void *arg)
{
    tally_t *t = (tally_t *)arg;
    for (long i = 0; i < t->ops; i++) {
        uint64_t removed = UINT64_MAX;
        kvp_status_t st = kvp_pool_remove_all(g_pool, &removed);
        TCHECK(t, st == KVP_OK, "remove_all: %s", kvp_status_name(st));
        TCHECK(t, removed <= NKEYS, "remove_all removed %" PRIu64, removed);
        t->reset += removed;
        kvp_ct_sleep_ms((long)(trnd(t) % 2));
    }
    atomic_store(&g_stop, 1);
    return NULL;
}

TEST(test_concurrent_get_during_remove_all)
{
    alarm(240);
    seed_init();
    keys_init("reset");
    g_pool = kvp_ct_open(CAPACITY_URI);
    kvp_pool_stats_t s0 = kvp_ct_stats(g_pool);
    enum { NR = 5, NW = 2 };
    pthread_t th[NR + NW + 1];
    tally_t t[NR + NW + 1];
    memset(t, 0, sizeof t);
    atomic_store(&g_stop, 0);
    for (int i = 0; i < NR + NW + 1; i++) {
        t[i].id = i;
        t[i].rng = kvp_ct_mix(g_seed * 31 + (uint64_t)i) | 1;
        t[i].ops = ops_from_env(6000) / 20; /* remove_all calls */
        void *(*fn)(void *) = i < NR ? reader_thread : i < NR + NW ? writer_thread : reset_thread;
        ASSERT_EQ(pthread_create(&th[i], NULL, fn, &t[i]), 0);
    }
    for (int i = 0; i < NR + NW + 1; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    uint64_t hits = 0;
    for (int i = 0; i < NR; i++)
        hits += t[i].hits;
    ASSERT_MSG(hits > 0 && t[NR + NW].reset > 0, "no hits (%" PRIu64 ") or nothing reset", hits);
    final_check(&s0, t, NR + NW + 1, "get during remove_all");
    kvp_pool_close(g_pool);
}

/* ---- all threads put the same new key at once: exactly one creates it */

static pthread_barrier_t g_barrier;

static void *race_thread(void *arg)
{
    tally_t *t = (tally_t *)arg;
    uint8_t *buf = (uint8_t *)kvp_ct_xmalloc(65536);
    for (long r = 0; r < t->ops; r++) {
        int k = (int)(r % NKEYS);
        size_t sz = key_size(k);
        kvp_ct_fill(buf, sz, kvp_ct_seed(g_key[k], 0));
        kvp_iov_t iov = {buf, sz};
        kvp_sgl_t sgl = {&iov, 1};
        kvp_key_result_t res;
        pthread_barrier_wait(&g_barrier);
        kvp_status_t st = kvp_pool_put(g_pool, &g_key[k], &sgl, 1, &res);
        TCHECK(t, st == KVP_OK && res.status == KVP_OK, "put: %s / %s", kvp_status_name(st),
               kvp_status_name(res.status));
        if (res.flags & KVP_RESULT_EXISTED)
            t->existed++;
        else
            t->committed++;
        pthread_barrier_wait(&g_barrier);
        if (t->id == 0) {
            kvp_ct_get_ok(g_pool, g_key[k], sz, 0);
            ASSERT_EQ(kvp_ct_remove1(g_pool, g_key[k]), KVP_OK);
            t->removed++;
        }
    }
    free(buf);
    return NULL;
}

TEST(test_concurrent_put_same_key)
{
    alarm(240);
    seed_init();
    keys_init("race");
    g_pool = kvp_ct_open("embedded://?capacity=16MiB");
    kvp_pool_stats_t s0 = kvp_ct_stats(g_pool);
    const long rounds = ops_from_env(6000) / 10;
    ASSERT_EQ(pthread_barrier_init(&g_barrier, NULL, NTHREADS), 0);
    pthread_t th[NTHREADS];
    tally_t t[NTHREADS];
    memset(t, 0, sizeof t);
    for (int i = 0; i < NTHREADS; i++) {
        t[i].id = i;
        t[i].ops = rounds;
        ASSERT_EQ(pthread_create(&th[i], NULL, race_thread, &t[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    uint64_t created = 0, existed = 0;
    for (int i = 0; i < NTHREADS; i++)
        created += t[i].committed, existed += t[i].existed;
    /* Each round: exactly one thread created the object, 7 saw it exist. */
    ASSERT_EQ(created, (uint64_t)rounds);
    ASSERT_EQ(existed, (uint64_t)rounds * (NTHREADS - 1));
    kvp_pool_stats_t s = kvp_ct_stats(g_pool);
    ASSERT_EQ(s.committed - s0.committed, (uint64_t)rounds);
    ASSERT_EQ(s.put_existed - s0.put_existed, (uint64_t)rounds * (NTHREADS - 1));
    ASSERT_EQ(s.live, 0);
    pthread_barrier_destroy(&g_barrier);
    kvp_pool_close(g_pool);
}

/* Snapshots taken while others put, get, remove and evict: live_bytes never
 * exceeds used_bytes (a snapshot is consistent, pool.h). */
static void *stats_thread(void *arg)
{
    tally_t *t = (tally_t *)arg;
    while (!atomic_load(&g_stop))
        t_stats(t);
    return NULL;
}

TEST(test_concurrent_stats_consistent)
{
    alarm(240);
    seed_init();
    keys_init("snap");
    g_pool = kvp_ct_open(CAPACITY_URI);
    kvp_pool_stats_t s0 = kvp_ct_stats(g_pool);
    enum { NM = NTHREADS - 2 };
    pthread_t th[NTHREADS];
    tally_t t[NTHREADS];
    memset(t, 0, sizeof t);
    atomic_store(&g_stop, 0);
    atomic_store(&g_bytes_inconsistent, 0);
    for (int i = 0; i < NTHREADS; i++) {
        t[i].id = i;
        t[i].rng = kvp_ct_mix(g_seed * 7 + (uint64_t)i) | 1;
        t[i].ops = ops_from_env(6000) / 2;
        void *(*fn)(void *) = i < NM ? mixed_thread : stats_thread;
        ASSERT_EQ(pthread_create(&th[i], NULL, fn, &t[i]), 0);
    }
    for (int i = 0; i < NM; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    atomic_store(&g_stop, 1);
    for (int i = NM; i < NTHREADS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
    uint64_t snaps = 0;
    for (int i = 0; i < NTHREADS; i++)
        snaps += t[i].stats;
    unsigned long bad = atomic_load(&g_bytes_inconsistent);
    ASSERT_MSG(bad == 0, "%lu of %" PRIu64 " concurrent stats snapshots had live_bytes > "
               "used_bytes (used_bytes is read outside the snapshot)", bad, snaps);
    final_check(&s0, t, NTHREADS, "stats snapshots");
    kvp_pool_close(g_pool);
}

TEST_LIST(T(test_concurrent_mixed), T(test_concurrent_mixed_shards),
          T(test_concurrent_get_during_remove_all), T(test_concurrent_put_same_key),
          T(test_concurrent_stats_consistent))
