/*
 * Mooncake-store keys (include/kvpool/kv_connector.h, "Store keys";
 * connectors-spec §2.3):
 *
 *   [cache_prefix@]model@tp_rank:T@pcp<P>@dcp<D>@pp_rank:<PP>@group:<G>@<hex>
 *
 * The parser reads from the right, where the layout is fixed, so the only
 * free-form part, "[cache_prefix@]model", is whatever is left; its last '@'
 * separates prefix and model.  That is why a prefix may hold '@' and a model
 * may not (format refuses such a model, so format -> parse always
 * round-trips).
 */
#include "kvpool/kv_connector.h"

#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/alloc.h"
#include "common/cbor.h"
#include "common/log.h"
#include "kv/kv_keys.h"

#define g_hex_digit "0123456789abcdef"

/* 1 if s[0..n) is UTF-8 without control characters (C0 or DEL). */
static int printable_utf8(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 || ch == 0x7f)
            return 0;
    }
    return kvp__utf8_valid(s, n);
}

typedef struct {
    char *p;
    size_t len, cap;
    int overflow;
} out_t;

static void out_mem(out_t *o, const void *s, size_t n)
{
    if (o->overflow || n > o->cap - o->len) {
        o->overflow = 1;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void out_str(out_t *o, const char *s) { out_mem(o, s, strlen(s)); }

static void out_u32(out_t *o, uint32_t v)
{
    char d[10];
    size_t n = 0;
    do {
        d[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    char r[10];
    for (size_t i = 0; i < n; i++)
        r[i] = d[n - 1 - i];
    out_mem(o, r, n);
}

/* The lowercase hex of a hash, sixteen bytes at a time where SSE2 is there
 * (every x86-64): the nibbles interleaved high first, then '0' + n, plus
 * 'a' - '0' - 10 more for n > 9.  A lookup formats one 64-digit hash per
 * key: about 4 ns a key, where a byte at a time cost 25 ns (8 % of a
 * 1,000-block lookup) and a 64-bit SWAR variant more still. */
size_t kvp__kv_key_hex(const uint8_t *hash, size_t n, char *out)
{
    size_t i = 0;
#if defined(__SSE2__)
    const __m128i m = _mm_set1_epi8(0x0f), nine = _mm_set1_epi8(9), zero = _mm_set1_epi8('0'),
                  gap = _mm_set1_epi8('a' - '0' - 10);
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(hash + i));
        __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), m), lo = _mm_and_si128(v, m);
        __m128i d0 = _mm_unpacklo_epi8(hi, lo), d1 = _mm_unpackhi_epi8(hi, lo);
        d0 = _mm_add_epi8(_mm_add_epi8(d0, zero), _mm_and_si128(_mm_cmpgt_epi8(d0, nine), gap));
        d1 = _mm_add_epi8(_mm_add_epi8(d1, zero), _mm_and_si128(_mm_cmpgt_epi8(d1, nine), gap));
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * i), d0);
        _mm_storeu_si128((__m128i *)(void *)(out + 2 * i + 16), d1);
    }
#endif
    for (; i < n; i++) {
        out[2 * i] = g_hex_digit[hash[i] >> 4];
        out[2 * i + 1] = g_hex_digit[hash[i] & 15];
    }
    return 2 * n;
}

kvp_status_t kvp__kv_names_init(kvp__kv_names_t *n, const char *model_path,
                                const char *cache_prefix)
{
    memset(n, 0, sizeof *n);
    const char *name;
    size_t len;
    if (!model_path || kvp_kv_store_key_model_name(model_path, strlen(model_path), &name, &len) != KVP_OK)
        return KVP_ERR_BAD_CONFIG;
    n->model = kvp__malloc(len + 1);
    if (!n->model)
        return KVP_ERR_NO_MEMORY;
    memcpy(n->model, name, len);
    n->model[len] = '\0';
    n->model_len = len;
    if (cache_prefix && cache_prefix[0]) {
        n->prefix = kvp__strdup(cache_prefix);
        if (!n->prefix) {
            kvp__kv_names_free(n);
            return KVP_ERR_NO_MEMORY;
        }
        n->prefix_len = strlen(cache_prefix);
    }
    return KVP_OK;
}

