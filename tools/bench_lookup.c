/*
 * `kvpool bench --lookup [--count N] [--blocks B] [--json]`
 *
 * The round trip of a LOOKUP over ipc (issue 13's number: p50 <= 2x a bare
 * ZeroMQ round trip): an embedded pool holding the B (default 1,000) blocks
 * of one request, a lookup server in this process over ipc, and N (default
 * 2,000) blocking lookups of all B blocks through the ZeroMQ client
 * (kvp_kv_lookup_zmq_query: the client's I/O thread, the wire, the server's
 * pool lookup of B keys, the reply).  In the same run, interleaved in rounds
 * of 100 so that both see the same machine, a bare REQ/REP round trip of the
 * same frames against a REP thread that answers 4 bytes (REQ and REP in two
 * ZeroMQ contexts, as in the service: see start()), the pool lookup
 * alone (kvp_kv_lookup_pool_query in process), and the bare round trip with
 * that pool lookup run by the REP thread before it answers: the lookup's p50
 * minus this last one is what the service itself (client, server, frames)
 * adds to a round trip and a pool lookup.  And the scheduler's
 * get_num_new_matched_tokens with a blocking lookup through the same client
 * (issue 13: it adds no more than the round trip): its p50 minus the
 * lookup's is what the scheduler adds.  --json prints one compact JSON
 * object as the last line of stdout.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "commands.h"
#include "common/clock.h"
#include "kvpool/kv_connector.h"

#define BS 16
#define HL 32
#define ROUND 100

typedef struct {
    uint32_t blocks, count;
    bool json;
    uint8_t *hashes;
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk, *ref, *echo_lk;
    _Atomic bool echo_lookup; /* the REP thread runs the pool lookup before answering */
    kvp_kv_lookup_server_t *srv;
    kvp_kv_lookup_zmq_t *cli;
    kvp_kv_sched_t *sched;
    void *zctx, *zctx_req, *rep, *req;
    pthread_t echo;
    char dir[64], bare_ep[128];
} lb_t;

static int die(const char *what, kvp_status_t st)
{
    fprintf(stderr, "kvpool bench --lookup: %s: %s\n", what, kvp_status_str(st));
    return 1;
}

static void *echo_main(void *arg)
{
    lb_t *b = arg;
    static const uint8_t hit[4] = {0, 0, 0, 0};
    for (;;) {
        for (int more = 1; more;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, b->rep, 0) < 0) {
                zmq_msg_close(&m);
                return NULL;
            }
            more = zmq_msg_more(&m);
            zmq_msg_close(&m);
        }
        if (atomic_load(&b->echo_lookup)) {
            kvp_kv_lookup_result_t r;
            kvp_kv_lookup_pool_query(b->echo_lk, (int64_t)b->blocks * BS + 1, b->hashes, b->blocks,
                                     HL, true, &r);
        }
        if (zmq_send(b->rep, hit, sizeof hit, 0) < 0)
            return NULL;
    }
}

/* The pool with the request's blocks under the keys a worker would write. */
static kvp_status_t fill_pool(lb_t *b)
{
    kvp_status_t st = kvp_pool_open("embedded://?capacity=64MiB", &b->pool);
    static uint8_t one = 1;
    kvp_iov_t iov = {&one, 1};
    kvp_sgl_t v = {&iov, 1};
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; st == KVP_OK && i < b->blocks; i++) {
        kvp_kv_store_key_t k;
        memset(&k, 0, sizeof k);
        k.model_name = "bench";
        k.model_name_len = 5;
        k.hash.len = HL;
        for (int j = 0; j < HL; j++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            b->hashes[(size_t)i * HL + (size_t)j] = k.hash.bytes[j] = (uint8_t)x;
        }
        char s[KVP_KV_STORE_KEY_MAX + 1];
        kvp_key_result_t res;
        st = kvp_kv_store_key_format(&k, s, sizeof s, NULL);
        kvp_key_t key = kvp_key_str(s);
        if (st == KVP_OK)
            st = kvp_pool_put(b->pool, &key, &v, 1, &res);
        if (st == KVP_OK)
            st = res.status;
    }
    kvp_kv_lookup_pool_params_t p;
    kvp_kv_lookup_pool_params_init(&p);
    p.model_name = "bench";
    p.block_size = p.hash_block_size = BS;
    if (st == KVP_OK)
        st = kvp_kv_lookup_pool_create(b->pool, &p, &b->lk);
    if (st == KVP_OK)
        st = kvp_kv_lookup_pool_create(b->pool, &p, &b->ref);
    if (st == KVP_OK)
        st = kvp_kv_lookup_pool_create(b->pool, &p, &b->echo_lk);
    return st;
}

