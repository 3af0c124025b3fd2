/*
 * Step 3 of an engine step (engine.c): which requests compute how many
 * tokens.  The running requests first, in order, a prefill chunk or one
 * decode token each within the token budget; when blocks run out the last
 * running request is preempted (its blocks freed, recomputed later).  Then,
 * if nothing was preempted, the waiting requests in order: the local prefix
 * cache, then the connector's get_num_new_matched_tokens; an async hit gets
 * its blocks and waits for its load, a sync hit is loaded before the
 * forward pass; the queue stops at the first request that does not fit.
 */
#include <inttypes.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "engine/content.h"
#include "engine/engine_int.h"

static size_t running_count(const kvp__eng_t *e)
{
    size_t n = 0;
    KVP_LIST_FOR_EACH(x, &e->running) n++;
    return n;
}

static kvp_status_t preempt(kvp__eng_t *e, step_t *s, rq_t *q)
{
    kvp__list_del(&q->node);
    kvp__rq_free_blocks(e, q);
    q->num_computed = 0;
    q->resumed = true;
    q->scheduled = 0;
    kvp__rq_set_state(q, RQ_WAITING);
    kvp__list_add_head(&e->waiting, &q->node);
    kvp__rq_sync_view(q);
    e->stats.preemptions++;
    s->preempted_any = true;
    return kvp__eng_push((void ***)&s->preempted, &s->npreempted, &s->cap_preempted, (void *)q->id)
               ? KVP_OK
               : KVP_ERR_NO_MEMORY;
}

/* Step 3a: the running requests. */
kvp_status_t kvp__eng_schedule_running(kvp__eng_t *e, step_t *s)
{
    int64_t bs = e->p.block_size;
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &e->running) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        if (s->budget <= 0)
            break;
        int64_t want = q->num_tokens - q->num_computed;
        if (want > s->budget)
            want = s->budget;
        if (want <= 0)
            continue;
        int64_t need = (q->num_computed + want + bs - 1) / bs - q->nblocks;
        bool self = false;
        while (need > e->bp.num_free) {
            rq_t *victim = KVP_CONTAINER_OF(e->running.prev, rq_t, node);
            self = victim == q;
            kvp_status_t st = preempt(e, s, victim);
            if (st != KVP_OK)
                return st;
            if (self)
                break;
        }
        if (self)
            break;
        q->new_from = q->nblocks;
        kvp_status_t st = kvp__rq_alloc(e, q, need);
        if (st != KVP_OK)
            return st;
        q->scheduled = want;
        s->budget -= want;
        if (!kvp__eng_push((void ***)&s->sched, &s->nsched, &s->cap_sched, q))
            return KVP_ERR_NO_MEMORY;
        tmp = q->node.next; /* a preemption may have removed what came next */
    }
    return KVP_OK;
}

