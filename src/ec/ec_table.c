/*
 * The transfer table: see ec_table.h for the model.
 *
 * The state table (connectors-spec §3.3), as the seed's own table (vLLM's
 * mooncake/state.py) runs it.  A transfer is created waiting for the
 * producer's readiness event (or straight from an event that came first, or
 * as a tombstone by a cancel of an id never seen), becomes AVAILABLE when
 * the push landed in a consumer reservation, LOADING when handed to the
 * workers, READY once in the engine's encoder cache, and RESIDENT when the
 * engine frees it but the pool keeps it for a local hand-off.  Every path out
 * of that life ends in a tombstone (UNAVAILABLE, EXPIRED, CANCELLED) or the
 * FAILED dead end; tombstones live 300 s so a late event or a repeated cancel
 * for the id is recognised and ignored, then expire() drops them (and caps
 * their number).
 *
 *   WAITING_EVENT -> AVAILABLE | UNAVAILABLE | CANCELLED
 *   AVAILABLE     -> LOADING | EXPIRED | CANCELLED
 *   LOADING       -> READY | UNAVAILABLE | FAILED | CANCELLED
 *   READY         -> RESIDENT | EXPIRED
 *   RESIDENT      -> LOADING | EXPIRED
 *   UNAVAILABLE   -> CANCELLED
 *   EXPIRED       -> CANCELLED
 *   FAILED, CANCELLED: none
 *
 * state.py checks no table in its _transition; this list is every transition
 * its operations make (from the seed's calls), and set_state rejects the rest.
 * Six behaviours of state.py differ from a table inferred from the spec alone,
 * and are the ones kept here:
 *   1. expire() times a LOADING record out at the deadline begin_load gave
 *      it (the workers never reported): -> UNAVAILABLE, its request reported
 *      unavailable, and the id returned so the scheduler cancels it.
 *   2. expire() walks the non-terminal records in insertion order (not
 *      record order), so the ids it returns come in that order.
 *   3. observe_ready() for an id that names another mm_hash keeps the record,
 *      reports the record's request unavailable and does not accept.
 *   4. wait_for_event() for an id that names another mm_hash gives no record
 *      and reports the waiting request unavailable (no error is raised).
 *   5. cancel(tid, hash) of a record whose non-empty hash is not the given
 *      non-empty hash does nothing (and cancels nothing).
 *   6. drain_orphaned() hands back every id retired out of READY/RESIDENT,
 *      unfiltered: an id removed since becomes, through the scheduler's
 *      cancel, a new hash-less CANCELLED tombstone with a remote cancel.
 * Also as state.py: observe_ready() keys the record by the event's transfer id
 * alone, and release_ready()'s canonical record is the last READY one in
 * hash-index order.
 */
#include "ec/ec_table.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/assert.h"
#include "common/log.h"

static const uint16_t g_allowed[KVP_EC_NUM_STATES] = {
    [KVP_EC_WAITING_EVENT] = KVP__EC_S(KVP_EC_AVAILABLE) | KVP__EC_S(KVP_EC_UNAVAILABLE) | KVP__EC_S(KVP_EC_CANCELLED),
    [KVP_EC_AVAILABLE] = KVP__EC_S(KVP_EC_LOADING) | KVP__EC_S(KVP_EC_EXPIRED) | KVP__EC_S(KVP_EC_CANCELLED),
    [KVP_EC_LOADING] = KVP__EC_S(KVP_EC_READY) | KVP__EC_S(KVP_EC_UNAVAILABLE) | KVP__EC_S(KVP_EC_FAILED) |
                       KVP__EC_S(KVP_EC_CANCELLED),
    [KVP_EC_READY] = KVP__EC_S(KVP_EC_RESIDENT) | KVP__EC_S(KVP_EC_EXPIRED),
    [KVP_EC_RESIDENT] = KVP__EC_S(KVP_EC_LOADING) | KVP__EC_S(KVP_EC_EXPIRED),
    [KVP_EC_UNAVAILABLE] = KVP__EC_S(KVP_EC_CANCELLED),
    [KVP_EC_EXPIRED] = KVP__EC_S(KVP_EC_CANCELLED),
    [KVP_EC_FAILED] = 0,
    [KVP_EC_CANCELLED] = 0,
};

