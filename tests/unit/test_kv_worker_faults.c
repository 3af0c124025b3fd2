/*
 * The worker against a pool that disappears (issue 13, "Tests": faults):
 * a real `kvpool server` killed (and stopped) while the worker's loads and
 * saves are in flight, over kvpool:// on both transports.  What must hold:
 * no crash; no call hangs past its timeout (timeout_ms); every load is
 * still reported in done_recving; a block is either a load error or byte
 * for byte what was saved (never reported loaded unverified); failed saves
 * are counted and retried by the request's next save (its high-water mark
 * did not move); after a restart saves and loads work again.
 */
#include <pthread.h>

#include "kv_worker_fixture.h"
#include "server_harness.h"

#define NREQ 16
#define PER 4 /* blocks per request */
#define CALL_MS 500

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static kvp_kv_worker_t *mk(kvp_pool_t *pool, fx_cache_t *c, kvp_kv_role_t role)
{
    kvp_kv_worker_params_t p;
    kvp_kv_worker_params_init(&p);
    p.pool = pool;
    p.model_name = "faults";
    p.role = role;
    p.timeout_ms = CALL_MS;
    kvp_kv_worker_t *w = NULL;
    ASSERT_OK(kvp_kv_worker_create(&p, &w));
    ASSERT_OK(kvp_kv_worker_register(w, c->t, (size_t)c->ntensors, (uint64_t)c->nblocks));
    return w;
}

/* Request r of family fam: PER blocks at base + r * PER. */
static void req(fx_meta_t *f, char *id, size_t idlen, uint32_t fam, int r, int64_t base, bool load)
{
    int64_t ids[PER];
    for (int i = 0; i < PER; i++)
        ids[i] = base + r * PER + i;
    snprintf(id, idlen, "%c%u.%d", load ? 'l' : 's', fam, r);
    fx_meta(f, id, PER * FX_BS, ids, PER, fam * 1000 + (uint32_t)r, PER);
    if (load)
        fx_load(f, 0, PER * FX_BS);
    else
        fx_save(f);
}

/* Queues NREQ saves (family fam, src blocks 0..) or loads (dst blocks
 * 64..) without waiting. */
static fx_meta_t g_m[NREQ];
static char g_id[NREQ][24];
static int g_recv; /* loads reported since the last await_loads */
static void queue(kvp_kv_worker_t *w, uint32_t fam, bool load)
{
    for (int r0 = 0; r0 < NREQ; r0 += 8) {
        fx_meta_t *ms[8];
        for (int r = r0; r < r0 + 8; r++) {
            req(&g_m[r], g_id[r], sizeof g_id[r], fam, r, load ? 64 : 0, load);
            ms[r - r0] = &g_m[r];
        }
        kvp_kv_finished_t out = fx_step(w, ms, 8, NULL, 0);
        g_recv += (int)out.num_recving;
    }
}

/* Waits until all NREQ loads of the last queue() are done; the ms it took. */
static uint64_t await_loads(kvp_kv_worker_t *w, int limit_ms)
{
    uint64_t t0 = now_ms();
    int seen = g_recv;
    g_recv = 0;
    while (seen < NREQ) {
        ASSERT_MSG(now_ms() - t0 < (uint64_t)limit_ms, "only %d of %d loads reported after %d ms",
                   seen, NREQ, limit_ms);
        kvp_kv_finished_t out;
        ASSERT_OK(kvp_kv_worker_get_finished(w, NULL, NULL, 0, &out));
        seen += (int)out.num_recving;
        fx_sleep_ms(1);
    }
    return now_ms() - t0;
}

/* Every block of the last loads is an error or equal to its source; the
 * number of errors. */
static size_t check_loads(kvp_kv_worker_t *w, const fx_cache_t *src, const fx_cache_t *dst)
{
    int64_t e[NREQ * PER + 1];
    size_t ne = fx_errors(w, e, NREQ * PER + 1);
    ASSERT_LE(ne, NREQ * PER);
    for (int64_t b = 0; b < NREQ * PER; b++) {
        int err = 0;
        for (size_t i = 0; i < ne; i++)
            err |= e[i] == 64 + b;
        ASSERT_MSG(err || fx_same(src, b, dst, 64 + b), "block %lld reported loaded, not equal",
                   (long long)b);
    }
    for (size_t i = 0; i < ne; i++)
        ASSERT_MSG(e[i] >= 64 && e[i] < 64 + NREQ * PER, "error block %lld", (long long)e[i]);
    return ne;
}

static void wipe(fx_cache_t *c)
{
    for (int i = 0; i < c->ntensors; i++)
        memset(c->mem[i], 0, c->bytes[i]);
}

