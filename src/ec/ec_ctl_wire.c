/*
 * The EC control protocol codec (ec_ctl_wire.h): requests, replies and
 * readiness events, encoder and decoder side by side.
 *
 * Decoding follows the seed's server loop (control.py ConsumerControlServer)
 * and its reserve handler (worker.py _reserve_push_destination), check for
 * check and in the same order, so a request fails with the message the seed
 * would send wherever the seed's message is one a peer can rely on:
 *
 *   frame not JSON, or not an object   "malformed control request"
 *   op missing or not one of ours      "unknown control op: <repr(op)>"
 *   reserve item, in the seed's order  transfer_id, mm_hash, nbytes, shape,
 *                                      dtype -> "Unsupported torch dtype
 *                                      string: <repr>" -> "shape and dtype
 *                                      do not match nbytes"
 *
 * Where the seed would only raise a Python KeyError/TypeError (whose str()
 * is an accident, e.g. "'transfer_id'"), kvpool says what is wrong:
 * "missing field 'transfer_id'", "field 'nbytes' must be an integer".
 * kvpool is stricter than the seed where the seed's leniency would hand the
 * reservation table something it cannot hold: an id over KVP__EC_CTL_MAX_ID
 * bytes or with a NUL in it, an empty transfer_id or mm_hash in a reserve,
 * a negative dim or more than KVP__EC_MAX_NDIM of them, more than
 * KVP__EC_CTL_MAX_ITEMS batch items, a frame over KVP__EC_CTL_MAX_FRAME, a
 * float where a flag is expected (its value is not kept by the reader, so
 * its truthiness is unknown), a "torch."-prefixed dtype (getattr(torch,
 * "torch.x") fails in the seed too).
 *
 * prod(shape) * itemsize is computed in 64 bits with every multiplication
 * checked: a zero dim makes it 0 whatever the others are (checked first, so
 * a huge dim before a zero cannot overflow a product that is really 0); an
 * overflow means a product no int64 nbytes can equal, which is the seed's
 * "shape and dtype do not match nbytes".
 *
 * Lifetimes: every string of a decoded request points into the decoder's
 * JSON arena (strings as sent) or its scratch buffer (integer ids written in
 * decimal, per-item error texts).  The scratch buffer is sized once per
 * decode, before the first pointer into it is handed out, for the worst case
 * of the frame's item count, so it never moves while a request is alive.
 */
#include "ec/ec_ctl_wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "ec/ec_json.h"

/* One item's error text (the repr of a dtype is trimmed to fit). */
#define ITEM_ERR_MAX 192u
/* What one item may put in scratch: two decimal ids and an error text. */
#define ITEM_SCRATCH (2u * 24u + ITEM_ERR_MAX)
#define REQ_MAX_DEPTH 32u
#define REPR_MAX 120u

static const char *const g_op_names[] = {
    [KVP__EC_OP_PEERS] = "peers",
    [KVP__EC_OP_EVENT_PORT] = "event_port",
    [KVP__EC_OP_STATUS] = "status",
    [KVP__EC_OP_RESERVE] = "reserve",
    [KVP__EC_OP_RESERVE_BATCH] = "reserve_batch",
    [KVP__EC_OP_COMPLETE] = "complete",
    [KVP__EC_OP_COMPLETE_BATCH] = "complete_batch",
    [KVP__EC_OP_CANCEL] = "cancel",
};
#define N_OPS (sizeof g_op_names / sizeof g_op_names[0])

const char *kvp__ec_op_name(kvp__ec_op_t op) { return (unsigned)op < N_OPS ? g_op_names[op] : "?"; }

/* getattr(torch, name) for the dtypes kvpool carries: the canonical names
 * and torch's aliases of them. */
static const struct {
    const char *name;
    kvp_ec_dtype_t dtype;
} g_wire_dtypes[] = {
    {"float32", KVP_EC_DTYPE_FLOAT32}, {"float", KVP_EC_DTYPE_FLOAT32},
    {"float16", KVP_EC_DTYPE_FLOAT16}, {"half", KVP_EC_DTYPE_FLOAT16},
    {"bfloat16", KVP_EC_DTYPE_BFLOAT16},
    {"float64", KVP_EC_DTYPE_FLOAT64}, {"double", KVP_EC_DTYPE_FLOAT64},
    {"int8", KVP_EC_DTYPE_INT8},
    {"uint8", KVP_EC_DTYPE_UINT8},
    {"int16", KVP_EC_DTYPE_INT16},     {"short", KVP_EC_DTYPE_INT16},
    {"int32", KVP_EC_DTYPE_INT32},     {"int", KVP_EC_DTYPE_INT32},
    {"int64", KVP_EC_DTYPE_INT64},     {"long", KVP_EC_DTYPE_INT64},
};

