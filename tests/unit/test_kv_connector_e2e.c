/*
 * The KV connector end to end: two engine instances share a pool.  The
 * producer's scheduler asks the lookup service (ZeroMQ, the server hosted
 * in process as worker rank 0 hosts it), its worker saves a prompt's blocks;
 * the consumer's scheduler then finds the hit through the same service, and
 * its worker loads the blocks into its own (zeroed) KV cache.  Every loaded
 * byte is compared with what the producer computed.  Run over embedded://
 * and over kvpool:// (a real server process on 127.0.0.1).
 *
 * The request's block hashes are vLLM's (sha256_cbor, PYTHONHASHSEED "0");
 * the KV cache is the `tiny` shape: 2 layers, each a K/V-first tensor
 * (2, num_blocks, 16 tokens, 1 head, 8 dims) of 2-byte elements.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kvpool/hash.h"
#include "kvpool/kv_connector.h"
#include "server_harness.h"
#include "test.h"

#define NB 32       /* blocks per cache */
#define BS 16       /* tokens per block */
#define LAYERS 2
#define TOK_BYTES 16 /* 1 head x 8 dims x 2 B, per K or V */
#define LAYER_BYTES ((size_t)2 * NB * BS * TOK_BYTES)
#define PROMPT 100

typedef struct {
    uint8_t *layer[LAYERS];
    kvp_kv_cache_tensor_t t[LAYERS];
} cache_t;

static void cache_init(cache_t *c, uint8_t fill_seed)
{
    for (int l = 0; l < LAYERS; l++) {
        c->layer[l] = aligned_alloc(64, LAYER_BYTES);
        ASSERT(c->layer[l] != NULL);
        for (size_t i = 0; i < LAYER_BYTES; i++)
            c->layer[l][i] = fill_seed ? (uint8_t)(i * 131u + (unsigned)l * 7u + fill_seed) : 0;
        kvp_kv_cache_tensor_t *t = &c->t[l];
        memset(t, 0, sizeof *t);
        t->storage = c->layer[l];
        t->storage_bytes = LAYER_BYTES;
        t->elem_size = 2;
        t->ndim = 5;
        int64_t shape[5] = {2, NB, BS, 1, 8};
        int64_t stride[5] = {(int64_t)NB * BS * 8, BS * 8, 8, 8, 1};
        memcpy(t->shape, shape, sizeof shape);
        memcpy(t->stride, stride, sizeof stride);
    }
}

static void cache_free(cache_t *c)
{
    for (int l = 0; l < LAYERS; l++)
        free(c->layer[l]);
}

/* Block b's bytes of segment (layer l, K or V). */
static const uint8_t *block_at(const cache_t *c, int l, int kv, int64_t b)
{
    return c->layer[l] + (size_t)kv * NB * BS * TOK_BYTES + (size_t)b * BS * TOK_BYTES;
}

typedef struct {
    int64_t toks[PROMPT];
    uint8_t hashes[PROMPT / BS * 32];
    size_t nh;
    kvp_kv_request_t v;
} req_t;

static void req_init(req_t *r, const char *id)
{
    memset(r, 0, sizeof *r);
    for (int i = 0; i < PROMPT; i++)
        r->toks[i] = 500 + i * 3;
    kvp_hash_t none, h[PROMPT / BS];
    ASSERT_OK(kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, "0", 1, &none));
    size_t n = 0;
    ASSERT_OK(kvp_hash_request_blocks_i64(KVP_HASH_SHA256_CBOR, &none, r->toks, PROMPT, BS, NULL,
                                          h, PROMPT / BS, &n));
    ASSERT_EQ(n, PROMPT / BS);
    for (size_t i = 0; i < n; i++)
        memcpy(r->hashes + 32 * i, h[i].bytes, 32);
    r->nh = n;
    r->v.req_id = id;
    r->v.num_tokens = PROMPT;
    r->v.all_token_ids = r->toks;
    r->v.num_all_token_ids = PROMPT;
    r->v.block_hashes = r->hashes;
    r->v.num_block_hashes = n;
    r->v.hash_len = 32;
}

typedef struct {
    kvp_kv_sched_t *s;
    kvp_kv_worker_t *w;
    kvp_kv_lookup_zmq_t *zc;
    cache_t cache;
} instance_t;

