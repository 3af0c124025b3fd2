/*
 * `kvpool ec-sched-replay`: replays an "ec-sched-replay v1" stream (stdin)
 * through the C EC scheduler with scripted collaborators and writes one
 * canonical JSON line per input line (stdout), in the format of
 * ../shared/tools/ecsched-ref/README.md, so ref.py and this command can be
 * compared byte for byte.
 *
 * The stream's JSON is parsed strictly (integers within int64, no floats or
 * NaN, values nested at most 32 deep, duplicate keys resolved as Python
 * does: first position, last value); an event that breaks the format is a
 * BadEvent and changes nothing.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "common/strmap.h"
#include "kvpool/ec_connector.h"
#include "support/ec_scripted.h"

#define MAX_DEPTH 32

typedef enum { E_NONE = 0, E_BAD, E_UNKNOWN_REQ, E_UNKNOWN_JOB, E_SEED } err_t;

typedef struct {
    char *rid;
    kvp_ec_feature_t *feats;
    size_t n_feats;
    bool has_params;
    kvp_ec_transfer_params_t params;
} rreq_t;

typedef struct {
    kvp_ec_sched_t *s;
    kvp__ec_sclock_t clock;
    kvp__ec_sexec_t exec;
    kvp__ec_sctl_t ctl;
    kvp__ec_sinbox_t inbox;
    kvp__strmap_t reqs; /* rid -> rreq_t */
    kvp__jw_t last_table;
    bool have_table_printed;
    uint64_t last_version;
    const char *seed_err; /* exception name for E_SEED */
} replay_t;

/* ---- field helpers --------------------------------------------------------- */

static const kvp_ec_value_t *field(const kvp_ec_value_t *ev, const char *k) { return kvp_ec_value_get(ev, k); }

static bool get_int(const kvp_ec_value_t *ev, const char *k, int64_t *v)
{
    const kvp_ec_value_t *f = field(ev, k);
    if (!f || f->type != KVP_EC_V_INT)
        return false;
    *v = f->u.i;
    return true;
}

static bool get_nat(const kvp_ec_value_t *ev, const char *k, int64_t *v) { return get_int(ev, k, v) && *v >= 0; }

static bool get_bool(const kvp_ec_value_t *ev, const char *k, bool *v)
{
    const kvp_ec_value_t *f = field(ev, k);
    if (!f || f->type != KVP_EC_V_BOOL)
        return false;
    *v = f->u.b;
    return true;
}

static const char *get_str(const kvp_ec_value_t *ev, const char *k)
{
    const kvp_ec_value_t *f = field(ev, k);
    return f && f->type == KVP_EC_V_STR ? f->u.str.ptr : NULL;
}

static bool is_strs(const kvp_ec_value_t *f)
{
    if (!f || f->type != KVP_EC_V_ARRAY)
        return false;
    for (size_t i = 0; i < f->u.arr.n; i++)
        if (f->u.arr.items[i].type != KVP_EC_V_STR)
            return false;
    return true;
}

/* ---- requests ------------------------------------------------------------- */

static void params_clear(kvp_ec_transfer_params_t *p)
{
    kvp__strfree((char *)p->consumer_zmq);
    for (size_t i = 0; i < p->n_items; i++) {
        kvp__strfree((char *)p->items[i].mm_hash);
        kvp__strfree((char *)p->items[i].transfer_id);
    }
    if (p->items)
        kvp__free((void *)p->items, p->n_items * sizeof *p->items);
    memset(p, 0, sizeof *p);
}

static void feats_free(kvp_ec_feature_t *f, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvp__strfree((char *)f[i].identifier);
        kvp__strfree((char *)f[i].modality);
    }
    if (f)
        kvp__free(f, n * sizeof *f);
}

static void rreq_free(rreq_t *r)
{
    kvp__strfree(r->rid);
    feats_free(r->feats, r->n_feats);
    params_clear(&r->params);
    kvp__free(r, sizeof *r);
}

static char *dup_or_null(const kvp_ec_value_t *v)
{
    return (v && v->type == KVP_EC_V_STR) ? kvp__strdup(v->u.str.ptr) : NULL;
}

