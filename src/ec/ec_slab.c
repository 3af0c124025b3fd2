/*
 * The receive slab's allocator and resident set: see ec_slab.h for the
 * model and the invariants.
 */
#include "ec/ec_slab.h"

#include <string.h>

#include "common/alloc.h"
#include "common/assert.h"

/* ---- allocator ------------------------------------------------------------ */

kvp_status_t kvp__ec_alloc_init(kvp__ec_alloc_t *a, uint64_t size)
{
    memset(a, 0, sizeof *a);
    a->size = size;
    if (kvp__grow_in((void **)&a->free, &a->cap_free, 1, sizeof *a->free, 16) != 0)
        return KVP_ERR_NO_MEMORY;
    a->free[0] = (kvp__ec_ext_t){0, size};
    a->n_free = 1;
    a->free_bytes = size;
    return KVP_OK;
}

void kvp__ec_alloc_cleanup(kvp__ec_alloc_t *a)
{
    if (a->free)
        kvp__free(a->free, a->cap_free * sizeof *a->free);
    memset(a, 0, sizeof *a);
}

uint64_t kvp__ec_alloc_round(uint64_t nbytes)
{
    if (nbytes == 0)
        return KVP__EC_SLAB_ALIGN;
    if (nbytes > UINT64_MAX - (KVP__EC_SLAB_ALIGN - 1))
        return 0;
    return (nbytes + KVP__EC_SLAB_ALIGN - 1) / KVP__EC_SLAB_ALIGN * KVP__EC_SLAB_ALIGN;
}

kvp_status_t kvp__ec_alloc_get(kvp__ec_alloc_t *a, uint64_t nbytes, kvp__ec_ext_t *ext_p)
{
    uint64_t size = kvp__ec_alloc_round(nbytes);
    if (size == 0 || size > a->free_bytes)
        return KVP_ERR_NO_SPACE;
    size_t i = 0;
    while (i < a->n_free && a->free[i].size < size)
        i++;
    if (i == a->n_free)
        return KVP_ERR_NO_SPACE;
    /* room for a free extent per allocated one, plus one, after this one */
    if (kvp__grow_in((void **)&a->free, &a->cap_free, a->n_used + 2, sizeof *a->free, 16) != 0)
        return KVP_ERR_NO_MEMORY;
    kvp__ec_ext_t *f = &a->free[i];
    *ext_p = (kvp__ec_ext_t){f->off, size};
    if (f->size == size) {
        memmove(f, f + 1, (a->n_free - i - 1) * sizeof *f);
        a->n_free--;
    } else {
        f->off += size;
        f->size -= size;
    }
    a->n_used++;
    a->free_bytes -= size;
    return KVP_OK;
}

void kvp__ec_alloc_put(kvp__ec_alloc_t *a, kvp__ec_ext_t ext)
{
    kvp__assert(a->n_used > 0 && ext.size > 0 && ext.off + ext.size <= a->size);
    /* i: the first free extent after ext */
    size_t lo = 0, hi = a->n_free;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a->free[mid].off < ext.off)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t i = lo;
    kvp__assert(i == a->n_free || ext.off + ext.size <= a->free[i].off);
    kvp__assert(i == 0 || a->free[i - 1].off + a->free[i - 1].size <= ext.off);
    bool join_prev = i > 0 && a->free[i - 1].off + a->free[i - 1].size == ext.off;
    bool join_next = i < a->n_free && ext.off + ext.size == a->free[i].off;
    if (join_prev && join_next) {
        a->free[i - 1].size += ext.size + a->free[i].size;
        memmove(&a->free[i], &a->free[i + 1], (a->n_free - i - 1) * sizeof *a->free);
        a->n_free--;
    } else if (join_prev) {
        a->free[i - 1].size += ext.size;
    } else if (join_next) {
        a->free[i].off = ext.off;
        a->free[i].size += ext.size;
    } else {
        /* surrounded by allocated extents (or the slab's ends): the gaps
         * among the other n_used - 1 extents number at most n_used, within
         * the capacity kvp__ec_alloc_get kept */
        kvp__assert(a->n_free < a->cap_free);
        memmove(&a->free[i + 1], &a->free[i], (a->n_free - i) * sizeof *a->free);
        a->free[i] = ext;
        a->n_free++;
    }
    a->n_used--;
    a->free_bytes += ext.size;
}

/* ---- resident set --------------------------------------------------------- */

void kvp__ec_resset_init(kvp__ec_resset_t *s)
{
    memset(s, 0, sizeof *s);
    kvp__strmap_init(&s->map);
    kvp__list_init(&s->lru);
    kvp__strmap_init(&s->reclaimed_set);
}

static void res_free(kvp__ec_res_t *e)
{
    kvp__strfree(e->hash);
    kvp__free(e, sizeof *e);
}

