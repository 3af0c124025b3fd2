/*
 * The EC connector's scheduler side: rules E1-E14 (connectors-spec §3.4)
 * over the transfer table (ec_table.c) and the readiness set (ec_ready.c).
 * Every decision is the original's (ECMooncakeScheduler); where the original
 * raised, the hook returns a status and records the exception class.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "ec/ec_config.h"
#include "ec/ec_json.h"
#include "ec/ec_ready.h"
#include "ec/ec_sched_int.h"
#include "ec/ec_table.h"

/* ---- creation -------------------------------------------------------------- */

kvp_status_t kvp_ec_sched_create(const kvp_ec_sched_params_t *params, kvp_ec_sched_t **sched_p)
{
    *sched_p = NULL;
    kvp_ec_sched_params_t pc; /* the caller's params, whatever header it was built with */
    kvp_status_t st = kvp__ec_sched_params_adopt(params, &pc);
    if (st != KVP_OK)
        return st;
    const kvp_ec_sched_params_t *p = &pc;
    if (!p->config || !p->clock.now_ms || !p->executor.submit_cancel || !p->executor.shutdown ||
        !p->inbox.shard_count || !p->inbox.drain)
        return KVP_ERR_INVALID_ARG;
    char addr[512], err[256];
    st = kvp_ec_config_validate(p->config, addr, sizeof addr, err, sizeof err);
    if (st != KVP_OK) {
        kvp_error("EC scheduler config: %s", err);
        return st;
    }
    kvp_ec_sched_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    kvp__ec_config_adopt(p->config, &s->cfg); /* cannot fail: validate adopted it */
    s->control_addr = kvp__strdup(s->cfg.control_addr ? s->cfg.control_addr : addr);
    if (!s->control_addr) {
        kvp__free(s, sizeof *s);
        return KVP_ERR_NO_MEMORY;
    }
    s->cfg.control_addr = s->control_addr;
    s->cfg.ec_ip = NULL;
    s->itemsize = kvp_ec_dtype_itemsize(s->cfg.dtype);
    s->clock = p->clock;
    s->control = p->control;
    s->executor = p->executor;
    s->inbox = p->inbox;
    s->max_pending_events = s->cfg.max_pending_events < 0 ? KVP_EC_MAX_PENDING_EVENTS : s->cfg.max_pending_events;
    s->max_terminal = s->cfg.max_terminal_records < 0 ? KVP_EC_MAX_TERMINAL_RECORDS : s->cfg.max_terminal_records;
    kvp__ec_table_init(&s->table, s->cfg.pool_size, KVP_EC_RESERVATION_TTL_MS);
    kvp__ec_ready_init(&s->ready);
    kvp__strmap_init(&s->local_cache);
    kvp__strmap_init(&s->failed_saves);
    kvp__strmap_init(&s->prepared);
    kvp__strmap_init(&s->push_index);
    s->drain_pending = true;
    s->drained_at = 0;
    *sched_p = s;
    return KVP_OK;
}

static void push_spec_clear(kvp_ec_push_spec_t *p)
{
    kvp__strfree(p->mm_hash);
    kvp__strfree(p->dtype);
    kvp__strfree(p->consumer_zmq);
    kvp__strfree(p->transfer_id);
    kvp__strfree(p->request_id);
    if (p->shape)
        kvp__free(p->shape, p->ndim * sizeof *p->shape);
    memset(p, 0, sizeof *p);
}

static void tensor_spec_clear(kvp_ec_tensor_spec_t *t)
{
    kvp__strfree(t->dtype);
    if (t->shape)
        kvp__free(t->shape, t->ndim * sizeof *t->shape);
    memset(t, 0, sizeof *t);
}

static void candidate_clear(candidate_t *c)
{
    kvp__strfree(c->request_id);
    kvp__strfree(c->identifier);
    tensor_spec_clear(&c->spec);
}

static void clear_pushes(kvp_ec_sched_t *s)
{
    for (size_t i = 0; i < s->n_pushes; i++)
        push_spec_clear(&s->pushes[i]);
    s->n_pushes = 0;
    kvp__strmap_clear(&s->push_index);
}

