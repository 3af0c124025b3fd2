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
#include <msgpack.h>
#include <string.h>

#include "common/alloc.h"
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

static void pk_str(msgpack_packer *pk, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s ? s : "", n);
}

static void pk_strv(msgpack_packer *pk, char *const *v, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        pk_str(pk, v[i]);
}

static void pk_shape(msgpack_packer *pk, const int64_t *shape, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_int64(pk, shape[i]);
}

static kvp_status_t finish(msgpack_sbuffer *sb, uint8_t **buf_p, size_t *len_p)
{
    uint8_t *out = kvp__malloc(sb->size ? sb->size : 1);
    if (!out) {
        msgpack_sbuffer_destroy(sb);
        return KVP_ERR_NO_MEMORY;
    }
    memcpy(out, sb->data, sb->size);
    *buf_p = out;
    *len_p = sb->size;
    msgpack_sbuffer_destroy(sb);
    return KVP_OK;
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
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 6);
    msgpack_pack_int(&pk, CODEC_VERSION);
    msgpack_pack_int(&pk, KIND_META);
    pk_strv(&pk, m->freed, m->n_freed);
    msgpack_pack_array(&pk, m->n_store_candidates);
    for (size_t i = 0; i < m->n_store_candidates; i++) {
        const kvp_ec_store_candidate_t *c = &m->store_candidates[i];
        msgpack_pack_array(&pk, 4);
        pk_str(&pk, c->identifier);
        pk_shape(&pk, c->spec.shape, c->spec.ndim);
        pk_str(&pk, c->spec.dtype);
        msgpack_pack_int64(&pk, c->spec.nbytes);
    }
    msgpack_pack_array(&pk, m->n_pushes);
    for (size_t i = 0; i < m->n_pushes; i++) {
        const kvp_ec_push_spec_t *p = &m->pushes[i];
        msgpack_pack_array(&pk, 7);
        pk_str(&pk, p->mm_hash);
        msgpack_pack_int64(&pk, p->nbytes);
        pk_shape(&pk, p->shape, p->ndim);
        pk_str(&pk, p->dtype);
        pk_str(&pk, p->consumer_zmq);
        pk_str(&pk, p->transfer_id);
        pk_str(&pk, p->request_id);
    }
    msgpack_pack_array(&pk, m->n_loads);
    for (size_t i = 0; i < m->n_loads; i++) {
        const kvp_ec_load_spec_t *l = &m->loads[i];
        msgpack_pack_array(&pk, 7);
        pk_str(&pk, l->mm_hash);
        msgpack_pack_int64(&pk, l->nbytes);
        pk_shape(&pk, l->shape, l->ndim);
        pk_str(&pk, l->dtype);
        pk_str(&pk, l->transfer_id);
        msgpack_pack_int64(&pk, l->num_token);
        if (l->local)
            msgpack_pack_true(&pk);
        else
            msgpack_pack_false(&pk);
    }
    return finish(&sb, buf_p, len_p);
}

kvp_status_t kvp_ec_worker_meta_encode(const kvp_ec_worker_meta_t *w, uint8_t **buf_p, size_t *len_p)
{
    *buf_p = NULL;
    *len_p = 0;
    if (w->n_loaded > MAX_COUNT || w->n_failed_loads > MAX_COUNT || w->n_reclaimed > MAX_COUNT ||
        w->n_failed_saves > MAX_COUNT)
        return KVP_ERR_INVALID_ARG;
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 8);
    msgpack_pack_int(&pk, CODEC_VERSION);
    msgpack_pack_int(&pk, KIND_WORKER);
    pk_strv(&pk, w->loaded, w->n_loaded);
    pk_strv(&pk, w->failed_loads, w->n_failed_loads);
    pk_strv(&pk, w->reclaimed, w->n_reclaimed);
    if (w->pending_loads)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
    if (w->pending_saves)
        msgpack_pack_true(&pk);
    else
        msgpack_pack_false(&pk);
    pk_strv(&pk, w->failed_saves, w->n_failed_saves);
    return finish(&sb, buf_p, len_p);
}

