/*
 * The engine model: one vLLM V1 engine instance (ARCHITECTURE.md §6) that
 * uses the KV connector only through include/kvpool/kv_connector.h, calling
 * its hooks in vLLM's order (connectors-spec §4): per step the scheduler
 * asks get_num_new_matched_tokens for each waiting request it considers,
 * update_state_after_alloc after allocating, build_connector_meta once, and
 * request_finished when a request ends; every TP rank (a thread with its own
 * KV cache in host memory and its own worker) then runs load_now (sync
 * loads) before the forward pass, computes the step's KV, and calls
 * get_finished and get_block_ids_with_load_errors after it.  Rank 0's worker
 * hosts the lookup service (ZeroMQ over ipc) the scheduler's lookups go to.
 *
 * Time is virtual (engine_clock below); the replay (replay.c) drives every
 * instance through one shared clock.
 */
#ifndef KVP_ENGINE_ENGINE_H
#define KVP_ENGINE_ENGINE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/strmap.h"
#include "engine/report.h"
#include "kvpool/kv_connector.h"
#include "kvpool/pool.h"

/* A model preset: what a token's KV weighs (the same shapes as `kvpool
 * bench --kv-worker`); compute costs are the same for every preset. */
typedef struct kvp__eng_model {
    const char *name;
    uint32_t layers, kv_heads, head_dim, elem_bytes;
} kvp__eng_model_t;

/* tiny, small, llama8b-like; NULL if unknown. */
const kvp__eng_model_t *kvp__eng_model_find(const char *name);
/* K and V bytes of one token on one rank (heads split over min(tp, heads) ranks). */
uint64_t kvp__eng_model_token_bytes(const kvp__eng_model_t *m, uint32_t tp);

/* Blocks saved and not yet visible to lookups, shared by the instances of a
 * run: a block hash is visible from the virtual time its save completes
 * (the earliest, if saved twice). */
typedef struct kvp__eng_visible {
    pthread_mutex_t mu;
    kvp__strmap_t map; /* hash -> entry (arena) */
    kvp__arena_t arena;
} kvp__eng_visible_t;

kvp_status_t kvp__eng_visible_init(kvp__eng_visible_t *v);
void kvp__eng_visible_cleanup(kvp__eng_visible_t *v);
/* Blocks hashes[0..n) are visible from t_us on (or earlier, if they were). */
void kvp__eng_visible_mark(kvp__eng_visible_t *v, const uint8_t *hashes, int64_t n, double t_us);
/* Leading hashes of hashes[0..n) visible at time t_us. */
int64_t kvp__eng_visible_prefix(kvp__eng_visible_t *v, const uint8_t *hashes, int64_t n,
                                double t_us);

typedef struct kvp__eng_params {
    const kvp__eng_model_t *model;
    uint32_t index;          /* instance number (lookup port, names) */
    uint32_t tp;
    int64_t block_size;
    int64_t gpu_tokens;      /* KV cache per instance, in tokens */
    int64_t token_budget;    /* per step */
    int64_t max_num_seqs;
    double step_us;          /* fixed cost of a step (weights read) */
    double prefill_us_per_token, decode_us_per_token;
    double link_bytes_per_us; /* host <-> GPU link, per rank */
    double lookup_rtt_us;
    /* The connector; pool NULL: off (no hook is called). */
    kvp_pool_t *pool;
    kvp__eng_visible_t *visible;
    kvp_kv_role_t role;
    bool load_async, lookup_async;
    int load_policy;         /* kvp_kv_load_policy_t */
    const char *cache_prefix;
    const char *ipc_dir;     /* the lookup socket's directory */
    uint32_t pool_timeout_ms;
    uint64_t corrupt_every;  /* tests: flip a byte in every Nth block saved (0: never) */
} kvp__eng_params_t;

typedef struct kvp__eng kvp__eng_t;

/* One request of a run (owned by the replay, shared with its instance). */
typedef struct kvp__eng_req kvp__eng_req_t;
struct kvp__eng_req {
    uint64_t idx;              /* trace index */
    double arrival_us;
    int64_t prompt_len, output_len;
    int64_t *tokens;           /* prompt_len + output_len (owned; freed when finished) */
    uint8_t *hashes;           /* full blocks of tokens, 32 bytes each (owned) */
    int64_t max_hashes;
    kvp__replay_point_t *point;
    kvp__eng_req_t *next_arrival; /* the instance's arrival queue */
    void *priv;                /* the instance's state */
};

kvp_status_t kvp__eng_create(const kvp__eng_params_t *p, kvp__eng_t **eng_p);
void kvp__eng_destroy(kvp__eng_t *eng);

/* Hands a routed request to the instance (its arrival time is not earlier
 * than the last one's).  The instance frees tokens and hashes at the end. */
void kvp__eng_arrive(kvp__eng_t *eng, kvp__eng_req_t *req);
/* The virtual time of the instance's next step, or INFINITY when it has
 * nothing to do until another arrival. */
double kvp__eng_next_us(const kvp__eng_t *eng);
/* Runs the next step (at kvp__eng_next_us()).  Every step lasts at least
 * params.step_us.  Returns KVP_OK or a fatal error (logged). */
kvp_status_t kvp__eng_step(kvp__eng_t *eng);
/* Waits until every save issued whose virtual completion is below t_us has
 * really completed (the clock may then pass it).  Thread-safe against the
 * instance's own thread. */
void kvp__eng_settle_saves(kvp__eng_t *eng, double t_us);
/* The local prefix-cache hit of hashes[0..n), in blocks (the prefix router;
 * call only while the instance is not stepping). */
int64_t kvp__eng_local_hit(const kvp__eng_t *eng, const uint8_t *hashes, int64_t n);

typedef struct kvp__eng_stats {
    uint64_t requests, rejected, prompt_tokens, local_hit_tokens, pool_hit_tokens;
    uint64_t blocks_loaded, blocks_verified, corruptions, load_errors, save_errors;
    uint64_t lookup_errors, preemptions, steps, bytes_saved, bytes_loaded;
    uint64_t io_ns;            /* the workers' time in pool put and get calls */
    double last_token_us;
} kvp__eng_stats_t;
void kvp__eng_stats(const kvp__eng_t *eng, kvp__eng_stats_t *st);

#endif
