/*
 * The lookup service over ZeroMQ (src/kv/kv_lookup_server.c, the client
 * src/kv/kv_lookup_zmq.c, the frames src/kv/kv_lookup_wire.c): the C client
 * against the C server over ipc and tcp with a real embedded:// pool, raw
 * ZeroMQ peers for what a well-behaved side never does (garbage frames,
 * replies that never come, odd reply sizes), and the socket-file rules.
 *
 * Blocks are stored the way a worker stores them: a pool put under the key
 * kvp_kv_store_key_format gives (model "m", every rank field 0), so server
 * and test meet only in the store.  Expected hits come from a second
 * in-process lookup on the same pool (kvp_kv_lookup_pool_query).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <zmq.h>

#include "common/clock.h"
#include "kvpool/kv_connector.h"
#include "kvpool/pool.h"
#include "test.h"

#define BS 16
#define HL 32
#define NB 12 /* blocks per test request */

typedef struct fx {
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;  /* the server's */
    kvp_kv_lookup_pool_t *ref; /* the test's (expected hits) */
    kvp_kv_lookup_server_t *srv;
    kvp_kv_lookup_zmq_t *cli;
    char dir[64];
    char ep[256];
    uint8_t hashes[NB * HL];
} fx_t;

static void make_hashes(uint8_t *h, size_t n, uint8_t salt)
{
    for (size_t i = 0; i < n * HL; i++)
        h[i] = (uint8_t)(i * 131u + salt * 7u + (i / HL) * 17u);
}

static void put_block(kvp_pool_t *pool, const uint8_t *hash)
{
    kvp_kv_store_key_t k;
    memset(&k, 0, sizeof k);
    k.model_name = "m";
    k.model_name_len = 1;
    k.hash.len = HL;
    memcpy(k.hash.bytes, hash, HL);
    char s[KVP_KV_STORE_KEY_MAX + 1];
    ASSERT_OK(kvp_kv_store_key_format(&k, s, sizeof s, NULL));
    static uint8_t one = 1;
    kvp_key_t key = kvp_key_str(s);
    kvp_iov_t iov = {&one, 1};
    kvp_sgl_t v = {&iov, 1};
    kvp_key_result_t res;
    ASSERT_OK(kvp_pool_put(pool, &key, &v, 1, &res));
    ASSERT_OK(res.status);
}

static void open_lookup(kvp_pool_t *pool, kvp_kv_lookup_pool_t **lk_p)
{
    kvp_kv_lookup_pool_params_t p;
    kvp_kv_lookup_pool_params_init(&p);
    p.model_name = "/models/m";
    p.block_size = BS;
    p.hash_block_size = BS;
    ASSERT_OK(kvp_kv_lookup_pool_create(pool, &p, lk_p));
}

static void tmpdir(fx_t *f)
{
    snprintf(f->dir, sizeof f->dir, "/tmp/kvp-lk-XXXXXX");
    ASSERT(mkdtemp(f->dir));
}

/* The pool with blocks [0, present) of the request stored, except `hole`
 * (-1: none), a server at ep (NULL: ipc in a temp dir) and a client. */
static void fx_open(fx_t *f, const char *ep, int present, int hole)
{
    memset(f, 0, sizeof *f);
    tmpdir(f);
    make_hashes(f->hashes, NB, 1);
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &f->pool));
    for (int b = 0; b < present; b++)
        if (b != hole)
            put_block(f->pool, f->hashes + b * HL);
    open_lookup(f->pool, &f->lk);
    open_lookup(f->pool, &f->ref);
    if (ep)
        snprintf(f->ep, sizeof f->ep, "%s", ep);
    else
        ASSERT_OK(kvp_kv_lookup_ipc_endpoint(f->dir, 0, "testhost", 0, f->ep, sizeof f->ep));
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = f->ep;
    sp.lookup = f->lk;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &f->srv));
    kvp_kv_lookup_zmq_params_t cp;
    kvp_kv_lookup_zmq_params_init(&cp);
    cp.endpoint = kvp_kv_lookup_server_endpoint(f->srv);
    cp.timeout_ms = 3000;
    ASSERT_OK(kvp_kv_lookup_zmq_create(&cp, &f->cli));
}

static void fx_close(fx_t *f)
{
    kvp_kv_lookup_zmq_destroy(f->cli);
    kvp_kv_lookup_server_stop(f->srv);
    kvp_kv_lookup_pool_destroy(f->lk);
    kvp_kv_lookup_pool_destroy(f->ref);
    kvp_pool_close(f->pool);
    rmdir(f->dir);
}

static int64_t expected(fx_t *f, int64_t num_tokens, size_t nh)
{
    kvp_kv_lookup_result_t r;
    ASSERT_OK(kvp_kv_lookup_pool_query(f->ref, num_tokens, f->hashes, nh, nh ? HL : 0, true, &r));
    return r.hit_tokens;
}

static kvp_kv_request_t req_of(fx_t *f, const char *id, int64_t num_tokens, size_t nh)
{
    return (kvp_kv_request_t){.req_id = id, .num_tokens = num_tokens, .block_hashes = f->hashes,
                              .num_block_hashes = nh, .hash_len = HL};
}

/* Lookups of several shapes through both client entry points equal the
 * in-process answer. */
static void check_hits_match(fx_t *f)
{
    static const struct { int64_t tokens; size_t nh; } cases[] = {
        {NB * BS + 1, NB}, {NB * BS, NB}, {5 * BS + 3, 5}, {3 * BS, NB}, {BS - 1, 1},
        {NB * BS + 1, 0},  {0, NB},       {1000 * BS, NB}, {7 * BS + 1, 7}};
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(f->cli);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t want = expected(f, cases[i].tokens, cases[i].nh), hit = -1;
        ASSERT_OK(
            kvp_kv_lookup_zmq_query(f->cli, cases[i].tokens, f->hashes, cases[i].nh, HL, &hit));
        ASSERT_EQ(hit, want);
        kvp_kv_request_t r = req_of(f, "r", cases[i].tokens, cases[i].nh);
        hit = -1;
        ASSERT_OK(c.ops->lookup(c.ctx, &r, false, &hit));
        ASSERT_EQ(hit, want);
    }
}

