/*
 * kvpool KV connector, scheduler side (connectors-spec §2: the Mooncake store
 * connector's MooncakeStoreScheduler, rules K1–K18, re-implemented in C).
 *
 * The scheduler decides, per engine step, which requests load KV from the pool
 * and which save newly computed blocks to it.  It sees the engine only through
 * plain C views (kvp_kv_request_t, kvp_kv_sched_output_t) and talks to the
 * lookup service through an interface (kvp_kv_lookup_client_t) so that the
 * ZeroMQ client, an in-process pool lookup and any other implementation all
 * plug in.
 *
 * Fidelity.  By default every decision is exactly the original's, its three
 * quirks included (K9: a preempted id stays in the unfinished-id set; K12: a
 * running request that gets no new blocks in a step is not saved that step;
 * K13: a deferred load whose allocation reported 0 external tokens becomes a
 * save).  On a call the original would fail (an assertion, a KeyError, ...)
 * the C scheduler performs the same steps in the same order, stops at the same
 * point (keeping the effects made before it, as the original does), logs one
 * line and returns an error status; kvp_kv_sched_last_error() names the kind.
 * Nothing aborts; other requests keep being served.
 *
 * Threads.  A scheduler is used by one thread at a time (the engine's
 * scheduler loop), like the original.
 */
#ifndef KVPOOL_KV_CONNECTOR_H
#define KVPOOL_KV_CONNECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/hash.h"
#include "kvpool/pool.h"
#include "kvpool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVP_API
#define KVP_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------- */
/* Configuration and block sizes (§2.1, §2.2)                                */
/* ------------------------------------------------------------------------- */

typedef enum kvp_kv_role {
    KVP_KV_ROLE_PRODUCER = 0, /* kv_producer: saves, may load */
    KVP_KV_ROLE_CONSUMER = 1, /* kv_consumer: loads only, never saves */
    KVP_KV_ROLE_BOTH = 2,     /* kv_both */
} kvp_kv_role_t;

/* Parses "kv_producer" / "kv_consumer" / "kv_both". KVP_ERR_BAD_CONFIG otherwise. */
KVP_API kvp_status_t kvp_kv_role_parse(const char *s, kvp_kv_role_t *role_p);
/* "kv_producer" etc.; never NULL. */
KVP_API const char *kvp_kv_role_name(kvp_kv_role_t role);

/* What a KV-cache group is (vLLM's KVCacheSpec families), the one enum for
 * both uses: the block sizes of §2.2 (kvp_kv_resolve_block_sizes: only Mamba
 * is special there) and the store keys' replication factor of §2.3
 * (kvp_kv_store_key_replication_factor: full and sliding-window attention
 * share the MHA/GQA rule, MLA and Mamba have their own). */
typedef enum kvp_kv_group_kind {
    KVP_KV_GROUP_FULL_ATTENTION = 0, /* MHA/GQA full attention */
    KVP_KV_GROUP_SLIDING_WINDOW = 1, /* MHA/GQA sliding-window attention */
    KVP_KV_GROUP_MAMBA = 2,          /* Mamba state */
    KVP_KV_GROUP_MLA = 3,            /* pure MLA (full attention): one latent for all TP ranks */
} kvp_kv_group_kind_t;

typedef struct kvp_kv_cache_group {
    kvp_kv_group_kind_t kind;
    int64_t block_size;      /* tokens per block of this group (> 0) */
    bool mamba_align_mode;   /* Mamba only: mamba_cache_mode == "align" */
    int64_t sliding_window;  /* sliding-window only: the window in tokens (> 0) */
    bool is_eagle_group;     /* the group holds the EAGLE drafter's layers */
} kvp_kv_cache_group_t;

/* Inputs of resolve_kv_cache_block_sizes besides the groups.  size: set to
 * sizeof(kvp_kv_block_params_t) (see kvp_kv_config_t). */
typedef struct kvp_kv_block_params {
    uint32_t size;
    int64_t cache_block_size;   /* cache_config.block_size (> 0) */
    int64_t hash_block_size;    /* cache_config.hash_block_size; 0 = not set */
    int64_t dcp_size, pcp_size; /* decode/prefill context parallel sizes (>= 1) */
    bool prefix_caching;        /* enable_prefix_caching */
    bool kv_connector;          /* a KV connector is configured (true for us) */
} kvp_kv_block_params_t;

typedef struct kvp_kv_block_sizes {
    int64_t block_size;      /* scheduler block size (the save/load unit) */
    int64_t hash_block_size; /* granularity of request block hashes */
    bool partial_hits;       /* partial_hash_hits_enabled(): lookups at hash granularity */
} kvp_kv_block_sizes_t;

/*
 * Derives (scheduler block size, hash block size, partial-hit flag) from the
 * KV-cache groups as vLLM does (§2.2):
 *   - 0 or 1 group: both sizes = cache_block_size * dcp * pcp.
 *   - several groups: dcp or pcp != 1 is an error; scheduler = lcm of group
 *     sizes; hash = scheduler if neither prefix caching nor a connector is on,
 *     or if a Mamba group's block size differs from cache_block_size (not
 *     "align" mode); else hash_block_size if set, else gcd of group sizes, and
 *     then every group size must be divisible by hash.
 *   - partial_hits: some Mamba group in align mode with block_size > hash.
 * [in] groups: n entries (may be NULL when n == 0). [out] out_p.
 * Returns KVP_OK, KVP_ERR_NULL_POINTER, KVP_ERR_BAD_CONFIG (logged),
 * KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (params->size, as for the config).
 */
KVP_API kvp_status_t kvp_kv_resolve_block_sizes(const kvp_kv_cache_group_t *groups, size_t n,
                                                const kvp_kv_block_params_t *params,
                                                kvp_kv_block_sizes_t *out_p);

/* Load or recompute (rule F1, kv_sched.c): whether the scheduler answers
 * every pool hit with a load (ALWAYS: the original's decisions, exactly) or
 * only a hit whose predicted load time is below the prefill time it replaces
 * (FASTER; the costs are kvp_kv_config_t's load_* / prefill_us_per_token /
 * lookup_rtt_us and the bandwidth of kvp_kv_sched_set_load_bandwidth). */
typedef enum kvp_kv_load_policy {
    KVP_KV_LOAD_ALWAYS = 0,
    KVP_KV_LOAD_FASTER = 1,
} kvp_kv_load_policy_t;

/* Parses "always" / "faster". KVP_ERR_NULL_POINTER; KVP_ERR_BAD_CONFIG
 * (logged) otherwise. */
KVP_API kvp_status_t kvp_kv_load_policy_parse(const char *s, kvp_kv_load_policy_t *policy_p);
/* "always" / "faster"; "unknown" for another value; never NULL. */
KVP_API const char *kvp_kv_load_policy_name(kvp_kv_load_policy_t policy);

