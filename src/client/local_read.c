#include "client/local_read.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client/remote_int.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "net/wire.h"

/* Arenas up to this size have their pages mapped in when they are mapped
 * (see map_arena). */
#define POPULATE_MAX (4ull << 30)

struct kvp__lmap {
    struct kvp__lmap *next;      /* the process's mappings */
    kvp__arena_info_t ai;
    const uint8_t *base;
    uint64_t size;
    const uint8_t *table;        /* the lease table */
    uint64_t nslots;
    kvp__cfilter_t filter;       /* in the table (c == NULL: none) */
    uint64_t refs;               /* under g_mu */
};

static struct {
    pthread_mutex_t mu;          /* the list of mappings, their references */
    pthread_mutex_t map_mu;      /* one mapping made at a time */
    kvp__lmap_t *maps;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .map_mu = PTHREAD_MUTEX_INITIALIZER};

/* ---- copying ---- */

/* A large copy into a caller's buffer streams past the caches
 * (non-temporal stores): the destination is not read back by this core
 * soon (a KV block goes on to a GPU), and skipping the read-for-ownership
 * of every destination line is worth 30-40 % here.  The source is read a
 * block at a time: the block's lines are all requested first (prefetch),
 * then copied, so the loads of a block overlap instead of trickling in as
 * the stores drain; 4 KiB blocks were best here, +15 % over streaming
 * alone, and AVX2 adds a few % more (docs/transport.md §9). */
#define STREAM_BLOCK 4096u

#if defined(__x86_64__)
#define HAVE_STREAM 1
#include <immintrin.h>

static void prefetch_block(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 64)
        _mm_prefetch(s + i, _MM_HINT_T0);
}

/* n: a multiple of 64; d: 16-byte aligned */
static void stream_sse2(char *d, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i x1 = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), x0);
        _mm_stream_si128((__m128i *)(d + i + 16), x1);
        _mm_stream_si128((__m128i *)(d + i + 32), x2);
        _mm_stream_si128((__m128i *)(d + i + 48), x3);
    }
}

/* n: a multiple of 64; d: 32-byte aligned */
__attribute__((target("avx2"))) static void stream_avx2(char *d, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i += 64) {
        __m256i y0 = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i y1 = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_stream_si256((__m256i *)(d + i), y0);
        _mm256_stream_si256((__m256i *)(d + i + 32), y1);
    }
}
#endif

static _Atomic int g_narrow; /* tests: no AVX2 */

void kvp__lread_test_wide(int on) { g_narrow = !on; }

static void copy_stream(void *dst, const void *src, size_t len)
{
#if defined(HAVE_STREAM)
    char *d = dst;
    const char *s = src;
    int avx2 = !g_narrow && __builtin_cpu_supports("avx2");
    size_t head = (size_t)(-(uintptr_t)d & (avx2 ? 31u : 15u));
    if (len < 4096 || head > len) {
        memcpy(d, s, len);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    len -= head;
    size_t body = len & ~(size_t)63;
    for (size_t o = 0; o < body; o += STREAM_BLOCK) {
        size_t b = body - o < STREAM_BLOCK ? body - o : STREAM_BLOCK;
        prefetch_block(s + o, b);
        if (avx2)
            stream_avx2(d + o, s + o, b);
        else
            stream_sse2(d + o, s + o, b);
    }
    _mm_sfence();
    memcpy(d + body, s + body, len - body);
#else
    memcpy(dst, src, len);
#endif
}

void kvp__lread_copy(const kvp__cpseg_t *segs, uint32_t n)
{
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++)
        total += segs[i].len;
    for (uint32_t i = 0; i < n; i++) {
        if (total >= KVP_STREAM_MIN)
            copy_stream(segs[i].dst, segs[i].src, segs[i].len);
        else
            memcpy(segs[i].dst, segs[i].src, segs[i].len);
    }
}

/* ---- mappings ---- */