static const char *const g_state_names[KVP_EC_NUM_STATES] = {
    "WAITING_EVENT", "AVAILABLE", "LOADING", "READY", "RESIDENT", "UNAVAILABLE", "EXPIRED", "FAILED", "CANCELLED",
};

const char *kvp_ec_state_name(kvp_ec_state_t s)
{
    return (unsigned)s < KVP_EC_NUM_STATES ? g_state_names[s] : "UNKNOWN";
}

bool kvp__ec_transition_allowed(kvp_ec_state_t from, kvp_ec_state_t to)
{
    if ((unsigned)from >= KVP_EC_NUM_STATES || (unsigned)to >= KVP_EC_NUM_STATES)
        return false;
    return (g_allowed[from] & KVP__EC_S(to)) != 0;
}

void kvp__ec_strv_free(char **v, size_t n)
{
    if (!v)
        return;
    for (size_t i = 0; i < n; i++)
        kvp__strfree(v[i]);
    kvp__free(v, n * sizeof *v);
}

void kvp__ec_spec_free(kvp__ec_spec_t *s)
{
    if (!s)
        return;
    kvp__strfree(s->mm_hash);
    kvp__strfree(s->dtype);
    kvp__strfree(s->transfer_id);
    if (s->shape)
        kvp__free(s->shape, s->ndim * sizeof *s->shape);
    kvp__free(s, sizeof *s);
}

kvp__ec_spec_t *kvp__ec_spec_clone(const kvp__ec_spec_t *s)
{
    kvp__ec_spec_t *c = kvp__calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = *s;
    c->mm_hash = kvp__strdup(s->mm_hash);
    c->dtype = kvp__strdup(s->dtype);
    c->transfer_id = kvp__strdup(s->transfer_id);
    c->shape = s->ndim ? kvp__malloc(s->ndim * sizeof *s->shape) : NULL;
    if (!c->mm_hash || !c->dtype || !c->transfer_id || (s->ndim && !c->shape)) {
        if (s->ndim && !c->shape)
            c->ndim = 0;
        kvp__ec_spec_free(c);
        return NULL;
    }
    if (s->ndim)
        memcpy(c->shape, s->shape, s->ndim * sizeof *s->shape);
    return c;
}

void kvp__ec_table_init(kvp__ec_table_t *t, int64_t resident_capacity, int64_t tombstone_ttl_ms)
{
    memset(t, 0, sizeof *t);
    t->resident_capacity = resident_capacity;
    t->tombstone_ttl_ms = tombstone_ttl_ms;
    kvp__strmap_init(&t->records);
    kvp__strmap_init(&t->hashes);
    kvp__list_init(&t->order);
    kvp__list_init(&t->dispatch);
    for (int s = 0; s < KVP_EC_NUM_STATES; s++)
        kvp__list_init(&t->states[s]);
    kvp__strmap_init(&t->unavailable);
}

static void rec_free(kvp__ec_rec_t *r)
{
    kvp__strfree(r->tid);
    kvp__strfree(r->req);
    kvp__strfree(r->hash);
    kvp__ec_spec_free(r->spec);
    kvp__ec_strv_free(r->notified, r->cap_notified);
    kvp__free(r, sizeof *r);
}

void kvp__ec_table_cleanup(kvp__ec_table_t *t)
{
    KVP_LIST_FOR_EACH_ENTRY_SAFE(r, n, &t->order, kvp__ec_rec_t, order)
        rec_free(r);
    for (size_t i = 0; i < t->hashes.cap; i++) {
        if (!t->hashes.slots[i].key)
            continue;
        kvp__ec_hent_t *h = t->hashes.slots[i].val;
        kvp__strfree(h->hash);
        kvp__free(h, sizeof *h);
    }
    kvp__strmap_cleanup(&t->records);
    kvp__strmap_cleanup(&t->hashes);
    kvp__strset_cleanup(&t->unavailable);
    kvp__ec_strv_free(t->orphans, t->cap_orphans);
    memset(t, 0, sizeof *t);
}

/* ---- record-order list ---------------------------------------------------- */

static void order_append(kvp__ec_table_t *t, kvp__ec_rec_t *r)
{
    kvp__list_add_tail(&t->order, &r->order);
    r->seq = ++t->next_seq;
}

static void dispatch_unlink(kvp__ec_rec_t *r) { kvp__list_del(&r->dlink); }

