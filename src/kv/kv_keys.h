/*
 * Store keys built in bulk (kv_keys.c).  A lookup or a save formats one key
 * per (chunk, rank namespace); everything but the hash is the same for every
 * chunk of a namespace, so it is formatted once, as the key's stem
 *
 *     [cache_prefix@]model@tp_rank:T@pcp<P>@dcp<D>@pp_rank:<PP>@group:<G>@
 *
 * and each key is then the stem and the hash's lowercase hex.  Both come
 * from kvp_kv_store_key_format, so a bulk key is byte for byte the one key
 * format.
 */
#ifndef KVP_KV_KEYS_H
#define KVP_KV_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/kv_connector.h"

/* The owned names of a key space: the model name (the last component of the
 * model path, §2.3) and the cache prefix (NULL and 0: none). */
typedef struct kvp__kv_names {
    char *model;
    size_t model_len;
    char *prefix;
    size_t prefix_len;
} kvp__kv_names_t;

/* From a model path and a cache prefix (NULL or "": none).  KVP_OK;
 * KVP_ERR_BAD_CONFIG (no name component in the path; logged);
 * KVP_ERR_NO_MEMORY.  On error n holds nothing to free. */
kvp_status_t kvp__kv_names_init(kvp__kv_names_t *n, const char *model_path,
                                const char *cache_prefix);
void kvp__kv_names_free(kvp__kv_names_t *n);
/* A store key over these names: prefix and model set, every rank, the group
 * and the hash zero (the caller sets what it needs). */
void kvp__kv_names_key(const kvp__kv_names_t *n, kvp_kv_store_key_t *k);

/* The stem of `key` (its hash ignored) into buf[0..buf_size), not
 * NUL-terminated, checked so that stem + the hex of any hash of up to
 * KVP_HASH_MAX_LEN bytes fits KVP_KV_STORE_KEY_MAX.  [out] len_p.  Returns
 * what kvp_kv_store_key_format returns for key with a 32-byte hash. */
kvp_status_t kvp__kv_key_stem(const kvp_kv_store_key_t *key, char *buf, size_t buf_size,
                              size_t *len_p);

/* Writes the lowercase hex of hash[0..n) to out (2n bytes, no NUL); returns 2n. */
size_t kvp__kv_key_hex(const uint8_t *hash, size_t n, char *out);

#endif
