/*
 * kvpool EC (encoder-cache) connector: scheduler side.
 *
 * A C re-implementation of the scheduler half of vLLM's Mooncake
 * encoder-cache connector (connectors-spec §3: config §3.1, request params
 * §3.2, the transfer table §3.3, rules E1-E14 §3.4, control protocol §3.5).
 * It makes exactly the original's decisions: `kvpool ec-sched-replay`
 * replays a recorded stream through this API and must match the reference
 * (../shared/tools/ecsched-ref) byte for byte.
 *
 * Threading: a scheduler handle is used from one thread (vLLM's scheduler
 * loop).  The collaborators may run work elsewhere (the executor runs remote
 * cancels on its own threads), but every callback into them is made from the
 * thread that called the hook.
 *
 * Ownership: every `const char *` and view passed in is borrowed for the
 * duration of the call only; the scheduler copies what it keeps.  Every
 * output struct filled by a hook is owned by the caller and released with
 * its *_cleanup function.
 *
 * Errors: hooks return KVP_OK or a negative status.  Where the original
 * raised a Python exception the hook returns a status and
 * kvp_ec_sched_error() names the exception class the original raised
 * (kvp_ec_error_t), so callers that need the exact behaviour (the replay)
 * can tell IndexError from ValueError.  State after an error is what the
 * original left (changes made before the raise stay).  Nothing aborts on
 * bad input.
 */
#ifndef KVPOOL_EC_CONNECTOR_H
#define KVPOOL_EC_CONNECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVP_API
#define KVP_API __attribute__((visibility("default")))
#endif

/* ------------------------------------------------------------------------ */
/* Constants of the original (connectors-spec §3.1)                          */
/* ------------------------------------------------------------------------ */

#define KVP_EC_RESERVATION_TTL_MS 300000       /* lease and tombstone TTL */
#define KVP_EC_DRAIN_MIN_INTERVAL_MS 5         /* event-drain rate limit */
#define KVP_EC_MAX_PENDING_EVENTS 4096         /* partial shard-readiness LRU */
#define KVP_EC_MAX_TERMINAL_RECORDS 65536      /* terminal-record cap */
#define KVP_EC_CANCEL_ATTEMPTS 2
#define KVP_EC_MAX_UNRESOLVED_WARNINGS 5

/* ------------------------------------------------------------------------ */
/* Configuration (§3.1)                                                      */
/* ------------------------------------------------------------------------ */

typedef enum kvp_ec_dtype {
    KVP_EC_DTYPE_FLOAT32 = 0, /* itemsize 4 */
    KVP_EC_DTYPE_FLOAT16,     /* itemsize 2 */
    KVP_EC_DTYPE_BFLOAT16,    /* itemsize 2 */
    /* Appended (values never change): the other torch dtypes a push may carry. */
    KVP_EC_DTYPE_FLOAT64,     /* itemsize 8 */
    KVP_EC_DTYPE_INT8,        /* itemsize 1 */
    KVP_EC_DTYPE_UINT8,       /* itemsize 1 */
    KVP_EC_DTYPE_INT16,       /* itemsize 2 */
    KVP_EC_DTYPE_INT32,       /* itemsize 4 */
    KVP_EC_DTYPE_INT64,       /* itemsize 8 */
} kvp_ec_dtype_t;

/* "float32", "float16", "bfloat16", "float64", "int8", "uint8", "int16",
 * "int32", "int64" (no "torch." prefix); NULL if unknown. */
KVP_API const char *kvp_ec_dtype_name(kvp_ec_dtype_t dtype);
/* Parses a name with or without "torch."; KVP_ERR_BAD_CONFIG if unknown. */
KVP_API kvp_status_t kvp_ec_dtype_parse(const char *name, kvp_ec_dtype_t *dtype_p);
KVP_API int kvp_ec_dtype_itemsize(kvp_ec_dtype_t dtype);

/* size: sizeof(kvp_ec_config_t) as the caller's header declares it (set by
 * kvp_ec_config_init).  New fields are only ever appended; the library takes
 * the defaults for the fields past an older caller's size.  A size below
 * sizeof(uint32_t) (0 included) is KVP_ERR_INVALID_ARG, one above this
 * library's struct (a newer caller) KVP_ERR_VERSION. */