TEST(test_lookup_hits_match_pool_query_over_ipc)
{
    fx_t f;
    fx_open(&f, NULL, NB, 6);
    ASSERT_EQ(expected(&f, NB * BS + 1, NB), 6 * BS); /* the hole stops the run */
    check_hits_match(&f);
    kvp_kv_lookup_server_stats_t ss;
    kvp_kv_lookup_server_stats(f.srv, &ss);
    ASSERT_EQ(ss.lookups, 18);
    ASSERT_EQ(ss.bad_frames + ss.unknown_tags, 0);
    fx_close(&f);
}

TEST(test_lookup_hits_match_pool_query_over_tcp_port_0_resolved)
{
    fx_t f;
    fx_open(&f, "tcp://127.0.0.1:0", NB, -1);
    const char *ep = kvp_kv_lookup_server_endpoint(f.srv);
    ASSERT(strncmp(ep, "tcp://127.0.0.1:", 16) == 0);
    ASSERT_GT(atoi(ep + 16), 0);
    ASSERT_EQ(expected(&f, NB * BS, NB), (NB - 1) * BS); /* the last token is recomputed */
    check_hits_match(&f);
    fx_close(&f);
}

/* The scheduler plugged into the ZeroMQ client (K3-K5, K18 over the wire):
 * the same answers as over the in-process lookup, blocking and async (where
 * "not known yet" is -1 until the reply is in); reset_store empties the pool
 * through the server. */
TEST(test_scheduler_over_zmq_client)
{
    fx_t f;
    fx_open(&f, NULL, NB, 4);
    int64_t toks[NB * BS];
    for (int i = 0; i < NB * BS; i++)
        toks[i] = i;
    kvp_kv_request_t req = {"r1", NB * BS, 0, toks, NB * BS, f.hashes, NB, HL};
    for (int async = 0; async < 2; async++) {
        kvp_kv_config_t cfg;
        kvp_kv_config_init(&cfg);
        cfg.model_name = "m";
        cfg.lookup_async = async;
        kvp_kv_sched_t *s;
        ASSERT_OK(kvp_kv_sched_create(&cfg, kvp_kv_lookup_zmq_client(f.cli), &s));
        int64_t num = -1;
        bool la;
        for (int i = 0; i < 3000; i++) {
            ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, 0, &num, &la));
            if (num != -1)
                break;
            ASSERT(async);
            usleep(1000);
        }
        ASSERT_EQ(num, 4 * BS); /* blocks 0-3, block 4 missing */
        ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, BS, &num, &la));
        if (async)
            for (int i = 0; i < 3000 && num == -1; i++) {
                usleep(1000);
                ASSERT_OK(kvp_kv_sched_get_num_new_matched_tokens(s, &req, BS, &num, &la));
            }
        ASSERT_EQ(num, 3 * BS); /* K4: minus what vLLM computed */
        if (async) {
            bool ok = false;
            ASSERT_OK(kvp_kv_sched_reset_store(s, &ok));
            ASSERT(ok);
            kvp_pool_stats_t ps;
            ASSERT_OK(kvp_pool_stats(f.pool, &ps));
            ASSERT_EQ(ps.live, 0);
        }
        kvp_kv_sched_destroy(s);
    }
    fx_close(&f);
}

/* A request the wire cannot carry (num_tokens over u32, a hash_len over
 * u16) is not sent: the query says KVP_ERR_INVALID_ARG, the lookup op a hit
 * of 0; the server saw nothing. */
TEST(test_request_not_fitting_the_wire_is_a_hit_of_0)
{
    fx_t f;
    fx_open(&f, NULL, NB, -1);
    int64_t hit = -1;
    ASSERT_EQ(kvp_kv_lookup_zmq_query(f.cli, (int64_t)UINT32_MAX + 1, f.hashes, NB, HL, &hit),
              KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_lookup_zmq_query(f.cli, -1, f.hashes, NB, HL, &hit), KVP_ERR_INVALID_ARG);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(f.cli);
    kvp_kv_request_t r = req_of(&f, "big", (int64_t)UINT32_MAX + 1, NB);
    ASSERT_OK(c.ops->lookup(c.ctx, &r, false, &hit));
    ASSERT_EQ(hit, 0);
    r = req_of(&f, "wide", NB * BS + 1, 1);
    r.hash_len = 70000;
    ASSERT_OK(c.ops->lookup(c.ctx, &r, false, &hit));
    ASSERT_EQ(hit, 0);
    kvp_kv_lookup_server_stats_t ss;
    kvp_kv_lookup_server_stats(f.srv, &ss);
    ASSERT_EQ(ss.requests, 0);
    ASSERT_EQ(kvp_kv_lookup_zmq_query(f.cli, NB * BS + 1, f.hashes, NB, HL, &hit), KVP_OK);
    ASSERT_EQ(hit, NB * BS);
    fx_close(&f);
}

/* ---------------------------------------------------- a scripted REP peer */

/* A raw REP socket that answers every request with `reply` (reply_len
 * bytes) once `release` allows (hold: wait for release; never: don't). */
typedef struct rep {
    void *zctx, *sock;
    pthread_t th;
    uint8_t reply[64];
    size_t reply_len;
    _Atomic int hold;     /* 0: answer at once; 1: wait for release; 2: never answer */
    _Atomic int released; /* answers allowed so far (hold 1) */
    _Atomic int received; /* requests received */
    _Atomic int last_frames;
    uint8_t last_eagle;
    char path[128]; /* the ipc socket file (libzmq leaves it behind) */
} rep_t;

