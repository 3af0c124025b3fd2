/*
 * The EC worker (connectors-spec §3.6, §3.7): life, the step's metadata,
 * aggregation across ranks and stats.  The consumer half is ec_consumer.c,
 * the producer half ec_producer.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/sized.h"
#include "ec/ec_config.h"
#include "ec/ec_worker_int.h"

/* ---- ordered name sets ---- */

void kvp__ec_names_init(kvp__ec_names_t *n)
{
    memset(n, 0, sizeof *n);
    kvp__strmap_init(&n->set);
}

void kvp__ec_names_cleanup(kvp__ec_names_t *n)
{
    for (size_t i = 0; i < n->list.n; i++)
        kvp__strfree(n->list.v[i]);
    kvp__free(n->list.v, n->cap * sizeof *n->list.v);
    kvp__strset_cleanup(&n->set);
    memset(&n->list, 0, sizeof n->list);
    n->cap = 0;
}

kvp_status_t kvp__ec_names_add(kvp__ec_names_t *n, const char *s)
{
    if (kvp__strset_has(&n->set, s))
        return KVP_OK;
    if (kvp__grow_in((void **)&n->list.v, &n->cap, n->list.n + 1, sizeof *n->list.v, 8) != 0)
        return KVP_ERR_NO_MEMORY;
    char *d = kvp__strdup(s);
    if (!d)
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__strset_add(&n->set, s, NULL);
    if (st != KVP_OK) {
        kvp__strfree(d);
        return st;
    }
    n->list.v[n->list.n++] = d;
    return KVP_OK;
}

void kvp__ec_names_take(kvp__ec_names_t *n, char ***v_p, size_t *n_p)
{
    /* The caller frees with kvp__ec_strv_free(v, n) and the array itself
     * with kvp__free(v, n * sizeof *v): shrink the array to n first. */
    char **v = NULL;
    size_t cnt = n->list.n;
    if (cnt) {
        v = kvp__malloc(cnt * sizeof *v);
        if (v) {
            memcpy(v, n->list.v, cnt * sizeof *v);
        } else {
            for (size_t i = 0; i < cnt; i++)
                kvp__strfree(n->list.v[i]);
            cnt = 0;
        }
    }
    kvp__free(n->list.v, n->cap * sizeof *n->list.v);
    n->list.v = NULL;
    n->list.n = 0;
    n->cap = 0;
    kvp__strset_clear(&n->set);
    *v_p = v;
    *n_p = cnt;
}

kvp_status_t kvp__ec_store_key(const char *model, const char *mm_hash, char *buf, size_t len, size_t *n_p)
{
    int n = snprintf(buf, len, "ec@%s@%s", model && model[0] ? model : "-", mm_hash);
    if (n < 0 || (size_t)n >= len || (size_t)n > KVP_KEY_MAX)
        return KVP_ERR_KEY_LENGTH;
    *n_p = (size_t)n;
    return KVP_OK;
}

/* ---- life ---- */

static kvp_status_t adopt_params(const kvp_ec_worker_params_t *in, kvp_ec_worker_params_t *out)
{
    if (!in)
        return KVP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    kvp_status_t st = kvp__sized_adopt(out, sizeof *out, in);
    if (st != KVP_OK)
        kvp_error("EC worker params: size %u (this library's struct has %zu bytes)", (unsigned)in->size,
                  sizeof *out);
    return st;
}

