/*
 * `kvpool replay`: Mooncake-format traces through engine instances that
 * share one pool (ARCHITECTURE.md §6, engine.h).  The same trace runs with
 * the connector on (load_policy always, faster, or both) and off; the
 * figures are deterministic for the trace and the flags (see replay.c).
 */
#ifndef KVP_ENGINE_REPLAY_H
#define KVP_ENGINE_REPLAY_H

#include <stdbool.h>
#include <stdint.h>

#include "kvpool/kv_connector.h"

#define KVP__REPLAY_MAX_INSTANCES 64

typedef enum kvp__replay_router { KVP__ROUTE_ROUND_ROBIN = 0, KVP__ROUTE_PREFIX } kvp__replay_router_t;
typedef enum kvp__replay_policy { KVP__POLICY_ALWAYS = 0, KVP__POLICY_FASTER, KVP__POLICY_BOTH } kvp__replay_policy_t;

typedef struct kvp__replay_params {
    const char *trace;
    const char *pool_uri;        /* NULL: an embedded pool sized to the trace */
    const char *model;           /* tiny | small | llama8b-like */
    uint32_t instances, tp;
    int64_t block_size, gpu_tokens, token_budget, max_num_seqs;
    kvp__replay_router_t router;
    kvp__replay_policy_t policy;
    double prefill_us_per_token, decode_us_per_token, step_us;
    double link_gbps;            /* Gbit/s */
    double lookup_rtt_us;
    uint64_t limit;              /* requests (0: all) */
    bool json;
    const char *plot;            /* SVG path or NULL */
    bool load_async, lookup_async;
    bool baseline;               /* also run without the pool (default) */
    kvp_kv_role_t roles[KVP__REPLAY_MAX_INSTANCES];
    uint32_t pool_timeout_ms;
    uint64_t corrupt_every;      /* tests only */
} kvp__replay_params_t;

void kvp__replay_params_init(kvp__replay_params_t *p);
/* Runs the replay; returns the exit status (0; 1: corruptions or a fatal
 * error; 2: refused up front). */
int kvp__replay_main(const kvp__replay_params_t *p);

#endif
