/*
 * KV connector configuration: defaults (§2.1), validation, and the derivation
 * of (scheduler block size, hash block size, partial-hit flag) from the
 * KV-cache groups (§2.2, vLLM's resolve_kv_cache_block_sizes and
 * partial_hash_hits_enabled).
 */
#include "kv/kv_config.h"

#include <math.h>
#include <string.h>

#include "common/log.h"
#include "common/sized.h"

/* The index of s in names[0..n), or -1. */
static int name_index(const char *const *names, int n, const char *s)
{
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0)
            return i;
    return -1;
}

static const char *const g_roles[] = {"kv_producer", "kv_consumer", "kv_both"};

kvp_status_t kvp_kv_role_parse(const char *s, kvp_kv_role_t *role_p)
{
    if (!s || !role_p)
        return KVP_ERR_NULL_POINTER;
    int i = name_index(g_roles, 3, s);
    if (i < 0) {
        kvp_error("kv connector: unknown kv_role '%s'", s);
        return KVP_ERR_BAD_CONFIG;
    }
    *role_p = (kvp_kv_role_t)i;
    return KVP_OK;
}

const char *kvp_kv_role_name(kvp_kv_role_t role)
{
    return (unsigned)role < 3 ? g_roles[role] : "unknown";
}

static const char *const g_load_policies[] = {"always", "faster"};

kvp_status_t kvp_kv_load_policy_parse(const char *s, kvp_kv_load_policy_t *policy_p)
{
    if (!s || !policy_p)
        return KVP_ERR_NULL_POINTER;
    int i = name_index(g_load_policies, 2, s);
    if (i < 0) {
        kvp_error("kv connector: unknown load_policy '%s' (always or faster)", s);
        return KVP_ERR_BAD_CONFIG;
    }
    *policy_p = (kvp_kv_load_policy_t)i;
    return KVP_OK;
}

const char *kvp_kv_load_policy_name(kvp_kv_load_policy_t policy)
{
    return (unsigned)policy < 2 ? g_load_policies[policy] : "unknown";
}

void kvp_kv_config_init_size(kvp_kv_config_t *cfg, size_t size)
{
    if (!cfg || size < sizeof cfg->size)
        return;
    kvp_kv_config_t d = {0};
    d.kv_role = KVP_KV_ROLE_BOTH;
    d.load_async = true;
    d.lookup_async = false;
    d.enable_lookup = true;
    d.block_size = 16;
    d.hash_block_size = 16;
    d.partial_hits = false;
    d.tp_size = d.pp_size = d.pcp_size = d.dcp_size = 1;
    d.num_kv_heads = 1;
    d.load_policy = KVP_KV_LOAD_ALWAYS;
    d.prefill_us_per_token = 40.0;
    d.load_bytes_per_token = 0;
    d.load_bytes_per_s = 0.0;
    d.lookup_rtt_us = 100.0;
    /* a newer caller (size > sizeof d): its extra fields untouched, and the
     * size kept, so that every call refuses the config (KVP_ERR_VERSION) */
    memcpy(cfg, &d, size < sizeof d ? size : sizeof d);
    cfg->size = (uint32_t)size;
}

kvp_status_t kvp__kv_config_adopt(const kvp_kv_config_t *in, kvp_kv_config_t *out)
{
    if (!in || !out)
        return KVP_ERR_NULL_POINTER;
    kvp_kv_config_init(out);
    kvp_status_t st = kvp__sized_adopt(out, sizeof *out, in);
    if (st != KVP_OK)
        kvp_error("kv connector: config size %u (this library's struct has %zu bytes)", (unsigned)in->size,
                  sizeof *out);
    return st;
}