/* ---- decoder ---------------------------------------------------------------- */

typedef struct {
    const uint8_t *p, *end;
} rd_t;

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static bool rd_need(rd_t *r, size_t n) { return (size_t)(r->end - r->p) >= n; }

static bool rd_array(rd_t *r, size_t *n_p)
{
    if (!rd_need(r, 1))
        return false;
    uint8_t b = *r->p++;
    size_t n;
    if (b >= 0x90 && b <= 0x9f) {
        n = b & 0x0f;
    } else if (b == 0xdc) {
        if (!rd_need(r, 2))
            return false;
        n = (size_t)be(r->p, 2);
        r->p += 2;
    } else if (b == 0xdd) {
        if (!rd_need(r, 4))
            return false;
        n = (size_t)be(r->p, 4);
        r->p += 4;
    } else {
        return false;
    }
    /* every element takes at least one byte */
    if (n > MAX_COUNT || n > (size_t)(r->end - r->p))
        return false;
    *n_p = n;
    return true;
}

static bool rd_int(rd_t *r, int64_t *v)
{
    if (!rd_need(r, 1))
        return false;
    uint8_t b = *r->p++;
    if (b <= 0x7f) {
        *v = b;
        return true;
    }
    if (b >= 0xe0) {
        *v = (int8_t)b;
        return true;
    }
    int n;
    bool sgn;
    switch (b) {
    case 0xcc: n = 1; sgn = false; break;
    case 0xcd: n = 2; sgn = false; break;
    case 0xce: n = 4; sgn = false; break;
    case 0xcf: n = 8; sgn = false; break;
    case 0xd0: n = 1; sgn = true; break;
    case 0xd1: n = 2; sgn = true; break;
    case 0xd2: n = 4; sgn = true; break;
    case 0xd3: n = 8; sgn = true; break;
    default: return false;
    }
    if (!rd_need(r, (size_t)n))
        return false;
    uint64_t u = be(r->p, n);
    r->p += n;
    if (!sgn) {
        if (u > (uint64_t)INT64_MAX)
            return false;
        *v = (int64_t)u;
    } else {
        int shift = 64 - 8 * n;
        *v = shift ? (int64_t)(u << shift) >> shift : (int64_t)u;
    }
    return true;
}

static bool rd_bool(rd_t *r, bool *v)
{
    if (!rd_need(r, 1))
        return false;
    uint8_t b = *r->p++;
    if (b != 0xc2 && b != 0xc3)
        return false;
    *v = b == 0xc3;
    return true;
}

static bool rd_str(rd_t *r, char **out)
{
    if (!rd_need(r, 1))
        return false;
    uint8_t b = *r->p++;
    size_t n;
    if (b >= 0xa0 && b <= 0xbf) {
        n = b & 0x1f;
    } else if (b >= 0xd9 && b <= 0xdb) {
        int w = b == 0xd9 ? 1 : b == 0xda ? 2 : 4;
        if (!rd_need(r, (size_t)w))
            return false;
        n = (size_t)be(r->p, w);
        r->p += w;
    } else {
        return false;
    }
    if (n > MAX_STR || !rd_need(r, n) || memchr(r->p, 0, n))
        return false;
    char *s = kvp__malloc(n + 1);
    if (!s)
        return false;
    memcpy(s, r->p, n);
    s[n] = 0;
    r->p += n;
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
    rd_t r = {buf, buf + len};
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
    if (r.p != r.end)
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
    rd_t r = {buf, buf + len};
    if (!rd_header(&r, 8, KIND_WORKER) || !rd_strv(&r, &w->loaded, &w->n_loaded) ||
        !rd_strv(&r, &w->failed_loads, &w->n_failed_loads) || !rd_strv(&r, &w->reclaimed, &w->n_reclaimed) ||
        !rd_bool(&r, &w->pending_loads) || !rd_bool(&r, &w->pending_saves) ||
        !rd_strv(&r, &w->failed_saves, &w->n_failed_saves) || r.p != r.end) {
        kvp_ec_worker_meta_cleanup(w);
        return KVP_ERR_DECODE;
    }
    return KVP_OK;
}
