#include "store/provider.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#define HUGE_2M (2u << 20)

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static void *map_region(kvp_mem_kind_t kind, int huge, size_t size, int prefault, int *fd_p)
{
    int flags = prefault ? MAP_POPULATE : 0;
    *fd_p = -1;
    if (kind == KVP_MEM_ANON) {
        flags |= MAP_PRIVATE | MAP_ANONYMOUS | (huge ? MAP_HUGETLB : 0);
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    int fd = memfd_create("kvpool-arena", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0));
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags | MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_p = fd;
    return p;
}

kvp_status_t kvp__mem_map(kvp_mem_kind_t kind, kvp_huge_mode_t huge, size_t size, int prefault,
                          kvp__mem_t *mem_p)
{
    memset(mem_p, 0, sizeof *mem_p);
    mem_p->fd = -1;
    if (size == 0 || kvp__alloc_should_fail()) {
        kvp_error("arena: cannot map %zu bytes (injected or zero size)", size);
        return KVP_ERR_NO_MEMORY;
    }
    void *p = NULL;
    int fd = -1;
    if (huge != KVP_HUGE_OFF) {
        size_t hsize = round_up(size, HUGE_2M);
        p = map_region(kind, 1, hsize, prefault, &fd);
        if (p) {
            mem_p->base = p;
            mem_p->size = hsize;
            mem_p->fd = fd;
            mem_p->huge = 1;
            mem_p->kind = kind;
            return KVP_OK;
        }
        if (huge == KVP_HUGE_ON) {
            kvp_error("arena: no huge pages for %zu bytes (errno %d: %s; see vm.nr_hugepages)",
                      hsize, errno, strerror(errno));
            return KVP_ERR_NO_MEMORY;
        }
        kvp_info("arena: hugetlbfs pages unavailable, using ordinary pages with THP advice");
    }
    size_t psize = round_up(size, (size_t)sysconf(_SC_PAGESIZE));
    p = map_region(kind, 0, psize, 0, &fd);
    if (!p) {
        kvp_error("arena: mmap of %zu bytes failed (errno %d: %s)", psize, errno, strerror(errno));
        return KVP_ERR_NO_MEMORY;
    }
    if (huge == KVP_HUGE_AUTO)
        (void)madvise(p, psize, MADV_HUGEPAGE);
    if (prefault) {
        /* After the THP advice, so prefaulting can allocate huge pages. */
        long pg = sysconf(_SC_PAGESIZE);
        for (size_t off = 0; off < psize; off += (size_t)pg)
            ((volatile char *)p)[off] = 0;
    }
    mem_p->base = p;
    mem_p->size = psize;
    mem_p->fd = fd;
    mem_p->kind = kind;
    return KVP_OK;
}

void kvp__mem_unmap(kvp__mem_t *mem)
{
    if (!mem || !mem->base)
        return;
    munmap(mem->base, mem->size);
    if (mem->fd >= 0)
        close(mem->fd);
    memset(mem, 0, sizeof *mem);
    mem->fd = -1;
}
