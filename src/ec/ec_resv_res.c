/*
 * The reservation object's take and resident-set calls, its stats and its
 * self-check: see ec_resv.c for the model (in particular "Residents": an
 * entry is never displaced).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "ec/ec_resv_int.h"

/* ---- take and the resident set ---------------------------------------------- */

static void fill_view(kvp__ec_resv_t *r, const kvp__ec_res_t *e, kvp__ec_view_t *v)
{
    if (!v)
        return;
    v->ptr = r->p.slab + e->ext.off;
    v->t = e->t;
}

static kvp_status_t do_take(kvp__ec_resv_t *r, const char *tid, const char *hash, kvp__ec_view_t *v, char *err,
                            size_t errlen)
{
    kvp__ec_rrec_t *rec = kvp__strmap_gets(&r->recs, tid);
    kvp__ec_res_t *e = NULL;
    if (!rec || rec->state != KVP__EC_R_READY || strcmp(rec->hash, hash) != 0 || (!rec->has_ext && !rec->lease))
        goto not_ready;
    if (rec->lease) {
        /* memory.py publish with a lease: the entry becomes the engine's */
        e = rec->lease;
        kvp__ec_res_pin(&r->res, e);
        kvp__ec_res_release(&r->res, e);
        rec->lease = NULL;
    } else if ((e = kvp__ec_resset_get(&r->res, hash))) {
        if (!kvp__ec_tensor_same(&e->t, &rec->t)) {
            kvp_warn_rl("ec resv: take of %s: mm_hash %s is resident with another shape or dtype", tid, hash);
            goto not_ready;
        }
        kvp__ec_res_pin(&r->res, e);
        kvp__ec_alloc_put(&r->alloc, rec->ext);
        rec->has_ext = false;
    } else {
        e = kvp__ec_resset_insert(&r->res, hash, rec->ext, &rec->t, true);
        if (!e)
            return KVP_ERR_NO_MEMORY;
        rec->has_ext = false;
    }
    kvp__ec_resv_do_remove(r, rec);
    fill_view(r, e, v);
    r->st.takes++;
    return KVP_OK;
not_ready:
    r->st.takes_failed++;
    kvp__ec_set_err(err, errlen, "Pushed EC tensor is not ready for mm_hash=%s", hash);
    return KVP_ERR_STATE;
}

kvp_status_t kvp__ec_resv_take(kvp__ec_resv_t *r, const char *transfer_id, const char *mm_hash,
                               kvp__ec_view_t *v, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!r || !transfer_id || !mm_hash)
        return KVP_ERR_INVALID_ARG;
    pthread_mutex_lock(&r->mu);
    kvp_status_t s = do_take(r, transfer_id, mm_hash, v, err, errlen);
    pthread_mutex_unlock(&r->mu);
    return s;
}

kvp_status_t kvp__ec_resv_take_resident(kvp__ec_resv_t *r, const char *mm_hash, const kvp__ec_tensor_t *t,
                                        kvp__ec_view_t *v)
{
    if (!r || !mm_hash || !t)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t s = KVP_ERR_NOT_FOUND;
    pthread_mutex_lock(&r->mu);
    kvp__ec_res_t *e = kvp__ec_resset_get(&r->res, mm_hash);
    if (e && kvp__ec_tensor_same(&e->t, t)) {
        kvp__ec_res_pin(&r->res, e);
        fill_view(r, e, v);
        s = KVP_OK;
    }
    pthread_mutex_unlock(&r->mu);
    return s;
}

static bool hash_ok(const char *mm_hash)
{
    return mm_hash && mm_hash[0] && strlen(mm_hash) < sizeof(((kvp__ec_fill_t *)0)->hash);
}

