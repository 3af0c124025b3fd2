/*
 * The EC push session string and TCP frames (ec_push_wire.h): encoders and
 * defensive decoders.  Decoders bound every field before they use it and
 * never read past their input; they allocate nothing.
 */
#include "ec/ec_push_wire.h"

#include <stdio.h>
#include <string.h>

/* ---- session string ---- */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static int host_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_';
}

/* v[0..n): 1..16 hex digits. */
static int parse_hex_u64(const char *v, size_t n, uint64_t *out)
{
    if (n == 0 || n > 16)
        return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        int d = hexval(v[i]);
        if (d < 0)
            return -1;
        x = x << 4 | (uint64_t)d;
    }
    *out = x;
    return 0;
}

/* v[0..n): an even number of hex digits, at most cap bytes decoded. */
static int parse_hex_bytes(const char *v, size_t n, uint8_t *out, size_t cap, size_t *len_p)
{
    if (n == 0 || n % 2 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hexval(v[i]), lo = hexval(v[i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    *len_p = n / 2;
    return 0;
}

/* v[0..n): HOST:PORT. */
static int parse_hostport(const char *v, size_t n, kvp__ec_session_t *s)
{
    const char *colon = memchr(v, ':', n);
    if (!colon)
        return -1;
    size_t hl = (size_t)(colon - v), pl = n - hl - 1;
    if (hl == 0 || hl > KVP__EC_HOST_MAX || pl == 0 || pl > 5 || colon[1] == '0')
        return -1;
    for (size_t i = 0; i < hl; i++)
        if (!host_char(v[i]))
            return -1;
    uint32_t port = 0;
    for (size_t i = 0; i < pl; i++) {
        char c = colon[1 + i];
        if (c < '0' || c > '9')
            return -1;
        port = port * 10 + (uint32_t)(c - '0');
    }
    if (port == 0 || port > 65535)
        return -1;
    memcpy(s->host, v, hl);
    s->host[hl] = 0;
    s->port = (uint16_t)port;
    return 0;
}

enum { F_TCP, F_BASE, F_SIZE, F_UCX, F_RKEY, F_NUM };
static const char *const field_names[F_NUM] = {"tcp", "base", "size", "ucx", "rkey"};

kvp_status_t kvp__ec_session_decode(const char *str, kvp__ec_session_t *s)
{
    if (!str || !s)
        return KVP_ERR_DECODE;
    size_t total = strnlen(str, KVP__EC_SESSION_MAX + 1);
    size_t pl = sizeof KVP__EC_SESSION_PREFIX - 1;
    if (total > KVP__EC_SESSION_MAX || total < pl || memcmp(str, KVP__EC_SESSION_PREFIX, pl) != 0)
        return KVP_ERR_DECODE;
    s->host[0] = 0;
    s->port = 0;
    s->base = s->size = 0;
    s->ucx_addr_len = s->rkey_len = 0;
    int last = -1; /* fields come in order, each once */
    unsigned seen = 0;
    size_t at = pl;
    while (at < total) {
        if (str[at] != ';')
            return KVP_ERR_DECODE;
        at++;
        const char *f = str + at;
        size_t fl = 0;
        while (at + fl < total && str[at + fl] != ';')
            fl++;
        at += fl;
        const char *eq = memchr(f, '=', fl);
        if (!eq)
            return KVP_ERR_DECODE;
        size_t kl = (size_t)(eq - f), vl = fl - kl - 1;
        const char *v = eq + 1;
        int k = -1;
        for (int i = 0; i < F_NUM; i++)
            if (strlen(field_names[i]) == kl && memcmp(f, field_names[i], kl) == 0)
                k = i;
        if (k < 0 || k <= last)
            return KVP_ERR_DECODE;
        last = k;
        seen |= 1u << k;
        int bad = 0;
        switch (k) {
        case F_TCP: bad = parse_hostport(v, vl, s); break;
        case F_BASE: bad = parse_hex_u64(v, vl, &s->base); break;
        case F_SIZE: bad = parse_hex_u64(v, vl, &s->size); break;
        case F_UCX: bad = parse_hex_bytes(v, vl, s->ucx_addr, sizeof s->ucx_addr, &s->ucx_addr_len); break;
        case F_RKEY: bad = parse_hex_bytes(v, vl, s->rkey, sizeof s->rkey, &s->rkey_len); break;
        }
        if (bad)
            return KVP_ERR_DECODE;
    }
    if (!(seen & 1u << F_BASE) || !(seen & 1u << F_SIZE) || s->size == 0 || s->base + s->size < s->base)
        return KVP_ERR_DECODE;
    if (!!(seen & 1u << F_UCX) != !!(seen & 1u << F_RKEY))
        return KVP_ERR_DECODE;
    if (!(seen & (1u << F_TCP | 1u << F_UCX)))
        return KVP_ERR_DECODE;
    return KVP_OK;
}

static int put_hex(char *out, size_t cap, size_t *at, const uint8_t *b, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    if (*at + 2 * n >= cap)
        return -1;
    for (size_t i = 0; i < n; i++) {
        out[(*at)++] = digits[b[i] >> 4];
        out[(*at)++] = digits[b[i] & 15];
    }
    out[*at] = 0;
    return 0;
}

static int put_text(char *out, size_t cap, size_t *at, const char *fmt_result)
{
    size_t n = strlen(fmt_result);
    if (*at + n >= cap)
        return -1;
    memcpy(out + *at, fmt_result, n + 1);
    *at += n;
    return 0;
}

size_t kvp__ec_session_encode(const kvp__ec_session_t *s, char *out, size_t cap)
{
    if (!s || !out || cap == 0 || s->size == 0 || s->base + s->size < s->base)
        return 0;
    int tcp = s->port != 0;
    size_t hl = strnlen(s->host, sizeof s->host);
    if (tcp && (hl == 0 || hl > KVP__EC_HOST_MAX))
        return 0;
    for (size_t i = 0; tcp && i < hl; i++)
        if (!host_char(s->host[i]))
            return 0;
    int ucx = s->ucx_addr_len != 0;
    if (ucx != (s->rkey_len != 0) || s->ucx_addr_len > sizeof s->ucx_addr || s->rkey_len > sizeof s->rkey ||
        (!tcp && !ucx))
        return 0;
    size_t at = 0;
    char buf[KVP__EC_HOST_MAX + 64];
    out[0] = 0;
    if (put_text(out, cap, &at, KVP__EC_SESSION_PREFIX) != 0)
        return 0;
    if (tcp) {
        snprintf(buf, sizeof buf, ";tcp=%s:%u", s->host, s->port);
        if (put_text(out, cap, &at, buf) != 0)
            return 0;
    }
    snprintf(buf, sizeof buf, ";base=%llx;size=%llx", (unsigned long long)s->base, (unsigned long long)s->size);
    if (put_text(out, cap, &at, buf) != 0)
        return 0;
    if (ucx && (put_text(out, cap, &at, ";ucx=") != 0 || put_hex(out, cap, &at, s->ucx_addr, s->ucx_addr_len) != 0 ||
                put_text(out, cap, &at, ";rkey=") != 0 || put_hex(out, cap, &at, s->rkey, s->rkey_len) != 0))
        return 0;
    return at > KVP__EC_SESSION_MAX ? 0 : at;
}

kvp_status_t kvp__ec_session_range(const kvp__ec_session_t *s, uint64_t dst_ptr, uint64_t len, uint64_t *offset_p)
{
    if (dst_ptr < s->base || len > s->size || dst_ptr - s->base > s->size - len)
        return KVP_ERR_INVALID_ARG;
    *offset_p = dst_ptr - s->base;
    return KVP_OK;
}

/* ---- TCP frames ---- */

static void be_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

static uint64_t be_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static int rid_ok(const char *rid, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)rid[i] < 0x21 || (unsigned char)rid[i] > 0x7e)
            return 0;
    return 1;
}

size_t kvp__ec_push_write_encode(uint8_t out[KVP__EC_PUSH_WRITE_MAX], uint64_t offset, uint64_t length,
                                 const char *rid)
{
    size_t rl = rid ? strnlen(rid, KVP__EC_PUSH_RID_MAX + 1) : 0;
    if (rl > KVP__EC_PUSH_RID_MAX || !rid_ok(rid, rl))
        return 0;
    memcpy(out, KVP__EC_PUSH_MAGIC, 4);
    be_put(out + 4, KVP__EC_PUSH_VERSION, 2);
    out[6] = KVP__EC_PUSH_KIND_WRITE;
    out[7] = (uint8_t)rl;
    be_put(out + 8, offset, 8);
    be_put(out + 16, length, 8);
    if (rl)
        memcpy(out + KVP__EC_PUSH_WRITE_FIXED, rid, rl);
    return KVP__EC_PUSH_WRITE_FIXED + rl;
}

/* The common prefix: magic, then version. */
static kvp_status_t check_prefix(const uint8_t *hdr, size_t hdr_len, unsigned kind)
{
    if (!hdr || hdr_len < 8 || memcmp(hdr, KVP__EC_PUSH_MAGIC, 4) != 0)
        return KVP_ERR_PROTOCOL;
    if (be_get(hdr + 4, 2) != KVP__EC_PUSH_VERSION)
        return KVP_ERR_VERSION;
    return hdr[6] == kind ? KVP_OK : KVP_ERR_PROTOCOL;
}

kvp_status_t kvp__ec_push_write_decode(const uint8_t *hdr, size_t hdr_len, uint64_t data_len,
                                       kvp__ec_push_write_hdr_t *out)
{
    kvp_status_t st = check_prefix(hdr, hdr_len, KVP__EC_PUSH_KIND_WRITE);
    if (st != KVP_OK)
        return st;
    size_t rl = hdr[7];
    if (hdr_len < KVP__EC_PUSH_WRITE_FIXED || rl > KVP__EC_PUSH_RID_MAX || hdr_len != KVP__EC_PUSH_WRITE_FIXED + rl)
        return KVP_ERR_PROTOCOL;
    const char *rid = (const char *)hdr + KVP__EC_PUSH_WRITE_FIXED;
    if (!rid_ok(rid, rl))
        return KVP_ERR_PROTOCOL;
    out->offset = be_get(hdr + 8, 8);
    out->length = be_get(hdr + 16, 8);
    if (out->length != data_len)
        return KVP_ERR_PROTOCOL;
    memcpy(out->rid, rid, rl);
    out->rid[rl] = 0;
    return KVP_OK;
}

void kvp__ec_push_status_encode(uint8_t out[KVP__EC_PUSH_STATUS_LEN], kvp_status_t status, uint64_t landed)
{
    memcpy(out, KVP__EC_PUSH_MAGIC, 4);
    be_put(out + 4, KVP__EC_PUSH_VERSION, 2);
    out[6] = KVP__EC_PUSH_KIND_STATUS;
    out[7] = 0;
    be_put(out + 8, (uint32_t)(int32_t)status, 4);
    be_put(out + 12, 0, 4);
    be_put(out + 16, landed, 8);
}

kvp_status_t kvp__ec_push_status_decode(const uint8_t *hdr, size_t hdr_len, uint64_t data_len,
                                        kvp_status_t *status_p, uint64_t *landed_p)
{
    kvp_status_t st = check_prefix(hdr, hdr_len, KVP__EC_PUSH_KIND_STATUS);
    if (st != KVP_OK)
        return st;
    if (hdr_len != KVP__EC_PUSH_STATUS_LEN || data_len != 0 || hdr[7] != 0 || be_get(hdr + 12, 4) != 0)
        return KVP_ERR_PROTOCOL;
    int32_t s = (int32_t)(uint32_t)be_get(hdr + 8, 4);
    switch (s) {
    case KVP_OK:
    case KVP_ERR_INVALID_ARG:
    case KVP_ERR_PROTOCOL:
    case KVP_ERR_VERSION:
    case KVP_ERR_BUSY:
        break;
    default: return KVP_ERR_PROTOCOL;
    }
    *status_p = (kvp_status_t)s;
    *landed_p = be_get(hdr + 16, 8);
    return KVP_OK;
}
