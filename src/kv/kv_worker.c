/*
 * The worker (kv_connector.h, "Worker side"): creation, get_finished
 * (W1-W3, W5), the load-error report, drain and teardown.
 * register_kv_caches (W8) is kv_worker_register.c, the save thread
 * kv_worker_save.c, the load threads kv_worker_load.c; kv_worker_int.h has
 * the layout and the lock order.
 *
 * get_finished, step by step (MooncakeStoreWorker.get_finished):
 *   1. loads (W2): every meta whose load spec can load gets token_len =
 *      kvpool_cached_tokens and goes on the shared load queue;
 *   2. saves (W3), unless the role is consumer: every can_save meta bumps
 *      stored_requests[req] and goes on the single save queue.  (The
 *      original records one CUDA event for the step here; host memory
 *      needs none, and a staged copy seam synchronises in to_host.)
 *      The queue is bounded: a meta whose block bytes would take the
 *      queued bytes past max_save_bytes is not queued at all and counted
 *      in saves_dropped, and its stored_requests count is NOT bumped (the
 *      entry is created at 0 if new, as the defaultdict would), so it
 *      cannot delay the request's done_sending: the scheduler delays the
 *      free of every request with a save (K17), and its finish is
 *      reported at once.  A slow pool costs saves, never an engine's
 *      blocks held without end.  The tokens are not lost for good: the
 *      request's high-water mark did not move, so its next queued save
 *      covers them;
 *   3. done_sending (W5), in exactly the original's order: preempted ids
 *      delete their stored-request entry; then every id remembered in
 *      finished_store_req whose count is 0 is done; then each of this
 *      step's finished ids: count 0 is done now, count > 0 is remembered,
 *      never stored is never reported (K16);
 *   4. done_recving: what the load threads finished since the last call.
 *
 * Bad metas.  A meta naming a block id outside [0, num_blocks) (or a group
 * count other than the worker's) fails alone, with one log line: a load
 * meta's block ids all become load errors and the request is still
 * reported in done_recving; a save meta is not queued.
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/sized.h"
#include "kv/kv_keys.h"
#include "kv/kv_worker_int.h"

void kvp_kv_worker_params_init(kvp_kv_worker_params_t *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->size = (uint32_t)sizeof *params;
    params->role = KVP_KV_ROLE_BOTH;
    params->tp_size = params->pp_size = params->pcp_size = params->dcp_size = 1;
    params->num_kv_heads = 1;
    params->group_kind = KVP_KV_GROUP_FULL_ATTENTION;
    params->block_size = 16;
    params->hash_block_size = 16;
    params->num_load_threads = 2;
    params->max_save_bytes = 1ull << 30;
}

/* ---- keys and pool calls ------------------------------------------------- */

/* Group g's key stem: this rank's namespace (T = tp_rank / factor). */
static kvp_status_t make_stem(kvp_kv_worker_t *w, uint32_t g)
{
    kvp_kv_store_key_t k;
    kvp__kv_names_key(&w->names, &k);
    k.tp_rank = w->p.tp_rank / w->factor[g];
    k.pcp_rank = w->p.pcp_size > 1 ? w->p.pcp_rank : 0;
    k.dcp_rank = w->p.dcp_size > 1 ? w->p.dcp_rank : 0;
    k.pp_rank = w->p.pp_rank;
    k.group_id = g;
    size_t len;
    kvp_status_t st = kvp__kv_key_stem(&k, w->stem[g], sizeof w->stem[g], &len);
    w->stem_len[g] = (uint16_t)len;
    return st;
}

kvp_status_t kvp__kvw_key(const kvp_kv_worker_t *w, uint32_t g, const uint8_t *hash,
                          uint32_t hash_len, char *buf, size_t *len_p)
{
    if (hash_len == 0 || hash_len > KVP_HASH_MAX_LEN)
        return KVP_ERR_INVALID_ARG;
    size_t n = w->stem_len[g];
    memcpy(buf, w->stem[g], n);
    n += kvp__kv_key_hex(hash, hash_len, buf + n);
    buf[n] = '\0';
    *len_p = n;
    return KVP_OK;
}