kvp_status_t kvp_kv_config_validate(const kvp_kv_config_t *in)
{
    kvp_kv_config_t c;
    kvp_status_t st = kvp__kv_config_adopt(in, &c);
    if (st != KVP_OK)
        return st;
    const kvp_kv_config_t *cfg = &c;
    if ((unsigned)cfg->kv_role > KVP_KV_ROLE_BOTH) {
        kvp_error("kv connector: bad kv_role %d", (int)cfg->kv_role);
        return KVP_ERR_BAD_CONFIG;
    }
    if (cfg->block_size < 1 || cfg->hash_block_size < 1 ||
        cfg->block_size % cfg->hash_block_size != 0) {
        kvp_error("kv connector: block_size %lld must be a positive multiple of "
                  "hash_block_size %lld",
                  (long long)cfg->block_size, (long long)cfg->hash_block_size);
        return KVP_ERR_BAD_CONFIG;
    }
    if (cfg->partial_hits && !(cfg->block_size > cfg->hash_block_size)) {
        kvp_error("kv connector: partial hits need block_size > hash_block_size");
        return KVP_ERR_BAD_CONFIG;
    }
    if (cfg->tp_size < 1 || cfg->pp_size < 1 || cfg->pcp_size < 1 || cfg->dcp_size < 1 ||
        cfg->num_kv_heads < 1) {
        kvp_error("kv connector: parallel sizes and num_kv_heads must be >= 1");
        return KVP_ERR_BAD_CONFIG;
    }
    if ((unsigned)cfg->load_policy > KVP_KV_LOAD_FASTER) {
        kvp_error("kv connector: bad load_policy %d", (int)cfg->load_policy);
        return KVP_ERR_BAD_CONFIG;
    }
    /* The costs are read only by F1 (kv_sched.c), so only FASTER checks them. */
    if (cfg->load_policy == KVP_KV_LOAD_FASTER &&
        (!(isfinite(cfg->prefill_us_per_token) && cfg->prefill_us_per_token > 0) ||
         !(isfinite(cfg->load_bytes_per_s) && cfg->load_bytes_per_s >= 0) ||
         !(isfinite(cfg->lookup_rtt_us) && cfg->lookup_rtt_us >= 0))) {
        kvp_error("kv connector: load_policy faster needs a finite prefill_us_per_token > 0 "
                  "(%g) and finite load_bytes_per_s (%g), lookup_rtt_us (%g) >= 0",
                  cfg->prefill_us_per_token, cfg->load_bytes_per_s, cfg->lookup_rtt_us);
        return KVP_ERR_BAD_CONFIG;
    }
    return KVP_OK;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

kvp_status_t kvp_kv_resolve_block_sizes(const kvp_kv_cache_group_t *groups, size_t n,
                                        const kvp_kv_block_params_t *params,
                                        kvp_kv_block_sizes_t *out_p)
{
    if (!params || !out_p || (n && !groups))
        return KVP_ERR_NULL_POINTER;
    kvp_kv_block_params_t pc = {0}; /* the defaults of the fields past an older caller's size */
    pc.dcp_size = pc.pcp_size = 1;
    pc.kv_connector = true;
    kvp_status_t st = kvp__sized_adopt(&pc, sizeof pc, params);
    if (st != KVP_OK) {
        kvp_error("kv connector: block params size %u (this library's struct has %zu bytes)",
                  (unsigned)params->size, sizeof pc);
        return st;
    }
    const kvp_kv_block_params_t *p = &pc;
    if (p->cache_block_size < 1 || p->dcp_size < 1 || p->pcp_size < 1 || p->hash_block_size < 0) {
        kvp_error("kv connector: bad block parameters");
        return KVP_ERR_BAD_CONFIG;
    }
    for (size_t i = 0; i < n; i++)
        if (groups[i].block_size < 1 || (unsigned)groups[i].kind > KVP_KV_GROUP_MLA) {
            kvp_error("kv connector: group %zu has a bad kind or block size", i);
            return KVP_ERR_BAD_CONFIG;
        }
    int64_t sched, hash;
    if (n <= 1) {
        sched = hash = p->cache_block_size * p->dcp_size * p->pcp_size;
    } else {
        if (p->dcp_size != 1 || p->pcp_size != 1) {
            kvp_error("kv connector: several KV-cache groups do not support DCP/PCP");
            return KVP_ERR_BAD_CONFIG;
        }
        sched = groups[0].block_size;
        int64_t g = groups[0].block_size;
        for (size_t i = 1; i < n; i++) {
            int64_t b = groups[i].block_size;
            g = gcd64(g, b);
            int64_t d = gcd64(sched, b);
            if (sched / d > INT64_MAX / b) {
                kvp_error("kv connector: lcm of group block sizes overflows");
                return KVP_ERR_BAD_CONFIG;
            }
            sched = sched / d * b;
        }
        /* Mamba groups whose block size is not the cache block size (not
         * "align" mode) break divisibility: back off to the scheduler size,
         * as when nothing consumes block hashes. */
        bool mamba_unaligned = false;
        for (size_t i = 0; i < n; i++)
            if (groups[i].kind == KVP_KV_GROUP_MAMBA && groups[i].block_size != p->cache_block_size)
                mamba_unaligned = true;
        if (!(p->prefix_caching || p->kv_connector) || mamba_unaligned) {
            hash = sched;
        } else {
            hash = p->hash_block_size ? p->hash_block_size : g;
            for (size_t i = 0; i < n; i++)
                if (groups[i].block_size % hash != 0) {
                    kvp_error("kv connector: group block size %lld not divisible by hash "
                              "block size %lld",
                              (long long)groups[i].block_size, (long long)hash);
                    return KVP_ERR_BAD_CONFIG;
                }
        }
    }
    bool partial = false;
    for (size_t i = 0; i < n; i++)
        if (groups[i].kind == KVP_KV_GROUP_MAMBA && groups[i].mamba_align_mode &&
            groups[i].block_size > hash)
            partial = true;
    out_p->block_size = sched;
    out_p->hash_block_size = hash;
    out_p->partial_hits = partial;
    return KVP_OK;
}
