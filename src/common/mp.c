#include "common/mp.h"

#include <string.h>

#include "common/alloc.h"

void kvp__mpw_init(kvp__mpw_t *w, void *storage, size_t cap)
{
    w->buf = storage;
    w->len = 0;
    w->cap = storage ? cap : 0;
    w->err = 0;
    w->owned = 0;
}

void kvp__mpw_free(kvp__mpw_t *w)
{
    if (w->owned)
        kvp__free(w->buf, w->cap);
    w->buf = NULL;
    w->cap = w->len = 0;
    w->owned = 0;
}

static uint8_t *need(kvp__mpw_t *w, size_t n)
{
    if (w->err)
        return NULL;
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 256;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *nb = w->owned ? kvp__realloc(w->buf, w->cap, cap) : kvp__malloc(cap);
        if (!nb) {
            w->err = 1;
            return NULL;
        }
        if (!w->owned && w->len)
            memcpy(nb, w->buf, w->len);
        w->buf = nb;
        w->cap = cap;
        w->owned = 1;
    }
    uint8_t *p = w->buf + w->len;
    w->len += n;
    return p;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static void w_tag_len(kvp__mpw_t *w, uint8_t fix, uint32_t fixmax, uint8_t t16, uint8_t t32, uint32_t n)
{
    uint8_t *p;
    if (n <= fixmax) {
        if ((p = need(w, 1)))
            p[0] = (uint8_t)(fix | n);
    } else if (n <= 0xffff) {
        if ((p = need(w, 3))) {
            p[0] = t16;
            put_be(p + 1, n, 2);
        }
    } else if ((p = need(w, 5))) {
        p[0] = t32;
        put_be(p + 1, n, 4);
    }
}

void kvp__mpw_array(kvp__mpw_t *w, uint32_t n) { w_tag_len(w, 0x90, 15, 0xdc, 0xdd, n); }
void kvp__mpw_map(kvp__mpw_t *w, uint32_t n) { w_tag_len(w, 0x80, 15, 0xde, 0xdf, n); }

void kvp__mpw_uint(kvp__mpw_t *w, uint64_t v)
{
    uint8_t *p;
    if (v < 128) {
        if ((p = need(w, 1)))
            p[0] = (uint8_t)v;
    } else if (v <= 0xff) {
        if ((p = need(w, 2))) {
            p[0] = 0xcc;
            p[1] = (uint8_t)v;
        }
    } else if (v <= 0xffff) {
        if ((p = need(w, 3))) {
            p[0] = 0xcd;
            put_be(p + 1, v, 2);
        }
    } else if (v <= 0xffffffffu) {
        if ((p = need(w, 5))) {
            p[0] = 0xce;
            put_be(p + 1, v, 4);
        }
    } else if ((p = need(w, 9))) {
        p[0] = 0xcf;
        put_be(p + 1, v, 8);
    }
}

void kvp__mpw_int(kvp__mpw_t *w, int64_t v)
{
    uint8_t *p;
    if (v >= 0) {
        kvp__mpw_uint(w, (uint64_t)v);
    } else if (v >= -32) {
        if ((p = need(w, 1)))
            p[0] = (uint8_t)(int8_t)v;
    } else if ((p = need(w, 9))) {
        p[0] = 0xd3;
        put_be(p + 1, (uint64_t)v, 8);
    }
}

void kvp__mpw_nil(kvp__mpw_t *w)
{
    uint8_t *p = need(w, 1);
    if (p)
        p[0] = 0xc0;
}

void kvp__mpw_bool(kvp__mpw_t *w, int v)
{
    uint8_t *p = need(w, 1);
    if (p)
        p[0] = v ? 0xc3 : 0xc2;
}

void kvp__mpw_bin(kvp__mpw_t *w, const void *src, uint32_t n)
{
    uint8_t *p;
    if (n <= 0xff) {
        if ((p = need(w, 2 + n))) {
            p[0] = 0xc4;
            p[1] = (uint8_t)n;
            memcpy(p + 2, src, n);
        }
    } else if (n <= 0xffff) {
        if ((p = need(w, 3 + n))) {
            p[0] = 0xc5;
            put_be(p + 1, n, 2);
            memcpy(p + 3, src, n);
        }
    } else if ((p = need(w, 5 + (size_t)n))) {
        p[0] = 0xc6;
        put_be(p + 1, n, 4);
        memcpy(p + 5, src, n);
    }
}