int kvp__lmap_is(const kvp__lmap_t *m, const kvp__arena_info_t *ai)
{
    return m && m->ai.pid == ai->pid && m->ai.fd == ai->fd && m->ai.dev == ai->dev &&
           m->ai.ino == ai->ino && m->ai.size == ai->size && m->ai.tfd == ai->tfd && m->ai.tdev == ai->tdev &&
           m->ai.tino == ai->tino && m->ai.tsize == ai->tsize;
}

const uint8_t *kvp__lmap_base(const kvp__lmap_t *m) { return m->base; }
uint64_t kvp__lmap_size(const kvp__lmap_t *m) { return m->size; }
const uint8_t *kvp__lmap_nonce(const kvp__lmap_t *m) { return m->table; }

int kvp__lmap_slot_ok(const kvp__lmap_t *m, uint64_t slot) { return m && slot < m->nslots; }

const kvp__cfilter_t *kvp__lmap_filter(const kvp__lmap_t *m) { return m && m->filter.c ? &m->filter : NULL; }

int kvp__lmap_still_leased(const kvp__lmap_t *m, uint64_t slot, uint64_t gen)
{
    if (!kvp__lmap_slot_ok(m, slot))
        return 0;
    /* The copy's loads come before this one (the server bumps, then frees). */
    atomic_thread_fence(memory_order_acquire);
    const _Atomic uint64_t *g = (const _Atomic uint64_t *)(const void *)(m->table + KVP_WIRE_LR_GEN_OFF);
    return atomic_load_explicit(&g[slot], memory_order_acquire) == gen;
}

void kvp__lmap_ref(kvp__lmap_t *m)
{
    pthread_mutex_lock(&g.mu);
    m->refs++;
    pthread_mutex_unlock(&g.mu);
}

/* Opens /proc/PID/fd/FD read-only if it is the file named by dev, ino and
 * of at least size bytes; -1 (logged) if not. */
static int open_file(uint64_t pid, uint64_t fdn, uint64_t dev, uint64_t ino, uint64_t size, const char *what)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%llu/fd/%llu", (unsigned long long)pid, (unsigned long long)fdn);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        kvp_info("local reads: cannot open the server's %s (%s: %s); reading over UCX", what, path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino ||
        (uint64_t)st.st_size < size || size == 0 || size > (uint64_t)SIZE_MAX) {
        kvp_info("local reads: %s is not the server's %s (another host or PID namespace); reading over UCX", path,
                 what);
        close(fd);
        return -1;
    }
    return fd;
}

/* The membership filter the table's header names, checked against the
 * table's size; none (c == NULL) if there is none or it is malformed. */
static void find_filter(const uint8_t *t, uint64_t tsize, uint64_t nslots, kvp__cfilter_t *f)
{
    uint64_t off, nb;
    memcpy(&off, t + KVP_WIRE_LR_FILTER_OFF, sizeof off);
    memcpy(&nb, t + KVP_WIRE_LR_FILTER_BLOCKS_OFF, sizeof nb);
    kvp__cfilter_attach(f, NULL, 0);
    if (!off && !nb)
        return;
    if (off % KVP_CF_BLOCK || off < KVP_WIRE_LR_GEN_OFF + nslots * 8u || off > tsize || !nb ||
        nb > (tsize - off) / KVP_CF_BLOCK || nb > UINT32_MAX) {
        kvp_warn("local reads: the server's membership filter is malformed; asking the server instead");
        return;
    }
    kvp__cfilter_attach(f, t + off, nb);
}

/* Maps the lease table; NULL if it is not one (logged). */
static const uint8_t *map_table(const kvp__arena_info_t *ai, uint64_t *nslots_p)
{
    int fd = open_file(ai->pid, ai->tfd, ai->tdev, ai->tino, ai->tsize, "lease table");
    if (fd < 0)
        return NULL;
    void *p = ai->tsize >= KVP_WIRE_LR_GEN_OFF ? mmap(NULL, (size_t)ai->tsize, PROT_READ, MAP_SHARED, fd, 0)
                                               : MAP_FAILED;
    close(fd);
    if (p == MAP_FAILED) {
        kvp_warn("local reads: cannot map the server's lease table; reading over UCX");
        return NULL;
    }
    uint64_t n;
    memcpy(&n, (const uint8_t *)p + KVP_WIRE_LR_NSLOTS_OFF, sizeof n);
    if (n == 0 || n > (ai->tsize - KVP_WIRE_LR_GEN_OFF) / 8u) {
        kvp_warn("local reads: the server's lease table is malformed; reading over UCX");
        munmap(p, (size_t)ai->tsize);
        return NULL;
    }
    *nslots_p = n;
    return p;
}

