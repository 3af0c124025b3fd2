/* Fuzz target: the readiness-event path.  The bytes are one frame off the
 * PULL socket: kvp_ec_json_parse, then a real consumer scheduler whose
 * inbox returns that event (twice: a repeated event) to the drain that
 * build_connector_meta runs, with one shard and with two (the partial
 * shard-readiness set), and with the request waiting before the event or
 * arriving after it.  Nothing may crash or leak; a malformed event costs
 * that event only. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool/ec_connector.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    int64_t now;
    uint64_t jobs;
    bool shut;
    size_t shards;
    bool armed; /* the next drain returns the event */
    const kvp_ec_value_t *events[2];
} fx_t;

static int64_t clk(void *ctx) { return ((fx_t *)ctx)->now; }

static kvp_status_t submit(void *ctx, const char *addr, const char *tid, uint64_t *job_p)
{
    fx_t *f = ctx;
    (void)addr;
    (void)tid;
    if (f->shut)
        return KVP_ERR_CLOSED;
    *job_p = ++f->jobs;
    return KVP_OK;
}

static void shutdown_(void *ctx) { ((fx_t *)ctx)->shut = true; }

static kvp_status_t discover(void *ctx, const char *addr, const char *const **addrs_p, size_t *n_p)
{
    (void)ctx;
    (void)addr;
    *addrs_p = NULL;
    *n_p = 0;
    return KVP_ERR_NOT_FOUND;
}

static kvp_status_t cancel(void *ctx, const char *addr, const char *tid, bool *cancelled_p)
{
    (void)ctx;
    (void)addr;
    (void)tid;
    *cancelled_p = false;
    return KVP_ERR_TIMEOUT;
}

static size_t shard_count(void *ctx) { return ((fx_t *)ctx)->shards; }

static kvp_status_t drain(void *ctx, const char *addr, const kvp_ec_value_t *const **events_p, size_t *n_p)
{
    fx_t *f = ctx;
    (void)addr;
    *events_p = f->events;
    *n_p = f->armed ? 2 : 0;
    f->armed = false;
    return KVP_OK;
}

static const char *str_or(const kvp_ec_value_t *v, const char *dflt)
{
    return v && v->type == KVP_EC_V_STR && !memchr(v->u.str.ptr, 0, v->u.str.len) ? v->u.str.ptr : dflt;
}

static void build(kvp_ec_sched_t *s)
{
    kvp_ec_meta_t m;
    memset(&m, 0, sizeof m);
    if (kvp_ec_sched_build_connector_meta(s, NULL, 0, NULL, 0, &m) == KVP_OK)
        kvp_ec_meta_cleanup(&m);
}

static void run(const kvp_ec_value_t *ev, size_t shards, bool wait_first)
{
    fx_t f;
    memset(&f, 0, sizeof f);
    f.now = 1000;
    f.shards = shards;
    f.events[0] = f.events[1] = ev;
    kvp_ec_config_t c;
    kvp_ec_config_init(&c);
    c.is_consumer = true;
    c.control_addr = "tcp://127.0.0.1:1";
    c.push_wait_timeout_s = 1;
    c.pool_size = 1 << 20;
    c.dtype = KVP_EC_DTYPE_BFLOAT16;
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &c;
    p.clock = (kvp_ec_clock_t){clk, &f};
    p.control = (kvp_ec_control_t){discover, cancel, NULL, &f};
    p.executor = (kvp_ec_executor_t){submit, shutdown_, &f};
    p.inbox = (kvp_ec_inbox_t){shard_count, drain, NULL, &f};
    kvp_ec_sched_t *s;
    if (kvp_ec_sched_create(&p, &s) != KVP_OK)
        abort();
    /* the request the event is for, when its fields name one */
    const char *hash = str_or(kvp_ec_value_get(ev, "mm_hash"), "H");
    const char *tid = str_or(kvp_ec_value_get(ev, "transfer_id"), "T");
    kvp_ec_feature_t feat = {hash, "image", 0, 16, 16};
    kvp_ec_item_t item = {hash, tid};
    kvp_ec_transfer_params_t params = {NULL, &item, 1};
    kvp_ec_request_t req = {"r1", &feat, 1, &params};
    bool ok;
    if (!wait_first)
        f.armed = true;
    kvp_ec_sched_ensure_cache_available(s, &req, 0, &ok);
    kvp_ec_sched_update_state_after_alloc(s, &req, 0);
    f.armed = true;
    f.now += 10;
    build(s);
    kvp_ec_sched_has_cache_item(s, hash, &ok);
    kvp_ec_sched_ensure_cache_available(s, &req, 0, &ok);
    f.now += 10;
    build(s);
    /* past the push wait: whatever is still waiting becomes unavailable */
    f.now += 2000;
    build(s);
    kvp_ec_strlist_t un;
    if (kvp_ec_sched_take_unavailable_requests(s, &un) == KVP_OK)
        kvp_ec_strlist_cleanup(&un);
    kvp_ec_finished_t fin;
    if (kvp_ec_sched_request_finished(s, &req, &fin) == KVP_OK)
        kvp_ec_finished_cleanup(&fin);
    kvp_ec_sched_close(s);
    kvp_ec_sched_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_ec_value_t *v;
    if (kvp_ec_json_parse((const char *)data, size, 32, &v) != KVP_OK)
        return 0; /* the inbox drops an undecodable frame before the scheduler */
    run(v, 1, true);
    run(v, 2, true);
    run(v, 1, false);
    kvp_ec_value_free(v);
    return 0;
}
