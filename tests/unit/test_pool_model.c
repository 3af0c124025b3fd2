/*
 * Model-based test of the embedded pool: a long random sequence of put, get,
 * exists, prefix, remove and remove_all (random batches, random value sizes,
 * random scatter lists) runs against the pool and against a trivially correct
 * reference (an array: key -> absent | present(generation, size)).
 *
 * The pool may evict any object at any time; the reference cannot know when.
 * So an object the reference holds but the pool lacks is an "eviction
 * observed", allowed only while the pool's own count explains it:
 *     explained <= stats.evicted   and   live == ref_count - (evicted - explained)
 * (the same for bytes), i.e. every object the pool lost is counted as evicted,
 * and every object counted as evicted was one the reference holds.  Every
 * few thousand steps an audit asks exists() for every key, which explains
 * every eviction so far: then explained == evicted exactly.  Each value's
 * content is derived from (key, generation), so every byte of every get is
 * checked, and a put of an existing key must leave the old generation.
 * The accounting identity and every counter are checked after every step.
 *
 * KVP_TEST_SEED=<n> reproduces a run (the seed is printed first);
 * KVP_TEST_OPS=<n> changes the number of steps (default 100000).
 */
#include "pool_contract.h"

#define CAPACITY "8MiB"
#define NKEYS 3000
#define MAXBATCH 8
#define MAXVAL (1u << 20)

typedef struct ref_entry {
    int present;
    uint64_t gen;
    size_t size;
} ref_entry_t;

typedef struct model {
    kvp_pool_t *pool;
    uint64_t seed, rng;
    long step;
    /* keys */
    uint8_t *keybytes[NKEYS];
    kvp_key_t key[NKEYS];
    /* reference */
    ref_entry_t ref[NKEYS];
    uint64_t ref_count, ref_bytes, next_gen;
    /* what the pool's counters must show (deltas since open) */
    kvp_pool_stats_t base;
    uint64_t explained, explained_bytes;
    uint64_t committed, removed, reset, put_existed, put_no_space, hits, misses;
    /* scratch */
    uint8_t *src, *dst;
    /* tallies */
    long nops[6];
} model_t;

static model_t M;

#define MCHECK(cond, ...)                                                                      \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "test_pool_model: FAILED at step %ld (KVP_TEST_SEED=%" PRIu64 "): ", \
                    M.step, M.seed);                                                           \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, "\n");                                                             \
            KVP__FAIL("%s", #cond);                                                            \
        }                                                                                      \
    } while (0)

static uint64_t rnd(void)
{
    /* xorshift64* */
    M.rng ^= M.rng >> 12;
    M.rng ^= M.rng << 25;
    M.rng ^= M.rng >> 27;
    return M.rng * 0x2545F4914F6CDD1Dull;
}

static uint64_t rnd_below(uint64_t n) { return rnd() % n; }

/* 1 B .. 64 KiB, log-uniform; 1 % of values 64 KiB .. 1 MiB. */
static size_t rnd_size(void)
{
    if (rnd_below(100) == 0)
        return (size_t)(65536 + rnd_below(MAXVAL - 65536 + 1));
    unsigned bits = (unsigned)rnd_below(17); /* 0..16 */
    size_t hi = (size_t)1 << bits;
    return 1 + (size_t)rnd_below(hi < 65536 ? hi : 65536);
}

/* A random key; with probability pct % one the reference holds (if found
 * quickly), so that gets hit and puts meet existing keys often. */
static int rnd_key(unsigned pct)
{
    int k = (int)rnd_below(NKEYS);
    if (rnd_below(100) < pct)
        for (int t = 0; t < 16 && !M.ref[k].present; t++)
            k = (int)rnd_below(NKEYS);
    return k;
}