static void dispatch_append(kvp__ec_table_t *t, kvp__ec_rec_t *r)
{
    if (kvp__list_linked(&r->dlink))
        return; /* an OrderedDict re-assignment keeps the old position */
    kvp__list_add_tail(&t->dispatch, &r->dlink);
}

/* ---- accounting shared by insert, remove and set_state ------------------- */

static void state_list(kvp__ec_table_t *t, kvp__ec_rec_t *r, int sign)
{
    if (sign < 0)
        kvp__list_del(&r->slink);
    else
        kvp__list_add_tail(&t->states[r->state], &r->slink);
}

/* The oldest record in state st, or NULL. */
static kvp__ec_rec_t *state_first(const kvp__ec_table_t *t, kvp_ec_state_t st)
{
    return KVP_LIST_FIRST_ENTRY(&t->states[st], kvp__ec_rec_t, slink);
}

static void account(kvp__ec_table_t *t, kvp__ec_rec_t *r, int sign)
{
    /* a record leaves only the counts it is in */
    kvp__assert(sign > 0 || !r->hent || r->hent->count[r->state] > 0);
    kvp__assert(sign > 0 || !kvp__ec_state_terminal(r->state) || t->n_terminal > 0);
    state_list(t, r, sign);
    if (r->hent)
        r->hent->count[r->state] += (uint32_t)sign;
    if (kvp__ec_state_terminal(r->state))
        t->n_terminal += (size_t)(ptrdiff_t)sign;
    if (r->state == KVP_EC_RESIDENT && r->spec)
        t->resident_bytes += sign * (__int128)r->spec->nbytes;
}

static kvp_status_t insert(kvp__ec_table_t *t, const char *tid, const char *req, const char *hash, kvp_ec_state_t st,
                           bool has_deadline, int64_t deadline, kvp__ec_rec_t **rec_p)
{
    kvp__ec_rec_t *r = kvp__calloc(1, sizeof *r);
    if (!r)
        return KVP_ERR_NO_MEMORY;
    kvp__list_init(&r->order);
    kvp__list_init(&r->hlink);
    kvp__list_init(&r->dlink);
    kvp__list_init(&r->slink);
    r->tid = kvp__strdup(tid);
    r->req = kvp__strdup(req ? req : "");
    r->hash = kvp__strdup(hash ? hash : "");
    if (!r->tid || !r->req || !r->hash)
        goto oom;
    r->tid_len = strlen(r->tid);
    r->state = st;
    r->has_deadline = has_deadline;
    r->deadline = deadline;
    kvp__ec_hent_t *h = NULL;
    bool new_hent = false;
    if (r->hash[0]) {
        h = kvp__strmap_gets(&t->hashes, r->hash);
        if (!h) {
            h = kvp__calloc(1, sizeof *h);
            if (!h)
                goto oom;
            kvp__list_init(&h->recs);
            h->hash = kvp__strdup(r->hash);
            if (!h->hash || kvp__strmap_put(&t->hashes, h->hash, strlen(h->hash), h) != KVP_OK) {
                kvp__strfree(h->hash);
                kvp__free(h, sizeof *h);
                goto oom;
            }
            new_hent = true;
        }
    }
    if (kvp__strmap_put(&t->records, r->tid, r->tid_len, r) != KVP_OK) {
        if (new_hent) {
            kvp__strmap_del(&t->hashes, h->hash, strlen(h->hash));
            kvp__strfree(h->hash);
            kvp__free(h, sizeof *h);
        }
        goto oom;
    }
    if (h) {
        r->hent = h;
        kvp__list_add_tail(&h->recs, &r->hlink);
    }
    order_append(t, r);
    r->ins_seq = r->seq;
    account(t, r, +1);
    t->version++;
    *rec_p = r;
    return KVP_OK;
oom:
    rec_free(r);
    return KVP_ERR_NO_MEMORY;
}

static void remove_rec(kvp__ec_table_t *t, kvp__ec_rec_t *r)
{
    account(t, r, -1);
    kvp__strmap_del(&t->records, r->tid, r->tid_len);
    kvp__list_del(&r->order);
    dispatch_unlink(r);
    kvp__ec_hent_t *h = r->hent;
    if (h) {
        kvp__list_del(&r->hlink);
        if (kvp__list_empty(&h->recs)) {
            kvp__strmap_del(&t->hashes, h->hash, strlen(h->hash));
            kvp__strfree(h->hash);
            kvp__free(h, sizeof *h);
        }
    }
    t->version++;
    rec_free(r);
}

