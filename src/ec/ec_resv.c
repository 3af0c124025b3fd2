/*
 * The consumer's reservations: see ec_resv.h for the contract and ec_slab.h
 * for the allocator and the resident set underneath.
 *
 * The life of a reservation (reservation.py, connectors-spec §3.6).  A
 * reserve of a transfer id makes a record in one of three ways: served from
 * the resident set (READY at once, holding a lease on the resident entry),
 * following a writer of the same mm_hash still WRITING (WRITING, no memory of
 * its own; READY when that writer completes), or with a fresh extent (a
 * writer: WRITING, the producer writes the bytes).  A writer's complete makes
 * it READY under a new lease; a take hands the tensor to the engine through
 * the resident set and removes the record.  A writer's memory may still be
 * written by RDMA, so neither a cancel nor a lease running out frees it:
 * the record is parked in CANCEL_PENDING / EXPIRE_PENDING until the
 * writer's complete, or a cancel with abandon (the producer says its write
 * has stopped), ends it -- or one more lease passes (a dead writer; see
 * defer).  Every end is a tombstone (CANCELLED: a
 * later reserve answers cancelled; EXPIRED: a later reserve starts afresh)
 * kept lease_ms, and at most max_tombstones of them, oldest first.
 *
 *   WRITING        -> READY | CANCEL_PENDING | EXPIRE_PENDING | CANCELLED
 *   READY          -> CANCELLED | EXPIRED
 *   CANCEL_PENDING -> CANCELLED
 *   EXPIRE_PENDING -> CANCELLED | EXPIRED
 *   CANCELLED, EXPIRED: none
 *
 * (reservation.py _ALLOWED_TRANSITIONS exactly; a refresh of a WRITING
 * record goes WRITING -> EXPIRE_PENDING -> EXPIRED.)  A record is created
 * WRITING or READY (reserve) or CANCELLED (a cancel of an unknown id), and
 * removed by a take (from READY), by a reserve of an EXPIRED id, or by the
 * tombstone reaper.
 *
 * Followers.  The second transfer id of an mm_hash being written follows the
 * writer (record->writer, on the writer's followers list).  When the writer
 * completes -- also from a *_PENDING state, its bytes are whole -- its extent
 * is published to the resident set unpinned, the writer and every follower
 * take a lease on it, and the followers become READY and are queued for
 * drain_ready (their readiness events).  When the writer ends without
 * completing, its followers are cancelled with it.
 *
 * Residents (where this file differs from memory.py, on purpose).  memory.py
 * publishes by inserting a new entry over an existing one for the hash and
 * freeing the old one when nobody leases it, even while the engine holds
 * its tensor.  Here an entry is never displaced: a publish that finds an
 * entry of the same shape and dtype keeps that one (the bytes are the same
 * tensor: same mm_hash) and frees the newcomer's extent; one that finds a
 * conflicting entry (a producer bug: two shapes under one content hash)
 * refuses -- the take fails as "not ready", a writer's followers are
 * cancelled and the writer completes alone.  So a pointer the engine got
 * stays valid while its entry is pinned, and a lease always names a live
 * entry.  put_resident of a hash already resident with the same tensor is a
 * no-op.
 *
 * Accounting.  Every allocated extent belongs to exactly one active record
 * (a writer, or a READY writer that had no followers), one resident
 * entry or one fill, so slab_free_bytes + bytes_reserved + resident_bytes + fill_bytes
 * == slab_size (fill_bytes: extents the cross-encoder cache is filling).
 * Per peer (kvpool's caps): a peer's reservations are its active records,
 * followers and cached ones included; its bytes are the extents its
 * records own (the rounded sizes).  Followers and cached records own none,
 * and a writer's extent stops counting once published to the resident set,
 * which no peer owns (unpinned entries are reclaimed under pressure, pinned
 * ones are bounded by the engine's cache).  Peer 0 is counted but never
 * capped.  rec_sync() recomputes what a record contributes after every
 * change to its state or memory.
 *
 * Tombstones are reaped at the end of every call that can make one (cancel,
 * complete, expire, begin_shutdown, a reserve that expired to make room):
 * the cap holds after every call.  The seed reaps in cancel and expire
 * only, and its worker expires before every reserve, which a caller of this
 * object should do too (kvp__ec_resv_expire).
 *
 * Locking: one mutex; every static function below runs with it held.
 * wait_for_writers waits on the condition variable (CLOCK_MONOTONIC, real
 * time: the params clock drives leases only).
 */
#include "ec/ec_resv.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/alloc.h"
#include "ec/ec_json.h"
#include "common/assert.h"
#include "common/log.h"
#include "common/random.h"
#include "ec/ec_resv_int.h"

static const uint8_t g_allowed[KVP__EC_R_NUM_STATES] = {
    [KVP__EC_R_WRITING] = KVP__EC_RS(KVP__EC_R_READY) | KVP__EC_RS(KVP__EC_R_CANCEL_PENDING) |
                          KVP__EC_RS(KVP__EC_R_EXPIRE_PENDING) |
                          KVP__EC_RS(KVP__EC_R_CANCELLED),
    [KVP__EC_R_READY] = KVP__EC_RS(KVP__EC_R_CANCELLED) | KVP__EC_RS(KVP__EC_R_EXPIRED),
    [KVP__EC_R_CANCEL_PENDING] = KVP__EC_RS(KVP__EC_R_CANCELLED),
    [KVP__EC_R_EXPIRE_PENDING] = KVP__EC_RS(KVP__EC_R_CANCELLED) | KVP__EC_RS(KVP__EC_R_EXPIRED),
    [KVP__EC_R_CANCELLED] = 0,
    [KVP__EC_R_EXPIRED] = 0,
};

