/* The producer's staging slab (ec_stage.h, the seed's memory.py
 * ProducerMemoryPool): copies carved from one mapping, lowest offset first
 * and reused once returned; what does not fit goes to the heap and is
 * counted; nothing is held after every region is returned, across threads
 * and when allocations fail. */
#include "test.h"

#include <pthread.h>

#include "common/alloc.h"
#include "common/mix.h"
#include "ec/ec_resv.h"
#include "ec/ec_stage.h"

static kvp__ec_stage_stats_t stats_of(kvp__ec_stage_t *s)
{
    kvp__ec_stage_stats_t st;
    kvp__ec_stage_stats(s, &st);
    return st;
}

TEST(test_ec_stage_copies_carved_lowest_first_and_reused)
{
    kvp__ec_stage_t *s;
    ASSERT_OK(kvp__ec_stage_create(1 << 20, &s));
    ASSERT_EQ(stats_of(s).capacity, 1 << 20);
    kvp__ec_stage_region_t a, b, c;
    ASSERT_OK(kvp__ec_stage_get(s, 100000, &a));
    ASSERT_OK(kvp__ec_stage_get(s, 1000, &b));
    ASSERT(!a.heap && !b.heap);
    ASSERT_EQ(a.nbytes, 100000);
    /* first fit from the bottom: b right after a's aligned extent */
    ASSERT_EQ(a.ext.off, 0);
    ASSERT_EQ(b.ext.off, a.ext.size);
    ASSERT_EQ(a.ext.size % KVP__EC_SLAB_ALIGN, 0);
    ASSERT(b.data == a.data + a.ext.size);
    memset(a.data, 0xa5, a.nbytes); /* writable, every byte */
    memset(b.data, 0x5a, b.nbytes);
    ASSERT_EQ(a.data[a.nbytes - 1], 0xa5);
    ASSERT_EQ(stats_of(s).bytes_staged, a.ext.size + b.ext.size);
    /* a freed extent is the next copy's that fits it */
    uint8_t *a_data = a.data;
    kvp__ec_stage_put(s, &a);
    ASSERT(a.data == NULL); /* returned: the region is cleared */
    ASSERT_OK(kvp__ec_stage_get(s, 90000, &c));
    ASSERT(c.data == a_data);
    ASSERT_EQ(b.data[0], 0x5a); /* untouched by the others */
    kvp__ec_stage_put(s, &b);
    kvp__ec_stage_put(s, &c);
    kvp__ec_stage_stats_t st = stats_of(s);
    ASSERT_EQ(st.bytes_staged, 0);
    ASSERT_EQ(st.copies, 3);
    ASSERT_EQ(st.fallbacks, 0);
    ASSERT_EQ(st.heap_bytes, 0);
    kvp__ec_stage_destroy(s);
}

TEST(test_ec_stage_full_slab_falls_back_to_heap_and_counts)
{
    kvp__ec_stage_t *s;
    ASSERT_OK(kvp__ec_stage_create(64 << 10, &s));
    kvp__ec_stage_region_t a, b, c;
    ASSERT_OK(kvp__ec_stage_get(s, 40 << 10, &a));
    ASSERT_OK(kvp__ec_stage_get(s, 40 << 10, &b)); /* does not fit what is left */
    ASSERT_OK(kvp__ec_stage_get(s, 100 << 10, &c)); /* larger than the slab */
    ASSERT(!a.heap && b.heap && c.heap);
    memset(b.data, 1, b.nbytes);
    memset(c.data, 2, c.nbytes);
    kvp__ec_stage_stats_t st = stats_of(s);
    ASSERT_EQ(st.copies, 3);
    ASSERT_EQ(st.fallbacks, 2);
    ASSERT_EQ(st.heap_bytes, (40 << 10) + (100 << 10));
    ASSERT_EQ(st.bytes_staged, 40 << 10);
    kvp__ec_stage_put(s, &b);
    ASSERT_EQ(stats_of(s).heap_bytes, 100 << 10);
    kvp__ec_stage_put(s, &a);
    kvp__ec_stage_put(s, &c);
    st = stats_of(s);
    ASSERT_EQ(st.heap_bytes, 0);
    ASSERT_EQ(st.bytes_staged, 0);
    /* room again: back in the slab */
    ASSERT_OK(kvp__ec_stage_get(s, 40 << 10, &a));
    ASSERT(!a.heap);
    kvp__ec_stage_put(s, &a);
    kvp__ec_stage_destroy(s);
}

TEST(test_ec_stage_zero_bytes_holds_nothing)
{
    kvp__ec_stage_t *s;
    ASSERT_OK(kvp__ec_stage_create(64 << 10, &s));
    kvp__ec_stage_region_t z;
    ASSERT_OK(kvp__ec_stage_get(s, 0, &z));
    ASSERT(z.data == NULL);
    ASSERT_EQ(z.nbytes, 0);
    kvp__ec_stage_stats_t st = stats_of(s);
    ASSERT_EQ(st.bytes_staged + st.heap_bytes + st.copies, 0);
    kvp__ec_stage_put(s, &z);
    kvp__ec_stage_destroy(s);
}

