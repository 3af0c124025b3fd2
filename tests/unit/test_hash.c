/*
 * Unit tests of the block-hash contract (include/kvpool/hash.h): the CBOR
 * encoder, NONE_HASH and block hashes, a request's chained hashes with extra
 * keys.  (Store keys: tests/unit/test_kv_keys.c.)
 *
 * Where the expected constants come from: every hex constant below was
 * computed once with Debian's /usr/bin/python3 (3.11), python3-cbor2 5.4.6,
 * hashlib and python3-xxhash 3.2.0, independently of this C code, using
 * vLLM's definitions (vllm/utils/hashing.py, vllm/v1/core/kv_cache_utils.py):
 *
 *   sha256_cbor = lambda o: hashlib.sha256(cbor2.dumps(o, canonical=True)).digest()
 *   xxhash_cbor = lambda o: xxhash.xxh3_128_digest(cbor2.dumps(o, canonical=True))
 *   NONE_HASH   = hash_fn(PYTHONHASHSEED)
 *   block hash  = hash_fn((parent, tuple(tokens), extra_keys or None))
 *
 * e.g. sha256_cbor("0").hex() == "4e1195df...".  The request-level constants
 * come from tests/integration/hash_ref.py's block_hashes() (the same
 * reference the integration test runs on random inputs).
 */
#include "test.h"

#include "common/alloc.h"
#include "common/cbor.h"
#include "kvpool/hash.h"

static void hex_of(const uint8_t *p, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[p[i] >> 4];
        out[2 * i + 1] = hx[p[i] & 15];
    }
    out[2 * n] = '\0';
}

#define ASSERT_HASH_HEX(h, want)                          \
    do {                                                  \
        char hx__[KVP_HASH_HEX_MAX];                      \
        kvp_hash_to_hex((h), hx__);                       \
        ASSERT_STR_EQ(hx__, (want));                      \
    } while (0)

#define ASSERT_CBOR_HEX(c, want)                          \
    do {                                                  \
        ASSERT_OK(kvp__cbor_status(c));                   \
        char hx__[4096];                                  \
        ASSERT((c)->len * 2 < sizeof hx__);               \
        hex_of((c)->data, (c)->len, hx__);                \
        ASSERT_STR_EQ(hx__, (want));                      \
    } while (0)

static kvp_hash_t none_hash(kvp_hash_algo_t algo, const char *seed)
{
    kvp_hash_t h;
    ASSERT_OK(kvp_hash_none_hash(algo, seed, strlen(seed), &h));
    return h;
}

/* ------------------------------------------------------------------ CBOR */

TEST(test_cbor_uints)
{
    /* cbor2.dumps([0,23,24,255,256,65535,65536,2**32-1,2**32,2**64-1], canonical=True) */
    static const uint64_t v[] = {0,     23,    24,          255,         256,
                                 65535, 65536, 4294967295u, 4294967296u, UINT64_MAX};
    uint8_t buf[128];
    kvp__cbor_t c;
    kvp__cbor_init(&c, buf, sizeof buf);
    kvp__cbor_array(&c, 10);
    for (size_t i = 0; i < 10; i++)
        kvp__cbor_uint(&c, v[i]);
    ASSERT_CBOR_HEX(&c, "8a0017181818ff19010019ffff1a000100001affffffff1b00000001000000001bfff"
                        "fffffffffffff");
    kvp__cbor_cleanup(&c);
}

TEST(test_cbor_negative_ints)
{
    /* cbor2.dumps([-1,-24,-25,-256,-257,-65536,-65537,-2**32,-2**32-1,-2**63], canonical=True) */
    static const int64_t v[] = {-1,     -24,    -25,           -256,          -257,
                                -65536, -65537, -4294967296LL, -4294967297LL, INT64_MIN};
    uint8_t buf[128];
    kvp__cbor_t c;
    kvp__cbor_init(&c, buf, sizeof buf);
    kvp__cbor_array(&c, 10);
    for (size_t i = 0; i < 10; i++)
        kvp__cbor_int(&c, v[i]);
    ASSERT_CBOR_HEX(&c, "8a2037381838ff39010039ffff3a000100003affffffff3b00000001000000003b7ff"
                        "fffffffffffff");
    kvp__cbor_reset(&c);
    kvp__cbor_int(&c, INT64_MAX);
    ASSERT_CBOR_HEX(&c, "1b7fffffffffffffff");
    kvp__cbor_cleanup(&c);
}

