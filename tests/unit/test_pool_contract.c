/*
 * The pool contract (tests/unit/pool_contract.h) against the embedded
 * backend, plus what only the embedded backend promises: its URI options and
 * that it always completes now.
 */
#include "pool_contract.h"

#define URI "embedded://?capacity=8MiB"

#define DEF(name) \
    TEST(test_contract_##name) { kvp_contract_##name(URI); }
KVP_CONTRACT_LIST(DEF)
#undef DEF

/* Other arenas: memfd provider, several shards, other watermarks. */
TEST(test_contract_memfd_shards)
{
    static const char *uris[] = {
        "embedded://?capacity=8MiB&provider=memfd",
        "embedded://?capacity=8MiB&shards=4",
        "embedded://?capacity=4MiB&high_watermark=0.8&low_watermark=0.5",
    };
    for (size_t i = 0; i < sizeof uris / sizeof uris[0]; i++) {
        kvp_contract_put_get(uris[i]);
        kvp_contract_batch_partial(uris[i]);
        kvp_contract_eviction_watermarks(uris[i]);
        kvp_contract_pin(uris[i]);
        kvp_contract_remove_all(uris[i]);
    }
}

/* Opens uri (must succeed), checks one round trip, returns the stats. */
static kvp_pool_stats_t open_use_close(const char *uri)
{
    kvp_pool_t *pool = NULL;
    kvp_status_t st = kvp_pool_open(uri, &pool);
    ASSERT_MSG(st == KVP_OK, "kvp_pool_open(\"%s\") = %s", uri, kvp_status_name(st));
    kvp_pool_stats_t s = kvp_ct_stats(pool);
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "opt/a");
    kvp_ct_put_new(pool, a.k, 4000, 1);
    kvp_ct_get_ok(pool, a.k, 4000, 1);
    kvp_pool_close(pool);
    return s;
}

/* Watermark bytes = fraction * capacity (to a page). */
static void check_mark(uint64_t got, uint64_t cap, double frac, const char *what)
{
    double want = frac * (double)cap;
    ASSERT_MSG((double)got >= want - 4096.0 && (double)got <= want + 4096.0,
               "%s: %" PRIu64 " B, expected %.0f (%.2f of %" PRIu64 ")", what, got, want, frac, cap);
}

TEST(test_embedded_uri_sizes)
{
    static const struct {
        const char *uri;
        uint64_t bytes;
    } cases[] = {
        {"embedded://?capacity=4194304B", 4u << 20},
        {"embedded://?capacity=4194304", 4u << 20},
        {"embedded://?capacity=4096KiB", 4u << 20},
        {"embedded://?capacity=6MiB", 6u << 20},
        {"embedded://?capacity=1GiB", 1u << 30},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_pool_stats_t s = open_use_close(cases[i].uri);
        /* The arena may be rounded up to the page or huge page size; the
         * allocator may keep a few bytes of it for itself. */
        ASSERT_MSG(s.capacity_bytes + 4096 >= cases[i].bytes &&
                       s.capacity_bytes <= cases[i].bytes + (2u << 20),
                   "%s: capacity_bytes %" PRIu64, cases[i].uri, s.capacity_bytes);
    }
}

TEST(test_embedded_uri_watermarks)
{
    kvp_pool_stats_t s = open_use_close("embedded://?capacity=8MiB");
    check_mark(s.high_watermark_bytes, s.capacity_bytes, 0.95, "default high_watermark");
    check_mark(s.low_watermark_bytes, s.capacity_bytes, 0.90, "default low_watermark");
    s = open_use_close("embedded://?capacity=8MiB&high_watermark=0.8&low_watermark=0.5");
    check_mark(s.high_watermark_bytes, s.capacity_bytes, 0.8, "high_watermark=0.8");
    check_mark(s.low_watermark_bytes, s.capacity_bytes, 0.5, "low_watermark=0.5");
    s = open_use_close("embedded://?low_watermark=0.6&capacity=8MiB");
    check_mark(s.high_watermark_bytes, s.capacity_bytes, 0.95, "default high_watermark");
    check_mark(s.low_watermark_bytes, s.capacity_bytes, 0.6, "low_watermark=0.6");
}

TEST(test_embedded_uri_hugepages)
{
    open_use_close("embedded://?capacity=8MiB&hugepages=off");
    open_use_close("embedded://?capacity=8MiB&hugepages=auto");
    open_use_close("embedded://?capacity=8MiB&hugepages=auto&provider=memfd");
    open_use_close("embedded://?capacity=8MiB&hugepages=auto&provider=anon");
    /* `on` needs configured huge pages: succeed, or refuse clearly. */
    static const char *on[] = {
        "embedded://?capacity=8MiB&hugepages=on",
        "embedded://?capacity=8MiB&hugepages=on&provider=memfd",
    };
    for (size_t i = 0; i < 2; i++) {
        kvp_pool_t *pool = (kvp_pool_t *)&pool;
        kvp_status_t st = kvp_pool_open(on[i], &pool);
        if (st == KVP_OK) {
            kvp_pool_close(pool);
            open_use_close(on[i]);
        } else {
            ASSERT_MSG(st == KVP_ERR_NO_MEMORY || st == KVP_ERR_UNSUPPORTED,
                       "%s: %s (expected OK, NO_MEMORY or UNSUPPORTED)", on[i], kvp_status_name(st));
            ASSERT(pool == NULL);
        }
    }
}

