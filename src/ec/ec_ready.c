#include "ec/ec_ready.h"

#include <string.h>

#include "common/alloc.h"

void kvp__ec_ready_init(kvp__ec_ready_t *r)
{
    kvp__strmap_init(&r->map);
    r->head = r->tail = NULL;
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
    kvp__ec_rentry_t *e = r->head;
    while (e) {
        kvp__ec_rentry_t *n = e->next;
        entry_free(e);
        e = n;
    }
    kvp__strmap_cleanup(&r->map);
    r->head = r->tail = NULL;
}

size_t kvp__ec_ready_size(const kvp__ec_ready_t *r) { return r->map.n; }

static void unlink_entry(kvp__ec_ready_t *r, kvp__ec_rentry_t *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        r->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        r->tail = e->prev;
    e->prev = e->next = NULL;
}

static void append_entry(kvp__ec_ready_t *r, kvp__ec_rentry_t *e)
{
    e->prev = r->tail;
    e->next = NULL;
    if (r->tail)
        r->tail->next = e;
    else
        r->head = e;
    r->tail = e;
}

kvp_status_t kvp__ec_ready_touch(kvp__ec_ready_t *r, const char *tid, kvp__ec_rentry_t **e_p)
{
    kvp__ec_rentry_t *e = kvp__strmap_gets(&r->map, tid);
    if (e) {
        unlink_entry(r, e);
        append_entry(r, e);
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
    append_entry(r, e);
    *e_p = e;
    return KVP_OK;
}

kvp_status_t kvp__ec_ready_add(kvp__ec_rentry_t *e, int64_t shard)
{
    for (size_t i = 0; i < e->n; i++)
        if (e->shards[i] == shard)
            return KVP_OK;
    if (e->n == e->cap) {
        size_t ncap = e->cap ? e->cap * 2 : 4;
        int64_t *ns = kvp__realloc(e->shards, e->cap * sizeof *ns, ncap * sizeof *ns);
        if (!ns)
            return KVP_ERR_NO_MEMORY;
        e->shards = ns;
        e->cap = ncap;
    }
    e->shards[e->n++] = shard;
    return KVP_OK;
}

void kvp__ec_ready_forget(kvp__ec_ready_t *r, const char *tid)
{
    kvp__ec_rentry_t *e = kvp__strmap_del(&r->map, tid, strlen(tid));
    if (!e)
        return;
    unlink_entry(r, e);
    entry_free(e);
}

void kvp__ec_ready_trim(kvp__ec_ready_t *r, size_t limit)
{
    while (r->map.n > limit && r->head) {
        kvp__ec_rentry_t *e = r->head;
        kvp__strmap_del(&r->map, e->tid, e->tid_len);
        unlink_entry(r, e);
        entry_free(e);
    }
}
