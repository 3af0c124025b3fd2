/* The consumer's reservations (connectors-spec §3.6, the seed's
 * reservation.py and memory.py): one test per row of the §3.6 table, the
 * followers, tombstones, the allocator, the resident set, kvpool's per-peer
 * caps, the data plane's bounds check, shutdown, and a randomized model test.
 * A fake clock steps leases: no test sleeps. */
#include "test.h"

#include <pthread.h>

#include "common/alloc.h"
#include "common/mix.h"
#include "ec/ec_resv.h"
#include "ec/ec_resv_int.h"
#include "ec/ec_slab.h"

#define LEASE 1000

typedef struct fx {
    kvp__ec_resv_t *r;
    uint8_t *slab;
    uint64_t size;
    int64_t now;
    char err[256];
} fx_t;

static int64_t fake_clock(void *ctx) { return ((fx_t *)ctx)->now; }

static void fx_init_caps(fx_t *f, uint64_t size, size_t max_tombs, size_t peer_n, uint64_t peer_b)
{
    memset(f, 0, sizeof *f);
    f->size = size;
    f->slab = calloc(1, size);
    f->now = 1000;
    kvp__ec_resv_params_t p = {
        .slab = f->slab,
        .slab_size = size,
        .lease_ms = LEASE,
        .max_tombstones = max_tombs,
        .peer_max_reservations = peer_n,
        .peer_max_bytes = peer_b,
        .now_ms = fake_clock,
        .clock_ctx = f,
    };
    ASSERT_OK(kvp__ec_resv_create(&p, &f->r));
}

static void fx_init(fx_t *f, uint64_t size) { fx_init_caps(f, size, 64, 0, 0); }

/* set while allocations are made to fail: the self-check may itself run
 * out of memory then (and says so) */
static bool g_oom;

static void check(fx_t *f)
{
    char err[256];
    kvp_status_t s = kvp__ec_resv_validate(f->r, err, sizeof err);
    if (g_oom && s == KVP_ERR_NO_MEMORY)
        return;
    ASSERT_MSG(s == KVP_OK, "validate: %d %s", s, err);
}

static void fx_done(fx_t *f)
{
    check(f);
    kvp__ec_resv_destroy(f->r);
    free(f->slab);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

static kvp__ec_tensor_t tensor(uint64_t nbytes)
{
    kvp__ec_tensor_t t = {0};
    t.nbytes = nbytes;
    t.ndim = 2;
    t.shape[0] = (int64_t)(nbytes / 4);
    t.shape[1] = 1;
    t.dtype = KVP_EC_DTYPE_FLOAT32;
    return t;
}

static kvp_status_t reserve(fx_t *f, const char *tid, const char *hash, uint64_t nbytes, uint64_t peer,
                            kvp__ec_reserve_out_t *o)
{
    kvp__ec_reserve_in_t in = {.transfer_id = tid, .mm_hash = hash, .t = tensor(nbytes), .peer = peer};
    kvp_status_t s = kvp__ec_resv_reserve(f->r, &in, o, f->err, sizeof f->err);
    check(f);
    return s;
}

static kvp__ec_reserve_out_t reserve_ok(fx_t *f, const char *tid, const char *hash, uint64_t nbytes)
{
    kvp__ec_reserve_out_t o;
    kvp_status_t s = reserve(f, tid, hash, nbytes, 0, &o);
    ASSERT_MSG(s == KVP_OK, "reserve %s: %d %s", tid, s, f->err);
    return o;
}

static void complete(fx_t *f, const char *tid, const char *rid, bool want_acc, bool want_ready)
{
    bool acc = !want_acc, ready = !want_ready;
    kvp__ec_resv_complete(f->r, tid, rid, &acc, &ready);
    ASSERT_EQ(acc, want_acc);
    ASSERT_EQ(ready, want_ready);
    check(f);
}

static bool cancel(fx_t *f, const char *tid, const char *rid, bool abandon, bool refresh, bool *deferred_p)
{
    bool c = false, d = false;
    ASSERT_OK(kvp__ec_resv_cancel(f->r, tid, rid, abandon, refresh, &c, &d));
    if (deferred_p)
        *deferred_p = d;
    check(f);
    return c;
}

/* The record's state, or -1 when there is none (white box: ec_resv_int.h). */
static int st_of(fx_t *f, const char *tid)
{
    kvp__ec_rrec_t *rec = kvp__strmap_gets(&f->r->recs, tid);
    return rec ? (int)rec->state : -1;
}

static kvp__ec_resv_stats_t stats(fx_t *f)
{
    kvp__ec_resv_stats_t st;
    kvp__ec_resv_stats(f->r, &st);
    ASSERT_EQ(st.slab_free_bytes + st.bytes_reserved + st.resident_bytes + st.fill_bytes, f->size);
    return st;
}

static size_t expire(fx_t *f)
{
    size_t n = kvp__ec_resv_expire(f->r);
    check(f);
    return n;
}

static uint8_t pat(unsigned h, uint64_t i) { return (uint8_t)(h * 131u + i * 7u + (i >> 8)); }
static void fill(uint8_t *p, unsigned h, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        p[i] = pat(h, i);
}
static bool has_pat(const uint8_t *p, unsigned h, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (p[i] != pat(h, i))
            return false;
    return true;
}

/* Takes tid (READY, hash), expecting success; returns the view. */
static kvp__ec_view_t take_ok(fx_t *f, const char *tid, const char *hash)
{
    kvp__ec_view_t v;
    kvp_status_t s = kvp__ec_resv_take(f->r, tid, hash, &v, f->err, sizeof f->err);
    ASSERT_MSG(s == KVP_OK, "take %s: %d %s", tid, s, f->err);
    check(f);
    return v;
}

static void put_res(fx_t *f, const char *hash, uint64_t nbytes, unsigned h)
{
    uint8_t *b = malloc(nbytes ? nbytes : 1);
    fill(b, h, nbytes);
    kvp__ec_tensor_t t = tensor(nbytes);
    ASSERT_OK(kvp__ec_resv_put_resident(f->r, hash, &t, b));
    free(b);
    check(f);
}

static void drain_reclaimed(fx_t *f, const char *const *want, size_t n_want)
{
    char **v;
    size_t n;
    ASSERT_OK(kvp__ec_resv_drain_reclaimed(f->r, &v, &n));
    ASSERT_EQ(n, n_want);
    for (size_t i = 0; i < n; i++)
        ASSERT_STR_EQ(v[i], want[i]);
    kvp__ec_strv_free(v, n);
}

/* ---- create ----------------------------------------------------------------- */

TEST(test_ec_resv_create_rejects_bad_params)
{
    uint8_t slab[256];
    kvp__ec_resv_t *r = NULL;
    kvp__ec_resv_params_t p = {.slab = slab, .slab_size = sizeof slab, .lease_ms = 1};
    kvp__ec_resv_params_t bad = p;
    bad.slab = NULL;
    ASSERT_EQ(kvp__ec_resv_create(&bad, &r), KVP_ERR_INVALID_ARG);
    bad = p;
    bad.slab_size = 0;
    ASSERT_EQ(kvp__ec_resv_create(&bad, &r), KVP_ERR_INVALID_ARG);
    bad = p;
    bad.lease_ms = 0;
    ASSERT_EQ(kvp__ec_resv_create(&bad, &r), KVP_ERR_INVALID_ARG);
    ASSERT_OK(kvp__ec_resv_create(&p, &r)); /* real clock */
    kvp__ec_resv_destroy(r);
    kvp__ec_resv_destroy(NULL);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_resv_reservation_ids_are_32_lowercase_hex_and_distinct)
{
    fx_t f;
    fx_init(&f, 1 << 16);
    char seen[20][KVP__EC_RID_LEN + 1];
    for (int i = 0; i < 20; i++) {
        char tid[16], hash[16];
        snprintf(tid, sizeof tid, "t%d", i);
        snprintf(hash, sizeof hash, "h%d", i);
        kvp__ec_reserve_out_t o = reserve_ok(&f, tid, hash, 64);
        ASSERT_EQ(strlen(o.reservation_id), KVP__EC_RID_LEN);
        for (int k = 0; k < KVP__EC_RID_LEN; k++)
            ASSERT((o.reservation_id[k] >= '0' && o.reservation_id[k] <= '9') ||
                   (o.reservation_id[k] >= 'a' && o.reservation_id[k] <= 'f'));
        for (int j = 0; j < i; j++)
            ASSERT(strcmp(seen[j], o.reservation_id) != 0);
        memcpy(seen[i], o.reservation_id, sizeof seen[i]);
    }
    fx_done(&f);
}

TEST(test_ec_resv_reserve_rejects_bad_input)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "", "H", 64, 0, &o), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(reserve(&f, "t1", "", 64, 0, &o), KVP_ERR_INVALID_ARG);
    char long_hash[300];
    memset(long_hash, 'a', sizeof long_hash - 1);
    long_hash[sizeof long_hash - 1] = '\0';
    ASSERT_EQ(reserve(&f, "t1", long_hash, 64, 0, &o), KVP_ERR_INVALID_ARG);
    kvp__ec_reserve_in_t in = {.transfer_id = "t1", .mm_hash = "H", .t = tensor(64)};
    in.t.ndim = KVP__EC_MAX_NDIM + 1;
    ASSERT_EQ(kvp__ec_resv_reserve(f.r, &in, &o, NULL, 0), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(stats(&f).records, 0);
    fx_done(&f);
}

/* ---- reserve (§3.6 row by row) ------------------------------------------------ */

TEST(test_ec_resv_s37_cancel_unknown_then_reserve_cancelled)
{
    fx_t f;
    fx_init(&f, 4096);
    bool d = true;
    ASSERT(cancel(&f, "t1", "", false, false, &d));
    ASSERT(!d);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(stats(&f).tombstones, 1);
    kvp__ec_reserve_out_t o = reserve_ok(&f, "t1", "H", 64);
    ASSERT(o.cancelled);
    ASSERT(!o.write && !o.ready && !o.cached);
    ASSERT_STR_EQ(o.reservation_id, "");
    ASSERT_EQ(o.offset, 0);
    ASSERT_EQ(o.nbytes, 64); /* the request's */
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.slab_free_bytes, 4096);
    ASSERT_EQ(st.active, 0);
    /* a status of a tombstone is the reply's null */
    kvp__ec_status_t ss;
    ASSERT_EQ(kvp__ec_resv_status(f.r, "t1", &ss), KVP_ERR_NOT_FOUND);
    fx_done(&f);
}

