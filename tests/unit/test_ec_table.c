/* The EC transfer table (connectors-spec §3.3, as the seed's state.py runs
 * it): one test per transition of the table, the rejected transitions, the
 * behaviours where state.py differs from a table inferred from the spec, and
 * a randomized invariant test. */
#include "test.h"

#include "common/alloc.h"
#include "ec/ec_table.h"

#define TTL 300000

static kvp__ec_spec_t *mkspec(const char *tid, const char *hash, int64_t nbytes)
{
    kvp__ec_spec_t *s = kvp__calloc(1, sizeof *s);
    s->mm_hash = kvp__strdup(hash);
    s->transfer_id = kvp__strdup(tid);
    s->dtype = kvp__strdup("bfloat16");
    s->nbytes = nbytes;
    s->ndim = 2;
    s->shape = kvp__malloc(2 * sizeof *s->shape);
    s->shape[0] = nbytes / 16;
    s->shape[1] = 8;
    return s;
}

static kvp_ec_state_t st_of(kvp__ec_table_t *t, const char *tid)
{
    kvp__ec_rec_t *r = kvp__ec_table_get(t, tid);
    ASSERT_MSG(r != NULL, "no record %s", tid);
    return r->state;
}

static void wait_rec(kvp__ec_table_t *t, const char *tid, const char *hash, int64_t deadline)
{
    kvp__ec_rec_t *r;
    ASSERT_OK(kvp__ec_table_wait_for_event(t, tid, "r1", hash, deadline, &r, NULL));
}

static void observe(kvp__ec_table_t *t, const char *tid, const char *hash, int64_t nbytes, int64_t deadline, bool want)
{
    bool acc;
    ASSERT_OK(kvp__ec_table_observe_ready(t, mkspec(tid, hash, nbytes), deadline, &acc, NULL));
    ASSERT_EQ(acc, want);
}

static void to_loading(kvp__ec_table_t *t, const char *tid, const char *hash)
{
    observe(t, tid, hash, 64, TTL, true);
    kvp__ec_rec_t *r;
    ASSERT_OK(kvp__ec_table_begin_load(t, hash, tid, "r1", 10000, &r));
    ASSERT(r != NULL);
    ASSERT_EQ(r->state, KVP_EC_LOADING);
}

static void to_ready(kvp__ec_table_t *t, const char *tid, const char *hash)
{
    to_loading(t, tid, hash);
    ASSERT_OK(kvp__ec_table_complete_load(t, hash));
    ASSERT_EQ(st_of(t, tid), KVP_EC_READY);
}

static bool do_cancel(kvp__ec_table_t *t, const char *tid, int64_t now)
{
    bool c;
    ASSERT_OK(kvp__ec_table_cancel(t, tid, now, "", "", &c));
    return c;
}

