/*
 * Reply decoding: the op fields of a server's reply, read into the request
 * they answer (remote_int.h: kvp__remote_reply_parse, kvp__remote_match_reply).
 * The reply envelope is decoded by net/wire.c; everything below reads bytes
 * a server sent, so every count and range is checked against what the
 * request asked for and what the caller's buffers hold.
 */
#include "client/remote_int.h"

#include <string.h>

#include "common/alloc.h"
#include "common/log.h"

/* GET_LOCAL's fields: n [status, size, offset].  Builds p->segs, the
 * copies from the mapped arena into the caller's buffers, checking every
 * range against the mapping and the buffers.  A reply that breaks the
 * protocol is still released (the server may hold leases for it). */
static kvp_status_t parse_local(pending_t *p, kvp__mpr_t *b)
{
    kvp_op_t *op = p->op;
    uint32_t n = kvp__mpr_array(b, KVP_BATCH_MAX);
    if (b->err || n != p->cnt || !p->lmap)
        goto bad;
    kvp_key_result_t *results = op->results + p->off;
    const kvp_sgl_t *values = op->values + p->off;
    uint32_t most = 0; /* segments, at most one per non-empty buffer piece */
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t j = 0; j < values[i].iovcnt; j++)
            most += values[i].iov[j].len != 0;
    if (most > p->segs_cap) {
        kvp__free(p->segs, p->segs_cap * sizeof *p->segs);
        p->segs_cap = 0;
        if (!(p->segs = kvp__calloc(most, sizeof *p->segs))) {
            p->release = 1;
            return KVP_ERR_NO_MEMORY;
        }
        p->segs_cap = most;
    }
    const uint8_t *base = kvp__lmap_base(p->lmap);
    uint64_t mapped = kvp__lmap_size(p->lmap);
    uint32_t k = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kvp__mpr_array(b, 3) != 3)
            goto bad;
        int64_t ks = kvp__mpr_int(b);
        uint64_t size = kvp__mpr_uint(b), off = kvp__mpr_uint(b);
        if (b->err || ks > 0 || ks < -1000)
            goto bad;
        results[i].status = (kvp_status_t)ks;
        results[i].size = size;
        results[i].flags = 0;
        if (ks == KVP_ERR_BUSY)
            p->repost = 1; /* (the server holds too much for this connection: over the network then) */
        if (ks != KVP_OK)
            continue;
        p->release = 1;
        if (off > mapped || size > mapped - off)
            goto bad;
        for (uint32_t j = 0; j < values[i].iovcnt && size; j++) {
            size_t len = values[i].iov[j].len < size ? values[i].iov[j].len : (size_t)size;
            if (!len)
                continue;
            p->segs[k++] = (kvp__cpseg_t){values[i].iov[j].base, base + off, len};
            off += len;
            size -= len;
        }
        if (size) /* more than the caller's buffers hold */
            goto bad;
    }
    p->lr_slot = kvp__mpr_uint(b);
    p->lr_gen = kvp__mpr_uint(b);
    if (b->err || (p->release && !kvp__lmap_slot_ok(p->lmap, p->lr_slot)))
        goto bad;
    p->nsegs = k;
    return KVP_OK;
bad:
    p->release = 1;
    p->nsegs = 0;
    return KVP_ERR_PROTOCOL;
}