TEST(test_ec_resv_reserve_expired_removed_and_fresh)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    complete(&f, "t1", a.reservation_id, true, true);
    f.now += LEASE;
    ASSERT_EQ(expire(&f), 1);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRED);
    ASSERT_EQ(stats(&f).bytes_reserved, 0);
    kvp__ec_reserve_out_t b = reserve_ok(&f, "t1", "OTHER", 128); /* a fresh record: no conflict */
    ASSERT(b.write && !b.ready && !b.cancelled);
    ASSERT(strcmp(a.reservation_id, b.reservation_id) != 0);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_WRITING);
    ASSERT_EQ(stats(&f).tombstones, 0);
    fx_done(&f);
}

TEST(test_ec_resv_reserve_expire_pending_still_has_writer)
{
    fx_t f;
    fx_init(&f, 4096);
    reserve_ok(&f, "t1", "H", 64);
    reserve_ok(&f, "it's", "H2", 64);
    f.now += LEASE;
    ASSERT_EQ(expire(&f), 0); /* WRITING does not count */
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRE_PENDING);
    ASSERT_EQ(stats(&f).bytes_reserved, 2 * 256); /* memory kept */
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "t1", "H", 64, 0, &o), KVP_ERR_STATE);
    ASSERT_STR_EQ(f.err, "Transfer 't1' still has an active writer");
    ASSERT_EQ(reserve(&f, "it's", "H2", 64, 0, &o), KVP_ERR_STATE);
    ASSERT_STR_EQ(f.err, "Transfer \"it's\" still has an active writer"); /* Python's repr */
    /* parked for one more lease; then its writer is taken for dead (kvpool:
     * the seed parks for ever, so a killed producer would leak the memory) */
    f.now += LEASE - 1;
    expire(&f);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRE_PENDING);
    f.now += 1;
    expire(&f);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRED);
    ASSERT_EQ(stats(&f).writers_abandoned, 2); /* t1 and it's */
    ASSERT_EQ(stats(&f).bytes_reserved, 0);
    fx_done(&f);
}

TEST(test_ec_resv_reserve_active_reused_writing_lease_refreshed)
{
    fx_t f;
    fx_init(&f, 4096);
    int64_t t0 = f.now;
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    ASSERT(a.write);
    f.now = t0 + 900;
    kvp__ec_reserve_out_t b = reserve_ok(&f, "t1", "H", 64);
    ASSERT(!b.write && !b.ready && !b.cached && !b.cancelled);
    ASSERT_STR_EQ(b.reservation_id, a.reservation_id);
    ASSERT_EQ(b.offset, a.offset);
    f.now = t0 + 1500; /* past the first lease, inside the refreshed one */
    expire(&f);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_WRITING);
    /* the same id with another hash or shape conflicts */
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "t1", "OTHER", 64, 0, &o), KVP_ERR_INVALID_ARG);
    ASSERT_STR_EQ(f.err, "conflicting reservation for transfer_id");
    ASSERT_EQ(reserve(&f, "t1", "H", 128, 0, &o), KVP_ERR_INVALID_ARG);
    ASSERT_STR_EQ(f.err, "conflicting reservation for transfer_id");
    /* READY reused: ready, but its lease is not refreshed */
    complete(&f, "t1", a.reservation_id, true, true); /* READY until t0+2500 */
    f.now = t0 + 2400;
    kvp__ec_reserve_out_t c = reserve_ok(&f, "t1", "H", 64);
    ASSERT(c.ready && !c.write && !c.cached);
    f.now = t0 + 2500;
    ASSERT_EQ(expire(&f), 1);
    f.now = t0 + 2600;
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRED);
    fx_done(&f);
}

TEST(test_ec_resv_reserve_cached_hash_ready_at_once)
{
    fx_t f;
    fx_init(&f, 4096);
    put_res(&f, "H", 256, 7);
    ASSERT(kvp__ec_resv_has_resident(f.r, "H"));
    kvp__ec_reserve_out_t o = reserve_ok(&f, "t2", "H", 256);
    ASSERT(o.ready && !o.write && o.cached && !o.cancelled);
    ASSERT_EQ(o.nbytes, 256);
    ASSERT(has_pat(f.slab + o.offset, 7, 256));
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.reserves_cached, 1);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.by_state[KVP__EC_R_READY], 1);
    kvp__ec_status_t ss;
    ASSERT_OK(kvp__ec_resv_status(f.r, "t2", &ss));
    ASSERT(ss.ready);
    ASSERT_STR_EQ(ss.mm_hash, "H");
    ASSERT_STR_EQ(ss.reservation_id, o.reservation_id);
    /* another shape for the cached hash conflicts */
    kvp__ec_reserve_out_t c;
    ASSERT_EQ(reserve(&f, "t3", "H", 128, 0, &c), KVP_ERR_INVALID_ARG);
    ASSERT_STR_EQ(f.err, "conflicting cached tensor for mm_hash");
    /* the take gives the resident tensor itself */
    kvp__ec_view_t v = take_ok(&f, "t2", "H");
    ASSERT(v.ptr == f.slab + o.offset);
    fx_done(&f);
}

TEST(test_ec_resv_reserve_full_expire_then_reclaim_then_pool_full)
{
    fx_t f;
    fx_init(&f, 4096); /* 16 units */
    int64_t t0 = f.now;
    kvp__ec_reserve_out_t a = reserve_ok(&f, "A", "HA", 2048);
    complete(&f, "A", a.reservation_id, true, true); /* READY until t0+1000 */
    put_res(&f, "R", 1024, 1);                       /* evictable */
    f.now = t0 + 600;
    reserve_ok(&f, "B", "HB", 1024); /* WRITING until t0+1600 */
    ASSERT_EQ(stats(&f).slab_free_bytes, 0);
    /* 1: expiry makes room, nothing is evicted */
    f.now = t0 + 1200;
    kvp__ec_reserve_out_t c = reserve_ok(&f, "C", "HC", 2048);
    ASSERT(c.write);
    ASSERT_EQ(st_of(&f, "A"), KVP__EC_R_EXPIRED);
    ASSERT_EQ(st_of(&f, "B"), KVP__EC_R_WRITING);
    ASSERT(kvp__ec_resv_has_resident(f.r, "R"));
    drain_reclaimed(&f, NULL, 0);
    /* 2: nothing to expire: the evictable resident goes */
    reserve_ok(&f, "D", "HD", 1024);
    ASSERT(!kvp__ec_resv_has_resident(f.r, "R"));
    static const char *const rec_r[] = {"R"};
    drain_reclaimed(&f, rec_r, 1);
    /* 3: nothing left: the pool is full */
    kvp__ec_reserve_out_t e;
    ASSERT_EQ(reserve(&f, "E", "HE", 4, 0, &e), KVP_ERR_NO_SPACE);
    ASSERT_STR_EQ(f.err, "EC consumer buffer pool is full");
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.reserves_full, 1);
    ASSERT_EQ(st.reclaimed, 1);
    ASSERT_EQ(st_of(&f, "E"), -1);
    fx_done(&f);
}

TEST(test_ec_resv_reserve_larger_than_slab_evicts_nothing)
{
    fx_t f;
    fx_init(&f, 4096);
    put_res(&f, "R", 1024, 1);
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "t1", "H", 8192, 0, &o), KVP_ERR_NO_SPACE);
    ASSERT(kvp__ec_resv_has_resident(f.r, "R"));
    fx_done(&f);
}

/* ---- complete ------------------------------------------------------------------ */

TEST(test_ec_resv_complete_wrong_rid_not_accepted)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    complete(&f, "t1", "0123456789abcdef0123456789abcdef", false, false);
    complete(&f, "t1", "", false, false);
    complete(&f, "nope", a.reservation_id, false, false);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_WRITING);
    ASSERT_EQ(stats(&f).completes, 0);
    fx_done(&f);
}

TEST(test_ec_resv_complete_ready_repeated_accepted)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    complete(&f, "t1", a.reservation_id, true, true);
    complete(&f, "t1", a.reservation_id, true, false);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_READY);
    fx_done(&f);
}

TEST(test_ec_resv_complete_pending_frees_and_accepts)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H1", 64);
    kvp__ec_reserve_out_t b = reserve_ok(&f, "t2", "H2", 64);
    bool d;
    f.now += LEASE;
    ASSERT(cancel(&f, "t1", a.reservation_id, false, false, &d));
    ASSERT(d);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCEL_PENDING);
    expire(&f);
    ASSERT_EQ(st_of(&f, "t2"), KVP__EC_R_EXPIRE_PENDING);
    ASSERT_EQ(stats(&f).bytes_reserved, 512);
    complete(&f, "t1", a.reservation_id, true, false);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCELLED);
    complete(&f, "t2", b.reservation_id, true, false);
    ASSERT_EQ(st_of(&f, "t2"), KVP__EC_R_EXPIRED);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.slab_free_bytes, 4096);
    ASSERT_EQ(st.tombstones, 2);
    /* the tombstones answer as tombstones */
    ASSERT(reserve_ok(&f, "t1", "H1", 64).cancelled);
    ASSERT(reserve_ok(&f, "t2", "H2", 64).write);
    /* a complete of a tombstone, even with its old id, is not accepted */
    complete(&f, "t1", a.reservation_id, false, false);
    fx_done(&f);
}

TEST(test_ec_resv_complete_writing_to_ready_new_lease)
{
    fx_t f;
    fx_init(&f, 4096);
    int64_t t0 = f.now;
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    f.now = t0 + 900;
    complete(&f, "t1", a.reservation_id, true, true);
    kvp__ec_status_t ss;
    ASSERT_OK(kvp__ec_resv_status(f.r, "t1", &ss));
    ASSERT(ss.ready);
    ASSERT_EQ(ss.t.nbytes, 64);
    f.now = t0 + 1800; /* past the reserve's lease, inside the complete's */
    ASSERT_EQ(expire(&f), 0);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_READY);
    f.now = t0 + 1900;
    ASSERT_EQ(expire(&f), 1);
    ASSERT_EQ(stats(&f).completes, 1);
    fx_done(&f);
}