kvp_status_t kvp__kvw_keys_add(kvp__kvw_keys_t *k, const kvp_kv_worker_t *w, uint32_t g,
                               const uint8_t *hash, uint32_t hash_len)
{
    if (kvp__grow_in((void **)&k->ends, &k->ends_cap, k->n + 1, sizeof *k->ends, 64) ||
        kvp__grow_in((void **)&k->keys, &k->cap, k->n + 1, sizeof *k->keys, 64) ||
        kvp__grow_in((void **)&k->text, &k->text_cap, k->text_len + KVP_KV_STORE_KEY_MAX + 1, 1,
                     4096))
        return KVP_ERR_NO_MEMORY;
    size_t len;
    kvp_status_t st = kvp__kvw_key(w, g, hash, hash_len, k->text + k->text_len, &len);
    if (st != KVP_OK)
        return st;
    k->text_len += len;
    k->ends[k->n++] = k->text_len;
    return KVP_OK;
}

void kvp__kvw_keys_seal(kvp__kvw_keys_t *k)
{
    size_t start = 0;
    for (size_t i = 0; i < k->n; i++) {
        k->keys[i].data = k->text + start;
        k->keys[i].len = (uint32_t)(k->ends[i] - start);
        start = k->ends[i];
    }
}

void kvp__kvw_keys_free(kvp__kvw_keys_t *k)
{
    kvp__free(k->text, k->text_cap);
    kvp__free(k->ends, k->ends_cap * sizeof *k->ends);
    kvp__free(k->keys, k->cap * sizeof *k->keys);
    memset(k, 0, sizeof *k);
}

kvp_status_t kvp__kvw_call(kvp_kv_worker_t *w, kvp_op_type_t type, const kvp_key_t *keys,
                           size_t n, const kvp_sgl_t *values, kvp_key_result_t *results,
                           uint8_t *present)
{
    /* One op, run to completion with the worker's timeout (kvp_pool_run
     * drives the transport as the blocking wrappers do). */
    kvp_op_t op = {.type = type, .keys = keys, .n = n, .values = values, .results = results,
                   .present = present, .timeout_ms = w->p.timeout_ms};
    uint64_t t0 = kvp__now_ns();
    kvp_status_t st = kvp_pool_run(w->p.pool, &op);
    if (type == KVP_OP_PUT || type == KVP_OP_GET)
        atomic_fetch_add(type == KVP_OP_PUT ? &w->c.save_ns : &w->c.load_ns, kvp__now_ns() - t0);
    if (st != KVP_OK)
        atomic_fetch_add(&w->c.pool_calls_failed, 1);
    return st;
}

/* ---- create / destroy ---------------------------------------------------- */

static kvp_status_t check_params(const kvp_kv_worker_params_t *p)
{
    if (!p->pool || !p->model_name) {
        kvp_error("kv worker: %s is NULL", p->pool ? "model_name" : "pool");
        return KVP_ERR_BAD_CONFIG;
    }
    if ((unsigned)p->role > KVP_KV_ROLE_BOTH || (unsigned)p->group_kind > KVP_KV_GROUP_MLA) {
        kvp_error("kv worker: role %d / group kind %d unknown", (int)p->role, (int)p->group_kind);
        return KVP_ERR_BAD_CONFIG;
    }
    if (p->tp_size < 1 || p->pp_size < 1 || p->pcp_size < 1 || p->dcp_size < 1 ||
        p->tp_rank >= p->tp_size || p->pp_rank >= p->pp_size || p->pcp_rank >= p->pcp_size ||
        p->dcp_rank >= p->dcp_size || p->tp_size % p->dcp_size || p->block_size < 1 ||
        p->hash_block_size < 1 || p->block_size % p->hash_block_size ||
        (p->groups && (p->num_groups < 1 || p->num_groups > KVP_KV_MAX_GROUPS))) {
        kvp_error("kv worker: tp %u/%u pp %u/%u pcp %u/%u dcp %u/%u block %lld hash block %lld "
                  "groups %u", p->tp_rank, p->tp_size, p->pp_rank, p->pp_size, p->pcp_rank,
                  p->pcp_size, p->dcp_rank, p->dcp_size, (long long)p->block_size,
                  (long long)p->hash_block_size, p->num_groups);
        return KVP_ERR_BAD_CONFIG;
    }
    const kvp_kv_copy_ops_t *c = p->copy;
    if (c && !c->direct && (!c->to_host || !c->from_host)) {
        kvp_error("kv worker: a staged copy seam needs to_host and from_host");
        return KVP_ERR_BAD_CONFIG;
    }
    return KVP_OK;
}