static err_t op_req(replay_t *rp, const kvp_ec_value_t *ev)
{
    const char *rid = get_str(ev, "req_id");
    if (!rid)
        return E_BAD;
    const kvp_ec_value_t *fl = field(ev, "mm_features");
    kvp_ec_feature_t *feats = NULL;
    size_t nf = 0;
    if (fl) {
        if (fl->type != KVP_EC_V_ARRAY)
            return E_BAD;
        for (size_t i = 0; i < fl->u.arr.n; i++) {
            const kvp_ec_value_t *f = &fl->u.arr.items[i];
            int64_t len, off, ne;
            if (f->type != KVP_EC_V_OBJECT || !get_nat(f, "length", &len) || !get_nat(f, "offset", &off) ||
                !get_str(f, "identifier") || !get_str(f, "modality"))
                return E_BAD;
            if (field(f, "num_embeds") && !get_nat(f, "num_embeds", &ne))
                return E_BAD;
        }
    }
    const kvp_ec_value_t *pv = field(ev, "ec_transfer_params");
    if (pv && pv->type != KVP_EC_V_NULL) {
        if (pv->type != KVP_EC_V_OBJECT)
            return E_BAD;
        const kvp_ec_value_t *cz = field(pv, "consumer_zmq");
        if (cz && cz->type != KVP_EC_V_NULL && cz->type != KVP_EC_V_STR)
            return E_BAD;
        const kvp_ec_value_t *items = field(pv, "ec_items");
        if (items && items->type != KVP_EC_V_NULL) {
            if (items->type != KVP_EC_V_ARRAY)
                return E_BAD;
            for (size_t i = 0; i < items->u.arr.n; i++) {
                const kvp_ec_value_t *it = &items->u.arr.items[i];
                if (it->type != KVP_EC_V_OBJECT)
                    return E_BAD;
                const kvp_ec_value_t *a = field(it, "mm_hash"), *b = field(it, "transfer_id");
                if ((a && a->type != KVP_EC_V_NULL && a->type != KVP_EC_V_STR) ||
                    (b && b->type != KVP_EC_V_NULL && b->type != KVP_EC_V_STR))
                    return E_BAD;
            }
        }
    }
    rreq_t *r = kvp__strmap_gets(&rp->reqs, rid);
    if (!r && !fl)
        return E_BAD;
    if (fl) {
        nf = fl->u.arr.n;
        feats = nf ? kvp__calloc(nf, sizeof *feats) : NULL;
        for (size_t i = 0; i < nf; i++) {
            const kvp_ec_value_t *f = &fl->u.arr.items[i];
            get_nat(f, "length", &feats[i].length);
            get_nat(f, "offset", &feats[i].offset);
            feats[i].num_embeds = feats[i].length;
            if (field(f, "num_embeds"))
                get_nat(f, "num_embeds", &feats[i].num_embeds);
            feats[i].identifier = kvp__strdup(get_str(f, "identifier"));
            feats[i].modality = kvp__strdup(get_str(f, "modality"));
        }
    }
    if (!r) {
        r = kvp__calloc(1, sizeof *r);
        r->rid = kvp__strdup(rid);
        kvp__strmap_put(&rp->reqs, r->rid, strlen(r->rid), r);
    }
    if (fl) {
        feats_free(r->feats, r->n_feats);
        r->feats = feats;
        r->n_feats = nf;
    }
    if (pv) {
        params_clear(&r->params);
        r->has_params = pv->type != KVP_EC_V_NULL;
        if (r->has_params) {
            r->params.consumer_zmq = dup_or_null(field(pv, "consumer_zmq"));
            const kvp_ec_value_t *items = field(pv, "ec_items");
            if (items && items->type == KVP_EC_V_ARRAY && items->u.arr.n) {
                size_t n = items->u.arr.n;
                kvp_ec_item_t *iv = kvp__calloc(n, sizeof *iv);
                for (size_t i = 0; i < n; i++) {
                    iv[i].mm_hash = dup_or_null(field(&items->u.arr.items[i], "mm_hash"));
                    iv[i].transfer_id = dup_or_null(field(&items->u.arr.items[i], "transfer_id"));
                }
                r->params.items = iv;
                r->params.n_items = n;
            }
        }
    }
    return E_NONE;
}

static err_t lookup_req(replay_t *rp, const kvp_ec_value_t *ev, kvp_ec_request_t *view)
{
    const char *rid = get_str(ev, "req_id");
    if (!rid)
        return E_BAD;
    rreq_t *r = kvp__strmap_gets(&rp->reqs, rid);
    if (!r)
        return E_UNKNOWN_REQ;
    view->request_id = r->rid;
    view->features = r->feats;
    view->n_features = r->n_feats;
    view->params = r->has_params ? &r->params : NULL;
    return E_NONE;
}

/* ---- output helpers ------------------------------------------------------- */

#define PUTS(b, s) kvp__jw_puts(b, s)

static void put_str(kvp__jw_t *b, const char *s) { kvp__jw_str(b, s, strlen(s)); }

static void put_shape(kvp__jw_t *b, const int64_t *shape, size_t n)
{
    PUTS(b, "[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            PUTS(b, ",");
        kvp__jw_int(b, shape[i]);
    }
    PUTS(b, "]");
}

