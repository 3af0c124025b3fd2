/*
 * One engine instance: vLLM V1's scheduler loop, reduced to what decides
 * which tokens are computed, loaded and saved when (see engine.h).  Step 3
 * (the scheduling itself) is engine_sched.c; the ranks' share of step 4 is
 * rank.c.
 *
 * A step at virtual time t:
 *   1. the clock's promises: loads and saves whose virtual completion is at
 *      or before t must have really completed, so the instance polls its
 *      ranks (get_finished with no metadata, vLLM's no-forward step) until
 *      they have;
 *   2. finished async loads go back to the waiting queue with their
 *      computed tokens (minus any failed block: recomputed), finished saves
 *      free their request's blocks, requests that have arrived by t join
 *      the waiting queue;
 *   3. the running requests are scheduled first (a chunk of prefill, or
 *      one decode token each) within the token budget, preempting the last
 *      running request (recompute) when blocks run out; then, if nothing was
 *      preempted, waiting requests in order: the local prefix cache, then the
 *      connector's get_num_new_matched_tokens; an async hit allocates and
 *      waits for its load (WAITING_FOR_REMOTE_KVS), a sync hit is loaded
 *      before the forward pass;
 *   4. build_connector_meta, then every rank: load_now (sync loads), the
 *      forward pass (the KV of each newly computed full block), get_finished
 *      and the load errors;
 *   5. the step lasts step_us + its tokens' compute + its sync loads; saves
 *      and async loads take the link after it, a load also the lookup round
 *      trip; a request whose last prompt token was computed has its first
 *      token at the step's end.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "engine/content.h"
#include "engine/engine_int.h"

static const kvp__eng_model_t g_models[] = {
    {"tiny", 2, 1, 8, 2},
    {"small", 24, 2, 64, 2},
    {"llama8b-like", 32, 8, 128, 2},
};

const kvp__eng_model_t *kvp__eng_model_find(const char *name)
{
    for (size_t i = 0; i < sizeof g_models / sizeof g_models[0]; i++)
        if (strcmp(g_models[i].name, name) == 0)
            return &g_models[i];
    return NULL;
}

static uint32_t rank_heads(const kvp__eng_model_t *m, uint32_t tp)
{
    return m->kv_heads < tp ? 1 : m->kv_heads / tp;
}

uint64_t kvp__eng_model_token_bytes(const kvp__eng_model_t *m, uint32_t tp)
{
    return (uint64_t)m->layers * 2 * rank_heads(m, tp) * m->head_dim * m->elem_bytes;
}

/* ---- requests ----------------------------------------------------------- */

/* The moves of a request's life (bit `to` set in row `from`). */
static const unsigned g_moves[] = {
    [RQ_WAITING] = 1u << RQ_WAITING_REMOTE | 1u << RQ_RUNNING | 1u << RQ_DONE,
    [RQ_WAITING_REMOTE] = 1u << RQ_WAITING | 1u << RQ_DONE,
    [RQ_RUNNING] = 1u << RQ_WAITING | 1u << RQ_FINISHING | 1u << RQ_DONE,
    [RQ_FINISHING] = 1u << RQ_DONE,
    [RQ_DONE] = 0,
};

void kvp__rq_set_state(rq_t *q, rq_state_t to)
{
    if (!(g_moves[q->state] & 1u << to))
        kvp_error("replay: %s: state %d -> %d is not a move", q->id, q->state, to);
    q->state = to;
}

void kvp__rq_sync_view(rq_t *q)
{
    q->view.num_tokens = q->num_tokens;
    q->view.num_computed_tokens = q->num_computed;
    q->view.all_token_ids = q->r->tokens;
    q->view.num_all_token_ids = (size_t)q->num_tokens;
    q->view.block_hashes = q->r->hashes;
    q->view.num_block_hashes = (size_t)q->num_hashes;
    q->view.hash_len = KVP__ENG_HASH_LEN;
}

void kvp__rq_release(kvp__eng_t *e, rq_t *q)
{
    kvp__strmap_del(&e->by_id, q->id, strlen(q->id));
    kvp__eng_req_t *r = q->r;
    kvp__free(r->tokens, (size_t)(r->prompt_len + r->output_len) * sizeof *r->tokens);
    kvp__free(r->hashes, (size_t)(r->max_hashes + 1) * KVP__ENG_HASH_LEN);
    r->tokens = NULL, r->hashes = NULL;
    kvp__free(q->blocks, (size_t)q->cap_blocks * sizeof *q->blocks);
    kvp__free(q, sizeof *q);
}