/* ---- cancel ---------------------------------------------------------------------- */

TEST(test_ec_resv_cancel_mismatching_rid_rejected)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    complete(&f, "t1", a.reservation_id, true, true);
    ASSERT(!cancel(&f, "t1", "ffffffffffffffffffffffffffffffff", false, false, NULL));
    ASSERT(!cancel(&f, "t1", "ffffffffffffffffffffffffffffffff", true, true, NULL));
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_READY);
    ASSERT(cancel(&f, "t1", "", false, false, NULL)); /* "" = any */
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(stats(&f).cancels, 1);
    fx_done(&f);
}

TEST(test_ec_resv_cancel_refresh_abandon_to_expired)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    /* refresh needs abandon */
    ASSERT(!cancel(&f, "t1", a.reservation_id, false, true, NULL));
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_WRITING);
    ASSERT(cancel(&f, "t1", a.reservation_id, true, true, NULL));
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRED);
    ASSERT_EQ(stats(&f).bytes_reserved, 0);
    /* the producer's reserve again: a fresh reservation */
    kvp__ec_reserve_out_t b = reserve_ok(&f, "t1", "H", 64);
    ASSERT(b.write);
    ASSERT(strcmp(a.reservation_id, b.reservation_id) != 0);
    /* EXPIRE_PENDING + refresh + abandon: EXPIRED too */
    f.now += LEASE;
    expire(&f);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRE_PENDING);
    ASSERT(cancel(&f, "t1", b.reservation_id, true, true, NULL));
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_EXPIRED);
    /* refresh of READY is rejected (READY -> EXPIRE_PENDING is not in the table) */
    kvp__ec_reserve_out_t c = reserve_ok(&f, "t2", "H2", 64);
    complete(&f, "t2", c.reservation_id, true, true);
    ASSERT(!cancel(&f, "t2", c.reservation_id, true, true, NULL));
    ASSERT_EQ(st_of(&f, "t2"), KVP__EC_R_READY);
    fx_done(&f);
}

TEST(test_ec_resv_s49_cancel_while_writing_deferred)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 1000);
    bool d = false;
    ASSERT(cancel(&f, "t1", "", false, false, &d));
    ASSERT(d);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCEL_PENDING);
    /* memory kept while RDMA may still write */
    ASSERT_EQ(stats(&f).bytes_reserved, 1024);
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset, 1000, a.reservation_id));
    /* a retried reserve is told cancelled; a repeated cancel stays deferred */
    ASSERT(reserve_ok(&f, "t1", "H", 1000).cancelled);
    ASSERT(cancel(&f, "t1", "", false, false, &d));
    ASSERT(d);
    /* the writer has one more lease to come back */
    f.now += LEASE - 1;
    expire(&f);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCEL_PENDING);
    /* the writer's complete: discarded, memory freed */
    complete(&f, "t1", a.reservation_id, true, false);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCELLED);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.slab_free_bytes, 4096);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset, 1, NULL), KVP_ERR_INVALID_ARG);
    fx_done(&f);
}

TEST(test_ec_resv_cancel_others_cancelled_and_freed)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "ready", "H1", 64);
    complete(&f, "ready", a.reservation_id, true, true);
    reserve_ok(&f, "writing", "H2", 64);
    reserve_ok(&f, "pending", "H3", 64);
    ASSERT(cancel(&f, "pending", "", false, false, NULL));
    ASSERT_EQ(stats(&f).bytes_reserved, 3 * 256);
    bool d = true;
    ASSERT(cancel(&f, "ready", "", false, false, &d));
    ASSERT(!d);
    ASSERT(cancel(&f, "writing", "", true, false, &d)); /* abandon: the writer stopped */
    ASSERT(!d);
    ASSERT(cancel(&f, "pending", "", true, false, &d));
    ASSERT(!d);
    ASSERT_EQ(st_of(&f, "ready"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(st_of(&f, "writing"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(st_of(&f, "pending"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(stats(&f).bytes_reserved, 0);
    /* a CANCELLED tombstone: accepted again, its deadline renewed */
    f.now += LEASE - 1;
    ASSERT(cancel(&f, "ready", "", false, false, NULL));
    f.now += 1;
    expire(&f);
    ASSERT_EQ(st_of(&f, "ready"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(st_of(&f, "writing"), -1);
    /* an EXPIRED tombstone: rejected */
    kvp__ec_reserve_out_t e = reserve_ok(&f, "exp", "H4", 64);
    complete(&f, "exp", e.reservation_id, true, true);
    f.now += LEASE;
    expire(&f);
    ASSERT_EQ(st_of(&f, "exp"), KVP__EC_R_EXPIRED);
    ASSERT(!cancel(&f, "exp", "", false, false, NULL));
    ASSERT(!cancel(&f, "exp", "", true, false, NULL));
    fx_done(&f);
}

/* ---- take ------------------------------------------------------------------------- */

TEST(test_ec_resv_take_ready_matching_hash_becomes_resident)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 1000);
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset, 1000, a.reservation_id));
    fill(f.slab + a.offset, 3, 1000);
    complete(&f, "t1", a.reservation_id, true, true);
    kvp__ec_view_t v = take_ok(&f, "t1", "H");
    ASSERT(v.ptr == f.slab + a.offset);
    ASSERT_EQ(v.t.nbytes, 1000);
    ASSERT(has_pat(v.ptr, 3, 1000));
    ASSERT_EQ(st_of(&f, "t1"), -1);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.residents, 1);
    ASSERT_EQ(st.resident_bytes, 1024);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.takes, 1);
    /* pinned: the engine holds it, so pressure cannot evict it */
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "big", "HB", 4096, 0, &o), KVP_ERR_NO_SPACE);
    ASSERT(kvp__ec_resv_has_resident(f.r, "H"));
    /* take_resident: the same tensor; another shape is a miss */
    kvp__ec_tensor_t t = tensor(1000);
    kvp__ec_view_t w;
    ASSERT_OK(kvp__ec_resv_take_resident(f.r, "H", &t, &w));
    ASSERT(w.ptr == v.ptr);
    kvp__ec_tensor_t t2 = tensor(996);
    ASSERT_EQ(kvp__ec_resv_take_resident(f.r, "H", &t2, &w), KVP_ERR_NOT_FOUND);
    t2 = t;
    t2.dtype = KVP_EC_DTYPE_BFLOAT16;
    ASSERT_EQ(kvp__ec_resv_take_resident(f.r, "H", &t2, &w), KVP_ERR_NOT_FOUND);
    ASSERT_EQ(kvp__ec_resv_take_resident(f.r, "NOPE", &t, &w), KVP_ERR_NOT_FOUND);
    fx_done(&f);
}

TEST(test_ec_resv_take_anything_else_fails)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "writing", "H", 64);
    kvp__ec_reserve_out_t b = reserve_ok(&f, "ready", "H2", 64);
    complete(&f, "ready", b.reservation_id, true, true);
    reserve_ok(&f, "pending", "H3", 64);
    cancel(&f, "pending", "", false, false, NULL);
    cancel(&f, "tomb", "", false, false, NULL);
    struct {
        const char *tid, *hash;
    } cases[] = {{"writing", "H"}, {"ready", "H"}, {"pending", "H3"}, {"tomb", "H"}, {"unknown", "H"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvp__ec_view_t v;
        ASSERT_EQ(kvp__ec_resv_take(f.r, cases[i].tid, cases[i].hash, &v, f.err, sizeof f.err), KVP_ERR_STATE);
        char want[64];
        snprintf(want, sizeof want, "Pushed EC tensor is not ready for mm_hash=%s", cases[i].hash);
        ASSERT_STR_EQ(f.err, want);
    }
    ASSERT_EQ(stats(&f).takes_failed, 5);
    ASSERT_EQ(st_of(&f, "ready"), KVP__EC_R_READY); /* a failed take changes nothing */
    (void)a;
    fx_done(&f);
}

TEST(test_ec_resv_take_with_matching_resident_keeps_the_resident)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t w = reserve_ok(&f, "t1", "H", 256);
    fill(f.slab + w.offset, 5, 256);
    complete(&f, "t1", w.reservation_id, true, true);
    put_res(&f, "H", 256, 5); /* the cross-encoder cache's copy lands meanwhile */
    kvp__ec_view_t v = take_ok(&f, "t1", "H");
    ASSERT(v.ptr != f.slab + w.offset); /* the resident copy is the canonical one */
    ASSERT(has_pat(v.ptr, 5, 256));
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.residents, 1);
    ASSERT_EQ(st.resident_bytes, 256);
    ASSERT_EQ(st.slab_free_bytes, 4096 - 256);
    /* now pinned: the engine holds it */
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "big", "HB", 4096, 0, &o), KVP_ERR_NO_SPACE);
    fx_done(&f);
}

TEST(test_ec_resv_take_with_conflicting_resident_fails)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t w = reserve_ok(&f, "t1", "H", 256);
    complete(&f, "t1", w.reservation_id, true, true);
    put_res(&f, "H", 512, 5); /* another shape under the same hash */
    kvp__ec_view_t v;
    ASSERT_EQ(kvp__ec_resv_take(f.r, "t1", "H", &v, f.err, sizeof f.err), KVP_ERR_STATE);
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_READY);
    fx_done(&f);
}

/* ---- expiry ------------------------------------------------------------------------- */