static const char *const g_names[KVP__EC_R_NUM_STATES] = {
    "WRITING", "READY", "CANCEL_PENDING", "EXPIRE_PENDING", "CANCELLED", "EXPIRED",
};

const char *kvp__ec_rstate_name(kvp__ec_rstate_t s)
{
    return (unsigned)s < KVP__EC_R_NUM_STATES ? g_names[s] : "UNKNOWN";
}

bool kvp__ec_rstate_allowed(kvp__ec_rstate_t from, kvp__ec_rstate_t to)
{
    if ((unsigned)from >= KVP__EC_R_NUM_STATES || (unsigned)to >= KVP__EC_R_NUM_STATES)
        return false;
    return (g_allowed[from] & KVP__EC_RS(to)) != 0;
}

/* ---- the object ------------------------------------------------------------ */

static int64_t clock_ms(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t now_ms(kvp__ec_resv_t *r) { return r->p.now_ms(r->p.clock_ctx); }

static int64_t lease_end(kvp__ec_resv_t *r, int64_t now)
{
    return now > INT64_MAX - r->p.lease_ms ? INT64_MAX - 1 : now + r->p.lease_ms;
}

void kvp__ec_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || !errlen)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ---- peers ------------------------------------------------------------------ */

static kvp__ec_peer_t *peer_get(kvp__ec_resv_t *r, uint64_t id)
{
    char key[17];
    snprintf(key, sizeof key, "%016" PRIx64, id);
    kvp__ec_peer_t *p = kvp__strmap_get(&r->peers, key, 16);
    if (p)
        return p;
    p = kvp__calloc(1, sizeof *p);
    if (!p)
        return NULL;
    memcpy(p->key, key, sizeof key);
    p->id = id;
    if (kvp__strmap_put(&r->peers, p->key, 16, p) != KVP_OK) {
        kvp__free(p, sizeof *p);
        return NULL;
    }
    return p;
}

static void peer_gc(kvp__ec_resv_t *r, kvp__ec_peer_t *p)
{
    if (p->n || p->bytes || p->hold)
        return;
    kvp__strmap_del(&r->peers, p->key, 16);
    kvp__free(p, sizeof *p);
}

/* ---- records ---------------------------------------------------------------- */

static void rid_fill(char rid[KVP__EC_RID_LEN + 1], const uint8_t raw[KVP__EC_RID_LEN / 2])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < KVP__EC_RID_LEN / 2; i++) {
        rid[2 * i] = hex[raw[i] >> 4];
        rid[2 * i + 1] = hex[raw[i] & 15];
    }
    rid[KVP__EC_RID_LEN] = '\0';
}

/* Recomputes what rec contributes (alive: still in the table): its bytes to
 * bytes_reserved and its peer, its peer's count, its place on the owning
 * list.  Called after every change of state, extent or lease. */
static void rec_sync(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, bool alive)
{
    bool active = alive && KVP__EC_RS_IN(rec->state, KVP__EC_RS_ACTIVE);
    uint64_t want = alive && rec->has_ext ? rec->ext.size : 0;
    r->bytes_reserved = r->bytes_reserved - rec->acct_bytes + want;
    rec->acct_bytes = want;
    /* a record leaving the active states still holds its extent until
     * release() a moment later; its peer stops paying for it now */
    uint64_t pwant = active ? want : 0;
    if (rec->peer) {
        rec->peer->bytes = rec->peer->bytes - rec->peer_bytes + pwant;
        rec->peer_bytes = pwant;
    }
    kvp__assert(pwant == 0 || rec->peer);
    if (rec->peer && !active) {
        kvp__ec_peer_t *p = rec->peer;
        kvp__assert(p->n > 0 && rec->peer_bytes == 0);
        p->n--;
        rec->peer = NULL;
        peer_gc(r, p);
    }
    bool owning = alive && rec->has_ext && !rec->writer && KVP__EC_RS_IN(rec->state, KVP__EC_RS_WRITER_OWNED);
    if (owning && !kvp__list_linked(&rec->olink))
        kvp__list_add_tail(&r->owning, &rec->olink);
    else if (!owning)
        kvp__list_del(&rec->olink);
}

/* The one set-state: KVP_ERR_STATE (logged; nothing changes) when from ->
 * to is not in the table.  Every caller checks the state first, so a
 * rejection is a bug here, not a peer's doing. */