TEST(test_cbor_strings_arrays_null)
{
    /* cbor2.dumps((b"", b"\0"*24, "", "é"*12, None, (), ((),)), canonical=True) */
    uint8_t zeros[24] = {0};
    char e12[25];
    for (int i = 0; i < 12; i++)
        memcpy(e12 + 2 * i, "\xc3\xa9", 2);
    uint8_t buf[128];
    kvp__cbor_t c;
    kvp__cbor_init(&c, buf, sizeof buf);
    kvp__cbor_array(&c, 7);
    kvp__cbor_bytes(&c, "", 0);
    kvp__cbor_bytes(&c, zeros, 24);
    kvp__cbor_text(&c, "", 0);
    kvp__cbor_text(&c, e12, 24);
    kvp__cbor_null(&c);
    kvp__cbor_array(&c, 0);
    kvp__cbor_array(&c, 1);
    kvp__cbor_array(&c, 0);
    ASSERT_CBOR_HEX(&c, "87405818000000000000000000000000000000000000000000000000607818c3a9c3a"
                        "9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9c3a9f6808180");
    kvp__cbor_cleanup(&c);
}

TEST(test_cbor_grows_to_heap_and_frees)
{
    uint64_t before = kvp__alloc_bytes_in_use();
    uint8_t buf[8];
    kvp__cbor_t c;
    kvp__cbor_init(&c, buf, sizeof buf);
    char big[300];
    memset(big, 'x', sizeof big);
    kvp__cbor_text(&c, big, sizeof big); /* "x"*300 -> 79 012c 78 78 ... */
    ASSERT_OK(kvp__cbor_status(&c));
    ASSERT_EQ(c.len, 303);
    ASSERT(c.data != buf);
    ASSERT_EQ(c.data[0], 0x79);
    ASSERT_EQ(c.data[1], 0x01);
    ASSERT_EQ(c.data[2], 0x2c);
    ASSERT_EQ(c.data[302], 'x');
    ASSERT_GT(kvp__alloc_bytes_in_use(), before);
    kvp__cbor_cleanup(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), before);
}