TEST(test_ec_table_new_to_waiting_event)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    wait_rec(&t, "t1", "H", 5000);
    kvp__ec_rec_t *r = kvp__ec_table_get(&t, "t1");
    ASSERT_EQ(r->state, KVP_EC_WAITING_EVENT);
    ASSERT_EQ(r->deadline, 5000);
    /* a later wait keeps the deadline (no refresh) */
    wait_rec(&t, "t1", "H", 9000);
    ASSERT_EQ(r->deadline, 5000);
    /* another hash for the id: no record, the waiting request reported */
    kvp_ec_error_t e = KVP_EC_ERR_NONE;
    kvp__ec_rec_t *got = r;
    ASSERT_OK(kvp__ec_table_wait_for_event(&t, "t1", "r2", "OTHER", 1, &got, &e));
    ASSERT(got == NULL);
    ASSERT_EQ(e, KVP_EC_ERR_NONE);
    ASSERT(kvp__strset_has(&t.unavailable, "r2"));
    ASSERT_EQ(r->state, KVP_EC_WAITING_EVENT);
    ASSERT_STR_EQ(r->hash, "H");
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_new_to_available)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    observe(&t, "t1", "H", 64, 300000, true);
    kvp__ec_rec_t *r = kvp__ec_table_get(&t, "t1");
    ASSERT_EQ(r->state, KVP_EC_AVAILABLE);
    ASSERT_STR_EQ(r->req, "");
    ASSERT(kvp__ec_table_has_state(&t, "H", KVP__EC_S(KVP_EC_AVAILABLE)));
    /* the key is the event's transfer id alone, even an empty one */
    observe(&t, "", "H2", 64, 300000, true);
    ASSERT(kvp__ec_table_get(&t, "H2") == NULL);
    ASSERT_STR_EQ(kvp__ec_table_get(&t, "")->hash, "H2");
    /* another hash for an id: the record is kept, its request (if any) reported */
    observe(&t, "t1", "OTHER", 64, 300000, false);
    ASSERT_EQ(r->state, KVP_EC_AVAILABLE);
    ASSERT_STR_EQ(r->hash, "H");
    ASSERT_EQ(t.unavailable.n, 0); /* t1 has no request */
    wait_rec(&t, "t3", "H3", 5000); /* request r1 */
    observe(&t, "t3", "OTHER", 64, 300000, false);
    ASSERT_EQ(st_of(&t, "t3"), KVP_EC_WAITING_EVENT);
    ASSERT(kvp__ec_table_get(&t, "t3")->spec == NULL);
    ASSERT(kvp__strset_has(&t.unavailable, "r1"));
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_new_to_cancelled)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    bool c;
    ASSERT_OK(kvp__ec_table_cancel(&t, "t9", 10, "H", "r1", &c));
    ASSERT(c);
    kvp__ec_rec_t *r = kvp__ec_table_get(&t, "t9");
    ASSERT_EQ(r->state, KVP_EC_CANCELLED);
    ASSERT_EQ(r->deadline, 10 + TTL);
    ASSERT_STR_EQ(r->hash, "H");
    /* a late event does not revive it */
    observe(&t, "t9", "H", 64, 300000, false);
    ASSERT_EQ(r->state, KVP_EC_CANCELLED);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_waiting_to_available)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    wait_rec(&t, "t1", "H", 5000);
    observe(&t, "t1", "H", 64, 7000, true);
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_AVAILABLE);
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 7000);
    ASSERT_STR_EQ(kvp__ec_table_get(&t, "t1")->req, "r1");
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_waiting_to_unavailable)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    wait_rec(&t, "t1", "H", 5000);
    ASSERT_OK(kvp__ec_table_mark_unavailable(&t, "t1", 6000));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_UNAVAILABLE);
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 6000 + TTL);
    kvp__strset_t got;
    kvp__strmap_init(&got);
    ASSERT_OK(kvp__ec_table_take_unavailable(&t, &got));
    ASSERT_EQ(got.n, 1);
    ASSERT(kvp__strset_has(&got, "r1"));
    kvp__strset_clear(&got);
    /* waiting on the tombstone again does not report r1 twice */
    wait_rec(&t, "t1", "H", 9000);
    ASSERT_OK(kvp__ec_table_take_unavailable(&t, &got));
    ASSERT_EQ(got.n, 0);
    kvp__strset_cleanup(&got);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_waiting_to_cancelled)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    wait_rec(&t, "t1", "H", 5000);
    ASSERT(do_cancel(&t, "t1", 100));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_CANCELLED);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_available_to_loading)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_loading(&t, "t1", "H");
    kvp__ec_rec_t **loads;
    size_t n;
    ASSERT_OK(kvp__ec_table_take_loads(&t, &loads, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(loads[0]->tid, "t1");
    kvp__free(loads, n * sizeof *loads);
    ASSERT_OK(kvp__ec_table_take_loads(&t, &loads, &n));
    ASSERT_EQ(n, 0);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_available_touch_keeps_order)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    observe(&t, "t1", "H", 64, 1000, true);
    observe(&t, "t2", "H2", 64, 1000, true);
    kvp__ec_table_touch_available(&t, "t1", 5000);
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 5000);
    ASSERT_STR_EQ(KVP_LIST_FIRST_ENTRY(&t.order, kvp__ec_rec_t, order)->tid, "t1"); /* not a transition: no move */
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_available_to_expired)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    observe(&t, "t1", "H", 64, 1000, true);
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_expire(&t, 999, 100, &out, &n));
    ASSERT_EQ(n, 0);
    ASSERT_OK(kvp__ec_table_expire(&t, 1000, 100, &out, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(out[0], "t1");
    kvp__ec_strv_free(out, n);
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_EXPIRED);
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 1000 + TTL);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_available_to_cancelled)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    observe(&t, "t1", "H", 64, 1000, true);
    ASSERT(do_cancel(&t, "t1", 5));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_CANCELLED);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_loading_to_ready)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_ready(&t, "t1", "H");
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 10000); /* kept through non-terminal transitions */
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_loading_to_failed)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_loading(&t, "t1", "H");
    ASSERT_OK(kvp__ec_table_fail_load(&t, "H", 50));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_FAILED);
    ASSERT(!do_cancel(&t, "t1", 60)); /* a dead end: cancel returns false */
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_FAILED);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_loading_to_cancelled)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_loading(&t, "t1", "H");
    ASSERT(do_cancel(&t, "t1", 5));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_CANCELLED);
    kvp__ec_rec_t **loads;
    size_t n;
    ASSERT_OK(kvp__ec_table_take_loads(&t, &loads, &n));
    ASSERT_EQ(n, 0); /* dropped from the dispatch queue */
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_ready_to_resident)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_ready(&t, "t1", "H");
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H", 100));
    kvp__ec_rec_t *r = kvp__ec_table_get(&t, "t1");
    ASSERT_EQ(r->state, KVP_EC_RESIDENT);
    ASSERT(r->spec->local);
    ASSERT_EQ(r->spec->num_token, 0);
    ASSERT_EQ((int64_t)t.resident_bytes, 64);
    ASSERT(!do_cancel(&t, "t1", 5));
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_ready_to_expired)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_ready(&t, "t1", "H");
    to_ready(&t, "t2", "H");
    ASSERT(!do_cancel(&t, "t1", 5)); /* READY: cancel refused */
    /* the last READY record in hash-index order is canonical; the other expires */
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H", 100));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_EXPIRED);
    ASSERT_EQ(st_of(&t, "t2"), KVP_EC_RESIDENT);
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_drain_orphaned(&t, &out, &n));
    ASSERT(n >= 1);
    ASSERT_STR_EQ(out[0], "t1");
    kvp__ec_strv_free(out, n);
    /* a reclaimed READY record loses its spec, then a release expires it */
    to_ready(&t, "t3", "G");
    ASSERT_OK(kvp__ec_table_reclaim(&t, "G", 200));
    ASSERT_EQ(st_of(&t, "t3"), KVP_EC_READY);
    ASSERT(kvp__ec_table_get(&t, "t3")->spec == NULL);
    ASSERT_OK(kvp__ec_table_release_ready(&t, "G", 300));
    ASSERT_EQ(st_of(&t, "t3"), KVP_EC_EXPIRED);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_resident_to_loading)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_ready(&t, "t1", "H");
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H", 100));
    kvp__ec_rec_t *r;
    ASSERT_OK(kvp__ec_table_begin_load(&t, "H", NULL, "r2", 500, &r));
    ASSERT(r != NULL);
    ASSERT_EQ(r->state, KVP_EC_LOADING);
    ASSERT(r->spec->local);
    ASSERT_EQ((int64_t)t.resident_bytes, 0);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_resident_to_expired)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 100, TTL); /* capacity 100 bytes, 64 per record */
    to_ready(&t, "t1", "H1");
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H1", 10));
    to_ready(&t, "t2", "H2");
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H2", 20));
    /* over capacity: the oldest RESIDENT expires */
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_EXPIRED);
    ASSERT_EQ(st_of(&t, "t2"), KVP_EC_RESIDENT);
    ASSERT_LE((int64_t)t.resident_bytes, 100);
    /* reclaim of a RESIDENT record expires it */
    ASSERT_OK(kvp__ec_table_reclaim(&t, "H2", 30));
    ASSERT_EQ(st_of(&t, "t2"), KVP_EC_EXPIRED);
    ASSERT_EQ((int64_t)t.resident_bytes, 0);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_unavailable_and_expired_to_cancelled)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    wait_rec(&t, "t1", "H", 5);
    ASSERT_OK(kvp__ec_table_mark_unavailable(&t, "t1", 10));
    ASSERT(do_cancel(&t, "t1", 20));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_CANCELLED);
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 20 + TTL);
    ASSERT(!do_cancel(&t, "t1", 30)); /* already cancelled */
    observe(&t, "t2", "G", 64, 1, true);
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_expire(&t, 1, 100, &out, &n));
    kvp__ec_strv_free(out, n);
    ASSERT_EQ(st_of(&t, "t2"), KVP_EC_EXPIRED);
    ASSERT(do_cancel(&t, "t2", 2));
    ASSERT_EQ(st_of(&t, "t2"), KVP_EC_CANCELLED);
    kvp__ec_table_cleanup(&t);
}