static const uint8_t *map_arena(const kvp__arena_info_t *ai)
{
    int fd = open_file(ai->pid, ai->fd, ai->dev, ai->ino, ai->size, "arena");
    if (fd < 0)
        return NULL;
    /* The page tables are filled now, once per process, where that is
     * cheap enough (about 0.1 s per GiB): faulting them in during the
     * copies costs about as much as the copies (docs/transport.md §9).
     * Only where the server has allocated every page anyway. */
    int populate = ai->populated && ai->size <= POPULATE_MAX;
    void *p = mmap(NULL, (size_t)ai->size, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        kvp_warn("local reads: cannot map the server's arena (%llu bytes): %s; reading over UCX",
                 (unsigned long long)ai->size, strerror(errno));
        return NULL;
    }
    return p;
}

/* Takes a reference on this process's mapping of ai, if there is one. */
static kvp__lmap_t *lmap_find(const kvp__arena_info_t *ai)
{
    pthread_mutex_lock(&g.mu);
    kvp__lmap_t *m = g.maps;
    while (m && !kvp__lmap_is(m, ai))
        m = m->next;
    if (m)
        m->refs++;
    pthread_mutex_unlock(&g.mu);
    return m;
}

kvp_status_t kvp__lmap_get(const kvp__arena_info_t *ai, kvp__lmap_t **m_p)
{
    *m_p = lmap_find(ai);
    if (*m_p)
        return KVP_OK;
    /* One mapping per arena: handles connecting at once wait for the
     * first to map it (and fill its page tables) rather than all doing
     * so; lookups and releases (g.mu) never wait for that. */
    pthread_mutex_lock(&g.map_mu);
    kvp__lmap_t *m = lmap_find(ai);
    if (!m) {
        uint64_t nslots = 0;
        const uint8_t *table = map_table(ai, &nslots);
        const uint8_t *base = table ? map_arena(ai) : NULL;
        m = base ? kvp__calloc(1, sizeof *m) : NULL;
        if (!m) {
            pthread_mutex_unlock(&g.map_mu);
            if (base)
                munmap((void *)base, (size_t)ai->size);
            if (table)
                munmap((void *)table, (size_t)ai->tsize);
            return base ? KVP_ERR_NO_MEMORY : KVP_ERR_UNSUPPORTED;
        }
        m->ai = *ai;
        m->base = base;
        m->size = ai->size;
        m->table = table;
        m->nslots = nslots;
        find_filter(table, ai->tsize, nslots, &m->filter);
        m->refs = 1;
        pthread_mutex_lock(&g.mu);
        m->next = g.maps;
        g.maps = m;
        pthread_mutex_unlock(&g.mu);
        kvp_info("local reads: mapped the server's arena (%llu bytes)", (unsigned long long)ai->size);
    }
    pthread_mutex_unlock(&g.map_mu);
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
    munmap((void *)m->table, (size_t)m->ai.tsize);
    kvp__free(m, sizeof *m);
}

/* ---- the kvpool:// handle's side: setting local reads up, finishing a
 * GET_LOCAL, batching its release (client/remote_int.h) ----
 *
 * GETs answered as GET_LOCAL but copied are not yet released (r->rel, under
 * mu): their ids ride on the connection's next request (its released
 * field), or go in a RELEASE of their own once REL_FLUSH_NS has passed or
 * KVP_RELEASED_MAX have gathered; a lost connection drops them (its leases
 * end with its socket). */