static int table_cb(void *ctx, const kvp_ec_record_view_t *r)
{
    kvp__jw_t *b = ctx;
    if (b->len > 1)
        PUTS(b, ",");
    PUTS(b, "{\"deadline\":");
    if (r->has_deadline)
        kvp__jw_int(b, r->deadline_ms);
    else
        PUTS(b, "null");
    PUTS(b, ",\"mm_hash\":");
    put_str(b, r->mm_hash);
    PUTS(b, ",\"request_id\":");
    put_str(b, r->request_id);
    PUTS(b, ",\"state\":\"");
    PUTS(b, kvp_ec_state_name(r->state));
    PUTS(b, "\",\"transfer_id\":");
    put_str(b, r->transfer_id);
    PUTS(b, "}");
    return 0;
}

/* Appends `,"table":[...]` to out when the table differs from the last one printed. */
static void maybe_table(replay_t *rp, kvp__jw_t *out)
{
    uint64_t v = kvp_ec_sched_table_version(rp->s);
    if (v == rp->last_version)
        return;
    rp->last_version = v;
    kvp__jw_t t;
    kvp__jw_init(&t);
    PUTS(&t, "[");
    kvp_ec_sched_table_visit(rp->s, table_cb, &t);
    PUTS(&t, "]");
    if (rp->last_table.len == t.len && !memcmp(rp->last_table.p, t.p, t.len)) {
        kvp__jw_cleanup(&t);
        return;
    }
    PUTS(out, ",\"table\":");
    kvp__jw_put(out, t.p, t.len);
    kvp__jw_cleanup(&rp->last_table);
    rp->last_table = t;
}

static void put_cancels(replay_t *rp, kvp__jw_t *out, uint64_t first_job)
{
    PUTS(out, "\"cancels\":[");
    for (uint64_t j = first_job; j <= kvp__ec_sexec_count(&rp->exec); j++) {
        const kvp__ec_sjob_t *job = &rp->exec.jobs[j - 1];
        if (j != first_job)
            PUTS(out, ",");
        PUTS(out, "{\"addr\":");
        put_str(out, job->addr);
        PUTS(out, ",\"job\":");
        kvp__jw_int(out, (int64_t)j);
        PUTS(out, ",\"transfer_id\":");
        put_str(out, job->tid);
        PUTS(out, "}");
    }
    PUTS(out, "]");
}

/* A hook finished: on error set rp->seed_err and return E_SEED; else write
 * {"cancels":...,"ret":<ret>,"table":...} (plus a prefix for close). */
static err_t hook_done(replay_t *rp, kvp_status_t st, kvp__jw_t *out, const char *prefix, uint64_t first_job,
                       const kvp__jw_t *ret)
{
    if (st != KVP_OK) {
        kvp_ec_error_t e = kvp_ec_sched_error(rp->s);
        rp->seed_err = kvp_ec_error_name(e == KVP_EC_ERR_NONE ? KVP_EC_ERR_RUNTIME : e);
        return E_SEED;
    }
    PUTS(out, "{");
    if (prefix)
        PUTS(out, prefix);
    put_cancels(rp, out, first_job);
    PUTS(out, ",\"ret\":");
    kvp__jw_put(out, ret->p, ret->len);
    maybe_table(rp, out);
    PUTS(out, "}");
    return E_NONE;
}

/* Sorts pointers to structs whose first member is a char * (the key). */
static int cmp_first_str(const void *a, const void *b)
{
    const char *const *x = *(const char *const *const *)a, *const *y = *(const char *const *const *)b;
    return strcmp(*x, *y);
}

/* ---- ops -------------------------------------------------------------------- */

