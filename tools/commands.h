/*
 * The `kvpool` command's subcommands.  Each lives in its own tools/cmd_*.c and
 * is listed in the table in tools/kvpool.c.  argv[0] is the subcommand name.
 * Return value is the process exit status.
 */
#ifndef KVP_TOOLS_COMMANDS_H
#define KVP_TOOLS_COMMANDS_H

int kvp_cmd_bench(int argc, char **argv);


#endif
