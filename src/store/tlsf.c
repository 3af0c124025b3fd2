#include "store/tlsf.h"

#include <string.h>

/* Block header.  `prev_phys` is valid only while the previous physical block
 * is free (PREV_FREE set); the free-list links overlay the first payload
 * bytes, so a used block costs 16 bytes. */
typedef struct kvp__tlsf_blk {
    struct kvp__tlsf_blk *prev_phys;
    uint64_t size_flags;
    struct kvp__tlsf_blk *next_free; /* free blocks only */
    struct kvp__tlsf_blk *prev_free; /* free blocks only */
} blk_t;

#define F_FREE 1ull
#define F_PREV_FREE 2ull
#define F_MASK 3ull
#define MIN_BLOCK 32ull /* header + two links */
#define SMALL_BLOCK (1ull << KVP_TLSF_FL_SHIFT)

static inline uint64_t bsize(const blk_t *b) { return b->size_flags & ~F_MASK; }
static inline int is_free(const blk_t *b) { return (b->size_flags & F_FREE) != 0; }
static inline blk_t *next_phys(const blk_t *b) { return (blk_t *)((char *)b + bsize(b)); }
static inline blk_t *from_payload(const void *p) { return (blk_t *)((char *)p - KVP_TLSF_OVERHEAD); }
static inline void *to_payload(blk_t *b) { return (char *)b + KVP_TLSF_OVERHEAD; }
static inline int fls64(uint64_t v) { return 63 - __builtin_clzll(v); }

static void mapping_insert(uint64_t size, int *fl, int *sl)
{
    if (size < SMALL_BLOCK) {
        *fl = 0;
        *sl = (int)(size / (SMALL_BLOCK / KVP_TLSF_SL_COUNT));
    } else {
        int f = fls64(size);
        *sl = (int)(size >> (f - KVP_TLSF_SL_LOG2)) ^ KVP_TLSF_SL_COUNT;
        *fl = f - (KVP_TLSF_FL_SHIFT - 1);
    }
}

/* Rounds up to the next list boundary so any block found fits. */
static void mapping_search(uint64_t size, int *fl, int *sl)
{
    if (size >= SMALL_BLOCK)
        size += (1ull << (fls64(size) - KVP_TLSF_SL_LOG2)) - 1;
    mapping_insert(size, fl, sl);
}

static void insert_free(kvp__tlsf_t *t, blk_t *b)
{
    int fl, sl;
    mapping_insert(bsize(b), &fl, &sl);
    blk_t *head = t->free[fl][sl];
    b->next_free = head;
    b->prev_free = NULL;
    if (head)
        head->prev_free = b;
    t->free[fl][sl] = b;
    t->fl_bitmap |= 1ull << fl;
    t->sl_bitmap[fl] |= 1u << sl;
}

static void remove_free(kvp__tlsf_t *t, blk_t *b)
{
    int fl, sl;
    mapping_insert(bsize(b), &fl, &sl);
    if (b->prev_free)
        b->prev_free->next_free = b->next_free;
    else
        t->free[fl][sl] = b->next_free;
    if (b->next_free)
        b->next_free->prev_free = b->prev_free;
    if (!t->free[fl][sl]) {
        t->sl_bitmap[fl] &= ~(1u << sl);
        if (!t->sl_bitmap[fl])
            t->fl_bitmap &= ~(1ull << fl);
    }
}

static blk_t *find_suitable(kvp__tlsf_t *t, int fl, int sl)
{
    if (fl >= KVP_TLSF_FL_COUNT)
        return NULL;
    uint32_t sl_map = t->sl_bitmap[fl] & (~0u << sl);
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < 64 ? t->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!fl_map)
            return NULL;
        fl = __builtin_ctzll(fl_map);
        sl_map = t->sl_bitmap[fl];
    }
    sl = __builtin_ctz(sl_map);
    return t->free[fl][sl];
}

uint64_t kvp__tlsf_footprint(uint64_t size)
{
    uint64_t need = (size + KVP_TLSF_OVERHEAD + KVP_TLSF_ALIGN - 1) & ~(uint64_t)(KVP_TLSF_ALIGN - 1);
    return need < MIN_BLOCK ? MIN_BLOCK : need;
}