static err_t op_run_job(replay_t *rp, const kvp_ec_value_t *ev, kvp__jw_t *out)
{
    int64_t job;
    if (!get_int(ev, "job", &job))
        return E_BAD;
    const kvp_ec_value_t *disc = field(ev, "discover"), *reps = field(ev, "replies");
    if (disc) {
        if (disc->type != KVP_EC_V_ARRAY)
            return E_BAD;
        for (size_t i = 0; i < disc->u.arr.n; i++)
            if (disc->u.arr.items[i].type != KVP_EC_V_NULL && !is_strs(&disc->u.arr.items[i]))
                return E_BAD;
    }
    if (reps) {
        if (reps->type != KVP_EC_V_ARRAY)
            return E_BAD;
        for (size_t i = 0; i < reps->u.arr.n; i++) {
            const kvp_ec_value_t *r = &reps->u.arr.items[i];
            if (r->type != KVP_EC_V_OBJECT)
                return E_BAD;
            const kvp_ec_value_t *to = field(r, "timeout");
            if (to) {
                if (to->type != KVP_EC_V_BOOL || !to->u.b || r->u.obj.n != 1)
                    return E_BAD;
                continue;
            }
            bool ok;
            if (!get_bool(r, "ok", &ok))
                return E_BAD;
            if (ok ? !field(r, "result") : !get_str(r, "error"))
                return E_BAD;
        }
    }
    kvp__ec_sjob_t *j = kvp__ec_sexec_pending(&rp->exec, job);
    if (!j)
        return E_UNKNOWN_JOB;
    size_t nd = disc ? disc->u.arr.n : 0, nr = reps ? reps->u.arr.n : 0;
    kvp__ec_sdiscover_t *dv = nd ? kvp__calloc(nd, sizeof *dv) : NULL;
    kvp__ec_sreply_t *rv = nr ? kvp__calloc(nr, sizeof *rv) : NULL;
    for (size_t i = 0; i < nd; i++) {
        const kvp_ec_value_t *d = &disc->u.arr.items[i];
        dv[i].is_null = d->type == KVP_EC_V_NULL;
        if (!dv[i].is_null && d->u.arr.n) {
            dv[i].n = d->u.arr.n;
            dv[i].addrs = kvp__calloc(dv[i].n, sizeof *dv[i].addrs);
            for (size_t k = 0; k < dv[i].n; k++)
                dv[i].addrs[k] = kvp__strdup(d->u.arr.items[k].u.str.ptr);
        }
    }
    for (size_t i = 0; i < nr; i++) {
        const kvp_ec_value_t *r = &reps->u.arr.items[i];
        bool ok = false;
        if (field(r, "timeout")) {
            rv[i].kind = KVP__EC_REPLY_TIMEOUT;
        } else if (get_bool(r, "ok", &ok) && ok) {
            const kvp_ec_value_t *res = field(r, "result");
            rv[i].kind = KVP__EC_REPLY_OK;
            rv[i].cancelled = res->type == KVP_EC_V_OBJECT && kvp_ec_value_truthy(field(res, "cancelled"));
        } else {
            rv[i].kind = KVP__EC_REPLY_ERROR;
        }
    }
    kvp__ec_sctl_script(&rp->ctl, dv, nd, rv, nr);
    kvp_ec_control_t ci = kvp__ec_sctl_iface(&rp->ctl);
    bool cancelled = false;
    kvp_status_t st = kvp_ec_cancel_remote(&ci, j->addr, j->tid, &cancelled);
    j->state = KVP__EC_JOB_DONE;
    PUTS(out, "{\"calls\":[");
    for (size_t i = 0; i < rp->ctl.n_calls; i++) {
        const kvp__ec_scall_t *c = &rp->ctl.calls[i];
        if (i)
            PUTS(out, ",");
        if (c->is_cancel) {
            PUTS(out, "[\"request\",");
            put_str(out, c->addr);
            PUTS(out, ",{\"op\":\"cancel\",\"transfer_id\":");
            put_str(out, c->tid);
            PUTS(out, "}]");
        } else {
            PUTS(out, "[\"discover_shards\",");
            put_str(out, c->addr);
            PUTS(out, "]");
        }
    }
    PUTS(out, "],\"raised\":");
    if (st == KVP_OK)
        PUTS(out, "null,\"ret\":");
    else
        PUTS(out, st == KVP_ERR_TIMEOUT ? "\"TimeoutError\",\"ret\":" : "\"RuntimeError\",\"ret\":");
    PUTS(out, st != KVP_OK ? "null}" : cancelled ? "true}" : "false}");
    kvp__ec_sctl_script(&rp->ctl, NULL, 0, NULL, 0);
    return E_NONE;
}

static void put_meta(kvp__jw_t *b, const kvp_ec_meta_t *m)
{
    PUTS(b, "{\"freed\":[");
    for (size_t i = 0; i < m->n_freed; i++) {
        if (i)
            PUTS(b, ",");
        put_str(b, m->freed[i]);
    }
    PUTS(b, "],\"loads\":[");
    for (size_t i = 0; i < m->n_loads; i++) {
        const kvp_ec_load_spec_t *l = &m->loads[i];
        if (i)
            PUTS(b, ",");
        PUTS(b, "{\"dtype\":");
        put_str(b, l->dtype);
        PUTS(b, l->local ? ",\"local\":true,\"mm_hash\":" : ",\"local\":false,\"mm_hash\":");
        put_str(b, l->mm_hash);
        PUTS(b, ",\"nbytes\":");
        kvp__jw_int(b, l->nbytes);
        PUTS(b, ",\"num_token\":");
        kvp__jw_int(b, l->num_token);
        PUTS(b, ",\"shape\":");
        put_shape(b, l->shape, l->ndim);
        PUTS(b, ",\"transfer_id\":");
        put_str(b, l->transfer_id);
        PUTS(b, "}");
    }
    PUTS(b, "],\"pushes\":[");
    for (size_t i = 0; i < m->n_pushes; i++) {
        const kvp_ec_push_spec_t *p = &m->pushes[i];
        if (i)
            PUTS(b, ",");
        PUTS(b, "{\"consumer_zmq\":");
        put_str(b, p->consumer_zmq);
        PUTS(b, ",\"dtype\":");
        put_str(b, p->dtype);
        PUTS(b, ",\"mm_hash\":");
        put_str(b, p->mm_hash);
        PUTS(b, ",\"nbytes\":");
        kvp__jw_int(b, p->nbytes);
        PUTS(b, ",\"request_id\":");
        put_str(b, p->request_id);
        PUTS(b, ",\"shape\":");
        put_shape(b, p->shape, p->ndim);
        PUTS(b, ",\"transfer_id\":");
        put_str(b, p->transfer_id);
        PUTS(b, "}");
    }
    PUTS(b, "],\"store_candidates\":{");
    size_t n = m->n_store_candidates;
    const kvp_ec_store_candidate_t **ord = n ? kvp__malloc(n * sizeof *ord) : NULL;
    for (size_t i = 0; i < n; i++)
        ord[i] = &m->store_candidates[i];
    if (n)
        qsort(ord, n, sizeof *ord, cmp_first_str); /* identifier is the first member */
    for (size_t i = 0; i < n; i++) {
        if (i)
            PUTS(b, ",");
        put_str(b, ord[i]->identifier);
        PUTS(b, ":{\"dtype\":");
        put_str(b, ord[i]->spec.dtype);
        PUTS(b, ",\"nbytes\":");
        kvp__jw_int(b, ord[i]->spec.nbytes);
        PUTS(b, ",\"shape\":");
        put_shape(b, ord[i]->spec.shape, ord[i]->spec.ndim);
        PUTS(b, "}");
    }
    if (ord)
        kvp__free(ord, n * sizeof *ord);
    PUTS(b, "}}");
}