kvp_status_t kvp__ec_resv_fill_begin(kvp__ec_resv_t *r, const char *mm_hash, const kvp__ec_tensor_t *t,
                                     uint8_t **ptr_p, uint64_t *id_p)
{
    if (!r || !hash_ok(mm_hash) || !t || t->ndim > KVP__EC_MAX_NDIM || !ptr_p || !id_p)
        return KVP_ERR_INVALID_ARG;
    *ptr_p = NULL;
    *id_p = 0;
    pthread_mutex_lock(&r->mu);
    kvp_status_t s = KVP_OK;
    kvp__ec_fill_t *f = NULL;
    kvp__ec_res_t *e = kvp__ec_resset_get(&r->res, mm_hash);
    if (e) {
        s = kvp__ec_tensor_same(&e->t, t) ? KVP_OK : KVP_ERR_INVALID_ARG;
        goto out;
    }
    if (r->shutting_down) {
        s = KVP_ERR_CLOSED;
        goto out;
    }
    for (size_t i = 0; i < KVP__EC_MAX_FILLS && !f; i++)
        if (!r->fills[i].used)
            f = &r->fills[i];
    if (!f) {
        s = KVP_ERR_BUSY;
        goto out;
    }
    s = kvp__ec_resv_do_alloc(r, t->nbytes, false, 0, &f->ext);
    if (s != KVP_OK)
        goto out;
    f->used = true;
    f->id = ++r->next_fill_id;
    f->t = *t;
    strcpy(f->hash, mm_hash);
    r->fill_bytes += f->ext.size;
    *ptr_p = r->p.slab + f->ext.off;
    *id_p = f->id;
out:
    pthread_mutex_unlock(&r->mu);
    return s;
}

kvp_status_t kvp__ec_resv_fill_end(kvp__ec_resv_t *r, uint64_t id, bool ok)
{
    if (!r || id == 0)
        return KVP_ERR_INVALID_ARG;
    pthread_mutex_lock(&r->mu);
    kvp_status_t s = KVP_ERR_NOT_FOUND;
    kvp__ec_fill_t *f = NULL;
    for (size_t i = 0; i < KVP__EC_MAX_FILLS && !f; i++)
        if (r->fills[i].used && r->fills[i].id == id)
            f = &r->fills[i];
    if (!f)
        goto out;
    f->used = false;
    r->fill_bytes -= f->ext.size;
    s = KVP_OK;
    kvp__ec_res_t *e = ok ? kvp__ec_resset_get(&r->res, f->hash) : NULL;
    if (e && !kvp__ec_tensor_same(&e->t, &f->t))
        s = KVP_ERR_INVALID_ARG;
    if (!ok || e) {
        kvp__ec_alloc_put(&r->alloc, f->ext);
    } else if (!kvp__ec_resset_insert(&r->res, f->hash, f->ext, &f->t, false)) {
        kvp__ec_alloc_put(&r->alloc, f->ext);
        s = KVP_ERR_NO_MEMORY;
    }
out:
    pthread_mutex_unlock(&r->mu);
    return s;
}

kvp_status_t kvp__ec_resv_put_resident(kvp__ec_resv_t *r, const char *mm_hash, const kvp__ec_tensor_t *t,
                                       const void *src)
{
    if (!t || (t->nbytes && !src))
        return KVP_ERR_INVALID_ARG;
    uint8_t *dst;
    uint64_t id;
    kvp_status_t s = kvp__ec_resv_fill_begin(r, mm_hash, t, &dst, &id);
    if (s != KVP_OK || id == 0)
        return s;
    if (t->nbytes)
        memcpy(dst, src, t->nbytes);
    return kvp__ec_resv_fill_end(r, id, true);
}

bool kvp__ec_resv_has_resident(kvp__ec_resv_t *r, const char *mm_hash)
{
    if (!r || !mm_hash)
        return false;
    pthread_mutex_lock(&r->mu);
    bool has = kvp__ec_resset_get(&r->res, mm_hash) != NULL;
    pthread_mutex_unlock(&r->mu);
    return has;
}

static void retire_one(kvp__ec_resv_t *r, kvp__ec_res_t *e,
                       bool (*in_cache)(void *ctx, const char *mm_hash, const uint8_t *ptr), void *ctx)
{
    if (in_cache && in_cache(ctx, e->hash, r->p.slab + e->ext.off))
        return;
    kvp__ec_res_retire(&r->res, e);
}

