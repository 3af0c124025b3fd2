/*
 * The storage engine's object lifecycle: create/destroy, two-phase put,
 * leased reads, remove, pin, remove_all, reservation expiry and stats.
 *
 * Life of an object:
 *   reserve  -> arena space allocated, object built but not indexed
 *               (invisible to every reader; reclaimed after put_timeout
 *               unless its owner holds it)
 *   commit   -> indexed under its shard lock: visible, counted `committed`
 *   get      -> refs+1 under the shard lock (a read lease), copy, refs-1
 *   leave    -> unlinked under the shard lock by evict/remove/remove_all,
 *               counted there; the arena space is freed when the last
 *               reference goes (immediately, or when the copy in flight ends)
 */
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/assert.h"
#include "common/clock.h"
#include "common/log.h"
#include "store/store_int.h"

#define DEFAULT_SHARDS 256u

static uint64_t default_now(void *arg)
{
    (void)arg;
    return kvp__now_ns();
}

void kvp__store_params_default(kvp__store_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->high_watermark = 0.95;
    p->low_watermark = 0.90;
    p->put_timeout_ns = 30ull * 1000000000ull;
    p->shards = DEFAULT_SHARDS;
    p->mem_kind = KVP_MEM_ANON;
    p->huge = KVP_HUGE_AUTO;
}

static uint64_t now_ns(kvp__store_t *s) { return s->params.now_ns(s->params.now_arg); }

kvp_status_t kvp__store_create(const kvp__store_params_t *params, kvp__store_t **store_p)
{
    kvp_status_t st;
    *store_p = NULL;
    if (params->capacity < 4096 || !(params->low_watermark > 0) ||
        !(params->low_watermark < params->high_watermark) || !(params->high_watermark <= 1.0)) {
        kvp_error("store: invalid parameters (capacity %llu, watermarks %.3f/%.3f)",
                  (unsigned long long)params->capacity, params->low_watermark,
                  params->high_watermark);
        return KVP_ERR_BAD_OPTION;
    }
    kvp__store_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    s->params = *params;
    kvp__objslab_init(&s->slab);
    if (!s->params.now_ns)
        s->params.now_ns = default_now;
    uint32_t n = s->params.shards ? s->params.shards : DEFAULT_SHARDS;
    if (n & (n - 1)) {
        kvp_error("store: shards must be a power of two (got %u)", n);
        st = KVP_ERR_BAD_OPTION;
        goto err_free;
    }
    s->nshards = n;
    s->shard_shift = 64 - (uint32_t)__builtin_ctz(n);

    st = kvp__mem_map(params->mem_kind, params->huge, params->capacity, params->prefault, &s->mem);
    if (st != KVP_OK)
        goto err_free;
    s->base = s->mem.base;
    if (kvp__tlsf_init(&s->tlsf, s->mem.base, params->capacity) != 0) {
        st = KVP_ERR_BAD_OPTION;
        goto err_unmap;
    }
    s->high_bytes = (uint64_t)((double)s->tlsf.size * params->high_watermark);
    s->low_bytes = (uint64_t)((double)s->tlsf.size * params->low_watermark);
    st = kvp__shards_init(s);
    if (st != KVP_OK)
        goto err_unmap;
    pthread_mutex_init(&s->alloc_lock, NULL);
    pthread_mutex_init(&s->evict_lock, NULL);
    pthread_mutex_init(&s->resv_lock, NULL);
    kvp__list_init(&s->resv);
    atomic_init(&s->resv_oldest_ns, UINT64_MAX);
    kvp_info("store: arena %llu bytes (%s%s), %u shards", (unsigned long long)s->mem.size,
             s->mem.kind == KVP_MEM_MEMFD ? "memfd" : "anonymous", s->mem.huge ? ", hugetlb" : "",
             s->nshards);
    *store_p = s;
    return KVP_OK;

err_unmap:
    kvp__mem_unmap(&s->mem);
err_free:
    kvp__free(s, sizeof *s);
    return st;
}