TEST(test_embedded_uri_provider_timeout_shards)
{
    open_use_close("embedded://?capacity=8MiB&provider=anon");
    open_use_close("embedded://?capacity=8MiB&provider=memfd");
    open_use_close("embedded://?capacity=8MiB&put_timeout=30s");
    open_use_close("embedded://?capacity=8MiB&put_timeout=500ms");
    open_use_close("embedded://?capacity=8MiB&put_timeout=2m");
    open_use_close("embedded://?capacity=8MiB&shards=1");
    open_use_close("embedded://?capacity=8MiB&shards=8");
    open_use_close("embedded://?capacity=16MiB&high_watermark=0.9&low_watermark=0.8&hugepages=off"
                   "&provider=memfd&put_timeout=10s&shards=2");
}

/* The embedded backend always completes now: the callback never fires. */
static int g_fired;
static void count_cb(void *arg, kvp_status_t st)
{
    (void)arg;
    (void)st;
    g_fired++;
}

TEST(test_embedded_submit_completes_now)
{
    kvp_pool_t *pool = kvp_ct_open(URI);
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "now/a");
    uint8_t src[100], dst[100];
    kvp_ct_fill(src, 100, kvp_ct_seed(a.k, 1));
    kvp_iov_t piov = {src, 100}, giov = {dst, 100};
    kvp_sgl_t psgl = {&piov, 1}, gsgl = {&giov, 1};
    kvp_key_result_t r;
    uint8_t present;
    size_t m;
    uint64_t removed;
    kvp_op_t ops[7];
    memset(ops, 0, sizeof ops);
    ops[0] = (kvp_op_t){.type = KVP_OP_PUT, .keys = &a.k, .n = 1, .values = &psgl, .results = &r};
    ops[1] = (kvp_op_t){.type = KVP_OP_EXISTS, .keys = &a.k, .n = 1, .present = &present};
    ops[2] = (kvp_op_t){.type = KVP_OP_PREFIX, .keys = &a.k, .n = 1, .prefix_len = &m};
    ops[3] = (kvp_op_t){.type = KVP_OP_GET, .keys = &a.k, .n = 1, .values = &gsgl, .results = &r};
    ops[4] = (kvp_op_t){.type = KVP_OP_PIN, .keys = &a.k, .n = 1, .results = &r};
    ops[5] = (kvp_op_t){.type = KVP_OP_UNPIN, .keys = &a.k, .n = 1, .results = &r};
    ops[6] = (kvp_op_t){.type = KVP_OP_REMOVE_ALL, .removed = &removed};
    for (int i = 0; i < 7; i++) {
        ops[i].cb = count_cb;
        KVP_CT_ST(kvp_pool_submit(pool, &ops[i]), KVP_OK);
        if (ops[i].results)
            ASSERT_EQ(r.status, KVP_OK);
    }
    ASSERT_EQ(present, 1);
    ASSERT_EQ(m, 1);
    ASSERT_MEM_EQ(dst, src, 100);
    ASSERT_EQ(removed, 1);
    /* Fails now. */
    kvp_op_t bad = {.type = KVP_OP_GET, .keys = &a.k, .n = 1, .values = NULL, .results = &r,
                    .cb = count_cb};
    KVP_CT_ST(kvp_pool_submit(pool, &bad), KVP_ERR_NULL_POINTER);
    kvp_ct_sleep_ms(20);
    ASSERT_EQ(g_fired, 0);
    kvp_pool_close(pool);
}

/* Many open pools at once are independent. */
TEST(test_embedded_pools_independent)
{
    kvp_pool_t *p1 = kvp_ct_open("embedded://?capacity=4MiB");
    kvp_pool_t *p2 = kvp_ct_open("embedded://?capacity=4MiB&provider=memfd");
    kvp_ct_name_t a;
    KVP_CT_NAME(&a, "indep/a");
    kvp_ct_put_new(p1, a.k, 1000, 1);
    ASSERT_EQ(kvp_ct_exists1(p2, a.k), 0);
    kvp_ct_put_new(p2, a.k, 2000, 2);
    kvp_ct_get_ok(p1, a.k, 1000, 1);
    kvp_ct_get_ok(p2, a.k, 2000, 2);
    kvp_pool_close(p1);
    kvp_ct_get_ok(p2, a.k, 2000, 2);
    kvp_pool_close(p2);
}

#define REF(name) T(test_contract_##name),
TEST_LIST(KVP_CONTRACT_LIST(REF) T(test_contract_memfd_shards), T(test_embedded_uri_sizes),
          T(test_embedded_uri_watermarks), T(test_embedded_uri_hugepages),
          T(test_embedded_uri_provider_timeout_shards), T(test_embedded_submit_completes_now),
          T(test_embedded_pools_independent))
