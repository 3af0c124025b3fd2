/* `kvpool bench`: pool benchmarks against a memcpy baseline measured in the same run. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

int kvp_cmd_bench(int argc, char **argv)
{
    /* Scheduler benchmarks live in their own files (bench_*.c). */
    for (int i = 1; i < argc; i++) {
        (void)argv[i];
        /* KVP_BENCH_HOOKS: one line per scheduler bench, e.g.
         * if (strcmp(argv[i], "--kv-scheduler") == 0) return kvp_bench_kv_scheduler(argc, argv); */
    }
    fprintf(stderr, "usage: kvpool bench --uri URI --op put|get|mixed|exists|prefix --size BYTES "
                    "--count N --threads T [--json]\n");
    return 2;
}
