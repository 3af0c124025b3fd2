/*
 * The structs callers fill carry a leading size (src/common/sized.h): the
 * library reads only the caller's `size` bytes and takes the defaults past
 * them (a caller built against an older header), refuses a size that does not
 * even cover `size` (KVP_ERR_INVALID_ARG) or one from a newer header
 * (KVP_ERR_VERSION), and kvp_*_config_init never writes past the size.
 *
 * An "older caller" is simulated: a struct whose bytes past an earlier
 * field's offset are garbage (0xA5) that would be refused if read.
 */
#include <stddef.h>
#include <string.h>

#include "kvpool/ec_connector.h"
#include "kvpool/kv_connector.h"
#include "support/ec_scripted.h"
#include "support/kv_scripted.h"
#include "test.h"

#define GARBAGE 0xA5

static int all_garbage(const void *p, size_t from, size_t to)
{
    const unsigned char *b = p;
    for (size_t i = from; i < to; i++)
        if (b[i] != GARBAGE)
            return 0;
    return 1;
}

/* ---- kvp_kv_config_t ---- */

TEST(test_size_kv_config_old_caller_gets_defaults)
{
    /* an older header whose struct ended before tp_size */
    const size_t old = offsetof(kvp_kv_config_t, tp_size);
    kvp_kv_config_t c;
    memset(&c, GARBAGE, sizeof c);
    kvp_kv_config_init_size(&c, old);
    ASSERT_EQ(c.size, old);
    ASSERT(all_garbage(&c, old, sizeof c)); /* init stayed inside the caller's struct */
    ASSERT_EQ(c.block_size, 16);
    /* the garbage tp_size..fix_k12 (tp_size = 0xA5A5A5A5 < 0) is not read */
    ASSERT_OK(kvp_kv_config_validate(&c));
    kvp_kv_scripted_t *sc;
    ASSERT_OK(kvp_kv_scripted_create(&sc));
    kvp_kv_sched_t *s;
    ASSERT_OK(kvp_kv_sched_create(&c, kvp_kv_scripted_client(sc), &s));
    kvp_kv_sched_destroy(s);
    kvp_kv_scripted_destroy(sc);
    /* the control: the same bytes as a current caller's are read, and refused */
    c.size = sizeof c;
    ASSERT_EQ(kvp_kv_config_validate(&c), KVP_ERR_BAD_CONFIG);
}

TEST(test_size_kv_config_bad_size_refused)
{
    kvp_kv_config_t c;
    kvp_kv_config_init(&c);
    ASSERT_EQ(c.size, sizeof c);
    ASSERT_OK(kvp_kv_config_validate(&c));
    kvp_kv_scripted_t *sc;
    ASSERT_OK(kvp_kv_scripted_create(&sc));
    kvp_kv_sched_t *s = (kvp_kv_sched_t *)&c;
    c.size = 0;
    ASSERT_EQ(kvp_kv_config_validate(&c), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_kv_sched_create(&c, kvp_kv_scripted_client(sc), &s), KVP_ERR_INVALID_ARG);
    ASSERT(s == NULL);
    c.size = 3;
    ASSERT_EQ(kvp_kv_config_validate(&c), KVP_ERR_INVALID_ARG);
    c.size = sizeof c + 8; /* a newer header */
    ASSERT_EQ(kvp_kv_config_validate(&c), KVP_ERR_VERSION);
    ASSERT_EQ(kvp_kv_sched_create(&c, kvp_kv_scripted_client(sc), &s), KVP_ERR_VERSION);
    kvp_kv_scripted_destroy(sc);
    /* a newer caller's init: its size is kept, so the config is refused */
    struct {
        kvp_kv_config_t c;
        unsigned char appended[16];
    } newer;
    memset(&newer, GARBAGE, sizeof newer);
    kvp_kv_config_init_size(&newer.c, sizeof newer);
    ASSERT_EQ(newer.c.size, sizeof newer);
    ASSERT(all_garbage(newer.appended, 0, sizeof newer.appended));
    ASSERT_EQ(kvp_kv_config_validate(&newer.c), KVP_ERR_VERSION);
}

/* ---- kvp_kv_block_params_t ---- */