static kvp_status_t set_state(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, kvp__ec_rstate_t to)
{
    if (!kvp__ec_rstate_allowed(rec->state, to)) {
        kvp_error("ec resv: transfer %s: no transition %s -> %s", rec->tid, kvp__ec_rstate_name(rec->state),
                  kvp__ec_rstate_name(to));
        kvp__assert(!"reservation transition not in the table");
        return KVP_ERR_STATE;
    }
    r->by_state[rec->state]--;
    r->by_state[to]++;
    if (KVP__EC_RS_IN(rec->state, KVP__EC_RS_ACTIVE) && !KVP__EC_RS_IN(to, KVP__EC_RS_ACTIVE))
        kvp__list_del(&rec->alink);
    rec->state = to;
    rec_sync(r, rec, true);
    return KVP_OK;
}

static void rec_free(kvp__ec_rrec_t *rec)
{
    kvp__strfree(rec->tid);
    kvp__strfree(rec->hash);
    kvp__free(rec, sizeof *rec);
}

/* A new record in state st (WRITING, READY or CANCELLED) for tid, charged
 * to peer when active.  with_rid: a fresh random reservation id (else "").
 * KVP_ERR_NO_MEMORY, KVP_ERR_IO (no random bytes). */
static kvp_status_t rec_new(kvp__ec_resv_t *r, const char *tid, const char *hash, kvp__ec_rstate_t st,
                            const kvp__ec_tensor_t *t, kvp__ec_peer_t *peer, bool with_rid, kvp__ec_rrec_t **rec_p)
{
    uint8_t raw[KVP__EC_RID_LEN / 2];
    if (with_rid) {
        kvp_status_t s = kvp__random_bytes(raw, sizeof raw);
        if (s != KVP_OK)
            return s;
    }
    kvp__ec_rrec_t *rec = kvp__calloc(1, sizeof *rec);
    if (!rec)
        return KVP_ERR_NO_MEMORY;
    rec->tid = kvp__strdup(tid);
    rec->hash = kvp__strdup(hash);
    if (!rec->tid || !rec->hash) {
        rec_free(rec);
        return KVP_ERR_NO_MEMORY;
    }
    rec->tid_len = strlen(rec->tid);
    if (kvp__strmap_put(&r->recs, rec->tid, rec->tid_len, rec) != KVP_OK) {
        rec_free(rec);
        return KVP_ERR_NO_MEMORY;
    }
    if (with_rid)
        rid_fill(rec->rid, raw);
    rec->state = st;
    if (t)
        rec->t = *t;
    kvp__list_init(&rec->followers);
    kvp__list_init(&rec->flink);
    kvp__list_init(&rec->alink);
    kvp__list_init(&rec->tlink);
    kvp__list_init(&rec->olink);
    r->n_recs++;
    r->by_state[st]++;
    if (KVP__EC_RS_IN(st, KVP__EC_RS_ACTIVE)) {
        kvp__list_add_tail(&r->active, &rec->alink);
        if (peer) {
            rec->peer = peer;
            peer->n++;
        }
    }
    *rec_p = rec;
    return KVP_OK;
}

/* reservation.py _remove: the record leaves every structure.  Its memory
 * was released or handed on already. */
void kvp__ec_resv_do_remove(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec)
{
    kvp__assert(!rec->has_ext && !rec->lease && kvp__list_empty(&rec->followers));
    if (kvp__strmap_gets(&r->writers, rec->hash) == rec)
        kvp__strmap_del(&r->writers, rec->hash, strlen(rec->hash));
    kvp__list_del(&rec->flink);
    rec->writer = NULL;
    kvp__list_del(&rec->alink);
    if (kvp__list_linked(&rec->tlink)) {
        kvp__list_del(&rec->tlink);
        r->n_tombs--;
    }
    rec_sync(r, rec, false);
    r->by_state[rec->state]--;
    r->n_recs--;
    kvp__strmap_del(&r->recs, rec->tid, rec->tid_len);
    rec_free(rec);
}

static void set_tombstone(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, int64_t now)
{
    rec->expires_at = lease_end(r, now);
    if (kvp__list_linked(&rec->tlink))
        kvp__list_del(&rec->tlink);
    else
        r->n_tombs++;
    kvp__list_add_tail(&r->tombs, &rec->tlink);
}

/* reservation.py _reap_tombstones: the oldest tombstones while past their
 * deadline or beyond the cap. */
static void reap(kvp__ec_resv_t *r, int64_t now)
{
    for (;;) {
        kvp__ec_rrec_t *t = KVP_LIST_FIRST_ENTRY(&r->tombs, kvp__ec_rrec_t, tlink);
        if (!t || (t->expires_at > now && r->n_tombs <= r->p.max_tombstones))
            return;
        kvp__ec_resv_do_remove(r, t);
    }
}

static void terminate(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, kvp__ec_rstate_t to, int64_t now);

/* reservation.py _release: a follower lets go of its writer; a writer
 * cancels its followers and frees (or stops leasing) its memory. */
static void release(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, int64_t now)
{
    if (rec->writer) {
        kvp__list_del(&rec->flink);
        rec->writer = NULL;
        rec_sync(r, rec, true);
        return;
    }
    if (kvp__strmap_gets(&r->writers, rec->hash) == rec)
        kvp__strmap_del(&r->writers, rec->hash, strlen(rec->hash));
    KVP_LIST_FOR_EACH_ENTRY_SAFE(f, tmp, &rec->followers, kvp__ec_rrec_t, flink)
        terminate(r, f, KVP__EC_R_CANCELLED, now); /* unlinks f only */
    if (rec->lease) {
        kvp__ec_res_release(&r->res, rec->lease);
        rec->lease = NULL;
    } else if (rec->has_ext) {
        kvp__ec_alloc_put(&r->alloc, rec->ext);
        rec->has_ext = false;
    }
    rec_sync(r, rec, true);
}