/* Step 3b: one waiting request; *stop_p: the queue stops here. */
static kvp_status_t schedule_waiting_one(kvp__eng_t *e, step_t *s, rq_t *q, bool *stop_p)
{
    int64_t bs = e->p.block_size;
    int64_t local = 0, ext = 0;
    bool async = false;
    int64_t hit_ids_n = 0;
    int64_t *hit_ids = NULL;
    bool fresh = q->nblocks == 0; /* else: back from an async load, blocks held */
    if (fresh) {
        int64_t nfull = (q->num_tokens - 1) / bs;
        if (nfull > q->num_hashes)
            nfull = q->num_hashes;
        hit_ids = kvp__arena_alloc(&e->scratch, (size_t)(nfull + 1) * sizeof *hit_ids);
        if (!hit_ids)
            return KVP_ERR_NO_MEMORY;
        hit_ids_n = kvp__bp_lookup(&e->bp, q->r->hashes, nfull, hit_ids);
        local = hit_ids_n * bs;
        if (e->sched) {
            kvp__rq_sync_view(q);
            int64_t num = 0;
            kvp_status_t st = kvp_kv_sched_get_num_new_matched_tokens(e->sched, &q->view, local,
                                                                      &num, &async);
            if (st != KVP_OK)
                return st;
            if (num < 0)
                return KVP_OK; /* the lookup is not back yet: ask again next step */
            ext = num;
        }
    }
    int64_t computed = fresh ? local + ext : q->num_computed;
    int64_t want = q->num_tokens - computed;
    bool wait_remote = async && ext > 0;
    if (wait_remote)
        want = 0;
    else if (want > s->budget)
        want = s->budget;
    int64_t have = q->nblocks + hit_ids_n;
    int64_t need = (computed + want + bs - 1) / bs - have;
    /* hits in the free queue are taken first: they may be what is free */
    int64_t free_hits = 0;
    for (int64_t i = 0; i < hit_ids_n; i++)
        free_hits += e->bp.blocks[hit_ids[i]].ref == 0;
    if (need > e->bp.num_free - free_hits) {
        *stop_p = true;
        return KVP_OK;
    }
    if (hit_ids_n) {
        if (!kvp__rq_grow_blocks(q, q->nblocks + hit_ids_n))
            return KVP_ERR_NO_MEMORY;
        kvp__bp_touch(&e->bp, hit_ids, hit_ids_n);
        memcpy(q->blocks + q->nblocks, hit_ids, (size_t)hit_ids_n * sizeof *hit_ids);
        q->nblocks += hit_ids_n;
        q->cached_blocks = hit_ids_n;
    }
    q->new_from = 0;
    kvp_status_t st = kvp__rq_alloc(e, q, need);
    if (st != KVP_OK)
        return st;
    if (!q->counted) {
        q->counted = true;
        q->count_pool = true;
        e->stats.requests++;
        e->stats.prompt_tokens += (uint64_t)q->r->prompt_len;
        e->stats.local_hit_tokens += (uint64_t)local;
        q->r->point->prompt_tokens = (uint32_t)q->r->prompt_len;
        q->r->point->hit_tokens = (uint32_t)local;
    }
    if (e->sched) {
        kvp_kv_ids_t ids = {q->blocks, (size_t)q->nblocks};
        kvp_kv_blocks_t blocks = {&ids, 1};
        kvp__rq_sync_view(q);
        st = kvp_kv_sched_update_state_after_alloc(e->sched, &q->view, &blocks, ext);
        if (st != KVP_OK)
            return st;
    }
    if (ext > 0) {
        q->load_from = local;
        q->load_to = local + ext;
        q->rollback = INT64_MAX;
        q->recv_count = 0;
        q->load_issued = false;
        q->load_sync = !wait_remote;
    }
    kvp__list_del(&q->node);
    if (wait_remote) {
        kvp__rq_set_state(q, RQ_WAITING_REMOTE);
        kvp__list_add_tail(&e->waiting, &q->node); /* (the caller walks a snapshot) */
        return KVP_OK;
    }
    q->num_computed = computed;
    q->scheduled = want;
    q->is_new = !q->resumed;
    s->budget -= want;
    if (ext > 0 && !kvp__eng_push((void ***)&s->sync, &s->nsync, &s->cap_sync, q))
        return KVP_ERR_NO_MEMORY;
    kvp__rq_set_state(q, RQ_RUNNING);
    kvp__list_add_tail(&e->running, &q->node);
    return kvp__eng_push((void ***)&s->sched, &s->nsched, &s->cap_sched, q) ? KVP_OK : KVP_ERR_NO_MEMORY;
}

kvp_status_t kvp__eng_schedule_waiting(kvp__eng_t *e, step_t *s)
{
    /* a snapshot of the queue: scheduling moves requests around in it */
    size_t n = 0, i = 0;
    KVP_LIST_FOR_EACH(x, &e->waiting) n++;
    rq_t **snap = kvp__arena_alloc(&e->scratch, (n + 1) * sizeof *snap);
    if (!snap)
        return KVP_ERR_NO_MEMORY;
    KVP_LIST_FOR_EACH(x, &e->waiting) snap[i++] = KVP_CONTAINER_OF(x, rq_t, node);
    size_t running = running_count(e);
    for (i = 0; i < n; i++) {
        rq_t *q = snap[i];
        if (s->budget <= 0 || running >= (size_t)e->p.max_num_seqs)
            break;
        if (q->state != RQ_WAITING)
            continue;
        bool stop = false;
        kvp_status_t st = schedule_waiting_one(e, s, q, &stop);
        if (st != KVP_OK)
            return st;
        /* vLLM stops at the first request that does not fit; with nothing
         * running, the blocks it waits for are held by requests behind it
         * (back from their loads), so those go first instead of nothing */
        if (stop && (running > 0 || !kvp__list_empty(&e->finishing)))
            break;
        if (q->state == RQ_RUNNING)
            running++;
    }
    if (s->nsched || running || !kvp__list_empty(&e->finishing))
        return KVP_OK;
    /* Nothing runs and nothing could start: every block is held by waiting
     * requests back from their loads, each needing more.  The last of them
     * gives its blocks up and will recompute (a preemption). */
    for (i = n; i-- > 0;) {
        rq_t *q = snap[i];
        if (q->state == RQ_WAITING && q->nblocks) {
            /* the connector hears of it as of any preemption (K9) */
            kvp__rq_free_blocks(e, q);
            q->num_computed = 0;
            q->resumed = true;
            kvp__rq_sync_view(q);
            e->stats.preemptions++;
            return kvp__eng_push((void ***)&s->preempted, &s->npreempted, &s->cap_preempted,
                                 (void *)q->id)
                       ? KVP_OK
                       : KVP_ERR_NO_MEMORY;
        }
    }
    return KVP_OK;
}

