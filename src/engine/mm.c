/*
 * The engine model's multimodal path (mm.h): requests, the scheduler's
 * encoder-input planning, the model runner's encoder cache and the EC
 * connector's hooks in vLLM's order.
 */
#include "engine/mm.h"

#include <string.h>

#include "common/alloc.h"
#include "common/list.h"
#include "common/log.h"
#include "common/strmap.h"
#include "engine/mm_cache.h"

typedef enum mq_state { MQ_WAITING = 0, MQ_RUNNING, MQ_DONE } mq_state_t;

typedef struct mq {
    char *id;
    mq_state_t state;
    kvp__list_t node;            /* on waiting or running */
    int64_t prompt_len, num_computed, scheduled;
    kvp_ec_feature_t *f;         /* owned strings */
    size_t nf;
    kvp_ec_item_t *items;        /* owned strings */
    size_t nitems;
    kvp_ec_transfer_params_t params;
    bool has_params;
    kvp_ec_request_t view;
    uint8_t *cached;             /* the manager's request_cached_ids */
    kvp__ecm_req_t ecm;
} mq_t;

/* One input to encode in this step. */
typedef struct enc {
    mq_t *q;
    size_t i;
} enc_t;

typedef struct spare {
    uint8_t *p;
    size_t n;
} spare_t;

/* The model runner's encoder cache entry: a producer's own output (own !=
 * NULL), or a consumer's tensor in the worker's receive pool (borrowed). */
typedef struct cent {
    char *hash;
    kvp_ec_tensor_t t;
    int64_t shape[4];
    uint8_t *own;
} cent_t;

struct kvp__mm {
    kvp__mm_params_t p;
    kvp__ecm_t ecm;
    kvp__list_t waiting, running;
    size_t n_waiting, n_running;
    kvp__strmap_t by_id;         /* id -> mq (live) */
    kvp__strmap_t cache;         /* mm_hash -> cent */
    char **finished;             /* ended since the last step (finished_req_ids), owned */
    size_t n_finished, cap_finished;
    mq_t **sched;                /* this step's scheduled requests */
    size_t n_sched, cap_sched;
    enc_t *encs;
    size_t n_encs, cap_encs;
    /* Freed encoder outputs kept for the next of their size, as the
     * framework's caching allocator keeps device memory: an output is not
     * a fresh mapping of megabytes to fault in and zero each time.  At most
     * the encoder cache's capacity in bytes is kept (the oldest spare goes
     * first). */
    spare_t *spare;
    size_t n_spare, cap_spare;
    uint64_t spare_bytes;
    kvp__mm_stats_t st;
};

/* ---------------------------------------------------------------- encoder cache */

/* An output buffer is at least one byte (a zero-byte output still has one). */
static void buf_free(uint8_t *p, size_t n) { kvp__free(p, n ? n : 1); }

/* An encoder output's buffer: a spare one of its size, or a new one. */
static uint8_t *buf_get(kvp__mm_t *mm, size_t n)
{
    for (size_t i = mm->n_spare; i-- > 0;)
        if (mm->spare[i].n == n) {
            uint8_t *p = mm->spare[i].p;
            mm->spare_bytes -= n;
            mm->st.outputs_reused++;
            mm->n_spare--;
            memmove(&mm->spare[i], &mm->spare[i + 1], (mm->n_spare - i) * sizeof *mm->spare);
            return p;
        }
    return kvp__malloc(n ? n : 1);
}

static uint64_t spare_cap(const kvp__mm_t *mm)
{
    int64_t b = mm->p.encoder_cache_embeds * mm->p.hidden * kvp_ec_dtype_itemsize(mm->p.dtype);
    return b > 0 ? (uint64_t)b : 0;
}

/* Kept as a spare, the oldest going while the spares are over their cap
 * (freed at once when it alone is, or the list cannot grow). */
