/*
 * Strict JSON parser for readiness events and replay streams, plus the
 * Python conversions the original applies to event fields.
 *
 * Strict means: what Python's json.loads accepts, minus every number that is
 * not an integer within int64 (json.loads would give a float or a big int;
 * kvpool refuses them, and so does the replay format), with nesting bounded
 * by the caller.  Strings are decoded to UTF-8; \u escapes of lone
 * surrogates become their 3-byte (WTF-8) form, so they round-trip.
 * Duplicate keys: Python keeps the first key's position and the last value.
 */
#include "ec/ec_json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"

typedef struct {
    const char *p, *end;
    int max_depth;
} parser_t;

static void value_clear(kvp_ec_value_t *v);

static void skip_ws(parser_t *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of a valid UTF-8 sequence at s (strict: no overlongs, no
 * surrogates, <= U+10FFFF), or 0. */
static size_t utf8_len(const unsigned char *s, const unsigned char *end)
{
    unsigned c = s[0];
    size_t n;
    unsigned cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - s) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return n;
}

static kvp_status_t parse_string(parser_t *ps, char **out, size_t *out_len)
{
    /* ps->p at the opening quote.  Output is never longer than the input. */
    const char *s = ++ps->p;
    const char *q = s;
    while (q < ps->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
    }
    if (q >= ps->end)
        return KVP_ERR_DECODE;
    size_t cap = (size_t)(q - s) + 1;
    char *o = kvp__malloc(cap);
    if (!o)
        return KVP_ERR_NO_MEMORY;
    size_t n = 0;
    const char *p = s;
    while (p < q) {
        unsigned char c = (unsigned char)*p;
        if (c < 0x20)
            goto bad;
        if (c != '\\') {
            size_t l = utf8_len((const unsigned char *)p, (const unsigned char *)q);
            if (!l)
                goto bad;
            memcpy(o + n, p, l);
            n += l;
            p += l;
            continue;
        }
        p++;
        if (p >= q)
            goto bad;
        char e = *p++;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (q - p < 4 || hex4(p, &cp))
                goto bad;
            p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && q - p >= 6 && p[0] == '\\' && p[1] == 'u') {
                unsigned lo;
                if (!hex4(p + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    p += 6;
                }
            }
            n += put_utf8(o + n, cp); /* \uXXXX (6 bytes in) gives <= 4 out */
            break;
        }
        default:
            goto bad;
        }
    }
    o[n] = 0;
    ps->p = q + 1;
    /* Shrink to the exact size so kvp__free can be given strlen-independent n+1. */
    char *shrunk = kvp__realloc(o, cap, n + 1);
    if (!shrunk) {
        kvp__free(o, cap);
        return KVP_ERR_NO_MEMORY;
    }
    *out = shrunk;
    *out_len = n;
    return KVP_OK;
bad:
    kvp__free(o, cap);
    return KVP_ERR_DECODE;
}

static kvp_status_t parse_value(parser_t *ps, kvp_ec_value_t *v, int depth);

static kvp_status_t parse_number(parser_t *ps, kvp_ec_value_t *v)
{
    const char *p = ps->p;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    if (p >= ps->end || *p < '0' || *p > '9')
        return KVP_ERR_DECODE;
    if (*p == '0' && p + 1 < ps->end && p[1] >= '0' && p[1] <= '9')
        return KVP_ERR_DECODE; /* leading zeros */
    uint64_t acc = 0;
    const uint64_t lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (p < ps->end && *p >= '0' && *p <= '9') {
        unsigned d = (unsigned)(*p - '0');
        if (acc > (lim - d) / 10)
            return KVP_ERR_DECODE; /* outside int64 */
        acc = acc * 10 + d;
        p++;
    }
    if (p < ps->end && (*p == '.' || *p == 'e' || *p == 'E'))
        return KVP_ERR_DECODE; /* a float */
    v->type = KVP_EC_V_INT;
    v->u.i = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    ps->p = p;
    return KVP_OK;
}