void kvp__mpw_str(kvp__mpw_t *w, const char *s, uint32_t n)
{
    uint8_t *p;
    if (n <= 31) {
        if ((p = need(w, 1 + n))) {
            p[0] = (uint8_t)(0xa0 | n);
            memcpy(p + 1, s, n);
        }
    } else if (n <= 0xff) {
        if ((p = need(w, 2 + n))) {
            p[0] = 0xd9;
            p[1] = (uint8_t)n;
            memcpy(p + 2, s, n);
        }
    } else if ((p = need(w, 5 + (size_t)n))) {
        p[0] = 0xdb;
        put_be(p + 1, n, 4);
        memcpy(p + 5, s, n);
    }
}

void kvp__mpw_int_small(kvp__mpw_t *w, int64_t v)
{
    uint8_t *p;
    if (v >= -32) {
        kvp__mpw_int(w, v); /* fixint or the smallest unsigned form */
    } else if (v >= INT8_MIN) {
        if ((p = need(w, 2))) {
            p[0] = 0xd0;
            p[1] = (uint8_t)v;
        }
    } else if (v >= INT16_MIN) {
        if ((p = need(w, 3))) {
            p[0] = 0xd1;
            put_be(p + 1, (uint64_t)v, 2);
        }
    } else if (v >= INT32_MIN) {
        if ((p = need(w, 5))) {
            p[0] = 0xd2;
            put_be(p + 1, (uint64_t)v, 4);
        }
    } else if ((p = need(w, 9))) {
        p[0] = 0xd3;
        put_be(p + 1, (uint64_t)v, 8);
    }
}

void kvp__mpw_str_small(kvp__mpw_t *w, const char *s, uint32_t n)
{
    uint8_t *p;
    if (n <= 0xff || n > 0xffff) {
        kvp__mpw_str(w, s, n); /* fixstr, str8 or str32: the same */
    } else if ((p = need(w, 3 + (size_t)n))) {
        p[0] = 0xda;
        put_be(p + 1, n, 2);
        memcpy(p + 3, s, n);
    }
}

int kvp__mpw_finish(kvp__mpw_t *w, uint8_t **buf_p, size_t *len_p)
{
    uint8_t *out = w->err ? NULL : kvp__malloc(w->len ? w->len : 1);
    if (out) {
        if (w->len)
            memcpy(out, w->buf, w->len);
        *buf_p = out;
        *len_p = w->len;
    }
    kvp__mpw_free(w);
    return out ? 0 : -1;
}

/* ---- reader ---- */

static const uint8_t *take(kvp__mpr_t *r, size_t n)
{
    if (r->err || (size_t)(r->end - r->p) < n) {
        r->err = 1;
        return NULL;
    }
    const uint8_t *p = r->p;
    r->p += n;
    return p;
}

static uint64_t get_be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t read_len(kvp__mpr_t *r, int nbytes)
{
    const uint8_t *p = take(r, (size_t)nbytes);
    return p ? get_be(p, nbytes) : 0;
}

uint32_t kvp__mpr_array(kvp__mpr_t *r, uint32_t max)
{
    const uint8_t *t = take(r, 1);
    uint64_t n;
    if (!t)
        return 0;
    if ((*t & 0xf0) == 0x90)
        n = *t & 0x0f;
    else if (*t == 0xdc)
        n = read_len(r, 2);
    else if (*t == 0xdd)
        n = read_len(r, 4);
    else {
        r->err = 1;
        return 0;
    }
    if (r->err || n > max) {
        r->err = 1;
        return 0;
    }
    return (uint32_t)n;
}

uint32_t kvp__mpr_array_fit(kvp__mpr_t *r, uint32_t max)
{
    uint32_t n = kvp__mpr_array(r, max);
    if (!r->err && n > (size_t)(r->end - r->p)) {
        r->err = 1;
        return 0;
    }
    return n;
}

uint64_t kvp__mpr_uint(kvp__mpr_t *r)
{
    const uint8_t *t = take(r, 1);
    if (!t)
        return 0;
    if (*t < 0x80)
        return *t;
    switch (*t) {
    case 0xcc: return read_len(r, 1);
    case 0xcd: return read_len(r, 2);
    case 0xce: return read_len(r, 4);
    case 0xcf: return read_len(r, 8);
    default:
        r->err = 1;
        return 0;
    }
}

int64_t kvp__mpr_int(kvp__mpr_t *r)
{
    if (r->err || r->p >= r->end) {
        r->err = 1;
        return 0;
    }
    uint8_t t = *r->p;
    if (t >= 0xe0) {
        r->p++;
        return (int8_t)t;
    }
    if (t == 0xd0 || t == 0xd1 || t == 0xd2 || t == 0xd3) {
        r->p++;
        int n = t == 0xd0 ? 1 : t == 0xd1 ? 2 : t == 0xd2 ? 4 : 8;
        uint64_t v = read_len(r, n);
        if (n < 8 && (v >> (8 * n - 1)) & 1)
            v |= ~0ull << (8 * n);
        return (int64_t)v;
    }
    uint64_t u = kvp__mpr_uint(r);
    if (u > INT64_MAX) {
        r->err = 1;
        return 0;
    }
    return (int64_t)u;
}