static void buf_put(kvp__mm_t *mm, uint8_t *p, size_t n)
{
    if (!p)
        return;
    uint64_t cap = spare_cap(mm);
    if (n > cap || kvp__grow_in((void **)&mm->spare, &mm->cap_spare, mm->n_spare + 1, sizeof *mm->spare, 16) != 0) {
        buf_free(p, n);
        return;
    }
    while (mm->n_spare && mm->spare_bytes + n > cap) {
        mm->spare_bytes -= mm->spare[0].n;
        buf_free(mm->spare[0].p, mm->spare[0].n);
        mm->n_spare--;
        memmove(&mm->spare[0], &mm->spare[1], mm->n_spare * sizeof *mm->spare);
    }
    mm->spare[mm->n_spare++] = (spare_t){p, n};
    mm->spare_bytes += n;
}

static void cent_free(kvp__mm_t *mm, cent_t *c)
{
    buf_put(mm, c->own, (size_t)c->t.nbytes);
    kvp__strfree(c->hash);
    kvp__free(c, sizeof *c);
}

static void cache_drop(kvp__mm_t *mm, const char *hash)
{
    cent_t *c = kvp__strmap_del(&mm->cache, hash, strlen(hash));
    if (c) {
        mm->st.cache_entries--;
        mm->st.cache_bytes -= c->t.nbytes;
        cent_free(mm, c);
    }
}

/* encoder_cache[hash] = t (replacing); own: the engine's buffer (taken). */
static kvp_status_t cache_set(kvp__mm_t *mm, const char *hash, const kvp_ec_tensor_t *t, uint8_t *own)
{
    cent_t *c = kvp__calloc(1, sizeof *c);
    if (!c || !(c->hash = kvp__strdup(hash)) || t->ndim > 4) {
        if (c)
            kvp__free(c, sizeof *c);
        buf_put(mm, own, (size_t)t->nbytes);
        return c ? KVP_ERR_INVALID_ARG : KVP_ERR_NO_MEMORY;
    }
    c->t = *t;
    memcpy(c->shape, t->shape, t->ndim * sizeof *t->shape);
    c->t.shape = c->shape;
    c->own = own;
    cache_drop(mm, hash);
    if (kvp__strmap_put(&mm->cache, c->hash, strlen(c->hash), c) != KVP_OK) {
        cent_free(mm, c);
        return KVP_ERR_NO_MEMORY;
    }
    mm->st.cache_entries++;
    mm->st.cache_bytes += t->nbytes;
    return KVP_OK;
}

static bool ec_has(void *ctx, const char *hash) { return kvp__strmap_gets(&((kvp__mm_t *)ctx)->cache, hash); }

static bool ec_get(void *ctx, const char *hash, kvp_ec_tensor_t *t)
{
    cent_t *c = kvp__strmap_gets(&((kvp__mm_t *)ctx)->cache, hash);
    if (c)
        *t = c->t;
    return c != NULL;
}

static void ec_put(void *ctx, const char *hash, const kvp_ec_tensor_t *t)
{
    kvp__mm_t *mm = ctx;
    mm->st.puts++;
    mm->st.put_bytes += (uint64_t)t->nbytes;
    if (mm->p.on_put)
        mm->p.on_put(mm->p.cb_ctx, hash, t);
    if (cache_set(mm, hash, t, NULL) != KVP_OK)
        mm->st.hook_errors++;
}

static kvp_ec_encoder_cache_t cache_iface(kvp__mm_t *mm)
{
    kvp_ec_encoder_cache_t c = {ec_has, ec_get, ec_put, mm};
    return c;
}

bool kvp__mm_cache_get(const kvp__mm_t *mm, const char *mm_hash, kvp_ec_tensor_t *t)
{
    return ec_get((void *)mm, mm_hash, t);
}

/* ---------------------------------------------------------------- requests */

static void mq_free(mq_t *q)
{
    for (size_t i = 0; i < q->nf; i++) {
        kvp__strfree((char *)q->f[i].identifier);
        kvp__strfree((char *)q->f[i].modality);
    }
    for (size_t i = 0; i < q->nitems; i++) {
        kvp__strfree((char *)q->items[i].mm_hash);
        kvp__strfree((char *)q->items[i].transfer_id);
    }
    kvp__free(q->f, q->nf * sizeof *q->f);
    kvp__free(q->items, q->nitems * sizeof *q->items);
    kvp__free(q->cached, q->nf ? q->nf : 1);
    kvp__strfree((char *)q->params.consumer_zmq);
    kvp__strfree(q->id);
    kvp__free(q, sizeof *q);
}