static int cmp_key_idx(const void *a, const void *b, void *ctx)
{
    const kvp_ec_member_t *m = ctx;
    size_t ia = *(const size_t *)a, ib = *(const size_t *)b;
    size_t la = m[ia].key_len, lb = m[ib].key_len;
    int c = memcmp(m[ia].key, m[ib].key, la < lb ? la : lb);
    if (c)
        return c;
    if (la != lb)
        return la < lb ? -1 : 1;
    return ia < ib ? -1 : (ia > ib);
}

/* Resolve duplicate keys: first position, last value. */
static kvp_status_t dedup_members(kvp_ec_member_t *m, size_t *n_p)
{
    size_t n = *n_p;
    if (n < 2)
        return KVP_OK;
    if (n <= 8) {
        bool any = false;
        for (size_t i = 0; i < n && !any; i++)
            for (size_t j = i + 1; j < n; j++)
                if (m[i].key_len == m[j].key_len && !memcmp(m[i].key, m[j].key, m[i].key_len)) {
                    any = true;
                    break;
                }
        if (!any)
            return KVP_OK;
    }
    size_t *idx = kvp__malloc(n * sizeof *idx);
    bool *dead = kvp__calloc(n, sizeof *dead);
    if (!idx || !dead) {
        if (idx)
            kvp__free(idx, n * sizeof *idx);
        if (dead)
            kvp__free(dead, n * sizeof *dead);
        return KVP_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    qsort_r(idx, n, sizeof *idx, cmp_key_idx, m);
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && m[idx[j]].key_len == m[idx[i]].key_len &&
               !memcmp(m[idx[j]].key, m[idx[i]].key, m[idx[i]].key_len))
            j++;
        if (j - i > 1) {
            size_t first = idx[i], last = idx[j - 1];
            kvp_ec_value_t keep = m[last].value;
            value_clear(&m[first].value);
            m[first].value = keep;
            for (size_t k = i + 1; k < j; k++) {
                size_t d = idx[k];
                if (d != last)
                    value_clear(&m[d].value);
                kvp__free((void *)m[d].key, m[d].key_len + 1);
                dead[d] = true;
            }
        }
        i = j;
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!dead[i])
            m[w++] = m[i];
    *n_p = w;
    kvp__free(idx, n * sizeof *idx);
    kvp__free(dead, n * sizeof *dead);
    return KVP_OK;
}

static kvp_status_t parse_container(parser_t *ps, kvp_ec_value_t *v, int depth, bool is_obj)
{
    size_t elem = is_obj ? sizeof(kvp_ec_member_t) : sizeof(kvp_ec_value_t);
    size_t n = 0, cap = 0;
    char *arr = NULL;
    kvp_status_t st = KVP_OK;
    ps->p++;
    skip_ws(ps);
    v->type = is_obj ? KVP_EC_V_OBJECT : KVP_EC_V_ARRAY;
    if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) {
        ps->p++;
        goto done;
    }
    for (;;) {
        if (n == cap) {
            size_t ncap = cap ? cap * 2 : 4;
            char *na = kvp__realloc(arr, cap * elem, ncap * elem);
            if (!na) {
                st = KVP_ERR_NO_MEMORY;
                goto fail;
            }
            arr = na;
            cap = ncap;
        }
        skip_ws(ps);
        kvp_ec_value_t *slot;
        if (is_obj) {
            kvp_ec_member_t *m = (kvp_ec_member_t *)arr + n;
            if (ps->p >= ps->end || *ps->p != '"') {
                st = KVP_ERR_DECODE;
                goto fail;
            }
            char *key;
            size_t klen;
            st = parse_string(ps, &key, &klen);
            if (st != KVP_OK)
                goto fail;
            m->key = key;
            m->key_len = klen;
            m->value.type = KVP_EC_V_NULL;
            n++;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                st = KVP_ERR_DECODE;
                goto fail;
            }
            ps->p++;
            slot = &m->value;
        } else {
            slot = (kvp_ec_value_t *)arr + n;
            slot->type = KVP_EC_V_NULL;
            n++;
        }
        st = parse_value(ps, slot, depth + 1);
        if (st != KVP_OK)
            goto fail;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == (is_obj ? '}' : ']')) {
            ps->p++;
            break;
        }
        st = KVP_ERR_DECODE;
        goto fail;
    }
