/*
 * The load threads (W6; KVCacheStoreRecvingThread._handle_request).
 * num_load_threads threads serve one shared queue, fed by get_finished (W2).
 *
 * Per job:
 *   token_len = kvpool_cached_tokens; mask_num = floor(vllm_cached / bs) * bs
 *   (bs: the scheduler block size).  For every group, chunks
 *   ceil(mask_num / bs_g) .. cdiv(token_len, bs_g) - 1 that the load mask
 *   keeps (absolute chunk indices) give one key each, keyed by the chunk's
 *   last sub-hash, landing in the block the meta names for that chunk.
 *   The key, value and block lists are rotated by tp_rank % n so that the
 *   ranks of one request start on different keys.
 *
 *   The staging budget (staging_budget_bytes, 0 = none) splits them into
 *   batches of at most that many value bytes; a single value over the
 *   budget fails the whole request: every one of its blocks is an error.
 *   (The original estimates each key's staging bytes with DirectIO padding
 *   and a usable ratio of a 1280 MiB disk buffer; here the budget is the
 *   caller's and a value counts its own bytes.)
 *
 *   One kvp_pool_get per batch.  A key whose result is not KVP_OK, or whose
 *   value is not exactly one block's value bytes, is a load error (its
 *   block id); a failed call makes the whole batch errors.  As in the
 *   original, the first batch with a failure stops the request; unlike it,
 *   the blocks of the batches not tried are reported as errors too (the
 *   original leaves them out, so vLLM would take them as loaded).  A block
 *   counts as loaded (blocks_loaded) only when its whole value arrived with
 *   the right size and, when staged, was copied into the cache.
 *
 *   A meta the original would fail on (hashes that do not cover token_len,
 *   a chunk without a block id) makes every block of its range an error.
 *   The request is ALWAYS reported in done_recving; vLLM recomputes the
 *   error blocks (scenario 28).
 */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/thread.h"
#include "kv/kv_worker_int.h"

/* A staged load's bounce buffer holds one batch: at most this much (or one
 * value), so a long hit does not stage all its bytes at once. */
#define STAGE_MAX (64u << 20)

typedef struct {
    kvp__kvw_keys_t k;
    int64_t *blocks;
    size_t blocks_cap;
    int64_t *errs;
    size_t nerrs, errs_cap;
    kvp_key_t *bkeys;      /* one batch's keys, rotated */
    size_t bkeys_cap;
    int64_t *bblocks;
    size_t bblocks_cap;
    kvp_sgl_t *sgl;
    size_t sgl_cap;
    kvp_iov_t *iov;
    size_t iov_cap;
    kvp_key_result_t *res;
    size_t res_cap;
    uint8_t *stage;
    size_t stage_cap;
    kvp__kv_masks_t masks;
} load_cx_t;

static void cx_free(load_cx_t *cx)
{
    kvp__kvw_keys_free(&cx->k);
    kvp__free(cx->blocks, cx->blocks_cap * sizeof *cx->blocks);
    kvp__free(cx->errs, cx->errs_cap * sizeof *cx->errs);
    kvp__free(cx->bkeys, cx->bkeys_cap * sizeof *cx->bkeys);
    kvp__free(cx->bblocks, cx->bblocks_cap * sizeof *cx->bblocks);
    kvp__free(cx->sgl, cx->sgl_cap * sizeof *cx->sgl);
    kvp__free(cx->iov, cx->iov_cap * sizeof *cx->iov);
    kvp__free(cx->res, cx->res_cap * sizeof *cx->res);
    kvp__free(cx->stage, cx->stage_cap);
    kvp__kv_masks_free(&cx->masks);
}

static void add_err(load_cx_t *cx, int64_t b)
{
    if (kvp__grow_in((void **)&cx->errs, &cx->errs_cap, cx->nerrs + 1, sizeof *cx->errs, 64)) {
        kvp_error("kv worker: out of memory recording a load error");
        return;
    }
    cx->errs[cx->nerrs++] = b;
}

/* Every block of the job's load range is an error (a meta that fails). */
static void range_fails(kvp_kv_worker_t *w, load_cx_t *cx, const kvp__kvw_job_t *j,
                        int64_t mask_num, int64_t token_len)
{
    for (uint32_t g = 0; g < j->num_groups && g < w->ngroups; g++) {
        int64_t bs = w->g[g].block_size;
        for (int64_t c = kvp__kvw_cdiv(mask_num, bs); c < kvp__kvw_cdiv(token_len, bs); c++)
            if ((size_t)c < j->nids[g])
                add_err(cx, j->ids[g][c]);
    }
}

