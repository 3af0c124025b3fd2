#include "store/provider.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"

#ifndef MFD_HUGETLB
#define MFD_HUGETLB 0x0004U
#endif
#define HUGE_2M (2u << 20)
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002U
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/* A memfd arena is shared read-only with other processes (local reads):
 * once its one writable mapping exists, the file is sealed so that nobody,
 * whatever the descriptor they reopen through /proc/PID/fd, can resize it
 * (a shrink would SIGBUS the server) or write it, by write(2) or through a
 * new shared writable mapping; the server's own mapping keeps writing.
 * (Another process of the same uid can still write the server's memory
 * with process_vm_writev or ptrace: the uid is the trust boundary.) */
#define ARENA_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL)

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void *kvp__mem_shared(const char *name, size_t size, int huge, int populate, int *fd_p)
{
    *fd_p = -1;
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | (huge ? MFD_HUGETLB : 0));
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    if (fcntl(fd, F_ADD_SEALS, ARENA_SEALS) != 0) {
        /* Unsealed, the file must not be shared: keep the mapping private
         * to this process (no fd to hand out). */
        kvp_warn("%s: cannot seal the memfd (%s); it will not be shared with other processes", name,
                 strerror(errno));
        close(fd);
        fd = -1;
    }
    *fd_p = fd;
    return p;
}

static void *map_region(kvp_mem_kind_t kind, int huge, size_t size, int prefault, int *fd_p)
{
    *fd_p = -1;
    if (kind == KVP_MEM_MEMFD)
        return kvp__mem_shared("kvpool-arena", size, huge, prefault, fd_p);
    int flags = (prefault ? MAP_POPULATE : 0) | MAP_PRIVATE | MAP_ANONYMOUS | (huge ? MAP_HUGETLB : 0);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, -1, 0);
    return p == MAP_FAILED ? NULL : p;
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