kvp_status_t kvp__ec_table_set_state(kvp__ec_table_t *t, kvp__ec_rec_t *r, kvp_ec_state_t to, int64_t now)
{
    if (!kvp__ec_transition_allowed(r->state, to))
        return KVP_ERR_STATE;
    kvp__assert((unsigned)r->state < KVP_EC_NUM_STATES && (unsigned)to < KVP_EC_NUM_STATES);
    account(t, r, -1);
    if (kvp__ec_state_terminal(to)) {
        r->has_deadline = true;
        r->deadline = now + t->tombstone_ttl_ms;
    }
    r->state = to;
    account(t, r, +1);
    kvp__list_del(&r->order);
    order_append(t, r);
    t->version++;
    return KVP_OK;
}

static void set_req_if_empty(kvp__ec_table_t *t, kvp__ec_rec_t *r, const char *req)
{
    if (r->req[0] || !req || !req[0])
        return;
    char *c = kvp__strdup(req);
    if (!c)
        return; /* out of memory: the request id stays unknown (display only) */
    kvp__strfree(r->req);
    r->req = c;
    t->version++;
}

static void set_deadline(kvp__ec_table_t *t, kvp__ec_rec_t *r, int64_t deadline)
{
    if (r->has_deadline && r->deadline == deadline)
        return;
    r->has_deadline = true;
    r->deadline = deadline;
    t->version++;
}

kvp__ec_rec_t *kvp__ec_table_get(const kvp__ec_table_t *t, const char *tid)
{
    return kvp__strmap_gets(&t->records, tid);
}

bool kvp__ec_table_has_state(const kvp__ec_table_t *t, const char *hash, kvp__ec_stateset_t states)
{
    const kvp__ec_hent_t *h = kvp__strmap_gets(&t->hashes, hash);
    if (!h)
        return false;
    for (int s = 0; s < KVP_EC_NUM_STATES; s++)
        if ((states & KVP__EC_S(s)) && h->count[s])
            return true;
    return false;
}

static kvp__ec_rec_t *first_for_hash(const kvp__ec_table_t *t, const char *hash, kvp__ec_stateset_t states)
{
    if (!kvp__ec_table_has_state(t, hash, states))
        return NULL;
    const kvp__ec_hent_t *h = kvp__strmap_gets(&t->hashes, hash);
    KVP_LIST_FOR_EACH_ENTRY(r, &h->recs, kvp__ec_rec_t, hlink)
        if (states & KVP__EC_S(r->state))
            return r;
    return NULL;
}

static kvp_status_t notify_unavailable(kvp__ec_table_t *t, kvp__ec_rec_t *r, const char *req)
{
    for (size_t i = 0; i < r->n_notified; i++)
        if (!strcmp(r->notified[i], req))
            return KVP_OK;
    char **nv = kvp__grow(r->notified, &r->cap_notified, r->n_notified + 1, sizeof *nv, 2);
    if (!nv)
        return KVP_ERR_NO_MEMORY;
    r->notified = nv;
    char *c = kvp__strdup(req);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__strset_add(&t->unavailable, req, NULL);
    if (st != KVP_OK) {
        kvp__strfree(c);
        return st;
    }
    r->notified[r->n_notified++] = c;
    return KVP_OK;
}

/* A record of no hash takes any; otherwise the hashes must be equal. */
static bool identity_matches(const kvp__ec_rec_t *r, const char *hash)
{
    return !r->hash[0] || !strcmp(r->hash, hash);
}

/* A transfer id that already names another encoding reaches us from outside
 * (ids come on the request), so it fails the one request instead of raising:
 * the request is reported unavailable (directly, not as a notification of
 * the record, which belongs to its own request). */
static kvp_status_t refuse_colliding_id(kvp__ec_table_t *t, const kvp__ec_rec_t *r, const char *hash, const char *req)
{
    kvp_warn("EC transfer_id=%s already names mm_hash=%.16s; refusing mm_hash=%.16s for request %s", r->tid, r->hash,
             hash, req[0] ? req : "<unknown>");
    return req[0] ? kvp__strset_add(&t->unavailable, req, NULL) : KVP_OK;
}

static kvp_status_t set_err(kvp_ec_error_t *err_p, kvp_ec_error_t e, kvp_status_t st)
{
    if (err_p)
        *err_p = e;
    return st;
}

