/*
 * vLLM-compatible chained block hashes (include/kvpool/hash.h,
 * connectors-spec §2.2).  The CBOR of each block is built in a buffer (on the
 * stack unless a block is very large) and then digested with OpenSSL SHA-256
 * or xxHash XXH3-128.
 */
#include "kvpool/hash.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <openssl/evp.h>
#include <xxhash.h>

#include "common/cbor.h"
#include "common/log.h"
#include "common/random.h"

/* Encode buffer on the stack: a 16-token block is ~100 bytes, a 1024-token
 * block ~5 KiB; bigger blocks spill to the heap. */
#define HASH_INLINE_BUF 8192

/* Token ids are either uint32 or int64; exactly one pointer is set. */
typedef struct {
    const uint32_t *u32;
    const int64_t *i64;
} token_view_t;

kvp_status_t kvp_hash_algo_parse(const char *name, kvp_hash_algo_t *algo_p)
{
    if (!name || !algo_p) {
        kvp_error("hash: algo_parse: NULL %s", !name ? "name" : "algo_p");
        return KVP_ERR_NULL_POINTER;
    }
    if (strcmp(name, "sha256_cbor") == 0) {
        *algo_p = KVP_HASH_SHA256_CBOR;
        return KVP_OK;
    }
    if (strcmp(name, "xxhash_cbor") == 0) {
        *algo_p = KVP_HASH_XXHASH_CBOR;
        return KVP_OK;
    }
    if (strcmp(name, "sha256") == 0 || strcmp(name, "xxhash") == 0) {
        kvp_error("hash: algorithm '%s' hashes Python pickle bytes and cannot be reproduced "
                  "outside Python; configure vLLM with '%s_cbor'",
                  name, name);
        return KVP_ERR_UNSUPPORTED;
    }
    kvp_error("hash: unknown hash algorithm '%s' (expected sha256_cbor or xxhash_cbor)", name);
    return KVP_ERR_INVALID_ARG;
}

const char *kvp_hash_algo_name(kvp_hash_algo_t algo)
{
    switch (algo) {
    case KVP_HASH_SHA256_CBOR:
        return "sha256_cbor";
    case KVP_HASH_XXHASH_CBOR:
        return "xxhash_cbor";
    }
    return NULL;
}

size_t kvp_hash_algo_len(kvp_hash_algo_t algo)
{
    switch (algo) {
    case KVP_HASH_SHA256_CBOR:
        return KVP_HASH_SHA256_LEN;
    case KVP_HASH_XXHASH_CBOR:
        return KVP_HASH_XXH3_128_LEN;
    }
    return 0;
}