static void *rep_main(void *arg)
{
    rep_t *r = arg;
    for (int n = 0;; n++) {
        int frames = 0, more = 1;
        while (more) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, r->sock, 0) < 0) {
                zmq_msg_close(&m);
                return NULL;
            }
            more = zmq_msg_more(&m);
            if (frames == 4 && zmq_msg_size(&m) == 1)
                r->last_eagle = *(uint8_t *)zmq_msg_data(&m);
            frames++;
            zmq_msg_close(&m);
        }
        r->last_frames = frames;
        r->received++;
        if (r->hold == 2)
            for (;;) { /* swallow everything: REP cannot take another request */
                zmq_pollitem_t it = {r->sock, 0, ZMQ_POLLIN, 0};
                if (zmq_poll(&it, 1, -1) < 0)
                    return NULL;
                usleep(1000);
            }
        while (r->hold == 1 && r->released <= n)
            usleep(1000);
        if (zmq_send(r->sock, r->reply, r->reply_len, 0) < 0)
            return NULL;
    }
}

static void rep_start(rep_t *r, const char *ep, int hold, const uint8_t *reply, size_t len)
{
    memset(r, 0, sizeof *r);
    memcpy(r->reply, reply, len);
    r->reply_len = len;
    r->hold = hold;
    ASSERT_EQ(strncmp(ep, "ipc://", 6), 0);
    snprintf(r->path, sizeof r->path, "%s", ep + 6);
    r->zctx = zmq_ctx_new();
    r->sock = zmq_socket(r->zctx, ZMQ_REP);
    int linger = 0;
    zmq_setsockopt(r->sock, ZMQ_LINGER, &linger, sizeof linger);
    ASSERT_EQ(zmq_bind(r->sock, ep), 0);
    ASSERT_EQ(pthread_create(&r->th, NULL, rep_main, r), 0);
}

static void rep_stop(rep_t *r)
{
    zmq_ctx_shutdown(r->zctx);
    pthread_join(r->th, NULL);
    zmq_close(r->sock);
    zmq_ctx_term(r->zctx);
    unlink(r->path);
}

static kvp_kv_lookup_zmq_t *client_to(const char *ep, uint32_t timeout_ms, uint32_t max_inflight)
{
    kvp_kv_lookup_zmq_params_t cp;
    kvp_kv_lookup_zmq_params_init(&cp);
    cp.endpoint = ep;
    cp.timeout_ms = timeout_ms;
    if (max_inflight)
        cp.max_inflight = max_inflight;
    kvp_kv_lookup_zmq_t *c;
    ASSERT_OK(kvp_kv_lookup_zmq_create(&cp, &c));
    return c;
}

static const uint8_t HIT_48[4] = {0, 0, 0, 48};

static void wait_received(rep_t *r, int n)
{
    for (int i = 0; i < 5000 && r->received < n; i++)
        usleep(1000);
    ASSERT_EQ(r->received, n);
}

/* The first call for an id submits; a later call for the same id reuses
 * that lookup whatever its arguments (one RPC), and the entry is gone once
 * the answer was taken (the next call is a new RPC). */
TEST(test_inflight_lookup_reused_per_request_id)
{
    fx_t f;
    fx_open(&f, NULL, NB, -1);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(f.cli);
    kvp_kv_request_t r1 = req_of(&f, "A", 5 * BS + 1, 5), r2 = req_of(&f, "A", NB * BS + 1, 0);
    int64_t hit = -1;
    kvp_status_t st = c.ops->lookup(c.ctx, &r1, true, &hit);
    ASSERT(st == KVP_INPROGRESS || st == KVP_OK);
    if (st == KVP_INPROGRESS) {
        ASSERT_OK(c.ops->lookup(c.ctx, &r2, false, &hit)); /* r2's arguments are ignored */
        ASSERT_EQ(hit, 5 * BS);
    } else {
        ASSERT_EQ(hit, 5 * BS);
    }
    kvp_kv_lookup_server_stats_t ss;
    kvp_kv_lookup_server_stats(f.srv, &ss);
    ASSERT_EQ(ss.lookups, 1);
    ASSERT_OK(c.ops->lookup(c.ctx, &r2, false, &hit)); /* a new lookup: no hashes */
    ASSERT_EQ(hit, 0);
    kvp_kv_lookup_server_stats(f.srv, &ss);
    ASSERT_EQ(ss.lookups, 2);
    fx_close(&f);
}

/* non_block answers KVP_INPROGRESS until the reply is in, then the value;
 * meanwhile a blocking call for the same id would wait for the same RPC. */
TEST(test_non_block_inprogress_until_reply)
{
    char dir[] = "/tmp/kvp-lk-XXXXXX", ep[128];
    ASSERT(mkdtemp(dir));
    snprintf(ep, sizeof ep, "ipc://%s/rep", dir);
    rep_t r;
    rep_start(&r, ep, 1, HIT_48, 4);
    kvp_kv_lookup_zmq_t *cli = client_to(ep, 3000, 0);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(cli);
    uint8_t h[HL] = {1};
    kvp_kv_request_t q = {.req_id = "x", .num_tokens = 64, .block_hashes = h,
                          .num_block_hashes = 1, .hash_len = HL};
    int64_t hit = -1;
    ASSERT_EQ(c.ops->lookup(c.ctx, &q, true, &hit), KVP_INPROGRESS);
    wait_received(&r, 1);
    ASSERT_EQ(c.ops->lookup(c.ctx, &q, true, &hit), KVP_INPROGRESS);
    kvp_kv_lookup_zmq_stats_t st;
    kvp_kv_lookup_zmq_stats(cli, &st);
    ASSERT_EQ(st.inflight, 1);
    r.released = 1;
    kvp_status_t s;
    for (int i = 0; i < 3000 && (s = c.ops->lookup(c.ctx, &q, true, &hit)) == KVP_INPROGRESS; i++)
        usleep(1000);
    ASSERT_OK(s);
    ASSERT_EQ(hit, 48);
    ASSERT_EQ(r.received, 1);
    ASSERT_EQ(r.last_frames, 4); /* vLLM's four frames, no apply_eagle by default */
    kvp_kv_lookup_zmq_stats(cli, &st);
    ASSERT_EQ(st.inflight, 0);
    kvp_kv_lookup_zmq_destroy(cli);
    rep_stop(&r);
    rmdir(dir);
}