/* reservation.py _terminate: to a tombstone, memory released. */
static void terminate(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, kvp__ec_rstate_t to, int64_t now)
{
    if (set_state(r, rec, to) != KVP_OK)
        return;
    release(r, rec, now);
    set_tombstone(r, rec, now);
}

/* reservation.py _defer: parked until the writer completes or abandons --
 * or, kvpool's addition, until one more lease has passed: the seed parks
 * with no deadline, so a producer that dies mid-write (it never completes
 * nor abandons) would hold the memory for ever.  A writer still writing a
 * whole lease after its reservation ran out is taken for dead: the TCP
 * receiver has dropped its connection long before (idle_ms, 30 s, against
 * a 300 s lease), and a one-sided put cannot be stopped by the consumer in
 * any case (docs/ec-push.md). */
static void defer(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec, kvp__ec_rstate_t to, int64_t now)
{
    if (set_state(r, rec, to) == KVP_OK)
        rec->expires_at = lease_end(r, now);
}

/* reservation.py _expire_locked.  Returns the READY records expired.
 * A READY record and a follower have no followers, so ending one takes only
 * itself off the active list; ending a parked writer (its one more lease
 * has passed) also ends its followers, which may include the iterator's
 * next entry, so the walk starts again after it (the writer is gone from
 * the list: the walk still ends). */
static size_t expire_locked(kvp__ec_resv_t *r, int64_t now)
{
    size_t n = 0;
again:
    KVP_LIST_FOR_EACH_ENTRY_SAFE(rec, tmp, &r->active, kvp__ec_rrec_t, alink) {
        if (rec->expires_at > now)
            continue;
        if (rec->state == KVP__EC_R_READY) {
            terminate(r, rec, KVP__EC_R_EXPIRED, now);
            n++;
            r->st.expired++;
        } else if (rec->state == KVP__EC_R_WRITING) {
            if (rec->writer)
                terminate(r, rec, KVP__EC_R_CANCELLED, now);
            else
                defer(r, rec, KVP__EC_R_EXPIRE_PENDING, now);
            r->st.expired++;
        } else if (rec->state == KVP__EC_R_CANCEL_PENDING || rec->state == KVP__EC_R_EXPIRE_PENDING) {
            /* the writer never came back (see defer) */
            terminate(r, rec, rec->state == KVP__EC_R_CANCEL_PENDING ? KVP__EC_R_CANCELLED : KVP__EC_R_EXPIRED, now);
            r->st.writers_abandoned++;
            goto again;
        }
    }
    reap(r, now);
    return n;
}

/* ---- create / destroy ------------------------------------------------------- */

kvp_status_t kvp__ec_resv_create(const kvp__ec_resv_params_t *p, kvp__ec_resv_t **r_p)
{
    if (!p || !r_p || !p->slab || p->slab_size == 0 || p->lease_ms < 1)
        return KVP_ERR_INVALID_ARG;
    kvp__ec_resv_t *r = kvp__calloc(1, sizeof *r);
    if (!r)
        return KVP_ERR_NO_MEMORY;
    r->p = *p;
    if (!r->p.now_ms) {
        r->p.now_ms = clock_ms;
        r->p.clock_ctx = NULL;
    }
    if (kvp__ec_alloc_init(&r->alloc, p->slab_size) != KVP_OK) {
        kvp__free(r, sizeof *r);
        return KVP_ERR_NO_MEMORY;
    }
    kvp__ec_resset_init(&r->res);
    kvp__strmap_init(&r->recs);
    kvp__strmap_init(&r->writers);
    kvp__strmap_init(&r->peers);
    kvp__list_init(&r->active);
    kvp__list_init(&r->tombs);
    kvp__list_init(&r->owning);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&r->mu, NULL);
    *r_p = r;
    return KVP_OK;
}

void kvp__ec_resv_destroy(kvp__ec_resv_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->recs.cap; i++)
        if (r->recs.slots[i].key)
            rec_free(r->recs.slots[i].val);
    for (size_t i = 0; i < r->peers.cap; i++)
        if (r->peers.slots[i].key)
            kvp__free(r->peers.slots[i].val, sizeof(kvp__ec_peer_t));
    kvp__strmap_cleanup(&r->recs);
    kvp__strmap_cleanup(&r->writers);
    kvp__strmap_cleanup(&r->peers);
    kvp__ec_resset_cleanup(&r->res);
    kvp__ec_alloc_cleanup(&r->alloc);
    kvp__ec_strv_free(r->ready, r->cap_ready);
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    kvp__free(r, sizeof *r);
}

/* ---- reserve ---------------------------------------------------------------- */

static uint64_t rec_offset(const kvp__ec_rrec_t *rec)
{
    if (rec->has_ext)
        return rec->ext.off;
    if (rec->lease)
        return rec->lease->ext.off;
    if (rec->writer)
        return rec->writer->ext.off;
    return 0;
}