static void clear_cands(kvp_ec_sched_t *s)
{
    for (size_t i = 0; i < s->n_cands; i++)
        candidate_clear(&s->cands[i]);
    s->n_cands = 0;
}

void kvp_ec_sched_destroy(kvp_ec_sched_t *s)
{
    if (!s)
        return;
    kvp__ec_table_cleanup(&s->table);
    kvp__ec_ready_cleanup(&s->ready);
    kvp__strset_cleanup(&s->local_cache);
    kvp__strset_cleanup(&s->failed_saves);
    kvp__strset_cleanup(&s->prepared);
    clear_pushes(s);
    if (s->pushes)
        kvp__free(s->pushes, s->cap_pushes * sizeof *s->pushes);
    kvp__strmap_cleanup(&s->push_index);
    clear_cands(s);
    if (s->cands)
        kvp__free(s->cands, s->cap_cands * sizeof *s->cands);
    kvp__strfree(s->control_addr);
    kvp__free(s, sizeof *s);
}

kvp_ec_error_t kvp_ec_sched_error(const kvp_ec_sched_t *s) { return s->err; }

/* ---- §3.2 transfer-id resolution ------------------------------------------ */

const char *kvp_ec_request_transfer_id(const kvp_ec_request_t *req, size_t index)
{
    const kvp_ec_transfer_params_t *p = req->params;
    size_t n = p ? p->n_items : 0;
    const char *hash = req->features[index].identifier;
    if (index < n) {
        const kvp_ec_item_t *it = &p->items[index];
        if ((!it->mm_hash || !strcmp(it->mm_hash, hash)) && it->transfer_id && it->transfer_id[0])
            return it->transfer_id;
    }
    for (size_t i = 0; i < n; i++) {
        const kvp_ec_item_t *it = &p->items[i];
        if (it->mm_hash && !strcmp(it->mm_hash, hash) && it->transfer_id && it->transfer_id[0])
            return it->transfer_id;
    }
    return NULL;
}

static void fallback_id(char *buf, size_t len, const kvp_ec_request_t *req, size_t index)
{
    snprintf(buf, len, "%s:%zu", req->request_id, index);
}

static void warn_unresolved(kvp_ec_sched_t *s, const kvp_ec_request_t *req, size_t index, const char *where)
{
    uint64_t count = ++s->unresolved;
    if (count > KVP_EC_MAX_UNRESOLVED_WARNINGS && count % 1000)
        return;
    kvp_warn("EC could not resolve a transfer id at %s for req=%s index=%zu: feature identifier=%.16s does not "
             "match any of the %zu ec_items (ec_transfer_params present=%d). Occurrence %" PRIu64
             ". ec_items[].mm_hash must echo an engine-reported identifier, or be omitted so the entry is "
             "matched by position.",
             where, req->request_id, index, req->features[index].identifier, req->params ? req->params->n_items : 0,
             req->params != NULL, count);
}

/* ---- E8: cancels -------------------------------------------------------------- */

kvp_status_t kvp__ec_sched_queue_cancel(kvp_ec_sched_t *s, const char *tid, const char *hash, const char *req)
{
    bool cancelled;
    kvp_status_t st = kvp__ec_table_cancel(&s->table, tid, now_ms(s), hash, req, &cancelled);
    if (st != KVP_OK)
        return fail_st(s, st);
    if (!cancelled)
        return KVP_OK;
    kvp__ec_ready_forget(&s->ready, tid);
    uint64_t job;
    st = s->executor.submit_cancel(s->executor.ctx, s->control_addr, tid, &job);
    if (st != KVP_OK)
        return fail(s, st == KVP_ERR_NO_MEMORY ? KVP_EC_ERR_NO_MEMORY : KVP_EC_ERR_RUNTIME, st);
    return KVP_OK;
}

/* ---- E3 ------------------------------------------------------------------------ */

kvp_status_t kvp_ec_sched_has_cache_item(kvp_ec_sched_t *s, const char *identifier, bool *ret_p)
{
    s->err = KVP_EC_ERR_NONE;
    *ret_p = false;
    if (!s->cfg.is_consumer)
        return KVP_OK;
    kvp_status_t st = kvp__ec_sched_drain(s);
    if (st != KVP_OK)
        return st;
    *ret_p = kvp__ec_table_has_state(&s->table, identifier,
                                     KVP__EC_S(KVP_EC_READY) | KVP__EC_S(KVP_EC_RESIDENT) | KVP__EC_S(KVP_EC_AVAILABLE));
    return KVP_OK;
}

