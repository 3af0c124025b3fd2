/* The EC scheduler (connectors-spec §3.4) through its public hooks with
 * scripted collaborators: scenarios 33-47 of §5 (the scheduler parts) and
 * the bad-input rules (malformed events, unknown indexes, never an abort). */
#include "test.h"

#include "common/alloc.h"
#include "support/ec_scripted.h"
#include "ec/ec_sched_int.h"
#include "kvpool/ec_connector.h"

typedef struct {
    kvp__ec_sclock_t clock;
    kvp__ec_sexec_t exec;
    kvp__ec_sctl_t ctl;
    kvp__ec_sinbox_t inbox;
    kvp_ec_sched_t *s;
} fx_t;

static void fx_init(fx_t *f, bool prod, bool cons, size_t shards, int64_t pool)
{
    memset(f, 0, sizeof *f);
    kvp__ec_sexec_init(&f->exec);
    kvp__ec_sctl_init(&f->ctl);
    kvp__ec_sinbox_init(&f->inbox, shards);
    kvp_ec_config_t c;
    kvp_ec_config_init(&c);
    c.is_producer = prod;
    c.is_consumer = cons;
    c.control_addr = "tcp://10.0.0.2:5500";
    c.push_wait_timeout_s = 10;
    c.pool_size = pool;
    c.hidden_dim = 8;
    c.dtype = KVP_EC_DTYPE_BFLOAT16;
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &c;
    p.clock = kvp__ec_sclock_iface(&f->clock);
    p.control = kvp__ec_sctl_iface(&f->ctl);
    p.executor = kvp__ec_sexec_iface(&f->exec);
    p.inbox = kvp__ec_sinbox_iface(&f->inbox);
    ASSERT_OK(kvp_ec_sched_create(&p, &f->s));
}

static void fx_free(fx_t *f)
{
    kvp_ec_sched_destroy(f->s);
    kvp__ec_sexec_cleanup(&f->exec);
    kvp__ec_sctl_cleanup(&f->ctl);
    kvp__ec_sinbox_cleanup(&f->inbox);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

static void event(fx_t *f, const char *json)
{
    kvp_ec_value_t *v;
    ASSERT_OK(kvp_ec_json_parse(json, strlen(json), 32, &v));
    ASSERT_OK(kvp__ec_sinbox_push(&f->inbox, v));
}

static void ready_event(fx_t *f, const char *tid, const char *hash, int shard)
{
    char buf[256];
    snprintf(buf, sizeof buf,
             "{\"ready\":true,\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"nbytes\":64,\"shape\":[4,8],"
             "\"dtype\":\"bfloat16\",\"shard\":%d}",
             tid, hash, shard);
    event(f, buf);
}

static kvp_ec_state_t state(fx_t *f, const char *tid)
{
    kvp__ec_rec_t *r = kvp__ec_table_get(kvp__ec_sched_table(f->s), tid);
    ASSERT_MSG(r != NULL, "no record %s", tid);
    return r->state;
}

static bool has_rec(fx_t *f, const char *tid) { return kvp__ec_table_get(kvp__ec_sched_table(f->s), tid) != NULL; }

/* one-feature request r1 needing H with transfer id T */
typedef struct {
    kvp_ec_feature_t feat[2];
    kvp_ec_item_t items[2];
    kvp_ec_transfer_params_t params;
    kvp_ec_request_t req;
} oreq_t;

static void mkreq(oreq_t *o, const char *rid, const char *hash, const char *tid, const char *czmq)
{
    memset(o, 0, sizeof *o);
    o->feat[0] = (kvp_ec_feature_t){hash, "image", 0, 16, 16};
    o->items[0] = (kvp_ec_item_t){hash, tid};
    o->params.consumer_zmq = czmq;
    o->params.items = tid ? o->items : NULL;
    o->params.n_items = tid ? 1 : 0;
    o->req = (kvp_ec_request_t){rid, o->feat, 1, &o->params};
}

static bool ensure(fx_t *f, const kvp_ec_request_t *r)
{
    bool ok;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(f->s, r, 0, &ok));
    return ok;
}

static void build(fx_t *f, const char *freed, kvp_ec_meta_t *m)
{
    const char *fr[1] = {freed};
    ASSERT_OK(kvp_ec_sched_build_connector_meta(f->s, fr, freed ? 1 : 0, NULL, 0, m));
}

static void worker(fx_t *f, char *loaded, char *failed, char *reclaimed, bool pending_saves)
{
    kvp_ec_worker_meta_t w = {0};
    w.loaded = loaded ? &loaded : NULL;
    w.n_loaded = loaded ? 1 : 0;
    w.failed_loads = failed ? &failed : NULL;
    w.n_failed_loads = failed ? 1 : 0;
    w.reclaimed = reclaimed ? &reclaimed : NULL;
    w.n_reclaimed = reclaimed ? 1 : 0;
    w.pending_saves = pending_saves;
    ASSERT_OK(kvp_ec_sched_update_connector_output(f->s, &w));
}

