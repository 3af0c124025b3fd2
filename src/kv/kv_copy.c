/*
 * The copy seam (kv_connector.h, kvp_kv_copy_ops_t): every byte that moves
 * between the KV cache and a buffer the pool reads or writes goes through
 * here, so a CUDA-staged copy replaces host memcpy without touching the
 * save and load rules.
 *
 * A block's value (§2.3) is one scatter list over every registered segment,
 * in registration order: slice s is segs[s].base + b * segs[s].block_len,
 * segs[s].block_len bytes (the original's prepare_value_for_block; its
 * size = block_len * ceil(span / block_size) is always one block_len, as a
 * chunk never spans more than one block).
 *
 *   direct   the pool reads (put) and writes (get) the cache in place:
 *            kvp__kvw_block_iov gives the slices.
 *   staged   a save copies the block into a host bounce buffer with to_host
 *            (kvp__kvw_stage_out) and puts that; a load gets into a bounce
 *            buffer, checks the result, and only then copies it into the
 *            cache with from_host (kvp__kvw_stage_in).
 */
#include <string.h>

#include "kv/kv_worker_int.h"

static kvp_status_t host_copy(void *ctx, void *dst, const void *src, size_t len)
{
    (void)ctx;
    memcpy(dst, src, len);
    return KVP_OK;
}

static const kvp_kv_copy_ops_t g_host = {true, host_copy, host_copy, NULL};

const kvp_kv_copy_ops_t *kvp_kv_copy_host(void) { return &g_host; }

void kvp__kvw_block_iov(const kvp_kv_worker_t *w, int64_t b, kvp_iov_t *iov)
{
    for (size_t s = 0; s < w->nsegs; s++) {
        iov[s].base = w->segs[s].base + (size_t)b * w->segs[s].block_len;
        iov[s].len = w->segs[s].block_len;
    }
}

kvp_status_t kvp__kvw_stage_out(const kvp_kv_worker_t *w, int64_t b, uint8_t *dst)
{
    for (size_t s = 0; s < w->nsegs; s++) {
        size_t len = w->segs[s].block_len;
        kvp_status_t st = w->copy.to_host(w->copy.ctx, dst, w->segs[s].base + (size_t)b * len, len);
        if (st != KVP_OK)
            return st;
        dst += len;
    }
    return KVP_OK;
}

kvp_status_t kvp__kvw_stage_in(const kvp_kv_worker_t *w, int64_t b, const uint8_t *src)
{
    for (size_t s = 0; s < w->nsegs; s++) {
        size_t len = w->segs[s].block_len;
        kvp_status_t st = w->copy.from_host(w->copy.ctx, w->segs[s].base + (size_t)b * len, src, len);
        if (st != KVP_OK)
            return st;
        src += len;
    }
    return KVP_OK;
}
