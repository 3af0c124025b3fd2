/*
 * The save thread (W4, W7; KVCacheStoreSendingThread._handle_request and
 * _maybe_offload_partial_tail).  One thread, fed by get_finished (W3).
 *
 * Per job:
 *   token_len = floor(token_len_chunk / lcm) * lcm (the scheduler block
 *   size is the lcm of the group sizes).  A request no longer in
 *   stored_requests (finished and reported, or preempted) is skipped
 *   without touching its count.  Otherwise, and whatever happens next, the
 *   job ends with stored_requests[req] -= 1:
 *     - a request skipped for store pressure is not saved (pressure_skips);
 *     - the partial tail first (W7); its failure ends the job;
 *     - token_len 0: nothing more;
 *     - chunks from ceil(save_start / bs), save_start = the request's
 *       high-water mark, filtered by the store mask (relative to the first
 *       chunk) and the put stride: rank r of a group with replication
 *       factor f (MLA: f = tp_size) writes chunk c only if
 *       c % f == (tp_rank + g) % f, so ranks holding identical bytes split
 *       the writes instead of repeating them;
 *     - one batched exists dedups (blocks_deduped); nothing missing: the
 *       high-water mark moves to token_len;
 *     - the missing blocks go in ONE put, each value a scatter list over
 *       every segment (staged through a bounce buffer when the copy seam
 *       is not direct);
 *     - every key OK (stored, or existed by a race): the mark moves to
 *       token_len and store pressure clears; any KVP_ERR_NO_SPACE (the
 *       counterpart of Mooncake's -200) marks the request pressure-skipped
 *       until some later batch, of any request, succeeds (scenario 27);
 *       the mark does not move, so the range is retried; other failures
 *       are logged and counted (save_errors).
 *
 * Pressure, without a set to clear.  The original keeps a set of skipped
 * ids and clears it whole when a batch succeeds.  Here each stored entry
 * carries `skipped` and the epoch it was marked in; a success bumps
 * w->pressure_epoch, which un-skips every entry at once.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/thread.h"
#include "kv/kv_worker_int.h"

/* The save thread's scratch, reused across jobs. */
typedef struct {
    kvp__kvw_keys_t k;
    int64_t *blocks;       /* block id of each key */
    size_t blocks_cap;
    uint8_t *present;
    size_t present_cap;
    kvp_key_t *mkeys;      /* the missing keys */
    size_t mkeys_cap;
    kvp_sgl_t *sgl;
    size_t sgl_cap;
    kvp_iov_t *iov;
    size_t iov_cap;
    kvp_key_result_t *res;
    size_t res_cap;
    uint8_t *stage;        /* bounce buffer (staged copies) */
    size_t stage_cap;
    kvp__kv_masks_t masks;
} save_cx_t;

static void cx_free(save_cx_t *cx)
{
    kvp__kvw_keys_free(&cx->k);
    kvp__free(cx->blocks, cx->blocks_cap * sizeof *cx->blocks);
    kvp__free(cx->present, cx->present_cap);
    kvp__free(cx->mkeys, cx->mkeys_cap * sizeof *cx->mkeys);
    kvp__free(cx->sgl, cx->sgl_cap * sizeof *cx->sgl);
    kvp__free(cx->iov, cx->iov_cap * sizeof *cx->iov);
    kvp__free(cx->res, cx->res_cap * sizeof *cx->res);
    kvp__free(cx->stage, cx->stage_cap);
    kvp__kv_masks_free(&cx->masks);
}

static void cx_reset(save_cx_t *cx)
{
    cx->k.n = 0;
    cx->k.text_len = 0;
}

static kvp_status_t add_key(save_cx_t *cx, const kvp_kv_worker_t *w, uint32_t g,
                            const uint8_t *hash, uint32_t hash_len, int64_t block)
{
    if (kvp__grow_in((void **)&cx->blocks, &cx->blocks_cap, cx->k.n + 1, sizeof *cx->blocks, 64))
        return KVP_ERR_NO_MEMORY;
    cx->blocks[cx->k.n] = block;
    return kvp__kvw_keys_add(&cx->k, w, g, hash, hash_len);
}

typedef enum { PUT_ALL_OK, PUT_NO_SPACE, PUT_FAILED } put_outcome_t;

