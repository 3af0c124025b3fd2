/* EC metadata msgpack codec (round trips, every truncation and random
 * corruption rejected cleanly) and the strict JSON parser of events. */
#include "golden.h"
#include "test.h"

#include "common/alloc.h"
#include "ec/ec_json.h"
#include "common/strmap.h"
#include "kvpool/ec_connector.h"

static char *S(const char *s) { return kvp__strdup(s); }

static int64_t *shape2(int64_t a, int64_t b)
{
    int64_t *s = kvp__malloc(2 * sizeof *s);
    s[0] = a;
    s[1] = b;
    return s;
}

static void make_meta(kvp_ec_meta_t *m)
{
    memset(m, 0, sizeof *m);
    m->n_freed = 2;
    m->freed = kvp__calloc(2, sizeof *m->freed);
    m->freed[0] = S("H6");
    m->freed[1] = S("H7");
    m->n_store_candidates = 1;
    m->store_candidates = kvp__calloc(1, sizeof *m->store_candidates);
    m->store_candidates[0].identifier = S("H1");
    m->store_candidates[0].spec = (kvp_ec_tensor_spec_t){shape2(16, 8), 2, S("torch.float16"), 256};
    m->n_pushes = 1;
    m->pushes = kvp__calloc(1, sizeof *m->pushes);
    m->pushes[0] = (kvp_ec_push_spec_t){S("H2"), 1LL << 40, shape2(1 << 20, 4096), 2, S("bfloat16"),
                                        S("tcp://10.0.0.3:7000"), S("t2"), S("r5")};
    m->n_loads = 2;
    m->loads = kvp__calloc(2, sizeof *m->loads);
    m->loads[0] = (kvp_ec_load_spec_t){S("H3"), 64, shape2(4, 8), 2, S("bfloat16"), S("tx4"), 0, true};
    m->loads[1] = (kvp_ec_load_spec_t){S("H\xc3\xa9"), -5, NULL, 0, S(""), S("r5:0"), -1, false};
}

static void assert_meta_eq(const kvp_ec_meta_t *a, const kvp_ec_meta_t *b)
{
    ASSERT_EQ(a->n_freed, b->n_freed);
    for (size_t i = 0; i < a->n_freed; i++)
        ASSERT_STR_EQ(a->freed[i], b->freed[i]);
    ASSERT_EQ(a->n_store_candidates, b->n_store_candidates);
    for (size_t i = 0; i < a->n_store_candidates; i++) {
        ASSERT_STR_EQ(a->store_candidates[i].identifier, b->store_candidates[i].identifier);
        ASSERT_STR_EQ(a->store_candidates[i].spec.dtype, b->store_candidates[i].spec.dtype);
        ASSERT_EQ(a->store_candidates[i].spec.nbytes, b->store_candidates[i].spec.nbytes);
        ASSERT_EQ(a->store_candidates[i].spec.ndim, b->store_candidates[i].spec.ndim);
    }
    ASSERT_EQ(a->n_pushes, b->n_pushes);
    for (size_t i = 0; i < a->n_pushes; i++) {
        ASSERT_STR_EQ(a->pushes[i].mm_hash, b->pushes[i].mm_hash);
        ASSERT_STR_EQ(a->pushes[i].consumer_zmq, b->pushes[i].consumer_zmq);
        ASSERT_STR_EQ(a->pushes[i].transfer_id, b->pushes[i].transfer_id);
        ASSERT_STR_EQ(a->pushes[i].request_id, b->pushes[i].request_id);
        ASSERT_EQ(a->pushes[i].nbytes, b->pushes[i].nbytes);
        ASSERT_EQ(a->pushes[i].shape[0], b->pushes[i].shape[0]);
        ASSERT_EQ(a->pushes[i].shape[1], b->pushes[i].shape[1]);
    }
    ASSERT_EQ(a->n_loads, b->n_loads);
    for (size_t i = 0; i < a->n_loads; i++) {
        ASSERT_STR_EQ(a->loads[i].mm_hash, b->loads[i].mm_hash);
        ASSERT_STR_EQ(a->loads[i].transfer_id, b->loads[i].transfer_id);
        ASSERT_STR_EQ(a->loads[i].dtype, b->loads[i].dtype);
        ASSERT_EQ(a->loads[i].nbytes, b->loads[i].nbytes);
        ASSERT_EQ(a->loads[i].num_token, b->loads[i].num_token);
        ASSERT_EQ(a->loads[i].local, b->loads[i].local);
        ASSERT_EQ(a->loads[i].ndim, b->loads[i].ndim);
        for (size_t k = 0; k < a->loads[i].ndim; k++)
            ASSERT_EQ(a->loads[i].shape[k], b->loads[i].shape[k]);
    }
}