void kvp__store_destroy(kvp__store_t *s)
{
    if (!s)
        return;
    /* Reservations still open belong to owners that never finished; their
     * objects are freed here (the arena goes away with them). */
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &s->resv)
        kvp__free(KVP_CONTAINER_OF(n, kvp__resv_t, link), sizeof(kvp__resv_t)); /* its object goes with the slab */
    kvp__shards_destroy(s);
    kvp__objslab_destroy(&s->slab);
    pthread_mutex_destroy(&s->alloc_lock);
    pthread_mutex_destroy(&s->evict_lock);
    pthread_mutex_destroy(&s->resv_lock);
    kvp__mem_unmap(&s->mem);
    kvp__free(s, sizeof *s);
}

uint64_t kvp__store_max_value(const kvp__store_t *s)
{
    uint64_t m = s->tlsf.size - 2 * KVP_TLSF_OVERHEAD;
    return m < KVP_VALUE_MAX ? m : KVP_VALUE_MAX;
}

static void arena_free(kvp__store_t *s, uint64_t off)
{
    pthread_mutex_lock(&s->alloc_lock);
    kvp__tlsf_free(&s->tlsf, s->base + off);
    atomic_store_explicit(&s->used_bytes, s->tlsf.used, memory_order_relaxed);
    pthread_mutex_unlock(&s->alloc_lock);
}

void kvp__obj_unref(kvp__store_t *s, kvp__obj_t *o)
{
    unsigned long long prev = (unsigned long long)atomic_fetch_sub_explicit(&o->refs, 1, memory_order_acq_rel);
    kvp__assert(prev >= 1); /* no unref without its ref */
    if (prev == 1) {
        arena_free(s, o->off);
        kvp__obj_free(s, o);
    }
}

static void *arena_try_alloc(kvp__store_t *s, uint64_t size)
{
    pthread_mutex_lock(&s->alloc_lock);
    void *p = kvp__tlsf_alloc(&s->tlsf, size);
    atomic_store_explicit(&s->used_bytes, s->tlsf.used, memory_order_relaxed);
    pthread_mutex_unlock(&s->alloc_lock);
    return p;
}

/* Space for `size` value bytes, evicting as the watermarks say; NULL when
 * even evicting everything evictable cannot make it fit.  no_evict: only
 * free space below the high watermark, NULL rather than evict. */
static void *arena_alloc(kvp__store_t *s, uint64_t size, int no_evict)
{
    uint64_t need = kvp__tlsf_footprint(size);
    if (no_evict)
        return atomic_load(&s->used_bytes) + need > s->high_bytes ? NULL : arena_try_alloc(s, size);
    if (atomic_load(&s->used_bytes) + need > s->high_bytes)
        (void)kvp__evict_until(s, need, s->low_bytes);
    for (;;) {
        void *p = arena_try_alloc(s, size);
        if (p)
            return p;
        /* Full or fragmented: evict below the current usage and retry. */
        uint64_t used = atomic_load(&s->used_bytes);
        uint64_t target = used > need ? used - need : 0;
        if (!kvp__evict_until(s, 0, target))
            return arena_try_alloc(s, size);
    }
}

static void resv_unlink(kvp__store_t *s, kvp__resv_t *r)
{
    if (!kvp__list_linked(&r->link))
        return;
    kvp__assert(s->resv_count > 0);
    kvp__list_del(&r->link);
    s->resv_count--;
    kvp__resv_t *oldest = KVP_LIST_FIRST_ENTRY(&s->resv, kvp__resv_t, link);
    atomic_store(&s->resv_oldest_ns, oldest ? oldest->deadline_ns : UINT64_MAX);
}

