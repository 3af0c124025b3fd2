/*
 * Decoder of the connector metadata (format in kv_meta_codec.c).  The bytes
 * come from another process: every length and count is bounded before use.
 *
 * Two passes over the same grammar: the first validates everything and
 * counts what the result needs (every element of every array takes at least
 * one input byte, so each count is bounded by the input length and no size
 * computation can overflow); the second fills one allocation sized exactly.
 * Bad input allocates nothing and returns KVP_ERR_DECODE (KVP_ERR_VERSION for
 * an unknown version) with one log line.
 */
#include <stddef.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/mp.h"
#include "kvpool/kv_connector.h"

/* The common msgpack reader (common/mp.h) and why it stopped, for the log. */
typedef struct {
    kvp__mpr_t mp;
    const char *why;
} rd_t;

/* What the result needs (pass 1) and where it goes (pass 2). */
typedef struct {
    bool fill;
    size_t n_ids;     /* unfinished + preempted pointers */
    size_t n_rm;      /* req metas */
    size_t n_groups;  /* kvp_kv_ids_t */
    size_t n_i64;     /* block ids + token ids */
    size_t n_tails;
    size_t n_bytes;   /* strings (with NUL) + hashes */
    /* pass 2 cursors */
    const char **ids;
    kvp_kv_req_meta_t *rm;
    kvp_kv_ids_t *groups;
    int64_t *i64;
    kvp_kv_tail_offload_t *tails;
    char *bytes;
} bld_t;

#define FAIL(r, msg) \
    do {             \
        (r)->why = (msg); \
        return -1;   \
    } while (0)
#define CHECK(r, msg)                  \
    do {                               \
        if (!kvp__mpr_ok(&(r)->mp))    \
            FAIL((r), (msg));          \
    } while (0)

static int rd_nil(rd_t *r) { return kvp__mpr_nil(&r->mp); }

static int rd_bool(rd_t *r, bool *b)
{
    *b = kvp__mpr_bool(&r->mp);
    CHECK(r, "expected a bool");
    return 0;
}

static int rd_int(rd_t *r, int64_t *v)
{
    *v = kvp__mpr_int(&r->mp);
    CHECK(r, "expected an int64");
    return 0;
}

/* Every element takes at least one byte: the count is bounded by the input. */
static int rd_array(rd_t *r, size_t *n)
{
    *n = kvp__mpr_array_fit(&r->mp, UINT32_MAX);
    CHECK(r, "expected an array that fits the input");
    return 0;
}

static int rd_raw(rd_t *r, bool bin, const uint8_t **s, size_t *n)
{
    uint32_t len;
    *s = bin ? kvp__mpr_bin(&r->mp, UINT32_MAX, &len) : kvp__mpr_str(&r->mp, UINT32_MAX, &len);
    CHECK(r, bin ? "expected bin within the input" : "expected a string within the input");
    *n = len;
    return 0;
}

static int rd_id(rd_t *r, bld_t *b, const char **out)
{
    const uint8_t *s;
    size_t n;
    if (rd_raw(r, false, &s, &n))
        return -1;
    if (n == 0 || n > KVP_KV_META_MAX_ID_LEN || memchr(s, 0, n))
        FAIL(r, "bad request id");
    if (b->fill) {
        memcpy(b->bytes, s, n);
        b->bytes[n] = 0;
        *out = b->bytes;
        b->bytes += n + 1;
    } else {
        b->n_bytes += n + 1;
    }
    return 0;
}

static int rd_i64_list(rd_t *r, bld_t *b, const int64_t **out, size_t *n_p)
{
    size_t n;
    if (rd_array(r, &n))
        return -1;
    int64_t *dst = b->fill ? b->i64 : NULL;
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        if (rd_int(r, &v))
            return -1;
        if (dst)
            dst[i] = v;
    }
    if (b->fill) {
        *out = dst;
        b->i64 += n;
    } else {
        b->n_i64 += n;
    }
    *n_p = n;
    return 0;
}

static int rd_id_list(rd_t *r, bld_t *b, const char *const **out, size_t *n_p)
{
    size_t n;
    if (rd_array(r, &n))
        return -1;
    const char **dst = b->fill ? b->ids : NULL;
    for (size_t i = 0; i < n; i++) {
        const char *s = NULL;
        if (rd_id(r, b, &s))
            return -1;
        if (dst)
            dst[i] = s;
    }
    if (b->fill) {
        *out = dst;
        b->ids += n;
    } else {
        b->n_ids += n;
    }
    *n_p = n;
    return 0;
}

