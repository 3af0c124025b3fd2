/*
 * `kvpool bench`: pool benchmarks against a memcpy baseline measured in the
 * same run.
 *
 * The workload is honest: puts use `count` distinct keys with distinct
 * contents; get first stores `count` objects (untimed), then reads each once in
 * random order into distinct, pre-faulted caller buffers; exists and prefix
 * run over a pool holding `count` keys with 90 % of probed keys present;
 * mixed is 80 % gets of stored objects and 20 % puts of new ones.  The memcpy
 * baseline is one thread copying the same `count` distinct sources into a
 * pre-faulted destination of the same footprint, so both are DRAM-bound.
 */
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "commands.h"
#include "common/clock.h"
#include "common/units.h"
#include "kvpool/pool.h"

typedef enum { OP_PUT, OP_GET, OP_MIXED, OP_EXISTS, OP_PREFIX } bench_op_t;

typedef struct {
    const char *uri;
    bench_op_t op;
    const char *op_name;
    uint64_t size;
    uint64_t count;
    int threads;
    int conns;          /* pool handles (connections); thread t uses handle t % conns */
    int json;
    uint32_t batch;
} bench_cfg_t;

typedef struct {
    kvp_pool_t *pool;
    const bench_cfg_t *cfg;
    char **srcs;        /* count distinct sources */
    char **dsts;        /* count distinct destinations */
    kvp_key_t *keys;    /* stored keys (and, for mixed, new keys after count) */
    kvp_key_t *absent;  /* never-stored keys (exists, prefix) */
    uint64_t *order;    /* permutation of op indices */
    uint8_t *is_put;    /* mixed: which ops are puts */
    uint64_t nops;      /* timed calls */
    kvp_key_t *probes;  /* exists/prefix: nops batches of `batch` keys, built before timing */
    uint32_t *probe_want; /* prefix: the expected answer of each batch */
    char *probe_bytes;  /* the probes' key bytes, contiguous per batch like a request message */
    size_t probe_bytes_len;
    _Atomic uint64_t next_new; /* mixed: next new key */
    _Atomic uint64_t examined;
    _Atomic uint64_t errors;
    _Atomic uint64_t bytes;
    pthread_barrier_t barrier;
} bench_t;

typedef struct {
    bench_t *b;
    kvp_pool_t *pool;   /* this thread's handle */
    int id;
    uint64_t from, to;  /* op range */
    double *lat_us;
    uint64_t nlat;
} worker_t;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A store key shaped like the KV connector's (ARCHITECTURE §3 namespaces). */
static kvp_key_t make_key(uint64_t i, uint64_t salt)
{
    char tmp[160];
    uint64_t s = i * 2654435761u + salt;
    int n = snprintf(tmp, sizeof tmp,
                     "bench-model@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@%016" PRIx64 "%016" PRIx64
                     "%016" PRIx64 "%016" PRIx64,
                     splitmix(&s), splitmix(&s), splitmix(&s), i);
    char *k = malloc((size_t)n);
    memcpy(k, tmp, (size_t)n);
    kvp_key_t key = {k, (uint32_t)n};
    return key;
}

static void fill(char *p, uint64_t size, uint64_t seed)
{
    uint64_t s = seed;
    uint64_t i = 0;
    for (; i + 8 <= size; i += 8) {
        uint64_t v = splitmix(&s);
        memcpy(p + i, &v, 8);
    }
    for (; i < size; i++)
        p[i] = (char)seed;
}