/* ---- E5 ------------------------------------------------------------------------ */

static kvp_status_t output_spec(kvp_ec_sched_t *s, const kvp_ec_request_t *req, size_t index, bool torch_prefix,
                                int64_t **shape_p, char **dtype_p, int64_t *nbytes_p)
{
    int64_t *shape = kvp__malloc(2 * sizeof *shape);
    char name[32];
    snprintf(name, sizeof name, "%s%s", torch_prefix ? "torch." : "", kvp_ec_dtype_name(s->cfg.dtype));
    char *dtype = kvp__strdup(name);
    if (!shape || !dtype) {
        if (shape)
            kvp__free(shape, 2 * sizeof *shape);
        kvp__strfree(dtype);
        return KVP_ERR_NO_MEMORY;
    }
    shape[0] = req->features[index].num_embeds;
    shape[1] = s->cfg.hidden_dim;
    int64_t nb;
    if (__builtin_mul_overflow(shape[0], shape[1], &nb) || __builtin_mul_overflow(nb, (int64_t)s->itemsize, &nb))
        nb = INT64_MAX; /* the original would use a big integer; saturate */
    *shape_p = shape;
    *dtype_p = dtype;
    *nbytes_p = nb;
    return KVP_OK;
}

static kvp_status_t prepare_push_spec(kvp_ec_sched_t *s, const kvp_ec_request_t *req, size_t index)
{
    const char *czmq = req->params ? req->params->consumer_zmq : NULL;
    const char *tid = kvp_ec_request_transfer_id(req, index);
    char fb[512];
    if (!tid) {
        if (czmq && czmq[0])
            warn_unresolved(s, req, index, "push prepare");
        fallback_id(fb, sizeof fb, req, index);
        tid = fb;
    }
    if (!czmq || !czmq[0] || kvp__strset_has(&s->prepared, tid))
        return KVP_OK;
    kvp_ec_push_spec_t p = {0};
    p.ndim = 2;
    kvp_status_t st = output_spec(s, req, index, false, &p.shape, &p.dtype, &p.nbytes);
    if (st != KVP_OK)
        return st;
    p.mm_hash = kvp__strdup(req->features[index].identifier);
    p.consumer_zmq = kvp__strdup(czmq);
    p.transfer_id = kvp__strdup(tid);
    p.request_id = kvp__strdup(req->request_id);
    if (!p.mm_hash || !p.consumer_zmq || !p.transfer_id || !p.request_id)
        goto oom;
    uintptr_t at = (uintptr_t)kvp__strmap_gets(&s->push_index, tid);
    if (at) {
        /* dict re-assignment: the value changes, the position stays */
        kvp_ec_push_spec_t old = s->pushes[at - 1];
        s->pushes[at - 1] = p;
        /* re-seat the key on the new copy before the old one is freed */
        kvp_status_t pst = kvp__strmap_put(&s->push_index, p.transfer_id, strlen(tid), (void *)at);
        push_spec_clear(&old);
        if (pst != KVP_OK)
            return pst;
    } else {
        if (s->n_pushes == s->cap_pushes) {
            size_t ncap = s->cap_pushes ? s->cap_pushes * 2 : 16;
            kvp_ec_push_spec_t *np =
                kvp__realloc(s->pushes, s->cap_pushes * sizeof *np, ncap * sizeof *np);
            if (!np)
                goto oom;
            s->pushes = np;
            s->cap_pushes = ncap;
            /* keys point into the moved array: re-seat them */
            kvp__strmap_clear(&s->push_index);
            for (size_t i = 0; i < s->n_pushes; i++)
                if (kvp__strmap_put(&s->push_index, np[i].transfer_id, strlen(np[i].transfer_id),
                                    (void *)(uintptr_t)(i + 1)) != KVP_OK)
                    goto oom;
        }
        s->pushes[s->n_pushes] = p;
        if (kvp__strmap_put(&s->push_index, s->pushes[s->n_pushes].transfer_id, strlen(tid),
                            (void *)(uintptr_t)(s->n_pushes + 1)) != KVP_OK) {
            push_spec_clear(&s->pushes[s->n_pushes]);
            return KVP_ERR_NO_MEMORY;
        }
        s->n_pushes++;
    }
    return kvp__strset_add(&s->prepared, tid, NULL);
oom:
    push_spec_clear(&p);
    return KVP_ERR_NO_MEMORY;
}

