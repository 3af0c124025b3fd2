/*
 * E1 and E2 (connectors-spec §3.4): the readiness-event drain.  Every call of
 * a hook that needs fresh readiness drains the inbox at most once per
 * KVP_EC_DRAIN_MIN_INTERVAL_MS (or at once after a drain was asked for):
 * it first expires the table (each lease that ran out gets a remote cancel),
 * then takes the pushed events.  An event counts when its "ready" is truthy;
 * with several shards it is kept in the readiness set (ec_ready.c) until
 * every shard has reported, then its pushed spec goes into the table.  A
 * malformed event is dropped with one warning, where the original drops it
 * (the Python conversions of ec_json.c).
 */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "ec/ec_json.h"
#include "ec/ec_sched_int.h"

static kvp_ec_error_t shape_of(const kvp_ec_value_t *v, int64_t **shape_p, size_t *ndim_p)
{
    *shape_p = NULL;
    *ndim_p = 0;
    size_t n;
    switch (v->type) {
    case KVP_EC_V_ARRAY: n = v->u.arr.n; break;
    case KVP_EC_V_OBJECT: n = v->u.obj.n; break;
    case KVP_EC_V_STR: n = v->u.str.len; break;
    default: return KVP_EC_ERR_TYPE;
    }
    int64_t *shape = n ? kvp__malloc(n * sizeof *shape) : NULL;
    if (n && !shape)
        return KVP_EC_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
        kvp_ec_error_t e;
        if (v->type == KVP_EC_V_ARRAY) {
            e = kvp__ec_py_int(&v->u.arr.items[i], &shape[i]);
        } else {
            /* iterating an object gives its keys; a string, its characters */
            kvp_ec_value_t k = {.type = KVP_EC_V_STR};
            char ch[2];
            if (v->type == KVP_EC_V_OBJECT) {
                k.u.str.ptr = v->u.obj.members[i].key;
                k.u.str.len = v->u.obj.members[i].key_len;
            } else {
                ch[0] = v->u.str.ptr[i];
                ch[1] = 0;
                k.u.str.ptr = ch;
                k.u.str.len = 1;
            }
            e = kvp__ec_py_int(&k, &shape[i]);
        }
        if (e != KVP_EC_ERR_NONE) {
            if (shape)
                kvp__free(shape, n * sizeof *shape);
            return e;
        }
    }
    *shape_p = shape;
    *ndim_p = n;
    return KVP_EC_ERR_NONE;
}

/* E2: returns true when the event may be stored (every shard reported). */
static kvp_ec_error_t note_shard_ready(kvp_ec_sched_t *s, const kvp_ec_value_t *data, const char *tid, bool *ok_p)
{
    *ok_p = false;
    size_t shard_count = s->inbox.shard_count(s->inbox.ctx);
    if (shard_count <= 1) {
        *ok_p = true;
        return KVP_EC_ERR_NONE;
    }
    kvp__ec_rec_t *r = kvp__ec_table_get(&s->table, tid);
    if (r && r->state != KVP_EC_WAITING_EVENT)
        return KVP_EC_ERR_NONE;
    const kvp_ec_value_t *shard = kvp_ec_value_get(data, "shard");
    kvp__ec_rentry_t *e;
    if (kvp__ec_ready_touch(&s->ready, tid, &e) != KVP_OK)
        return KVP_EC_ERR_NO_MEMORY;
    int64_t id = (int64_t)e->n;
    if (shard && shard->type != KVP_EC_V_NULL) {
        kvp_ec_error_t err = kvp__ec_py_int(shard, &id);
        if (err != KVP_EC_ERR_NONE)
            return err; /* the entry was created and moved already, as in the original */
    }
    if (kvp__ec_ready_add(e, id) != KVP_OK)
        return KVP_EC_ERR_NO_MEMORY;
    if (e->n < shard_count) {
        kvp__ec_ready_trim(&s->ready, (size_t)s->max_pending_events);
        return KVP_EC_ERR_NONE;
    }
    kvp__ec_ready_forget(&s->ready, tid);
    *ok_p = true;
    return KVP_EC_ERR_NONE;
}