static int rd_reqmeta(rd_t *r, bld_t *b, kvp_kv_req_meta_t *m)
{
    size_t n;
    if (rd_array(r, &n))
        return -1;
    if (n != 12)
        FAIL(r, "reqmeta must have 12 fields");
    kvp_kv_req_meta_t tmp;
    if (!m)
        m = &tmp;
    memset(m, 0, sizeof *m);
    if (rd_id(r, b, &m->req_id) || rd_int(r, &m->token_len_chunk))
        return -1;
    size_t ng;
    if (rd_array(r, &ng))
        return -1;
    if (ng > UINT32_MAX)
        FAIL(r, "too many groups");
    kvp_kv_ids_t *groups = b->fill ? b->groups : NULL;
    if (b->fill)
        b->groups += ng;
    else
        b->n_groups += ng;
    for (size_t g = 0; g < ng; g++) {
        const int64_t *ids = NULL;
        size_t cnt;
        if (rd_i64_list(r, b, &ids, &cnt))
            return -1;
        if (groups)
            groups[g] = (kvp_kv_ids_t){ids, cnt};
    }
    m->block_ids = (kvp_kv_blocks_t){ng ? groups : NULL, (uint32_t)ng};
    int64_t nh, hl;
    if (rd_int(r, &nh) || rd_int(r, &hl))
        return -1;
    if (nh < 0 || hl < 0 || hl > 1024)
        FAIL(r, "bad block hash count or length");
    const uint8_t *hb;
    size_t hbn;
    if (rd_raw(r, true, &hb, &hbn))
        return -1;
    /* the bytes are bounded by the input; the count only when hashes are sent */
    if (hl > 0 && (uint64_t)nh > hbn / (uint64_t)hl)
        FAIL(r, "hash bytes do not match the count");
    if (hl > 0 ? hbn != (size_t)nh * (size_t)hl : hbn != 0)
        FAIL(r, "hash bytes do not match the count");
    if ((uint64_t)nh > KVP_KV_META_MAX_BYTES)
        FAIL(r, "too many block hashes");
    m->num_block_hashes = (size_t)nh;
    m->hash_len = (uint32_t)hl;
    if (b->fill) {
        if (hbn) {
            memcpy(b->bytes, hb, hbn);
            m->block_hashes = (const uint8_t *)b->bytes;
            b->bytes += hbn;
        }
    } else {
        b->n_bytes += hbn;
    }
    if (rd_bool(r, &m->can_save))
        return -1;
    if (rd_nil(r)) {
        m->is_last_chunk = KVP_KV_TRI_NONE;
    } else {
        bool v;
        if (rd_bool(r, &v))
            return -1;
        m->is_last_chunk = v;
    }
    if (!rd_nil(r)) {
        size_t k;
        if (rd_array(r, &k))
            return -1;
        if (k != 3)
            FAIL(r, "load_spec must have 3 fields");
        m->has_load_spec = true;
        if (rd_int(r, &m->load_spec.vllm_cached_tokens) ||
            rd_int(r, &m->load_spec.kvpool_cached_tokens) || rd_bool(r, &m->load_spec.can_load))
            return -1;
    }
    if (rd_int(r, &m->num_prompt_tokens))
        return -1;
    if (!rd_nil(r)) {
        if (rd_i64_list(r, b, &m->token_ids, &m->num_token_ids))
            return -1;
        m->has_token_ids = true;
    }
    if (!rd_nil(r)) {
        size_t nt;
        if (rd_array(r, &nt))
            return -1;
        kvp_kv_tail_offload_t *t = b->fill ? b->tails : NULL;
        if (b->fill)
            b->tails += nt;
        else
            b->n_tails += nt;
        for (size_t i = 0; i < nt; i++) {
            size_t k;
            int64_t v[3];
            if (rd_array(r, &k))
                return -1;
            if (k != 3)
                FAIL(r, "a partial-tail offload has 3 fields");
            if (rd_int(r, &v[0]) || rd_int(r, &v[1]) || rd_int(r, &v[2]))
                return -1;
            if (t)
                t[i] = (kvp_kv_tail_offload_t){v[0], v[1], v[2]};
        }
        m->partial_tail_offloads = nt ? t : NULL;
        m->num_partial_tail_offloads = nt;
    }
    return 0;
}