/* n distinct random key indices, pct % biased towards held keys. */
static size_t rnd_keys(int *idx, size_t n, unsigned pct)
{
    for (size_t i = 0; i < n; i++) {
        int k, dup;
        do {
            k = rnd_key(pct);
            dup = 0;
            for (size_t j = 0; j < i; j++)
                dup |= idx[j] == k;
        } while (dup);
        idx[i] = k;
    }
    return n;
}

/* Splits [0, len) into 1..4 slices (some possibly empty) of buf. */
static uint32_t split(kvp_iov_t *iov, uint8_t *buf, size_t len)
{
    uint32_t n = 1 + (uint32_t)rnd_below(4);
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t part = i + 1 == n ? len - off : (size_t)rnd_below(len - off + 1);
        iov[i].base = buf + off;
        iov[i].len = part;
        off += part;
    }
    return n;
}

/* The reference lost key k to an eviction the pool reported as absence. */
static void observe_evicted(int k, const char *how)
{
    MCHECK(M.ref[k].present, "key %d: %s reports absence of a key the reference never had "
           "(bug in the test)", k, how);
    M.explained++;
    M.explained_bytes += M.ref[k].size;
    M.ref[k].present = 0;
    M.ref_count--;
    M.ref_bytes -= M.ref[k].size;
}

static void check_stats(void)
{
    kvp_pool_stats_t s;
    memset(&s, 0xEE, sizeof s);
    kvp_status_t st = kvp_pool_stats(M.pool, &s);
    MCHECK(st == KVP_OK, "kvp_pool_stats: %s", kvp_status_name(st));
    char where[96];
    snprintf(where, sizeof where, "model step %ld (KVP_TEST_SEED=%" PRIu64 ")", M.step, M.seed);
    kvp_ct_check_snapshot(&s, where);
    const kvp_pool_stats_t *b = &M.base;
    uint64_t evicted = s.evicted - b->evicted, evicted_bytes = s.evicted_bytes - b->evicted_bytes;
    MCHECK(M.explained <= evicted, "%" PRIu64 " objects observed missing but stats.evicted "
           "rose by only %" PRIu64 " (an object vanished uncounted)", M.explained, evicted);
    MCHECK(M.explained_bytes <= evicted_bytes, "%" PRIu64 " bytes observed evicted > "
           "stats.evicted_bytes delta %" PRIu64, M.explained_bytes, evicted_bytes);
    MCHECK(s.live == M.ref_count - (evicted - M.explained),
           "stats.live %" PRIu64 " != reference %" PRIu64 " - unexplained evictions %" PRIu64,
           s.live, M.ref_count, evicted - M.explained);
    MCHECK(s.live_bytes == M.ref_bytes - (evicted_bytes - M.explained_bytes),
           "stats.live_bytes %" PRIu64 " != reference %" PRIu64 " - unexplained %" PRIu64,
           s.live_bytes, M.ref_bytes, evicted_bytes - M.explained_bytes);
    MCHECK(s.committed - b->committed == M.committed, "committed +%" PRIu64 ", expected +%" PRIu64,
           s.committed - b->committed, M.committed);
    MCHECK(s.removed - b->removed == M.removed, "removed +%" PRIu64 ", expected +%" PRIu64,
           s.removed - b->removed, M.removed);
    MCHECK(s.reset - b->reset == M.reset, "reset +%" PRIu64 ", expected +%" PRIu64,
           s.reset - b->reset, M.reset);
    MCHECK(s.put_existed - b->put_existed == M.put_existed, "put_existed +%" PRIu64
           ", expected +%" PRIu64, s.put_existed - b->put_existed, M.put_existed);
    MCHECK(s.put_no_space - b->put_no_space == M.put_no_space, "put_no_space +%" PRIu64
           ", expected +%" PRIu64, s.put_no_space - b->put_no_space, M.put_no_space);
    MCHECK(s.get_hits - b->get_hits == M.hits, "get_hits +%" PRIu64 ", expected +%" PRIu64,
           s.get_hits - b->get_hits, M.hits);
    MCHECK(s.get_misses - b->get_misses == M.misses, "get_misses +%" PRIu64 ", expected +%" PRIu64,
           s.get_misses - b->get_misses, M.misses);
    MCHECK(s.reserved == 0 && s.leased == 0 && s.pinned == 0,
           "idle pool: reserved %" PRIu64 " leased %" PRIu64 " pinned %" PRIu64, s.reserved,
           s.leased, s.pinned);
    MCHECK(s.expired_put == b->expired_put, "expired_put moved");
}

