/*
 * register_kv_caches (W8; MooncakeStoreWorker.register_kv_caches): the
 * tensors' checks, the segment rule (a dim whose byte stride exceeds the
 * page splits a storage into segments: K/V-first; none: one segment,
 * blocks-first or cross-layer), one kvp_pool_register per distinct storage,
 * and the threads' start.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kv/kv_worker_int.h"

/* Checks one tensor; the reason it is refused, or NULL. */
static const char *tensor_problem(const kvp_kv_cache_tensor_t *t, uint64_t num_blocks)
{
    if (!t->storage)
        return "storage is NULL";
    if (!t->storage_bytes || !t->elem_size)
        return "zero storage_bytes or elem_size";
    if (t->ndim < 1 || t->ndim > KVP_KV_TENSOR_MAX_DIMS)
        return "ndim out of range";
    if ((uintptr_t)t->storage % t->elem_size)
        return "storage not aligned to elem_size";
    if (t->storage_bytes % num_blocks)
        return "storage_bytes not divisible into num_blocks pages";
    unsigned __int128 last = 0; /* the view's last element, in elements */
    for (uint32_t d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 0)
            return "a zero or negative dimension";
        if (t->stride[d] < 0)
            return "a negative stride";
        last += (unsigned __int128)(t->shape[d] - 1) * (uint64_t)t->stride[d];
    }
    if ((last + 1) * t->elem_size > t->storage_bytes)
        return "the view leaves its storage";
    return NULL;
}

static int cmp_range(const void *a, const void *b)
{
    const kvp_kv_cache_tensor_t *x = *(const kvp_kv_cache_tensor_t *const *)a;
    const kvp_kv_cache_tensor_t *y = *(const kvp_kv_cache_tensor_t *const *)b;
    uintptr_t p = (uintptr_t)x->storage, q = (uintptr_t)y->storage;
    return p < q ? -1 : p > q;
}

/* Validates every tensor and that distinct storages do not overlap (one
 * storage named twice, with the same size, is one storage: Mamba's lists
 * and layers sharing a cache). */
static kvp_status_t check_tensors(const kvp_kv_cache_tensor_t *t, size_t n, uint64_t num_blocks)
{
    if (n == 0 || num_blocks == 0) {
        kvp_error("kv worker register: %zu tensors, %llu blocks", n, (unsigned long long)num_blocks);
        return KVP_ERR_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++) {
        const char *why = tensor_problem(&t[i], num_blocks);
        if (why) {
            kvp_error("kv worker register: tensor %zu: %s", i, why);
            return KVP_ERR_INVALID_ARG;
        }
    }
    const kvp_kv_cache_tensor_t **s = kvp__malloc(n * sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++)
        s[i] = &t[i];
    qsort(s, n, sizeof *s, cmp_range);
    kvp_status_t st = KVP_OK;
    for (size_t i = 1; i < n && st == KVP_OK; i++) {
        uintptr_t pb = (uintptr_t)s[i - 1]->storage, qb = (uintptr_t)s[i]->storage;
        bool same = pb == qb && s[i - 1]->storage_bytes == s[i]->storage_bytes;
        if (!same && qb < pb + s[i - 1]->storage_bytes) {
            kvp_error("kv worker register: storages at %p (%zu B) and %p overlap",
                      s[i - 1]->storage, s[i - 1]->storage_bytes, s[i]->storage);
            st = KVP_ERR_INVALID_ARG;
        }
    }
    kvp__free(s, n * sizeof *s);
    return st;
}

/* The segments of one storage (register_kv_caches' stride rule). */
static kvp_status_t add_segments(kvp_kv_worker_t *w, const kvp_kv_cache_tensor_t *t, size_t *cap_p)
{
    size_t page = t->storage_bytes / w->num_blocks;
    int outer = -1;
    for (uint32_t d = 0; d < t->ndim; d++)
        if ((uint64_t)t->stride[d] * t->elem_size > page) {
            outer = (int)d;
            break;
        }
    size_t nseg = 1, seg_stride = page, block_len = page;
    if (outer >= 0) { /* K/V-first: shape[outer] segments of seg_stride bytes */
        seg_stride = (size_t)t->stride[outer] * t->elem_size;
        nseg = (size_t)t->shape[outer];
        if (seg_stride % w->num_blocks || nseg * seg_stride > t->storage_bytes) {
            kvp_error("kv worker register: %zu segments of %zu B do not split %zu B into %llu "
                      "blocks", nseg, seg_stride, t->storage_bytes,
                      (unsigned long long)w->num_blocks);
            return KVP_ERR_INVALID_ARG;
        }
        block_len = seg_stride / w->num_blocks;
    }
    if (kvp__grow_in((void **)&w->segs, cap_p, w->nsegs + nseg, sizeof *w->segs, 16))
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < nseg; i++) {
        w->segs[w->nsegs].base = (uint8_t *)t->storage + i * seg_stride;
        w->segs[w->nsegs].block_len = block_len;
        w->nsegs++;
        w->value_bytes += block_len;
    }
    return KVP_OK;
}