int kvp__mpr_bool(kvp__mpr_t *r)
{
    const uint8_t *t = take(r, 1);
    if (t && (*t == 0xc2 || *t == 0xc3))
        return *t == 0xc3;
    r->err = 1;
    return 0;
}

int kvp__mpr_nil(kvp__mpr_t *r)
{
    if (!r->err && r->p < r->end && *r->p == 0xc0) {
        r->p++;
        return 1;
    }
    return 0;
}

/* kinds: 1 = str, 2 = bin, 3 = either */
static const uint8_t *read_raw(kvp__mpr_t *r, int kinds, uint32_t max, uint32_t *len_p)
{
    const uint8_t *t = take(r, 1);
    uint64_t n;
    *len_p = 0;
    if (!t)
        return NULL;
    int is_str = (*t & 0xe0) == 0xa0 || (*t >= 0xd9 && *t <= 0xdb);
    int is_bin = *t >= 0xc4 && *t <= 0xc6;
    if (!((is_str && (kinds & 1)) || (is_bin && (kinds & 2)))) {
        r->err = 1;
        return NULL;
    }
    if ((*t & 0xe0) == 0xa0)
        n = *t & 0x1f;
    else if (*t == 0xc4 || *t == 0xd9)
        n = read_len(r, 1);
    else if (*t == 0xc5 || *t == 0xda)
        n = read_len(r, 2);
    else
        n = read_len(r, 4);
    if (r->err || n > max) {
        r->err = 1;
        return NULL;
    }
    const uint8_t *p = take(r, (size_t)n);
    if (p)
        *len_p = (uint32_t)n;
    return p;
}

const uint8_t *kvp__mpr_bytes(kvp__mpr_t *r, uint32_t max, uint32_t *len_p) { return read_raw(r, 3, max, len_p); }
const uint8_t *kvp__mpr_str(kvp__mpr_t *r, uint32_t max, uint32_t *len_p) { return read_raw(r, 1, max, len_p); }
const uint8_t *kvp__mpr_bin(kvp__mpr_t *r, uint32_t max, uint32_t *len_p) { return read_raw(r, 2, max, len_p); }

static void skip_depth(kvp__mpr_t *r, int depth)
{
    if (depth > 32) {
        r->err = 1;
        return;
    }
    const uint8_t *t = take(r, 1);
    if (!t)
        return;
    uint8_t c = *t;
    uint64_t n = 0;
    if (c < 0x80 || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return;
    if ((c & 0xf0) == 0x90 || c == 0xdc || c == 0xdd) {
        n = (c & 0xf0) == 0x90 ? (c & 0x0f) : read_len(r, c == 0xdc ? 2 : 4);
        for (uint64_t i = 0; i < n && !r->err; i++)
            skip_depth(r, depth + 1);
        return;
    }
    if ((c & 0xf0) == 0x80 || c == 0xde || c == 0xdf) {
        n = (c & 0xf0) == 0x80 ? (c & 0x0f) : read_len(r, c == 0xde ? 2 : 4);
        for (uint64_t i = 0; i < 2 * n && !r->err; i++)
            skip_depth(r, depth + 1);
        return;
    }
    if ((c & 0xe0) == 0xa0) {
        take(r, c & 0x1f);
        return;
    }
    switch (c) {
    case 0xcc: case 0xd0: take(r, 1); return;
    case 0xcd: case 0xd1: take(r, 2); return;
    case 0xce: case 0xd2: case 0xca: take(r, 4); return;
    case 0xcf: case 0xd3: case 0xcb: take(r, 8); return;
    case 0xc4: case 0xd9: take(r, (size_t)read_len(r, 1)); return;
    case 0xc5: case 0xda: take(r, (size_t)read_len(r, 2)); return;
    case 0xc6: case 0xdb: take(r, (size_t)read_len(r, 4)); return;
    case 0xd4: take(r, 2); return;
    case 0xd5: take(r, 3); return;
    case 0xd6: take(r, 5); return;
    case 0xd7: take(r, 9); return;
    case 0xd8: take(r, 17); return;
    case 0xc7: n = read_len(r, 1); take(r, (size_t)n + 1); return;
    case 0xc8: n = read_len(r, 2); take(r, (size_t)n + 1); return;
    case 0xc9: n = read_len(r, 4); take(r, (size_t)n + 1); return;
    default: r->err = 1; return;
    }
}

void kvp__mpr_skip(kvp__mpr_t *r) { skip_depth(r, 0); }