static kvp_status_t start(lb_t *b)
{
    snprintf(b->dir, sizeof b->dir, "/tmp/kvpool-bench-lookup-XXXXXX");
    if (!mkdtemp(b->dir))
        return KVP_ERR_IO;
    char ep[256];
    kvp_status_t st = kvp_kv_lookup_ipc_endpoint(b->dir, 0, "bench", 0, ep, sizeof ep);
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = ep;
    sp.lookup = b->lk;
    if (st == KVP_OK)
        st = kvp_kv_lookup_server_start(&sp, &b->srv);
    kvp_kv_lookup_zmq_params_t cp;
    kvp_kv_lookup_zmq_params_init(&cp);
    cp.endpoint = ep;
    if (st == KVP_OK)
        st = kvp_kv_lookup_zmq_create(&cp, &b->cli);
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.model_name = "bench";
    if (st == KVP_OK)
        st = kvp_kv_sched_create(&cfg, kvp_kv_lookup_zmq_client(b->cli), &b->sched);
    if (st != KVP_OK)
        return st;
    snprintf(b->bare_ep, sizeof b->bare_ep, "ipc://%s/bare", b->dir);
    /* Two contexts, as the service has (the scheduler's client and the
     * worker's server are two processes, each with its own I/O thread):
     * one shared context would carry both ends on one I/O thread and make
     * the bare trip a thread hop shorter than any real one. */
    b->zctx = zmq_ctx_new();
    b->zctx_req = zmq_ctx_new();
    b->rep = zmq_socket(b->zctx, ZMQ_REP);
    b->req = zmq_socket(b->zctx_req, ZMQ_REQ);
    int linger = 0;
    zmq_setsockopt(b->rep, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(b->req, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_bind(b->rep, b->bare_ep) != 0 || zmq_connect(b->req, b->bare_ep) != 0 ||
        pthread_create(&b->echo, NULL, echo_main, b) != 0)
        return KVP_ERR_IO;
    return KVP_OK;
}

static void stop(lb_t *b)
{
    if (b->zctx) {
        zmq_ctx_shutdown(b->zctx);
        pthread_join(b->echo, NULL);
        zmq_close(b->req);
        zmq_close(b->rep);
        zmq_ctx_term(b->zctx_req);
        zmq_ctx_term(b->zctx);
    }
    kvp_kv_sched_destroy(b->sched);
    kvp_kv_lookup_zmq_destroy(b->cli);
    kvp_kv_lookup_server_stop(b->srv);
    kvp_kv_lookup_pool_destroy(b->lk);
    kvp_kv_lookup_pool_destroy(b->ref);
    kvp_kv_lookup_pool_destroy(b->echo_lk);
    if (b->pool)
        kvp_pool_close(b->pool);
    if (b->bare_ep[0])
        unlink(b->bare_ep + 6); /* (libzmq leaves the file behind) */
    if (b->dir[0])
        rmdir(b->dir);
}

static const uint8_t g_hdr_hl[2] = {0, HL};

/* One bare round trip of the LOOKUP's frames; 0 or -1. */
static int bare_rtt(lb_t *b, const uint8_t nt[4])
{
    uint8_t out[8];
    if (zmq_send(b->req, "lookup", 6, ZMQ_SNDMORE) < 0 ||
        zmq_send(b->req, nt, 4, ZMQ_SNDMORE) < 0 ||
        zmq_send(b->req, g_hdr_hl, 2, ZMQ_SNDMORE) < 0 ||
        zmq_send(b->req, b->hashes, (size_t)b->blocks * HL, 0) < 0)
        return -1;
    return zmq_recv(b->req, out, sizeof out, 0) == 4 ? 0 : -1;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, c = *(const uint64_t *)y;
    return a < c ? -1 : a > c;
}

static double pct_us(uint64_t *ns, uint32_t n, double p)
{
    qsort(ns, n, sizeof *ns, cmp_u64);
    size_t i = (size_t)(p * (n - 1) + 0.5);
    return (double)ns[i] / 1e3;
}

/* The five measurements, interleaved by rounds; -1 on a failure. */
static int measure(lb_t *b, uint64_t *lat, uint64_t *bare, uint64_t *local, uint64_t *both,
                   uint64_t *sched)
{
    int64_t tokens = (int64_t)b->blocks * BS + 1, want = (int64_t)b->blocks * BS;
    uint8_t nt[4] = {(uint8_t)(tokens >> 24), (uint8_t)(tokens >> 16), (uint8_t)(tokens >> 8),
                     (uint8_t)tokens};
    size_t nh = b->blocks;
    for (int w = 0; w < 50; w++) { /* warm-up: sockets, scratch buffers, caches */
        int64_t hit = -1;
        if (kvp_kv_lookup_zmq_query(b->cli, tokens, b->hashes, nh, HL, &hit) != KVP_OK ||
            hit != want || bare_rtt(b, nt) != 0)
            return -1;
    }
    for (uint32_t done = 0; done < b->count;) {
        uint32_t n = b->count - done < ROUND ? b->count - done : ROUND;
        for (uint32_t i = 0; i < n; i++) {
            int64_t hit = -1;
            uint64_t t0 = kvp__now_ns();
            kvp_status_t st = kvp_kv_lookup_zmq_query(b->cli, tokens, b->hashes, nh, HL, &hit);
            lat[done + i] = kvp__now_ns() - t0;
            if (st != KVP_OK || hit != want) {
                fprintf(stderr, "kvpool bench --lookup: hit %lld, expected %lld (%s)\n",
                        (long long)hit, (long long)want, kvp_status_str(st));
                return -1;
            }
        }
        for (uint32_t i = 0; i < n; i++) {
            uint64_t t0 = kvp__now_ns();
            if (bare_rtt(b, nt) != 0)
                return -1;
            bare[done + i] = kvp__now_ns() - t0;
        }
        atomic_store(&b->echo_lookup, true);
        for (uint32_t i = 0; i < n; i++) {
            uint64_t t0 = kvp__now_ns();
            if (bare_rtt(b, nt) != 0)
                return -1;
            both[done + i] = kvp__now_ns() - t0;
        }
        atomic_store(&b->echo_lookup, false);
        for (uint32_t i = 0; i < n; i++) {
            kvp_kv_lookup_result_t r;
            uint64_t t0 = kvp__now_ns();
            kvp_kv_lookup_pool_query(b->ref, tokens, b->hashes, nh, HL, true, &r);
            local[done + i] = kvp__now_ns() - t0;
        }
        kvp_kv_request_t rq = {.req_id = "bench", .num_tokens = tokens, .block_hashes = b->hashes,
                               .num_block_hashes = nh, .hash_len = HL};
        for (uint32_t i = 0; i < n; i++) {
            int64_t num = -1;
            bool async;
            uint64_t t0 = kvp__now_ns();
            kvp_status_t st = kvp_kv_sched_get_num_new_matched_tokens(b->sched, &rq, 0, &num, &async);
            sched[done + i] = kvp__now_ns() - t0;
            if (st != KVP_OK || num != want) {
                fprintf(stderr, "kvpool bench --lookup: scheduler matched %lld, expected %lld\n",
                        (long long)num, (long long)want);
                return -1;
            }
        }
        done += n;
    }
    return 0;
}

int kvp_bench_lookup(int argc, char **argv)
{
    lb_t b;
    memset(&b, 0, sizeof b);
    b.blocks = 1000;
    b.count = 2000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--lookup"))
            continue;
        if (!strcmp(a, "--json")) {
            b.json = true;
            continue;
        }
        long v = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : 0;
        if ((!strcmp(a, "--count") || !strcmp(a, "--blocks")) && v >= 1 && v <= 1000000) {
            *(a[2] == 'c' ? &b.count : &b.blocks) = (uint32_t)v;
            i++;
            continue;
        }
        fprintf(stderr, "usage: kvpool bench --lookup [--count N] [--blocks B] [--json]\n");
        return 2;
    }
    b.hashes = calloc(b.blocks, HL);
    uint64_t *lat = calloc(b.count, sizeof *lat), *bare = calloc(b.count, sizeof *bare),
             *local = calloc(b.count, sizeof *local), *both = calloc(b.count, sizeof *both),
             *sched = calloc(b.count, sizeof *sched);
    int rc = 1;
    kvp_status_t st = b.hashes && lat && bare && local && both && sched ? fill_pool(&b) : KVP_ERR_NO_MEMORY;
    if (st != KVP_OK)
        rc = die("pool", st);
    else if ((st = start(&b)) != KVP_OK)
        rc = die("server", st);
    else if (measure(&b, lat, bare, local, both, sched) == 0)
        rc = 0;
    stop(&b);
    if (rc == 0) {
        double p50 = pct_us(lat, b.count, 0.5), p99 = pct_us(lat, b.count, 0.99);
        double z50 = pct_us(bare, b.count, 0.5), z99 = pct_us(bare, b.count, 0.99);
        double l50 = pct_us(local, b.count, 0.5), b50 = pct_us(both, b.count, 0.5);
        double s50 = pct_us(sched, b.count, 0.5);
        printf("lookup of %u blocks over ipc: p50 %.1f us, p99 %.1f us (%u round trips)\n",
               b.blocks, p50, p99, b.count);
        printf("bare ZeroMQ REQ/REP, same frames: p50 %.1f us, p99 %.1f us\n", z50, z99);
        printf("pool lookup alone (in process): p50 %.1f us\n", l50);
        printf("bare REQ/REP whose REP runs the same pool lookup: p50 %.1f us "
               "(the service's own cost: %.1f us)\n", b50, p50 - b50);
        printf("scheduler get_num_new_matched_tokens, blocking lookup: p50 %.1f us "
               "(adds %.1f us to the lookup)\n", s50, s50 - p50);
        printf("lookup p50 / bare p50: %.2fx (target <= 2x)\n", p50 / z50);
        if (b.json)
            printf("{\"blocks\":%u,\"count\":%u,\"lookup_p50_us\":%.2f,\"lookup_p99_us\":%.2f,"
                   "\"zmq_rtt_us\":%.2f,\"zmq_p99_us\":%.2f,\"pool_lookup_p50_us\":%.2f,"
                   "\"zmq_rtt_with_pool_lookup_us\":%.2f,\"sched_lookup_p50_us\":%.2f,"
                   "\"ratio\":%.3f}\n",
                   b.blocks, b.count, p50, p99, z50, z99, l50, b50, s50, p50 / z50);
    }
    free(b.hashes);
    free(lat);
    free(bare);
    free(local);
    free(both);
    free(sched);
    return rc;
}