/* Pressure state (w->mu taken here). */
static void mark_pressure(kvp_kv_worker_t *w, const char *req_id)
{
    pthread_mutex_lock(&w->mu);
    kvp__kvw_stored_t *e = kvp__strmap_get(&w->stored, req_id, strlen(req_id));
    bool already = e && e->skipped && e->skip_epoch == w->pressure_epoch;
    w->pressure_active = true;
    if (e)
        e->skipped = true, e->skip_epoch = w->pressure_epoch;
    pthread_mutex_unlock(&w->mu);
    if (!already)
        kvp_warn("kv worker: store pressure (no space); saves of %s paused until a later batch "
                 "succeeds", req_id);
}

static void clear_pressure(kvp_kv_worker_t *w)
{
    pthread_mutex_lock(&w->mu);
    if (w->pressure_active)
        kvp_info("kv worker: store pressure cleared");
    w->pressure_active = false;
    w->pressure_epoch++;
    pthread_mutex_unlock(&w->mu);
}

/* _record_saved: only while the request is still stored (a concurrent
 * finish or preemption is not recreated). */
static void record_saved(kvp_kv_worker_t *w, const char *req_id, int64_t token_len)
{
    pthread_mutex_lock(&w->mu);
    kvp__kvw_stored_t *e = kvp__strmap_get(&w->stored, req_id, strlen(req_id));
    if (e)
        e->saved_offset = token_len;
    pthread_mutex_unlock(&w->mu);
}

/* The keys in cx (cx->k, cx->blocks): one exists, then one put of the
 * missing ones.  PUT_ALL_OK also when nothing was missing. */
