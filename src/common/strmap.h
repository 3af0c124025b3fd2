/*
 * The string map: byte-string keys to pointers.  Open addressing with linear
 * probing and backward-shift deletion (no tombstones, so lookups stay short
 * however many entries come and go), power-of-two capacity, load <= 1/2.
 *
 * The map never copies keys: an entry's key must stay valid and unchanged
 * while the entry is in the map (the usual case is a key that lives in the
 * value, e.g. a record's id).  Callers that hash a key once and keep the hash
 * (a record that is looked up and removed many times) use the _h forms with
 * kvp__strmap_hash(); the plain forms hash for themselves.
 *
 * kvp__strset_* is a set of strings built on top that owns copies of them.
 * Iterating: slots[0..cap) with key != NULL (the order is the hash order).
 * Not thread-safe: the owner serialises.
 */
#ifndef KVP_COMMON_STRMAP_H
#define KVP_COMMON_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef struct kvp__strmap_slot {
    uint64_t hash;
    const char *key; /* NULL = empty slot */
    size_t len;
    void *val;
} kvp__strmap_slot_t;

typedef struct kvp__strmap {
    kvp__strmap_slot_t *slots;
    size_t cap; /* power of two, or 0 */
    size_t n;
} kvp__strmap_t;

uint64_t kvp__strmap_hash(const char *key, size_t len);

void kvp__strmap_init(kvp__strmap_t *m);
/* Frees the slot array only (not keys or values). */
void kvp__strmap_cleanup(kvp__strmap_t *m);
void kvp__strmap_clear(kvp__strmap_t *m);
/* The value for key, or NULL. */
void *kvp__strmap_get_h(const kvp__strmap_t *m, const char *key, size_t len, uint64_t hash);
/* Insert or replace.  KVP_ERR_NO_MEMORY leaves the map unchanged. */
kvp_status_t kvp__strmap_put_h(kvp__strmap_t *m, const char *key, size_t len, uint64_t hash, void *val);
/* Removes the entry; returns its value (NULL if absent). */
void *kvp__strmap_del_h(kvp__strmap_t *m, const char *key, size_t len, uint64_t hash);

static inline void *kvp__strmap_get(const kvp__strmap_t *m, const char *key, size_t len)
{
    return m->n ? kvp__strmap_get_h(m, key, len, kvp__strmap_hash(key, len)) : NULL;
}
static inline void *kvp__strmap_gets(const kvp__strmap_t *m, const char *key)
{
    return kvp__strmap_get(m, key, __builtin_strlen(key));
}
static inline kvp_status_t kvp__strmap_put(kvp__strmap_t *m, const char *key, size_t len, void *val)
{
    return kvp__strmap_put_h(m, key, len, kvp__strmap_hash(key, len), val);
}
static inline void *kvp__strmap_del(kvp__strmap_t *m, const char *key, size_t len)
{
    return m->n ? kvp__strmap_del_h(m, key, len, kvp__strmap_hash(key, len)) : NULL;
}

/* A set of strings that owns copies of them (each entry's value is its key). */
typedef kvp__strmap_t kvp__strset_t;
void kvp__strset_cleanup(kvp__strset_t *s);
void kvp__strset_clear(kvp__strset_t *s);
bool kvp__strset_has(const kvp__strset_t *s, const char *str);
/* *added_p (optional) tells whether it was new. */
kvp_status_t kvp__strset_add(kvp__strset_t *s, const char *str, bool *added_p);
void kvp__strset_discard(kvp__strset_t *s, const char *str);

#endif