TEST(test_ec_table_terminal_removed_and_capped)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    ASSERT(do_cancel(&t, "a", 0));
    ASSERT(do_cancel(&t, "b", 10));
    ASSERT(do_cancel(&t, "c", 20));
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_expire(&t, TTL + 5, 100, &out, &n));
    ASSERT(kvp__ec_table_get(&t, "a") == NULL); /* tombstone lifetime over */
    ASSERT(kvp__ec_table_get(&t, "b") != NULL);
    ASSERT_OK(kvp__ec_table_expire(&t, TTL + 5, 1, &out, &n)); /* cap: keep the newest one */
    ASSERT(kvp__ec_table_get(&t, "b") == NULL);
    ASSERT(kvp__ec_table_get(&t, "c") != NULL);
    ASSERT_EQ(t.records.n, 1);
    kvp__ec_table_cleanup(&t);
}

/* LOADING -> UNAVAILABLE: expire() times a load out at the deadline
 * begin_load gave it, reports its request and returns its id. */
TEST(test_ec_table_loading_to_unavailable)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_loading(&t, "t1", "H"); /* deadline 10000, request r1 */
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_expire(&t, 9999, 100, &out, &n));
    ASSERT_EQ(n, 0);
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_LOADING);
    ASSERT_OK(kvp__ec_table_expire(&t, 10000, 100, &out, &n));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(out[0], "t1");
    kvp__ec_strv_free(out, n);
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_UNAVAILABLE);
    ASSERT_EQ(kvp__ec_table_get(&t, "t1")->deadline, 10000 + TTL);
    ASSERT(kvp__strset_has(&t.unavailable, "r1"));
    kvp__ec_rec_t **loads;
    ASSERT_OK(kvp__ec_table_take_loads(&t, &loads, &n));
    ASSERT_EQ(n, 0); /* no longer dispatched */
    ASSERT(do_cancel(&t, "t1", 10001));
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_CANCELLED);
    kvp__ec_table_cleanup(&t);
}