TEST(test_ec_resv_expiry_ready_expired_writing_pending)
{
    fx_t f;
    fx_init(&f, 4096);
    int64_t t0 = f.now;
    kvp__ec_reserve_out_t a = reserve_ok(&f, "ready", "H1", 64);
    complete(&f, "ready", a.reservation_id, true, true);
    reserve_ok(&f, "writing", "H2", 64);
    reserve_ok(&f, "follower", "H2", 64);
    f.now = t0 + LEASE - 1;
    ASSERT_EQ(expire(&f), 0);
    f.now = t0 + LEASE; /* the deadline itself has passed */
    ASSERT_EQ(expire(&f), 1);
    ASSERT_EQ(st_of(&f, "ready"), KVP__EC_R_EXPIRED);
    ASSERT_EQ(st_of(&f, "writing"), KVP__EC_R_EXPIRE_PENDING);
    ASSERT_EQ(st_of(&f, "follower"), KVP__EC_R_CANCELLED);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.bytes_reserved, 256); /* only the parked writer's */
    ASSERT_EQ(st.expired, 3);
    /* tombstones go at their own deadline */
    f.now = t0 + 2 * LEASE - 1;
    expire(&f);
    ASSERT_EQ(st_of(&f, "writing"), KVP__EC_R_EXPIRE_PENDING);
    f.now = t0 + 2 * LEASE;
    expire(&f);
    ASSERT_EQ(st_of(&f, "ready"), -1);
    ASSERT_EQ(st_of(&f, "follower"), -1);
    /* and the parked writer, whose writer never came back, ends too */
    ASSERT_EQ(st_of(&f, "writing"), KVP__EC_R_EXPIRED);
    ASSERT_EQ(stats(&f).writers_abandoned, 1);
    ASSERT_EQ(stats(&f).bytes_reserved, 0);
    fx_done(&f);
}

/* ---- followers -------------------------------------------------------------------- */

TEST(test_ec_resv_followers_ready_with_their_writer)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t w = reserve_ok(&f, "W", "H", 1000);
    fill(f.slab + w.offset, 9, 1000);
    kvp__ec_reserve_out_t f1 = reserve_ok(&f, "F1", "H", 1000);
    kvp__ec_reserve_out_t f2 = reserve_ok(&f, "F2", "H", 1000);
    ASSERT(!f1.write && !f1.ready && !f1.cached && !f1.cancelled);
    ASSERT_EQ(f1.offset, w.offset);
    ASSERT(strcmp(f1.reservation_id, w.reservation_id) != 0);
    ASSERT(strcmp(f1.reservation_id, f2.reservation_id) != 0);
    ASSERT_EQ(stats(&f).bytes_reserved, 1024); /* one extent for three */
    kvp__ec_reserve_out_t c;
    ASSERT_EQ(reserve(&f, "F3", "H", 996, 0, &c), KVP_ERR_INVALID_ARG);
    ASSERT_STR_EQ(f.err, "conflicting in-flight tensor for mm_hash");
    /* a follower writes nothing and completes nothing */
    complete(&f, "F1", f1.reservation_id, false, false);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, f1.offset, 1, f1.reservation_id), KVP_ERR_INVALID_ARG);
    complete(&f, "W", w.reservation_id, true, true);
    char **ids;
    size_t n;
    ASSERT_OK(kvp__ec_resv_drain_ready(f.r, &ids, &n));
    ASSERT_EQ(n, 2);
    ASSERT_STR_EQ(ids[0], "F1");
    ASSERT_STR_EQ(ids[1], "F2");
    kvp__ec_strv_free(ids, n);
    ASSERT_OK(kvp__ec_resv_drain_ready(f.r, &ids, &n));
    ASSERT_EQ(n, 0);
    ASSERT_EQ(st_of(&f, "F1"), KVP__EC_R_READY);
    /* the tensor went to the resident set, leased by all three */
    ASSERT(kvp__ec_resv_has_resident(f.r, "H"));
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.bytes_reserved, 0);
    ASSERT_EQ(st.resident_bytes, 1024);
    ASSERT(reserve_ok(&f, "W", "H", 1000).cached);
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "big", "HB", 4096, 0, &o), KVP_ERR_NO_SPACE); /* leased: not evictable */
    kvp__ec_view_t v = take_ok(&f, "F1", "H");
    ASSERT(v.ptr == f.slab + w.offset);
    ASSERT(has_pat(v.ptr, 9, 1000));
    /* the others expire; F1's take pinned it; retired, it becomes evictable */
    f.now += LEASE;
    ASSERT_EQ(expire(&f), 2);
    ASSERT_EQ(reserve(&f, "big", "HB", 4096, 0, &o), KVP_ERR_NO_SPACE);
    kvp__ec_resv_retire(f.r, NULL, 0, NULL, NULL);
    ASSERT(reserve_ok(&f, "big", "HB", 4096).write);
    ASSERT(!kvp__ec_resv_has_resident(f.r, "H"));
    fx_done(&f);
}

