/*
 * The scheduler's transfer table (connectors-spec §3.3), following the seed's
 * own table (SchedulerTransferTable of vLLM's mooncake/state.py), as an
 * explicit state machine: one state enum (kvp_ec_state_t, public), one set-state
 * (kvp__ec_table_set_state) that rejects every transition not in the table,
 * and the operations the scheduler drives it with.
 *
 * Records keep three orders:
 *   - the record order (an OrderedDict in the original): insertion, and every
 *     transition moves the record to the end;
 *   - the insertion order (ins_seq, set once), the order expire() walks the
 *     non-terminal records in;
 *   - the hash index: per non-empty mm_hash, its ids in insertion order,
 *     with a count per state so "is any record of H in states S" is O(1);
 *   - the dispatch queue of LOADING records not yet handed to the workers.
 * A record lives in exactly one state; entering a terminal state (UNAVAILABLE,
 * EXPIRED, FAILED, CANCELLED) sets its deadline to now + 300 s, after which
 * expire() removes it (the tombstone that stops a late event from reviving a
 * cancelled transfer).  RESIDENT bytes are kept in a running sum so the
 * capacity check after a release is O(1), and eviction takes the head of the
 * RESIDENT list.  Because every record enters a terminal state at the
 * current (monotonic) time with the same TTL, each terminal state's list is
 * also sorted by deadline: expiry pops tombstones from the heads instead of
 * walking the whole table.
 */
#ifndef KVP_EC_TABLE_H
#define KVP_EC_TABLE_H

#include "common/list.h"
#include "common/strmap.h"
#include "kvpool/ec_connector.h"

/* A load spec held by a record (ECMooncakeLoadSpec). */
typedef struct {
    char *mm_hash;
    int64_t nbytes;
    int64_t *shape;
    size_t ndim;
    char *dtype;
    char *transfer_id;
    int64_t num_token;
    bool local;
} kvp__ec_spec_t;

typedef struct kvp__ec_hent kvp__ec_hent_t;

typedef struct kvp__ec_rec {
    char *tid;
    size_t tid_len;
    char *req;  /* "" when none */
    char *hash; /* "" when none (then not indexed) */
    kvp_ec_state_t state;
    kvp__ec_spec_t *spec; /* NULL = None */
    bool has_deadline;
    int64_t deadline;
    char **notified; /* requests told this record is unavailable */
    size_t n_notified, cap_notified;
    uint64_t seq;        /* position in record order (grows) */
    uint64_t ins_seq;    /* position in insertion order (set once) */
    kvp__list_t order;   /* on the table's record order */
    kvp__list_t hlink;   /* on its hash entry's records, in hash-index order */
    kvp__ec_hent_t *hent;
    kvp__list_t dlink;   /* on the dispatch queue, or unlinked */
    kvp__list_t slink;   /* on its state's list, in record order */
} kvp__ec_rec_t;

struct kvp__ec_hent {
    char *hash;
    kvp__list_t recs; /* kvp__ec_rec_t.hlink */
    uint32_t count[KVP_EC_NUM_STATES];
};

typedef struct {
    int64_t resident_capacity;
    int64_t tombstone_ttl_ms;
    kvp__strmap_t records; /* tid -> rec */
    kvp__strmap_t hashes;  /* hash -> hent */
    kvp__list_t order;    /* every record (kvp__ec_rec_t.order), oldest first */
    kvp__list_t dispatch; /* the dispatch queue (kvp__ec_rec_t.dlink) */
    /* one list per state, each in record order (a record joins the tail of
     * its new state's list when it moves to the end of the record order) */
    kvp__list_t states[KVP_EC_NUM_STATES];
    size_t n_terminal;
    __int128 resident_bytes;
    kvp__strset_t unavailable;
    /* ids retired to EXPIRED out of READY/RESIDENT, for drain_orphaned() */
    char **orphans;
    size_t n_orphans, cap_orphans;
    uint64_t version;
    uint64_t next_seq;
} kvp__ec_table_t;

typedef uint32_t kvp__ec_stateset_t; /* bit per state */
#define KVP__EC_S(st) (1u << (st))

static inline bool kvp__ec_state_terminal(kvp_ec_state_t s)
{
    return s == KVP_EC_UNAVAILABLE || s == KVP_EC_EXPIRED || s == KVP_EC_FAILED || s == KVP_EC_CANCELLED;
}

