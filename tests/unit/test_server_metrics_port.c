/*
 * `--metrics-port 0`: the server picks a free port for its metrics endpoint
 * and writes it to --metrics-port-file before --port-file appears, so a
 * caller never races another process for a port it picked itself.
 */
#include "server_harness.h"

/* Two servers at once, both asking for any port: each writes the port it
 * serves on, the ports differ, and each endpoint counts its own server's
 * requests only. */
TEST(test_server_metrics_port_0_writes_the_chosen_port)
{
    server_t a = {0}, b = {0};
    server_start_metrics(&a, "8MiB");
    server_start_metrics(&b, "8MiB");
    ASSERT(a.metrics_port != 0);
    ASSERT(b.metrics_port != 0);
    ASSERT(a.metrics_port != b.metrics_port);
    ASSERT(a.metrics_port != a.port);
    kvp_pool_t *p = open_ok(a.uri);
    kvp_status_t st;
    for (int i = 0; i < 3; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        put_pattern(p, key, 1000, (uint8_t)i, &st);
        ASSERT_OK(st);
    }
    kvp_pool_close(p);
    char *ma = metrics_get(&a), *mb = metrics_get(&b);
    ASSERT_EQ(metric(ma, "kvpool_requests_total{op=\"put\"}"), 3);
    ASSERT_EQ(metric(mb, "kvpool_requests_total{op=\"put\"}"), 0);
    free(ma);
    free(mb);
    ASSERT_EQ(server_stop(&a, SIGTERM), 0);
    ASSERT_EQ(server_stop(&b, SIGTERM), 0);
}

/* The metrics port file is there, complete, whenever the port file is (the
 * harness reads it right after the port file and asserts on its content),
 * and a server without --metrics-port writes none. */
TEST(test_server_metrics_port_file_only_with_metrics)
{
    server_t s = {0};
    server_start(&s, "8MiB", 0, NULL);
    char path[160];
    snprintf(path, sizeof path, "%s/metrics-port", s.dir);
    ASSERT_EQ(access(path, F_OK), -1);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST_LIST(T(test_server_metrics_port_0_writes_the_chosen_port), T(test_server_metrics_port_file_only_with_metrics))
