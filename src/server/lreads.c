/*
 * Local reads: clients on this host copy get values out of the arena
 * themselves (docs/transport.md §9, docs/protocol.md §2).
 *
 * The arena is a sealed memfd (store/provider.c): another process may map
 * it read-only, never write, grow or shrink it.  Next to it the server
 * keeps a second sealed memfd, the lease table: a nonce, then one 64-bit
 * generation per slot (net/wire.h has the layout).  HELLO names both files
 * (pid, fd, size, dev, ino), but only to a client whose address is this
 * host's; such a client maps them and sends a LOCAL_PROOF (a hash of the
 * nonce and its connection key), and from then on, and only then, its
 * GET_LOCALs are served: the server leases every value it finds, as for a
 * GET, and answers with each value's offset in the arena instead of its
 * bytes, plus a slot of the table and that slot's generation.
 *
 * Life of a GET_LOCAL's leases (an lgroup):
 *   served    -> a slot taken, the leases held for the connection
 *   released  -> the client names its req_id (RELEASE, or the released field
 *                of a later request) after copying: leases end, slot free
 *   expired   -> LR_TTL_NS passed unreleased, or the socket closed: the
 *                slot's generation is bumped first, then the leases end
 * The reader checks the generation after its copy: unchanged means every
 * byte it read was still leased to it when it read it (the server bumps
 * before it lets the space go; the reader reads the bytes before the
 * generation), so a lease that expired mid-copy fails the get
 * (KVP_ERR_TIMEOUT) instead of returning bytes reused meanwhile.
 *
 * Bounds: LR_GROUPS_MAX unreleased GET_LOCALs, LR_LEASES_MAX leases and
 * bytes_max leased bytes per connection (one get alone always allowed),
 * LR_SLOTS for the whole server: past any, the key or request is answered
 * KVP_ERR_BUSY and the client reads over the network instead.  A release
 * is found by its req_id in O(1) (a hash keyed by a random seed); one naming
 * nothing is counted, and LR_BOGUS_MAX of them close the connection.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "server/server_int.h"

#define LR_SLOTS 65536u
#define LR_BUCKETS 16384u
#define LR_GROUPS_MAX 1024u                  /* unreleased GET_LOCALs per connection */
#define LR_LEASES_MAX 65536u                 /* leased values per connection */
#define LR_TTL_NS (10ull * 1000000000ull)    /* a GET_LOCAL's leases end this long after it, released or not */
#define LR_BOGUS_MAX 64u                     /* releases naming nothing before the connection is closed */

struct lgroup {
    kvp__list_t conn_link;   /* c->lgroups */
    kvp__list_t age_link;    /* s->lr.by_age */
    lgroup_t *hnext;         /* hash chain */
    conn_t *c;
    uint64_t req_id;
    uint64_t bytes;
    uint64_t expires_ns;
    uint32_t slot;
    uint32_t n, cap;
    kvp__lease_t *leases[];
};

static int lr_on(const server_t *s) { return s->lr.fd >= 0 && kvp__store_arena_fd(s->store) >= 0; }

static uint32_t bucket(const lreads_t *lr, uint64_t conn_id, uint64_t req_id)
{
    uint64_t h = (req_id ^ lr->seed) * 0x9e3779b97f4a7c15ull;
    h ^= conn_id * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 29;
    return (uint32_t)(h & (lr->nbuckets - 1));
}

/* The membership filter's size: --filter-bytes, else one byte per KiB of
 * arena (a counter per KiB: at 64 KiB values about 1 in 10^5 absent keys
 * is taken for present, at 4 KiB 1 in 6), within [64 KiB, 64 MiB]. */
#define FILTER_MIN (64ull << 10)
#define FILTER_MAX (64ull << 20)
static uint64_t filter_blocks(const kvp__server_params_t *p)
{
    if (p->no_filter)
        return 0;
    uint64_t bytes = p->filter_bytes ? p->filter_bytes : p->memory / 1024u;
    if (!p->filter_bytes)
        bytes = bytes < FILTER_MIN ? FILTER_MIN : bytes > FILTER_MAX ? FILTER_MAX : bytes;
    return bytes / KVP_CF_BLOCK;
}