TEST(test_ec_resv_followers_cancelled_with_abandoned_writer)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t w = reserve_ok(&f, "W", "H", 64);
    reserve_ok(&f, "F1", "H", 64);
    reserve_ok(&f, "F2", "H", 64);
    /* cancelling a follower ends it alone */
    ASSERT(cancel(&f, "F2", "", false, false, NULL));
    ASSERT_EQ(st_of(&f, "F2"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(st_of(&f, "W"), KVP__EC_R_WRITING);
    ASSERT(cancel(&f, "W", w.reservation_id, true, false, NULL));
    ASSERT_EQ(st_of(&f, "F1"), KVP__EC_R_CANCELLED);
    ASSERT(reserve_ok(&f, "F1", "H", 64).cancelled);
    ASSERT_EQ(stats(&f).slab_free_bytes, 4096);
    /* the next reserve of H writes afresh */
    ASSERT(reserve_ok(&f, "N", "H", 64).write);
    fx_done(&f);
}

TEST(test_ec_resv_followers_of_parked_writer_published_on_complete)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t w = reserve_ok(&f, "W", "H", 64);
    reserve_ok(&f, "F", "H", 64);
    bool d;
    ASSERT(cancel(&f, "W", "", false, false, &d));
    ASSERT(d);
    ASSERT_EQ(st_of(&f, "F"), KVP__EC_R_WRITING);
    /* another id of H no longer follows a parked writer: it writes afresh */
    ASSERT(reserve_ok(&f, "N", "H", 64).write);
    complete(&f, "W", w.reservation_id, true, false);
    ASSERT_EQ(st_of(&f, "W"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(st_of(&f, "F"), KVP__EC_R_READY);
    char **ids;
    size_t n;
    ASSERT_OK(kvp__ec_resv_drain_ready(f.r, &ids, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(ids[0], "F");
    kvp__ec_strv_free(ids, n);
    take_ok(&f, "F", "H");
    fx_done(&f);
}

/* ---- tombstones -------------------------------------------------------------------- */

TEST(test_ec_resv_tombstones_capped_oldest_first_and_reaped_at_deadline)
{
    fx_t f;
    fx_init_caps(&f, 4096, 3, 0, 0);
    const char *ids[] = {"t1", "t2", "t3", "t4"};
    for (int i = 0; i < 3; i++)
        ASSERT(cancel(&f, ids[i], "", false, false, NULL));
    /* a repeated cancel moves t1 to the end */
    ASSERT(cancel(&f, "t1", "", false, false, NULL));
    ASSERT(cancel(&f, "t4", "", false, false, NULL));
    ASSERT_EQ(stats(&f).tombstones, 3);
    ASSERT_EQ(st_of(&f, "t2"), -1); /* the oldest went */
    ASSERT_EQ(st_of(&f, "t1"), KVP__EC_R_CANCELLED);
    ASSERT(reserve_ok(&f, "t2", "H", 64).write); /* forgotten: a fresh reserve */
    ASSERT(reserve_ok(&f, "t3", "H3", 64).cancelled);
    /* the cap holds after a complete that makes a tombstone too */
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t5", "H5", 64);
    cancel(&f, "t5", "", false, false, NULL);
    complete(&f, "t5", a.reservation_id, true, false);
    ASSERT_EQ(stats(&f).tombstones, 3);
    f.now += LEASE;
    expire(&f);
    ASSERT_EQ(stats(&f).tombstones, 0);
    fx_done(&f);
}

/* ---- the allocator ----------------------------------------------------------------- */

TEST(test_ec_resv_alloc_aligned_first_fit_coalescing_full)
{
    ASSERT_EQ(kvp__ec_alloc_round(0), 256);
    ASSERT_EQ(kvp__ec_alloc_round(1), 256);
    ASSERT_EQ(kvp__ec_alloc_round(256), 256);
    ASSERT_EQ(kvp__ec_alloc_round(257), 512);
    ASSERT_EQ(kvp__ec_alloc_round(UINT64_MAX), 0);
    kvp__ec_alloc_t a;
    ASSERT_OK(kvp__ec_alloc_init(&a, 1000)); /* not a multiple of the alignment */
    kvp__ec_ext_t e[4];
    ASSERT_OK(kvp__ec_alloc_get(&a, 1, &e[0]));
    ASSERT_OK(kvp__ec_alloc_get(&a, 300, &e[1]));
    ASSERT_EQ(e[0].off, 0);
    ASSERT_EQ(e[0].size, 256);
    ASSERT_EQ(e[1].off, 256);
    ASSERT_EQ(e[1].size, 512);
    ASSERT_EQ(a.free_bytes, 232);
    ASSERT_EQ(kvp__ec_alloc_get(&a, 0, &e[2]), KVP_ERR_NO_SPACE); /* 256 > the 232 left */
    /* first fit: the hole at 0 before the tail */
    kvp__ec_alloc_put(&a, e[0]);
    ASSERT_EQ(a.n_free, 2);
    ASSERT_OK(kvp__ec_alloc_get(&a, 200, &e[3]));
    ASSERT_EQ(e[3].off, 0);
    kvp__ec_alloc_put(&a, e[3]);
    kvp__ec_alloc_put(&a, e[1]); /* joins both neighbours */
    ASSERT_EQ(a.n_free, 1);
    ASSERT_EQ(a.free[0].off, 0);
    ASSERT_EQ(a.free[0].size, 1000);
    ASSERT_EQ(a.n_used, 0);
    ASSERT_OK(kvp__ec_alloc_get(&a, 768, &e[0]));
    ASSERT_EQ(kvp__ec_alloc_get(&a, 256, &e[1]), KVP_ERR_NO_SPACE);
    kvp__ec_alloc_put(&a, e[0]);
    kvp__ec_alloc_cleanup(&a);

    /* the full slab; holes; a larger request skips the holes too small */
    ASSERT_OK(kvp__ec_alloc_init(&a, 8 * 256));
    kvp__ec_ext_t x[8];
    for (int i = 0; i < 8; i++) {
        ASSERT_OK(kvp__ec_alloc_get(&a, 256, &x[i]));
        ASSERT_EQ(x[i].off, (uint64_t)i * 256);
    }
    ASSERT_EQ(a.n_free, 0);
    ASSERT_EQ(kvp__ec_alloc_get(&a, 1, &e[0]), KVP_ERR_NO_SPACE);
    kvp__ec_alloc_put(&a, x[1]); /* no free neighbour */
    kvp__ec_alloc_put(&a, x[5]);
    ASSERT_EQ(a.n_free, 2);
    kvp__ec_alloc_put(&a, x[4]); /* joins the next one only */
    ASSERT_EQ(a.n_free, 2);
    ASSERT_EQ(a.free[1].off, 4 * 256);
    ASSERT_EQ(a.free[1].size, 512);
    kvp__ec_ext_t y, z;
    ASSERT_OK(kvp__ec_alloc_get(&a, 512, &y));
    ASSERT_EQ(y.off, 4 * 256);
    ASSERT_OK(kvp__ec_alloc_get(&a, 1, &z));
    ASSERT_EQ(z.off, 256);
    kvp__ec_alloc_put(&a, x[2]);
    kvp__ec_alloc_put(&a, x[3]); /* joins the previous one only */
    ASSERT_EQ(a.n_free, 1);
    ASSERT_EQ(a.free[0].off, 2 * 256);
    ASSERT_EQ(a.free[0].size, 512);
    ASSERT_EQ(a.free_bytes, 512);
    kvp__ec_alloc_cleanup(&a);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* ---- the resident set ----------------------------------------------------------------- */

TEST(test_ec_resv_reclaim_evicts_lru_and_records_reclaimed)
{
    fx_t f;
    fx_init(&f, 4 * 1024);
    put_res(&f, "R1", 1024, 1);
    put_res(&f, "R2", 1024, 2);
    put_res(&f, "R3", 1024, 3);
    put_res(&f, "R4", 1024, 4);
    /* R2 pinned by a local hand-off: not evictable */
    kvp__ec_tensor_t t = tensor(1024);
    kvp__ec_view_t v;
    ASSERT_OK(kvp__ec_resv_take_resident(f.r, "R2", &t, &v));
    ASSERT(has_pat(v.ptr, 2, 1024));
    /* R1 leased by a cached reservation: not evictable either */
    ASSERT(reserve_ok(&f, "c1", "R1", 1024).cached);
    reserve_ok(&f, "w", "HW", 2048); /* evicts R3 then R4 */
    static const char *const want[] = {"R3", "R4"};
    drain_reclaimed(&f, want, 2);
    drain_reclaimed(&f, NULL, 0);
    ASSERT(kvp__ec_resv_has_resident(f.r, "R1"));
    ASSERT(kvp__ec_resv_has_resident(f.r, "R2"));
    ASSERT_EQ(stats(&f).reclaimed, 2);
    /* R1's lease released (expired): evictable */
    f.now += LEASE;
    expire(&f);
    ASSERT(cancel(&f, "w", "", true, false, NULL));
    reserve_ok(&f, "w2", "HW2", 2 * 1024); /* fits where w was */
    drain_reclaimed(&f, NULL, 0);
    reserve_ok(&f, "w3", "HW3", 1024); /* R1 goes; R2 (pinned) stays */
    static const char *const want1[] = {"R1"};
    drain_reclaimed(&f, want1, 1);
    ASSERT(kvp__ec_resv_has_resident(f.r, "R2"));
    fx_done(&f);
}

typedef struct cache_ctx {
    const char *held;
    int calls;
} cache_ctx_t;

static bool in_cache(void *ctx, const char *mm_hash, const uint8_t *ptr)
{
    cache_ctx_t *c = ctx;
    c->calls++;
    (void)ptr;
    return c->held && strcmp(c->held, mm_hash) == 0;
}

TEST(test_ec_resv_retire_only_what_the_engine_no_longer_holds)
{
    fx_t f;
    fx_init(&f, 2048);
    kvp__ec_tensor_t t = tensor(1024);
    kvp__ec_view_t v;
    put_res(&f, "A", 1024, 1);
    put_res(&f, "B", 1024, 2);
    ASSERT_OK(kvp__ec_resv_take_resident(f.r, "A", &t, &v));
    ASSERT_OK(kvp__ec_resv_take_resident(f.r, "B", &t, &v));
    /* all pinned, the engine still holds A */
    cache_ctx_t c = {"A", 0};
    kvp__ec_resv_retire(f.r, NULL, 0, in_cache, &c);
    ASSERT_EQ(c.calls, 2);
    check(&f);
    ASSERT(reserve_ok(&f, "t1", "H", 1024).write); /* B went */
    ASSERT(!kvp__ec_resv_has_resident(f.r, "B"));
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "t2", "H2", 1024, 0, &o), KVP_ERR_NO_SPACE); /* A stays */
    /* a freed list names the hashes to look at; the engine let A go */
    c.held = NULL;
    const char *freed[] = {"NOPE", "A"};
    kvp__ec_resv_retire(f.r, freed, 2, in_cache, &c);
    ASSERT(reserve_ok(&f, "t2", "H2", 1024).write);
    static const char *const want[] = {"B", "A"};
    drain_reclaimed(&f, want, 2);
    fx_done(&f);
}

/* The cross-encoder cache's two-step put: a fill's extent is nobody else's
 * (not resident, not reserved, counted in fill_bytes) until fill_end
 * publishes it or frees it; a hash resident by then keeps its entry. */
TEST(test_ec_resv_fill_begin_end_publish_abort_busy)
{
    fx_t f;
    fx_init(&f, 64 * 1024);
    kvp__ec_tensor_t t = tensor(1024);
    uint8_t *ptr;
    uint64_t id;
    ASSERT_OK(kvp__ec_resv_fill_begin(f.r, "F1", &t, &ptr, &id));
    ASSERT(id != 0 && ptr >= f.slab && ptr + 1024 <= f.slab + f.size);
    check(&f);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.fill_bytes, 1024);
    ASSERT_EQ(st.residents, 0);
    ASSERT(!kvp__ec_resv_has_resident(f.r, "F1")); /* not visible while filling */
    memset(ptr, 0x3c, 1024);
    ASSERT_OK(kvp__ec_resv_fill_end(f.r, id, true));
    ASSERT_EQ(kvp__ec_resv_fill_end(f.r, id, true), KVP_ERR_NOT_FOUND); /* once */
    st = stats(&f);
    ASSERT_EQ(st.fill_bytes, 0);
    ASSERT_EQ(st.residents, 1);
    kvp__ec_view_t v;
    ASSERT_OK(kvp__ec_resv_take_resident(f.r, "F1", &t, &v));
    ASSERT_EQ(v.ptr, ptr);
    ASSERT_EQ(v.ptr[1023], 0x3c);
    /* resident already: nothing to fill; with another tensor: refused */
    ASSERT_OK(kvp__ec_resv_fill_begin(f.r, "F1", &t, &ptr, &id));
    ASSERT(id == 0 && ptr == NULL);
    kvp__ec_tensor_t t2 = tensor(2048);
    ASSERT_EQ(kvp__ec_resv_fill_begin(f.r, "F1", &t2, &ptr, &id), KVP_ERR_INVALID_ARG);
    /* aborted: the extent goes back, nothing becomes resident */
    ASSERT_OK(kvp__ec_resv_fill_begin(f.r, "F2", &t, &ptr, &id));
    ASSERT_OK(kvp__ec_resv_fill_end(f.r, id, false));
    ASSERT(!kvp__ec_resv_has_resident(f.r, "F2"));
    ASSERT_EQ(stats(&f).fill_bytes, 0);
    /* a hash that became resident while it was filled keeps its entry */
    ASSERT_OK(kvp__ec_resv_fill_begin(f.r, "F3", &t, &ptr, &id));
    uint8_t src[1024];
    memset(src, 7, sizeof src);
    ASSERT_OK(kvp__ec_resv_put_resident(f.r, "F3", &t, src));
    ASSERT_OK(kvp__ec_resv_fill_end(f.r, id, true));
    ASSERT_OK(kvp__ec_resv_take_resident(f.r, "F3", &t, &v));
    ASSERT_EQ(v.ptr[0], 7);
    st = stats(&f);
    ASSERT_EQ(st.fill_bytes, 0);
    ASSERT_EQ(st.residents, 2);
    check(&f);
    /* at most KVP__EC_MAX_FILLS at once */
    uint64_t ids[KVP__EC_MAX_FILLS];
    for (int i = 0; i < KVP__EC_MAX_FILLS; i++) {
        char h[16];
        snprintf(h, sizeof h, "B%d", i);
        ASSERT_OK(kvp__ec_resv_fill_begin(f.r, h, &t, &ptr, &ids[i]));
    }
    ASSERT_EQ(kvp__ec_resv_fill_begin(f.r, "Bx", &t, &ptr, &id), KVP_ERR_BUSY);
    check(&f);
    ASSERT_EQ(stats(&f).fill_bytes, (uint64_t)KVP__EC_MAX_FILLS * 1024);
    for (int i = 0; i < KVP__EC_MAX_FILLS; i++)
        ASSERT_OK(kvp__ec_resv_fill_end(f.r, ids[i], i % 2 == 0));
    ASSERT_EQ(stats(&f).residents, 2 + KVP__EC_MAX_FILLS / 2);
    /* no room, and shutting down */
    kvp__ec_tensor_t big = tensor(128 * 1024);
    ASSERT_EQ(kvp__ec_resv_fill_begin(f.r, "Big", &big, &ptr, &id), KVP_ERR_NO_SPACE);
    kvp__ec_resv_begin_shutdown(f.r);
    ASSERT_EQ(kvp__ec_resv_fill_begin(f.r, "Late", &t, &ptr, &id), KVP_ERR_CLOSED);
    fx_done(&f);
}

TEST(test_ec_resv_put_resident_conflict_duplicate_and_no_space)
{
    fx_t f;
    fx_init(&f, 1024);
    put_res(&f, "A", 512, 1);
    put_res(&f, "A", 512, 1); /* the same tensor again: nothing to do */
    ASSERT_EQ(stats(&f).resident_bytes, 512);
    kvp__ec_tensor_t t = tensor(256);
    uint8_t b[2048] = {0};
    ASSERT_EQ(kvp__ec_resv_put_resident(f.r, "A", &t, b), KVP_ERR_INVALID_ARG);
    t = tensor(2048);
    ASSERT_EQ(kvp__ec_resv_put_resident(f.r, "B", &t, b), KVP_ERR_NO_SPACE);
    /* pressure evicts older copies */
    put_res(&f, "B", 512, 2);
    put_res(&f, "C", 512, 3);
    ASSERT(!kvp__ec_resv_has_resident(f.r, "A"));
    static const char *const want[] = {"A"};
    drain_reclaimed(&f, want, 1);
    fx_done(&f);
}

/* ---- per-peer caps (kvpool's) ------------------------------------------------------------ */

TEST(test_ec_resv_peer_caps_refuse_one_peer_serve_another)
{
    fx_t f;
    fx_init_caps(&f, 1 << 16, 64, 3, 2048);
    kvp__ec_reserve_out_t o;
    ASSERT_OK(reserve(&f, "a1", "H1", 1024, 1, &o));
    ASSERT_OK(reserve(&f, "a2", "H2", 1024, 1, &o));
    /* bytes: 2048 held, one more byte is over */
    ASSERT_EQ(reserve(&f, "a3", "H3", 4, 1, &o), KVP_ERR_BUSY);
    ASSERT_STR_EQ(f.err, "peer reservation cap reached");
    /* a follower costs a reservation but no bytes */
    ASSERT_OK(reserve(&f, "a3", "H1", 1024, 1, &o));
    size_t n;
    uint64_t bytes;
    kvp__ec_resv_peer_usage(f.r, 1, &n, &bytes);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(bytes, 2048);
    /* count: a fourth is over, even one that would cost nothing */
    ASSERT_EQ(reserve(&f, "a4", "H1", 1024, 1, &o), KVP_ERR_BUSY);
    /* a retried reserve of one it holds is no new reservation */
    ASSERT_OK(reserve(&f, "a1", "H1", 1024, 1, &o));
    /* another peer is still served, and peer 0 is never capped */
    ASSERT_OK(reserve(&f, "b1", "H4", 2048, 2, &o));
    for (int i = 0; i < 5; i++) {
        char tid[8], h[8];
        snprintf(tid, sizeof tid, "z%d", i);
        snprintf(h, sizeof h, "Z%d", i);
        ASSERT_OK(reserve(&f, tid, h, 2048, 0, &o));
    }
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.reserves_capped, 2);
    ASSERT_EQ(st_of(&f, "a4"), -1);
    /* the writer completes: its extent goes to the resident set (the
     * follower), and stops counting against peer 1 */
    kvp__ec_status_t ss;
    ASSERT_OK(kvp__ec_resv_status(f.r, "a1", &ss));
    complete(&f, "a1", ss.reservation_id, true, true);
    kvp__ec_resv_peer_usage(f.r, 1, &n, &bytes);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(bytes, 1024);
    /* taken, cancelled: released */
    take_ok(&f, "a1", "H1");
    take_ok(&f, "a3", "H1");
    ASSERT(cancel(&f, "a2", "", true, false, NULL));
    kvp__ec_resv_peer_usage(f.r, 1, &n, &bytes);
    ASSERT_EQ(n, 0);
    ASSERT_EQ(bytes, 0);
    /* a cached reserve costs a reservation, no bytes */
    ASSERT_OK(reserve(&f, "a5", "H1", 1024, 1, &o));
    ASSERT(o.cached);
    kvp__ec_resv_peer_usage(f.r, 1, &n, &bytes);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(bytes, 0);
    kvp__ec_resv_peer_usage(f.r, 2, &n, &bytes);
    ASSERT_EQ(n, 1);
    ASSERT_EQ(bytes, 2048);
    kvp__ec_resv_peer_usage(f.r, 99, &n, &bytes);
    ASSERT_EQ(n, 0);
    fx_done(&f);
}

/* ---- the data plane's bounds check ---------------------------------------------------------- */

TEST(test_ec_resv_check_write_inside_outside_after_cancel)
{
    fx_t f;
    fx_init(&f, 4096);
    reserve_ok(&f, "pad", "P", 256);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 1000);
    const char *rid = a.reservation_id;
    ASSERT_EQ(a.offset, 256);
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset, 1000, rid));
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset + 500, 500, rid));
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset + 10, 10, NULL));
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset + 10, 10, ""));
    /* past the tensor's bytes (the extent's padding included), before it, overflowing */
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset, 1001, rid), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset + 1000, 1, rid), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset - 1, 2, rid), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset + 1, UINT64_MAX, rid), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, 2048, 16, NULL), KVP_ERR_INVALID_ARG); /* free space */
    /* another reservation's id does not cover it */
    kvp__ec_status_t ss;
    ASSERT_OK(kvp__ec_resv_status(f.r, "pad", &ss));
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset, 16, ss.reservation_id), KVP_ERR_INVALID_ARG);
    ASSERT_OK(kvp__ec_resv_check_write(f.r, 0, 256, ss.reservation_id));
    /* cancelled while writing: still writable (memory kept) */
    cancel(&f, "t1", "", false, false, NULL);
    ASSERT_OK(kvp__ec_resv_check_write(f.r, a.offset, 1000, rid));
    /* abandoned: gone */
    cancel(&f, "t1", "", true, false, NULL);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset, 1, rid), KVP_ERR_INVALID_ARG);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, a.offset, 1, NULL), KVP_ERR_INVALID_ARG);
    /* completed: READY is no longer writable */
    complete(&f, "pad", ss.reservation_id, true, true);
    ASSERT_EQ(kvp__ec_resv_check_write(f.r, 0, 1, ss.reservation_id), KVP_ERR_INVALID_ARG);
    fx_done(&f);
}

