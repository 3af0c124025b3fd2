/*
 * msgpack encoding of the EC metadata (scheduler -> workers) and the worker
 * metadata (workers -> scheduler), and a defensive decoder for both.
 *
 * Layout (all arrays, so the format is compact and order-defined):
 *   meta:   [1, 1, freed[str], candidates[[id, shape[int], dtype, nbytes]],
 *            pushes[[mm_hash, nbytes, shape, dtype, consumer_zmq, transfer_id, request_id]],
 *            loads[[mm_hash, nbytes, shape, dtype, transfer_id, num_token, local]]]
 *   worker: [1, 2, loaded[str], failed_loads[str], reclaimed[str],
 *            pending_loads, pending_saves, failed_saves[str]]
 * The first element is the format version, the second the kind.
 *
 * The decoder is hand-written and bounded: every count is checked against
 * the bytes left (each element takes at least one byte) and a hard cap,
 * every string against its cap and for NUL bytes; anything else, trailing
 * bytes included, is KVP_ERR_DECODE with the output left empty.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/mp.h"
#include "common/strmap.h"
#include "ec/ec_table.h"
#include "kvpool/ec_connector.h"

#define CODEC_VERSION 1
#define KIND_META 1
#define KIND_WORKER 2
#define MAX_COUNT (1u << 20)
#define MAX_STR (1u << 16)
#define MAX_NDIM 16

/* ---- encoder ---------------------------------------------------------------- */

static void pk_str(kvp__mpw_t *w, const char *s)
{
    kvp__mpw_str_small(w, s ? s : "", s ? (uint32_t)strlen(s) : 0);
}