/* Is from -> to in the table (state.py's transitions)? */
bool kvp__ec_transition_allowed(kvp_ec_state_t from, kvp_ec_state_t to);

void kvp__ec_table_init(kvp__ec_table_t *t, int64_t resident_capacity, int64_t tombstone_ttl_ms);
void kvp__ec_table_cleanup(kvp__ec_table_t *t);

/* The one set-state: KVP_ERR_STATE (InvalidSchedulerTransferTransition) if
 * the transition is not in the table; nothing changes then.  Entering a
 * terminal state sets deadline = now + ttl.  Moves the record to the end. */
kvp_status_t kvp__ec_table_set_state(kvp__ec_table_t *t, kvp__ec_rec_t *r, kvp_ec_state_t to, int64_t now);

kvp__ec_rec_t *kvp__ec_table_get(const kvp__ec_table_t *t, const char *tid);
bool kvp__ec_table_has_state(const kvp__ec_table_t *t, const char *hash, kvp__ec_stateset_t states);

/* Operations (see the README of ecsched-ref for the exact semantics).  Each
 * returns KVP_OK or an error; *err_p (when given) names the class. */
kvp_status_t kvp__ec_table_wait_for_event(kvp__ec_table_t *t, const char *tid, const char *req, const char *hash,
                                          int64_t deadline, kvp__ec_rec_t **rec_p, kvp_ec_error_t *err_p);
/* Takes ownership of spec (freed on every path). */
kvp_status_t kvp__ec_table_observe_ready(kvp__ec_table_t *t, kvp__ec_spec_t *spec, int64_t deadline, bool *accepted_p,
                                         kvp_ec_error_t *err_p);
void kvp__ec_table_touch_available(kvp__ec_table_t *t, const char *tid, int64_t deadline);
kvp_status_t kvp__ec_table_begin_load(kvp__ec_table_t *t, const char *hash, const char *tid, const char *req,
                                      int64_t deadline, kvp__ec_rec_t **rec_p);
/* Fills *out (array of records, caller frees with kvp__free(out, n*sizeof)). */
kvp_status_t kvp__ec_table_take_loads(kvp__ec_table_t *t, kvp__ec_rec_t ***out_p, size_t *n_p);
kvp_status_t kvp__ec_table_complete_load(kvp__ec_table_t *t, const char *hash);
kvp_status_t kvp__ec_table_fail_load(kvp__ec_table_t *t, const char *hash, int64_t now);
kvp_status_t kvp__ec_table_release_ready(kvp__ec_table_t *t, const char *hash, int64_t now);
kvp_status_t kvp__ec_table_reclaim(kvp__ec_table_t *t, const char *hash, int64_t now);
kvp_status_t kvp__ec_table_mark_unavailable(kvp__ec_table_t *t, const char *tid, int64_t now);
kvp_status_t kvp__ec_table_cancel(kvp__ec_table_t *t, const char *tid, int64_t now, const char *hash, const char *req,
                                  bool *cancelled_p);
/* Non-terminal records past their deadline, in insertion order: AVAILABLE
 * -> EXPIRED, LOADING -> UNAVAILABLE (its request reported unavailable);
 * their ids are returned in that order (owned copies) for the caller to
 * cancel.  Then terminal ones past their deadline are removed, then the
 * terminal cap.  *out_p freed with kvp__ec_strv_free. */
kvp_status_t kvp__ec_table_expire(kvp__ec_table_t *t, int64_t now, int64_t terminal_limit, char ***out_p, size_t *n_p);
/* Moves the unavailable request set into *out (sorted). */
kvp_status_t kvp__ec_table_take_unavailable(kvp__ec_table_t *t, kvp__strset_t *into);
/* Every id release_ready / reclaim / eviction retired to EXPIRED since the
 * last call, in that order, unfiltered (an id may since have been removed,
 * re-created or cancelled; it may appear twice).  *out_p has *n_p slots: the
 * ids first, then NULLs; free with kvp__ec_strv_free. */
kvp_status_t kvp__ec_table_drain_orphaned(kvp__ec_table_t *t, char ***out_p, size_t *n_p);

void kvp__ec_strv_free(char **v, size_t n);
void kvp__ec_spec_free(kvp__ec_spec_t *s);
kvp__ec_spec_t *kvp__ec_spec_clone(const kvp__ec_spec_t *s);

#endif
