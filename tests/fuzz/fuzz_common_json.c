/*
 * Fuzz target for the JSON reader and writer (common/json.c): any input is
 * refused with KVP_ERR_DECODE or parsed; a parsed tree written back with the
 * writer (floats and big ints as null, which the writer never sees) parses
 * again to the same tree, every string byte for byte.  (The EC conversion on
 * top, kvp_ec_json_parse, is fuzzed by fuzz_ec_meta.)
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void write_tree(kvp__jw_t *b, const kvp__json_t *v, int *lossy)
{
    switch (v->type) {
    case KVP__JSON_NULL: kvp__jw_puts(b, "null"); break;
    case KVP__JSON_FALSE: kvp__jw_bool(b, false); break;
    case KVP__JSON_TRUE: kvp__jw_bool(b, true); break;
    case KVP__JSON_INT: kvp__jw_int(b, v->u.i); break;
    case KVP__JSON_BIGINT:
    case KVP__JSON_FLOAT:
        *lossy = 1;
        kvp__jw_puts(b, "null");
        break;
    case KVP__JSON_STRING: kvp__jw_str(b, v->u.s, v->n); break;
    case KVP__JSON_ARRAY:
    case KVP__JSON_OBJECT: {
        bool obj = v->type == KVP__JSON_OBJECT;
        kvp__jw_put(b, obj ? "{" : "[", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                kvp__jw_put(b, ",", 1);
            if (obj) {
                kvp__jw_str(b, v->u.items[i].key, v->u.items[i].key_len);
                kvp__jw_put(b, ":", 1);
            }
            write_tree(b, &v->u.items[i], lossy);
        }
        kvp__jw_put(b, obj ? "}" : "]", 1);
        break;
    }
    }
}

static int same(const kvp__json_t *a, const kvp__json_t *b)
{
    int lossy = a->type == KVP__JSON_FLOAT || a->type == KVP__JSON_BIGINT;
    if (lossy)
        return b->type == KVP__JSON_NULL;
    if (a->type != b->type || a->n != b->n)
        return 0;
    switch (a->type) {
    case KVP__JSON_INT: return a->u.i == b->u.i;
    case KVP__JSON_STRING: return memcmp(a->u.s, b->u.s, a->n + 1) == 0;
    case KVP__JSON_ARRAY:
    case KVP__JSON_OBJECT:
        for (size_t i = 0; i < a->n; i++) {
            const kvp__json_t *x = &a->u.items[i], *y = &b->u.items[i];
            if (a->type == KVP__JSON_OBJECT &&
                (x->key_len != y->key_len || memcmp(x->key, y->key, x->key_len + 1) != 0))
                return 0;
            if (!same(x, y))
                return 0;
        }
        return 1;
    default: return 1;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp__json_parser_t p1, p2;
    kvp__json_parser_init(&p1);
    kvp__json_parser_init(&p2);
    p1.max_depth = p2.max_depth = 32;
    const kvp__json_t *t1, *t2;
    kvp_status_t st = kvp__json_parse(&p1, (const char *)data, size, &t1);
    if (st != KVP_OK) {
        if (st != KVP_ERR_DECODE)
            abort();
    } else {
        kvp__jw_t b;
        kvp__jw_init(&b);
        int lossy = 0;
        write_tree(&b, t1, &lossy);
        if (b.oom || kvp__json_parse(&p2, b.p, b.len, &t2) != KVP_OK || !same(t1, t2))
            abort();
        kvp__jw_cleanup(&b);
    }
    kvp__json_parser_cleanup(&p1);
    kvp__json_parser_cleanup(&p2);
    return 0;
}
