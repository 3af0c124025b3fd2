/*
 * KV connector metadata codec: msgpack round trips and the defensive decoder
 * (it decodes bytes from another process).  KVP_KV_WRITE_CORPUS=DIR writes
 * the encodings used here as fuzz seeds (tests/fuzz/corpus/fuzz_kv_meta/).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kvpool/kv_connector.h"
#include "golden.h"
#include "support/kv_scripted.h"
#include "test.h"

static const int64_t g_ids0[] = {12, 40, 41};
static const int64_t g_ids1[] = {100008, 100024};
static const kvp_kv_ids_t g_groups[] = {{g_ids0, 3}, {g_ids1, 2}};
static const int64_t g_toks[] = {5, 9, 2, -1, 1LL << 40};
static const uint8_t g_hashes[] = {0xab, 0xcd, 0x01, 0x02, 0x03, 0x04};
static const kvp_kv_tail_offload_t g_tails[] = {{1, 900012, 52}, {2, 900013, 52}};
static const char *const g_unf[] = {"r2", "r5", "r7", "\xc3\xa9t\xc3\xa9"};
static const char *const g_pre[] = {"r6"};

static void sample_meta(kvp_kv_meta_t *m, kvp_kv_req_meta_t rm[3])
{
    memset(rm, 0, 3 * sizeof *rm);
    rm[0].req_id = "r7";
    rm[0].token_len_chunk = 48;
    rm[0].block_ids = (kvp_kv_blocks_t){g_groups, 2};
    rm[0].block_hashes = g_hashes;
    rm[0].num_block_hashes = 3;
    rm[0].hash_len = 2;
    rm[0].can_save = true;
    rm[0].is_last_chunk = 0;
    rm[0].num_prompt_tokens = 100;
    rm[0].token_ids = g_toks;
    rm[0].num_token_ids = 5;
    rm[0].has_token_ids = true;
    rm[1].req_id = "r5";
    rm[1].token_len_chunk = 64;
    rm[1].num_block_hashes = 4; /* count-only view */
    rm[1].is_last_chunk = KVP_KV_TRI_NONE;
    rm[1].has_load_spec = true;
    rm[1].load_spec = (kvp_kv_load_spec_t){32, 64, true};
    rm[2].req_id = "r2";
    rm[2].block_ids = (kvp_kv_blocks_t){g_groups, 1};
    rm[2].can_save = true;
    rm[2].is_last_chunk = KVP_KV_TRI_NONE;
    rm[2].num_prompt_tokens = -7;
    rm[2].partial_tail_offloads = g_tails;
    rm[2].num_partial_tail_offloads = 2;
    *m = (kvp_kv_meta_t){g_unf, 4, g_pre, 1, rm, 3};
}

static void write_corpus(const char *name, const uint8_t *buf, size_t len)
{
    const char *dir = getenv("KVP_KV_WRITE_CORPUS");
    if (!dir)
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    ASSERT(f);
    ASSERT_EQ(fwrite(buf, 1, len, f), len);
    fclose(f);
}

TEST(test_meta_roundtrip_every_field)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_kv_meta_t m;
    kvp_kv_req_meta_t rm[3];
    sample_meta(&m, rm);
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(&m, &buf, &len));
    write_corpus("sample3", buf, len);
    kvp_kv_meta_t *d;
    ASSERT_OK(kvp_kv_meta_decode(buf, len, &d));
    ASSERT(kvp_kv_meta_equal(&m, d));
    ASSERT_STR_EQ(d->unfinished_req_ids[3], "\xc3\xa9t\xc3\xa9");
    ASSERT_EQ(d->requests[0].hash_len, 2);
    ASSERT_MEM_EQ(d->requests[0].block_hashes, g_hashes, 6);
    ASSERT_EQ(d->requests[0].token_ids[4], 1LL << 40);
    ASSERT_EQ(d->requests[1].num_block_hashes, 4);
    ASSERT_EQ(d->requests[2].partial_tail_offloads[1].group_id, 2);
    kvp_kv_meta_free(d);
    kvp_kv_meta_buf_free(buf, len);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
}

TEST(test_meta_roundtrip_empty)
{
    kvp_kv_meta_t m = {0};
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(&m, &buf, &len));
    write_corpus("empty", buf, len);
    ASSERT_EQ(len, 5); /* [1, [], [], []] */
    kvp_kv_meta_t *d;
    ASSERT_OK(kvp_kv_meta_decode(buf, len, &d));
    ASSERT_EQ(d->num_requests + d->num_unfinished + d->num_preempted, 0);
    kvp_kv_meta_free(d);
    kvp_kv_meta_buf_free(buf, len);
}