static void op_put(void)
{
    int idx[MAXBATCH];
    size_t n = rnd_keys(idx, 1 + rnd_below(MAXBATCH), 30);
    kvp_key_t keys[MAXBATCH];
    kvp_iov_t iov[MAXBATCH][4];
    kvp_sgl_t sgl[MAXBATCH];
    kvp_key_result_t res[MAXBATCH];
    size_t size[MAXBATCH], off = 0;
    uint64_t gen[MAXBATCH];
    for (size_t i = 0; i < n; i++) {
        int k = idx[i];
        keys[i] = M.key[k];
        size[i] = rnd_size();
        gen[i] = ++M.next_gen;
        kvp_ct_fill(M.src + off, size[i], kvp_ct_seed(keys[i], gen[i]));
        sgl[i].iov = iov[i];
        sgl[i].iovcnt = split(iov[i], M.src + off, size[i]);
        off += size[i];
    }
    memset(res, 0xEE, sizeof res);
    kvp_status_t st = kvp_pool_put(M.pool, keys, sgl, n, res);
    MCHECK(st == KVP_OK, "put of %zu keys: %s", n, kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        int k = idx[i];
        ref_entry_t *r = &M.ref[k];
        if (res[i].status == KVP_OK && (res[i].flags & KVP_RESULT_EXISTED)) {
            MCHECK(r->present, "put key %d: EXISTED, but the reference does not hold it", k);
            M.put_existed++;
            continue;
        }
        if (r->present) /* the pool lost it: must have been evicted */
            observe_evicted(k, "put (stored anew)");
        if (res[i].status == KVP_ERR_NO_SPACE) {
            M.put_no_space++;
            continue;
        }
        MCHECK(res[i].status == KVP_OK, "put key %d (%zu B): %s", k, size[i],
               kvp_status_name(res[i].status));
        MCHECK(res[i].flags == 0, "put key %d: flags %u", k, res[i].flags);
        MCHECK(res[i].size == size[i], "put key %d: size %" PRIu64 ", expected %zu", k,
               res[i].size, size[i]);
        r->present = 1;
        r->gen = gen[i];
        r->size = size[i];
        M.ref_count++;
        M.ref_bytes += size[i];
        M.committed++;
    }
}

static void op_get(void)
{
    int idx[MAXBATCH];
    size_t n = rnd_keys(idx, 1 + rnd_below(MAXBATCH), 70);
    kvp_key_t keys[MAXBATCH];
    kvp_iov_t iov[MAXBATCH][4];
    kvp_sgl_t sgl[MAXBATCH];
    kvp_key_result_t res[MAXBATCH];
    size_t cap[MAXBATCH], off[MAXBATCH], o = 0;
    for (size_t i = 0; i < n; i++) {
        ref_entry_t *r = &M.ref[idx[i]];
        keys[i] = M.key[idx[i]];
        cap[i] = r->present ? r->size + (size_t)rnd_below(3) * (size_t)rnd_below(100)
                            : 1 + (size_t)rnd_below(1024);
        off[i] = o;
        memset(M.dst + o, 0xA5, cap[i]);
        sgl[i].iov = iov[i];
        sgl[i].iovcnt = split(iov[i], M.dst + o, cap[i]);
        o += cap[i];
    }
    memset(res, 0xEE, sizeof res);
    kvp_status_t st = kvp_pool_get(M.pool, keys, sgl, n, res);
    MCHECK(st == KVP_OK, "get of %zu keys: %s", n, kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        int k = idx[i];
        ref_entry_t *r = &M.ref[k];
        if (res[i].status == KVP_ERR_NOT_FOUND) {
            M.misses++;
            if (r->present)
                observe_evicted(k, "get");
            continue;
        }
        MCHECK(res[i].status == KVP_OK, "get key %d: %s", k, kvp_status_name(res[i].status));
        MCHECK(r->present, "get key %d: found a key the reference does not hold", k);
        M.hits++;
        MCHECK(res[i].size == r->size, "get key %d: size %" PRIu64 ", expected %zu (gen %" PRIu64 ")",
               k, res[i].size, r->size, r->gen);
        size_t bad = kvp_ct_check(M.dst + off[i], r->size, kvp_ct_seed(keys[i], r->gen));
        MCHECK(bad == SIZE_MAX, "get key %d: byte %zu of %zu differs from generation %" PRIu64
               " (split into %u slices)", k, bad, r->size, r->gen, sgl[i].iovcnt);
    }
}

