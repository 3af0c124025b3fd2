/*
 * Connector metadata wire format (scheduler process -> every worker), msgpack:
 *
 *   meta    = [ version (1), unfinished [str...], preempted [str...], requests [reqmeta...] ]
 *   reqmeta = [ req_id str, token_len_chunk int, block_ids [[int...]...],
 *               num_block_hashes uint, hash_len uint, hashes bin (num*hash_len bytes),
 *               can_save bool, is_last_chunk nil|bool,
 *               load_spec nil | [vllm_cached int, kvpool_cached int, can_load bool],
 *               num_prompt_tokens int, token_ids nil | [int...],
 *               partial_tail_offloads nil | [[group int, cow_block int, boundary int]...] ]
 *
 * Arrays of fixed shape, not maps: the receiver checks the arity, and new
 * fields can only be appended (a decoder accepts longer reqmeta arrays from a
 * newer sender only if the version says so).  The decoder is in
 * kv_meta_decode.c.
 */
#include <msgpack.h>
#include <string.h>

#include "common/alloc.h"
#include "kvpool/kv_connector.h"

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} wbuf_t;

static int wbuf_write(void *data, const char *buf, size_t len)
{
    wbuf_t *w = data;
    if (w->oom)
        return -1;
    if (w->n + len > w->cap) {
        size_t nc = w->cap ? w->cap : 1024;
        while (nc < w->n + len)
            nc *= 2;
        uint8_t *np = kvp__realloc(w->p, w->cap, nc);
        if (!np) {
            w->oom = 1;
            return -1;
        }
        w->p = np;
        w->cap = nc;
    }
    memcpy(w->p + w->n, buf, len);
    w->n += len;
    return 0;
}

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_ids(msgpack_packer *pk, const int64_t *v, size_t n)
{
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_int64(pk, v[i]);
}

static void pack_reqmeta(msgpack_packer *pk, const kvp_kv_req_meta_t *m)
{
    msgpack_pack_array(pk, 12);
    pack_str(pk, m->req_id);
    msgpack_pack_int64(pk, m->token_len_chunk);
    msgpack_pack_array(pk, m->block_ids.num_groups);
    for (uint32_t g = 0; g < m->block_ids.num_groups; g++)
        pack_ids(pk, m->block_ids.groups[g].ids, m->block_ids.groups[g].n);
    msgpack_pack_uint64(pk, m->num_block_hashes);
    /* hash_len travels only with hash bytes (a count-only view sends 0) */
    uint32_t hl = (m->block_hashes && m->num_block_hashes) ? m->hash_len : 0;
    msgpack_pack_uint32(pk, hl);
    size_t hb = m->num_block_hashes * hl;
    msgpack_pack_bin(pk, hb);
    if (hb)
        msgpack_pack_bin_body(pk, m->block_hashes, hb);
    if (m->can_save)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    if (m->is_last_chunk == KVP_KV_TRI_NONE)
        msgpack_pack_nil(pk);
    else if (m->is_last_chunk)
        msgpack_pack_true(pk);
    else
        msgpack_pack_false(pk);
    if (m->has_load_spec) {
        msgpack_pack_array(pk, 3);
        msgpack_pack_int64(pk, m->load_spec.vllm_cached_tokens);
        msgpack_pack_int64(pk, m->load_spec.kvpool_cached_tokens);
        if (m->load_spec.can_load)
            msgpack_pack_true(pk);
        else
            msgpack_pack_false(pk);
    } else {
        msgpack_pack_nil(pk);
    }
    msgpack_pack_int64(pk, m->num_prompt_tokens);
    if (m->has_token_ids)
        pack_ids(pk, m->token_ids, m->num_token_ids);
    else
        msgpack_pack_nil(pk);
    if (m->num_partial_tail_offloads) {
        msgpack_pack_array(pk, m->num_partial_tail_offloads);
        for (size_t i = 0; i < m->num_partial_tail_offloads; i++) {
            const kvp_kv_tail_offload_t *t = &m->partial_tail_offloads[i];
            msgpack_pack_array(pk, 3);
            msgpack_pack_int64(pk, t->group_id);
            msgpack_pack_int64(pk, t->cow_block_id);
            msgpack_pack_int64(pk, t->boundary_tokens);
        }
    } else {
        msgpack_pack_nil(pk);
    }
}