/* ---- the state table -------------------------------------------------------------------------- */

TEST(test_ec_resv_rejects_transitions_not_in_table)
{
    enum { W = KVP__EC_R_WRITING, R, CP, EP, C, E };
    static const bool want[6][6] = {
        [W] = {[R] = 1, [CP] = 1, [EP] = 1, [C] = 1},
        [R] = {[C] = 1, [E] = 1},
        [CP] = {[C] = 1},
        [EP] = {[C] = 1, [E] = 1},
    };
    int allowed = 0;
    for (int a = 0; a < KVP__EC_R_NUM_STATES; a++)
        for (int b = 0; b < KVP__EC_R_NUM_STATES; b++) {
            ASSERT_MSG(kvp__ec_rstate_allowed(a, b) == want[a][b], "%s -> %s", kvp__ec_rstate_name(a),
                       kvp__ec_rstate_name(b));
            allowed += want[a][b];
        }
    ASSERT_EQ(allowed, 9);
    ASSERT(!kvp__ec_rstate_allowed((kvp__ec_rstate_t)KVP__EC_R_NUM_STATES, KVP__EC_R_WRITING));
    ASSERT_STR_EQ(kvp__ec_rstate_name(KVP__EC_R_EXPIRE_PENDING), "EXPIRE_PENDING");
    ASSERT_STR_EQ(kvp__ec_rstate_name((kvp__ec_rstate_t)KVP__EC_R_NUM_STATES), "UNKNOWN");
    /* the operations that would need a missing transition refuse */
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    complete(&f, "t1", a.reservation_id, true, true);
    ASSERT(!cancel(&f, "t1", "", true, true, NULL)); /* READY -> EXPIRE_PENDING */
    ASSERT(cancel(&f, "t1", "", false, false, NULL));
    complete(&f, "t1", a.reservation_id, false, false); /* CANCELLED -> READY */
    kvp__ec_reserve_out_t b = reserve_ok(&f, "t2", "H2", 64);
    complete(&f, "t2", b.reservation_id, true, true);
    f.now += LEASE;
    expire(&f);
    ASSERT(!cancel(&f, "t2", "", true, false, NULL)); /* EXPIRED -> CANCELLED */
    ASSERT_EQ(st_of(&f, "t2"), KVP__EC_R_EXPIRED);
    fx_done(&f);
}

/* ---- stats --------------------------------------------------------------------------------------- */

TEST(test_ec_resv_stats_count_what_happened)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t a = reserve_ok(&f, "t1", "H", 64);
    reserve_ok(&f, "t1", "H", 64);
    complete(&f, "t1", a.reservation_id, true, true);
    take_ok(&f, "t1", "H");
    reserve_ok(&f, "t2", "H", 64); /* cached */
    reserve_ok(&f, "t3", "H3", 64);
    cancel(&f, "t3", "", false, false, NULL);
    cancel(&f, "t4", "", false, false, NULL);
    kvp__ec_view_t v;
    ASSERT_EQ(kvp__ec_resv_take(f.r, "t3", "H3", &v, NULL, 0), KVP_ERR_STATE);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_EQ(st.reserves, 4);
    ASSERT_EQ(st.reserves_cached, 1);
    ASSERT_EQ(st.completes, 1);
    ASSERT_EQ(st.takes, 1);
    ASSERT_EQ(st.takes_failed, 1);
    ASSERT_EQ(st.cancels, 2);
    ASSERT_EQ(st.records, 3);
    ASSERT_EQ(st.active, 2);
    ASSERT_EQ(st.tombstones, 1);
    ASSERT_EQ(st.by_state[KVP__EC_R_READY], 1);
    ASSERT_EQ(st.by_state[KVP__EC_R_CANCEL_PENDING], 1);
    ASSERT_EQ(st.by_state[KVP__EC_R_CANCELLED], 1);
    ASSERT_EQ(st.bytes_reserved, 256);
    ASSERT_EQ(st.residents, 1);
    ASSERT_EQ(st.resident_bytes, 256);
    ASSERT_EQ(st.slab_free_bytes, 4096 - 512);
    fx_done(&f);
}

/* ---- shutdown -------------------------------------------------------------------------------------- */

typedef struct completer {
    fx_t *f;
    const char *tid, *rid;
} completer_t;

static void *complete_thread(void *arg)
{
    completer_t *c = arg;
    bool acc, ready;
    kvp__ec_resv_complete(c->f->r, c->tid, c->rid, &acc, &ready);
    return NULL;
}