/* The reply worker.py builds from a record. */
static void fill_out(const kvp__ec_rrec_t *rec, const kvp__ec_reserve_in_t *in, bool write, kvp__ec_reserve_out_t *out)
{
    memset(out, 0, sizeof *out);
    if (rec->state == KVP__EC_R_CANCEL_PENDING || rec->state == KVP__EC_R_CANCELLED) {
        out->nbytes = in->t.nbytes;
        out->cancelled = true;
        return;
    }
    memcpy(out->reservation_id, rec->rid, sizeof out->reservation_id);
    out->offset = rec_offset(rec);
    out->nbytes = rec->t.nbytes;
    out->write = write;
    out->ready = rec->state == KVP__EC_R_READY;
    out->cached = rec->lease != NULL;
}

/* An extent for nbytes: allocate; on failure expire (when allowed) and
 * retry; then evict evictable residents, oldest first, retrying after each
 * (memory.py reclaim_and_allocate).  KVP_OK, KVP_ERR_NO_SPACE,
 * KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_resv_do_alloc(kvp__ec_resv_t *r, uint64_t nbytes, bool may_expire, int64_t now,
                                     kvp__ec_ext_t *ext_p)
{
    uint64_t size = kvp__ec_alloc_round(nbytes);
    if (size == 0 || size > r->alloc.size)
        return KVP_ERR_NO_SPACE; /* never fits: evict nothing for it */
    kvp_status_t s = kvp__ec_alloc_get(&r->alloc, nbytes, ext_p);
    if (s != KVP_ERR_NO_SPACE)
        return s;
    if (may_expire) {
        expire_locked(r, now);
        s = kvp__ec_alloc_get(&r->alloc, nbytes, ext_p);
        if (s != KVP_ERR_NO_SPACE)
            return s;
    }
    for (;;) {
        int ev = kvp__ec_resset_evict_lru(&r->res, &r->alloc);
        if (ev < 0)
            return KVP_ERR_NO_MEMORY;
        if (ev == 0)
            return KVP_ERR_NO_SPACE;
        r->st.reclaimed++;
        s = kvp__ec_alloc_get(&r->alloc, nbytes, ext_p);
        if (s != KVP_ERR_NO_SPACE)
            return s;
    }
}

static kvp_status_t do_reserve(kvp__ec_resv_t *r, const kvp__ec_reserve_in_t *in, kvp__ec_reserve_out_t *out,
                               char *err, size_t errlen)
{
    int64_t now = now_ms(r);
    r->st.reserves++;
    if (r->shutting_down) {
        kvp__ec_set_err(err, errlen, "Consumer reservation manager is shutting down");
        return KVP_ERR_CLOSED;
    }
    kvp__ec_rrec_t *rec = kvp__strmap_gets(&r->recs, in->transfer_id);
    if (rec && rec->state == KVP__EC_R_CANCELLED) {
        fill_out(rec, in, false, out);
        return KVP_OK;
    }
    if (rec && rec->state == KVP__EC_R_EXPIRED) {
        kvp__ec_resv_do_remove(r, rec);
        rec = NULL;
    }
    if (rec && rec->state == KVP__EC_R_EXPIRE_PENDING) {
        kvp__jw_t q;
        kvp__jw_init(&q);
        kvp__ec_py_repr(&q, in->transfer_id, strlen(in->transfer_id), 120);
        kvp__ec_set_err(err, errlen, "Transfer %.*s still has an active writer", q.oom ? 0 : (int)q.len,
                        q.p ? q.p : "");
        kvp__jw_cleanup(&q);
        return KVP_ERR_STATE;
    }
    if (rec) {
        if (strcmp(rec->hash, in->mm_hash) != 0 || !kvp__ec_tensor_same(&rec->t, &in->t)) {
            kvp__ec_set_err(err, errlen, "conflicting reservation for transfer_id");
            return KVP_ERR_INVALID_ARG;
        }
        if (rec->state == KVP__EC_R_WRITING)
            rec->expires_at = lease_end(r, now);
        fill_out(rec, in, false, out);
        return KVP_OK;
    }

    kvp__ec_peer_t *p = peer_get(r, in->peer);
    if (!p)
        return KVP_ERR_NO_MEMORY;
    p->hold++;
    kvp_status_t s = KVP_OK;
    if (in->peer && r->p.peer_max_reservations && p->n >= r->p.peer_max_reservations)
        goto capped;

    kvp__ec_res_t *e = kvp__ec_resset_get(&r->res, in->mm_hash);
    if (e) {
        if (!kvp__ec_tensor_same(&e->t, &in->t)) {
            kvp__ec_set_err(err, errlen, "conflicting cached tensor for mm_hash");
            s = KVP_ERR_INVALID_ARG;
            goto out;
        }
        s = rec_new(r, in->transfer_id, in->mm_hash, KVP__EC_R_READY, &in->t, p, true, &rec);
        if (s != KVP_OK)
            goto out;
        rec->lease = e;
        kvp__ec_res_acquire(&r->res, e);
        rec->expires_at = lease_end(r, now);
        r->st.reserves_cached++;
        fill_out(rec, in, false, out);
        goto out;
    }

    kvp__ec_rrec_t *w = kvp__strmap_gets(&r->writers, in->mm_hash);
    if (w && w->state == KVP__EC_R_WRITING) {
        if (!kvp__ec_tensor_same(&w->t, &in->t)) {
            kvp__ec_set_err(err, errlen, "conflicting in-flight tensor for mm_hash");
            s = KVP_ERR_INVALID_ARG;
            goto out;
        }
        s = rec_new(r, in->transfer_id, in->mm_hash, KVP__EC_R_WRITING, &in->t, p, true, &rec);
        if (s != KVP_OK)
            goto out;
        rec->writer = w;
        kvp__list_add_tail(&w->followers, &rec->flink);
        rec->expires_at = lease_end(r, now);
        fill_out(rec, in, false, out);
        goto out;
    }

    uint64_t size = kvp__ec_alloc_round(in->t.nbytes);
    uint64_t cap = r->p.peer_max_bytes;
    if (in->peer && cap && size && (size > cap || p->bytes > cap - size))
        goto capped;
    kvp__ec_ext_t ext;
    s = kvp__ec_resv_do_alloc(r, in->t.nbytes, true, now, &ext);
    if (s == KVP_ERR_NO_SPACE) {
        r->st.reserves_full++;
        kvp__ec_set_err(err, errlen, "EC consumer buffer pool is full");
        goto out;
    }
    if (s != KVP_OK)
        goto out;
    s = rec_new(r, in->transfer_id, in->mm_hash, KVP__EC_R_WRITING, &in->t, p, true, &rec);
    if (s != KVP_OK) {
        kvp__ec_alloc_put(&r->alloc, ext);
        goto out;
    }
    if (kvp__strmap_put(&r->writers, rec->hash, strlen(rec->hash), rec) != KVP_OK) {
        kvp__ec_alloc_put(&r->alloc, ext);
        kvp__ec_resv_do_remove(r, rec);
        s = KVP_ERR_NO_MEMORY;
        goto out;
    }
    rec->has_ext = true;
    rec->ext = ext;
    rec->expires_at = lease_end(r, now);
    rec_sync(r, rec, true);
    fill_out(rec, in, true, out);
    goto out;

capped:
    r->st.reserves_capped++;
    kvp__ec_set_err(err, errlen, "peer reservation cap reached");
    s = KVP_ERR_BUSY;
out:
    p->hold--;
    peer_gc(r, p);
    return s;
}