uint64_t kvp__store_reap(kvp__store_t *s)
{
    uint64_t now = now_ns(s), n = 0;
    pthread_mutex_lock(&s->resv_lock);
    /* Deadlines are creation time + one constant timeout, so the list is in
     * deadline order: stop at the first reservation still in time. */
    KVP_LIST_FOR_EACH_ENTRY_SAFE(r, next, &s->resv, kvp__resv_t, link) {
        if (r->deadline_ns > now)
            break;
        if (!r->held) {
            resv_unlink(s, r);
            r->expired = 1;
            s->expired_put++;
            arena_free(s, r->obj->off);
            n++;
        }
    }
    pthread_mutex_unlock(&s->resv_lock);
    if (n)
        kvp_warn("store: reclaimed %llu put reservation(s) not committed within put_timeout",
                 (unsigned long long)n);
    return n;
}

kvp_status_t kvp__store_reserve(kvp__store_t *s, const void *key, uint32_t klen, uint64_t size,
                                unsigned flags, kvp__resv_t **resv_p, void **dst_p, uint32_t *flags_p)
{
    *resv_p = NULL;
    *dst_p = NULL;
    *flags_p = 0;
    uint64_t h = kvp__key_hash(key, klen);
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    if (kvp__do_find(sh, h, key, klen)) {
        sh->put_existed++;
        kvp__spin_unlock(&sh->lock);
        *flags_p = KVP_RESULT_EXISTED;
        return KVP_OK;
    }
    kvp__spin_unlock(&sh->lock);

    if (atomic_load_explicit(&s->resv_oldest_ns, memory_order_relaxed) <= now_ns(s))
        (void)kvp__store_reap(s);

    kvp__resv_t *r = kvp__calloc(1, sizeof *r);
    kvp__obj_t *o = kvp__obj_alloc(s, klen);
    if (!r || !o) {
        kvp__free(r, sizeof *r);
        if (o)
            kvp__obj_free(s, o);
        kvp_error("store: out of memory reserving a put of %u-byte key", klen);
        return KVP_ERR_NO_MEMORY;
    }
    void *dst = arena_alloc(s, size, (flags & KVP_RESV_NO_EVICT) != 0);
    if (!dst) {
        kvp__free(r, sizeof *r);
        if (o)
            kvp__obj_free(s, o);
        if (flags & KVP_RESV_NO_EVICT)
            return KVP_ERR_NO_SPACE;
        atomic_fetch_add(&s->put_no_space, 1);
        kvp_debug("store: no space for a %llu-byte value", (unsigned long long)size);
        return KVP_ERR_NO_SPACE;
    }
    kvp__list_init(&r->link);
    memset(o, 0, sizeof *o);
    atomic_init(&o->refs, 1);
    o->off = (uint64_t)((char *)dst - s->base);
    o->size = (uint32_t)size;
    o->klen = (uint16_t)klen;
    memcpy(o->key, key, klen);
    r->obj = o;
    r->hash = h;
    r->held = (flags & KVP_RESV_HELD) != 0;
    r->deadline_ns = now_ns(s) + s->params.put_timeout_ns;

    pthread_mutex_lock(&s->resv_lock);
    kvp__list_add_tail(&s->resv, &r->link);
    s->resv_count++;
    atomic_store(&s->resv_oldest_ns, KVP_LIST_FIRST_ENTRY(&s->resv, kvp__resv_t, link)->deadline_ns);
    pthread_mutex_unlock(&s->resv_lock);

    *resv_p = r;
    *dst_p = dst;
    return KVP_OK;
}

void kvp__store_resv_hold(kvp__store_t *s, kvp__resv_t *r, int held)
{
    pthread_mutex_lock(&s->resv_lock);
    r->held = held;
    pthread_mutex_unlock(&s->resv_lock);
}