/* ---- E4 ------------------------------------------------------------------------ */

static kvp_status_t note_awaiting_push(kvp_ec_sched_t *s, const char *hash, const char *tid, const char *req,
                                       int64_t now)
{
    kvp__ec_rec_t *r;
    kvp_ec_error_t e = KVP_EC_ERR_NONE;
    kvp_status_t st = kvp__ec_table_wait_for_event(&s->table, tid, req, hash, now + s->cfg.push_wait_timeout_s * 1000,
                                                   &r, &e);
    if (st != KVP_OK)
        return fail(s, e == KVP_EC_ERR_NONE ? KVP_EC_ERR_RUNTIME : e, st);
    if (!r)
        return KVP_OK; /* the id names another encoding; the request is already failed */
    if (r->state != KVP_EC_WAITING_EVENT)
        return KVP_OK;
    if (!r->has_deadline)
        return fail(s, KVP_EC_ERR_ASSERTION, KVP_ERR_STATE);
    if (now < r->deadline)
        return KVP_OK;
    int64_t waited = now - r->deadline + s->cfg.push_wait_timeout_s * 1000;
    st = kvp__ec_table_mark_unavailable(&s->table, tid, now);
    if (st != KVP_OK)
        return fail_st(s, st);
    kvp_warn("EC waited %" PRId64 ".%01" PRId64 "s for a push of mm_hash=%s (transfer_id=%s) that never arrived; "
             "requests needing it fail with a retryable error.",
             waited / 1000, (waited % 1000) / 100, hash, tid);
    return KVP_OK;
}

static bool covered(const kvp_ec_feature_t *f, int64_t num_computed)
{
    return (__int128)f->offset + f->length <= num_computed;
}

kvp_status_t kvp_ec_sched_ensure_cache_available(kvp_ec_sched_t *s, const kvp_ec_request_t *req,
                                                 int64_t num_computed, bool *ret_p)
{
    s->err = KVP_EC_ERR_NONE;
    *ret_p = false;
    kvp_status_t st;
    if (s->cfg.is_producer) {
        for (size_t i = 0; i < req->n_features; i++)
            if (!covered(&req->features[i], num_computed) && (st = prepare_push_spec(s, req, i)) != KVP_OK)
                return fail_st(s, st);
    }
    if (!s->cfg.is_consumer) {
        *ret_p = true;
        return KVP_OK;
    }
    if ((st = kvp__ec_sched_drain(s)) != KVP_OK)
        return st;
    int64_t now = now_ms(s);
    bool all_ready = true;
    for (size_t i = 0; i < req->n_features; i++) {
        const kvp_ec_feature_t *f = &req->features[i];
        if (covered(f, num_computed))
            continue;
        const char *hash = f->identifier;
        const char *tid = kvp_ec_request_transfer_id(req, i);
        if (tid)
            kvp__ec_table_touch_available(&s->table, tid, now + KVP_EC_RESERVATION_TTL_MS);
        if (kvp__strset_has(&s->local_cache, hash))
            continue;
        if (kvp__ec_table_has_state(&s->table, hash, KVP__EC_S(KVP_EC_READY)))
            continue;
        all_ready = false;
        if (kvp__ec_table_has_state(&s->table, hash, KVP__EC_S(KVP_EC_LOADING)))
            continue;
        kvp__ec_rec_t *r;
        st = kvp__ec_table_begin_load(&s->table, hash, tid, req->request_id,
                                      now + s->cfg.push_wait_timeout_s * 1000, &r);
        if (st != KVP_OK)
            return fail_st(s, st);
        if (r) {
            s->pending_work = true;
            continue;
        }
        char fb[512];
        if (!tid) {
            fallback_id(fb, sizeof fb, req, i);
            tid = fb;
        }
        if ((st = note_awaiting_push(s, hash, tid, req->request_id, now)) != KVP_OK)
            return st;
    }
    *ret_p = all_ready;
    return KVP_OK;
}

