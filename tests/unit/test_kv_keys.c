/*
 * Unit tests of the KV store-key format (include/kvpool/kv_connector.h,
 * "Store keys", connectors-spec §2.3): format, strict parse, model names and
 * the replication factor.  Moved from test_hash.c with every assertion; the
 * expected keys were written by hand from §2.3, and scenario 11's block hash
 * is test_hash.c's scenario-32 constant (computed with Python, see there).
 */
#include "test.h"

#include "kvpool/hash.h"
#include "kvpool/kv_connector.h"

/* -------------------------------------------------------------- store keys */

/* Scenario 11: model "/m/Llama-3/", tp 0, pp 0, group 0, hash bytes 0xab.. ->
 * "Llama-3@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@abab..."; with cache_prefix
 * "x" the key is "x@Llama-3@...". */
TEST(test_scenario_11_store_key)
{
    static const char *path = "/m/Llama-3/";
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    ASSERT_OK(kvp_kv_store_key_model_name(path, strlen(path), &k.model_name, &k.model_name_len));
    ASSERT_EQ(k.model_name_len, 7);
    ASSERT(strncmp(k.model_name, "Llama-3", 7) == 0);
    k.hash.len = 32;
    memset(k.hash.bytes, 0xab, 32);
    char buf[KVP_KV_STORE_KEY_MAX + 1];
    size_t len = 0;
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, sizeof buf, &len));
    ASSERT_STR_EQ(buf, "Llama-3@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"
                       "abababababababababababababababababababababababababababababababab");
    ASSERT_EQ(len, strlen(buf));

    k.cache_prefix = "x";
    k.cache_prefix_len = 1;
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, sizeof buf, &len));
    ASSERT_STR_EQ(buf, "x@Llama-3@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"
                       "abababababababababababababababababababababababababababababababab");

    /* An empty prefix is no prefix (vLLM: `if cache_prefix`). */
    k.cache_prefix = "";
    k.cache_prefix_len = 0;
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, sizeof buf, &len));
    ASSERT(strncmp(buf, "Llama-3@", 8) == 0);

    /* With scenario 32's block 0 hash, other ranks, xxhash length. */
    kvp_hash_t n;
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_XXHASH_CBOR, "0", 1, &n));
    uint32_t t[16];
    for (uint32_t i = 0; i < 16; i++)
        t[i] = i;
    ASSERT_OK(kvp_hash_block(KVP_HASH_XXHASH_CBOR, &n, t, 16, NULL, &k.hash));
    k.tp_rank = 3;
    k.pcp_rank = 1;
    k.dcp_rank = 2;
    k.pp_rank = 4294967295u;
    k.group_id = 10;
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, sizeof buf, &len));
    ASSERT_STR_EQ(buf, "Llama-3@tp_rank:3@pcp1@dcp2@pp_rank:4294967295@group:10@"
                       "209f5d549fc07c8e39d823615ede61ce");
}

static void roundtrip(const kvp_kv_store_key_t *k)
{
    char buf[KVP_KV_STORE_KEY_MAX + 1];
    size_t len;
    ASSERT_OK(kvp_kv_store_key_format(k, buf, sizeof buf, &len));
    kvp_kv_store_key_t p;
    ASSERT_OK(kvp_kv_store_key_parse(buf, len, &p));
    ASSERT_EQ(p.cache_prefix_len, k->cache_prefix_len);
    if (k->cache_prefix_len)
        ASSERT(memcmp(p.cache_prefix, k->cache_prefix, k->cache_prefix_len) == 0);
    else
        ASSERT(p.cache_prefix == NULL);
    ASSERT_EQ(p.model_name_len, k->model_name_len);
    ASSERT(memcmp(p.model_name, k->model_name, k->model_name_len) == 0);
    ASSERT(p.model_name >= buf && p.model_name < buf + len); /* a view into the key */
    ASSERT_EQ(p.tp_rank, k->tp_rank);
    ASSERT_EQ(p.pcp_rank, k->pcp_rank);
    ASSERT_EQ(p.dcp_rank, k->dcp_rank);
    ASSERT_EQ(p.pp_rank, k->pp_rank);
    ASSERT_EQ(p.group_id, k->group_id);
    ASSERT_EQ(p.hash.len, k->hash.len);
    ASSERT_MEM_EQ(p.hash.bytes, k->hash.bytes, k->hash.len);
    /* format(parse(s)) == s */
    char again[KVP_KV_STORE_KEY_MAX + 1];
    size_t len2;
    ASSERT_OK(kvp_kv_store_key_format(&p, again, sizeof again, &len2));
    ASSERT_EQ(len2, len);
    ASSERT_STR_EQ(again, buf);
}

