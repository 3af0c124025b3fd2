/*
 * Allocation-failure injection (src/common/alloc.h).
 *
 * open: for n = 0, 1, 2, ... the (n+1)-th allocation of kvp_pool_open fails
 * (arena providers consult the same switch); every attempt must return
 * KVP_ERR_NO_MEMORY, leave *pool_p NULL and leak nothing, until one attempt
 * has all it needs and succeeds.  After close, the shim's byte count is back
 * to where it started.
 *
 * Data operations: the same walk over n for put, get, exists, prefix,
 * remove, pin and remove_all.  A call that meets a failed allocation must
 * answer KVP_ERR_NO_MEMORY for the call or for the affected keys and change
 * nothing visible; whatever it reports as done must be done.
 */
#include "pool_contract.h"

#include "common/alloc.h"

#define MAX_STEPS 100000

static void open_walk(const char *uri)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_pool_t *pool = NULL;
    long n;
    for (n = 0; n < MAX_STEPS; n++) {
        pool = (kvp_pool_t *)&pool; /* not NULL: a failed open must clear it */
        kvp__alloc_fail_after(n);
        kvp_status_t st = kvp_pool_open(uri, &pool);
        kvp__alloc_fail_reset();
        if (st == KVP_OK)
            break;
        ASSERT_MSG(st == KVP_ERR_NO_MEMORY, "%s, allocation %ld failing: %s (expected "
                   "KVP_ERR_NO_MEMORY)", uri, n, kvp_status_name(st));
        ASSERT_MSG(pool == NULL, "%s, allocation %ld failing: *pool_p not NULL", uri, n);
        ASSERT_MSG(kvp__alloc_bytes_in_use() == base, "%s, allocation %ld failing: %lld bytes "
                   "leaked", uri, n, (long long)(kvp__alloc_bytes_in_use() - base));
    }
    ASSERT_MSG(n < MAX_STEPS, "%s: open never succeeded", uri);
    ASSERT_MSG(n >= 2, "%s: open succeeded with only %ld allocations", uri, n);
    fprintf(stderr, "%s: open needs %ld allocations\n", uri, n);
    /* The pool that finally opened works. */
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "af/a");
    kvp_ct_put_new(pool, a.k, 5000, 1);
    kvp_ct_get_ok(pool, a.k, 5000, 1);
    kvp_pool_close(pool);
    ASSERT_MSG(kvp__alloc_bytes_in_use() == base, "%s: %lld bytes still allocated after close",
               uri, (long long)(kvp__alloc_bytes_in_use() - base));
}

TEST(test_alloc_fail_open)
{
    open_walk("embedded://?capacity=8MiB");
}

TEST(test_alloc_fail_open_memfd)
{
    open_walk("embedded://?capacity=8MiB&provider=memfd");
}

TEST(test_alloc_fail_open_shards)
{
    open_walk("embedded://?capacity=8MiB&shards=4&hugepages=auto");
}

/* ---- put */

enum { NB = 6 };

/* One put batch {existing key, NB-1 fresh keys} with allocation n failing.
 * Returns 1 when every key got through without a failure. */