static bool wire_dtype(const char *name, size_t n, kvp_ec_dtype_t *dt_p)
{
    for (size_t i = 0; i < sizeof g_wire_dtypes / sizeof g_wire_dtypes[0]; i++)
        if (strlen(g_wire_dtypes[i].name) == n && !memcmp(g_wire_dtypes[i].name, name, n)) {
            *dt_p = g_wire_dtypes[i].dtype;
            return true;
        }
    return false;
}

/* ---- Python repr (for "unknown control op: ..." and the dtype error) ---- */

/* repr() of a JSON value as Python's json.loads would give it: exact for
 * strings, None, booleans and int64 integers; the reader keeps no value for
 * floats and big integers, and containers are not spelled out. */
static void repr_value(kvp__jw_t *b, const kvp__json_t *v)
{
    if (!v) {
        kvp__jw_puts(b, "None");
        return;
    }
    switch (v->type) {
    case KVP__JSON_NULL: kvp__jw_puts(b, "None"); break;
    case KVP__JSON_FALSE: kvp__jw_puts(b, "False"); break;
    case KVP__JSON_TRUE: kvp__jw_puts(b, "True"); break;
    case KVP__JSON_INT: kvp__jw_int(b, v->u.i); break;
    case KVP__JSON_BIGINT: kvp__jw_puts(b, "<int>"); break;
    case KVP__JSON_FLOAT: kvp__jw_puts(b, "<float>"); break;
    case KVP__JSON_STRING: kvp__ec_py_repr(b, v->u.s, v->n, REPR_MAX); break;
    case KVP__JSON_ARRAY: kvp__jw_puts(b, v->n ? "[...]" : "[]"); break;
    case KVP__JSON_OBJECT: kvp__jw_puts(b, v->n ? "{...}" : "{}"); break;
    }
}

/* err = prefix + repr(v), NUL-terminated and truncated to errlen. */
static void err_repr(char *err, size_t errlen, const char *prefix, const kvp__json_t *v)
{
    if (!errlen)
        return;
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, prefix);
    repr_value(&b, v);
    if (b.oom)
        snprintf(err, errlen, "%s...", prefix);
    else
        snprintf(err, errlen, "%.*s", (int)b.len, b.p);
    kvp__jw_cleanup(&b);
}

/* ---- decoder ---- */

void kvp__ec_ctl_dec_init(kvp__ec_ctl_dec_t *d)
{
    memset(d, 0, sizeof *d);
    kvp__json_parser_init(&d->json);
    d->json.max_depth = REQ_MAX_DEPTH;
}

void kvp__ec_ctl_dec_cleanup(kvp__ec_ctl_dec_t *d)
{
    kvp__json_parser_cleanup(&d->json);
    if (d->reserves)
        kvp__free(d->reserves, d->cap_reserves * sizeof *d->reserves);
    if (d->completes)
        kvp__free(d->completes, d->cap_completes * sizeof *d->completes);
    if (d->scratch)
        kvp__free(d->scratch, d->scratch_cap);
    memset(d, 0, sizeof *d);
}

/* A copy of s[0..n) + NUL in scratch (sized by the caller in advance: see
 * the top; never grows here). */
static const char *scratch_put(kvp__ec_ctl_dec_t *d, const char *s, size_t n)
{
    if (d->scratch_len + n + 1 > d->scratch_cap)
        return "(error text lost)"; /* unreachable with the advance sizing */
    char *p = d->scratch + d->scratch_len;
    memcpy(p, s, n);
    p[n] = 0;
    d->scratch_len += n + 1;
    return p;
}

typedef struct {
    char msg[ITEM_ERR_MAX];
} ebuf_t;

static bool fail(ebuf_t *e, const char *fmt, const char *field)
{
    snprintf(e->msg, sizeof e->msg, fmt, field);
    return false;
}

/* transfer_id / reservation_id / mm_hash: a string (as sent) or, where
 * allow_int, an int64 written in decimal (Python's str()). */
