/*
 * Reply fields, op by op (net/wire_reply.h has the formats).  Every decoder
 * reads with the bounded reader of common/mp.h, whose error is sticky: a
 * decoder reads all it needs and checks r->err once where the client always
 * did (fuzzed by tests/fuzz/fuzz_wire_reply.c).
 */
#include "net/wire_reply.h"

#include <string.h>

/* A per-key status as a server may send it: OK (0) or an error (negative,
 * within the status list's range). */
static int status_ok(int64_t st) { return st <= 0 && st >= -1000; }

void kvp__wire_reply_status_encode(kvp__mpw_t *w, uint32_t op, uint64_t req_id, kvp_status_t status)
{
    kvp__wire_reply_begin(w, op, req_id, status, 0);
}

kvp_status_t kvp__wire_reply_data_check(const kvp__wire_reply_t *rep, uint64_t data_len)
{
    if (data_len && (rep->op != KVP_WOP_GET || rep->status != KVP_OK))
        return KVP_ERR_PROTOCOL;
    return KVP_OK;
}

/* ---- HELLO ---- */

void kvp__wire_reply_hello_encode(kvp__mpw_t *w, uint64_t req_id, uint64_t max_batch, uint64_t max_value,
                                  const kvp__wire_arena_t *a)
{
    kvp__wire_reply_begin(w, KVP_WOP_HELLO, req_id, KVP_OK, 4);
    kvp__mpw_uint(w, KVP_WIRE_VERSION);
    kvp__mpw_uint(w, max_batch);
    kvp__mpw_uint(w, max_value);
    if (!a) {
        kvp__mpw_nil(w);
        return;
    }
    kvp__mpw_array(w, 10);
    kvp__mpw_uint(w, a->pid);
    kvp__mpw_uint(w, a->fd);
    kvp__mpw_uint(w, a->size);
    kvp__mpw_uint(w, a->dev);
    kvp__mpw_uint(w, a->ino);
    kvp__mpw_uint(w, a->populated ? 1 : 0);
    kvp__mpw_uint(w, a->tfd);
    kvp__mpw_uint(w, a->tsize);
    kvp__mpw_uint(w, a->tdev);
    kvp__mpw_uint(w, a->tino);
}

/* The arena field is optional (a server without local reads may end the
 * reply after max_value). */
kvp_status_t kvp__wire_reply_hello_decode(kvp__wire_reply_t *rep, kvp__wire_hello_t *out)
{
    kvp__mpr_t *b = &rep->body;
    memset(out, 0, sizeof *out);
    out->protocol = kvp__mpr_uint(b);
    out->max_batch = kvp__mpr_uint(b);
    out->max_value = kvp__mpr_uint(b);
    if (!b->err && b->p < b->end && !kvp__mpr_nil(b)) {
        if (kvp__mpr_array(b, 16) != 10)
            return KVP_ERR_PROTOCOL;
        kvp__wire_arena_t *a = &out->arena;
        a->pid = kvp__mpr_uint(b);
        a->fd = kvp__mpr_uint(b);
        a->size = kvp__mpr_uint(b);
        a->dev = kvp__mpr_uint(b);
        a->ino = kvp__mpr_uint(b);
        a->populated = kvp__mpr_uint(b) != 0;
        a->tfd = kvp__mpr_uint(b);
        a->tsize = kvp__mpr_uint(b);
        a->tdev = kvp__mpr_uint(b);
        a->tino = kvp__mpr_uint(b);
        out->has_arena = !b->err;
    }
    return b->err ? KVP_ERR_PROTOCOL : KVP_OK;
}

/* ---- EXISTS, PREFIX, REMOVE_ALL, STATS ---- */

void kvp__wire_reply_exists_encode(kvp__mpw_t *w, uint64_t req_id, const uint8_t *present, uint32_t n)
{
    kvp__wire_reply_begin(w, KVP_WOP_EXISTS, req_id, KVP_OK, 1);
    kvp__mpw_bin(w, present, n);
}

kvp_status_t kvp__wire_reply_exists_decode(kvp__wire_reply_t *rep, uint32_t expect, uint8_t *present)
{
    kvp__mpr_t *b = &rep->body;
    uint32_t len;
    const uint8_t *bits = kvp__mpr_bytes(b, KVP_BATCH_MAX, &len);
    if (b->err || len != expect)
        return KVP_ERR_PROTOCOL;
    if (len)
        memcpy(present, bits, len);
    return KVP_OK;
}

void kvp__wire_reply_prefix_encode(kvp__mpw_t *w, uint64_t req_id, uint64_t m)
{
    kvp__wire_reply_begin(w, KVP_WOP_PREFIX, req_id, KVP_OK, 1);
    kvp__mpw_uint(w, m);
}

kvp_status_t kvp__wire_reply_prefix_decode(kvp__wire_reply_t *rep, uint32_t expect, uint64_t *m)
{
    kvp__mpr_t *b = &rep->body;
    uint64_t v = kvp__mpr_uint(b);
    if (b->err || v > expect)
        return KVP_ERR_PROTOCOL;
    *m = v;
    return KVP_OK;
}

void kvp__wire_reply_remove_all_encode(kvp__mpw_t *w, uint64_t req_id, uint64_t removed)
{
    kvp__wire_reply_begin(w, KVP_WOP_REMOVE_ALL, req_id, KVP_OK, 1);
    kvp__mpw_uint(w, removed);
}