TEST(test_cbor_out_of_memory_is_sticky)
{
    kvp__cbor_t c;
    kvp__cbor_init(&c, NULL, 0);
    kvp__alloc_fail_after(0);
    kvp__cbor_uint(&c, 1);
    kvp__alloc_fail_reset();
    ASSERT_EQ(kvp__cbor_status(&c), KVP_ERR_NO_MEMORY);
    kvp__cbor_uint(&c, 2); /* ignored after the failure */
    ASSERT_EQ(c.len, 0);
    ASSERT_EQ(kvp__cbor_status(&c), KVP_ERR_NO_MEMORY);
    kvp__cbor_reset(&c);
    kvp__cbor_uint(&c, 2);
    ASSERT_CBOR_HEX(&c, "02");
    kvp__cbor_cleanup(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_utf8_validation)
{
    ASSERT(kvp__utf8_valid("", 0));
    ASSERT(kvp__utf8_valid("abc", 3));
    ASSERT(kvp__utf8_valid("a\0b", 3)); /* NUL is a valid code point */
    ASSERT(kvp__utf8_valid("\xc3\xa9", 2));
    ASSERT(kvp__utf8_valid("\xe6\xbc\xa2", 3));
    ASSERT(kvp__utf8_valid("\xf0\x9f\x98\x80", 4));
    ASSERT(kvp__utf8_valid("\xf4\x8f\xbf\xbf", 4));      /* U+10FFFF */
    ASSERT(kvp__utf8_valid("\xed\x9f\xbf", 3));          /* U+D7FF */
    ASSERT(!kvp__utf8_valid("\xff", 1));
    ASSERT(!kvp__utf8_valid("\xc0\x80", 2));             /* overlong NUL */
    ASSERT(!kvp__utf8_valid("\xc1\xbf", 2));             /* overlong */
    ASSERT(!kvp__utf8_valid("\xe0\x9f\xbf", 3));         /* overlong */
    ASSERT(!kvp__utf8_valid("\xed\xa0\x80", 3));         /* surrogate U+D800 */
    ASSERT(!kvp__utf8_valid("\xf0\x8f\xbf\xbf", 4));     /* overlong */
    ASSERT(!kvp__utf8_valid("\xf4\x90\x80\x80", 4));     /* > U+10FFFF */
    ASSERT(!kvp__utf8_valid("\xf5\x80\x80\x80", 4));
    ASSERT(!kvp__utf8_valid("\xc3", 1));                 /* truncated */
    ASSERT(!kvp__utf8_valid("\xe6\xbc", 2));
    ASSERT(!kvp__utf8_valid("\xe6\xbcx", 3));
    ASSERT(!kvp__utf8_valid("\x80", 1));                 /* lone continuation */
}

/* ------------------------------------------------------------ block hashes */

TEST(test_algo_names)
{
    kvp_hash_algo_t a;
    ASSERT_OK(kvp_hash_algo_parse("sha256_cbor", &a));
    ASSERT_EQ(a, KVP_HASH_SHA256_CBOR);
    ASSERT_OK(kvp_hash_algo_parse("xxhash_cbor", &a));
    ASSERT_EQ(a, KVP_HASH_XXHASH_CBOR);
    ASSERT_EQ(kvp_hash_algo_parse("sha256", &a), KVP_ERR_UNSUPPORTED);
    ASSERT_EQ(kvp_hash_algo_parse("xxhash", &a), KVP_ERR_UNSUPPORTED);
    ASSERT_EQ(kvp_hash_algo_parse("md5", &a), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_hash_algo_parse("", &a), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_hash_algo_parse(NULL, &a), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_algo_parse("sha256_cbor", NULL), KVP_ERR_NULL_POINTER);
    ASSERT_STR_EQ(kvp_hash_algo_name(KVP_HASH_SHA256_CBOR), "sha256_cbor");
    ASSERT_STR_EQ(kvp_hash_algo_name(KVP_HASH_XXHASH_CBOR), "xxhash_cbor");
    ASSERT(kvp_hash_algo_name((kvp_hash_algo_t)0) == NULL);
    ASSERT_EQ(kvp_hash_algo_len(KVP_HASH_SHA256_CBOR), 32);
    ASSERT_EQ(kvp_hash_algo_len(KVP_HASH_XXHASH_CBOR), 16);
    ASSERT_EQ(kvp_hash_algo_len((kvp_hash_algo_t)7), 0);
}

/* Scenario 32: PYTHONHASHSEED="0", sha256_cbor.  NONE_HASH =
 * sha256(cbor text "0") = sha256(61 30); block 0 = sha256(cbor([NONE_HASH,
 * [0..15], null])).  Python: sha256_cbor("0"), sha256_cbor((NONE_HASH,
 * tuple(range(16)), None)); same with xxhash_cbor. */
TEST(test_scenario_32_none_hash_and_block0)
{
    static const char *none_sha =
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e";
    static const char *blk0_sha =
        "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c";
    static const char *none_xx = "1ebe36576dcb573f26b99533a20aaeca";
    static const char *blk0_xx = "209f5d549fc07c8e39d823615ede61ce";
    uint32_t t[16];
    for (uint32_t i = 0; i < 16; i++)
        t[i] = i;

    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), h;
    ASSERT_EQ(n.len, 32);
    ASSERT_HASH_HEX(&n, none_sha);
    /* NONE_HASH is the SHA-256 of the two bytes 0x61 0x30, independently. */
    uint8_t direct[32];
    ASSERT_OK(kvp_hash_sha256("\x61\x30", 2, direct));
    ASSERT_MEM_EQ(direct, n.bytes, 32);

    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 16, NULL, &h));
    ASSERT_HASH_HEX(&h, blk0_sha);

    /* The same through the request API (16 tokens of a 20-token prompt). */
    uint32_t t20[20];
    for (uint32_t i = 0; i < 20; i++)
        t20[i] = i;
    kvp_hash_t hs[2];
    size_t nh = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t20, 20, 16, NULL, hs, 2, &nh));
    ASSERT_EQ(nh, 1);
    ASSERT_HASH_HEX(&hs[0], blk0_sha);

    kvp_hash_t nx = none_hash(KVP_HASH_XXHASH_CBOR, "0");
    ASSERT_EQ(nx.len, 16);
    ASSERT_HASH_HEX(&nx, none_xx);
    ASSERT_OK(kvp_hash_block(KVP_HASH_XXHASH_CBOR, &nx, t, 16, NULL, &h));
    ASSERT_EQ(h.len, 16);
    ASSERT_HASH_HEX(&h, blk0_xx);

    /* Second block chains on the first (Python: sha256_cbor((blk0,
     * tuple(range(16, 32)), None))). */
    uint32_t t2[16];
    for (uint32_t i = 0; i < 16; i++)
        t2[i] = 16 + i;
    kvp_hash_t b0 = none_hash(KVP_HASH_SHA256_CBOR, "0");
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &b0, t, 16, NULL, &b0)); /* out aliases parent */
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &b0, t2, 16, NULL, &h));
    ASSERT_HASH_HEX(&h, "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac");
}