int kvp__tlsf_init(kvp__tlsf_t *t, void *base, uint64_t size)
{
    memset(t, 0, sizeof *t);
    uintptr_t start = ((uintptr_t)base + KVP_TLSF_ALIGN - 1) & ~(uintptr_t)(KVP_TLSF_ALIGN - 1);
    uint64_t avail = size - (start - (uintptr_t)base);
    avail &= ~(uint64_t)(KVP_TLSF_ALIGN - 1);
    if (size < 4 * MIN_BLOCK || avail < 2 * MIN_BLOCK)
        return -1;
    if (avail > (1ull << KVP_TLSF_FL_MAX) - 1)
        avail = ((1ull << KVP_TLSF_FL_MAX) - 1) & ~(uint64_t)(KVP_TLSF_ALIGN - 1);
    t->base = (char *)start;
    t->size = avail - KVP_TLSF_OVERHEAD; /* the end sentinel's header */
    blk_t *b = (blk_t *)t->base;
    b->prev_phys = NULL;
    b->size_flags = t->size | F_FREE;
    blk_t *sentinel = next_phys(b);
    sentinel->prev_phys = b;
    sentinel->size_flags = 0 | F_PREV_FREE; /* size 0, used: stops coalescing */
    insert_free(t, b);
    return 0;
}

void *kvp__tlsf_alloc(kvp__tlsf_t *t, uint64_t size)
{
    if (size == 0 || size > t->size)
        return NULL;
    uint64_t need = kvp__tlsf_footprint(size);
    int fl, sl;
    mapping_search(need, &fl, &sl);
    blk_t *b = find_suitable(t, fl, sl);
    if (!b) {
        /* The rounded-up class is empty, but a block of the request's own
         * class may still be big enough (the largest requests need this). */
        mapping_insert(need, &fl, &sl);
        for (b = t->free[fl][sl]; b && bsize(b) < need; b = b->next_free)
            ;
        if (!b)
            return NULL;
    }
    remove_free(t, b);
    uint64_t have = bsize(b);
    uint64_t keep_flags = b->size_flags & F_PREV_FREE;
    if (have - need >= MIN_BLOCK) {
        blk_t *rest = (blk_t *)((char *)b + need);
        rest->prev_phys = b;
        rest->size_flags = (have - need) | F_FREE; /* its prev (b) is used */
        next_phys(rest)->prev_phys = rest;          /* next keeps PREV_FREE */
        insert_free(t, rest);
        b->size_flags = need | keep_flags;
    } else {
        b->size_flags = have | keep_flags;
        next_phys(b)->size_flags &= ~F_PREV_FREE;
    }
    t->used += bsize(b);
    return to_payload(b);
}

void kvp__tlsf_free(kvp__tlsf_t *t, void *payload)
{
    if (!payload)
        return;
    blk_t *b = from_payload(payload);
    t->used -= bsize(b);
    b->size_flags |= F_FREE;
    if (b->size_flags & F_PREV_FREE) {
        blk_t *p = b->prev_phys;
        remove_free(t, p);
        p->size_flags = (bsize(p) + bsize(b)) | F_FREE | (p->size_flags & F_PREV_FREE);
        b = p;
    }
    blk_t *n = next_phys(b);
    if (is_free(n)) {
        remove_free(t, n);
        b->size_flags = (bsize(b) + bsize(n)) | F_FREE | (b->size_flags & F_PREV_FREE);
        n = next_phys(b);
    }
    n->prev_phys = b;
    n->size_flags |= F_PREV_FREE;
    insert_free(t, b);
}

uint64_t kvp__tlsf_block_size(const void *payload) { return bsize(from_payload(payload)); }

int kvp__tlsf_check(const kvp__tlsf_t *t)
{
    const blk_t *b = (const blk_t *)t->base;
    uint64_t total = 0, used = 0;
    int prev_free = 0;
    while (bsize(b) != 0) {
        uint64_t s = bsize(b);
        if (s < MIN_BLOCK || s % KVP_TLSF_ALIGN)
            return -1;
        if (!!(b->size_flags & F_PREV_FREE) != prev_free)
            return -2;
        if (prev_free && is_free(b))
            return -3; /* two adjacent free blocks: coalescing failed */
        if (!is_free(b))
            used += s;
        prev_free = is_free(b);
        total += s;
        b = next_phys(b);
        if ((const char *)b > t->base + t->size)
            return -4;
    }
    if (total != t->size)
        return -5;
    if (used != t->used)
        return -6;
    return 0;
}