TEST(test_size_kv_block_params_old_caller_gets_defaults)
{
    kvp_kv_block_params_t p;
    memset(&p, GARBAGE, sizeof p);
    p.size = (uint32_t)offsetof(kvp_kv_block_params_t, dcp_size); /* knows sizes, not dcp/pcp/flags */
    p.cache_block_size = 16;
    p.hash_block_size = 0;
    kvp_kv_block_sizes_t out;
    /* defaults dcp = pcp = 1; the garbage (negative) sizes would be refused */
    ASSERT_OK(kvp_kv_resolve_block_sizes(NULL, 0, &p, &out));
    ASSERT_EQ(out.block_size, 16);
    p.size = sizeof p;
    ASSERT_EQ(kvp_kv_resolve_block_sizes(NULL, 0, &p, &out), KVP_ERR_BAD_CONFIG);
    p.size = 0;
    ASSERT_EQ(kvp_kv_resolve_block_sizes(NULL, 0, &p, &out), KVP_ERR_INVALID_ARG);
    p.size = sizeof p + 1;
    ASSERT_EQ(kvp_kv_resolve_block_sizes(NULL, 0, &p, &out), KVP_ERR_VERSION);
}

/* ---- kvp_ec_config_t and kvp_ec_sched_params_t ---- */

typedef struct {
    kvp__ec_sclock_t clock;
    kvp__ec_sexec_t exec;
    kvp__ec_sctl_t ctl;
    kvp__ec_sinbox_t inbox;
} collab_t;

static void collab_init(collab_t *k, kvp_ec_sched_params_t *p, const kvp_ec_config_t *cfg)
{
    memset(k, 0, sizeof *k);
    kvp__ec_sexec_init(&k->exec);
    kvp__ec_sctl_init(&k->ctl);
    kvp__ec_sinbox_init(&k->inbox, 1);
    kvp_ec_sched_params_init(p);
    p->config = cfg;
    p->clock = kvp__ec_sclock_iface(&k->clock);
    p->control = kvp__ec_sctl_iface(&k->ctl);
    p->executor = kvp__ec_sexec_iface(&k->exec);
    p->inbox = kvp__ec_sinbox_iface(&k->inbox);
}

static void collab_cleanup(collab_t *k)
{
    kvp__ec_sexec_cleanup(&k->exec);
    kvp__ec_sctl_cleanup(&k->ctl);
    kvp__ec_sinbox_cleanup(&k->inbox);
}

static void ec_consumer(kvp_ec_config_t *c, size_t size)
{
    kvp_ec_config_init_size(c, size);
    c->is_consumer = true;
    c->control_addr = "tcp://10.0.0.2:5500";
    c->pool_size = 1 << 20;
}

TEST(test_size_ec_config_old_caller_gets_defaults)
{
    const size_t old = offsetof(kvp_ec_config_t, dtype); /* an older header: no dtype, no caps */
    kvp_ec_config_t c;
    memset(&c, GARBAGE, sizeof c);
    ec_consumer(&c, old);
    ASSERT_EQ(c.size, old);
    ASSERT(all_garbage(&c, old, sizeof c));
    char err[256];
    ASSERT_OK(kvp_ec_config_validate(&c, NULL, 0, err, sizeof err)); /* dtype: the default */
    kvp_ec_sched_params_t p;
    collab_t k;
    collab_init(&k, &p, &c);
    kvp_ec_sched_t *s;
    ASSERT_OK(kvp_ec_sched_create(&p, &s));
    kvp_ec_sched_destroy(s);
    collab_cleanup(&k);
    c.size = sizeof c; /* the control: the garbage dtype, read, is refused */
    ASSERT_EQ(kvp_ec_config_validate(&c, NULL, 0, err, sizeof err), KVP_ERR_BAD_CONFIG);
    ASSERT(strstr(err, "dtype") != NULL);
}

