/*
 * The consumer half of the EC worker (connectors-spec §3.6, §3.7 "Consumer
 * load"): the receive slab, the reservation table over it, the push
 * receiver that writes into it and the control server that hands out its
 * slots; and the load path that takes pushed (or resident) tensors into the
 * engine's encoder cache.
 *
 * Life: start makes the receiver (which allocates the slab; the data port
 * binds the same host as the control server), the table over its slab and
 * the server, in that order; stop undoes them in reverse, after telling the table to shut down
 * and waiting (up to the control timeout) for writers that own memory, so
 * no remote write can land in unmapped memory.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "ec/ec_worker_int.h"

static kvp_status_t check_write(void *ctx, uint64_t offset, uint64_t len, const char *rid)
{
    kvp_ec_worker_t *w = ctx;
    /* The receiver listens before the table exists (it allocates the slab
     * the table is made over): a write that early names no reservation. */
    kvp__ec_resv_t *resv = __atomic_load_n(&w->resv, __ATOMIC_ACQUIRE);
    if (!resv)
        return KVP_ERR_INVALID_ARG;
    return kvp__ec_resv_check_write(resv, offset, len, rid && rid[0] ? rid : NULL);
}

kvp_status_t kvp__ec_consumer_start(kvp_ec_worker_t *w, const kvp_ec_worker_params_t *p)
{
    kvp_status_t st;
    int64_t tp = w->cfg.tp_size > 0 ? w->cfg.tp_size : 1;
    /* Host and base port come from the first shard's control address. */
    char host[256];
    long base = 0;
    const char *a = w->control_addr;
    if (strncmp(a, "tcp://", 6) != 0)
        goto bad_addr;
    a += 6;
    const char *colon = strrchr(a, ':');
    if (!colon || colon == a || (size_t)(colon - a) >= sizeof host)
        goto bad_addr;
    memcpy(host, a, (size_t)(colon - a));
    host[colon - a] = 0;
    if (host[0] == '[') { /* [v6] */
        size_t hl = strlen(host);
        if (hl < 3 || host[hl - 1] != ']')
            goto bad_addr;
        memmove(host, host + 1, hl - 2);
        host[hl - 2] = 0;
    }
    base = strtol(colon + 1, NULL, 10);
    if (base < 1 || base + tp - 1 > 65535)
        goto bad_addr;
    const char *bind_host = p->bind_host && p->bind_host[0] ? p->bind_host : host;

    /* The receiver allocates the slab: with UCX shared memory where UCX
     * offers it, so a producer's put is a one-sided copy (a put into memory
     * the caller mapped is emulated by UCX here: docs/ec-push.md). */
    w->slab_size = (size_t)w->cfg.pool_size;
    unsigned paths = p->push_path == KVP_EC_PUSH_TCP   ? KVP__EC_PATH_TCP
                     : p->push_path == KVP_EC_PUSH_UCX ? KVP__EC_PATH_UCX
                                                       : KVP__EC_PATH_TCP | KVP__EC_PATH_UCX;
    kvp__ec_push_rx_params_t xp = {
        .host = bind_host,
        /* producers reach this host (the control address's): a data port
         * bound to every interface must not advertise 0.0.0.0 */
        .advertise_host = strcmp(bind_host, host) ? host : NULL,
        .port = 0,
        .slab = NULL,
        .slab_size = w->slab_size,
        .paths = paths,
        .check = check_write,
        .check_ctx = w,
    };
    if ((st = kvp__ec_push_rx_create(&xp, &w->rx)) != KVP_OK)
        return st;
    w->slab = kvp__ec_push_rx_slab(w->rx);

    kvp__ec_resv_t *resv = NULL;
    kvp__ec_resv_params_t rp = {
        .slab = w->slab,
        .slab_size = w->slab_size,
        .lease_ms = p->lease_ms > 0 ? p->lease_ms : KVP_EC_RESERVATION_TTL_MS,
        .max_tombstones = p->max_tombstones > 0 ? (size_t)p->max_tombstones : 65536,
        .peer_max_reservations = p->peer_max_reservations > 0 ? (size_t)p->peer_max_reservations : 65536,
        .peer_max_bytes = p->peer_max_bytes > 0 ? (uint64_t)p->peer_max_bytes : (uint64_t)w->slab_size,
    };
    if ((st = kvp__ec_resv_create(&rp, &resv)) != KVP_OK)
        return st;
    __atomic_store_n(&w->resv, resv, __ATOMIC_RELEASE);

    uint16_t ports[1024];
    if (tp > 1024)
        goto bad_addr;
    for (int64_t r = 0; r < tp; r++)
        ports[r] = (uint16_t)(base + r);
    kvp__ec_ctl_server_params_t sp = {
        .host = bind_host,
        .port = (uint16_t)(base + p->tp_rank),
        .peer_ports = ports,
        .n_peers = (size_t)tp,
        .resv = w->resv,
        .dst_session = kvp__ec_push_rx_session(w->rx),
        .slab = w->slab,
        .reap_interval_ms = p->reap_interval_ms > 0 ? p->reap_interval_ms : 1000,
        .max_pending_events = p->max_pending_events > 0 ? (size_t)p->max_pending_events : 4096,
        .start_timeout_ms = p->start_timeout_ms > 0 ? p->start_timeout_ms : 5000,
    };
    if (w->pool) {
        kvp__ec_xcache_params_t cp = {.pool = w->pool, .model = w->model, .resv = w->resv};
        if ((st = kvp__ec_xcache_create(&cp, &w->xcache)) != KVP_OK)
            return st;
        sp.xcache = w->xcache;
    }
    return kvp__ec_ctl_server_create(&sp, &w->srv);
bad_addr:
    kvp_error("EC worker: cannot serve control address %s with tp_size %" PRId64, w->control_addr, tp);
    return KVP_ERR_BAD_CONFIG;
}