/* discard drops a queued lookup before it is sent and forgets a running one
 * (its reply is thrown away): the id's next lookup is a new RPC. */
TEST(test_discard_cancels_queued_and_forgets_running)
{
    char dir[] = "/tmp/kvp-lk-XXXXXX", ep[128];
    ASSERT(mkdtemp(dir));
    snprintf(ep, sizeof ep, "ipc://%s/rep", dir);
    rep_t r;
    rep_start(&r, ep, 1, HIT_48, 4);
    kvp_kv_lookup_zmq_t *cli = client_to(ep, 3000, 0);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(cli);
    uint8_t h[HL] = {2};
    kvp_kv_request_t a = {.req_id = "a", .num_tokens = 64, .block_hashes = h,
                          .num_block_hashes = 1, .hash_len = HL};
    kvp_kv_request_t b = a;
    b.req_id = "b";
    int64_t hit;
    ASSERT_EQ(c.ops->lookup(c.ctx, &a, true, &hit), KVP_INPROGRESS);
    wait_received(&r, 1); /* a is running */
    ASSERT_EQ(c.ops->lookup(c.ctx, &b, true, &hit), KVP_INPROGRESS); /* b is queued */
    kvp_kv_lookup_zmq_stats_t st;
    kvp_kv_lookup_zmq_stats(cli, &st);
    ASSERT_EQ(st.inflight, 2);
    c.ops->discard(c.ctx, "b");
    kvp_kv_lookup_zmq_stats(cli, &st);
    ASSERT_EQ(st.inflight, 1);
    c.ops->discard(c.ctx, "a");
    c.ops->discard(c.ctx, "never-seen"); /* harmless */
    r.released = 3;
    for (int i = 0; i < 3000 && (kvp_kv_lookup_zmq_stats(cli, &st), st.inflight); i++)
        usleep(1000);
    ASSERT_EQ(st.inflight, 0);
    ASSERT_EQ(r.received, 1); /* b was never sent */
    ASSERT_OK(c.ops->lookup(c.ctx, &a, false, &hit)); /* a new RPC for a */
    ASSERT_EQ(hit, 48);
    ASSERT_EQ(r.received, 2);
    kvp_kv_lookup_zmq_destroy(cli);
    rep_stop(&r);
    rmdir(dir);
}

/* At most max_inflight lookups queued or running; one more is a hit of 0 at
 * once, without an RPC. */
TEST(test_max_inflight_beyond_is_a_hit_of_0)
{
    char dir[] = "/tmp/kvp-lk-XXXXXX", ep[128];
    ASSERT(mkdtemp(dir));
    snprintf(ep, sizeof ep, "ipc://%s/rep", dir);
    rep_t r;
    rep_start(&r, ep, 1, HIT_48, 4);
    kvp_kv_lookup_zmq_t *cli = client_to(ep, 3000, 2);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(cli);
    uint8_t h[HL] = {3};
    kvp_kv_request_t q = {.req_id = "1", .num_tokens = 64, .block_hashes = h,
                          .num_block_hashes = 1, .hash_len = HL};
    int64_t hit;
    ASSERT_EQ(c.ops->lookup(c.ctx, &q, true, &hit), KVP_INPROGRESS);
    q.req_id = "2";
    ASSERT_EQ(c.ops->lookup(c.ctx, &q, true, &hit), KVP_INPROGRESS);
    q.req_id = "3";
    hit = -1;
    ASSERT_OK(c.ops->lookup(c.ctx, &q, false, &hit));
    ASSERT_EQ(hit, 0);
    r.released = 2;
    q.req_id = "1";
    ASSERT_OK(c.ops->lookup(c.ctx, &q, false, &hit));
    ASSERT_EQ(hit, 48);
    q.req_id = "2";
    ASSERT_OK(c.ops->lookup(c.ctx, &q, false, &hit));
    ASSERT_EQ(hit, 48);
    ASSERT_EQ(r.received, 2);
    kvp_kv_lookup_zmq_destroy(cli);
    rep_stop(&r);
    rmdir(dir);
}

/* The client accepts a reply of 4 + 8k bytes (hit = the first u32) and
 * rejects any other size as a bad reply (KVP_ERR_DECODE; a hit of 0 through
 * the lookup op); send_eagle appends the fifth frame. */
