/*
 * The TP ranks of an engine instance: each a thread with its own paged KV
 * cache in host memory (one tensor per layer, K/V first, as FlashAttention
 * lays it out: (2, num_blocks, block_size, heads, head_dim)) and its own
 * worker; rank 0 also hosts the instance's lookup service.  A phase (see
 * engine_int.h) is what vLLM's model runner does around one forward pass:
 * sync loads, the forward pass (here: writing each newly computed block's
 * KV, a function of its store key), get_finished and the load errors.
 * Every block a load brought in is checked against the KV its key
 * determines; a mismatch is a corruption.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/thread.h"
#include "engine/content.h"
#include "engine/engine_int.h"

static uint64_t key_seed(const rank_t *rk, const uint8_t *hash)
{
    const struct kvp__eng *e = rk->eng;
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    k.cache_prefix = e->p.cache_prefix;
    k.cache_prefix_len = e->p.cache_prefix ? strlen(e->p.cache_prefix) : 0;
    k.model_name = e->model_name;
    k.model_name_len = strlen(e->model_name);
    k.tp_rank = rk->key_rank;
    memcpy(k.hash.bytes, hash, KVP__ENG_HASH_LEN);
    k.hash.len = KVP__ENG_HASH_LEN;
    char buf[KVP_KV_STORE_KEY_MAX + 1];
    size_t len = 0;
    if (kvp_kv_store_key_format(&k, buf, sizeof buf, &len) != KVP_OK)
        return 0;
    return kvp__eng_key_seed(buf, len);
}

static uint8_t *slice(const rank_t *rk, int64_t block, uint32_t layer, uint32_t kv)
{
    const struct kvp__eng *e = rk->eng;
    size_t layer_bytes = 2 * (size_t)e->num_blocks * e->seg;
    return rk->mem + layer * layer_bytes + (kv * (size_t)e->num_blocks + (size_t)block) * e->seg;
}

static void fill_block(rank_t *rk, int64_t block, const uint8_t *hash)
{
    uint64_t seed = key_seed(rk, hash);
    for (uint32_t l = 0; l < rk->eng->p.model->layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            kvp__eng_kv_fill(slice(rk, block, l, kv), rk->eng->seg, seed, l, kv);
}

static bool check_block(rank_t *rk, int64_t block, const uint8_t *hash)
{
    uint64_t seed = key_seed(rk, hash);
    for (uint32_t l = 0; l < rk->eng->p.model->layers; l++)
        for (uint32_t kv = 0; kv < 2; kv++)
            if (!kvp__eng_kv_check(slice(rk, block, l, kv), rk->eng->seg, seed, l, kv))
                return false;
    return true;
}

static bool failed(const rank_t *rk, int64_t block)
{
    for (size_t i = 0; i < rk->nerrs; i++)
        if (rk->errs[i] == block)
            return true;
    return false;
}

/* Appends the worker's load errors since its last call to this phase's. */
static kvp_status_t take_errors(rank_t *rk)
{
    const int64_t *ids;
    size_t n;
    kvp_status_t st = kvp_kv_worker_load_errors(rk->worker, &ids, &n);
    if (st != KVP_OK || n == 0)
        return st;
    if (kvp__grow_in((void **)&rk->errs, &rk->cap_errs, rk->nerrs + n, sizeof *rk->errs, 64))
        return KVP_ERR_NO_MEMORY;
    memcpy(rk->errs + rk->nerrs, ids, n * sizeof *ids);
    rk->nerrs += n;
    return KVP_OK;
}

/* Checks the blocks of q's load that this rank did not report failed. */
static void verify_load(rank_t *rk, const rq_t *q)
{
    int64_t bs = rk->eng->p.block_size;
    for (int64_t b = q->load_from / bs; b < q->load_to / bs && b < q->nblocks; b++) {
        if (failed(rk, q->blocks[b]))
            continue;
        if (check_block(rk, q->blocks[b], q->r->hashes + b * KVP__ENG_HASH_LEN))
            rk->verified++;
        else {
            rk->corrupt++;
            KVP_LOG_RL(KVP_LOG_ERROR, "replay: instance %u rank %u: %s block %" PRId64
                       " loaded from the pool differs from the KV its key determines",
                       rk->eng->p.index, rk->rank, q->id, b);
        }
    }
}

