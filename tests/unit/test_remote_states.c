/*
 * The kvpool:// client's two state machines (client/remote_int.h): a
 * request's life (remote_req.c, kvp__remote_do_advance) and the
 * connection's (remote_conn.c, kvp__remote_do_set_cstate).  Every legal path
 * ends DONE once, with the receive count back where it was; what the
 * tables do not have is refused and changes nothing.  Internal requests
 * (no parent op) are used so that a DONE one is not freed and can be
 * looked at.
 */
#include "client/remote_int.h"
#include "common/alloc.h"
#include "test.h"

static remote_t *remote_new(void)
{
    remote_t *r = kvp__calloc(1, sizeof *r);
    ASSERT(r != NULL);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    snprintf(r->host, sizeof r->host, "test");
    r->wake_fd = -1;
    return r;
}

static void remote_free(remote_t *r)
{
    pthread_cond_destroy(&r->cv);
    pthread_mutex_destroy(&r->mu);
    kvp__free(r, sizeof *r);
}

/* Posts an internal request into r's table and applies evs in order;
 * returns it (DONE ones are out of the table, not freed). */
static pending_t *run(remote_t *r, uint64_t id, const pend_ev_t *evs, int n)
{
    pending_t *p = kvp__remote_pending_new(KVP_WOP_STATS, NULL);
    ASSERT(p != NULL);
    p->req_id = id;
    kvp__remote_do_add(r, p);
    ASSERT_EQ(p->state, PEND_POSTED);
    for (int i = 0; i < n; i++)
        ASSERT(kvp__remote_do_advance(r, p, evs[i]) == NULL); /* (no parent op to complete) */
    return p;
}

static void ends_done(const pend_ev_t *evs, int n)
{
    remote_t *r = remote_new();
    pending_t *p = run(r, 7, evs, n);
    ASSERT_EQ(p->state, PEND_DONE);
    ASSERT(kvp__remote_do_find(r, 7) == NULL);
    ASSERT_EQ(atomic_load(&r->npending), 0u);
    ASSERT_EQ(r->recv_active, 0u);
    kvp__remote_pending_free(p);
    remote_free(r);
}

TEST(test_remote_request_sides_end_in_either_order)
{
    ends_done((pend_ev_t[]){PEV_SENT, PEV_REPLIED}, 2);
    ends_done((pend_ev_t[]){PEV_REPLIED, PEV_SENT}, 2);
    ends_done((pend_ev_t[]){PEV_LOST}, 1);
    ends_done((pend_ev_t[]){PEV_SENT, PEV_LOST}, 2);
    ends_done((pend_ev_t[]){PEV_REPLIED, PEV_LOST}, 2);
}

TEST(test_remote_request_receive_or_copy_is_ended_only_by_its_mover)
{
    ends_done((pend_ev_t[]){PEV_RECV, PEV_SENT, PEV_REPLIED}, 3);
    ends_done((pend_ev_t[]){PEV_SENT, PEV_RECV, PEV_REPLIED}, 3);
    ends_done((pend_ev_t[]){PEV_RECV, PEV_REPLIED, PEV_SENT}, 3);
    ends_done((pend_ev_t[]){PEV_COPY, PEV_SENT, PEV_REPLIED}, 3);
    ends_done((pend_ev_t[]){PEV_SENT, PEV_COPY, PEV_REPLIED}, 3);
    /* a lost connection (and the late send completion after it) leave the
     * receive or copy running */
    ends_done((pend_ev_t[]){PEV_RECV, PEV_LOST, PEV_SENT, PEV_LOST, PEV_REPLIED}, 5);
    ends_done((pend_ev_t[]){PEV_COPY, PEV_LOST, PEV_SENT, PEV_REPLIED}, 4);
    /* a receive its destroyed worker never ends */
    ends_done((pend_ev_t[]){PEV_RECV, PEV_ABANDON}, 2);
    ends_done((pend_ev_t[]){PEV_SENT, PEV_RECV, PEV_LOST, PEV_ABANDON}, 4);

    remote_t *r = remote_new();
    pending_t *p = run(r, 9, (pend_ev_t[]){PEV_RECV, PEV_LOST}, 2);
    ASSERT_EQ(p->state, PEND_RECV_SENT);
    ASSERT_EQ(r->recv_active, 1u);
    ASSERT(kvp__remote_do_find(r, 9) == p);
    ASSERT(kvp__remote_receiving(p) && kvp__remote_reply_open(p) && !kvp__remote_awaits_reply(p));
    ASSERT(kvp__remote_do_advance(r, p, PEV_REPLIED) == NULL);
    ASSERT_EQ(p->state, PEND_DONE);
    ASSERT_EQ(r->recv_active, 0u);
    kvp__remote_pending_free(p);
    remote_free(r);
}

/* A lost connection's status: taken by a request still waiting, recorded
 * (first failure) for one being received, ignored by one already replied. */