TEST(test_reply_4_plus_8k_accepted_other_sizes_rejected)
{
    static const struct { size_t len; kvp_status_t st; } cases[] = {
        {4, KVP_OK}, {12, KVP_OK}, {20, KVP_OK}, {3, KVP_ERR_DECODE}, {5, KVP_ERR_DECODE},
        {8, KVP_ERR_DECODE}, {0, KVP_ERR_DECODE}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[] = "/tmp/kvp-lk-XXXXXX", ep[128];
        ASSERT(mkdtemp(dir));
        snprintf(ep, sizeof ep, "ipc://%s/rep", dir);
        uint8_t reply[24] = {0, 0, 1, 0, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 7, 8};
        rep_t r;
        rep_start(&r, ep, 0, reply, cases[i].len);
        kvp_kv_lookup_zmq_params_t cp;
        kvp_kv_lookup_zmq_params_init(&cp);
        cp.endpoint = ep;
        cp.send_eagle = true;
        cp.apply_eagle = true;
        kvp_kv_lookup_zmq_t *cli;
        ASSERT_OK(kvp_kv_lookup_zmq_create(&cp, &cli));
        int64_t hit = -1;
        uint8_t h[HL] = {4};
        ASSERT_EQ(kvp_kv_lookup_zmq_query(cli, 1000, h, 1, HL, &hit), cases[i].st);
        if (cases[i].st == KVP_OK)
            ASSERT_EQ(hit, 256);
        kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(cli);
        kvp_kv_request_t q = {.req_id = "z", .num_tokens = 1000, .block_hashes = h,
                              .num_block_hashes = 1, .hash_len = HL};
        ASSERT_OK(c.ops->lookup(c.ctx, &q, false, &hit));
        ASSERT_EQ(hit, cases[i].st == KVP_OK ? 256 : 0);
        ASSERT_EQ(r.last_frames, 5);
        ASSERT_EQ(r.last_eagle, 1);
        kvp_kv_lookup_zmq_stats_t st;
        kvp_kv_lookup_zmq_stats(cli, &st);
        ASSERT_EQ(st.reconnects, 0); /* a one-frame bad reply keeps the socket in step */
        kvp_kv_lookup_zmq_destroy(cli);
        rep_stop(&r);
        rmdir(dir);
    }
}

/* A server that never answers costs a miss within the timeout (plus slack),
 * not a hang; the REQ socket is replaced, so a new server at the same
 * endpoint is answered by the same client. */
TEST(test_timeout_is_a_miss_and_socket_replaced_for_new_server)
{
    fx_t f;
    memset(&f, 0, sizeof f);
    tmpdir(&f);
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/lk", f.dir);
    rep_t r;
    rep_start(&r, ep, 2, HIT_48, 4);
    kvp_kv_lookup_zmq_t *cli = client_to(ep, 300, 0);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(cli);
    make_hashes(f.hashes, NB, 1);
    int64_t hit = -1;
    uint64_t t0 = kvp__now_ns();
    ASSERT_EQ(kvp_kv_lookup_zmq_query(cli, NB * BS + 1, f.hashes, NB, HL, &hit), KVP_ERR_TIMEOUT);
    kvp_kv_request_t q = req_of(&f, "t", NB * BS + 1, NB);
    ASSERT_OK(c.ops->lookup(c.ctx, &q, false, &hit));
    ASSERT_EQ(hit, 0);
    uint64_t ms = (kvp__now_ns() - t0) / 1000000;
    ASSERT_GE(ms, 2 * 300 - 10);
    ASSERT_LT(ms, 2 * 300 + 700);
    kvp_kv_lookup_zmq_stats_t st;
    kvp_kv_lookup_zmq_stats(cli, &st);
    ASSERT_EQ(st.timeouts, 2);
    ASSERT_EQ(st.errors, 2);
    ASSERT_EQ(st.reconnects, 2);
    rep_stop(&r);

    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &f.pool));
    for (int b = 0; b < NB; b++)
        put_block(f.pool, f.hashes + b * HL);
    open_lookup(f.pool, &f.lk);
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = ep;
    sp.lookup = f.lk;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &f.srv));
    ASSERT_OK(c.ops->lookup(c.ctx, &q, false, &hit));
    ASSERT_EQ(hit, NB * BS);
    kvp_kv_lookup_zmq_destroy(cli);
    kvp_kv_lookup_server_stop(f.srv);
    kvp_kv_lookup_pool_destroy(f.lk);
    kvp_pool_close(f.pool);
    rmdir(f.dir);
}

/* --------------------------------------------------------------- reset */

typedef struct drain_rec {
    kvp_pool_t *pool;
    int calls;
    uint64_t live_at_drain;
    kvp_status_t ret;
} drain_rec_t;

static kvp_status_t drain_cb(void *arg)
{
    drain_rec_t *d = arg;
    kvp_pool_stats_t ps;
    ASSERT_OK(kvp_pool_stats(d->pool, &ps));
    d->live_at_drain = ps.live;
    d->calls++;
    return d->ret;
}

/* RESET calls drain first (the pool still full), then empties the pool and
 * answers ACK; a failing drain is a NACK and the pool is left alone. */
TEST(test_reset_drains_first_then_empties_pool_and_acks)
{
    fx_t f;
    memset(&f, 0, sizeof f);
    tmpdir(&f);
    make_hashes(f.hashes, NB, 1);
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &f.pool));
    for (int b = 0; b < NB; b++)
        put_block(f.pool, f.hashes + b * HL);
    open_lookup(f.pool, &f.lk);
    drain_rec_t d = {f.pool, 0, 0, KVP_ERR_IO};
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    snprintf(f.ep, sizeof f.ep, "ipc://%s/lk", f.dir);
    sp.endpoint = f.ep;
    sp.lookup = f.lk;
    sp.drain = drain_cb;
    sp.drain_arg = &d;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &f.srv));
    kvp_kv_lookup_zmq_t *cli = client_to(f.ep, 3000, 0);
    kvp_kv_lookup_client_t c = kvp_kv_lookup_zmq_client(cli);
    bool ack = true;
    ASSERT_OK(c.ops->reset(c.ctx, &ack)); /* drain fails: NACK */
    ASSERT(!ack);
    kvp_pool_stats_t ps;
    ASSERT_OK(kvp_pool_stats(f.pool, &ps));
    ASSERT_EQ(ps.live, NB);
    d.ret = KVP_OK;
    ASSERT_OK(c.ops->reset(c.ctx, &ack));
    ASSERT(ack);
    ASSERT_EQ(d.calls, 2);
    ASSERT_EQ(d.live_at_drain, NB);
    ASSERT_OK(kvp_pool_stats(f.pool, &ps));
    ASSERT_EQ(ps.live, 0);
    int64_t hit = -1;
    ASSERT_OK(kvp_kv_lookup_zmq_query(cli, NB * BS + 1, f.hashes, NB, HL, &hit));
    ASSERT_EQ(hit, 0);
    kvp_kv_lookup_server_stats_t ss;
    kvp_kv_lookup_server_stats(f.srv, &ss);
    ASSERT_EQ(ss.resets, 2);
    kvp_kv_lookup_zmq_destroy(cli);
    kvp_kv_lookup_server_stop(f.srv);
    kvp_kv_lookup_pool_destroy(f.lk);
    kvp_pool_close(f.pool);
    rmdir(f.dir);
}