static void op_exists(void)
{
    int idx[16];
    size_t n = rnd_keys(idx, 1 + rnd_below(16), 50);
    kvp_key_t keys[16];
    uint8_t present[16];
    for (size_t i = 0; i < n; i++)
        keys[i] = M.key[idx[i]];
    memset(present, 0xEE, sizeof present);
    kvp_status_t st = kvp_pool_exists(M.pool, keys, n, present);
    MCHECK(st == KVP_OK, "exists: %s", kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        int k = idx[i];
        MCHECK(present[i] <= 1, "exists key %d: flag %u", k, present[i]);
        if (present[i])
            MCHECK(M.ref[k].present, "exists key %d: present, the reference does not hold it", k);
        else if (M.ref[k].present)
            observe_evicted(k, "exists");
    }
}

/* A run of present keys (in random order) followed by random keys. */
static void op_prefix(void)
{
    enum { MAXP = 32 };
    int idx[MAXP];
    size_t n = 1 + rnd_below(MAXP), have = 0;
    size_t want_present = rnd_below(n + 1);
    for (int tries = 0; have < want_present && tries < 4 * MAXP; tries++) {
        int k = (int)rnd_below(NKEYS), dup = 0;
        if (!M.ref[k].present)
            continue;
        for (size_t j = 0; j < have; j++)
            dup |= idx[j] == k;
        if (!dup)
            idx[have++] = k;
    }
    while (have < n) {
        int k = (int)rnd_below(NKEYS), dup = 0;
        for (size_t j = 0; j < have; j++)
            dup |= idx[j] == k;
        if (!dup)
            idx[have++] = k;
    }
    kvp_key_t keys[MAXP];
    size_t expect = n;
    for (size_t i = 0; i < n; i++) {
        keys[i] = M.key[idx[i]];
        if (expect == n && !M.ref[idx[i]].present)
            expect = i;
    }
    size_t m = (size_t)-1;
    kvp_status_t st = kvp_pool_prefix(M.pool, keys, n, &m);
    MCHECK(st == KVP_OK, "prefix: %s", kvp_status_name(st));
    MCHECK(m <= expect, "prefix of %zu keys = %zu, but key %zu is absent from the reference", n, m,
           expect);
    if (m < expect) /* keys[m] is held by the reference but gone: evicted */
        observe_evicted(idx[m], "prefix");
}

static void op_remove(void)
{
    int idx[4];
    size_t n = rnd_keys(idx, 1 + rnd_below(4), 50);
    kvp_key_t keys[4];
    kvp_key_result_t res[4];
    for (size_t i = 0; i < n; i++)
        keys[i] = M.key[idx[i]];
    memset(res, 0xEE, sizeof res);
    kvp_status_t st = kvp_pool_remove(M.pool, keys, n, res);
    MCHECK(st == KVP_OK, "remove: %s", kvp_status_name(st));
    for (size_t i = 0; i < n; i++) {
        int k = idx[i];
        ref_entry_t *r = &M.ref[k];
        if (res[i].status == KVP_ERR_NOT_FOUND) {
            if (r->present)
                observe_evicted(k, "remove");
            continue;
        }
        MCHECK(res[i].status == KVP_OK, "remove key %d: %s", k, kvp_status_name(res[i].status));
        MCHECK(r->present, "remove key %d: OK for a key the reference does not hold", k);
        r->present = 0;
        M.ref_count--;
        M.ref_bytes -= r->size;
        M.removed++;
    }
}

