/* The EC scheduler's parts, shared by ec_sched.c (the hooks) and ec_drain.c
 * (E1/E2, the readiness-event drain); internal access for tests. */
#ifndef KVP_EC_SCHED_INT_H
#define KVP_EC_SCHED_INT_H

#include "common/strmap.h"
#include "ec/ec_ready.h"
#include "ec/ec_table.h"
#include "kvpool/ec_connector.h"

typedef struct {
    char *request_id;
    char *identifier;
    kvp_ec_tensor_spec_t spec;
} candidate_t;

struct kvp_ec_sched {
    kvp_ec_config_t cfg;
    char *control_addr;
    int itemsize;
    kvp_ec_clock_t clock;
    kvp_ec_control_t control;
    kvp_ec_executor_t executor;
    kvp_ec_inbox_t inbox;
    int64_t max_pending_events;
    int64_t max_terminal;
    kvp__ec_table_t table;
    kvp__ec_ready_t ready;
    kvp__strset_t local_cache;
    kvp__strset_t failed_saves;
    kvp__strset_t prepared;
    /* _pushes_to_prepare: an insertion-ordered map tid -> push spec */
    kvp_ec_push_spec_t *pushes;
    size_t n_pushes, cap_pushes;
    kvp__strmap_t push_index; /* tid -> (index + 1) */
    candidate_t *cands;
    size_t n_cands, cap_cands;
    bool drain_pending;
    int64_t drained_at;
    bool pending_work;
    uint64_t unresolved;
    kvp_ec_error_t err;
};

static inline kvp_status_t fail(kvp_ec_sched_t *s, kvp_ec_error_t e, kvp_status_t st)
{
    s->err = e;
    return st;
}

static inline kvp_status_t fail_st(kvp_ec_sched_t *s, kvp_status_t st)
{
    if (st == KVP_ERR_NO_MEMORY)
        return fail(s, KVP_EC_ERR_NO_MEMORY, st);
    if (st == KVP_ERR_STATE)
        return fail(s, KVP_EC_ERR_INVALID_TRANSITION, st);
    return fail(s, KVP_EC_ERR_RUNTIME, st);
}

static inline int64_t now_ms(kvp_ec_sched_t *s) { return s->clock.now_ms(s->clock.ctx); }

/* E1/E2 (ec_drain.c): drain the readiness inbox if it is due. */
kvp_status_t kvp__ec_sched_drain(kvp_ec_sched_t *s);
/* E8: cancel the transfer tid remotely (hash, req: for the log). */
kvp_status_t kvp__ec_sched_queue_cancel(kvp_ec_sched_t *s, const char *tid, const char *hash, const char *req);


kvp__ec_table_t *kvp__ec_sched_table(kvp_ec_sched_t *s);
const kvp__ec_table_t *kvp__ec_sched_table_view(const kvp_ec_sched_t *s);
size_t kvp__ec_sched_ready_size(const kvp_ec_sched_t *s);

#endif
