/*
 * One UCX context per process (net/ucx.h, kvp__ucx_client_open): every
 * kvpool:// handle shares it, each with a worker of its own; the first open
 * makes it, the last close frees it.  And the internal constructor for one
 * server connection (client/remote.h).  Against a real `kvpool server`.
 */
#include <pthread.h>

#include "client/backend.h"
#include "client/remote.h"
#include "net/ucx.h"
#include "server_harness.h"

#define NHANDLES 64

/* Every handle stores and reads back a value of its own. */
static void each_handle_works(kvp_pool_t **h, int n, const char *tag)
{
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s-%d", tag, i);
        kvp_status_t st;
        put_pattern(h[i], key, 4096 + (size_t)i * 64, (uint8_t)i, &st);
        ASSERT_OK(st);
    }
    for (int i = 0; i < n; i++) {
        char key[64];
        snprintf(key, sizeof key, "%s-%d", tag, (i + 1) % n); /* (what another handle stored) */
        ASSERT_EQ(check_pattern(h[i], key, 4096 + (size_t)((i + 1) % n) * 64, (uint8_t)((i + 1) % n)), 1);
    }
}

TEST(test_remote_64_handles_share_one_ucx_context)
{
    server_t s = {0};
    server_start(&s, "64MiB", 0, NULL);
    ASSERT_EQ(kvp__ucx_context_refs(), 0u);
    kvp_pool_t *h[NHANDLES];
    for (int i = 0; i < NHANDLES; i++) {
        h[i] = open_ok(s.uri);
        ASSERT_EQ(kvp__ucx_context_refs(), (unsigned)i + 1);
    }
    each_handle_works(h, NHANDLES, "shared");
    for (int i = 0; i < NHANDLES; i++) {
        kvp_pool_close(h[i]);
        ASSERT_EQ(kvp__ucx_context_refs(), (unsigned)(NHANDLES - 1 - i));
    }
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* After the last close the context is gone, and the next open makes a new
 * one that works (a handle over kvpool's TCP transport holds one too: its
 * worker stays for a server reachable over UCX later). */
TEST(test_remote_context_made_again_after_the_last_close)
{
    server_t s = {0};
    server_start(&s, "16MiB", 0, NULL);
    for (int round = 0; round < 3; round++) {
        kvp_pool_t *h[2] = {open_ok(s.uri), open_ok(lane_uri(&s))};
        ASSERT_EQ(kvp__ucx_context_refs(), 2u);
        each_handle_works(h, 2, round == 0 ? "again0" : round == 1 ? "again1" : "again2");
        kvp_pool_close(h[0]);
        ASSERT_EQ(kvp__ucx_context_refs(), 1u);
        kvp_pool_close(h[1]);
        ASSERT_EQ(kvp__ucx_context_refs(), 0u);
    }
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* Opens and closes from many threads at once count every reference. */
typedef struct {
    const char *uri;
    kvp_pool_t *h[NHANDLES / 8];
    kvp_status_t st;
} opener_t;

static void *open_many(void *arg)
{
    opener_t *o = arg;
    o->st = KVP_OK;
    for (int i = 0; i < NHANDLES / 8 && o->st == KVP_OK; i++)
        o->st = kvp_pool_open(o->uri, &o->h[i]);
    return NULL;
}

static void *close_many(void *arg)
{
    opener_t *o = arg;
    for (int i = 0; i < NHANDLES / 8; i++)
        kvp_pool_close(o->h[i]);
    return NULL;
}

TEST(test_remote_concurrent_opens_and_closes_share_one_context)
{
    server_t s = {0};
    server_start(&s, "64MiB", 0, NULL);
    opener_t o[8];
    pthread_t t[8];
    for (int i = 0; i < 8; i++) {
        o[i].uri = s.uri;
        ASSERT_EQ(pthread_create(&t[i], NULL, open_many, &o[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        ASSERT_OK(o[i].st);
    }
    ASSERT_EQ(kvp__ucx_context_refs(), (unsigned)NHANDLES);
    kvp_pool_t *all[NHANDLES];
    for (int i = 0; i < NHANDLES; i++)
        all[i] = o[i / (NHANDLES / 8)].h[i % (NHANDLES / 8)];
    each_handle_works(all, NHANDLES, "threads");
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(pthread_create(&t[i], NULL, close_many, &o[i]), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    ASSERT_EQ(kvp__ucx_context_refs(), 0u);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* kvp__remote_open: one server connection without a URI, used through the
 * backend's ops; a bad host or port is refused before anything is made. */
TEST(test_remote_open_connects_one_server_without_a_uri)
{
    server_t s = {0};
    server_start(&s, "16MiB", 0, NULL);
    kvp__remote_opts_t o = {.timeout_ms = 5000, .transport = KVP_REMOTE_AUTO, .local_reads = 1};
    void *impl = NULL;
    ASSERT_OK(kvp__remote_open("127.0.0.1", s.port, &o, &impl));
    ASSERT_EQ(kvp__ucx_context_refs(), 1u);
    kvp_pool_stats_t st;
    ASSERT_OK(kvp__remote_backend.stats(impl, &st));
    ASSERT(st.capacity_bytes > 0);
    kvp__remote_backend.close(impl);
    ASSERT_EQ(kvp__ucx_context_refs(), 0u);
    void *none = NULL;
    ASSERT_EQ(kvp__remote_open("", s.port, &o, &none), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__remote_open("127.0.0.1", 0, &o, &none), KVP_ERR_INVALID_ARG);
    ASSERT(none == NULL);
    ASSERT_EQ(kvp__ucx_context_refs(), 0u);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST_LIST(T(test_remote_64_handles_share_one_ucx_context), T(test_remote_context_made_again_after_the_last_close),
          T(test_remote_concurrent_opens_and_closes_share_one_context),
          T(test_remote_open_connects_one_server_without_a_uri))
