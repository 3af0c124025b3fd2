/*
 * `kvpool lookup-server` and `kvpool lookup`: the KV lookup service of
 * connectors-spec §2.4 over ZeroMQ (include/kvpool/kv_connector.h, "Lookup
 * service over ZeroMQ"), for running it next to a pool and for operators
 * debugging "why no hit".
 *
 *   kvpool lookup-server --pool URI --endpoint EP --model NAME --block-size N [options]
 *       serves LOOKUP/RESET at EP (ipc://PATH or tcp://HOST:PORT) against the
 *       pool; prints "listening on EP" once it answers; SIGINT/SIGTERM stop it
 *       (the ipc socket file is removed).
 *   kvpool lookup EP --algo A --seed S --block-size N [-v] TOKEN...
 *       hashes the tokens as `kvpool hash` does and prints the hit the
 *       server at EP answers (one number).
 *   kvpool lookup --pool URI --model NAME --block-size N --algo A --seed S -v TOKEN...
 *       computes the same lookup in this process (kvp_kv_lookup_pool_query)
 *       and, with -v, why the hit stopped there: the reason, the group and
 *       block, the namespace that lacked it.  The reason is not on the wire,
 *       so only this form can print it.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "common/units.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "kvpool/hash.h"
#include "kvpool/kv_connector.h"
#include "server/metrics.h"

#define MAX_GROUPS 64

/* What both commands read about the lookup's geometry and the hashing. */
typedef struct lk_opts {
    const char *cmd;
    const char *pool, *endpoint, *model, *prefix, *seed;
    kvp_hash_algo_t algo;
    uint64_t block_size, hash_block_size, tp_size, num_kv_heads, timeout_ms, repeat, interval_ms;
    uint64_t metrics_port; /* lookup-server: serve GET /metrics (UINT64_MAX: off) */
    kvp_kv_cache_group_t groups[MAX_GROUPS];
    uint32_t num_groups;
    bool eagle, verbose, print_metrics;
} lk_opts_t;

static int fail(const lk_opts_t *o, const char *what, const char *arg)
{
    fprintf(stderr, "kvpool %s: %s '%s' (see kvpool %s --help)\n", o->cmd, what, arg, o->cmd);
    return 2;
}

/* One group of --groups: KIND:BLOCK_SIZE[:window=N][:align][:eagle]. */
static int parse_group(char *spec, kvp_kv_cache_group_t *g)
{
    memset(g, 0, sizeof *g);
    char *save, *kind = strtok_r(spec, ":", &save), *bs = strtok_r(NULL, ":", &save);
    if (!kind || !bs)
        return -1;
    static const struct { const char *name; kvp_kv_group_kind_t kind; } kinds[] = {
        {"full", KVP_KV_GROUP_FULL_ATTENTION}, {"swa", KVP_KV_GROUP_SLIDING_WINDOW},
        {"mamba", KVP_KV_GROUP_MAMBA}, {"mla", KVP_KV_GROUP_MLA}};
    size_t k = 0;
    while (k < 4 && strcmp(kind, kinds[k].name) != 0)
        k++;
    uint64_t v;
    if (k == 4 || kvp__parse_u64(bs, 1, 1u << 30, &v) != 0)
        return -1;
    g->kind = kinds[k].kind;
    g->block_size = (int64_t)v;
    for (char *opt; (opt = strtok_r(NULL, ":", &save));) {
        if (strncmp(opt, "window=", 7) == 0 && g->kind == KVP_KV_GROUP_SLIDING_WINDOW &&
            kvp__parse_u64(opt + 7, 1, 1ull << 40, &v) == 0)
            g->sliding_window = (int64_t)v;
        else if (strcmp(opt, "align") == 0 && g->kind == KVP_KV_GROUP_MAMBA)
            g->mamba_align_mode = true;
        else if (strcmp(opt, "eagle") == 0)
            g->is_eagle_group = true;
        else
            return -1;
    }
    return g->kind == KVP_KV_GROUP_SLIDING_WINDOW && !g->sliding_window ? -1 : 0;
}