TEST(test_ec_resv_begin_shutdown_cancels_and_waits_for_writers)
{
    fx_t f;
    fx_init(&f, 4096);
    kvp__ec_reserve_out_t w = reserve_ok(&f, "W", "H", 64);
    reserve_ok(&f, "F", "H", 64);
    kvp__ec_reserve_out_t r = reserve_ok(&f, "R", "H2", 64);
    complete(&f, "R", r.reservation_id, true, true);
    ASSERT(!kvp__ec_resv_wait_for_writers(f.r, 0));
    kvp__ec_resv_begin_shutdown(f.r);
    kvp__ec_resv_begin_shutdown(f.r); /* once */
    check(&f);
    ASSERT_EQ(st_of(&f, "W"), KVP__EC_R_CANCEL_PENDING);
    ASSERT_EQ(st_of(&f, "F"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(st_of(&f, "R"), KVP__EC_R_CANCELLED);
    kvp__ec_reserve_out_t o;
    ASSERT_EQ(reserve(&f, "N", "H3", 64, 0, &o), KVP_ERR_CLOSED);
    ASSERT_STR_EQ(f.err, "Consumer reservation manager is shutting down");
    ASSERT(!kvp__ec_resv_wait_for_writers(f.r, 0));
    completer_t c = {&f, "W", w.reservation_id};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, complete_thread, &c), 0);
    ASSERT(kvp__ec_resv_wait_for_writers(f.r, 60000));
    pthread_join(th, NULL);
    ASSERT_EQ(st_of(&f, "W"), KVP__EC_R_CANCELLED);
    ASSERT_EQ(stats(&f).slab_free_bytes, 4096);
    fx_done(&f);
}

/* ---- the randomized model --------------------------------------------------------------------------- */

#define M_TIDS 24
#define M_HASHES 12

typedef struct mtid {
    char rid[KVP__EC_RID_LEN + 1];
    unsigned h; /* the hash of its last reserve */
    char follower_rid[KVP__EC_RID_LEN + 1]; /* its last reserve made it a follower */
} mtid_t;

static uint64_t m_nbytes(unsigned h) { return 4u * (100u + 350u * (h % 8u)); }

/* Random operations on a small slab with short leases, tight caps and few
 * tombstones.  After each: the self-check (every extent disjoint, together
 * the slab; counters, lists, peers) and the byte sum.  Every writer writes
 * its hash's pattern at once (after the bounds check passes), so a take or
 * local hand-off that finds another pattern means two live extents shared
 * bytes, or a freed extent was handed out while still owned. */
static void model_run(uint64_t seed, int steps)
{
    fx_t f;
    fx_init_caps(&f, 40 * 1024, 16, 5, 16 * 1024);
    mtid_t tids[M_TIDS];
    memset(tids, 0, sizeof tids);
    uint64_t rng = seed;
    uint8_t *buf = malloc(64 * 1024);
    size_t followers_ready = 0;
    for (int step = 0; step < steps; step++) {
        uint64_t x = kvp__splitmix64(&rng);
        unsigned ti = (unsigned)(x >> 8) % M_TIDS, h = (unsigned)(x >> 20) % M_HASHES;
        if ((x % 16 == 7 || x % 16 == 8) && (x >> 60) != 0)
            h = tids[ti].h; /* mostly take what the id reserved */
        char tid[16], hash[16];
        snprintf(tid, sizeof tid, "t%u", ti);
        snprintf(hash, sizeof hash, "h%u", h);
        uint64_t nb = m_nbytes(h) + ((x >> 40) % 23 == 0 ? 4 : 0); /* now and then a conflicting shape */
        const char *rid = (x >> 32) % 7 == 0 ? "" : (x >> 32) % 11 == 0 ? "00000000000000000000000000000000"
                                                                         : tids[ti].rid;
        bool b1 = (x >> 45) & 1, b2 = ((x >> 46) & 3) == 0;
        switch (x % 16) {
        case 0:
        case 1:
        case 2:
        case 3: {
            kvp__ec_reserve_out_t o;
            kvp_status_t s = reserve(&f, tid, hash, nb, 1 + (x >> 50) % 4, &o);
            if (s == KVP_OK && !o.cancelled) {
                bool fresh = strcmp(tids[ti].rid, o.reservation_id) != 0;
                if (fresh && !o.write && !o.ready && !o.cached)
                    memcpy(tids[ti].follower_rid, o.reservation_id, sizeof tids[ti].follower_rid);
                memcpy(tids[ti].rid, o.reservation_id, sizeof tids[ti].rid);
                tids[ti].h = h;
                ASSERT_EQ(o.nbytes, nb);
                ASSERT(o.offset + o.nbytes <= f.size);
            }
            if (s == KVP_OK && o.write) {
                ASSERT_OK(kvp__ec_resv_check_write(f.r, o.offset, o.nbytes, o.reservation_id));
                fill(f.slab + o.offset, h, o.nbytes);
            }
            if (s == KVP_OK && o.cached)
                ASSERT(has_pat(f.slab + o.offset, h, o.nbytes));
            ASSERT(s == KVP_OK || s == KVP_ERR_INVALID_ARG || s == KVP_ERR_STATE || s == KVP_ERR_NO_SPACE ||
                   s == KVP_ERR_BUSY);
            break;
        }
        case 4:
        case 5: {
            bool acc, ready;
            kvp__ec_resv_complete(f.r, tid, rid, &acc, &ready);
            ASSERT(!ready || acc);
            check(&f);
            /* the followers this complete made READY: READY now, each the
             * follower its last reserve made */
            char **v;
            size_t n;
            ASSERT_OK(kvp__ec_resv_drain_ready(f.r, &v, &n));
            ASSERT(n == 0 || acc);
            followers_ready += n;
            for (size_t i = 0; i < n; i++) {
                kvp__ec_status_t ss;
                unsigned k = (unsigned)atoi(v[i] + 1);
                ASSERT(v[i][0] == 't' && k < M_TIDS);
                ASSERT_OK(kvp__ec_resv_status(f.r, v[i], &ss));
                ASSERT_MSG(ss.ready, "step %d: %s drained but not READY", step, v[i]);
                ASSERT_STR_EQ(ss.reservation_id, tids[k].follower_rid);
            }
            kvp__ec_strv_free(v, n);
            break;
        }
        case 6:
            cancel(&f, tid, rid, b1, b2, NULL);
            break;
        case 7:
        case 8: {
            kvp__ec_view_t v;
            if (kvp__ec_resv_take(f.r, tid, hash, &v, NULL, 0) == KVP_OK)
                ASSERT_MSG(has_pat(v.ptr, h, v.t.nbytes), "step %d: take %s %s: bytes not its own", step, tid, hash);
            check(&f);
            break;
        }
        case 9: {
            kvp__ec_tensor_t t = tensor(nb);
            kvp__ec_view_t v;
            if (kvp__ec_resv_take_resident(f.r, hash, &t, &v) == KVP_OK)
                ASSERT_MSG(has_pat(v.ptr, h, v.t.nbytes), "step %d: take_resident %s", step, hash);
            break;
        }
        case 10: {
            kvp__ec_tensor_t t = tensor(nb);
            fill(buf, h, nb);
            kvp_status_t s = kvp__ec_resv_put_resident(f.r, hash, &t, buf);
            ASSERT(s == KVP_OK || s == KVP_ERR_INVALID_ARG || s == KVP_ERR_NO_SPACE);
            check(&f);
            break;
        }
        case 11:
            if (b1) {
                kvp__ec_resv_retire(f.r, NULL, 0, NULL, NULL);
            } else {
                const char *freed[] = {hash};
                kvp__ec_resv_retire(f.r, freed, 1, NULL, NULL);
            }
            check(&f);
            break;
        case 12:
        case 13:
            f.now += (int64_t)((x >> 24) % 150);
            expire(&f);
            break;
        case 14: {
            char **v;
            size_t n;
            ASSERT_OK(kvp__ec_resv_drain_ready(f.r, &v, &n));
            ASSERT_EQ(n, 0); /* every complete's were drained after it */
            kvp__ec_strv_free(v, n);
            ASSERT_OK(kvp__ec_resv_drain_reclaimed(f.r, &v, &n));
            kvp__ec_strv_free(v, n);
            break;
        }
        case 15: {
            uint64_t off = (x >> 24) % f.size, len = (x >> 40) % 4096;
            (void)kvp__ec_resv_check_write(f.r, off, len, NULL);
            break;
        }
        }
        kvp__ec_resv_stats_t st = stats(&f);
        ASSERT(st.tombstones <= 16);
        ASSERT_EQ(st.records, st.active + st.tombstones);
        for (uint64_t p = 1; p <= 4; p++) {
            size_t n;
            uint64_t bytes;
            kvp__ec_resv_peer_usage(f.r, p, &n, &bytes);
            ASSERT(n <= 5 && bytes <= 16 * 1024);
        }
    }
    /* the run reached every path it is meant to */
    kvp__ec_resv_stats_t end = stats(&f);
    fprintf(stderr,
            "  seed %" PRIu64 ": reserves %" PRIu64 " cached %" PRIu64 " full %" PRIu64 " capped %" PRIu64
            " completes %" PRIu64 " takes %" PRIu64 "/%" PRIu64 " cancels %" PRIu64 " expired %" PRIu64
            " reclaimed %" PRIu64 " followers made ready %zu\n",
            seed, end.reserves, end.reserves_cached, end.reserves_full, end.reserves_capped, end.completes, end.takes,
            end.takes_failed, end.cancels, end.expired, end.reclaimed, followers_ready);
    ASSERT(end.reserves_cached && end.reserves_full && end.reserves_capped && end.completes && end.takes &&
           end.cancels && end.expired && end.reclaimed && followers_ready);
    /* shut down: every writer parked; their completes free everything held */
    kvp__ec_resv_begin_shutdown(f.r);
    check(&f);
    for (unsigned i = 0; i < M_TIDS; i++) {
        char tid[16];
        snprintf(tid, sizeof tid, "t%u", i);
        kvp__ec_resv_complete(f.r, tid, tids[i].rid, NULL, NULL);
    }
    check(&f);
    ASSERT(kvp__ec_resv_wait_for_writers(f.r, 0));
    ASSERT_EQ(stats(&f).bytes_reserved, 0);
    free(buf);
    fx_done(&f);
}