static void op_remove_all(void)
{
    kvp_pool_stats_t s0 = kvp_ct_stats(M.pool);
    uint64_t removed = UINT64_MAX;
    kvp_status_t st = kvp_pool_remove_all(M.pool, &removed);
    MCHECK(st == KVP_OK, "remove_all: %s", kvp_status_name(st));
    kvp_pool_stats_t s1 = kvp_ct_stats(M.pool);
    MCHECK(removed + (s1.evicted - s0.evicted) == s0.live,
           "remove_all removed %" PRIu64 " (+%" PRIu64 " evicted meanwhile), stats.live was %" PRIu64,
           removed, s1.evicted - s0.evicted, s0.live);
    MCHECK(s1.live == 0 && s1.live_bytes == 0, "after remove_all: live %" PRIu64 ", %" PRIu64 " B",
           s1.live, s1.live_bytes);
    /* Every object the reference held is gone; those not counted under
     * reset had been evicted. */
    M.explained = s1.evicted - M.base.evicted;
    M.explained_bytes = s1.evicted_bytes - M.base.evicted_bytes;
    for (int k = 0; k < NKEYS; k++)
        M.ref[k].present = 0;
    M.ref_count = 0;
    M.ref_bytes = 0;
    M.reset += removed;
}

/* exists() on every key: explains every eviction so far. */
static void audit(void)
{
    for (int tries = 0;; tries++) {
        for (int k0 = 0; k0 < NKEYS; k0 += 512) {
            size_t n = NKEYS - k0 < 512 ? (size_t)(NKEYS - k0) : 512;
            uint8_t present[512];
            kvp_status_t st = kvp_pool_exists(M.pool, M.key + k0, n, present);
            MCHECK(st == KVP_OK, "audit exists: %s", kvp_status_name(st));
            for (size_t i = 0; i < n; i++) {
                int k = k0 + (int)i;
                if (present[i])
                    MCHECK(M.ref[k].present, "audit: key %d present, reference does not hold it", k);
                else if (M.ref[k].present)
                    observe_evicted(k, "audit");
            }
        }
        kvp_pool_stats_t s = kvp_ct_stats(M.pool);
        uint64_t evicted = s.evicted - M.base.evicted;
        if (evicted == M.explained || tries == 3) {
            MCHECK(evicted == M.explained, "audit: stats.evicted rose by %" PRIu64 " but only %"
                   PRIu64 " objects are missing", evicted, M.explained);
            MCHECK(s.evicted_bytes - M.base.evicted_bytes == M.explained_bytes,
                   "audit: stats.evicted_bytes +%" PRIu64 " but missing objects hold %" PRIu64 " B",
                   s.evicted_bytes - M.base.evicted_bytes, M.explained_bytes);
            MCHECK(s.live == M.ref_count, "audit: live %" PRIu64 " != reference %" PRIu64, s.live,
                   M.ref_count);
            return;
        }
        kvp_ct_sleep_ms(10); /* a background evictor may still be running */
    }
}

