#include "common/cbor.h"

#include <string.h>

#include "common/alloc.h"
#include "common/log.h"

/* CBOR major types (RFC 8949 §3.1), already shifted into the top 3 bits. */
enum {
    CBOR_UINT = 0u << 5,
    CBOR_NEGINT = 1u << 5,
    CBOR_BYTES = 2u << 5,
    CBOR_TEXT = 3u << 5,
    CBOR_ARRAY = 4u << 5,
    CBOR_NULL = 0xf6,
};

void kvp__cbor_init(kvp__cbor_t *c, uint8_t *buf, size_t cap)
{
    c->data = buf;
    c->len = 0;
    c->cap = buf ? cap : 0;
    c->inline_buf = buf;
    c->status = KVP_OK;
}

void kvp__cbor_cleanup(kvp__cbor_t *c)
{
    if (c->data && c->data != c->inline_buf)
        kvp__free(c->data, c->cap);
    c->data = NULL;
    c->len = c->cap = 0;
    c->inline_buf = NULL;
}

void kvp__cbor_reset(kvp__cbor_t *c)
{
    c->len = 0;
    c->status = KVP_OK;
}

kvp_status_t kvp__cbor_status(const kvp__cbor_t *c) { return c->status; }

/* Makes room for `n` more bytes; 0 on success, -1 (status set) on failure. */
static int cbor_reserve(kvp__cbor_t *c, size_t n)
{
    if (c->status != KVP_OK)
        return -1;
    if (n <= c->cap - c->len)
        return 0;
    if (n > SIZE_MAX / 2 - c->len) {
        kvp_error("cbor: encoding larger than the address space (%zu + %zu bytes)", c->len, n);
        c->status = KVP_ERR_NO_MEMORY;
        return -1;
    }
    size_t want = c->len + n;
    size_t cap = c->cap ? c->cap : 256;
    while (cap < want)
        cap *= 2;
    uint8_t *p = kvp__malloc(cap);
    if (!p) {
        kvp_error("cbor: out of memory growing the encode buffer to %zu bytes", cap);
        c->status = KVP_ERR_NO_MEMORY;
        return -1;
    }
    if (c->len)
        memcpy(p, c->data, c->len);
    if (c->data && c->data != c->inline_buf)
        kvp__free(c->data, c->cap);
    c->data = p;
    c->cap = cap;
    return 0;
}

/* A head: major type plus argument in the shortest encoding (canonical). */
static void cbor_head(kvp__cbor_t *c, uint8_t major, uint64_t v)
{
    if (cbor_reserve(c, 9) != 0)
        return;
    uint8_t *p = c->data + c->len;
    if (v < 24) {
        p[0] = (uint8_t)(major | v);
        c->len += 1;
    } else if (v <= UINT8_MAX) {
        p[0] = major | 24;
        p[1] = (uint8_t)v;
        c->len += 2;
    } else if (v <= UINT16_MAX) {
        p[0] = major | 25;
        p[1] = (uint8_t)(v >> 8);
        p[2] = (uint8_t)v;
        c->len += 3;
    } else if (v <= UINT32_MAX) {
        p[0] = major | 26;
        for (int i = 0; i < 4; i++)
            p[1 + i] = (uint8_t)(v >> (24 - 8 * i));
        c->len += 5;
    } else {
        p[0] = major | 27;
        for (int i = 0; i < 8; i++)
            p[1 + i] = (uint8_t)(v >> (56 - 8 * i));
        c->len += 9;
    }
}

static void cbor_raw(kvp__cbor_t *c, const void *p, size_t n)
{
    if (n == 0 || cbor_reserve(c, n) != 0)
        return;
    memcpy(c->data + c->len, p, n);
    c->len += n;
}

void kvp__cbor_uint(kvp__cbor_t *c, uint64_t v) { cbor_head(c, CBOR_UINT, v); }

void kvp__cbor_int(kvp__cbor_t *c, int64_t v)
{
    if (v >= 0)
        cbor_head(c, CBOR_UINT, (uint64_t)v);
    else /* -1 - v, computed without overflowing for INT64_MIN */
        cbor_head(c, CBOR_NEGINT, ~(uint64_t)v);
}

void kvp__cbor_bytes(kvp__cbor_t *c, const void *p, size_t n)
{
    cbor_head(c, CBOR_BYTES, n);
    cbor_raw(c, p, n);
}

void kvp__cbor_text(kvp__cbor_t *c, const char *s, size_t n)
{
    cbor_head(c, CBOR_TEXT, n);
    cbor_raw(c, s, n);
}

void kvp__cbor_array(kvp__cbor_t *c, uint64_t n) { cbor_head(c, CBOR_ARRAY, n); }

void kvp__cbor_null(kvp__cbor_t *c)
{
    if (cbor_reserve(c, 1) != 0)
        return;
    c->data[c->len++] = CBOR_NULL;
}