done:
    if (is_obj) {
        st = dedup_members((kvp_ec_member_t *)arr, &n);
        if (st != KVP_OK)
            goto fail;
    }
    if (n != cap) {
        char *na = n ? kvp__realloc(arr, cap * elem, n * elem) : NULL;
        if (n && !na) {
            st = KVP_ERR_NO_MEMORY;
            goto fail;
        }
        if (!n && arr)
            kvp__free(arr, cap * elem);
        arr = na;
    }
    if (is_obj) {
        v->u.obj.members = (kvp_ec_member_t *)arr;
        v->u.obj.n = n;
    } else {
        v->u.arr.items = (kvp_ec_value_t *)arr;
        v->u.arr.n = n;
    }
    return KVP_OK;
fail:
    for (size_t i = 0; i < n; i++) {
        if (is_obj) {
            kvp_ec_member_t *m = (kvp_ec_member_t *)arr + i;
            kvp__free((void *)m->key, m->key_len + 1);
            value_clear(&m->value);
        } else {
            value_clear((kvp_ec_value_t *)arr + i);
        }
    }
    if (arr)
        kvp__free(arr, cap * elem);
    v->type = KVP_EC_V_NULL;
    return st;
}

static kvp_status_t parse_value(parser_t *ps, kvp_ec_value_t *v, int depth)
{
    if (depth > ps->max_depth)
        return KVP_ERR_DECODE;
    skip_ws(ps);
    if (ps->p >= ps->end)
        return KVP_ERR_DECODE;
    size_t left = (size_t)(ps->end - ps->p);
    switch (*ps->p) {
    case '{':
        return parse_container(ps, v, depth, true);
    case '[':
        return parse_container(ps, v, depth, false);
    case '"': {
        char *s;
        size_t n;
        kvp_status_t st = parse_string(ps, &s, &n);
        if (st != KVP_OK)
            return st;
        v->type = KVP_EC_V_STR;
        v->u.str.ptr = s;
        v->u.str.len = n;
        return KVP_OK;
    }
    case 't':
        if (left >= 4 && !memcmp(ps->p, "true", 4)) {
            ps->p += 4;
            v->type = KVP_EC_V_BOOL;
            v->u.b = true;
            return KVP_OK;
        }
        return KVP_ERR_DECODE;
    case 'f':
        if (left >= 5 && !memcmp(ps->p, "false", 5)) {
            ps->p += 5;
            v->type = KVP_EC_V_BOOL;
            v->u.b = false;
            return KVP_OK;
        }
        return KVP_ERR_DECODE;
    case 'n':
        if (left >= 4 && !memcmp(ps->p, "null", 4)) {
            ps->p += 4;
            v->type = KVP_EC_V_NULL;
            return KVP_OK;
        }
        return KVP_ERR_DECODE;
    default:
        return parse_number(ps, v);
    }
}

static void value_clear(kvp_ec_value_t *v)
{
    switch (v->type) {
    case KVP_EC_V_STR:
        kvp__free((void *)v->u.str.ptr, v->u.str.len + 1);
        break;
    case KVP_EC_V_ARRAY:
        for (size_t i = 0; i < v->u.arr.n; i++)
            value_clear(&v->u.arr.items[i]);
        if (v->u.arr.items)
            kvp__free(v->u.arr.items, v->u.arr.n * sizeof *v->u.arr.items);
        break;
    case KVP_EC_V_OBJECT:
        for (size_t i = 0; i < v->u.obj.n; i++) {
            kvp__free((void *)v->u.obj.members[i].key, v->u.obj.members[i].key_len + 1);
            value_clear(&v->u.obj.members[i].value);
        }
        if (v->u.obj.members)
            kvp__free(v->u.obj.members, v->u.obj.n * sizeof *v->u.obj.members);
        break;
    default:
        break;
    }
    v->type = KVP_EC_V_NULL;
}