TEST(test_ec_s33_single_shard_event_then_load)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    ready_event(&f, "T", "H", 5500);
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT(has);
    ASSERT_EQ(state(&f, "T"), KVP_EC_AVAILABLE);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", NULL);
    ASSERT(!ensure(&f, &o.req));
    ASSERT_EQ(state(&f, "T"), KVP_EC_LOADING);
    ASSERT(kvp_ec_sched_has_pending_push_work(f.s));
    kvp_ec_meta_t m;
    build(&f, NULL, &m);
    ASSERT_EQ(m.n_loads, 1);
    ASSERT_STR_EQ(m.loads[0].transfer_id, "T");
    ASSERT_STR_EQ(m.loads[0].mm_hash, "H");
    ASSERT_EQ(m.loads[0].nbytes, 64);
    ASSERT(!m.loads[0].local);
    kvp_ec_meta_cleanup(&m);
    worker(&f, "H", NULL, NULL, false);
    ASSERT_EQ(state(&f, "T"), KVP_EC_READY);
    ASSERT(ensure(&f, &o.req));
    fx_free(&f);
}

TEST(test_ec_s34_push_wait_timeout_unavailable_once)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", NULL);
    ASSERT(!ensure(&f, &o.req));
    ASSERT_EQ(state(&f, "T"), KVP_EC_WAITING_EVENT);
    f.clock.now_ms = 9999;
    ASSERT(!ensure(&f, &o.req));
    ASSERT_EQ(state(&f, "T"), KVP_EC_WAITING_EVENT);
    f.clock.now_ms = 10000;
    ASSERT(!ensure(&f, &o.req));
    ASSERT_EQ(state(&f, "T"), KVP_EC_UNAVAILABLE);
    kvp_ec_strlist_t l;
    ASSERT_OK(kvp_ec_sched_take_unavailable_requests(f.s, &l));
    ASSERT_EQ(l.n, 1);
    ASSERT_STR_EQ(l.v[0], "r1");
    kvp_ec_strlist_cleanup(&l);
    ASSERT(!ensure(&f, &o.req));
    ASSERT_OK(kvp_ec_sched_take_unavailable_requests(f.s, &l));
    ASSERT_EQ(l.n, 0);
    fx_free(&f);
}

TEST(test_ec_s35_two_shards_accept_when_all_reported)
{
    fx_t f;
    fx_init(&f, false, true, 2, 1 << 20);
    bool has;
    ready_event(&f, "T", "H", 5500);
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT(!has);
    ASSERT(!has_rec(&f, "T"));
    ASSERT_EQ(kvp__ec_sched_ready_size(f.s), 1);
    ready_event(&f, "T", "H", 5501);
    f.clock.now_ms += 5; /* the drain is rate-limited to one per 5 ms */
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT(has);
    ASSERT_EQ(state(&f, "T"), KVP_EC_AVAILABLE);
    ASSERT_EQ(kvp__ec_sched_ready_size(f.s), 0);
    ready_event(&f, "T", "H", 5500); /* duplicate after acceptance: ignored */
    f.clock.now_ms += 5;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT_EQ(kvp__ec_sched_ready_size(f.s), 0);
    ASSERT_EQ(state(&f, "T"), KVP_EC_AVAILABLE);
    fx_free(&f);
}

TEST(test_ec_s36_event_for_cancelled_id_ignored)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", NULL);
    kvp_ec_finished_t fin;
    ASSERT_OK(kvp_ec_sched_request_finished(f.s, &o.req, &fin));
    ASSERT(!fin.has_items);
    ASSERT_EQ(state(&f, "T"), KVP_EC_CANCELLED);
    ready_event(&f, "T", "H", 5500);
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT(!has);
    ASSERT_EQ(state(&f, "T"), KVP_EC_CANCELLED);
    fx_free(&f);
}