static void model_run(const char *uri, long steps)
{
    memset(&M, 0, sizeof M);
    const char *env = getenv("KVP_TEST_SEED");
    M.seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    M.rng = kvp_ct_mix(M.seed) | 1;
    fprintf(stderr, "test_pool_model: KVP_TEST_SEED=%" PRIu64 " steps=%ld uri=%s\n", M.seed, steps,
            uri);
    /* Keys: 8..200 bytes, binary tails, distinct by their "m%04x/" head. */
    for (int k = 0; k < NKEYS; k++) {
        size_t len = 8 + (size_t)(kvp_ct_mix((uint64_t)k) % 193);
        M.keybytes[k] = (uint8_t *)kvp_ct_xmalloc(len);
        snprintf((char *)M.keybytes[k], 8, "m%04x/", k);
        for (size_t i = 7; i < len; i++)
            M.keybytes[k][i] = (uint8_t)kvp_ct_mix((uint64_t)k * 1000 + i);
        M.key[k].data = M.keybytes[k];
        M.key[k].len = (uint32_t)len;
    }
    M.src = (uint8_t *)kvp_ct_xmalloc((size_t)MAXBATCH * MAXVAL);
    M.dst = (uint8_t *)kvp_ct_xmalloc((size_t)MAXBATCH * (MAXVAL + 300));
    M.pool = kvp_ct_open(uri);
    M.base = kvp_ct_stats(M.pool);
    for (M.step = 0; M.step < steps; M.step++) {
        uint64_t r = rnd_below(10000);
        if (r < 3500)
            op_put(), M.nops[0]++;
        else if (r < 6500)
            op_get(), M.nops[1]++;
        else if (r < 7500)
            op_exists(), M.nops[2]++;
        else if (r < 8700)
            op_prefix(), M.nops[3]++;
        else if (r < 9998)
            op_remove(), M.nops[4]++;
        else
            op_remove_all(), M.nops[5]++;
        check_stats();
        if (M.step % 5000 == 4999)
            audit();
    }
    audit();
    check_stats();
    kvp_pool_stats_t s = kvp_ct_stats(M.pool);
    fprintf(stderr, "test_pool_model: ops put %ld get %ld exists %ld prefix %ld remove %ld "
            "remove_all %ld; committed %" PRIu64 " evicted %" PRIu64 " removed %" PRIu64
            " reset %" PRIu64 " hits %" PRIu64 " misses %" PRIu64 " existed %" PRIu64
            " no_space %" PRIu64 "\n", M.nops[0], M.nops[1], M.nops[2], M.nops[3], M.nops[4],
            M.nops[5], M.committed, s.evicted - M.base.evicted, M.removed, M.reset, M.hits,
            M.misses, M.put_existed, M.put_no_space);
    /* The test must have exercised eviction, hits and idempotent puts. */
    MCHECK(s.evicted - M.base.evicted > (uint64_t)steps / 100, "too few evictions: %" PRIu64,
           s.evicted - M.base.evicted);
    MCHECK(M.hits > (uint64_t)steps / 20 && M.put_existed > (uint64_t)steps / 100,
           "too few hits (%" PRIu64 ") or existing puts (%" PRIu64 ")", M.hits, M.put_existed);
    /* Without pins every object is evictable: a put may never be refused. */
    MCHECK(M.put_no_space == 0, "%" PRIu64 " puts got KVP_ERR_NO_SPACE although nothing is pinned "
           "and values are <= 1 MiB in a " CAPACITY " pool", M.put_no_space);
    kvp_pool_close(M.pool);
    for (int k = 0; k < NKEYS; k++)
        free(M.keybytes[k]);
    free(M.src);
    free(M.dst);
}

static long steps_from_env(long dflt)
{
    const char *e = getenv("KVP_TEST_OPS");
    return e ? atol(e) : dflt;
}

TEST(test_model_100k_ops)
{
    model_run("embedded://?capacity=" CAPACITY, steps_from_env(100000));
}

/* The same with several shards, the memfd provider and other watermarks. */
TEST(test_model_shards_memfd)
{
    model_run("embedded://?capacity=" CAPACITY "&shards=4&provider=memfd&high_watermark=0.85"
              "&low_watermark=0.6",
              steps_from_env(100000) / 4);
}

TEST_LIST(T(test_model_100k_ops), T(test_model_shards_memfd))
