/*
 * What lookups may see, in virtual time.
 *
 * A block's bytes reach the pool when the save thread really puts them,
 * which is usually long before the modelled link would have delivered them
 * (and sometimes after, on a busy machine).  So that the replay's figures
 * do not depend on the machine, a lookup answers min(the pool's real hit,
 * the prefix visible at the asking instance's virtual time): a block is
 * visible from the virtual completion of its first save.  The other half,
 * that a visible block is really there, is the clock's: it never passes a
 * save's virtual completion before that save has really completed
 * (kvp__eng_settle_saves).  A real hit below the visible prefix (the pool
 * evicted a block) is the pool's answer and stays.
 */
#include <math.h>
#include <string.h>

#include "common/log.h"
#include "engine/engine_int.h"

typedef struct vis_entry {
    uint8_t hash[KVP__BP_HASH_LEN];
    double t_us;
} vis_entry_t;

kvp_status_t kvp__eng_visible_init(kvp__eng_visible_t *v)
{
    memset(v, 0, sizeof *v);
    kvp__strmap_init(&v->map);
    kvp__arena_init(&v->arena);
    return pthread_mutex_init(&v->mu, NULL) ? KVP_ERR_NO_MEMORY : KVP_OK;
}

void kvp__eng_visible_cleanup(kvp__eng_visible_t *v)
{
    kvp__strmap_cleanup(&v->map);
    kvp__arena_cleanup(&v->arena);
    pthread_mutex_destroy(&v->mu);
}

void kvp__eng_visible_mark(kvp__eng_visible_t *v, const uint8_t *hashes, int64_t n, double t_us)
{
    pthread_mutex_lock(&v->mu);
    for (int64_t i = 0; i < n; i++) {
        const char *h = (const char *)hashes + i * KVP__BP_HASH_LEN;
        vis_entry_t *e = kvp__strmap_get(&v->map, h, KVP__BP_HASH_LEN);
        if (e) {
            if (t_us < e->t_us)
                e->t_us = t_us;
            continue;
        }
        e = kvp__arena_alloc(&v->arena, sizeof *e);
        if (!e)
            break; /* out of memory: the block stays invisible (a miss, never a wrong hit) */
        memcpy(e->hash, h, KVP__BP_HASH_LEN);
        e->t_us = t_us;
        if (kvp__strmap_put(&v->map, (const char *)e->hash, KVP__BP_HASH_LEN, e) != KVP_OK)
            break;
    }
    pthread_mutex_unlock(&v->mu);
}

int64_t kvp__eng_visible_prefix(kvp__eng_visible_t *v, const uint8_t *hashes, int64_t n,
                                double t_us)
{
    int64_t i = 0;
    pthread_mutex_lock(&v->mu);
    for (; i < n; i++) {
        vis_entry_t *e = kvp__strmap_get(&v->map, (const char *)hashes + i * KVP__BP_HASH_LEN,
                                         KVP__BP_HASH_LEN);
        if (!e || e->t_us > t_us)
            break;
    }
    pthread_mutex_unlock(&v->mu);
    return i;
}

static kvp_status_t filter_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block,
                                  int64_t *hit_p)
{
    struct kvp__eng *e = ctx;
    kvp_kv_lookup_client_t z = kvp_kv_lookup_zmq_client(e->zmq);
    kvp_status_t st = z.ops->lookup(z.ctx, req, non_block, hit_p);
    if (st != KVP_OK)
        return st;
    int64_t vis = kvp__eng_visible_prefix(e->p.visible, req->block_hashes,
                                          (int64_t)req->num_block_hashes, e->now_us);
    if (*hit_p > vis * e->p.block_size)
        *hit_p = vis * e->p.block_size;
    return KVP_OK;
}

static void filter_discard(void *ctx, const char *req_id)
{
    struct kvp__eng *e = ctx;
    kvp_kv_lookup_client_t z = kvp_kv_lookup_zmq_client(e->zmq);
    z.ops->discard(z.ctx, req_id);
}

static kvp_status_t filter_reset(void *ctx, bool *ack_p)
{
    struct kvp__eng *e = ctx;
    kvp_kv_lookup_client_t z = kvp_kv_lookup_zmq_client(e->zmq);
    return z.ops->reset(z.ctx, ack_p);
}

static const kvp_kv_lookup_ops_t g_filter_ops = {filter_lookup, filter_discard, filter_reset};

kvp_kv_lookup_client_t kvp__eng_filter_client(struct kvp__eng *e)
{
    return (kvp_kv_lookup_client_t){&g_filter_ops, e};
}