kvp_status_t kvp_ec_worker_create(const kvp_ec_worker_params_t *params, kvp_ec_worker_t **w_p)
{
    kvp_ec_worker_params_t p;
    char addr[300], err[256];
    if (!w_p)
        return KVP_ERR_INVALID_ARG;
    *w_p = NULL;
    kvp_status_t st = adopt_params(params, &p);
    if (st != KVP_OK)
        return st;
    if (!p.config)
        return KVP_ERR_INVALID_ARG;
    kvp_ec_worker_t *w = kvp__calloc(1, sizeof *w);
    if (!w)
        return KVP_ERR_NO_MEMORY;
    pthread_mutex_init(&w->mu, NULL);
    kvp__ec_names_init(&w->loaded);
    kvp__ec_names_init(&w->failed_loads);
    if ((st = kvp__ec_config_adopt(p.config, &w->cfg)) != KVP_OK)
        goto fail;
    if ((st = kvp_ec_config_validate(&w->cfg, addr, sizeof addr, err, sizeof err)) != KVP_OK) {
        kvp_error("EC worker: bad config: %s", err);
        goto fail;
    }
    snprintf(w->control_addr, sizeof w->control_addr, "%s", w->cfg.control_addr ? w->cfg.control_addr : addr);
    w->cfg.control_addr = NULL; /* borrowed: not kept */
    w->cfg.ec_ip = NULL;
    w->consumer = w->cfg.is_consumer;
    w->producer = w->cfg.is_producer;
    w->receiving = !p.not_receiving;
    int64_t tp = w->cfg.tp_size > 0 ? w->cfg.tp_size : 1;
    if (p.tp_rank < 0 || p.tp_rank >= tp) {
        kvp_error("EC worker: tp_rank %" PRId64 " outside 0..%" PRId64, p.tp_rank, tp - 1);
        st = KVP_ERR_BAD_CONFIG;
        goto fail;
    }
    if (w->cfg.cross_encoder_cache && p.pool) {
        w->pool = p.pool;
        w->model = kvp__strdup(p.model ? p.model : "");
        if (!w->model) {
            st = KVP_ERR_NO_MEMORY;
            goto fail;
        }
    }
    if (w->consumer && w->receiving && (st = kvp__ec_consumer_start(w, &p)) != KVP_OK)
        goto fail;
    if (w->producer) {
        kvp__ec_producer_params_t pp = {
            .control_timeout_ms = w->cfg.control_timeout_ms,
            .lease_ms = p.lease_ms > 0 ? p.lease_ms : KVP_EC_RESERVATION_TTL_MS,
            .paths = p.push_path == KVP_EC_PUSH_TCP   ? KVP__EC_PATH_TCP
                     : p.push_path == KVP_EC_PUSH_UCX ? KVP__EC_PATH_UCX
                                                      : KVP__EC_PATH_TCP | KVP__EC_PATH_UCX,
            .threads = 4,
            .stage_bytes = (uint64_t)w->cfg.pool_size,
            .cross_encoder_cache = w->cfg.cross_encoder_cache,
            .pool = w->pool,
            .model = w->model,
            .on_push = p.on_push,
            .on_push_ctx = p.on_push_ctx,
        };
        if ((st = kvp__ec_producer_create(&pp, &w->prod)) != KVP_OK)
            goto fail;
    }
    *w_p = w;
    return KVP_OK;
fail:
    kvp_ec_worker_destroy(w);
    return st;
}

void kvp_ec_worker_destroy(kvp_ec_worker_t *w)
{
    if (!w)
        return;
    kvp__ec_producer_destroy(w->prod);
    kvp__ec_consumer_stop(w);
    kvp__ec_names_cleanup(&w->loaded);
    kvp__ec_names_cleanup(&w->failed_loads);
    kvp__strfree(w->model);
    pthread_mutex_destroy(&w->mu);
    kvp__free(w, sizeof *w);
}

const char *kvp_ec_worker_control_addr(const kvp_ec_worker_t *w)
{
    if (!w)
        return NULL;
    return w->srv ? kvp__ec_ctl_server_addr(w->srv) : w->control_addr;
}

/* ---- the hooks ---- */

kvp_status_t kvp_ec_worker_start_load_caches(kvp_ec_worker_t *w, const kvp_ec_meta_t *meta,
                                             const kvp_ec_encoder_cache_t *cache)
{
    if (!w || !meta || !cache)
        return KVP_ERR_INVALID_ARG;
    if (!w->consumer || !w->receiving)
        return KVP_OK;
    return kvp__ec_consumer_load(w, meta, cache);
}

kvp_status_t kvp_ec_worker_start_save_caches(kvp_ec_worker_t *w, const kvp_ec_meta_t *meta,
                                             const kvp_ec_encoder_cache_t *cache)
{
    if (!w || !meta)
        return KVP_ERR_INVALID_ARG;
    if (!w->prod)
        return KVP_OK;
    return kvp__ec_producer_start_save(w->prod, meta, cache);
}

kvp_status_t kvp_ec_worker_save_caches(kvp_ec_worker_t *w, const char *mm_hash, const kvp_ec_tensor_t *t)
{
    if (!w || !mm_hash || !t || (!t->data && t->nbytes) || t->nbytes < 0)
        return KVP_ERR_INVALID_ARG;
    if (!w->prod)
        return KVP_OK;
    return kvp__ec_producer_save(w->prod, mm_hash, t);
}

kvp_status_t kvp_ec_worker_get_finished(kvp_ec_worker_t *w, const char *const *finished, size_t n)
{
    if (!w || (n && !finished))
        return KVP_ERR_INVALID_ARG;
    if (!w->prod || n == 0)
        return KVP_OK; /* (the producer's NULL list means "every orphan": its own shutdown only) */
    return kvp__ec_producer_finished(w->prod, finished, n);
}

