/*
 * The EC worker's parts: ec_worker.c (life, metadata, stats), ec_consumer.c
 * (receive pool, control server, loads), ec_producer.c (pushes).
 *
 * Lock order: worker mu (the step's metadata sets) -> producer mu ->
 * reservation table mu.  No lock is held across a network call.
 */
#ifndef KVP_EC_WORKER_INT_H
#define KVP_EC_WORKER_INT_H

#include <pthread.h>

#include "common/strmap.h"
#include "ec/ec_client.h"
#include "ec/ec_ctl_server.h"
#include "ec/ec_push.h"
#include "ec/ec_resv.h"
#include "kvpool/ec_connector.h"
#include "kvpool/pool.h"

/* An insertion-ordered set of strings (the metadata's sets). */
typedef struct {
    kvp_ec_strlist_t list;
    size_t cap;
    kvp__strset_t set;
} kvp__ec_names_t;

void kvp__ec_names_init(kvp__ec_names_t *n);
void kvp__ec_names_cleanup(kvp__ec_names_t *n);
kvp_status_t kvp__ec_names_add(kvp__ec_names_t *n, const char *s);
/* Moves the strings out into (*v, *n) and empties the set. */
void kvp__ec_names_take(kvp__ec_names_t *n, char ***v_p, size_t *n_p);

typedef struct kvp__ec_producer kvp__ec_producer_t;

typedef struct kvp__ec_producer_params {
    int64_t control_timeout_ms;
    int64_t lease_ms;
    unsigned paths; /* KVP__EC_PATH_* */
    size_t threads;
    uint64_t stage_bytes; /* the staging slab (ec_stage.h): the config's pool_size */
    bool cross_encoder_cache;
    kvp_pool_t *pool;
    const char *model;
    void (*on_push)(void *ctx, const kvp_ec_push_record_t *rec);
    void *on_push_ctx;
} kvp__ec_producer_params_t;

kvp_status_t kvp__ec_producer_create(const kvp__ec_producer_params_t *p, kvp__ec_producer_t **pr_p);
void kvp__ec_producer_destroy(kvp__ec_producer_t *pr);
kvp_status_t kvp__ec_producer_start_save(kvp__ec_producer_t *pr, const kvp_ec_meta_t *meta,
                                         const kvp_ec_encoder_cache_t *cache);
kvp_status_t kvp__ec_producer_save(kvp__ec_producer_t *pr, const char *mm_hash, const kvp_ec_tensor_t *t);
kvp_status_t kvp__ec_producer_finished(kvp__ec_producer_t *pr, const char *const *ids, size_t n);
bool kvp__ec_producer_pending(kvp__ec_producer_t *pr);
/* The request ids whose pushes failed since the last call. */
void kvp__ec_producer_take_failed(kvp__ec_producer_t *pr, char ***v_p, size_t *n_p);
void kvp__ec_producer_stats(kvp__ec_producer_t *pr, kvp_ec_worker_stats_t *st);

/* The store key of an encoder output in the cross-encoder cache:
 * "ec@<model>@<mm_hash>".  KVP_ERR_KEY_LENGTH when longer than KVP_KEY_MAX. */
kvp_status_t kvp__ec_store_key(const char *model, const char *mm_hash, char *buf, size_t len, size_t *n_p);

struct kvp_ec_worker {
    kvp_ec_config_t cfg;
    bool consumer, producer, receiving;
    char control_addr[300];
    pthread_mutex_t mu; /* loaded, failed_loads */
    kvp__ec_names_t loaded, failed_loads;
    kvp_pool_t *pool;
    char *model;
    /* consumer */
    uint8_t *slab;
    size_t slab_size;
    kvp__ec_resv_t *resv;
    kvp__ec_push_rx_t *rx;
    kvp__ec_ctl_server_t *srv;
    kvp__ec_xcache_t *xcache; /* the cross-encoder cache's lookups (NULL: none) */
    uint64_t cc_hits;
    /* producer */
    kvp__ec_producer_t *prod;
};

kvp_status_t kvp__ec_consumer_start(kvp_ec_worker_t *w, const kvp_ec_worker_params_t *p);
void kvp__ec_consumer_stop(kvp_ec_worker_t *w);
kvp_status_t kvp__ec_consumer_load(kvp_ec_worker_t *w, const kvp_ec_meta_t *meta,
                                   const kvp_ec_encoder_cache_t *cache);
void kvp__ec_consumer_stats(kvp_ec_worker_t *w, kvp_ec_worker_stats_t *st);

#endif