static char *alloc_buf(uint64_t size)
{
    char *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    /* Huge pages for the caller's buffers (serving engines pin large
     * host buffers); the memcpy baseline uses these same buffers. */
    (void)madvise(p, size, MADV_HUGEPAGE);
    return p;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void do_put(bench_t *b, kvp_pool_t *pool, kvp_key_t *key, char *src)
{
    kvp_iov_t iov = {src, b->cfg->size};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    kvp_status_t st = kvp_pool_put(pool, key, &sgl, 1, &r);
    if (st != KVP_OK || r.status != KVP_OK)
        atomic_fetch_add(&b->errors, 1);
    else
        atomic_fetch_add(&b->bytes, b->cfg->size);
}

static void do_get(bench_t *b, kvp_pool_t *pool, uint64_t k, char *dst)
{
    kvp_iov_t iov = {dst, b->cfg->size};
    kvp_sgl_t sgl = {&iov, 1};
    kvp_key_result_t r;
    kvp_status_t st = kvp_pool_get(pool, &b->keys[k], &sgl, 1, &r);
    if (st != KVP_OK || r.status != KVP_OK)
        atomic_fetch_add(&b->errors, 1);
    else
        atomic_fetch_add(&b->bytes, r.size);
}

/* Picks the keys of probe batch i of exists/prefix into out[] (pointing at
 * the stored key strings); returns how many of them are stored (prefix). */
static uint32_t probe_pick(bench_t *b, uint64_t i, kvp_key_t *out)
{
    uint32_t B = b->cfg->batch;
    uint64_t s = i + 77;
    if (b->cfg->op == OP_EXISTS) {
        for (uint32_t j = 0; j < B; j++) {
            uint64_t r = splitmix(&s);
            out[j] = (r % 10) < 9 ? b->keys[(r >> 8) % b->cfg->count] : b->absent[(r >> 8) % b->cfg->count];
        }
        return B;
    }
    /* prefix: a chain whose first 90 % is stored, then absent keys. */
    uint32_t present = B - B / 10;
    uint64_t start = (i * present) % (b->cfg->count > present ? b->cfg->count - present : 1);
    for (uint32_t j = 0; j < B; j++)
        out[j] = j < present ? b->keys[start + j] : b->absent[(start + j) % b->cfg->count];
    return present;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    bench_t *b = w->b;
    const bench_cfg_t *c = b->cfg;
    uint8_t *present = NULL;
    if (c->op == OP_EXISTS || c->op == OP_PREFIX)
        present = malloc(c->batch);
    pthread_barrier_wait(&b->barrier);
    uint64_t examined = 0;
    for (uint64_t i = w->from; i < w->to; i++) {
        uint64_t t0 = kvp__now_ns();
        switch (c->op) {
        case OP_PUT:
            do_put(b, w->pool, &b->keys[b->order[i]], b->srcs[b->order[i]]);
            break;
        case OP_GET:
            do_get(b, w->pool, b->order[i], b->dsts[b->order[i]]);
            break;
        case OP_MIXED:
            if (b->is_put[i]) {
                uint64_t n = atomic_fetch_add(&b->next_new, 1);
                do_put(b, w->pool, &b->keys[c->count + n], b->srcs[n % c->count]);
            } else {
                do_get(b, w->pool, b->order[i], b->dsts[b->order[i]]);
            }
            break;
        case OP_EXISTS: {
            uint32_t n = c->batch;
            if (kvp_pool_exists(w->pool, &b->probes[i * c->batch], n, present) != KVP_OK)
                atomic_fetch_add(&b->errors, 1);
            examined += n;
            break;
        }
        case OP_PREFIX: {
            uint32_t want = b->probe_want[i];
            size_t m = 0;
            if (kvp_pool_prefix(w->pool, &b->probes[i * c->batch], c->batch, &m) != KVP_OK || m != want)
                atomic_fetch_add(&b->errors, 1);
            examined += m + (m < c->batch);
            break;
        }
        }
        w->lat_us[w->nlat++] = (double)(kvp__now_ns() - t0) / 1e3;
    }
    atomic_fetch_add(&b->examined, examined);
    free(present);
    return NULL;
}

/* The memcpy baseline: one thread, count distinct sources into distinct,
 * pre-faulted destinations.  Returns GB/s. */
static double memcpy_baseline(bench_t *b)
{
    uint64_t n = b->cfg->count, size = b->cfg->size;
    uint64_t t0 = kvp__now_ns();
    for (uint64_t i = 0; i < n; i++)
        memcpy(b->dsts[b->order[i]], b->srcs[b->order[i]], size);
    double secs = (double)(kvp__now_ns() - t0) / 1e9;
    return (double)(n * size) / secs / 1e9;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: kvpool bench --uri URI --op put|get|mixed|exists|prefix --size BYTES --count N\n"
            "                    [--threads T] [--conns C] [--batch B] [--json]\n"
            "       kvpool bench --kv-scheduler [--json]   |   --ec-scheduler [--json]\n"
            "       kvpool bench --ec-push [--runs N] [--sizes BYTES,...] [--json]\n"
            "       kvpool bench --ec-reserve [--rounds N] [--per-round K] [--size BYTES] [--pool URI] [--json]\n"
            "       kvpool bench --lookup [--count N] [--json]\n"
            "  sizes accept B, KiB, MiB, GiB; --batch: keys per exists/prefix call (default 128)\n"
            "  --conns: pool handles the threads share round-robin (default 1; a kvpool:// URI\n"
            "  opens one connection per handle, so --conns T gives T independent clients)\n");
}

