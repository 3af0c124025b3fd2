/* Fuzz target: the EC push session string and TCP frame decoders
 * (src/ec/ec_push_wire.h).  The first byte picks the decoder; a decoded
 * value must re-encode to what decodes to the same value. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "ec/ec_push_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void session(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    memcpy(s, data, size);
    s[size] = 0;
    kvp__ec_session_t *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    char *out = malloc(KVP__EC_SESSION_MAX + 1);
    if (kvp__ec_session_decode(s, a) == KVP_OK) {
        size_t n = kvp__ec_session_encode(a, out, KVP__EC_SESSION_MAX + 1);
        if (n == 0 || kvp__ec_session_decode(out, b) != KVP_OK)
            abort();
        if (strcmp(a->host, b->host) || a->port != b->port || a->base != b->base || a->size != b->size ||
            a->ucx_addr_len != b->ucx_addr_len || a->rkey_len != b->rkey_len ||
            memcmp(a->ucx_addr, b->ucx_addr, a->ucx_addr_len) || memcmp(a->rkey, b->rkey, a->rkey_len))
            abort();
        uint64_t off;
        if (kvp__ec_session_range(a, a->base, a->size, &off) != KVP_OK || off != 0 ||
            kvp__ec_session_range(a, a->base, a->size + 1, &off) == KVP_OK)
            abort();
    }
    free(out);
    free(a);
    free(b);
    free(s);
}

static void frames(const uint8_t *data, size_t size)
{
    /* data: u64 data_len (little-endian, 8 bytes), then the header */
    if (size < 8)
        return;
    uint64_t dl = 0;
    for (int i = 0; i < 8; i++)
        dl |= (uint64_t)data[i] << (8 * i);
    const uint8_t *h = data + 8;
    size_t hl = size - 8;
    kvp__ec_push_write_hdr_t w, w2;
    if (kvp__ec_push_write_decode(h, hl, dl, &w) == KVP_OK) {
        uint8_t enc[KVP__EC_PUSH_WRITE_MAX];
        size_t n = kvp__ec_push_write_encode(enc, w.offset, w.length, w.rid);
        if (n != hl || memcmp(enc, h, n) || kvp__ec_push_write_decode(enc, n, dl, &w2) != KVP_OK ||
            w2.offset != w.offset || strcmp(w2.rid, w.rid))
            abort();
    }
    kvp_status_t st;
    uint64_t landed;
    if (kvp__ec_push_status_decode(h, hl, dl, &st, &landed) == KVP_OK) {
        uint8_t enc[KVP__EC_PUSH_STATUS_LEN];
        kvp__ec_push_status_encode(enc, st, landed);
        if (hl != sizeof enc || memcmp(enc, h, hl))
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] & 1)
        session(data + 1, size - 1);
    else
        frames(data + 1, size - 1);
    return 0;
}
