/* `kvpool server`: run a pool server (see src/server/server.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "common/log.h"
#include "common/thread.h"
#include "common/token.h"
#include "common/units.h"
#include "server/server.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpool server --listen HOST:PORT --memory SIZE [--metrics-port P] [--metrics-listen HOST]\n"
               "                     [--metrics-port-file F] [--token-file F] [--insecure]\n"
               "                     [--put-timeout DURATION] [--log-level L]\n"
               "                     [--port-file F] [--max-conns N] [--max-conns-per-source N]\n"
               "                     [--no-prefault] [--no-local-reads] [--filter-bytes SIZE]\n"
               "  --listen       IPv4 address and port (port 0 = any free port, see --port-file); an\n"
               "                 address other than loopback needs --token-file (or --insecure)\n"
               "  --memory       arena size, e.g. 4GiB (at most the machine's, or the cgroup's, memory)\n"
               "  --token-file   clients must prove they hold this file's first line (challenge-response;\n"
               "                 the token never crosses the wire)\n"
               "  --insecure     serve a network address without a token: anyone who reaches it reads\n"
               "                 and writes every key\n"
               "  --metrics-port serve Prometheus text on this port (GET /metrics), on --metrics-listen\n"
               "                 (default: the --listen address); 0 = any free port, written to\n"
               "                 --metrics-port-file (before --port-file appears)\n"
               "  --put-timeout  give up puts whose values stop arriving for this long, and reclaim\n"
               "                 their reservations (default 30s)\n"
               "  --max-conns    established connections at most (default 1024, and below the\n"
               "                 descriptor limit)\n"
               "  --max-conns-per-source  from one address, without a token (default half of\n"
               "                 --max-conns)\n"
               "  --no-prefault  do not fault the arena in at start (it is by default)\n"
               "  --no-local-reads  keep the arena private: clients on this host then get values\n"
               "                 over UCX instead of copying them out of the mapped arena\n"
               "  --filter-bytes the membership filter clients on this host map, to answer a lookup\n"
               "                 of an absent key themselves (default: 1/1024 of --memory, 64KiB to\n"
               "                 64MiB; 0 = none); with the local reads only\n"
               "  --log-level    error|warn|info|debug (default info)\n"
               "SIGTERM or SIGINT: finish the requests in flight, refuse new ones, exit 0.\n"
               "SIGUSR2: replace the UCX worker (its clients reconnect); the server does this by\n"
               "itself when the worker is stuck, e.g. after a client died mid-message.\n");
}

/* Reads the token (common/token.h: the file's first line, 1..256 bytes) into buf. */
static int read_token(const char *path, char *buf, size_t cap)
{
    size_t len;
    kvp_status_t st = kvp__token_file_read(path, buf, cap, &len);
    if (st == KVP_ERR_IO)
        fprintf(stderr, "kvpool server: cannot read token file %s\n", path);
    else if (st != KVP_OK)
        fprintf(stderr, "kvpool server: the token in %s (its first line) must be 1..%d bytes, without NUL\n",
                path, KVP__TOKEN_MAX);
    return st == KVP_OK ? 0 : -1;
}

int kvp_cmd_server(int argc, char **argv)
{
    kvp__server_params_t p = {.host = "127.0.0.1", .port = 0, .memory = 1ull << 30};
    kvp_log_level_t lvl = KVP_LOG_INFO;
    char host[256] = "127.0.0.1";
    char token_buf[KVP__TOKEN_MAX + 1];
    const char *token = NULL;
    kvp__thread_name("kvp-server");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--no-prefault")) {
            p.no_prefault = 1;
            continue;
        }
        if (!strcmp(a, "--no-local-reads")) {
            p.no_local_reads = 1;
            continue;
        }
        if (!strcmp(a, "--insecure")) {
            p.insecure = 1;
            continue;
        }
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) {
            fprintf(stderr, "kvpool server: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--listen")) {
            const char *colon = strrchr(v, ':');
            char *end;
            long port = colon ? strtol(colon + 1, &end, 10) : -1;
            if (!colon || colon == v || (size_t)(colon - v) >= sizeof host || *end || port < 0 || port > 65535) {
                fprintf(stderr, "kvpool server: --listen wants HOST:PORT, got '%s'\n", v);
                return 2;
            }
            memcpy(host, v, (size_t)(colon - v));
            host[colon - v] = 0;
            p.port = (uint16_t)port;
        } else if (!strcmp(a, "--filter-bytes")) {
            if (kvp__parse_size(v, &p.filter_bytes) != KVP_OK || p.filter_bytes > (1ull << 30) ||
                (p.filter_bytes && p.filter_bytes < 64)) {
                fprintf(stderr, "kvpool server: bad --filter-bytes '%s' (0, or 64B to 1GiB)\n", v);
                return 2;
            }
            p.no_filter = p.filter_bytes == 0;
        } else if (!strcmp(a, "--memory")) {
            if (kvp__parse_size(v, &p.memory) != KVP_OK || p.memory < 65536) {
                fprintf(stderr, "kvpool server: bad --memory '%s' (e.g. 4GiB, at least 64KiB)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--metrics-port")) {
            char *end;
            long port = strtol(v, &end, 10);
            if (*end || port < 0 || port > 65535) {
                fprintf(stderr, "kvpool server: bad --metrics-port '%s' (0 = any free port)\n", v);
                return 2;
            }
            p.metrics = 1;
            p.metrics_port = (uint16_t)port;
        } else if (!strcmp(a, "--metrics-port-file")) {
            p.metrics_port_file = v;
        } else if (!strcmp(a, "--metrics-listen")) {
            p.metrics_host = v;
        } else if (!strcmp(a, "--max-conns") || !strcmp(a, "--max-conns-per-source")) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || n < 1 || n > 1000000) {
                fprintf(stderr, "kvpool server: bad %s '%s' (1..1000000)\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--max-conns"))
                p.max_conns = (uint32_t)n;
            else
                p.max_conns_per_source = (uint32_t)n;
        } else if (!strcmp(a, "--token-file")) {
            if (read_token(v, token_buf, sizeof token_buf) != 0)
                return 2;
            token = token_buf;
        } else if (!strcmp(a, "--put-timeout")) {
            if (kvp__parse_duration_ns(v, &p.put_timeout_ns) != KVP_OK || !p.put_timeout_ns) {
                fprintf(stderr, "kvpool server: bad --put-timeout '%s' (e.g. 30s)\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--log-level")) {
            if (kvp__log_parse_level(v, &lvl) != 0) {
                fprintf(stderr, "kvpool server: --log-level is error|warn|info|debug\n");
                return 2;
            }
        } else if (!strcmp(a, "--port-file")) {
            p.port_file = v;
        } else {
            fprintf(stderr, "kvpool server: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    kvp__log_set_level(lvl);
    p.host = host;
    p.token = token;
    kvp_status_t st = kvp__server_run(&p);
    if (st == KVP_ERR_BAD_CONFIG)
        return 2; /* (said why) */
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool server: %s\n", kvp_status_str(st));
        return 1;
    }
    return 0;
}