/* Scheduler configuration.  Initialise with kvp_kv_config_init() (defaults of
 * §2.1, and size) and set what differs.
 * size: sizeof(kvp_kv_config_t) as the caller's header declares it.  New
 * fields are only ever appended; the library takes the defaults for the
 * fields past an older caller's size.  A size below sizeof(uint32_t) (0
 * included) is KVP_ERR_INVALID_ARG, one above this library's struct (a newer
 * caller) KVP_ERR_VERSION, from every call that takes the config. */
typedef struct kvp_kv_config {
    uint32_t size;             /* set by kvp_kv_config_init */
    kvp_kv_role_t kv_role;     /* default KVP_KV_ROLE_BOTH */
    bool load_async;           /* default true: 2nd return of get_num_new_matched_tokens */
    bool lookup_async;         /* default false: lookups are non-blocking */
    bool enable_lookup;        /* default true: false answers (0, false) without lookup */
    int64_t block_size;        /* scheduler block size, default 16 */
    int64_t hash_block_size;   /* default 16; block_size must be a multiple of it */
    bool partial_hits;         /* default false; needs block_size > hash_block_size */
    const char *model_name;    /* copied; NULL = "" (store keys, §2.3) */
    const char *cache_prefix;  /* copied; NULL = "" */
    int32_t tp_size, pp_size, pcp_size, dcp_size; /* default 1 each */
    int32_t num_kv_heads;      /* default 1 */
    bool use_mla;              /* default false */
    /* Quirk switches (all false = the original's decisions, exactly).
     * fix_k12_save_without_new_blocks: a running request in prefill whose
     * step brought no new blocks still grows its token_len and is saved when
     * it crosses a block boundary (the original skips it; see kv_sched.c,
     * "K12 quirk").  K9 and K13 have no switch: their effects on workers
     * are benign (K9: a preempted id stays listed until the request
     * finishes; K13: the odd save carries the stored ids `()`, so there is
     * no block to write). */
    bool fix_k12_save_without_new_blocks;
    /* Load or recompute (rule F1).  load_policy: default KVP_KV_LOAD_ALWAYS
     * (a caller whose size stops before it gets ALWAYS).  The other four are
     * read only with KVP_KV_LOAD_FASTER, where validate wants them finite,
     * prefill_us_per_token > 0 and the rest >= 0. */
    kvp_kv_load_policy_t load_policy;
    double prefill_us_per_token;   /* modelled prefill cost of one token, default 40.0 */
    uint64_t load_bytes_per_token; /* KV bytes of one token over all that this scheduler's
                                    * requests load (every rank, layer, group); 0 = unknown
                                    * (default): every hit is loaded */
    double load_bytes_per_s;       /* initial load bandwidth estimate, of the same bytes (so
                                    * that bytes / bandwidth is one token's load time);
                                    * 0 = unknown (default) */
    double lookup_rtt_us;          /* modelled lookup round trip, default 100.0 */
} kvp_kv_config_t;

/* Fills the defaults into the first `size` bytes of cfg (which it never
 * writes past) and sets cfg->size = size.  Call it as kvp_kv_config_init(). */
KVP_API void kvp_kv_config_init_size(kvp_kv_config_t *cfg, size_t size);
/* The caller's own sizeof, compiled into the caller. */
static inline void kvp_kv_config_init(kvp_kv_config_t *cfg) { kvp_kv_config_init_size(cfg, sizeof *cfg); }
/* Checks a config: KVP_OK, KVP_ERR_NULL_POINTER, KVP_ERR_BAD_CONFIG (logged),
 * KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (size). */
KVP_API kvp_status_t kvp_kv_config_validate(const kvp_kv_config_t *cfg);

/* ------------------------------------------------------------------------- */
/* Plain views of the engine's objects                                       */
/* ------------------------------------------------------------------------- */

/* One list of block ids. */
typedef struct kvp_kv_ids {
    const int64_t *ids; /* n entries; may be NULL when n == 0 */
    size_t n;
} kvp_kv_ids_t;

/* Block ids per KV-cache group (vLLM's tuple of lists).  num_groups == 0 is
 * the empty tuple, and also stands for None where vLLM allows None. */
typedef struct kvp_kv_blocks {
    const kvp_kv_ids_t *groups;
    uint32_t num_groups;
} kvp_kv_blocks_t;

/*
 * A live request (vLLM's Request).  Owned by the caller.  Like the original,
 * which keeps references to the engine's Request objects, the scheduler keeps
 * a pointer to the view passed to update_state_after_alloc and reads it again
 * in later steps: the caller keeps that view alive and current (its counts and
 * arrays) until build_connector_meta has processed the id in finished_req_ids
 * (or the scheduler is destroyed).  Block hashes are opaque: hash_len bytes
 * each, contiguous; block_hashes may be NULL when hash_len is 0 (a count-only
 * view, e.g. the replay tool).
 */
typedef struct kvp_kv_request {
    const char *req_id;          /* NUL-terminated */
    int64_t num_tokens;
    int64_t num_computed_tokens;
    const int64_t *all_token_ids;
    size_t num_all_token_ids;
    const uint8_t *block_hashes;
    size_t num_block_hashes;
    uint32_t hash_len;
} kvp_kv_request_t;

/* num_scheduled_tokens value meaning "no entry for this id" (the original's
 * dict lookup fails: KeyError). */
#define KVP_KV_NO_ENTRY INT64_MIN

/* NewRequestData. */
typedef struct kvp_kv_new_req {
    const char *req_id;
    int64_t num_computed_tokens;
    int64_t num_scheduled_tokens; /* KVP_KV_NO_ENTRY: missing */
    kvp_kv_blocks_t block_ids;
    const int64_t *prompt_token_ids;
    size_t num_prompt_token_ids;
    const int64_t *prefill_token_ids; /* used when has_prefill_token_ids (MRV2) */
    size_t num_prefill_token_ids;
    bool has_prefill_token_ids;
} kvp_kv_new_req_t;

/* One entry of CachedRequestData. */
typedef struct kvp_kv_cached_req {
    const char *req_id;
    int64_t num_computed_tokens;
    int64_t num_scheduled_tokens; /* KVP_KV_NO_ENTRY: missing */
    kvp_kv_blocks_t new_block_ids; /* num_groups 0: None or () */
    bool resumed;                  /* id in resumed_req_ids */
} kvp_kv_cached_req_t;

typedef struct kvp_kv_tail_offload {
    int64_t group_id;
    int64_t cow_block_id;
    int64_t boundary_tokens;
} kvp_kv_tail_offload_t;