kvp_status_t kvp_ec_json_parse(const char *buf, size_t len, int max_depth, kvp_ec_value_t **value_p)
{
    *value_p = NULL;
    kvp_ec_value_t *v = kvp__malloc(sizeof *v);
    if (!v)
        return KVP_ERR_NO_MEMORY;
    v->type = KVP_EC_V_NULL;
    parser_t ps = {buf, buf + len, max_depth < 0 ? 0 : max_depth};
    kvp_status_t st = parse_value(&ps, v, 0);
    if (st == KVP_OK) {
        skip_ws(&ps);
        if (ps.p != ps.end) {
            value_clear(v);
            st = KVP_ERR_DECODE;
        }
    }
    if (st != KVP_OK) {
        kvp__free(v, sizeof *v);
        return st;
    }
    *value_p = v;
    return KVP_OK;
}

void kvp_ec_value_free(kvp_ec_value_t *v)
{
    if (!v)
        return;
    value_clear(v);
    kvp__free(v, sizeof *v);
}

const kvp_ec_value_t *kvp_ec_value_get(const kvp_ec_value_t *obj, const char *key)
{
    if (!obj || obj->type != KVP_EC_V_OBJECT)
        return NULL;
    size_t kl = strlen(key);
    for (size_t i = 0; i < obj->u.obj.n; i++)
        if (obj->u.obj.members[i].key_len == kl && !memcmp(obj->u.obj.members[i].key, key, kl))
            return &obj->u.obj.members[i].value;
    return NULL;
}

/* ---- Python conversions ------------------------------------------------ */

bool kvp__ec_py_truthy(const kvp_ec_value_t *v)
{
    if (!v)
        return false;
    switch (v->type) {
    case KVP_EC_V_NULL: return false;
    case KVP_EC_V_BOOL: return v->u.b;
    case KVP_EC_V_INT: return v->u.i != 0;
    case KVP_EC_V_STR: return v->u.str.len != 0;
    case KVP_EC_V_ARRAY: return v->u.arr.n != 0;
    case KVP_EC_V_OBJECT: return v->u.obj.n != 0;
    }
    return false;
}

/* Python repr() of a str. */
static void buf_pyrepr_str(kvp__ec_buf_t *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    kvp__ec_buf_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '\\' || c == (unsigned char)q) {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            kvp__ec_buf_put(b, tmp, 2);
        } else if (c == '\n') {
            kvp__ec_buf_puts(b, "\\n");
        } else if (c == '\r') {
            kvp__ec_buf_puts(b, "\\r");
        } else if (c == '\t') {
            kvp__ec_buf_puts(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            kvp__ec_buf_puts(b, tmp);
        } else {
            kvp__ec_buf_put(b, (const char *)&c, 1);
        }
    }
    kvp__ec_buf_put(b, &q, 1);
}

static void buf_pystr(kvp__ec_buf_t *b, const kvp_ec_value_t *v, bool repr)
{
    switch (v->type) {
    case KVP_EC_V_NULL: kvp__ec_buf_puts(b, "None"); break;
    case KVP_EC_V_BOOL: kvp__ec_buf_puts(b, v->u.b ? "True" : "False"); break;
    case KVP_EC_V_INT: kvp__ec_buf_int(b, v->u.i); break;
    case KVP_EC_V_STR:
        if (repr)
            buf_pyrepr_str(b, v->u.str.ptr, v->u.str.len);
        else
            kvp__ec_buf_put(b, v->u.str.ptr, v->u.str.len);
        break;
    case KVP_EC_V_ARRAY:
        kvp__ec_buf_puts(b, "[");
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i)
                kvp__ec_buf_puts(b, ", ");
            buf_pystr(b, &v->u.arr.items[i], true);
        }
        kvp__ec_buf_puts(b, "]");
        break;
    case KVP_EC_V_OBJECT:
        kvp__ec_buf_puts(b, "{");
        for (size_t i = 0; i < v->u.obj.n; i++) {
            if (i)
                kvp__ec_buf_puts(b, ", ");
            buf_pyrepr_str(b, v->u.obj.members[i].key, v->u.obj.members[i].key_len);
            kvp__ec_buf_puts(b, ": ");
            buf_pystr(b, &v->u.obj.members[i].value, true);
        }
        kvp__ec_buf_puts(b, "}");
        break;
    }
}