/* The keys and blocks of the job (process_tokens + the load mask); false
 * when the meta cannot be served (logged). */
static bool collect(kvp_kv_worker_t *w, load_cx_t *cx, const kvp__kvw_job_t *j, int64_t mask_num,
                    int64_t token_len)
{
    int64_t hbs = w->p.hash_block_size;
    cx->k.n = 0, cx->k.text_len = 0;
    if (token_len <= 0 || !j->num_groups)
        return true; /* nothing to load */
    if (!j->num_hashes || token_len % hbs || token_len / hbs > (int64_t)j->num_hashes) {
        kvp_warn("kv worker: load of %s: %lld tokens, %zu hashes", j->req_id,
                 (long long)token_len, j->num_hashes);
        return false;
    }
    if (kvp__kv_coord_load_mask(w->coord, j->num_hashes, token_len, &cx->masks) != KVP_OK)
        return false;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        int64_t bs = w->g[g].block_size;
        const kvp__kv_mask_t *mask = &cx->masks.g[g];
        for (int64_t c = kvp__kvw_cdiv(mask_num, bs); c < kvp__kvw_cdiv(token_len, bs); c++) {
            if (!kvp__kv_mask_has(mask, (size_t)c))
                continue;
            if ((size_t)c >= j->nids[g]) {
                kvp_warn("kv worker: load of %s: chunk %lld of group %u has no block", j->req_id,
                         (long long)c, g);
                return false;
            }
            int64_t e = (c + 1) * bs < token_len ? (c + 1) * bs : token_len;
            const uint8_t *h = j->hashes + (size_t)(e / hbs - 1) * j->hash_len;
            if (kvp__grow_in((void **)&cx->blocks, &cx->blocks_cap, cx->k.n + 1,
                             sizeof *cx->blocks, 64))
                return false;
            cx->blocks[cx->k.n] = j->ids[g][c];
            if (kvp__kvw_keys_add(&cx->k, w, g, h, j->hash_len) != KVP_OK)
                return false;
        }
    }
    kvp__kvw_keys_seal(&cx->k);
    return true;
}

/* One batch: keys [first, first + n) of the rotated order.  Returns the
 * number of blocks that failed (0: all loaded and verified). */
static size_t get_batch(kvp_kv_worker_t *w, load_cx_t *cx, const char *req_id, size_t rot,
                        size_t first, size_t n)
{
    size_t total = cx->k.n, nseg = w->nsegs, vb = w->value_bytes;
    if (kvp__grow_in((void **)&cx->bkeys, &cx->bkeys_cap, n, sizeof *cx->bkeys, 64) ||
        kvp__grow_in((void **)&cx->bblocks, &cx->bblocks_cap, n, sizeof *cx->bblocks, 64) ||
        kvp__grow_in((void **)&cx->sgl, &cx->sgl_cap, n, sizeof *cx->sgl, 64) ||
        kvp__grow_in((void **)&cx->iov, &cx->iov_cap, n * nseg, sizeof *cx->iov, 64) ||
        kvp__grow_in((void **)&cx->res, &cx->res_cap, n, sizeof *cx->res, 64) ||
        (!w->copy.direct && kvp__grow_in((void **)&cx->stage, &cx->stage_cap, n * vb, 1, 1))) {
        kvp_error("kv worker: load of %s: out of memory for %zu blocks", req_id, n);
        for (size_t i = 0; i < n; i++)
            add_err(cx, cx->blocks[(rot + first + i) % total]);
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        size_t src = (rot + first + i) % total;
        cx->bkeys[i] = cx->k.keys[src];
        cx->bblocks[i] = cx->blocks[src];
        kvp_iov_t *iov = cx->iov + i * nseg;
        if (w->copy.direct) {
            kvp__kvw_block_iov(w, cx->bblocks[i], iov);
            cx->sgl[i].iov = iov, cx->sgl[i].iovcnt = (uint32_t)nseg;
        } else {
            iov->base = cx->stage + i * vb, iov->len = vb;
            cx->sgl[i].iov = iov, cx->sgl[i].iovcnt = 1;
        }
    }
    kvp_status_t st = kvp__kvw_call(w, KVP_OP_GET, cx->bkeys, n, cx->sgl, cx->res, NULL);
    if (st != KVP_OK) {
        kvp_warn_rl("kv worker: load of %s: get of %zu keys: %s", req_id, n, kvp_status_str(st));
        for (size_t i = 0; i < n; i++)
            add_err(cx, cx->bblocks[i]);
        return n;
    }
    size_t failed = 0;
    kvp_status_t first_bad = KVP_OK;
    for (size_t i = 0; i < n; i++) {
        bool ok = cx->res[i].status == KVP_OK && cx->res[i].size == vb;
        if (ok && !w->copy.direct)
            ok = kvp__kvw_stage_in(w, cx->bblocks[i], cx->stage + i * vb) == KVP_OK;
        if (ok)
            continue;
        if (first_bad == KVP_OK)
            first_bad = cx->res[i].status != KVP_OK ? cx->res[i].status : KVP_ERR_BAD_SIZE;
        failed++;
        add_err(cx, cx->bblocks[i]);
    }
    atomic_fetch_add(&w->c.blocks_loaded, n - failed);
    atomic_fetch_add(&w->c.bytes_loaded, (uint64_t)(n - failed) * vb);
    if (failed)
        kvp_warn_rl("kv worker: load of %s: %zu of %zu keys failed (first: %s)", req_id, failed, n,
                    kvp_status_str(first_bad));
    return failed;
}