static int parse_groups(lk_opts_t *o, const char *spec)
{
    char buf[4096];
    if (strlen(spec) >= sizeof buf)
        return fail(o, "--groups too long", "...");
    snprintf(buf, sizeof buf, "%s", spec);
    o->num_groups = 0;
    char *save;
    for (char *g = strtok_r(buf, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        char one[256];
        snprintf(one, sizeof one, "%s", g);
        if (o->num_groups == MAX_GROUPS || parse_group(one, &o->groups[o->num_groups]) != 0)
            return fail(o, "bad --groups entry (need KIND:BLOCK_SIZE[:window=N][:align][:eagle], "
                           "KIND full|swa|mamba|mla)", g);
        o->num_groups++;
    }
    return o->num_groups ? 0 : fail(o, "empty --groups", spec);
}

/* Parses options from argv[*i]; 1 when one was taken (and its value), 0 when
 * argv[*i] is no option of ours, 2 on a bad value (printed). */
static int parse_opt(lk_opts_t *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i];
    bool *flag = !strcmp(a, "--eagle")           ? &o->eagle
                 : !strcmp(a, "-v")              ? &o->verbose
                 : !strcmp(a, "--print-metrics") ? &o->print_metrics
                                                 : NULL;
    if (flag) {
        *flag = true;
        return 1;
    }
    static const char *const valued[] = {"--pool", "--endpoint", "--model", "--cache-prefix",
                                         "--seed", "--algo", "--block-size", "--hash-block-size",
                                         "--tp-size", "--num-kv-heads", "--groups", "--timeout-ms",
                                         "--repeat", "--interval-ms", "--metrics-port"};
    size_t k = 0;
    while (k < sizeof valued / sizeof valued[0] && strcmp(a, valued[k]) != 0)
        k++;
    if (k == sizeof valued / sizeof valued[0])
        return 0;
    if (*i + 1 >= argc)
        return fail(o, "option needs a value", a);
    const char *v = argv[++*i];
    uint64_t *num[] = {&o->block_size, &o->hash_block_size, &o->tp_size, &o->num_kv_heads};
    switch (k) {
    case 0: o->pool = v; return 1;
    case 1: o->endpoint = v; return 1;
    case 2: o->model = v; return 1;
    case 3: o->prefix = v; return 1;
    case 4: o->seed = v; return 1;
    case 5: return kvp_hash_algo_parse(v, &o->algo) == KVP_OK ? 1 : fail(o, "bad --algo", v);
    case 10: return parse_groups(o, v) == 0 ? 1 : 2;
    case 11:
        return kvp__parse_u64(v, 1, 3600000, &o->timeout_ms) == 0 ? 1 : fail(o, "bad --timeout-ms", v);
    case 12:
        return kvp__parse_u64(v, 1, 1000000, &o->repeat) == 0 ? 1 : fail(o, "bad --repeat", v);
    case 13:
        return kvp__parse_u64(v, 0, 3600000, &o->interval_ms) == 0 ? 1 : fail(o, "bad --interval-ms", v);
    case 14:
        return kvp__parse_u64(v, 0, 65535, &o->metrics_port) == 0 ? 1 : fail(o, "bad --metrics-port", v);
    default:
        return kvp__parse_u64(v, 1, 1u << 30, num[k - 6]) == 0 ? 1 : fail(o, "bad value of", a);
    }
}

static void opts_init(lk_opts_t *o, const char *cmd)
{
    memset(o, 0, sizeof *o);
    o->cmd = cmd;
    o->algo = KVP_HASH_SHA256_CBOR;
    o->tp_size = o->num_kv_heads = 1;
    o->timeout_ms = 2000;
    o->repeat = 1;
    o->metrics_port = UINT64_MAX;
}

/* Opens the pool and the lookup the options describe. */
static int open_lookup(const lk_opts_t *o, kvp_pool_t **pool_p, kvp_kv_lookup_pool_t **lk_p)
{
    kvp_status_t st = kvp_pool_open(o->pool, pool_p);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool %s: open %s: %s\n", o->cmd, o->pool, kvp_status_str(st));
        return 1;
    }
    kvp_kv_lookup_pool_params_t p;
    kvp_kv_lookup_pool_params_init(&p);
    p.model_name = o->model;
    p.cache_prefix = o->prefix;
    p.tp_size = (uint32_t)o->tp_size;
    p.num_kv_heads = (uint32_t)o->num_kv_heads;
    p.block_size = (int64_t)o->block_size;
    p.hash_block_size = (int64_t)(o->hash_block_size ? o->hash_block_size : o->block_size);
    p.groups = o->num_groups ? o->groups : NULL;
    p.num_groups = o->num_groups;
    p.use_eagle = o->eagle;
    st = kvp_kv_lookup_pool_create(*pool_p, &p, lk_p);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool %s: lookup: %s\n", o->cmd, kvp_status_str(st));
        kvp_pool_close(*pool_p);
        return st == KVP_ERR_BAD_CONFIG || st == KVP_ERR_UNSUPPORTED ? 2 : 1;
    }
    return 0;
}