static void put_finished(kvp__jw_t *b, const kvp_ec_finished_t *f)
{
    PUTS(b, "[false,");
    if (!f->has_items) {
        PUTS(b, "null]");
        return;
    }
    size_t n = f->n_items;
    const kvp_ec_finished_item_t **ord = kvp__malloc(n * sizeof *ord);
    for (size_t i = 0; i < n; i++)
        ord[i] = &f->items[i];
    qsort(ord, n, sizeof *ord, cmp_first_str);
    PUTS(b, "{");
    for (size_t i = 0; i < n; i++) {
        if (i)
            PUTS(b, ",");
        put_str(b, ord[i]->identifier);
        PUTS(b, ":{\"metadata\":{\"length\":");
        kvp__jw_int(b, ord[i]->length);
        PUTS(b, ",\"modality\":");
        put_str(b, ord[i]->modality);
        PUTS(b, ",\"offset\":");
        kvp__jw_int(b, ord[i]->offset);
        PUTS(b, "}");
        if (ord[i]->transfer_id) {
            PUTS(b, ",\"transfer_id\":");
            put_str(b, ord[i]->transfer_id);
        }
        PUTS(b, "}");
    }
    PUTS(b, "}]");
    kvp__free(ord, n * sizeof *ord);
}

/* Collects a string list (already type-checked) as borrowed pointers. */
static const char **strs_view(const kvp_ec_value_t *f, size_t *n_p)
{
    size_t n = f->u.arr.n;
    *n_p = n;
    const char **v = n ? kvp__malloc(n * sizeof *v) : NULL;
    for (size_t i = 0; i < n; i++)
        v[i] = f->u.arr.items[i].u.str.ptr;
    return v;
}

/* A stream-order list with duplicates removed (first occurrence kept). */
static char **strs_dedup(const kvp_ec_value_t *f, size_t *n_p)
{
    size_t n = f->u.arr.n, k = 0;
    char **v = n ? kvp__calloc(n, sizeof *v) : NULL;
    kvp__strmap_t seen;
    kvp__strmap_init(&seen);
    for (size_t i = 0; i < n; i++) {
        const char *s = f->u.arr.items[i].u.str.ptr;
        if (kvp__strmap_gets(&seen, s))
            continue;
        kvp__strmap_put(&seen, s, strlen(s), (void *)s);
        v[k++] = kvp__strdup(s);
    }
    kvp__strmap_cleanup(&seen);
    if (k < n && k) {
        char **nv = kvp__realloc(v, n * sizeof *v, k * sizeof *v);
        if (nv)
            v = nv;
    } else if (!k && v) {
        kvp__free(v, n * sizeof *v);
        v = NULL;
    }
    *n_p = k;
    return v;
}