static void handle(kvp_kv_worker_t *w, load_cx_t *cx, const kvp__kvw_job_t *j)
{
    int64_t bs = w->p.block_size, token_len = j->load_spec.kvpool_cached_tokens;
    int64_t vc = j->load_spec.vllm_cached_tokens;
    int64_t mask_num = vc > 0 ? vc / bs * bs : 0;
    cx->nerrs = 0;
    if (!collect(w, cx, j, mask_num, token_len)) {
        atomic_fetch_add(&w->c.bad_metas, 1);
        range_fails(w, cx, j, mask_num, token_len);
    } else if (cx->k.n) {
        size_t n = cx->k.n, rot = w->p.tp_rank % n, vb = w->value_bytes;
        uint64_t budget = w->p.staging_budget_bytes;
        size_t per = KVP_BATCH_MAX;
        if (budget && budget / vb < per)
            per = (size_t)(budget / vb);
        if (!w->copy.direct && per > 1 && per * vb > STAGE_MAX) /* the bounce buffer's size */
            per = STAGE_MAX / vb > 1 ? STAGE_MAX / vb : 1;
        if (per == 0) { /* one value over the budget: the whole request fails */
            kvp_warn("kv worker: load of %s: a value of %zu B exceeds the staging budget %llu B",
                     j->req_id, vb, (unsigned long long)budget);
            for (size_t i = 0; i < n; i++)
                add_err(cx, cx->blocks[i]);
        } else {
            size_t first = 0;
            for (; first < n; first += per) {
                size_t m = n - first < per ? n - first : per;
                if (get_batch(w, cx, j->req_id, rot, first, m)) {
                    first += per;
                    break;
                }
            }
            for (; first < n; first++) /* the batches never tried */
                add_err(cx, cx->blocks[(rot + first) % n]);
        }
    }
    kvp__kvw_load_report(w, j->sync ? NULL : j->req_id, cx->errs, cx->nerrs);
}

void *kvp__kvw_load_main(void *arg)
{
    kvp_kv_worker_t *w = arg;
    kvp__thread_name("kvp-kv-load");
    load_cx_t cx;
    memset(&cx, 0, sizeof cx);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->load_q.n && !w->stopping)
            pthread_cond_wait(&w->load_cv, &w->mu);
        if (!w->load_q.n)
            break;
        kvp__kvw_job_t *j = kvp__kvw_pop(&w->load_q);
        atomic_store(&w->c.load_queue_depth, w->load_q.n);
        pthread_mutex_unlock(&w->mu);
        handle(w, &cx, j);
        bool sync = j->sync;
        kvp__kvw_job_free(j);
        atomic_fetch_add(&w->c.loads_done, 1);
        pthread_mutex_lock(&w->mu);
        if (sync && --w->sync_pending == 0)
            pthread_cond_broadcast(&w->idle_cv);
    }
    pthread_mutex_unlock(&w->mu);
    cx_free(&cx);
    return NULL;
}