/* ---- E6, E7 --------------------------------------------------------------------- */

kvp_status_t kvp_ec_sched_update_state_after_alloc(kvp_ec_sched_t *s, const kvp_ec_request_t *req, size_t index)
{
    s->err = KVP_EC_ERR_NONE;
    if (index >= req->n_features)
        return fail(s, KVP_EC_ERR_INDEX, KVP_ERR_INVALID_ARG);
    const kvp_ec_feature_t *f = &req->features[index];
    kvp_status_t st = kvp__strset_add(&s->local_cache, f->identifier, NULL);
    if (st != KVP_OK)
        return fail_st(s, st);
    if (!s->cfg.is_producer)
        return KVP_OK;
    if ((st = prepare_push_spec(s, req, index)) != KVP_OK)
        return fail_st(s, st);
    if (s->cfg.cross_encoder_cache && !strcmp(f->modality, "image")) {
        candidate_t *nc = kvp__grow(s->cands, &s->cap_cands, s->n_cands + 1, sizeof *nc, 16);
        if (!nc)
            return fail_st(s, KVP_ERR_NO_MEMORY);
        s->cands = nc;
        candidate_t c = {0};
        c.spec.ndim = 2;
        st = output_spec(s, req, index, true, &c.spec.shape, &c.spec.dtype, &c.spec.nbytes);
        c.request_id = kvp__strdup(req->request_id);
        c.identifier = kvp__strdup(f->identifier);
        if (st != KVP_OK || !c.request_id || !c.identifier) {
            if (st != KVP_OK)
                c.spec.ndim = 0;
            candidate_clear(&c);
            return fail_st(s, KVP_ERR_NO_MEMORY);
        }
        s->cands[s->n_cands++] = c;
    }
    return KVP_OK;
}

kvp_status_t kvp_ec_sched_update_state_after_free(kvp_ec_sched_t *s, const kvp_ec_request_t *req, size_t index)
{
    s->err = KVP_EC_ERR_NONE;
    if (!s->cfg.is_consumer)
        return KVP_OK;
    if (index >= req->n_features)
        return fail(s, KVP_EC_ERR_INDEX, KVP_ERR_INVALID_ARG);
    const char *tid = kvp_ec_request_transfer_id(req, index);
    if (!tid) {
        warn_unresolved(s, req, index, "encoder-cache free");
        return KVP_OK;
    }
    return kvp__ec_sched_queue_cancel(s, tid, req->features[index].identifier, req->request_id);
}

/* ---- E9 ------------------------------------------------------------------------- */

static bool str_in(const char *x, const char *const *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(x, v[i]))
            return true;
    return false;
}

static kvp_status_t strv_copy(const char *const *src, size_t n, char ***out_p)
{
    *out_p = NULL;
    if (!n)
        return KVP_OK;
    char **v = kvp__calloc(n, sizeof *v);
    if (!v)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++)
        if (!(v[i] = kvp__strdup(src[i]))) {
            kvp__ec_strv_free(v, n);
            return KVP_ERR_NO_MEMORY;
        }
    *out_p = v;
    return KVP_OK;
}

static kvp_status_t load_from_spec(kvp_ec_load_spec_t *l, const kvp__ec_spec_t *sp)
{
    memset(l, 0, sizeof *l);
    l->mm_hash = kvp__strdup(sp->mm_hash);
    l->dtype = kvp__strdup(sp->dtype);
    l->transfer_id = kvp__strdup(sp->transfer_id);
    l->shape = sp->ndim ? kvp__malloc(sp->ndim * sizeof *l->shape) : NULL;
    l->ndim = l->shape || !sp->ndim ? sp->ndim : 0;
    l->nbytes = sp->nbytes;
    l->num_token = sp->num_token;
    l->local = sp->local;
    if (!l->mm_hash || !l->dtype || !l->transfer_id || (sp->ndim && !l->shape))
        return KVP_ERR_NO_MEMORY;
    if (sp->ndim)
        memcpy(l->shape, sp->shape, sp->ndim * sizeof *l->shape);
    return KVP_OK;
}