bool kvp__rq_grow_blocks(rq_t *q, int64_t n)
{
    size_t cap = (size_t)q->cap_blocks;
    if (kvp__grow_in((void **)&q->blocks, &cap, (size_t)n, sizeof *q->blocks, 16))
        return false;
    q->cap_blocks = (int64_t)cap;
    return true;
}

/* Appends n fresh blocks (KVP_ERR_NO_SPACE: none taken). */
kvp_status_t kvp__rq_alloc(kvp__eng_t *e, rq_t *q, int64_t n)
{
    if (n <= 0)
        return KVP_OK;
    if (n > e->bp.num_free)
        return KVP_ERR_NO_SPACE;
    if (!kvp__rq_grow_blocks(q, q->nblocks + n))
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__bp_alloc(&e->bp, n, q->blocks + q->nblocks);
    if (st == KVP_OK)
        q->nblocks += n;
    return st;
}

void kvp__rq_free_blocks(kvp__eng_t *e, rq_t *q)
{
    kvp__bp_free(&e->bp, q->blocks, q->nblocks);
    q->nblocks = q->cached_blocks = 0;
}

/* Registers q's computed full blocks in the local prefix cache. */
void kvp__rq_cache(kvp__eng_t *e, rq_t *q)
{
    int64_t full = q->num_computed / e->p.block_size;
    if (full > q->num_hashes)
        full = q->num_hashes;
    if (full > q->nblocks)
        full = q->nblocks;
    for (; q->cached_blocks < full; q->cached_blocks++)
        kvp__bp_cache(&e->bp, q->blocks[q->cached_blocks],
                      q->r->hashes + q->cached_blocks * KVP__ENG_HASH_LEN);
}

bool kvp__eng_push(void ***arr, size_t *n, size_t *cap, void *v)
{
    if (kvp__grow_in((void **)arr, cap, *n + 1, sizeof **arr, 16))
        return false;
    (*arr)[(*n)++] = v;
    return true;
}

/* ---- life ------------------------------------------------------------- */

kvp_status_t kvp__eng_create(const kvp__eng_params_t *p, kvp__eng_t **eng_p)
{
    kvp__eng_t *e = kvp__calloc(1, sizeof *e);
    if (!e)
        return KVP_ERR_NO_MEMORY;
    e->p = *p;
    kvp__list_init(&e->waiting);
    kvp__list_init(&e->running);
    kvp__list_init(&e->finishing);
    kvp__strmap_init(&e->by_id);
    pthread_mutex_init(&e->mu, NULL);
    pthread_mutex_init(&e->settle_mu, NULL);
    pthread_cond_init(&e->go_cv, NULL);
    pthread_cond_init(&e->done_cv, NULL);
    e->next_us = INFINITY;
    e->unsettled_min_us = INFINITY;
    e->token_bytes = kvp__eng_model_token_bytes(p->model, p->tp);
    e->seg = (size_t)p->block_size * rank_heads(p->model, p->tp) * p->model->head_dim *
             p->model->elem_bytes;
    e->num_blocks = p->gpu_tokens / p->block_size;
    const char *chk = getenv("KVP_ENGINE_CHECK");
    e->check = chk && *chk == '1';
    snprintf(e->model_name, sizeof e->model_name, "replay-%s", p->model->name);
    kvp_status_t st = kvp__bp_init(&e->bp, e->num_blocks);
    if (st == KVP_OK)
        st = kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, NULL, 0, &e->none_hash);
    if (st == KVP_OK && p->pool) {
        st = kvp__eng_ranks_start(e);
        if (st == KVP_OK) {
            kvp_kv_config_t cfg;
            kvp_kv_config_init(&cfg);
            cfg.kv_role = p->role;
            cfg.load_async = p->load_async;
            cfg.lookup_async = p->lookup_async;
            cfg.block_size = cfg.hash_block_size = p->block_size;
            cfg.model_name = e->model_name;
            cfg.cache_prefix = p->cache_prefix;
            cfg.tp_size = (int32_t)p->tp;
            cfg.num_kv_heads = (int32_t)p->model->kv_heads;
            cfg.fix_k12_save_without_new_blocks = true; /* as the vLLM connector runs it */
            cfg.load_policy = (kvp_kv_load_policy_t)p->load_policy;
            cfg.prefill_us_per_token = p->prefill_us_per_token;
            cfg.load_bytes_per_token = e->token_bytes;
            cfg.load_bytes_per_s = p->link_bytes_per_us * 1e6;
            cfg.lookup_rtt_us = p->lookup_rtt_us;
            e->filter = kvp__eng_filter_client(e);
            st = kvp_kv_sched_create(&cfg, e->filter, &e->sched);
        }
    }
    if (st != KVP_OK) {
        kvp__eng_destroy(e);
        return st;
    }
    *eng_p = e;
    return KVP_OK;
}

