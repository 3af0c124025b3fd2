/*
 * The membership filter (common/cfilter.h, docs/transport.md §10): the
 * filter alone (no false negatives, a bounded false-positive rate, stuck
 * counters), the store keeping it over its live keys through every way a
 * key comes and goes, and real server processes whose clients on this host
 * answer lookups (EXISTS, PREFIX) of absent keys themselves: checked by the server's own
 * request counters, which such a lookup leaves alone, and by a put on one
 * handle always seen by the next lookup on another.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "common/cfilter.h"
#include "common/mix.h"
#include "server_harness.h"
#include "store/store.h"

/* ---- the filter alone ---- */

static uint8_t *filter_mem(uint64_t nblocks)
{
    uint8_t *m = aligned_alloc(KVP_CF_BLOCK, (size_t)(nblocks * KVP_CF_BLOCK));
    ASSERT(m != NULL);
    memset(m, 0xAB, (size_t)(nblocks * KVP_CF_BLOCK)); /* init must zero it */
    return m;
}

static int all_zero(const uint8_t *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (m[i])
            return 0;
    return 1;
}

TEST(test_cfilter_no_false_negatives_bounded_false_positives)
{
    const uint64_t nb = 1024; /* 65,536 counters */
    const int nkeys = 8192;   /* 4 counters a key: half of them set, about */
    uint8_t *mem = filter_mem(nb);
    kvp__cfilter_t f;
    kvp__cfilter_init(&f, mem, nb);
    ASSERT(all_zero(mem, nb * KVP_CF_BLOCK));
    uint64_t st = 1;
    for (int i = 0; i < nkeys; i++)
        kvp__cfilter_add(&f, kvp__splitmix64(&st));
    ASSERT_EQ(atomic_load(&f.keys), (uint64_t)nkeys);
    /* A reader through its own view of the same memory sees every key. */
    kvp__cfilter_t r;
    kvp__cfilter_attach(&r, mem, nb);
    st = 1;
    for (int i = 0; i < nkeys; i++)
        ASSERT_EQ(kvp__cfilter_maybe(&r, kvp__splitmix64(&st)), 1);
    /* Keys never added: the blocked filter's rate at this load is about
     * 3 % ((1 - e^-0.5)^4 = 2.4 % unblocked). */
    uint64_t other = 0x5eed, fp = 0;
    const int probes = 200000;
    for (int i = 0; i < probes; i++)
        fp += (uint64_t)kvp__cfilter_maybe(&r, kvp__splitmix64(&other) | (1ull << 63) /* (another stream) */);
    double rate = (double)fp / probes;
    printf("    false positives %.4f at %d keys / %llu counters\n", rate, nkeys,
           (unsigned long long)(nb * KVP_CF_BLOCK));
    ASSERT_MSG(rate > 0.001 && rate < 0.06, "false-positive rate %.4f", rate);
    /* Every key deleted: every counter is back at 0, nothing is maybe. */
    st = 1;
    for (int i = 0; i < nkeys; i++)
        kvp__cfilter_del(&f, kvp__splitmix64(&st));
    ASSERT_EQ(atomic_load(&f.keys), 0);
    ASSERT(all_zero(mem, nb * KVP_CF_BLOCK));
    st = 1;
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ(kvp__cfilter_maybe(&r, kvp__splitmix64(&st)), 0);
    /* No filter: everything may be there. */
    kvp__cfilter_t none;
    kvp__cfilter_attach(&none, NULL, 0);
    ASSERT_EQ(kvp__cfilter_maybe(&none, 42), 1);
    free(mem);
}