/* Partial-tail offloads of one request (one entry of the step's dict). */
typedef struct kvp_kv_tail_req {
    const char *req_id;
    const kvp_kv_tail_offload_t *offloads;
    size_t num_offloads;
} kvp_kv_tail_req_t;

/* SchedulerOutput.  finished/preempted are sets: ids must not repeat. */
typedef struct kvp_kv_sched_output {
    const char *const *finished_req_ids;
    size_t num_finished;
    const char *const *preempted_req_ids;
    size_t num_preempted;
    const kvp_kv_new_req_t *new_reqs;
    size_t num_new_reqs;
    const kvp_kv_cached_req_t *cached_reqs;
    size_t num_cached_reqs;
    const kvp_kv_tail_req_t *partial_tails; /* in dict order; ids must not repeat */
    size_t num_partial_tails;
} kvp_kv_sched_output_t;

/* ------------------------------------------------------------------------- */
/* Connector metadata (scheduler -> every worker, each step)                 */
/* ------------------------------------------------------------------------- */

typedef struct kvp_kv_load_spec {
    int64_t vllm_cached_tokens;
    int64_t kvpool_cached_tokens;
    bool can_load;
} kvp_kv_load_spec_t;

#define KVP_KV_TRI_NONE (-1) /* is_last_chunk: None */

/* ReqMeta.  In a meta returned by build_connector_meta, block_ids and
 * token_ids are views of the tracker's own lists as they stand when the call
 * returns (the original's metas share the tracker's lists), and block_hashes
 * a view of the request view's hashes. */
typedef struct kvp_kv_req_meta {
    const char *req_id;
    int64_t token_len_chunk;
    kvp_kv_blocks_t block_ids;
    const uint8_t *block_hashes; /* num_block_hashes * hash_len bytes; may be NULL if hash_len 0 */
    size_t num_block_hashes;
    uint32_t hash_len;
    bool can_save;
    int8_t is_last_chunk;        /* 0, 1 or KVP_KV_TRI_NONE */
    bool has_load_spec;
    kvp_kv_load_spec_t load_spec;
    int64_t num_prompt_tokens;
    const int64_t *token_ids;    /* None when has_token_ids is false */
    size_t num_token_ids;
    bool has_token_ids;
    const kvp_kv_tail_offload_t *partial_tail_offloads; /* None when num == 0 */
    size_t num_partial_tail_offloads;
} kvp_kv_req_meta_t;

/* MooncakeStoreConnectorMetadata.  The id sets are in no particular order. */
typedef struct kvp_kv_meta {
    const char *const *unfinished_req_ids;
    size_t num_unfinished;
    const char *const *preempted_req_ids;
    size_t num_preempted;
    const kvp_kv_req_meta_t *requests;
    size_t num_requests;
} kvp_kv_meta_t;

/* Metadata wire format version (first element of the encoding). */
#define KVP_KV_META_VERSION 1u
/* Decoder bounds. */
#define KVP_KV_META_MAX_BYTES (256u << 20)
#define KVP_KV_META_MAX_ID_LEN 4096u

/*
 * Encodes a meta as msgpack (a versioned array; see kv_meta_codec.c).
 * [out] buf_p/len_p: the encoding, allocated; free with kvp_kv_meta_buf_free.
 * Returns KVP_OK, KVP_ERR_NULL_POINTER, KVP_ERR_NO_MEMORY.
 */
KVP_API kvp_status_t kvp_kv_meta_encode(const kvp_kv_meta_t *meta, uint8_t **buf_p, size_t *len_p);
KVP_API void kvp_kv_meta_buf_free(uint8_t *buf, size_t len);

/*
 * Decodes an encoding from an untrusted peer.  Every length and count is
 * bounded before use; bad input returns KVP_ERR_DECODE (or KVP_ERR_VERSION),
 * logs one line and allocates nothing.  [out] meta_p: one allocation owning
 * every array and string it points to; free with kvp_kv_meta_free().
 */
KVP_API kvp_status_t kvp_kv_meta_decode(const uint8_t *buf, size_t len, kvp_kv_meta_t **meta_p);
KVP_API void kvp_kv_meta_free(kvp_kv_meta_t *meta);

/* Deep equality of two metas (sets compared as sets); for tests. */
KVP_API bool kvp_kv_meta_equal(const kvp_kv_meta_t *a, const kvp_kv_meta_t *b);

/* ------------------------------------------------------------------------- */
/* Lookup client interface (§2.4)                                            */
/* ------------------------------------------------------------------------- */

/*
 * What the scheduler needs from LookupKeyClient.  Implementations: the
 * ZeroMQ client (next issue) and an in-process pool lookup.  The scheduler
 * does not own the client.
 *
 * lookup: hit length in tokens for the request's prefix.  KVP_OK with *hit_p
 *   set; KVP_INPROGRESS when non_block is set and the answer is not there yet
 *   (the original's None: the scheduler answers "ask again"; a later call for
 *   the same id reuses the in-flight lookup); any error is treated as a hit of
 *   0 (the original client logs and returns 0).
 * discard: forget/cancel any in-flight lookup of req_id.
 * reset: remove everything from the store; KVP_OK with *ack_p (true = ACK),
 *   or an error (the scheduler answers false).
 */
typedef struct kvp_kv_lookup_ops {
    kvp_status_t (*lookup)(void *ctx, const kvp_kv_request_t *req, bool non_block, int64_t *hit_p);
    void (*discard)(void *ctx, const char *req_id);
    kvp_status_t (*reset)(void *ctx, bool *ack_p);
} kvp_kv_lookup_ops_t;

typedef struct kvp_kv_lookup_client {
    const kvp_kv_lookup_ops_t *ops;
    void *ctx;
} kvp_kv_lookup_client_t;

/* ------------------------------------------------------------------------- */
/* The scheduler                                                             */
/* ------------------------------------------------------------------------- */

typedef struct kvp_kv_sched kvp_kv_sched_t;

/* Which exception the original raises where the C scheduler failed. */
typedef enum kvp_kv_err_kind {
    KVP_KV_ERR_NONE = 0,
    KVP_KV_ERR_ASSERTION, /* an assert of the original (K7, K11, K14) */
    KVP_KV_ERR_KEY,       /* a missing dict entry (tracker, num_scheduled_tokens) */
    KVP_KV_ERR_VALUE,     /* not in _unfinished_requests; group count mismatch */
    KVP_KV_ERR_TYPE,      /* resumed request not in _unfinished_requests */
    KVP_KV_ERR_OTHER,     /* out of memory etc. */
} kvp_kv_err_kind_t;

/* "AssertionError", "KeyError", "ValueError", "TypeError", "Error", "" */
KVP_API const char *kvp_kv_err_kind_name(kvp_kv_err_kind_t kind);