static void release_list(kvp__eng_t *e, kvp__list_t *l)
{
    KVP_LIST_FOR_EACH_SAFE(n, tmp, l) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        kvp__list_del(&q->node);
        kvp__rq_release(e, q);
    }
}

void kvp__eng_destroy(kvp__eng_t *e)
{
    if (!e)
        return;
    kvp_kv_sched_destroy(e->sched);
    kvp__eng_ranks_stop(e);
    for (size_t i = 0; i < e->num_done_rqs; i++)
        if (e->done_rqs[i]->state == RQ_DONE)
            kvp__rq_release(e, e->done_rqs[i]);
    release_list(e, &e->waiting);
    release_list(e, &e->running);
    release_list(e, &e->finishing);
    for (kvp__eng_req_t *r = e->arr_head; r; r = r->next_arrival) {
        kvp__free(r->tokens, (size_t)(r->prompt_len + r->output_len) * sizeof *r->tokens);
        kvp__free(r->hashes, (size_t)(r->max_hashes + 1) * KVP__ENG_HASH_LEN);
        r->tokens = NULL, r->hashes = NULL;
    }
    kvp__bp_cleanup(&e->bp);
    kvp__strmap_cleanup(&e->by_id);
    kvp__free(e->finished_ids, e->cap_finished_ids * sizeof *e->finished_ids);
    kvp__free(e->done_rqs, e->cap_done_rqs * sizeof *e->done_rqs);
    kvp__arena_cleanup(&e->scratch);
    kvp__free(e->step.sched, e->step.cap_sched * sizeof *e->step.sched);
    kvp__free(e->step.preempted, e->step.cap_preempted * sizeof *e->step.preempted);
    kvp__free(e->step.sync, e->step.cap_sync * sizeof *e->step.sync);
    pthread_mutex_destroy(&e->mu);
    pthread_mutex_destroy(&e->settle_mu);
    pthread_cond_destroy(&e->go_cv);
    pthread_cond_destroy(&e->done_cv);
    kvp__free(e, sizeof *e);
}

void kvp__eng_arrive(kvp__eng_t *e, kvp__eng_req_t *r)
{
    r->next_arrival = NULL;
    if (e->arr_tail)
        e->arr_tail->next_arrival = r;
    else
        e->arr_head = r;
    e->arr_tail = r;
    if (r->arrival_us < e->next_us)
        e->next_us = r->arrival_us > e->now_us ? r->arrival_us : e->now_us;
}

double kvp__eng_next_us(const kvp__eng_t *e) { return e->next_us; }

int64_t kvp__eng_local_hit(const kvp__eng_t *e, const uint8_t *hashes, int64_t n)
{
    return kvp__bp_lookup(&e->bp, hashes, n, NULL);
}

void kvp__eng_settle_saves(kvp__eng_t *e, double t_us)
{
    pthread_mutex_lock(&e->settle_mu);
    if (e->unsettled_min_us < t_us) {
        for (uint32_t r = 0; r < e->p.tp; r++)
            kvp_kv_worker_drain(e->ranks[r].worker);
        e->unsettled_min_us = INFINITY;
    }
    pthread_mutex_unlock(&e->settle_mu);
}

void kvp__eng_stats(const kvp__eng_t *e, kvp__eng_stats_t *st)
{
    *st = e->stats;
    for (uint32_t r = 0; e->ranks && r < e->p.tp; r++) {
        kvp_kv_worker_stats_t ws;
        kvp_kv_worker_stats(e->ranks[r].worker, &ws);
        st->blocks_loaded += ws.blocks_loaded;
        st->load_errors += ws.load_errors;
        st->save_errors += ws.save_errors;
        st->bytes_saved += ws.bytes_saved;
        st->bytes_loaded += ws.bytes_loaded;
        st->io_ns += ws.save_ns + ws.load_ns;
        st->blocks_verified += e->ranks[r].verified;
        st->corruptions += e->ranks[r].corrupt;
    }
    if (e->zmq) {
        kvp_kv_lookup_zmq_stats_t zs;
        kvp_kv_lookup_zmq_stats(e->zmq, &zs);
        st->lookup_errors = zs.errors;
    }
}