static put_outcome_t put_missing(kvp_kv_worker_t *w, save_cx_t *cx, const char *req_id)
{
    size_t n = cx->k.n, nseg = w->nsegs;
    kvp__kvw_keys_seal(&cx->k);
    if (kvp__grow_in((void **)&cx->present, &cx->present_cap, n, 1, 64))
        return PUT_FAILED;
    kvp_status_t st = kvp__kvw_call(w, KVP_OP_EXISTS, cx->k.keys, n, NULL, NULL, cx->present);
    if (st != KVP_OK) {
        kvp_warn_rl("kv worker: save of %s: exists of %zu keys: %s", req_id, n, kvp_status_str(st));
        atomic_fetch_add(&w->c.save_errors, n);
        return PUT_FAILED;
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (cx->present[i] != 1) /* compact the missing ones to the front */
            cx->k.keys[m] = cx->k.keys[i], cx->blocks[m] = cx->blocks[i], m++;
    atomic_fetch_add(&w->c.blocks_deduped, n - m);
    if (m == 0)
        return PUT_ALL_OK;
    if (kvp__grow_in((void **)&cx->sgl, &cx->sgl_cap, m, sizeof *cx->sgl, 64) ||
        kvp__grow_in((void **)&cx->iov, &cx->iov_cap, m * nseg, sizeof *cx->iov, 64) ||
        kvp__grow_in((void **)&cx->res, &cx->res_cap, m, sizeof *cx->res, 64) ||
        (!w->copy.direct &&
         kvp__grow_in((void **)&cx->stage, &cx->stage_cap, m * w->value_bytes, 1, 1))) {
        kvp_error("kv worker: save of %s: out of memory for %zu blocks", req_id, m);
        atomic_fetch_add(&w->c.save_errors, m);
        return PUT_FAILED;
    }
    for (size_t i = 0; i < m; i++) {
        kvp_iov_t *iov = cx->iov + i * nseg;
        if (w->copy.direct) {
            kvp__kvw_block_iov(w, cx->blocks[i], iov);
            cx->sgl[i].iov = iov, cx->sgl[i].iovcnt = (uint32_t)nseg;
            continue;
        }
        uint8_t *buf = cx->stage + i * w->value_bytes;
        st = kvp__kvw_stage_out(w, cx->blocks[i], buf);
        if (st != KVP_OK) {
            kvp_warn_rl("kv worker: save of %s: copy to host failed: %s", req_id, kvp_status_str(st));
            atomic_fetch_add(&w->c.save_errors, m);
            return PUT_FAILED;
        }
        iov->base = buf, iov->len = w->value_bytes;
        cx->sgl[i].iov = iov, cx->sgl[i].iovcnt = 1;
    }
    st = kvp__kvw_call(w, KVP_OP_PUT, cx->k.keys, m, cx->sgl, cx->res, NULL);
    if (st != KVP_OK) { /* the original's exception: only logged */
        kvp_warn_rl("kv worker: save of %s: put of %zu keys: %s", req_id, m, kvp_status_str(st));
        atomic_fetch_add(&w->c.save_errors, m);
        return PUT_FAILED;
    }
    size_t failed = 0, saved = 0;
    bool no_space = false;
    for (size_t i = 0; i < m; i++) {
        if (cx->res[i].status != KVP_OK) {
            failed++;
            no_space |= cx->res[i].status == KVP_ERR_NO_SPACE;
        } else if (cx->res[i].flags & KVP_RESULT_EXISTED) {
            atomic_fetch_add(&w->c.blocks_deduped, 1);
        } else {
            saved++;
        }
    }
    atomic_fetch_add(&w->c.blocks_saved, saved);
    atomic_fetch_add(&w->c.bytes_saved, saved * w->value_bytes);
    if (!failed)
        return PUT_ALL_OK;
    atomic_fetch_add(&w->c.save_errors, failed);
    kvp_warn_rl("kv worker: save of %s: %zu of %zu keys failed%s", req_id, failed, m,
                no_space ? " (no space)" : "");
    if (no_space) {
        mark_pressure(w, req_id);
        return PUT_NO_SPACE;
    }
    return PUT_FAILED;
}

/* W7 (_maybe_offload_partial_tail): true when nothing needs putting or
 * every put succeeded. */
static bool partial_tail(kvp_kv_worker_t *w, save_cx_t *cx, const kvp__kvw_job_t *j, int64_t saved)
{
    if (!kvp__kv_coord_partial(w->coord) || !j->num_hashes || !j->num_tails)
        return true;
    int64_t boundary = j->tails[0].boundary_tokens, hbs = w->p.hash_block_size;
    for (size_t i = 1; i < j->num_tails; i++)
        if (j->tails[i].boundary_tokens != boundary) {
            kvp_warn("kv worker: %s: partial-tail offloads with different boundaries", j->req_id);
            return false; /* the original's ValueError */
        }
    if (boundary <= 0 || boundary / hbs - 1 >= (int64_t)j->num_hashes)
        return true;
    if (j->num_groups != w->ngroups)
        return true;
    cx_reset(cx);
    for (uint32_t g = 0; g < w->ngroups; g++) {
        int64_t bs = w->g[g].block_size, step = w->factor[g];
        int64_t rank = (int64_t)((w->p.tp_rank + g) % w->factor[g]);
        int64_t last = kvp__kvw_cdiv(boundary, bs) - 1;
        int64_t from = saved / bs < last ? saved / bs : last;
        for (int64_t i = from; i <= last; i++) {
            if (i % step != rank)
                continue;
            int64_t end = (i + 1) * bs < boundary ? (i + 1) * bs : boundary;
            if (end < hbs)
                continue;
            int64_t block = -1;
            for (size_t t = 0; t < j->num_tails; t++) /* the dict: the last entry wins */
                if (j->tails[t].group_id == g && end == boundary && boundary % bs)
                    block = j->tails[t].cow_block_id;
            if (block < 0) {
                if ((size_t)i >= j->nids[g])
                    continue;
                block = j->ids[g][i];
            }
            if (block == KVP_KVW_NULL_BLOCK)
                continue;
            const uint8_t *h = j->hashes + (size_t)(end / hbs - 1) * j->hash_len;
            if (add_key(cx, w, g, h, j->hash_len, block) != KVP_OK)
                return false;
        }
    }
    if (!cx->k.n)
        return true;
    if (put_missing(w, cx, j->req_id) != PUT_ALL_OK)
        return false;
    clear_pressure(w);
    return true;
}

/* Collects the normal save's chunks (process_tokens for every group);
 * false on a meta the original would fail on (logged). */
static bool collect_chunks(kvp_kv_worker_t *w, save_cx_t *cx, const kvp__kvw_job_t *j,
                           int64_t token_len, int64_t save_start)
{
    int64_t hbs = w->p.hash_block_size;
    if (!j->num_hashes)
        return true; /* process_tokens yields nothing */
    if (token_len % hbs || token_len / hbs > (int64_t)j->num_hashes) {
        kvp_warn("kv worker: save of %s: %lld tokens, %zu hashes", j->req_id,
                 (long long)token_len, j->num_hashes);
        return false;
    }
    if (kvp__kv_coord_store_mask(w->coord, token_len, save_start, j->num_prompt_tokens,
                                 &cx->masks) != KVP_OK)
        return false;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        int64_t bs = w->g[g].block_size, step = w->factor[g];
        int64_t rank = (int64_t)((w->p.tp_rank + g) % w->factor[g]);
        const kvp__kv_mask_t *mask = &cx->masks.g[g];
        int64_t start = kvp__kvw_cdiv(save_start, bs), max = kvp__kvw_cdiv(token_len, bs);
        if (!mask->all && max > start + (int64_t)mask->len)
            max = start + (int64_t)mask->len;
        for (int64_t c = start; c < max; c++) {
            if (!kvp__kv_mask_has(mask, (size_t)(c - start)) || c % step != rank)
                continue;
            int64_t s = c * bs, e = s + bs < token_len ? s + bs : token_len;
            if ((size_t)c >= j->nids[g]) {
                kvp_warn("kv worker: save of %s: chunk %lld of group %u has no block", j->req_id,
                         (long long)c, g);
                return false;
            }
            const uint8_t *h = j->hashes + (size_t)(e / hbs - 1) * j->hash_len;
            if (add_key(cx, w, g, h, j->hash_len, j->ids[g][c]) != KVP_OK)
                return false;
        }
    }
    return true;
}