kvp_status_t kvp_ec_sched_build_connector_meta(kvp_ec_sched_t *s, const char *const *freed, size_t n_freed,
                                               const char *const *preempted, size_t n_preempted, kvp_ec_meta_t *meta)
{
    s->err = KVP_EC_ERR_NONE;
    memset(meta, 0, sizeof *meta);
    kvp_status_t st;
    for (size_t i = 0; i < n_freed; i++) {
        kvp__strset_discard(&s->local_cache, freed[i]);
        if ((st = kvp__ec_table_release_ready(&s->table, freed[i], now_ms(s))) != KVP_OK)
            return fail_st(s, st);
    }
    char **orphans;
    size_t n_orphans;
    if ((st = kvp__ec_table_drain_orphaned(&s->table, &orphans, &n_orphans)) != KVP_OK)
        return fail_st(s, st);
    for (size_t i = 0; i < n_orphans && orphans[i] && st == KVP_OK; i++)
        st = kvp__ec_sched_queue_cancel(s, orphans[i], "", "");
    kvp__ec_strv_free(orphans, n_orphans);
    if (st != KVP_OK)
        return st;

    if ((st = strv_copy(freed, n_freed, &meta->freed)) != KVP_OK)
        goto oom;
    meta->n_freed = n_freed;

    /* store candidates: {identifier: spec} for requests not preempted; a later
     * candidate for an identifier replaces the value, keeping the position */
    if (s->n_cands) {
        meta->store_candidates = kvp__calloc(s->n_cands, sizeof *meta->store_candidates);
        if (!meta->store_candidates)
            goto oom;
        for (size_t i = 0; i < s->n_cands; i++) {
            candidate_t *c = &s->cands[i];
            if (preempted && str_in(c->request_id, preempted, n_preempted))
                continue;
            size_t j = 0;
            while (j < meta->n_store_candidates && strcmp(meta->store_candidates[j].identifier, c->identifier))
                j++;
            kvp_ec_store_candidate_t *out = &meta->store_candidates[j];
            if (j == meta->n_store_candidates) {
                out->identifier = c->identifier;
                c->identifier = NULL;
                meta->n_store_candidates++;
            } else {
                tensor_spec_clear(&out->spec);
            }
            out->spec = c->spec;
            memset(&c->spec, 0, sizeof c->spec);
        }
    }
    if (meta->store_candidates) {
        size_t cap = s->n_cands, n = meta->n_store_candidates;
        if (n == 0) {
            kvp__free(meta->store_candidates, cap * sizeof *meta->store_candidates);
            meta->store_candidates = NULL;
        } else if (n < cap) {
            kvp_ec_store_candidate_t *nc = kvp__realloc(meta->store_candidates, cap * sizeof *nc, n * sizeof *nc);
            if (!nc) {
                /* keep the count honest for cleanup: free the unused tail as empty entries */
                meta->n_store_candidates = cap;
                goto oom;
            }
            meta->store_candidates = nc;
        }
    }
    clear_cands(s);

    if (s->n_pushes) {
        meta->pushes = kvp__malloc(s->n_pushes * sizeof *meta->pushes);
        if (!meta->pushes)
            goto oom;
        memcpy(meta->pushes, s->pushes, s->n_pushes * sizeof *meta->pushes);
        meta->n_pushes = s->n_pushes;
        s->n_pushes = 0;
        kvp__strmap_clear(&s->push_index);
    }

    kvp__ec_rec_t **loads;
    size_t n_loads;
    if ((st = kvp__ec_table_take_loads(&s->table, &loads, &n_loads)) != KVP_OK)
        goto oom;
    if (n_loads) {
        meta->loads = kvp__calloc(n_loads, sizeof *meta->loads);
        if (!meta->loads) {
            kvp__free(loads, n_loads * sizeof *loads);
            goto oom;
        }
        meta->n_loads = n_loads;
        for (size_t i = 0; i < n_loads; i++) {
            if (!loads[i]->spec) {
                kvp__free(loads, n_loads * sizeof *loads);
                kvp_ec_meta_cleanup(meta);
                return fail(s, KVP_EC_ERR_ASSERTION, KVP_ERR_STATE);
            }
            if (load_from_spec(&meta->loads[i], loads[i]->spec) != KVP_OK) {
                kvp__free(loads, n_loads * sizeof *loads);
                goto oom;
            }
        }
        kvp__free(loads, n_loads * sizeof *loads);
    }
    s->drain_pending = true;
    return KVP_OK;
oom:
    kvp_ec_meta_cleanup(meta);
    return fail_st(s, KVP_ERR_NO_MEMORY);
}