TEST(test_size_ec_bad_sizes_refused)
{
    kvp_ec_config_t c;
    ec_consumer(&c, sizeof c);
    ASSERT_EQ(c.size, sizeof c);
    kvp_ec_sched_params_t p;
    collab_t k;
    collab_init(&k, &p, &c);
    ASSERT_EQ(p.size, sizeof p);
    kvp_ec_sched_t *s;
    ASSERT_OK(kvp_ec_sched_create(&p, &s));
    kvp_ec_sched_destroy(s);
    char err[256];
    c.size = 0;
    ASSERT_EQ(kvp_ec_config_validate(&c, NULL, 0, err, sizeof err), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp_ec_sched_create(&p, &s), KVP_ERR_INVALID_ARG);
    c.size = sizeof c + 8;
    ASSERT_EQ(kvp_ec_config_validate(&c, NULL, 0, err, sizeof err), KVP_ERR_VERSION);
    ASSERT_EQ(kvp_ec_sched_create(&p, &s), KVP_ERR_VERSION);
    c.size = sizeof c;
    p.size = 0;
    ASSERT_EQ(kvp_ec_sched_create(&p, &s), KVP_ERR_INVALID_ARG);
    p.size = sizeof p + 8;
    ASSERT_EQ(kvp_ec_sched_create(&p, &s), KVP_ERR_VERSION);
    /* an older params struct without the inbox: the inbox the caller's
     * memory holds past its size is not read, so the required inbox is missing */
    p.size = (uint32_t)offsetof(kvp_ec_sched_params_t, inbox);
    ASSERT_EQ(kvp_ec_sched_create(&p, &s), KVP_ERR_INVALID_ARG);
    p.size = sizeof p;
    p.config = NULL;
    ASSERT_EQ(kvp_ec_sched_create(&p, &s), KVP_ERR_INVALID_ARG);
    collab_cleanup(&k);
}

/* The lookup service's and the worker's params follow the same rule: a
 * size that does not cover `size` is INVALID_ARG, a newer header's size
 * VERSION, before anything else is looked at; an older caller's size
 * (up to a field) takes the defaults past it. */
TEST(test_size_kv_service_params_refused_and_defaulted)
{
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_t *srv = NULL;
    kvp_kv_lookup_server_params_init(&sp);
    ASSERT_EQ(sp.size, sizeof sp);
    sp.size = 0;
    ASSERT_EQ(kvp_kv_lookup_server_start(&sp, &srv), KVP_ERR_INVALID_ARG);
    sp.size = sizeof sp + 8;
    ASSERT_EQ(kvp_kv_lookup_server_start(&sp, &srv), KVP_ERR_VERSION);
    ASSERT(srv == NULL);

    kvp_kv_lookup_zmq_params_t zp;
    kvp_kv_lookup_zmq_t *zc = NULL;
    kvp_kv_lookup_zmq_params_init(&zp);
    zp.endpoint = "ipc:///nonexistent/kvp-abi-sizes";
    zp.size = 3;
    ASSERT_EQ(kvp_kv_lookup_zmq_create(&zp, &zc), KVP_ERR_INVALID_ARG);
    zp.size = sizeof zp + 8;
    ASSERT_EQ(kvp_kv_lookup_zmq_create(&zp, &zc), KVP_ERR_VERSION);
    /* A caller that knows only endpoint: timeout and max_inflight take
     * their defaults (0 would be refused). */
    zp.timeout_ms = 0, zp.max_inflight = 0;
    zp.size = (uint32_t)offsetof(kvp_kv_lookup_zmq_params_t, timeout_ms);
    ASSERT_OK(kvp_kv_lookup_zmq_create(&zp, &zc));
    kvp_kv_lookup_zmq_stats_t st;
    kvp_kv_lookup_zmq_stats(zc, &st);
    ASSERT_EQ(st.lookups, 0);
    kvp_kv_lookup_zmq_destroy(zc);

    kvp_kv_worker_params_t wp;
    kvp_kv_worker_t *w = NULL;
    kvp_kv_worker_params_init(&wp);
    wp.size = 0;
    ASSERT_EQ(kvp_kv_worker_create(&wp, &w), KVP_ERR_INVALID_ARG);
    wp.size = sizeof wp + 8;
    ASSERT_EQ(kvp_kv_worker_create(&wp, &w), KVP_ERR_VERSION);
    ASSERT(w == NULL);
}

TEST_LIST(T(test_size_kv_config_old_caller_gets_defaults), T(test_size_kv_config_bad_size_refused),
          T(test_size_kv_service_params_refused_and_defaulted),
          T(test_size_kv_block_params_old_caller_gets_defaults), T(test_size_ec_config_old_caller_gets_defaults),
          T(test_size_ec_bad_sizes_refused))