static int parse_args(int argc, char **argv, bench_cfg_t *c)
{
    memset(c, 0, sizeof *c);
    c->uri = "embedded://?capacity=4GiB";
    c->op_name = "put";
    c->size = 1 << 20;
    c->count = 2000;
    c->threads = 1;
    c->conns = 1;
    c->batch = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            c->json = 1;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 1;
        }
        if (!v) {
            fprintf(stderr, "kvpool bench: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--uri"))
            c->uri = v;
        else if (!strcmp(a, "--op"))
            c->op_name = v;
        else if (!strcmp(a, "--size")) {
            if (kvp__parse_size(v, &c->size) != KVP_OK || c->size == 0) {
                fprintf(stderr, "kvpool bench: bad --size '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--count")) {
            char *e;
            c->count = strtoull(v, &e, 10);
            if (*e || c->count == 0) {
                fprintf(stderr, "kvpool bench: bad --count '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            c->threads = atoi(v);
            if (c->threads < 1 || c->threads > 256) {
                fprintf(stderr, "kvpool bench: --threads must be 1..256\n");
                return 2;
            }
        } else if (!strcmp(a, "--conns")) {
            c->conns = atoi(v);
            if (c->conns < 1 || c->conns > 256) {
                fprintf(stderr, "kvpool bench: --conns must be 1..256\n");
                return 2;
            }
        } else if (!strcmp(a, "--batch")) {
            c->batch = (uint32_t)atoi(v);
            if (c->batch < 1 || c->batch > KVP_BATCH_MAX) {
                fprintf(stderr, "kvpool bench: --batch must be 1..%u\n", KVP_BATCH_MAX);
                return 2;
            }
        } else {
            fprintf(stderr, "kvpool bench: unknown option '%s'\n", a);
            usage();
            return 2;
        }
    }
    static const char *names[] = {"put", "get", "mixed", "exists", "prefix"};
    int found = 0;
    for (int k = 0; k < 5; k++)
        if (!strcmp(c->op_name, names[k])) {
            c->op = (bench_op_t)k;
            found = 1;
        }
    if (!found) {
        fprintf(stderr, "kvpool bench: unknown --op '%s'\n", c->op_name);
        return 2;
    }
    if (!c->batch)
        c->batch = 128;
    if ((c->op == OP_EXISTS || c->op == OP_PREFIX) && c->batch > c->count) {
        fprintf(stderr, "kvpool bench: --batch must not exceed --count\n");
        return 2;
    }
    return 0;
}

/* Adds prefault=true to embedded URIs that do not say (allowed by the bench
 * rules: the arena is faulted in before timing, like the memcpy target). */
static const char *bench_uri(const char *uri, char *buf, size_t len)
{
    if (strncmp(uri, "embedded://", 11) != 0 || strstr(uri, "prefault="))
        return uri;
    snprintf(buf, len, "%s%sprefault=true", uri, strchr(uri, '?') ? "&" : "?");
    return buf;
}

int kvp_bench_ec_push(int argc, char **argv); /* tools/bench_ec_push.c */

int kvp_cmd_bench(int argc, char **argv)
{
    /* Scheduler benchmarks live in their own files (bench_*.c). */
    for (int i = 1; i < argc; i++) {
        /* KVP_BENCH_HOOKS: one line per scheduler bench, e.g.
         * if (strcmp(argv[i], "--kv-scheduler") == 0) return kvp_bench_kv_scheduler(argc, argv); */
        if (strcmp(argv[i], "--kv-scheduler") == 0) return kvp_bench_kv_scheduler(argc, argv);
        if (strcmp(argv[i], "--lookup") == 0) return kvp_bench_lookup(argc, argv);
        if (strcmp(argv[i], "--kv-worker") == 0) return kvp_bench_kv_worker(argc, argv);
        if (strcmp(argv[i], "--ec-scheduler") == 0) return kvp_bench_ec_scheduler(argc, argv);
        if (strcmp(argv[i], "--ec-push") == 0) return kvp_bench_ec_push(argc, argv);
        if (strcmp(argv[i], "--ec-reserve") == 0) return kvp_bench_ec_reserve(argc, argv);
        (void)argv[i];
    }
    bench_cfg_t cfg;
    int rc = parse_args(argc, argv, &cfg);
    if (rc)
        return rc == 1 ? 0 : rc;

    char ubuf[2300];
    const char *uri = bench_uri(cfg.uri, ubuf, sizeof ubuf);
    bench_t b;
    memset(&b, 0, sizeof b);
    b.cfg = &cfg;
    if (cfg.conns > 1 && strncmp(uri, "kvpool://", 9) != 0) {
        fprintf(stderr, "kvpool bench: --conns needs a kvpool:// URI (handles of other URIs are separate pools)\n");
        return 2;
    }
    kvp_pool_t *pools[256];
    for (int i = 0; i < cfg.conns; i++) {
        kvp_status_t st = kvp_pool_open(uri, &pools[i]);
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool bench: cannot open %s: %s\n", cfg.uri, kvp_status_str(st));
            while (i > 0)
                kvp_pool_close(pools[--i]);
            return 1;
        }
    }
    b.pool = pools[0];
    uint64_t n = cfg.count;
    int bandwidth_op = cfg.op == OP_PUT || cfg.op == OP_GET || cfg.op == OP_MIXED;
    uint64_t nkeys = cfg.op == OP_MIXED ? n + n : n;
    b.keys = malloc(sizeof *b.keys * nkeys);
    b.absent = malloc(sizeof *b.absent * n);
    b.srcs = malloc(sizeof *b.srcs * n);
    b.dsts = malloc(sizeof *b.dsts * n);
    b.order = malloc(sizeof *b.order * n);
    b.is_put = calloc(n, 1);
    for (uint64_t i = 0; i < nkeys; i++)
        b.keys[i] = make_key(i, 1);
    for (uint64_t i = 0; i < n; i++)
        b.absent[i] = make_key(i, 999);
    /* Sources and destinations: one region each, `size` apart, pre-faulted. */
    uint64_t vsize = cfg.size;
    char *src_region = alloc_buf(n * vsize), *dst_region = alloc_buf(n * vsize);
    if (!src_region || !dst_region) {
        fprintf(stderr, "kvpool bench: cannot allocate %" PRIu64 " bytes of buffers\n", 2 * n * vsize);
        return 1;
    }
    for (uint64_t i = 0; i < n; i++) {
        b.srcs[i] = src_region + i * vsize;
        b.dsts[i] = dst_region + i * vsize;
        fill(b.srcs[i], vsize, i + 1);
        memset(b.dsts[i], 0, vsize);
    }
    uint64_t seed = 12345;
    for (uint64_t i = 0; i < n; i++)
        b.order[i] = i;
    for (uint64_t i = n; i > 1; i--) {
        uint64_t j = splitmix(&seed) % i, t = b.order[i - 1];
        b.order[i - 1] = b.order[j];
        b.order[j] = t;
    }
    /* Untimed preload for everything but put. */
    if (cfg.op != OP_PUT) {
        for (uint64_t i = 0; i < n; i++)
            do_put(&b, b.pool, &b.keys[i], b.srcs[i]);
        if (atomic_load(&b.errors)) {
            fprintf(stderr, "kvpool bench: preload failed for %" PRIu64 " keys (pool too small?)\n",
                    (uint64_t)atomic_load(&b.errors));
            return 1;
        }
        atomic_store(&b.bytes, 0);
    }
    kvp_pool_stats_t st_loaded;
    kvp_pool_stats(b.pool, &st_loaded);
    if (cfg.op == OP_MIXED)
        for (uint64_t i = 0; i < n; i++)
            b.is_put[i] = (splitmix(&seed) % 10) < 2;
    b.nops = (cfg.op == OP_EXISTS || cfg.op == OP_PREFIX) ? (n + cfg.batch - 1) / cfg.batch : n;
    if (cfg.op == OP_PREFIX && b.nops < 1000)
        b.nops = 1000;
    if (cfg.op == OP_EXISTS && b.nops < 1000)
        b.nops = 1000;

    /* Lookup probes are built before timing, each batch's key bytes copied
     * into one contiguous buffer, as a lookup request message carries them. */
    if (cfg.op == OP_EXISTS || cfg.op == OP_PREFIX) {
        uint64_t nk = b.nops * cfg.batch;
        b.probes = malloc(sizeof *b.probes * nk);
        b.probe_want = malloc(sizeof *b.probe_want * b.nops);
        b.probe_bytes_len = nk * (KVP_KEY_MAX > 160 ? 160 : KVP_KEY_MAX);
        b.probe_bytes = malloc(b.probe_bytes_len);
        kvp_key_t *pick = malloc(sizeof *pick * cfg.batch);
        char *at = b.probe_bytes;
        for (uint64_t i = 0; i < b.nops; i++) {
            b.probe_want[i] = probe_pick(&b, i, pick);
            for (uint32_t j = 0; j < cfg.batch; j++) {
                memcpy(at, pick[j].data, pick[j].len);
                b.probes[i * cfg.batch + j] = (kvp_key_t){at, pick[j].len};
                at += pick[j].len;
            }
        }
        free(pick);
    }
    pthread_barrier_init(&b.barrier, NULL, (unsigned)cfg.threads + 1);
    worker_t *ws = calloc((size_t)cfg.threads, sizeof *ws);
    pthread_t *tids = calloc((size_t)cfg.threads, sizeof *tids);
    for (int t = 0; t < cfg.threads; t++) {
        ws[t].b = &b;
        ws[t].pool = pools[t % cfg.conns];
        ws[t].id = t;
        ws[t].from = b.nops * (uint64_t)t / (uint64_t)cfg.threads;
        ws[t].to = b.nops * (uint64_t)(t + 1) / (uint64_t)cfg.threads;
        ws[t].lat_us = malloc(sizeof(double) * (ws[t].to - ws[t].from + 1));
        pthread_create(&tids[t], NULL, worker_main, &ws[t]);
    }
    pthread_barrier_wait(&b.barrier);
    uint64_t t0 = kvp__now_ns();
    for (int t = 0; t < cfg.threads; t++)
        pthread_join(tids[t], NULL);
    double secs = (double)(kvp__now_ns() - t0) / 1e9;

    /* Put's measurement of index memory (the pool holds count objects now). */
    kvp_pool_stats_t st_end;
    kvp_pool_stats(b.pool, &st_end);

    double *all = malloc(sizeof(double) * (b.nops + 1));
    uint64_t nl = 0;
    for (int t = 0; t < cfg.threads; t++) {
        memcpy(all + nl, ws[t].lat_us, sizeof(double) * ws[t].nlat);
        nl += ws[t].nlat;
    }
    qsort(all, nl, sizeof(double), cmp_double);
    double p50 = nl ? all[nl / 2] : 0, p99 = nl ? all[(nl * 99) / 100 < nl ? (nl * 99) / 100 : nl - 1] : 0;
    double ops = (double)b.nops / secs;
    double gbps = bandwidth_op ? (double)atomic_load(&b.bytes) / secs / 1e9 : 0.0;
    double keys_per_s = (double)atomic_load(&b.examined) / secs;

    /* The baseline, same run, same buffers (destinations re-zeroed not needed:
     * they were faulted in above). */
    double mc = memcpy_baseline(&b);
    double ratio = bandwidth_op && mc > 0 ? gbps / mc : 0.0;

    /* Index memory per object: the engine's own count, and the heap growth
     * seen by malloc while the objects were stored (both exclude keys). */
    kvp_pool_stats_t *ist = cfg.op == OP_PUT ? &st_end : &st_loaded;
    double key_avg = 0;
    for (uint64_t i = 0; i < n; i++)
        key_avg += b.keys[i].len;
    key_avg /= (double)n;
    double idx_per_obj = ist->live ? (double)ist->index_bytes / (double)ist->live - key_avg : 0;
    if (cfg.json) {
        printf("{\"op\":\"%s\",\"size\":%" PRIu64 ",\"count\":%" PRIu64 ",\"threads\":%d,"
               "\"ops_per_s\":%.1f,\"gbps\":%.3f,\"p50_us\":%.2f,\"p99_us\":%.2f,"
               "\"memcpy_gbps\":%.3f,\"ratio\":%.3f",
               cfg.op_name, cfg.size, cfg.count, cfg.threads, ops, gbps, p50, p99, mc, ratio);
        if (!bandwidth_op)
            printf(",\"keys_per_s\":%.1f,\"batch\":%u", keys_per_s, cfg.batch);
        printf(",\"errors\":%" PRIu64 ",\"index_bytes_per_obj\":%.1f,"
               "\"key_bytes\":%.1f,\"evicted\":%" PRIu64 "}\n",
               (uint64_t)atomic_load(&b.errors), idx_per_obj, key_avg, st_end.evicted);
    } else {
        char sz[32];
        kvp__format_size(cfg.size, sz, sizeof sz);
        printf("kvpool bench  %s  op=%s size=%s count=%" PRIu64 " threads=%d\n", cfg.uri, cfg.op_name,
               sz, cfg.count, cfg.threads);
        printf("  %.0f ops/s", ops);
        if (bandwidth_op)
            printf("  %.2f GB/s", gbps);
        else
            printf("  %.2f M keys/s (batch %u)", keys_per_s / 1e6, cfg.batch);
        printf("  p50 %.2f us  p99 %.2f us\n", p50, p99);
        printf("  memcpy baseline (1 thread, same footprint): %.2f GB/s", mc);
        if (bandwidth_op)
            printf("  ratio %.2f", ratio);
        printf("\n  index: %.1f B/object beyond the key (bucket arrays + shard table + object slab "
               "chunks, whole); key %.0f B; evicted %" PRIu64 "; errors %" PRIu64 "\n",
               idx_per_obj, key_avg, st_end.evicted, (uint64_t)atomic_load(&b.errors));
    }
    int failed = atomic_load(&b.errors) != 0;
    for (int t = 0; t < cfg.threads; t++)
        free(ws[t].lat_us);
    free(ws);
    free(tids);
    free(all);
    for (int i = 0; i < cfg.conns; i++)
        kvp_pool_close(pools[i]);
    for (uint64_t i = 0; i < nkeys; i++)
        free((void *)b.keys[i].data);
    for (uint64_t i = 0; i < n; i++)
        free((void *)b.absent[i].data);
    munmap(src_region, n * vsize);
    munmap(dst_region, n * vsize);
    free(b.keys);
    free(b.absent);
    free(b.srcs);
    free(b.dsts);
    free(b.order);
    free(b.is_put);
    free(b.probes);
    free(b.probe_want);
    free(b.probe_bytes);
    pthread_barrier_destroy(&b.barrier);
    return failed ? 1 : 0;
}