/* vLLM 0.32's tagged extra keys (kvp_hash_keys_t): block 0 of tokens 0..31
 * with LoRA "L" at "/p", an image at tokens 4..23 and salt "s" hashes
 * (parent, tokens, (("lora", "L", "/p"), ("mm", "img", 4), ("cache_salt",
 * "s"))), block 1 (parent, tokens, (("lora", "L", "/p"), ("mm", "img", -12))).
 * Expected values from tests/integration/hash_ref.py (cbor2 + hashlib):
 *   hash_ref.block_hashes("sha256_cbor", "0", 16, list(range(32)), lora="L",
 *       salt="s", mm_items=[("img", 4, 20)], keys="tagged", lora_path="/p") */
TEST(test_tagged_extra_keys_vllm_0_32)
{
    uint32_t t[32];
    for (uint32_t i = 0; i < 32; i++)
        t[i] = i;
    kvp_hash_t none = none_hash(KVP_HASH_SHA256_CBOR, "0");
    kvp_hash_mm_item_t img = {"img", 3, 4, 20};
    kvp_hash_request_t req = {.lora_name = "L", .lora_name_len = 1, .mm_items = &img,
                              .num_mm_items = 1, .cache_salt = "s", .cache_salt_len = 1,
                              .keys = KVP_HASH_KEYS_TAGGED, .lora_path = "/p", .lora_path_len = 2};
    kvp_hash_t h[2];
    size_t n = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &none, t, 32, 16, &req, h, 2, &n));
    ASSERT_EQ(n, 2);
    ASSERT_HASH_HEX(&h[0], "3a2167b311e3742fed0fec3f9eef16f643a87fe118011702e5f757f968ea9aa4");
    ASSERT_HASH_HEX(&h[1], "2df9ba4b51cd9284c004520bcb42177f57ae49de3e598d73deaf98e809d9a8c9");
    /* The same block 0 given literally. */
    kvp_hash_mm_key_t mk = {"img", 3, 4};
    kvp_hash_extra_keys_t x = {.lora_name = "L", .lora_name_len = 1, .mm_keys = &mk,
                               .num_mm_keys = 1, .cache_salt = "s", .cache_salt_len = 1,
                               .keys = KVP_HASH_KEYS_TAGGED, .lora_path = "/p",
                               .lora_path_len = 2};
    kvp_hash_t one;
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &none, t, 16, &x, &one));
    ASSERT_MEM_EQ(one.bytes, h[0].bytes, 32);
    /* Untagged (vLLM 0.27) is another hash; an unknown spelling is refused. */
    x.keys = KVP_HASH_KEYS_UNTAGGED;
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &none, t, 16, &x, &one));
    ASSERT(memcmp(one.bytes, h[0].bytes, 32) != 0);
    x.keys = (kvp_hash_keys_t)7;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &none, t, 16, &x, &one), KVP_ERR_INVALID_ARG);
}

#define VLLM_NONE_HASH_HEX "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0"

/* vLLM 0.32 without PYTHONHASHSEED: a cryptographic algorithm hashes the
 * fixed seed "vllm-none-hash" (the same in every process), xxhash_cbor a
 * random one (never the same twice). */
TEST(test_none_hash_without_seed_follows_vllm_0_32)
{
    kvp_hash_t a, b, fixed;
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, NULL, 0, &a));
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, NULL, 0, &b));
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, KVP_HASH_DEFAULT_SEED,
                                 strlen(KVP_HASH_DEFAULT_SEED), &fixed));
    ASSERT_EQ(a.len, 32);
    ASSERT_MEM_EQ(a.bytes, b.bytes, 32);
    ASSERT_MEM_EQ(a.bytes, fixed.bytes, 32);
    /* sha256(cbor text "vllm-none-hash"), computed independently:
     * python3 -c 'import hashlib,cbor2; print(hashlib.sha256(cbor2.dumps("vllm-none-hash")).hexdigest())' */
    ASSERT_HASH_HEX(&a, VLLM_NONE_HASH_HEX);
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_XXHASH_CBOR, NULL, 0, &a));
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_XXHASH_CBOR, NULL, 0, &b));
    ASSERT_EQ(a.len, 16); /* xxh3_128 of a random 64-hex-digit seed */
    ASSERT(memcmp(a.bytes, b.bytes, 16) != 0);
}

