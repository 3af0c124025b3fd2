/* The server honours a request's timeout_ms (docs/protocol.md §2): what it
 * still holds for a request whose deadline has passed (a put's values still
 * arriving, a get's reply still waiting to be sent) is let go, and the
 * request answered KVP_ERR_TIMEOUT; timeout_ms 0 is no deadline.  Raw frames
 * on kvpool's TCP transport, against a real server. */
#include <stdlib.h>
#include <string.h>

#include "server_harness.h"

/* Sends a PUT of one value of n bytes whose request says timeout_ms: half
 * the values, a pause of pause_ms, the rest; returns the reply's status. */
static kvp_status_t slow_put(int fd, uint64_t key, const char *name, uint32_t timeout_ms, int pause_ms,
                             const uint8_t *val, size_t n)
{
    uint8_t buf[256];
    kvp__mpw_t w;
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp_key_t k = kvp_key_str(name);
    uint64_t sz = n;
    kvp__wire_req_encode(&w, KVP_WOP_PUT, 7, timeout_ms, key, &k, 1, &sz);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, n, val, n / 2);
    sleep_ms(pause_ms);
    ASSERT_EQ(send(fd, val + n / 2, n - n / 2, MSG_NOSIGNAL), (ssize_t)(n - n / 2));
    uint32_t op;
    kvp_status_t st;
    ASSERT_EQ(lane_raw_next(fd, &op, &st), 1);
    ASSERT_EQ(op, (uint32_t)KVP_WOP_PUT);
    return st;
}

static int exists_raw(int fd, uint64_t key, const char *name)
{
    uint8_t buf[256];
    kvp__mpw_t w;
    kvp__mpw_init(&w, buf, sizeof buf);
    kvp_key_t k = kvp_key_str(name);
    kvp__wire_req_encode(&w, KVP_WOP_EXISTS, 8, 0, key, &k, 1, NULL);
    lane_raw_frame(fd, w.buf, (uint32_t)w.len, 0, NULL, 0);
    uint8_t *hdr;
    kvp__wire_reply_t rep;
    uint64_t dl;
    ASSERT_EQ(lane_raw_reply(fd, &hdr, &rep, &dl), 1);
    ASSERT_EQ(rep.op, (uint32_t)KVP_WOP_EXISTS);
    ASSERT_OK(rep.status);
    uint32_t len;
    const uint8_t *bits = kvp__mpr_bytes(&rep.body, 16, &len);
    ASSERT(!rep.body.err && len == 1);
    int present = bits[0];
    free(hdr);
    return present;
}

/* A 64 MiB server, and a client of it on the TCP transport. */
static kvp_pool_t *start(server_t *s)
{
    server_start(s, "64MiB", 0, NULL);
    return open_ok(lane_uri(s));
}