kvp_status_t kvp__ec_table_wait_for_event(kvp__ec_table_t *t, const char *tid, const char *req, const char *hash,
                                          int64_t deadline, kvp__ec_rec_t **rec_p, kvp_ec_error_t *err_p)
{
    kvp__ec_rec_t *r = kvp__ec_table_get(t, tid);
    if (!r) {
        kvp_status_t st = insert(t, tid, req, hash, KVP_EC_WAITING_EVENT, true, deadline, rec_p);
        return st == KVP_OK ? st : set_err(err_p, KVP_EC_ERR_NO_MEMORY, st);
    }
    if (!identity_matches(r, hash)) {
        /* the id names another encoding: that request fails, no record (#4) */
        *rec_p = NULL;
        kvp_status_t st = refuse_colliding_id(t, r, hash, req);
        return st == KVP_OK ? st : set_err(err_p, KVP_EC_ERR_NO_MEMORY, st);
    }
    set_req_if_empty(t, r, req);
    if (kvp__ec_state_terminal(r->state) && req[0]) {
        kvp_status_t st = notify_unavailable(t, r, req);
        if (st != KVP_OK)
            return set_err(err_p, KVP_EC_ERR_NO_MEMORY, st);
    }
    *rec_p = r;
    return KVP_OK;
}

kvp_status_t kvp__ec_table_observe_ready(kvp__ec_table_t *t, kvp__ec_spec_t *spec, int64_t deadline, bool *accepted_p,
                                         kvp_ec_error_t *err_p)
{
    *accepted_p = false;
    /* keyed by the event's transfer id alone, even when that is "" */
    const char *key = spec->transfer_id;
    kvp__ec_rec_t *r = kvp__ec_table_get(t, key);
    if (!r) {
        kvp_status_t st = insert(t, key, "", spec->mm_hash, KVP_EC_WAITING_EVENT, false, 0, &r);
        if (st != KVP_OK) {
            kvp__ec_spec_free(spec);
            return set_err(err_p, KVP_EC_ERR_NO_MEMORY, st);
        }
    } else if (!identity_matches(r, spec->mm_hash)) {
        /* another encoding under this id: the record stays, its request fails (#3) */
        kvp_status_t st = refuse_colliding_id(t, r, spec->mm_hash, r->req);
        kvp__ec_spec_free(spec);
        return st == KVP_OK ? st : set_err(err_p, KVP_EC_ERR_NO_MEMORY, st);
    }
    if (r->state != KVP_EC_WAITING_EVENT) {
        kvp__ec_spec_free(spec);
        return KVP_OK;
    }
    kvp__ec_spec_free(r->spec);
    r->spec = spec;
    r->has_deadline = true;
    r->deadline = deadline;
    kvp_status_t st = kvp__ec_table_set_state(t, r, KVP_EC_AVAILABLE, 0);
    if (st != KVP_OK)
        return set_err(err_p, KVP_EC_ERR_INVALID_TRANSITION, st);
    *accepted_p = true;
    return KVP_OK;
}

void kvp__ec_table_touch_available(kvp__ec_table_t *t, const char *tid, int64_t deadline)
{
    kvp__ec_rec_t *r = kvp__ec_table_get(t, tid);
    if (r && r->state == KVP_EC_AVAILABLE)
        set_deadline(t, r, deadline); /* not a transition: the record does not move */
}

kvp_status_t kvp__ec_table_begin_load(kvp__ec_table_t *t, const char *hash, const char *tid, const char *req,
                                      int64_t deadline, kvp__ec_rec_t **rec_p)
{
    *rec_p = NULL;
    kvp__ec_rec_t *r = (tid && tid[0]) ? kvp__ec_table_get(t, tid) : NULL;
    if (r && (strcmp(r->hash, hash) != 0 || r->state != KVP_EC_AVAILABLE))
        r = NULL;
    if (!r)
        r = first_for_hash(t, hash, KVP__EC_S(KVP_EC_AVAILABLE) | KVP__EC_S(KVP_EC_RESIDENT));
    if (!r || !r->spec)
        return KVP_OK;
    set_req_if_empty(t, r, req);
    set_deadline(t, r, deadline);
    kvp_status_t st = kvp__ec_table_set_state(t, r, KVP_EC_LOADING, 0);
    if (st != KVP_OK)
        return st;
    dispatch_append(t, r);
    *rec_p = r;
    return KVP_OK;
}