/* ------------------------------------------------------- lookup-server */

static void server_usage(FILE *out)
{
    fprintf(out,
            "usage: kvpool lookup-server --pool URI --endpoint EP --model NAME --block-size N\n"
            "           [--hash-block-size N] [--tp-size N] [--num-kv-heads N] [--cache-prefix P]\n"
            "           [--groups SPEC] [--eagle] [--metrics-port N] [--print-metrics]\n"
            "\n"
            "Answers vLLM's LookupKeyClient (LOOKUP / RESET) at EP against the pool.\n"
            "  EP                ipc://PATH (socket file owner-only) or tcp://HOST:PORT (HOST\n"
            "                    named, no wildcard; PORT 0 picks one, printed)\n"
            "  --model NAME      the model path or name (its last component goes into keys)\n"
            "  --block-size N    scheduler block size; --hash-block-size defaults to it\n"
            "  --tp-size, --num-kv-heads   default 1 each; --cache-prefix: default none\n"
            "  --groups SPEC     KV-cache groups, e.g. full:16,swa:16:window=128,mamba:64:align\n"
            "                    (default: one full-attention group of --block-size)\n"
            "  --eagle           EAGLE speculative decoding (drops the last block)\n"
            "  --metrics-port N  serve the Prometheus counters on http://127.0.0.1:N/metrics\n"
            "                    (0: a free port, printed as \"metrics on http://...\")\n"
            "  --print-metrics   print the Prometheus counters to stdout on exit\n"
            "Prints \"listening on EP\" when ready; SIGINT/SIGTERM stop it cleanly.\n");
}

/* The metrics endpoint's page: the server's kvp_kv_lookup_server_metrics. */
static kvp_status_t lookup_text(void *ctx, char *buf, size_t cap, size_t *len_p)
{
    return kvp_kv_lookup_server_metrics(ctx, buf, cap, len_p);
}

static char *render_metrics(void *arg, size_t *len_p, size_t *cap_p)
{
    return kvp_tool_text(lookup_text, arg, len_p, cap_p);
}

int kvp_cmd_lookup_server(int argc, char **argv)
{
    lk_opts_t o;
    opts_init(&o, "lookup-server");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            server_usage(stdout);
            return 0;
        }
        int r = parse_opt(&o, argc, argv, &i);
        if (r == 0)
            return fail(&o, "unknown argument", argv[i]);
        if (r == 2)
            return 2;
    }
    if (!o.pool || !o.endpoint || !o.model || !o.block_size) {
        fprintf(stderr, "kvpool lookup-server: --pool, --endpoint, --model and --block-size are "
                        "required (see --help)\n");
        return 2;
    }
    /* The signals are taken by sigwait below: block them before any thread
     * starts (the server's inherits the mask). */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    int rc = open_lookup(&o, &pool, &lk);
    if (rc)
        return rc;
    kvp_kv_lookup_server_params_t sp;
    kvp_kv_lookup_server_params_init(&sp);
    sp.endpoint = o.endpoint;
    sp.lookup = lk;
    kvp_kv_lookup_server_t *srv;
    kvp_status_t st = kvp_kv_lookup_server_start(&sp, &srv);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool lookup-server: %s: %s\n", o.endpoint, kvp_status_str(st));
        rc = st == KVP_ERR_BAD_CONFIG || st == KVP_ERR_BAD_URI ? 2 : 1;
    } else {
        kvp__metrics_t *http = NULL;
        if (o.metrics_port != UINT64_MAX &&
            kvp__metrics_start("127.0.0.1", (uint16_t)o.metrics_port, render_metrics, srv,
                               &http) != KVP_OK) {
            fprintf(stderr, "kvpool lookup-server: cannot serve metrics on port %llu\n",
                    (unsigned long long)o.metrics_port);
            rc = 1;
        }
        if (http)
            printf("metrics on http://127.0.0.1:%u/metrics\n", kvp__metrics_port(http));
        if (rc == 0) {
            printf("listening on %s\n", kvp_kv_lookup_server_endpoint(srv));
            fflush(stdout);
        }
        int sig;
        if (rc == 0)
            sigwait(&sigs, &sig);
        kvp__metrics_stop(http);
        if (o.print_metrics) {
            size_t len, cap;
            char *text = render_metrics(srv, &len, &cap);
            if (text)
                fputs(text, stdout);
            kvp__free(text, cap);
        }
        kvp_kv_lookup_server_stop(srv);
    }
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
    return rc;
}