static char *dup_opt(const char *s, bool *oom)
{
    if (!s)
        return NULL;
    char *d = kvp__strdup(s);
    *oom |= d == NULL;
    return d;
}

kvp_status_t kvp__mm_add(kvp__mm_t *mm, const kvp__mm_req_t *r)
{
    if (!r->id || r->prompt_len < 1 || r->n_features > KVP__MM_MAX_FEATURES)
        return KVP_ERR_INVALID_ARG;
    if (kvp__strmap_gets(&mm->by_id, r->id))
        return KVP_ERR_DUPLICATE_KEY;
    int64_t end = 0;
    for (size_t i = 0; i < r->n_features; i++) {
        const kvp_ec_feature_t *f = &r->features[i];
        if (!f->identifier || !f->modality || f->offset < end || f->length < 1 || f->num_embeds < 1 ||
            f->num_embeds > f->length || f->offset + f->length > r->prompt_len)
            return KVP_ERR_INVALID_ARG;
        end = f->offset + f->length;
    }
    mq_t *q = kvp__calloc(1, sizeof *q);
    if (!q)
        return KVP_ERR_NO_MEMORY;
    bool oom = false;
    q->id = dup_opt(r->id, &oom);
    q->prompt_len = r->prompt_len;
    q->nf = r->n_features;
    q->f = kvp__calloc(q->nf ? q->nf : 1, sizeof *q->f);
    q->cached = kvp__calloc(q->nf ? q->nf : 1, 1);
    oom |= !q->f || !q->cached;
    for (size_t i = 0; !oom && i < q->nf; i++) {
        q->f[i] = r->features[i];
        q->f[i].identifier = dup_opt(r->features[i].identifier, &oom);
        q->f[i].modality = dup_opt(r->features[i].modality, &oom);
    }
    if (!oom && r->params) {
        q->has_params = true;
        q->params.consumer_zmq = dup_opt(r->params->consumer_zmq, &oom);
        q->nitems = r->params->n_items;
        q->items = kvp__calloc(q->nitems ? q->nitems : 1, sizeof *q->items);
        oom |= !q->items;
        for (size_t i = 0; !oom && i < q->nitems; i++) {
            q->items[i].mm_hash = dup_opt(r->params->items[i].mm_hash, &oom);
            q->items[i].transfer_id = dup_opt(r->params->items[i].transfer_id, &oom);
        }
        q->params.items = q->items;
        q->params.n_items = q->nitems;
    }
    if (oom || kvp__strmap_put(&mm->by_id, q->id, strlen(q->id), q) != KVP_OK) {
        if (!q->f)
            q->nf = 0;
        if (!q->items)
            q->nitems = 0;
        mq_free(q);
        return KVP_ERR_NO_MEMORY;
    }
    q->view.request_id = q->id;
    q->view.features = q->f;
    q->view.n_features = q->nf;
    q->view.params = q->has_params ? &q->params : NULL;
    q->ecm.id = q->id;
    q->ecm.features = q->f;
    q->ecm.n = q->nf;
    q->ecm.cached = q->cached;
    q->state = MQ_WAITING;
    kvp__list_add_tail(&mm->waiting, &q->node);
    mm->n_waiting++;
    mm->st.requests++;
    return KVP_OK;
}

/* The request ends: request_finished (before the encoder cache is freed, as
 * vLLM's _free_request does), then the manager lets go of its inputs; its id
 * goes to the workers' get_finished in the next step. */
static void finish(kvp__mm_t *mm, mq_t *q, kvp__mm_outcome_t outcome)
{
    if (mm->p.sched) {
        kvp_ec_finished_t fin;
        memset(&fin, 0, sizeof fin);
        if (kvp_ec_sched_request_finished(mm->p.sched, &q->view, &fin) != KVP_OK)
            mm->st.hook_errors++;
        kvp_ec_finished_cleanup(&fin);
    }
    kvp__ecm_free(&mm->ecm, &q->ecm);
    kvp__list_del(&q->node);
    if (q->state == MQ_RUNNING)
        mm->n_running--;
    else
        mm->n_waiting--;
    q->state = MQ_DONE;
    kvp__strmap_del(&mm->by_id, q->id, strlen(q->id));
    if (kvp__grow_in((void **)&mm->finished, &mm->cap_finished, mm->n_finished + 1, sizeof *mm->finished, 16) == 0)
        mm->finished[mm->n_finished++] = q->id, q->id = NULL;
    else
        mm->st.hook_errors++;
    if (outcome == KVP__MM_DONE)
        mm->st.done++;
    else if (outcome == KVP__MM_RETRYABLE)
        mm->st.retryable++;
    else
        mm->st.failed++;
    if (mm->p.on_end)
        mm->p.on_end(mm->p.cb_ctx, mm->finished[mm->n_finished - 1], outcome);
    mq_free(q);
}