/*
 * Creates a scheduler.  [in] cfg (copied), client (not owned; must outlive the
 * scheduler).  Returns KVP_OK, KVP_ERR_NULL_POINTER, KVP_ERR_BAD_CONFIG,
 * KVP_ERR_NO_MEMORY.
 */
KVP_API kvp_status_t kvp_kv_sched_create(const kvp_kv_config_t *cfg, kvp_kv_lookup_client_t client,
                                         kvp_kv_sched_t **sched_p);
KVP_API void kvp_kv_sched_destroy(kvp_kv_sched_t *sched);

/* The kind and message of the last failed call's error (KVP_KV_ERR_NONE after
 * a call that succeeded).  The message is owned by the scheduler. */
KVP_API kvp_kv_err_kind_t kvp_kv_sched_last_error(const kvp_kv_sched_t *sched, const char **msg_p);

/*
 * get_num_new_matched_tokens (K1–K5, and F1 with KVP_KV_LOAD_FASTER: a hit
 * whose load is predicted no faster than recomputing it answers (0, false)
 * and writes no LoadSpec, as K4).  [out] num_p: tokens to load from the
 * pool, or -1 for "not known yet" (async lookup in flight: ask again on a
 * later step); [out] load_async_p: whether the load is asynchronous.
 * Returns KVP_OK or KVP_ERR_NULL_POINTER / KVP_ERR_NO_MEMORY.
 */
KVP_API kvp_status_t kvp_kv_sched_get_num_new_matched_tokens(kvp_kv_sched_t *sched,
                                                             const kvp_kv_request_t *req,
                                                             int64_t num_computed_tokens,
                                                             int64_t *num_p, bool *load_async_p);

/*
 * update_state_after_alloc (K6, K7).  [in] req is kept (see kvp_kv_request_t);
 * blocks is copied.  Returns KVP_OK; KVP_ERR_STATE (ASSERTION) when
 * num_external_tokens does not match the pending load (K6 has been applied).
 */
KVP_API kvp_status_t kvp_kv_sched_update_state_after_alloc(kvp_kv_sched_t *sched,
                                                           const kvp_kv_request_t *req,
                                                           const kvp_kv_blocks_t *blocks,
                                                           int64_t num_external_tokens);

/*
 * build_connector_meta (K8–K14).  [out] meta_p: owned by the scheduler, valid
 * until the next build_connector_meta, reset_cache or destroy; its block-hash
 * pointers are views of the request views (valid while those are).
 * Returns KVP_OK; on a call the original fails (KVP_ERR_NOT_FOUND: KeyError,
 * KVP_ERR_STATE: assertion/ValueError/TypeError, KVP_ERR_INVALID_ARG: group
 * count mismatch) *meta_p is NULL and the effects made before the failing step
 * stay, as in the original.
 */
KVP_API kvp_status_t kvp_kv_sched_build_connector_meta(kvp_kv_sched_t *sched,
                                                       const kvp_kv_sched_output_t *so,
                                                       const kvp_kv_meta_t **meta_p);

/*
 * request_finished (K15–K17).  [out] delay_p: true when the engine must keep
 * the request's blocks until the worker reports it in done_sending.
 * block_ids: the request's blocks per group (only counted).
 */
KVP_API kvp_status_t kvp_kv_sched_request_finished(kvp_kv_sched_t *sched, const char *req_id,
                                                   const kvp_kv_blocks_t *block_ids, bool *delay_p);
/* request_finished_all_groups: same decision, blocks given as one flat count. */
KVP_API kvp_status_t kvp_kv_sched_request_finished_all_groups(kvp_kv_sched_t *sched,
                                                              const char *req_id,
                                                              size_t total_blocks, bool *delay_p);

/* reset_store (K18): asks the lookup service to drop everything.  [out] ok_p:
 * true on ACK, false on NACK or an RPC error (logged). */
KVP_API kvp_status_t kvp_kv_sched_reset_store(kvp_kv_sched_t *sched, bool *ok_p);

/* Connector-level reset_cache (K18, scenario 29): clears every pending load
 * spec, then reset_store.  The caller must have drained in-flight work. */
KVP_API kvp_status_t kvp_kv_sched_reset_cache(kvp_kv_sched_t *sched, bool *ok_p);

/*
 * The load bandwidth the worker measured recently, in bytes/s (rule F1; the
 * replay passes its modelled link).  It replaces the config's
 * load_bytes_per_s from the next get_num_new_matched_tokens on; 0 = unknown
 * (every hit is loaded).  Read only with KVP_KV_LOAD_FASTER.  Returns KVP_OK,
 * KVP_ERR_NULL_POINTER, KVP_ERR_INVALID_ARG (negative or not finite; the
 * bandwidth in use is kept).
 */
KVP_API kvp_status_t kvp_kv_sched_set_load_bandwidth(kvp_kv_sched_t *sched, double bytes_per_s);

/* Introspection (tests, stats). */
typedef struct kvp_kv_sched_stats {
    size_t num_load_specs;
    size_t num_trackers;
    size_t num_unfinished;     /* _unfinished_requests */
    size_t num_unfinished_ids; /* _unfinished_request_ids */
    uint64_t loads_declined;   /* F1: hits answered (0, false) because recomputing is faster */
    uint64_t tokens_declined;  /* F1: the tokens of those hits (need = hit - num_computed) */
} kvp_kv_sched_stats_t;
KVP_API void kvp_kv_sched_stats(const kvp_kv_sched_t *sched, kvp_kv_sched_stats_t *stats_p);

/* A request's tracker (RequestTracker), if any. */
typedef struct kvp_kv_tracker_info {
    int64_t token_len;
    int64_t num_saved_tokens;
    int64_t prefill_end_tokens;
    size_t num_token_ids;
    uint32_t num_groups;
    size_t num_blocks;  /* over all groups */
    bool has_pending_offload;
} kvp_kv_tracker_info_t;
/* KVP_OK and *info_p, or KVP_ERR_NOT_FOUND. */
KVP_API kvp_status_t kvp_kv_sched_tracker(const kvp_kv_sched_t *sched, const char *req_id,
                                          kvp_kv_tracker_info_t *info_p);
/* KVP_OK and *spec_p, or KVP_ERR_NOT_FOUND. */
KVP_API kvp_status_t kvp_kv_sched_load_spec(const kvp_kv_sched_t *sched, const char *req_id,
                                            kvp_kv_load_spec_t *spec_p);
/* Flags: 1 = in _unfinished_requests, 2 = in _unfinished_request_ids. */
KVP_API int kvp_kv_sched_membership(const kvp_kv_sched_t *sched, const char *req_id);

/* ------------------------------------------------------------------------- */
/* Store keys (§2.3)                                                         */
/* ------------------------------------------------------------------------- */