/* How long a copied GET_LOCAL waits for a request to ride on before the
 * progress thread (which looks at least every 10 ms) releases it by a
 * message of its own (a RELEASE costs the client a send and the server a
 * wake-up, ~10 us; docs/transport.md §9). */
#define REL_FLUSH_NS 1000000ull

/* A RELEASE in flight (its header must live until UCX is done with it). */
typedef struct release_msg {
    kvp__mpw_t w;
    uint8_t buf[64];
} release_msg_t;

static void release_sent(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    release_msg_t *m = user_data;
    kvp__mpw_free(&m->w);
    kvp__free(m, sizeof *m);
    if (request)
        ucp_request_free(request);
}

/* Tells the server that GET_LOCALs ids[0..n) are copied, in one RELEASE
 * (never answered): req_id ids[0], the rest in its released field.  On a
 * connection that is gone there is nothing to tell: its leases end with
 * its socket. */
static void post_release(struct remote *r, int gen, const uint64_t *ids, uint32_t n)
{
    pthread_mutex_lock(&r->mu);
    if (gen != r->gen || !kvp__remote_do_ready(r)) {
        pthread_mutex_unlock(&r->mu);
        return;
    }
    ucp_ep_h ep = r->ep;
    uint64_t key = r->conn_key;
    r->senders++;
    pthread_mutex_unlock(&r->mu);
    release_msg_t *m = kvp__malloc(sizeof *m);
    if (m) {
        kvp__mpw_init(&m->w, m->buf, sizeof m->buf);
        kvp__wire_req_encode(&m->w, KVP_WOP_RELEASE, ids[0], 0, key, NULL, 0, NULL);
        if (n > 1 && kvp__wire_req_add_released(&m->w, ids + 1, n - 1) != 0)
            m->w.err = 1;
    }
    if (m && !m->w.err) {
        ucp_request_param_t prm = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS,
            .cb.send = release_sent,
            .user_data = m,
            .flags = UCP_AM_SEND_FLAG_REPLY,
        };
        int wl = kvp__remote_wlock_rd(&r->wlock);
        ucs_status_ptr_t sp = ucp_am_send_nbx(ep, KVP_AM_REQUEST, m->w.buf, m->w.len, NULL, 0, &prm);
        kvp__remote_wunlock(&r->wlock, wl);
        if (sp == NULL || UCS_PTR_IS_ERR(sp))
            release_sent(NULL, UCS_OK, m);
    } else {
        if (m)
            release_sent(NULL, UCS_OK, m);
        kvp_error("remote: out of memory releasing %u local reads; the server keeps their values until "
                  "the connection closes", n);
    }
    pthread_mutex_lock(&r->mu);
    kvp__remote_do_sent(r, gen);
    pthread_mutex_unlock(&r->mu);
}

/* Takes the queued releases (mu held); returns how many. */
static uint32_t do_take_released(struct remote *r, uint64_t *ids)
{
    uint32_t n = r->nrel;
    memcpy(ids, r->rel, n * sizeof *ids);
    r->nrel = 0;
    return n;
}

/* GET_LOCAL req_id's values are copied: queues its release. */
static void queue_release(struct remote *r, int gen, uint64_t req_id)
{
    uint64_t ids[KVP_RELEASED_MAX];
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    if (gen == r->gen && kvp__remote_do_ready(r)) {
        if (r->nrel == 0)
            r->rel_since_ns = kvp__now_ns();
        r->rel[r->nrel++] = req_id;
        if (r->nrel == KVP_RELEASED_MAX)
            n = do_take_released(r, ids);
    }
    pthread_mutex_unlock(&r->mu);
    if (n)
        post_release(r, gen, ids, n);
}

/* Progress thread: sends the releases that waited REL_FLUSH_NS for a
 * request to ride on.  Returns whether any are still queued. */