kvp_status_t kvp_kv_meta_encode(const kvp_kv_meta_t *meta, uint8_t **buf_p, size_t *len_p)
{
    if (!meta || !buf_p || !len_p)
        return KVP_ERR_NULL_POINTER;
    wbuf_t w = {0};
    msgpack_packer pk;
    msgpack_packer_init(&pk, &w, wbuf_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_uint32(&pk, KVP_KV_META_VERSION);
    msgpack_pack_array(&pk, meta->num_unfinished);
    for (size_t i = 0; i < meta->num_unfinished; i++)
        pack_str(&pk, meta->unfinished_req_ids[i]);
    msgpack_pack_array(&pk, meta->num_preempted);
    for (size_t i = 0; i < meta->num_preempted; i++)
        pack_str(&pk, meta->preempted_req_ids[i]);
    msgpack_pack_array(&pk, meta->num_requests);
    for (size_t i = 0; i < meta->num_requests; i++)
        pack_reqmeta(&pk, &meta->requests[i]);
    if (w.oom) {
        if (w.p)
            kvp__free(w.p, w.cap);
        return KVP_ERR_NO_MEMORY;
    }
    /* shrink to the exact size so that kvp_kv_meta_buf_free(buf, len) is exact */
    uint8_t *out = kvp__malloc(w.n ? w.n : 1);
    if (!out) {
        kvp__free(w.p, w.cap);
        return KVP_ERR_NO_MEMORY;
    }
    memcpy(out, w.p, w.n);
    kvp__free(w.p, w.cap);
    *buf_p = out;
    *len_p = w.n;
    return KVP_OK;
}

void kvp_kv_meta_buf_free(uint8_t *buf, size_t len)
{
    if (buf)
        kvp__free(buf, len ? len : 1);
}

/* ---- equality (tests) ---------------------------------------------------- */

static bool id_in(const char *const *ids, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(ids[i], id) == 0)
            return true;
    return false;
}

static bool set_eq(const char *const *a, size_t na, const char *const *b, size_t nb)
{
    if (na != nb)
        return false;
    for (size_t i = 0; i < na; i++)
        if (!id_in(b, nb, a[i]))
            return false;
    return true;
}

static bool reqmeta_eq(const kvp_kv_req_meta_t *a, const kvp_kv_req_meta_t *b)
{
    if (strcmp(a->req_id, b->req_id) != 0 || a->token_len_chunk != b->token_len_chunk ||
        a->block_ids.num_groups != b->block_ids.num_groups ||
        a->num_block_hashes != b->num_block_hashes ||
        (a->num_block_hashes && a->hash_len != b->hash_len) ||
        a->can_save != b->can_save || a->is_last_chunk != b->is_last_chunk ||
        a->has_load_spec != b->has_load_spec || a->num_prompt_tokens != b->num_prompt_tokens ||
        a->has_token_ids != b->has_token_ids || a->num_token_ids != b->num_token_ids ||
        a->num_partial_tail_offloads != b->num_partial_tail_offloads)
        return false;
    for (uint32_t g = 0; g < a->block_ids.num_groups; g++) {
        const kvp_kv_ids_t *x = &a->block_ids.groups[g], *y = &b->block_ids.groups[g];
        if (x->n != y->n || (x->n && memcmp(x->ids, y->ids, x->n * sizeof(int64_t)) != 0))
            return false;
    }
    size_t hb = a->num_block_hashes * a->hash_len;
    if (hb && a->block_hashes && b->block_hashes && memcmp(a->block_hashes, b->block_hashes, hb) != 0)
        return false;
    if (a->has_load_spec &&
        (a->load_spec.vllm_cached_tokens != b->load_spec.vllm_cached_tokens ||
         a->load_spec.kvpool_cached_tokens != b->load_spec.kvpool_cached_tokens ||
         a->load_spec.can_load != b->load_spec.can_load))
        return false;
    if (a->num_token_ids &&
        memcmp(a->token_ids, b->token_ids, a->num_token_ids * sizeof(int64_t)) != 0)
        return false;
    for (size_t i = 0; i < a->num_partial_tail_offloads; i++) {
        const kvp_kv_tail_offload_t *x = &a->partial_tail_offloads[i], *y = &b->partial_tail_offloads[i];
        if (x->group_id != y->group_id || x->cow_block_id != y->cow_block_id ||
            x->boundary_tokens != y->boundary_tokens)
            return false;
    }
    return true;
}

bool kvp_kv_meta_equal(const kvp_kv_meta_t *a, const kvp_kv_meta_t *b)
{
    if (!a || !b)
        return a == b;
    if (!set_eq(a->unfinished_req_ids, a->num_unfinished, b->unfinished_req_ids, b->num_unfinished) ||
        !set_eq(a->preempted_req_ids, a->num_preempted, b->preempted_req_ids, b->num_preempted) ||
        a->num_requests != b->num_requests)
        return false;
    for (size_t i = 0; i < a->num_requests; i++)
        if (!reqmeta_eq(&a->requests[i], &b->requests[i]))
            return false;
    return true;
}