TEST(test_meta_roundtrip_from_scheduler)
{
    kvp_kv_scripted_t *sc;
    kvp_kv_sched_t *s;
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    ASSERT_OK(kvp_kv_scripted_create(&sc));
    ASSERT_OK(kvp_kv_sched_create(&cfg, kvp_kv_scripted_client(sc), &s));
    int64_t toks[100];
    for (int i = 0; i < 100; i++)
        toks[i] = i * 7;
    uint8_t hashes[6 * 32];
    for (size_t i = 0; i < sizeof hashes; i++)
        hashes[i] = (uint8_t)i;
    kvp_kv_request_t r = {"req-1", 100, 0, toks, 100, hashes, 6, 32};
    int64_t bl[7] = {1, 2, 3, 4, 5, 6, 7};
    kvp_kv_ids_t g = {bl, 7};
    kvp_kv_blocks_t b = {&g, 1};
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(s, &r, &b, 0));
    kvp_kv_new_req_t nr = {"req-1", 0, 64, b, toks, 100, NULL, 0, false};
    kvp_kv_sched_output_t so = {NULL, 0, NULL, 0, &nr, 1, NULL, 0, NULL, 0};
    const kvp_kv_meta_t *m;
    ASSERT_OK(kvp_kv_sched_build_connector_meta(s, &so, &m));
    ASSERT_EQ(m->num_requests, 1);
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(m, &buf, &len));
    write_corpus("sched1", buf, len);
    kvp_kv_meta_t *d;
    ASSERT_OK(kvp_kv_meta_decode(buf, len, &d));
    ASSERT(kvp_kv_meta_equal(m, d));
    ASSERT_EQ(d->requests[0].hash_len, 32);
    ASSERT_MEM_EQ(d->requests[0].block_hashes, hashes, sizeof hashes);
    kvp_kv_meta_free(d);
    kvp_kv_meta_buf_free(buf, len);
    kvp_kv_sched_destroy(s);
    kvp_kv_scripted_destroy(sc);
}

TEST(test_meta_decode_rejects_every_truncation)
{
    kvp_kv_meta_t m;
    kvp_kv_req_meta_t rm[3];
    sample_meta(&m, rm);
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(&m, &buf, &len));
    uint64_t base = kvp__alloc_bytes_in_use();
    for (size_t n = 0; n < len; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact-size copy: ASan sees over-reads */
        memcpy(copy, buf, n);
        kvp_kv_meta_t *d = (kvp_kv_meta_t *)1;
        ASSERT_EQ(kvp_kv_meta_decode(copy, n, &d), KVP_ERR_DECODE);
        ASSERT(d == NULL);
        free(copy);
    }
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
    kvp_kv_meta_buf_free(buf, len);
}

TEST(test_meta_decode_rejects_bad_input)
{
    kvp_kv_meta_t *d;
    /* unknown version */
    const uint8_t v2[] = {0x94, 0x02, 0x90, 0x90, 0x90};
    ASSERT_EQ(kvp_kv_meta_decode(v2, sizeof v2, &d), KVP_ERR_VERSION);
    /* trailing byte */
    const uint8_t trail[] = {0x94, 0x01, 0x90, 0x90, 0x90, 0x00};
    ASSERT_EQ(kvp_kv_meta_decode(trail, sizeof trail, &d), KVP_ERR_DECODE);
    /* wrong arity */
    const uint8_t arity[] = {0x93, 0x01, 0x90, 0x90};
    ASSERT_EQ(kvp_kv_meta_decode(arity, sizeof arity, &d), KVP_ERR_DECODE);
    /* a huge array count is bounded by the input */
    const uint8_t huge[] = {0x94, 0x01, 0xdd, 0xff, 0xff, 0xff, 0xff, 0x90, 0x90};
    ASSERT_EQ(kvp_kv_meta_decode(huge, sizeof huge, &d), KVP_ERR_DECODE);
    /* a huge string length */
    const uint8_t hstr[] = {0x94, 0x01, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff, 0x41};
    ASSERT_EQ(kvp_kv_meta_decode(hstr, sizeof hstr, &d), KVP_ERR_DECODE);
    /* an id with a NUL, an empty id */
    const uint8_t nul[] = {0x94, 0x01, 0x91, 0xa2, 'a', 0x00, 0x90, 0x90};
    ASSERT_EQ(kvp_kv_meta_decode(nul, sizeof nul, &d), KVP_ERR_DECODE);
    const uint8_t emp[] = {0x94, 0x01, 0x91, 0xa0, 0x90, 0x90};
    ASSERT_EQ(kvp_kv_meta_decode(emp, sizeof emp, &d), KVP_ERR_DECODE);
    /* not msgpack at all */
    ASSERT_EQ(kvp_kv_meta_decode((const uint8_t *)"{\"a\":1}", 7, &d), KVP_ERR_DECODE);
    ASSERT_EQ(kvp_kv_meta_decode(NULL, 0, &d), KVP_ERR_DECODE);
    /* uint64 above INT64_MAX as a token count */
    const uint8_t big[] = {0x94, 0x01, 0x90, 0x90, 0x91, 0x9c, 0xa1, 'r', 0xcf, 0xff, 0xff, 0xff,
                           0xff, 0xff, 0xff, 0xff, 0xff};
    ASSERT_EQ(kvp_kv_meta_decode(big, sizeof big, &d), KVP_ERR_DECODE);
    ASSERT_EQ(kvp_kv_meta_decode(v2, sizeof v2, NULL), KVP_ERR_NULL_POINTER);
}

