#include "client/local_read.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define POPULATE_CHUNK (2u << 20)

struct kvp__lmap {
    struct kvp__lmap *next;      /* the process's mappings */
    kvp__arena_info_t ai;
    const uint8_t *base;
    uint64_t size;
    uint64_t refs;               /* under g_mu */
    uint64_t populated_to;       /* the helper's progress mapping pages in */
    struct kvp__lmap *pop_next;  /* waiting to be mapped in (holds a reference) */
};

/* The copy helper's one job: bytes [from, to) of the segments' concatenation. */
enum { JOB_IDLE, JOB_POSTED, JOB_TAKEN, JOB_DONE };

static struct {
    pthread_mutex_t mu;          /* the mappings, the populate queue, sleeping */
    pthread_cond_t cv;
    kvp__lmap_t *maps;
    kvp__lmap_t *pop;            /* mappings to map in ahead of use */
    int helper;                  /* 1 running, -1 none (one core, or it could not start) */
    int sleeping;
    _Atomic int owner;           /* a caller holds the job slot */
    _Atomic int job;
    const kvp__cpseg_t *segs;
    uint32_t n;
    size_t from, to;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* ---- copying ---- */

/* A large copy into a caller's buffer streams past the caches
 * (non-temporal stores): the destination is not read back by this core
 * soon (a KV block goes on to a GPU), and skipping the read-for-ownership
 * of every destination line is worth 30-40 % here (docs/transport.md §9). */
static void copy_stream(void *dst, const void *src, size_t len)
{
#if defined(__SSE2__)
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 15u);
    if (len < 4096 || head > len) {
        memcpy(d, s, len);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    size_t body = len & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
    _mm_sfence();
    memcpy(d + body, s + body, len - body);
#else
    memcpy(dst, src, len);
#endif
}

static void copy_range(const kvp__cpseg_t *segs, uint32_t n, size_t from, size_t to)
{
    size_t pos = 0;
    for (uint32_t i = 0; i < n && pos < to; i++) {
        size_t a = pos, b = pos + segs[i].len;
        pos = b;
        if (b <= from)
            continue;
        size_t lo = a < from ? from - a : 0;
        size_t hi = (b < to ? b : to) - a;
        copy_stream((char *)segs[i].dst + lo, (const char *)segs[i].src + lo, hi - lo);
    }
}

/* Maps the next chunk of the first queued mapping in (helper, g_mu held
 * on entry and exit).  Returns 1 if there was one. */
static int populate_step(void)
{
    kvp__lmap_t *m = g.pop;
    if (!m)
        return 0;
    uint64_t off = m->populated_to;
    uint64_t len = m->size - off < POPULATE_CHUNK ? m->size - off : POPULATE_CHUNK;
    m->populated_to = off + len;
    int last = m->populated_to >= m->size;
    if (last)
        g.pop = m->pop_next;
    pthread_mutex_unlock(&g.mu);
    if (len && madvise((void *)(m->base + off), len, MADV_POPULATE_READ) != 0) {
        long pg = sysconf(_SC_PAGESIZE); /* kernels before 5.14: touch each page */
        for (uint64_t o = 0; o < len; o += (uint64_t)pg)
            (void)*(volatile const uint8_t *)(m->base + off + o);
    }
    if (last)
        kvp__lmap_put(m);
    pthread_mutex_lock(&g.mu);
    return 1;
}

static void *helper_main(void *arg)
{
    (void)arg;
    for (;;) {
        int want = JOB_POSTED;
        if (atomic_compare_exchange_strong(&g.job, &want, JOB_TAKEN)) {
            copy_range(g.segs, g.n, g.from, g.to);
            atomic_store(&g.job, JOB_DONE);
            continue;
        }
        /* A short spin catches back-to-back gets without a wake-up. */
        uint64_t until = kvp__now_ns() + 20000;
        while (atomic_load(&g.job) != JOB_POSTED && kvp__now_ns() < until)
            sched_yield();
        if (atomic_load(&g.job) == JOB_POSTED)
            continue;
        pthread_mutex_lock(&g.mu);
        if (!populate_step()) {
            g.sleeping = 1;
            while (atomic_load(&g.job) != JOB_POSTED && !g.pop)
                pthread_cond_wait(&g.cv, &g.mu);
            g.sleeping = 0;
        }
        pthread_mutex_unlock(&g.mu);
    }
    return NULL;
}

/* Starts the helper once, where there is a second core for it (g_mu held). */
static int helper_ready(void)
{
    if (g.helper)
        return g.helper > 0;
    cpu_set_t cs;
    g.helper = -1;
    if (sched_getaffinity(0, sizeof cs, &cs) != 0 || CPU_COUNT(&cs) < 2)
        return 0;
    pthread_attr_t at;
    pthread_t t;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, helper_main, NULL) == 0)
        g.helper = 1;
    pthread_attr_destroy(&at);
    return g.helper > 0;
}