kvp_status_t kvp__ec_resv_reserve(kvp__ec_resv_t *r, const kvp__ec_reserve_in_t *in, kvp__ec_reserve_out_t *out,
                                  char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!r || !in || !out || !in->transfer_id || !in->mm_hash)
        return KVP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (!in->transfer_id[0] || !in->mm_hash[0] || in->t.ndim > KVP__EC_MAX_NDIM) {
        kvp__ec_set_err(err, errlen, "transfer_id and mm_hash must be non-empty, ndim <= %d", KVP__EC_MAX_NDIM);
        return KVP_ERR_INVALID_ARG;
    }
    if (strlen(in->mm_hash) >= sizeof(((kvp__ec_status_t *)0)->mm_hash)) {
        kvp__ec_set_err(err, errlen, "mm_hash too long");
        return KVP_ERR_INVALID_ARG;
    }
    pthread_mutex_lock(&r->mu);
    kvp_status_t s = do_reserve(r, in, out, err, errlen);
    pthread_mutex_unlock(&r->mu);
    return s;
}

/* ---- status / complete ------------------------------------------------------ */

kvp_status_t kvp__ec_resv_status(kvp__ec_resv_t *r, const char *transfer_id, kvp__ec_status_t *st)
{
    if (!r || !transfer_id || !st)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t s = KVP_ERR_NOT_FOUND;
    pthread_mutex_lock(&r->mu);
    kvp__ec_rrec_t *rec = kvp__strmap_gets(&r->recs, transfer_id);
    if (rec && KVP__EC_RS_IN(rec->state, KVP__EC_RS_ACTIVE)) {
        memset(st, 0, sizeof *st);
        snprintf(st->mm_hash, sizeof st->mm_hash, "%s", rec->hash);
        st->ready = rec->state == KVP__EC_R_READY;
        memcpy(st->reservation_id, rec->rid, sizeof st->reservation_id);
        st->t = rec->t;
        s = KVP_OK;
    }
    pthread_mutex_unlock(&r->mu);
    return s;
}

/* reservation.py _publish_followers, with the refusals of "Residents" above:
 * on a conflicting resident, or out of memory, the followers are cancelled
 * and the writer keeps its extent. */