/* --------------------------------------------------------------- lookup */

static void lookup_usage(FILE *out)
{
    fprintf(out,
            "usage: kvpool lookup EP --seed S --block-size N [--algo A] [--timeout-ms MS]\n"
            "                     [--repeat N [--interval-ms MS]] TOKEN...\n"
            "       kvpool lookup --pool URI --model NAME --block-size N --seed S [--algo A] [-v]\n"
            "                     [lookup-server geometry options] TOKEN...\n"
            "\n"
            "Prints the hit (tokens) of a token list, hashed as `kvpool hash` does (at\n"
            "--hash-block-size, default --block-size).  The first form asks the lookup server\n"
            "at EP; the second computes it in this process against the pool and, with -v,\n"
            "prints why the hit stopped there (reason, group, block index, namespace) -- the\n"
            "reason is not on the wire, so -v needs the second form.  A failed call prints\n"
            "0 (the scheduler's miss) and the error on stderr; --repeat asks N times on one\n"
            "client, printing \"HIT MS\" per call (MS: how long it took).\n");
}

/* Hashes tokens argv[first..argc) into *hashes_p (n * hash bytes). */
static int hash_tokens(const lk_opts_t *o, int argc, char **argv, int first, int64_t **tokens_p,
                       size_t *ntok_p, uint8_t **hashes_p, size_t *nh_p, uint32_t *hlen_p)
{
    size_t ntok = (size_t)(argc - first);
    size_t bs = o->hash_block_size ? o->hash_block_size : o->block_size;
    int64_t *tok = kvp__calloc(ntok ? ntok : 1, sizeof *tok);
    size_t nb = ntok / bs;
    kvp_hash_t *h = kvp__calloc(nb ? nb : 1, sizeof *h);
    uint8_t *flat = kvp__calloc(nb ? nb : 1, KVP_HASH_MAX_LEN);
    int rc = tok && h && flat ? 0 : 1;
    for (size_t t = 0; !rc && t < ntok; t++) {
        char *end;
        errno = 0;
        tok[t] = strtoll(argv[first + (int)t], &end, 10);
        if (errno || *end || end == argv[first + (int)t])
            rc = fail(o, "bad token id", argv[first + (int)t]);
    }
    kvp_hash_t none;
    kvp_hash_request_t req;
    memset(&req, 0, sizeof req);
    size_t got = 0;
    if (!rc && (kvp_hash_none_hash(o->algo, o->seed, strlen(o->seed), &none) != KVP_OK ||
                kvp_hash_request_blocks_i64(o->algo, &none, tok, ntok, bs, &req, h, nb, &got) !=
                    KVP_OK))
        rc = 2; /* (the library logged why) */
    uint32_t hl = got ? h[0].len : 0;
    for (size_t b = 0; !rc && b < got; b++)
        memcpy(flat + b * hl, h[b].bytes, hl);
    kvp__free(h, (nb ? nb : 1) * sizeof *h);
    *tokens_p = tok;
    *ntok_p = ntok;
    *hashes_p = flat;
    *nh_p = got;
    *hlen_p = hl;
    return rc;
}

static int lookup_in_process(const lk_opts_t *o, int64_t ntok, const uint8_t *hashes, size_t nh,
                             uint32_t hl)
{
    kvp_pool_t *pool;
    kvp_kv_lookup_pool_t *lk;
    int rc = open_lookup(o, &pool, &lk);
    if (rc)
        return rc;
    kvp_kv_lookup_result_t r;
    kvp_status_t st = kvp_kv_lookup_pool_query(lk, ntok, hashes, nh, hl, o->eagle, &r);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool lookup: %s\n", kvp_status_str(st));
        rc = 1;
    } else {
        printf("%lld\n", (long long)r.hit_tokens);
        if (o->verbose) {
            printf("reason %s\n", kvp_kv_miss_reason_name(r.reason));
            if (r.reason == KVP_KV_MISS_MISSING_BLOCK || r.reason == KVP_KV_MISS_RANK_MISSING)
                printf("group %u\nblock_index %lld\n", r.group_id, (long long)r.block_index);
            if (r.reason == KVP_KV_MISS_RANK_MISSING)
                printf("namespace tp_rank:%u@pcp%u@dcp%u@pp_rank:%u\n", r.tp_rank, r.pcp_rank,
                       r.dcp_rank, r.pp_rank);
            printf("keys_probed %llu\n", (unsigned long long)r.keys_probed);
        }
    }
    kvp_kv_lookup_pool_destroy(lk);
    kvp_pool_close(pool);
    return rc;
}