kvp_status_t kvp_kv_worker_create(const kvp_kv_worker_params_t *params, kvp_kv_worker_t **worker_p)
{
    if (!params || !worker_p)
        return KVP_ERR_NULL_POINTER;
    *worker_p = NULL;
    kvp_kv_worker_params_t p;
    kvp_kv_worker_params_init(&p);
    kvp_status_t st = kvp__sized_adopt(&p, sizeof p, params);
    if (st != KVP_OK) {
        kvp_error("kv worker: params.size %u (this library's struct has %zu bytes; call "
                  "kvp_kv_worker_params_init)", params->size, sizeof p);
        return st;
    }
    st = check_params(&p);
    if (st != KVP_OK)
        return st;
    kvp_kv_worker_t *w = kvp__calloc(1, sizeof *w);
    if (!w)
        return KVP_ERR_NO_MEMORY;
    w->p = p;
    w->copy = p.copy ? *p.copy : *kvp_kv_copy_host();
    if (p.groups) {
        w->ngroups = p.num_groups;
        memcpy(w->g, p.groups, p.num_groups * sizeof *p.groups);
    } else {
        w->ngroups = 1;
        w->g[0].kind = p.group_kind;
        w->g[0].block_size = p.block_size;
    }
    w->p.groups = w->g;
    w->p.num_groups = w->ngroups;
    st = kvp__kv_names_init(&w->names, p.model_name, p.cache_prefix);
    if (st != KVP_OK) {
        kvp_kv_worker_destroy(w);
        return st;
    }
    w->p.model_name = w->names.model;
    w->p.cache_prefix = w->names.prefix;
    for (uint32_t g = 0; g < w->ngroups; g++) {
        if (kvp_kv_store_key_replication_factor(w->g[g].kind, p.tp_size, p.num_kv_heads,
                                                p.dcp_size, &w->factor[g]) != KVP_OK) {
            kvp_kv_worker_destroy(w);
            return KVP_ERR_BAD_CONFIG;
        }
    }
    /* The stems carry the key format's checks (model name, prefix), once. */
    for (uint32_t g = 0; g < w->ngroups && st == KVP_OK; g++)
        st = make_stem(w, g);
    if (st == KVP_OK)
        st = kvp__kv_coord_create(w->g, w->ngroups, p.block_size, p.hash_block_size, p.use_eagle,
                                  &w->coord);
    if (st != KVP_OK) {
        kvp_error("kv worker: configuration refused: %s", kvp_status_str(st));
        kvp_kv_worker_destroy(w);
        return st == KVP_ERR_NO_MEMORY ? st : KVP_ERR_BAD_CONFIG;
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->save_cv, NULL);
    pthread_cond_init(&w->load_cv, NULL);
    pthread_cond_init(&w->idle_cv, NULL);
    kvp__strmap_init(&w->stored);
    kvp__strmap_init(&w->finished_store_req);
    kvp__strmap_init(&w->sync_loaded);
    *worker_p = w;
    return KVP_OK;
}

void kvp__kvw_job_free(kvp__kvw_job_t *j)
{
    if (j)
        kvp__free(j, j->alloc_size);
}

static void queue_free(kvp__kvw_queue_t *q)
{
    while (q->head) {
        kvp__kvw_job_t *j = q->head;
        q->head = j->next;
        kvp__kvw_job_free(j);
    }
    q->tail = NULL;
    q->n = 0;
}

static void strs_clear(kvp__kvw_strs_t *s)
{
    for (size_t i = 0; i < s->n; i++)
        kvp__strfree(s->v[i]);
    s->n = 0;
}

static void strs_free(kvp__kvw_strs_t *s)
{
    strs_clear(s);
    kvp__free(s->v, s->cap * sizeof *s->v);
    memset(s, 0, sizeof *s);
}