/* ------------------------------------------------------------- garbage */

/* Sends one message of n frames on a raw REQ socket; the reply's bytes into
 * out (returns its length), or -1 when none came within 1 s. */
static int raw_rpc(void *req, const void *const *frames, const size_t *lens, size_t n,
                   uint8_t *out, size_t cap)
{
    for (size_t i = 0; i < n; i++)
        ASSERT(zmq_send(req, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
    zmq_pollitem_t it = {req, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, 1000) <= 0)
        return -1;
    return zmq_recv(req, out, cap, 0);
}

/* Every malformed message is answered "\x00" (one byte), counted, and the
 * socket stays in step: a healthy client between them gets right answers. */
TEST(test_garbage_frames_get_err_and_healthy_client_keeps_answers)
{
    fx_t f;
    fx_open(&f, NULL, NB, -1);
    void *zctx = zmq_ctx_new(), *req = zmq_socket(zctx, ZMQ_REQ);
    int linger = 0;
    zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
    ASSERT_EQ(zmq_connect(req, f.ep), 0);
    static uint8_t blob[40 * HL + 5], nt[4] = {0, 0, 1, 0}, hl32[2] = {0, 32}, hl0[2] = {0, 0},
                                      hl33[2] = {0, 33}, hl7[2] = {0, 7}, e1[1] = {1}, e2[2];
    struct { const char *name; const void *f[7]; size_t len[7]; size_t n; bool unknown; } g[] = {
        {"unknown tag", {"lookupx"}, {7}, 1, true},
        {"empty tag", {""}, {0}, 1, true},
        {"tag only", {"lookup"}, {6}, 1, false},
        {"three frames", {"lookup", nt, hl32}, {6, 4, 2}, 3, false},
        {"num_tokens 3 bytes", {"lookup", nt, hl32, blob}, {6, 3, 2, 64}, 4, false},
        {"hash_len 1 byte", {"lookup", nt, hl32, blob}, {6, 4, 1, 64}, 4, false},
        {"hash_len 0 with hashes", {"lookup", nt, hl0, blob}, {6, 4, 2, 32}, 4, false},
        {"hash_len 33", {"lookup", nt, hl33, blob}, {6, 4, 2, 66}, 4, false},
        {"hash_len not dividing", {"lookup", nt, hl7, blob}, {6, 4, 2, 64}, 4, false},
        {"eagle 2 bytes", {"lookup", nt, hl32, blob, e2}, {6, 4, 2, 64, 2}, 5, false},
        {"eagle empty", {"lookup", nt, hl32, blob, e1}, {6, 4, 2, 64, 0}, 5, false},
        {"extra frame", {"lookup", nt, hl32, blob, e1, e1}, {6, 4, 2, 64, 1, 1}, 6, false},
        {"seven frames", {"lookup", nt, hl32, blob, e1, e1, e1}, {6, 4, 2, 64, 1, 1, 1}, 7, false},
        {"reset with payload", {"reset", e1}, {5, 1}, 2, false},
        {"more than max_hashes", {"lookup", nt, hl0, blob}, {6, 4, 2, 0}, 4, false},
    };
    /* (the last one is patched to be over the limit below) */
    kvp_kv_lookup_server_stop(f.srv);
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = f.ep;
    sp.lookup = f.lk;
    sp.max_hashes = 32;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &f.srv));
    size_t last = sizeof g / sizeof g[0] - 1;
    g[last].f[2] = hl32;
    g[last].len[3] = 33 * HL;
    uint64_t unknown = 0, badf = 0;
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) {
        uint8_t out[16];
        int n = raw_rpc(req, g[i].f, g[i].len, g[i].n, out, sizeof out);
        ASSERT_MSG(n == 1 && out[0] == 0, "%s: reply of %d bytes", g[i].name, n);
        if (g[i].unknown)
            unknown++;
        else
            badf++;
        int64_t hit = -1;
        ASSERT_OK(kvp_kv_lookup_zmq_query(f.cli, NB * BS + 1, f.hashes, NB, HL, &hit));
        ASSERT_EQ(hit, NB * BS);
    }
    /* The limits themselves are fine: 32 hashes, and a well-formed 5-frame
     * LOOKUP from the raw socket, answered with a u32. */
    const void *okf[5] = {"lookup", nt, hl32, f.hashes, e1};
    size_t okl[5] = {6, 4, 2, 5 * HL, 1};
    uint8_t out[16];
    ASSERT_EQ(raw_rpc(req, okf, okl, 5, out, sizeof out), 4);
    ASSERT_EQ(out[3], 5 * BS); /* 256 tokens asked, 5 blocks present */
    kvp_kv_lookup_server_stats_t ss;
    kvp_kv_lookup_server_stats(f.srv, &ss);
    ASSERT_EQ(ss.unknown_tags, unknown);
    ASSERT_EQ(ss.bad_frames, badf);
    ASSERT_EQ(ss.lookups, sizeof g / sizeof g[0] + 1);
    zmq_close(req);

    /* A frame over ZMQ_MAXMSGSIZE (32 hashes + slack) costs the sender its
     * connection, not our memory: no reply, and the server goes on. */
    req = zmq_socket(zctx, ZMQ_REQ);
    zmq_setsockopt(req, ZMQ_LINGER, &linger, sizeof linger);
    ASSERT_EQ(zmq_connect(req, f.ep), 0);
    static uint8_t huge[1 << 20];
    const void *hf[4] = {"lookup", nt, hl32, huge};
    size_t hlens[4] = {6, 4, 2, sizeof huge};
    ASSERT_EQ(raw_rpc(req, hf, hlens, 4, out, sizeof out), -1);
    int64_t hit = -1;
    ASSERT_OK(kvp_kv_lookup_zmq_query(f.cli, NB * BS + 1, f.hashes, NB, HL, &hit));
    ASSERT_EQ(hit, NB * BS);
    zmq_close(req);
    zmq_ctx_term(zctx);
    fx_close(&f);
}