TEST(test_none_hash_bad_input)
{
    kvp_hash_t h;
    ASSERT_EQ(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, "0", 1, NULL), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_none_hash((kvp_hash_algo_t)9, "0", 1, &h), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, "\xff", 1, &h), KVP_ERR_INVALID_ARG);
    /* The seed is counted, not NUL-terminated: "0" out of "0abc". */
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, "0abc", 1, &h));
    ASSERT_HASH_HEX(&h, "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e");
}

/* Every kind of extra key in one block.  Python:
 *   n = sha256_cbor("0"); emb = hashlib.sha256(b"embeds").digest()
 *   o = (n, (1, 2, 3, 4), ("lora-a", ("img0", -3), ("img1", 2), "salt", emb))
 *   cbor2.dumps(o, canonical=True).hex(), sha256_cbor(o).hex(), xxhash_cbor(o).hex() */
TEST(test_block_with_every_extra_key)
{
    static const uint32_t t[] = {1, 2, 3, 4};
    static const int64_t t64[] = {1, 2, 3, 4};
    uint8_t emb[32];
    ASSERT_OK(kvp_hash_sha256("embeds", 6, emb));
    char emb_hex[65];
    hex_of(emb, 32, emb_hex);
    ASSERT_STR_EQ(emb_hex, "804e6a0a978d599015792e2aed8279eefe7a9ca6b81f572c31da48fe2d2c0fa9");

    kvp_hash_mm_key_t mm[] = {{"img0", 4, -3}, {"img1", 4, 2}};
    kvp_hash_extra_keys_t x = {
        .lora_name = "lora-a", .lora_name_len = 6,
        .mm_keys = mm, .num_mm_keys = 2,
        .cache_salt = "salt", .cache_salt_len = 4,
        .prompt_embeds_sha256 = emb,
    };
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), h, h64;
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 4, &x, &h));
    ASSERT_HASH_HEX(&h, "ca927798c7b7f7e5575b97e8cddcdd4fe80bd6d3fdef47454fc198a0474fdff0");
    ASSERT_OK(kvp_hash_block_i64(KVP_HASH_SHA256_CBOR, &n, t64, 4, &x, &h64));
    ASSERT_MEM_EQ(h.bytes, h64.bytes, 32);
    /* xxhash_cbor over the same object (parent is still the sha256 NONE_HASH). */
    ASSERT_OK(kvp_hash_block(KVP_HASH_XXHASH_CBOR, &n, t, 4, &x, &h));
    ASSERT_HASH_HEX(&h, "0eadafc673388ed6eaa068b02344302b");

    /* The CBOR itself, byte for byte: hash what cbor2 wrote and compare. */
    static const char *cbor_hex =
        "8358204e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e840102030485666c"
        "6f72612d618264696d6730228264696d6731026473616c745820804e6a0a978d599015792e2aed8279eefe"
        "7a9ca6b81f572c31da48fe2d2c0fa9";
    uint8_t raw[256];
    size_t rl = strlen(cbor_hex) / 2;
    for (size_t i = 0; i < rl; i++) {
        unsigned v;
        ASSERT_EQ(sscanf(cbor_hex + 2 * i, "%2x", &v), 1);
        raw[i] = (uint8_t)v;
    }
    uint8_t d[32];
    ASSERT_OK(kvp_hash_sha256(raw, rl, d));
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 4, &x, &h));
    ASSERT_MEM_EQ(d, h.bytes, 32);
}

TEST(test_block_empty_extras_are_null)
{
    static const uint32_t t[] = {7, 8};
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), a, b, c;
    kvp_hash_extra_keys_t none = {0};
    none.cache_salt = ""; /* an empty salt is no key, as in vLLM (`and request.cache_salt`) */
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 2, NULL, &a));
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 2, &none, &b));
    ASSERT_MEM_EQ(a.bytes, b.bytes, 32);
    /* ...but an empty LoRA name is a key (vLLM tests the request, not the name). */
    kvp_hash_extra_keys_t lora = {0};
    lora.lora_name = "";
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 2, &lora, &c));
    ASSERT(memcmp(a.bytes, c.bytes, 32) != 0);
    /* An empty block is allowed at this level. */
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, NULL, 0, NULL, &c));
}

