#include "ec/ec_ready.h"

#include <string.h>

#include "common/alloc.h"

void kvp__ec_ready_init(kvp__ec_ready_t *r)
{
    kvp__strmap_init(&r->map);
    kvp__list_init(&r->lru);
}

static void entry_free(kvp__ec_rentry_t *e)
{
    kvp__strfree(e->tid);
    if (e->shards)
        kvp__free(e->shards, e->cap * sizeof *e->shards);
    kvp__free(e, sizeof *e);
}

void kvp__ec_ready_cleanup(kvp__ec_ready_t *r)
{
    KVP_LIST_FOR_EACH_ENTRY_SAFE(e, n, &r->lru, kvp__ec_rentry_t, lru)
        entry_free(e);
    kvp__strmap_cleanup(&r->map);
    kvp__list_init(&r->lru);
}

size_t kvp__ec_ready_size(const kvp__ec_ready_t *r) { return r->map.n; }

kvp_status_t kvp__ec_ready_touch(kvp__ec_ready_t *r, const char *tid, kvp__ec_rentry_t **e_p)
{
    kvp__ec_rentry_t *e = kvp__strmap_gets(&r->map, tid);
    if (e) {
        kvp__list_del(&e->lru); /* move_to_end */
        kvp__list_add_tail(&r->lru, &e->lru);
        *e_p = e;
        return KVP_OK;
    }
    e = kvp__calloc(1, sizeof *e);
    if (!e)
        return KVP_ERR_NO_MEMORY;
    e->tid = kvp__strdup(tid);
    if (!e->tid) {
        kvp__free(e, sizeof *e);
        return KVP_ERR_NO_MEMORY;
    }
    e->tid_len = strlen(tid);
    if (kvp__strmap_put(&r->map, e->tid, e->tid_len, e) != KVP_OK) {
        entry_free(e);
        return KVP_ERR_NO_MEMORY;
    }
    kvp__list_add_tail(&r->lru, &e->lru);
    *e_p = e;
    return KVP_OK;
}

kvp_status_t kvp__ec_ready_add(kvp__ec_rentry_t *e, int64_t shard)
{
    for (size_t i = 0; i < e->n; i++)
        if (e->shards[i] == shard)
            return KVP_OK;
    int64_t *ns = kvp__grow(e->shards, &e->cap, e->n + 1, sizeof *ns, 4);
    if (!ns)
        return KVP_ERR_NO_MEMORY;
    e->shards = ns;
    e->shards[e->n++] = shard;
    return KVP_OK;
}

void kvp__ec_ready_forget(kvp__ec_ready_t *r, const char *tid)
{
    kvp__ec_rentry_t *e = kvp__strmap_del(&r->map, tid, strlen(tid));
    if (!e)
        return;
    kvp__list_del(&e->lru);
    entry_free(e);
}

void kvp__ec_ready_trim(kvp__ec_ready_t *r, size_t limit)
{
    kvp__ec_rentry_t *e;
    while (r->map.n > limit && (e = KVP_LIST_FIRST_ENTRY(&r->lru, kvp__ec_rentry_t, lru))) {
        kvp__strmap_del(&r->map, e->tid, e->tid_len);
        kvp__list_del(&e->lru);
        entry_free(e);
    }
}