void kvp__ec_consumer_stop(kvp_ec_worker_t *w)
{
    bool drained = true;
    if (w->resv) {
        kvp__ec_resv_begin_shutdown(w->resv);
        drained = kvp__ec_resv_wait_for_writers(w->resv, w->cfg.control_timeout_ms);
    }
    kvp__ec_ctl_server_destroy(w->srv); /* waits for its lookups */
    w->srv = NULL;
    kvp__ec_xcache_destroy(w->xcache);
    w->xcache = NULL;
    /* The receiver stops (no write lands after this) and frees the slab;
     * the table, which never touches the slab's bytes at destroy, goes
     * after it. */
    kvp__ec_push_rx_destroy(w->rx);
    w->rx = NULL;
    w->slab = NULL;
    kvp__ec_resv_destroy(w->resv);
    w->resv = NULL;
    if (!drained)
        kvp_warn("ec consumer: writers still owned reservations at shutdown; their connections were closed");
}

typedef struct {
    const kvp_ec_encoder_cache_t *cache;
} held_ctx_t;

/* retire_stale's "encoder_cache.get(h) is allocation.tensor". */
static bool engine_holds(void *ctx, const char *mm_hash, const uint8_t *ptr)
{
    held_ctx_t *h = ctx;
    kvp_ec_tensor_t t;
    if (!h->cache->get || !h->cache->get(h->cache->ctx, mm_hash, &t))
        return false;
    return t.data == ptr;
}

static bool spec_tensor(const kvp_ec_load_spec_t *ls, kvp__ec_tensor_t *t)
{
    memset(t, 0, sizeof *t);
    if (ls->ndim > KVP__EC_MAX_NDIM || ls->nbytes < 0 || !ls->dtype)
        return false;
    if (kvp_ec_dtype_parse(ls->dtype, &t->dtype) != KVP_OK)
        return false;
    t->nbytes = (uint64_t)ls->nbytes;
    t->ndim = (uint32_t)ls->ndim;
    for (size_t i = 0; i < ls->ndim; i++)
        t->shape[i] = ls->shape[i];
    return true;
}