TEST(test_block_bad_input)
{
    static const uint32_t t[] = {1};
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), h, bad = n;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, NULL, t, 1, NULL, &h), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, NULL, 1, NULL, &h), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 1, NULL, NULL), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_block((kvp_hash_algo_t)0, &n, t, 1, NULL, &h), KVP_ERR_INVALID_ARG);
    bad.len = 0;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &bad, t, 1, NULL, &h), KVP_ERR_INVALID_ARG);
    bad.len = 33;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &bad, t, 1, NULL, &h), KVP_ERR_INVALID_ARG);
    kvp_hash_extra_keys_t x = {0};
    x.lora_name = "\xc3";
    x.lora_name_len = 1;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 1, &x, &h), KVP_ERR_INVALID_ARG);
    x.lora_name = NULL;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 1, &x, &h), KVP_ERR_NULL_POINTER);
    kvp_hash_extra_keys_t y = {0};
    y.num_mm_keys = 1;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 1, &y, &h), KVP_ERR_NULL_POINTER);
    kvp_hash_mm_key_t k = {"\xed\xa0\x80", 3, 0};
    y.mm_keys = &k;
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 1, &y, &h), KVP_ERR_INVALID_ARG);
}

TEST(test_block_large_spills_to_heap)
{
    /* 5000 tokens of 2^32-1 encode to ~25 KB, past the stack buffer.
     * Python: sha256_cbor((sha256_cbor("0"), (2**32-1,)*5000, None)). */
    size_t n = 5000;
    uint32_t *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++)
        t[i] = UINT32_MAX;
    kvp_hash_t p = none_hash(KVP_HASH_SHA256_CBOR, "0"), h;
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &p, t, n, NULL, &h));
    ASSERT_HASH_HEX(&h, "8e40504a6c7a1a17db9beba9497008771be0db6014216e24f900f9b75aeedfb7");
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
    kvp__alloc_fail_after(0);
    ASSERT_EQ(kvp_hash_block(KVP_HASH_SHA256_CBOR, &p, t, n, NULL, &h), KVP_ERR_NO_MEMORY);
    kvp__alloc_fail_reset();
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
    free(t);
}

/* --------------------------------------------------------- request blocks */

/* 40 tokens 1000..1039, hash_block_size 8, seed "123", LoRA "L", salt "S",
 * mm items a@[3,7) b@[7,19) c@[30,32).  Python:
 *   block_hashes("sha256_cbor", "123", 8, list(range(1000, 1040)), "L", "S",
 *                [("a", 3, 4), ("b", 7, 12), ("c", 30, 2)])
 * Block extra keys: 0: (L, (a,3), (b,7), S)  1: (L, (b,-1))  2: (L, (b,-9))
 * 3: (L, (c,6))  4: (L,). */
TEST(test_request_blocks_with_mm_lora_salt)
{
    static const char *want[] = {
        "9f0b02debd9f529733321c34a69c3479def12dacf1f7b80b5e9e3dda0b6cf5b0",
        "93be3176deb8ceec004813173b7241ed603ebb723603b374087b78d47ee66116",
        "b074f4013e15de6eb2c605c9e04a0fe1113a525566d7ae07d14e83a17312d969",
        "3da474daee1c31dc5b2b1314c5e0063ec110737aa6724e1d330899e4ab45d9e3",
        "b4e58d4019b9396a82504f3cb2ac9b49ec8212e75dea476a057234b82dbfb24e",
    };
    uint32_t t[43];
    for (uint32_t i = 0; i < 43; i++)
        t[i] = 1000 + i;
    kvp_hash_mm_item_t mm[] = {{"a", 1, 3, 4}, {"b", 1, 7, 12}, {"c", 1, 30, 2}};
    kvp_hash_request_t req = {
        .lora_name = "L", .lora_name_len = 1,
        .mm_items = mm, .num_mm_items = 3,
        .cache_salt = "S", .cache_salt_len = 1,
    };
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "123"), hs[5];
    size_t nh = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 40, 8, &req, hs, 5, &nh));
    ASSERT_EQ(nh, 5);
    for (int i = 0; i < 5; i++)
        ASSERT_HASH_HEX(&hs[i], want[i]);

    /* The same via kvp_hash_block with the keys spelled out, for block 1. */
    kvp_hash_mm_key_t k1 = {"b", 1, -1};
    kvp_hash_extra_keys_t x1 = {.lora_name = "L", .lora_name_len = 1, .mm_keys = &k1,
                                .num_mm_keys = 1};
    kvp_hash_t h;
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &hs[0], t + 8, 8, &x1, &h));
    ASSERT_HASH_HEX(&h, want[1]);

    /* Trailing partial block: 43 tokens still give 5 hashes. */
    nh = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 43, 8, &req, hs, 5, &nh));
    ASSERT_EQ(nh, 5);
    ASSERT_HASH_HEX(&hs[4], want[4]);
}