static kvp_ec_error_t store_pushed_spec(kvp_ec_sched_t *s, const kvp_ec_value_t *data, const char *tid, int64_t now)
{
    const kvp_ec_value_t *h = kvp_ec_value_get(data, "mm_hash");
    const kvp_ec_value_t *nb = kvp_ec_value_get(data, "nbytes");
    const kvp_ec_value_t *sh = kvp_ec_value_get(data, "shape");
    const kvp_ec_value_t *dt = kvp_ec_value_get(data, "dtype");
    if (!h)
        return KVP_EC_ERR_KEY;
    kvp__ec_spec_t *spec = kvp__calloc(1, sizeof *spec);
    if (!spec)
        return KVP_EC_ERR_NO_MEMORY;
    kvp_ec_error_t e = KVP_EC_ERR_NONE;
    if (kvp__ec_py_str(h, &spec->mm_hash) != KVP_OK) {
        e = KVP_EC_ERR_NO_MEMORY;
        goto out;
    }
    if (!nb) {
        e = KVP_EC_ERR_KEY;
        goto out;
    }
    if ((e = kvp__ec_py_int(nb, &spec->nbytes)) != KVP_EC_ERR_NONE)
        goto out;
    if (!sh) {
        e = KVP_EC_ERR_KEY;
        goto out;
    }
    if ((e = shape_of(sh, &spec->shape, &spec->ndim)) != KVP_EC_ERR_NONE)
        goto out;
    if (!dt) {
        e = KVP_EC_ERR_KEY;
        goto out;
    }
    if (kvp__ec_py_str(dt, &spec->dtype) != KVP_OK || !(spec->transfer_id = kvp__strdup(tid))) {
        e = KVP_EC_ERR_NO_MEMORY;
        goto out;
    }
    bool accepted;
    kvp_ec_error_t te = KVP_EC_ERR_NONE;
    kvp_status_t st = kvp__ec_table_observe_ready(&s->table, spec, now + KVP_EC_RESERVATION_TTL_MS, &accepted, &te);
    if (st != KVP_OK)
        return te == KVP_EC_ERR_NONE ? KVP_EC_ERR_RUNTIME : te;
    return KVP_EC_ERR_NONE;
out:
    kvp__ec_spec_free(spec);
    return e;
}

static kvp_ec_error_t accept_ready_event(kvp_ec_sched_t *s, const kvp_ec_value_t *data, int64_t now)
{
    const kvp_ec_value_t *tv = kvp_ec_value_get(data, "transfer_id");
    if (!tv)
        return KVP_EC_ERR_KEY;
    char *tid;
    if (kvp__ec_py_str(tv, &tid) != KVP_OK)
        return KVP_EC_ERR_NO_MEMORY;
    kvp_ec_error_t e = KVP_EC_ERR_NONE;
    kvp__ec_rec_t *r = kvp__ec_table_get(&s->table, tid);
    if (r && kvp__ec_state_terminal(r->state))
        goto out;
    bool ok;
    if ((e = note_shard_ready(s, data, tid, &ok)) != KVP_EC_ERR_NONE || !ok)
        goto out;
    e = store_pushed_spec(s, data, tid, now);
out:
    kvp__strfree(tid);
    return e;
}

kvp_status_t kvp__ec_sched_drain(kvp_ec_sched_t *s)
{
    int64_t now = now_ms(s);
    if (!s->drain_pending && now - s->drained_at < KVP_EC_DRAIN_MIN_INTERVAL_MS)
        return KVP_OK;
    s->drain_pending = false;
    s->drained_at = now;
    /* Expire the table; each lease that ran out gets a remote cancel. */
    char **expired;
    size_t n_expired;
    kvp_status_t st = kvp__ec_table_expire(&s->table, now, s->max_terminal, &expired, &n_expired);
    if (st != KVP_OK) {
        kvp__ec_strv_free(expired, n_expired);
        return fail_st(s, st);
    }
    for (size_t i = 0; i < n_expired && st == KVP_OK; i++)
        if (expired[i])
            st = kvp__ec_sched_queue_cancel(s, expired[i], "", "");
    kvp__ec_strv_free(expired, n_expired);
    if (st != KVP_OK)
        return st;
    const kvp_ec_value_t *const *events = NULL;
    size_t n_events = 0;
    st = s->inbox.drain(s->inbox.ctx, s->control_addr, &events, &n_events);
    if (st != KVP_OK) {
        kvp_warn("EC readiness inbox drain failed: %s", kvp_status_str(st));
        return KVP_OK;
    }
    for (size_t i = 0; i < n_events; i++) {
        const kvp_ec_value_t *data = events[i];
        kvp_ec_error_t e;
        if (!data || data->type != KVP_EC_V_OBJECT)
            e = KVP_EC_ERR_TYPE;
        else if (!kvp_ec_value_truthy(kvp_ec_value_get(data, "ready")))
            continue;
        else
            e = accept_ready_event(s, data, now);
        if (e == KVP_EC_ERR_NO_MEMORY)
            return fail(s, e, KVP_ERR_NO_MEMORY);
        if (e != KVP_EC_ERR_NONE)
            kvp_warn("Discarding a malformed EC readiness event (%s).", kvp_ec_error_name(e));
    }
    return KVP_OK;
}