static int put_step(kvp_pool_t *pool, long n, const kvp_ct_name_t *old)
{
    kvp_ct_name_t nm[NB];
    kvp_key_t keys[NB];
    kvp_ct_val_t v[NB];
    kvp_sgl_t sgl[NB];
    kvp_key_result_t res[NB];
    keys[0] = old->k;
    for (int i = 1; i < NB; i++) {
        KVP_CT_NAME(&nm[i], "af/put/%ld/%d", n, i);
        keys[i] = nm[i].k;
    }
    for (int i = 0; i < NB; i++) {
        kvp_ct_val_init(&v[i], keys[i], 1000 + (size_t)i * 3000, i == 0 ? 7 : 1);
        sgl[i] = v[i].sgl;
    }
    kvp_pool_stats_t s0 = kvp_ct_stats(pool);
    memset(res, 0xEE, sizeof res);
    kvp__alloc_fail_after(n);
    kvp_status_t st = kvp_pool_put(pool, keys, sgl, NB, res);
    kvp__alloc_fail_reset();
    kvp_pool_stats_t s1 = kvp_ct_stats(pool);
    int clean = 0;
    if (st == KVP_ERR_NO_MEMORY) {
        /* Refused as a whole: nothing stored. */
        ASSERT_MSG(s1.committed == s0.committed && s1.live == s0.live &&
                       s1.live_bytes == s0.live_bytes && s1.used_bytes == s0.used_bytes &&
                       s1.reserved == s0.reserved,
                   "put refused with NO_MEMORY (allocation %ld) but stats changed", n);
        for (int i = 1; i < NB; i++)
            ASSERT_MSG(!kvp_ct_exists1(pool, keys[i]), "put refused with NO_MEMORY (allocation "
                       "%ld) but key %d was stored", n, i);
    } else {
        ASSERT_MSG(st == KVP_OK, "put with allocation %ld failing: %s", n, kvp_status_name(st));
        uint64_t stored = 0, bytes = 0;
        clean = 1;
        ASSERT_MSG(res[0].status == KVP_OK ? (res[0].flags & KVP_RESULT_EXISTED) != 0
                                            : res[0].status == KVP_ERR_NO_MEMORY,
                   "existing key: %s flags %u", kvp_status_name(res[0].status), res[0].flags);
        clean &= res[0].status == KVP_OK;
        for (int i = 1; i < NB; i++) {
            size_t sz = 1000 + (size_t)i * 3000;
            if (res[i].status == KVP_OK) {
                ASSERT(!(res[i].flags & KVP_RESULT_EXISTED));
                kvp_ct_get_ok(pool, keys[i], sz, 1);
                stored++;
                bytes += sz;
            } else {
                ASSERT_MSG(res[i].status == KVP_ERR_NO_MEMORY, "key %d with allocation %ld "
                           "failing: %s", i, n, kvp_status_name(res[i].status));
                ASSERT_MSG(!kvp_ct_exists1(pool, keys[i]), "key %d failed with NO_MEMORY but "
                           "is stored", i);
                clean = 0;
            }
        }
        ASSERT_EQ(s1.committed - s0.committed, stored);
        ASSERT_EQ(s1.live - s0.live, stored);
        ASSERT_EQ(s1.live_bytes - s0.live_bytes, bytes);
        ASSERT_EQ(s1.reserved, s0.reserved);
    }
    kvp_ct_get_ok(pool, old->k, 4321, 1); /* the existing value never changes */
    for (int i = 0; i < NB; i++)
        free(v[i].buf);
    return clean;
}

static void put_walk(const char *uri)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_pool_t *pool = kvp_ct_open(uri);
    kvp_ct_name_t old;
    KVP_CT_NAME(&old, "af/old");
    kvp_ct_put_new(pool, old.k, 4321, 1);
    long n;
    for (n = 0; n < 1000; n++)
        if (put_step(pool, n, &old))
            break;
    ASSERT_MSG(n < 1000, "put never succeeded under injection");
    /* The pool still works normally. */
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "af/after");
    kvp_ct_put_new(pool, a.k, 9999, 3);
    kvp_ct_get_ok(pool, a.k, 9999, 3);
    kvp_pool_close(pool);
    ASSERT_MSG(kvp__alloc_bytes_in_use() == base, "%lld bytes still allocated after close",
               (long long)(kvp__alloc_bytes_in_use() - base));
}

TEST(test_alloc_fail_put)
{
    put_walk("embedded://?capacity=8MiB");
}