static void publish_followers(kvp__ec_resv_t *r, kvp__ec_rrec_t *w, int64_t now)
{
    if (kvp__strmap_gets(&r->writers, w->hash) == w)
        kvp__strmap_del(&r->writers, w->hash, strlen(w->hash));
    if (kvp__list_empty(&w->followers))
        return;
    kvp__assert(w->has_ext && !w->lease);
    size_t nf = 0;
    KVP_LIST_FOR_EACH(n, &w->followers)
        nf++;
    kvp__ec_res_t *e = kvp__ec_resset_get(&r->res, w->hash);
    bool ok = !e || kvp__ec_tensor_same(&e->t, &w->t);
    if (!ok)
        kvp_warn_rl("ec resv: mm_hash %s completed with a tensor unlike its resident one; followers cancelled",
                    w->hash);
    /* the ready ids first (copies in the array's spare slots), so nothing
     * can fail after the first follower moves */
    size_t made = 0;
    if (ok && kvp__grow_in((void **)&r->ready, &r->cap_ready, r->n_ready + nf, sizeof *r->ready, 8) != 0)
        ok = false;
    if (ok) {
        KVP_LIST_FOR_EACH_ENTRY(f, &w->followers, kvp__ec_rrec_t, flink) {
            if (!(r->ready[r->n_ready + made] = kvp__strdup(f->tid))) {
                ok = false;
                break;
            }
            made++;
        }
    }
    if (ok && !e) {
        e = kvp__ec_resset_insert(&r->res, w->hash, w->ext, &w->t, false);
        if (e)
            w->has_ext = false; /* the extent now belongs to the resident set */
        else
            ok = false;
    } else if (ok) {
        kvp__ec_alloc_put(&r->alloc, w->ext); /* the resident copy is the same tensor */
        w->has_ext = false;
    }
    if (!ok) {
        for (size_t i = 0; i < made; i++) {
            kvp__strfree(r->ready[r->n_ready + i]);
            r->ready[r->n_ready + i] = NULL;
        }
        KVP_LIST_FOR_EACH_ENTRY_SAFE(f, tmp, &w->followers, kvp__ec_rrec_t, flink)
            terminate(r, f, KVP__EC_R_CANCELLED, now);
        return;
    }
    w->lease = e;
    kvp__ec_res_acquire(&r->res, e);
    rec_sync(r, w, true);
    KVP_LIST_FOR_EACH_ENTRY_SAFE(f, tmp, &w->followers, kvp__ec_rrec_t, flink) {
        kvp__list_del(&f->flink);
        f->writer = NULL;
        f->lease = e;
        kvp__ec_res_acquire(&r->res, e);
        set_state(r, f, KVP__EC_R_READY);
        f->expires_at = lease_end(r, now);
    }
    r->n_ready += made;
}

void kvp__ec_resv_complete(kvp__ec_resv_t *r, const char *transfer_id, const char *reservation_id,
                           bool *accepted_p, bool *became_ready_p)
{
    bool acc = false, ready = false;
    if (!r || !transfer_id || !reservation_id)
        goto done;
    pthread_mutex_lock(&r->mu);
    int64_t now = now_ms(r);
    kvp__ec_rrec_t *rec = kvp__strmap_gets(&r->recs, transfer_id);
    if (!rec || strcmp(rec->rid, reservation_id) != 0)
        goto unlock;
    if (rec->state == KVP__EC_R_READY) {
        acc = true;
        goto unlock;
    }
    if (rec->writer)
        goto unlock; /* a follower writes nothing, so completes nothing */
    if (KVP__EC_RS_IN(rec->state, KVP__EC_RS_WRITER_OWNED))
        publish_followers(r, rec, now);
    if (KVP__EC_RS_IN(rec->state, KVP__EC_RS_DEFERRED)) {
        terminate(r, rec, rec->state == KVP__EC_R_CANCEL_PENDING ? KVP__EC_R_CANCELLED : KVP__EC_R_EXPIRED, now);
        acc = true;
        reap(r, now);
        goto unlock;
    }
    if (rec->state != KVP__EC_R_WRITING)
        goto unlock;
    if (set_state(r, rec, KVP__EC_R_READY) == KVP_OK) {
        rec->expires_at = lease_end(r, now);
        acc = ready = true;
    }
unlock:
    if (acc)
        r->st.completes++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
done:
    if (accepted_p)
        *accepted_p = acc;
    if (became_ready_p)
        *became_ready_p = ready;
}

static kvp_status_t move_strv(char ***src, size_t *n_src, size_t *cap_src, char ***ids_p, size_t *n_p)
{
    *ids_p = NULL;
    *n_p = 0;
    if (*n_src == 0)
        return KVP_OK;
    char **v = kvp__malloc(*n_src * sizeof *v);
    if (!v)
        return KVP_ERR_NO_MEMORY;
    memcpy(v, *src, *n_src * sizeof *v);
    memset(*src, 0, *cap_src * sizeof **src);
    *ids_p = v;
    *n_p = *n_src;
    *n_src = 0;
    return KVP_OK;
}

kvp_status_t kvp__ec_resv_drain_ready(kvp__ec_resv_t *r, char ***ids_p, size_t *n_p)
{
    if (!r || !ids_p || !n_p)
        return KVP_ERR_INVALID_ARG;
    pthread_mutex_lock(&r->mu);
    kvp_status_t s = move_strv(&r->ready, &r->n_ready, &r->cap_ready, ids_p, n_p);
    pthread_mutex_unlock(&r->mu);
    return s;
}

/* ---- cancel ----------------------------------------------------------------- */