static kvp_status_t check_algo(const char *fn, kvp_hash_algo_t algo)
{
    if (kvp_hash_algo_len(algo) == 0) {
        kvp_error("hash: %s: unknown algorithm %d", fn, (int)algo);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/* A caller's string: NULL only when empty, and UTF-8 (a Python str). */
static kvp_status_t check_text(const char *fn, const char *what, const char *s, size_t n)
{
    if (!s && n) {
        kvp_error("hash: %s: %s is NULL with length %zu", fn, what, n);
        return KVP_ERR_NULL_POINTER;
    }
    if (s && !kvp__utf8_valid(s, n)) {
        kvp_error("hash: %s: %s is not valid UTF-8", fn, what);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

static kvp_status_t check_hash(const char *fn, const char *what, const kvp_hash_t *h)
{
    if (!h) {
        kvp_error("hash: %s: %s is NULL", fn, what);
        return KVP_ERR_NULL_POINTER;
    }
    if (h->len == 0 || h->len > KVP_HASH_MAX_LEN) {
        kvp_error("hash: %s: %s length %u is not 1..%u", fn, what, (unsigned)h->len,
                  KVP_HASH_MAX_LEN);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

/*
 * SHA-256 goes through EVP with the algorithm fetched once per process and
 * one context per call of ours (reused across a request's blocks): OpenSSL
 * 3's one-shot SHA256() fetches the algorithm on every call, which made a
 * 16-token block about 4x slower to hash (measured).
 */
static pthread_once_t g_sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *g_sha256; /* never freed: process lifetime */

static void sha256_fetch(void) { g_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL); }

typedef struct {
    kvp_hash_algo_t algo;
    EVP_MD_CTX *ctx; /* SHA-256 only */
} digester_t;

static kvp_status_t digester_init(digester_t *d, kvp_hash_algo_t algo)
{
    d->algo = algo;
    d->ctx = NULL;
    if (algo != KVP_HASH_SHA256_CBOR)
        return KVP_OK;
    pthread_once(&g_sha256_once, sha256_fetch);
    if (!g_sha256) {
        kvp_error("hash: OpenSSL has no SHA256 implementation");
        return KVP_ERR_INTERNAL;
    }
    if (!(d->ctx = EVP_MD_CTX_new())) {
        kvp_error("hash: out of memory for an OpenSSL digest context");
        return KVP_ERR_NO_MEMORY;
    }
    return KVP_OK;
}

static void digester_cleanup(digester_t *d)
{
    EVP_MD_CTX_free(d->ctx);
    d->ctx = NULL;
}

static kvp_status_t digest(digester_t *d, const uint8_t *data, size_t len, kvp_hash_t *out)
{
    if (d->algo == KVP_HASH_SHA256_CBOR) {
        if (EVP_DigestInit_ex(d->ctx, g_sha256, NULL) != 1 ||
            EVP_DigestUpdate(d->ctx, data, len) != 1 ||
            EVP_DigestFinal_ex(d->ctx, out->bytes, NULL) != 1) {
            kvp_error("hash: OpenSSL SHA-256 failed");
            return KVP_ERR_INTERNAL;
        }
        out->len = KVP_HASH_SHA256_LEN;
    } else {
        /* python-xxhash's xxh3_128_digest() is the canonical (big-endian)
         * form: high 64 bits first. */
        XXH128_canonical_t canon;
        XXH128_canonicalFromHash(&canon, XXH3_128bits(data, len));
        memcpy(out->bytes, canon.digest, KVP_HASH_XXH3_128_LEN);
        out->len = KVP_HASH_XXH3_128_LEN;
    }
    return KVP_OK;
}

kvp_status_t kvp_hash_sha256(const void *data, size_t len, uint8_t out[32])
{
    if ((!data && len) || !out) {
        kvp_error("hash: sha256: NULL %s", !out ? "out" : "data");
        return KVP_ERR_NULL_POINTER;
    }
    digester_t d;
    kvp_hash_t h;
    kvp_status_t st = digester_init(&d, KVP_HASH_SHA256_CBOR);
    if (st == KVP_OK && (st = digest(&d, data ? data : (const void *)"", len, &h)) == KVP_OK)
        memcpy(out, h.bytes, 32);
    digester_cleanup(&d);
    return st;
}

size_t kvp_hash_to_hex(const kvp_hash_t *h, char out[KVP_HASH_HEX_MAX])
{
    static const char hex[] = "0123456789abcdef";
    size_t n = h->len <= KVP_HASH_MAX_LEN ? h->len : KVP_HASH_MAX_LEN;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[h->bytes[i] >> 4];
        out[2 * i + 1] = hex[h->bytes[i] & 15];
    }
    out[2 * n] = '\0';
    return 2 * n;
}

/* Hashes what c encoded (or returns its encoding error), then frees c. */
static kvp_status_t digest_cbor(kvp_hash_algo_t algo, kvp__cbor_t *c, kvp_hash_t *out_p)
{
    digester_t d;
    kvp_status_t st = kvp__cbor_status(c);
    if (st == KVP_OK && (st = digester_init(&d, algo)) == KVP_OK) {
        st = digest(&d, c->data, c->len, out_p);
        digester_cleanup(&d);
    }
    kvp__cbor_cleanup(c);
    return st;
}

kvp_status_t kvp_hash_none_hash(kvp_hash_algo_t algo, const char *seed, size_t seed_len,
                                kvp_hash_t *out_p)
{
    kvp_status_t st;
    if (!out_p) {
        kvp_error("hash: none_hash: out_p is NULL");
        return KVP_ERR_NULL_POINTER;
    }
    if ((st = check_algo("none_hash", algo)) != KVP_OK)
        return st;
    char random_seed[2 * KVP_HASH_MAX_LEN];
    if (!seed && algo == KVP_HASH_SHA256_CBOR) {
        /* vLLM 0.32 without PYTHONHASHSEED, a cryptographic algorithm: the
         * fixed default seed, so that independent engines agree. */
        seed = KVP_HASH_DEFAULT_SEED;
        seed_len = sizeof KVP_HASH_DEFAULT_SEED - 1;
    } else if (!seed) {
        /* ... a non-cryptographic one: os.urandom(32).hex(), kept secret. */
        uint8_t r[KVP_HASH_MAX_LEN];
        if ((st = kvp__random_bytes(r, sizeof r)) != KVP_OK)
            return st;
        kvp_hash_t rh = {.len = KVP_HASH_MAX_LEN};
        memcpy(rh.bytes, r, sizeof r);
        char hex[KVP_HASH_HEX_MAX];
        memcpy(random_seed, hex, kvp_hash_to_hex(&rh, hex));
        seed = random_seed;
        seed_len = sizeof random_seed;
        kvp_warn("hash: no hash seed given for %s: NONE_HASH is random, so no other process "
                 "will produce the same block hashes (set the same PYTHONHASHSEED everywhere)",
                 kvp_hash_algo_name(algo));
    }
    if ((st = check_text("none_hash", "seed", seed, seed_len)) != KVP_OK)
        return st;
    uint8_t inline_buf[256];
    kvp__cbor_t c;
    kvp__cbor_init(&c, inline_buf, sizeof inline_buf);
    kvp__cbor_text(&c, seed, seed_len);
    return digest_cbor(algo, &c, out_p);
}

/* ------------------------------------------------------------ one block */

static void encode_tokens(kvp__cbor_t *c, token_view_t tv, size_t start, size_t n)
{
    kvp__cbor_array(c, n);
    if (tv.u32) {
        for (size_t i = 0; i < n; i++)
            kvp__cbor_uint(c, tv.u32[start + i]);
    } else {
        for (size_t i = 0; i < n; i++)
            kvp__cbor_int(c, tv.i64[start + i]);
    }
}

/* The extra keys, one spelling each (kvp_hash_keys_t): bare (vLLM 0.27)
 * or tagged tuples (vLLM 0.32). */
static void put_lora(kvp__cbor_t *c, kvp_hash_keys_t keys, const char *name, size_t len,
                     const char *path, size_t path_len)
{
    if (keys == KVP_HASH_KEYS_TAGGED) {
        kvp__cbor_array(c, 3);
        kvp__cbor_text(c, "lora", 4);
        kvp__cbor_text(c, name, len);
        kvp__cbor_text(c, path ? path : "", path ? path_len : 0);
        return;
    }
    kvp__cbor_text(c, name, len);
}

static void put_mm(kvp__cbor_t *c, kvp_hash_keys_t keys, const char *id, size_t len, int64_t offset)
{
    kvp__cbor_array(c, keys == KVP_HASH_KEYS_TAGGED ? 3 : 2);
    if (keys == KVP_HASH_KEYS_TAGGED)
        kvp__cbor_text(c, "mm", 2);
    kvp__cbor_text(c, id, len);
    kvp__cbor_int(c, offset);
}

static void put_salt(kvp__cbor_t *c, kvp_hash_keys_t keys, const char *salt, size_t len)
{
    if (keys == KVP_HASH_KEYS_TAGGED) {
        kvp__cbor_array(c, 2);
        kvp__cbor_text(c, "cache_salt", 10);
    }
    kvp__cbor_text(c, salt, len);
}

static void put_embeds(kvp__cbor_t *c, kvp_hash_keys_t keys, const uint8_t *digest)
{
    if (keys == KVP_HASH_KEYS_TAGGED) {
        kvp__cbor_array(c, 2);
        kvp__cbor_text(c, "prompt_embeds", 13);
    }
    kvp__cbor_bytes(c, digest, 32);
}

/* A block's CBOR up to its extra keys: [parent, tokens, extras] with
 * extras null when there are none (returns 0) or an array head of nextra
 * that the caller fills (returns 1). */
static int encode_head(kvp__cbor_t *c, const kvp_hash_t *parent, token_view_t tv, size_t start, size_t n,
                       size_t nextra)
{
    kvp__cbor_array(c, 3);
    kvp__cbor_bytes(c, parent->bytes, parent->len);
    encode_tokens(c, tv, start, n);
    if (nextra == 0) {
        kvp__cbor_null(c);
        return 0;
    }
    kvp__cbor_array(c, nextra);
    return 1;
}

/* The fields an extra-keys struct and a request share: lora_name,
 * cache_salt and an array of multimodal entries (`what`, n of them). */
static kvp_status_t check_common(const char *fn, kvp_hash_keys_t keys, const char *lora,
                                 size_t lora_len, const char *path, size_t path_len,
                                 const char *salt, size_t salt_len, const void *entries, size_t n,
                                 const char *what)
{
    kvp_status_t st;
    if ((unsigned)keys > KVP_HASH_KEYS_TAGGED) {
        kvp_error("hash: %s: unknown extra-keys spelling %d", fn, (int)keys);
        return KVP_ERR_INVALID_ARG;
    }
    if ((st = check_text(fn, "lora_name", lora, lora_len)) != KVP_OK ||
        (st = check_text(fn, "lora_path", path, path_len)) != KVP_OK ||
        (st = check_text(fn, "cache_salt", salt, salt_len)) != KVP_OK)
        return st;
    if (n && !entries) {
        kvp_error("hash: %s: %s is NULL with %zu entries", fn, what, n);
        return KVP_ERR_NULL_POINTER;
    }
    return KVP_OK;
}

static kvp_status_t check_extra(const char *fn, const kvp_hash_extra_keys_t *x)
{
    kvp_status_t st = check_common(fn, x->keys, x->lora_name, x->lora_name_len, x->lora_path,
                                   x->lora_path_len, x->cache_salt, x->cache_salt_len, x->mm_keys,
                                   x->num_mm_keys, "mm_keys");
    if (st != KVP_OK)
        return st;
    for (size_t i = 0; i < x->num_mm_keys; i++) {
        const kvp_hash_mm_key_t *k = &x->mm_keys[i];
        if ((st = check_text(fn, "mm key identifier", k->identifier, k->identifier_len)) != KVP_OK)
            return st;
    }
    return KVP_OK;
}

static kvp_status_t hash_block(const char *fn, kvp_hash_algo_t algo, const kvp_hash_t *parent,
                               token_view_t tv, size_t num_tokens,
                               const kvp_hash_extra_keys_t *extra, kvp_hash_t *out_p)
{
    kvp_status_t st;
    if (!out_p) {
        kvp_error("hash: %s: out_p is NULL", fn);
        return KVP_ERR_NULL_POINTER;
    }
    if (num_tokens && !tv.u32 && !tv.i64) {
        kvp_error("hash: %s: tokens is NULL with %zu tokens", fn, num_tokens);
        return KVP_ERR_NULL_POINTER;
    }
    if ((st = check_algo(fn, algo)) != KVP_OK || (st = check_hash(fn, "parent", parent)) != KVP_OK)
        return st;
    if (extra && (st = check_extra(fn, extra)) != KVP_OK)
        return st;

    size_t nextra = 0;
    int with_salt = 0;
    if (extra) {
        with_salt = extra->cache_salt && extra->cache_salt_len > 0;
        nextra = (extra->lora_name != NULL) + extra->num_mm_keys + (size_t)with_salt +
                 (extra->prompt_embeds_sha256 != NULL);
    }

    uint8_t inline_buf[HASH_INLINE_BUF];
    kvp__cbor_t c;
    kvp__cbor_init(&c, inline_buf, sizeof inline_buf);
    if (encode_head(&c, parent, tv, 0, num_tokens, nextra)) {
        kvp_hash_keys_t k = extra->keys;
        if (extra->lora_name)
            put_lora(&c, k, extra->lora_name, extra->lora_name_len, extra->lora_path,
                     extra->lora_path_len);
        for (size_t i = 0; i < extra->num_mm_keys; i++)
            put_mm(&c, k, extra->mm_keys[i].identifier, extra->mm_keys[i].identifier_len,
                   extra->mm_keys[i].offset);
        if (with_salt)
            put_salt(&c, k, extra->cache_salt, extra->cache_salt_len);
        if (extra->prompt_embeds_sha256)
            put_embeds(&c, k, extra->prompt_embeds_sha256);
    }
    return digest_cbor(algo, &c, out_p);
}

kvp_status_t kvp_hash_block(kvp_hash_algo_t algo, const kvp_hash_t *parent, const uint32_t *tokens,
                            size_t num_tokens, const kvp_hash_extra_keys_t *extra,
                            kvp_hash_t *out_p)
{
    token_view_t tv = {tokens, NULL};
    return hash_block("hash_block", algo, parent, tv, num_tokens, extra, out_p);
}

kvp_status_t kvp_hash_block_i64(kvp_hash_algo_t algo, const kvp_hash_t *parent,
                                const int64_t *tokens, size_t num_tokens,
                                const kvp_hash_extra_keys_t *extra, kvp_hash_t *out_p)
{
    token_view_t tv = {NULL, tokens};
    return hash_block("hash_block_i64", algo, parent, tv, num_tokens, extra, out_p);
}

/* ------------------------------------------------------- a request's blocks */

/*
 * Which multimodal items go into a block's extra keys.
 *
 * vLLM does not test every item against every block.  It keeps a cursor
 * (curr_mm_idx) into the items, which it assumes are sorted by offset, and
 * for the block [start, end) walks forward from the cursor:
 *
 *   - item not reached yet (end <= offset): stop;
 *   - item already passed (start >= offset + length): cursor++, go on;
 *   - otherwise the item overlaps: add (identifier, offset - start); if the
 *     item also ends inside the block (end >= offset + length) cursor++ and
 *     go on (the block may hold the next item too), else stop.
 *
 * The cursor carries over to the next block.  A hashing call that starts at
 * token 0 begins with cursor 0; one that starts later (blocks completed by
 * decode tokens) begins with cursor -1, meaning "the last item".  And when
 * the last item ends at or before the block start, nothing is added and the
 * cursor is left as it was.  This walk is reproduced step for step, rather
 * than as "every overlapping item", so that even unusual inputs (nested
 * items) give vLLM's keys.  The walk runs twice per block, once to count
 * the keys (the CBOR array head comes first) and once to write them; it is
 * a pure function of (items, start, end, cursor).
 */
static int64_t mm_walk(const kvp_hash_request_t *req, int64_t start, int64_t end, int64_t cursor,
                       kvp__cbor_t *c, size_t *count_p)
{
    size_t count = 0;
    const kvp_hash_mm_item_t *items = req->mm_items;
    int64_t n = (int64_t)req->num_mm_items;
    *count_p = 0;
    if (n == 0)
        return cursor;
    if (items[n - 1].offset + items[n - 1].length <= start)
        return cursor;
    if (cursor < 0)
        cursor += n; /* validated: only -1 is ever passed */
    while (cursor < n) {
        const kvp_hash_mm_item_t *it = &items[cursor];
        if (!(end > it->offset))
            break; /* not reached yet */
        if (start >= it->offset + it->length) {
            cursor++; /* already passed */
            continue;
        }
        count++;
        if (c)
            put_mm(c, req->keys, it->identifier, it->identifier_len, it->offset - start);
        if (end >= it->offset + it->length)
            cursor++;
        else
            break;
    }
    *count_p = count;
    return cursor;
}

static kvp_status_t check_request(const char *fn, const kvp_hash_request_t *req,
                                  size_t total_blocks)
{
    kvp_status_t st = check_common(fn, req->keys, req->lora_name, req->lora_name_len,
                                   req->lora_path, req->lora_path_len, req->cache_salt,
                                   req->cache_salt_len, req->mm_items, req->num_mm_items,
                                   "mm_items");
    if (st != KVP_OK)
        return st;
    for (size_t i = 0; i < req->num_mm_items; i++) {
        const kvp_hash_mm_item_t *it = &req->mm_items[i];
        if ((st = check_text(fn, "mm item identifier", it->identifier, it->identifier_len)) !=
            KVP_OK)
            return st;
        /* Bounded so that offset + length and offset - start cannot overflow. */
        if (it->offset < 0 || it->length < 1 || it->offset > INT64_MAX / 4 ||
            it->length > INT64_MAX / 4) {
            kvp_error("hash: %s: mm item %zu has offset %lld, length %lld (need offset >= 0, "
                      "length >= 1)",
                      fn, i, (long long)it->offset, (long long)it->length);
            return KVP_ERR_INVALID_ARG;
        }
        if (i > 0 && it->offset < req->mm_items[i - 1].offset) {
            kvp_error("hash: %s: mm items not sorted by offset (item %zu at %lld after %lld)", fn,
                      i, (long long)it->offset, (long long)req->mm_items[i - 1].offset);
            return KVP_ERR_INVALID_ARG;
        }
    }
    if (req->prompt_embeds_sha256 && req->num_prompt_embeds_blocks < total_blocks) {
        kvp_error("hash: %s: %zu prompt-embeds digests for %zu blocks", fn,
                  req->num_prompt_embeds_blocks, total_blocks);
        return KVP_ERR_INVALID_ARG;
    }
    return KVP_OK;
}

static kvp_status_t request_blocks(const char *fn, kvp_hash_algo_t algo,
                                   const kvp_hash_t *none_hash, token_view_t tv,
                                   size_t num_tokens, size_t bs, const kvp_hash_request_t *req,
                                   kvp_hash_t *hashes, size_t max_hashes, size_t *num_hashes_p)
{
    static const kvp_hash_request_t no_extras = {0};
    kvp_status_t st;
    if (!num_hashes_p || (max_hashes && !hashes) || (num_tokens && !tv.u32 && !tv.i64)) {
        kvp_error("hash: %s: NULL %s", fn,
                  !num_hashes_p ? "num_hashes_p" : (max_hashes && !hashes) ? "hashes" : "tokens");
        return KVP_ERR_NULL_POINTER;
    }
    if ((st = check_algo(fn, algo)) != KVP_OK ||
        (st = check_hash(fn, "none_hash", none_hash)) != KVP_OK)
        return st;
    if (bs == 0 || num_tokens > (size_t)INT64_MAX / 4) {
        kvp_error("hash: %s: hash_block_size %zu, %zu tokens", fn, bs, num_tokens);
        return KVP_ERR_INVALID_ARG;
    }
    size_t total = num_tokens / bs, have = *num_hashes_p;
    if (!req)
        req = &no_extras;
    if ((st = check_request(fn, req, total)) != KVP_OK)
        return st;
    if (have > total || have > max_hashes) {
        kvp_error("hash: %s: %zu hashes already computed, but only %zu full blocks (room "
                  "for %zu)",
                  fn, have, total, max_hashes);
        return KVP_ERR_INVALID_ARG;
    }
    if (total > max_hashes) {
        kvp_error("hash: %s: %zu full blocks, room for %zu hashes", fn, total, max_hashes);
        return KVP_ERR_BUFFER_TOO_SMALL;
    }
    if (have > 0 && (st = check_hash(fn, "previous block hash", &hashes[have - 1])) != KVP_OK)
        return st;
    if (have == total)
        return KVP_OK;

    digester_t d;
    if ((st = digester_init(&d, algo)) != KVP_OK)
        return st;
    uint8_t inline_buf[HASH_INLINE_BUF];
    kvp__cbor_t c;
    kvp__cbor_init(&c, inline_buf, sizeof inline_buf);
    int64_t cursor = have > 0 ? -1 : 0;
    for (size_t b = have; b < total; b++) {
        int64_t start = (int64_t)(b * bs), end = start + (int64_t)bs;
        size_t nmm;
        int64_t next = mm_walk(req, start, end, cursor, NULL, &nmm);
        int with_salt = b == 0 && req->cache_salt && req->cache_salt_len > 0;
        size_t nextra = (req->lora_name != NULL) + nmm + (size_t)with_salt +
                        (req->prompt_embeds_sha256 != NULL);
        const kvp_hash_t *parent = b == 0 ? none_hash : &hashes[b - 1];

        kvp__cbor_reset(&c);
        if (encode_head(&c, parent, tv, (size_t)start, bs, nextra)) {
            if (req->lora_name)
                put_lora(&c, req->keys, req->lora_name, req->lora_name_len, req->lora_path,
                         req->lora_path_len);
            mm_walk(req, start, end, cursor, &c, &nmm);
            if (with_salt)
                put_salt(&c, req->keys, req->cache_salt, req->cache_salt_len);
            if (req->prompt_embeds_sha256)
                put_embeds(&c, req->keys, req->prompt_embeds_sha256 + 32 * b);
        }
        if ((st = kvp__cbor_status(&c)) != KVP_OK ||
            (st = digest(&d, c.data, c.len, &hashes[b])) != KVP_OK)
            break;
        *num_hashes_p = b + 1;
        cursor = next;
    }
    kvp__cbor_cleanup(&c);
    digester_cleanup(&d);
    return st;
}

kvp_status_t kvp_hash_request_blocks(kvp_hash_algo_t algo, const kvp_hash_t *none_hash,
                                     const uint32_t *tokens, size_t num_tokens,
                                     size_t hash_block_size, const kvp_hash_request_t *req,
                                     kvp_hash_t *hashes, size_t max_hashes, size_t *num_hashes_p)
{
    token_view_t tv = {tokens, NULL};
    return request_blocks("request_blocks", algo, none_hash, tv, num_tokens, hash_block_size, req,
                          hashes, max_hashes, num_hashes_p);
}

kvp_status_t kvp_hash_request_blocks_i64(kvp_hash_algo_t algo, const kvp_hash_t *none_hash,
                                         const int64_t *tokens, size_t num_tokens,
                                         size_t hash_block_size, const kvp_hash_request_t *req,
                                         kvp_hash_t *hashes, size_t max_hashes,
                                         size_t *num_hashes_p)
{
    token_view_t tv = {NULL, tokens};
    return request_blocks("request_blocks_i64", algo, none_hash, tv, num_tokens, hash_block_size,
                          req, hashes, max_hashes, num_hashes_p);
}