kvp_status_t kvp__store_commit(kvp__store_t *s, kvp__resv_t *r, uint32_t *flags_p)
{
    *flags_p = 0;
    kvp__obj_t *o = r->obj;
    pthread_mutex_lock(&s->resv_lock);
    int expired = r->expired;
    resv_unlink(s, r);
    pthread_mutex_unlock(&s->resv_lock);
    kvp_status_t st = KVP_OK;
    if (expired) {
        kvp_warn("store: commit of a reservation reclaimed after put_timeout");
        kvp__obj_free(s, o);
        st = KVP_ERR_EXPIRED;
        goto out;
    }
    kvp__shard_t *sh = kvp__shard_of(s, r->hash);
    kvp__spin_lock(&sh->lock);
    if (kvp__do_find(sh, r->hash, o->key, o->klen)) {
        /* Another writer committed the same key first: identical prompts
         * race to store identical blocks; the first one wins. */
        sh->put_existed++;
        kvp__spin_unlock(&sh->lock);
        arena_free(s, o->off);
        kvp__obj_free(s, o);
        *flags_p = KVP_RESULT_EXISTED;
        goto out;
    }
    kvp__do_insert(sh, o, r->hash);
    sh->committed++;
    kvp__spin_unlock(&sh->lock);
out:
    kvp__free(r, sizeof *r);
    return st;
}

void kvp__store_abort(kvp__store_t *s, kvp__resv_t *r)
{
    pthread_mutex_lock(&s->resv_lock);
    int expired = r->expired;
    resv_unlink(s, r);
    pthread_mutex_unlock(&s->resv_lock);
    if (!expired)
        arena_free(s, r->obj->off);
    kvp__obj_free(s, r->obj);
    kvp__free(r, sizeof *r);
}

void kvp__store_expire(kvp__store_t *s, kvp__resv_t *r)
{
    pthread_mutex_lock(&s->resv_lock);
    if (!r->expired)
        s->expired_put++;
    pthread_mutex_unlock(&s->resv_lock);
    kvp__store_abort(s, r);
}

kvp_status_t kvp__store_put(kvp__store_t *s, const void *key, uint32_t klen, const kvp_sgl_t *val,
                            uint64_t total, uint32_t *flags_p)
{
    kvp__resv_t *r;
    void *dst;
    kvp_status_t st = kvp__store_reserve(s, key, klen, total, KVP_RESV_HELD, &r, &dst, flags_p);
    if (st != KVP_OK || !r)
        return st;
    char *p = dst;
    for (uint32_t i = 0; i < val->iovcnt; i++) {
        memcpy(p, val->iov[i].base, val->iov[i].len);
        p += val->iov[i].len;
    }
    return kvp__store_commit(s, r, flags_p);
}

int kvp__store_exists(kvp__store_t *s, const void *key, uint32_t klen)
{
    uint64_t h = kvp__key_hash(key, klen);
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    int found = kvp__do_find(sh, h, key, klen) != NULL;
    kvp__spin_unlock(&sh->lock);
    return found;
}

/*
 * Batch lookups hide memory latency with a three-stage software pipeline:
 *   stage A (key i):        hash the key, prefetch its bucket slot;
 *   stage B (key i - D):    under the shard lock, read the slot and prefetch
 *                           the first object of the chain (header and key);
 *   stage C (key i - 2D):   the real lookup, under the shard lock.
 * So the two dependent cache misses of a lookup (slot, then object) of many
 * keys overlap instead of queueing.  Stage A reads the shard's table pointer
 * without the lock (atomically); a stale pointer only prefetches a useless
 * line and is never dereferenced.  Stage B costs one extra uncontended lock
 * pair per key, far cheaper than the miss it hides.
 */
#define PF_DIST 12
#define PF_RING 32 /* > 2 * PF_DIST: stage A must not overwrite what stage C reads */

static inline void prefetch_slot(kvp__store_t *s, uint64_t h)
{
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__obj_t **b = __atomic_load_n(&sh->buckets, __ATOMIC_RELAXED);
    uint64_t nb = __atomic_load_n(&sh->nbuckets, __ATOMIC_RELAXED);
    __builtin_prefetch(&b[h & (nb - 1)]);
}