/* in_cache runs under the lock: it must not call back into r. */
void kvp__ec_resv_retire(kvp__ec_resv_t *r, const char *const *freed, size_t n_freed,
                         bool (*in_cache)(void *ctx, const char *mm_hash, const uint8_t *ptr), void *ctx)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    if (!freed) {
        for (size_t i = 0; i < r->res.map.cap; i++) {
            kvp__ec_res_t *e = r->res.map.slots[i].key ? r->res.map.slots[i].val : NULL;
            if (e && e->pinned)
                retire_one(r, e, in_cache, ctx);
        }
    } else {
        for (size_t i = 0; i < n_freed; i++) {
            kvp__ec_res_t *e = freed[i] ? kvp__ec_resset_get(&r->res, freed[i]) : NULL;
            if (e)
                retire_one(r, e, in_cache, ctx);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

kvp_status_t kvp__ec_resv_drain_reclaimed(kvp__ec_resv_t *r, char ***ids_p, size_t *n_p)
{
    if (!r || !ids_p || !n_p)
        return KVP_ERR_INVALID_ARG;
    pthread_mutex_lock(&r->mu);
    kvp_status_t s = kvp__ec_resset_drain_reclaimed(&r->res, ids_p, n_p);
    pthread_mutex_unlock(&r->mu);
    return s;
}

/* ---- stats and the self-check ------------------------------------------------ */

void kvp__ec_resv_stats(kvp__ec_resv_t *r, kvp__ec_resv_stats_t *st)
{
    if (!r || !st)
        return;
    pthread_mutex_lock(&r->mu);
    *st = r->st;
    st->records = r->n_recs;
    st->active = 0;
    for (int i = 0; i < KVP__EC_R_NUM_STATES; i++) {
        st->by_state[i] = r->by_state[i];
        if (KVP__EC_RS_IN(i, KVP__EC_RS_ACTIVE))
            st->active += r->by_state[i];
    }
    st->tombstones = r->n_tombs;
    st->bytes_reserved = r->bytes_reserved;
    st->residents = r->res.n;
    st->resident_bytes = r->res.bytes;
    st->slab_free_bytes = r->alloc.free_bytes;
    st->fill_bytes = r->fill_bytes;
    pthread_mutex_unlock(&r->mu);
}

void kvp__ec_resv_peer_usage(kvp__ec_resv_t *r, uint64_t peer, size_t *reservations_p, uint64_t *bytes_p)
{
    size_t n = 0;
    uint64_t b = 0;
    if (r) {
        char key[17];
        snprintf(key, sizeof key, "%016" PRIx64, peer);
        pthread_mutex_lock(&r->mu);
        kvp__ec_peer_t *p = kvp__strmap_get(&r->peers, key, 16);
        if (p) {
            n = p->n;
            b = p->bytes;
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (reservations_p)
        *reservations_p = n;
    if (bytes_p)
        *bytes_p = b;
}


#define CHECK(cond, ...)                           \
    do {                                           \
        if (!(cond)) {                             \
            kvp__ec_set_err(err, errlen, __VA_ARGS__);     \
            s = KVP_ERR_INTERNAL;                  \
            goto out;                              \
        }                                          \
    } while (0)

static int ext_cmp(const void *a, const void *b)
{
    const kvp__ec_ext_t *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

kvp_status_t kvp__ec_resv_validate(kvp__ec_resv_t *r, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    kvp_status_t s = KVP_OK;
    pthread_mutex_lock(&r->mu);
    const kvp__ec_alloc_t *a = &r->alloc;
    size_t n_ext = a->n_free + a->n_used, k = 0;
    kvp__ec_ext_t *ext = kvp__malloc((n_ext ? n_ext : 1) * sizeof *ext);
    uint64_t by_state[KVP__EC_R_NUM_STATES] = {0}, bytes = 0, n_recs = 0, n_tombs = 0;
    if (!ext) {
        s = KVP_ERR_NO_MEMORY;
        goto out;
    }
    /* the free list */
    uint64_t fsum = 0;
    CHECK(a->n_free <= a->n_used + 1 && a->cap_free >= a->n_used + 1, "free list capacity");
    for (size_t i = 0; i < a->n_free; i++) {
        CHECK(a->free[i].size > 0, "empty free extent");
        CHECK(i == 0 || a->free[i - 1].off + a->free[i - 1].size < a->free[i].off, "free list unsorted or uncoalesced");
        fsum += a->free[i].size;
        ext[k++] = a->free[i];
    }
    CHECK(fsum == a->free_bytes, "free bytes %" PRIu64 " != %" PRIu64, fsum, a->free_bytes);
    /* the records */
    size_t owning = 0, leases_total = 0;
    for (size_t i = 0; i < r->recs.cap; i++) {
        if (!r->recs.slots[i].key)
            continue;
        kvp__ec_rrec_t *rec = r->recs.slots[i].val;
        n_recs++;
        by_state[rec->state]++;
        bool active = KVP__EC_RS_IN(rec->state, KVP__EC_RS_ACTIVE);
        CHECK(kvp__list_linked(&rec->alink) == active, "%s: active list", rec->tid);
        CHECK(kvp__list_linked(&rec->tlink) == !active, "%s: tombstone list", rec->tid);
        n_tombs += !active;
        CHECK(!(rec->has_ext && rec->lease), "%s: an extent and a lease", rec->tid);
        CHECK(active || (!rec->has_ext && !rec->lease && !rec->writer && kvp__list_empty(&rec->followers)),
              "%s: a tombstone holding memory", rec->tid);
        CHECK(!active || rec->has_ext || rec->lease || rec->writer, "%s: active without memory", rec->tid);
        CHECK(!active || rec->peer, "%s: active without a peer", rec->tid);
        CHECK(active || !rec->peer, "%s: a tombstone charged to a peer", rec->tid);
        CHECK(rec->acct_bytes == (rec->has_ext ? rec->ext.size : 0), "%s: accounted bytes", rec->tid);
        if (rec->writer) {
            CHECK(rec->state == KVP__EC_R_WRITING && rec->writer->has_ext && !rec->writer->writer &&
                      KVP__EC_RS_IN(rec->writer->state, KVP__EC_RS_WRITER_OWNED) && kvp__list_linked(&rec->flink),
                  "%s: follower of a writer that cannot be followed", rec->tid);
            CHECK(kvp__strmap_gets(&r->recs, rec->writer->tid) == rec->writer, "%s: follows a removed writer",
                  rec->tid);
        } else {
            CHECK(!kvp__list_linked(&rec->flink), "%s: on a followers list without a writer", rec->tid);
        }
        CHECK(kvp__list_empty(&rec->followers) || (rec->has_ext && KVP__EC_RS_IN(rec->state, KVP__EC_RS_WRITER_OWNED)),
              "%s: followers of a record that is no writer", rec->tid);
        CHECK(!KVP__EC_RS_IN(rec->state, KVP__EC_RS_WRITER_OWNED) || rec->writer || rec->has_ext,
              "%s: writer without an extent", rec->tid);
        CHECK(rec->state != KVP__EC_R_READY || !rec->writer, "%s: READY follower", rec->tid);
        bool own = rec->has_ext && !rec->writer && KVP__EC_RS_IN(rec->state, KVP__EC_RS_WRITER_OWNED);
        CHECK(kvp__list_linked(&rec->olink) == own, "%s: owning list", rec->tid);
        owning += own;
        if (rec->has_ext) {
            CHECK(k < n_ext, "more extents than allocated");
            CHECK(rec->ext.size == kvp__ec_alloc_round(rec->t.nbytes), "%s: extent size", rec->tid);
            ext[k++] = rec->ext;
            bytes += rec->ext.size;
        }
        if (rec->lease) {
            CHECK(kvp__ec_resset_get(&r->res, rec->hash) == rec->lease, "%s: lease on a dead entry", rec->tid);
            leases_total++;
        }
        CHECK(!active || rec->rid[0], "%s: active without a reservation id", rec->tid);
        CHECK(rec->hash[0] || (!active && !rec->rid[0]), "%s: a hash-less record", rec->tid);
    }
    CHECK(n_recs == r->n_recs && n_tombs == r->n_tombs, "record counts");
    CHECK(n_tombs <= r->p.max_tombstones, "%" PRIu64 " tombstones over the cap", n_tombs);
    for (int i = 0; i < KVP__EC_R_NUM_STATES; i++)
        CHECK(by_state[i] == r->by_state[i], "by_state[%s]", kvp__ec_rstate_name(i));
    CHECK(bytes == r->bytes_reserved, "bytes_reserved %" PRIu64 " != %" PRIu64, bytes, r->bytes_reserved);
    size_t n_owning = 0;
    KVP_LIST_FOR_EACH(n, &r->owning)
        n_owning++;
    CHECK(n_owning == owning, "owning list length");
    /* the writers index */
    for (size_t i = 0; i < r->writers.cap; i++) {
        if (!r->writers.slots[i].key)
            continue;
        kvp__ec_rrec_t *w = r->writers.slots[i].val;
        CHECK(kvp__strmap_gets(&r->recs, w->tid) == w && !strcmp(w->hash, r->writers.slots[i].key) &&
                  !w->writer && w->has_ext && KVP__EC_RS_IN(w->state, KVP__EC_RS_WRITER_OWNED),
              "writers[%s]: not a live writer", r->writers.slots[i].key);
    }
    /* the resident set */
    uint64_t rbytes = 0, rn = 0, leases = 0, lru = 0;
    for (size_t i = 0; i < r->res.map.cap; i++) {
        if (!r->res.map.slots[i].key)
            continue;
        kvp__ec_res_t *e = r->res.map.slots[i].val;
        rn++;
        rbytes += e->ext.size;
        leases += e->leases;
        CHECK(kvp__list_linked(&e->lru) == (!e->pinned && e->leases == 0), "resident %s: LRU rule", e->hash);
        CHECK(k < n_ext, "more extents than allocated");
        ext[k++] = e->ext;
    }
    KVP_LIST_FOR_EACH(n, &r->res.lru)
        lru++;
    CHECK(rn == r->res.n && rbytes == r->res.bytes, "resident counts");
    CHECK(leases == leases_total, "leases %" PRIu64 " != %zu held", leases, leases_total);
    size_t n_lru = 0;
    for (size_t i = 0; i < r->res.map.cap; i++)
        if (r->res.map.slots[i].key && kvp__list_linked(&((kvp__ec_res_t *)r->res.map.slots[i].val)->lru))
            n_lru++;
    CHECK(lru == n_lru, "LRU list length");
    /* the fills */
    uint64_t fbytes = 0;
    for (size_t i = 0; i < KVP__EC_MAX_FILLS; i++) {
        if (!r->fills[i].used)
            continue;
        CHECK(k < n_ext, "more extents than allocated");
        ext[k++] = r->fills[i].ext;
        fbytes += r->fills[i].ext.size;
    }
    CHECK(fbytes == r->fill_bytes, "fill bytes %" PRIu64 " != %" PRIu64, fbytes, r->fill_bytes);
    /* every extent: disjoint, the whole slab */
    CHECK(k == n_ext, "%zu extents found, %zu expected", k, n_ext);
    qsort(ext, k, sizeof *ext, ext_cmp);
    uint64_t end = 0;
    for (size_t i = 0; i < k; i++) {
        CHECK(ext[i].off == end, "extent at %" PRIu64 ": gap or overlap (expected %" PRIu64 ")", ext[i].off, end);
        end = ext[i].off + ext[i].size;
    }
    CHECK(end == a->size, "extents end at %" PRIu64 ", slab is %" PRIu64, end, a->size);
    CHECK(a->free_bytes + r->bytes_reserved + r->res.bytes + r->fill_bytes == a->size, "byte sum");
    /* peers */
    for (size_t i = 0; i < r->peers.cap; i++) {
        if (!r->peers.slots[i].key)
            continue;
        kvp__ec_peer_t *p = r->peers.slots[i].val;
        size_t pn = 0;
        uint64_t pb = 0;
        for (size_t j = 0; j < r->recs.cap; j++) {
            kvp__ec_rrec_t *rec = r->recs.slots[j].key ? r->recs.slots[j].val : NULL;
            if (rec && rec->peer == p) {
                pn++;
                pb += rec->peer_bytes;
            }
        }
        CHECK(pn == p->n && pb == p->bytes && !p->hold && (p->n || p->bytes), "peer %" PRIu64 " accounting", p->id);
    }
out:
    if (ext)
        kvp__free(ext, (n_ext ? n_ext : 1) * sizeof *ext);
    pthread_mutex_unlock(&r->mu);
    return s;
}