/*
 *     [cache_prefix@]model@tp_rank:T@pcp<P>@dcp<D>@pp_rank:<PP>@group:<G>@<hex>
 *
 * with model = the last path component of the model path (trailing "/"
 * removed) and hex = the lowercase hex of the chunk's block hash
 * (include/kvpool/hash.h).  Keys are parsed from the right: the hash and the
 * five numeric fields are fixed, and of what remains the text after the last
 * '@' is the model and everything before it the cache prefix.  So a cache
 * prefix MAY contain '@' (it still round-trips) but a model name may not.  A
 * model name is never empty and has no '/'; a present prefix is never empty
 * (an empty prefix means "no prefix", as in vLLM); neither holds control
 * characters or invalid UTF-8.  Every call validates its arguments first; bad
 * input returns a specific KVP_ERR_* status, logs one line and leaves the
 * outputs unspecified.  All calls are thread-safe (no shared state).
 */

#define KVP_KV_STORE_KEY_MAX 512u /* bytes, the pool's key limit (pool.h KVP_KEY_MAX) */

/* The fields of a store key.  For kvp_kv_store_key_format every field is
 * [in]; kvp_kv_store_key_parse fills it with views into the parsed string (the
 * cache_prefix and model_name pointers stay valid as long as that string). */
typedef struct kvp_kv_store_key {
    const char *cache_prefix; /* NULL or empty (len 0): no prefix */
    size_t cache_prefix_len;
    const char *model_name;   /* the model's last path component (kvp_kv_store_key_model_name) */
    size_t model_name_len;
    uint32_t tp_rank;         /* T = tp_rank / replication factor */
    uint32_t pcp_rank;
    uint32_t dcp_rank;
    uint32_t pp_rank;
    uint32_t group_id;
    kvp_hash_t hash;          /* the chunk's block hash, 1..32 bytes */
} kvp_kv_store_key_t;

/* Formats `key` into buf (NUL-terminated).
 *   [in]  key
 *   [out] buf[buf_size]; len_p (may be NULL): the key length without the
 *         NUL, also set (to the length needed) on KVP_ERR_BUFFER_TOO_SMALL
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG (empty model
 * name or one with '@' or '/', a control character in prefix or model, hash
 * length 0 or > 32); KVP_ERR_KEY_LENGTH (key over KVP_KV_STORE_KEY_MAX);
 * KVP_ERR_BUFFER_TOO_SMALL (buf_size < length + 1; buf untouched). */
KVP_API kvp_status_t kvp_kv_store_key_format(const kvp_kv_store_key_t *key, char *buf,
                                             size_t buf_size, size_t *len_p);

/* Parses a store key str[0..len) (no NUL needed) strictly: exact field
 * names, decimal numbers without sign or leading zeros that fit 32 bits,
 * a lowercase hex hash of 2..64 even digits.
 *   [out] key_p: views into str (see kvp_kv_store_key_t)
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_KEY_LENGTH (len 0 or over
 * KVP_KV_STORE_KEY_MAX); KVP_ERR_DECODE (anything malformed). */
KVP_API kvp_status_t kvp_kv_store_key_parse(const char *str, size_t len, kvp_kv_store_key_t *key_p);

/* The model name of a model path: its last '/'-separated component after
 * removing trailing '/' ("/m/Llama-3/" -> "Llama-3").  A view into path.
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG (nothing left,
 * e.g. "" or "///"). */
KVP_API kvp_status_t kvp_kv_store_key_model_name(const char *path, size_t len,
                                                 const char **name_p, size_t *name_len_p);

/* The replication factor of a KV cache group (§2.3): 1 for Mamba groups or
 * when dcp_size > 1; tp_size for pure MLA; otherwise (full or sliding-window
 * attention) max(1, tp_size / num_kv_heads).  The key's T is tp_rank / factor.
 *   [in] kind, tp_size >= 1, num_kv_heads (>= 1 for attention), dcp_size >= 1
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG. */
KVP_API kvp_status_t kvp_kv_store_key_replication_factor(kvp_kv_group_kind_t kind,
                                                         uint32_t tp_size, uint32_t num_kv_heads,
                                                         uint32_t dcp_size, uint32_t *factor_p);

/* ------------------------------------------------------------------------- */
/* In-process pool lookup (§2.4)                                             */
/* ------------------------------------------------------------------------- */

/*
 * A kvp_kv_lookup_ops_t over a pool opened with include/kvpool/pool.h: what
 * the worker rank 0 answers on the lookup channel (§2.4, "How the worker
 * computes a hit"), computed in the calling process.  A lookup turns the
 * request's block hashes into one store key per (group, chunk, rank
 * namespace) (§2.3), asks the pool in one batch (kvp_pool_exists or
 * kvp_pool_prefix), and returns the hit length in tokens under the
 * every-rank rule (a chunk counts only if every namespace stored it), the
 * hybrid rule (several groups: the fixed point of the per-group maxima of
 * vLLM's hybrid coordinator; sliding-window and Mamba groups need only their
 * tail chunks; EAGLE drops the last block), partial hits at hash-block
 * granularity (a Mamba group in align mode with block_size > hash block
 * size), and the last-token rule (a hit covering the whole prompt is cut to
 * align(num_tokens - 1)).  See src/kv/kv_lookup_pool.c and src/kv/kv_coord.c.
 *
 * Every answer is computed at once, so lookup never returns KVP_INPROGRESS
 * and discard has nothing to cancel.  reset removes every object of the pool
 * (kvp_pool_remove_all, the RESET of §2.4).  Lookups and queries are used by
 * one thread at a time; stats may be read from any thread.
 */
typedef struct kvp_kv_lookup_pool kvp_kv_lookup_pool_t;

/* What the keys and the hit rule need.  Initialise with
 * kvp_kv_lookup_pool_params_init() (it sets `size` and the defaults) and set
 * what differs.  size: as for kvp_kv_config_t (fields past an older caller's
 * size take their defaults). */
typedef struct kvp_kv_lookup_pool_params {
    uint32_t size;            /* sizeof(kvp_kv_lookup_pool_params_t) of the caller's header */
    const char *model_name;   /* model path or name (its last component is used); required */
    const char *cache_prefix; /* NULL or "": no prefix */
    uint32_t tp_size;         /* default 1 each; >= 1 */
    uint32_t pp_size;
    uint32_t pcp_size;
    uint32_t dcp_size;        /* >= 1 and divides tp_size */
    uint32_t num_kv_heads;    /* default 1; >= 1 (ignored for MLA) */
    /* The KV-cache groups, in group-id order (copied).  NULL / 0: one group
     * of kind group_kind and block size block_size. */
    const kvp_kv_cache_group_t *groups;
    uint32_t num_groups;
    kvp_kv_group_kind_t group_kind; /* default FULL_ATTENTION (used when groups is NULL) */
    int64_t block_size;       /* scheduler block size (lcm of the group sizes), default 16 */
    int64_t hash_block_size;  /* default 16; divides every group's block size */
    bool use_eagle;           /* speculative decoding with EAGLE (drops the last block) */
} kvp_kv_lookup_pool_params_t;