/* ---------------------------------------------------------------- schedule */

/* _try_schedule_encoder_inputs for one request: which inputs in the window
 * [num_computed, num_computed + *num_new) to encode here, which to load
 * through the connector, which are duplicates of an input planned in this
 * call; *num_new shrinks to stop before an input that does not fit. */
static void plan_inputs(kvp__mm_t *mm, mq_t *q, int64_t *num_new, int64_t *enc_budget, size_t *enc, size_t *nenc,
                        size_t *ext, size_t *next, size_t *dup, size_t *ndup)
{
    int64_t nc = q->num_computed, planned = 0;
    const char *hashes[64];
    size_t nh = 0;
    *nenc = *next = *ndup = 0;
    for (size_t i = 0; i < q->nf; i++) {
        const kvp_ec_feature_t *f = &q->f[i];
        if (f->offset >= nc + *num_new)
            break; /* not in this step's window */
        if (f->offset + f->length <= nc)
            continue; /* computed and in the KV cache already */
        bool seen = false;
        for (size_t k = 0; k < nh; k++)
            seen |= !strcmp(hashes[k], f->identifier);
        if (seen) {
            dup[(*ndup)++] = i;
            continue;
        }
        if (kvp__ecm_check_and_update(&mm->ecm, &q->ecm, i)) {
            mm->st.cache_hits++;
            continue;
        }
        if (!kvp__ecm_can_allocate(&mm->ecm, &q->ecm, i, *enc_budget, planned)) {
            /* the cache is full or the budget spent: schedule the text
             * before the input only */
            *num_new = nc < f->offset ? f->offset - nc : 0;
            break;
        }
        if (nh < 64)
            hashes[nh++] = f->identifier;
        bool has = false;
        if (mm->p.sched && kvp_ec_sched_has_cache_item(mm->p.sched, f->identifier, &has) != KVP_OK) {
            mm->st.hook_errors++;
            has = false;
        }
        planned += f->num_embeds;
        if (has) {
            ext[(*next)++] = i;
            continue;
        }
        *enc_budget -= f->num_embeds;
        enc[(*nenc)++] = i;
    }
}

static bool push_ptr(void ***arr, size_t *n, size_t *cap, void *v)
{
    if (kvp__grow_in((void **)arr, cap, *n + 1, sizeof **arr, 16) != 0)
        return false;
    (*arr)[(*n)++] = v;
    return true;
}

/* Schedules one request if it can; true when it got tokens. */
static bool schedule_one(kvp__mm_t *mm, mq_t *q, int64_t *budget, int64_t *enc_budget)
{
    if (mm->p.sched && q->nf) {
        bool ok = false;
        if (kvp_ec_sched_ensure_cache_available(mm->p.sched, &q->view, q->num_computed, &ok) != KVP_OK) {
            mm->st.hook_errors++;
            ok = false;
        }
        if (!ok) {
            mm->st.ensure_false++;
            return false;
        }
    }
    int64_t num_new = q->prompt_len - q->num_computed;
    if (num_new > *budget)
        num_new = *budget;
    if (num_new <= 0)
        return false;
    size_t enc[KVP__MM_MAX_FEATURES], ext[KVP__MM_MAX_FEATURES], dup[KVP__MM_MAX_FEATURES], nenc, next, ndup;
    plan_inputs(mm, q, &num_new, enc_budget, enc, &nenc, ext, &next, dup, &ndup);
    if (num_new == 0)
        return false;
    if (!push_ptr((void ***)&mm->sched, &mm->n_sched, &mm->cap_sched, q))
        return false;
    /* _allocate_encoder_inputs: the encoded and the external ones, then the
     * duplicates */
    for (size_t pass = 0; pass < 2; pass++) {
        size_t *ids = pass ? ext : enc, n = pass ? next : nenc;
        for (size_t k = 0; k < n; k++) {
            if (kvp__ecm_allocate(&mm->ecm, &q->ecm, ids[k]) != KVP_OK) {
                mm->st.hook_errors++;
                continue;
            }
            if (mm->p.sched && kvp_ec_sched_update_state_after_alloc(mm->p.sched, &q->view, ids[k]) != KVP_OK)
                mm->st.hook_errors++;
            if (pass == 0) {
                if (kvp__grow_in((void **)&mm->encs, &mm->cap_encs, mm->n_encs + 1, sizeof *mm->encs, 16) == 0)
                    mm->encs[mm->n_encs++] = (enc_t){q, ids[k]};
                mm->st.encoded++;
            } else {
                mm->st.loaded_external++;
            }
        }
    }
    for (size_t k = 0; k < ndup; k++)
        kvp__ecm_check_and_update(&mm->ecm, &q->ecm, dup[k]);
    q->scheduled = num_new;
    *budget -= num_new;
    return true;
}