kvp_status_t kvp__wire_reply_remove_all_decode(kvp__wire_reply_t *rep, uint64_t *removed)
{
    kvp__mpr_t *b = &rep->body;
    uint64_t v = kvp__mpr_uint(b);
    if (b->err)
        return KVP_ERR_PROTOCOL;
    *removed = v;
    return KVP_OK;
}

void kvp__wire_reply_stats_encode(kvp__mpw_t *w, uint64_t req_id, const kvp_pool_stats_t *st)
{
    uint64_t f[KVP_WIRE_NSTATS];
    memcpy(f, st, sizeof f);
    kvp__wire_reply_begin(w, KVP_WOP_STATS, req_id, KVP_OK, 1);
    kvp__mpw_array(w, (uint32_t)KVP_WIRE_NSTATS);
    for (size_t i = 0; i < KVP_WIRE_NSTATS; i++)
        kvp__mpw_uint(w, f[i]);
}

kvp_status_t kvp__wire_reply_stats_decode(kvp__wire_reply_t *rep, kvp_pool_stats_t *st, uint32_t *nfields)
{
    kvp__mpr_t *b = &rep->body;
    uint32_t n = kvp__mpr_array(b, 64);
    for (uint32_t i = 0; i < n; i++) {
        uint64_t v = kvp__mpr_uint(b);
        if (i < KVP_WIRE_NSTATS && st)
            memcpy((char *)st + i * sizeof v, &v, sizeof v);
    }
    if (nfields)
        *nfields = n < KVP_WIRE_NSTATS ? n : (uint32_t)KVP_WIRE_NSTATS;
    return b->err ? KVP_ERR_PROTOCOL : KVP_OK;
}

/* ---- per-key results ---- */

void kvp__wire_reply_keys_begin(kvp__mpw_t *w, uint32_t op, uint64_t req_id, uint32_t n)
{
    kvp__wire_reply_begin(w, op, req_id, KVP_OK, 1);
    kvp__mpw_array(w, n);
}

void kvp__wire_reply_results_encode(kvp__mpw_t *w, uint32_t op, uint64_t req_id, const kvp_key_result_t *res,
                                    uint32_t n)
{
    kvp__wire_reply_keys_begin(w, op, req_id, n);
    for (uint32_t i = 0; i < n; i++)
        kvp__wire_reply_key(w, res[i].status, op == KVP_WOP_GET ? res[i].size : res[i].flags);
}

kvp_status_t kvp__wire_reply_results_decode(kvp__wire_reply_t *rep, uint32_t expect, kvp_key_result_t *res,
                                            uint64_t *total)
{
    kvp__mpr_t *b = &rep->body;
    uint32_t op = rep->op;
    uint32_t n = kvp__mpr_array(b, KVP_BATCH_MAX);
    if (b->err || n != expect)
        return KVP_ERR_PROTOCOL;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kvp__mpr_array(b, 2) != 2)
            return KVP_ERR_PROTOCOL;
        int64_t st = kvp__mpr_int(b);
        uint64_t v = kvp__mpr_uint(b);
        if (b->err || !status_ok(st))
            return KVP_ERR_PROTOCOL;
        res[i].status = (kvp_status_t)st;
        if (op == KVP_WOP_GET) {
            res[i].size = v;
            res[i].flags = 0;
            if (st == KVP_OK) {
                if (v > UINT64_MAX - sum) /* sizes that wrap could match any data length */
                    return KVP_ERR_PROTOCOL;
                sum += v;
            }
        } else {
            res[i].flags = (uint32_t)v;
            if (op != KVP_WOP_PUT)
                res[i].size = 0;
        }
    }
    if (total)
        *total = sum;
    return KVP_OK;
}

/* ---- GET_LOCAL ---- */

void kvp__wire_reply_local_begin(kvp__mpw_t *w, uint64_t req_id, uint32_t n)
{
    kvp__wire_reply_begin(w, KVP_WOP_GET_LOCAL, req_id, KVP_OK, 3);
    kvp__mpw_array(w, n);
}

void kvp__wire_reply_local_end(kvp__mpw_t *w, uint64_t slot, uint64_t gen)
{
    kvp__mpw_uint(w, slot);
    kvp__mpw_uint(w, gen);
}

kvp_status_t kvp__wire_reply_local_decode(kvp__wire_reply_t *rep, uint32_t expect, kvp__wire_local_item_t *items,
                                          uint64_t *slot, uint64_t *gen, uint32_t *nok)
{
    kvp__mpr_t *b = &rep->body;
    *nok = 0;
    uint32_t n = kvp__mpr_array(b, KVP_BATCH_MAX);
    if (b->err || n != expect)
        return KVP_ERR_PROTOCOL;
    for (uint32_t i = 0; i < n; i++) {
        if (kvp__mpr_array(b, 3) != 3)
            return KVP_ERR_PROTOCOL;
        int64_t st = kvp__mpr_int(b);
        uint64_t size = kvp__mpr_uint(b), off = kvp__mpr_uint(b);
        if (b->err || !status_ok(st))
            return KVP_ERR_PROTOCOL;
        items[i] = (kvp__wire_local_item_t){(kvp_status_t)st, size, off};
        *nok += st == KVP_OK;
    }
    *slot = kvp__mpr_uint(b);
    *gen = kvp__mpr_uint(b);
    return b->err ? KVP_ERR_PROTOCOL : KVP_OK;
}
