/*
 * `kvpool replay TRACE [--pool URI] [--model tiny|small|llama8b-like]
 *   [--instances N] [--tp N] [--block-size N] [--gpu-tokens N]
 *   [--router round-robin|prefix] [--load-policy always|faster|both]
 *   [--prefill-us-per-token US] [--link-gbps G] [--limit N] [--json]
 *   [--plot FILE.svg] ...`: the engine model and the trace replay
 * (src/engine/replay.c).  Flags and their defaults are in usage().
 * --debug-corrupt-every N (not in usage: for tests) flips a byte of every
 * Nth block rank 0 computes, so that its saves are wrong and the loads of
 * them must be found corrupted.
 * `kvpool replay --epd ...` (replay_epd below) is another replay: the
 * encoder -> prefill one of src/engine/epd.h, with its own flags.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/log.h"
#include "common/units.h"
#include "engine/epd.h"
#include "engine/replay.h"

static int usage(FILE *out)
{
    fprintf(out,
            "usage: kvpool replay TRACE [options]\n"
            "  TRACE                      Mooncake-format JSONL (512 tokens per hash id), '-' = stdin\n"
            "  --pool URI                 the shared pool (default: embedded, sized to the trace, <= 16 GiB)\n"
            "  --model M                  tiny (64 B/token) | small (12 KiB) | llama8b-like (128 KiB); default tiny\n"
            "  --instances N              engine instances sharing the pool (default 1)\n"
            "  --tp N                     TP ranks per instance, threads (default 1)\n"
            "  --block-size N             tokens per KV block, divides 512 (default 16)\n"
            "  --gpu-tokens N             KV cache per instance, tokens (default 500000)\n"
            "  --token-budget N           tokens per step (default 8192)\n"
            "  --max-num-seqs N           running requests per instance (default 256)\n"
            "  --router R                 round-robin (default) | prefix (longest local prefix hit)\n"
            "  --load-policy P            always (default) | faster | both (a run of each)\n"
            "  --prefill-us-per-token US  modelled prefill cost (default 40: an 8B model on one H100)\n"
            "  --decode-us-per-token US   modelled decode cost (default 40)\n"
            "  --step-us US               fixed cost of a step (default 5000)\n"
            "  --link-gbps G              host<->GPU link per rank, Gbit/s (default 400 = 50 GB/s, PCIe 5.0 x16)\n"
            "  --lookup-rtt-us US         modelled lookup round trip (default 100)\n"
            "  --sync-loads               load hits before the step's forward pass (load_async=false)\n"
            "  --async-lookups            non-blocking lookups (lookup_async=true)\n"
            "  --roles R,R,...            kv_both (default) | kv_producer | kv_consumer per instance\n"
            "  --no-baseline              skip the run without the pool\n"
            "  --pool-timeout-ms MS       per pool call (default 2000)\n"
            "  --limit N                  the first N requests only\n"
            "  --json                     one compact JSON object as the last line of stdout\n"
            "  --plot FILE.svg            hit rate and TTFT p50 over trace time\n"
            "       kvpool replay --epd [...]: encoder -> prefill disaggregation (`kvpool replay --epd --help`)\n");
    return out == stdout ? 0 : 2;
}

static bool num_f(const char *s, double lo, double hi, double *v)
{
    char *end;
    errno = 0;
    if (!s || !*s)
        return false;
    double x = strtod(s, &end);
    if (errno || *end || !isfinite(x) || x < lo || x > hi)
        return false;
    *v = x;
    return true;
}

static bool parse_roles(const char *s, kvp__replay_params_t *p)
{
    char buf[1024];
    if (strlen(s) >= sizeof buf)
        return false;
    strcpy(buf, s);
    uint32_t i = 0;
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (i >= KVP__REPLAY_MAX_INSTANCES || kvp_kv_role_parse(tok, &p->roles[i]) != KVP_OK)
            return false;
        i++;
    }
    return i > 0;
}

/* ---------------------------------------------------------------- --epd */