static err_t handle(replay_t *rp, const kvp_ec_value_t *ev, kvp_ec_value_t *ev_mut, kvp__jw_t *out)
{
    if (ev->type != KVP_EC_V_OBJECT)
        return E_BAD;
    const kvp_ec_value_t *opv = field(ev, "op");
    if (opv && (opv->type == KVP_EC_V_ARRAY || opv->type == KVP_EC_V_OBJECT)) {
        rp->seed_err = "TypeError"; /* unhashable type as a dict key */
        return E_SEED;
    }
    if (!opv || opv->type != KVP_EC_V_STR)
        return E_BAD;
    const char *op = opv->u.str.ptr;
    kvp__jw_t ret;
    kvp__jw_init(&ret);
    uint64_t first_job = kvp__ec_sexec_count(&rp->exec) + 1;
    err_t e = E_NONE;
    kvp_status_t st = KVP_OK;
    kvp_ec_request_t req;

    if (!strcmp(op, "clock")) {
        int64_t now;
        if (!get_int(ev, "now_ms", &now) || now < rp->clock.now_ms)
            return E_BAD;
        rp->clock.now_ms = now;
        PUTS(out, "{\"ret\":null}");
    } else if (!strcmp(op, "req")) {
        if ((e = op_req(rp, ev)) == E_NONE)
            PUTS(out, "{\"ret\":null}");
    } else if (!strcmp(op, "event")) {
        kvp_ec_value_t *data = (kvp_ec_value_t *)kvp_ec_value_get(ev_mut, "data");
        if (!data)
            return E_BAD;
        kvp_ec_value_t *owned = kvp__malloc(sizeof *owned);
        *owned = *data;
        data->type = KVP_EC_V_NULL; /* detached from the line's tree */
        kvp__ec_sinbox_push(&rp->inbox, owned);
        PUTS(out, "{\"ret\":null}");
    } else if (!strcmp(op, "run_job")) {
        e = op_run_job(rp, ev, out);
    } else if (!strcmp(op, "has_cache_item")) {
        const char *id = get_str(ev, "identifier");
        bool r = false;
        if (!id)
            return E_BAD;
        st = kvp_ec_sched_has_cache_item(rp->s, id, &r);
        PUTS(&ret, r ? "true" : "false");
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "ensure_cache_available")) {
        int64_t n;
        bool r = false;
        if (!get_nat(ev, "num_computed_tokens", &n))
            return E_BAD;
        if ((e = lookup_req(rp, ev, &req)) != E_NONE)
            return e;
        st = kvp_ec_sched_ensure_cache_available(rp->s, &req, n, &r);
        PUTS(&ret, r ? "true" : "false");
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "update_state_after_alloc") || !strcmp(op, "update_state_after_free")) {
        int64_t idx;
        if (!get_nat(ev, "index", &idx))
            return E_BAD;
        if ((e = lookup_req(rp, ev, &req)) != E_NONE)
            return e;
        if (op[19] == 'a')
            st = kvp_ec_sched_update_state_after_alloc(rp->s, &req, (size_t)idx);
        else
            st = kvp_ec_sched_update_state_after_free(rp->s, &req, (size_t)idx);
        PUTS(&ret, "null");
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "build_connector_meta")) {
        const kvp_ec_value_t *fr = field(ev, "free_encoder_mm_hashes"), *pre = field(ev, "preempted_req_ids");
        if (!is_strs(fr) || !pre || (pre->type != KVP_EC_V_NULL && !is_strs(pre)))
            return E_BAD;
        size_t nfr, npre = 0;
        const char **frv = strs_view(fr, &nfr);
        const char **prev = pre->type == KVP_EC_V_NULL ? NULL : strs_view(pre, &npre);
        static const char *const empty[1] = {""};
        kvp_ec_meta_t meta;
        st = kvp_ec_sched_build_connector_meta(rp->s, frv, nfr,
                                               pre->type == KVP_EC_V_NULL ? NULL : (prev ? prev : empty), npre,
                                               &meta);
        if (st == KVP_OK) {
            put_meta(&ret, &meta);
            kvp_ec_meta_cleanup(&meta);
        }
        if (frv)
            kvp__free(frv, nfr * sizeof *frv);
        if (prev)
            kvp__free(prev, npre * sizeof *prev);
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "update_connector_output")) {
        const kvp_ec_value_t *wm = field(ev, "worker_meta");
        if (!wm)
            return E_BAD;
        kvp_ec_worker_meta_t w;
        memset(&w, 0, sizeof w);
        if (wm->type != KVP_EC_V_NULL) {
            if (wm->type != KVP_EC_V_OBJECT || !is_strs(field(wm, "loaded")) || !is_strs(field(wm, "failed_loads")) ||
                !is_strs(field(wm, "reclaimed")) || !is_strs(field(wm, "failed_saves")) ||
                !get_bool(wm, "pending_loads", &w.pending_loads) || !get_bool(wm, "pending_saves", &w.pending_saves))
                return E_BAD;
            w.loaded = strs_dedup(field(wm, "loaded"), &w.n_loaded);
            w.failed_loads = strs_dedup(field(wm, "failed_loads"), &w.n_failed_loads);
            w.reclaimed = strs_dedup(field(wm, "reclaimed"), &w.n_reclaimed);
            w.failed_saves = strs_dedup(field(wm, "failed_saves"), &w.n_failed_saves);
        }
        st = kvp_ec_sched_update_connector_output(rp->s, wm->type == KVP_EC_V_NULL ? NULL : &w);
        kvp_ec_worker_meta_cleanup(&w);
        PUTS(&ret, "null");
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "take_unavailable_requests")) {
        kvp_ec_strlist_t l;
        st = kvp_ec_sched_take_unavailable_requests(rp->s, &l);
        PUTS(&ret, "[");
        for (size_t i = 0; st == KVP_OK && i < l.n; i++) {
            if (i)
                PUTS(&ret, ",");
            put_str(&ret, l.v[i]);
        }
        PUTS(&ret, "]");
        if (st == KVP_OK)
            kvp_ec_strlist_cleanup(&l);
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "has_pending_push_work")) {
        PUTS(&ret, kvp_ec_sched_has_pending_push_work(rp->s) ? "true" : "false");
        e = hook_done(rp, KVP_OK, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "request_finished")) {
        if ((e = lookup_req(rp, ev, &req)) != E_NONE)
            return e;
        kvp_ec_finished_t f;
        st = kvp_ec_sched_request_finished(rp->s, &req, &f);
        if (st == KVP_OK) {
            put_finished(&ret, &f);
            kvp_ec_finished_cleanup(&f);
        }
        e = hook_done(rp, st, out, NULL, first_job, &ret);
    } else if (!strcmp(op, "close")) {
        kvp_ec_sched_close(rp->s);
        kvp__jw_t pre;
        kvp__jw_init(&pre);
        PUTS(&pre, "\"cancelled_jobs\":[");
        for (size_t i = 0; i < rp->exec.n_cancelled; i++) {
            if (i)
                PUTS(&pre, ",");
            kvp__jw_int(&pre, (int64_t)rp->exec.cancelled[i]);
        }
        PUTS(&pre, "],");
        PUTS(&pre, "");
        kvp__jw_put(&pre, "", 1);
        PUTS(&ret, "null");
        e = hook_done(rp, KVP_OK, out, pre.p, first_job, &ret);
        kvp__jw_cleanup(&pre);
        /* the cancelled list belongs to this close only */
        if (rp->exec.cancelled)
            kvp__free(rp->exec.cancelled, rp->exec.n_cancelled * sizeof *rp->exec.cancelled);
        rp->exec.cancelled = NULL;
        rp->exec.n_cancelled = 0;
    } else {
        e = E_BAD;
    }
    kvp__jw_cleanup(&ret);
    return e;
}