KVP_API void kvp_kv_lookup_pool_params_init(kvp_kv_lookup_pool_params_t *params);

/* Why a lookup's hit stopped where it did (`kvpool lookup -v`, the stats). */
typedef enum kvp_kv_miss_reason {
    KVP_KV_MISS_NONE = 0,          /* every probed block present: the hashes or tokens ended */
    KVP_KV_MISS_NO_HASHES,         /* the request carried no block hashes */
    KVP_KV_MISS_TOO_SHORT,         /* fewer tokens than one lookup unit */
    KVP_KV_MISS_MISSING_BLOCK,     /* block `block_index` of `group_id` is on no namespace */
    KVP_KV_MISS_RANK_MISSING,      /* ... is on some namespaces, not on the one named */
    KVP_KV_MISS_CAPPED_LAST_TOKEN, /* all present; cut so the last prompt token is recomputed */
    KVP_KV_MISS_POOL_ERROR,        /* the pool (or the lookup's memory) failed: a hit of 0 */
    KVP_KV_MISS__COUNT
} kvp_kv_miss_reason_t;

/* "none", "no_hashes", "too_short", "missing_block", "rank_missing",
 * "capped_last_token", "pool_error"; "unknown" otherwise. */
KVP_API const char *kvp_kv_miss_reason_name(kvp_kv_miss_reason_t reason);

/* One lookup's answer, with its reason. */
typedef struct kvp_kv_lookup_result {
    int64_t hit_tokens;
    kvp_kv_miss_reason_t reason;
    uint32_t group_id;        /* MISSING_BLOCK / RANK_MISSING: the group ... */
    int64_t block_index;      /* ... and its block (in that group's block size); else -1 */
    uint32_t tp_rank, pcp_rank, dcp_rank, pp_rank; /* RANK_MISSING: a namespace lacking it */
    uint64_t keys_probed;     /* keys asked of the pool */
} kvp_kv_lookup_result_t;

/* Creates a pool lookup.  [in] pool (not owned; must outlive the lookup),
 * params (copied).  Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_BAD_CONFIG
 * (a size or rank count out of range, groups the hybrid rule refuses, a
 * model name or prefix the key format refuses; logged); KVP_ERR_NO_MEMORY;
 * KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (params->size). */
KVP_API kvp_status_t kvp_kv_lookup_pool_create(kvp_pool_t *pool,
                                               const kvp_kv_lookup_pool_params_t *params,
                                               kvp_kv_lookup_pool_t **lookup_p);
KVP_API void kvp_kv_lookup_pool_destroy(kvp_kv_lookup_pool_t *lookup);
/* The client view of it (valid while lookup lives), for kvp_kv_sched_create. */
KVP_API kvp_kv_lookup_client_t kvp_kv_lookup_pool_client(kvp_kv_lookup_pool_t *lookup);

/* The lookup of the wire (§2.4): hashes are num_hashes * hash_len bytes at
 * hash_block_size granularity; apply_eagle as the LOOKUP frame's u8 (true
 * when the frame is absent).  Returns KVP_OK with *res_p (a pool error is
 * KVP_OK with reason POOL_ERROR and hit 0, as the original's "any exception
 * returns 0"); KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG (hash_len 0 or over
 * KVP_HASH_MAX_LEN with hashes present; logged). */
KVP_API kvp_status_t kvp_kv_lookup_pool_query(kvp_kv_lookup_pool_t *lookup, int64_t num_tokens,
                                              const uint8_t *hashes, size_t num_hashes,
                                              uint32_t hash_len, bool apply_eagle,
                                              kvp_kv_lookup_result_t *res_p);

typedef struct kvp_kv_lookup_stats {
    uint64_t lookups;
    uint64_t hit_tokens;       /* sum of the hits answered */
    uint64_t queried_tokens;   /* sum of num_tokens asked */
    uint64_t keys_probed;
    uint64_t resets;
    uint64_t reasons[KVP_KV_MISS__COUNT]; /* lookups by reason */
} kvp_kv_lookup_stats_t;
KVP_API void kvp_kv_lookup_pool_stats(const kvp_kv_lookup_pool_t *lookup,
                                      kvp_kv_lookup_stats_t *stats_p);

/* ------------------------------------------------------------------------- */
/* Lookup service over ZeroMQ (§2.4): server and client                      */
/* ------------------------------------------------------------------------- */

/*
 * The wire is vLLM's LookupKeyClient/LookupKeyServer, byte for byte:
 *   LOOKUP: multipart "lookup" / u32 BE num_tokens / u16 BE hash_len /
 *           hashes [/ u8 apply_eagle]  ->  u32 BE hit  (a client also
 *           accepts 4 + 8k bytes: the newer tail_key_boundaries)
 *   RESET:  "reset"  ->  "\x01" (OK) or "\x00" (error)
 * Unknown tags and malformed frames get "\x00" and one rate-limited log line.
 */

/* The ipc endpoint of §2.4:
 *   ipc://{base_path}/lookup_rpc_port_{rpc_port}_host_{hostname}_dp_rank{dp_rank}
 * hostname NULL: this host's name (gethostname).  Returns KVP_OK;
 * KVP_ERR_NULL_POINTER; KVP_ERR_BUFFER_TOO_SMALL; KVP_ERR_INVALID_ARG. */
KVP_API kvp_status_t kvp_kv_lookup_ipc_endpoint(const char *base_path, uint32_t rpc_port,
                                                const char *hostname, uint32_t dp_rank,
                                                char *buf, size_t buf_size);

typedef struct kvp_kv_lookup_server kvp_kv_lookup_server_t;

typedef struct kvp_kv_lookup_server_params {
    uint32_t size;                 /* set by kvp_kv_lookup_server_params_init (as for the config) */
    const char *endpoint;          /* "ipc://PATH" or "tcp://HOST:PORT" (HOST named, PORT 0 = any) */
    kvp_kv_lookup_pool_t *lookup;  /* not owned; answers LOOKUP; its pool is what RESET clears */
    /* RESET first calls drain (joins pending saves: kvp_kv_worker_drain), if set. */
    kvp_status_t (*drain)(void *arg);
    void *drain_arg;
    uint32_t max_hashes;           /* a LOOKUP with more is refused; default 1 << 20 */
} kvp_kv_lookup_server_params_t;

KVP_API void kvp_kv_lookup_server_params_init(kvp_kv_lookup_server_params_t *params);