kvp_status_t kvp__lr_init(server_t *s)
{
    lreads_t *lr = &s->lr;
    memset(lr, 0, sizeof *lr);
    lr->fd = -1;
    kvp__list_init(&lr->by_age);
    void *base;
    size_t len;
    kvp__store_arena(s->store, &base, &len);
    lr->bytes_max = len / 4;
    if (kvp__store_arena_fd(s->store) < 0)
        return KVP_OK; /* a private arena: no local reads */
    long pg = sysconf(_SC_PAGESIZE);
    size_t gens_end = (KVP_WIRE_LR_GEN_OFF + (size_t)LR_SLOTS * 8u + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
    uint64_t fblocks = filter_blocks(&s->p);
    size_t size = gens_end + (size_t)fblocks * KVP_CF_BLOCK;
    lr->free_slots = kvp__malloc(LR_SLOTS * sizeof *lr->free_slots);
    lr->buckets = kvp__calloc(LR_BUCKETS, sizeof *lr->buckets);
    if (!lr->free_slots || !lr->buckets)
        goto fail;
    int fd;
    uint8_t *p = kvp__mem_shared("kvpool-leases", size, 0, 1, &fd);
    if (!p || fd < 0 || kvp__random_bytes(p, KVP_WIRE_LR_NONCE) != KVP_OK) {
        kvp_warn("local reads: cannot set up the lease table (%s); local reads off", strerror(errno));
        if (p)
            munmap(p, size);
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    lr->fd = fd;
    lr->map = p;
    lr->size = size;
    lr->nslots = LR_SLOTS;
    uint64_t ns = LR_SLOTS;
    memcpy(lr->map + KVP_WIRE_LR_NSLOTS_OFF, &ns, sizeof ns);
    lr->gen = (_Atomic uint64_t *)(void *)(lr->map + KVP_WIRE_LR_GEN_OFF);
    for (uint32_t i = 0; i < LR_SLOTS; i++)
        lr->free_slots[i] = LR_SLOTS - 1 - i;
    lr->nfree = LR_SLOTS;
    lr->nbuckets = LR_BUCKETS;
    if (kvp__random_bytes(&lr->seed, sizeof lr->seed) != KVP_OK)
        goto fail;
    /* The membership filter, after the generations; the store keeps it
     * from the first put on.  Last: nothing after this may fail, since the
     * store writes into this mapping from now on (and the server unmaps it
     * only after the last request). */
    if (fblocks && kvp__store_set_filter(s->store, lr->map + gens_end, fblocks) == KVP_OK) {
        uint64_t off = gens_end;
        memcpy(lr->map + KVP_WIRE_LR_FILTER_OFF, &off, sizeof off);
        memcpy(lr->map + KVP_WIRE_LR_FILTER_BLOCKS_OFF, &fblocks, sizeof fblocks);
    }
    return KVP_OK;
fail:
    kvp__lr_destroy(s);
    return KVP_OK; /* (the server runs without local reads) */
}

static void group_end(server_t *s, lgroup_t *g, int bump)
{
    lreads_t *lr = &s->lr;
    if (bump) {
        /* Before the space can be reused: a reader that copied from it sees
         * the change when it looks after its copy. */
        atomic_fetch_add_explicit(&lr->gen[g->slot], 1, memory_order_release);
        atomic_thread_fence(memory_order_seq_cst);
    }
    for (uint32_t i = 0; i < g->n; i++)
        kvp__store_release(s->store, g->leases[i]);
    conn_t *c = g->c;
    lgroup_t **hp = &lr->buckets[bucket(lr, c->id, g->req_id)];
    while (*hp != g)
        hp = &(*hp)->hnext;
    *hp = g->hnext;
    kvp__list_del(&g->conn_link);
    kvp__list_del(&g->age_link);
    c->nlgroups--;
    c->lr_bytes -= g->bytes;
    c->lr_leases -= g->n;
    lr->ngroups--;
    lr->free_slots[lr->nfree++] = g->slot;
    atomic_fetch_sub(&s->ctr.local_leases, g->n);
    atomic_fetch_sub(&s->ctr.local_bytes, g->bytes);
    atomic_store(&s->ctr.local_groups, lr->ngroups);
    kvp__free(g, sizeof *g + g->cap * sizeof g->leases[0]);
}

void kvp__lr_destroy(server_t *s)
{
    lreads_t *lr = &s->lr;
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &lr->by_age)
        group_end(s, KVP_CONTAINER_OF(n, lgroup_t, age_link), 0);
    if (lr->map)
        munmap(lr->map, lr->size);
    if (lr->fd >= 0)
        close(lr->fd);
    kvp__free(lr->free_slots, LR_SLOTS * sizeof *lr->free_slots);
    kvp__free(lr->buckets, LR_BUCKETS * sizeof *lr->buckets);
    uint64_t bm = lr->bytes_max;
    memset(lr, 0, sizeof *lr);
    lr->fd = -1;
    lr->bytes_max = bm;
    kvp__list_init(&lr->by_age);
}

/* A file as HELLO names it: its fd in this process, size, device, inode. */
static void file_id(int fd, uint64_t size, uint64_t *fd_p, uint64_t *size_p, uint64_t *dev_p, uint64_t *ino_p)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        memset(&st, 0, sizeof st);
    *fd_p = (uint64_t)fd;
    *size_p = size;
    *dev_p = (uint64_t)st.st_dev;
    *ino_p = (uint64_t)st.st_ino;
}

