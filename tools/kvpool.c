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
    {"bench", kvp_cmd_bench, "benchmark a pool (put|get|mixed|exists|prefix) against memcpy"},
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
    for (size_t i = 0; i < sizeof g_commands / sizeof g_commands[0]; i++)
        if (strcmp(argv[1], g_commands[i].name) == 0)
            return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvpool: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