TEST(test_store_key_roundtrip)
{
    static const char *prefixes[] = {NULL, "x", "tenant@a", "@lead", "trail@", "a@@b", "日本"};
    static const char *models[] = {"Llama-3", "m", "Qwen3-32B.fp8", "модель", "tp_rank:0", "g"};
    static const uint32_t nums[] = {0, 1, 9, 10, 4294967295u, 65536};
    unsigned seed = 12345;
    for (size_t pi = 0; pi < sizeof prefixes / sizeof *prefixes; pi++) {
        for (size_t mi = 0; mi < sizeof models / sizeof *models; mi++) {
            kvp_kv_store_key_t k;
            memset(&k, 0, sizeof k);
            k.cache_prefix = prefixes[pi];
            k.cache_prefix_len = prefixes[pi] ? strlen(prefixes[pi]) : 0;
            k.model_name = models[mi];
            k.model_name_len = strlen(models[mi]);
            for (int r = 0; r < 20; r++) {
                seed = seed * 1103515245u + 12345u;
                k.tp_rank = nums[(seed >> 8) % 6];
                k.pcp_rank = nums[(seed >> 11) % 6];
                k.dcp_rank = nums[(seed >> 14) % 6];
                k.pp_rank = nums[(seed >> 17) % 6];
                k.group_id = nums[(seed >> 20) % 6];
                k.hash.len = (uint8_t)(1 + (seed >> 23) % 32);
                for (int i = 0; i < k.hash.len; i++) {
                    seed = seed * 1103515245u + 12345u;
                    k.hash.bytes[i] = (uint8_t)(seed >> 16);
                }
                roundtrip(&k);
            }
        }
    }
}

TEST(test_store_key_parse_fields)
{
    static const char *s = "pre@fix@Model@tp_rank:12@pcp3@dcp0@pp_rank:7@group:2@00ff";
    kvp_kv_store_key_t k;
    ASSERT_OK(kvp_kv_store_key_parse(s, strlen(s), &k));
    ASSERT_EQ(k.cache_prefix_len, 7);
    ASSERT(memcmp(k.cache_prefix, "pre@fix", 7) == 0);
    ASSERT_EQ(k.model_name_len, 5);
    ASSERT(memcmp(k.model_name, "Model", 5) == 0);
    ASSERT_EQ(k.tp_rank, 12);
    ASSERT_EQ(k.pcp_rank, 3);
    ASSERT_EQ(k.dcp_rank, 0);
    ASSERT_EQ(k.pp_rank, 7);
    ASSERT_EQ(k.group_id, 2);
    ASSERT_EQ(k.hash.len, 2);
    ASSERT_EQ(k.hash.bytes[0], 0x00);
    ASSERT_EQ(k.hash.bytes[1], 0xff);
    /* The length bounds the parse, not a NUL: parse a prefix of a longer buffer. */
    static const char *longer = "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@abcdXYZ";
    ASSERT_OK(kvp_kv_store_key_parse(longer, strlen(longer) - 3, &k));
    ASSERT_EQ(k.hash.len, 2);
}

