/* The EC control client (src/ec/ec_client.h, control.py ControlClient) and
 * the public ZeroMQ collaborators (kvp_ec_zmq_*: control, executor, inbox),
 * against real peers: a REP server thread written here with raw libzmq on
 * 127.0.0.1 ephemeral ports (and a PUSH socket for readiness events). */
#include "test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "ec/ec_client.h"

/* ---- a consumer's control server, scripted ---- */

#define MAX_LOG 512
#define MAX_SCRIPT 16

typedef struct srv {
    void *ctx, *rep;
    char addr[128];
    int port;
    int event_port; /* what event_port answers */
    pthread_t th;
    atomic_bool stop;
    pthread_mutex_t mu;
    char *log[MAX_LOG]; /* requests received, in order */
    size_t n_log;
    /* the next replies: NULL = the default for the op; delay before sending */
    const char *script[MAX_SCRIPT];
    int delay_ms[MAX_SCRIPT];
    size_t n_script, pos;
    int all_delay_ms; /* added to every reply */
} srv_t;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int port_of_endpoint(void *sock, char *out, size_t outlen)
{
    char ep[120];
    size_t n = sizeof ep;
    ASSERT_OK(zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, ep, &n));
    if (out)
        snprintf(out, outlen, "%s", ep);
    return atoi(strrchr(ep, ':') + 1);
}

/* The default reply of the fake consumer. */
static void default_reply(srv_t *s, const char *req, char *out, size_t outlen)
{
    if (strstr(req, "\"op\":\"peers\""))
        snprintf(out, outlen, "{\"ok\":true,\"result\":{\"ports\":[%d]}}", s->port);
    else if (strstr(req, "\"op\":\"event_port\""))
        snprintf(out, outlen, "{\"ok\":true,\"result\":%d}", s->event_port);
    else if (strstr(req, "\"op\":\"cancel\""))
        snprintf(out, outlen, "{\"ok\":true,\"result\":{\"cancelled\":true}}");
    else
        snprintf(out, outlen, "{\"ok\":true,\"result\":%s}", req);
}

static void *srv_main(void *arg)
{
    srv_t *s = arg;
    char buf[8192], out[9000];
    while (!atomic_load(&s->stop)) {
        int n = zmq_recv(s->rep, buf, sizeof buf - 1, 0);
        if (n < 0)
            continue; /* RCVTIMEO: look at stop again */
        buf[n < (int)sizeof buf - 1 ? n : (int)sizeof buf - 1] = 0;
        pthread_mutex_lock(&s->mu);
        if (s->n_log < MAX_LOG)
            s->log[s->n_log++] = strdup(buf);
        const char *r = NULL;
        int delay = s->all_delay_ms;
        if (s->pos < s->n_script) {
            r = s->script[s->pos];
            delay += s->delay_ms[s->pos];
            s->pos++;
        }
        if (r)
            snprintf(out, sizeof out, "%s", r);
        else
            default_reply(s, buf, out, sizeof out);
        pthread_mutex_unlock(&s->mu);
        if (delay)
            sleep_ms(delay);
        zmq_send(s->rep, out, strlen(out), 0);
    }
    return NULL;
}

static void srv_start(srv_t *s)
{
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->ctx = zmq_ctx_new();
    s->rep = zmq_socket(s->ctx, ZMQ_REP);
    int to = 20, linger = 0;
    zmq_setsockopt(s->rep, ZMQ_RCVTIMEO, &to, sizeof to);
    zmq_setsockopt(s->rep, ZMQ_LINGER, &linger, sizeof linger);
    ASSERT_OK(zmq_bind(s->rep, "tcp://127.0.0.1:*"));
    s->port = port_of_endpoint(s->rep, s->addr, sizeof s->addr);
    ASSERT_GT(s->port, 0);
    pthread_create(&s->th, NULL, srv_main, s);
}

static void srv_script(srv_t *s, const char *reply, int delay_ms)
{
    pthread_mutex_lock(&s->mu);
    s->script[s->n_script] = reply;
    s->delay_ms[s->n_script] = delay_ms;
    s->n_script++;
    pthread_mutex_unlock(&s->mu);
}