/* ------------------------------------------------------------ the ipc file */

TEST(test_ipc_endpoint_is_vllm_path)
{
    char buf[256];
    ASSERT_OK(kvp_kv_lookup_ipc_endpoint("/tmp/rpc", 7, "node-1", 3, buf, sizeof buf));
    ASSERT_STR_EQ(buf, "ipc:///tmp/rpc/lookup_rpc_port_7_host_node-1_dp_rank3");
    ASSERT_EQ(kvp_kv_lookup_ipc_endpoint("/tmp/rpc", 7, "node-1", 3, buf, 20),
              KVP_ERR_BUFFER_TOO_SMALL);
    char host[256] = "";
    gethostname(host, sizeof host);
    ASSERT_OK(kvp_kv_lookup_ipc_endpoint("/b", 0, NULL, 0, buf, sizeof buf));
    char want[300];
    snprintf(want, sizeof want, "ipc:///b/lookup_rpc_port_0_host_%s_dp_rank0", host);
    ASSERT_STR_EQ(buf, want);
    ASSERT_EQ(kvp_kv_lookup_ipc_endpoint(NULL, 0, "h", 0, buf, sizeof buf), KVP_ERR_NULL_POINTER);
    ASSERT_EQ(kvp_kv_lookup_ipc_endpoint("", 0, "h", 0, buf, sizeof buf), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_lookup_ipc_endpoint("/b", 0, "a/b", 0, buf, sizeof buf), KVP_ERR_INVALID_ARG);
}

/* The socket file is owner-only, a socket, and gone after stop. */
TEST(test_ipc_socket_file_owner_only_and_removed_on_stop)
{
    fx_t f;
    fx_open(&f, NULL, 0, -1);
    const char *path = f.ep + 6;
    struct stat sb;
    ASSERT_EQ(lstat(path, &sb), 0);
    ASSERT(S_ISSOCK(sb.st_mode));
    ASSERT_EQ(sb.st_mode & 0077, 0);
    ASSERT_EQ(sb.st_uid, getuid());
    int64_t hit = -1;
    ASSERT_OK(kvp_kv_lookup_zmq_query(f.cli, 100, f.hashes, 2, HL, &hit));
    ASSERT_EQ(hit, 0);
    kvp_kv_lookup_server_stop(f.srv);
    ASSERT_EQ(lstat(path, &sb), -1);
    f.srv = NULL;
    fx_close(&f);
}

/* A socket file nobody listens on (a crashed server's) is unlinked and the
 * server binds; a live server's socket is never stolen (KVP_ERR_BUSY, and
 * it still answers); a path that is no socket is left alone. */
TEST(test_stale_socket_unlinked_live_socket_not_stolen)
{
    fx_t f;
    memset(&f, 0, sizeof f);
    tmpdir(&f);
    make_hashes(f.hashes, NB, 1);
    snprintf(f.ep, sizeof f.ep, "ipc://%s/lk", f.dir);
    const char *path = f.ep + 6;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ASSERT_LT(strlen(path), sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd); /* the file stays: stale */

    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &f.pool));
    put_block(f.pool, f.hashes);
    open_lookup(f.pool, &f.lk);
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = f.ep;
    sp.lookup = f.lk;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &f.srv));
    kvp_kv_lookup_server_t *second = (kvp_kv_lookup_server_t *)&f;
    ASSERT_EQ(kvp_kv_lookup_server_start(&sp, &second), KVP_ERR_BUSY);
    ASSERT(second == NULL);
    f.cli = client_to(f.ep, 3000, 0);
    int64_t hit = -1;
    ASSERT_OK(kvp_kv_lookup_zmq_query(f.cli, 3 * BS, f.hashes, 3, HL, &hit));
    ASSERT_EQ(hit, BS);
    kvp_kv_lookup_zmq_destroy(f.cli);
    kvp_kv_lookup_server_stop(f.srv);

    char other[128];
    snprintf(other, sizeof other, "%s/plain", f.dir);
    FILE *fp = fopen(other, "w");
    ASSERT(fp);
    fclose(fp);
    char ep2[160];
    snprintf(ep2, sizeof ep2, "ipc://%s", other);
    sp.endpoint = ep2;
    ASSERT_EQ(kvp_kv_lookup_server_start(&sp, &second), KVP_ERR_BUSY);
    struct stat sb;
    ASSERT_EQ(stat(other, &sb), 0);
    ASSERT(S_ISREG(sb.st_mode));
    unlink(other);
    kvp_kv_lookup_pool_destroy(f.lk);
    kvp_pool_close(f.pool);
    rmdir(f.dir);
}

/* Instance i at rpc_port base + i: two servers side by side on one host,
 * each answering for its own pool. */