void kvp__ec_resset_cleanup(kvp__ec_resset_t *s)
{
    for (size_t i = 0; i < s->map.cap; i++)
        if (s->map.slots[i].key)
            res_free(s->map.slots[i].val);
    kvp__strmap_cleanup(&s->map);
    kvp__strmap_cleanup(&s->reclaimed_set);
    kvp__ec_strv_free(s->reclaimed, s->cap_reclaimed);
    memset(s, 0, sizeof *s);
}

kvp__ec_res_t *kvp__ec_resset_get(kvp__ec_resset_t *s, const char *hash)
{
    return kvp__strmap_gets(&s->map, hash);
}

bool kvp__ec_tensor_same(const kvp__ec_tensor_t *a, const kvp__ec_tensor_t *b)
{
    if (a->ndim != b->ndim || a->dtype != b->dtype || a->ndim > KVP__EC_MAX_NDIM)
        return false;
    for (uint32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

/* Puts e on the LRU's tail when the rule says it belongs there and it is
 * not there yet; takes it off when the rule says it does not. */
static void lru_sync(kvp__ec_resset_t *s, kvp__ec_res_t *e)
{
    bool want = !e->pinned && e->leases == 0;
    if (want && !kvp__list_linked(&e->lru))
        kvp__list_add_tail(&s->lru, &e->lru);
    else if (!want)
        kvp__list_del(&e->lru);
}

kvp__ec_res_t *kvp__ec_resset_insert(kvp__ec_resset_t *s, const char *hash, kvp__ec_ext_t ext,
                                     const kvp__ec_tensor_t *t, bool pinned)
{
    kvp__assert(!kvp__ec_resset_get(s, hash));
    kvp__ec_res_t *e = kvp__calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->hash = kvp__strdup(hash);
    if (!e->hash) {
        kvp__free(e, sizeof *e);
        return NULL;
    }
    e->hash_len = strlen(e->hash);
    if (kvp__strmap_put(&s->map, e->hash, e->hash_len, e) != KVP_OK) {
        res_free(e);
        return NULL;
    }
    e->ext = ext;
    e->t = *t;
    e->pinned = pinned;
    kvp__list_init(&e->lru);
    lru_sync(s, e);
    s->n++;
    s->bytes += ext.size;
    return e;
}

void kvp__ec_res_acquire(kvp__ec_resset_t *s, kvp__ec_res_t *e)
{
    e->leases++;
    lru_sync(s, e);
}

void kvp__ec_res_release(kvp__ec_resset_t *s, kvp__ec_res_t *e)
{
    kvp__assert(e->leases > 0);
    e->leases--;
    lru_sync(s, e);
}

void kvp__ec_res_pin(kvp__ec_resset_t *s, kvp__ec_res_t *e)
{
    e->pinned = true;
    lru_sync(s, e);
}

void kvp__ec_res_retire(kvp__ec_resset_t *s, kvp__ec_res_t *e)
{
    e->pinned = false;
    lru_sync(s, e);
}

int kvp__ec_resset_evict_lru(kvp__ec_resset_t *s, kvp__ec_alloc_t *a)
{
    kvp__ec_res_t *e = KVP_LIST_FIRST_ENTRY(&s->lru, kvp__ec_res_t, lru);
    if (!e)
        return 0;
    kvp__assert(!e->pinned && e->leases == 0);
    bool seen = kvp__strmap_get(&s->reclaimed_set, e->hash, e->hash_len) != NULL;
    if (!seen) {
        if (kvp__grow_in((void **)&s->reclaimed, &s->cap_reclaimed, s->n_reclaimed + 1, sizeof *s->reclaimed,
                         8) != 0)
            return KVP_ERR_NO_MEMORY;
        /* the entry's own string moves to the reclaimed list */
        if (kvp__strmap_put(&s->reclaimed_set, e->hash, e->hash_len, e->hash) != KVP_OK)
            return KVP_ERR_NO_MEMORY;
    }
    kvp__list_del(&e->lru);
    kvp__strmap_del(&s->map, e->hash, e->hash_len);
    kvp__ec_alloc_put(a, e->ext);
    s->n--;
    s->bytes -= e->ext.size;
    if (!seen) {
        s->reclaimed[s->n_reclaimed++] = e->hash;
        e->hash = NULL;
    }
    res_free(e);
    return 1;
}

kvp_status_t kvp__ec_resset_drain_reclaimed(kvp__ec_resset_t *s, char ***v_p, size_t *n_p)
{
    *v_p = NULL;
    *n_p = 0;
    if (s->n_reclaimed == 0)
        return KVP_OK;
    char **v = kvp__malloc(s->n_reclaimed * sizeof *v);
    if (!v)
        return KVP_ERR_NO_MEMORY;
    memcpy(v, s->reclaimed, s->n_reclaimed * sizeof *v);
    *v_p = v;
    *n_p = s->n_reclaimed;
    memset(s->reclaimed, 0, s->n_reclaimed * sizeof *s->reclaimed);
    s->n_reclaimed = 0;
    kvp__strmap_clear(&s->reclaimed_set);
    return KVP_OK;
}