TEST(test_store_key_parse_bad)
{
    static const char *bad[] = {
        "",
        "@",
        "abcd",
        "m@abcd",
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@",          /* empty hash */
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@abc",       /* odd digits */
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ABCD",      /* uppercase */
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@zz",
        ("m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@"
         "000000000000000000000000000000000000000000000000000000000000000000"), /* 33 bytes */
        "tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",          /* no model */
        "@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",         /* empty model */
        "@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",       /* empty prefix */
        "a/b@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",      /* '/' in model */
        "m@tp_rank:01@pcp0@dcp0@pp_rank:0@group:0@ab",       /* leading zero */
        "m@tp_rank:-1@pcp0@dcp0@pp_rank:0@group:0@ab",
        "m@tp_rank:+1@pcp0@dcp0@pp_rank:0@group:0@ab",
        "m@tp_rank:4294967296@pcp0@dcp0@pp_rank:0@group:0@ab", /* > u32 */
        "m@tp_rank:99999999999@pcp0@dcp0@pp_rank:0@group:0@ab",
        "m@tp_rank:@pcp0@dcp0@pp_rank:0@group:0@ab",
        "m@tp_rank:0@pcp@dcp0@pp_rank:0@group:0@ab",
        "m@tp_rank:0@pcp:0@dcp0@pp_rank:0@group:0@ab",       /* "pcp:0" is not "pcp0" */
        "m@tp_rank:0@dcp0@pcp0@pp_rank:0@group:0@ab",        /* order */
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@ab",                /* no group */
        "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@group:0@ab",
        "m@head_or_tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",
        "m@TP_RANK:0@pcp0@dcp0@pp_rank:0@group:0@ab",
        "m@tp_rank:0 @pcp0@dcp0@pp_rank:0@group:0@ab",
        "m\n@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",      /* control character */
        "\xff@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",     /* not UTF-8 */
        "p\x01@m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvp_kv_store_key_t k;
        kvp_status_t st = kvp_kv_store_key_parse(bad[i], strlen(bad[i]), &k);
        ASSERT_MSG(st == (i == 0 ? KVP_ERR_KEY_LENGTH : KVP_ERR_DECODE),
                   "bad key %zu \"%s\" gave %d", i, bad[i], (int)st);
    }
    /* An embedded NUL. */
    static const char nul[] = "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@a\0";
    kvp_kv_store_key_t k;
    ASSERT_EQ(kvp_kv_store_key_parse(nul, sizeof nul - 1, &k), KVP_ERR_DECODE);
    static const char nul2[] = "m\0x@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@ab";
    ASSERT_EQ(kvp_kv_store_key_parse(nul2, sizeof nul2 - 1, &k), KVP_ERR_DECODE);
    /* Too long, NULLs. */
    char big[KVP_KV_STORE_KEY_MAX + 2];
    memset(big, 'a', sizeof big);
    ASSERT_EQ(kvp_kv_store_key_parse(big, KVP_KV_STORE_KEY_MAX + 1, &k), KVP_ERR_KEY_LENGTH);
    ASSERT_EQ(kvp_kv_store_key_parse(NULL, 3, &k), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_store_key_parse("abc", 3, NULL), KVP_ERR_NULL_POINTER);
}

TEST(test_store_key_format_bad)
{
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    k.model_name = "m";
    k.model_name_len = 1;
    k.hash.len = 16;
    char buf[KVP_KV_STORE_KEY_MAX + 1];
    size_t len = 0;
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, sizeof buf, &len));
    ASSERT_EQ(len, strlen("m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@") + 32);

    /* Buffer too small: untouched, needed length reported; size query with NULL. */
    char small[8];
    memset(small, 'Z', sizeof small);
    size_t need = 0;
    ASSERT_EQ(kvp_kv_store_key_format(&k, small, sizeof small, &need), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(need, len);
    ASSERT_EQ(small[0], 'Z');
    ASSERT_EQ(kvp_kv_store_key_format(&k, NULL, 0, &need), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(need, len);
    /* No room for the NUL. */
    ASSERT_EQ(kvp_kv_store_key_format(&k, buf, len, NULL), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_OK(kvp_kv_store_key_format(&k, buf, len + 1, NULL));

    ASSERT_EQ(kvp_kv_store_key_format(NULL, buf, sizeof buf, &len), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_store_key_format(&k, NULL, 5, &len), KVP_ERR_NULL_POINTER);

    static const char *bad_models[] = {"", "a@b", "a/b", "a\tb", "\xc3"};
    for (size_t i = 0; i < sizeof bad_models / sizeof *bad_models; i++) {
        kvp_kv_store_key_t b = k;
        b.model_name = bad_models[i];
        b.model_name_len = strlen(bad_models[i]);
        ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &len), KVP_ERR_INVALID_ARG);
    }
    kvp_kv_store_key_t b = k;
    b.model_name = NULL;
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &len), KVP_ERR_NULL_POINTER);
    b = k;
    b.cache_prefix = "a\nb";
    b.cache_prefix_len = 3;
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &len), KVP_ERR_INVALID_ARG);
    b.cache_prefix = NULL;
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &len), KVP_ERR_NULL_POINTER);
    b = k;
    b.hash.len = 0;
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &len), KVP_ERR_INVALID_ARG);
    b.hash.len = 33;
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &len), KVP_ERR_INVALID_ARG);

    /* Length limit: the longest prefix that fits, then one byte more. */
    char prefix[KVP_KV_STORE_KEY_MAX + 1];
    memset(prefix, 'p', sizeof prefix);
    b = k;
    b.cache_prefix = prefix;
    b.cache_prefix_len = KVP_KV_STORE_KEY_MAX - 1 - len; /* prefix + '@' + rest == 512 */
    ASSERT_OK(kvp_kv_store_key_format(&b, buf, sizeof buf, &need));
    ASSERT_EQ(need, KVP_KV_STORE_KEY_MAX);
    roundtrip(&b);
    b.cache_prefix_len++;
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &need), KVP_ERR_KEY_LENGTH);
    b.cache_prefix_len = (size_t)1 << 40; /* never read: rejected by length first */
    ASSERT_EQ(kvp_kv_store_key_format(&b, buf, sizeof buf, &need), KVP_ERR_KEY_LENGTH);
}

