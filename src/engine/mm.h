/*
 * The engine model's multimodal path: one vLLM V1 engine instance as the EC
 * connector sees it (connectors-spec §4, ECConnectorBase).  Requests carry
 * features (mm_hash identifier, modality, placeholder offset and length,
 * num_embeds) and the proxy's ec_transfer_params; the instance has an
 * encoder cache manager with a capacity in embeddings (mm_cache.h) and the
 * model runner's encoder cache (mm_hash -> tensor).  Each step calls the
 * scheduler hooks and the worker in vLLM's order (vllm/v1/core/sched/
 * scheduler.py, v1/worker/ec_connector_model_runner_mixin.py):
 *
 *   schedule():  per running request, then per waiting request:
 *       ensure_cache_available(req, num_computed)  -- skip the request if false
 *       per feature in the scheduled window (_try_schedule_encoder_inputs):
 *           check_and_update_cache (a hit: nothing to do), can_allocate,
 *           has_cache_item (true: an external load, else encode here)
 *       allocate + update_state_after_alloc per encoded or loaded input
 *     free_encoder_mm_hashes = manager.get_freed_mm_hashes()
 *     build_connector_meta(freed, preempted)
 *   the model runner:
 *     pop the freed hashes from the encoder cache (update_states)
 *     producer: start_save_caches(cache);  consumer: start_load_caches(cache)
 *     encode the scheduled inputs: cache[mm_hash] = output; save_caches(mm_hash)
 *     gather: every feature in a scheduled window must be in the cache
 *     get_finished(finished_req_ids); build_connector_worker_meta()
 *   update_from_output():
 *     per scheduled request: num_computed += scheduled; _free_encoder_inputs
 *       (free_encoder_input + update_state_after_free for each input wholly
 *       computed); a finished prompt: request_finished, then manager.free
 *     take_unavailable_requests() -> those requests fail (retryable)
 *     update_connector_output(worker meta)
 *   the engine keeps stepping while a request is unfinished or
 *   has_pending_push_work() is true.
 *
 * Requests end when their prompt is computed (the prefill; no decode is
 * modelled).  Time is real: the caller steps the instance when there is
 * work (kvp__mm_busy) and sleeps otherwise.  One thread.
 */
#ifndef KVP_ENGINE_MM_H
#define KVP_ENGINE_MM_H

#define KVP__MM_MAX_FEATURES 64 /* per request */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/ec_connector.h"

/* The worker side as the engine drives it: the real kvp_ec_worker_* (one per
 * TP rank, aggregated) in the nodes, stand-ins in the unit tests.  Producer
 * calls go to a producer, consumer calls to a consumer; NULL = a no-op. */
typedef struct kvp__mm_worker {
    kvp_status_t (*start_load)(void *ctx, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache);
    kvp_status_t (*start_save)(void *ctx, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache);
    kvp_status_t (*save)(void *ctx, const char *mm_hash, const kvp_ec_tensor_t *t);
    kvp_status_t (*get_finished)(void *ctx, const char *const *finished, size_t n);
    /* *has_p false: None (no metadata this step). */
    kvp_status_t (*build_meta)(void *ctx, kvp_ec_worker_meta_t *out, bool *has_p);
    void *ctx;
} kvp__mm_worker_t;

typedef enum kvp__mm_outcome {
    KVP__MM_DONE = 0,      /* prompt computed */
    KVP__MM_RETRYABLE,     /* take_unavailable_requests named it: re-issuing re-runs the encode */
    KVP__MM_FAILED,        /* refused (bad request) or the instance failed it */
} kvp__mm_outcome_t;

typedef struct kvp__mm_params {
    kvp_ec_sched_t *sched;    /* the connector's scheduler (borrowed); NULL: no connector */
    bool producer;            /* the scheduler's role, for the worker calls */
    bool consumer;
    kvp__mm_worker_t worker;
    int64_t encoder_cache_embeds; /* the manager's capacity */
    int64_t encoder_budget;   /* embeddings encoded per step */
    int64_t token_budget;     /* tokens per step */
    int64_t max_num_seqs;
    int64_t hidden;           /* encoder output width */
    kvp_ec_dtype_t dtype;
    /* The encoder (producer, or a consumer that must encode): fills the
     * output of mm_hash. */
    void (*encode)(void *ctx, const char *mm_hash, uint8_t *buf, int64_t nbytes);
    /* An output the worker put into the encoder cache (consumer loads). */
    void (*on_put)(void *ctx, const char *mm_hash, const kvp_ec_tensor_t *t);
    /* A request ended (once per request). */
    void (*on_end)(void *ctx, const char *req_id, kvp__mm_outcome_t outcome);
    void *cb_ctx;
} kvp__mm_params_t;

typedef struct kvp__mm kvp__mm_t;

/* A request handed to the instance (copied). */
typedef struct kvp__mm_req {
    const char *id;
    int64_t prompt_len;
    const kvp_ec_feature_t *features;
    size_t n_features;
    const kvp_ec_transfer_params_t *params; /* NULL: none */
} kvp__mm_req_t;

kvp_status_t kvp__mm_create(const kvp__mm_params_t *p, kvp__mm_t **mm_p);
/* Frees the requests and the encoder cache (no hook is called). */
void kvp__mm_destroy(kvp__mm_t *mm);

/* Queues a request (waiting).  KVP_ERR_INVALID_ARG: features outside the
 * prompt, overlapping, or num_embeds > length; KVP_ERR_DUPLICATE_KEY: an id
 * that is live.  A refused request is not queued (on_end is not called). */
kvp_status_t kvp__mm_add(kvp__mm_t *mm, const kvp__mm_req_t *req);
/* One step (see above).  A hook's error is fatal only when it is not one
 * the original would survive; returns KVP_OK or that error. */
kvp_status_t kvp__mm_step(kvp__mm_t *mm);
/* Unfinished requests, or has_pending_push_work(). */
bool kvp__mm_busy(const kvp__mm_t *mm);
/* Requests unfinished (waiting or running). */
size_t kvp__mm_unfinished(const kvp__mm_t *mm);

typedef struct kvp__mm_stats {
    uint64_t requests, done, retryable, failed;
    uint64_t steps, idle_steps;       /* steps that scheduled no token */
    uint64_t encoded, loaded_external, cache_hits; /* inputs: encoded here, from the connector, local hits */
    uint64_t puts, put_bytes;         /* outputs the worker put into the cache */
    uint64_t gather_misses;           /* a scheduled window whose output was not in the cache */
    uint64_t evictions, ensure_false;
    uint64_t hook_errors;             /* hooks that returned an error the engine survived */
    int64_t cache_entries, cache_bytes; /* the model runner's encoder cache now */
    uint64_t outputs_reused;          /* encoder outputs written into a freed output's buffer */
    int64_t spare_bytes;              /* freed outputs' buffers kept for that now */
} kvp__mm_stats_t;

void kvp__mm_stats(const kvp__mm_t *mm, kvp__mm_stats_t *st);
/* The encoder cache (tests): the tensor of mm_hash, or false. */
bool kvp__mm_cache_get(const kvp__mm_t *mm, const char *mm_hash, kvp_ec_tensor_t *t);
/* The manager's books (kvp__ecm_check), and the engine's: KVP_OK or
 * KVP_ERR_INTERNAL. */
kvp_status_t kvp__mm_check(const kvp__mm_t *mm);

#endif