const kvp__wire_arena_t *kvp__lr_hello(server_t *s, conn_t *c, kvp__wire_arena_t *a)
{
    if (!lr_on(s) || !c->peer_local)
        return NULL;
    void *base;
    size_t len;
    kvp__store_arena(s->store, &base, &len);
    a->pid = (uint64_t)getpid();
    file_id(kvp__store_arena_fd(s->store), len, &a->fd, &a->size, &a->dev, &a->ino);
    a->populated = !s->p.no_prefault;
    file_id(s->lr.fd, s->lr.size, &a->tfd, &a->tsize, &a->tdev, &a->tino);
    return a;
}

void kvp__lr_prove(server_t *s, conn_t *c, const kvp_key_t *proof)
{
    if (lr_on(s) && c->peer_local && proof && proof->len == KVP_WIRE_LR_PROOF) {
        uint8_t want[KVP_WIRE_LR_PROOF];
        kvp__wire_lr_proof(s->lr.map, c->key, want);
        if (CRYPTO_memcmp(want, proof->data, sizeof want) == 0) {
            c->lr_proven = 1;
            return;
        }
    }
    atomic_fetch_add(&s->ctr.bad_requests, 1);
    kvp_warn_rl("server: conn %llu: local-read proof refused", (unsigned long long)c->id);
}