/* expire() returns the records it retires in insertion order, not record
 * order (a transition moves a record to the end of the record order). */
TEST(test_ec_table_expire_insertion_order)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    wait_rec(&t, "a", "HA", 5000);
    wait_rec(&t, "b", "HB", 5000);
    wait_rec(&t, "c", "HC", 5000);
    observe(&t, "c", "HC", 64, 1000, true);
    observe(&t, "b", "HB", 64, 1000, true);
    observe(&t, "a", "HA", 64, 1000, true);
    kvp__ec_rec_t *r;
    ASSERT_OK(kvp__ec_table_begin_load(&t, "HB", "b", "r1", 1000, &r)); /* b LOADING, moved to the end */
    ASSERT_STR_EQ(KVP_LIST_FIRST_ENTRY(&t.order, kvp__ec_rec_t, order)->tid, "c");
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_expire(&t, 1000, 100, &out, &n));
    ASSERT_EQ(n, 3);
    ASSERT_STR_EQ(out[0], "a");
    ASSERT_STR_EQ(out[1], "b");
    ASSERT_STR_EQ(out[2], "c");
    kvp__ec_strv_free(out, n);
    ASSERT_EQ(st_of(&t, "a"), KVP_EC_EXPIRED);
    ASSERT_EQ(st_of(&t, "b"), KVP_EC_UNAVAILABLE);
    ASSERT_EQ(st_of(&t, "c"), KVP_EC_EXPIRED);
    kvp__ec_table_cleanup(&t);
}

/* cancel(tid, H) of a record of another non-empty hash does nothing; with
 * no hash given, or a record of no hash, it cancels. */
