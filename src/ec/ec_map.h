/*
 * A string-keyed hash map for the EC scheduler (open addressing, linear
 * probing, backward-shift deletion: no tombstones, so lookups stay short
 * however many records come and go).
 *
 * The map never copies keys: an entry's key must stay valid and unchanged
 * while the entry is in the map (the usual case is a key that lives in the
 * value, e.g. a record's transfer id).  kvp__ec_sset_* is a string set built
 * on top that owns copies of its strings.
 */
#ifndef KVP_EC_MAP_H
#define KVP_EC_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef struct {
    uint64_t hash;
    const char *key; /* NULL = empty slot */
    size_t len;
    void *val;
} kvp__ec_slot_t;

typedef struct {
    kvp__ec_slot_t *slots;
    size_t cap; /* power of two, or 0 */
    size_t n;
} kvp__ec_map_t;

void kvp__ec_map_init(kvp__ec_map_t *m);
/* Frees the slot array only (not keys or values). */
void kvp__ec_map_cleanup(kvp__ec_map_t *m);
void kvp__ec_map_clear(kvp__ec_map_t *m);
void *kvp__ec_map_get(const kvp__ec_map_t *m, const char *key, size_t len);
/* Insert or replace.  KVP_ERR_NO_MEMORY leaves the map unchanged. */
kvp_status_t kvp__ec_map_put(kvp__ec_map_t *m, const char *key, size_t len, void *val);
/* Removes the entry; returns its value (NULL if absent). */
void *kvp__ec_map_del(kvp__ec_map_t *m, const char *key, size_t len);

static inline void *kvp__ec_map_gets(const kvp__ec_map_t *m, const char *key)
{
    return kvp__ec_map_get(m, key, __builtin_strlen(key));
}

/* A set of strings that owns copies of them. */
typedef kvp__ec_map_t kvp__ec_sset_t;
void kvp__ec_sset_cleanup(kvp__ec_sset_t *s);
void kvp__ec_sset_clear(kvp__ec_sset_t *s);
bool kvp__ec_sset_has(const kvp__ec_sset_t *s, const char *str);
/* *added_p (optional) tells whether it was new. */
kvp_status_t kvp__ec_sset_add(kvp__ec_sset_t *s, const char *str, bool *added_p);
void kvp__ec_sset_discard(kvp__ec_sset_t *s, const char *str);

/* Owned string helpers (sizes tracked by strlen + 1). */
char *kvp__ec_strdup(const char *s);
void kvp__ec_strfree(char *s);

#endif