/* ---- the step ----------------------------------------------------------- */

#define POLL_US 100
#define POLL_LIMIT_NS (30ull * 1000000000ull)

static rq_t *rq_of(const kvp__eng_t *e, const char *id) { return kvp__strmap_gets(&e->by_id, id); }

/* A failed block of q's load: q recomputes from it on.  Whether it was q's. */
static bool blame(const kvp__eng_t *e, rq_t *q, int64_t blk)
{
    int64_t bs = e->p.block_size;
    for (int64_t b = q->load_from / bs; b < q->load_to / bs && b < q->nblocks; b++)
        if (q->blocks[b] == blk) {
            if (b * bs < q->rollback)
                q->rollback = b * bs;
            return true;
        }
    return false;
}

/* Folds one phase's reports into the requests: done_recving / done_sending
 * per rank, and each failed block back to the load it belongs to. */
static void merge_phase(kvp__eng_t *e, rq_t *const *sync, size_t nsync)
{
    for (uint32_t r = 0; r < e->p.tp; r++) {
        rank_t *rk = &e->ranks[r];
        for (size_t i = 0; i < rk->fin.num_recving; i++) {
            rq_t *q = rq_of(e, rk->fin.recving[i]);
            if (q && q->state == RQ_WAITING_REMOTE)
                q->recv_count++;
        }
        for (size_t i = 0; i < rk->fin.num_sending; i++) {
            rq_t *q = rq_of(e, rk->fin.sending[i]);
            if (q)
                q->send_count++;
        }
        for (size_t i = 0; i < rk->nerrs; i++) {
            bool found = false;
            for (size_t k = 0; k < nsync && !found; k++)
                found = blame(e, sync[k], rk->errs[i]);
            KVP_LIST_FOR_EACH(n, &e->waiting) {
                rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
                if (!found && q->state == RQ_WAITING_REMOTE)
                    found = blame(e, q, rk->errs[i]);
            }
        }
    }
}

static kvp_status_t poll_ranks(kvp__eng_t *e)
{
    memset(&e->phase, 0, sizeof e->phase);
    kvp_status_t st = kvp__eng_ranks_run(e);
    if (st == KVP_OK)
        merge_phase(e, NULL, 0);
    return st;
}

/* Step 1: what is due by t must have really happened. */
static kvp_status_t keep_promises(kvp__eng_t *e, double t)
{
    if (!e->sched)
        return KVP_OK;
    uint64_t t0 = kvp__now_ns();
    for (;;) {
        bool due = false;
        KVP_LIST_FOR_EACH(n, &e->waiting) {
            rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
            if (q->state == RQ_WAITING_REMOTE && q->load_issued && q->load_done_us <= t &&
                q->recv_count < e->p.tp)
                due = true;
        }
        KVP_LIST_FOR_EACH(n, &e->finishing) {
            rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
            if (q->save_done_us <= t && q->send_count < e->p.tp && q->sent_reported)
                due = true;
        }
        if (!due)
            return KVP_OK;
        if (kvp__now_ns() - t0 > POLL_LIMIT_NS) {
            /* a worker that never reports: give up on it, loudly (the load's
             * blocks are recomputed, the blocks of the save are freed) */
            kvp_error("replay: instance %u: I/O due at %.0f us not reported in %llu s; going on",
                      e->p.index, t, POLL_LIMIT_NS / 1000000000ull);
            KVP_LIST_FOR_EACH(n, &e->waiting) {
                rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
                if (q->state == RQ_WAITING_REMOTE && q->load_issued && q->load_done_us <= t)
                    q->recv_count = e->p.tp, q->rollback = q->load_from;
            }
            KVP_LIST_FOR_EACH(n, &e->finishing) {
                rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
                if (q->save_done_us <= t && q->sent_reported)
                    q->send_count = e->p.tp;
            }
            return KVP_OK;
        }
        kvp_status_t st = poll_ranks(e);
        if (st != KVP_OK)
            return st;
        usleep(POLL_US);
    }
}