TEST(test_ec_s37_cancel_unknown_id_tombstone_and_remote_cancel)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", NULL);
    ASSERT_OK(kvp_ec_sched_update_state_after_free(f.s, &o.req, 0));
    ASSERT_EQ(state(&f, "T"), KVP_EC_CANCELLED);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    ASSERT_STR_EQ(f.exec.jobs[0].tid, "T");
    ASSERT_STR_EQ(f.exec.jobs[0].addr, "tcp://10.0.0.2:5500");
    /* run the job: discovery then one cancel per shard */
    kvp__ec_sdiscover_t *d = kvp__calloc(1, sizeof *d);
    d->n = 2;
    d->addrs = kvp__calloc(2, sizeof *d->addrs);
    d->addrs[0] = kvp__strdup("tcp://10.0.0.2:5500");
    d->addrs[1] = kvp__strdup("tcp://10.0.0.2:5501");
    kvp__ec_sreply_t *r = kvp__calloc(3, sizeof *r);
    r[0].kind = KVP__EC_REPLY_TIMEOUT;
    r[1].kind = KVP__EC_REPLY_OK;
    r[1].cancelled = true;
    r[2].kind = KVP__EC_REPLY_OK;
    kvp__ec_sctl_script(&f.ctl, d, 1, r, 3);
    kvp_ec_control_t ci = kvp__ec_sctl_iface(&f.ctl);
    bool cancelled;
    ASSERT_OK(kvp_ec_cancel_remote(&ci, "tcp://10.0.0.2:5500", "T", &cancelled));
    ASSERT(cancelled);
    ASSERT_EQ(f.ctl.n_calls, 4); /* discover, two cancels, the retry of the failed shard */
    ASSERT_STR_EQ(f.ctl.calls[3].addr, "tcp://10.0.0.2:5500");
    /* discovery failing twice: RuntimeError */
    kvp__ec_sctl_script(&f.ctl, NULL, 0, NULL, 0);
    ASSERT_EQ(kvp_ec_cancel_remote(&ci, "tcp://10.0.0.2:5500", "T", &cancelled), KVP_ERR_NOT_FOUND);
    ASSERT_EQ(f.ctl.n_calls, 2);
    fx_free(&f);
}

TEST(test_ec_s38_lease_expiry_cancels_then_removes)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    ready_event(&f, "T", "H", 5500);
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT_EQ(state(&f, "T"), KVP_EC_AVAILABLE);
    f.clock.now_ms = 300000;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT(!has);
    /* EXPIRED, and the queued remote cancel turned it into a CANCELLED tombstone */
    ASSERT_EQ(state(&f, "T"), KVP_EC_CANCELLED);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    f.clock.now_ms = 600000;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "H", &has));
    ASSERT(!has_rec(&f, "T"));
    fx_free(&f);
}

static void load_to_ready(fx_t *f, const char *rid, const char *tid, const char *hash)
{
    ready_event(f, tid, hash, 5500);
    oreq_t o;
    mkreq(&o, rid, hash, tid, NULL);
    f->clock.now_ms += 5;
    ASSERT(!ensure(f, &o.req));
    kvp_ec_meta_t m;
    build(f, NULL, &m);
    kvp_ec_meta_cleanup(&m);
    worker(f, (char *)hash, NULL, NULL, false);
    ASSERT_EQ(state(f, tid), KVP_EC_READY);
}

TEST(test_ec_s39_release_ready_resident_then_local_handoff)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    load_to_ready(&f, "r1", "T", "H");
    kvp_ec_meta_t m;
    build(&f, "H", &m);
    ASSERT_EQ(m.n_freed, 1);
    kvp_ec_meta_cleanup(&m);
    ASSERT_EQ(state(&f, "T"), KVP_EC_RESIDENT);
    ASSERT_EQ(kvp_ec_sched_resident_bytes(f.s), 64);
    oreq_t o;
    mkreq(&o, "r2", "H", "T2", NULL);
    ASSERT(!ensure(&f, &o.req));
    ASSERT_EQ(state(&f, "T"), KVP_EC_LOADING);
    build(&f, NULL, &m);
    ASSERT_EQ(m.n_loads, 1);
    ASSERT(m.loads[0].local);
    ASSERT_EQ(m.loads[0].num_token, 0);
    ASSERT_STR_EQ(m.loads[0].transfer_id, "T");
    kvp_ec_meta_cleanup(&m);
    fx_free(&f);
}

TEST(test_ec_s40_resident_capacity_evicts_oldest)
{
    fx_t f;
    fx_init(&f, false, true, 1, 100);
    load_to_ready(&f, "r1", "T1", "H1");
    load_to_ready(&f, "r2", "T2", "H2");
    kvp_ec_meta_t m;
    build(&f, "H1", &m);
    kvp_ec_meta_cleanup(&m);
    build(&f, "H2", &m);
    kvp_ec_meta_cleanup(&m);
    ASSERT_EQ(state(&f, "T2"), KVP_EC_RESIDENT);
    ASSERT_LE(kvp_ec_sched_resident_bytes(f.s), 100);
    /* T1 was evicted (EXPIRED) and drain_orphaned gave it a remote cancel */
    ASSERT_EQ(state(&f, "T1"), KVP_EC_CANCELLED);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    ASSERT_STR_EQ(f.exec.jobs[0].tid, "T1");
    fx_free(&f);
}