int kvp__lread_flush_released(struct remote *r, uint64_t now)
{
    uint64_t ids[KVP_RELEASED_MAX];
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    int gen = r->gen;
    if (r->nrel && now - r->rel_since_ns >= REL_FLUSH_NS)
        n = do_take_released(r, ids);
    int left = r->nrel > 0;
    pthread_mutex_unlock(&r->mu);
    if (n)
        post_release(r, gen, ids, n);
    return left;
}

/* A GET_LOCAL's reply is parsed (mu held; unlocks): copies the values out
 * of the mapped arena, releases the leases, finishes p. */
void kvp__lread_finish(struct remote *r, struct pending *p, kvp_status_t st)
{
    int gen = p->gen;
    uint64_t id = p->req_id;
    if (st == KVP_ERR_BUSY) { /* the server is holding too much: over the network then */
        p->repost = 1;
        st = KVP_OK;
    }
    /* The copy holds the connection: its socket, whose close would end the
     * server's leases, stays open until the copy is done. */
    int copy = st == KVP_OK && p->nsegs > 0 && !p->repost;
    int held = copy && kvp__remote_do_hold(r, gen);
    if (copy && !held)
        st = KVP_ERR_CONN_LOST; /* already closed: the bytes may have been reused */
    int release = p->release;
    (void)kvp__remote_do_advance(r, p, PEV_COPY); /* (never DONE: only this thread ends it now) */
    pthread_mutex_unlock(&r->mu);
    if (held) {
        kvp__lread_copy(p->segs, p->nsegs);
        /* Still leased all along?  The server bumps the slot's generation
         * before it lets leased bytes go (a lease past its deadline). */
        if (!kvp__lmap_still_leased(p->lmap, p->lr_slot, p->lr_gen)) {
            kvp_warn("remote: a local read outlived its lease (the server's deadline passed mid-copy)");
            st = KVP_ERR_TIMEOUT;
        }
    }
    if (release)
        queue_release(r, gen, id);
    pthread_mutex_lock(&r->mu);
    if (held)
        kvp__remote_do_sent(r, gen);
    p->status = p->timed_out ? KVP_ERR_TIMEOUT : st;
    opctx_t *f = kvp__remote_do_advance(r, p, PEV_REPLIED);
    pthread_mutex_unlock(&r->mu);
    kvp__remote_fire(f);
}

/* After the HELLO of connection gen: maps the server's arena and lease
 * table when it offers them (or keeps the mapping of the last connection
 * to the same server) and proves it to the server, so gets on gen can read
 * locally. */
void kvp__lread_setup(struct remote *r, int gen, uint64_t key, const kvp__arena_info_t *ai)
{
    pthread_mutex_lock(&r->mu);
    kvp__lmap_t *have = r->lmap;
    int same = ai && have && kvp__lmap_is(have, ai);
    pthread_mutex_unlock(&r->mu);
    kvp__lmap_t *m = NULL;
    if (ai && !same && kvp__lmap_get(ai, &m) != KVP_OK)
        m = NULL;
    pthread_mutex_lock(&r->mu);
    kvp__lmap_t *old = NULL;
    if (!same) {
        old = r->lmap;
        r->lmap = m;
    }
    m = r->lmap;
    if (m)
        kvp__lmap_ref(m);
    pthread_mutex_unlock(&r->mu);
    kvp__lmap_put(old);
    if (!m)
        return;
    uint8_t proof[KVP_WIRE_LR_PROOF];
    kvp__wire_lr_proof(kvp__lmap_nonce(m), key, proof);
    kvp_key_t pk = {proof, sizeof proof};
    kvp_status_t st = kvp__remote_run_request(r, KVP_WOP_LOCAL_PROOF, key, &pk, NULL);
    kvp__lmap_put(m);
    if (st != KVP_OK) {
        kvp_info("remote: the server did not take this process's local-read proof (%s); reading over UCX",
                 kvp_status_str(st));
        return;
    }
    pthread_mutex_lock(&r->mu);
    if (r->lmap && r->gen == gen && kvp__remote_do_ready(r))
        r->lmap_gen = gen;
    pthread_mutex_unlock(&r->mu);
}