static size_t srv_count(srv_t *s)
{
    pthread_mutex_lock(&s->mu);
    size_t n = s->n_log;
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* The i-th request the server got (a copy the caller frees). */
static char *srv_req(srv_t *s, size_t i)
{
    pthread_mutex_lock(&s->mu);
    char *r = i < s->n_log ? strdup(s->log[i]) : NULL;
    pthread_mutex_unlock(&s->mu);
    return r;
}

static void srv_stop(srv_t *s)
{
    atomic_store(&s->stop, true);
    pthread_join(s->th, NULL);
    zmq_close(s->rep);
    zmq_ctx_term(s->ctx);
    for (size_t i = 0; i < s->n_log; i++)
        free(s->log[i]);
    pthread_mutex_destroy(&s->mu);
}

static void assert_req(srv_t *s, size_t i, const char *want)
{
    char *r = srv_req(s, i);
    ASSERT_STR_EQ(r, want);
    free(r);
}

/* Waits (up to ms) until cond(ctx) holds. */
static bool wait_until(bool (*cond)(void *), void *ctx, int ms)
{
    uint64_t end = kvp__now_ns() + (uint64_t)ms * 1000000u;
    while (!cond(ctx)) {
        if (kvp__now_ns() > end)
            return false;
        sleep_ms(2);
    }
    return true;
}

static kvp_status_t req_str(kvp__ec_client_t *c, const char *addr, const char *req, kvp__ec_reply_t *rep)
{
    return kvp__ec_client_request(c, addr, req, strlen(req), rep);
}

/* ---- the client ---- */

TEST(test_ec_client_request_reply)
{
    srv_t s;
    srv_start(&s);
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(2000, &c));
    for (int i = 0; i < 3; i++) {
        kvp__ec_reply_t rep;
        kvp__ec_reply_init(&rep);
        ASSERT_OK(req_str(c, s.addr, "{\"op\":\"status\",\"transfer_id\":\"T\"}", &rep));
        ASSERT(rep.ok);
        ASSERT(rep.result && rep.result->type == KVP__JSON_OBJECT);
        ASSERT_STR_EQ(kvp__json_get(rep.result, "transfer_id")->u.s, "T");
        kvp__ec_reply_cleanup(&rep);
    }
    kvp__ec_client_stats_t st;
    kvp__ec_client_stats(c, &st);
    ASSERT_EQ(st.requests, 3);
    ASSERT_EQ(st.errors, 0);
    ASSERT_EQ(st.sockets_open, 1); /* one socket, reused */
    assert_req(&s, 2, "{\"op\":\"status\",\"transfer_id\":\"T\"}");
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_client_timeout_closes_socket_and_next_request_works)
{
    srv_t s;
    srv_start(&s);
    srv_script(&s, NULL, 400); /* the first reply comes after the timeout */
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(100, &c));
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    uint64_t t0 = kvp__now_ns();
    ASSERT_EQ(req_str(c, s.addr, "{\"op\":\"peers\"}", &rep), KVP_ERR_TIMEOUT);
    uint64_t waited_ms = (kvp__now_ns() - t0) / 1000000u;
    ASSERT_GE(waited_ms, 90);
    ASSERT_LT(waited_ms, 1000);
    kvp__ec_client_stats_t st;
    kvp__ec_client_stats(c, &st);
    ASSERT_EQ(st.timeouts, 1);
    ASSERT_EQ(st.sockets_open, 0); /* the REQ socket that missed its reply is gone */
    sleep_ms(400);                 /* the server is free again (its late reply went nowhere) */
    ASSERT_OK(req_str(c, s.addr, "{\"op\":\"event_port\"}", &rep));
    ASSERT(rep.ok);
    ASSERT_EQ(rep.result->type, KVP__JSON_INT);
    kvp__ec_client_stats(c, &st);
    ASSERT_EQ(st.sockets_open, 1);
    ASSERT_EQ(st.requests, 2);
    kvp__ec_reply_cleanup(&rep);
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_client_error_reply_is_remote)
{
    srv_t s;
    srv_start(&s);
    srv_script(&s, "{\"ok\":false,\"error\":\"EC consumer buffer pool is full\"}", 0);
    srv_script(&s, "{\"ok\":false}", 0);
    srv_script(&s, "not json", 0);
    srv_script(&s, "[1]", 0);
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(2000, &c));
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    ASSERT_EQ(req_str(c, s.addr, "{\"op\":\"peers\"}", &rep), KVP_ERR_REMOTE);
    ASSERT(!rep.ok);
    ASSERT_STR_EQ(rep.error, "EC consumer buffer pool is full");
    /* exchange reports the verdict without failing */
    ASSERT_OK(kvp__ec_client_exchange(c, s.addr, "{}", 2, &rep));
    ASSERT(!rep.ok);
    ASSERT_STR_EQ(rep.error, "EC control request failed");
    ASSERT_EQ(req_str(c, s.addr, "{\"op\":\"peers\"}", &rep), KVP_ERR_DECODE);
    ASSERT_EQ(req_str(c, s.addr, "{\"op\":\"peers\"}", &rep), KVP_ERR_DECODE);
    /* a reply that arrived whole leaves the socket in step: it is reused */
    ASSERT_OK(req_str(c, s.addr, "{\"op\":\"peers\"}", &rep));
    kvp__ec_client_stats_t st;
    kvp__ec_client_stats(c, &st);
    ASSERT_EQ(st.sockets_open, 1);
    ASSERT_EQ(st.errors, 2); /* the two undecodable replies; not ok is a verdict, not an error */
    kvp__ec_reply_cleanup(&rep);
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_client_shards_discovery_and_cache)
{
    srv_t s;
    srv_start(&s);
    srv_script(&s, "{\"ok\":true,\"result\":{\"ports\":[6001,6002,65535]}}", 0);
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(2000, &c));
    const char *const *addrs;
    size_t n;
    ASSERT_OK(kvp__ec_client_shards(c, s.addr, &addrs, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STR_EQ(addrs[0], "tcp://127.0.0.1:6001");
    ASSERT_STR_EQ(addrs[1], "tcp://127.0.0.1:6002");
    ASSERT_STR_EQ(addrs[2], "tcp://127.0.0.1:65535");
    const char *const *again;
    ASSERT_OK(kvp__ec_client_shards(c, s.addr, &again, &n));
    ASSERT(again == addrs);
    ASSERT_EQ(srv_count(&s), 1); /* cached: asked once */
    assert_req(&s, 0, "{\"op\":\"peers\"}");
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_client_bad_peers_reply_is_error)
{
    srv_t s;
    srv_start(&s);
    static const char *bad[] = {
        "{\"ok\":true,\"result\":{\"ports\":[]}}",     "{\"ok\":true,\"result\":{\"ports\":[0]}}",
        "{\"ok\":true,\"result\":{\"ports\":[65536]}}", "{\"ok\":true,\"result\":{\"ports\":[\"6001\"]}}",
        "{\"ok\":true,\"result\":{\"ports\":6001}}",   "{\"ok\":true,\"result\":[6001]}",
        "{\"ok\":true}",                               "{\"ok\":true,\"result\":{\"ports\":[1,-1]}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        srv_script(&s, bad[i], 0);
    srv_script(&s, "{\"ok\":false,\"error\":\"no\"}", 0);
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(2000, &c));
    const char *const *addrs;
    size_t n;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ASSERT_MSG(kvp__ec_client_shards(c, s.addr, &addrs, &n) == KVP_ERR_DECODE, "accepted %s", bad[i]);
    ASSERT_EQ(kvp__ec_client_shards(c, s.addr, &addrs, &n), KVP_ERR_REMOTE);
    /* a failure is not cached: the next good reply is taken */
    ASSERT_OK(kvp__ec_client_shards(c, s.addr, &addrs, &n));
    ASSERT_EQ(n, 1);
    ASSERT_EQ(srv_count(&s), sizeof bad / sizeof bad[0] + 2);
    /* event_port must be a port too */
    srv_script(&s, "{\"ok\":true,\"result\":\"5555\"}", 0);
    uint16_t port;
    ASSERT_EQ(kvp__ec_client_event_port(c, s.addr, &port), KVP_ERR_DECODE);
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_client_event_port_and_cancel)
{
    srv_t s;
    srv_start(&s);
    s.event_port = 5555;
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(2000, &c));
    uint16_t port;
    ASSERT_OK(kvp__ec_client_event_port(c, s.addr, &port));
    ASSERT_EQ(port, 5555);
    bool cancelled = false;
    ASSERT_OK(kvp__ec_client_cancel(c, s.addr, "T1", NULL, false, false, &cancelled));
    ASSERT(cancelled);
    assert_req(&s, 1, "{\"op\":\"cancel\",\"transfer_id\":\"T1\"}");
    srv_script(&s, "{\"ok\":true,\"result\":{\"cancelled\":false}}", 0);
    ASSERT_OK(kvp__ec_client_cancel(c, s.addr, "T2", "r2", true, true, &cancelled));
    ASSERT(!cancelled);
    assert_req(&s, 2, "{\"op\":\"cancel\",\"transfer_id\":\"T2\",\"reservation_id\":\"r2\",\"abandon\":true,"
                      "\"refresh\":true}");
    srv_script(&s, "{\"ok\":true,\"result\":null}", 0);
    ASSERT_OK(kvp__ec_client_cancel(c, s.addr, "T3", "", false, false, &cancelled));
    ASSERT(!cancelled);
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_client_bad_address_and_closed)
{
    kvp__ec_client_t *c;
    ASSERT_EQ(kvp__ec_client_create(0, &c), KVP_ERR_INVALID_ARG);
    ASSERT_OK(kvp__ec_client_create(100, &c));
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    ASSERT_EQ(req_str(c, "nonsense", "{}", &rep), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(req_str(c, "tcp://", "{}", &rep), KVP_ERR_INVALID_ARG);
    /* nobody listens: a timeout, not a hang */
    ASSERT_EQ(req_str(c, "tcp://127.0.0.1:1", "{}", &rep), KVP_ERR_TIMEOUT);
    kvp__ec_reply_cleanup(&rep);
    kvp__ec_client_destroy(c);
    kvp__ec_client_destroy(NULL);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

typedef struct {
    kvp__ec_client_t *c;
    const char *addr;
    int failures;
} conc_t;

static void *conc_main(void *arg)
{
    conc_t *t = arg;
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    for (int i = 0; i < 50; i++) {
        char req[64];
        snprintf(req, sizeof req, "{\"op\":\"status\",\"transfer_id\":%d}", i);
        if (req_str(t->c, t->addr, req, &rep) != KVP_OK || kvp__json_get(rep.result, "transfer_id")->u.i != i)
            t->failures++;
    }
    kvp__ec_reply_cleanup(&rep);
    return NULL;
}

TEST(test_ec_client_thread_safe_socket_free_list)
{
    srv_t s;
    srv_start(&s);
    kvp__ec_client_t *c;
    ASSERT_OK(kvp__ec_client_create(2000, &c));
    pthread_t th[4];
    conc_t t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (conc_t){c, s.addr, 0};
        pthread_create(&th[i], NULL, conc_main, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ASSERT_EQ(t[i].failures, 0);
    }
    kvp__ec_client_stats_t st;
    kvp__ec_client_stats(c, &st);
    ASSERT_EQ(st.requests, 200);
    ASSERT_GE(st.sockets_open, 1);
    ASSERT_LE(st.sockets_open, 4); /* at most one per concurrent caller */
    ASSERT_EQ(srv_count(&s), 200);
    kvp__ec_client_destroy(c);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* ---- the ZeroMQ collaborators ---- */

static bool srv_has_4(void *ctx) { return srv_count(ctx) >= 4; }

TEST(test_ec_zmq_executor_runs_cancels)
{
    srv_t s;
    srv_start(&s);
    kvp_ec_zmq_t *z;
    ASSERT_EQ(kvp_ec_zmq_create(0, 1, &z), KVP_ERR_INVALID_ARG);
    ASSERT_OK(kvp_ec_zmq_create(2000, 2, &z));
    kvp_ec_executor_t ex = kvp_ec_zmq_executor(z);
    uint64_t j1 = 0, j2 = 0;
    ASSERT_OK(ex.submit_cancel(ex.ctx, s.addr, "T1", &j1));
    ASSERT_OK(ex.submit_cancel(ex.ctx, s.addr, "T2", &j2));
    ASSERT_EQ(j1, 1);
    ASSERT_EQ(j2, 2);
    /* each job: peers once (then cached), cancel per shard */
    ASSERT(wait_until(srv_has_4, &s, 3000) || srv_count(&s) >= 3);
    sleep_ms(50);
    int peers = 0, c1 = 0, c2 = 0;
    for (size_t i = 0; i < srv_count(&s); i++) {
        char *r = srv_req(&s, i);
        peers += !strcmp(r, "{\"op\":\"peers\"}");
        c1 += !strcmp(r, "{\"op\":\"cancel\",\"transfer_id\":\"T1\"}");
        c2 += !strcmp(r, "{\"op\":\"cancel\",\"transfer_id\":\"T2\"}");
        free(r);
    }
    ASSERT_GE(peers, 1);
    ASSERT_LE(peers, 2); /* two threads may both ask before either caches */
    ASSERT_EQ(c1, 1);
    ASSERT_EQ(c2, 1);
    /* the control table: the same client */
    kvp_ec_control_t ctl = kvp_ec_zmq_control(z);
    const char *const *addrs;
    size_t n;
    ASSERT_OK(ctl.discover_shards(ctl.ctx, s.addr, &addrs, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(addrs[0], s.addr);
    bool cancelled = false;
    ASSERT_OK(ctl.cancel(ctl.ctx, s.addr, "T3", &cancelled));
    ASSERT(cancelled);
    ex.shutdown(ex.ctx);
    ASSERT_EQ(ex.submit_cancel(ex.ctx, s.addr, "T4", &j1), KVP_ERR_CLOSED);
    ex.shutdown(ex.ctx); /* twice is fine */
    ctl.close(ctl.ctx);
    ASSERT_EQ(ctl.cancel(ctl.ctx, s.addr, "T5", &cancelled), KVP_ERR_CLOSED);
    kvp_ec_zmq_destroy(z);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_zmq_shutdown_cancels_jobs_not_started)
{
    srv_t s;
    srv_start(&s);
    s.all_delay_ms = 150; /* every reply is slow: job 1 is still running at shutdown */
    kvp_ec_zmq_t *z;
    ASSERT_OK(kvp_ec_zmq_create(2000, 1, &z));
    kvp_ec_executor_t ex = kvp_ec_zmq_executor(z);
    uint64_t id;
    ASSERT_OK(ex.submit_cancel(ex.ctx, s.addr, "T1", &id));
    ASSERT_OK(ex.submit_cancel(ex.ctx, s.addr, "T2", &id));
    ASSERT_OK(ex.submit_cancel(ex.ctx, s.addr, "T3", &id));
    ASSERT_EQ(id, 3);
    sleep_ms(50);
    uint64_t t0 = kvp__now_ns();
    ex.shutdown(ex.ctx); /* waits for job 1 (peers + cancel, ~300 ms), drops 2 and 3 */
    uint64_t waited_ms = (kvp__now_ns() - t0) / 1000000u;
    ASSERT_GE(waited_ms, 150);
    ASSERT_EQ(srv_count(&s), 2);
    assert_req(&s, 0, "{\"op\":\"peers\"}");
    assert_req(&s, 1, "{\"op\":\"cancel\",\"transfer_id\":\"T1\"}");
    sleep_ms(200);
    ASSERT_EQ(srv_count(&s), 2); /* T2 and T3 never ran */
    kvp_ec_zmq_destroy(z);
    srv_stop(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* A fake consumer shard: the REP server above plus a PUSH socket bound
 * here (used by the test's thread only). */
typedef struct {
    srv_t s;
    void *push_ctx, *push;
} consumer_t;

static void consumer_start(consumer_t *c)
{
    srv_start(&c->s);
    c->push_ctx = zmq_ctx_new();
    c->push = zmq_socket(c->push_ctx, ZMQ_PUSH);
    int linger = 0, to = 2000;
    zmq_setsockopt(c->push, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(c->push, ZMQ_SNDTIMEO, &to, sizeof to);
    ASSERT_OK(zmq_bind(c->push, "tcp://127.0.0.1:*"));
    c->s.event_port = port_of_endpoint(c->push, NULL, 0);
}

static void consumer_push(consumer_t *c, const char *frame, size_t len)
{
    ASSERT_EQ(zmq_send(c->push, frame, len, 0), (int)len);
}

static void consumer_stop(consumer_t *c)
{
    zmq_close(c->push);
    zmq_ctx_term(c->push_ctx);
    srv_stop(&c->s);
}

typedef struct {
    kvp_ec_inbox_t in;
    const char *base;
    /* what the drains returned, as transfer ids (or "<type>") */
    char got[64][32];
    size_t n_got;
    size_t want;
} drainer_t;

static void drain_once(drainer_t *d)
{
    const kvp_ec_value_t *const *ev;
    size_t n;
    ASSERT_OK(d->in.drain(d->in.ctx, d->base, &ev, &n));
    for (size_t i = 0; i < n && d->n_got < 64; i++) {
        const kvp_ec_value_t *tid = kvp_ec_value_get(ev[i], "transfer_id");
        if (tid && tid->type == KVP_EC_V_STR)
            snprintf(d->got[d->n_got++], 32, "%s", tid->u.str.ptr);
        else
            snprintf(d->got[d->n_got++], 32, "<%d>", (int)ev[i]->type);
    }
}

static bool connected(void *ctx)
{
    drainer_t *d = ctx;
    drain_once(d);
    return d->in.shard_count(d->in.ctx) > 0;
}

static bool drained_enough(void *ctx)
{
    drainer_t *d = ctx;
    drain_once(d);
    return d->n_got >= d->want;
}

TEST(test_ec_zmq_inbox_discovers_then_drains_in_order)
{
    consumer_t c;
    consumer_start(&c);
    kvp_ec_zmq_t *z;
    ASSERT_OK(kvp_ec_zmq_create(2000, 2, &z));
    drainer_t d = {.in = kvp_ec_zmq_inbox(z), .base = c.s.addr};
    ASSERT_EQ(d.in.shard_count(d.in.ctx), 0); /* before discovery */
    /* the first drain only queues the discovery: it returns at once */
    uint64_t t0 = kvp__now_ns();
    drain_once(&d);
    ASSERT_LT((kvp__now_ns() - t0) / 1000000u, 100);
    ASSERT_EQ(d.n_got, 0);
    ASSERT(wait_until(connected, &d, 3000));
    ASSERT_EQ(d.in.shard_count(d.in.ctx), 1);
    assert_req(&c.s, 0, "{\"op\":\"peers\"}");
    assert_req(&c.s, 1, "{\"op\":\"event_port\"}");
    for (int i = 0; i < 10; i++) {
        char ev[160];
        int n = snprintf(ev, sizeof ev,
                         "{\"transfer_id\":\"T%d\",\"mm_hash\":\"H\",\"ready\":true,\"reservation_id\":\"r\","
                         "\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"bfloat16\",\"shard\":%d}",
                         i, c.s.port);
        consumer_push(&c, ev, (size_t)n);
    }
    d.want = 10;
    ASSERT(wait_until(drained_enough, &d, 3000));
    ASSERT_EQ(d.n_got, 10);
    for (int i = 0; i < 10; i++) {
        char want[8];
        snprintf(want, sizeof want, "T%d", i);
        ASSERT_STR_EQ(d.got[i], want);
    }
    ASSERT_EQ(srv_count(&c.s), 2); /* discovered once */
    d.in.close(d.in.ctx);
    ASSERT_EQ(d.in.shard_count(d.in.ctx), 0);
    size_t before = d.n_got;
    zmq_send(c.push, "{\"transfer_id\":\"late\"}", 22, ZMQ_DONTWAIT); /* (no peer left: may not go) */
    drain_once(&d);
    ASSERT_EQ(d.n_got, before); /* after close: nothing */
    kvp_ec_executor_t ex = kvp_ec_zmq_executor(z);
    ex.shutdown(ex.ctx);
    kvp_ec_zmq_destroy(z);
    consumer_stop(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_zmq_inbox_skips_undecodable_frames)
{
    consumer_t c;
    consumer_start(&c);
    kvp_ec_zmq_t *z;
    ASSERT_OK(kvp_ec_zmq_create(2000, 1, &z));
    drainer_t d = {.in = kvp_ec_zmq_inbox(z), .base = c.s.addr};
    ASSERT(wait_until(connected, &d, 3000));
    static const char *frames[] = {
        "{\"transfer_id\":\"A\",\"ready\":true}",
        "{\"transfer_id\":",          /* truncated */
        "\xff\xfe",                   /* not UTF-8 */
        "{\"transfer_id\":\"x\",\"nbytes\":1.5}", /* a float: kvp_ec_json_parse refuses it */
        "7",                          /* JSON but not an object: the scheduler's to judge */
        "",
        "{\"transfer_id\":\"B\",\"ready\":true}",
    };
    for (size_t i = 0; i < sizeof frames / sizeof frames[0]; i++)
        consumer_push(&c, frames[i], strlen(frames[i]));
    d.want = 3;
    ASSERT(wait_until(drained_enough, &d, 3000));
    sleep_ms(50);
    drain_once(&d);
    ASSERT_EQ(d.n_got, 3);
    ASSERT_STR_EQ(d.got[0], "A");
    ASSERT_STR_EQ(d.got[1], "<2>"); /* KVP_EC_V_INT */
    ASSERT_STR_EQ(d.got[2], "B");
    kvp_ec_zmq_destroy(z); /* without a close first: destroy closes all three */
    consumer_stop(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_zmq_inbox_retries_failed_discovery)
{
    consumer_t c;
    consumer_start(&c);
    srv_script(&c.s, "{\"ok\":false,\"error\":\"not yet\"}", 0);              /* peers fails */
    srv_script(&c.s, NULL, 0);                                                /* peers */
    srv_script(&c.s, "{\"ok\":false,\"error\":\"no events here\"}", 0);       /* event_port fails */
    kvp_ec_zmq_t *z;
    ASSERT_OK(kvp_ec_zmq_create(2000, 1, &z));
    drainer_t d = {.in = kvp_ec_zmq_inbox(z), .base = c.s.addr};
    ASSERT(wait_until(connected, &d, 3000));
    /* peers (failed), peers, event_port (failed), event_port (the shards were cached) */
    ASSERT_EQ(srv_count(&c.s), 4);
    assert_req(&c.s, 0, "{\"op\":\"peers\"}");
    assert_req(&c.s, 1, "{\"op\":\"peers\"}");
    assert_req(&c.s, 2, "{\"op\":\"event_port\"}");
    assert_req(&c.s, 3, "{\"op\":\"event_port\"}");
    consumer_push(&c, "{\"transfer_id\":\"A\"}", 19);
    d.want = 1;
    ASSERT(wait_until(drained_enough, &d, 3000));
    ASSERT_STR_EQ(d.got[0], "A");
    kvp_ec_zmq_destroy(z);
    consumer_stop(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_zmq_unreachable_consumer_costs_the_scheduler_nothing)
{
    /* nobody at the address: every drain returns at once while the
     * discovery times out on the executor */
    kvp_ec_zmq_t *z;
    ASSERT_OK(kvp_ec_zmq_create(300, 1, &z));
    kvp_ec_inbox_t in = kvp_ec_zmq_inbox(z);
    uint64_t t0 = kvp__now_ns(), worst = 0;
    while (kvp__now_ns() - t0 < 700u * 1000000u) {
        uint64_t a = kvp__now_ns();
        const kvp_ec_value_t *const *ev;
        size_t n;
        ASSERT_OK(in.drain(in.ctx, "tcp://127.0.0.1:1", &ev, &n));
        ASSERT_EQ(n, 0);
        uint64_t took = kvp__now_ns() - a;
        worst = took > worst ? took : worst;
        sleep_ms(5);
    }
    ASSERT_LT(worst / 1000000u, 50);
    ASSERT_EQ(in.shard_count(in.ctx), 0);
    uint64_t d0 = kvp__now_ns();
    kvp_ec_zmq_destroy(z); /* waits for the running discovery: at most one timeout */
    ASSERT_LT((kvp__now_ns() - d0) / 1000000u, 1500);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* The three tables plugged into a real scheduler (consumer): an event the
 * fake consumer pushes becomes a load in the connector meta. */
static kvp_ec_sched_t *g_sched;
static bool sched_has_A(void *ctx)
{
    (void)ctx;
    bool has = false;
    kvp_ec_sched_has_cache_item(g_sched, "HA", &has);
    return has;
}

TEST(test_ec_zmq_collaborators_drive_a_scheduler)
{
    consumer_t c;
    consumer_start(&c);
    kvp_ec_zmq_t *z;
    ASSERT_OK(kvp_ec_zmq_create(2000, 2, &z));
    kvp_ec_config_t cfg;
    kvp_ec_config_init(&cfg);
    cfg.is_consumer = true;
    cfg.control_addr = c.s.addr;
    cfg.pool_size = 1 << 20;
    cfg.dtype = KVP_EC_DTYPE_BFLOAT16;
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &cfg;
    p.clock = kvp_ec_clock_monotonic();
    p.control = kvp_ec_zmq_control(z);
    p.executor = kvp_ec_zmq_executor(z);
    p.inbox = kvp_ec_zmq_inbox(z);
    ASSERT_OK(kvp_ec_sched_create(&p, &g_sched));
    drainer_t d = {.in = p.inbox, .base = c.s.addr};
    (void)d;
    /* discovery runs from the scheduler's own drains */
    uint64_t end = kvp__now_ns() + 3000u * 1000000u;
    bool has = false;
    while (p.inbox.shard_count(p.inbox.ctx) == 0 && kvp__now_ns() < end) {
        ASSERT_OK(kvp_ec_sched_has_cache_item(g_sched, "HA", &has));
        sleep_ms(6);
    }
    ASSERT_EQ(p.inbox.shard_count(p.inbox.ctx), 1);
    const char ev[] = "{\"transfer_id\":\"TA\",\"mm_hash\":\"HA\",\"ready\":true,\"reservation_id\":\"r\","
                      "\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"bfloat16\",\"shard\":1}";
    consumer_push(&c, ev, sizeof ev - 1);
    ASSERT(wait_until(sched_has_A, NULL, 3000));
    kvp_ec_sched_close(g_sched);
    kvp_ec_sched_destroy(g_sched);
    kvp_ec_zmq_destroy(z);
    consumer_stop(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST_LIST(T(test_ec_client_request_reply), T(test_ec_client_timeout_closes_socket_and_next_request_works),
          T(test_ec_client_error_reply_is_remote), T(test_ec_client_shards_discovery_and_cache),
          T(test_ec_client_bad_peers_reply_is_error), T(test_ec_client_event_port_and_cancel),
          T(test_ec_client_bad_address_and_closed), T(test_ec_client_thread_safe_socket_free_list),
          T(test_ec_zmq_executor_runs_cancels), T(test_ec_zmq_shutdown_cancels_jobs_not_started),
          T(test_ec_zmq_inbox_discovers_then_drains_in_order), T(test_ec_zmq_inbox_skips_undecodable_frames),
          T(test_ec_zmq_inbox_retries_failed_discovery),
          T(test_ec_zmq_unreachable_consumer_costs_the_scheduler_nothing),
          T(test_ec_zmq_collaborators_drive_a_scheduler))