static void instance_open(instance_t *in, kvp_pool_t *pool, const char *ep, kvp_kv_role_t role,
                          uint8_t fill_seed)
{
    kvp_kv_lookup_zmq_params_t zp;
    kvp_kv_lookup_zmq_params_init(&zp);
    zp.endpoint = ep;
    ASSERT_OK(kvp_kv_lookup_zmq_create(&zp, &in->zc));
    kvp_kv_config_t cfg;
    kvp_kv_config_init(&cfg);
    cfg.kv_role = role;
    cfg.model_name = "m";
    ASSERT_OK(kvp_kv_sched_create(&cfg, kvp_kv_lookup_zmq_client(in->zc), &in->s));
    kvp_kv_worker_params_t wp;
    kvp_kv_worker_params_init(&wp);
    wp.pool = pool;
    wp.role = role;
    wp.model_name = "/models/m/";
    wp.timeout_ms = 3000;
    ASSERT_OK(kvp_kv_worker_create(&wp, &in->w));
    cache_init(&in->cache, fill_seed);
    ASSERT_OK(kvp_kv_worker_register(in->w, in->cache.t, LAYERS, NB));
}

static void instance_close(instance_t *in)
{
    kvp_kv_worker_destroy(in->w);
    kvp_kv_sched_destroy(in->s);
    kvp_kv_lookup_zmq_destroy(in->zc);
    cache_free(&in->cache);
}

/* The lookup server's RESET joins the producer's pending saves. */
static kvp_status_t drain_worker(void *w) { return kvp_kv_worker_drain(w); }

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool has_id(const char *const *ids, size_t n, const char *id)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ids[i], id))
            return true;
    return false;
}

/* Steps the worker with empty metas until `id` is reported (sending or
 * receiving), at most 10 s. */
static void wait_reported(kvp_kv_worker_t *w, const char *id, bool sending)
{
    int64_t end = now_ms() + 10000;
    for (;;) {
        kvp_kv_finished_t f;
        ASSERT_OK(kvp_kv_worker_get_finished(w, NULL, NULL, 0, &f));
        if (sending ? has_id(f.sending, f.num_sending, id) : has_id(f.recving, f.num_recving, id))
            return;
        ASSERT_MSG(now_ms() < end, "%s never reported %s", id, sending ? "sent" : "received");
        sleep_ms(2);
    }
}