static kvp_status_t do_cancel(kvp__ec_resv_t *r, const char *tid, const char *rid, bool abandon, bool refresh,
                              bool *cancelled_p, bool *deferred_p)
{
    int64_t now = now_ms(r);
    kvp__ec_rrec_t *rec = kvp__strmap_gets(&r->recs, tid);
    if (rec && rid[0] && strcmp(rec->rid, rid) != 0)
        return KVP_OK; /* rejected */
    if (!rec) {
        kvp_status_t s = rec_new(r, tid, "", KVP__EC_R_CANCELLED, NULL, NULL, false, &rec);
        if (s != KVP_OK)
            return s;
        set_tombstone(r, rec, now);
    } else if (rec->state == KVP__EC_R_CANCELLED) {
        set_tombstone(r, rec, now);
    } else if (refresh) {
        if (!abandon || (rec->state != KVP__EC_R_WRITING && rec->state != KVP__EC_R_EXPIRE_PENDING))
            return KVP_OK; /* rejected */
        if (rec->state == KVP__EC_R_WRITING && set_state(r, rec, KVP__EC_R_EXPIRE_PENDING) != KVP_OK)
            return KVP_ERR_STATE;
        terminate(r, rec, KVP__EC_R_EXPIRED, now);
    } else if (rec->writer) {
        terminate(r, rec, KVP__EC_R_CANCELLED, now);
    } else if (KVP__EC_RS_IN(rec->state, KVP__EC_RS_DEFERRED) && !abandon) {
        *deferred_p = true; /* memory kept: the writer may still write */
    } else if (rec->state == KVP__EC_R_WRITING && !abandon) {
        defer(r, rec, KVP__EC_R_CANCEL_PENDING, now);
        *deferred_p = true;
    } else if (!KVP__EC_RS_IN(rec->state, KVP__EC_RS_ACTIVE)) {
        return KVP_OK; /* rejected (an EXPIRED tombstone) */
    } else {
        terminate(r, rec, KVP__EC_R_CANCELLED, now);
    }
    *cancelled_p = true;
    r->st.cancels++;
    reap(r, now); /* rec may be gone from here on */
    return KVP_OK;
}

kvp_status_t kvp__ec_resv_cancel(kvp__ec_resv_t *r, const char *transfer_id, const char *reservation_id,
                                 bool abandon, bool refresh, bool *cancelled_p, bool *deferred_p)
{
    bool c = false, d = false;
    kvp_status_t s = KVP_ERR_INVALID_ARG;
    if (r && transfer_id) {
        pthread_mutex_lock(&r->mu);
        s = do_cancel(r, transfer_id, reservation_id ? reservation_id : "", abandon, refresh, &c, &d);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
    }
    if (cancelled_p)
        *cancelled_p = c;
    if (deferred_p)
        *deferred_p = d;
    return s;
}

/* ---- expiry, the data plane's check, shutdown --------------------------------- */

size_t kvp__ec_resv_expire(kvp__ec_resv_t *r)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    size_t n = expire_locked(r, now_ms(r));
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* O(writer-owned records): the records being written, few at a time. */
kvp_status_t kvp__ec_resv_check_write(kvp__ec_resv_t *r, uint64_t offset, uint64_t len, const char *reservation_id)
{
    if (!r || offset > UINT64_MAX - len)
        return KVP_ERR_INVALID_ARG;
    bool any = !reservation_id || !reservation_id[0];
    kvp_status_t s = KVP_ERR_INVALID_ARG;
    pthread_mutex_lock(&r->mu);
    KVP_LIST_FOR_EACH_ENTRY(rec, &r->owning, kvp__ec_rrec_t, olink) {
        if (!any && strcmp(rec->rid, reservation_id) != 0)
            continue;
        if (offset >= rec->ext.off && offset + len <= rec->ext.off + rec->t.nbytes) {
            s = KVP_OK;
            break;
        }
        if (!any)
            break;
    }
    pthread_mutex_unlock(&r->mu);
    return s;
}

void kvp__ec_resv_begin_shutdown(kvp__ec_resv_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    if (!r->shutting_down) {
        r->shutting_down = true;
        int64_t now = now_ms(r);
        /* as in expire_locked, only the current record leaves the list */
        KVP_LIST_FOR_EACH_ENTRY_SAFE(rec, tmp, &r->active, kvp__ec_rrec_t, alink) {
            if (rec->writer || rec->state == KVP__EC_R_READY)
                terminate(r, rec, KVP__EC_R_CANCELLED, now);
            else if (rec->state == KVP__EC_R_WRITING)
                defer(r, rec, KVP__EC_R_CANCEL_PENDING, now);
        }
        reap(r, now);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static uint64_t writers_left(const kvp__ec_resv_t *r)
{
    return r->by_state[KVP__EC_R_WRITING] + r->by_state[KVP__EC_R_CANCEL_PENDING] +
           r->by_state[KVP__EC_R_EXPIRE_PENDING];
}

bool kvp__ec_resv_wait_for_writers(kvp__ec_resv_t *r, int64_t timeout_ms)
{
    if (!r)
        return true;
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    int64_t t = timeout_ms > 0 ? timeout_ms : 0;
    dl.tv_sec += (time_t)(t / 1000);
    dl.tv_nsec += (long)(t % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&r->mu);
    while (writers_left(r) > 0 && t > 0) {
        int rc = pthread_cond_timedwait(&r->cv, &r->mu, &dl);
        if (rc == ETIMEDOUT)
            break;
    }
    bool done = writers_left(r) == 0;
    pthread_mutex_unlock(&r->mu);
    return done;
}