/* ---------------------------------------------------------------- the step */

static kvp_status_t run_worker(kvp__mm_t *mm, const kvp_ec_meta_t *meta, const kvp_ec_strlist_t *freed,
                               char **step_finished, size_t n_step_finished, kvp_ec_worker_meta_t *wm, bool *has_wm)
{
    const kvp__mm_worker_t *w = &mm->p.worker;
    kvp_ec_encoder_cache_t cache = cache_iface(mm);
    /* update_states: the freed hashes leave the encoder cache */
    for (size_t i = 0; i < freed->n; i++)
        cache_drop(mm, freed->v[i]);
    if (meta && mm->p.producer && w->start_save && w->start_save(w->ctx, meta, &cache) != KVP_OK)
        mm->st.hook_errors++;
    if (meta && mm->p.consumer && w->start_load && w->start_load(w->ctx, meta, &cache) != KVP_OK)
        mm->st.hook_errors++;
    /* the encoder */
    for (size_t k = 0; k < mm->n_encs; k++) {
        const kvp_ec_feature_t *f = &mm->encs[k].q->f[mm->encs[k].i];
        int64_t nbytes = f->num_embeds * mm->p.hidden * kvp_ec_dtype_itemsize(mm->p.dtype);
        uint8_t *buf = buf_get(mm, (size_t)nbytes);
        if (!buf)
            return KVP_ERR_NO_MEMORY;
        if (mm->p.encode)
            mm->p.encode(mm->p.cb_ctx, f->identifier, buf, nbytes);
        else
            memset(buf, 0, (size_t)nbytes);
        int64_t shape[2] = {f->num_embeds, mm->p.hidden};
        kvp_ec_tensor_t t = {buf, nbytes, shape, 2, mm->p.dtype};
        kvp_status_t st = cache_set(mm, f->identifier, &t, buf);
        if (st != KVP_OK)
            return st;
        if (mm->p.sched && w->save && (mm->p.producer || mm->p.consumer)) {
            kvp_ec_tensor_t saved;
            ec_get(mm, f->identifier, &saved);
            if (w->save(w->ctx, f->identifier, &saved) != KVP_OK)
                mm->st.hook_errors++;
        }
    }
    /* the forward pass gathers every input of the scheduled windows */
    for (size_t k = 0; k < mm->n_sched; k++) {
        mq_t *q = mm->sched[k];
        for (size_t i = 0; i < q->nf; i++) {
            const kvp_ec_feature_t *f = &q->f[i];
            if (f->offset >= q->num_computed + q->scheduled || f->offset + f->length <= q->num_computed)
                continue;
            if (!kvp__strmap_gets(&mm->cache, f->identifier)) {
                mm->st.gather_misses++;
                kvp_warn_rl("engine mm: request %s input %zu (%s) scheduled but not in the encoder cache",
                                q->id, i, f->identifier);
            }
        }
    }
    *has_wm = false;
    if (!mm->p.sched)
        return KVP_OK;
    /* Never a NULL list: kvp_ec_worker_get_finished(w, NULL, 0) reached the
     * producer's "every orphan" path (its destroy's), cancelling the pushes
     * of live requests whose outputs were not computed yet (reported to the
     * EC worker's authors; an empty list is what vLLM passes). */
    static const char *const none[1] = {NULL};
    const char *const *fin = n_step_finished ? (const char *const *)step_finished : none;
    if (w->get_finished && w->get_finished(w->ctx, fin, n_step_finished) != KVP_OK)
        mm->st.hook_errors++;
    if (w->build_meta && w->build_meta(w->ctx, wm, has_wm) != KVP_OK) {
        mm->st.hook_errors++;
        *has_wm = false;
    }
    return KVP_OK;
}