static void rank_phase(rank_t *rk)
{
    struct kvp__eng *e = rk->eng;
    const phase_t *ph = &e->phase;
    rk->nerrs = 0;
    if (ph->load_now && ph->meta) {
        rk->st = kvp_kv_worker_load_now(rk->worker, ph->meta);
        if (rk->st == KVP_OK)
            rk->st = take_errors(rk);
        if (rk->st != KVP_OK)
            return;
        for (size_t i = 0; i < ph->num_sync_loads; i++)
            verify_load(rk, ph->sync_loads[i]);
    }
    for (size_t i = 0; i < ph->num_fills; i++) {
        fill_block(rk, ph->fills[i].block, ph->fills[i].hash);
        if (rk->rank == 0 && e->p.corrupt_every && ++e->fills_done % e->p.corrupt_every == 0)
            slice(rk, ph->fills[i].block, 0, 0)[0] ^= 0x5a;
    }
    rk->st = kvp_kv_worker_get_finished(rk->worker, ph->meta, ph->finished, ph->num_finished,
                                        &rk->fin);
    if (rk->st == KVP_OK)
        rk->st = take_errors(rk);
    if (rk->st != KVP_OK)
        return;
    for (size_t i = 0; i < rk->fin.num_recving; i++) {
        const rq_t *q = kvp__strmap_gets(&e->by_id, rk->fin.recving[i]);
        if (q && !q->load_sync)
            verify_load(rk, q);
    }
}