static int usage_epd(FILE *out)
{
    fprintf(out,
            "usage: kvpool replay --epd [options]\n"
            "  an encoder process and a prefill process (each an engine instance with the EC connector's\n"
            "  real scheduler and workers) started by the replay, which plays the proxy (src/engine/epd.h)\n"
            "  --requests N               generated multimodal requests (default 300)\n"
            "  --images-per-request K     each request has 1..K images, uniformly (default 3, at most %d)\n"
            "  --size BYTES               encoder output per image, bf16 [N, hidden] (default 4MiB)\n"
            "  --repeat R                 share of image slots that reuse an earlier image (default 0.333)\n"
            "  --consumer-tp N            consumer TP ranks (workers) in the prefill process (default 1)\n"
            "  --pool URI                 the cross-encoder cache; 'none' for none.  Default: a `kvpool server`\n"
            "                             the replay starts on 127.0.0.1 (unlike the KV replay, whose default\n"
            "                             is an embedded pool)\n"
            "  --faults SPEC              comma-separated: kill-encoder@N (SIGKILL the encoder node after N\n"
            "                             push records; the requests in flight fail with a retryable error\n"
            "                             after the push wait), drop-events@P (the prefill scheduler's inbox\n"
            "                             loses each readiness event with probability P, 0 < P <= 1),\n"
            "                             kill-pool@N (SIGKILL the pool server the replay started after N push\n"
            "                             records: the cross-encoder cache is gone, the pushes go on)\n"
            "  --json                     one compact JSON object as the last line of stdout\n"
            "  test knobs: --seed N (1), --window N requests in flight (8), --push-wait-s S (60),\n"
            "  --lease-ms MS reservation lease (300000), --cache-images N encoder cache (16), --timeout-s S (280)\n",
            KVP__EPD_MAX_IMAGES);
    return out == stdout ? 0 : 2;
}

static int replay_epd(int argc, char **argv)
{
    kvp__epd_replay_params_t p;
    kvp__epd_replay_params_init(&p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u = 0;
        double x = 0;
        bool ok = true, val = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage_epd(stdout);
        else if (!strcmp(a, "--epd"))
            val = false;
        else if (!strcmp(a, "--json"))
            p.json = true, val = false;
        else if (!strcmp(a, "--requests"))
            ok = kvp__parse_u64(v, 1, 1000000, &u) == KVP_OK, p.wl.requests = (uint32_t)u;
        else if (!strcmp(a, "--images-per-request"))
            ok = kvp__parse_u64(v, 1, KVP__EPD_MAX_IMAGES, &u) == KVP_OK, p.wl.max_images = (uint32_t)u;
        else if (!strcmp(a, "--size"))
            ok = v && kvp__parse_size(v, &u) == KVP_OK && u >= 2 && u <= (256u << 20) && u % 2 == 0,
            p.wl.size = (int64_t)u;
        else if (!strcmp(a, "--repeat"))
            ok = num_f(v, 0, 1, &x), p.wl.repeat = x;
        else if (!strcmp(a, "--consumer-tp"))
            ok = kvp__parse_u64(v, 1, 8, &u) == KVP_OK, p.consumer_tp = (uint32_t)u;
        else if (!strcmp(a, "--pool")) {
            ok = v && *v;
            if (ok && !strcmp(v, "none"))
                p.no_pool = true;
            else
                p.pool_uri = v;
        } else if (!strcmp(a, "--faults"))
            ok = kvp__epd_faults_parse(v, &p) == KVP_OK;
        else if (!strcmp(a, "--seed"))
            ok = kvp__parse_u64(v, 0, UINT64_MAX, &p.wl.seed) == KVP_OK;
        else if (!strcmp(a, "--window"))
            ok = kvp__parse_u64(v, 1, 1024, &u) == KVP_OK, p.window = (uint32_t)u;
        else if (!strcmp(a, "--push-wait-s"))
            ok = kvp__parse_u64(v, 1, 3600, &p.push_wait_s) == KVP_OK;
        else if (!strcmp(a, "--lease-ms"))
            ok = kvp__parse_u64(v, 100, 3600000, &p.lease_ms) == KVP_OK;
        else if (!strcmp(a, "--cache-images"))
            ok = kvp__parse_u64(v, 1, 1 << 20, &p.cache_images) == KVP_OK;
        else if (!strcmp(a, "--timeout-s"))
            ok = kvp__parse_u64(v, 1, 86400, &p.timeout_s) == KVP_OK;
        else {
            fprintf(stderr, "kvpool replay --epd: unknown option %s\n", a);
            return usage_epd(stderr);
        }
        if (!ok) {
            fprintf(stderr, "kvpool replay --epd: bad value for %s: %s\n", a, v ? v : "(missing)");
            return usage_epd(stderr);
        }
        if (val)
            i++;
    }
    if (p.wl.repeat_gap < p.window)
        p.wl.repeat_gap = p.window;
    return kvp__epd_replay_main(&p);
}