TEST(test_request_blocks_incremental_matches_one_shot)
{
    enum { N = 100, BS = 4 };
    uint32_t t[N];
    for (uint32_t i = 0; i < N; i++)
        t[i] = i * 7919u;
    /* mm items all inside the first blocks: decode blocks see none, so both
     * ways agree (vLLM's incremental walk starts at the last item). */
    kvp_hash_mm_item_t mm[] = {{"x", 1, 1, 6}, {"y", 1, 9, 2}};
    kvp_hash_request_t req = {.lora_name = "lora", .lora_name_len = 4, .mm_items = mm,
                              .num_mm_items = 2, .cache_salt = "s", .cache_salt_len = 1};
    kvp_hash_t n = none_hash(KVP_HASH_XXHASH_CBOR, "9"), one[N / BS], inc[N / BS];
    size_t n1 = 0, n2 = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_XXHASH_CBOR, &n, t, N, BS, &req, one, N / BS, &n1));
    ASSERT_EQ(n1, N / BS);
    static const size_t steps[] = {3, 17, 17, 18, 40, 41, 99, 100};
    for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
        ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_XXHASH_CBOR, &n, t, steps[s], BS, &req, inc,
                                          N / BS, &n2));
        ASSERT_EQ(n2, steps[s] / BS);
    }
    for (size_t i = 0; i < N / BS; i++)
        ASSERT_MEM_EQ(one[i].bytes, inc[i].bytes, 16);
}

/* vLLM's decode-time quirk, reproduced: a hashing call that starts after
 * block 0 walks the mm items from the LAST one (curr_mm_idx = -1).  Items
 * a@[4,20), b@[5,6) (nested in a), c@[30,32); 4-token blocks; block 2 =
 * [8,12) is hashed
 *   - in one call from token 0: with key (a, 4-8 = -4);
 *   - incrementally (blocks 0-1 first, then block 2): the walk starts at c,
 *     not reached yet, so no mm key at all.
 * (Python: _gen_mm_extra_hash_keys(req, 8, 12, 0) -> [("a", -4)], and with
 * start_mm_idx=-1 -> [].)  Without c, the early "last item already ended"
 * exit would drop a's key in both cases, as vLLM does. */
TEST(test_request_blocks_incremental_uses_last_mm_item)
{
    uint32_t t[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    kvp_hash_mm_item_t mm[] = {{"a", 1, 4, 16}, {"b", 1, 5, 1}, {"c", 1, 30, 2}};
    kvp_hash_request_t req = {.mm_items = mm, .num_mm_items = 3};
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), one[3], inc[3], h;
    size_t n1 = 0, n2 = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 12, 4, &req, one, 3, &n1));
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 8, 4, &req, inc, 3, &n2));
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 12, 4, &req, inc, 3, &n2));
    ASSERT_EQ(n1, 3);
    ASSERT_EQ(n2, 3);
    ASSERT_MEM_EQ(one[1].bytes, inc[1].bytes, 32);
    kvp_hash_mm_key_t ka = {"a", 1, -4};
    kvp_hash_extra_keys_t xa = {.mm_keys = &ka, .num_mm_keys = 1};
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &one[1], t + 8, 4, &xa, &h));
    ASSERT_MEM_EQ(h.bytes, one[2].bytes, 32);
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &inc[1], t + 8, 4, NULL, &h));
    ASSERT_MEM_EQ(h.bytes, inc[2].bytes, 32);
}

TEST(test_request_blocks_prompt_embeds)
{
    uint32_t t[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t emb[2 * 32];
    ASSERT_OK(kvp_hash_sha256("block0", 6, emb));
    ASSERT_OK(kvp_hash_sha256("block1", 6, emb + 32));
    kvp_hash_request_t req = {.prompt_embeds_sha256 = emb, .num_prompt_embeds_blocks = 2};
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), hs[2], h;
    size_t nh = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 8, 4, &req, hs, 2, &nh));
    ASSERT_EQ(nh, 2);
    kvp_hash_extra_keys_t x = {.prompt_embeds_sha256 = emb};
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &n, t, 4, &x, &h));
    ASSERT_MEM_EQ(h.bytes, hs[0].bytes, 32);
    x.prompt_embeds_sha256 = emb + 32;
    ASSERT_OK(kvp_hash_block(KVP_HASH_SHA256_CBOR, &h, t + 4, 4, &x, &h));
    ASSERT_MEM_EQ(h.bytes, hs[1].bytes, 32);
    /* Too few digests for the blocks. */
    req.num_prompt_embeds_blocks = 1;
    nh = 0;
    ASSERT_EQ(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 8, 4, &req, hs, 2, &nh),
              KVP_ERR_INVALID_ARG);
}