/* Binds and starts answering (one thread).  ipc: the socket file is created
 * owner-only; an existing file is unlinked only when nothing answers on it
 * (a live server's socket is never stolen: KVP_ERR_BUSY).  tcp: binds only
 * the host named (no wildcard).  Returns KVP_OK; KVP_ERR_NULL_POINTER;
 * KVP_ERR_BAD_CONFIG / KVP_ERR_BAD_URI (endpoint; logged); KVP_ERR_BUSY;
 * KVP_ERR_IO (bind failed; logged); KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_kv_lookup_server_start(const kvp_kv_lookup_server_params_t *params,
                                                kvp_kv_lookup_server_t **server_p);
/* Stops answering, closes the socket (an ipc file it created is unlinked). */
KVP_API void kvp_kv_lookup_server_stop(kvp_kv_lookup_server_t *server);
/* The bound endpoint (a tcp port 0 resolved), owned by the server. */
KVP_API const char *kvp_kv_lookup_server_endpoint(const kvp_kv_lookup_server_t *server);

typedef struct kvp_kv_lookup_server_stats {
    uint64_t requests;     /* messages received */
    uint64_t lookups;      /* well-formed LOOKUPs answered */
    uint64_t resets;       /* RESETs (ACK or NACK) */
    uint64_t bad_frames;   /* malformed LOOKUPs answered "\x00" */
    uint64_t unknown_tags; /* unknown first frames answered "\x00" */
} kvp_kv_lookup_server_stats_t;
KVP_API void kvp_kv_lookup_server_stats(const kvp_kv_lookup_server_t *server,
                                        kvp_kv_lookup_server_stats_t *stats_p);

/* Prometheus text of the server's and its lookup's counters (kvpool_lookup_*),
 * NUL-terminated, into buf.  [out] len_p: the length (also the length needed
 * on KVP_ERR_BUFFER_TOO_SMALL). */
KVP_API kvp_status_t kvp_kv_lookup_server_metrics(const kvp_kv_lookup_server_t *server, char *buf,
                                                  size_t buf_size, size_t *len_p);

/* The ZeroMQ client (REQ), a kvp_kv_lookup_client_t with LookupKeyClient's
 * semantics: one I/O thread serialises the socket; one in-flight lookup per
 * request id, which later calls for that id reuse (their arguments are
 * ignored); non_block answers KVP_INPROGRESS while it is not done; an error
 * or a timeout counts as a hit of 0 (logged); discard cancels; reset goes
 * through the same thread.  Every call has a deadline (timeout_ms): a dead
 * server costs a miss, not a hang, and a timed-out REQ socket is replaced. */
typedef struct kvp_kv_lookup_zmq kvp_kv_lookup_zmq_t;

typedef struct kvp_kv_lookup_zmq_params {
    uint32_t size;        /* set by kvp_kv_lookup_zmq_params_init (as for the config) */
    const char *endpoint; /* ipc:// or tcp:// */
    uint32_t timeout_ms;  /* per call, default 2000 */
    bool send_eagle;      /* append the u8 apply_eagle frame (default false: 4 frames) */
    bool apply_eagle;     /* its value */
    uint32_t max_inflight; /* lookups queued or in flight; beyond: a hit of 0; default 4096 */
} kvp_kv_lookup_zmq_params_t;

KVP_API void kvp_kv_lookup_zmq_params_init(kvp_kv_lookup_zmq_params_t *params);
KVP_API kvp_status_t kvp_kv_lookup_zmq_create(const kvp_kv_lookup_zmq_params_t *params,
                                              kvp_kv_lookup_zmq_t **client_p);
KVP_API void kvp_kv_lookup_zmq_destroy(kvp_kv_lookup_zmq_t *client);
/* The client view (valid while client lives), for kvp_kv_sched_create. */
KVP_API kvp_kv_lookup_client_t kvp_kv_lookup_zmq_client(kvp_kv_lookup_zmq_t *client);
/* One blocking LOOKUP outside the per-request table (the CLI, benches).
 * Returns KVP_OK and *hit_p; KVP_ERR_TIMEOUT; KVP_ERR_DECODE (a bad reply);
 * KVP_ERR_IO. */
KVP_API kvp_status_t kvp_kv_lookup_zmq_query(kvp_kv_lookup_zmq_t *client, int64_t num_tokens,
                                             const uint8_t *hashes, size_t num_hashes,
                                             uint32_t hash_len, int64_t *hit_p);

typedef struct kvp_kv_lookup_zmq_stats {
    uint64_t lookups;      /* RPCs sent */
    uint64_t errors;       /* RPCs that failed (answered as a hit of 0) */
    uint64_t timeouts;     /* ... of which timed out */
    uint64_t reconnects;   /* REQ sockets replaced */
    uint64_t inflight;     /* lookups queued or in flight now */
} kvp_kv_lookup_zmq_stats_t;
KVP_API void kvp_kv_lookup_zmq_stats(const kvp_kv_lookup_zmq_t *client,
                                     kvp_kv_lookup_zmq_stats_t *stats_p);

/* ------------------------------------------------------------------------- */
/* Worker side (§2.7, W1–W8): saves and loads KV blocks                      */
/* ------------------------------------------------------------------------- */

/*
 * The worker executes the scheduler's ReqMetas against a pool: it saves newly
 * computed blocks of an engine's paged KV cache and loads hit blocks into it.
 * All I/O is queued in get_finished (W1) and done by one save thread and N
 * load threads, so it overlaps the engine's compute.  The value of one block
 * is one scatter list over every registered segment (§2.3).
 */
typedef struct kvp_kv_worker kvp_kv_worker_t;

/* How bytes move between the KV cache and buffers the pool can read/write.
 * direct: the KV cache is host memory the pool reads and writes in place
 * (kvp_kv_copy_host(): no staging).  Otherwise every block is staged through
 * a host bounce buffer with to_host (save) and from_host (load): the seam a
 * CUDA-staged copy plugs into without touching the rules. */
typedef struct kvp_kv_copy_ops {
    bool direct;
    kvp_status_t (*to_host)(void *ctx, void *host_dst, const void *cache_src, size_t len);
    kvp_status_t (*from_host)(void *ctx, void *cache_dst, const void *host_src, size_t len);
    void *ctx;
} kvp_kv_copy_ops_t;

/* Host memory, in place (the default). */
KVP_API const kvp_kv_copy_ops_t *kvp_kv_copy_host(void);

#define KVP_KV_TENSOR_MAX_DIMS 8u

/* One registered KV-cache tensor (a layer's paged cache, or the cross-layer
 * cache), as torch describes it: the storage it lives in and its view. */
