/*
 * The EC connector's JSON values: the public kvp_ec_value_t tree built from
 * the common reader's (common/json.h), and the Python conversions the
 * original applies to event fields.
 *
 * kvp_ec_json_parse is the common strict reader minus every number that is
 * not an integer within int64 (json.loads would give a float or a big int;
 * kvpool refuses them, and so does the replay format), with nesting bounded
 * by the caller.  Duplicate keys: Python keeps the first key's position and
 * the last value.
 */
#include "ec/ec_json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"

static void value_clear(kvp_ec_value_t *v);

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

static kvp_status_t convert(const kvp__json_t *j, kvp_ec_value_t *v);

/* An array or object: the items converted in order, then (objects) the
 * duplicate keys resolved; the final array is allocated to its exact size. */
static kvp_status_t convert_container(const kvp__json_t *j, kvp_ec_value_t *v, bool is_obj)
{
    size_t elem = is_obj ? sizeof(kvp_ec_member_t) : sizeof(kvp_ec_value_t);
    size_t n = 0, cap = j->n;
    char *arr = cap ? kvp__malloc(cap * elem) : NULL;
    kvp_status_t st = KVP_OK;
    if (cap && !arr)
        return KVP_ERR_NO_MEMORY;
    for (; n < cap; n++) {
        const kvp__json_t *item = &j->u.items[n];
        if (is_obj) {
            kvp_ec_member_t *m = (kvp_ec_member_t *)arr + n;
            char *key = kvp__malloc((size_t)item->key_len + 1);
            if (!key) {
                st = KVP_ERR_NO_MEMORY;
                break;
            }
            memcpy(key, item->key, (size_t)item->key_len + 1);
            m->key = key;
            m->key_len = item->key_len;
            if ((st = convert(item, &m->value)) != KVP_OK) {
                kvp__free(key, (size_t)item->key_len + 1);
                break;
            }
        } else if ((st = convert(item, (kvp_ec_value_t *)arr + n)) != KVP_OK) {
            break;
        }
    }
    if (st == KVP_OK && is_obj)
        st = dedup_members((kvp_ec_member_t *)arr, &n);
    if (st == KVP_OK && n != cap) {
        char *na = kvp__realloc(arr, cap * elem, n * elem); /* n >= 1: dedup keeps one of each */
        if (!na)
            st = KVP_ERR_NO_MEMORY;
        else {
            arr = na;
            cap = n;
        }
    }
    if (st != KVP_OK) {
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
    if (is_obj) {
        v->type = KVP_EC_V_OBJECT;
        v->u.obj.members = (kvp_ec_member_t *)arr;
        v->u.obj.n = n;
    } else {
        v->type = KVP_EC_V_ARRAY;
        v->u.arr.items = (kvp_ec_value_t *)arr;
        v->u.arr.n = n;
    }
    return KVP_OK;
}

static kvp_status_t convert(const kvp__json_t *j, kvp_ec_value_t *v)
{
    v->type = KVP_EC_V_NULL;
    switch (j->type) {
    case KVP__JSON_NULL: return KVP_OK;
    case KVP__JSON_FALSE:
    case KVP__JSON_TRUE:
        v->type = KVP_EC_V_BOOL;
        v->u.b = j->type == KVP__JSON_TRUE;
        return KVP_OK;
    case KVP__JSON_INT:
        v->type = KVP_EC_V_INT;
        v->u.i = j->u.i;
        return KVP_OK;
    case KVP__JSON_STRING: {
        char *s = kvp__malloc(j->n + 1);
        if (!s)
            return KVP_ERR_NO_MEMORY;
        memcpy(s, j->u.s, j->n + 1);
        v->type = KVP_EC_V_STR;
        v->u.str.ptr = s;
        v->u.str.len = j->n;
        return KVP_OK;
    }
    case KVP__JSON_ARRAY: return convert_container(j, v, false);
    case KVP__JSON_OBJECT: return convert_container(j, v, true);
    case KVP__JSON_BIGINT:
    case KVP__JSON_FLOAT: break; /* not an integer within int64 */
    }
    return KVP_ERR_DECODE;
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
    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    jp.max_depth = max_depth < 0 ? 0 : (unsigned)max_depth;
    const kvp__json_t *root;
    kvp_status_t st = kvp__json_parse(&jp, buf, len, &root);
    kvp_ec_value_t *v = NULL;
    if (st == KVP_OK && !(v = kvp__malloc(sizeof *v)))
        st = KVP_ERR_NO_MEMORY;
    if (st == KVP_OK && (st = convert(root, v)) != KVP_OK) {
        kvp__free(v, sizeof *v);
        v = NULL;
    }
    kvp__json_parser_cleanup(&jp);
    *value_p = v;
    return st;
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

bool kvp_ec_value_truthy(const kvp_ec_value_t *v)
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
static void buf_pyrepr_str(kvp__jw_t *b, const char *s, size_t n)
{
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    kvp__jw_put(b, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '\\' || c == (unsigned char)q) {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            kvp__jw_put(b, tmp, 2);
        } else if (c == '\n') {
            kvp__jw_puts(b, "\\n");
        } else if (c == '\r') {
            kvp__jw_puts(b, "\\r");
        } else if (c == '\t') {
            kvp__jw_puts(b, "\\t");
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(tmp, sizeof tmp, "\\x%02x", c);
            kvp__jw_puts(b, tmp);
        } else {
            kvp__jw_put(b, (const char *)&c, 1);
        }
    }
    kvp__jw_put(b, &q, 1);
}

static void buf_pystr(kvp__jw_t *b, const kvp_ec_value_t *v, bool repr)
{
    switch (v->type) {
    case KVP_EC_V_NULL: kvp__jw_puts(b, "None"); break;
    case KVP_EC_V_BOOL: kvp__jw_puts(b, v->u.b ? "True" : "False"); break;
    case KVP_EC_V_INT: kvp__jw_int(b, v->u.i); break;
    case KVP_EC_V_STR:
        if (repr)
            buf_pyrepr_str(b, v->u.str.ptr, v->u.str.len);
        else
            kvp__jw_put(b, v->u.str.ptr, v->u.str.len);
        break;
    case KVP_EC_V_ARRAY:
        kvp__jw_puts(b, "[");
        for (size_t i = 0; i < v->u.arr.n; i++) {
            kvp__jw_puts(b, i ? ", " : "");
            buf_pystr(b, &v->u.arr.items[i], true);
        }
        kvp__jw_puts(b, "]");
        break;
    case KVP_EC_V_OBJECT:
        kvp__jw_puts(b, "{");
        for (size_t i = 0; i < v->u.obj.n; i++) {
            kvp__jw_puts(b, i ? ", " : "");
            buf_pyrepr_str(b, v->u.obj.members[i].key, v->u.obj.members[i].key_len);
            kvp__jw_puts(b, ": ");
            buf_pystr(b, &v->u.obj.members[i].value, true);
        }
        kvp__jw_puts(b, "}");
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
    kvp__jw_t b;
    kvp__jw_init(&b);
    buf_pystr(&b, v, false);
    kvp__jw_put(&b, "", 1);
    if (b.oom) {
        kvp__jw_cleanup(&b);
        return KVP_ERR_NO_MEMORY;
    }
    char *s = kvp__strdup(b.p);
    kvp__jw_cleanup(&b);
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

static int cmp_members(const void *a, const void *b)
{
    const kvp_ec_member_t *x = *(const kvp_ec_member_t *const *)a, *y = *(const kvp_ec_member_t *const *)b;
    size_t l = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, l);
    if (c)
        return c;
    return x->key_len < y->key_len ? -1 : (x->key_len > y->key_len);
}

void kvp__ec_value_write(kvp__jw_t *b, const kvp_ec_value_t *v)
{
    switch (v->type) {
    case KVP_EC_V_NULL: kvp__jw_puts(b, "null"); break;
    case KVP_EC_V_BOOL: kvp__jw_puts(b, v->u.b ? "true" : "false"); break;
    case KVP_EC_V_INT: kvp__jw_int(b, v->u.i); break;
    case KVP_EC_V_STR: kvp__jw_str(b, v->u.str.ptr, v->u.str.len); break;
    case KVP_EC_V_ARRAY:
        kvp__jw_put(b, "[", 1);
        for (size_t i = 0; i < v->u.arr.n; i++) {
            if (i)
                kvp__jw_put(b, ",", 1);
            kvp__ec_value_write(b, &v->u.arr.items[i]);
        }
        kvp__jw_put(b, "]", 1);
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
        kvp__jw_put(b, "{", 1);
        for (size_t i = 0; i < n; i++) {
            if (i)
                kvp__jw_put(b, ",", 1);
            kvp__jw_str(b, ms[i]->key, ms[i]->key_len);
            kvp__jw_put(b, ":", 1);
            kvp__ec_value_write(b, &ms[i]->value);
        }
        kvp__jw_put(b, "}", 1);
        if (ms)
            kvp__free(ms, n * sizeof *ms);
        break;
    }
    }
}

/* ---- Python repr() of a str (error texts that quote a peer's value) ---- */

/* One code point of the reader's output (UTF-8, or WTF-8 for lone
 * surrogates) at s[0..n): its length, or 1 for a byte that starts none. */
static size_t cp_at(const unsigned char *s, size_t n, uint32_t *cp_p)
{
    unsigned c = s[0];
    size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
    if (len > n)
        len = 1;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            *cp_p = c;
            return 1;
        }
        cp = cp << 6 | (s[i] & 0x3f);
    }
    *cp_p = cp;
    return len;
}