kvp_status_t kvp__ec_consumer_load(kvp_ec_worker_t *w, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache)
{
    held_ctx_t h = {cache};
    /* The scheduler always sends a list (the seed's freed is never None
     * there): retire exactly those the engine freed. */
    if (meta->n_freed)
        kvp__ec_resv_retire(w->resv, (const char *const *)meta->freed, meta->n_freed, engine_holds, &h);
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; i < meta->n_loads && st == KVP_OK; i++) {
        const kvp_ec_load_spec_t *ls = &meta->loads[i];
        if (!ls->mm_hash || !ls->transfer_id)
            continue;
        if (cache->has(cache->ctx, ls->mm_hash)) {
            if (!ls->local) /* the spec's id is one shard's; cancel by transfer */
                kvp__ec_resv_cancel(w->resv, ls->transfer_id, "", false, false, NULL, NULL);
            st = kvp__ec_names_add(&w->loaded, ls->mm_hash);
            continue;
        }
        kvp__ec_tensor_t t;
        kvp__ec_view_t v;
        char err[256];
        kvp_status_t got;
        if (!spec_tensor(ls, &t))
            got = KVP_ERR_INVALID_ARG;
        else if (ls->local)
            got = kvp__ec_resv_take_resident(w->resv, ls->mm_hash, &t, &v);
        else
            got = kvp__ec_resv_take(w->resv, ls->transfer_id, ls->mm_hash, &v, err, sizeof err);
        if (got != KVP_OK) {
            kvp_warn_rl("ec consumer: load of mm_hash=%s (transfer %s) failed: %s", ls->mm_hash, ls->transfer_id,
                        ls->local ? "not resident" : err);
            st = kvp__ec_names_add(&w->failed_loads, ls->mm_hash);
            continue;
        }
        kvp_ec_tensor_t out = {
            .data = v.ptr,
            .nbytes = (int64_t)v.t.nbytes,
            .shape = v.t.shape,
            .ndim = v.t.ndim,
            .dtype = v.t.dtype,
        };
        cache->put(cache->ctx, ls->mm_hash, &out);
        st = kvp__ec_names_add(&w->loaded, ls->mm_hash);
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

void kvp__ec_consumer_stats(kvp_ec_worker_t *w, kvp_ec_worker_stats_t *o)
{
    kvp__ec_resv_stats_t r;
    kvp__ec_resv_stats(w->resv, &r);
    o->reservations_active = r.active;
    o->bytes_reserved = r.bytes_reserved;
    o->tombstones = r.tombstones;
    o->residents = r.residents;
    o->resident_bytes = r.resident_bytes;
    o->reserves = r.reserves;
    o->reserves_cached = r.reserves_cached;
    o->reserves_full = r.reserves_full;
    o->reserves_capped = r.reserves_capped;
    o->completes = r.completes;
    o->cancels = r.cancels;
    o->takes = r.takes;
    o->takes_failed = r.takes_failed;
    o->expired = r.expired;
    o->reclaimed = r.reclaimed;
    o->writers_abandoned = r.writers_abandoned;
    if (w->srv) {
        kvp__ec_ctl_server_stats_t s;
        kvp__ec_ctl_server_stats(w->srv, &s);
        o->events_sent = s.events_sent;
        o->events_dropped = s.events_dropped;
        o->control_requests = s.requests;
        o->control_errors = s.error_replies;
        o->cross_cache_parked = s.parked;
        o->control_busy_ns = s.busy_ns;
        o->reserve_busy_ns = s.reserve_busy_ns;
        o->reserve_cpu_ns = s.reserve_cpu_ns;
        o->reserve_requests = s.reserve_requests;
    }
    if (w->xcache) {
        kvp__ec_xcache_stats_t x;
        kvp__ec_xcache_stats(w->xcache, &x);
        o->cross_cache_hits = x.hits;
        o->cross_cache_misses = x.misses;
        o->cross_cache_skipped = x.skipped;
        o->cross_cache_errors = x.errors;
        o->cross_cache_bytes = x.bytes_fetched;
    }
    if (w->rx) {
        kvp__ec_push_rx_stats_t x;
        kvp__ec_push_rx_stats(w->rx, &x);
        o->push_conns_open = x.conns_open;
        o->push_writes = x.writes;
        o->push_bytes = x.bytes;
        o->push_bad_headers = x.bad_headers;
    }
}