TEST(test_remote_request_lost_status_by_stage)
{
    remote_t *r = remote_new();
    pending_t *p = run(r, 1, NULL, 0);
    p->timed_out = 1;
    ASSERT(kvp__remote_do_lost(r, p, KVP_ERR_CONN_LOST) == NULL);
    ASSERT_EQ(p->state, PEND_DONE);
    ASSERT_EQ(p->status, KVP_ERR_TIMEOUT);
    kvp__remote_pending_free(p);

    p = run(r, 2, (pend_ev_t[]){PEV_RECV}, 1);
    ASSERT(kvp__remote_do_lost(r, p, KVP_ERR_CONN_LOST) == NULL);
    ASSERT_EQ(p->state, PEND_RECV_SENT);
    ASSERT_EQ(p->status, KVP_ERR_CONN_LOST);
    ASSERT(kvp__remote_do_advance(r, p, PEV_REPLIED) == NULL);
    kvp__remote_pending_free(p);

    p = run(r, 3, (pend_ev_t[]){PEV_REPLIED}, 1);
    ASSERT(kvp__remote_do_lost(r, p, KVP_ERR_CONN_LOST) == NULL);
    ASSERT_EQ(p->state, PEND_DONE);
    ASSERT_EQ(p->status, KVP_OK);
    kvp__remote_pending_free(p);
    remote_free(r);
}

TEST(test_remote_request_refuses_what_its_state_does_not_take)
{
    static const struct {
        pend_ev_t before[2];
        int n;
        pend_ev_t refused;
        pend_state_t stays;
    } cases[] = {
        {{PEV_SENT}, 1, PEV_SENT, PEND_SENT},              /* a send ends once */
        {{PEV_REPLIED}, 1, PEV_REPLIED, PEND_REPLIED},     /* a reply ends once */
        {{PEV_REPLIED}, 1, PEV_RECV, PEND_REPLIED},        /* no receive after the reply */
        {{PEV_RECV}, 1, PEV_RECV, PEND_RECV},
        {{PEV_RECV}, 1, PEV_COPY, PEND_RECV},
        {{PEV_COPY}, 1, PEV_ABANDON, PEND_COPY},           /* only receives are abandoned */
        {{PEV_SENT}, 1, PEV_ABANDON, PEND_SENT},
        {{PEV_SENT, PEV_REPLIED}, 2, PEV_SENT, PEND_DONE}, /* DONE takes nothing */
        {{PEV_LOST}, 1, PEV_REPLIED, PEND_DONE},
        {{PEV_LOST}, 1, PEV_NUM, PEND_DONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        remote_t *r = remote_new();
        pending_t *p = run(r, 5, cases[i].before, cases[i].n);
        uint64_t recv = r->recv_active, npend = atomic_load(&r->npending);
        ASSERT(kvp__remote_do_advance(r, p, cases[i].refused) == NULL);
        ASSERT_EQ(p->state, cases[i].stays);
        ASSERT_EQ(r->recv_active, recv);
        ASSERT_EQ(atomic_load(&r->npending), npend);
        if (p->state != PEND_DONE)
            ASSERT(kvp__remote_do_advance(r, p, kvp__remote_receiving(p) ? PEV_ABANDON : PEV_LOST) == NULL);
        if (p->state != PEND_DONE)
            ASSERT(kvp__remote_do_advance(r, p, PEV_REPLIED) == NULL); /* (a copy ends by its reply) */
        ASSERT_EQ(p->state, PEND_DONE);
        kvp__remote_pending_free(p);
        remote_free(r);
    }
}

TEST(test_remote_connection_life_and_refusals)
{
    remote_t *r = remote_new();
    ASSERT_EQ(r->cstate, RCONN_IDLE);
    ASSERT_EQ(kvp__remote_do_set_cstate(r, RCONN_READY), KVP_ERR_STATE); /* not without connecting */
    ASSERT_EQ(r->cstate, RCONN_IDLE);
    ASSERT_OK(kvp__remote_do_set_cstate(r, RCONN_CONNECTING));
    ASSERT_EQ(kvp__remote_do_set_cstate(r, RCONN_CONNECTING), KVP_ERR_STATE); /* one connect at a time */
    ASSERT_OK(kvp__remote_do_set_cstate(r, RCONN_IDLE));                      /* it failed */
    ASSERT_OK(kvp__remote_do_set_cstate(r, RCONN_CONNECTING));
    ASSERT_OK(kvp__remote_do_set_cstate(r, RCONN_READY));
    ASSERT(kvp__remote_do_ready(r));
    ASSERT_EQ(kvp__remote_do_set_cstate(r, RCONN_CLOSED), KVP_ERR_STATE); /* retired first */
    ASSERT_EQ(kvp__remote_do_set_cstate(r, RCONN_CONNECTING), KVP_ERR_STATE);
    ASSERT_OK(kvp__remote_do_set_cstate(r, RCONN_IDLE));
    ASSERT_OK(kvp__remote_do_set_cstate(r, RCONN_CLOSED));
    for (int s = 0; s <= RCONN_NUM_STATES; s++)
        ASSERT_EQ(kvp__remote_do_set_cstate(r, (rconn_state_t)s), KVP_ERR_STATE);
    ASSERT_EQ(r->cstate, RCONN_CLOSED);
    remote_free(r);
}

TEST_LIST(T(test_remote_request_sides_end_in_either_order),
          T(test_remote_request_receive_or_copy_is_ended_only_by_its_mover),
          T(test_remote_request_lost_status_by_stage),
          T(test_remote_request_refuses_what_its_state_does_not_take),
          T(test_remote_connection_life_and_refusals))