/* ---- config ------------------------------------------------------------------ */

static const char *parse_config(const kvp_ec_value_t *ev, kvp_ec_config_t *c, size_t *shards_p)
{
    kvp_ec_config_init(c);
    int64_t v;
    if (ev->type != KVP_EC_V_OBJECT || !get_str(ev, "op") || strcmp(get_str(ev, "op"), "config"))
        return "first line must be the config";
    if (!get_int(ev, "version", &v) || v != 1)
        return "unsupported version";
    if (!get_bool(ev, "is_producer", &c->is_producer) || !get_bool(ev, "is_consumer", &c->is_consumer) ||
        !get_bool(ev, "cross_encoder_cache", &c->cross_encoder_cache))
        return "a bool field is missing or not a bool";
    if (!(c->control_addr = get_str(ev, "control_addr")) || !c->control_addr[0])
        return "control_addr must be a non-empty string";
    if (!get_nat(ev, "push_wait_timeout_s", &c->push_wait_timeout_s))
        return "push_wait_timeout_s must be an int >= 0";
    if (!get_int(ev, "control_timeout_ms", &c->control_timeout_ms) || c->control_timeout_ms < 1)
        return "control_timeout_ms must be an int >= 1";
    if (!get_int(ev, "pool_size", &c->pool_size) || c->pool_size < 1)
        return "pool_size must be an int > 0";
    if (!get_nat(ev, "shard_count", &v))
        return "shard_count must be an int >= 0";
    *shards_p = (size_t)v;
    if (!get_int(ev, "hidden_dim", &c->hidden_dim) || c->hidden_dim < 1)
        return "hidden_dim must be an int > 0";
    const char *dt = get_str(ev, "dtype");
    if (!dt || strncmp(dt, "torch.", 6) == 0 || kvp_ec_dtype_parse(dt, &c->dtype) != KVP_OK)
        return "dtype must be one of bfloat16, float16, float32";
    if (field(ev, "max_pending_events") && !get_nat(ev, "max_pending_events", &c->max_pending_events))
        return "max_pending_events must be a non-negative int";
    if (field(ev, "max_terminal_transfer_records") &&
        !get_nat(ev, "max_terminal_transfer_records", &c->max_terminal_records))
        return "max_terminal_transfer_records must be a non-negative int";
    if (c->push_wait_timeout_s > INT64_MAX / 2000)
        return "push_wait_timeout_s too large";
    return NULL;
}