static void run_e2e(const char *uri)
{
    kvp_pool_t *pool;
    ASSERT_OK(kvp_pool_open(uri, &pool));
    char dir[] = "/tmp/kvp-e2e-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    char ep[256];
    ASSERT_OK(kvp_kv_lookup_ipc_endpoint(dir, 0, "testhost", 0, ep, sizeof ep));

    /* The lookup service over the pool, hosted by the producer's rank 0. */
    kvp_kv_lookup_pool_params_t lp;
    kvp_kv_lookup_pool_params_init(&lp);
    lp.model_name = "/models/m/";
    kvp_kv_lookup_pool_t *lk;
    ASSERT_OK(kvp_kv_lookup_pool_create(pool, &lp, &lk));

    instance_t prod, cons;
    instance_open(&prod, pool, ep, KVP_KV_ROLE_BOTH, 1);
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = ep;
    sp.lookup = lk;
    sp.drain = drain_worker;
    sp.drain_arg = prod.w;
    kvp_kv_lookup_server_t *srv;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &srv));
    instance_open(&cons, pool, ep, KVP_KV_ROLE_CONSUMER, 0);

    /* Producer: nothing stored yet, the prompt is computed and saved. */
    req_t a;
    req_init(&a, "A");
    int64_t num;
    bool async;
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(prod.s, &a.v, 0, &num, &async));
    ASSERT_EQ(num, 0);
    int64_t ids_a[7] = {3, 4, 5, 6, 7, 8, 9};
    kvp_kv_ids_t ga = {ids_a, 7};
    kvp_kv_blocks_t ba = {&ga, 1};
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(prod.s, &a.v, &ba, 0));
    kvp_kv_new_req_t na = {.req_id = "A", .num_computed_tokens = 0, .num_scheduled_tokens = PROMPT,
                           .block_ids = ba, .prompt_token_ids = a.toks,
                           .num_prompt_token_ids = PROMPT};
    kvp_kv_sched_output_t so = {.new_reqs = &na, .num_new_reqs = 1};
    const kvp_kv_meta_t *m;
    ASSERT_OK(kvp_kv_sched_build_connector_meta(prod.s, &so, &m));
    ASSERT_EQ(m->num_requests, 1);
    ASSERT(m->requests[0].can_save);
    kvp_kv_finished_t f;
    ASSERT_OK(kvp_kv_worker_get_finished(prod.w, m, NULL, 0, &f));

    /* A finishes: its blocks are held until the worker reports it sent. */
    bool delay;
    ASSERT_OK(kvp_kv_sched_request_finished(prod.s, "A", &ba, &delay));
    ASSERT(delay);
    const char *fin[1] = {"A"};
    kvp_kv_sched_output_t so2 = {.finished_req_ids = fin, .num_finished = 1};
    ASSERT_OK(kvp_kv_sched_build_connector_meta(prod.s, &so2, &m));
    ASSERT_OK(kvp_kv_worker_get_finished(prod.w, m, fin, 1, &f));
    if (!has_id(f.sending, f.num_sending, "A"))
        wait_reported(prod.w, "A", true);

    /* Consumer: the same prompt hits 96 tokens (six full blocks; 96 < 100,
     * so the last-token rule does not cut it) through the lookup service. */
    req_t b;
    req_init(&b, "B");
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(cons.s, &b.v, 0, &num, &async));
    ASSERT_EQ(num, 96);
    ASSERT(async);
    int64_t ids_b[7] = {20, 21, 22, 23, 24, 25, 26};
    kvp_kv_ids_t gb = {ids_b, 7};
    kvp_kv_blocks_t bb = {&gb, 1};
    ASSERT_OK(kvp_kv_sched_update_state_after_alloc(cons.s, &b.v, &bb, 96));
    kvp_kv_sched_output_t so3 = {0}; /* B waits for its remote KV: a deferred load (K13) */
    ASSERT_OK(kvp_kv_sched_build_connector_meta(cons.s, &so3, &m));
    ASSERT_EQ(m->num_requests, 1);
    ASSERT(m->requests[0].has_load_spec && m->requests[0].load_spec.can_load);
    ASSERT_OK(kvp_kv_worker_get_finished(cons.w, m, NULL, 0, &f));
    if (!has_id(f.recving, f.num_recving, "B"))
        wait_reported(cons.w, "B", false);
    const int64_t *errs;
    size_t nerr;
    ASSERT_OK(kvp_kv_worker_load_errors(cons.w, &errs, &nerr));
    ASSERT_EQ(nerr, 0);

    /* Every byte of the six loaded blocks is the producer's; the seventh
     * (the partial block, recomputed) and every other block stay zero. */
    for (int l = 0; l < LAYERS; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int64_t blk = 0; blk < NB; blk++) {
                const uint8_t *got = block_at(&cons.cache, l, kv, blk);
                int64_t src = -1;
                for (int i = 0; i < 6; i++)
                    if (ids_b[i] == blk)
                        src = ids_a[i];
                if (src >= 0) {
                    ASSERT_MEM_EQ(got, block_at(&prod.cache, l, kv, src), BS * TOK_BYTES);
                } else {
                    for (size_t i = 0; i < BS * TOK_BYTES; i++)
                        ASSERT_EQ(got[i], 0);
                }
            }
    kvp_kv_worker_stats_t ws;
    kvp_kv_worker_stats(prod.w, &ws);
    ASSERT_EQ(ws.blocks_saved, 6);
    kvp_kv_worker_stats(cons.w, &ws);
    ASSERT_EQ(ws.blocks_loaded, 6);

    /* RESET through the service: the producer's saves are joined, the pool
     * emptied, and the prompt no longer hits. */
    bool ok;
    ASSERT_OK(kvp_kv_sched_reset_cache(cons.s, &ok));
    ASSERT(ok);
    req_t c;
    req_init(&c, "C");
    ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(cons.s, &c.v, 0, &num, &async));
    ASSERT_EQ(num, 0);

    instance_close(&cons);
    kvp_kv_lookup_server_stop(srv);
    instance_close(&prod);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
    rmdir(dir);
}

TEST(test_e2e_embedded_save_lookup_load)
{
    run_e2e("embedded://?capacity=64MiB");
}

TEST(test_e2e_server_save_lookup_load)
{
    server_t s = {0};
    server_start(&s, "64MiB", 0, NULL);
    run_e2e(s.uri);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST_LIST(T(test_e2e_embedded_save_lookup_load), T(test_e2e_server_save_lookup_load))