static inline void prefetch_obj(kvp__store_t *s, uint64_t h)
{
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    const char *o = (const char *)sh->buckets[h & (sh->nbuckets - 1)];
    if (o) {
        __builtin_prefetch(o);
        __builtin_prefetch(o + 64);
        __builtin_prefetch(o + 128);
    }
    kvp__spin_unlock(&sh->lock);
}

/* A batch lookup (exists, prefix) refreshes the recency of what it finds:
 * a block the KV lookup service just found is about to be loaded, so it
 * should be the last to be evicted (issue 13).  No lease is taken, so
 * eviction is never blocked by a lookup.  The refresh is a second-chance
 * mark (KVP_OBJ_LOOKED, set in the object line the find has just read;
 * evict.c moves a marked tail to the head instead of evicting it), not an
 * LRU splice: a splice writes the two neighbours' lines, which a batch has
 * not prefetched, and halved exists throughput (kvpool bench --op exists). */
static int exists_hashed(kvp__store_t *s, uint64_t h, const kvp_key_t *k)
{
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    kvp__obj_t *o = kvp__do_find(sh, h, k->data, k->len);
    if (o && !(o->flags & KVP_OBJ_LOOKED))
        o->flags |= KVP_OBJ_LOOKED;
    kvp__spin_unlock(&sh->lock);
    return o != NULL;
}

/* Runs the pipeline over keys[0..n); stops at the first absent key when
 * `stop_at_miss` (prefix) and returns its index; otherwise fills present[]
 * and returns n. */
static size_t lookup_batch(kvp__store_t *s, const kvp_key_t *keys, size_t n, uint8_t *present,
                           int stop_at_miss)
{
    uint64_t h[PF_RING];
    for (size_t i = 0; i < n + 2 * PF_DIST; i++) {
        if (i < n) {
            if (i + PF_DIST < n)
                __builtin_prefetch(keys[i + PF_DIST].data);
            h[i % PF_RING] = kvp__key_hash(keys[i].data, keys[i].len);
            prefetch_slot(s, h[i % PF_RING]);
        }
        if (i >= PF_DIST && i - PF_DIST < n)
            prefetch_obj(s, h[(i - PF_DIST) % PF_RING]);
        if (i >= 2 * PF_DIST) {
            size_t j = i - 2 * PF_DIST;
            int found = exists_hashed(s, h[j % PF_RING], &keys[j]);
            if (stop_at_miss && !found)
                return j;
            if (present)
                present[j] = (uint8_t)found;
        }
    }
    return n;
}

void kvp__store_exists_batch(kvp__store_t *s, const kvp_key_t *keys, size_t n, uint8_t *present)
{
    (void)lookup_batch(s, keys, n, present, 0);
}

size_t kvp__store_prefix(kvp__store_t *s, const kvp_key_t *keys, size_t n)
{
    return lookup_batch(s, keys, n, NULL, 1);
}

kvp_status_t kvp__store_acquire(kvp__store_t *s, const void *key, uint32_t klen,
                                const void **data_p, uint64_t *size_p, kvp__lease_t **lease_p)
{
    uint64_t h = kvp__key_hash(key, klen);
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    kvp__obj_t *o = kvp__do_find(sh, h, key, klen);
    if (!o) {
        sh->misses++;
        kvp__spin_unlock(&sh->lock);
        *data_p = NULL;
        *size_p = 0;
        *lease_p = NULL;
        return KVP_ERR_NOT_FOUND;
    }
    if (atomic_load_explicit(&o->refs, memory_order_relaxed) >= KVP_LEASES_MAX) {
        /* (leases are only taken under the shard lock: the count cannot
         * pass this between the check and the add) */
        kvp__spin_unlock(&sh->lock);
        *data_p = NULL;
        *size_p = 0;
        *lease_p = NULL;
        kvp_warn("store: an object holds %u read leases; refusing more", KVP_LEASES_MAX);
        return KVP_ERR_BUSY;
    }
    sh->hits++;
    atomic_fetch_add_explicit(&o->refs, 1, memory_order_acq_rel);
    kvp__do_lru_touch(sh, o);
    kvp__spin_unlock(&sh->lock);
    atomic_fetch_add_explicit(&s->leases, 1, memory_order_relaxed);
    *data_p = s->base + o->off;
    *size_p = o->size;
    *lease_p = o;
    return KVP_OK;
}