kvp_status_t kvp__ec_table_take_loads(kvp__ec_table_t *t, kvp__ec_rec_t ***out_p, size_t *n_p)
{
    size_t n = 0;
    KVP_LIST_FOR_EACH_ENTRY(r, &t->dispatch, kvp__ec_rec_t, dlink)
        n += r->state == KVP_EC_LOADING;
    kvp__ec_rec_t **out = NULL;
    if (n) {
        out = kvp__malloc(n * sizeof *out);
        if (!out)
            return KVP_ERR_NO_MEMORY;
    }
    size_t i = 0;
    KVP_LIST_FOR_EACH_ENTRY_SAFE(r, next, &t->dispatch, kvp__ec_rec_t, dlink) {
        if (r->state == KVP_EC_LOADING)
            out[i++] = r;
        kvp__list_del(&r->dlink);
    }
    *out_p = out;
    *n_p = n;
    return KVP_OK;
}

kvp_status_t kvp__ec_table_complete_load(kvp__ec_table_t *t, const char *hash)
{
    kvp__ec_rec_t *r = first_for_hash(t, hash, KVP__EC_S(KVP_EC_LOADING));
    return r ? kvp__ec_table_set_state(t, r, KVP_EC_READY, 0) : KVP_OK;
}

kvp_status_t kvp__ec_table_fail_load(kvp__ec_table_t *t, const char *hash, int64_t now)
{
    kvp__ec_rec_t *r = first_for_hash(t, hash, KVP__EC_S(KVP_EC_LOADING));
    return r ? kvp__ec_table_set_state(t, r, KVP_EC_FAILED, now) : KVP_OK;
}

static kvp_status_t expire_orphan(kvp__ec_table_t *t, kvp__ec_rec_t *r, int64_t now)
{
    kvp_status_t st = kvp__ec_table_set_state(t, r, KVP_EC_EXPIRED, now);
    if (st != KVP_OK)
        return st;
    char **nv = kvp__grow(t->orphans, &t->cap_orphans, t->n_orphans + 1, sizeof *nv, 8);
    if (!nv)
        return KVP_ERR_NO_MEMORY;
    t->orphans = nv;
    char *c = kvp__strdup(r->tid);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    t->orphans[t->n_orphans++] = c;
    return KVP_OK;
}

static kvp_status_t evict_residents(kvp__ec_table_t *t, int64_t now)
{
    /* the oldest RESIDENT record (record order) is the head of its list */
    kvp__ec_rec_t *r;
    while (t->resident_bytes > t->resident_capacity && (r = state_first(t, KVP_EC_RESIDENT))) {
        kvp_status_t st = expire_orphan(t, r, now);
        if (st != KVP_OK)
            return st;
    }
    return KVP_OK;
}

kvp_status_t kvp__ec_table_release_ready(kvp__ec_table_t *t, const char *hash, int64_t now)
{
    kvp__ec_hent_t *h = kvp__strmap_gets(&t->hashes, hash);
    if (h && h->count[KVP_EC_READY]) {
        /* The canonical record is the last READY one in hash-index order. */
        kvp__ec_rec_t *canon = NULL;
        KVP_LIST_FOR_EACH_ENTRY(r, &h->recs, kvp__ec_rec_t, hlink)
            if (r->state == KVP_EC_READY)
                canon = r;
        KVP_LIST_FOR_EACH_ENTRY(r, &h->recs, kvp__ec_rec_t, hlink) {
            if (r == canon || (r->state != KVP_EC_READY && r->state != KVP_EC_RESIDENT))
                continue;
            kvp_status_t st = expire_orphan(t, r, now);
            if (st != KVP_OK)
                return st;
        }
        kvp_status_t st;
        if (!canon->spec) {
            st = expire_orphan(t, canon, now);
        } else {
            canon->spec->num_token = 0;
            canon->spec->local = true;
            st = kvp__ec_table_set_state(t, canon, KVP_EC_RESIDENT, now);
        }
        if (st != KVP_OK)
            return st;
    }
    return evict_residents(t, now);
}