kvp_status_t kvp_ec_worker_build_meta(kvp_ec_worker_t *w, kvp_ec_worker_meta_t *out, bool *has_p)
{
    if (!w || !out || !has_p)
        return KVP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    *has_p = false;
    if (w->consumer && !w->receiving)
        return KVP_OK; /* a stage that never loads must not empty the intersection */
    pthread_mutex_lock(&w->mu);
    kvp__ec_names_take(&w->loaded, &out->loaded, &out->n_loaded);
    kvp__ec_names_take(&w->failed_loads, &out->failed_loads, &out->n_failed_loads);
    pthread_mutex_unlock(&w->mu);
    kvp_status_t st = KVP_OK;
    if (w->resv)
        st = kvp__ec_resv_drain_reclaimed(w->resv, &out->reclaimed, &out->n_reclaimed);
    if (w->prod) {
        out->pending_saves = kvp__ec_producer_pending(w->prod);
        kvp__ec_producer_take_failed(w->prod, &out->failed_saves, &out->n_failed_saves);
    }
    if (st != KVP_OK) {
        kvp_ec_worker_meta_cleanup(out);
        return st;
    }
    *has_p = true;
    return KVP_OK;
}

/* ---- aggregation (metadata.py aggregate) ---- */

static kvp_status_t unite(kvp__ec_names_t *n, char *const *a, size_t na, char *const *b, size_t nb)
{
    kvp_status_t st = KVP_OK;
    for (size_t i = 0; i < na && st == KVP_OK; i++)
        st = kvp__ec_names_add(n, a[i]);
    for (size_t i = 0; i < nb && st == KVP_OK; i++)
        st = kvp__ec_names_add(n, b[i]);
    return st;
}

kvp_status_t kvp_ec_worker_meta_aggregate(const kvp_ec_worker_meta_t *a, const kvp_ec_worker_meta_t *b,
                                          kvp_ec_worker_meta_t *out)
{
    if (!a || !b || !out)
        return KVP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    kvp__ec_names_t l, f, r, s;
    kvp__ec_names_init(&l);
    kvp__ec_names_init(&f);
    kvp__ec_names_init(&r);
    kvp__ec_names_init(&s);
    kvp__strset_t inb;
    kvp__strmap_init(&inb);
    kvp_status_t st = KVP_OK;
    for (size_t i = 0; i < b->n_loaded && st == KVP_OK; i++)
        st = kvp__strset_add(&inb, b->loaded[i], NULL);
    /* loaded: intersected (every rank must hold it) */
    for (size_t i = 0; i < a->n_loaded && st == KVP_OK; i++)
        if (kvp__strset_has(&inb, a->loaded[i]))
            st = kvp__ec_names_add(&l, a->loaded[i]);
    if (st == KVP_OK)
        st = unite(&f, a->failed_loads, a->n_failed_loads, b->failed_loads, b->n_failed_loads);
    if (st == KVP_OK)
        st = unite(&r, a->reclaimed, a->n_reclaimed, b->reclaimed, b->n_reclaimed);
    if (st == KVP_OK)
        st = unite(&s, a->failed_saves, a->n_failed_saves, b->failed_saves, b->n_failed_saves);
    kvp__strset_cleanup(&inb);
    if (st == KVP_OK) {
        kvp__ec_names_take(&l, &out->loaded, &out->n_loaded);
        kvp__ec_names_take(&f, &out->failed_loads, &out->n_failed_loads);
        kvp__ec_names_take(&r, &out->reclaimed, &out->n_reclaimed);
        kvp__ec_names_take(&s, &out->failed_saves, &out->n_failed_saves);
        out->pending_loads = a->pending_loads || b->pending_loads;
        out->pending_saves = a->pending_saves || b->pending_saves;
    }
    kvp__ec_names_cleanup(&l);
    kvp__ec_names_cleanup(&f);
    kvp__ec_names_cleanup(&r);
    kvp__ec_names_cleanup(&s);
    return st;
}

void kvp_ec_worker_stats(kvp_ec_worker_t *w, kvp_ec_worker_stats_t *st)
{
    if (!st)
        return;
    uint32_t size = st->size;
    kvp_ec_worker_stats_t all;
    memset(&all, 0, sizeof all);
    all.size = sizeof all;
    if (w) {
        if (w->resv)
            kvp__ec_consumer_stats(w, &all);
        if (w->prod)
            kvp__ec_producer_stats(w->prod, &all);
    }
    /* The caller's struct may be older (shorter): fill only its size. */
    if (size < sizeof size)
        return;
    if (size > sizeof all)
        size = sizeof all;
    all.size = size;
    memcpy(st, &all, size);
}