/* Asks the server at EP (repeat times, interval_ms apart, on one client:
 * each line then also says how long the call took).  A failed call prints a
 * hit of 0 -- what the scheduler would see -- and the error on stderr. */
static int lookup_remote(const lk_opts_t *o, int64_t ntok, const uint8_t *hashes, size_t nh,
                         uint32_t hl)
{
    kvp_kv_lookup_zmq_params_t cp;
    kvp_kv_lookup_zmq_params_init(&cp);
    cp.endpoint = o->endpoint;
    cp.timeout_ms = (uint32_t)o->timeout_ms;
    kvp_kv_lookup_zmq_t *c;
    kvp_status_t st = kvp_kv_lookup_zmq_create(&cp, &c);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool lookup: %s: %s\n", o->endpoint, kvp_status_str(st));
        return 2;
    }
    int rc = 0;
    for (uint64_t i = 0; i < o->repeat; i++) {
        if (i)
            usleep((useconds_t)o->interval_ms * 1000);
        int64_t hit = 0;
        uint64_t t0 = kvp__now_ns();
        st = kvp_kv_lookup_zmq_query(c, ntok, hashes, nh, hl, &hit);
        uint64_t ms = (kvp__now_ns() - t0) / 1000000;
        if (st != KVP_OK) {
            fprintf(stderr, "kvpool lookup: %s: %s\n", o->endpoint, kvp_status_str(st));
            hit = 0;
            rc = 1;
        }
        if (o->repeat > 1)
            printf("%lld %llu\n", (long long)hit, (unsigned long long)ms);
        else
            printf("%lld\n", (long long)hit);
        fflush(stdout);
    }
    kvp_kv_lookup_zmq_destroy(c);
    if (o->verbose)
        printf("reason (not on the wire: use kvpool lookup --pool URI --model NAME -v)\n");
    return o->repeat > 1 ? 0 : rc;
}

int kvp_cmd_lookup(int argc, char **argv)
{
    lk_opts_t o;
    opts_init(&o, "lookup");
    int first = argc;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            lookup_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--")) {
            first = i + 1;
            break;
        }
        int r = parse_opt(&o, argc, argv, &i);
        if (r == 2)
            return 2;
        if (r == 1)
            continue;
        bool ep = !strncmp(argv[i], "ipc://", 6) || !strncmp(argv[i], "tcp://", 6);
        if (ep && !o.endpoint && !o.pool) {
            o.endpoint = argv[i];
            continue;
        }
        if (argv[i][0] == '-' && (argv[i][1] < '0' || argv[i][1] > '9'))
            return fail(&o, "unknown option", argv[i]);
        first = i;
        break;
    }
    if (!o.seed || !o.block_size || (!o.endpoint == !o.pool) || (o.pool && !o.model)) {
        fprintf(stderr, "kvpool lookup: need EP or --pool URI --model NAME (one of them), "
                        "--seed and --block-size (see --help)\n");
        return 2;
    }
    int64_t *tok;
    uint8_t *hashes;
    size_t ntok, nh;
    uint32_t hl;
    int rc = hash_tokens(&o, argc, argv, first, &tok, &ntok, &hashes, &nh, &hl);
    if (!rc)
        rc = o.pool ? lookup_in_process(&o, (int64_t)ntok, hashes, nh, hl)
                    : lookup_remote(&o, (int64_t)ntok, hashes, nh, hl);
    size_t bs = o.hash_block_size ? o.hash_block_size : o.block_size;
    if (tok)
        kvp__free(tok, (ntok ? ntok : 1) * sizeof *tok);
    if (hashes)
        kvp__free(hashes, (ntok / bs ? ntok / bs : 1) * KVP_HASH_MAX_LEN);
    return rc;
}
