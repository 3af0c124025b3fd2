/*
 * The engine model's insides, shared by engine.c (the scheduler and the
 * step), rank.c (the TP ranks: KV caches, workers, the lookup service) and
 * visible.c (the lookup filter).
 *
 * Threads.  The instance's thread runs the scheduler and rank 0; ranks
 * 1..tp-1 are threads that run one phase at a time (rank_phase): the
 * instance fills `phase`, releases every rank, does rank 0's share and waits
 * for all.  While a phase runs, the ranks read the instance's state (the
 * request map, the requests' blocks) and write only their own rank_t; the
 * instance changes nothing but rank 0's share.
 */
#ifndef KVP_ENGINE_ENGINE_INT_H
#define KVP_ENGINE_ENGINE_INT_H

#include <pthread.h>

#include "common/arena.h"
#include "common/list.h"
#include "engine/blockpool.h"
#include "engine/engine.h"

/* A request's life in the instance (rq_set_state checks the moves). */
typedef enum rq_state {
    RQ_WAITING = 0,     /* queued: not scheduled yet, or preempted */
    RQ_WAITING_REMOTE,  /* blocks allocated, an async load in flight */
    RQ_RUNNING,         /* scheduled (prefill or decode) */
    RQ_FINISHING,       /* done; its blocks kept until its saves are sent */
    RQ_DONE,            /* its blocks freed */
} rq_state_t;

typedef struct rq {
    kvp__eng_req_t *r;
    char id[24];
    rq_state_t state;
    kvp__list_t node;          /* on waiting / running / finishing */
    int64_t num_tokens;        /* prompt + generated so far */
    int64_t num_out;           /* generated */
    int64_t num_computed;
    int64_t num_hashes;        /* full blocks of tokens hashed */
    int64_t *blocks;
    int64_t nblocks, cap_blocks;
    int64_t new_from;          /* first block allocated in this step */
    int64_t cached_blocks;     /* leading blocks registered in the prefix cache */
    kvp_kv_request_t view;
    bool counted;              /* its hits are in the stats (first admission) */
    bool resumed;              /* preempted before: the next scheduling resumes it */
    bool is_new;               /* scheduled for the first time in this step */
    int64_t scheduled;         /* tokens scheduled in this step */
    /* loads */
    int64_t load_from, load_to; /* tokens [from, to) loaded from the pool */
    bool load_sync;            /* loaded before this step's forward */
    bool load_issued;          /* the async load went to the workers */
    double load_done_us;       /* its virtual completion */
    uint32_t recv_count;       /* ranks that reported it done */
    int64_t rollback;          /* first failed token (INT64_MAX: none) */
    /* saves */
    int64_t save_blocks;       /* full blocks whose save was issued */
    double save_done_us;
    uint32_t send_count;
    bool sent_reported;        /* its id went to the workers as finished */
    bool count_pool;           /* its next load counts in pool_hit_tokens */
} rq_t;

typedef struct rank {
    struct kvp__eng *eng;
    uint32_t rank, key_rank;   /* tp rank, and the T of its keys */
    pthread_t th;
    bool started;
    uint8_t *mem;
    size_t mem_bytes;
    kvp_kv_worker_t *worker;
    kvp_kv_finished_t fin;     /* this phase's get_finished */
    int64_t *errs;             /* this phase's load errors (block ids) */
    size_t nerrs, cap_errs;
    uint64_t verified, corrupt;
    kvp_status_t st;
} rank_t;

/* One block to compute (fill) this step. */
typedef struct fill {
    int64_t block;
    const uint8_t *hash;
} fill_t;

typedef struct phase {
    const kvp_kv_meta_t *meta;   /* NULL: a poll (no step) */
    const char *const *finished;
    size_t num_finished;
    bool load_now;               /* sync loads first */
    rq_t *const *sync_loads;     /* whose loads to verify after load_now */
    size_t num_sync_loads;
    const fill_t *fills;
    size_t num_fills;
} phase_t;

/* One step's schedule (engine_sched.c fills it, engine.c runs it). */
typedef struct step {
    int64_t budget;
    bool preempted_any;
    rq_t **sched;             /* scheduled this step, in order */
    size_t nsched, cap_sched;
    const char **preempted;
    size_t npreempted, cap_preempted;
    rq_t **sync;              /* sync loads this step */
    size_t nsync, cap_sync;
    int64_t prefill_tokens, decode_tokens;
} step_t;

struct kvp__eng {
    kvp__eng_params_t p;
    uint64_t token_bytes;      /* per rank */
    size_t seg;                /* one layer's K (or V) of one block, per rank */
    int64_t num_blocks;
    kvp__bp_t bp;
    kvp__list_t waiting, running, finishing;
    kvp__strmap_t by_id;       /* id -> rq (live ones) */
    kvp__eng_req_t *arr_head, *arr_tail; /* routed, not yet arrived */
    double now_us, next_us;
    /* the connector (pool != NULL) */
    kvp_kv_sched_t *sched;
    kvp_kv_lookup_pool_t *lookup;
    kvp_kv_lookup_server_t *lookup_server;
    kvp_kv_lookup_zmq_t *zmq;
    kvp_kv_lookup_client_t filter;
    char model_name[32];
    rank_t *ranks;
    /* phases */
    pthread_mutex_t mu;
    pthread_cond_t go_cv, done_cv;
    uint64_t phase_gen;
    uint32_t phase_left;
    bool quit;
    phase_t phase;
    /* links: when each direction is free again (virtual) */
    double load_link_us, save_link_us;
    /* saves issued whose virtual completion has not been settled */
    pthread_mutex_t settle_mu;
    double unsettled_min_us;   /* INFINITY: none */
    uint64_t fills_done;
    kvp_hash_t none_hash;
    bool check;                /* KVP_ENGINE_CHECK: the books after every step */
    kvp__arena_t scratch;      /* this step's views */
    step_t step;               /* this step's schedule */
    /* step scratch */
    const char **finished_ids;
    size_t num_finished_ids, cap_finished_ids;
    rq_t **done_rqs;           /* finished last step: views alive until this step's meta */
    size_t num_done_rqs, cap_done_rqs;
    kvp__eng_stats_t stats;
};


/* engine.c: requests */
void kvp__rq_set_state(rq_t *q, rq_state_t to);
void kvp__rq_sync_view(rq_t *q);
void kvp__rq_release(struct kvp__eng *e, rq_t *q);
bool kvp__rq_grow_blocks(rq_t *q, int64_t n);
kvp_status_t kvp__rq_alloc(struct kvp__eng *e, rq_t *q, int64_t n);
void kvp__rq_free_blocks(struct kvp__eng *e, rq_t *q);
void kvp__rq_cache(struct kvp__eng *e, rq_t *q);
bool kvp__eng_push(void ***arr, size_t *n, size_t *cap, void *v);
/* engine_sched.c */
kvp_status_t kvp__eng_schedule_running(struct kvp__eng *e, step_t *s);
kvp_status_t kvp__eng_schedule_waiting(struct kvp__eng *e, step_t *s);

/* rank.c */
kvp_status_t kvp__eng_ranks_start(struct kvp__eng *e);
void kvp__eng_ranks_stop(struct kvp__eng *e);
/* Runs e->phase on every rank (rank 0 on the calling thread). */
kvp_status_t kvp__eng_ranks_run(struct kvp__eng *e);
/* visible.c: the scheduler's lookup client (the ZeroMQ one, capped by what
 * is visible at the instance's virtual time). */
kvp_kv_lookup_client_t kvp__eng_filter_client(struct kvp__eng *e);

#endif