TEST(test_store_key_model_name)
{
    static const struct {
        const char *path, *want;
    } ok[] = {
        {"/m/Llama-3/", "Llama-3"},
        {"/m/Llama-3", "Llama-3"},
        {"Llama-3", "Llama-3"},
        {"meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct"},
        {"a//b///", "b"},
        {"/x", "x"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        const char *name;
        size_t n;
        ASSERT_OK(kvp_kv_store_key_model_name(ok[i].path, strlen(ok[i].path), &name, &n));
        ASSERT_EQ(n, strlen(ok[i].want));
        ASSERT(memcmp(name, ok[i].want, n) == 0);
    }
    const char *name;
    size_t n;
    ASSERT_EQ(kvp_kv_store_key_model_name("", 0, &name, &n), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_store_key_model_name("///", 3, &name, &n), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_store_key_model_name(NULL, 0, &name, &n), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_store_key_model_name("a", 1, NULL, &n), KVP_ERR_NULL_POINTER);
}

TEST(test_store_key_replication_factor)
{
    uint32_t f;
    /* GQA: max(1, tp_size // num_kv_heads). */
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 8, 2, 1, &f));
    ASSERT_EQ(f, 4);
    /* Sliding-window attention shares the MHA/GQA rule (one group enum). */
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_SLIDING_WINDOW, 8, 2, 1, &f));
    ASSERT_EQ(f, 4);
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 2, 2, 1, &f));
    ASSERT_EQ(f, 1); /* scenario 10: TP=2, kv_heads=2 -> tp_rank:0 and tp_rank:1 */
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 2, 8, 1, &f));
    ASSERT_EQ(f, 1);
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 8, 3, 1, &f));
    ASSERT_EQ(f, 2); /* floor division */
    /* Pure MLA: tp_size, so every rank uses tp_rank:0. */
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_MLA, 8, 0, 1, &f));
    ASSERT_EQ(f, 8);
    ASSERT_EQ(7 / f, 0);
    /* Mamba, or DCP > 1: 1. */
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_MAMBA, 8, 1, 1, &f));
    ASSERT_EQ(f, 1);
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_MLA, 8, 1, 2, &f));
    ASSERT_EQ(f, 1);
    ASSERT_OK(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 8, 1, 4, &f));
    ASSERT_EQ(f, 1);
    /* Bad input. */
    ASSERT_EQ(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 0, 1, 1, &f),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 8, 0, 1, &f),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 8, 1, 0, &f),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_store_key_replication_factor((kvp_kv_group_kind_t)9, 8, 1, 1, &f),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, 8, 1, 1, NULL),
              KVP_ERR_NULL_POINTER);
}

/* The hex of the key is lowercase and byte for byte %02x, for every byte
 * value, every hash length and every position (the formatter writes four
 * bytes at a time). */
TEST(test_store_key_hex_every_byte)
{
    for (unsigned len = 1; len <= KVP_HASH_MAX_LEN; len++)
        for (unsigned start = 0; start < 256; start += 7) {
            kvp_kv_store_key_t k = {.model_name = "m", .model_name_len = 1};
            k.hash.len = (uint8_t)len;
            char want[2 * KVP_HASH_MAX_LEN + 1];
            for (unsigned i = 0; i < len; i++) {
                k.hash.bytes[i] = (uint8_t)(start + i * 37);
                snprintf(want + 2 * i, 3, "%02x", k.hash.bytes[i]);
            }
            char buf[KVP_KV_STORE_KEY_MAX + 1];
            size_t n;
            ASSERT_OK(kvp_kv_store_key_format(&k, buf, sizeof buf, &n));
            const char *hex = strrchr(buf, '@') + 1;
            ASSERT_STR_EQ(hex, want);
        }
}

TEST_LIST(T(test_scenario_11_store_key), T(test_store_key_roundtrip), T(test_store_key_hex_every_byte),
          T(test_store_key_parse_fields), T(test_store_key_parse_bad),
          T(test_store_key_format_bad), T(test_store_key_model_name),
          T(test_store_key_replication_factor))