/* One shard: a big batch makes the index grow while allocations fail. */
TEST(test_alloc_fail_put_index_growth)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_pool_t *pool = kvp_ct_open("embedded://?capacity=32MiB&shards=1");
    enum { N = 3000 };
    kvp_ct_name_t *nm = (kvp_ct_name_t *)kvp_ct_xmalloc(sizeof(kvp_ct_name_t) * N);
    kvp_key_t *keys = (kvp_key_t *)kvp_ct_xmalloc(sizeof(kvp_key_t) * N);
    kvp_sgl_t *sgl = (kvp_sgl_t *)kvp_ct_xmalloc(sizeof(kvp_sgl_t) * N);
    kvp_iov_t *iov = (kvp_iov_t *)kvp_ct_xmalloc(sizeof(kvp_iov_t) * N);
    kvp_key_result_t *res = (kvp_key_result_t *)kvp_ct_xmalloc(sizeof(kvp_key_result_t) * N);
    uint8_t *vals = (uint8_t *)kvp_ct_xmalloc((size_t)N * 64);
    uint8_t *present = (uint8_t *)kvp_ct_xmalloc(N);
    for (int i = 0; i < N; i++) {
        KVP_CT_NAME(&nm[i], "af/grow/%d", i);
        keys[i] = nm[i].k;
        kvp_ct_fill(vals + (size_t)i * 64, 64, kvp_ct_seed(keys[i], 1));
        iov[i].base = vals + (size_t)i * 64;
        iov[i].len = 64;
        sgl[i].iov = &iov[i];
        sgl[i].iovcnt = 1;
    }
    /* Fail after a growing number of allocations: each round stores some
     * keys, so the index grows through failures. */
    for (long fail = 0; fail < 40; fail += 3) {
        kvp_pool_stats_t s0 = kvp_ct_stats(pool);
        memset(res, 0xEE, sizeof(kvp_key_result_t) * N);
        kvp__alloc_fail_after(fail);
        kvp_status_t st = kvp_pool_put(pool, keys, sgl, N, res);
        kvp__alloc_fail_reset();
        kvp_pool_stats_t s1 = kvp_ct_stats(pool);
        if (st == KVP_ERR_NO_MEMORY) {
            ASSERT_EQ(s1.committed, s0.committed);
            continue;
        }
        ASSERT_MSG(st == KVP_OK, "put of %d keys, allocation %ld failing: %s", N, fail,
                   kvp_status_name(st));
        uint64_t created = 0;
        for (int i = 0; i < N; i++) {
            ASSERT_MSG(res[i].status == KVP_OK || res[i].status == KVP_ERR_NO_MEMORY,
                       "key %d: %s", i, kvp_status_name(res[i].status));
            created += res[i].status == KVP_OK && !(res[i].flags & KVP_RESULT_EXISTED);
        }
        ASSERT_EQ(s1.committed - s0.committed, created);
        KVP_CT_ST(kvp_pool_exists(pool, keys, N, present), KVP_OK);
        uint64_t live = 0;
        for (int i = 0; i < N; i++) {
            if (res[i].status == KVP_OK)
                ASSERT_MSG(present[i], "key %d reported stored but absent", i);
            live += present[i];
        }
        ASSERT_EQ(live, s1.live);
    }
    /* Without injection everything goes in, and every value is intact. */
    KVP_CT_ST(kvp_pool_put(pool, keys, sgl, N, res), KVP_OK);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(res[i].status, KVP_OK);
    for (int i = 0; i < N; i += 7)
        kvp_ct_get_ok(pool, keys[i], 64, 1);
    kvp_pool_stats_t s = kvp_ct_stats(pool);
    ASSERT_EQ(s.live, N);
    kvp_pool_close(pool);
    free(nm), free(keys), free(sgl), free(iov), free(res), free(vals), free(present);
    ASSERT_MSG(kvp__alloc_bytes_in_use() == base, "%lld bytes still allocated after close",
               (long long)(kvp__alloc_bytes_in_use() - base));
}

/* ---- other operations: correct answer or NO_MEMORY with nothing changed */