TEST(test_ec_s41_failed_load_is_dead_end)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    ready_event(&f, "T", "H", 5500);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", NULL);
    ASSERT(!ensure(&f, &o.req));
    worker(&f, NULL, "H", NULL, false);
    ASSERT_EQ(state(&f, "T"), KVP_EC_FAILED);
    kvp_ec_finished_t fin;
    ASSERT_OK(kvp_ec_sched_request_finished(f.s, &o.req, &fin));
    ASSERT_EQ(state(&f, "T"), KVP_EC_FAILED);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 0); /* nothing sent */
    fx_free(&f);
}

TEST(test_ec_s42_malformed_event_dropped_others_processed)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    event(&f, "{\"ready\":true,\"transfer_id\":\"A\",\"mm_hash\":\"HA\",\"shape\":[4,8],\"dtype\":\"bfloat16\"}");
    event(&f, "[\"not\",\"an\",\"object\"]");
    event(&f, "{\"ready\":true,\"transfer_id\":\"C\",\"mm_hash\":\"HC\",\"nbytes\":\"x\",\"shape\":[1],\"dtype\":\"f\"}");
    event(&f, "{\"ready\":true,\"transfer_id\":\"D\",\"mm_hash\":\"HD\",\"nbytes\":1,\"shape\":{\"a\":1},\"dtype\":\"f\"}");
    event(&f, "{\"ready\":0,\"transfer_id\":\"E\",\"mm_hash\":\"HE\",\"nbytes\":1,\"shape\":[1],\"dtype\":\"f\"}");
    event(&f, "7");
    ready_event(&f, "B", "HB", 5500);
    bool has;
    ASSERT_OK(kvp_ec_sched_has_cache_item(f.s, "HB", &has));
    ASSERT(has);
    ASSERT(!has_rec(&f, "A"));
    ASSERT(!has_rec(&f, "C"));
    ASSERT(!has_rec(&f, "D"));
    ASSERT(!has_rec(&f, "E"));
    fx_free(&f);
}