/* Step 2. */
static kvp_status_t take_events(kvp__eng_t *e, double t)
{
    int64_t bs = e->p.block_size;
    KVP_LIST_FOR_EACH(n, &e->waiting) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        if (q->state != RQ_WAITING_REMOTE || !q->load_issued || q->load_done_us > t ||
            q->recv_count < e->p.tp)
            continue;
        int64_t ok_to = q->rollback < q->load_to ? q->rollback / bs * bs : q->load_to;
        if (ok_to < q->load_from)
            ok_to = q->load_from;
        q->num_computed = ok_to;
        if (q->count_pool) {
            e->stats.pool_hit_tokens += (uint64_t)(ok_to - q->load_from);
            q->r->point->hit_tokens += (uint32_t)(ok_to - q->load_from);
        }
        q->count_pool = false;
        q->rollback = INT64_MAX;
        kvp__rq_cache(e, q);
        kvp__rq_set_state(q, RQ_WAITING);
    }
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &e->finishing) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        if (q->send_count < e->p.tp || q->save_done_us > t)
            continue;
        kvp__list_del(&q->node);
        kvp__rq_free_blocks(e, q);
        kvp__rq_set_state(q, RQ_DONE);
        kvp__rq_release(e, q);
    }
    while (e->arr_head && e->arr_head->arrival_us <= t) {
        kvp__eng_req_t *r = e->arr_head;
        e->arr_head = r->next_arrival;
        if (!e->arr_head)
            e->arr_tail = NULL;
        rq_t *q = kvp__calloc(1, sizeof *q);
        if (!q)
            return KVP_ERR_NO_MEMORY;
        q->r = r;
        snprintf(q->id, sizeof q->id, "r%" PRIu64, r->idx);
        q->num_tokens = r->prompt_len;
        q->num_hashes = r->prompt_len / bs;
        q->rollback = INT64_MAX;
        q->view.req_id = q->id;
        kvp__rq_sync_view(q);
        if (kvp__strmap_put(&e->by_id, q->id, strlen(q->id), q) != KVP_OK) {
            kvp__free(q, sizeof *q);
            return KVP_ERR_NO_MEMORY;
        }
        kvp__list_add_tail(&e->waiting, &q->node);
    }
    return KVP_OK;
}

/* Step 4a: vLLM's SchedulerOutput, as the connector's views. */
static kvp_status_t build_output(kvp__eng_t *e, step_t *s, kvp_kv_sched_output_t *so)
{
    memset(so, 0, sizeof *so);
    size_t nnew = 0, ncached = 0;
    for (size_t i = 0; i < s->nsched; i++)
        s->sched[i]->is_new ? nnew++ : ncached++;
    kvp_kv_new_req_t *nr = kvp__arena_alloc(&e->scratch, (nnew + 1) * sizeof *nr);
    kvp_kv_cached_req_t *cr = kvp__arena_alloc(&e->scratch, (ncached + 1) * sizeof *cr);
    kvp_kv_ids_t *ids = kvp__arena_alloc(&e->scratch, (s->nsched + 1) * sizeof *ids);
    if (!nr || !cr || !ids)
        return KVP_ERR_NO_MEMORY;
    nnew = ncached = 0;
    for (size_t i = 0; i < s->nsched; i++) {
        rq_t *q = s->sched[i];
        if (q->is_new) {
            ids[i] = (kvp_kv_ids_t){q->blocks, (size_t)q->nblocks};
            nr[nnew++] = (kvp_kv_new_req_t){
                .req_id = q->id,
                .num_computed_tokens = q->num_computed,
                .num_scheduled_tokens = q->scheduled,
                .block_ids = {&ids[i], 1},
                .prompt_token_ids = q->r->tokens,
                .num_prompt_token_ids = (size_t)q->r->prompt_len,
            };
        } else {
            bool resumed = q->resumed;
            int64_t from = resumed ? 0 : q->new_from;
            ids[i] = (kvp_kv_ids_t){q->blocks + from, (size_t)(q->nblocks - from)};
            cr[ncached++] = (kvp_kv_cached_req_t){
                .req_id = q->id,
                .num_computed_tokens = q->num_computed,
                .num_scheduled_tokens = q->scheduled,
                .new_block_ids = {&ids[i], ids[i].n ? 1u : 0u},
                .resumed = resumed,
            };
        }
    }
    so->finished_req_ids = e->finished_ids;
    so->num_finished = e->num_finished_ids;
    so->preempted_req_ids = s->preempted;
    so->num_preempted = s->npreempted;
    so->new_reqs = nr;
    so->num_new_reqs = nnew;
    so->cached_reqs = cr;
    so->num_cached_reqs = ncached;
    return KVP_OK;
}