TEST(test_alloc_fail_other_ops)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_pool_t *pool = kvp_ct_open("embedded://?capacity=8MiB");
    kvp_ct_name_t nm[4];
    kvp_key_t keys[4];
    for (int i = 0; i < 4; i++) {
        KVP_CT_NAME(&nm[i], "af/ops/%d", i);
        keys[i] = nm[i].k;
        if (i != 2)
            kvp_ct_put_new(pool, keys[i], 3000 + (size_t)i, 1);
    }
    uint8_t buf[4][4000];
    kvp_iov_t iov[4];
    kvp_sgl_t sgl[4];
    for (int i = 0; i < 4; i++) {
        iov[i].base = buf[i], iov[i].len = sizeof buf[i];
        sgl[i].iov = &iov[i], sgl[i].iovcnt = 1;
    }
    for (long n = 0; n < 8; n++) {
        kvp_pool_stats_t s0 = kvp_ct_stats(pool);
        kvp_key_result_t res[4];
        uint8_t present[4];
        size_t m = 99;

        /* get */
        memset(res, 0xEE, sizeof res);
        kvp__alloc_fail_after(n);
        kvp_status_t st = kvp_pool_get(pool, keys, sgl, 4, res);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "get: %s", kvp_status_name(st));
        if (st == KVP_OK)
            for (int i = 0; i < 4; i++) {
                if (res[i].status == KVP_ERR_NO_MEMORY)
                    continue;
                ASSERT_EQ(res[i].status, i == 2 ? KVP_ERR_NOT_FOUND : KVP_OK);
                if (i != 2)
                    ASSERT_EQ(kvp_ct_check(buf[i], 3000 + (size_t)i, kvp_ct_seed(keys[i], 1)),
                              SIZE_MAX);
            }
        /* exists, prefix */
        memset(present, 0xEE, sizeof present);
        kvp__alloc_fail_after(n);
        st = kvp_pool_exists(pool, keys, 4, present);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "exists: %s", kvp_status_name(st));
        if (st == KVP_OK)
            ASSERT(present[0] == 1 && present[1] == 1 && present[2] == 0 && present[3] == 1);
        kvp__alloc_fail_after(n);
        st = kvp_pool_prefix(pool, keys, 4, &m);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "prefix: %s", kvp_status_name(st));
        if (st == KVP_OK)
            ASSERT_EQ(m, 2);
        /* pin + unpin */
        memset(res, 0xEE, sizeof res);
        kvp__alloc_fail_after(n);
        st = kvp_pool_pin(pool, keys, 2, 1, res);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "pin: %s", kvp_status_name(st));
        KVP_CT_ST(kvp_pool_pin(pool, keys, 2, 0, res), KVP_OK);
        /* remove of a missing key (changes nothing either way) */
        kvp__alloc_fail_after(n);
        st = kvp_pool_remove(pool, keys + 2, 1, res);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "remove: %s", kvp_status_name(st));
        if (st == KVP_OK)
            ASSERT(res[0].status == KVP_ERR_NOT_FOUND || res[0].status == KVP_ERR_NO_MEMORY);
        kvp_pool_stats_t s1 = kvp_ct_stats(pool);
        ASSERT_EQ(s1.live, s0.live);
        ASSERT_EQ(s1.committed, s0.committed);
        ASSERT_EQ(s1.pinned, s0.pinned);
        ASSERT_EQ(s1.used_bytes, s0.used_bytes);
        /* stats itself under injection */
        kvp_pool_stats_t s2;
        kvp__alloc_fail_after(n);
        st = kvp_pool_stats(pool, &s2);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "stats: %s", kvp_status_name(st));
    }
    /* remove_all under injection: all or (NO_MEMORY and) nothing. */
    for (long n = 0; n < 4; n++) {
        kvp_pool_stats_t s0 = kvp_ct_stats(pool);
        uint64_t removed = 0;
        kvp__alloc_fail_after(n);
        kvp_status_t st = kvp_pool_remove_all(pool, &removed);
        kvp__alloc_fail_reset();
        kvp_pool_stats_t s1 = kvp_ct_stats(pool);
        if (st == KVP_OK) {
            ASSERT_EQ(removed, s0.live);
            ASSERT_EQ(s1.live, 0);
            break;
        }
        ASSERT_MSG(st == KVP_ERR_NO_MEMORY, "remove_all: %s", kvp_status_name(st));
        ASSERT_EQ(s1.live, s0.live);
    }
    kvp_pool_close(pool);
    ASSERT_MSG(kvp__alloc_bytes_in_use() == base, "%lld bytes still allocated after close",
               (long long)(kvp__alloc_bytes_in_use() - base));
}

TEST_LIST(T(test_alloc_fail_open), T(test_alloc_fail_open_memfd), T(test_alloc_fail_open_shards),
          T(test_alloc_fail_put), T(test_alloc_fail_put_index_growth),
          T(test_alloc_fail_other_ops))