void kvp__kv_names_free(kvp__kv_names_t *n)
{
    if (n->model)
        kvp__free(n->model, n->model_len + 1);
    if (n->prefix)
        kvp__free(n->prefix, n->prefix_len + 1);
    memset(n, 0, sizeof *n);
}

void kvp__kv_names_key(const kvp__kv_names_t *n, kvp_kv_store_key_t *k)
{
    memset(k, 0, sizeof *k);
    k->cache_prefix = n->prefix;
    k->cache_prefix_len = n->prefix_len;
    k->model_name = n->model;
    k->model_name_len = n->model_len;
}

kvp_status_t kvp__kv_key_stem(const kvp_kv_store_key_t *key, char *buf, size_t buf_size,
                              size_t *len_p)
{
    if (!key || !buf || !len_p)
        return KVP_ERR_NULL_POINTER;
    kvp_kv_store_key_t k = *key;
    k.hash.len = KVP_HASH_MAX_LEN; /* the longest: any shorter hash fits too */
    memset(k.hash.bytes, 0, sizeof k.hash.bytes);
    char tmp[KVP_KV_STORE_KEY_MAX + 1];
    size_t len;
    kvp_status_t st = kvp_kv_store_key_format(&k, tmp, sizeof tmp, &len);
    if (st != KVP_OK)
        return st;
    len -= 2 * KVP_HASH_MAX_LEN;
    if (buf_size < len)
        return KVP_ERR_BUFFER_TOO_SMALL;
    memcpy(buf, tmp, len);
    *len_p = len;
    return KVP_OK;
}

kvp_status_t kvp_kv_store_key_format(const kvp_kv_store_key_t *key, char *buf, size_t buf_size,
                                  size_t *len_p)
{
    if (!key || (!buf && buf_size)) {
        kvp_error("store_key: format: NULL %s", !key ? "key" : "buf");
        return KVP_ERR_NULL_POINTER;
    }
    const char *prefix = key->cache_prefix;
    size_t prefix_len = prefix ? key->cache_prefix_len : 0;
    if (!prefix && key->cache_prefix_len) {
        kvp_error("store_key: format: cache_prefix is NULL with length %zu", key->cache_prefix_len);
        return KVP_ERR_NULL_POINTER;
    }
    if (!key->model_name) {
        kvp_error("store_key: format: model_name is NULL");
        return KVP_ERR_NULL_POINTER;
    }
    /* Lengths first: the contents are only read within bounds. */
    if (prefix_len > KVP_KV_STORE_KEY_MAX || key->model_name_len > KVP_KV_STORE_KEY_MAX) {
        kvp_error("store_key: format: key longer than %u bytes", KVP_KV_STORE_KEY_MAX);
        return KVP_ERR_KEY_LENGTH;
    }
    if (key->model_name_len == 0 || memchr(key->model_name, '@', key->model_name_len) ||
        memchr(key->model_name, '/', key->model_name_len) ||
        !printable_utf8(key->model_name, key->model_name_len)) {
        kvp_error("store_key: format: model name must be a non-empty path component without "
                  "'@', '/' or control characters");
        return KVP_ERR_INVALID_ARG;
    }
    if (prefix_len && !printable_utf8(prefix, prefix_len)) {
        kvp_error("store_key: format: cache_prefix holds control characters or invalid UTF-8");
        return KVP_ERR_INVALID_ARG;
    }
    if (key->hash.len == 0 || key->hash.len > KVP_HASH_MAX_LEN) {
        kvp_error("store_key: format: hash length %u is not 1..%u", (unsigned)key->hash.len,
                  KVP_HASH_MAX_LEN);
        return KVP_ERR_INVALID_ARG;
    }

    char tmp[KVP_KV_STORE_KEY_MAX];
    out_t o = {tmp, 0, sizeof tmp, 0};
    if (prefix_len) {
        out_mem(&o, prefix, prefix_len);
        out_str(&o, "@");
    }
    out_mem(&o, key->model_name, key->model_name_len);
    out_str(&o, "@tp_rank:");
    out_u32(&o, key->tp_rank);
    out_str(&o, "@pcp");
    out_u32(&o, key->pcp_rank);
    out_str(&o, "@dcp");
    out_u32(&o, key->dcp_rank);
    out_str(&o, "@pp_rank:");
    out_u32(&o, key->pp_rank);
    out_str(&o, "@group:");
    out_u32(&o, key->group_id);
    out_str(&o, "@");
    char hex[2 * KVP_HASH_MAX_LEN];
    out_mem(&o, hex, kvp__kv_key_hex(key->hash.bytes, key->hash.len, hex));
    if (o.overflow) {
        kvp_error("store_key: format: key longer than %u bytes", KVP_KV_STORE_KEY_MAX);
        return KVP_ERR_KEY_LENGTH;
    }
    if (len_p)
        *len_p = o.len;
    if (buf_size < o.len + 1) {
        kvp_error("store_key: format: buffer of %zu bytes, key needs %zu", buf_size, o.len + 1);
        return KVP_ERR_BUFFER_TOO_SMALL;
    }
    memcpy(buf, tmp, o.len);
    buf[o.len] = '\0';
    return KVP_OK;
}

