/*
 * kvpool block-hash contract: vLLM-compatible chained block hashes
 * (connectors-spec §2.2).  The store keys built from them (§2.3) are the KV
 * connector's: include/kvpool/kv_connector.h, "Store keys".
 *
 * Block hashes.  vLLM hashes a request's tokens in full blocks of
 * `hash_block_size` tokens.  Block i's hash is
 *
 *     h_i = H( (parent, tuple(tokens of block i), extra_keys) )
 *
 * where parent is h_{i-1}, or NONE_HASH for block 0, and H is one of
 *
 *     sha256_cbor:  SHA-256 of cbor2.dumps(obj, canonical=True)      (32 B)
 *     xxhash_cbor:  XXH3-128 of the same CBOR, canonical big-endian  (16 B)
 *
 * (vLLM's pickle-based "sha256" and "xxhash" cannot be reproduced outside
 * Python and are refused with KVP_ERR_UNSUPPORTED.)  In CBOR the triple is an
 * array of 3: a byte string (the parent), an array of integers (the tokens)
 * and null or an array of extra keys, in this order:
 *   1. the LoRA name (text), if the request has a LoRA adapter;
 *   2. one array [identifier (text), offset] per multimodal item overlapping
 *      the block, offset = item offset - block start (may be negative);
 *   3. the cache salt (text), on block 0 only, if non-empty;
 *   4. the SHA-256 (32-byte string) of the block's raw prompt-embeds bytes.
 * Nothing to add gives null, not an empty array.
 *
 * NONE_HASH is H(seed) with the seed as a CBOR text string (vLLM 0.32's
 * init_none_hash): the engine's PYTHONHASHSEED string exactly as set ("0"
 * hashes the text "0"); without PYTHONHASHSEED, for sha256_cbor the fixed
 * seed "vllm-none-hash" (KVP_HASH_DEFAULT_SEED: independent engines share
 * hashes without configuration), for xxhash_cbor (not collision resistant)
 * a random one, so no other process can ever match its hashes.  The older
 * rule (vLLM up to 0.27, the seed scheduler's release) drew 32 random bytes
 * for every algorithm when PYTHONHASHSEED was unset.  Every engine, pool and
 * router that must agree has to use the same algorithm and the same seed.
 *
 * Strings.  Every text (seed, LoRA name, salt, mm identifier) is passed as
 * pointer + length (no NUL needed; embedded NULs allowed) and must be valid
 * UTF-8, since these are Python strs: anything else is KVP_ERR_INVALID_ARG.
 *
 * Every call validates its arguments first; bad input returns a specific
 * KVP_ERR_* status, logs one line and leaves the outputs unspecified.  Any
 * hashing call may also return KVP_ERR_INTERNAL if OpenSSL fails (logged).
 * All calls are thread-safe: NONE_HASH is passed explicitly, and the only
 * shared state is OpenSSL's SHA-256 handle, fetched once.
 */
#ifndef KVPOOL_HASH_H
#define KVPOOL_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_HASH_MAX_LEN 32u        /* largest digest (and random NONE_HASH) */
#define KVP_HASH_SHA256_LEN 32u
#define KVP_HASH_XXH3_128_LEN 16u
#define KVP_HASH_HEX_MAX (2u * KVP_HASH_MAX_LEN + 1u) /* hex of a hash + NUL */

typedef enum kvp_hash_algo {
    KVP_HASH_SHA256_CBOR = 1, /* vLLM prefix_caching_hash_algo "sha256_cbor" */
    KVP_HASH_XXHASH_CBOR = 2, /* vLLM prefix_caching_hash_algo "xxhash_cbor" */
} kvp_hash_algo_t;

/* A block hash or NONE_HASH: `len` bytes of `bytes` are used. */
typedef struct kvp_hash {
    uint8_t len;
    uint8_t bytes[KVP_HASH_MAX_LEN];
} kvp_hash_t;

/* How extra keys are spelled.  vLLM 0.27 (the seed's release) puts bare
 * values in extra_keys: the LoRA name, [identifier, offset] per multimodal
 * item, the salt, the prompt-embeds digest.  vLLM 0.32 tags each one:
 * ["lora", name, path], ["mm", identifier, offset], ["cache_salt", salt],
 * ["prompt_embeds", digest] (same order, same which-block rules). */
typedef enum kvp_hash_keys {
    KVP_HASH_KEYS_UNTAGGED = 0, /* vLLM 0.27: bare values (a zeroed struct) */
    KVP_HASH_KEYS_TAGGED = 1,   /* vLLM 0.32: tagged tuples, the LoRA path included */
} kvp_hash_keys_t;