TEST(test_ec_s43_producer_fallback_id_and_push_dedup)
{
    fx_t f;
    fx_init(&f, true, false, 0, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H", NULL, "tcp://c:7000"); /* no ec_items */
    ASSERT(ensure(&f, &o.req));
    ASSERT_OK(kvp_ec_sched_update_state_after_alloc(f.s, &o.req, 0)); /* same tid again */
    kvp_ec_meta_t m;
    build(&f, NULL, &m);
    ASSERT_EQ(m.n_pushes, 1);
    ASSERT_STR_EQ(m.pushes[0].transfer_id, "r1:0");
    ASSERT_STR_EQ(m.pushes[0].consumer_zmq, "tcp://c:7000");
    ASSERT_STR_EQ(m.pushes[0].dtype, "bfloat16");
    ASSERT_EQ(m.pushes[0].nbytes, 16 * 8 * 2);
    ASSERT_EQ(m.pushes[0].shape[0], 16);
    ASSERT_EQ(m.pushes[0].shape[1], 8);
    kvp_ec_meta_cleanup(&m);
    oreq_t o2;
    mkreq(&o2, "r2", "H2", "T2", NULL); /* no consumer_zmq: no push */
    ASSERT(ensure(&f, &o2.req));
    build(&f, NULL, &m);
    ASSERT_EQ(m.n_pushes, 0);
    kvp_ec_meta_cleanup(&m);
    fx_free(&f);
}

TEST(test_ec_s44_transfer_id_resolution)
{
    kvp_ec_feature_t feats[2] = {{"H0", "image", 0, 4, 4}, {"H1", "image", 4, 4, 4}};
    kvp_ec_item_t items[2] = {{NULL, "t1"}, {"OTHER", "t2"}};
    kvp_ec_transfer_params_t p = {NULL, items, 2};
    kvp_ec_request_t r = {"r", feats, 2, &p};
    ASSERT_STR_EQ(kvp_ec_request_transfer_id(&r, 0), "t1"); /* by position, no mm_hash */
    ASSERT(kvp_ec_request_transfer_id(&r, 1) == NULL);      /* differs, and no search match */
    items[0] = (kvp_ec_item_t){"H1", "tA"};
    items[1] = (kvp_ec_item_t){"H0", "tB"};
    ASSERT_STR_EQ(kvp_ec_request_transfer_id(&r, 0), "tB"); /* found by searching mm_hash */
    ASSERT_STR_EQ(kvp_ec_request_transfer_id(&r, 1), "tA");
    items[1] = (kvp_ec_item_t){"H0", ""}; /* an empty transfer id is not a match */
    ASSERT(kvp_ec_request_transfer_id(&r, 0) == NULL);
    r.params = NULL;
    ASSERT(kvp_ec_request_transfer_id(&r, 0) == NULL);
}

TEST(test_ec_s45_request_finished_producer_items_consumer_cancels)
{
    fx_t f;
    fx_init(&f, true, false, 0, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", "tcp://c:7000");
    kvp_ec_finished_t fin;
    ASSERT_OK(kvp_ec_sched_request_finished(f.s, &o.req, &fin));
    ASSERT(fin.has_items);
    ASSERT(!fin.delay_free);
    ASSERT_EQ(fin.n_items, 1);
    ASSERT_STR_EQ(fin.items[0].identifier, "H");
    ASSERT_STR_EQ(fin.items[0].modality, "image");
    ASSERT_EQ(fin.items[0].length, 16);
    ASSERT_STR_EQ(fin.items[0].transfer_id, "T");
    kvp_ec_finished_cleanup(&fin);
    fx_free(&f);

    fx_init(&f, false, true, 1, 1 << 20);
    ASSERT_OK(kvp_ec_sched_request_finished(f.s, &o.req, &fin));
    ASSERT(!fin.has_items);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    fx_free(&f);
}

TEST(test_ec_s46_config_validation)
{
    kvp_ec_config_t c;
    char err[256], addr[128];
    kvp_ec_config_init(&c);
    c.is_producer = true;
    c.control_addr = "tcp://x:1";
    c.pool_size = 1024;
    c.hidden_dim = 8;
    ASSERT_OK(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err));
    c.tp_size = 2;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    ASSERT(strstr(err, "TP=2") != NULL);
    c.tp_size = 1;
    c.pp_size = 2;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    c.pp_size = 1;
    c.dp_size = 2;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    kvp_ec_config_init(&c);
    c.is_consumer = true;
    c.pool_size = 1024;
    c.ec_ip = "10.0.0.2";
    c.ec_port = 65535;
    c.tp_size = 2;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    c.ec_port = 5500;
    c.dp_size = 2;
    c.dp_index = 1;
    ASSERT_OK(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err));
    ASSERT_STR_EQ(addr, "tcp://10.0.0.2:5502"); /* ec_port + dp_index * tp_size */
    c.control_timeout_ms = 0;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    c.control_timeout_ms = 1;
    c.pool_size = 0;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    c.pool_size = 1;
    c.push_wait_timeout_s = -1;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
    c.push_wait_timeout_s = 0;
    c.ec_port = 0;
    ASSERT_EQ(kvp_ec_config_validate(&c, addr, sizeof addr, err, sizeof err), KVP_ERR_BAD_CONFIG);
}

TEST(test_ec_s47_pending_push_work_follows_worker_meta)
{
    fx_t f;
    fx_init(&f, true, true, 1, 1 << 20);
    ASSERT(!kvp_ec_sched_has_pending_push_work(f.s));
    worker(&f, NULL, NULL, NULL, true);
    ASSERT(kvp_ec_sched_has_pending_push_work(f.s));
    ASSERT(kvp_ec_sched_has_pending_push_work(f.s));
    ASSERT_OK(kvp_ec_sched_update_connector_output(f.s, NULL)); /* no worker meta: ignored */
    ASSERT(kvp_ec_sched_has_pending_push_work(f.s));
    worker(&f, NULL, NULL, NULL, false);
    ASSERT(!kvp_ec_sched_has_pending_push_work(f.s));
    fx_free(&f);
}

TEST(test_ec_bad_hooks_never_abort)
{
    fx_t f;
    fx_init(&f, true, true, 1, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H", "T", "tcp://c:7000");
    ASSERT_EQ(kvp_ec_sched_update_state_after_alloc(f.s, &o.req, 5), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_ec_sched_error(f.s), KVP_EC_ERR_INDEX);
    ASSERT_EQ(kvp_ec_sched_update_state_after_free(f.s, &o.req, 5), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_ec_sched_error(f.s), KVP_EC_ERR_INDEX);
    /* a wrong-hash event before anyone waited, then a wait: the request
     * fails (false, reported unavailable), no error (state.py) */
    ready_event(&f, "T", "WRONG", 5500);
    bool ok = true;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(f.s, &o.req, 0, &ok));
    ASSERT(!ok);
    ASSERT_EQ(kvp_ec_sched_error(f.s), KVP_EC_ERR_NONE);
    /* hooks after close that queue a cancel: RuntimeError, the record already CANCELLED */
    kvp_ec_sched_close(f.s);
    oreq_t o2;
    mkreq(&o2, "r2", "H2", "T2", NULL);
    ASSERT_EQ(kvp_ec_sched_update_state_after_free(f.s, &o2.req, 0), KVP_ERR_CLOSED);
    ASSERT_EQ(kvp_ec_sched_error(f.s), KVP_EC_ERR_RUNTIME);
    ASSERT_EQ(state(&f, "T2"), KVP_EC_CANCELLED);
    kvp_ec_sched_close(f.s); /* twice is fine */
    fx_free(&f);
}

