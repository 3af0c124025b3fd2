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
#include <string.h>

#include "common/alloc.h"
#include "common/mp.h"
#include "kvpool/kv_connector.h"

static void pack_str(kvp__mpw_t *w, const char *s) { kvp__mpw_str_small(w, s, (uint32_t)strlen(s)); }

static void pack_ids(kvp__mpw_t *w, const int64_t *v, size_t n)
{
    kvp__mpw_array(w, (uint32_t)n);
    for (size_t i = 0; i < n; i++)
        kvp__mpw_int_small(w, v[i]);
}

static void pack_reqmeta(kvp__mpw_t *w, const kvp_kv_req_meta_t *m)
{
    kvp__mpw_array(w, 12);
    pack_str(w, m->req_id);
    kvp__mpw_int_small(w, m->token_len_chunk);
    kvp__mpw_array(w, m->block_ids.num_groups);
    for (uint32_t g = 0; g < m->block_ids.num_groups; g++)
        pack_ids(w, m->block_ids.groups[g].ids, m->block_ids.groups[g].n);
    kvp__mpw_uint(w, m->num_block_hashes);
    /* hash_len travels only with hash bytes (a count-only view sends 0) */
    uint32_t hl = (m->block_hashes && m->num_block_hashes) ? m->hash_len : 0;
    kvp__mpw_uint(w, hl);
    size_t hb = m->num_block_hashes * hl;
    kvp__mpw_bin(w, hb ? (const void *)m->block_hashes : "", (uint32_t)hb);
    kvp__mpw_bool(w, m->can_save);
    if (m->is_last_chunk == KVP_KV_TRI_NONE)
        kvp__mpw_nil(w);
    else
        kvp__mpw_bool(w, m->is_last_chunk != 0);
    if (m->has_load_spec) {
        kvp__mpw_array(w, 3);
        kvp__mpw_int_small(w, m->load_spec.vllm_cached_tokens);
        kvp__mpw_int_small(w, m->load_spec.kvpool_cached_tokens);
        kvp__mpw_bool(w, m->load_spec.can_load);
    } else {
        kvp__mpw_nil(w);
    }
    kvp__mpw_int_small(w, m->num_prompt_tokens);
    if (m->has_token_ids)
        pack_ids(w, m->token_ids, m->num_token_ids);
    else
        kvp__mpw_nil(w);
    if (m->num_partial_tail_offloads) {
        kvp__mpw_array(w, (uint32_t)m->num_partial_tail_offloads);
        for (size_t i = 0; i < m->num_partial_tail_offloads; i++) {
            const kvp_kv_tail_offload_t *t = &m->partial_tail_offloads[i];
            kvp__mpw_array(w, 3);
            kvp__mpw_int_small(w, t->group_id);
            kvp__mpw_int_small(w, t->cow_block_id);
            kvp__mpw_int_small(w, t->boundary_tokens);
        }
    } else {
        kvp__mpw_nil(w);
    }
}

kvp_status_t kvp_kv_meta_encode(const kvp_kv_meta_t *meta, uint8_t **buf_p, size_t *len_p)
{
    if (!meta || !buf_p || !len_p)
        return KVP_ERR_NULL_POINTER;
    kvp__mpw_t w;
    kvp__mpw_init(&w, NULL, 0);
    kvp__mpw_array(&w, 4);
    kvp__mpw_uint(&w, KVP_KV_META_VERSION);
    kvp__mpw_array(&w, (uint32_t)meta->num_unfinished);
    for (size_t i = 0; i < meta->num_unfinished; i++)
        pack_str(&w, meta->unfinished_req_ids[i]);
    kvp__mpw_array(&w, (uint32_t)meta->num_preempted);
    for (size_t i = 0; i < meta->num_preempted; i++)
        pack_str(&w, meta->preempted_req_ids[i]);
    kvp__mpw_array(&w, (uint32_t)meta->num_requests);
    for (size_t i = 0; i < meta->num_requests; i++)
        pack_reqmeta(&w, &meta->requests[i]);
    /* exact size, so that kvp_kv_meta_buf_free(buf, len) is exact */
    return kvp__mpw_finish(&w, buf_p, len_p) == 0 ? KVP_OK : KVP_ERR_NO_MEMORY;
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
