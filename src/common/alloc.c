#include "common/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static _Atomic uint64_t g_bytes;
/* < 0: no injection; otherwise allocations left before failures begin. */
static _Atomic long g_fail_after = -1;

int kvp__alloc_should_fail(void)
{
    long v = atomic_load_explicit(&g_fail_after, memory_order_relaxed);
    while (v >= 0) {
        if (v == 0)
            return 1;
        if (atomic_compare_exchange_weak(&g_fail_after, &v, v - 1))
            return 0;
    }
    return 0;
}

void kvp__alloc_fail_after(long n) { atomic_store(&g_fail_after, n); }
void kvp__alloc_fail_reset(void) { atomic_store(&g_fail_after, -1); }
uint64_t kvp__alloc_bytes_in_use(void) { return atomic_load(&g_bytes); }

void *kvp__malloc(size_t size)
{
    if (kvp__alloc_should_fail())
        return NULL;
    void *p = malloc(size ? size : 1);
    if (p)
        atomic_fetch_add_explicit(&g_bytes, size, memory_order_relaxed);
    return p;
}

void *kvp__calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (kvp__alloc_should_fail())
        return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p)
        atomic_fetch_add_explicit(&g_bytes, n * size, memory_order_relaxed);
    return p;
}

void *kvp__realloc(void *old, size_t old_size, size_t new_size)
{
    if (kvp__alloc_should_fail())
        return NULL;
    void *p = realloc(old, new_size ? new_size : 1);
    if (p) {
        atomic_fetch_sub_explicit(&g_bytes, old ? old_size : 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&g_bytes, new_size, memory_order_relaxed);
    }
    return p;
}

void kvp__free(void *p, size_t size)
{
    if (!p)
        return;
    atomic_fetch_sub_explicit(&g_bytes, size, memory_order_relaxed);
    free(p);
}

void *kvp__grow(void *arr, size_t *cap_p, size_t need, size_t elem, size_t first)
{
    size_t cap = arr ? *cap_p : 0;
    if (need <= cap)
        return arr;
    if (!elem || cap > SIZE_MAX / 2)
        return NULL;
    size_t ncap = cap ? cap * 2 : (first ? first : 1);
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return NULL;
        ncap *= 2;
    }
    if (ncap > SIZE_MAX / elem)
        return NULL;
    uint8_t *p = kvp__realloc(arr, cap * elem, ncap * elem);
    if (!p)
        return NULL;
    memset(p + cap * elem, 0, (ncap - cap) * elem);
    *cap_p = ncap;
    return p;
}

int kvp__grow_in(void **arr_p, size_t *cap_p, size_t need, size_t elem, size_t first)
{
    if (!need)
        return 0; /* (nothing to make room for: a NULL array stays NULL) */
    void *p = kvp__grow(*arr_p, cap_p, need, elem, first);
    if (!p)
        return -1;
    *arr_p = p;
    return 0;
}

char *kvp__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kvp__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void kvp__strfree(char *s)
{
    if (s)
        kvp__free(s, strlen(s) + 1);
}