TEST(test_cfilter_saturated_counters_stay)
{
    uint8_t *mem = filter_mem(1);
    kvp__cfilter_t f;
    kvp__cfilter_init(&f, mem, 1);
    const uint64_t h = 0x1234567890abcdefull;
    for (int i = 0; i < 300; i++)
        kvp__cfilter_add(&f, h);
    uint64_t stuck = atomic_load(&f.saturated);
    ASSERT(stuck >= 1 && stuck <= KVP_CF_K);
    int at_max = 0, others = 0;
    for (unsigned i = 0; i < KVP_CF_BLOCK; i++) {
        at_max += mem[i] == 255;
        others += mem[i] != 255 && mem[i] != 0;
    }
    ASSERT_EQ((uint64_t)at_max, stuck);
    ASSERT_EQ(others, 0);
    /* Deleting as often as added leaves the stuck counters stuck: the key
     * reads as maybe-present (a false positive), never the other way. */
    for (int i = 0; i < 300; i++)
        kvp__cfilter_del(&f, h);
    ASSERT_EQ(atomic_load(&f.keys), 0);
    ASSERT_EQ(kvp__cfilter_maybe(&f, h), 1);
    for (unsigned i = 0; i < KVP_CF_BLOCK; i++)
        ASSERT(mem[i] == 0 || mem[i] == 255);
    free(mem);
}

/* ---- the store keeping it ---- */

static kvp__store_t *filtered_store(uint64_t cap, uint8_t **mem_p, uint64_t nb)
{
    kvp__store_params_t p;
    kvp__store_params_default(&p);
    p.capacity = cap;
    p.shards = 16;
    kvp__store_t *s = NULL;
    ASSERT_OK(kvp__store_create(&p, &s));
    *mem_p = filter_mem(nb);
    ASSERT_OK(kvp__store_set_filter(s, *mem_p, nb));
    ASSERT_EQ(kvp__store_set_filter(s, *mem_p, nb), KVP_ERR_INVALID_ARG); /* once */
    return s;
}

static kvp_status_t sput(kvp__store_t *s, const char *key, size_t len)
{
    static char val[16384];
    kvp_iov_t iov = {val, len};
    kvp_sgl_t sgl = {&iov, 1};
    uint32_t flags;
    return kvp__store_put(s, key, (uint32_t)strlen(key), &sgl, len, &flags);
}

static int smaybe(kvp__store_t *s, const char *key)
{
    return kvp__cfilter_maybe(kvp__store_filter(s), kvp__key_hash(key, (uint32_t)strlen(key)));
}

TEST(test_store_filter_follows_the_index)
{
    const uint64_t nb = 4096;
    uint8_t *mem;
    kvp__store_t *s = filtered_store(4u << 20, &mem, nb);
    char key[32];
    /* puts (a repeated put is one key), removes */
    for (int i = 0; i < 200; i++) {
        snprintf(key, sizeof key, "k%04d", i);
        ASSERT_OK(sput(s, key, 100));
        ASSERT_OK(sput(s, key, 100));
        ASSERT_EQ(smaybe(s, key), 1);
    }
    ASSERT_EQ(atomic_load(&kvp__store_filter(s)->keys), 200);
    for (int i = 0; i < 50; i++) {
        snprintf(key, sizeof key, "k%04d", i);
        ASSERT_OK(kvp__store_remove(s, key, (uint32_t)strlen(key)));
    }
    ASSERT_EQ(atomic_load(&kvp__store_filter(s)->keys), 150);
    /* eviction: far more than fits; what is live is in the filter and
     * nothing else is counted */
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "big%04d", i);
        ASSERT_OK(sput(s, key, 16384));
    }
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    ASSERT_GT(st.evicted, 0);
    ASSERT_EQ(atomic_load(&kvp__store_filter(s)->keys), st.live);
    for (int i = 0; i < 1000; i++) {
        snprintf(key, sizeof key, "big%04d", i);
        if (kvp__store_exists(s, key, (uint32_t)strlen(key)))
            ASSERT_EQ(smaybe(s, key), 1);
    }
    /* remove_all: every counter back at 0 */
    kvp__store_remove_all(s);
    ASSERT_EQ(atomic_load(&kvp__store_filter(s)->keys), 0);
    ASSERT(all_zero(mem, nb * KVP_CF_BLOCK));
    ASSERT_EQ(smaybe(s, "k0100"), 0);
    kvp__store_destroy(s);
    free(mem);

    /* Only on an empty store. */
    kvp__store_params_t p;
    kvp__store_params_default(&p);
    p.capacity = 1u << 20;
    ASSERT_OK(kvp__store_create(&p, &s));
    ASSERT_OK(sput(s, "x", 10));
    mem = filter_mem(16);
    ASSERT_EQ(kvp__store_set_filter(s, mem, 16), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__store_filter(s)->c, NULL);
    kvp__store_destroy(s);
    free(mem);
}

