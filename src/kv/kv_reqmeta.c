/*
 * RequestTracker and ReqMeta.from_request_tracker (§2.5), and the snapshot of
 * a step's metadata that build_connector_meta returns.
 */
#include <string.h>

#include "common/alloc.h"
#include "kv/kv_sched_int.h"

void kvp__kv_tracker_clear(kvp__kv_tracker_t *tr)
{
    kvp__kv_btuple_unref(tr->blocks);
    kvp__kv_tokens_unref(tr->token_ids);
    memset(tr, 0, sizeof *tr);
}

kvp_status_t kvp__kv_pmeta_push(kvp_kv_sched_t *s, const kvp__kv_pmeta_t *pm)
{
    kvp__kv_metabuf_t *mb = &s->mb;
    if (kvp__grow_in((void **)&mb->pm, &mb->pm_cap, mb->npm + 1, sizeof *mb->pm, 16)) {
        kvp__kv_btuple_unref(pm->blocks);
        kvp__kv_tokens_unref(pm->token_ids);
        return KVP_ERR_NO_MEMORY;
    }
    mb->pm[mb->npm++] = *pm;
    return KVP_OK;
}

/*
 * from_request_tracker, step by step as §2.5 states it:
 *   boundary = ceil((saved+1)/bs)*bs; to_save = floor(token_len/bs)*bs
 *   skip = skip_save or to_save < boundary; skip = True if the load spec can
 *   load (a meta never both loads and saves); skip and no load spec -> None;
 *   not skip -> tracker.num_saved_tokens = to_save (side effect); the load
 *   spec is kept only if it can load; token_ids only if non-empty.
 */
kvp_status_t kvp__kv_from_tracker(kvp_kv_sched_t *s, kvp__kv_rec_t *rec,
                                  const kvp_kv_load_spec_t *ls, bool skip_save,
                                  const kvp_kv_request_t *req, int8_t is_last_chunk)
{
    kvp__kv_tracker_t *tr = &rec->tr;
    int64_t bs = s->cfg.block_size;
    /* boundary = ceil((saved + 1) / bs) * bs, in 128 bits (no overflow) */
    __int128 x = (__int128)tr->num_saved_tokens + 1;
    __int128 q = x / bs;
    if (x % bs != 0 && x > 0)
        q++;
    __int128 boundary = q * bs;
    int64_t to_save = kvp__floordiv(tr->token_len, bs) * bs;
    bool skip = skip_save || (__int128)to_save < boundary;
    bool can_load = ls && ls->can_load;
    if (can_load)
        skip = true;
    if (skip && !ls)
        return KVP_OK;
    if (!skip)
        tr->num_saved_tokens = to_save;
    kvp__kv_pmeta_t pm = {
        .rec = rec,
        .req = req,
        .token_len_chunk = to_save,
        .blocks = kvp__kv_btuple_ref(tr->blocks),
        .token_ids = kvp__kv_tokens_ref(tr->token_ids),
        .can_save = !skip,
        .is_last_chunk = is_last_chunk,
        .has_ls = can_load,
        .num_prompt_tokens = tr->prefill_end_tokens,
    };
    if (can_load)
        pm.ls = *ls;
    return kvp__kv_pmeta_push(s, &pm);
}

void kvp__kv_metabuf_release(kvp__kv_metabuf_t *mb)
{
    for (size_t i = 0; i < mb->npm; i++) {
        kvp__kv_btuple_unref(mb->pm[i].blocks);
        kvp__kv_tokens_unref(mb->pm[i].token_ids);
    }
    mb->npm = 0;
    memset(&mb->meta, 0, sizeof mb->meta);
}

void kvp__kv_metabuf_cleanup(kvp__kv_metabuf_t *mb)
{
    kvp__kv_metabuf_release(mb);
#define FREE_ARR(p, cap) \
    if (p)               \
    kvp__free((void *)(p), (cap) * sizeof *(p))
    FREE_ARR(mb->pm, mb->pm_cap);
    FREE_ARR(mb->rm, mb->rm_cap);
    FREE_ARR(mb->groups, mb->groups_cap);
    FREE_ARR(mb->tails, mb->tails_cap);
    FREE_ARR(mb->unf, mb->unf_cap);
    FREE_ARR(mb->pre, mb->pre_cap);
    FREE_ARR(mb->strs, mb->strs_cap);
#undef FREE_ARR
    memset(mb, 0, sizeof *mb);
}