kvp_status_t kvp__ec_table_reclaim(kvp__ec_table_t *t, const char *hash, int64_t now)
{
    kvp__ec_hent_t *h = kvp__strmap_gets(&t->hashes, hash);
    if (!h)
        return KVP_OK;
    KVP_LIST_FOR_EACH_ENTRY(r, &h->recs, kvp__ec_rec_t, hlink) {
        if (r->state == KVP_EC_READY) {
            kvp__ec_spec_free(r->spec); /* stays READY, does not move */
            r->spec = NULL;
        } else if (r->state == KVP_EC_RESIDENT) {
            kvp_status_t st = expire_orphan(t, r, now);
            if (st != KVP_OK)
                return st;
        }
    }
    return KVP_OK;
}

kvp_status_t kvp__ec_table_mark_unavailable(kvp__ec_table_t *t, const char *tid, int64_t now)
{
    kvp__ec_rec_t *r = kvp__ec_table_get(t, tid);
    if (!r)
        return KVP_ERR_NOT_FOUND;
    kvp_status_t st = kvp__ec_table_set_state(t, r, KVP_EC_UNAVAILABLE, now);
    if (st != KVP_OK)
        return st;
    if (r->req[0])
        return notify_unavailable(t, r, r->req);
    return KVP_OK;
}

kvp_status_t kvp__ec_table_cancel(kvp__ec_table_t *t, const char *tid, int64_t now, const char *hash, const char *req,
                                  bool *cancelled_p)
{
    *cancelled_p = false;
    kvp__ec_rec_t *r = kvp__ec_table_get(t, tid);
    if (r && hash && hash[0] && !identity_matches(r, hash))
        return KVP_OK; /* the id names another encoding: not this cancel's (#5) */
    if (!r) {
        kvp_status_t st = insert(t, tid, req, hash, KVP_EC_WAITING_EVENT, false, 0, &r);
        if (st != KVP_OK)
            return st;
    }
    switch (r->state) {
    case KVP_EC_CANCELLED:
    case KVP_EC_READY:
    case KVP_EC_RESIDENT:
    case KVP_EC_FAILED:
        return KVP_OK;
    default:
        break;
    }
    kvp_status_t st = kvp__ec_table_set_state(t, r, KVP_EC_CANCELLED, now);
    if (st != KVP_OK)
        return st;
    dispatch_unlink(r);
    *cancelled_p = true;
    return KVP_OK;
}

static int by_insertion(const void *a, const void *b)
{
    uint64_t x = (*(kvp__ec_rec_t *const *)a)->ins_seq, y = (*(kvp__ec_rec_t *const *)b)->ins_seq;
    return x < y ? -1 : x > y;
}

/* The AVAILABLE and LOADING records whose deadline has passed, in insertion
 * order: *n_p of them in an array of *cap_p (kvp__free(.., *cap_p * sizeof)). */
static kvp_status_t due_records(kvp__ec_table_t *t, int64_t now, kvp__ec_rec_t ***recs_p, size_t *n_p, size_t *cap_p)
{
    static const kvp_ec_state_t due_states[2] = {KVP_EC_AVAILABLE, KVP_EC_LOADING};
    kvp__ec_rec_t **v = NULL;
    size_t n = 0, cap = 0;
    for (int k = 0; k < 2; k++) {
        KVP_LIST_FOR_EACH_ENTRY(r, &t->states[due_states[k]], kvp__ec_rec_t, slink) {
            if (!r->has_deadline || r->deadline > now)
                continue;
            kvp__ec_rec_t **nv = kvp__grow(v, &cap, n + 1, sizeof *nv, 8);
            if (!nv) {
                kvp__free(v, cap * sizeof *v);
                return KVP_ERR_NO_MEMORY;
            }
            v = nv;
            v[n++] = r;
        }
    }
    if (n > 1)
        qsort(v, n, sizeof *v, by_insertion);
    *recs_p = v;
    *n_p = n;
    *cap_p = cap;
    return KVP_OK;
}

