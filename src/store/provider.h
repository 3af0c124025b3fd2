/*
 * Arena memory providers.  The storage engine never maps memory itself: it
 * asks a provider for one contiguous region and gives it back at close.  That
 * lets the server hand the engine memory its transport allocated and
 * registered (a later provider) while the embedded pool uses plain memory.
 *
 *   ANON   private anonymous mapping (lazy; the default for embedded://)
 *   MEMFD  a memfd mapped shared (another process can map the same fd)
 * Either may be backed by huge pages: OFF (never), AUTO (try hugetlbfs pages,
 * else ordinary pages with transparent-huge-page advice), ON (hugetlbfs pages
 * or fail with KVP_ERR_NO_MEMORY).
 */
#ifndef KVP_STORE_PROVIDER_H
#define KVP_STORE_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef enum { KVP_MEM_ANON = 0, KVP_MEM_MEMFD } kvp_mem_kind_t;
typedef enum { KVP_HUGE_OFF = 0, KVP_HUGE_AUTO, KVP_HUGE_ON } kvp_huge_mode_t;

typedef struct kvp__mem {
    void *base;          /* mapped region */
    size_t size;         /* mapped length (capacity rounded up to the page size) */
    int fd;              /* memfd, or -1 */
    int huge;            /* 1 if backed by hugetlbfs pages */
    kvp_mem_kind_t kind;
} kvp__mem_t;

/* Maps at least `size` bytes.  prefault: touch every page now.  Errors:
 * KVP_ERR_NO_MEMORY (mapping failed, or huge pages required but absent). */
kvp_status_t kvp__mem_map(kvp_mem_kind_t kind, kvp_huge_mode_t huge, size_t size, int prefault,
                          kvp__mem_t *mem_p);
void kvp__mem_unmap(kvp__mem_t *mem);

/* A memfd of `size` bytes named `name` (hugetlbfs pages if huge), mapped
 * shared and writable here (populated if populate), then sealed: nobody,
 * through any descriptor of it, can write it, grow or shrink it or map it
 * writable again; this mapping keeps writing.  Returns the mapping and
 * *fd_p, or NULL (errno set).  *fd_p is -1 if sealing failed (logged): the
 * mapping is then private to this process (the fd is closed). */
void *kvp__mem_shared(const char *name, size_t size, int huge, int populate, int *fd_p);

#endif