static kvp_status_t strs_add(kvp__kvw_strs_t *s, const char *str)
{
    if (kvp__grow_in((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v, 16))
        return KVP_ERR_NO_MEMORY;
    char *c = kvp__strdup(str);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    s->v[s->n++] = c;
    return KVP_OK;
}

static void stored_free(kvp__kvw_stored_t *e)
{
    kvp__strfree(e->req_id);
    kvp__free(e, sizeof *e);
}

void kvp_kv_worker_destroy(kvp_kv_worker_t *w)
{
    if (!w)
        return;
    if (w->coord) { /* fully created: the locks and maps exist */
        pthread_mutex_lock(&w->mu);
        w->stopping = true;
        pthread_cond_broadcast(&w->save_cv);
        pthread_cond_broadcast(&w->load_cv);
        pthread_mutex_unlock(&w->mu);
        if (w->has_save_thread)
            pthread_join(w->save_thr, NULL);
        for (uint32_t i = 0; i < w->nload_thr; i++)
            pthread_join(w->load_thr[i], NULL);
        queue_free(&w->save_q);
        queue_free(&w->load_q);
        for (size_t i = 0; i < w->stored.cap; i++)
            if (w->stored.slots[i].key)
                stored_free(w->stored.slots[i].val);
        kvp__strmap_cleanup(&w->stored);
        kvp__strset_cleanup(&w->finished_store_req);
        kvp__strset_cleanup(&w->sync_loaded);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->save_cv);
        pthread_cond_destroy(&w->load_cv);
        pthread_cond_destroy(&w->idle_cv);
        kvp__kv_coord_destroy(w->coord);
    }
    for (size_t i = 0; i < w->nbases; i++)
        kvp_pool_deregister(w->p.pool, w->bases[i]);
    kvp__free(w->load_thr, w->nload_thr * sizeof *w->load_thr);
    kvp__free(w->bases, w->nbases * sizeof *w->bases);
    kvp__free(w->segs, w->nsegs * sizeof *w->segs);
    strs_free(&w->recv_done);
    strs_free(&w->out_send);
    strs_free(&w->out_recv);
    kvp__free(w->errs, w->errs_cap * sizeof *w->errs);
    kvp__free(w->out_errs, w->out_errs_cap * sizeof *w->out_errs);
    kvp__kv_names_free(&w->names);
    kvp__free(w, sizeof *w);
}

/* ---- get_finished (W1-W3, W5) --------------------------------------------- */

/* Whether every block id of m is a registered block, and its group count
 * is the worker's (an empty tuple is allowed: nothing to move). */
static bool meta_ok(const kvp_kv_worker_t *w, const kvp_kv_req_meta_t *m)
{
    if (!m->req_id)
        return false;
    if (m->block_ids.num_groups && m->block_ids.num_groups != w->ngroups) {
        kvp_warn("kv worker: %s: %u block-id groups, the worker has %u", m->req_id,
                 m->block_ids.num_groups, w->ngroups);
        return false;
    }
    if (m->block_ids.num_groups && !m->block_ids.groups) {
        kvp_warn("kv worker: %s: %u block-id groups at NULL", m->req_id, m->block_ids.num_groups);
        return false;
    }
    for (uint32_t g = 0; g < m->block_ids.num_groups; g++) {
        if (m->block_ids.groups[g].n && !m->block_ids.groups[g].ids) {
            kvp_warn("kv worker: %s: group %u has %zu block ids at NULL", m->req_id, g,
                     m->block_ids.groups[g].n);
            return false;
        }
        for (size_t i = 0; i < m->block_ids.groups[g].n; i++) {
            int64_t b = m->block_ids.groups[g].ids[i];
            if (b < 0 || (uint64_t)b >= w->num_blocks) {
                kvp_warn("kv worker: %s: block id %lld outside 0..%llu", m->req_id, (long long)b,
                         (unsigned long long)w->num_blocks - 1);
                return false;
            }
        }
    }
    if (m->num_partial_tail_offloads && !m->partial_tail_offloads)
        return false;
    for (size_t i = 0; i < m->num_partial_tail_offloads; i++) {
        int64_t b = m->partial_tail_offloads[i].cow_block_id;
        if (b < 0 || (uint64_t)b >= w->num_blocks) {
            kvp_warn("kv worker: %s: partial-tail block id %lld outside 0..%llu", m->req_id,
                     (long long)b, (unsigned long long)w->num_blocks - 1);
            return false;
        }
    }
    if (m->num_block_hashes && (!m->block_hashes || !m->hash_len || m->hash_len > KVP_HASH_MAX_LEN)) {
        kvp_warn("kv worker: %s: %zu hashes of %u bytes", m->req_id, m->num_block_hashes,
                 m->hash_len);
        return false;
    }
    return true;
}