void kvp__store_release(kvp__store_t *s, kvp__lease_t *lease)
{
    if (!lease)
        return;
    atomic_fetch_sub_explicit(&s->leases, 1, memory_order_relaxed);
    kvp__obj_unref(s, lease);
}

void kvp__store_arena(kvp__store_t *s, void **base_p, size_t *len_p)
{
    *base_p = s->mem.base;
    *len_p = s->mem.size;
}

int kvp__store_arena_fd(const kvp__store_t *s) { return s->mem.fd; }

kvp_status_t kvp__store_get(kvp__store_t *s, const void *key, uint32_t klen, const kvp_sgl_t *dst,
                            uint64_t dst_cap, uint64_t *size_p)
{
    const void *data;
    kvp__lease_t *lease;
    kvp_status_t st = kvp__store_acquire(s, key, klen, &data, size_p, &lease);
    if (st != KVP_OK)
        return st;
    if (*size_p > dst_cap) {
        kvp__store_release(s, lease);
        return KVP_ERR_BUFFER_TOO_SMALL;
    }
    const char *src = data;
    uint64_t left = *size_p;
    for (uint32_t i = 0; i < dst->iovcnt && left; i++) {
        size_t n = dst->iov[i].len < left ? dst->iov[i].len : (size_t)left;
        memcpy(dst->iov[i].base, src, n);
        src += n;
        left -= n;
    }
    kvp__store_release(s, lease);
    return KVP_OK;
}

kvp_status_t kvp__store_remove(kvp__store_t *s, const void *key, uint32_t klen)
{
    uint64_t h = kvp__key_hash(key, klen);
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    kvp__obj_t *o = kvp__do_find(sh, h, key, klen);
    if (o) {
        kvp__do_unlink(sh, o, h);
        sh->removed++;
    }
    kvp__spin_unlock(&sh->lock);
    if (!o)
        return KVP_ERR_NOT_FOUND;
    kvp__obj_unref(s, o);
    return KVP_OK;
}

kvp_status_t kvp__store_pin(kvp__store_t *s, const void *key, uint32_t klen, int pin)
{
    uint64_t h = kvp__key_hash(key, klen);
    kvp__shard_t *sh = kvp__shard_of(s, h);
    kvp__spin_lock(&sh->lock);
    kvp__obj_t *o = kvp__do_find(sh, h, key, klen);
    if (o && pin && !(o->flags & KVP_OBJ_PINNED)) {
        kvp__do_lru_remove(sh, o);
        o->flags |= KVP_OBJ_PINNED;
        sh->pinned++;
    } else if (o && !pin && (o->flags & KVP_OBJ_PINNED)) {
        o->flags &= (uint8_t)~KVP_OBJ_PINNED;
        sh->pinned--;
        kvp__do_lru_push(sh, o);
    }
    kvp__spin_unlock(&sh->lock);
    return o ? KVP_OK : KVP_ERR_NOT_FOUND;
}

kvp_status_t kvp__store_set_filter(kvp__store_t *s, void *mem, uint64_t nblocks)
{
    if (!s || !mem || !nblocks || s->filter.c)
        return KVP_ERR_INVALID_ARG;
    for (uint32_t i = 0; i < s->nshards; i++)
        if (s->shards[i].count)
            return KVP_ERR_INVALID_ARG;
    kvp__cfilter_init(&s->filter, mem, nblocks);
    for (uint32_t i = 0; i < s->nshards; i++)
        s->shards[i].filter = &s->filter;
    return KVP_OK;
}

