#include "net/wire.h"

#include <string.h>

#include <openssl/sha.h>

#include "common/log.h"

static int op_has_keys(uint64_t op)
{
    return op != KVP_WOP_IN_DATA && op != KVP_WOP_HELLO && op != KVP_WOP_REMOVE_ALL &&
           op != KVP_WOP_STATS && op != KVP_WOP_RELEASE;
}

void kvp__wire_lr_proof(const uint8_t nonce[KVP_WIRE_LR_NONCE], uint64_t conn_key, uint8_t out[KVP_WIRE_LR_PROOF])
{
    uint8_t msg[KVP_WIRE_LR_NONCE + 8], md[SHA256_DIGEST_LENGTH];
    memcpy(msg, nonce, KVP_WIRE_LR_NONCE);
    for (int i = 0; i < 8; i++)
        msg[KVP_WIRE_LR_NONCE + i] = (uint8_t)(conn_key >> (56 - 8 * i));
    SHA256(msg, sizeof msg, md);
    memcpy(out, md, KVP_WIRE_LR_PROOF);
}

void kvp__wire_req_encode(kvp__mpw_t *w, uint32_t op, uint64_t req_id, uint32_t timeout_ms,
                          uint64_t conn_key, const kvp_key_t *keys, uint32_t nkeys,
                          const uint64_t *sizes)
{
    int has_keys = op_has_keys(op);
    kvp__mpw_array(w, 5 + (has_keys ? 1 : 0) + (sizes ? 1 : 0));
    kvp__mpw_uint(w, KVP_WIRE_VERSION);
    kvp__mpw_uint(w, op);
    kvp__mpw_uint(w, req_id);
    kvp__mpw_uint(w, timeout_ms);
    kvp__mpw_uint(w, conn_key);
    if (has_keys) {
        kvp__mpw_array(w, nkeys);
        for (uint32_t i = 0; i < nkeys; i++)
            kvp__mpw_bin(w, keys[i].data, keys[i].len);
    }
    if (sizes) {
        kvp__mpw_array(w, nkeys);
        for (uint32_t i = 0; i < nkeys; i++)
            kvp__mpw_uint(w, sizes[i]);
    }
}

int kvp__wire_req_add_released(kvp__mpw_t *w, const uint64_t *ids, uint32_t n)
{
    /* The header is a fixarray of at most 7 fields: its first byte counts
     * them. */
    if (w->err || w->len == 0 || (w->buf[0] & 0xf0u) != 0x90u || (w->buf[0] & 0x0fu) >= 8u ||
        n == 0 || n > KVP_RELEASED_MAX)
        return -1;
    size_t len = w->len;
    kvp__mpw_array(w, n);
    for (uint32_t i = 0; i < n; i++)
        kvp__mpw_uint(w, ids[i]);
    if (w->err) { /* the bytes written so far are intact: drop the field */
        w->err = 0;
        w->len = len;
        return -1;
    }
    w->buf[0]++;
    return 0;
}

