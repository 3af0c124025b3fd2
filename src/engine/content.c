/* Deterministic tokens, block hashes and KV bytes (see content.h). */
#include "engine/content.h"

#include <string.h>
#include <xxhash.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/mix.h"
#include "engine/trace.h"

#define VOCAB 32000

int64_t kvp__eng_trace_token(int64_t h, uint32_t i)
{
    return 1 + (int64_t)(kvp__mix64((uint64_t)h * KVP__TRACE_BLOCK_TOKENS + i) % VOCAB);
}

int64_t kvp__eng_output_token(uint64_t req, int64_t pos)
{
    return 1 + (int64_t)(kvp__mix64(~(req << 24) ^ (uint64_t)pos) % VOCAB);
}

/* One hash id's block hashes: the first `n` of its 512 / block_size blocks,
 * chained from `parent`. */
typedef struct entry {
    int64_t id;
    uint8_t parent[KVP__ENG_HASH_LEN];
    uint32_t n, cap;
    uint8_t *hashes;
} entry_t;

kvp_status_t kvp__eng_hashes_init(kvp__eng_hashes_t *c, uint32_t block_size)
{
    memset(c, 0, sizeof *c);
    kvp__strmap_init(&c->map);
    c->block_size = block_size;
    if (block_size == 0 || KVP__TRACE_BLOCK_TOKENS % block_size)
        return KVP_ERR_INVALID_ARG;
    return kvp_hash_none_hash(KVP_HASH_SHA256_CBOR, NULL, 0, &c->none_hash);
}

void kvp__eng_hashes_cleanup(kvp__eng_hashes_t *c)
{
    for (size_t i = 0; i < c->map.cap; i++) {
        entry_t *e = c->map.slots[i].key ? c->map.slots[i].val : NULL;
        if (e) {
            kvp__free(e->hashes, (size_t)e->cap * KVP__ENG_HASH_LEN);
            kvp__free(e, sizeof *e);
        }
    }
    kvp__strmap_cleanup(&c->map);
}

kvp_status_t kvp__eng_block_hash(const uint8_t *parent, const int64_t *tokens, size_t bs,
                                 uint8_t *out)
{
    kvp_hash_t p, h;
    memset(&p, 0, sizeof p);
    memcpy(p.bytes, parent, KVP__ENG_HASH_LEN);
    p.len = KVP__ENG_HASH_LEN;
    kvp_status_t st = kvp_hash_block_i64(KVP_HASH_SHA256_CBOR, &p, tokens, bs, NULL, &h);
    if (st == KVP_OK)
        memcpy(out, h.bytes, KVP__ENG_HASH_LEN);
    return st;
}

/* Hashes blocks [from, to) of hash id `id`'s 512 tokens into out. */
static kvp_status_t hash_blocks(uint32_t bs, int64_t id, const uint8_t *parent, uint32_t from,
                                uint32_t to, const int64_t *tokens, uint8_t *out)
{
    for (uint32_t b = from; b < to; b++) {
        const uint8_t *prev = b ? out + (size_t)(b - 1) * KVP__ENG_HASH_LEN : parent;
        kvp_status_t st = kvp__eng_block_hash(prev, tokens + (size_t)b * bs, bs,
                                              out + (size_t)b * KVP__ENG_HASH_LEN);
        if (st != KVP_OK)
            return st;
    }
    (void)id;
    return KVP_OK;
}

