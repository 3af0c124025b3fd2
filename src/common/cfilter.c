#include "common/cfilter.h"

#include <string.h>

#include "common/mix.h"

/* The key's block and its KVP_CF_K counters in it.  The hash is mixed
 * first: the store's own hash picks its shard and bucket by its top and
 * low bits, and the filter should not see the same split. */
static _Atomic uint8_t *locate(const kvp__cfilter_t *f, uint64_t h, unsigned pos[KVP_CF_K])
{
    uint64_t g = kvp__mix64(h);
    uint64_t block = (uint64_t)(((unsigned __int128)(g >> 32) * f->nblocks) >> 32);
    for (unsigned i = 0; i < KVP_CF_K; i++)
        pos[i] = (unsigned)(g >> (6 * i)) & (KVP_CF_BLOCK - 1);
    return f->c + block * KVP_CF_BLOCK;
}

void kvp__cfilter_init(kvp__cfilter_t *f, void *mem, uint64_t nblocks)
{
    memset(f, 0, sizeof *f);
    if (!mem || !nblocks)
        return;
    memset(mem, 0, (size_t)(nblocks * KVP_CF_BLOCK));
    f->c = mem;
    f->nblocks = nblocks;
}

void kvp__cfilter_attach(kvp__cfilter_t *f, const void *mem, uint64_t nblocks)
{
    memset(f, 0, sizeof *f);
    if (!mem || !nblocks)
        return;
    f->c = (_Atomic uint8_t *)(uintptr_t)mem; /* (only read through it) */
    f->nblocks = nblocks;
}

/* One counter one step up or down, atomically.  255 is stuck; 0 is never
 * stepped down (it cannot happen for a key that was added, whose own add is
 * still counted: left alone rather than wrapped).  Returns 1 when this step
 * made it stick. */
static int step(_Atomic uint8_t *c, int up)
{
    uint8_t v = atomic_load_explicit(c, memory_order_relaxed);
    while (v != 255 && (up || v != 0) &&
           !atomic_compare_exchange_weak_explicit(c, &v, (uint8_t)(up ? v + 1 : v - 1), memory_order_release,
                                                  memory_order_relaxed))
        ;
    return up && v == 254;
}

static void change(kvp__cfilter_t *f, uint64_t h, int up)
{
    if (!f->c)
        return;
    unsigned pos[KVP_CF_K];
    _Atomic uint8_t *b = locate(f, h, pos);
    for (unsigned i = 0; i < KVP_CF_K; i++)
        if (step(&b[pos[i]], up))
            atomic_fetch_add_explicit(&f->saturated, 1, memory_order_relaxed);
    if (up)
        atomic_fetch_add_explicit(&f->keys, 1, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&f->keys, 1, memory_order_relaxed);
}

void kvp__cfilter_add(kvp__cfilter_t *f, uint64_t h) { change(f, h, 1); }
void kvp__cfilter_del(kvp__cfilter_t *f, uint64_t h) { change(f, h, 0); }

int kvp__cfilter_maybe(const kvp__cfilter_t *f, uint64_t h)
{
    if (!f->c)
        return 1;
    unsigned pos[KVP_CF_K];
    _Atomic uint8_t *b = locate(f, h, pos);
    for (unsigned i = 0; i < KVP_CF_K; i++)
        if (atomic_load_explicit(&b[pos[i]], memory_order_acquire) == 0)
            return 0;
    return 1;
}
