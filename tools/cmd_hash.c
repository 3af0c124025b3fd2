/*
 * `kvpool hash`: vLLM-compatible chained block hashes of a token list, one
 * lowercase hex hash per full block, to debug hash mismatches between the
 * engine, the pool and a router (include/kvpool/hash.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/alloc.h"
#include "kvpool/hash.h"

#define HASH_MAX_MM 4096

static void hash_usage(FILE *out)
{
    fprintf(out,
            "usage: kvpool hash [--seed S] --block-size N [--algo sha256_cbor|xxhash_cbor]\n"
            "                   [--keys tagged|untagged] [--lora NAME [--lora-path P]] [--salt S]\n"
            "                   [--mm ID:OFFSET:LENGTH]... TOKEN...\n"
            "\n"
            "Prints vLLM's block hash of every full block of N tokens, one lowercase hex\n"
            "hash per line (request.block_hashes, connectors-spec 2.2).\n"
            "\n"
            "  --algo A          vLLM prefix_caching_hash_algo: sha256_cbor (default) or\n"
            "                    xxhash_cbor (pickle-based sha256/xxhash cannot be reproduced)\n"
            "  --seed S          the engine's PYTHONHASHSEED, exactly as set.  Without it, as\n"
            "                    vLLM 0.32 does: sha256_cbor uses the seed \"vllm-none-hash\";\n"
            "                    xxhash_cbor needs --seed (vLLM's NONE_HASH is then random and\n"
            "                    nothing can match; so was every algorithm's up to vLLM 0.27)\n"
            "  --block-size N    hash_block_size in tokens (>= 1)\n"
            "  --keys K          how extra keys are spelled: tagged (vLLM 0.32, the default:\n"
            "                    (\"lora\", name, path), (\"mm\", id, offset), (\"cache_salt\", s)) or\n"
            "                    untagged (vLLM 0.27: the bare values)\n"
            "  --lora NAME       the request's LoRA adapter name\n"
            "  --lora-path P     its lora_path (tagged keys only; default empty)\n"
            "  --salt S          the request's cache_salt (first block only)\n"
            "  --mm ID:OFF:LEN   a multimodal item: identifier (mm hash), token offset and\n"
            "                    length; repeat in offset order\n"
            "  --                end of options (tokens may follow)\n"
            "  TOKEN             token ids, decimal\n");
}

static int bad(const char *fmt, const char *arg)
{
    fprintf(stderr, "kvpool hash: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see kvpool hash --help)\n");
    return 2;
}

/* Strict decimal int64: optional '-', digits only, no overflow. */
static int parse_i64(const char *s, int64_t *v_p)
{
    if (!s || !(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')))
        return -1; /* no sign '+', no leading blanks */
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s)
        return -1;
    *v_p = v;
    return 0;
}

/* ID:OFFSET:LENGTH, split at the last two ':' (an identifier may hold ':'). */
static int parse_mm(const char *s, kvp_hash_mm_item_t *it)
{
    const char *c2 = strrchr(s, ':');
    if (!c2 || c2 == s)
        return -1;
    const char *c1 = c2 - 1;
    while (c1 > s && *c1 != ':')
        c1--;
    if (*c1 != ':')
        return -1;
    char num[32];
    size_t n = (size_t)(c2 - c1 - 1);
    if (n == 0 || n >= sizeof num)
        return -1;
    memcpy(num, c1 + 1, n);
    num[n] = '\0';
    if (parse_i64(num, &it->offset) != 0 || parse_i64(c2 + 1, &it->length) != 0)
        return -1;
    it->identifier = s;
    it->identifier_len = (size_t)(c1 - s);
    return 0;
}

int kvp_cmd_hash(int argc, char **argv)
{
    kvp_hash_algo_t algo = KVP_HASH_SHA256_CBOR;
    const char *seed = NULL;
    int64_t block_size = 0;
    kvp_hash_request_t req;
    memset(&req, 0, sizeof req);
    req.keys = KVP_HASH_KEYS_TAGGED; /* vLLM 0.32's spelling unless --keys untagged */
    kvp_hash_mm_item_t mm[HASH_MAX_MM];
    size_t nmm = 0;
    int first_tok = argc; /* index of the first token argument */

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            hash_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--") == 0) {
            first_tok = i + 1;
            break;
        }
        if (strncmp(a, "--", 2) != 0) {
            first_tok = i;
            break;
        }
        if (i + 1 >= argc)
            return bad("option %s needs a value", a);
        const char *v = argv[++i];
        if (strcmp(a, "--algo") == 0) {
            if (kvp_hash_algo_parse(v, &algo) != KVP_OK)
                return 2; /* kvp_hash_algo_parse logged why */
        } else if (strcmp(a, "--seed") == 0) {
            seed = v;
        } else if (strcmp(a, "--block-size") == 0) {
            if (parse_i64(v, &block_size) != 0 || block_size < 1 || block_size > (1 << 30))
                return bad("bad --block-size '%s' (need 1..2^30)", v);
        } else if (strcmp(a, "--lora") == 0) {
            req.lora_name = v;
            req.lora_name_len = strlen(v);
        } else if (strcmp(a, "--keys") == 0) {
            if (strcmp(v, "tagged") == 0)
                req.keys = KVP_HASH_KEYS_TAGGED;
            else if (strcmp(v, "untagged") == 0)
                req.keys = KVP_HASH_KEYS_UNTAGGED;
            else
                return bad("bad --keys '%s' (tagged or untagged)", v);
        } else if (strcmp(a, "--lora-path") == 0) {
            req.lora_path = v;
            req.lora_path_len = strlen(v);
        } else if (strcmp(a, "--salt") == 0) {
            req.cache_salt = v;
            req.cache_salt_len = strlen(v);
        } else if (strcmp(a, "--mm") == 0) {
            if (nmm == HASH_MAX_MM)
                return bad("more than %s --mm items", "4096");
            if (parse_mm(v, &mm[nmm]) != 0)
                return bad("bad --mm '%s' (need ID:OFFSET:LENGTH)", v);
            nmm++;
        } else {
            return bad("unknown option '%s'", a);
        }
    }
    if (!seed && algo != KVP_HASH_SHA256_CBOR)
        return bad("%s", "--seed is required for xxhash_cbor (the engine's PYTHONHASHSEED; "
                         "without it vLLM's NONE_HASH is random)");
    if (block_size == 0)
        return bad("%s", "--block-size is required");
    req.mm_items = mm;
    req.num_mm_items = nmm;

    size_t ntok = (size_t)(argc - first_tok);
    int64_t *tokens = NULL;
    kvp_hash_t *hashes = NULL;
    size_t nblocks = ntok / (size_t)block_size, nhashes = 0;
    int rc = 0;
    if (ntok && !(tokens = kvp__malloc(ntok * sizeof *tokens))) {
        fprintf(stderr, "kvpool hash: out of memory\n");
        return 1;
    }
    for (size_t t = 0; t < ntok; t++) {
        if (parse_i64(argv[first_tok + (int)t], &tokens[t]) != 0) {
            rc = bad("bad token id '%s' (need a decimal integer)", argv[first_tok + (int)t]);
            goto free_tokens;
        }
    }
    if (nblocks && !(hashes = kvp__malloc(nblocks * sizeof *hashes))) {
        fprintf(stderr, "kvpool hash: out of memory\n");
        rc = 1;
        goto free_tokens;
    }

    /* The library logs its own one-line error for bad input. */
    kvp_hash_t none_hash;
    kvp_status_t st = kvp_hash_none_hash(algo, seed, seed ? strlen(seed) : 0, &none_hash);
    if (st == KVP_OK)
        st = kvp_hash_request_blocks_i64(algo, &none_hash, tokens, ntok, (size_t)block_size, &req,
                                         hashes, nblocks, &nhashes);
    if (st != KVP_OK) {
        rc = st <= KVP_ERR_INVALID_ARG && st > KVP_ERR_NO_MEMORY ? 2 : 1;
        goto free_hashes;
    }
    for (size_t b = 0; b < nhashes; b++) {
        char hex[KVP_HASH_HEX_MAX];
        kvp_hash_to_hex(&hashes[b], hex);
        puts(hex);
    }
    if (fflush(stdout) != 0)
        rc = 1;

free_hashes:
    kvp__free(hashes, nblocks * sizeof *hashes);
free_tokens:
    kvp__free(tokens, ntok * sizeof *tokens);
    return rc;
}
