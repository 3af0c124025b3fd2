/* The replays' memcpy baseline (memcpy_baseline.h). */
#include "engine/memcpy_baseline.h"

#include <string.h>
#include <sys/mman.h>

#include "common/clock.h"

static char *map_buf(size_t n)
{
    char *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE);
    return p;
}

double kvp__memcpy_baseline_gbps(int64_t size)
{
    if (size < 1)
        return 0;
    size_t count = (size_t)((256ll << 20) / size);
    count = count < 8 ? 8 : count > 64 ? 64 : count;
    size_t total = count * (size_t)size;
    char *src = map_buf(total), *dst = map_buf(total);
    double g = 0;
    if (src && dst) {
        memset(src, 0x5a, total);
        memset(dst, 0, total);
        uint64_t t0 = kvp__now_ns();
        for (size_t i = 0; i < count; i++)
            memcpy(dst + i * (size_t)size, src + ((i * 7) % count) * (size_t)size, (size_t)size);
        g = (double)total / ((double)(kvp__now_ns() - t0) / 1e9) / 1e9;
    }
    if (src)
        munmap(src, total);
    if (dst)
        munmap(dst, total);
    return g;
}