void kvp__lr_get(server_t *s, conn_t *c, const kvp__wire_req_t *rq)
{
    lreads_t *lr = &s->lr;
    uint32_t n = rq->nkeys, cap = n ? n : 1;
    if (!lr_on(s) || !c->lr_proven) {
        atomic_fetch_add(&s->ctr.bad_requests, 1);
        kvp_warn_rl("server: conn %llu sent a local read, but %s", (unsigned long long)c->id,
                    lr_on(s) ? "has not shown that it maps the arena" : "this server's arena is private");
        kvp__reply_status(s, c, rq->op, rq->req_id, KVP_ERR_PROTOCOL);
        return;
    }
    if (c->nlgroups >= LR_GROUPS_MAX || c->lr_leases + n > LR_LEASES_MAX || lr->nfree == 0) {
        kvp_info_rl("server: conn %llu holds %u unreleased local reads (%llu leases); refusing more",
                    (unsigned long long)c->id, c->nlgroups, (unsigned long long)c->lr_leases);
        kvp__reply_status(s, c, rq->op, rq->req_id, KVP_ERR_BUSY);
        return;
    }
    reply_t *r = kvp__reply_new(s, c, rq->op);
    if (!r)
        return;
    lgroup_t *g = kvp__malloc(sizeof *g + cap * sizeof g->leases[0]);
    if (!g) {
        kvp__wire_reply_status_encode(&r->w, rq->op, rq->req_id, KVP_ERR_NO_MEMORY);
        kvp__reply_send(r);
        return;
    }
    *g = (lgroup_t){.c = c, .req_id = rq->req_id, .cap = cap};
    void *arena = NULL;
    size_t arena_len = 0;
    kvp__store_arena(s->store, &arena, &arena_len);
    kvp__wire_reply_local_begin(&r->w, rq->req_id, n);
    for (uint32_t i = 0; i < n; i++) {
        const void *p;
        uint64_t size;
        kvp__lease_t *l;
        kvp_status_t st = kvp__store_acquire(s->store, rq->keys[i].data, rq->keys[i].len, &p, &size, &l);
        if (st == KVP_OK && size > rq->sizes[i])
            st = KVP_ERR_BUFFER_TOO_SMALL;
        else if (st == KVP_OK && (c->lr_bytes || g->bytes) && c->lr_bytes + g->bytes + size > lr->bytes_max)
            st = KVP_ERR_BUSY; /* (this client reads it over the network instead) */
        if (st == KVP_OK) {
            g->leases[g->n++] = l;
            g->bytes += size;
        } else if (l) {
            kvp__store_release(s->store, l);
        }
        kvp__wire_reply_local_item(&r->w, st, size,
                                   st == KVP_OK ? (uint64_t)((const uint8_t *)p - (const uint8_t *)arena) : 0);
    }
    if (g->n == 0) {
        kvp__free(g, sizeof *g + g->cap * sizeof g->leases[0]);
        kvp__wire_reply_local_end(&r->w, 0, 0);
        kvp__reply_send(r);
        return;
    }
    g->slot = lr->free_slots[--lr->nfree];
    g->expires_ns = kvp__now_ns() + LR_TTL_NS;
    kvp__wire_reply_local_end(&r->w, g->slot, atomic_load_explicit(&lr->gen[g->slot], memory_order_relaxed));
    lgroup_t **b = &lr->buckets[bucket(lr, c->id, g->req_id)];
    g->hnext = *b;
    *b = g;
    kvp__list_add_tail(&c->lgroups, &g->conn_link);
    kvp__list_add_tail(&lr->by_age, &g->age_link);
    c->nlgroups++;
    c->lr_bytes += g->bytes;
    c->lr_leases += g->n;
    lr->ngroups++;
    atomic_fetch_add(&s->ctr.local_leases, g->n);
    atomic_fetch_add(&s->ctr.local_bytes, g->bytes);
    atomic_store(&s->ctr.local_groups, lr->ngroups);
    atomic_fetch_add(&s->ctr.bytes_out, g->bytes);
    s->local_replied += g->bytes;
    kvp__reply_send(r);
}

void kvp__lr_release(server_t *s, conn_t *c, uint64_t req_id)
{
    lreads_t *lr = &s->lr;
    if (lr->nbuckets) {
        for (lgroup_t *g = lr->buckets[bucket(lr, c->id, req_id)]; g; g = g->hnext)
            if (g->c == c && g->req_id == req_id) {
                group_end(s, g, 0);
                return;
            }
    }
    atomic_fetch_add(&s->ctr.bad_requests, 1);
    atomic_fetch_add(&s->ctr.local_bogus, 1);
    kvp_warn_rl("server: conn %llu released request %llu, which holds no leases", (unsigned long long)c->id,
                (unsigned long long)req_id);
    if (++c->lr_bogus > LR_BOGUS_MAX && kvp__conn_live(c))
        kvp__conn_kill(s, c, "too many releases of requests that hold no leases");
}

void kvp__lr_release_all(server_t *s, conn_t *c)
{
    KVP_LIST_FOR_EACH_SAFE(n, tmp, &c->lgroups)
        group_end(s, KVP_CONTAINER_OF(n, lgroup_t, conn_link), 1);
}

void kvp__lr_reap(server_t *s, uint64_t now)
{
    kvp__list_t *n;
    while ((n = kvp__list_first(&s->lr.by_age))) {
        lgroup_t *g = KVP_CONTAINER_OF(n, lgroup_t, age_link);
        if (g->expires_ns > now)
            break;
        kvp_warn_rl("server: conn %llu never released local read %llu; its leases end now (deadline)",
                    (unsigned long long)g->c->id, (unsigned long long)g->req_id);
        atomic_fetch_add(&s->ctr.local_expired, 1);
        group_end(s, g, 1);
    }
}