typedef struct kvp_ec_config {
    uint32_t size;
    bool is_producer;
    bool is_consumer;
    bool cross_encoder_cache; /* producers record image outputs as store candidates */
    /* The first consumer shard's control address ("tcp://ip:port"), where
     * every remote cancel goes.  NULL: derived from ec_ip and the control
     * port (ec_port + dp_index * tp_size) by kvp_ec_config_validate. */
    const char *control_addr;
    const char *ec_ip;          /* used only when control_addr is NULL */
    int64_t ec_port;            /* 0 = not given (control_addr must be) */
    int64_t tp_size, pp_size, dp_size, dp_index; /* 0 counts as 1 / index 0 */
    int64_t push_wait_timeout_s;   /* >= 0; the original's default is 60 */
    int64_t control_timeout_ms;    /* >= 1 (ceil(control_timeout_s*1000)) */
    int64_t pool_size;             /* > 0: receive pool and RESIDENT byte capacity */
    int64_t hidden_dim;            /* encoder output width; > 0 for producers */
    kvp_ec_dtype_t dtype;          /* model dtype */
    /* Test knobs for the two caps; < 0 = the original's constants. */
    int64_t max_pending_events;
    int64_t max_terminal_records;
} kvp_ec_config_t;

/* Fills the original's defaults (consumer off, producer off, push wait 60 s,
 * control timeout 30 s, caps at their constants, tp=pp=dp=1) into the first
 * `size` bytes of cfg (never past them) and sets cfg->size = size.  Call it
 * as kvp_ec_config_init(). */
KVP_API void kvp_ec_config_init_size(kvp_ec_config_t *cfg, size_t size);
/* The caller's own sizeof, compiled into the caller. */
static inline void kvp_ec_config_init(kvp_ec_config_t *cfg) { kvp_ec_config_init_size(cfg, sizeof *cfg); }

/* Validates a config (§3.1, scenario 46).  On failure returns
 * KVP_ERR_BAD_CONFIG and writes a one-line reason to err (if errlen > 0):
 * a producer with TP, PP or DP > 1; control ports [port, port+tp-1] outside
 * 1..65535; control_timeout_ms < 1; push_wait_timeout_s < 0; pool_size < 1;
 * hidden_dim < 1 for a producer; no control address; unknown dtype.
 * If control_addr is NULL and the rest is valid, the derived address is
 * written to addr_buf (may be NULL when control_addr is set).  A bad
 * cfg->size: KVP_ERR_INVALID_ARG or KVP_ERR_VERSION (see kvp_ec_config_t). */