/* ---- a server and its clients on this host ---- */

static double lookups_served(const server_t *s)
{
    return metric_now(s, "kvpool_requests_total{op=\"exists\"}") +
           metric_now(s, "kvpool_requests_total{op=\"prefix\"}") + metric_now(s, "kvpool_requests_total{op=\"get\"}") +
           metric_now(s, "kvpool_requests_total{op=\"get_local\"}");
}

static void put_small(kvp_pool_t *p, const char *key)
{
    kvp_status_t st;
    put_pattern(p, key, 64, 3, &st);
    ASSERT_OK(st);
}

static void exists2(kvp_pool_t *p, const char *a, const char *b, uint8_t *out)
{
    kvp_key_t k[2] = {kvp_key_str(a), kvp_key_str(b)};
    ASSERT_OK(kvp_pool_exists(p, k, 2, out));
}

TEST(test_server_filter_answers_absent_keys_locally)
{
    server_t s = {0};
    server_start_metrics(&s, "64MiB");
    kvp_pool_t *p = open_ok(s.uri);
    put_small(p, "here");
    ASSERT_EQ(metric_now(&s, "kvpool_filter_keys"), 1);
    ASSERT_GT(metric_now(&s, "kvpool_filter_counters"), 0);
    double before = lookups_served(&s);
    /* Absent keys, every one: answered here. */
    uint8_t pr[2] = {9, 9};
    exists2(p, "gone1", "gone2", pr);
    ASSERT(pr[0] == 0 && pr[1] == 0);
    kvp_key_t pk[2] = {kvp_key_str("gone1"), kvp_key_str("here")};
    size_t m = 9;
    ASSERT_OK(kvp_pool_prefix(p, pk, 2, &m));
    ASSERT_EQ(m, 0);
    ASSERT_EQ(lookups_served(&s), before);
    /* A get is the server's to answer (it counts its misses). */
    ASSERT_EQ(check_pattern(p, "gone1", 64, 3), 0);
    ASSERT_EQ(lookups_served(&s), before + 1);
    ASSERT_EQ(metric_now(&s, "kvpool_get_total{result=\"miss\"}"), 1);
    before += 1;
    /* A present key among them: the server answers, exactly. */
    exists2(p, "here", "gone2", pr);
    ASSERT(pr[0] == 1 && pr[1] == 0);
    kvp_key_t pk2[3] = {kvp_key_str("here"), kvp_key_str("gone1"), kvp_key_str("gone2")};
    ASSERT_OK(kvp_pool_prefix(p, pk2, 3, &m));
    ASSERT_EQ(m, 1);
    ASSERT_EQ(check_pattern(p, "here", 64, 3), 1);
    ASSERT_EQ(lookups_served(&s), before + 3);
    /* Gone again (removed): answered here once more. */
    kvp_key_t hk = kvp_key_str("here");
    kvp_key_result_t rr;
    ASSERT_OK(kvp_pool_remove(p, &hk, 1, &rr));
    ASSERT_OK(rr.status);
    ASSERT_EQ(metric_now(&s, "kvpool_filter_keys"), 0);
    exists2(p, "here", "gone2", pr);
    ASSERT(pr[0] == 0 && pr[1] == 0);
    ASSERT_EQ(lookups_served(&s), before + 3);
    kvp_pool_close(p);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* Every put answered on one handle is seen by the next lookup on another
 * (the filter's add comes before the put's reply), while a third thread
 * removes other keys (counters shared with keys that leave). */
typedef struct {
    const char *uri;
    _Atomic int stop;
} churn_t;

static void *churn_main(void *arg)
{
    churn_t *c = arg;
    kvp_pool_t *p = open_ok(c->uri);
    char key[32];
    for (int i = 0; !atomic_load(&c->stop); i++) {
        snprintf(key, sizeof key, "churn%d", i % 64);
        put_small(p, key);
        kvp_key_t k = kvp_key_str(key);
        kvp_key_result_t r;
        ASSERT_OK(kvp_pool_remove(p, &k, 1, &r));
    }
    kvp_pool_close(p);
    return NULL;
}

TEST(test_server_filter_put_then_lookup_elsewhere_sees_it)
{
    server_t s = {0};
    s.extra = "--filter-bytes 4KiB"; /* small: counters are shared */
    server_start_metrics(&s, "64MiB");
    kvp_pool_t *a = open_ok(s.uri), *b = open_ok(s.uri);
    churn_t c = {.uri = s.uri};
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, churn_main, &c), 0);
    char key[32];
    for (int i = 0; i < 1500; i++) {
        snprintf(key, sizeof key, "seen%d", i);
        put_small(a, key);
        kvp_key_t k = kvp_key_str(key);
        uint8_t pr = 0;
        ASSERT_OK(kvp_pool_exists(b, &k, 1, &pr));
        ASSERT_MSG(pr == 1, "%s put on one handle, absent on the next lookup on another", key);
        if (i % 3 == 0) { /* and gone once removed */
            kvp_key_result_t r;
            ASSERT_OK(kvp_pool_remove(a, &k, 1, &r));
            ASSERT_OK(kvp_pool_exists(b, &k, 1, &pr));
            ASSERT_EQ(pr, 0);
        }
    }
    atomic_store(&c.stop, 1);
    pthread_join(t, NULL);
    ASSERT_EQ(metric_now(&s, "kvpool_filter_counters"), 4096);
    ASSERT_EQ(metric_now(&s, "kvpool_filter_keys"), 1000);
    kvp_pool_close(a);
    kvp_pool_close(b);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST(test_server_filter_switched_off)
{
    /* Server side: --filter-bytes 0, or no local reads.  Client side:
     * local_reads=off, or kvpool's TCP transport (the filter comes with the
     * local-read mapping).  Every lookup goes to the server. */
    const char *extras[] = {"--filter-bytes 0", "--no-local-reads", NULL, NULL};
    const char *suffixes[] = {"", "", "&local_reads=off", "&transport=tcp"};
    for (int i = 0; i < 4; i++) {
        server_t s = {0};
        s.extra = extras[i];
        server_start_metrics(&s, "16MiB");
        char uri[256];
        snprintf(uri, sizeof uri, "%s%s", s.uri, suffixes[i]);
        kvp_pool_t *p = open_ok(uri);
        put_small(p, "here");
        ASSERT_EQ(metric_now(&s, "kvpool_filter_counters"), i < 2 ? 0 : 65536); /* (the smallest default) */
        double before = lookups_served(&s);
        uint8_t pr[2];
        exists2(p, "gone1", "gone2", pr);
        ASSERT(pr[0] == 0 && pr[1] == 0);
        ASSERT_EQ(lookups_served(&s), before + 1);
        kvp_pool_close(p);
        ASSERT_EQ(server_stop(&s, SIGTERM), 0);
    }
}

TEST_LIST(T(test_cfilter_no_false_negatives_bounded_false_positives), T(test_cfilter_saturated_counters_stay),
          T(test_store_filter_follows_the_index), T(test_server_filter_answers_absent_keys_locally),
          T(test_server_filter_put_then_lookup_elsewhere_sees_it), T(test_server_filter_switched_off))