/* The deep copy of m (see kv_worker_int.h, "Jobs"). */
static kvp__kvw_job_t *job_copy(const kvp_kv_req_meta_t *m)
{
    uint32_t ng = m->block_ids.num_groups;
    size_t idlen = strlen(m->req_id) + 1, nids = 0;
    for (uint32_t g = 0; g < ng; g++)
        nids += m->block_ids.groups[g].n;
    size_t hbytes = m->num_block_hashes * m->hash_len;
    size_t sz = sizeof(kvp__kvw_job_t) + ng * (sizeof(int64_t *) + sizeof(size_t)) +
                nids * sizeof(int64_t) + m->num_partial_tail_offloads * sizeof(kvp_kv_tail_offload_t) +
                hbytes + idlen;
    kvp__kvw_job_t *j = kvp__calloc(1, sz);
    if (!j)
        return NULL;
    j->alloc_size = sz;
    uint8_t *p = (uint8_t *)(j + 1);
    const int64_t **idp = (const int64_t **)p;
    p += ng * sizeof(int64_t *);
    size_t *np = (size_t *)p;
    p += ng * sizeof(size_t);
    int64_t *ids = (int64_t *)p;
    p += nids * sizeof(int64_t);
    for (uint32_t g = 0; g < ng; g++) {
        size_t n = m->block_ids.groups[g].n;
        if (n)
            memcpy(ids, m->block_ids.groups[g].ids, n * sizeof *ids);
        idp[g] = ids, np[g] = n;
        ids += n;
    }
    kvp_kv_tail_offload_t *tails = (kvp_kv_tail_offload_t *)p;
    p += m->num_partial_tail_offloads * sizeof *tails;
    if (m->num_partial_tail_offloads)
        memcpy(tails, m->partial_tail_offloads, m->num_partial_tail_offloads * sizeof *tails);
    if (hbytes)
        memcpy(p, m->block_hashes, hbytes);
    j->hashes = p;
    p += hbytes;
    memcpy(p, m->req_id, idlen);
    j->req_id = (char *)p;
    j->ids = idp, j->nids = np, j->num_groups = ng;
    j->token_len_chunk = m->token_len_chunk;
    j->num_hashes = m->num_block_hashes;
    j->hash_len = m->hash_len;
    j->load_spec = m->load_spec;
    j->num_prompt_tokens = m->num_prompt_tokens;
    j->tails = m->num_partial_tail_offloads ? tails : NULL;
    j->num_tails = m->num_partial_tail_offloads;
    return j;
}

static void enqueue(kvp__kvw_queue_t *q, kvp__kvw_job_t *j)
{
    j->next = NULL;
    if (q->tail)
        q->tail->next = j;
    else
        q->head = j;
    q->tail = j;
    q->n++;
}

kvp__kvw_job_t *kvp__kvw_pop(kvp__kvw_queue_t *q)
{
    kvp__kvw_job_t *j = q->head;
    q->head = j->next;
    if (!q->head)
        q->tail = NULL;
    q->n--;
    return j;
}

/* Adds ids to the load-error list (w->mu held). */
static void add_errors_locked(kvp_kv_worker_t *w, const int64_t *ids, size_t n)
{
    if (!n)
        return;
    if (kvp__grow_in((void **)&w->errs, &w->errs_cap, w->nerrs + n, sizeof *w->errs, 64)) {
        kvp_error("kv worker: out of memory recording %zu load errors", n);
        return;
    }
    memcpy(w->errs + w->nerrs, ids, n * sizeof *ids);
    w->nerrs += n;
    atomic_fetch_add(&w->c.load_errors, n);
}

