#include "common/strmap.h"

#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"

uint64_t kvp__strmap_hash(const char *key, size_t len) { return XXH3_64bits(key, len); }

void kvp__strmap_init(kvp__strmap_t *m)
{
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
}

void kvp__strmap_cleanup(kvp__strmap_t *m)
{
    if (m->slots)
        kvp__free(m->slots, m->cap * sizeof *m->slots);
    kvp__strmap_init(m);
}

void kvp__strmap_clear(kvp__strmap_t *m)
{
    if (m->slots)
        memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->n = 0;
}

/* The slot holding key, or the empty slot that ends its probe run. */
static size_t find(const kvp__strmap_t *m, uint64_t h, const char *key, size_t len, bool *found)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    for (;;) {
        const kvp__strmap_slot_t *s = &m->slots[i];
        if (!s->key) {
            *found = false;
            return i;
        }
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            *found = true;
            return i;
        }
        i = (i + 1) & mask;
    }
}

void *kvp__strmap_get_h(const kvp__strmap_t *m, const char *key, size_t len, uint64_t hash)
{
    if (!m->n)
        return NULL;
    bool found;
    size_t i = find(m, hash, key, len, &found);
    return found ? m->slots[i].val : NULL;
}

static kvp_status_t grow(kvp__strmap_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    kvp__strmap_slot_t *ns = kvp__calloc(ncap, sizeof *ns);
    if (!ns)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < m->cap; i++) {
        kvp__strmap_slot_t *s = &m->slots[i];
        if (!s->key)
            continue;
        size_t j = (size_t)s->hash & (ncap - 1);
        while (ns[j].key)
            j = (j + 1) & (ncap - 1);
        ns[j] = *s;
    }
    if (m->slots)
        kvp__free(m->slots, m->cap * sizeof *m->slots);
    m->slots = ns;
    m->cap = ncap;
    return KVP_OK;
}

kvp_status_t kvp__strmap_put_h(kvp__strmap_t *m, const char *key, size_t len, uint64_t hash, void *val)
{
    if ((m->n + 1) * 2 > m->cap) { /* load <= 1/2: short probe runs */
        kvp_status_t st = grow(m);
        if (st != KVP_OK)
            return st;
    }
    bool found;
    size_t i = find(m, hash, key, len, &found);
    kvp__strmap_slot_t *s = &m->slots[i];
    if (found) {
        s->key = key;
        s->val = val;
        return KVP_OK;
    }
    *s = (kvp__strmap_slot_t){hash, key, len, val};
    m->n++;
    return KVP_OK;
}

void *kvp__strmap_del_h(kvp__strmap_t *m, const char *key, size_t len, uint64_t hash)
{
    if (!m->n)
        return NULL;
    bool found;
    size_t mask = m->cap - 1;
    size_t i = find(m, hash, key, len, &found);
    if (!found)
        return NULL;
    void *val = m->slots[i].val;
    /* Backward-shift deletion: a later member of the probe run moves into the
     * hole at i when its home slot is not in (i, j] (cyclically), so every
     * probe run stays unbroken without tombstones. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        kvp__strmap_slot_t *s = &m->slots[j];
        if (!s->key)
            break;
        size_t home = (size_t)s->hash & mask;
        bool between = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!between) {
            m->slots[i] = *s;
            i = j;
        }
    }
    memset(&m->slots[i], 0, sizeof m->slots[i]);
    m->n--;
    return val;
}

void kvp__strset_clear(kvp__strset_t *s)
{
    for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i].key)
            kvp__strfree(s->slots[i].val);
    kvp__strmap_clear(s);
}

void kvp__strset_cleanup(kvp__strset_t *s)
{
    kvp__strset_clear(s);
    kvp__strmap_cleanup(s);
}

bool kvp__strset_has(const kvp__strset_t *s, const char *str) { return kvp__strmap_gets(s, str) != NULL; }

kvp_status_t kvp__strset_add(kvp__strset_t *s, const char *str, bool *added_p)
{
    if (kvp__strset_has(s, str)) {
        if (added_p)
            *added_p = false;
        return KVP_OK;
    }
    char *copy = kvp__strdup(str);
    if (!copy)
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__strmap_put(s, copy, strlen(copy), copy);
    if (st != KVP_OK) {
        kvp__strfree(copy);
        return st;
    }
    if (added_p)
        *added_p = true;
    return KVP_OK;
}

void kvp__strset_discard(kvp__strset_t *s, const char *str)
{
    kvp__strfree(kvp__strmap_del(s, str, strlen(str)));
}