kvp_status_t kvp__ec_py_str(const kvp_ec_value_t *v, char **out_p)
{
    *out_p = NULL;
    if (v->type == KVP_EC_V_STR) {
        char *s = kvp__malloc(v->u.str.len + 1);
        if (!s)
            return KVP_ERR_NO_MEMORY;
        memcpy(s, v->u.str.ptr, v->u.str.len + 1);
        *out_p = s;
        return KVP_OK;
    }
    kvp__ec_buf_t b;
    kvp__ec_buf_init(&b);
    buf_pystr(&b, v, false);
    kvp__ec_buf_put(&b, "", 1);
    if (b.oom) {
        kvp__ec_buf_cleanup(&b);
        return KVP_ERR_NO_MEMORY;
    }
    char *s = kvp__strdup(b.p);
    kvp__ec_buf_cleanup(&b);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    *out_p = s;
    return KVP_OK;
}

static bool py_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1c && c <= 0x1f);
}

kvp_ec_error_t kvp__ec_py_int(const kvp_ec_value_t *v, int64_t *out_p)
{
    switch (v->type) {
    case KVP_EC_V_INT:
        *out_p = v->u.i;
        return KVP_EC_ERR_NONE;
    case KVP_EC_V_BOOL:
        *out_p = v->u.b ? 1 : 0;
        return KVP_EC_ERR_NONE;
    case KVP_EC_V_STR: {
        const char *p = v->u.str.ptr, *e = p + v->u.str.len;
        while (p < e && py_space(*p))
            p++;
        while (e > p && py_space(e[-1]))
            e--;
        bool neg = false;
        if (p < e && (*p == '+' || *p == '-'))
            neg = *p++ == '-';
        if (p >= e || *p < '0' || *p > '9')
            return KVP_EC_ERR_VALUE;
        uint64_t acc = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
        bool prev_us = false;
        for (; p < e; p++) {
            if (*p == '_') {
                if (prev_us)
                    return KVP_EC_ERR_VALUE;
                prev_us = true;
                continue;
            }
            if (*p < '0' || *p > '9')
                return KVP_EC_ERR_VALUE;
            prev_us = false;
            unsigned d = (unsigned)(*p - '0');
            if (acc > (lim - d) / 10)
                return KVP_EC_ERR_VALUE;
            acc = acc * 10 + d;
        }
        if (prev_us)
            return KVP_EC_ERR_VALUE;
        *out_p = neg ? (int64_t)(0 - acc) : (int64_t)acc;
        return KVP_EC_ERR_NONE;
    }
    default:
        return KVP_EC_ERR_TYPE;
    }
}

/* ---- canonical writer --------------------------------------------------- */

void kvp__ec_buf_init(kvp__ec_buf_t *b)
{
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

void kvp__ec_buf_cleanup(kvp__ec_buf_t *b)
{
    if (b->p)
        kvp__free(b->p, b->cap);
    kvp__ec_buf_init(b);
}

void kvp__ec_buf_put(kvp__ec_buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n)
            ncap *= 2;
        char *np = kvp__realloc(b->p, b->cap, ncap);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

void kvp__ec_buf_puts(kvp__ec_buf_t *b, const char *s) { kvp__ec_buf_put(b, s, strlen(s)); }

void kvp__ec_buf_int(kvp__ec_buf_t *b, int64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v);
    kvp__ec_buf_put(b, tmp, (size_t)n);
}

static void put_u16(kvp__ec_buf_t *b, unsigned u)
{
    char tmp[8];
    snprintf(tmp, sizeof tmp, "\\u%04x", u);
    kvp__ec_buf_put(b, tmp, 6);
}