TEST(test_ec_table_cancel_other_hash_noop)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    observe(&t, "t1", "H", 64, 1000, true);
    bool c = true;
    ASSERT_OK(kvp__ec_table_cancel(&t, "t1", 5, "OTHER", "r1", &c));
    ASSERT(!c);
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_AVAILABLE);
    ASSERT_OK(kvp__ec_table_cancel(&t, "t1", 5, "H", "r1", &c));
    ASSERT(c);
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_CANCELLED);
    ASSERT_OK(kvp__ec_table_cancel(&t, "t2", 5, "", "", &c)); /* a hash-less tombstone */
    ASSERT_OK(kvp__ec_table_cancel(&t, "t2", 6, "ANY", "", &c));
    ASSERT(!c); /* matched (no hash), but already CANCELLED */
    kvp__ec_table_cleanup(&t);
}

/* drain_orphaned() hands back every id retired out of READY/RESIDENT, also
 * one removed since and one retired twice. */
TEST(test_ec_table_drain_orphaned_unfiltered)
{
    kvp__ec_table_t t;
    kvp__ec_table_init(&t, 1000, TTL);
    to_ready(&t, "t1", "H");
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H", 100));
    ASSERT_OK(kvp__ec_table_reclaim(&t, "H", 100)); /* RESIDENT -> EXPIRED: an orphan */
    char **out;
    size_t n;
    ASSERT_OK(kvp__ec_table_expire(&t, 200, 0, &out, &n)); /* the cap removes it */
    kvp__ec_strv_free(out, n);
    ASSERT(kvp__ec_table_get(&t, "t1") == NULL);
    to_ready(&t, "t1", "H"); /* the id again, retired again */
    ASSERT_OK(kvp__ec_table_reclaim(&t, "H", 300));
    ASSERT_OK(kvp__ec_table_release_ready(&t, "H", 300)); /* READY without spec -> EXPIRED */
    ASSERT_EQ(st_of(&t, "t1"), KVP_EC_EXPIRED);
    ASSERT_OK(kvp__ec_table_drain_orphaned(&t, &out, &n));
    ASSERT(n >= 2);
    ASSERT_STR_EQ(out[0], "t1");
    ASSERT_STR_EQ(out[1], "t1");
    ASSERT(n == 2 || out[2] == NULL);
    kvp__ec_strv_free(out, n);
    ASSERT_OK(kvp__ec_table_drain_orphaned(&t, &out, &n));
    ASSERT_EQ(n, 0);
    kvp__ec_table_cleanup(&t);
}