static int rd_meta(rd_t *r, bld_t *b, kvp_kv_meta_t *meta, kvp_status_t *st)
{
    size_t n;
    if (rd_array(r, &n))
        return -1;
    if (n != 4)
        FAIL(r, "meta must have 4 fields");
    int64_t ver;
    if (rd_int(r, &ver))
        return -1;
    if (ver != KVP_KV_META_VERSION) {
        *st = KVP_ERR_VERSION;
        FAIL(r, "unsupported version");
    }
    if (rd_id_list(r, b, &meta->unfinished_req_ids, &meta->num_unfinished) ||
        rd_id_list(r, b, &meta->preempted_req_ids, &meta->num_preempted))
        return -1;
    size_t nr;
    if (rd_array(r, &nr))
        return -1;
    kvp_kv_req_meta_t *rm = b->fill ? b->rm : NULL;
    if (b->fill)
        b->rm += nr;
    else
        b->n_rm += nr;
    for (size_t i = 0; i < nr; i++)
        if (rd_reqmeta(r, b, rm ? &rm[i] : NULL))
            return -1;
    meta->requests = rm;
    meta->num_requests = nr;
    if (!kvp__mpr_done(&r->mp))
        FAIL(r, "trailing bytes");
    return 0;
}

/* One allocation: header, meta, pointer arrays, structs, int64s, bytes. */
typedef struct {
    size_t total;
    kvp_kv_meta_t meta;
} meta_box_t;

#define ALIGN8(x) (((x) + 7) & ~(size_t)7)

kvp_status_t kvp_kv_meta_decode(const uint8_t *buf, size_t len, kvp_kv_meta_t **meta_p)
{
    if (!meta_p || (!buf && len))
        return KVP_ERR_NULL_POINTER;
    *meta_p = NULL;
    if (len == 0 || len > KVP_KV_META_MAX_BYTES) {
        kvp_warn("kv meta: %zu bytes: empty or over the limit", len);
        return KVP_ERR_DECODE;
    }
    bld_t b;
    memset(&b, 0, sizeof b);
    kvp_kv_meta_t scratch;
    memset(&scratch, 0, sizeof scratch);
    kvp_status_t st = KVP_ERR_DECODE;
    rd_t r = {.why = NULL};
    kvp__mpr_init(&r.mp, buf, len);
    if (rd_meta(&r, &b, &scratch, &st)) {
        kvp_warn("kv meta: undecodable metadata (%s at byte %zu)", r.why,
                 (size_t)(r.mp.p - buf));
        return st;
    }
    size_t off_ids = ALIGN8(sizeof(meta_box_t));
    size_t off_rm = ALIGN8(off_ids + b.n_ids * sizeof(char *));
    size_t off_groups = ALIGN8(off_rm + b.n_rm * sizeof(kvp_kv_req_meta_t));
    size_t off_i64 = ALIGN8(off_groups + b.n_groups * sizeof(kvp_kv_ids_t));
    size_t off_tails = ALIGN8(off_i64 + b.n_i64 * sizeof(int64_t));
    size_t off_bytes = ALIGN8(off_tails + b.n_tails * sizeof(kvp_kv_tail_offload_t));
    size_t total = off_bytes + b.n_bytes;
    char *base = kvp__calloc(1, total);
    if (!base)
        return KVP_ERR_NO_MEMORY;
    meta_box_t *box = (meta_box_t *)base;
    box->total = total;
    bld_t f;
    memset(&f, 0, sizeof f);
    f.fill = true;
    f.ids = (const char **)(base + off_ids);
    f.rm = (kvp_kv_req_meta_t *)(base + off_rm);
    f.groups = (kvp_kv_ids_t *)(base + off_groups);
    f.i64 = (int64_t *)(base + off_i64);
    f.tails = (kvp_kv_tail_offload_t *)(base + off_tails);
    f.bytes = base + off_bytes;
    kvp__mpr_init(&r.mp, buf, len);
    if (rd_meta(&r, &f, &box->meta, &st)) { /* cannot happen: pass 1 accepted it */
        kvp__free(base, total);
        kvp_error("kv meta: decoder passes disagree (%s)", r.why);
        return KVP_ERR_INTERNAL;
    }
    *meta_p = &box->meta;
    return KVP_OK;
}

void kvp_kv_meta_free(kvp_kv_meta_t *meta)
{
    if (!meta)
        return;
    meta_box_t *box = (meta_box_t *)((char *)meta - offsetof(meta_box_t, meta));
    kvp__free(box, box->total);
}