static const char *strip(const char *s, const char *e, const char **end_p)
{
    while (s < e && (*s == ' ' || (*s >= '\t' && *s <= '\r') || (*s >= 0x1c && *s <= 0x1f)))
        s++;
    while (e > s && (e[-1] == ' ' || (e[-1] >= '\t' && e[-1] <= '\r') || (e[-1] >= 0x1c && e[-1] <= 0x1f)))
        e--;
    *end_p = e;
    return s;
}

int kvp_cmd_ec_sched_replay(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: kvpool ec-sched-replay < events.jsonl > outputs.jsonl\n"
                   "Replays an ec-sched-replay v1 stream through the C EC scheduler "
                   "(see ../shared/tools/ecsched-ref/README.md).\n");
            return 0;
        }
    }
    if (!getenv("KVP_LOG_LEVEL"))
        kvp__log_set_level(KVP_LOG_ERROR);
    /* read all of stdin */
    size_t cap = 1 << 20, len = 0;
    char *in = malloc(cap);
    if (!in)
        return 1;
    for (;;) {
        if (len == cap) {
            char *n = realloc(in, cap * 2);
            if (!n) {
                free(in);
                return 1;
            }
            in = n;
            cap *= 2;
        }
        size_t got = fread(in + len, 1, cap - len, stdin);
        if (!got)
            break;
        len += got;
    }
    static char obuf[1 << 16];
    setvbuf(stdout, obuf, _IOFBF, sizeof obuf);

    replay_t rp;
    memset(&rp, 0, sizeof rp);
    kvp__ec_sexec_init(&rp.exec);
    kvp__ec_sctl_init(&rp.ctl);
    kvp__strmap_init(&rp.reqs);
    kvp__jw_init(&rp.last_table);
    PUTS(&rp.last_table, "[]");
    int rc = 0;
    kvp__jw_t out;
    kvp__jw_init(&out);
    const char *p = in, *end = in + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *se;
        const char *ls = strip(p, le, &se);
        p = nl ? nl + 1 : end;
        if (ls == se)
            continue;
        kvp_ec_value_t *ev = NULL;
        kvp_status_t pst = kvp_ec_json_parse(ls, (size_t)(se - ls), MAX_DEPTH, &ev);
        if (!rp.s) {
            kvp_ec_config_t cfg;
            size_t shards = 0;
            const char *why = pst != KVP_OK ? "the config line is not valid JSON" : parse_config(ev, &cfg, &shards);
            if (why) {
                fprintf(stderr, "kvpool ec-sched-replay: bad config line: %s\n", why);
                kvp_ec_value_free(ev);
                rc = 2;
                break;
            }
            kvp__ec_sinbox_init(&rp.inbox, shards);
            kvp_ec_sched_params_t params = {
                .size = sizeof params,
                .config = &cfg,
                .clock = kvp__ec_sclock_iface(&rp.clock),
                .control = kvp__ec_sctl_iface(&rp.ctl),
                .executor = kvp__ec_sexec_iface(&rp.exec),
                .inbox = kvp__ec_sinbox_iface(&rp.inbox),
            };
            kvp_status_t st = kvp_ec_sched_create(&params, &rp.s);
            kvp_ec_value_free(ev);
            if (st != KVP_OK) {
                fprintf(stderr, "kvpool ec-sched-replay: %s\n", kvp_status_str(st));
                rc = 2;
                break;
            }
            rp.last_version = kvp_ec_sched_table_version(rp.s);
            fputs("{\"ret\":null}\n", stdout);
            continue;
        }
        out.len = 0;
        err_t e = pst != KVP_OK ? E_BAD : handle(&rp, ev, ev, &out);
        kvp_ec_value_free(ev);
        switch (e) {
        case E_NONE:
            fwrite(out.p, 1, out.len, stdout);
            fputc('\n', stdout);
            break;
        case E_BAD: fputs("{\"error\":\"BadEvent\"}\n", stdout); break;
        case E_UNKNOWN_REQ: fputs("{\"error\":\"UnknownRequest\"}\n", stdout); break;
        case E_UNKNOWN_JOB: fputs("{\"error\":\"UnknownJob\"}\n", stdout); break;
        case E_SEED: fprintf(stdout, "{\"error\":\"%s\"}\n", rp.seed_err); break;
        }
    }
    fflush(stdout);
    kvp__jw_cleanup(&out);
    kvp__jw_cleanup(&rp.last_table);
    kvp_ec_sched_destroy(rp.s);
    for (size_t i = 0; i < rp.reqs.cap; i++)
        if (rp.reqs.slots[i].key)
            rreq_free(rp.reqs.slots[i].val);
    kvp__strmap_cleanup(&rp.reqs);
    kvp__ec_sexec_cleanup(&rp.exec);
    kvp__ec_sctl_cleanup(&rp.ctl);
    kvp__ec_sinbox_cleanup(&rp.inbox);
    free(in);
    return rc;
}