void kvp__kvw_load_report(kvp_kv_worker_t *w, const char *req_id, const int64_t *ids, size_t n)
{
    pthread_mutex_lock(&w->mu);
    add_errors_locked(w, ids, n);
    if (req_id && strs_add(&w->recv_done, req_id) != KVP_OK)
        kvp_error("kv worker: out of memory reporting %s as loaded", req_id);
    pthread_mutex_unlock(&w->mu);
}

/* A load meta that cannot be queued: every block id it names is an error,
 * and (unless it was a synchronous load) it is done. */
static void load_meta_fails(kvp_kv_worker_t *w, const kvp_kv_req_meta_t *m, bool report)
{
    pthread_mutex_lock(&w->mu);
    for (uint32_t g = 0; m->block_ids.groups && g < m->block_ids.num_groups; g++)
        if (m->block_ids.groups[g].ids) /* (meta_ok refused NULL lists: nothing to name) */
            add_errors_locked(w, m->block_ids.groups[g].ids, m->block_ids.groups[g].n);
    if (report && m->req_id && strs_add(&w->recv_done, m->req_id) != KVP_OK)
        kvp_error("kv worker: out of memory reporting %s as loaded", m->req_id);
    pthread_mutex_unlock(&w->mu);
    atomic_fetch_add(&w->c.bad_metas, 1);
}

/* Block bytes a save meta may write: its chunks from the request's
 * high-water mark to its lcm-floored token_len, every group (an upper
 * bound: dedup and the masks only lower it). */
static uint64_t save_bytes(const kvp_kv_worker_t *w, const kvp_kv_req_meta_t *m, int64_t saved)
{
    int64_t lcm = w->p.block_size;
    int64_t tl = m->token_len_chunk > 0 ? m->token_len_chunk / lcm * lcm : 0;
    uint64_t chunks = 0;
    for (uint32_t g = 0; g < m->block_ids.num_groups; g++) {
        int64_t bs = w->g[g].block_size;
        int64_t c = kvp__kvw_cdiv(tl, bs) - kvp__kvw_cdiv(saved, bs);
        if (c > 0)
            chunks += (uint64_t)c;
    }
    return chunks * w->value_bytes;
}

static kvp_status_t queue_save(kvp_kv_worker_t *w, const kvp_kv_req_meta_t *m)
{
    if (!meta_ok(w, m)) {
        atomic_fetch_add(&w->c.bad_metas, 1);
        return KVP_OK; /* skipped (logged) */
    }
    kvp__kvw_job_t *j = job_copy(m);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    size_t idlen = strlen(m->req_id);
    pthread_mutex_lock(&w->mu);
    kvp__kvw_stored_t *e = kvp__strmap_get(&w->stored, m->req_id, idlen);
    if (!e) { /* stored_requests is a defaultdict: the first += 1 creates it */
        e = kvp__calloc(1, sizeof *e);
        char *id = e ? kvp__strdup(m->req_id) : NULL;
        if (!id || kvp__strmap_put(&w->stored, id, idlen, e) != KVP_OK) {
            pthread_mutex_unlock(&w->mu);
            kvp__strfree(id);
            kvp__free(e, sizeof *e);
            kvp__kvw_job_free(j);
            return KVP_ERR_NO_MEMORY;
        }
        e->req_id = id;
    }
    j->queued_bytes = save_bytes(w, m, e->saved_offset);
    if (w->save_q_bytes + j->queued_bytes > w->p.max_save_bytes) {
        /* Dropped: the entry exists (count not bumped), so the request's
         * finish reports it in done_sending at once. */
        pthread_mutex_unlock(&w->mu);
        kvp_warn_rl("kv worker: save queue full (%llu B queued), save of %s dropped",
                    (unsigned long long)w->save_q_bytes, m->req_id);
        atomic_fetch_add(&w->c.saves_dropped, 1);
        kvp__kvw_job_free(j);
        return KVP_OK;
    }
    e->count++;
    enqueue(&w->save_q, j);
    w->save_q_bytes += j->queued_bytes;
    atomic_store(&w->c.save_queue_depth, w->save_q.n);
    atomic_store(&w->c.save_queue_bytes, w->save_q_bytes);
    pthread_cond_signal(&w->save_cv);
    pthread_mutex_unlock(&w->mu);
    return KVP_OK;
}

