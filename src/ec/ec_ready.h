/*
 * The multi-shard readiness set (E2): per transfer id, the shards that have
 * reported the transfer ready so far, in an LRU capped at max_pending_events
 * entries.  A transfer is accepted only when every shard has reported.
 */
#ifndef KVP_EC_READY_H
#define KVP_EC_READY_H

#include "common/list.h"
#include "common/strmap.h"

typedef struct kvp__ec_rentry {
    char *tid;
    size_t tid_len;
    int64_t *shards; /* distinct shard ids */
    size_t n, cap;
    kvp__list_t lru; /* on kvp__ec_ready_t.lru */
} kvp__ec_rentry_t;

typedef struct {
    kvp__strmap_t map; /* tid -> entry */
    kvp__list_t lru;   /* the entries, oldest first */
} kvp__ec_ready_t;

void kvp__ec_ready_init(kvp__ec_ready_t *r);
void kvp__ec_ready_cleanup(kvp__ec_ready_t *r);
size_t kvp__ec_ready_size(const kvp__ec_ready_t *r);
/* setdefault(tid, set()) + move_to_end(tid). */
kvp_status_t kvp__ec_ready_touch(kvp__ec_ready_t *r, const char *tid, kvp__ec_rentry_t **e_p);
/* shards.add(shard). */
kvp_status_t kvp__ec_ready_add(kvp__ec_rentry_t *e, int64_t shard);
/* pop(tid, None). */
void kvp__ec_ready_forget(kvp__ec_ready_t *r, const char *tid);
/* Evict the oldest entries while more than limit are kept. */
void kvp__ec_ready_trim(kvp__ec_ready_t *r, size_t limit);

#endif
