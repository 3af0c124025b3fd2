/*
 * A hash map from request id (a byte string) to an item pointer, for the KV
 * scheduler's per-request state.  Open addressing with linear probing and
 * backward-shift deletion (no tombstones), power-of-two capacity, load <= 1/2.
 * The map does not own keys or items: a key must stay valid and unchanged
 * while its entry is in the map (items carry their own id).
 */
#ifndef KVP_KV_IDMAP_H
#define KVP_KV_IDMAP_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef struct kvp__kv_idmap_slot {
    uint64_t hash; /* 0 = empty slot (hashes are forced non-zero) */
    const char *key;
    size_t len;
    void *item;
} kvp__kv_idmap_slot_t;

typedef struct kvp__kv_idmap {
    kvp__kv_idmap_slot_t *slots;
    size_t cap; /* 0 or a power of two */
    size_t count;
} kvp__kv_idmap_t;

uint64_t kvp__kv_id_hash(const char *key, size_t len);

void kvp__kv_idmap_init(kvp__kv_idmap_t *m);
void kvp__kv_idmap_cleanup(kvp__kv_idmap_t *m);
/* The item for key, or NULL. */
void *kvp__kv_idmap_get(const kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash);
/* Inserts key -> item; the key must not be present.  KVP_OK or KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__kv_idmap_put(kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash,
                               void *item);
/* Removes key if present; returns its item or NULL. */
void *kvp__kv_idmap_del(kvp__kv_idmap_t *m, const char *key, size_t len, uint64_t hash);

#endif