kvp_status_t kvp__ec_table_expire(kvp__ec_table_t *t, int64_t now, int64_t terminal_limit, char ***out_p, size_t *n_p)
{
    char **out = NULL;
    size_t n = 0, cap = 0;
    /* 1. Non-terminal records past their deadline, in insertion order (the
     * original walks its active ids, which keep insertion order; only
     * AVAILABLE and LOADING records act, so only their lists are read and
     * the few that are due sorted by insertion): an AVAILABLE lease that ran
     * out -> EXPIRED; a LOADING record whose begin_load deadline passed (the
     * workers never reported) -> UNAVAILABLE, its request reported
     * unavailable.  Both are returned, so the caller cancels them. */
    kvp__ec_rec_t **due = NULL;
    size_t n_due = 0, due_cap = 0;
    kvp_status_t st = due_records(t, now, &due, &n_due, &due_cap);
    for (size_t i = 0; st == KVP_OK && i < n_due; i++) {
        kvp__ec_rec_t *r = due[i];
        char **nv = kvp__grow(out, &cap, n + 1, sizeof *nv, 8);
        if (!nv) {
            st = KVP_ERR_NO_MEMORY;
            break;
        }
        out = nv;
        char *c = kvp__strdup(r->tid);
        if (!c) {
            st = KVP_ERR_NO_MEMORY;
            break;
        }
        if (r->state == KVP_EC_AVAILABLE)
            st = kvp__ec_table_set_state(t, r, KVP_EC_EXPIRED, now);
        else
            st = kvp__ec_table_mark_unavailable(t, r->tid, now);
        if (st != KVP_OK) {
            kvp__strfree(c);
            break;
        }
        out[n++] = c;
    }
    kvp__free(due, due_cap * sizeof *due);
    /* 2. tombstones past their deadline are removed.  A terminal list is
     * sorted by deadline (entered at the current time + one TTL), so this
     * pops heads; the records expired just above carry now + TTL and stay.
     * (The original walks every record; the result is the same, since
     * removal does not reorder the others.) */
    static const kvp_ec_state_t terminal[4] = {KVP_EC_UNAVAILABLE, KVP_EC_EXPIRED, KVP_EC_FAILED, KVP_EC_CANCELLED};
    for (int k = 0; k < 4 && st == KVP_OK; k++) {
        kvp__ec_rec_t *r;
        while ((r = state_first(t, terminal[k])) && r->has_deadline && r->deadline <= now)
            remove_rec(t, r);
    }
    /* 3. the terminal-record cap: drop the oldest tombstones (record order)
     * beyond the limit; the oldest is the lowest-sequence list head. */
    while (st == KVP_OK && terminal_limit >= 0 && (int64_t)t->n_terminal > terminal_limit) {
        kvp__ec_rec_t *oldest = NULL;
        for (int k = 0; k < 4; k++) {
            kvp__ec_rec_t *h = state_first(t, terminal[k]);
            if (h && (!oldest || h->seq < oldest->seq))
                oldest = h;
        }
        if (!oldest)
            break;
        remove_rec(t, oldest);
    }
    if (n < cap) {
        /* shrink so the caller frees n entries */
        if (n == 0) {
            kvp__free(out, cap * sizeof *out);
            out = NULL;
        } else {
            char **nv = kvp__realloc(out, cap * sizeof *out, n * sizeof *out);
            if (nv)
                out = nv;
            else {
                for (size_t i = n; i < cap; i++)
                    out[i] = NULL;
                n = cap; /* free the full array; trailing NULLs are fine */
            }
        }
    }
    *out_p = out;
    *n_p = n;
    return st;
}

kvp_status_t kvp__ec_table_take_unavailable(kvp__ec_table_t *t, kvp__strset_t *into)
{
    kvp_status_t st = KVP_OK;
    for (size_t i = 0; i < t->unavailable.cap; i++) {
        kvp__strmap_slot_t *sl = &t->unavailable.slots[i];
        if (sl->key && st == KVP_OK)
            st = kvp__strset_add(into, sl->val, NULL);
    }
    kvp__strset_clear(&t->unavailable);
    return st;
}

kvp_status_t kvp__ec_table_drain_orphaned(kvp__ec_table_t *t, char ***out_p, size_t *n_p)
{
    /* Every id retired to EXPIRED out of READY/RESIDENT since the last drain,
     * unfiltered: one removed since (or re-created, or cancelled) is handed
     * back too, and the caller's cancel decides (a removed id becomes a new
     * hash-less CANCELLED tombstone).  The list is handed over whole. */
    *out_p = t->orphans;
    *n_p = t->cap_orphans; /* the first n_orphans slots used, then NULLs */
    for (size_t i = t->n_orphans; i < t->cap_orphans; i++)
        t->orphans[i] = NULL;
    t->orphans = NULL;
    t->n_orphans = t->cap_orphans = 0;
    return KVP_OK;
}