/* One multimodal key of one block, as vLLM puts it in extra_keys. */
typedef struct kvp_hash_mm_key {
    const char *identifier; /* [in] UTF-8, identifier_len bytes (mm hash) */
    size_t identifier_len;
    int64_t offset;         /* [in] item offset - block start (<0: began earlier) */
} kvp_hash_mm_key_t;

/* The extra_keys of one block, given literally (kvp_hash_block).  Every
 * pointer is owned by the caller and only read during the call. */
typedef struct kvp_hash_extra_keys {
    const char *lora_name;      /* [in] NULL: no LoRA; else included (even if empty) */
    size_t lora_name_len;
    const kvp_hash_mm_key_t *mm_keys; /* [in] num_mm_keys entries, in this order */
    size_t num_mm_keys;
    const char *cache_salt;     /* [in] NULL or empty: none */
    size_t cache_salt_len;
    const uint8_t *prompt_embeds_sha256; /* [in] NULL, or the block's 32-byte digest */
    kvp_hash_keys_t keys;       /* [in] the spelling (0: untagged) */
    const char *lora_path;      /* [in] tagged only: the LoRA's path (NULL: "") */
    size_t lora_path_len;
} kvp_hash_extra_keys_t;

/* A multimodal item of a request, in absolute token positions. */
typedef struct kvp_hash_mm_item {
    const char *identifier; /* [in] UTF-8 (vLLM's mm_feature.identifier) */
    size_t identifier_len;
    int64_t offset;         /* [in] first token of the item, >= 0 */
    int64_t length;         /* [in] tokens, >= 1 */
} kvp_hash_mm_item_t;

/* What of a request feeds its extra keys (kvp_hash_request_blocks).  A
 * zeroed struct means none.  Pointers are owned by the caller and only read
 * during the call. */
typedef struct kvp_hash_request {
    const char *lora_name;  /* [in] NULL: no LoRA request */
    size_t lora_name_len;
    const kvp_hash_mm_item_t *mm_items; /* [in] sorted by offset (non-decreasing) */
    size_t num_mm_items;
    const char *cache_salt; /* [in] NULL or empty: none */
    size_t cache_salt_len;
    /* [in] NULL, or 32 bytes per block: block i's prompt-embeds SHA-256 at
     * [32*i]; must cover every full block of the token list. */
    const uint8_t *prompt_embeds_sha256;
    size_t num_prompt_embeds_blocks;
    kvp_hash_keys_t keys;   /* [in] the spelling (0: untagged, vLLM 0.27) */
    const char *lora_path;  /* [in] tagged only: the LoRA request's lora_path (NULL: "") */
    size_t lora_path_len;
} kvp_hash_request_t;

/* "sha256_cbor" / "xxhash_cbor" -> algo.  Returns KVP_OK; KVP_ERR_NULL_POINTER;
 * KVP_ERR_UNSUPPORTED for vLLM's pickle-based "sha256" and "xxhash";
 * KVP_ERR_INVALID_ARG for any other name. */
KVP_API kvp_status_t kvp_hash_algo_parse(const char *name, kvp_hash_algo_t *algo_p);
/* The vLLM name of `algo` (static string), or NULL if unknown. */
KVP_API const char *kvp_hash_algo_name(kvp_hash_algo_t algo);
/* Digest bytes of `algo` (32 or 16), or 0 if unknown. */
KVP_API size_t kvp_hash_algo_len(kvp_hash_algo_t algo);

/* The seed vLLM 0.32 uses for a cryptographic algorithm when PYTHONHASHSEED
 * is unset. */
#define KVP_HASH_DEFAULT_SEED "vllm-none-hash"

/* NONE_HASH for `algo` and the PYTHONHASHSEED string seed[0..seed_len):
 * H(cbor text seed).  seed == NULL means "PYTHONHASHSEED unset" (vLLM
 * 0.32): sha256_cbor hashes KVP_HASH_DEFAULT_SEED; xxhash_cbor hashes a
 * random seed (64 hex digits of 32 random bytes, logged as a warning, since
 * nothing else can ever match it).
 *   [in]  algo, seed (UTF-8, may be NULL), seed_len
 *   [out] out_p
 * Returns KVP_OK; KVP_ERR_NULL_POINTER (out_p); KVP_ERR_INVALID_ARG (unknown
 * algo, seed not UTF-8); KVP_ERR_NO_MEMORY; KVP_ERR_IO (no randomness). */
