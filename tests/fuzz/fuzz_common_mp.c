/*
 * Fuzz target for the msgpack reader and writer (common/mp.c).  The input is
 * read as a sequence of values with the typed readers (arrays through
 * kvp__mpr_array_fit, integers, str, bin, bool, nil; a map or any other kind
 * is skipped with kvp__mpr_skip) and re-encoded with the smallest-form
 * writers.  Reading that encoding the same way must consume it exactly and
 * encode it to the same bytes again (the smallest form is a fixed point), and
 * kvp__mpr_skip must step over each re-encoded value exactly.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/mp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* One value from r into w; 0 when r failed. */
static int copy_value(kvp__mpr_t *r, kvp__mpw_t *w, int depth)
{
    if (r->p >= r->end || depth > 16) {
        r->err = 1;
        return 0;
    }
    uint8_t t = *r->p;
    uint32_t n;
    const uint8_t *s;
    if ((t & 0xf0) == 0x90 || t == 0xdc || t == 0xdd) {
        n = kvp__mpr_array_fit(r, 1u << 20);
        if (!kvp__mpr_ok(r))
            return 0;
        kvp__mpw_array(w, n);
        for (uint32_t i = 0; i < n; i++)
            if (!copy_value(r, w, depth + 1))
                return 0;
    } else if (t < 0x80 || (t >= 0xcc && t <= 0xcf)) {
        uint64_t u = kvp__mpr_uint(r);
        kvp__mpw_uint(w, u);
    } else if (t >= 0xe0 || (t >= 0xd0 && t <= 0xd3)) {
        kvp__mpw_int_small(w, kvp__mpr_int(r));
    } else if ((t & 0xe0) == 0xa0 || (t >= 0xd9 && t <= 0xdb)) {
        s = kvp__mpr_str(r, UINT32_MAX, &n);
        if (kvp__mpr_ok(r))
            kvp__mpw_str_small(w, (const char *)s, n);
    } else if (t >= 0xc4 && t <= 0xc6) {
        s = kvp__mpr_bin(r, UINT32_MAX, &n);
        if (kvp__mpr_ok(r))
            kvp__mpw_bin(w, s, n);
    } else if (t == 0xc2 || t == 0xc3) {
        kvp__mpw_bool(w, kvp__mpr_bool(r));
    } else if (kvp__mpr_nil(r)) {
        kvp__mpw_nil(w);
    } else {
        kvp__mpr_skip(r);
        if (kvp__mpr_ok(r))
            kvp__mpw_nil(w); /* maps and others: out of the typed readers' reach */
    }
    return kvp__mpr_ok(r);
}

static void copy_all(const uint8_t *p, size_t n, kvp__mpw_t *w, size_t *values)
{
    kvp__mpr_t r;
    *values = 0;
    if (!n)
        return; /* (p may be NULL: an empty writer has no buffer) */
    kvp__mpr_init(&r, p, n);
    while (r.p < r.end) {
        size_t mark = w->len;
        if (!copy_value(&r, w, 0)) {
            w->len = mark; /* drop the value that failed half-way */
            break;
        }
        (*values)++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp__mpw_t w1, w2;
    kvp__mpw_init(&w1, NULL, 0);
    kvp__mpw_init(&w2, NULL, 0);
    size_t v1, v2;
    copy_all(data, size, &w1, &v1);
    copy_all(w1.buf, w1.len, &w2, &v2);
    if (w1.err || w2.err || v1 != v2 || w1.len != w2.len || (w1.len && memcmp(w1.buf, w2.buf, w1.len) != 0))
        abort();
    if (w1.len) {
        kvp__mpr_t r;
        kvp__mpr_init(&r, w1.buf, w1.len);
        for (size_t i = 0; i < v1; i++)
            kvp__mpr_skip(&r);
        if (!kvp__mpr_done(&r))
            abort();
    }
    kvp__mpw_free(&w1);
    kvp__mpw_free(&w2);
    return 0;
}
