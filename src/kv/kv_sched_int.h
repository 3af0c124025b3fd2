/*
 * Internals of the KV connector's scheduler side, shared by kv_sched.c (the
 * hooks) and kv_reqmeta.c (RequestTracker / ReqMeta.from_request_tracker and
 * the metadata snapshot).
 *
 * The original keeps four containers keyed by request id: load_specs,
 * _request_trackers, _unfinished_requests (an insertion-ordered dict) and
 * _unfinished_request_ids (a set).  Here one record per id carries all four
 * memberships, found through one hash map; the ordered dict is an intrusive
 * doubly linked list (a new id goes to the end, re-assignment keeps its
 * place, removal unlinks), the set a dense array with a back index.  A record
 * lives while it is a member of any of the four, so every operation of the
 * original is O(1) here and a step is O(requests in the step output), plus
 * one walk over _unfinished_requests when some load spec is pending (K13).
 */
#ifndef KVP_KV_SCHED_INT_H
#define KVP_KV_SCHED_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kv/kv_blocks.h"
#include "common/list.h"
#include "common/strmap.h"
#include "kvpool/kv_connector.h"

/* RequestTracker (§2.5).  blocks NULL = `()`, token_ids NULL = None/empty. */
typedef struct kvp__kv_tracker {
    int64_t token_len;
    kvp__kv_btuple_t *blocks;
    int64_t num_saved_tokens;
    kvp__kv_tokens_t *token_ids;
    bool has_pending_offload;
    int64_t prefill_end_tokens;
} kvp__kv_tracker_t;

typedef struct kvp__kv_rec {
    uint64_t hash;
    /* load_specs[id] */
    bool has_ls;
    kvp_kv_load_spec_t ls;
    /* _request_trackers[id] */
    bool has_tracker;
    kvp__kv_tracker_t tr;
    /* _unfinished_requests[id] = (req, ublocks) */
    bool in_unf;
    const kvp_kv_request_t *req;
    kvp__kv_btuple_t *ublocks;
    kvp__list_t ulink; /* on sched->unf while in_unf, in insertion order */
    /* _unfinished_request_ids: index in sched->uids, SIZE_MAX if absent */
    size_t uid_idx;
    /* per-call marks (build_connector_meta) */
    uint64_t seen_stamp, tail_stamp;
    size_t tail_idx;
    size_t id_len;
    char id[];
} kvp__kv_rec_t;

/* A ReqMeta while build_connector_meta runs: it refers to the tracker's own
 * objects, snapshotted when the call returns (kvsched-ref "Shared lists"). */
typedef struct kvp__kv_pmeta {
    kvp__kv_rec_t *rec;
    const kvp_kv_request_t *req; /* block_hashes come from here */
    int64_t token_len_chunk;
    kvp__kv_btuple_t *blocks;    /* counted reference */
    kvp__kv_tokens_t *token_ids; /* counted reference */
    bool can_save;
    int8_t is_last_chunk;
    bool has_ls;
    kvp_kv_load_spec_t ls;
    int64_t num_prompt_tokens;
    const kvp_kv_tail_offload_t *tails; /* the caller's, copied at the snapshot */
    size_t ntails;
} kvp__kv_pmeta_t;

/* Growable arrays for the returned meta (reused every step). */
typedef struct kvp__kv_metabuf {
    kvp__kv_pmeta_t *pm;
    size_t npm, pm_cap;
    kvp_kv_req_meta_t *rm;
    size_t rm_cap;
    kvp_kv_ids_t *groups;
    size_t groups_cap;
    kvp_kv_tail_offload_t *tails;
    size_t tails_cap;
    const char **unf;
    size_t unf_cap;
    const char **pre;
    size_t pre_cap;
    char *strs;
    size_t strs_cap;
    kvp_kv_meta_t meta;
} kvp__kv_metabuf_t;

struct kvp_kv_sched {
    kvp_kv_config_t cfg;
    char *model_name, *cache_prefix;
    kvp_kv_lookup_client_t client;
    int64_t align; /* hash_block_size with partial hits, else block_size */
    kvp__strmap_t map;
    kvp__list_t unf; /* the in_unf records (kvp__kv_rec_t.ulink), oldest first */
    size_t num_unf;
    kvp__kv_rec_t **uids;
    size_t num_uids, uids_cap;
    size_t num_ls, num_trackers;
    uint64_t stamp;
    /* K14 scratch */
    bool *tail_used;
    size_t tail_used_cap;
    kvp__kv_metabuf_t mb;
    /* F1 (load_policy faster): the bandwidth in use (bytes/s, 0 = unknown),
     * the config's until kvp_kv_sched_set_load_bandwidth; the declines */
    double load_bw;
    uint64_t loads_declined, tokens_declined;
    kvp_kv_err_kind_t err_kind;
    char err_msg[256];
};

/* kv_reqmeta.c */
void kvp__kv_tracker_clear(kvp__kv_tracker_t *tr);
/* ReqMeta.from_request_tracker over rec->tr: appends the meta (or nothing:
 * the original's None) to the call's list.  ls NULL = no load_spec. */
kvp_status_t kvp__kv_from_tracker(kvp_kv_sched_t *s, kvp__kv_rec_t *rec,
                                  const kvp_kv_load_spec_t *ls, bool skip_save,
                                  const kvp_kv_request_t *req, int8_t is_last_chunk);
kvp_status_t kvp__kv_pmeta_push(kvp_kv_sched_t *s, const kvp__kv_pmeta_t *pm);
/* Drops the references the previous step's metas held. */
void kvp__kv_metabuf_release(kvp__kv_metabuf_t *mb);
void kvp__kv_metabuf_cleanup(kvp__kv_metabuf_t *mb);
/* Builds sched->mb.meta from the call's metas, the live unfinished-id set
 * and the step's preempted ids. */
kvp_status_t kvp__kv_metabuf_snapshot(kvp_kv_sched_t *s, const kvp_kv_sched_output_t *so);

/* Python's floor division and ceil division for b > 0. */
static inline int64_t kvp__floordiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0)
        q--;
    return q;
}
static inline int64_t kvp__cdiv(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if ((a % b) != 0 && a > 0)
        q++;
    return q;
}

#endif
