/*
 * What the engine model computes, deterministically: token ids, the vLLM
 * block hashes of a trace request, and KV bytes.
 *
 * Tokens.  Block h of a trace (512 tokens per hash id) holds the same 512
 * token ids wherever h appears; a partial last block holds a prefix of them.
 * Generated tokens are a function of (request, position).  So equal trace
 * prefixes give equal token prefixes, and therefore equal vLLM block hashes
 * (sha256_cbor, chained, include/kvpool/hash.h).
 *
 * Hashes.  A hash id is a prefix hash (it stands for its block and all
 * before it), so the vLLM hashes of the blocks inside it depend on it alone:
 * the cache keeps them per hash id, with the parent hash they were chained
 * from (a trace that reuses an id after another prefix is recomputed, never
 * served a wrong hash).  Memory grows with unique hash ids.
 *
 * KV bytes.  The K or V bytes of a block for one layer are a stream seeded
 * by (store key, layer, K/V): a function of the key, not of the rank, since
 * ranks that share a KV head share keys; byte o of the stream belongs to
 * token position o / bytes-per-token.  Every block loaded from the pool is
 * checked against it.
 */
#ifndef KVP_ENGINE_CONTENT_H
#define KVP_ENGINE_CONTENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/strmap.h"
#include "kvpool/hash.h"
#include "kvpool/status.h"

#define KVP__ENG_HASH_LEN 32u /* sha256_cbor */

/* Token i (0..511) of trace block h. */
int64_t kvp__eng_trace_token(int64_t h, uint32_t i);
/* Generated token at position pos of request req. */
int64_t kvp__eng_output_token(uint64_t req, int64_t pos);

typedef struct kvp__eng_hashes {
    kvp__strmap_t map;      /* hash id (8 bytes) -> entry */
    uint32_t block_size;    /* vLLM block size; divides 512 */
    kvp_hash_t none_hash;
    uint64_t bytes;         /* held by the entries */
} kvp__eng_hashes_t;

kvp_status_t kvp__eng_hashes_init(kvp__eng_hashes_t *c, uint32_t block_size);
void kvp__eng_hashes_cleanup(kvp__eng_hashes_t *c);

/* A trace request's prompt: tokens[input_length] and the hashes of its full
 * blocks (input_length / block_size of them, KVP__ENG_HASH_LEN bytes each)
 * into caller arrays.  Not thread-safe (the cache is the caller's). */
kvp_status_t kvp__eng_prompt(kvp__eng_hashes_t *c, const int64_t *hash_ids, uint32_t num_ids,
                             int64_t input_length, int64_t *tokens, uint8_t *hashes);

/* The hash of the block tokens[0..bs) chained from parent (32 bytes). */
kvp_status_t kvp__eng_block_hash(const uint8_t *parent, const int64_t *tokens, size_t bs,
                                 uint8_t *out);

/* The seed of a store key's bytes (for kvp__eng_kv_fill/_check). */
uint64_t kvp__eng_key_seed(const char *key, size_t len);
/* Fills / checks len bytes of the stream of (seed, layer, kv). */
void kvp__eng_kv_fill(uint8_t *dst, size_t len, uint64_t seed, uint32_t layer, uint32_t kv);
bool kvp__eng_kv_check(const uint8_t *src, size_t len, uint64_t seed, uint32_t layer, uint32_t kv);

#endif