TEST(test_ec_stage_no_slab_copies_on_the_heap)
{
    /* capacity 0, and a mapping that fails: the heap only, still correct */
    for (int how = 0; how < 2; how++) {
        kvp__ec_stage_t *s;
        if (how == 0) {
            ASSERT_OK(kvp__ec_stage_create(0, &s));
        } else {
            kvp__alloc_fail_after(1); /* the object itself, then the mapping fails */
            kvp_status_t st = kvp__ec_stage_create(1 << 20, &s);
            kvp__alloc_fail_reset();
            ASSERT_OK(st);
        }
        ASSERT_EQ(stats_of(s).capacity, 0);
        kvp__ec_stage_region_t r;
        ASSERT_OK(kvp__ec_stage_get(s, 4096, &r));
        ASSERT(r.heap);
        memset(r.data, 7, r.nbytes);
        ASSERT_EQ(stats_of(s).fallbacks, 1);
        kvp__ec_stage_put(s, &r);
        ASSERT_EQ(stats_of(s).heap_bytes, 0);
        kvp__ec_stage_destroy(s);
    }
}

TEST(test_ec_stage_out_of_memory_gives_nothing)
{
    for (long n = 0; n < 4; n++) {
        uint64_t before = kvp__alloc_bytes_in_use();
        kvp__ec_stage_t *s = NULL;
        kvp__alloc_fail_after(n);
        kvp_status_t st = kvp__ec_stage_create(8 << 10, &s);
        kvp__ec_stage_region_t a = {0}, b = {0};
        kvp_status_t sa = KVP_ERR_NO_MEMORY, sb = KVP_ERR_NO_MEMORY;
        if (st == KVP_OK) {
            sa = kvp__ec_stage_get(s, 4 << 10, &a);
            sb = kvp__ec_stage_get(s, 16 << 10, &b); /* the heap */
        }
        kvp__alloc_fail_reset();
        if (st != KVP_OK) {
            ASSERT_EQ(st, KVP_ERR_NO_MEMORY);
            ASSERT_EQ(kvp__alloc_bytes_in_use(), before);
            continue;
        }
        if (sa != KVP_OK)
            ASSERT(a.data == NULL);
        if (sb != KVP_OK) {
            ASSERT_EQ(sb, KVP_ERR_NO_MEMORY);
            ASSERT(b.data == NULL);
            ASSERT_EQ(stats_of(s).heap_bytes, 0);
        }
        kvp__ec_stage_put(s, &a);
        kvp__ec_stage_put(s, &b);
        kvp__ec_stage_stats_t ss = stats_of(s);
        ASSERT_EQ(ss.bytes_staged + ss.heap_bytes, 0);
        kvp__ec_stage_destroy(s);
        ASSERT_EQ(kvp__alloc_bytes_in_use(), before);
    }
}

/* Threads take, fill, check and return regions of random sizes: no region
 * ever overlaps another that is held (each finds its own bytes intact). */
#define THREADS 4
#define ROUNDS 3000
#define HELD 4

typedef struct {
    kvp__ec_stage_t *s;
    uint64_t seed;
    int bad;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    kvp__ec_stage_region_t held[HELD] = {{0}};
    uint8_t tag[HELD] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        int k = (int)(kvp__splitmix64(&w->seed) % HELD);
        if (held[k].data) {
            for (size_t j = 0; j < held[k].nbytes; j += 97)
                w->bad += held[k].data[j] != tag[k];
            w->bad += held[k].data[held[k].nbytes - 1] != tag[k];
            kvp__ec_stage_put(w->s, &held[k]);
        }
        size_t n = 1 + (size_t)(kvp__splitmix64(&w->seed) % (48 << 10));
        if (kvp__ec_stage_get(w->s, n, &held[k]) != KVP_OK) {
            w->bad++;
            continue;
        }
        tag[k] = (uint8_t)kvp__splitmix64(&w->seed);
        memset(held[k].data, tag[k], n);
    }
    for (int k = 0; k < HELD; k++)
        kvp__ec_stage_put(w->s, &held[k]);
    return NULL;
}

TEST(test_ec_stage_threads_share_one_slab)
{
    kvp__ec_stage_t *s;
    ASSERT_OK(kvp__ec_stage_create(512 << 10, &s)); /* smaller than all held at once: some fall back */
    pthread_t th[THREADS];
    worker_t w[THREADS];
    for (int t = 0; t < THREADS; t++) {
        w[t] = (worker_t){s, 0x9e3779b97f4a7c15ull * (uint64_t)(t + 1), 0};
        ASSERT_EQ(pthread_create(&th[t], NULL, worker, &w[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(th[t], NULL);
        ASSERT_EQ(w[t].bad, 0);
    }
    kvp__ec_stage_stats_t st = stats_of(s);
    ASSERT_EQ(st.copies, THREADS * ROUNDS);
    ASSERT_GT(st.copies, st.fallbacks); /* most fit */
    ASSERT_EQ(st.bytes_staged, 0);
    ASSERT_EQ(st.heap_bytes, 0);
    kvp__ec_stage_destroy(s);
}

TEST_LIST(T(test_ec_stage_copies_carved_lowest_first_and_reused),
          T(test_ec_stage_full_slab_falls_back_to_heap_and_counts), T(test_ec_stage_zero_bytes_holds_nothing),
          T(test_ec_stage_no_slab_copies_on_the_heap), T(test_ec_stage_out_of_memory_gives_nothing),
          T(test_ec_stage_threads_share_one_slab))