static kvp_status_t queue_load(kvp_kv_worker_t *w, const kvp_kv_req_meta_t *m, bool sync)
{
    if (!meta_ok(w, m)) {
        load_meta_fails(w, m, !sync);
        return KVP_OK;
    }
    kvp__kvw_job_t *j = job_copy(m);
    if (!j)
        return KVP_ERR_NO_MEMORY;
    j->sync = sync;
    pthread_mutex_lock(&w->mu);
    w->sync_pending += sync;
    enqueue(&w->load_q, j);
    atomic_store(&w->c.load_queue_depth, w->load_q.n);
    pthread_cond_signal(&w->load_cv);
    pthread_mutex_unlock(&w->mu);
    return KVP_OK;
}

/* delete_finished_stored_request (w->mu held). */
static void stored_delete_locked(kvp_kv_worker_t *w, const char *req_id)
{
    kvp__kvw_stored_t *e = kvp__strmap_del(&w->stored, req_id, strlen(req_id));
    if (e)
        stored_free(e);
}

/* W5, into w->out_send. */
static kvp_status_t finished_sending(kvp_kv_worker_t *w, const kvp_kv_meta_t *meta,
                                     const char *const *finished, size_t nfin)
{
    kvp_status_t st = KVP_OK;
    pthread_mutex_lock(&w->mu);
    for (size_t i = 0; meta && i < meta->num_preempted; i++)
        if (meta->preempted_req_ids[i])
            stored_delete_locked(w, meta->preempted_req_ids[i]);
    /* 2: remembered ids whose saves are all done (an id deleted by a
     * preemption stays remembered, as in the original). */
    for (size_t i = 0; i < w->finished_store_req.cap && st == KVP_OK; i++) {
        const char *id = w->finished_store_req.slots[i].key;
        if (!id)
            continue;
        kvp__kvw_stored_t *e = kvp__strmap_get(&w->stored, id, strlen(id));
        if (!e || e->count != 0)
            continue;
        st = strs_add(&w->out_send, id);
        stored_delete_locked(w, id);
    }
    for (size_t i = 0; i < w->out_send.n; i++) /* not while iterating the set */
        kvp__strset_discard(&w->finished_store_req, w->out_send.v[i]);
    /* 3: this step's finished ids. */
    for (size_t i = 0; i < nfin && st == KVP_OK; i++) {
        if (!finished[i])
            continue;
        kvp__kvw_stored_t *e = kvp__strmap_get(&w->stored, finished[i], strlen(finished[i]));
        if (!e)
            continue;
        if (e->count == 0) {
            bool dup = false;
            for (size_t k = 0; k < w->out_send.n && !dup; k++)
                dup = !strcmp(w->out_send.v[k], finished[i]);
            if (!dup)
                st = strs_add(&w->out_send, finished[i]);
            stored_delete_locked(w, finished[i]);
        } else {
            st = kvp__strset_add(&w->finished_store_req, finished[i], NULL);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

/*
 * Synchronous loads (the engine's load_async=False: the hit feeds this very
 * step's forward pass).  The step's load metas go to the load threads at
 * once and the call waits for them; their failed blocks are load errors as
 * usual, but the requests are not reported in done_recving (the engine is
 * not waiting for them), and the get_finished that follows with the same
 * meta does not load them again.  A meta the checks refuse fails alone: its
 * blocks become load errors, reported by load_errors().
 */
kvp_status_t kvp_kv_worker_load_now(kvp_kv_worker_t *w, const kvp_kv_meta_t *meta)
{
    if (!w || !meta || (meta->num_requests && !meta->requests))
        return KVP_ERR_NULL_POINTER;
    if (!w->registered) {
        kvp_error("kv worker: load_now before register");
        return KVP_ERR_STATE;
    }
    kvp_status_t st = KVP_OK;
    for (size_t i = 0; i < meta->num_requests && st == KVP_OK; i++) {
        const kvp_kv_req_meta_t *m = &meta->requests[i];
        if (!m->has_load_spec || !m->load_spec.can_load || !m->req_id)
            continue;
        st = kvp__strset_add(&w->sync_loaded, m->req_id, NULL);
        if (st == KVP_OK)
            st = queue_load(w, m, true);
    }
    pthread_mutex_lock(&w->mu);
    while (w->sync_pending)
        pthread_cond_wait(&w->idle_cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return st;
}

kvp_status_t kvp_kv_worker_get_finished(kvp_kv_worker_t *w, const kvp_kv_meta_t *meta,
                                        const char *const *finished_ids, size_t num_finished,
                                        kvp_kv_finished_t *out_p)
{
    if (!w || !out_p || (num_finished && !finished_ids) ||
        (meta && ((meta->num_requests && !meta->requests) ||
                  (meta->num_preempted && !meta->preempted_req_ids))))
        return KVP_ERR_NULL_POINTER;
    memset(out_p, 0, sizeof *out_p);
    if (!w->registered) {
        kvp_error("kv worker: get_finished before register");
        return KVP_ERR_STATE;
    }
    strs_clear(&w->out_send);
    strs_clear(&w->out_recv);
    kvp_status_t st = KVP_OK;
    size_t nreq = meta ? meta->num_requests : 0;
    for (size_t i = 0; i < nreq && st == KVP_OK; i++) { /* W2 */
        const kvp_kv_req_meta_t *m = &meta->requests[i];
        if (!m->has_load_spec || !m->load_spec.can_load)
            continue;
        if (m->req_id && kvp__strset_has(&w->sync_loaded, m->req_id))
            kvp__strset_discard(&w->sync_loaded, m->req_id); /* done before the forward pass */
        else
            st = queue_load(w, m, false);
    }
    if (w->p.role != KVP_KV_ROLE_CONSUMER) {
        for (size_t i = 0; i < nreq && st == KVP_OK; i++) /* W3 */
            if (meta->requests[i].can_save)
                st = queue_save(w, &meta->requests[i]);
        if (st == KVP_OK)
            st = finished_sending(w, meta, finished_ids, num_finished);
    }
    pthread_mutex_lock(&w->mu); /* done_recving: hand the list over */
    kvp__kvw_strs_t t = w->out_recv;
    w->out_recv = w->recv_done;
    w->recv_done = t;
    pthread_mutex_unlock(&w->mu);
    out_p->sending = (const char *const *)w->out_send.v;
    out_p->num_sending = w->out_send.n;
    out_p->recving = (const char *const *)w->out_recv.v;
    out_p->num_recving = w->out_recv.n;
    return st;
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

kvp_status_t kvp_kv_worker_load_errors(kvp_kv_worker_t *w, const int64_t **ids_p, size_t *n_p)
{
    if (!w || !ids_p || !n_p)
        return KVP_ERR_NULL_POINTER;
    pthread_mutex_lock(&w->mu);
    int64_t *t = w->out_errs;
    size_t tcap = w->out_errs_cap;
    w->out_errs = w->errs, w->out_errs_cap = w->errs_cap;
    size_t n = w->nerrs;
    w->errs = t, w->errs_cap = tcap, w->nerrs = 0;
    pthread_mutex_unlock(&w->mu);
    /* A set, as the original's: sorted, each id once. */
    int64_t *v = w->out_errs;
    if (n > 1)
        qsort(v, n, sizeof *v, cmp_id);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || v[u - 1] != v[i])
            v[u++] = v[i];
    *ids_p = v;
    *n_p = u;
    return KVP_OK;
}

kvp_status_t kvp_kv_worker_drain(kvp_kv_worker_t *w)
{
    if (!w)
        return KVP_ERR_NULL_POINTER;
    if (!w->registered)
        return KVP_OK;
    pthread_mutex_lock(&w->mu);
    while (w->has_save_thread && (w->save_q.n || w->save_running))
        pthread_cond_wait(&w->idle_cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
    return KVP_OK;
}