static void killed_and_restarted(int lane)
{
    server_t s = {0};
    server_start(&s, "64MiB", 0, NULL);
    uint16_t port = s.port;
    char uri[160];
    snprintf(uri, sizeof uri, "kvpool://127.0.0.1:%u?timeout=2s%s", port, lane ? "&transport=tcp" : "");
    kvp_pool_t *pool = open_ok(uri);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 128);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 128);
    fx_fill(&src, 99);
    kvp_kv_worker_t *ws = mk(pool, &src, KVP_KV_ROLE_PRODUCER);
    kvp_kv_worker_t *wd = mk(pool, &dst, KVP_KV_ROLE_CONSUMER);

    /* Family 1 saved and loaded while the server is up: all good. */
    queue(ws, 1, false);
    ASSERT_OK(kvp_kv_worker_drain(ws));
    ASSERT_EQ(fx_stats(ws).blocks_saved, NREQ * PER);
    queue(wd, 1, true);
    await_loads(wd, 10000);
    ASSERT_EQ(check_loads(wd, &src, &dst), 0);

    /* Loads of family 1 and saves of family 2 in flight, then SIGKILL. */
    wipe(&dst);
    queue(wd, 1, true);
    queue(ws, 2, false);
    server_stop(&s, SIGKILL);
    await_loads(wd, 20000);
    check_loads(wd, &src, &dst); /* errors or verified, whatever the race left */
    uint64_t t0 = now_ms();
    ASSERT_OK(kvp_kv_worker_drain(ws));
    ASSERT_LT(now_ms() - t0, 20000);

    /* With the server gone every load fails, every save is counted as an
     * error, and nothing waits for long. */
    wipe(&dst);
    kvp_kv_worker_stats_t s0 = fx_stats(ws);
    t0 = now_ms();
    queue(wd, 1, true);
    uint64_t took = await_loads(wd, 20000);
    ASSERT_EQ(check_loads(wd, &src, &dst), NREQ * PER);
    queue(ws, 3, false);
    ASSERT_OK(kvp_kv_worker_drain(ws));
    ASSERT_LT(now_ms() - t0, 20000);
    kvp_kv_worker_stats_t s1 = fx_stats(ws);
    ASSERT_EQ(s1.blocks_saved, s0.blocks_saved);
    ASSERT_GT(s1.save_errors, s0.save_errors);
    fprintf(stderr, "  dead pool: %d loads reported in %llu ms\n", NREQ, (unsigned long long)took);

    /* Restarted (an empty arena): family 3's saves are retried by its next
     * metas (their high-water marks never moved) once the client has
     * reconnected, and they load back byte for byte. */
    server_start(&s, "64MiB", port, NULL);
    t0 = now_ms();
    for (;;) {
        queue(ws, 3, false);
        ASSERT_OK(kvp_kv_worker_drain(ws));
        if (fx_stats(ws).blocks_saved >= s1.blocks_saved + NREQ * PER)
            break;
        ASSERT_MSG(now_ms() - t0 < 15000, "saves never recovered after the restart");
        fx_sleep_ms(100);
    }
    wipe(&dst);
    queue(wd, 3, true);
    await_loads(wd, 10000);
    ASSERT_EQ(check_loads(wd, &src, &dst), 0);

    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    kvp_pool_close(pool);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
    fx_cache_free(&src);
    fx_cache_free(&dst);
}

TEST(test_faults_pool_server_killed_and_restarted_ucx) { killed_and_restarted(0); }
TEST(test_faults_pool_server_killed_and_restarted_tcp) { killed_and_restarted(1); }

/* A server that stops answering (SIGSTOP) costs each call its timeout_ms,
 * not a hang: the loads are reported, all as errors. */
TEST(test_faults_stalled_server_costs_the_call_timeout)
{
    server_t s = {0};
    server_start(&s, "64MiB", 0, NULL);
    char uri[160];
    snprintf(uri, sizeof uri, "kvpool://127.0.0.1:%u?timeout=2s&transport=tcp", s.port);
    kvp_pool_t *pool = open_ok(uri);
    fx_cache_t src, dst;
    fx_cache_init(&src, FX_KV_FIRST, 2, 128);
    fx_cache_init(&dst, FX_KV_FIRST, 2, 128);
    fx_fill(&src, 7);
    kvp_kv_worker_t *ws = mk(pool, &src, KVP_KV_ROLE_PRODUCER);
    kvp_kv_worker_t *wd = mk(pool, &dst, KVP_KV_ROLE_CONSUMER);
    queue(ws, 5, false);
    ASSERT_OK(kvp_kv_worker_drain(ws));
    kill(s.pid, SIGSTOP);
    uint64_t t0 = now_ms();
    queue(wd, 5, true);
    await_loads(wd, 25000); /* 16 calls on 2 threads at 500 ms: about 4 s, far below 30 s */
    uint64_t took = now_ms() - t0;
    fprintf(stderr, "  stalled pool: %d loads reported in %llu ms\n", NREQ, (unsigned long long)took);
    ASSERT_EQ(check_loads(wd, &src, &dst), NREQ * PER);
    /* one call's 500 ms, one reconnect's handshake (the URI's 2 s), then the
     * client's backoff fails the rest at once */
    ASSERT_LT(took, 8000);
    kill(s.pid, SIGCONT);
    kvp_kv_worker_destroy(ws);
    kvp_kv_worker_destroy(wd);
    kvp_pool_close(pool);
    server_stop(&s, SIGKILL);
    fx_cache_free(&src);
    fx_cache_free(&dst);
}

TEST_LIST(T(test_faults_pool_server_killed_and_restarted_ucx),
          T(test_faults_pool_server_killed_and_restarted_tcp),
          T(test_faults_stalled_server_costs_the_call_timeout))