/* The blocks the forward pass completes: full blocks in [computed,
 * computed + scheduled). */
static kvp_status_t build_fills(kvp__eng_t *e, step_t *s, phase_t *ph)
{
    int64_t bs = e->p.block_size;
    size_t n = 0;
    for (size_t i = 0; i < s->nsched; i++) {
        rq_t *q = s->sched[i];
        int64_t to = (q->num_computed + q->scheduled) / bs;
        if (to > q->num_hashes)
            to = q->num_hashes;
        if (to > q->num_computed / bs)
            n += (size_t)(to - q->num_computed / bs);
    }
    fill_t *f = kvp__arena_alloc(&e->scratch, (n + 1) * sizeof *f);
    if (!f)
        return KVP_ERR_NO_MEMORY;
    n = 0;
    for (size_t i = 0; i < s->nsched; i++) {
        rq_t *q = s->sched[i];
        int64_t to = (q->num_computed + q->scheduled) / bs;
        if (to > q->num_hashes)
            to = q->num_hashes;
        for (int64_t b = q->num_computed / bs; b < to; b++)
            f[n++] = (fill_t){q->blocks[b], q->r->hashes + b * KVP__ENG_HASH_LEN};
    }
    ph->fills = f;
    ph->num_fills = n;
    return KVP_OK;
}

/* A token was generated: append it (and hash a block it fills). */
static kvp_status_t append_token(kvp__eng_t *e, rq_t *q)
{
    int64_t bs = e->p.block_size;
    q->r->tokens[q->num_tokens] = kvp__eng_output_token(q->r->idx, q->num_tokens);
    q->num_tokens++;
    if (q->num_tokens % bs == 0 && q->num_tokens / bs <= q->r->max_hashes &&
        q->num_hashes == q->num_tokens / bs - 1) {
        const uint8_t *parent = q->num_hashes ? q->r->hashes + (q->num_hashes - 1) * KVP__ENG_HASH_LEN
                                              : e->none_hash.bytes;
        kvp_status_t st = kvp__eng_block_hash(parent, q->r->tokens + q->num_tokens - bs, (size_t)bs,
                                              q->r->hashes + q->num_hashes * KVP__ENG_HASH_LEN);
        if (st != KVP_OK)
            return st;
        q->num_hashes++;
    }
    return KVP_OK;
}

static kvp_status_t finish(kvp__eng_t *e, rq_t *q, double end)
{
    kvp__list_del(&q->node);
    bool delay = false;
    if (e->sched) {
        kvp_kv_ids_t ids = {q->blocks, (size_t)q->nblocks};
        kvp_kv_blocks_t blocks = {&ids, 1};
        kvp_status_t st = kvp_kv_sched_request_finished(e->sched, q->id, &blocks, &delay);
        if (st != KVP_OK)
            return st;
    }
    if (delay) {
        kvp__rq_set_state(q, RQ_FINISHING);
        kvp__list_add_tail(&e->finishing, &q->node);
    } else {
        kvp__rq_free_blocks(e, q);
        kvp__rq_set_state(q, RQ_DONE);
    }
    if (end > e->stats.last_token_us)
        e->stats.last_token_us = end;
    return kvp__eng_push((void ***)&e->done_rqs, &e->num_done_rqs, &e->cap_done_rqs, q) ? KVP_OK
                                                                             : KVP_ERR_NO_MEMORY;
}

/* Step 5: the metas' saves and async loads take the link after the step. */
static void model_io(kvp__eng_t *e, const kvp_kv_meta_t *meta, double end)
{
    int64_t bs = e->p.block_size;
    double link = e->p.link_bytes_per_us;
    for (size_t i = 0; meta && i < meta->num_requests; i++) {
        const kvp_kv_req_meta_t *m = &meta->requests[i];
        rq_t *q = rq_of(e, m->req_id);
        if (!q)
            continue;
        if (m->can_save) {
            int64_t covered = m->token_len_chunk / bs;
            if (covered > q->num_hashes)
                covered = q->num_hashes;
            if (covered > q->save_blocks) {
                double bytes = (double)(covered - q->save_blocks) * (double)bs * (double)e->token_bytes;
                double start = end > e->save_link_us ? end : e->save_link_us;
                double done = start + bytes / link;
                e->save_link_us = done;
                q->save_done_us = done;
                kvp__eng_visible_mark(e->p.visible, q->r->hashes + q->save_blocks * KVP__ENG_HASH_LEN,
                                      covered - q->save_blocks, done);
                pthread_mutex_lock(&e->settle_mu);
                if (done < e->unsettled_min_us)
                    e->unsettled_min_us = done;
                pthread_mutex_unlock(&e->settle_mu);
                q->save_blocks = covered;
            }
        }
        if (m->has_load_spec && m->load_spec.can_load && q->state == RQ_WAITING_REMOTE &&
            !q->load_issued) {
            double bytes = (double)(q->load_to - q->load_from) * (double)e->token_bytes;
            double start = end > e->load_link_us ? end : e->load_link_us;
            e->load_link_us = start + bytes / link;
            q->load_done_us = e->load_link_us + e->p.lookup_rtt_us;
            q->load_issued = true;
        }
    }
}

