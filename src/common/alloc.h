/*
 * The allocation shim.  Every heap allocation in kvpool goes through these
 * functions so that (1) bytes in use are counted (stats, index-memory
 * measurement, leak checks in tests) and (2) tests can inject failures.
 * Out of memory is reported to the caller as NULL; callers turn it into
 * KVP_ERR_NO_MEMORY.  Nothing here aborts.
 *
 * kvp__free must be given the size that was allocated (callers always know it;
 * it keeps the counter exact without a header in front of every block).
 */
#ifndef KVP_COMMON_ALLOC_H
#define KVP_COMMON_ALLOC_H

#include <stddef.h>
#include <stdint.h>

void *kvp__malloc(size_t size);
void *kvp__calloc(size_t n, size_t size);
/* old_size: the size old was allocated with (0 when old is NULL). */
void *kvp__realloc(void *old, size_t old_size, size_t new_size);
void kvp__free(void *p, size_t size);
/* A growable array of *cap_p elements of elem bytes, with room for at
 * least `need` (>= 1): returns arr when it has, else the array grown (doubled, or
 * `first` elements when empty; the new elements zeroed) with *cap_p
 * updated, or NULL (out of memory: arr and *cap_p unchanged). */
void *kvp__grow(void *arr, size_t *cap_p, size_t need, size_t elem, size_t first);
/* The same on the array pointer itself (*arr_p updated; need 0 is
 * always met): 0, or -1. */
int kvp__grow_in(void **arr_p, size_t *cap_p, size_t need, size_t elem, size_t first);
/* strdup through the shim; free with kvp__free(s, strlen(s) + 1). */
char *kvp__strdup(const char *s);
/* Frees a kvp__strdup'ed string (NULL is fine). */
void kvp__strfree(char *s);

/* Bytes currently allocated through the shim (requested sizes). */
uint64_t kvp__alloc_bytes_in_use(void);

/* Failure injection (tests): after `n` more successful allocations, every
 * allocation fails until kvp__alloc_fail_reset().  n < 0 disables.  Also
 * consulted by the arena memory providers (kvp__alloc_should_fail). */
void kvp__alloc_fail_after(long n);
void kvp__alloc_fail_reset(void);
int kvp__alloc_should_fail(void);

#endif
