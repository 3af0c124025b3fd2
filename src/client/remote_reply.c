/*
 * Reply decoding: a server's reply, read into the request it answers
 * (remote_int.h: kvp__remote_reply_parse, kvp__remote_match_reply).  The
 * formats and their decoders are net/wire_reply.h's (the envelope net/wire.h's);
 * what is left here is the client's part: the reply's fields placed into the
 * caller's op at the request's slice (p->off), the GET's values mapped onto
 * the caller's buffers (p->iov), a GET_LOCAL's offsets checked against the
 * mapped arena, the caller's buffers and the lease table before they become
 * copies (p->segs), and which leases to release or slices to repost.
 */
#include "client/remote_int.h"

#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "net/wire_reply.h"

/* GET_LOCAL: builds p->segs, the copies from the mapped arena into the
 * caller's buffers, checking every range against the mapping and the
 * buffers.  A reply that breaks the protocol is still released (the server
 * may hold leases for it). */
static kvp_status_t parse_local(pending_t *p, kvp__wire_reply_t *rep)
{
    kvp_op_t *op = p->op;
    uint32_t n = p->cnt;
    /* (a request is a slice of at most KVP_SLICE_KEYS keys: remote.c) */
    kvp__wire_local_item_t items[KVP_SLICE_KEYS];
    uint64_t slot, gen;
    uint32_t nok;
    if (n > KVP_SLICE_KEYS || !p->lmap || kvp__wire_reply_local_decode(rep, n, items, &slot, &gen, &nok) != KVP_OK)
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
    if (nok)
        p->release = 1; /* the server holds leases for it */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t size = items[i].size, off = items[i].offset;
        results[i].status = items[i].status;
        results[i].size = size;
        results[i].flags = 0;
        if (items[i].status == KVP_ERR_BUSY)
            p->repost = 1; /* (the server holds too much for this connection: over the network then) */
        if (items[i].status != KVP_OK)
            continue;
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
    p->lr_slot = slot;
    p->lr_gen = gen;
    if (p->release && !kvp__lmap_slot_ok(p->lmap, slot))
        goto bad;
    p->nsegs = k;
    return KVP_OK;
bad:
    p->release = 1;
    p->nsegs = 0;
    return KVP_ERR_PROTOCOL;
}

/* GET: p->iov, the caller's buffers the reply's data_len bytes of values
 * fill in key order (the OK items' sizes, each capped by its buffers: the
 * server checked capacities). */
static kvp_status_t map_values(pending_t *p, const kvp_key_result_t *results, const kvp_sgl_t *values)
{
    uint32_t nv = 0;
    for (uint32_t i = 0; i < p->cnt; i++)
        if (results[i].status == KVP_OK)
            nv += values[i].iovcnt;
    kvp__free(p->iov, p->niov * sizeof *p->iov);
    p->iov = kvp__calloc(nv ? nv : 1, sizeof *p->iov);
    p->niov = nv ? nv : 1;
    if (!p->iov) {
        p->niov = 0;
        return KVP_ERR_NO_MEMORY;
    }
    uint32_t k = 0;
    for (uint32_t i = 0; i < p->cnt; i++) {
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
    return KVP_OK;
}

kvp_status_t kvp__remote_reply_parse(pending_t *p, kvp__wire_reply_t *rep, size_t data_len)
{
    kvp_op_t *op = p->op;
    uint32_t off = p->off, cnt = p->cnt;
    /* Only a get's reply carries values: anything else with data is a
     * server breaking the protocol (on the TCP transport those bytes would
     * otherwise land in the op's put sources).  (rep->op is p->wop:
     * kvp__remote_match_reply.) */
    if (kvp__wire_reply_data_check(rep, data_len) != KVP_OK)
        return KVP_ERR_PROTOCOL;
    if (rep->status != KVP_OK)
        return rep->status;
    switch (p->wop) {
    case KVP_WOP_HELLO:
        return kvp__wire_reply_hello_decode(rep, &p->hello);
    case KVP_WOP_STATS:
        return kvp__wire_reply_stats_decode(rep, p->stats_out, NULL);
    case KVP_WOP_EXISTS:
        return kvp__wire_reply_exists_decode(rep, cnt, op->present + off);
    case KVP_WOP_PREFIX: {
        uint64_t m;
        if (kvp__wire_reply_prefix_decode(rep, cnt, &m) != KVP_OK)
            return KVP_ERR_PROTOCOL;
        if (m < cnt && off + m < p->parent->prefix)
            p->parent->prefix = off + (size_t)m;
        return KVP_OK;
    }
    case KVP_WOP_REMOVE_ALL: {
        uint64_t m;
        if (kvp__wire_reply_remove_all_decode(rep, &m) != KVP_OK)
            return KVP_ERR_PROTOCOL;
        if (op->removed)
            *op->removed = m;
        return KVP_OK;
    }
    case KVP_WOP_PUT:
    case KVP_WOP_REMOVE:
    case KVP_WOP_PIN:
    case KVP_WOP_UNPIN:
    case KVP_WOP_GET: {
        kvp_key_result_t *results = op->results + off;
        uint64_t total;
        int get = p->wop == KVP_WOP_GET;
        if (kvp__wire_reply_results_decode(rep, cnt, results, get ? &total : NULL) != KVP_OK)
            return KVP_ERR_PROTOCOL;
        if (!get)
            return KVP_OK;
        if (total != data_len)
            return KVP_ERR_PROTOCOL;
        return map_values(p, results, op->values + off);
    }
    case KVP_WOP_GET_LOCAL:
        return parse_local(p, rep);
    case KVP_WOP_LOCAL_PROOF:
        return KVP_OK;
    default:
        return KVP_ERR_PROTOCOL;
    }
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