/* Every (from, to) pair through the one set-state: exactly the table. */
TEST(test_ec_table_rejects_transitions_not_in_table)
{
    static const int allowed[KVP_EC_NUM_STATES][KVP_EC_NUM_STATES] = {
        [KVP_EC_WAITING_EVENT] = {[KVP_EC_AVAILABLE] = 1, [KVP_EC_UNAVAILABLE] = 1, [KVP_EC_CANCELLED] = 1},
        [KVP_EC_AVAILABLE] = {[KVP_EC_LOADING] = 1, [KVP_EC_EXPIRED] = 1, [KVP_EC_CANCELLED] = 1},
        [KVP_EC_LOADING] = {[KVP_EC_READY] = 1, [KVP_EC_UNAVAILABLE] = 1, [KVP_EC_FAILED] = 1, [KVP_EC_CANCELLED] = 1},
        [KVP_EC_READY] = {[KVP_EC_RESIDENT] = 1, [KVP_EC_EXPIRED] = 1},
        [KVP_EC_RESIDENT] = {[KVP_EC_LOADING] = 1, [KVP_EC_EXPIRED] = 1},
        [KVP_EC_UNAVAILABLE] = {[KVP_EC_CANCELLED] = 1},
        [KVP_EC_EXPIRED] = {[KVP_EC_CANCELLED] = 1},
    };
    /* a path that reaches every state through allowed transitions */
    static const kvp_ec_state_t path[KVP_EC_NUM_STATES][4] = {
        [KVP_EC_WAITING_EVENT] = {KVP_EC_WAITING_EVENT},
        [KVP_EC_AVAILABLE] = {KVP_EC_AVAILABLE},
        [KVP_EC_LOADING] = {KVP_EC_AVAILABLE, KVP_EC_LOADING},
        [KVP_EC_READY] = {KVP_EC_AVAILABLE, KVP_EC_LOADING, KVP_EC_READY},
        [KVP_EC_RESIDENT] = {KVP_EC_AVAILABLE, KVP_EC_LOADING, KVP_EC_READY, KVP_EC_RESIDENT},
        [KVP_EC_UNAVAILABLE] = {KVP_EC_UNAVAILABLE},
        [KVP_EC_EXPIRED] = {KVP_EC_AVAILABLE, KVP_EC_EXPIRED},
        [KVP_EC_FAILED] = {KVP_EC_AVAILABLE, KVP_EC_LOADING, KVP_EC_FAILED},
        [KVP_EC_CANCELLED] = {KVP_EC_CANCELLED},
    };
    int checked = 0;
    for (int from = 0; from < KVP_EC_NUM_STATES; from++) {
        for (int to = 0; to < KVP_EC_NUM_STATES; to++) {
            kvp__ec_table_t t;
            kvp__ec_table_init(&t, 1000, TTL);
            wait_rec(&t, "x", "H", 5);
            kvp__ec_rec_t *r = kvp__ec_table_get(&t, "x");
            for (int k = 0; k < 4 && path[from][k] != KVP_EC_WAITING_EVENT; k++)
                ASSERT_OK(kvp__ec_table_set_state(&t, r, path[from][k], 1));
            ASSERT_EQ(r->state, from);
            ASSERT_EQ(kvp__ec_transition_allowed(from, to), allowed[from][to]);
            kvp_status_t st = kvp__ec_table_set_state(&t, r, to, 2);
            if (allowed[from][to]) {
                ASSERT_OK(st);
                ASSERT_EQ(r->state, to);
            } else {
                ASSERT_EQ(st, KVP_ERR_STATE);
                ASSERT_EQ(r->state, from);
            }
            checked++;
            kvp__ec_table_cleanup(&t);
        }
    }
    ASSERT_EQ(checked, 81);
}

/* ---- randomized invariants ---------------------------------------------- */

static uint64_t g_rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

static void check_invariants(kvp__ec_table_t *t)
{
    size_t n = 0, term = 0;
    __int128 res = 0;
    KVP_LIST_FOR_EACH_ENTRY(r, &t->order, kvp__ec_rec_t, order) {
        n++;
        ASSERT((unsigned)r->state < KVP_EC_NUM_STATES); /* exactly one state */
        term += kvp__ec_state_terminal(r->state);
        if (r->state == KVP_EC_RESIDENT && r->spec)
            res += r->spec->nbytes;
        ASSERT(kvp__ec_table_get(t, r->tid) == r);
        const kvp__ec_rec_t *next = KVP_LIST_NEXT_ENTRY(r, &t->order, kvp__ec_rec_t, order);
        if (next)
            ASSERT_LT(r->seq, next->seq);
        if (r->hash[0]) {
            ASSERT(r->hent != NULL);
            ASSERT_GT(r->hent->count[r->state], 0);
        }
    }
    ASSERT_EQ(n, t->records.n);
    ASSERT_EQ(term, t->n_terminal);
    ASSERT(res == t->resident_bytes);
    /* per-hash counts add up to the records of the hash */
    for (size_t i = 0; i < t->hashes.cap; i++) {
        if (!t->hashes.slots[i].key)
            continue;
        kvp__ec_hent_t *h = t->hashes.slots[i].val;
        size_t m = 0, c = 0;
        KVP_LIST_FOR_EACH_ENTRY(r, &h->recs, kvp__ec_rec_t, hlink)
            m++;
        for (int s = 0; s < KVP_EC_NUM_STATES; s++)
            c += h->count[s];
        ASSERT_EQ(m, c);
        ASSERT_GT(m, 0);
    }
}