/* Python's str.isprintable() for the code points a peer is likely to send;
 * the rest of Unicode's non-printable classes (unassigned code points,
 * rarer format characters) print literally here. */
static bool py_printable(uint32_t cp)
{
    if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad || cp == 0x1680)
        return false;
    if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f))
        return false;
    if (cp == 0x3000 || cp == 0xfeff || (cp >= 0xd800 && cp <= 0xf8ff) || (cp >= 0xfff9 && cp <= 0xfffb))
        return false;
    if (cp == 0xfffe || cp == 0xffff || cp >= 0xf0000)
        return false;
    return true;
}

void kvp__ec_py_repr(kvp__jw_t *b, const char *str, size_t n, size_t max)
{
    const unsigned char *s = (const unsigned char *)str;
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    size_t start = b->len;
    kvp__jw_put(b, &q, 1);
    for (size_t i = 0; i < n;) {
        if (b->len - start > max) {
            kvp__jw_puts(b, "...");
            break;
        }
        uint32_t cp;
        size_t len = cp_at(s + i, n - i, &cp);
        char tmp[16];
        if (cp == '\\' || cp == (uint32_t)(unsigned char)q) {
            tmp[0] = '\\';
            tmp[1] = (char)cp;
            kvp__jw_put(b, tmp, 2);
        } else if (cp == '\n') {
            kvp__jw_puts(b, "\\n");
        } else if (cp == '\r') {
            kvp__jw_puts(b, "\\r");
        } else if (cp == '\t') {
            kvp__jw_puts(b, "\\t");
        } else if (py_printable(cp)) {
            kvp__jw_put(b, (const char *)s + i, len);
        } else {
            if (cp <= 0xff)
                snprintf(tmp, sizeof tmp, "\\x%02" PRIx32, cp);
            else if (cp <= 0xffff)
                snprintf(tmp, sizeof tmp, "\\u%04" PRIx32, cp);
            else
                snprintf(tmp, sizeof tmp, "\\U%08" PRIx32, cp);
            kvp__jw_puts(b, tmp);
        }
        i += len;
    }
    kvp__jw_put(b, &q, 1);
}