static void handle(kvp_kv_worker_t *w, save_cx_t *cx, const kvp__kvw_job_t *j)
{
    int64_t lcm = w->p.block_size;
    int64_t token_len = j->token_len_chunk > 0 ? j->token_len_chunk / lcm * lcm : 0;
    size_t idlen = strlen(j->req_id);
    pthread_mutex_lock(&w->mu);
    kvp__kvw_stored_t *e = kvp__strmap_get(&w->stored, j->req_id, idlen);
    bool skip = e && w->pressure_active && e->skipped && e->skip_epoch == w->pressure_epoch;
    int64_t saved = e ? e->saved_offset : 0;
    pthread_mutex_unlock(&w->mu);
    if (!e)
        return;
    if (skip) {
        kvp_debug("kv worker: save of %s skipped (store pressure)", j->req_id);
        atomic_fetch_add(&w->c.pressure_skips, 1);
    } else if (j->tails && !partial_tail(w, cx, j, saved)) {
        /* a failed partial tail ends the job */
    } else if (token_len > 0 && j->num_groups == w->ngroups) { /* () carries no block */
        cx_reset(cx);
        if (collect_chunks(w, cx, j, token_len, saved)) {
            if (!cx->k.n) {
                record_saved(w, j->req_id, token_len);
            } else if (put_missing(w, cx, j->req_id) == PUT_ALL_OK) {
                record_saved(w, j->req_id, token_len);
                clear_pressure(w);
            }
        } else {
            atomic_fetch_add(&w->c.bad_metas, 1);
        }
    }
    pthread_mutex_lock(&w->mu); /* always: stored_requests[req] -= 1 */
    e = kvp__strmap_get(&w->stored, j->req_id, idlen);
    if (e)
        e->count--;
    pthread_mutex_unlock(&w->mu);
}

void *kvp__kvw_save_main(void *arg)
{
    kvp_kv_worker_t *w = arg;
    kvp__thread_name("kvp-kv-save");
    save_cx_t cx;
    memset(&cx, 0, sizeof cx);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->save_q.n && !w->stopping)
            pthread_cond_wait(&w->save_cv, &w->mu);
        if (!w->save_q.n) /* stopping, and every queued save handled */
            break;
        kvp__kvw_job_t *j = kvp__kvw_pop(&w->save_q);
        w->save_q_bytes -= j->queued_bytes;
        atomic_store(&w->c.save_queue_depth, w->save_q.n);
        atomic_store(&w->c.save_queue_bytes, w->save_q_bytes);
        w->save_running = true;
        pthread_mutex_unlock(&w->mu);
        handle(w, &cx, j);
        kvp__kvw_job_free(j);
        atomic_fetch_add(&w->c.saves_done, 1);
        pthread_mutex_lock(&w->mu);
        w->save_running = false;
        pthread_cond_broadcast(&w->idle_cv);
    }
    pthread_mutex_unlock(&w->mu);
    cx_free(&cx);
    return NULL;
}