kvp_status_t kvp__mm_step(kvp__mm_t *mm)
{
    mm->st.steps++;
    mm->n_sched = mm->n_encs = 0;
    /* the ids that ended since the last step (SchedulerOutput.finished_req_ids) */
    char **step_finished = mm->finished;
    size_t n_step_finished = mm->n_finished, cap_step_finished = mm->cap_finished;
    mm->finished = NULL;
    mm->n_finished = mm->cap_finished = 0;

    int64_t budget = mm->p.token_budget, enc_budget = mm->p.encoder_budget;
    KVP_LIST_FOR_EACH_ENTRY(q, &mm->running, mq_t, node) {
        if (budget <= 0)
            break;
        schedule_one(mm, q, &budget, &enc_budget);
    }
    KVP_LIST_FOR_EACH_ENTRY_SAFE(q, tmp, &mm->waiting, mq_t, node) {
        if (budget <= 0 || (int64_t)mm->n_running >= mm->p.max_num_seqs)
            break;
        if (schedule_one(mm, q, &budget, &enc_budget)) {
            kvp__list_del(&q->node);
            kvp__list_add_tail(&mm->running, &q->node);
            q->state = MQ_RUNNING;
            mm->n_waiting--;
            mm->n_running++;
        }
    }
    if (!mm->n_sched)
        mm->st.idle_steps++;
    kvp_ec_strlist_t freed = {NULL, 0};
    kvp_status_t st = kvp__ecm_get_freed(&mm->ecm, &freed);
    mm->st.evictions = mm->ecm.evictions;
    kvp_ec_meta_t meta;
    memset(&meta, 0, sizeof meta);
    bool have_meta = false;
    if (st == KVP_OK && mm->p.sched) {
        static const char *const no_preempted[1] = {NULL};
        st = kvp_ec_sched_build_connector_meta(mm->p.sched, (const char *const *)freed.v, freed.n, no_preempted, 0,
                                               &meta);
        have_meta = st == KVP_OK;
    }
    kvp_ec_worker_meta_t wm;
    memset(&wm, 0, sizeof wm);
    bool has_wm = false;
    if (st == KVP_OK)
        st = run_worker(mm, have_meta ? &meta : NULL, &freed, step_finished, n_step_finished, &wm, &has_wm);
    kvp_ec_meta_cleanup(&meta);
    kvp_ec_strlist_cleanup(&freed);
    for (size_t i = 0; i < n_step_finished; i++)
        kvp__strfree(step_finished[i]);
    kvp__free(step_finished, cap_step_finished * sizeof *step_finished);
    if (st != KVP_OK) {
        kvp_ec_worker_meta_cleanup(&wm);
        return st;
    }

    /* update_from_output */
    for (size_t k = 0; k < mm->n_sched; k++) {
        mq_t *q = mm->sched[k];
        q->num_computed += q->scheduled;
        q->scheduled = 0;
        /* _free_encoder_inputs: inputs wholly behind num_computed */
        for (size_t i = 0; i < q->nf; i++) {
            if (!q->cached[i] || q->f[i].offset + q->f[i].length > q->num_computed)
                continue;
            kvp__ecm_free_input(&mm->ecm, &q->ecm, i);
            if (mm->p.sched && kvp_ec_sched_update_state_after_free(mm->p.sched, &q->view, i) != KVP_OK)
                mm->st.hook_errors++;
        }
        if (q->num_computed >= q->prompt_len)
            finish(mm, q, KVP__MM_DONE);
    }
    mm->n_sched = 0;
    if (mm->p.sched) {
        kvp_ec_strlist_t un = {NULL, 0};
        if (kvp_ec_sched_take_unavailable_requests(mm->p.sched, &un) != KVP_OK)
            mm->st.hook_errors++;
        for (size_t i = 0; i < un.n; i++) {
            mq_t *q = kvp__strmap_gets(&mm->by_id, un.v[i]);
            if (q)
                finish(mm, q, KVP__MM_RETRYABLE);
        }
        kvp_ec_strlist_cleanup(&un);
        if (kvp_ec_sched_update_connector_output(mm->p.sched, has_wm ? &wm : NULL) != KVP_OK)
            mm->st.hook_errors++;
    }
    kvp_ec_worker_meta_cleanup(&wm);
    return KVP_OK;
}