static void *rank_main(void *arg)
{
    rank_t *rk = arg;
    kvp__thread_name("kvp-rank");
    struct kvp__eng *e = rk->eng;
    uint64_t seen = 0;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (!e->quit && e->phase_gen == seen)
            pthread_cond_wait(&e->go_cv, &e->mu);
        if (e->quit)
            break;
        seen = e->phase_gen;
        pthread_mutex_unlock(&e->mu);
        rank_phase(rk);
        pthread_mutex_lock(&e->mu);
        if (--e->phase_left == 0)
            pthread_cond_signal(&e->done_cv);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

kvp_status_t kvp__eng_ranks_run(struct kvp__eng *e)
{
    uint32_t tp = e->p.tp;
    if (tp > 1) {
        pthread_mutex_lock(&e->mu);
        e->phase_left = tp - 1;
        e->phase_gen++;
        pthread_cond_broadcast(&e->go_cv);
        pthread_mutex_unlock(&e->mu);
    }
    rank_phase(&e->ranks[0]);
    if (tp > 1) {
        pthread_mutex_lock(&e->mu);
        while (e->phase_left)
            pthread_cond_wait(&e->done_cv, &e->mu);
        pthread_mutex_unlock(&e->mu);
    }
    for (uint32_t r = 0; r < tp; r++)
        if (e->ranks[r].st != KVP_OK)
            return e->ranks[r].st;
    return KVP_OK;
}

static kvp_status_t rank_open(struct kvp__eng *e, rank_t *rk)
{
    const kvp__eng_model_t *m = e->p.model;
    uint32_t heads = m->kv_heads < e->p.tp ? 1 : m->kv_heads / e->p.tp;
    size_t layer_bytes = 2 * (size_t)e->num_blocks * e->seg;
    rk->mem_bytes = layer_bytes * m->layers;
    /* The "GPU" memory: reserved, touched as blocks are written. */
    rk->mem = mmap(NULL, rk->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (rk->mem == MAP_FAILED) {
        rk->mem = NULL;
        kvp_error("replay: cannot map %zu bytes of KV cache", rk->mem_bytes);
        return KVP_ERR_NO_MEMORY;
    }
    uint32_t factor = 1;
    kvp_status_t st = kvp_kv_store_key_replication_factor(KVP_KV_GROUP_FULL_ATTENTION, e->p.tp,
                                                          m->kv_heads, 1, &factor);
    if (st != KVP_OK)
        return st;
    rk->key_rank = rk->rank / factor;

    kvp_kv_worker_params_t wp;
    kvp_kv_worker_params_init(&wp);
    wp.pool = e->p.pool;
    wp.role = e->p.role;
    wp.model_name = e->model_name;
    wp.cache_prefix = e->p.cache_prefix;
    wp.tp_rank = rk->rank;
    wp.tp_size = e->p.tp;
    wp.num_kv_heads = m->kv_heads;
    wp.block_size = wp.hash_block_size = e->p.block_size;
    wp.num_load_threads = 1;
    wp.timeout_ms = e->p.pool_timeout_ms;
    st = kvp_kv_worker_create(&wp, &rk->worker);
    if (st != KVP_OK)
        return st;
    kvp_kv_cache_tensor_t *t = kvp__calloc(m->layers, sizeof *t);
    if (!t)
        return KVP_ERR_NO_MEMORY;
    for (uint32_t l = 0; l < m->layers; l++) {
        t[l].storage = rk->mem + l * layer_bytes;
        t[l].storage_bytes = layer_bytes;
        t[l].elem_size = m->elem_bytes;
        t[l].ndim = 5;
        int64_t shape[5] = {2, e->num_blocks, e->p.block_size, heads, m->head_dim};
        int64_t stride = 1;
        for (int d = 4; d >= 0; d--) {
            t[l].shape[d] = shape[d];
            t[l].stride[d] = stride;
            stride *= shape[d];
        }
    }
    st = kvp_kv_worker_register(rk->worker, t, m->layers, (uint64_t)e->num_blocks);
    kvp__free(t, m->layers * sizeof *t);
    return st;
}

static kvp_status_t drain_rank0(void *arg) { return kvp_kv_worker_drain(((rank_t *)arg)->worker); }

/* Rank 0 hosts the lookup service; the scheduler's client talks to it. */
static kvp_status_t lookup_open(struct kvp__eng *e)
{
    const kvp__eng_model_t *m = e->p.model;
    kvp_kv_lookup_pool_params_t lp;
    kvp_kv_lookup_pool_params_init(&lp);
    lp.model_name = e->model_name;
    lp.cache_prefix = e->p.cache_prefix;
    lp.tp_size = e->p.tp;
    lp.num_kv_heads = m->kv_heads;
    lp.block_size = lp.hash_block_size = e->p.block_size;
    kvp_status_t st = kvp_kv_lookup_pool_create(e->p.pool, &lp, &e->lookup);
    if (st != KVP_OK)
        return st;
    char ep[512];
    st = kvp_kv_lookup_ipc_endpoint(e->p.ipc_dir, 9000 + e->p.index, "replay", 0, ep, sizeof ep);
    if (st != KVP_OK)
        return st;
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = ep;
    sp.lookup = e->lookup;
    sp.drain = drain_rank0;
    sp.drain_arg = &e->ranks[0];
    st = kvp_kv_lookup_server_start(&sp, &e->lookup_server);
    if (st != KVP_OK)
        return st;
    kvp_kv_lookup_zmq_params_t zp;
    kvp_kv_lookup_zmq_params_init(&zp);
    zp.endpoint = ep;
    zp.timeout_ms = 2000;
    return kvp_kv_lookup_zmq_create(&zp, &e->zmq);
}

kvp_status_t kvp__eng_ranks_start(struct kvp__eng *e)
{
    e->ranks = kvp__calloc(e->p.tp, sizeof *e->ranks);
    if (!e->ranks)
        return KVP_ERR_NO_MEMORY;
    for (uint32_t r = 0; r < e->p.tp; r++) {
        e->ranks[r].eng = e;
        e->ranks[r].rank = r;
        kvp_status_t st = rank_open(e, &e->ranks[r]);
        if (st != KVP_OK)
            return st;
    }
    kvp_status_t st = lookup_open(e);
    if (st != KVP_OK)
        return st;
    for (uint32_t r = 1; r < e->p.tp; r++) {
        if (pthread_create(&e->ranks[r].th, NULL, rank_main, &e->ranks[r]))
            return KVP_ERR_NO_MEMORY;
        e->ranks[r].started = true;
    }
    return KVP_OK;
}

void kvp__eng_ranks_stop(struct kvp__eng *e)
{
    if (!e->ranks)
        return;
    pthread_mutex_lock(&e->mu);
    e->quit = true;
    pthread_cond_broadcast(&e->go_cv);
    pthread_mutex_unlock(&e->mu);
    for (uint32_t r = 0; r < e->p.tp; r++)
        if (e->ranks[r].started)
            pthread_join(e->ranks[r].th, NULL);
    kvp_kv_lookup_zmq_destroy(e->zmq);
    kvp_kv_lookup_server_stop(e->lookup_server);
    kvp_kv_lookup_pool_destroy(e->lookup);
    e->zmq = NULL, e->lookup_server = NULL, e->lookup = NULL;
    for (uint32_t r = 0; r < e->p.tp; r++) {
        rank_t *rk = &e->ranks[r];
        kvp_kv_worker_destroy(rk->worker);
        if (rk->mem)
            munmap(rk->mem, rk->mem_bytes);
        kvp__free(rk->errs, rk->cap_errs * sizeof *rk->errs);
    }
    kvp__free(e->ranks, e->p.tp * sizeof *e->ranks);
    e->ranks = NULL;
}