static void pk_strv(kvp__mpw_t *w, char *const *v, size_t n)
{
    kvp__mpw_array(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        pk_str(w, v[i]);
}

static void pk_shape(kvp__mpw_t *w, const int64_t *shape, size_t n)
{
    kvp__mpw_array(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        kvp__mpw_int_small(w, shape[i]);
}

/* [mm_hash, nbytes, shape, dtype, ...]: the head that pushes and loads share. */
static void pk_tensor_head(kvp__mpw_t *w, uint32_t fields, const char *mm_hash, int64_t nbytes, const int64_t *shape,
                           size_t ndim, const char *dtype)
{
    kvp__mpw_array(w, fields);
    pk_str(w, mm_hash);
    kvp__mpw_int_small(w, nbytes);
    pk_shape(w, shape, ndim);
    pk_str(w, dtype);
}

/* A fresh writer holding the head [version, kind, ...] of a `fields` array. */
static void pk_begin(kvp__mpw_t *w, uint32_t fields, unsigned kind)
{
    kvp__mpw_init(w, NULL, 0);
    kvp__mpw_array(w, fields);
    kvp__mpw_uint(w, CODEC_VERSION);
    kvp__mpw_uint(w, kind);
}

static kvp_status_t finish(kvp__mpw_t *w, uint8_t **buf_p, size_t *len_p)
{
    return kvp__mpw_finish(w, buf_p, len_p) == 0 ? KVP_OK : KVP_ERR_NO_MEMORY;
}

void kvp_ec_buf_free(uint8_t *buf, size_t len)
{
    if (buf)
        kvp__free(buf, len ? len : 1);
}

kvp_status_t kvp_ec_meta_encode(const kvp_ec_meta_t *m, uint8_t **buf_p, size_t *len_p)
{
    *buf_p = NULL;
    *len_p = 0;
    if (m->n_store_candidates > MAX_COUNT || m->n_pushes > MAX_COUNT || m->n_loads > MAX_COUNT ||
        m->n_freed > MAX_COUNT)
        return KVP_ERR_INVALID_ARG;
    kvp__mpw_t out, *pk = &out;
    pk_begin(pk, 6, KIND_META);
    pk_strv(pk, m->freed, m->n_freed);
    kvp__mpw_array(pk, (uint32_t)m->n_store_candidates);
    for (size_t i = 0; i < m->n_store_candidates; i++) {
        const kvp_ec_store_candidate_t *c = &m->store_candidates[i];
        kvp__mpw_array(pk, 4);
        pk_str(pk, c->identifier);
        pk_shape(pk, c->spec.shape, c->spec.ndim);
        pk_str(pk, c->spec.dtype);
        kvp__mpw_int_small(pk, c->spec.nbytes);
    }
    kvp__mpw_array(pk, (uint32_t)m->n_pushes);
    for (size_t i = 0; i < m->n_pushes; i++) {
        const kvp_ec_push_spec_t *p = &m->pushes[i];
        pk_tensor_head(pk, 7, p->mm_hash, p->nbytes, p->shape, p->ndim, p->dtype);
        pk_str(pk, p->consumer_zmq);
        pk_str(pk, p->transfer_id);
        pk_str(pk, p->request_id);
    }
    kvp__mpw_array(pk, (uint32_t)m->n_loads);
    for (size_t i = 0; i < m->n_loads; i++) {
        const kvp_ec_load_spec_t *l = &m->loads[i];
        pk_tensor_head(pk, 7, l->mm_hash, l->nbytes, l->shape, l->ndim, l->dtype);
        pk_str(pk, l->transfer_id);
        kvp__mpw_int_small(pk, l->num_token);
        kvp__mpw_bool(pk, l->local);
    }
    return finish(pk, buf_p, len_p);
}

kvp_status_t kvp_ec_worker_meta_encode(const kvp_ec_worker_meta_t *w, uint8_t **buf_p, size_t *len_p)
{
    *buf_p = NULL;
    *len_p = 0;
    if (w->n_loaded > MAX_COUNT || w->n_failed_loads > MAX_COUNT || w->n_reclaimed > MAX_COUNT ||
        w->n_failed_saves > MAX_COUNT)
        return KVP_ERR_INVALID_ARG;
    kvp__mpw_t out, *pk = &out;
    pk_begin(pk, 8, KIND_WORKER);
    pk_strv(pk, w->loaded, w->n_loaded);
    pk_strv(pk, w->failed_loads, w->n_failed_loads);
    pk_strv(pk, w->reclaimed, w->n_reclaimed);
    kvp__mpw_bool(pk, w->pending_loads);
    kvp__mpw_bool(pk, w->pending_saves);
    pk_strv(pk, w->failed_saves, w->n_failed_saves);
    return finish(pk, buf_p, len_p);
}

/* ---- decoder ---------------------------------------------------------------- */

typedef kvp__mpr_t rd_t; /* common/mp.h; its error is sticky */

/* every element takes at least one byte */
static bool rd_array(rd_t *r, size_t *n_p)
{
    *n_p = kvp__mpr_array_fit(r, MAX_COUNT);
    return kvp__mpr_ok(r);
}

static bool rd_int(rd_t *r, int64_t *v)
{
    *v = kvp__mpr_int(r);
    return kvp__mpr_ok(r);
}

static bool rd_bool(rd_t *r, bool *v)
{
    *v = kvp__mpr_bool(r);
    return kvp__mpr_ok(r);
}

/* A string of at most MAX_STR bytes without NUL, as a new kvp__strdup-sized copy. */
static bool rd_str(rd_t *r, char **out)
{
    uint32_t n;
    const uint8_t *p = kvp__mpr_str(r, MAX_STR, &n);
    if (!kvp__mpr_ok(r) || memchr(p, 0, n))
        return false;
    char *s = kvp__malloc((size_t)n + 1);
    if (!s)
        return false;
    memcpy(s, p, n);
    s[n] = 0;
    *out = s;
    return true;
}

static bool rd_strv(rd_t *r, char ***v_p, size_t *n_p)
{
    size_t n;
    if (!rd_array(r, &n))
        return false;
    *v_p = NULL;
    *n_p = 0;
    if (!n)
        return true;
    char **v = kvp__calloc(n, sizeof *v);
    if (!v)
        return false;
    *v_p = v;
    *n_p = n; /* unfilled entries stay NULL: cleanup copes */
    for (size_t i = 0; i < n; i++)
        if (!rd_str(r, &v[i]))
            return false;
    return true;
}

static bool rd_shape(rd_t *r, int64_t **shape_p, size_t *ndim_p)
{
    size_t n;
    if (!rd_array(r, &n) || n > MAX_NDIM)
        return false;
    *shape_p = NULL;
    *ndim_p = 0;
    if (!n)
        return true;
    int64_t *s = kvp__calloc(n, sizeof *s);
    if (!s)
        return false;
    *shape_p = s;
    *ndim_p = n;
    for (size_t i = 0; i < n; i++)
        if (!rd_int(r, &s[i]))
            return false;
    return true;
}

static bool rd_header(rd_t *r, size_t want_len, int64_t kind)
{
    size_t n;
    int64_t v, k;
    return rd_array(r, &n) && n == want_len && rd_int(r, &v) && v == CODEC_VERSION && rd_int(r, &k) && k == kind;
}

kvp_status_t kvp_ec_meta_decode(const uint8_t *buf, size_t len, kvp_ec_meta_t *m)
{
    memset(m, 0, sizeof *m);
    if (!buf)
        return KVP_ERR_DECODE;
    rd_t r;
    kvp__mpr_init(&r, buf, len);
    size_t n;
    if (!rd_header(&r, 6, KIND_META) || !rd_strv(&r, &m->freed, &m->n_freed))
        goto bad;
    if (!rd_array(&r, &n))
        goto bad;
    if (n) {
        if (!(m->store_candidates = kvp__calloc(n, sizeof *m->store_candidates)))
            goto bad;
        m->n_store_candidates = n;
        for (size_t i = 0; i < n; i++) {
            kvp_ec_store_candidate_t *c = &m->store_candidates[i];
            size_t k;
            if (!rd_array(&r, &k) || k != 4 || !rd_str(&r, &c->identifier) ||
                !rd_shape(&r, &c->spec.shape, &c->spec.ndim) || !rd_str(&r, &c->spec.dtype) ||
                !rd_int(&r, &c->spec.nbytes))
                goto bad;
        }
    }
    if (!rd_array(&r, &n))
        goto bad;
    if (n) {
        if (!(m->pushes = kvp__calloc(n, sizeof *m->pushes)))
            goto bad;
        m->n_pushes = n;
        for (size_t i = 0; i < n; i++) {
            kvp_ec_push_spec_t *p = &m->pushes[i];
            size_t k;
            if (!rd_array(&r, &k) || k != 7 || !rd_str(&r, &p->mm_hash) || !rd_int(&r, &p->nbytes) ||
                !rd_shape(&r, &p->shape, &p->ndim) || !rd_str(&r, &p->dtype) || !rd_str(&r, &p->consumer_zmq) ||
                !rd_str(&r, &p->transfer_id) || !rd_str(&r, &p->request_id))
                goto bad;
        }
    }
    if (!rd_array(&r, &n))
        goto bad;
    if (n) {
        if (!(m->loads = kvp__calloc(n, sizeof *m->loads)))
            goto bad;
        m->n_loads = n;
        for (size_t i = 0; i < n; i++) {
            kvp_ec_load_spec_t *l = &m->loads[i];
            size_t k;
            if (!rd_array(&r, &k) || k != 7 || !rd_str(&r, &l->mm_hash) || !rd_int(&r, &l->nbytes) ||
                !rd_shape(&r, &l->shape, &l->ndim) || !rd_str(&r, &l->dtype) || !rd_str(&r, &l->transfer_id) ||
                !rd_int(&r, &l->num_token) || !rd_bool(&r, &l->local))
                goto bad;
        }
    }
    if (!kvp__mpr_done(&r))
        goto bad;
    return KVP_OK;
bad:
    kvp_ec_meta_cleanup(m);
    return KVP_ERR_DECODE;
}

kvp_status_t kvp_ec_worker_meta_decode(const uint8_t *buf, size_t len, kvp_ec_worker_meta_t *w)
{
    memset(w, 0, sizeof *w);
    if (!buf)
        return KVP_ERR_DECODE;
    rd_t r;
    kvp__mpr_init(&r, buf, len);
    if (!rd_header(&r, 8, KIND_WORKER) || !rd_strv(&r, &w->loaded, &w->n_loaded) ||
        !rd_strv(&r, &w->failed_loads, &w->n_failed_loads) || !rd_strv(&r, &w->reclaimed, &w->n_reclaimed) ||
        !rd_bool(&r, &w->pending_loads) || !rd_bool(&r, &w->pending_saves) ||
        !rd_strv(&r, &w->failed_saves, &w->n_failed_saves) || !kvp__mpr_done(&r)) {
        kvp_ec_worker_meta_cleanup(w);
        return KVP_ERR_DECODE;
    }
    return KVP_OK;
}