void kvp__ec_buf_jstr(kvp__ec_buf_t *b, const char *s, size_t n)
{
    kvp__ec_buf_put(b, "\"", 1);
    size_t run = 0; /* plain bytes pending */
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
            run++;
            i++;
            continue;
        }
        kvp__ec_buf_put(b, s + i - run, run);
        run = 0;
        if (c < 0x80) {
            switch (c) {
            case '"': kvp__ec_buf_puts(b, "\\\""); break;
            case '\\': kvp__ec_buf_puts(b, "\\\\"); break;
            case '\n': kvp__ec_buf_puts(b, "\\n"); break;
            case '\r': kvp__ec_buf_puts(b, "\\r"); break;
            case '\t': kvp__ec_buf_puts(b, "\\t"); break;
            case '\b': kvp__ec_buf_puts(b, "\\b"); break;
            case '\f': kvp__ec_buf_puts(b, "\\f"); break;
            default: put_u16(b, c); break;
            }
            i++;
            continue;
        }
        /* Decode one (WTF-8) sequence leniently. */
        unsigned cp;
        size_t l;
        if (c >= 0xF0 && i + 3 < n + 0 && i + 3 <= n - 1 + 0) {
            cp = ((c & 0x07u) << 18) | (((unsigned char)s[i + 1] & 0x3Fu) << 12) |
                 (((unsigned char)s[i + 2] & 0x3Fu) << 6) | ((unsigned char)s[i + 3] & 0x3Fu);
            l = 4;
        } else if (c >= 0xE0 && i + 2 <= n - 1) {
            cp = ((c & 0x0Fu) << 12) | (((unsigned char)s[i + 1] & 0x3Fu) << 6) |
                 ((unsigned char)s[i + 2] & 0x3Fu);
            l = 3;
        } else if (c >= 0xC0 && i + 1 <= n - 1) {
            cp = ((c & 0x1Fu) << 6) | ((unsigned char)s[i + 1] & 0x3Fu);
            l = 2;
        } else {
            cp = 0xFFFD;
            l = 1;
        }
        if (cp >= 0x10000) {
            cp -= 0x10000;
            put_u16(b, 0xD800 + (cp >> 10));
            put_u16(b, 0xDC00 + (cp & 0x3FF));
        } else {
            put_u16(b, cp);
        }
        i += l;
    }
    kvp__ec_buf_put(b, s + n - run, run);
    kvp__ec_buf_put(b, "\"", 1);
}

static int cmp_members(const void *a, const void *b)
{
    const kvp_ec_member_t *x = *(const kvp_ec_member_t *const *)a, *y = *(const kvp_ec_member_t *const *)b;
    size_t l = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, l);
    if (c)
        return c;
    return x->key_len < y->key_len ? -1 : (x->key_len > y->key_len);
}

void kvp__ec_buf_value(kvp__ec_buf_t *b, const kvp_ec_value_t *v)
{
    switch (v->type) {
    case KVP_EC_V_NULL: kvp__ec_buf_puts(b, "null"); break;
    case KVP_EC_V_BOOL: kvp__ec_buf_puts(b, v->u.b ? "true" : "false"); break;
    case KVP_EC_V_INT: kvp__ec_buf_int(b, v->u.i); break;
    case KVP_EC_V_STR: kvp__ec_buf_jstr(b, v->u.str.ptr, v->u.str.len); break;
    case KVP_EC_V_ARRAY:
        kvp__ec_buf_put(b, "[", 1);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i)
                kvp__ec_buf_put(b, ",", 1);
            kvp__ec_buf_value(b, &v->u.arr.items[i]);
        }
        kvp__ec_buf_put(b, "]", 1);
        break;
    case KVP_EC_V_OBJECT: {
        size_t n = v->u.obj.n;
        const kvp_ec_member_t **ms = n ? kvp__malloc(n * sizeof *ms) : NULL;
        if (n && !ms) {
            b->oom = true;
            return;
        }
        for (size_t i = 0; i < n; i++)
            ms[i] = &v->u.obj.members[i];
        qsort(ms, n, sizeof *ms, cmp_members);
        kvp__ec_buf_put(b, "{", 1);
        for (size_t i = 0; i < n; i++) {
            if (i)
                kvp__ec_buf_put(b, ",", 1);
            kvp__ec_buf_jstr(b, ms[i]->key, ms[i]->key_len);
            kvp__ec_buf_put(b, ":", 1);
            kvp__ec_buf_value(b, &ms[i]->value);
        }
        kvp__ec_buf_put(b, "}", 1);
        if (ms)
            kvp__free(ms, n * sizeof *ms);
        break;
    }
    }
}