int kvp_cmd_replay(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--epd"))
            return replay_epd(argc, argv);
    kvp__replay_params_t p;
    kvp__replay_params_init(&p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        uint64_t u = 0;
        bool ok = true, val = true;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout);
        else if (!strcmp(a, "--json"))
            p.json = true, val = false;
        else if (!strcmp(a, "--sync-loads"))
            p.load_async = false, val = false;
        else if (!strcmp(a, "--async-lookups"))
            p.lookup_async = true, val = false;
        else if (!strcmp(a, "--no-baseline"))
            p.baseline = false, val = false;
        else if (!strcmp(a, "--pool"))
            ok = v && (p.pool_uri = v);
        else if (!strcmp(a, "--model"))
            ok = v && (p.model = v);
        else if (!strcmp(a, "--plot"))
            ok = v && (p.plot = v);
        else if (!strcmp(a, "--instances"))
            ok = kvp__parse_u64(v, 1, KVP__REPLAY_MAX_INSTANCES, &u) == KVP_OK, p.instances = (uint32_t)u;
        else if (!strcmp(a, "--tp"))
            ok = kvp__parse_u64(v, 1, 64, &u) == KVP_OK, p.tp = (uint32_t)u;
        else if (!strcmp(a, "--block-size"))
            ok = kvp__parse_u64(v, 1, 512, &u) == KVP_OK, p.block_size = (int64_t)u;
        else if (!strcmp(a, "--gpu-tokens"))
            ok = kvp__parse_u64(v, 1, 1ull << 34, &u) == KVP_OK, p.gpu_tokens = (int64_t)u;
        else if (!strcmp(a, "--token-budget"))
            ok = kvp__parse_u64(v, 1, 1ull << 24, &u) == KVP_OK, p.token_budget = (int64_t)u;
        else if (!strcmp(a, "--max-num-seqs"))
            ok = kvp__parse_u64(v, 1, 1ull << 20, &u) == KVP_OK, p.max_num_seqs = (int64_t)u;
        else if (!strcmp(a, "--limit"))
            ok = kvp__parse_u64(v, 1, 1ull << 40, &p.limit) == KVP_OK;
        else if (!strcmp(a, "--pool-timeout-ms"))
            ok = kvp__parse_u64(v, 1, 3600000, &u) == KVP_OK, p.pool_timeout_ms = (uint32_t)u;
        else if (!strcmp(a, "--debug-corrupt-every"))
            ok = kvp__parse_u64(v, 1, 1ull << 40, &p.corrupt_every) == KVP_OK;
        else if (!strcmp(a, "--prefill-us-per-token"))
            ok = num_f(v, 1e-3, 1e6, &p.prefill_us_per_token);
        else if (!strcmp(a, "--decode-us-per-token"))
            ok = num_f(v, 0, 1e6, &p.decode_us_per_token);
        else if (!strcmp(a, "--step-us"))
            ok = num_f(v, 1, 1e7, &p.step_us);
        else if (!strcmp(a, "--link-gbps"))
            ok = num_f(v, 1e-3, 1e6, &p.link_gbps);
        else if (!strcmp(a, "--lookup-rtt-us"))
            ok = num_f(v, 0, 1e7, &p.lookup_rtt_us);
        else if (!strcmp(a, "--roles"))
            ok = v && parse_roles(v, &p);
        else if (!strcmp(a, "--router")) {
            ok = v && (!strcmp(v, "round-robin") || !strcmp(v, "prefix"));
            p.router = v && !strcmp(v, "prefix") ? KVP__ROUTE_PREFIX : KVP__ROUTE_ROUND_ROBIN;
        } else if (!strcmp(a, "--load-policy")) {
            ok = v && (!strcmp(v, "always") || !strcmp(v, "faster") || !strcmp(v, "both"));
            p.policy = !v || !strcmp(v, "always") ? KVP__POLICY_ALWAYS
                       : !strcmp(v, "faster")      ? KVP__POLICY_FASTER
                                                   : KVP__POLICY_BOTH;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "kvpool replay: unknown option %s\n", a);
            return usage(stderr);
        } else {
            if (p.trace) {
                fprintf(stderr, "kvpool replay: one TRACE only (%s, %s)\n", p.trace, a);
                return usage(stderr);
            }
            p.trace = a;
            val = false;
        }
        if (!ok) {
            fprintf(stderr, "kvpool replay: bad value for %s: %s\n", a, v ? v : "(missing)");
            return usage(stderr);
        }
        if (val)
            i++;
    }
    if (!p.trace) {
        fprintf(stderr, "kvpool replay: TRACE missing\n");
        return usage(stderr);
    }
    return kvp__replay_main(&p);
}