TEST(test_ec_resv_randomized_model_invariants)
{
    for (uint64_t seed = 1; seed <= 6; seed++)
        model_run(seed * 0x1234567ull, 4000);
}

/* The one mutex: four threads (control server, data plane, worker) on one
 * object, ids of their own, hashes shared (so followers and cached reserves
 * cross threads); every structure checks out afterwards. */
typedef struct hammer {
    fx_t *f;
    unsigned id;
} hammer_t;

static void *hammer_thread(void *arg)
{
    hammer_t *h = arg;
    uint64_t rng = 77 + h->id;
    char rids[8][KVP__EC_RID_LEN + 1], hashes[8][16];
    memset(rids, 0, sizeof rids);
    memset(hashes, 0, sizeof hashes);
    for (int i = 0; i < 3000; i++) {
        uint64_t x = kvp__splitmix64(&rng);
        unsigned k = (unsigned)(x >> 8) % 8, hh = (unsigned)(x >> 16) % 6;
        char tid[16], hash[16];
        snprintf(tid, sizeof tid, "p%u-%u", h->id, k);
        snprintf(hash, sizeof hash, "h%u", hh);
        kvp__ec_reserve_in_t in = {.transfer_id = tid, .mm_hash = hash, .t = tensor(m_nbytes(hh)), .peer = h->id};
        kvp__ec_reserve_out_t o;
        kvp__ec_view_t v;
        switch (x % 6) {
        case 0:
        case 1:
            if (kvp__ec_resv_reserve(h->f->r, &in, &o, NULL, 0) == KVP_OK && !o.cancelled) {
                memcpy(rids[k], o.reservation_id, sizeof rids[k]);
                memcpy(hashes[k], hash, sizeof hashes[k]);
                if (o.write && kvp__ec_resv_check_write(h->f->r, o.offset, o.nbytes, o.reservation_id) == KVP_OK)
                    fill(h->f->slab + o.offset, hh, o.nbytes);
            }
            break;
        case 2:
            kvp__ec_resv_complete(h->f->r, tid, rids[k], NULL, NULL);
            break;
        case 3:
            kvp__ec_resv_cancel(h->f->r, tid, "", (x >> 40) & 1, false, NULL, NULL);
            break;
        case 4:
            /* mostly the hash this tid was reserved with (a take that can
             * succeed), sometimes another (one that must fail cleanly) */
            kvp__ec_resv_take(h->f->r, tid, hashes[k][0] && (x >> 32) % 4 ? hashes[k] : hash, &v, NULL, 0);
            kvp__ec_resv_retire(h->f->r, NULL, 0, NULL, NULL);
            break;
        case 5:
            kvp__ec_resv_expire(h->f->r);
            break;
        }
    }
    return NULL;
}

TEST(test_ec_resv_threads_share_one_object)
{
    fx_t f;
    fx_init_caps(&f, 32 * 1024, 64, 0, 0);
    pthread_t th[4];
    hammer_t h[4];
    for (unsigned i = 0; i < 4; i++) {
        h[i] = (hammer_t){&f, i + 1};
        ASSERT_EQ(pthread_create(&th[i], NULL, hammer_thread, &h[i]), 0);
    }
    for (unsigned i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    check(&f);
    kvp__ec_resv_stats_t st = stats(&f);
    ASSERT_GT(st.reserves, 0);
    ASSERT_GT(st.takes, 0);
    fx_done(&f);
}

/* Out of memory at every allocation of a script that reaches every path
 * that allocates (records, the maps, the free list, publishing followers,
 * the ready and reclaimed lists, tombstones, peers): a call fails with
 * KVP_ERR_NO_MEMORY or succeeds, and every structure checks out after. */
static void oom_script(fx_t *f)
{
    kvp__ec_reserve_out_t o, w;
    bool acc, ready, c;
    char **v;
    size_t n;
    kvp__ec_view_t view;
    kvp__ec_tensor_t t = tensor(512);
    uint8_t src[512] = {0};
    kvp__ec_resv_put_resident(f->r, "R", &t, src);
    kvp__ec_resv_put_resident(f->r, "R2", &t, src);
    memset(&w, 0, sizeof w);
    reserve(f, "W", "H", 256, 1, &w);
    for (int i = 0; i < 6; i++) {
        char tid[8];
        snprintf(tid, sizeof tid, "F%d", i);
        reserve(f, tid, "H", 256, 1 + (unsigned)i % 3, &o);
    }
    for (int i = 0; i < 6; i++) {
        char tid[8], h[8];
        snprintf(tid, sizeof tid, "X%d", i);
        snprintf(h, sizeof h, "HX%d", i);
        reserve(f, tid, h, 1024, 2, &o);
    }
    kvp__ec_resv_complete(f->r, "W", w.reservation_id, &acc, &ready);
    check(f);
    if (kvp__ec_resv_drain_ready(f->r, &v, &n) == KVP_OK)
        kvp__ec_strv_free(v, n);
    kvp__ec_resv_take(f->r, "F1", "H", &view, NULL, 0);
    kvp__ec_resv_take(f->r, "W", "H", &view, NULL, 0);
    reserve(f, "C", "R", 512, 3, &o);
    kvp__ec_resv_take(f->r, "C", "R", &view, NULL, 0);
    for (int i = 0; i < 6; i++) {
        char tid[8];
        snprintf(tid, sizeof tid, "U%d", i);
        kvp__ec_resv_cancel(f->r, tid, "", false, false, &c, NULL);
    }
    kvp__ec_resv_cancel(f->r, "X1", "", false, false, &c, NULL);
    kvp__ec_resv_retire(f->r, NULL, 0, NULL, NULL);
    reserve(f, "BIG", "HB", 8 * 1024, 0, &o); /* reclaims */
    if (kvp__ec_resv_drain_reclaimed(f->r, &v, &n) == KVP_OK)
        kvp__ec_strv_free(v, n);
    f->now += LEASE;
    kvp__ec_resv_expire(f->r);
    kvp__ec_resv_begin_shutdown(f->r);
    check(f);
}

TEST(test_ec_resv_out_of_memory_at_every_allocation)
{
    int completed = 0;
    for (long k = 0; k < 400 && completed < 3; k++) {
        fx_t f;
        memset(&f, 0, sizeof f);
        f.size = 16 * 1024;
        f.slab = calloc(1, f.size);
        f.now = 1000;
        kvp__ec_resv_params_t p = {.slab = f.slab, .slab_size = f.size, .lease_ms = LEASE, .max_tombstones = 4,
                                   .peer_max_reservations = 4, .now_ms = fake_clock, .clock_ctx = &f};
        g_oom = true;
        kvp__alloc_fail_after(k);
        kvp_status_t s = kvp__ec_resv_create(&p, &f.r);
        bool whole = false;
        if (s == KVP_OK) {
            oom_script(&f);
            whole = !kvp__alloc_should_fail(); /* no allocation failed */
            kvp__alloc_fail_reset();
            g_oom = false;
            check(&f);
            kvp__ec_resv_destroy(f.r);
        } else {
            ASSERT_EQ(s, KVP_ERR_NO_MEMORY);
            kvp__alloc_fail_reset();
            g_oom = false;
        }
        free(f.slab);
        ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
        /* a k past the script's allocations runs it whole: stop a little after */
        if (whole && completed++ == 0)
            fprintf(stderr, "  the script runs whole from %ld allocations on\n", k);
    }
    ASSERT_EQ(completed, 3); /* the script's every allocation was made to fail */
}

TEST_LIST(T(test_ec_resv_create_rejects_bad_params),
          T(test_ec_resv_reservation_ids_are_32_lowercase_hex_and_distinct),
          T(test_ec_resv_reserve_rejects_bad_input),
          T(test_ec_resv_s37_cancel_unknown_then_reserve_cancelled),
          T(test_ec_resv_reserve_expired_removed_and_fresh),
          T(test_ec_resv_reserve_expire_pending_still_has_writer),
          T(test_ec_resv_reserve_active_reused_writing_lease_refreshed),
          T(test_ec_resv_reserve_cached_hash_ready_at_once),
          T(test_ec_resv_reserve_full_expire_then_reclaim_then_pool_full),
          T(test_ec_resv_reserve_larger_than_slab_evicts_nothing),
          T(test_ec_resv_complete_wrong_rid_not_accepted),
          T(test_ec_resv_complete_ready_repeated_accepted),
          T(test_ec_resv_complete_pending_frees_and_accepts),
          T(test_ec_resv_complete_writing_to_ready_new_lease),
          T(test_ec_resv_cancel_mismatching_rid_rejected),
          T(test_ec_resv_cancel_refresh_abandon_to_expired),
          T(test_ec_resv_s49_cancel_while_writing_deferred),
          T(test_ec_resv_cancel_others_cancelled_and_freed),
          T(test_ec_resv_take_ready_matching_hash_becomes_resident),
          T(test_ec_resv_take_anything_else_fails),
          T(test_ec_resv_take_with_matching_resident_keeps_the_resident),
          T(test_ec_resv_take_with_conflicting_resident_fails),
          T(test_ec_resv_expiry_ready_expired_writing_pending),
          T(test_ec_resv_followers_ready_with_their_writer),
          T(test_ec_resv_followers_cancelled_with_abandoned_writer),
          T(test_ec_resv_followers_of_parked_writer_published_on_complete),
          T(test_ec_resv_tombstones_capped_oldest_first_and_reaped_at_deadline),
          T(test_ec_resv_alloc_aligned_first_fit_coalescing_full),
          T(test_ec_resv_reclaim_evicts_lru_and_records_reclaimed),
          T(test_ec_resv_retire_only_what_the_engine_no_longer_holds),
          T(test_ec_resv_put_resident_conflict_duplicate_and_no_space), T(test_ec_resv_fill_begin_end_publish_abort_busy),
          T(test_ec_resv_peer_caps_refuse_one_peer_serve_another),
          T(test_ec_resv_check_write_inside_outside_after_cancel),
          T(test_ec_resv_rejects_transitions_not_in_table),
          T(test_ec_resv_stats_count_what_happened),
          T(test_ec_resv_begin_shutdown_cancels_and_waits_for_writers),
          T(test_ec_resv_randomized_model_invariants),
          T(test_ec_resv_threads_share_one_object),
          T(test_ec_resv_out_of_memory_at_every_allocation))