/* The block pool's books balance: every reference is a request's block
 * (KVP_ENGINE_CHECK=1 runs it after every step; the tests set it). */
static void check_refs(const kvp__eng_t *e)
{
    int64_t held = 0, refs = 0;
    const kvp__list_t *lists[] = {&e->waiting, &e->running, &e->finishing};
    for (size_t l = 0; l < 3; l++)
        KVP_LIST_FOR_EACH(n, lists[l]) held += KVP_CONTAINER_OF(n, rq_t, node)->nblocks;
    for (int64_t b = 0; b < e->bp.num_blocks; b++)
        refs += e->bp.blocks[b].ref;
    int64_t free_n = 0;
    for (int64_t b = 0; b < e->bp.num_blocks; b++)
        free_n += e->bp.blocks[b].ref == 0;
    if (held != refs || free_n != e->bp.num_free)
        kvp_error("replay: instance %u step %" PRIu64 ": %" PRId64 " block references, %" PRId64
                  " held by requests; %" PRId64 " free, %" PRId64 " counted",
                  e->p.index, e->stats.steps, refs, held, free_n, e->bp.num_free);
}

/* The next step's time (see kvp__eng_next_us). */
static void plan_next(kvp__eng_t *e, double end, bool progressed)
{
    bool work = e->num_done_rqs || !kvp__list_empty(&e->running);
    KVP_LIST_FOR_EACH(n, &e->waiting) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        if (q->state == RQ_WAITING || (q->state == RQ_WAITING_REMOTE && !q->load_issued))
            work = true;
    }
    if (work && progressed) {
        e->next_us = end;
        return;
    }
    /* nothing can move before an event: the next arrival or I/O completion */
    double t = INFINITY;
    if (e->arr_head)
        t = e->arr_head->arrival_us;
    KVP_LIST_FOR_EACH(n, &e->waiting) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        if (q->state == RQ_WAITING_REMOTE && q->load_issued && q->load_done_us < t)
            t = q->load_done_us;
    }
    KVP_LIST_FOR_EACH(n, &e->finishing) {
        rq_t *q = KVP_CONTAINER_OF(n, rq_t, node);
        if (q->save_done_us < t)
            t = q->save_done_us;
    }
    if (work && !isfinite(t))
        t = end + e->p.step_us; /* waiting on a lookup: ask again */
    e->next_us = t < end ? end : t;
}