void kvp__pcopy(const kvp__cpseg_t *segs, uint32_t n)
{
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += segs[i].len;
    int idle = 0;
    if (total < KVP_PCOPY_MIN) {
        for (uint32_t i = 0; i < n; i++)
            memcpy(segs[i].dst, segs[i].src, segs[i].len);
        return;
    }
    if (g.helper <= 0 || !atomic_compare_exchange_strong(&g.owner, &idle, 1)) {
        copy_range(segs, n, 0, total); /* no helper, or it is busy for another caller */
        return;
    }
    size_t half = (total / 2) & ~(size_t)63;
    g.segs = segs;
    g.n = n;
    g.from = half;
    g.to = total;
    atomic_store(&g.job, JOB_POSTED);
    pthread_mutex_lock(&g.mu);
    if (g.sleeping)
        pthread_cond_signal(&g.cv);
    pthread_mutex_unlock(&g.mu);
    copy_range(segs, n, 0, half);
    int posted = JOB_POSTED;
    if (atomic_compare_exchange_strong(&g.job, &posted, JOB_IDLE)) {
        copy_range(segs, n, half, total); /* the helper never got to it: take it back */
    } else {
        for (unsigned spins = 0; atomic_load(&g.job) != JOB_DONE; spins++)
            if (spins > 1000)
                sched_yield();
        atomic_store(&g.job, JOB_IDLE);
    }
    atomic_store(&g.owner, 0);
}

/* ---- mappings ---- */

int kvp__lmap_is(const kvp__lmap_t *m, const kvp__arena_info_t *ai)
{
    return m && m->ai.pid == ai->pid && m->ai.fd == ai->fd && m->ai.dev == ai->dev &&
           m->ai.ino == ai->ino && m->ai.size == ai->size;
}

const uint8_t *kvp__lmap_base(const kvp__lmap_t *m) { return m->base; }
uint64_t kvp__lmap_size(const kvp__lmap_t *m) { return m->size; }

void kvp__lmap_ref(kvp__lmap_t *m)
{
    pthread_mutex_lock(&g.mu);
    m->refs++;
    pthread_mutex_unlock(&g.mu);
}

static const uint8_t *map_arena(const kvp__arena_info_t *ai)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%llu/fd/%llu", (unsigned long long)ai->pid, (unsigned long long)ai->fd);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvp_info("local reads: cannot open the server's arena (%s: %s); reading over UCX", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != ai->dev || (uint64_t)st.st_ino != ai->ino ||
        (uint64_t)st.st_size < ai->size || ai->size == 0 || ai->size > (uint64_t)SIZE_MAX) {
        kvp_info("local reads: %s is not the server's arena (another host or PID namespace); "
                 "reading over UCX", path);
        close(fd);
        return NULL;
    }
    void *p = mmap(NULL, (size_t)ai->size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        kvp_warn("local reads: cannot map the server's arena (%llu bytes): %s; reading over UCX",
                 (unsigned long long)ai->size, strerror(errno));
        return NULL;
    }
    return p;
}

kvp_status_t kvp__lmap_get(const kvp__arena_info_t *ai, kvp__lmap_t **m_p)
{
    *m_p = NULL;
    pthread_mutex_lock(&g.mu);
    for (kvp__lmap_t *m = g.maps; m; m = m->next)
        if (kvp__lmap_is(m, ai)) {
            m->refs++;
            *m_p = m;
            pthread_mutex_unlock(&g.mu);
            return KVP_OK;
        }
    pthread_mutex_unlock(&g.mu);
    const uint8_t *base = map_arena(ai);
    kvp__lmap_t *m = base ? kvp__calloc(1, sizeof *m) : NULL;
    if (!m) {
        if (base)
            munmap((void *)base, (size_t)ai->size);
        return base ? KVP_ERR_NO_MEMORY : KVP_ERR_UNSUPPORTED;
    }
    m->ai = *ai;
    m->base = base;
    m->size = ai->size;
    m->refs = 1;
    pthread_mutex_lock(&g.mu);
    m->next = g.maps;
    g.maps = m;
    /* Map its pages in ahead of the first reads (page faults would cost
     * about a third of a copy), on the helper, only where the server has
     * allocated them all anyway. */
    if (ai->populated && helper_ready()) {
        m->refs++;
        kvp__lmap_t **pp = &g.pop;
        while (*pp)
            pp = &(*pp)->pop_next;
        *pp = m;
        pthread_cond_signal(&g.cv);
    } else {
        (void)helper_ready();
    }
    pthread_mutex_unlock(&g.mu);
    kvp_info("local reads: mapped the server's arena (%llu bytes)", (unsigned long long)ai->size);
    *m_p = m;
    return KVP_OK;
}

void kvp__lmap_put(kvp__lmap_t *m)
{
    if (!m)
        return;
    pthread_mutex_lock(&g.mu);
    if (--m->refs) {
        pthread_mutex_unlock(&g.mu);
        return;
    }
    kvp__lmap_t **pp = &g.maps;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp)
        *pp = m->next;
    pthread_mutex_unlock(&g.mu);
    munmap((void *)m->base, (size_t)m->size);
    kvp__free(m, sizeof *m);
}