/* ---- E10, E11, E13 ------------------------------------------------------------------ */

/* Calls fn on each distinct entry of v (first occurrence, in order): the
 * worker lists are sets in vLLM.  O(n) with a scratch set. */
static kvp_status_t for_each_distinct(kvp_ec_sched_t *s, char *const *v, size_t n,
                                      kvp_status_t (*fn)(kvp_ec_sched_t *s, const char *x))
{
    kvp_status_t st = KVP_OK;
    if (n <= 1) {
        for (size_t i = 0; i < n && st == KVP_OK; i++)
            st = fn(s, v[i]);
        return st;
    }
    kvp__strmap_t seen;
    kvp__strmap_init(&seen);
    for (size_t i = 0; i < n && st == KVP_OK; i++) {
        size_t len = strlen(v[i]);
        if (kvp__strmap_get(&seen, v[i], len))
            continue;
        if ((st = kvp__strmap_put(&seen, v[i], len, v[i])) == KVP_OK)
            st = fn(s, v[i]);
    }
    kvp__strmap_cleanup(&seen);
    return st;
}

static kvp_status_t do_complete(kvp_ec_sched_t *s, const char *h) { return kvp__ec_table_complete_load(&s->table, h); }
static kvp_status_t do_fail(kvp_ec_sched_t *s, const char *h) { return kvp__ec_table_fail_load(&s->table, h, now_ms(s)); }
static kvp_status_t do_reclaim(kvp_ec_sched_t *s, const char *h) { return kvp__ec_table_reclaim(&s->table, h, now_ms(s)); }