TEST(test_ec_meta_roundtrip)
{
    kvp_ec_meta_t m, d;
    make_meta(&m);
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_ec_meta_encode(&m, &buf, &len));
    ASSERT_OK(kvp_ec_meta_decode(buf, len, &d));
    assert_meta_eq(&m, &d);
    kvp_ec_meta_cleanup(&d);
    /* every strict prefix is rejected and leaves the output empty */
    for (size_t n = 0; n < len; n++) {
        ASSERT_EQ(kvp_ec_meta_decode(buf, n, &d), KVP_ERR_DECODE);
        ASSERT_EQ(d.n_loads + d.n_pushes + d.n_freed + d.n_store_candidates, 0);
    }
    /* a trailing byte is rejected too; so is a worker meta read as a meta */
    uint8_t *longer = kvp__malloc(len + 1);
    memcpy(longer, buf, len);
    longer[len] = 0xc0;
    ASSERT_EQ(kvp_ec_meta_decode(longer, len + 1, &d), KVP_ERR_DECODE);
    kvp__free(longer, len + 1);
    kvp_ec_buf_free(buf, len);
    /* empty meta */
    kvp_ec_meta_t e;
    memset(&e, 0, sizeof e);
    ASSERT_OK(kvp_ec_meta_encode(&e, &buf, &len));
    ASSERT_OK(kvp_ec_meta_decode(buf, len, &d));
    assert_meta_eq(&e, &d);
    kvp_ec_buf_free(buf, len);
    kvp_ec_meta_cleanup(&m);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_worker_meta_roundtrip)
{
    kvp_ec_worker_meta_t w = {0}, d;
    w.n_loaded = 2;
    w.loaded = kvp__calloc(2, sizeof *w.loaded);
    w.loaded[0] = S("H1");
    w.loaded[1] = S("H2");
    w.n_failed_saves = 1;
    w.failed_saves = kvp__calloc(1, sizeof *w.failed_saves);
    w.failed_saves[0] = S("r9");
    w.pending_saves = true;
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_ec_worker_meta_encode(&w, &buf, &len));
    ASSERT_OK(kvp_ec_worker_meta_decode(buf, len, &d));
    ASSERT_EQ(d.n_loaded, 2);
    ASSERT_STR_EQ(d.loaded[1], "H2");
    ASSERT_EQ(d.n_failed_saves, 1);
    ASSERT_STR_EQ(d.failed_saves[0], "r9");
    ASSERT(d.pending_saves);
    ASSERT(!d.pending_loads);
    ASSERT_EQ(d.n_reclaimed, 0);
    kvp_ec_worker_meta_cleanup(&d);
    kvp_ec_meta_t m;
    ASSERT_EQ(kvp_ec_meta_decode(buf, len, &m), KVP_ERR_DECODE); /* wrong kind */
    for (size_t n = 0; n < len; n++)
        ASSERT_EQ(kvp_ec_worker_meta_decode(buf, n, &d), KVP_ERR_DECODE);
    kvp_ec_buf_free(buf, len);
    kvp_ec_worker_meta_cleanup(&w);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_meta_decoder_bounds)
{
    kvp_ec_meta_t m;
    /* an array32 claiming 4 billion entries in 10 bytes */
    const uint8_t huge[] = {0x96, 0x01, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0xa1, 'x'};
    ASSERT_EQ(kvp_ec_meta_decode(huge, sizeof huge, &m), KVP_ERR_DECODE);
    /* a string with a NUL inside */
    const uint8_t nul[] = {0x96, 0x01, 0x01, 0x91, 0xa2, 'a', 0x00, 0x90, 0x90, 0x90};
    ASSERT_EQ(kvp_ec_meta_decode(nul, sizeof nul, &m), KVP_ERR_DECODE);
    /* version 2 */
    const uint8_t ver[] = {0x96, 0x02, 0x01, 0x90, 0x90, 0x90, 0x90};
    ASSERT_EQ(kvp_ec_meta_decode(ver, sizeof ver, &m), KVP_ERR_DECODE);
    const uint8_t ok[] = {0x96, 0x01, 0x01, 0x90, 0x90, 0x90, 0x90};
    ASSERT_OK(kvp_ec_meta_decode(ok, sizeof ok, &m));
    ASSERT_EQ(kvp_ec_meta_decode(NULL, 0, &m), KVP_ERR_DECODE);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

static uint64_t g_rng = 0x2545F4914F6CDD1Dull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

TEST(test_ec_meta_random_corruption)
{
    kvp_ec_meta_t m, d;
    make_meta(&m);
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_ec_meta_encode(&m, &buf, &len));
    uint8_t *copy = kvp__malloc(len);
    for (int it = 0; it < 200000; it++) {
        memcpy(copy, buf, len);
        int flips = 1 + (int)(rnd() % 4);
        for (int k = 0; k < flips; k++)
            copy[rnd() % len] = (uint8_t)rnd();
        size_t n = (rnd() % 4) ? len : (size_t)(rnd() % (len + 1));
        if (kvp_ec_meta_decode(copy, n, &d) == KVP_OK)
            kvp_ec_meta_cleanup(&d);
        else
            ASSERT_EQ(d.n_loads + d.n_pushes + d.n_freed + d.n_store_candidates, 0);
    }
    kvp__free(copy, len);
    kvp_ec_buf_free(buf, len);
    kvp_ec_meta_cleanup(&m);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

static int parse_ok(const char *s)
{
    kvp_ec_value_t *v;
    kvp_status_t st = kvp_ec_json_parse(s, strlen(s), 32, &v);
    kvp_ec_value_free(v);
    return st == KVP_OK;
}

static void canon(const char *in, const char *want)
{
    kvp_ec_value_t *v;
    ASSERT_OK(kvp_ec_json_parse(in, strlen(in), 32, &v));
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_value_write(&b, v);
    kvp__jw_put(&b, "", 1);
    ASSERT_STR_EQ(b.p, want);
    kvp__jw_cleanup(&b);
    kvp_ec_value_free(v);
}

TEST(test_ec_json_strict)
{
    ASSERT(parse_ok("{\"a\":[1,-2,9223372036854775807,-9223372036854775808]}"));
    ASSERT(!parse_ok("9223372036854775808"));
    ASSERT(!parse_ok("-9223372036854775809"));
    ASSERT(!parse_ok("1.0"));
    ASSERT(!parse_ok("1e3"));
    ASSERT(!parse_ok("NaN"));
    ASSERT(!parse_ok("Infinity"));
    ASSERT(!parse_ok("-Infinity"));
    ASSERT(!parse_ok("01"));
    ASSERT(!parse_ok("{\"a\":1,}"));
    ASSERT(!parse_ok("[1] x"));
    ASSERT(!parse_ok("\"a\x01\""));
    ASSERT(!parse_ok("\"\xff\""));
    /* depth: 33 nested arrays put the innermost at depth 32 (allowed); 34 is too deep */
    char deep[100];
    memset(deep, '[', 34);
    memset(deep + 34, ']', 34);
    deep[68] = 0;
    ASSERT(!parse_ok(deep));
    memset(deep, '[', 33);
    memset(deep + 33, ']', 33);
    deep[66] = 0;
    ASSERT(parse_ok(deep));
    /* duplicate keys: first position, last value (Python) */
    canon("{\"b\":1,\"a\":2,\"b\":3}", "{\"a\":2,\"b\":3}");
    kvp_ec_value_t *v;
    ASSERT_OK(kvp_ec_json_parse("{\"b\":1,\"a\":2,\"b\":3}", 19, 32, &v));
    ASSERT_EQ(v->u.obj.n, 2);
    ASSERT_STR_EQ(v->u.obj.members[0].key, "b");
    ASSERT_EQ(v->u.obj.members[0].value.u.i, 3);
    kvp_ec_value_free(v);
    /* ensure_ascii escapes; surrogate pairs; a lone surrogate round-trips */
    canon("\"\\u00e9\\ud83d\\ude00\\ud800\\u007f\\n\"", "\"\\u00e9\\ud83d\\ude00\\ud800\\u007f\\n\"");
    canon("\"\xc3\xa9/\"", "\"\\u00e9/\"");
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_json_python_conversions)
{
    kvp_ec_value_t *v;
    const char *in = "[true,0,\"\",[],{},null,\" 12 \",\"1_000\",\"x\",\"1__0\",[1,\"a\",null],{\"k\":\"it's\"}]";
    ASSERT_OK(kvp_ec_json_parse(in, strlen(in), 32, &v));
    kvp_ec_value_t *a = v->u.arr.items;
    ASSERT(kvp_ec_value_truthy(&a[0]));
    for (int i = 1; i <= 5; i++)
        ASSERT(!kvp_ec_value_truthy(&a[i]));
    int64_t x;
    ASSERT_EQ(kvp__ec_py_int(&a[6], &x), KVP_EC_ERR_NONE);
    ASSERT_EQ(x, 12);
    ASSERT_EQ(kvp__ec_py_int(&a[7], &x), KVP_EC_ERR_NONE);
    ASSERT_EQ(x, 1000);
    ASSERT_EQ(kvp__ec_py_int(&a[8], &x), KVP_EC_ERR_VALUE);
    ASSERT_EQ(kvp__ec_py_int(&a[9], &x), KVP_EC_ERR_VALUE);
    ASSERT_EQ(kvp__ec_py_int(&a[5], &x), KVP_EC_ERR_TYPE);
    ASSERT_EQ(kvp__ec_py_int(&a[3], &x), KVP_EC_ERR_TYPE);
    ASSERT_EQ(kvp__ec_py_int(&a[0], &x), KVP_EC_ERR_NONE);
    ASSERT_EQ(x, 1);
    char *s;
    ASSERT_OK(kvp__ec_py_str(&a[10], &s));
    ASSERT_STR_EQ(s, "[1, 'a', None]");
    kvp__strfree(s);
    ASSERT_OK(kvp__ec_py_str(&a[11], &s));
    ASSERT_STR_EQ(s, "{'k': \"it's\"}");
    kvp__strfree(s);
    ASSERT_OK(kvp__ec_py_str(&a[0], &s));
    ASSERT_STR_EQ(s, "True");
    kvp__strfree(s);
    kvp_ec_value_free(v);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

static void check_encoding(kvp_status_t (*enc)(const void *, uint8_t **, size_t *), const void *m, const gold_t *g)
{
    uint8_t *buf;
    size_t len;
    ASSERT_OK(enc(m, &buf, &len));
    ASSERT_EQ(len, g->n);
    ASSERT_MEM_EQ(buf, g->b, len);
    kvp_ec_buf_free(buf, len);
}

static kvp_status_t enc_meta(const void *m, uint8_t **b, size_t *n) { return kvp_ec_meta_encode(m, b, n); }
static kvp_status_t enc_worker(const void *m, uint8_t **b, size_t *n) { return kvp_ec_worker_meta_encode(m, b, n); }

/* Both encodings are msgpack's smallest form for every integer and string
 * head, byte for byte what libmsgpack-c and Python's msgpack.packb write. */
TEST(test_ec_meta_encoding_is_byte_exact_msgpack)
{
    static int64_t sh1[] = {0, 127, 128, 255, 256, 65535, 65536, 4294967295LL, 4294967296LL, INT64_MAX};
    static int64_t sh2[] = {-1, -32, -33, -128, -129, -32768, -32769, -2147483648LL, -2147483649LL, INT64_MIN};
    const char *strs[4];
    golden_strs(strs);
    char *freed[] = {(char *)strs[0], (char *)strs[1], (char *)strs[2], (char *)strs[3]};
    kvp_ec_store_candidate_t cand = {"i", {sh1, 10, "", -129}};
    kvp_ec_push_spec_t push = {"h", 200, sh2, 10, "bf16", "tcp://x", "t", "r"};
    kvp_ec_load_spec_t load = {"h", 65536, NULL, 0, "d", "t", -32769, true};
    kvp_ec_meta_t m = {freed, 4, &cand, 1, &push, 1, &load, 1};
    gold_t g = {.n = 0};
    G(&g, 0x96, 0x01, 0x01, 0x94);
    g_golden_strs(&g);
    G(&g, 0x91, 0x94, 0xa1, 'i', 0x9a, 0x00, 0x7f, 0xcc, 0x80, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xcd, 0xff, 0xff,
      0xce, 0x00, 0x01, 0x00, 0x00, 0xce, 0xff, 0xff, 0xff, 0xff, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
      0x00, 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xa0, 0xd1, 0xff, 0x7f);
    G(&g, 0x91, 0x97, 0xa1, 'h', 0xcc, 200, 0x9a, 0xff, 0xe0, 0xd0, 0xdf, 0xd0, 0x80, 0xd1, 0xff, 0x7f, 0xd1, 0x80,
      0x00, 0xd2, 0xff, 0xff, 0x7f, 0xff, 0xd2, 0x80, 0x00, 0x00, 0x00, 0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff,
      0xff, 0xff, 0xd3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00);
    G(&g, 0xa4, 'b', 'f', '1', '6', 0xa7, 't', 'c', 'p', ':', '/', '/', 'x', 0xa1, 't', 0xa1, 'r');
    G(&g, 0x91, 0x97, 0xa1, 'h', 0xce, 0x00, 0x01, 0x00, 0x00, 0x90, 0xa1, 'd', 0xa1, 't', 0xd2, 0xff, 0xff, 0x7f,
      0xff, 0xc3);
    check_encoding(enc_meta, &m, &g);

    char *loaded[] = {"a"}, *recl[] = {(char *)strs[1]}, *fsaves[] = {"z"};
    kvp_ec_worker_meta_t w = {loaded, 1, NULL, 0, recl, 1, true, false, fsaves, 1};
    g.n = 0;
    G(&g, 0x98, 0x01, 0x02, 0x91, 0xa1, 'a', 0x90, 0x91, 0xd9, 0x20);
    g_fill(&g, 'b', 32);
    G(&g, 0xc3, 0xc2, 0x91, 0xa1, 'z');
    check_encoding(enc_worker, &w, &g);
}

TEST_LIST(T(test_ec_meta_encoding_is_byte_exact_msgpack), T(test_ec_meta_roundtrip), T(test_ec_worker_meta_roundtrip), T(test_ec_meta_decoder_bounds),
          T(test_ec_meta_random_corruption), T(test_ec_json_strict), T(test_ec_json_python_conversions))