kvp_status_t kvp__remote_reply_parse(pending_t *p, kvp__wire_reply_t *rep, size_t data_len)
{
    kvp__mpr_t *b = &rep->body;
    kvp_op_t *op = p->op;
    uint32_t off = p->off, cnt = p->cnt;
    /* Only a get's reply carries values: anything else with data is a
     * server breaking the protocol (on the TCP transport those bytes would
     * otherwise land in the op's put sources). */
    if (data_len && (p->wop != KVP_WOP_GET || rep->status != KVP_OK))
        return KVP_ERR_PROTOCOL;
    if (rep->status != KVP_OK)
        return rep->status;
    switch (p->wop) {
    case KVP_WOP_HELLO:
        (void)kvp__mpr_uint(b);
        (void)kvp__mpr_uint(b);
        p->hello_max_value = kvp__mpr_uint(b);
        if (!b->err && b->p < b->end && !kvp__mpr_nil(b)) {
            /* the server's arena and lease table: [pid, fd, size, dev, ino,
             * populated, table fd, size, dev, ino] */
            if (kvp__mpr_array(b, 16) != 10)
                return KVP_ERR_PROTOCOL;
            kvp__arena_info_t *a = &p->hello_arena;
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
            p->hello_has_arena = !b->err;
        }
        break;
    case KVP_WOP_STATS: {
        uint32_t n = kvp__mpr_array(b, 64);
        uint64_t *f = (uint64_t *)p->stats_out;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t v = kvp__mpr_uint(b);
            if (i < KVP_WIRE_NSTATS && f)
                f[i] = v;
        }
        break;
    }
    case KVP_WOP_EXISTS: {
        uint32_t len;
        const uint8_t *bits = kvp__mpr_bytes(b, KVP_BATCH_MAX, &len);
        if (b->err || len != cnt)
            return KVP_ERR_PROTOCOL;
        memcpy(op->present + off, bits, len);
        break;
    }
    case KVP_WOP_PREFIX: {
        uint64_t m = kvp__mpr_uint(b);
        if (b->err || m > cnt)
            return KVP_ERR_PROTOCOL;
        if (m < cnt && off + m < p->parent->prefix)
            p->parent->prefix = off + (size_t)m;
        break;
    }
    case KVP_WOP_REMOVE_ALL: {
        uint64_t m = kvp__mpr_uint(b);
        if (op->removed)
            *op->removed = m;
        break;
    }
    case KVP_WOP_PUT:
    case KVP_WOP_REMOVE:
    case KVP_WOP_PIN:
    case KVP_WOP_UNPIN:
    case KVP_WOP_GET: {
        uint32_t n = kvp__mpr_array(b, KVP_BATCH_MAX);
        if (b->err || n != cnt)
            return KVP_ERR_PROTOCOL;
        kvp_key_result_t *results = op->results + off;
        const kvp_sgl_t *values = op->values ? op->values + off : NULL;
        uint64_t total = 0;
        uint32_t nv = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (kvp__mpr_array(b, 2) != 2)
                return KVP_ERR_PROTOCOL;
            int64_t st = kvp__mpr_int(b);
            uint64_t v = kvp__mpr_uint(b);
            if (b->err || st > 0 || st < -1000)
                return KVP_ERR_PROTOCOL;
            results[i].status = (kvp_status_t)st;
            if (p->wop == KVP_WOP_GET) {
                results[i].size = v;
                results[i].flags = 0;
                if (st == KVP_OK) {
                    total += v;
                    for (uint32_t k = 0; k < values[i].iovcnt; k++)
                        nv++;
                }
            } else {
                results[i].flags = (uint32_t)v;
                if (p->wop != KVP_WOP_PUT)
                    results[i].size = 0;
            }
        }
        if (p->wop != KVP_WOP_GET)
            break;
        if (total != data_len)
            return KVP_ERR_PROTOCOL;
        kvp__free(p->iov, p->niov * sizeof *p->iov);
        p->iov = kvp__calloc(nv ? nv : 1, sizeof *p->iov);
        p->niov = nv ? nv : 1;
        if (!p->iov) {
            p->niov = 0;
            return KVP_ERR_NO_MEMORY;
        }
        uint32_t k = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (results[i].status != KVP_OK)
                continue;
            uint64_t left = results[i].size;
            for (uint32_t j = 0; j < values[i].iovcnt && left; j++) {
                size_t len = values[i].iov[j].len < left ? values[i].iov[j].len : (size_t)left;
                if (!len)
                    continue;
                p->iov[k].buffer = values[i].iov[j].base;
                p->iov[k].length = len;
                k++;
                left -= len;
            }
            if (left)
                return KVP_ERR_PROTOCOL; /* the server checked capacities; never here */
        }
        p->niov = k ? k : 1;
        if (!k)
            p->iov[0].length = 0;
        break;
    }
    case KVP_WOP_GET_LOCAL:
        return parse_local(p, b);
    case KVP_WOP_LOCAL_PROOF:
        break;
    default:
        return KVP_ERR_PROTOCOL;
    }
    return b->err ? KVP_ERR_PROTOCOL : KVP_OK;
}

pending_t *kvp__remote_match_reply(remote_t *r, const void *hdr, size_t len, kvp__wire_reply_t *rep)
{
    if (kvp__wire_reply_decode(hdr, len, rep) != KVP_OK) {
        kvp_warn("remote: undecodable reply dropped (%zu bytes)", len);
        return NULL;
    }
    pthread_mutex_lock(&r->mu);
    pending_t *p = kvp__remote_do_find(r, rep->req_id);
    if (!p || !kvp__remote_awaits_reply(p) || p->wop != rep->op) {
        pthread_mutex_unlock(&r->mu);
        if (rep->op == 0)
            kvp_warn("remote: server refused a request: %s", kvp_status_str(rep->status));
        return NULL;
    }
    return p;
}