KVP_API kvp_status_t kvp_ec_config_validate(const kvp_ec_config_t *cfg, char *addr_buf,
                                            size_t addr_len, char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* Plain C views of vLLM objects                                             */
/* ------------------------------------------------------------------------ */

typedef struct kvp_ec_feature {
    const char *identifier; /* mm_features[i].identifier (the mm hash) */
    const char *modality;   /* "image", "audio", ... */
    int64_t offset;         /* mm_position.offset */
    int64_t length;         /* mm_position.length */
    int64_t num_embeds;     /* get_num_encoder_embeds(i) */
} kvp_ec_feature_t;

typedef struct kvp_ec_item {
    const char *mm_hash;     /* NULL = absent or null */
    const char *transfer_id; /* NULL = absent or null */
} kvp_ec_item_t;

typedef struct kvp_ec_transfer_params {
    const char *consumer_zmq; /* NULL = absent or null */
    const kvp_ec_item_t *items; /* ec_items; n_items 0 = absent/null/empty */
    size_t n_items;
} kvp_ec_transfer_params_t;

typedef struct kvp_ec_request {
    const char *request_id;
    const kvp_ec_feature_t *features;
    size_t n_features;
    const kvp_ec_transfer_params_t *params; /* NULL = ec_transfer_params None */
} kvp_ec_request_t;

/* §3.2: the transfer id of feature `index`, or NULL when none resolves.
 * The result points into req (borrowed). */
KVP_API const char *kvp_ec_request_transfer_id(const kvp_ec_request_t *req, size_t index);

/* A JSON value: how readiness events reach the scheduler.  Events cross a
 * plain PULL socket, so the scheduler treats them as untrusted and applies
 * the original's conversions (str(), int(), truthiness) to them. */
typedef enum kvp_ec_vtype {
    KVP_EC_V_NULL = 0,
    KVP_EC_V_BOOL,
    KVP_EC_V_INT,
    KVP_EC_V_STR,
    KVP_EC_V_ARRAY,
    KVP_EC_V_OBJECT,
} kvp_ec_vtype_t;

typedef struct kvp_ec_member kvp_ec_member_t;
typedef struct kvp_ec_value {
    kvp_ec_vtype_t type;
    union {
        bool b;
        int64_t i;
        struct {
            const char *ptr; /* NUL-terminated, UTF-8 (WTF-8 for lone surrogates) */
            size_t len;
        } str;
        struct {
            struct kvp_ec_value *items;
            size_t n;
        } arr;
        struct {
            kvp_ec_member_t *members; /* unique keys, in first-seen order */
            size_t n;
        } obj;
    } u;
} kvp_ec_value_t;

struct kvp_ec_member {
    const char *key;
    size_t key_len;
    kvp_ec_value_t value;
};

/* Strict JSON parse of buf[0..len): integers within int64 only (a fraction,
 * exponent, NaN/Infinity or an out-of-range integer is KVP_ERR_DECODE), at
 * most max_depth levels below the top value, duplicate keys resolved as
 * Python does (first position, last value).  *value_p is freed with
 * kvp_ec_value_free. */
KVP_API kvp_status_t kvp_ec_json_parse(const char *buf, size_t len, int max_depth,
                                       kvp_ec_value_t **value_p);
KVP_API void kvp_ec_value_free(kvp_ec_value_t *value);
/* The member named key of an object, or NULL. */
KVP_API const kvp_ec_value_t *kvp_ec_value_get(const kvp_ec_value_t *obj, const char *key);
/* Python's bool(value): false for NULL (a missing member), None, False, 0
 * and empty strings, arrays and objects (how the connector reads flags such
 * as "ready" and "cancelled"). */
KVP_API bool kvp_ec_value_truthy(const kvp_ec_value_t *value);

/* Worker metadata (ECMooncakeWorkerMetadata) as the scheduler sees it.
 * Filled by kvp_ec_worker_meta_decode (owned, kvp_ec_worker_meta_cleanup) or
 * by the caller (borrowed for the call). */
typedef struct kvp_ec_worker_meta {
    char **loaded;
    size_t n_loaded;
    char **failed_loads;
    size_t n_failed_loads;
    char **reclaimed;
    size_t n_reclaimed;
    bool pending_loads;
    bool pending_saves;
    char **failed_saves;
    size_t n_failed_saves;
} kvp_ec_worker_meta_t;

/* Metadata built for the workers (ECMooncakeConnectorMetadata). */
typedef struct kvp_ec_tensor_spec {
    int64_t *shape;
    size_t ndim;
    char *dtype; /* "torch.bfloat16" in store candidates (str(torch dtype)) */
    int64_t nbytes;
} kvp_ec_tensor_spec_t;

typedef struct kvp_ec_store_candidate {
    char *identifier;
    kvp_ec_tensor_spec_t spec;
} kvp_ec_store_candidate_t;

typedef struct kvp_ec_push_spec {
    char *mm_hash;
    int64_t nbytes;
    int64_t *shape;
    size_t ndim;
    char *dtype; /* without "torch." */
    char *consumer_zmq;
    char *transfer_id;
    char *request_id;
} kvp_ec_push_spec_t;

typedef struct kvp_ec_load_spec {
    char *mm_hash;
    int64_t nbytes;
    int64_t *shape;
    size_t ndim;
    char *dtype; /* as the readiness event gave it */
    char *transfer_id;
    int64_t num_token;
    bool local; /* a local hand-off of a RESIDENT record */
} kvp_ec_load_spec_t;

typedef struct kvp_ec_meta {
    char **freed;
    size_t n_freed;
    kvp_ec_store_candidate_t *store_candidates; /* unique identifiers */
    size_t n_store_candidates;
    kvp_ec_push_spec_t *pushes;
    size_t n_pushes;
    kvp_ec_load_spec_t *loads;
    size_t n_loads;
} kvp_ec_meta_t;

KVP_API void kvp_ec_meta_cleanup(kvp_ec_meta_t *meta);
KVP_API void kvp_ec_worker_meta_cleanup(kvp_ec_worker_meta_t *wm);

/* msgpack encoding (crosses from the scheduler process to the workers and
 * back).  encode: *buf_p is allocated with malloc-compatible kvp__ shim and
 * freed with kvp_ec_buf_free(buf, len).  decode: defensive; every length and
 * count bounded; KVP_ERR_DECODE on anything malformed, leaving *out empty. */
KVP_API kvp_status_t kvp_ec_meta_encode(const kvp_ec_meta_t *meta, uint8_t **buf_p, size_t *len_p);
KVP_API kvp_status_t kvp_ec_meta_decode(const uint8_t *buf, size_t len, kvp_ec_meta_t *out);
KVP_API kvp_status_t kvp_ec_worker_meta_encode(const kvp_ec_worker_meta_t *wm, uint8_t **buf_p,
                                               size_t *len_p);
KVP_API kvp_status_t kvp_ec_worker_meta_decode(const uint8_t *buf, size_t len,
                                               kvp_ec_worker_meta_t *out);
KVP_API void kvp_ec_buf_free(uint8_t *buf, size_t len);

/* request_finished's items (E12): one per distinct identifier, in first-seen
 * order, with the last feature's metadata and resolved transfer id. */
typedef struct kvp_ec_finished_item {
    char *identifier;
    char *modality;
    int64_t offset;
    int64_t length;
    char *transfer_id; /* NULL when none resolved */
} kvp_ec_finished_item_t;

typedef struct kvp_ec_finished {
    bool delay_free;   /* always false: encoder memory is never delayed */
    bool has_items;    /* false = None */
    kvp_ec_finished_item_t *items;
    size_t n_items;
} kvp_ec_finished_t;

KVP_API void kvp_ec_finished_cleanup(kvp_ec_finished_t *f);

typedef struct kvp_ec_strlist {
    char **v;
    size_t n;
} kvp_ec_strlist_t;

KVP_API void kvp_ec_strlist_cleanup(kvp_ec_strlist_t *l);

/* ------------------------------------------------------------------------ */
/* Collaborators (interfaces: the ZeroMQ implementations and any other plug */
/* in).  Each is a table of functions plus an opaque ctx.                    */
/* ------------------------------------------------------------------------ */

typedef struct kvp_ec_clock {
    /* Monotonic time in integer milliseconds, never decreasing. */
    int64_t (*now_ms)(void *ctx);
    void *ctx;
} kvp_ec_clock_t;

/* The real monotonic clock (CLOCK_MONOTONIC in ms). */
KVP_API kvp_ec_clock_t kvp_ec_clock_monotonic(void);

typedef struct kvp_ec_control {
    /* The shard addresses behind a consumer's first control address.
     * KVP_OK: *addrs_p and *n_p valid until the next call on this client.
     * Any error = the original's None (discovery failed). */
    kvp_status_t (*discover_shards)(void *ctx, const char *addr, const char *const **addrs_p,
                                    size_t *n_p);
    /* Sends {"op":"cancel","transfer_id":tid} to one shard.  KVP_OK: the
     * reply was {"ok":true,"result":X}; *cancelled_p = X is an object whose
     * "cancelled" is truthy.  KVP_ERR_TIMEOUT = TimeoutError;
     * KVP_ERR_REMOTE = {"ok":false} (RuntimeError); other errors likewise
     * count as a failed shard. */
    kvp_status_t (*cancel)(void *ctx, const char *addr, const char *transfer_id, bool *cancelled_p);
    void (*close)(void *ctx);
    void *ctx;
} kvp_ec_control_t;

/* The remote-cancel job (E8, the original's _cancel_remote): discovery up
 * to 2 times, then up to 2 rounds of cancel over the pending shards.
 * Returns KVP_OK with *cancelled_p, or the first error of the job
 * (discovery failure: KVP_ERR_NOT_FOUND). */
KVP_API kvp_status_t kvp_ec_cancel_remote(const kvp_ec_control_t *client, const char *addr,
                                          const char *transfer_id, bool *cancelled_p);

typedef struct kvp_ec_executor {
    /* Queue kvp_ec_cancel_remote(client, addr, transfer_id) to run later on
     * the executor.  KVP_OK with *job_p (>= 1, in submission order), or
     * KVP_ERR_CLOSED after shutdown (the original's RuntimeError). */
    kvp_status_t (*submit_cancel)(void *ctx, const char *addr, const char *transfer_id,
                                  uint64_t *job_p);
    /* Stop accepting jobs and cancel every job not yet started. */
    void (*shutdown)(void *ctx);
    void *ctx;
} kvp_ec_executor_t;

typedef struct kvp_ec_inbox {
    /* Number of consumer shards connected (0 = no inbox). */
    size_t (*shard_count)(void *ctx);
    /* Every readiness event queued since the last drain, in arrival order;
     * the array and values stay valid until the next drain or close.  After
     * close or with no shards: zero events (queued ones are discarded). */
    kvp_status_t (*drain)(void *ctx, const char *control_addr, const kvp_ec_value_t *const **events_p,
                          size_t *n_p);
    void (*close)(void *ctx);
    void *ctx;
} kvp_ec_inbox_t;

/* ------------------------------------------------------------------------ */
/* The scheduler                                                             */
/* ------------------------------------------------------------------------ */

/* The transfer states (§3.3).  Terminal: UNAVAILABLE, EXPIRED, FAILED,
 * CANCELLED. */
typedef enum kvp_ec_state {
    KVP_EC_WAITING_EVENT = 0, /* a request waits for the producer's readiness event */
    KVP_EC_AVAILABLE,         /* pushed into a consumer reservation; leased for 300 s */
    KVP_EC_LOADING,           /* handed to the workers in meta.loads */
    KVP_EC_READY,             /* loaded into the engine's encoder cache */
    KVP_EC_RESIDENT,          /* freed by the engine but kept in the pool (local hand-off) */
    KVP_EC_UNAVAILABLE,       /* the push never arrived in time (tombstone) */
    KVP_EC_EXPIRED,           /* lease expired, reclaimed or evicted (tombstone) */
    KVP_EC_FAILED,            /* the workers failed to load it (dead end) */
    KVP_EC_CANCELLED,         /* cancelled; later events for it are ignored (tombstone) */
} kvp_ec_state_t;
#define KVP_EC_NUM_STATES 9

KVP_API const char *kvp_ec_state_name(kvp_ec_state_t state);

/* The Python exception class the original raised for the last failed hook. */
typedef enum kvp_ec_error {
    KVP_EC_ERR_NONE = 0,
    KVP_EC_ERR_INDEX,              /* IndexError: feature index out of range */
    KVP_EC_ERR_VALUE,              /* ValueError: a value that does not parse (an event field) */
    KVP_EC_ERR_RUNTIME,            /* RuntimeError: a cancel submitted after close */
    KVP_EC_ERR_KEY,                /* KeyError */
    KVP_EC_ERR_TYPE,               /* TypeError */
    KVP_EC_ERR_ASSERTION,          /* AssertionError: an assert of the original */
    KVP_EC_ERR_INVALID_TRANSITION, /* InvalidSchedulerTransferTransition */
    KVP_EC_ERR_NO_MEMORY,          /* out of memory (not in the original) */
} kvp_ec_error_t;

KVP_API const char *kvp_ec_error_name(kvp_ec_error_t err);

typedef struct kvp_ec_sched kvp_ec_sched_t;

/* What a scheduler is made of.  Initialise with kvp_ec_sched_params_init()
 * (zeroes it and sets size) and fill it in.  size: as for kvp_ec_config_t
 * (the fields past an older caller's size are zero).  The config is a
 * pointer so that both structs can grow on their own. */
typedef struct kvp_ec_sched_params {
    uint32_t size;
    const kvp_ec_config_t *config; /* required; read during create only */
    kvp_ec_clock_t clock;       /* required */
    kvp_ec_control_t control;   /* close() is called by kvp_ec_sched_close */
    kvp_ec_executor_t executor; /* required */
    kvp_ec_inbox_t inbox;       /* required (shard_count 0 = no inbox) */
} kvp_ec_sched_params_t;

static inline void kvp_ec_sched_params_init(kvp_ec_sched_params_t *params)
{
    kvp_ec_sched_params_t zero = {0};
    *params = zero;
    params->size = sizeof *params;
}

/* Validates the config and creates a scheduler.  KVP_ERR_BAD_CONFIG (reason
 * logged), KVP_ERR_INVALID_ARG (the config or a collaborator missing, or a
 * bad size), KVP_ERR_VERSION (a size from a newer header), KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_ec_sched_create(const kvp_ec_sched_params_t *params, kvp_ec_sched_t **sched_p);
/* Frees everything.  Does not call close (call kvp_ec_sched_close first to
 * shut the collaborators down).  NULL is a no-op. */
KVP_API void kvp_ec_sched_destroy(kvp_ec_sched_t *sched);

/* E3. */
KVP_API kvp_status_t kvp_ec_sched_has_cache_item(kvp_ec_sched_t *s, const char *identifier, bool *ret_p);
/* E4. */
KVP_API kvp_status_t kvp_ec_sched_ensure_cache_available(kvp_ec_sched_t *s, const kvp_ec_request_t *req,
                                                         int64_t num_computed_tokens, bool *ret_p);
/* E6, E7.  index >= n_features: KVP_ERR_INVALID_ARG (IndexError). */
KVP_API kvp_status_t kvp_ec_sched_update_state_after_alloc(kvp_ec_sched_t *s, const kvp_ec_request_t *req,
                                                           size_t index);
KVP_API kvp_status_t kvp_ec_sched_update_state_after_free(kvp_ec_sched_t *s, const kvp_ec_request_t *req,
                                                          size_t index);
/* E9.  preempted == NULL means None.  *meta is filled (caller cleans up). */
KVP_API kvp_status_t kvp_ec_sched_build_connector_meta(kvp_ec_sched_t *s, const char *const *freed,
                                                       size_t n_freed, const char *const *preempted,
                                                       size_t n_preempted, kvp_ec_meta_t *meta);
/* E10.  wm == NULL: the output carried no ECMooncakeWorkerMetadata (also
 * what to pass when the workers' bytes fail kvp_ec_worker_meta_decode: the
 * original ignores a meta of the wrong type).  The four lists are sets: a
 * repeated entry counts once, at its first position. */
KVP_API kvp_status_t kvp_ec_sched_update_connector_output(kvp_ec_sched_t *s, const kvp_ec_worker_meta_t *wm);
/* E11: sorted ascending, caller cleans up. */
KVP_API kvp_status_t kvp_ec_sched_take_unavailable_requests(kvp_ec_sched_t *s, kvp_ec_strlist_t *out);
/* E13. */
KVP_API bool kvp_ec_sched_has_pending_push_work(const kvp_ec_sched_t *s);
/* E12. */
KVP_API kvp_status_t kvp_ec_sched_request_finished(kvp_ec_sched_t *s, const kvp_ec_request_t *req,
                                                   kvp_ec_finished_t *out);
/* E14: executor shutdown (pending jobs cancelled), control close, inbox
 * close.  Safe to call twice. */
KVP_API void kvp_ec_sched_close(kvp_ec_sched_t *s);

/* The exception class of the last failed hook (KVP_EC_ERR_NONE after a
 * successful one). */
KVP_API kvp_ec_error_t kvp_ec_sched_error(const kvp_ec_sched_t *s);

/* The transfer table, for observability and the replay. */
typedef struct kvp_ec_record_view {
    const char *transfer_id;
    const char *mm_hash;
    const char *request_id;
    kvp_ec_state_t state;
    bool has_deadline;
    int64_t deadline_ms;
} kvp_ec_record_view_t;

/* Calls cb for each record in the table's order (oldest change first).
 * Views are valid during the callback only.  cb returns non-zero to stop. */
KVP_API void kvp_ec_sched_table_visit(const kvp_ec_sched_t *s,
                                      int (*cb)(void *ctx, const kvp_ec_record_view_t *rec), void *ctx);
/* Bumped on every table change (a cheap "did anything change"). */
KVP_API uint64_t kvp_ec_sched_table_version(const kvp_ec_sched_t *s);
KVP_API size_t kvp_ec_sched_table_size(const kvp_ec_sched_t *s);
/* Sum of spec nbytes over RESIDENT records. */
KVP_API int64_t kvp_ec_sched_resident_bytes(const kvp_ec_sched_t *s);

/* ------------------------------------------------------------------------ */
/* The ZeroMQ collaborators of a scheduler (control.py ControlClient,        */
/* EventInbox, and the remote-cancel executor)                              */
/* ------------------------------------------------------------------------ */

typedef struct kvp_ec_zmq kvp_ec_zmq_t;

/* One control client (REQ sockets with control_timeout_ms) shared by the
 * three collaborators below; the executor runs cancel jobs on `threads`
 * threads (0 = the seed's 8).  The inbox discovers the consumer's shards
 * (peers, event_port) on the executor so an unreachable consumer costs the
 * scheduler nothing, then connects one PULL socket to every shard.
 * KVP_OK, KVP_ERR_INVALID_ARG, KVP_ERR_NO_MEMORY, KVP_ERR_IO. */
KVP_API kvp_status_t kvp_ec_zmq_create(int64_t control_timeout_ms, size_t threads, kvp_ec_zmq_t **z_p);
/* After kvp_ec_sched_close (which closes the three); NULL is a no-op. */
KVP_API void kvp_ec_zmq_destroy(kvp_ec_zmq_t *z);
KVP_API kvp_ec_control_t kvp_ec_zmq_control(kvp_ec_zmq_t *z);
KVP_API kvp_ec_executor_t kvp_ec_zmq_executor(kvp_ec_zmq_t *z);
KVP_API kvp_ec_inbox_t kvp_ec_zmq_inbox(kvp_ec_zmq_t *z);

/* ------------------------------------------------------------------------ */
/* The worker side (§3.6, §3.7): consumer and producer                       */
/* ------------------------------------------------------------------------ */

typedef struct kvp_ec_worker kvp_ec_worker_t;

/* How pushes move (docs/ec-push.md). */
typedef enum kvp_ec_push_path {
    KVP_EC_PUSH_AUTO = 0, /* UCX RMA where it reaches the consumer over shm or rdma, else TCP */
    KVP_EC_PUSH_TCP,      /* the consumer's data port only */
    KVP_EC_PUSH_UCX,      /* UCX RMA only */
} kvp_ec_push_path_t;

/* A tensor: bytes plus the shape and dtype they carry. */
typedef struct kvp_ec_tensor {
    const uint8_t *data;
    int64_t nbytes;
    const int64_t *shape;
    size_t ndim;
    kvp_ec_dtype_t dtype;
} kvp_ec_tensor_t;

/* The engine's encoder cache as the worker sees it (vLLM's
 * dict[mm_hash, Tensor]).  Called from the thread that called the worker. */
typedef struct kvp_ec_encoder_cache {
    /* Is mm_hash in the cache? */
    bool (*has)(void *ctx, const char *mm_hash);
    /* The cache's tensor of mm_hash, or false (a producer's source). */
    bool (*get)(void *ctx, const char *mm_hash, kvp_ec_tensor_t *t);
    /* encoder_cache[mm_hash] = t.  t.data points into the consumer's
     * receive pool; it stays valid until the engine frees mm_hash (a later
     * meta's `freed`, seen by start_load_caches) or the worker is
     * destroyed. */
    void (*put)(void *ctx, const char *mm_hash, const kvp_ec_tensor_t *t);
    void *ctx;
} kvp_ec_encoder_cache_t;

/* One push as the producer saw it, for reports (times: CLOCK_MONOTONIC ns). */
typedef struct kvp_ec_push_record {
    const char *transfer_id;
    const char *mm_hash;
    const char *request_id;
    int64_t nbytes;
    size_t shards;       /* consumer shards reserved on */
    size_t written;      /* shards written to (the others were cached or cancelled) */
    bool cached;         /* every shard answered cached: nothing moved */
    kvp_status_t status; /* KVP_OK, or why the push failed */
    bool retryable;      /* a failure the request may retry (timeouts, lost peers, expiry) */
    uint64_t reserve_sent_ns, reserve_done_ns;
    uint64_t reserve_asked_ns; /* start_save queued the reserve (it waits there for a control thread) */
    uint64_t write_start_ns, write_done_ns; /* 0 when nothing was written */
    uint64_t complete_done_ns;
    unsigned path;       /* KVP_EC_PUSH_TCP or KVP_EC_PUSH_UCX when written */
    size_t reserve_reply_bytes; /* the largest shard's reserve reply frame (0: none came) */
} kvp_ec_push_record_t;

typedef struct kvp_ec_worker_params {
    uint32_t size;
    const kvp_ec_config_t *config; /* required; validated; read during create only */
    /* Consumer: this TP rank (its control server listens on control port +
     * tp_rank, reports the ports of tp_size shards) and whether this is a
     * receiving (first PP) stage; a non-receiving stage has no pool or
     * server and reports no metadata. */
    int64_t tp_rank;
    bool not_receiving;
    /* Where the consumer's control server and data port bind: NULL = the
     * host of the config's control address.  "0.0.0.0" binds every
     * interface, and only when given. */
    const char *bind_host;
    kvp_ec_push_path_t push_path;
    /* Test knobs and caps; 0 = default. */
    int64_t lease_ms;              /* 300000: reservation lease and tombstone TTL */
    int64_t max_tombstones;        /* 65536 */
    int64_t reap_interval_ms;      /* 1000 */
    int64_t max_pending_events;    /* 4096 */
    int64_t peer_max_reservations; /* 65536 */
    int64_t peer_max_bytes;        /* pool_size */
    int64_t start_timeout_ms;      /* 5000: the control server must be up by then */
    /* Cross-encoder cache (config->cross_encoder_cache): the pool (borrowed,
     * outlives the worker) and the store-key namespace (model name). */
    struct kvp_pool *pool;
    const char *model;
    /* Producer: called once per push when it ends, on one of the worker's
     * threads with its lock held: it must not call back into the worker. */
    void (*on_push)(void *ctx, const kvp_ec_push_record_t *rec);
    void *on_push_ctx;
} kvp_ec_worker_params_t;

static inline void kvp_ec_worker_params_init(kvp_ec_worker_params_t *p)
{
    kvp_ec_worker_params_t zero = {0};
    *p = zero;
    p->size = sizeof *p;
}

/* A consumer starts its receive pool, data receiver and control server
 * (bound before this returns, or KVP_ERR_IO within start_timeout_ms); a
 * producer its control client, transport and push threads.
 * KVP_ERR_BAD_CONFIG (reason logged), KVP_ERR_INVALID_ARG, KVP_ERR_VERSION,
 * KVP_ERR_IO, KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_ec_worker_create(const kvp_ec_worker_params_t *params, kvp_ec_worker_t **w_p);
/* Stops everything (pending pushes are cancelled with abandon, writers are
 * waited for up to the control timeout).  NULL is a no-op. */
KVP_API void kvp_ec_worker_destroy(kvp_ec_worker_t *w);

/* The consumer's control address of this shard ("tcp://host:port"). */
KVP_API const char *kvp_ec_worker_control_addr(const kvp_ec_worker_t *w);

/* Consumer (§3.7 "Consumer load"): retire residents the engine freed, then
 * per load spec: already cached -> completed (a pushed reservation is
 * cancelled); local -> take_resident; pushed -> take; a miss fails the
 * load.  Loaded tensors are put into cache.  Producer: no-op. */
KVP_API kvp_status_t kvp_ec_worker_start_load_caches(kvp_ec_worker_t *w, const kvp_ec_meta_t *meta,
                                                     const kvp_ec_encoder_cache_t *cache);
/* Producer: reserve every push of meta on every consumer shard (in the
 * background) and bind the sources cache already holds.  Consumer: no-op. */
KVP_API kvp_status_t kvp_ec_worker_start_save_caches(kvp_ec_worker_t *w, const kvp_ec_meta_t *meta,
                                                     const kvp_ec_encoder_cache_t *cache);
/* Producer: the encoder output of mm_hash is computed; the worker copies
 * it (the caller's buffer is free on return) and pushes it once reserved.
 * With the cross-encoder cache, an image output is also put into the pool. */
KVP_API kvp_status_t kvp_ec_worker_save_caches(kvp_ec_worker_t *w, const char *mm_hash, const kvp_ec_tensor_t *t);
/* Producer: cancel the reservations of finished requests' pushes that never
 * ran (orphans). */
KVP_API kvp_status_t kvp_ec_worker_get_finished(kvp_ec_worker_t *w, const char *const *finished, size_t n);
/* The step's ECMooncakeWorkerMetadata (and it resets the sets).  *has_p
 * false: None (a non-receiving consumer stage). */
KVP_API kvp_status_t kvp_ec_worker_build_meta(kvp_ec_worker_t *w, kvp_ec_worker_meta_t *out, bool *has_p);
/* aggregate (metadata.py): loaded intersected, the rest united, into out
 * (owned; kvp_ec_worker_meta_cleanup). */
KVP_API kvp_status_t kvp_ec_worker_meta_aggregate(const kvp_ec_worker_meta_t *a, const kvp_ec_worker_meta_t *b,
                                                  kvp_ec_worker_meta_t *out);

typedef struct kvp_ec_worker_stats {
    uint32_t size;
    /* consumer */
    uint64_t reservations_active, bytes_reserved, tombstones, residents, resident_bytes;
    uint64_t reserves, reserves_cached, reserves_full, reserves_capped, cross_cache_hits;
    uint64_t completes, cancels, takes, takes_failed, expired, reclaimed;
    uint64_t events_sent, events_dropped, control_requests, control_errors;
    uint64_t push_conns_open, push_writes, push_bytes, push_bad_headers;
    /* producer */
    uint64_t pushes, pushes_cached, pushes_failed, pushes_retryable, bytes_pushed;
    uint64_t pushes_pending, cross_cache_puts;
    /* consumer: reservations ended because their writer never completed nor
     * abandoned within one more lease (a dead producer) */
    uint64_t writers_abandoned;
    /* consumer, cross-encoder cache: lookups that missed, were skipped (the
     * pool backing off after a failure, or over the cap), failed; reserves
     * waiting for a lookup now; bytes copied in from the pool */
    uint64_t cross_cache_misses, cross_cache_skipped, cross_cache_errors, cross_cache_parked;
    uint64_t cross_cache_bytes;
    /* consumer: the control server thread's time serving requests, from a
     * request received to its reply sent (a reserve parked for its
     * cross-encoder cache lookup: without the wait), all of them and the
     * reserves' (reserve and reserve_batch), and the thread's CPU time in
     * those (without its waits for a CPU); reserve requests served */
    uint64_t control_busy_ns, reserve_busy_ns, reserve_cpu_ns, reserve_requests;
    /* producer: its staging slab for the encoder outputs it holds until
     * pushed (pool_size bytes, 0 when it could not be mapped), the bytes
     * held there now and on the heap (copies that did not fit), copies
     * made, and of them those that did not fit */
    uint64_t stage_capacity, stage_bytes, stage_heap_bytes, stage_copies, stage_fallbacks;
} kvp_ec_worker_stats_t;

KVP_API void kvp_ec_worker_stats(kvp_ec_worker_t *w, kvp_ec_worker_stats_t *st);

/* Those figures of n workers (1..64; a process's TP ranks) as Prometheus
 * text: kvpool_ec_* gauges for what is held now, *_total counters for the
 * rest, one series per worker labelled rank="i" (its index in w),
 * NUL-terminated, into buf.  *len_p: the text's length;
 * KVP_ERR_BUFFER_TOO_SMALL when buf_size is not more than that (ask with
 * buf NULL and buf_size 0 first). */
KVP_API kvp_status_t kvp_ec_worker_metrics(kvp_ec_worker_t *const *w, size_t n, char *buf, size_t buf_size,
                                           size_t *len_p);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_EC_CONNECTOR_H */