/* ---------------------------------------------------------------- life */

kvp_status_t kvp__mm_create(const kvp__mm_params_t *p, kvp__mm_t **mm_p)
{
    *mm_p = NULL;
    if (p->encoder_cache_embeds < 1 || p->encoder_budget < 1 || p->token_budget < 1 || p->max_num_seqs < 1 ||
        p->hidden < 1 || kvp_ec_dtype_itemsize(p->dtype) < 1)
        return KVP_ERR_INVALID_ARG;
    kvp__mm_t *mm = kvp__calloc(1, sizeof *mm);
    if (!mm)
        return KVP_ERR_NO_MEMORY;
    mm->p = *p;
    kvp__ecm_init(&mm->ecm, p->encoder_cache_embeds);
    kvp__list_init(&mm->waiting);
    kvp__list_init(&mm->running);
    kvp__strmap_init(&mm->by_id);
    kvp__strmap_init(&mm->cache);
    *mm_p = mm;
    return KVP_OK;
}

void kvp__mm_destroy(kvp__mm_t *mm)
{
    if (!mm)
        return;
    KVP_LIST_FOR_EACH_ENTRY_SAFE(q, tmp, &mm->waiting, mq_t, node) mq_free(q);
    KVP_LIST_FOR_EACH_ENTRY_SAFE(q, tmp, &mm->running, mq_t, node) mq_free(q);
    kvp__strmap_cleanup(&mm->by_id);
    for (size_t i = 0; i < mm->cache.cap; i++)
        if (mm->cache.slots[i].key)
            cent_free(mm, mm->cache.slots[i].val);
    kvp__strmap_cleanup(&mm->cache);
    for (size_t i = 0; i < mm->n_spare; i++)
        buf_free(mm->spare[i].p, mm->spare[i].n);
    kvp__free(mm->spare, mm->cap_spare * sizeof *mm->spare);
    for (size_t i = 0; i < mm->n_finished; i++)
        kvp__strfree(mm->finished[i]);
    kvp__free(mm->finished, mm->cap_finished * sizeof *mm->finished);
    kvp__free(mm->sched, mm->cap_sched * sizeof *mm->sched);
    kvp__free(mm->encs, mm->cap_encs * sizeof *mm->encs);
    kvp__ecm_cleanup(&mm->ecm);
    kvp__free(mm, sizeof *mm);
}

size_t kvp__mm_unfinished(const kvp__mm_t *mm) { return mm->n_waiting + mm->n_running; }

bool kvp__mm_busy(const kvp__mm_t *mm)
{
    return kvp__mm_unfinished(mm) || mm->n_finished ||
           (mm->p.sched && kvp_ec_sched_has_pending_push_work(mm->p.sched));
}

void kvp__mm_stats(const kvp__mm_t *mm, kvp__mm_stats_t *st)
{
    *st = mm->st;
    st->spare_bytes = (int64_t)mm->spare_bytes;
}

kvp_status_t kvp__mm_check(const kvp__mm_t *mm)
{
    kvp_status_t st = kvp__ecm_check(&mm->ecm);
    if (st != KVP_OK)
        return st;
    size_t n = 0;
    KVP_LIST_FOR_EACH(it, &mm->waiting)
        n++;
    if (n != mm->n_waiting)
        return KVP_ERR_INTERNAL;
    n = 0;
    KVP_LIST_FOR_EACH(it, &mm->running)
        n++;
    if (n != mm->n_running || mm->n_waiting + mm->n_running != mm->by_id.n)
        return KVP_ERR_INTERNAL;
    return KVP_OK;
}
