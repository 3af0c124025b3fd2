/* `kvpool` — one binary, many subcommands (see `kvpool help`). */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} kvp_command_t;

static const kvp_command_t g_commands[] = {
    {"server", kvp_cmd_server, "run a pool server (kvpool://HOST:PORT) over UCX"},
    {"bench", kvp_cmd_bench, "benchmark a pool (put|get|mixed|exists|prefix) against memcpy"},
    {"ec-sched-replay", kvp_cmd_ec_sched_replay, "replay an ec-sched-replay v1 stream through the C EC scheduler"},
    {"kv-sched-replay", kvp_cmd_kv_sched_replay, "replay a kv-sched-replay v1 stream through the C KV scheduler"},
    {"hash", kvp_cmd_hash, "print vLLM-compatible chained block hashes of a token list"},
    {"put", kvp_cmd_put, "store a file's contents under a key"},
    {"get", kvp_cmd_get, "write a key's value to a file (atomically)"},
    {"exists", kvp_cmd_exists, "print 1 or 0 per key: is it in the pool"},
    {"rm", kvp_cmd_rm, "remove a key"},
    {"reset", kvp_cmd_reset, "drop every object in the pool"},
    {"stats", kvp_cmd_stats, "print a pool's statistics (--json for scripts)"},
    {"lookup-server", kvp_cmd_lookup_server, "serve KV lookups (vLLM's LookupKeyServer) over ZeroMQ"},
    {"lookup", kvp_cmd_lookup, "print the KV lookup hit of a token list (and why, with -v)"},
    {"replay", kvp_cmd_replay, "replay a Mooncake trace through engine instances sharing a pool"},
    {"bench-baseline", kvp_cmd_bench_baseline, "baselines for bench/compare.sh: memcpy, tcp-raw, redis"},
    {"trace-gen", kvp_cmd_trace_gen, "write a synthetic Mooncake-format trace (sessions, system prompts)"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvpool COMMAND [ARGS...]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        fprintf(out, "  %-18s %s\n", g_commands[i].name, g_commands[i].help);
    fprintf(out, "\n`kvpool COMMAND --help` describes one command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "epd-node") == 0) /* hidden: the nodes `kvpool replay --epd` starts */
        return kvp_cmd_epd_node(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (strcmp(argv[1], g_commands[i].name) == 0)
            return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvpool: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