typedef struct kvp_kv_cache_tensor {
    void *storage;            /* the storage's base (untyped_storage().data_ptr()) */
    size_t storage_bytes;     /* untyped_storage().nbytes() */
    uint32_t elem_size;       /* bytes per element */
    uint32_t ndim;            /* 1 .. KVP_KV_TENSOR_MAX_DIMS */
    int64_t shape[KVP_KV_TENSOR_MAX_DIMS];
    int64_t stride[KVP_KV_TENSOR_MAX_DIMS]; /* in elements */
} kvp_kv_cache_tensor_t;

typedef struct kvp_kv_worker_params {
    uint32_t size;            /* set by kvp_kv_worker_params_init (as for the config) */
    kvp_pool_t *pool;         /* not owned; must outlive the worker */
    kvp_kv_role_t role;       /* default BOTH; a consumer never saves */
    const char *model_name;   /* required (its last path component goes into keys) */
    const char *cache_prefix; /* NULL or "": none */
    uint32_t tp_rank, tp_size; /* default 0, 1 */
    uint32_t pp_rank, pp_size;
    uint32_t pcp_rank, pcp_size;
    uint32_t dcp_rank, dcp_size;
    uint32_t num_kv_heads;    /* total KV heads, default 1 */
    const kvp_kv_cache_group_t *groups; /* NULL / 0: one group of group_kind, block_size */
    uint32_t num_groups;
    kvp_kv_group_kind_t group_kind;     /* default FULL_ATTENTION */
    int64_t block_size;       /* scheduler block size, default 16 */
    int64_t hash_block_size;  /* default 16 */
    bool use_eagle;
    uint32_t num_load_threads;     /* default 2 (VLLM_MOONCAKE_LOAD_RECV_THREADS) */
    uint64_t max_save_bytes;       /* block bytes queued to the save thread; beyond, saves are
                                    * dropped and counted; default 1 GiB */
    uint64_t staging_budget_bytes; /* W6 staging budget per load batch; 0 = none */
    uint32_t timeout_ms;           /* per pool call; 0 = the pool's default */
    const kvp_kv_copy_ops_t *copy; /* NULL: kvp_kv_copy_host() */
} kvp_kv_worker_params_t;

KVP_API void kvp_kv_worker_params_init(kvp_kv_worker_params_t *params);

/* Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_BAD_CONFIG (logged);
 * KVP_ERR_NO_MEMORY; KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (params->size). */
KVP_API kvp_status_t kvp_kv_worker_create(const kvp_kv_worker_params_t *params,
                                          kvp_kv_worker_t **worker_p);
/* Joins the threads (queued work is finished first) and frees everything. */
KVP_API void kvp_kv_worker_destroy(kvp_kv_worker_t *worker);

/* register_kv_caches (W8): derives the segments from the strides (a dim whose
 * byte stride exceeds the page size, storage_bytes / num_blocks, splits the
 * storage into that many segments: K/V-first; none: one segment,
 * blocks-first or cross-layer), registers each distinct storage once with
 * kvp_pool_register, and starts the threads.  Called once.  Returns KVP_OK;
 * KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG (a tensor whose view leaves its
 * storage, storage not divisible into num_blocks pages, segments that
 * overlap or are misaligned; logged); KVP_ERR_STATE (called twice). */
KVP_API kvp_status_t kvp_kv_worker_register(kvp_kv_worker_t *worker,
                                            const kvp_kv_cache_tensor_t *tensors, size_t n,
                                            uint64_t num_blocks);

/* What get_finished reports: ids owned by the worker, valid until the next
 * get_finished or destroy. */
typedef struct kvp_kv_finished {
    const char *const *sending; /* done_sending (W5) */
    size_t num_sending;
    const char *const *recving; /* done_recving (W6) */
    size_t num_recving;
} kvp_kv_finished_t;

/* get_finished (W1-W6): queues this step's loads (W2) and saves (W3), then
 * reports what has finished.  meta may be NULL (no metas this step);
 * finished_ids: the engine's finished request ids of this step.  Block ids
 * outside the registered range make that ReqMeta fail (logged; its loads
 * are reported as load errors and the request as done_recving).  Returns
 * KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_STATE (not registered);
 * KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_kv_worker_get_finished(kvp_kv_worker_t *worker, const kvp_kv_meta_t *meta,
                                                const char *const *finished_ids, size_t num_finished,
                                                kvp_kv_finished_t *out_p);

/* Synchronous loads (load_async=False: the hit feeds this step's forward
 * pass; call it before the forward pass with the step's meta): queues the
 * meta's loads at once and waits until they are done.  Failed blocks are
 * load errors as usual; the requests are not reported in done_recving, and
 * the get_finished that follows with the same meta does not load them again.
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_STATE (not registered);
 * KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_kv_worker_load_now(kvp_kv_worker_t *worker, const kvp_kv_meta_t *meta);

/* get_block_ids_with_load_errors: every block id whose load failed since the
 * last call (missing key, wrong size, pool error, lost connection), then
 * cleared.  [out] ids_p: owned by the worker, valid until the next call. */
KVP_API kvp_status_t kvp_kv_worker_load_errors(kvp_kv_worker_t *worker, const int64_t **ids_p,
                                               size_t *n_p);

/* Blocks until every queued save has been handled (the RESET's join). */
KVP_API kvp_status_t kvp_kv_worker_drain(kvp_kv_worker_t *worker);

typedef struct kvp_kv_worker_stats {
    uint64_t blocks_saved;       /* blocks put (new) */
    uint64_t blocks_deduped;     /* blocks already in the pool (not put) */
    uint64_t blocks_loaded;      /* blocks got and verified */
    uint64_t load_errors;        /* blocks reported as load errors */
    uint64_t save_errors;        /* blocks whose put failed */
    uint64_t saves_dropped;      /* ReqMetas not queued: the save queue was full */
    uint64_t pressure_skips;     /* ReqMetas skipped for store pressure (W4) */
    uint64_t bytes_saved, bytes_loaded;
    uint64_t save_queue_depth;   /* ReqMetas queued to the save thread now */
    uint64_t save_queue_bytes;   /* their block bytes */
    uint64_t load_queue_depth;   /* ReqMetas queued to the load threads now */
    uint64_t save_ns;            /* time spent in the pool's put calls (bytes_saved / it: the
                                  * save bandwidth really reached) */
    uint64_t load_ns;            /* time spent in the pool's get calls, summed over load threads */
} kvp_kv_worker_stats_t;
KVP_API void kvp_kv_worker_stats(const kvp_kv_worker_t *worker, kvp_kv_worker_stats_t *stats_p);

/* Prometheus text of the worker's counters (kvpool_kv_worker_*), as
 * kvp_kv_lookup_server_metrics. */
KVP_API kvp_status_t kvp_kv_worker_metrics(const kvp_kv_worker_t *worker, char *buf,
                                           size_t buf_size, size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_KV_CONNECTOR_H */