const kvp__cfilter_t *kvp__store_filter(const kvp__store_t *s) { return &s->filter; }

uint64_t kvp__store_remove_all(kvp__store_t *s)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < s->nshards; i++) {
        kvp__shard_t *sh = &s->shards[i];
        kvp__obj_t *victims = NULL;
        kvp__spin_lock(&sh->lock);
        for (uint64_t b = 0; b < sh->nbuckets; b++) {
            kvp__obj_t *o = sh->buckets[b];
            while (o) {
                kvp__obj_t *next = o->hnext;
                if (sh->filter)
                    kvp__cfilter_del(sh->filter, kvp__key_hash(o->key, o->klen));
                o->hnext = victims;
                victims = o;
                o = next;
            }
            sh->buckets[b] = NULL;
        }
        sh->reset += sh->count;
        total += sh->count;
        sh->count = 0;
        sh->live_bytes = 0;
        sh->pinned = 0;
        kvp__list_init(&sh->lru);
        kvp__spin_unlock(&sh->lock);
        /* Objects mid-copy keep their lease; they are freed when it ends. */
        while (victims) {
            kvp__obj_t *next = victims->hnext;
            kvp__obj_unref(s, victims);
            victims = next;
        }
    }
    return total;
}

void kvp__store_stats(kvp__store_t *s, kvp_pool_stats_t *st)
{
    (void)kvp__store_reap(s);
    memset(st, 0, sizeof *st);
    for (uint32_t i = 0; i < s->nshards; i++)
        kvp__spin_lock(&s->shards[i].lock);
    for (uint32_t i = 0; i < s->nshards; i++) {
        kvp__shard_t *sh = &s->shards[i];
        st->live += sh->count;
        st->committed += sh->committed;
        st->evicted += sh->evicted;
        st->removed += sh->removed;
        st->reset += sh->reset;
        st->live_bytes += sh->live_bytes;
        st->pinned += sh->pinned;
        st->put_existed += sh->put_existed;
        st->get_hits += sh->hits;
        st->get_misses += sh->misses;
        st->evicted_bytes += sh->evicted_bytes;
        st->index_bytes += sh->index_bytes;
    }
    /* Read while every shard is locked: objects enter the index after their
     * space is allocated and leave it before it is freed, so this snapshot
     * always has live_bytes <= used_bytes. */
    st->used_bytes = atomic_load(&s->used_bytes);
    st->leased = atomic_load(&s->leases);
    for (uint32_t i = s->nshards; i-- > 0;)
        kvp__spin_unlock(&s->shards[i].lock);
    /* Index memory: bucket arrays (per shard), the shard table, and every
     * slab chunk the objects live in (whole chunks, free slots included). */
    st->index_bytes += sizeof(kvp__shard_t) * s->nshards + kvp__objslab_bytes(&s->slab);
    st->capacity_bytes = s->tlsf.size;
    st->high_watermark_bytes = s->high_bytes;
    st->low_watermark_bytes = s->low_bytes;
    st->put_no_space = atomic_load(&s->put_no_space);
    pthread_mutex_lock(&s->resv_lock);
    st->reserved = s->resv_count;
    st->expired_put = s->expired_put;
    pthread_mutex_unlock(&s->resv_lock);
}

kvp_status_t kvp__store_check(kvp__store_t *s)
{
    pthread_mutex_lock(&s->alloc_lock);
    int rc = kvp__tlsf_check(&s->tlsf);
    pthread_mutex_unlock(&s->alloc_lock);
    if (rc != 0) {
        kvp_error("store: allocator invariant %d broken", rc);
        return KVP_ERR_INTERNAL;
    }
    kvp_pool_stats_t st;
    kvp__store_stats(s, &st);
    if (st.committed != st.live + st.evicted + st.removed + st.reset) {
        kvp_error("store: accounting identity broken");
        return KVP_ERR_INTERNAL;
    }
    return KVP_OK;
}