static bool get_id(kvp__ec_ctl_dec_t *d, const kvp__json_t *obj, const char *key, bool allow_int, bool required,
                   const char **out_p, ebuf_t *e)
{
    const kvp__json_t *v = kvp__json_get(obj, key);
    if (!v) {
        if (required)
            return fail(e, "missing field '%s'", key);
        *out_p = "";
        return true;
    }
    if (v->type == KVP__JSON_STRING) {
        if (v->n > KVP__EC_CTL_MAX_ID) {
            snprintf(e->msg, sizeof e->msg, "field '%s' longer than %u bytes", key, KVP__EC_CTL_MAX_ID);
            return false;
        }
        if (memchr(v->u.s, 0, v->n))
            return fail(e, "field '%s' contains a NUL character", key);
        *out_p = v->u.s;
        return true;
    }
    if (allow_int && v->type == KVP__JSON_INT) {
        char tmp[24];
        int n = snprintf(tmp, sizeof tmp, "%" PRId64, v->u.i);
        *out_p = scratch_put(d, tmp, (size_t)n);
        return true;
    }
    return fail(e, allow_int ? "field '%s' must be a string or an integer" : "field '%s' must be a string", key);
}

/* Python truthiness of a flag: 1, 0, or -1 for a float (value unknown). */
static int truthy(const kvp__json_t *v)
{
    if (!v)
        return 0;
    switch (v->type) {
    case KVP__JSON_NULL:
    case KVP__JSON_FALSE: return 0;
    case KVP__JSON_TRUE:
    case KVP__JSON_BIGINT: return 1;
    case KVP__JSON_INT: return v->u.i != 0;
    case KVP__JSON_FLOAT: return -1;
    case KVP__JSON_STRING:
    case KVP__JSON_ARRAY:
    case KVP__JSON_OBJECT: return v->n != 0;
    }
    return 0;
}