kvp_status_t kvp__eng_prompt(kvp__eng_hashes_t *c, const int64_t *hash_ids, uint32_t num_ids,
                             int64_t input_length, int64_t *tokens, uint8_t *hashes)
{
    const uint32_t bs = c->block_size, per = KVP__TRACE_BLOCK_TOKENS / bs;
    const uint8_t *parent = c->none_hash.bytes;
    size_t done = 0; /* hashes written */
    for (uint32_t j = 0; j < num_ids; j++) {
        int64_t base = (int64_t)j * KVP__TRACE_BLOCK_TOKENS;
        int64_t ntok = input_length - base < KVP__TRACE_BLOCK_TOKENS ? input_length - base
                                                                     : KVP__TRACE_BLOCK_TOKENS;
        if (ntok <= 0)
            break;
        int64_t *t = tokens + base;
        for (int64_t i = 0; i < ntok; i++)
            t[i] = kvp__eng_trace_token(hash_ids[j], (uint32_t)i);
        uint32_t need = (uint32_t)(ntok / bs);
        if (need == 0)
            break;
        int64_t id = hash_ids[j];
        entry_t *e = kvp__strmap_get(&c->map, (const char *)&id, sizeof id);
        if (e && memcmp(e->parent, parent, KVP__ENG_HASH_LEN) != 0)
            e = NULL; /* the id after another prefix: not ours to reuse */
        else if (!e) {
            e = kvp__calloc(1, sizeof *e);
            if (!e)
                return KVP_ERR_NO_MEMORY;
            e->id = id;
            e->cap = per;
            e->hashes = kvp__malloc((size_t)per * KVP__ENG_HASH_LEN);
            memcpy(e->parent, parent, KVP__ENG_HASH_LEN);
            if (!e->hashes || kvp__strmap_put(&c->map, (const char *)&e->id, sizeof e->id, e)) {
                kvp__free(e->hashes, (size_t)per * KVP__ENG_HASH_LEN);
                kvp__free(e, sizeof *e);
                return KVP_ERR_NO_MEMORY;
            }
            c->bytes += sizeof *e + (size_t)per * KVP__ENG_HASH_LEN + 32;
        }
        uint8_t *out = hashes + done * KVP__ENG_HASH_LEN;
        if (e) {
            if (e->n < need) {
                /* tokens of blocks before e->n were written above; the
                 * chain continues from the entry's last hash */
                kvp_status_t st = hash_blocks(bs, id, e->parent, e->n, need, t, e->hashes);
                if (st != KVP_OK)
                    return st;
                e->n = need;
            }
            memcpy(out, e->hashes, (size_t)need * KVP__ENG_HASH_LEN);
        } else {
            kvp_status_t st = hash_blocks(bs, id, parent, 0, need, t, out);
            if (st != KVP_OK)
                return st;
        }
        done += need;
        parent = out + (size_t)(need - 1) * KVP__ENG_HASH_LEN;
        if (need < per)
            break; /* a partial block ends the prompt's full blocks */
    }
    return KVP_OK;
}

uint64_t kvp__eng_key_seed(const char *key, size_t len) { return XXH3_64bits(key, len); }

/* Word i of the stream: kvp__mix64(seed' + i), seed' = f(seed, layer, kv). */
static inline uint64_t stream_seed(uint64_t seed, uint32_t layer, uint32_t kv)
{
    return kvp__mix64(seed ^ ((uint64_t)layer << 1 | kv) * 0xd6e8feb86659fd93ull);
}

void kvp__eng_kv_fill(uint8_t *dst, size_t len, uint64_t seed, uint32_t layer, uint32_t kv)
{
    uint64_t s = stream_seed(seed, layer, kv);
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w = kvp__mix64(s + i);
        memcpy(dst + i, &w, 8);
    }
    if (i < len) {
        uint64_t w = kvp__mix64(s + i);
        memcpy(dst + i, &w, len - i);
    }
}

bool kvp__eng_kv_check(const uint8_t *src, size_t len, uint64_t seed, uint32_t layer, uint32_t kv)
{
    uint64_t s = stream_seed(seed, layer, kv), acc = 0;
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, src + i, 8);
        acc |= w ^ kvp__mix64(s + i);
    }
    if (i < len) {
        uint64_t w = kvp__mix64(s + i), v = 0;
        memcpy(&v, src + i, len - i);
        uint64_t m = 0;
        memcpy(&m, &w, len - i);
        acc |= v ^ m;
    }
    return acc == 0;
}
