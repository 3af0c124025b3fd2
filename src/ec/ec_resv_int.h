/*
 * The reservation object's insides, shared by ec_resv.c (the reservations'
 * lifecycle: reserve, complete, cancel, expiry, shutdown) and ec_resv_res.c
 * (take, the resident-set calls, stats, the self-check).  See ec_resv.c for
 * the model.  Every kvp__ec_resv_do_* function runs with r->mu held.
 */
#ifndef KVP_EC_RESV_INT_H
#define KVP_EC_RESV_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/list.h"
#include "common/strmap.h"
#include "ec/ec_resv.h"
#include "ec/ec_slab.h"

#define KVP__EC_RS(st) (1u << (st)) /* a set of states */

/* parked: memory kept for a writer that may still write */
#define KVP__EC_RS_DEFERRED (KVP__EC_RS(KVP__EC_R_CANCEL_PENDING) | KVP__EC_RS(KVP__EC_R_EXPIRE_PENDING))
/* a remote writer may be writing (wait_for_writers waits these out) */
#define KVP__EC_RS_WRITER_OWNED (KVP__EC_RS(KVP__EC_R_WRITING) | KVP__EC_RS_DEFERRED)
/* not a tombstone */
#define KVP__EC_RS_ACTIVE (KVP__EC_RS_WRITER_OWNED | KVP__EC_RS(KVP__EC_R_READY))
#define KVP__EC_RS_IN(st, set) ((KVP__EC_RS(st) & (set)) != 0)

typedef struct kvp__ec_peer {
    char key[17]; /* the id in hex: the map's key */
    uint64_t id;
    size_t n;       /* active records */
    uint64_t bytes; /* extents they own */
    unsigned hold;  /* a reserve in progress keeps it alive */
} kvp__ec_peer_t;

typedef struct kvp__ec_rrec {
    char *tid; /* owned; the map's key */
    size_t tid_len;
    char *hash; /* owned; "" for a cancel's tombstone */
    char rid[KVP__EC_RID_LEN + 1];
    kvp__ec_rstate_t state;
    kvp__ec_tensor_t t;
    bool has_ext;              /* owns ext (a writer, or READY without a publish) */
    kvp__ec_ext_t ext;
    kvp__ec_res_t *lease;      /* a lease on a resident entry */
    struct kvp__ec_rrec *writer;        /* a follower: the writer it follows */
    kvp__list_t followers;     /* a writer: its followers, in order */
    kvp__list_t flink;         /* a follower: on writer->followers */
    kvp__list_t alink;         /* on r->active iff the state is active */
    kvp__list_t tlink;         /* on r->tombs iff a tombstone */
    kvp__list_t olink;         /* on r->owning iff writer-owned with an extent */
    int64_t expires_at;        /* lease or tombstone deadline; INT64_MAX when parked */
    kvp__ec_peer_t *peer;              /* held while active */
    uint64_t acct_bytes;       /* what this record adds to bytes_reserved */
    uint64_t peer_bytes;       /* ... and to its peer's bytes (0 once inactive) */
} kvp__ec_rrec_t;

/* A fill: an extent the cross-encoder cache is filling from the pool
 * (fill_begin .. fill_end), visible to nobody else. */
typedef struct kvp__ec_fill {
    bool used;
    uint64_t id; /* fill_begin's handle: never 0, never reused */
    kvp__ec_ext_t ext;
    kvp__ec_tensor_t t;
    char hash[256];
} kvp__ec_fill_t;

struct kvp__ec_resv {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvp__ec_resv_params_t p;
    kvp__ec_alloc_t alloc;
    kvp__ec_resset_t res;
    kvp__strmap_t recs;    /* tid -> kvp__ec_rrec_t */
    kvp__strmap_t writers; /* mm_hash -> the writer of that hash (kvp__ec_rrec_t) */
    kvp__strmap_t peers;   /* hex id -> kvp__ec_peer_t */
    kvp__list_t active;    /* active records, in insertion order */
    kvp__list_t tombs;     /* tombstones, oldest deadline first */
    kvp__list_t owning;    /* writer-owned records with an extent (check_write) */
    char **ready;          /* followers made READY, for drain_ready */
    size_t n_ready, cap_ready;
    bool shutting_down;
    kvp__ec_fill_t fills[KVP__EC_MAX_FILLS];
    uint64_t next_fill_id, fill_bytes;
    uint64_t by_state[KVP__EC_R_NUM_STATES];
    uint64_t n_recs, n_tombs, bytes_reserved;
    kvp__ec_resv_stats_t st; /* the event counters only */
};

/* Removes a record from every structure (its memory released or handed on). */
void kvp__ec_resv_do_remove(kvp__ec_resv_t *r, kvp__ec_rrec_t *rec);
/* An extent for nbytes: allocate; on failure expire (when may_expire) and
 * retry; then evict evictable residents, oldest first, retrying after each
 * (memory.py reclaim_and_allocate).  KVP_OK, KVP_ERR_NO_SPACE,
 * KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_resv_do_alloc(kvp__ec_resv_t *r, uint64_t nbytes, bool may_expire, int64_t now,
                                   kvp__ec_ext_t *ext_p);
/* snprintf into err (NULL or errlen 0: nothing). */
void kvp__ec_set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Walks every structure of r under its lock: the free list sorted and
 * coalesced, every extent (free, owned by a record, held by a resident)
 * disjoint and together exactly the slab, the counters equal to what they
 * count, the list memberships equal to their rules, the per-peer sums, the
 * tombstone cap.  KVP_OK, or KVP_ERR_INTERNAL with what failed in err (tests). */
kvp_status_t kvp__ec_resv_validate(kvp__ec_resv_t *r, char *err, size_t errlen);

#endif