KVP_API kvp_status_t kvp_hash_none_hash(kvp_hash_algo_t algo, const char *seed, size_t seed_len,
                                        kvp_hash_t *out_p);

/* One block hash: H((parent, tuple(tokens), extra_keys)).
 *   [in]  algo
 *   [in]  parent      the previous block's hash, or NONE_HASH for block 0
 *                     (len 1..32)
 *   [in]  tokens      num_tokens token ids (may be NULL when num_tokens is 0)
 *   [in]  extra       NULL, or the block's extra keys; when nothing in it is
 *                     set the CBOR is null, as in vLLM
 *   [out] out_p       may alias parent
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG (unknown algo,
 * bad parent length, a string that is not UTF-8); KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_hash_block(kvp_hash_algo_t algo, const kvp_hash_t *parent,
                                    const uint32_t *tokens, size_t num_tokens,
                                    const kvp_hash_extra_keys_t *extra, kvp_hash_t *out_p);
/* The same for signed 64-bit token ids (negative ids encode as CBOR
 * negative integers, as Python would). */
KVP_API kvp_status_t kvp_hash_block_i64(kvp_hash_algo_t algo, const kvp_hash_t *parent,
                                        const int64_t *tokens, size_t num_tokens,
                                        const kvp_hash_extra_keys_t *extra, kvp_hash_t *out_p);

/* A request's block hashes, as vLLM's request block hasher computes
 * request.block_hashes: full blocks of hash_block_size tokens only, chained
 * from none_hash, extra keys from `req` (LoRA on every block; mm keys for
 * the items overlapping each block, by vLLM's generate_block_hash_extra_keys
 * walk; salt on block 0; prompt-embeds digests per block).
 *
 * Incremental use: *num_hashes_p holds, on entry, how many hashes of this
 * request hashes[] already holds (0 the first time); blocks after them are
 * appended and *num_hashes_p is updated.  As in vLLM, a call that starts
 * after block 0 looks only at the last mm item (it is hashing decode
 * blocks); hashing a prompt in one call from 0 considers every item.
 *   [in]     algo, none_hash, tokens[num_tokens] (all tokens so far),
 *            hash_block_size (>= 1), req (NULL = no extra keys)
 *   [in,out] hashes[max_hashes], num_hashes_p
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_INVALID_ARG (unknown algo,
 * block size 0, bad none_hash, *num_hashes_p beyond the full blocks, an mm
 * item with offset < 0 or length < 1 or out of order, a string that is not
 * UTF-8, too few prompt-embeds digests); KVP_ERR_BUFFER_TOO_SMALL
 * (max_hashes < num_tokens / hash_block_size; nothing written);
 * KVP_ERR_NO_MEMORY (only for blocks whose CBOR exceeds 8 KiB, about 1,600
 * 32-bit tokens; the hashes counted in *num_hashes_p are still valid). */
KVP_API kvp_status_t kvp_hash_request_blocks(kvp_hash_algo_t algo, const kvp_hash_t *none_hash,
                                             const uint32_t *tokens, size_t num_tokens,
                                             size_t hash_block_size, const kvp_hash_request_t *req,
                                             kvp_hash_t *hashes, size_t max_hashes,
                                             size_t *num_hashes_p);
KVP_API kvp_status_t kvp_hash_request_blocks_i64(kvp_hash_algo_t algo,
                                                 const kvp_hash_t *none_hash,
                                                 const int64_t *tokens, size_t num_tokens,
                                                 size_t hash_block_size,
                                                 const kvp_hash_request_t *req, kvp_hash_t *hashes,
                                                 size_t max_hashes, size_t *num_hashes_p);

/* SHA-256 of raw bytes (e.g. a block's prompt embeddings for
 * kvp_hash_request_t.prompt_embeds_sha256).  data may be NULL when len is 0.
 * Returns KVP_OK; KVP_ERR_NULL_POINTER; KVP_ERR_NO_MEMORY. */
KVP_API kvp_status_t kvp_hash_sha256(const void *data, size_t len, uint8_t out[32]);

/* Lowercase hex of h into out (2*h->len chars + NUL; KVP_HASH_HEX_MAX bytes
 * always suffice).  Returns the number of hex characters. */
KVP_API size_t kvp_hash_to_hex(const kvp_hash_t *h, char out[KVP_HASH_HEX_MAX]);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_HASH_H */
