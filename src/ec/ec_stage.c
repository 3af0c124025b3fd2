/*
 * The producer's staging slab (ec_stage.h).
 */
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "common/alloc.h"
#include "common/log.h"
#include "ec/ec_stage.h"
#include "store/provider.h"

struct kvp__ec_stage {
    pthread_mutex_t mu;
    kvp__mem_t mem; /* base NULL: no slab */
    kvp__ec_alloc_t alloc;
    uint64_t heap_bytes, copies, fallbacks;
};

kvp_status_t kvp__ec_stage_create(uint64_t capacity, kvp__ec_stage_t **s_p)
{
    kvp__ec_stage_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    pthread_mutex_init(&s->mu, NULL);
    s->mem.fd = -1;
    /* Ordinary pages with the THP advice, as the receive slab: never
     * hugetlbfs pages, whose reservation the pool's arena may need. */
    if (capacity > 0 && capacity <= SIZE_MAX &&
        kvp__mem_map(KVP_MEM_ANON, KVP_HUGE_OFF, (size_t)capacity, 0, &s->mem) != KVP_OK) {
        kvp_warn("ec producer: no %llu-byte staging slab; encoder outputs are copied to the heap",
                 (unsigned long long)capacity);
        memset(&s->mem, 0, sizeof s->mem);
        s->mem.fd = -1;
    }
    if (s->mem.base) {
        (void)madvise(s->mem.base, s->mem.size, MADV_HUGEPAGE);
        if (kvp__ec_alloc_init(&s->alloc, capacity) != KVP_OK) {
            kvp__mem_unmap(&s->mem);
            pthread_mutex_destroy(&s->mu);
            kvp__free(s, sizeof *s);
            return KVP_ERR_NO_MEMORY;
        }
    }
    *s_p = s;
    return KVP_OK;
}

void kvp__ec_stage_destroy(kvp__ec_stage_t *s)
{
    if (!s)
        return;
    if (s->mem.base) {
        kvp__ec_alloc_cleanup(&s->alloc);
        kvp__mem_unmap(&s->mem);
    }
    pthread_mutex_destroy(&s->mu);
    kvp__free(s, sizeof *s);
}

kvp_status_t kvp__ec_stage_get(kvp__ec_stage_t *s, size_t nbytes, kvp__ec_stage_region_t *r)
{
    memset(r, 0, sizeof *r);
    r->nbytes = nbytes;
    if (nbytes == 0)
        return KVP_OK; /* nothing to hold */
    pthread_mutex_lock(&s->mu);
    if (s->mem.base && kvp__ec_alloc_get(&s->alloc, nbytes, &r->ext) == KVP_OK) {
        r->data = (uint8_t *)s->mem.base + r->ext.off;
        s->copies++;
        pthread_mutex_unlock(&s->mu);
        return KVP_OK;
    }
    pthread_mutex_unlock(&s->mu);
    r->data = kvp__malloc(nbytes);
    if (!r->data)
        return KVP_ERR_NO_MEMORY;
    r->heap = true;
    pthread_mutex_lock(&s->mu);
    s->copies++;
    s->fallbacks++;
    s->heap_bytes += nbytes;
    pthread_mutex_unlock(&s->mu);
    return KVP_OK;
}

void kvp__ec_stage_put(kvp__ec_stage_t *s, kvp__ec_stage_region_t *r)
{
    if (!r->data)
        return;
    pthread_mutex_lock(&s->mu);
    if (r->heap)
        s->heap_bytes -= r->nbytes;
    else
        kvp__ec_alloc_put(&s->alloc, r->ext);
    pthread_mutex_unlock(&s->mu);
    if (r->heap)
        kvp__free(r->data, r->nbytes);
    memset(r, 0, sizeof *r);
}

void kvp__ec_stage_stats(kvp__ec_stage_t *s, kvp__ec_stage_stats_t *st)
{
    pthread_mutex_lock(&s->mu);
    st->capacity = s->mem.base ? s->alloc.size : 0;
    st->bytes_staged = s->mem.base ? s->alloc.size - s->alloc.free_bytes : 0;
    st->heap_bytes = s->heap_bytes;
    st->copies = s->copies;
    st->fallbacks = s->fallbacks;
    pthread_mutex_unlock(&s->mu);
}