TEST(test_request_blocks_i64_matches_u32)
{
    uint32_t t[64];
    int64_t t64[64];
    for (int i = 0; i < 64; i++)
        t64[i] = t[i] = (uint32_t)i * 2654435761u;
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "1"), a[4], b[4];
    size_t na = 0, nb = 0;
    ASSERT_OK(kvp_hash_request_blocks(KVP_HASH_SHA256_CBOR, &n, t, 64, 16, NULL, a, 4, &na));
    ASSERT_OK(kvp_hash_request_blocks_i64(KVP_HASH_SHA256_CBOR, &n, t64, 64, 16, NULL, b, 4, &nb));
    ASSERT_EQ(na, 4);
    ASSERT_EQ(nb, 4);
    for (int i = 0; i < 4; i++)
        ASSERT_MEM_EQ(a[i].bytes, b[i].bytes, 32);
}

TEST(test_request_blocks_bad_input)
{
    uint32_t t[16] = {0};
    kvp_hash_t n = none_hash(KVP_HASH_SHA256_CBOR, "0"), hs[4];
    size_t nh = 0;
    kvp_hash_algo_t A = KVP_HASH_SHA256_CBOR;
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, NULL, hs, 4, NULL), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, NULL, 16, 4, NULL, hs, 4, &nh), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, NULL, NULL, 4, &nh), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_request_blocks(A, NULL, t, 16, 4, NULL, hs, 4, &nh), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_hash_request_blocks((kvp_hash_algo_t)3, &n, t, 16, 4, NULL, hs, 4, &nh),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 0, NULL, hs, 4, &nh), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, NULL, hs, 3, &nh), KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(nh, 0);
    nh = 5; /* more hashes than full blocks */
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, NULL, hs, 4, &nh), KVP_ERR_INVALID_ARG);

    kvp_hash_mm_item_t unsorted[] = {{"a", 1, 8, 2}, {"b", 1, 1, 2}};
    kvp_hash_request_t req = {.mm_items = unsorted, .num_mm_items = 2};
    nh = 0;
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, &req, hs, 4, &nh), KVP_ERR_INVALID_ARG);
    kvp_hash_mm_item_t neg[] = {{"a", 1, -1, 2}};
    req.mm_items = neg;
    req.num_mm_items = 1;
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, &req, hs, 4, &nh), KVP_ERR_INVALID_ARG);
    kvp_hash_mm_item_t zero[] = {{"a", 1, 1, 0}};
    req.mm_items = zero;
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, &req, hs, 4, &nh), KVP_ERR_INVALID_ARG);
    kvp_hash_mm_item_t badid[] = {{"\xfe", 1, 1, 2}};
    req.mm_items = badid;
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, &req, hs, 4, &nh), KVP_ERR_INVALID_ARG);
    req.mm_items = NULL;
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, &req, hs, 4, &nh), KVP_ERR_NULL_POINTER);
    kvp_hash_request_t salt = {.cache_salt = "\x80", .cache_salt_len = 1};
    ASSERT_EQ(kvp_hash_request_blocks(A, &n, t, 16, 4, &salt, hs, 4, &nh), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(nh, 0);
    /* Nothing to do is fine: no full block, or all already hashed. */
    ASSERT_OK(kvp_hash_request_blocks(A, &n, t, 3, 4, NULL, NULL, 0, &nh));
    ASSERT_EQ(nh, 0);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST_LIST(T(test_cbor_uints), T(test_cbor_negative_ints), T(test_cbor_strings_arrays_null),
          T(test_cbor_grows_to_heap_and_frees), T(test_cbor_out_of_memory_is_sticky),
          T(test_utf8_validation), T(test_algo_names), T(test_scenario_32_none_hash_and_block0),
          T(test_none_hash_without_seed_follows_vllm_0_32), T(test_tagged_extra_keys_vllm_0_32), T(test_none_hash_bad_input),
          T(test_block_with_every_extra_key), T(test_block_empty_extras_are_null),
          T(test_block_bad_input), T(test_block_large_spills_to_heap),
          T(test_request_blocks_with_mm_lora_salt),
          T(test_request_blocks_incremental_matches_one_shot),
          T(test_request_blocks_incremental_uses_last_mm_item),
          T(test_request_blocks_prompt_embeds), T(test_request_blocks_i64_matches_u32),
          T(test_request_blocks_bad_input))
