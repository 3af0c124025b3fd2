#include "kv/kv_idmap.h"

#include <string.h>

#include "common/alloc.h"

uint64_t kvp__kv_id_hash(const char *key, size_t len)
{
    /* FNV-1a with a final avalanche (ids are short ASCII strings). */
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

void kvp__kv_idmap_init(kvp__kv_idmap_t *m)
{
    memset(m, 0, sizeof *m);
}

void kvp__kv_idmap_cleanup(kvp__kv_idmap_t *m)
{
    if (m->slots)
        kvp__free(m->slots, m->cap * sizeof *m->slots);
    memset(m, 0, sizeof *m);
}

static size_t find_slot(const kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash)
{
    size_t mask = m->cap - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const kvp__kv_idmap_slot_t *s = &m->slots[i];
        if (s->hash == 0)
            return SIZE_MAX;
        if (s->hash == hash && s->len == len && memcmp(s->key, key, len) == 0)
            return i;
    }
}

void *kvp__kv_idmap_get(const kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash)
{
    if (m->count == 0)
        return NULL;
    size_t i = find_slot(m, key, len, hash);
    return i == SIZE_MAX ? NULL : m->slots[i].item;
}

static void insert_slot(kvp__kv_idmap_slot_t *slots, size_t cap, const kvp__kv_idmap_slot_t *e)
{
    size_t mask = cap - 1;
    size_t i = e->hash & mask;
    while (slots[i].hash != 0)
        i = (i + 1) & mask;
    slots[i] = *e;
}

static kvp_status_t grow(kvp__kv_idmap_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    kvp__kv_idmap_slot_t *ns = kvp__calloc(ncap, sizeof *ns);
    if (!ns)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < m->cap; i++)
        if (m->slots[i].hash)
            insert_slot(ns, ncap, &m->slots[i]);
    if (m->slots)
        kvp__free(m->slots, m->cap * sizeof *m->slots);
    m->slots = ns;
    m->cap = ncap;
    return KVP_OK;
}

kvp_status_t kvp__kv_idmap_put(kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash,
                               void *item)
{
    if ((m->count + 1) * 2 > m->cap) {
        kvp_status_t st = grow(m);
        if (st != KVP_OK)
            return st;
    }
    kvp__kv_idmap_slot_t e = {hash, key, len, item};
    insert_slot(m->slots, m->cap, &e);
    m->count++;
    return KVP_OK;
}

void *kvp__kv_idmap_del(kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash)
{
    if (m->count == 0)
        return NULL;
    size_t i = find_slot(m, key, len, hash);
    if (i == SIZE_MAX)
        return NULL;
    void *item = m->slots[i].item;
    /* Backward-shift deletion: move later members of the probe run into the
     * hole when their home slot is at or before it (cyclically). */
    size_t mask = m->cap - 1;
    size_t hole = i;
    for (size_t j = (i + 1) & mask; m->slots[j].hash != 0; j = (j + 1) & mask) {
        size_t home = m->slots[j].hash & mask;
        /* j may move to hole iff home is not in (hole, j] cyclically. */
        int in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!in_range) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    memset(&m->slots[hole], 0, sizeof m->slots[hole]);
    m->count--;
    return item;
}