kvp_status_t kvp__kv_metabuf_snapshot(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so)
{
    kvp__kv_metabuf_t *mb = &s->mb;
    size_t ngroups = 0, ntails = 0, nstr = 0;
    for (size_t i = 0; i < mb->npm; i++) {
        const kvp__kv_btuple_t *b = mb->pm[i].blocks;
        if (b)
            ngroups += b->num_groups;
        ntails += mb->pm[i].ntails;
    }
    for (size_t i = 0; i < so->num_preempted; i++)
        nstr += strlen(so->preempted_req_ids[i]) + 1;
    if (kvp__grow_in((void **)&mb->rm, &mb->rm_cap, mb->npm, sizeof *mb->rm, 16) ||
        kvp__grow_in((void **)&mb->groups, &mb->groups_cap, ngroups, sizeof *mb->groups, 16) ||
        kvp__grow_in((void **)&mb->tails, &mb->tails_cap, ntails, sizeof *mb->tails, 16) ||
        kvp__grow_in((void **)&mb->unf, &mb->unf_cap, s->num_uids, sizeof *mb->unf, 16) ||
        kvp__grow_in((void **)&mb->pre, &mb->pre_cap, so->num_preempted, sizeof *mb->pre, 16) ||
        kvp__grow_in((void **)&mb->strs, &mb->strs_cap, nstr, 1, 16))
        return KVP_ERR_NO_MEMORY;
    size_t gi = 0, ti = 0;
    for (size_t i = 0; i < mb->npm; i++) {
        const kvp__kv_pmeta_t *pm = &mb->pm[i];
        kvp_kv_req_meta_t *rm = &mb->rm[i];
        memset(rm, 0, sizeof *rm);
        rm->req_id = pm->rec->id;
        rm->token_len_chunk = pm->token_len_chunk;
        if (pm->blocks) {
            rm->block_ids.groups = mb->groups + gi;
            rm->block_ids.num_groups = pm->blocks->num_groups;
            for (uint32_t g = 0; g < pm->blocks->num_groups; g++) {
                /* a view of the tracker's list: the meta holds a reference
                 * to the tuple, and nothing changes its lists before the
                 * next build_connector_meta */
                mb->groups[gi].ids = pm->blocks->g[g].ids;
                mb->groups[gi].n = pm->blocks->g[g].n;
                gi++;
            }
        }
        if (pm->req) {
            rm->block_hashes = pm->req->block_hashes;
            rm->num_block_hashes = pm->req->num_block_hashes;
            rm->hash_len = pm->req->hash_len;
        }
        rm->can_save = pm->can_save;
        rm->is_last_chunk = pm->is_last_chunk;
        rm->has_load_spec = pm->has_ls;
        rm->load_spec = pm->ls;
        rm->num_prompt_tokens = pm->num_prompt_tokens;
        if (pm->token_ids) {
            rm->token_ids = pm->token_ids->v;
            rm->num_token_ids = pm->token_ids->n;
            rm->has_token_ids = true;
        }
        if (pm->ntails) {
            memcpy(mb->tails + ti, pm->tails, pm->ntails * sizeof *mb->tails);
            rm->partial_tail_offloads = mb->tails + ti;
            rm->num_partial_tail_offloads = pm->ntails;
            ti += pm->ntails;
        }
    }
    for (size_t i = 0; i < s->num_uids; i++)
        mb->unf[i] = s->uids[i]->id;
    size_t off = 0;
    for (size_t i = 0; i < so->num_preempted; i++) {
        size_t l = strlen(so->preempted_req_ids[i]) + 1;
        memcpy(mb->strs + off, so->preempted_req_ids[i], l);
        mb->pre[i] = mb->strs + off;
        off += l;
    }
    mb->meta.unfinished_req_ids = mb->unf;
    mb->meta.num_unfinished = s->num_uids;
    mb->meta.preempted_req_ids = mb->pre;
    mb->meta.num_preempted = so->num_preempted;
    mb->meta.requests = mb->rm;
    mb->meta.num_requests = mb->npm;
    return KVP_OK;
}