/* ---- the six behaviours of the seed's table (state.py) -------------------
 * Each modelled on the smallest stream of ecsched-ref's README, "The real
 * table" (push_wait_timeout_s here is 10 s). */

static void take_unavailable(fx_t *f, const char *want)
{
    kvp_ec_strlist_t l;
    ASSERT_OK(kvp_ec_sched_take_unavailable_requests(f->s, &l));
    ASSERT_EQ(l.n, want ? 1 : 0);
    if (want)
        ASSERT_STR_EQ(l.v[0], want);
    kvp_ec_strlist_cleanup(&l);
}

static bool has_item(fx_t *f, const char *hash)
{
    bool has;
    f->clock.now_ms += 5; /* past the drain's rate limit */
    ASSERT_OK(kvp_ec_sched_has_cache_item(f->s, hash, &has));
    return has;
}

/* #1: a LOADING record the workers never reported times out at the deadline
 * begin_load gave it: UNAVAILABLE, its request reported, a cancel queued. */
TEST(test_table_expire_times_out_loading)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H1", "T1", NULL);
    ready_event(&f, "T1", "H1", 5500);
    f.clock.now_ms = 100;
    ASSERT(!ensure(&f, &o.req));
    ASSERT_EQ(state(&f, "T1"), KVP_EC_LOADING);
    ASSERT_EQ(kvp__ec_table_get(kvp__ec_sched_table(f.s), "T1")->deadline, 100 + 10000);
    f.clock.now_ms = 100 + 10000 - 6;
    ASSERT(!has_item(&f, "H1")); /* one ms before the deadline: still LOADING */
    ASSERT_EQ(state(&f, "T1"), KVP_EC_LOADING);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 0);
    take_unavailable(&f, NULL);
    ASSERT(!has_item(&f, "H1")); /* at the deadline */
    ASSERT_EQ(state(&f, "T1"), KVP_EC_CANCELLED); /* UNAVAILABLE, then the queued cancel */
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    ASSERT_STR_EQ(f.exec.jobs[0].tid, "T1");
    take_unavailable(&f, "r1");
    fx_free(&f);
}

static void mkreq2(oreq_t *o, const char *rid, const char *h0, const char *t0, const char *h1, const char *t1)
{
    memset(o, 0, sizeof *o);
    o->feat[0] = (kvp_ec_feature_t){h0, "image", 0, 16, 16};
    o->feat[1] = (kvp_ec_feature_t){h1, "image", 16, 16, 16};
    o->items[0] = (kvp_ec_item_t){h0, t0};
    o->items[1] = (kvp_ec_item_t){h1, t1};
    o->params.items = o->items;
    o->params.n_items = 2;
    o->req = (kvp_ec_request_t){rid, o->feat, 2, &o->params};
}

/* #2: expire walks the non-terminal records in insertion order: two leases
 * running out in one drain are cancelled T1 then T2, although T1 became
 * AVAILABLE last (and so is last in record order). */
TEST(test_table_expire_insertion_order)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq2(&o, "r1", "H1", "T1", "H2", "T2");
    ASSERT(!ensure(&f, &o.req)); /* T1 then T2 inserted, WAITING_EVENT */
    ready_event(&f, "T2", "H2", 5500);
    ready_event(&f, "T1", "H1", 5500);
    ASSERT(has_item(&f, "H1"));
    ASSERT_EQ(state(&f, "T1"), KVP_EC_AVAILABLE);
    ASSERT_EQ(state(&f, "T2"), KVP_EC_AVAILABLE);
    kvp__ec_table_t *t = kvp__ec_sched_table(f.s);
    ASSERT_STR_EQ(KVP_LIST_FIRST_ENTRY(&t->order, kvp__ec_rec_t, order)->tid, "T2");
    f.clock.now_ms += 300000;
    ASSERT(!has_item(&f, "H1"));
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 2);
    ASSERT_STR_EQ(f.exec.jobs[0].tid, "T1");
    ASSERT_STR_EQ(f.exec.jobs[1].tid, "T2");
    ASSERT_EQ(state(&f, "T1"), KVP_EC_CANCELLED);
    ASSERT_EQ(state(&f, "T2"), KVP_EC_CANCELLED);
    fx_free(&f);
}