kvp_status_t kvp_ec_sched_update_connector_output(kvp_ec_sched_t *s, const kvp_ec_worker_meta_t *wm)
{
    s->err = KVP_EC_ERR_NONE;
    if (!wm)
        return KVP_OK;
    kvp_status_t st;
    if ((st = for_each_distinct(s, wm->loaded, wm->n_loaded, do_complete)) != KVP_OK ||
        (st = for_each_distinct(s, wm->failed_loads, wm->n_failed_loads, do_fail)) != KVP_OK ||
        (st = for_each_distinct(s, wm->reclaimed, wm->n_reclaimed, do_reclaim)) != KVP_OK)
        return fail_st(s, st);
    s->pending_work = wm->pending_saves;
    for (size_t i = 0; i < wm->n_failed_saves; i++)
        if ((st = kvp__strset_add(&s->failed_saves, wm->failed_saves[i], NULL)) != KVP_OK)
            return fail_st(s, st);
    return KVP_OK;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

kvp_status_t kvp_ec_sched_take_unavailable_requests(kvp_ec_sched_t *s, kvp_ec_strlist_t *out)
{
    s->err = KVP_EC_ERR_NONE;
    out->v = NULL;
    out->n = 0;
    kvp_status_t st = kvp__ec_table_take_unavailable(&s->table, &s->failed_saves);
    size_t n = s->failed_saves.n;
    if (st == KVP_OK && n) {
        out->v = kvp__calloc(n, sizeof *out->v);
        if (!out->v)
            st = KVP_ERR_NO_MEMORY;
    }
    if (st == KVP_OK && n) {
        size_t k = 0;
        for (size_t i = 0; i < s->failed_saves.cap; i++) {
            kvp__strmap_slot_t *sl = &s->failed_saves.slots[i];
            if (sl->key) {
                out->v[k++] = sl->val; /* ownership moves to out */
                sl->val = NULL;
            }
        }
        out->n = k;
        qsort(out->v, k, sizeof *out->v, cmp_str);
        kvp__strmap_clear(&s->failed_saves);
    } else {
        kvp__strset_clear(&s->failed_saves);
    }
    return st == KVP_OK ? KVP_OK : fail_st(s, st);
}

bool kvp_ec_sched_has_pending_push_work(const kvp_ec_sched_t *s) { return s->pending_work; }

/* ---- E12 -------------------------------------------------------------------------- */

kvp_status_t kvp_ec_sched_request_finished(kvp_ec_sched_t *s, const kvp_ec_request_t *req, kvp_ec_finished_t *out)
{
    s->err = KVP_EC_ERR_NONE;
    memset(out, 0, sizeof *out);
    kvp_status_t st;
    if (s->cfg.is_consumer) {
        for (size_t i = 0; i < req->n_features; i++) {
            const char *tid = kvp_ec_request_transfer_id(req, i);
            if (!tid) {
                warn_unresolved(s, req, i, "request finish");
                continue;
            }
            if ((st = kvp__ec_sched_queue_cancel(s, tid, req->features[i].identifier, req->request_id)) != KVP_OK)
                return st;
        }
    }
    if (s->cfg.is_producer && s->prepared.n) {
        for (size_t i = 0; i < req->n_features; i++) {
            const char *tid = kvp_ec_request_transfer_id(req, i);
            char fb[512];
            if (!tid) {
                fallback_id(fb, sizeof fb, req, i);
                tid = fb;
            }
            kvp__strset_discard(&s->prepared, tid);
        }
    }
    if (!s->cfg.is_producer || !req->n_features)
        return KVP_OK;
    out->items = kvp__calloc(req->n_features, sizeof *out->items);
    if (!out->items)
        return fail_st(s, KVP_ERR_NO_MEMORY);
    for (size_t i = 0; i < req->n_features; i++) {
        const kvp_ec_feature_t *f = &req->features[i];
        size_t j = 0;
        while (j < out->n_items && strcmp(out->items[j].identifier, f->identifier))
            j++;
        kvp_ec_finished_item_t *it = &out->items[j];
        if (j == out->n_items) {
            if (!(it->identifier = kvp__strdup(f->identifier)))
                goto oom;
            out->n_items++;
        }
        kvp__strfree(it->modality);
        kvp__strfree(it->transfer_id); /* the metadata dict is replaced whole */
        it->transfer_id = NULL;
        if (!(it->modality = kvp__strdup(f->modality)))
            goto oom;
        it->offset = f->offset;
        it->length = f->length;
    }
    for (size_t i = 0; i < req->n_features; i++) {
        const char *tid = kvp_ec_request_transfer_id(req, i);
        if (!tid)
            continue;
        size_t j = 0;
        while (strcmp(out->items[j].identifier, req->features[i].identifier))
            j++;
        kvp__strfree(out->items[j].transfer_id);
        if (!(out->items[j].transfer_id = kvp__strdup(tid)))
            goto oom;
    }
    if (out->n_items < req->n_features) {
        kvp_ec_finished_item_t *ni =
            kvp__realloc(out->items, req->n_features * sizeof *ni, out->n_items * sizeof *ni);
        if (!ni) {
            out->n_items = req->n_features; /* the tail is zeroed: cleanup frees it whole */
            goto oom;
        }
        out->items = ni;
    }
    out->has_items = true;
    return KVP_OK;
oom:
    if (out->items && out->n_items < req->n_features && !out->has_items)
        out->n_items = req->n_features; /* allocated for every feature; the tail is zeroed */
    kvp_ec_finished_cleanup(out);
    return fail_st(s, KVP_ERR_NO_MEMORY);
}

/* ---- E14 -------------------------------------------------------------------------- */

void kvp_ec_sched_close(kvp_ec_sched_t *s)
{
    s->err = KVP_EC_ERR_NONE;
    s->executor.shutdown(s->executor.ctx);
    if (s->control.close)
        s->control.close(s->control.ctx);
    if (s->inbox.close)
        s->inbox.close(s->inbox.ctx);
}

/* ---- internal access (the observability calls are in ec_snapshot.c) ---------------- */

kvp__ec_table_t *kvp__ec_sched_table(kvp_ec_sched_t *s) { return &s->table; }
const kvp__ec_table_t *kvp__ec_sched_table_view(const kvp_ec_sched_t *s) { return &s->table; }
size_t kvp__ec_sched_ready_size(const kvp_ec_sched_t *s) { return kvp__ec_ready_size(&s->ready); }
