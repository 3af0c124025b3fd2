/*
 * The `kvpool` command's subcommands.  Each lives in its own tools/cmd_*.c and
 * is listed in the table in tools/kvpool.c.  argv[0] is the subcommand name.
 * Return value is the process exit status.
 */
#ifndef KVP_TOOLS_COMMANDS_H
#define KVP_TOOLS_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

int kvp_cmd_bench(int argc, char **argv);
int kvp_cmd_server(int argc, char **argv);
int kvp_cmd_ec_sched_replay(int argc, char **argv); int kvp_bench_ec_scheduler(int argc, char **argv);
int kvp_cmd_hash(int argc, char **argv);
int kvp_cmd_put(int argc, char **argv); int kvp_cmd_get(int argc, char **argv);
int kvp_cmd_exists(int argc, char **argv); int kvp_cmd_rm(int argc, char **argv);
int kvp_cmd_reset(int argc, char **argv); int kvp_cmd_stats(int argc, char **argv);
int kvp_cmd_bench_baseline(int argc, char **argv);
int kvp_cmd_kv_sched_replay(int argc, char **argv); int kvp_bench_kv_scheduler(int argc, char **argv);
int kvp_cmd_lookup_server(int argc, char **argv); int kvp_cmd_lookup(int argc, char **argv);
int kvp_bench_lookup(int argc, char **argv);
int kvp_bench_kv_worker(int argc, char **argv);
int kvp_cmd_replay(int argc, char **argv);
int kvp_cmd_trace_gen(int argc, char **argv);
int kvp_cmd_epd_node(int argc, char **argv); /* hidden: started by replay --epd */
int kvp_bench_ec_reserve(int argc, char **argv);
/* A base port with base..base+n-1 free on 127.0.0.1 just now (cmd_epd_node.c). */
int kvp_tool_free_ports(size_t nports);

/* A metrics page (metrics_text.c): the text fn renders into buf (cap
 * bytes; *len_p: the whole text's length; KVP_ERR_BUFFER_TOO_SMALL when it
 * did not fit), in a kvp__malloc buffer of *cap_p bytes (kvp__free it), or
 * NULL. */
typedef kvp_status_t (*kvp_tool_text_fn)(void *ctx, char *buf, size_t cap, size_t *len_p);
char *kvp_tool_text(kvp_tool_text_fn fn, void *ctx, size_t *len_p, size_t *cap_p);


#endif