/* #3: a ready event whose mm_hash is not the record's keeps the record (and
 * its hash) and fails the record's request instead of being dropped as an
 * error. */
TEST(test_ready_other_hash_reports_unavailable)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq(&o, "r1", "H1", "T1", NULL);
    ASSERT(!ensure(&f, &o.req));
    ready_event(&f, "T1", "H9", 5500);
    ASSERT(!has_item(&f, "H1"));
    ASSERT(!has_item(&f, "H9"));
    kvp__ec_rec_t *r = kvp__ec_table_get(kvp__ec_sched_table(f.s), "T1");
    ASSERT_EQ(r->state, KVP_EC_WAITING_EVENT);
    ASSERT_STR_EQ(r->hash, "H1");
    ASSERT(r->spec == NULL);
    ASSERT_EQ(kvp_ec_sched_error(f.s), KVP_EC_ERR_NONE);
    take_unavailable(&f, "r1");
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 0);
    fx_free(&f);
}

/* #4: a wait for an id that already names another mm_hash answers false and
 * fails the request; no ValueError, and the record is untouched. */
TEST(test_wait_other_hash_returns_false)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    ready_event(&f, "T1", "H9", 5500);
    oreq_t o;
    mkreq(&o, "r1", "H1", "T1", NULL);
    bool ok = true;
    ASSERT_OK(kvp_ec_sched_ensure_cache_available(f.s, &o.req, 0, &ok));
    ASSERT(!ok);
    ASSERT_EQ(kvp_ec_sched_error(f.s), KVP_EC_ERR_NONE);
    kvp__ec_rec_t *r = kvp__ec_table_get(kvp__ec_sched_table(f.s), "T1");
    ASSERT_EQ(r->state, KVP_EC_AVAILABLE);
    ASSERT_STR_EQ(r->hash, "H9");
    ASSERT_STR_EQ(r->req, "");
    take_unavailable(&f, "r1");
    fx_free(&f);
}

/* #5: cancel(tid, H) of a record whose hash is another one does nothing: a
 * request whose two features resolve (by position) to one id cancels it
 * only through the feature of the record's own hash. */
TEST(test_cancel_other_hash_noop)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    oreq_t o;
    mkreq2(&o, "r1", "H1", "T1", "H2", "T1");
    o.items[0].mm_hash = o.items[1].mm_hash = NULL; /* matched by position */
    ready_event(&f, "T1", "H1", 5500);
    ASSERT(has_item(&f, "H1"));
    ASSERT_EQ(state(&f, "T1"), KVP_EC_AVAILABLE);
    ASSERT_OK(kvp_ec_sched_update_state_after_free(f.s, &o.req, 1));
    ASSERT_EQ(state(&f, "T1"), KVP_EC_AVAILABLE);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 0);
    ASSERT_OK(kvp_ec_sched_update_state_after_free(f.s, &o.req, 0));
    ASSERT_EQ(state(&f, "T1"), KVP_EC_CANCELLED);
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    fx_free(&f);
}

/* #6: drain_orphaned hands back every id retired out of READY/RESIDENT, also
 * one the terminal cap removed since: it comes back as a new hash-less
 * CANCELLED tombstone, with a remote cancel. */
TEST(test_drain_orphaned_unfiltered)
{
    fx_t f;
    fx_init(&f, false, true, 1, 1 << 20);
    f.s->max_terminal = 0;
    load_to_ready(&f, "r1", "T1", "H1");
    kvp_ec_meta_t m;
    build(&f, "H1", &m);
    kvp_ec_meta_cleanup(&m);
    ASSERT_EQ(state(&f, "T1"), KVP_EC_RESIDENT);
    worker(&f, NULL, NULL, "H1", false);
    ASSERT_EQ(state(&f, "T1"), KVP_EC_EXPIRED);
    ASSERT(!has_item(&f, "H1"));
    ASSERT(!has_rec(&f, "T1")); /* the cap (0) removed it */
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 0);
    build(&f, NULL, &m);
    kvp_ec_meta_cleanup(&m);
    kvp__ec_rec_t *r = kvp__ec_table_get(kvp__ec_sched_table(f.s), "T1");
    ASSERT(r != NULL);
    ASSERT_EQ(r->state, KVP_EC_CANCELLED);
    ASSERT_STR_EQ(r->hash, "");
    ASSERT_EQ(kvp__ec_sexec_count(&f.exec), 1);
    ASSERT_STR_EQ(f.exec.jobs[0].tid, "T1");
    fx_free(&f);
}