/* Strict decimal: 1..10 digits, no leading zero (except "0"), <= UINT32_MAX. */
static int parse_u32(const char *s, size_t n, uint32_t *v_p)
{
    if (n == 0 || n > 10 || (n > 1 && s[0] == '0'))
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (v > UINT32_MAX)
        return -1;
    *v_p = (uint32_t)v;
    return 0;
}

static int hex_val(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

/* The segment before position *end_p: (last '@' before it, *end_p).  Moves
 * *end_p to that '@'.  -1 if there is no '@'. */
static int prev_segment(const char *s, size_t *end_p, const char **seg_p, size_t *seg_len_p)
{
    size_t end = *end_p, i = end;
    while (i > 0 && s[i - 1] != '@')
        i--;
    if (i == 0)
        return -1;
    *seg_p = s + i;
    *seg_len_p = end - i;
    *end_p = i - 1;
    return 0;
}

kvp_status_t kvp_kv_store_key_parse(const char *str, size_t len, kvp_kv_store_key_t *key_p)
{
    static const struct {
        const char *label;
        size_t off;
    } fields[] = {
        /* right to left */
        {"group:", offsetof(kvp_kv_store_key_t, group_id)},
        {"pp_rank:", offsetof(kvp_kv_store_key_t, pp_rank)},
        {"dcp", offsetof(kvp_kv_store_key_t, dcp_rank)},
        {"pcp", offsetof(kvp_kv_store_key_t, pcp_rank)},
        {"tp_rank:", offsetof(kvp_kv_store_key_t, tp_rank)},
    };
    if (!str || !key_p) {
        kvp_error("store_key: parse: NULL %s", !str ? "str" : "key_p");
        return KVP_ERR_NULL_POINTER;
    }
    if (len == 0 || len > KVP_KV_STORE_KEY_MAX) {
        kvp_error("store_key: parse: key length %zu is not 1..%u", len, KVP_KV_STORE_KEY_MAX);
        return KVP_ERR_KEY_LENGTH;
    }
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    size_t end = len;
    const char *seg;
    size_t seg_len;

    /* The hash. */
    if (prev_segment(str, &end, &seg, &seg_len) != 0) {
        kvp_error("store_key: parse: no '@' in a %zu-byte key", len);
        return KVP_ERR_DECODE;
    }
    if (seg_len == 0 || seg_len % 2 || seg_len > 2 * KVP_HASH_MAX_LEN) {
        kvp_error("store_key: parse: hash has %zu hex digits (need an even 2..%u)", seg_len,
                  2 * KVP_HASH_MAX_LEN);
        return KVP_ERR_DECODE;
    }
    for (size_t i = 0; i < seg_len; i += 2) {
        int hi = hex_val(seg[i]), lo = hex_val(seg[i + 1]);
        if (hi < 0 || lo < 0) {
            kvp_error("store_key: parse: hash is not lowercase hex (offset %zu)",
                      (size_t)(seg - str) + i);
            return KVP_ERR_DECODE;
        }
        k.hash.bytes[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    k.hash.len = (uint8_t)(seg_len / 2);

    /* The numeric fields. */
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        size_t ll = strlen(fields[f].label);
        uint32_t v;
        if (prev_segment(str, &end, &seg, &seg_len) != 0 || seg_len < ll ||
            memcmp(seg, fields[f].label, ll) != 0 || parse_u32(seg + ll, seg_len - ll, &v) != 0) {
            kvp_error("store_key: parse: expected '@%s<number>' before offset %zu",
                      fields[f].label, end + 1 + seg_len);
            return KVP_ERR_DECODE;
        }
        memcpy((char *)&k + fields[f].off, &v, sizeof v);
    }

    /* "[cache_prefix@]model" is str[0..end). */
    size_t at = end;
    while (at > 0 && str[at - 1] != '@')
        at--;
    k.model_name = str + at;
    k.model_name_len = end - at;
    if (at > 0) {
        k.cache_prefix = str;
        k.cache_prefix_len = at - 1;
    }
    if (k.model_name_len == 0 || memchr(k.model_name, '/', k.model_name_len) ||
        !printable_utf8(k.model_name, k.model_name_len)) {
        kvp_error("store_key: parse: model name is empty or holds '/', control characters or "
                  "invalid UTF-8");
        return KVP_ERR_DECODE;
    }
    if (at > 0 &&
        (k.cache_prefix_len == 0 || !printable_utf8(k.cache_prefix, k.cache_prefix_len))) {
        kvp_error("store_key: parse: cache prefix is empty or holds control characters or "
                  "invalid UTF-8");
        return KVP_ERR_DECODE;
    }
    *key_p = k;
    return KVP_OK;
}

kvp_status_t kvp_kv_store_key_model_name(const char *path, size_t len, const char **name_p,
                                      size_t *name_len_p)
{
    if (!path || !name_p || !name_len_p) {
        kvp_error("store_key: model_name: NULL %s",
                  !path ? "path" : !name_p ? "name_p" : "name_len_p");
        return KVP_ERR_NULL_POINTER;
    }
    size_t end = len;
    while (end > 0 && path[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && path[start - 1] != '/')
        start--;
    if (start == end) {
        kvp_error("store_key: model_name: model path of %zu bytes has no name component", len);
        return KVP_ERR_INVALID_ARG;
    }
    *name_p = path + start;
    *name_len_p = end - start;
    return KVP_OK;
}

kvp_status_t kvp_kv_store_key_replication_factor(kvp_kv_group_kind_t kind, uint32_t tp_size,
                                              uint32_t num_kv_heads, uint32_t dcp_size,
                                              uint32_t *factor_p)
{
    if (!factor_p) {
        kvp_error("store_key: replication_factor: factor_p is NULL");
        return KVP_ERR_NULL_POINTER;
    }
    bool attention = kind == KVP_KV_GROUP_FULL_ATTENTION || kind == KVP_KV_GROUP_SLIDING_WINDOW;
    if (tp_size == 0 || dcp_size == 0 ||
        (!attention && kind != KVP_KV_GROUP_MLA && kind != KVP_KV_GROUP_MAMBA) ||
        (attention && num_kv_heads == 0)) {
        kvp_error("store_key: replication_factor: kind %d, tp_size %u, num_kv_heads %u, "
                  "dcp_size %u",
                  (int)kind, tp_size, num_kv_heads, dcp_size);
        return KVP_ERR_INVALID_ARG;
    }
    if (dcp_size > 1 || kind == KVP_KV_GROUP_MAMBA)
        *factor_p = 1;
    else if (kind == KVP_KV_GROUP_MLA)
        *factor_p = tp_size;
    else
        *factor_p = tp_size / num_kv_heads > 1 ? tp_size / num_kv_heads : 1;
    return KVP_OK;
}
