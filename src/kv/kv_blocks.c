#include "kv/kv_blocks.h"

#include <string.h>

#include "common/alloc.h"

static size_t btuple_size(uint32_t groups)
{
    return sizeof(kvp__kv_btuple_t) + (size_t)groups * sizeof(kvp__kv_glist_t);
}

kvp_status_t kvp__kv_btuple_copy(const kvp_kv_blocks_t *b, kvp__kv_btuple_t **t_p)
{
    *t_p = NULL;
    if (!b || b->num_groups == 0)
        return KVP_OK;
    kvp__kv_btuple_t *t = kvp__calloc(1, btuple_size(b->num_groups));
    if (!t)
        return KVP_ERR_NO_MEMORY;
    t->refs = 1;
    t->num_groups = b->num_groups;
    for (uint32_t g = 0; g < b->num_groups; g++) {
        size_t n = b->groups[g].n;
        if (n == 0)
            continue;
        t->g[g].ids = kvp__malloc(n * sizeof(int64_t));
        if (!t->g[g].ids) {
            kvp__kv_btuple_unref(t);
            return KVP_ERR_NO_MEMORY;
        }
        memcpy(t->g[g].ids, b->groups[g].ids, n * sizeof(int64_t));
        t->g[g].n = t->g[g].cap = n;
    }
    *t_p = t;
    return KVP_OK;
}

void kvp__kv_btuple_unref(kvp__kv_btuple_t *t)
{
    if (!t || --t->refs > 0)
        return;
    for (uint32_t g = 0; g < t->num_groups; g++)
        if (t->g[g].ids)
            kvp__free(t->g[g].ids, t->g[g].cap * sizeof(int64_t));
    kvp__free(t, btuple_size(t->num_groups));
}

kvp_status_t kvp__kv_btuple_extend(kvp__kv_btuple_t *t, const kvp_kv_blocks_t *b)
{
    for (uint32_t g = 0; g < b->num_groups && g < t->num_groups; g++) {
        kvp__kv_glist_t *l = &t->g[g];
        size_t add = b->groups[g].n;
        if (add == 0)
            continue;
        int64_t *ni = kvp__grow(l->ids, &l->cap, l->n + add, sizeof *ni, 8);
        if (!ni)
            return KVP_ERR_NO_MEMORY;
        l->ids = ni;
        memcpy(l->ids + l->n, b->groups[g].ids, add * sizeof(int64_t));
        l->n += add;
    }
    return KVP_OK;
}

size_t kvp__kv_btuple_total(const kvp__kv_btuple_t *t)
{
    size_t n = 0;
    for (uint32_t g = 0; t && g < t->num_groups; g++)
        n += t->g[g].n;
    return n;
}

kvp_status_t kvp__kv_tokens_new(const int64_t *v, size_t n, kvp__kv_tokens_t **t_p)
{
    *t_p = NULL;
    if (n == 0)
        return KVP_OK;
    kvp__kv_tokens_t *t = kvp__malloc(sizeof *t + n * sizeof(int64_t));
    if (!t)
        return KVP_ERR_NO_MEMORY;
    t->refs = 1;
    t->n = n;
    memcpy(t->v, v, n * sizeof(int64_t));
    *t_p = t;
    return KVP_OK;
}

void kvp__kv_tokens_unref(kvp__kv_tokens_t *t)
{
    if (!t || --t->refs > 0)
        return;
    kvp__free(t, sizeof *t + t->n * sizeof(int64_t));
}