/* prod(shape) * itemsize == nbytes, without overflow (see the top). */
static bool size_matches(const kvp__ec_tensor_t *t, int64_t nbytes, int itemsize)
{
    if (nbytes < 0)
        return false;
    for (uint32_t i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return nbytes == 0;
    uint64_t prod = (uint64_t)itemsize;
    for (uint32_t i = 0; i < t->ndim; i++)
        if (__builtin_mul_overflow(prod, (uint64_t)t->shape[i], &prod) || prod > (uint64_t)INT64_MAX)
            return false;
    return prod == (uint64_t)nbytes;
}

/* One reserve (the request itself, or a reserve_batch item), in the seed's
 * order of checks.  false: the message is in e. */
static bool decode_reserve(kvp__ec_ctl_dec_t *d, const kvp__json_t *obj, kvp__ec_wire_reserve_t *r, ebuf_t *e)
{
    memset(r, 0, sizeof *r);
    if (obj->type != KVP__JSON_OBJECT)
        return fail(e, "%s", "reserve item must be an object");
    if (!get_id(d, obj, "transfer_id", true, true, &r->transfer_id, e))
        return false;
    if (!r->transfer_id[0])
        return fail(e, "field '%s' must not be empty", "transfer_id");
    if (!get_id(d, obj, "mm_hash", false, true, &r->mm_hash, e))
        return false;
    if (!r->mm_hash[0])
        return fail(e, "field '%s' must not be empty", "mm_hash");
    const kvp__json_t *nb = kvp__json_get(obj, "nbytes");
    if (!nb)
        return fail(e, "missing field '%s'", "nbytes");
    if (nb->type != KVP__JSON_INT)
        return fail(e, "field '%s' must be an integer", "nbytes");
    const kvp__json_t *sh = kvp__json_get(obj, "shape");
    if (!sh)
        return fail(e, "missing field '%s'", "shape");
    if (sh->type != KVP__JSON_ARRAY)
        return fail(e, "field '%s' must be a list of integers", "shape");
    if (sh->n > KVP__EC_MAX_NDIM) {
        snprintf(e->msg, sizeof e->msg, "shape has more than %d dimensions", KVP__EC_MAX_NDIM);
        return false;
    }
    for (size_t i = 0; i < sh->n; i++) {
        const kvp__json_t *dim = &sh->u.items[i];
        if (dim->type != KVP__JSON_INT)
            return fail(e, "field '%s' must be a list of integers", "shape");
        if (dim->u.i < 0)
            return fail(e, "%s", "shape has a negative dimension");
        r->t.shape[i] = dim->u.i;
    }
    r->t.ndim = (uint32_t)sh->n;
    const kvp__json_t *dt = kvp__json_get(obj, "dtype");
    if (!dt)
        return fail(e, "missing field '%s'", "dtype");
    if (dt->type != KVP__JSON_STRING)
        return fail(e, "field '%s' must be a string", "dtype");
    if (memchr(dt->u.s, 0, dt->n) || !wire_dtype(dt->u.s, dt->n, &r->t.dtype)) {
        err_repr(e->msg, sizeof e->msg, "Unsupported torch dtype string: ", dt);
        return false;
    }
    r->dtype_name = dt->u.s;
    if (!size_matches(&r->t, nb->u.i, kvp_ec_dtype_itemsize(r->t.dtype)))
        return fail(e, "%s", "shape and dtype do not match nbytes");
    r->t.nbytes = (uint64_t)nb->u.i;
    return true;
}

static bool decode_complete(kvp__ec_ctl_dec_t *d, const kvp__json_t *obj, kvp__ec_wire_complete_t *c, ebuf_t *e)
{
    if (obj->type != KVP__JSON_OBJECT)
        return fail(e, "%s", "complete item must be an object");
    return get_id(d, obj, "transfer_id", true, true, &c->transfer_id, e) &&
           get_id(d, obj, "reservation_id", true, true, &c->reservation_id, e);
}

static bool flag(const kvp__json_t *obj, const char *key, bool *out, ebuf_t *e)
{
    int t = truthy(kvp__json_get(obj, key));
    if (t < 0)
        return fail(e, "field '%s' must not be a float", key);
    *out = t == 1;
    return true;
}

/* The "items" of a batch: a list of at most KVP__EC_CTL_MAX_ITEMS. */
static const kvp__json_t *batch_items(const kvp__json_t *root, ebuf_t *e)
{
    const kvp__json_t *items = kvp__json_get(root, "items");
    if (!items) {
        fail(e, "missing field '%s'", "items");
        return NULL;
    }
    if (items->type != KVP__JSON_ARRAY) {
        fail(e, "field '%s' must be a list", "items");
        return NULL;
    }
    if (items->n > KVP__EC_CTL_MAX_ITEMS) {
        snprintf(e->msg, sizeof e->msg, "too many items (at most %u)", KVP__EC_CTL_MAX_ITEMS);
        return NULL;
    }
    return items;
}

static kvp_status_t req_fail(char *err, size_t errlen, const char *msg)
{
    if (errlen)
        snprintf(err, errlen, "%s", msg);
    return KVP_ERR_DECODE;
}

static bool op_of(const kvp__json_t *v, kvp__ec_op_t *op_p)
{
    if (!v || v->type != KVP__JSON_STRING)
        return false;
    for (size_t i = 0; i < N_OPS; i++)
        if (strlen(g_op_names[i]) == v->n && !memcmp(g_op_names[i], v->u.s, v->n)) {
            *op_p = (kvp__ec_op_t)i;
            return true;
        }
    return false;
}

kvp_status_t kvp__ec_ctl_decode(kvp__ec_ctl_dec_t *d, const void *buf, size_t len, kvp__ec_ctl_req_t *req,
                                char *err, size_t errlen)
{
    memset(req, 0, sizeof *req);
    if (errlen)
        err[0] = 0;
    d->scratch_len = 0;
    if (len > KVP__EC_CTL_MAX_FRAME) {
        char msg[64];
        snprintf(msg, sizeof msg, "control request larger than %u bytes", KVP__EC_CTL_MAX_FRAME);
        return req_fail(err, errlen, msg);
    }
    const kvp__json_t *root;
    kvp_status_t st = kvp__json_parse(&d->json, buf, len, &root);
    if (st == KVP_ERR_NO_MEMORY)
        return st;
    if (st != KVP_OK || root->type != KVP__JSON_OBJECT)
        return req_fail(err, errlen, "malformed control request");
    const kvp__json_t *opv = kvp__json_get(root, "op");
    kvp__ec_op_t op;
    if (!op_of(opv, &op)) {
        err_repr(err, errlen, "unknown control op: ", opv);
        return KVP_ERR_DECODE;
    }
    req->op = op;
    ebuf_t e;
    const kvp__json_t *items = NULL;
    if (op == KVP__EC_OP_RESERVE_BATCH || op == KVP__EC_OP_COMPLETE_BATCH) {
        if (!(items = batch_items(root, &e)))
            return req_fail(err, errlen, e.msg);
    }
    /* The scratch buffer, sized for the worst case before any pointer into it
     * is handed out (see the top). */
    size_t n_items = items ? items->n : 1;
    size_t need = (n_items + 1) * ITEM_SCRATCH;
    if (need > d->scratch_cap && kvp__grow_in((void **)&d->scratch, &d->scratch_cap, need, 1, need) != 0)
        return KVP_ERR_NO_MEMORY;
    switch (op) {
    case KVP__EC_OP_PEERS:
    case KVP__EC_OP_EVENT_PORT: return KVP_OK;
    case KVP__EC_OP_STATUS:
        if (!get_id(d, root, "transfer_id", true, true, &req->transfer_id, &e))
            return req_fail(err, errlen, e.msg);
        return KVP_OK;
    case KVP__EC_OP_CANCEL:
        if (!get_id(d, root, "transfer_id", true, true, &req->transfer_id, &e) ||
            !get_id(d, root, "reservation_id", true, false, &req->reservation_id, &e) ||
            !flag(root, "abandon", &req->abandon, &e) || !flag(root, "refresh", &req->refresh, &e))
            return req_fail(err, errlen, e.msg);
        return KVP_OK;
    case KVP__EC_OP_RESERVE:
    case KVP__EC_OP_RESERVE_BATCH: {
        if (n_items > d->cap_reserves &&
            kvp__grow_in((void **)&d->reserves, &d->cap_reserves, n_items, sizeof *d->reserves, 16) != 0)
            return KVP_ERR_NO_MEMORY;
        req->reserves = d->reserves;
        if (op == KVP__EC_OP_RESERVE) {
            if (!decode_reserve(d, root, &d->reserves[0], &e))
                return req_fail(err, errlen, e.msg);
            req->n_reserves = 1;
            return KVP_OK;
        }
        for (size_t i = 0; i < n_items; i++)
            if (!decode_reserve(d, &items->u.items[i], &d->reserves[i], &e)) {
                memset(&d->reserves[i], 0, sizeof d->reserves[i]);
                d->reserves[i].error = scratch_put(d, e.msg, strlen(e.msg));
            }
        req->n_reserves = n_items;
        return KVP_OK;
    }
    case KVP__EC_OP_COMPLETE:
    case KVP__EC_OP_COMPLETE_BATCH: {
        if (n_items > d->cap_completes &&
            kvp__grow_in((void **)&d->completes, &d->cap_completes, n_items, sizeof *d->completes, 16) != 0)
            return KVP_ERR_NO_MEMORY;
        req->completes = d->completes;
        const kvp__json_t *one = op == KVP__EC_OP_COMPLETE ? root : NULL;
        for (size_t i = 0; i < n_items; i++)
            if (!decode_complete(d, one ? one : &items->u.items[i], &d->completes[i], &e)) {
                req->completes = NULL; /* the seed fails the whole batch */
                return req_fail(err, errlen, e.msg);
            }
        req->n_completes = n_items;
        return KVP_OK;
    }
    }
    return req_fail(err, errlen, "malformed control request");
}

/* ---- encoders ---- */

static void put_s(kvp__jw_t *b, const char *s) { kvp__jw_str(b, s ? s : "", s ? strlen(s) : 0); }

/* "key": (a comma before it unless first) */
static void put_key(kvp__jw_t *b, const char *key, bool first)
{
    /* (the keys are this file's literals: nothing to escape) */
    if (first)
        kvp__jw_put(b, "\"", 1);
    else
        kvp__jw_put(b, ",\"", 2);
    kvp__jw_puts(b, key);
    kvp__jw_put(b, "\":", 2);
}

static void put_shape(kvp__jw_t *b, const int64_t *shape, uint32_t ndim)
{
    if (ndim > KVP__EC_MAX_NDIM)
        ndim = KVP__EC_MAX_NDIM;
    kvp__jw_put(b, "[", 1);
    for (uint32_t i = 0; i < ndim; i++) {
        if (i)
            kvp__jw_put(b, ",", 1);
        kvp__jw_int(b, shape[i]);
    }
    kvp__jw_put(b, "]", 1);
}

static void put_dtype(kvp__jw_t *b, kvp_ec_dtype_t dt)
{
    const char *name = kvp_ec_dtype_name(dt);
    put_s(b, name ? name : "?");
}

static void put_op(kvp__jw_t *b, kvp__ec_op_t op)
{
    kvp__jw_puts(b, "{\"op\":");
    put_s(b, kvp__ec_op_name(op));
}

void kvp__ec_ctl_put_simple(kvp__jw_t *b, kvp__ec_op_t op)
{
    put_op(b, op);
    kvp__jw_put(b, "}", 1);
}

void kvp__ec_ctl_put_status(kvp__jw_t *b, const char *transfer_id)
{
    put_op(b, KVP__EC_OP_STATUS);
    put_key(b, "transfer_id", false);
    put_s(b, transfer_id);
    kvp__jw_put(b, "}", 1);
}

/* The reserve fields (worker.py _reserve_one's order), after a key. */
static void put_reserve_fields(kvp__jw_t *b, const char *tid, const char *hash, const kvp__ec_tensor_t *t,
                               bool first)
{
    put_key(b, "transfer_id", first);
    put_s(b, tid);
    put_key(b, "mm_hash", false);
    put_s(b, hash);
    put_key(b, "nbytes", false);
    kvp__jw_uint(b, t->nbytes);
    put_key(b, "shape", false);
    put_shape(b, t->shape, t->ndim);
    put_key(b, "dtype", false);
    put_dtype(b, t->dtype);
}

void kvp__ec_ctl_put_reserve(kvp__jw_t *b, const char *const *transfer_ids, const char *const *mm_hashes,
                             const kvp__ec_tensor_t *ts, size_t n, bool batch)
{
    if (!batch) {
        put_op(b, KVP__EC_OP_RESERVE);
        if (n)
            put_reserve_fields(b, transfer_ids[0], mm_hashes[0], &ts[0], false);
        kvp__jw_put(b, "}", 1);
        return;
    }
    put_op(b, KVP__EC_OP_RESERVE_BATCH);
    kvp__jw_puts(b, ",\"items\":[");
    for (size_t i = 0; i < n; i++) {
        kvp__jw_puts(b, i ? ",{" : "{");
        put_reserve_fields(b, transfer_ids[i], mm_hashes[i], &ts[i], true);
        kvp__jw_put(b, "}", 1);
    }
    kvp__jw_puts(b, "]}");
}

void kvp__ec_ctl_put_complete(kvp__jw_t *b, const kvp__ec_wire_complete_t *items, size_t n, bool batch)
{
    if (!batch) {
        put_op(b, KVP__EC_OP_COMPLETE);
        if (n) {
            put_key(b, "transfer_id", false);
            put_s(b, items[0].transfer_id);
            put_key(b, "reservation_id", false);
            put_s(b, items[0].reservation_id);
        }
        kvp__jw_put(b, "}", 1);
        return;
    }
    put_op(b, KVP__EC_OP_COMPLETE_BATCH);
    kvp__jw_puts(b, ",\"items\":[");
    for (size_t i = 0; i < n; i++) {
        kvp__jw_puts(b, i ? ",{" : "{");
        put_key(b, "transfer_id", true);
        put_s(b, items[i].transfer_id);
        put_key(b, "reservation_id", false);
        put_s(b, items[i].reservation_id);
        kvp__jw_put(b, "}", 1);
    }
    kvp__jw_puts(b, "]}");
}

/* make_cancel_request; reservation_id NULL leaves the key out (the
 * scheduler's cancel, which carries the transfer id only). */
void kvp__ec_ctl_put_cancel(kvp__jw_t *b, const char *transfer_id, const char *reservation_id, bool abandon,
                            bool refresh)
{
    put_op(b, KVP__EC_OP_CANCEL);
    put_key(b, "transfer_id", false);
    put_s(b, transfer_id);
    if (reservation_id) {
        put_key(b, "reservation_id", false);
        put_s(b, reservation_id);
    }
    if (abandon)
        kvp__jw_puts(b, ",\"abandon\":true");
    if (refresh)
        kvp__jw_puts(b, ",\"refresh\":true");
    kvp__jw_put(b, "}", 1);
}

void kvp__ec_ctl_put_ok_begin(kvp__jw_t *b) { kvp__jw_puts(b, "{\"ok\":true,\"result\":"); }
void kvp__ec_ctl_put_ok_end(kvp__jw_t *b) { kvp__jw_put(b, "}", 1); }

void kvp__ec_ctl_put_error(kvp__jw_t *b, const char *msg)
{
    kvp__jw_puts(b, "{\"ok\":false,\"error\":");
    put_s(b, msg);
    kvp__jw_put(b, "}", 1);
}

void kvp__ec_ctl_put_peers_result(kvp__jw_t *b, const uint16_t *ports, size_t n)
{
    kvp__jw_puts(b, "{\"ports\":[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            kvp__jw_put(b, ",", 1);
        kvp__jw_int(b, ports[i]);
    }
    kvp__jw_puts(b, "]}");
}

void kvp__ec_ctl_put_reserve_result(kvp__jw_t *b, const kvp__ec_reserve_out_t *o, const char *dst_session,
                                    uint64_t dst_ptr)
{
    if (o->cancelled) {
        kvp__jw_puts(b, "{\"reservation_id\":\"\",\"dst_session\":\"\",\"dst_ptr\":0,\"nbytes\":");
        kvp__jw_uint(b, o->nbytes);
        kvp__jw_puts(b, ",\"write\":false,\"ready\":false,\"cancelled\":true}");
        return;
    }
    kvp__jw_put(b, "{", 1);
    put_key(b, "reservation_id", true);
    put_s(b, o->reservation_id);
    put_key(b, "dst_session", false);
    put_s(b, dst_session);
    put_key(b, "dst_ptr", false);
    kvp__jw_uint(b, dst_ptr);
    put_key(b, "nbytes", false);
    kvp__jw_uint(b, o->nbytes);
    put_key(b, "write", false);
    kvp__jw_bool(b, o->write);
    put_key(b, "ready", false);
    kvp__jw_bool(b, o->ready);
    put_key(b, "cached", false);
    kvp__jw_bool(b, o->cached);
    kvp__jw_put(b, "}", 1);
}

void kvp__ec_ctl_put_status_result(kvp__jw_t *b, const kvp__ec_status_t *st)
{
    if (!st) {
        kvp__jw_puts(b, "null");
        return;
    }
    kvp__jw_put(b, "{", 1);
    put_key(b, "mm_hash", true);
    put_s(b, st->mm_hash);
    put_key(b, "ready", false);
    kvp__jw_bool(b, st->ready);
    put_key(b, "reservation_id", false);
    put_s(b, st->reservation_id);
    put_key(b, "nbytes", false);
    kvp__jw_uint(b, st->t.nbytes);
    put_key(b, "shape", false);
    put_shape(b, st->t.shape, st->t.ndim);
    put_key(b, "dtype", false);
    put_dtype(b, st->t.dtype);
    kvp__jw_put(b, "}", 1);
}

void kvp__ec_ctl_put_complete_result(kvp__jw_t *b, bool completed, bool became_ready)
{
    kvp__jw_puts(b, "{\"completed\":");
    kvp__jw_bool(b, completed);
    kvp__jw_puts(b, ",\"became_ready\":");
    kvp__jw_bool(b, became_ready);
    kvp__jw_put(b, "}", 1);
}

void kvp__ec_ctl_put_cancel_result(kvp__jw_t *b, bool cancelled, bool deferred)
{
    kvp__jw_puts(b, "{\"cancelled\":");
    kvp__jw_bool(b, cancelled);
    if (deferred)
        kvp__jw_puts(b, ",\"deferred\":true");
    kvp__jw_put(b, "}", 1);
}

/* control.py queue_ready: {"transfer_id": tid, **status, "shard": port};
 * "ready" is the status's (true whenever the server queues one). */
void kvp__ec_ctl_put_event(kvp__jw_t *b, const char *transfer_id, const kvp__ec_status_t *st, uint16_t shard)
{
    kvp__jw_put(b, "{", 1);
    put_key(b, "transfer_id", true);
    put_s(b, transfer_id);
    put_key(b, "mm_hash", false);
    put_s(b, st->mm_hash);
    put_key(b, "ready", false);
    kvp__jw_bool(b, st->ready);
    put_key(b, "reservation_id", false);
    put_s(b, st->reservation_id);
    put_key(b, "nbytes", false);
    kvp__jw_uint(b, st->t.nbytes);
    put_key(b, "shape", false);
    put_shape(b, st->t.shape, st->t.ndim);
    put_key(b, "dtype", false);
    put_dtype(b, st->t.dtype);
    put_key(b, "shard", false);
    kvp__jw_int(b, shard);
    kvp__jw_put(b, "}", 1);
}

/* ---- reply decoders ---- */

static const kvp__json_t g_null = {.type = KVP__JSON_NULL};

kvp_status_t kvp__ec_ctl_decode_reply(kvp__json_parser_t *p, const void *buf, size_t len, bool *ok_p,
                                      const kvp__json_t **result_p, const char **error_p)
{
    *ok_p = false;
    *result_p = NULL;
    *error_p = NULL;
    const kvp__json_t *root;
    kvp_status_t st = kvp__json_parse(p, buf, len, &root);
    if (st == KVP_ERR_NO_MEMORY)
        return st;
    if (st != KVP_OK || root->type != KVP__JSON_OBJECT)
        return KVP_ERR_DECODE;
    int ok = truthy(kvp__json_get(root, "ok"));
    if (ok < 0)
        return KVP_ERR_DECODE;
    if (ok) {
        const kvp__json_t *r = kvp__json_get(root, "result");
        *ok_p = true;
        *result_p = r ? r : &g_null;
        return KVP_OK;
    }
    /* RuntimeError(response.get("error", "EC control request failed")), str()'d */
    const kvp__json_t *e = kvp__json_get(root, "error");
    const char *msg = "EC control request failed";
    if (e && e->type == KVP__JSON_STRING) {
        msg = e->u.s;
    } else if (e && e->type == KVP__JSON_NULL) {
        msg = "None";
    } else if (e && (e->type == KVP__JSON_TRUE || e->type == KVP__JSON_FALSE)) {
        msg = e->type == KVP__JSON_TRUE ? "True" : "False";
    } else if (e && e->type == KVP__JSON_INT) {
        char *s = kvp__arena_alloc(&p->arena, 24);
        if (!s)
            return KVP_ERR_NO_MEMORY;
        snprintf(s, 24, "%" PRId64, e->u.i);
        msg = s;
    }
    *error_p = msg;
    return KVP_OK;
}

static bool get_u64(const kvp__json_t *obj, const char *key, uint64_t *out)
{
    const kvp__json_t *v = kvp__json_get(obj, key);
    if (!v || v->type != KVP__JSON_INT || v->u.i < 0)
        return false;
    *out = (uint64_t)v->u.i;
    return true;
}

static bool get_flag(const kvp__json_t *obj, const char *key, bool *out)
{
    int t = truthy(kvp__json_get(obj, key));
    *out = t == 1;
    return t >= 0;
}

kvp_status_t kvp__ec_ctl_decode_reserve_result(const kvp__json_t *result, kvp__ec_reserve_out_t *o,
                                               const char **dst_session_p, uint64_t *dst_ptr_p)
{
    memset(o, 0, sizeof *o);
    *dst_session_p = NULL;
    *dst_ptr_p = 0;
    if (!result || result->type != KVP__JSON_OBJECT)
        return KVP_ERR_DECODE;
    const kvp__json_t *rid = kvp__json_get(result, "reservation_id");
    const kvp__json_t *sess = kvp__json_get(result, "dst_session");
    if (!rid || rid->type != KVP__JSON_STRING || rid->n > KVP__EC_RID_LEN || memchr(rid->u.s, 0, rid->n))
        return KVP_ERR_DECODE;
    if (!sess || sess->type != KVP__JSON_STRING || memchr(sess->u.s, 0, sess->n))
        return KVP_ERR_DECODE;
    uint64_t ptr;
    if (!get_u64(result, "dst_ptr", &ptr) || !get_u64(result, "nbytes", &o->nbytes))
        return KVP_ERR_DECODE;
    if (!get_flag(result, "write", &o->write) || !get_flag(result, "ready", &o->ready) ||
        !get_flag(result, "cached", &o->cached) || !get_flag(result, "cancelled", &o->cancelled))
        return KVP_ERR_DECODE;
    memcpy(o->reservation_id, rid->u.s, rid->n);
    o->reservation_id[rid->n] = 0;
    *dst_session_p = sess->u.s;
    *dst_ptr_p = ptr;
    return KVP_OK;
}