TEST(test_ec_table_randomized_invariants)
{
    kvp__ec_table_t t;
    const int64_t cap = 400;
    kvp__ec_table_init(&t, cap, TTL);
    int64_t now = 0;
    char tid[16], hash[16];
    for (int step = 0; step < 60000; step++) {
        now += (int64_t)(rnd() % 3000);
        if (rnd() % 500 == 0)
            now += 200000;
        snprintf(tid, sizeof tid, "t%d", (int)(rnd() % 64));
        snprintf(hash, sizeof hash, "H%d", (int)(rnd() % 12));
        kvp__ec_rec_t *before = kvp__ec_table_get(&t, tid);
        bool was_cancelled = before && before->state == KVP_EC_CANCELLED;
        uint64_t before_seq = before ? before->seq : 0; /* a CANCELLED record never moves */
        kvp__ec_rec_t *r;
        bool b;
        switch (rnd() % 10) {
        case 0: {
            kvp_ec_error_t e;
            (void)kvp__ec_table_wait_for_event(&t, tid, "rq", before ? before->hash : hash, now + 5000, &r, &e);
            break;
        }
        case 1: {
            kvp_ec_error_t e = KVP_EC_ERR_NONE;
            ASSERT_OK(kvp__ec_table_observe_ready(&t, mkspec(tid, (before && rnd() % 4) ? before->hash : hash,
                                                             16 * (1 + (int64_t)(rnd() % 16))),
                                                  now + TTL, &b, &e));
            break;
        }
        case 2: ASSERT_OK(kvp__ec_table_begin_load(&t, hash, tid, "rq", now + 5000, &r)); break;
        case 3: ASSERT_OK(kvp__ec_table_complete_load(&t, hash)); break;
        case 4: ASSERT_OK(kvp__ec_table_fail_load(&t, hash, now)); break;
        case 5:
            ASSERT_OK(kvp__ec_table_release_ready(&t, hash, now));
            ASSERT_LE((int64_t)t.resident_bytes, cap); /* never above capacity after a release */
            break;
        case 6: ASSERT_OK(kvp__ec_table_reclaim(&t, hash, now)); break;
        case 7: ASSERT_OK(kvp__ec_table_cancel(&t, tid, now, hash, "rq", &b)); break;
        case 8: {
            char **out;
            size_t n;
            ASSERT_OK(kvp__ec_table_expire(&t, now, 40, &out, &n));
            for (size_t i = 0; i < n; i++)
                ASSERT(st_of(&t, out[i]) == KVP_EC_EXPIRED || st_of(&t, out[i]) == KVP_EC_UNAVAILABLE);
            kvp__ec_strv_free(out, n);
            ASSERT_OK(kvp__ec_table_drain_orphaned(&t, &out, &n));
            kvp__ec_strv_free(out, n);
            break;
        }
        default:
            if (before && before->state == KVP_EC_WAITING_EVENT && now >= before->deadline)
                ASSERT_OK(kvp__ec_table_mark_unavailable(&t, tid, now));
            break;
        }
        /* a cancelled id is never revived: only removal (expiry/cap) ends it */
        kvp__ec_rec_t *after = kvp__ec_table_get(&t, tid);
        if (was_cancelled && after && after->seq == before_seq)
            ASSERT_EQ(after->state, KVP_EC_CANCELLED);
        if (step % 16 == 0)
            check_invariants(&t);
    }
    check_invariants(&t);
    kvp__ec_table_cleanup(&t);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST_LIST(T(test_ec_table_new_to_waiting_event), T(test_ec_table_new_to_available), T(test_ec_table_new_to_cancelled),
          T(test_ec_table_waiting_to_available), T(test_ec_table_waiting_to_unavailable),
          T(test_ec_table_waiting_to_cancelled), T(test_ec_table_available_to_loading),
          T(test_ec_table_available_touch_keeps_order), T(test_ec_table_available_to_expired),
          T(test_ec_table_available_to_cancelled), T(test_ec_table_loading_to_ready),
          T(test_ec_table_loading_to_failed), T(test_ec_table_loading_to_cancelled),
          T(test_ec_table_ready_to_resident), T(test_ec_table_ready_to_expired),
          T(test_ec_table_resident_to_loading), T(test_ec_table_resident_to_expired),
          T(test_ec_table_unavailable_and_expired_to_cancelled), T(test_ec_table_terminal_removed_and_capped),
          T(test_ec_table_loading_to_unavailable), T(test_ec_table_expire_insertion_order),
          T(test_ec_table_cancel_other_hash_noop), T(test_ec_table_drain_orphaned_unfiltered),
          T(test_ec_table_rejects_transitions_not_in_table), T(test_ec_table_randomized_invariants))