TEST(test_meta_decode_random_mutations_fuzz)
{
    kvp_kv_meta_t m;
    kvp_kv_req_meta_t rm[3];
    sample_meta(&m, rm);
    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(&m, &buf, &len));
    uint64_t base = kvp__alloc_bytes_in_use();
    uint64_t x = 0x9E3779B97F4A7C15ull;
    size_t accepted = 0;
    for (int iter = 0; iter < 20000; iter++) {
        uint8_t *c = malloc(len);
        memcpy(c, buf, len);
        int nmut = 1 + iter % 4;
        for (int k = 0; k < nmut; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c[x % len] = (uint8_t)(x >> 24);
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        size_t n = iter % 3 == 0 ? (size_t)(x % (len + 1)) : len;
        kvp_kv_meta_t *d;
        kvp_status_t st = kvp_kv_meta_decode(c, n, &d);
        if (st == KVP_OK) {
            accepted++;
            uint8_t *b2;
            size_t l2;
            ASSERT_OK(kvp_kv_meta_encode(d, &b2, &l2));
            kvp_kv_meta_t *d2;
            ASSERT_OK(kvp_kv_meta_decode(b2, l2, &d2));
            ASSERT(kvp_kv_meta_equal(d, d2));
            kvp_kv_meta_free(d2);
            kvp_kv_meta_buf_free(b2, l2);
            kvp_kv_meta_free(d);
        } else {
            ASSERT(st == KVP_ERR_DECODE || st == KVP_ERR_VERSION);
        }
        free(c);
    }
    ASSERT_GT(accepted, 0);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
    kvp_kv_meta_buf_free(buf, len);
}

/* The encoding is msgpack's smallest form for every integer, string and bin
 * head, byte for byte what libmsgpack-c and Python's msgpack.packb write
 * (the workers' decoders and the Python references depend on it). */
TEST(test_meta_encoding_is_byte_exact_msgpack)
{
    static const int64_t ints[] = {0, 127, 128, 255, 256, 65535, 65536, 4294967295LL, 4294967296LL, -1, -32,
                                   -33, -128, -129, -32768, -32769, -2147483648LL, -2147483649LL, INT64_MIN,
                                   INT64_MAX};
    static uint8_t hashes[260];
    for (size_t i = 0; i < sizeof hashes; i++)
        hashes[i] = (uint8_t)i;
    const char *unf[4];
    golden_strs(unf);
    kvp_kv_ids_t grp = {ints, sizeof ints / sizeof ints[0]};
    kvp_kv_req_meta_t rm;
    memset(&rm, 0, sizeof rm);
    rm.req_id = "r";
    rm.token_len_chunk = -33;
    rm.block_ids = (kvp_kv_blocks_t){&grp, 1};
    rm.block_hashes = hashes;
    rm.num_block_hashes = 130;
    rm.hash_len = 2;
    rm.is_last_chunk = 1;
    rm.num_prompt_tokens = 300;
    kvp_kv_meta_t m = {unf, 4, NULL, 0, &rm, 1};

    gold_t g = {.n = 0};
    G(&g, 0x94, 0x01, 0x94);
    g_golden_strs(&g);
    G(&g, 0x90, 0x91, 0x9c, 0xa1, 'r', 0xd0, 0xdf, 0x91, 0xdc, 0x00, 0x14);
    G(&g, 0x00, 0x7f, 0xcc, 0x80, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xcd, 0xff, 0xff, 0xce, 0x00, 0x01, 0x00, 0x00,
      0xce, 0xff, 0xff, 0xff, 0xff, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00);
    G(&g, 0xff, 0xe0, 0xd0, 0xdf, 0xd0, 0x80, 0xd1, 0xff, 0x7f, 0xd1, 0x80, 0x00, 0xd2, 0xff, 0xff, 0x7f, 0xff,
      0xd2, 0x80, 0x00, 0x00, 0x00, 0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff);
    G(&g, 0xd3, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xcf, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
      0xff);
    G(&g, 0xcc, 0x82, 0x02, 0xc5, 0x01, 0x04);
    g_bytes(&g, hashes, sizeof hashes);
    G(&g, 0xc2, 0xc3, 0xc0, 0xcd, 0x01, 0x2c, 0xc0, 0xc0);

    uint8_t *buf;
    size_t len;
    ASSERT_OK(kvp_kv_meta_encode(&m, &buf, &len));
    ASSERT_EQ(len, g.n);
    ASSERT_MEM_EQ(buf, g.b, len);
    kvp_kv_meta_t *back;
    ASSERT_OK(kvp_kv_meta_decode(buf, len, &back));
    ASSERT(kvp_kv_meta_equal(&m, back));
    kvp_kv_meta_free(back);
    kvp_kv_meta_buf_free(buf, len);
}

TEST_LIST(T(test_meta_encoding_is_byte_exact_msgpack), T(test_meta_roundtrip_every_field), T(test_meta_roundtrip_empty),
          T(test_meta_roundtrip_from_scheduler), T(test_meta_decode_rejects_every_truncation),
          T(test_meta_decode_rejects_bad_input), T(test_meta_decode_random_mutations_fuzz))