kvp_status_t kvp__wire_req_decode(const void *hdr, size_t len, kvp__wire_req_t *req,
                                  kvp_key_t *keys_buf, uint64_t *sizes_buf, uint32_t max_keys)
{
    kvp__mpr_t r;
    memset(req, 0, sizeof *req);
    if (!hdr || len == 0 || len > KVP_WIRE_HEADER_MAX) {
        kvp_warn_rl("wire: request header of %zu bytes (1..%u)", len, KVP_WIRE_HEADER_MAX);
        return KVP_ERR_PROTOCOL;
    }
    kvp__mpr_init(&r, hdr, len);
    uint32_t nf = kvp__mpr_array(&r, 8);
    if (r.err || nf < 5)
        goto bad;
    uint64_t ver = kvp__mpr_uint(&r);
    if (r.err)
        goto bad;
    if (ver != KVP_WIRE_VERSION) {
        kvp_warn_rl("wire: protocol version %llu (this server speaks %u)", (unsigned long long)ver,
                 KVP_WIRE_VERSION);
        return KVP_ERR_VERSION;
    }
    uint64_t op = kvp__mpr_uint(&r);
    req->req_id = kvp__mpr_uint(&r);
    uint64_t to = kvp__mpr_uint(&r);
    req->conn_key = kvp__mpr_uint(&r);
    if (r.err || op > KVP_WOP_MAX || to > 0xffffffffu)
        goto bad;
    req->op = (uint32_t)op;
    req->timeout_ms = (uint32_t)to;
    int has_keys = op_has_keys(op);
    int has_sizes = op == KVP_WOP_PUT || op == KVP_WOP_GET || op == KVP_WOP_GET_LOCAL;
    uint32_t base = 5u + (uint32_t)has_keys + (uint32_t)has_sizes;
    if (nf != base && nf != base + 1u)
        goto bad;
    if (has_keys) {
        uint32_t n = kvp__mpr_array(&r, max_keys < KVP_BATCH_MAX ? max_keys : KVP_BATCH_MAX);
        if (r.err)
            goto bad;
        req->nkeys = n;
        req->keys = keys_buf;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t kl;
            const uint8_t *k = kvp__mpr_bytes(&r, KVP_KEY_MAX, &kl);
            if (r.err || kl == 0)
                goto bad;
            keys_buf[i].data = k;
            keys_buf[i].len = kl;
        }
    }
    if (has_sizes) {
        uint32_t n = kvp__mpr_array(&r, req->nkeys);
        if (r.err || n != req->nkeys)
            goto bad;
        req->sizes = sizes_buf;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t sz = kvp__mpr_uint(&r);
            if (r.err || (op == KVP_WOP_PUT && (sz == 0 || sz > KVP_VALUE_MAX)))
                goto bad;
            sizes_buf[i] = sz;
            if (op == KVP_WOP_PUT) {
                req->payload += sz;
                if (req->payload > KVP_WIRE_PAYLOAD_MAX)
                    goto bad;
            }
        }
    }
    if (nf == base + 1u) {
        uint32_t n = kvp__mpr_array(&r, KVP_RELEASED_MAX);
        if (r.err || n == 0)
            goto bad;
        for (uint32_t i = 0; i < n; i++)
            req->released[i] = kvp__mpr_uint(&r);
        if (r.err)
            goto bad;
        req->nreleased = n;
    }
    if (!kvp__mpr_done(&r))
        goto bad;
    return KVP_OK;
bad:
    kvp_warn_rl("wire: malformed request header (%zu bytes)", len);
    return KVP_ERR_PROTOCOL;
}

void kvp__wire_reply_begin(kvp__mpw_t *w, uint32_t op, uint64_t req_id, kvp_status_t status,
                           uint32_t nfields)
{
    kvp__mpw_array(w, 4 + nfields);
    kvp__mpw_uint(w, KVP_WIRE_VERSION);
    kvp__mpw_uint(w, op);
    kvp__mpw_uint(w, req_id);
    kvp__mpw_int(w, status);
}

kvp_status_t kvp__wire_reply_decode(const void *hdr, size_t len, kvp__wire_reply_t *rep)
{
    memset(rep, 0, sizeof *rep);
    if (!hdr || len == 0 || len > KVP_WIRE_HEADER_MAX)
        return KVP_ERR_PROTOCOL;
    kvp__mpr_t *r = &rep->body;
    kvp__mpr_init(r, hdr, len);
    uint32_t nf = kvp__mpr_array(r, 8);
    uint64_t ver = kvp__mpr_uint(r);
    if (r->err || nf < 4)
        return KVP_ERR_PROTOCOL;
    if (ver != KVP_WIRE_VERSION)
        return KVP_ERR_VERSION;
    uint64_t op = kvp__mpr_uint(r);
    rep->req_id = kvp__mpr_uint(r);
    int64_t st = kvp__mpr_int(r);
    if (r->err || op > KVP_WOP_MAX || st > 1 || st < -1000)
        return KVP_ERR_PROTOCOL;
    rep->op = (uint32_t)op;
    rep->status = (kvp_status_t)st;
    return KVP_OK;
}