TEST(test_instances_side_by_side_never_collide)
{
    fx_t a, b;
    memset(&b, 0, sizeof b);
    fx_open(&a, NULL, NB, -1);
    char ep1[256];
    ASSERT_OK(kvp_kv_lookup_ipc_endpoint(a.dir, 1, "testhost", 0, ep1, sizeof ep1));
    ASSERT(strcmp(ep1, a.ep) != 0);
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &b.pool));
    put_block(b.pool, a.hashes); /* one block only */
    open_lookup(b.pool, &b.lk);
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = ep1;
    sp.lookup = b.lk;
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &b.srv));
    b.cli = client_to(ep1, 3000, 0);
    int64_t ha = -1, hb = -1;
    ASSERT_OK(kvp_kv_lookup_zmq_query(a.cli, NB * BS + 1, a.hashes, NB, HL, &ha));
    ASSERT_OK(kvp_kv_lookup_zmq_query(b.cli, NB * BS + 1, a.hashes, NB, HL, &hb));
    ASSERT_EQ(ha, NB * BS);
    ASSERT_EQ(hb, BS);
    kvp_kv_lookup_zmq_destroy(b.cli);
    kvp_kv_lookup_server_stop(b.srv);
    kvp_kv_lookup_pool_destroy(b.lk);
    kvp_pool_close(b.pool);
    fx_close(&a);
}

/* tcp binds only the host it names: wildcards are refused. */
TEST(test_tcp_wildcard_refused_bad_endpoints)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    ASSERT_OK(kvp_pool_open("embedded://?capacity=16MiB", &pool));
    open_lookup(pool, &lk);
    static const struct { const char *ep; kvp_status_t st; } cases[] = {
        {"tcp://*:0", KVP_ERR_BAD_CONFIG},       {"tcp://0.0.0.0:5555", KVP_ERR_BAD_CONFIG},
        {"tcp://[::]:0", KVP_ERR_BAD_CONFIG},    {"tcp://:0", KVP_ERR_BAD_CONFIG},
        {"tcp://127.0.0.1", KVP_ERR_BAD_URI},   {"tcp://127.0.0.1:x", KVP_ERR_BAD_URI},
        {"tcp://127.0.0.1:99999", KVP_ERR_BAD_URI}, {"udp://127.0.0.1:1", KVP_ERR_BAD_URI},
        {"ipc://", KVP_ERR_BAD_CONFIG}};
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.lookup = lk;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp_kv_lookup_server_t *s = NULL;
        sp.endpoint = cases[i].ep;
        ASSERT_MSG(kvp_kv_lookup_server_start(&sp, &s) == cases[i].st, "%s", cases[i].ep);
        ASSERT(s == NULL);
    }
    kvp_kv_lookup_server_t *s;
    sp.endpoint = "tcp://localhost:0"; /* a name, resolved to its address */
    ASSERT_OK(kvp_kv_lookup_server_start(&sp, &s));
    ASSERT(strstr(kvp_kv_lookup_server_endpoint(s), ":0") == NULL);
    kvp_kv_lookup_server_stop(s);
    ASSERT_EQ(kvp_kv_lookup_server_start(NULL, &s), KVP_ERR_NULL_POINTER);
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
}

/* Prometheus text: HELP/TYPE lines, the server's counters and the lookup's
 * per-reason counts; a short buffer says how much is needed. */
TEST(test_metrics_prometheus_text)
{
    fx_t f;
    fx_open(&f, NULL, NB, 3);
    int64_t hit;
    ASSERT_OK(kvp_kv_lookup_zmq_query(f.cli, NB * BS + 1, f.hashes, NB, HL, &hit));
    ASSERT_EQ(hit, 3 * BS);
    char buf[8192];
    size_t len = 0;
    ASSERT_OK(kvp_kv_lookup_server_metrics(f.srv, buf, sizeof buf, &len));
    ASSERT_EQ(len, strlen(buf));
    ASSERT(strstr(buf, "# TYPE kvpool_lookup_server_requests_total counter\n"));
    ASSERT(strstr(buf, "\nkvpool_lookup_server_lookups_total 1\n"));
    ASSERT(strstr(buf, "# HELP kvpool_lookup_misses_total "));
    for (int r = 0; r < KVP_KV_MISS__COUNT; r++) {
        char line[96];
        snprintf(line, sizeof line, "kvpool_lookup_misses_total{reason=\"%s\"} ",
                 kvp_kv_miss_reason_name((kvp_kv_miss_reason_t)r));
        ASSERT_MSG(strstr(buf, line), "%s", line);
    }
    char small[16];
    size_t need = 0;
    ASSERT_EQ(kvp_kv_lookup_server_metrics(f.srv, small, sizeof small, &need),
              KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(need, len);
    fx_close(&f);
}

TEST_LIST(T(test_lookup_hits_match_pool_query_over_ipc),
          T(test_lookup_hits_match_pool_query_over_tcp_port_0_resolved),
          T(test_request_not_fitting_the_wire_is_a_hit_of_0), T(test_scheduler_over_zmq_client),
          T(test_inflight_lookup_reused_per_request_id), T(test_non_block_inprogress_until_reply),
          T(test_discard_cancels_queued_and_forgets_running),
          T(test_max_inflight_beyond_is_a_hit_of_0),
          T(test_reply_4_plus_8k_accepted_other_sizes_rejected),
          T(test_timeout_is_a_miss_and_socket_replaced_for_new_server),
          T(test_reset_drains_first_then_empties_pool_and_acks),
          T(test_garbage_frames_get_err_and_healthy_client_keeps_answers),
          T(test_ipc_endpoint_is_vllm_path), T(test_ipc_socket_file_owner_only_and_removed_on_stop),
          T(test_stale_socket_unlinked_live_socket_not_stolen),
          T(test_instances_side_by_side_never_collide), T(test_tcp_wildcard_refused_bad_endpoints),
          T(test_metrics_prometheus_text))