TEST(test_ec_worker_meta_that_does_not_decode)
{
    const uint8_t junk[] = {0x93, 0x01, 0x02, 0xff};
    kvp_ec_worker_meta_t w;
    ASSERT_EQ(kvp_ec_worker_meta_decode(junk, sizeof junk, &w), KVP_ERR_DECODE);
    ASSERT_EQ(w.n_loaded, 0);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* Randomized: a cancelled id is never revived by a late event, every record
 * is in one state, and resident bytes stay within capacity after builds. */
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

TEST(test_ec_sched_randomized_no_revival)
{
    fx_t f;
    fx_init(&f, false, true, 2, 300);
    kvp__ec_table_t *t = kvp__ec_sched_table(f.s);
    char tid[16], hash[16], rid[16];
    for (int step = 0; step < 20000; step++) {
        f.clock.now_ms += (int64_t)(rnd() % 2000);
        int k = (int)(rnd() % 40);
        snprintf(tid, sizeof tid, "t%d", k);
        snprintf(hash, sizeof hash, "H%d", k % 10);
        snprintf(rid, sizeof rid, "r%d", k);
        oreq_t o;
        mkreq(&o, rid, hash, tid, NULL);
        kvp__ec_rec_t *before = kvp__ec_table_get(t, tid);
        bool was_cancelled = before && before->state == KVP_EC_CANCELLED;
        uint64_t before_seq = before ? before->seq : 0; /* a CANCELLED record never moves */
        int64_t before_deadline = before ? before->deadline : 0;
        bool b;
        kvp_ec_meta_t m;
        switch (rnd() % 7) {
        case 0: ready_event(&f, tid, hash, 5500 + (int)(rnd() % 2)); break;
        case 1: (void)kvp_ec_sched_ensure_cache_available(f.s, &o.req, 0, &b); break;
        case 2: (void)kvp_ec_sched_has_cache_item(f.s, hash, &b); break;
        case 3: ASSERT_OK(kvp_ec_sched_update_state_after_free(f.s, &o.req, 0)); break;
        case 4:
            build(&f, (rnd() & 1) ? hash : NULL, &m);
            kvp_ec_meta_cleanup(&m);
            ASSERT_LE(kvp_ec_sched_resident_bytes(f.s), 300);
            break;
        case 5: worker(&f, (rnd() & 1) ? hash : NULL, (rnd() % 8) ? NULL : hash, (rnd() % 8) ? NULL : hash, false); break;
        default: {
            kvp_ec_strlist_t l;
            ASSERT_OK(kvp_ec_sched_take_unavailable_requests(f.s, &l));
            kvp_ec_strlist_cleanup(&l);
        }
        }
        kvp__ec_rec_t *after = kvp__ec_table_get(t, tid);
        if (was_cancelled && after && after->seq == before_seq)
            ASSERT_EQ(after->state, KVP_EC_CANCELLED);
        /* while its tombstone lives (and the cap is far), the cancelled record stays, unrevived */
        if (was_cancelled && f.clock.now_ms < before_deadline) {
            ASSERT(after != NULL);
            ASSERT_EQ(after->seq, before_seq);
            ASSERT_EQ(after->state, KVP_EC_CANCELLED);
        }
        size_t n = 0;
        KVP_LIST_FOR_EACH_ENTRY(r, &t->order, kvp__ec_rec_t, order)
            n++;
        ASSERT_EQ(n, t->records.n);
    }
    fx_free(&f);
}

TEST_LIST(T(test_ec_s33_single_shard_event_then_load), T(test_ec_s34_push_wait_timeout_unavailable_once),
          T(test_ec_s35_two_shards_accept_when_all_reported), T(test_ec_s36_event_for_cancelled_id_ignored),
          T(test_ec_s37_cancel_unknown_id_tombstone_and_remote_cancel), T(test_ec_s38_lease_expiry_cancels_then_removes),
          T(test_ec_s39_release_ready_resident_then_local_handoff), T(test_ec_s40_resident_capacity_evicts_oldest),
          T(test_ec_s41_failed_load_is_dead_end), T(test_ec_s42_malformed_event_dropped_others_processed),
          T(test_ec_s43_producer_fallback_id_and_push_dedup), T(test_ec_s44_transfer_id_resolution),
          T(test_ec_s45_request_finished_producer_items_consumer_cancels), T(test_ec_s46_config_validation),
          T(test_ec_s47_pending_push_work_follows_worker_meta), T(test_ec_bad_hooks_never_abort),
          T(test_table_expire_times_out_loading), T(test_table_expire_insertion_order),
          T(test_ready_other_hash_reports_unavailable), T(test_wait_other_hash_returns_false),
          T(test_cancel_other_hash_noop), T(test_drain_orphaned_unfiltered),
          T(test_ec_worker_meta_that_does_not_decode), T(test_ec_sched_randomized_no_revival))