TEST(test_server_lane_put_past_its_timeout_expires_and_answers_timeout)
{
    server_t s = {0};
    kvp_pool_t *healthy = start(&s);
    size_t n = 1 << 20;
    uint8_t *val = malloc(n);
    for (size_t i = 0; i < n; i++)
        val[i] = (uint8_t)(i * 13 + 1);
    uint64_t key;
    int fd = lane_raw_connect(s.port, &key);
    /* timeout 300 ms, values stalled for 1.5 s (the server checks every
     * second): the put ends KVP_ERR_TIMEOUT, nothing is stored, its
     * reservation is gone, and the connection is still in step. */
    ASSERT_EQ(slow_put(fd, key, "late", 300, 1500, val, n), KVP_ERR_TIMEOUT);
    ASSERT_EQ(exists_raw(fd, key, "late"), 0);
    kvp_pool_stats_t st;
    await_reservations_gone(healthy, &st);
    ASSERT_EQ(st.live, 0);
    ASSERT_EQ(st.expired_put, 1); /* its reservation expired (not committed, not left open) */
    /* Stalled as long but within its timeout (10 s): stored. */
    ASSERT_OK(slow_put(fd, key, "in-time", 10000, 1500, val, n));
    ASSERT_EQ(exists_raw(fd, key, "in-time"), 1);
    /* timeout_ms 0: no deadline at all. */
    ASSERT_OK(slow_put(fd, key, "no-deadline", 0, 1500, val, n));
    ASSERT_EQ(exists_raw(fd, key, "no-deadline"), 1);
    close(fd);
    free(val);
    kvp_pool_close(healthy);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

/* n_gets GETs of "big" whose replies wait unread (the client does not read)
 * for 2.5 s: those not yet begun when their timeout_ms passes go as
 * KVP_ERR_TIMEOUT without values (their leases ended).  Returns how many
 * were served, *timeouts how many timed out. */
static int gets_unread(uint16_t port, uint32_t timeout_ms, int n_gets, int *timeouts)
{
    uint64_t key;
    int fd = lane_raw_connect(port, &key);
    kvp_key_t k = kvp_key_str("big");
    uint64_t cap = 1 << 20;
    for (int i = 0; i < n_gets; i++) {
        uint8_t buf[128];
        kvp__mpw_t w;
        kvp__mpw_init(&w, buf, sizeof buf);
        kvp__wire_req_encode(&w, KVP_WOP_GET, (uint64_t)i + 1, timeout_ms, key, &k, 1, &cap);
        lane_raw_frame(fd, w.buf, (uint32_t)w.len, 0, NULL, 0);
    }
    sleep_ms(2500);
    *timeouts = 0;
    int ok = 0;
    for (int i = 0; i < n_gets; i++) {
        uint8_t *hdr;
        kvp__wire_reply_t rep;
        uint64_t dl;
        ASSERT_EQ(lane_raw_reply(fd, &hdr, &rep, &dl), 1);
        ASSERT_EQ(rep.op, (uint32_t)KVP_WOP_GET);
        ASSERT_EQ(rep.req_id, (uint64_t)i + 1);
        free(hdr);
        if (rep.status == KVP_ERR_TIMEOUT) {
            ASSERT_EQ(dl, 0); /* no values */
            (*timeouts)++;
        } else {
            ASSERT_OK(rep.status);
            ASSERT_EQ(dl, cap);
            ok++;
        }
        for (uint64_t left = dl; left;) {
            char sink[65536];
            ssize_t r = recv(fd, sink, left < sizeof sink ? left : sizeof sink, 0);
            ASSERT(r > 0);
            left -= (uint64_t)r;
        }
    }
    close(fd);
    return ok;
}

TEST(test_server_lane_get_reply_waiting_past_its_timeout_answers_timeout)
{
    enum { N = 150 };
    int timeouts;
    server_t s = {0};
    kvp_pool_t *healthy = start(&s);
    kvp_status_t st;
    put_pattern(healthy, "big", 1 << 20, 5, &st);
    ASSERT_OK(st);
    /* 64 MiB of replies queue (the rest of the gets wait unread in the
     * socket): the queued ones not begun pass their 300 ms deadline. */
    int ok = gets_unread(s.port, 300, N, &timeouts);
    ASSERT_MSG(timeouts >= 20, "%d of %d gets timed out (%d ok)", timeouts, N, ok);
    ASSERT_EQ(ok + timeouts, N);
    /* With no deadline every one is served. */
    ok = gets_unread(s.port, 0, N, &timeouts);
    ASSERT_EQ(timeouts, 0);
    ASSERT_EQ(ok, N);
    ASSERT_EQ(check_pattern(healthy, "big", 1 << 20, 5), 1);
    kvp_pool_close(healthy);
    ASSERT_EQ(server_stop(&s, SIGTERM), 0);
}

TEST_LIST(T(test_server_lane_put_past_its_timeout_expires_and_answers_timeout),
          T(test_server_lane_get_reply_waiting_past_its_timeout_answers_timeout))