/* Whether tensors[i] is the first to name its storage. */
static bool first_of_storage(const kvp_kv_cache_tensor_t *t, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (t[j].storage == t[i].storage)
            return false;
    return true;
}

static kvp_status_t start_threads(kvp_kv_worker_t *w)
{
    if (w->p.role != KVP_KV_ROLE_CONSUMER) {
        if (pthread_create(&w->save_thr, NULL, kvp__kvw_save_main, w))
            return KVP_ERR_NO_MEMORY;
        w->has_save_thread = true;
    }
    uint32_t n = w->p.num_load_threads ? w->p.num_load_threads : 1;
    w->load_thr = kvp__calloc(n, sizeof *w->load_thr);
    if (!w->load_thr)
        return KVP_ERR_NO_MEMORY;
    for (; w->nload_thr < n; w->nload_thr++)
        if (pthread_create(&w->load_thr[w->nload_thr], NULL, kvp__kvw_load_main, w))
            return KVP_ERR_NO_MEMORY;
    return KVP_OK;
}

kvp_status_t kvp_kv_worker_register(kvp_kv_worker_t *w, const kvp_kv_cache_tensor_t *tensors,
                                    size_t n, uint64_t num_blocks)
{
    if (!w || !tensors)
        return KVP_ERR_NULL_POINTER;
    if (w->registered) {
        kvp_error("kv worker register: called twice");
        return KVP_ERR_STATE;
    }
    kvp_status_t st = check_tensors(tensors, n, num_blocks);
    if (st != KVP_OK)
        return st;
    w->num_blocks = num_blocks;
    size_t nbases = 0, seg_cap = 0;
    for (size_t i = 0; i < n; i++)
        nbases += first_of_storage(tensors, i);
    w->bases = kvp__calloc(nbases, sizeof *w->bases);
    if (!w->bases)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < n && st == KVP_OK; i++)
        if (first_of_storage(tensors, i)) {
            w->bases[w->nbases++] = tensors[i].storage;
            st = add_segments(w, &tensors[i], &seg_cap);
        }
    if (st == KVP_OK && (w->value_bytes > KVP_VALUE_MAX || w->nsegs > UINT32_MAX)) {
        kvp_error("kv worker register: a block's value is %zu B in %zu segments", w->value_bytes,
                  w->nsegs);
        st = KVP_ERR_INVALID_ARG;
    }
    if (st == KVP_OK && seg_cap != w->nsegs) { /* exact, for the sized free */
        kvp__kvw_seg_t *s = kvp__realloc(w->segs, seg_cap * sizeof *s, w->nsegs * sizeof *s);
        if (!s)
            st = KVP_ERR_NO_MEMORY;
        else
            w->segs = s;
    }
    if (st != KVP_OK) {
        kvp__free(w->segs, seg_cap * sizeof *w->segs);
        kvp__free(w->bases, nbases * sizeof *w->bases);
        w->segs = NULL, w->bases = NULL, w->nsegs = 0, w->nbases = 0, w->value_bytes = 0;
        return st;
    }
    for (size_t i = 0; i < n; i++) {
        if (!first_of_storage(tensors, i))
            continue;
        kvp_status_t rs = kvp_pool_register(w->p.pool, tensors[i].storage, tensors[i].storage_bytes);
        if (rs != KVP_OK) /* as the original: logged, and the worker goes on */
            kvp_warn("kv worker register: pool register of %p (%zu B): %s", tensors[i].storage,
                     tensors[i].storage_bytes, kvp_status_str(rs));
    }
    kvp_info("kv worker: registered %zu storages, %zu segments, %llu blocks of %zu B", w->nbases,
             w->nsegs, (unsigned long long)num_blocks, w->value_bytes);
    w->registered = true;
    return start_threads(w);
}