kvp_status_t kvp__eng_step(kvp__eng_t *e)
{
    double t = e->next_us;
    if (!isfinite(t))
        return KVP_OK;
    e->now_us = t;
    kvp__arena_reset(&e->scratch);
    kvp_status_t st = keep_promises(e, t);
    if (st == KVP_OK)
        st = take_events(e, t);
    step_t *s = &e->step; /* its arrays are kept from step to step */
    s->budget = e->p.token_budget;
    s->preempted_any = false;
    s->nsched = s->npreempted = s->nsync = 0;
    s->prefill_tokens = s->decode_tokens = 0;
    if (st == KVP_OK)
        st = kvp__eng_schedule_running(e, s);
    if (st == KVP_OK && !s->preempted_any)
        st = kvp__eng_schedule_waiting(e, s);
    /* finished ids: those of the last step */
    e->num_finished_ids = 0;
    for (size_t i = 0; st == KVP_OK && i < e->num_done_rqs; i++) {
        if (kvp__grow_in((void **)&e->finished_ids, &e->cap_finished_ids, e->num_finished_ids + 1,
                         sizeof *e->finished_ids, 16))
            st = KVP_ERR_NO_MEMORY;
        else
            e->finished_ids[e->num_finished_ids++] = e->done_rqs[i]->id;
    }
    double dur = e->p.step_us;
    for (size_t i = 0; st == KVP_OK && i < s->nsched; i++) {
        rq_t *q = s->sched[i];
        if (q->num_computed >= q->r->prompt_len)
            s->decode_tokens += q->scheduled;
        else
            s->prefill_tokens += q->scheduled;
    }
    dur += (double)s->prefill_tokens * e->p.prefill_us_per_token +
           (double)s->decode_tokens * e->p.decode_us_per_token;
    bool progressed = s->nsched || s->npreempted || e->num_done_rqs;
    const kvp_kv_meta_t *meta = NULL;
    if (st == KVP_OK && e->sched) {
        kvp_kv_sched_output_t so;
        st = build_output(e, s, &so);
        if (st == KVP_OK)
            st = kvp_kv_sched_build_connector_meta(e->sched, &so, &meta);
        if (st == KVP_OK && s->nsync) {
            double bytes = 0;
            for (size_t i = 0; i < s->nsync; i++)
                bytes += (double)(s->sync[i]->load_to - s->sync[i]->load_from) * (double)e->token_bytes;
            double start = t > e->load_link_us ? t : e->load_link_us;
            e->load_link_us = start + bytes / e->p.link_bytes_per_us;
            dur += e->load_link_us - t + e->p.lookup_rtt_us;
        }
        /* A preempted request's blocks are free again and may be written
         * in this very step, while its saves may still be reading them:
         * they finish first (the worker's handle_preemptions). */
        for (uint32_t r = 0; st == KVP_OK && s->npreempted && r < e->p.tp; r++)
            kvp_kv_worker_drain(e->ranks[r].worker);
        memset(&e->phase, 0, sizeof e->phase);
        e->phase.meta = meta;
        e->phase.finished = e->finished_ids;
        e->phase.num_finished = e->num_finished_ids;
        e->phase.load_now = s->nsync > 0;
        e->phase.sync_loads = s->sync;
        e->phase.num_sync_loads = s->nsync;
        if (st == KVP_OK)
            st = build_fills(e, s, &e->phase);
        if (st == KVP_OK)
            st = kvp__eng_ranks_run(e);
        if (st == KVP_OK)
            merge_phase(e, s->sync, s->nsync);
        for (size_t i = 0; i < e->num_done_rqs; i++)
            e->done_rqs[i]->sent_reported = true;
    }
    double end = t + dur;
    if (st == KVP_OK && e->sched)
        model_io(e, meta, end);
    /* the finished of the last step have been reported: let them go */
    for (size_t i = 0; i < e->num_done_rqs; i++)
        if (e->done_rqs[i]->state == RQ_DONE)
            kvp__rq_release(e, e->done_rqs[i]);
    e->num_done_rqs = 0;
    for (size_t i = 0; st == KVP_OK && i < s->nsched; i++) {
        rq_t *q = s->sched[i];
        if (q->state != RQ_RUNNING)
            continue;
        q->num_computed += q->scheduled;
        q->scheduled = 0;
        q->is_new = false;
        q->resumed = false;
        if (q->load_sync) {
            int64_t bs = e->p.block_size;
            int64_t ok_to = q->rollback < q->load_to ? q->rollback / bs * bs : q->load_to;
            if (q->count_pool) {
                e->stats.pool_hit_tokens += (uint64_t)(ok_to - q->load_from);
                q->r->point->hit_tokens += (uint32_t)(ok_to - q->load_from);
            }
            q->count_pool = false;
            q->load_sync = false;
            if (q->rollback < q->num_computed) {
                q->num_computed = q->rollback; /* recomputed from the failed block on */
                q->rollback = INT64_MAX;
                kvp__rq_sync_view(q);
                continue;
            }
            q->rollback = INT64_MAX;
        }
        q->count_pool = false;
        kvp__rq_cache(e, q);
        if (q->num_computed < q->num_tokens) {
            kvp__rq_sync_view(q);
            continue; /* prefill goes on */
        }
        if (q->num_out++ == 0)
            q->r->point->ttft_ms = (end - q->r->arrival_us) / 1000.0;
        if (q->num_out >= (q->r->output_len > 0 ? q->r->output_len : 1))
            st = finish(e, q, end);
        else
            st = append_token(e, q);
        kvp__rq_sync_view(q);
    }
    e->stats.steps++;
    if (e->check)
        check_refs(e);
    e->now_us = end;
    plan_next(e, end, progressed);
    return st;
}
