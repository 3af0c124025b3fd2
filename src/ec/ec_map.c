#include "ec/ec_map.h"

#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"

char *kvp__ec_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = kvp__malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

void kvp__ec_strfree(char *s)
{
    if (s)
        kvp__free(s, strlen(s) + 1);
}

void kvp__ec_map_init(kvp__ec_map_t *m)
{
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
}

void kvp__ec_map_cleanup(kvp__ec_map_t *m)
{
    if (m->slots)
        kvp__free(m->slots, m->cap * sizeof *m->slots);
    kvp__ec_map_init(m);
}

void kvp__ec_map_clear(kvp__ec_map_t *m)
{
    if (m->slots)
        memset(m->slots, 0, m->cap * sizeof *m->slots);
    m->n = 0;
}

static uint64_t hash_of(const char *key, size_t len) { return XXH3_64bits(key, len); }

static size_t find(const kvp__ec_map_t *m, uint64_t h, const char *key, size_t len, bool *found)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    for (;;) {
        const kvp__ec_slot_t *s = &m->slots[i];
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

void *kvp__ec_map_get(const kvp__ec_map_t *m, const char *key, size_t len)
{
    if (!m->n)
        return NULL;
    bool found;
    size_t i = find(m, hash_of(key, len), key, len, &found);
    return found ? m->slots[i].val : NULL;
}

static kvp_status_t grow(kvp__ec_map_t *m)
{
    size_t ncap = m->cap ? m->cap * 2 : 16;
    kvp__ec_slot_t *ns = kvp__calloc(ncap, sizeof *ns);
    if (!ns)
        return KVP_ERR_NO_MEMORY;
    for (size_t i = 0; i < m->cap; i++) {
        kvp__ec_slot_t *s = &m->slots[i];
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

kvp_status_t kvp__ec_map_put(kvp__ec_map_t *m, const char *key, size_t len, void *val)
{
    if ((m->n + 1) * 2 > m->cap) { /* load <= 1/2: short probe chains */
        kvp_status_t st = grow(m);
        if (st != KVP_OK)
            return st;
    }
    uint64_t h = hash_of(key, len);
    bool found;
    size_t i = find(m, h, key, len, &found);
    kvp__ec_slot_t *s = &m->slots[i];
    if (found) {
        s->key = key;
        s->val = val;
        return KVP_OK;
    }
    s->hash = h;
    s->key = key;
    s->len = len;
    s->val = val;
    m->n++;
    return KVP_OK;
}

void *kvp__ec_map_del(kvp__ec_map_t *m, const char *key, size_t len)
{
    if (!m->n)
        return NULL;
    bool found;
    size_t mask = m->cap - 1;
    size_t i = find(m, hash_of(key, len), key, len, &found);
    if (!found)
        return NULL;
    void *val = m->slots[i].val;
    /* Backward-shift deletion keeps every probe chain unbroken. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        kvp__ec_slot_t *s = &m->slots[j];
        if (!s->key)
            break;
        size_t home = (size_t)s->hash & mask;
        /* Move s into the hole at i if its home is not in (i, j]. */
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

void kvp__ec_sset_clear(kvp__ec_sset_t *s)
{
    for (size_t i = 0; i < s->cap; i++)
        if (s->slots[i].key)
            kvp__ec_strfree(s->slots[i].val);
    kvp__ec_map_clear(s);
}

void kvp__ec_sset_cleanup(kvp__ec_sset_t *s)
{
    kvp__ec_sset_clear(s);
    kvp__ec_map_cleanup(s);
}

bool kvp__ec_sset_has(const kvp__ec_sset_t *s, const char *str)
{
    return kvp__ec_map_gets(s, str) != NULL;
}

kvp_status_t kvp__ec_sset_add(kvp__ec_sset_t *s, const char *str, bool *added_p)
{
    if (kvp__ec_sset_has(s, str)) {
        if (added_p)
            *added_p = false;
        return KVP_OK;
    }
    char *copy = kvp__ec_strdup(str);
    if (!copy)
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__ec_map_put(s, copy, strlen(copy), copy);
    if (st != KVP_OK) {
        kvp__ec_strfree(copy);
        return st;
    }
    if (added_p)
        *added_p = true;
    return KVP_OK;
}

void kvp__ec_sset_discard(kvp__ec_sset_t *s, const char *str)
{
    char *old = kvp__ec_map_del(s, str, strlen(str));
    kvp__ec_strfree(old);
}
