/*
 * Fuzz target for the Mooncake trace reader and the bound (engine/trace.c):
 * any bytes, read as a trace file through fmemopen, give KVP_OK with every
 * kept request obeying the reader's rules (len(hash_ids) == ceil(input /
 * 512), lengths in range, ids non-negative, timestamps non-decreasing), a
 * bound no larger than the prompt tokens, and nothing left allocated.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "engine/trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint64_t before = kvp__alloc_bytes_in_use();
    static const char empty = '\0';
    /* fmemopen of 0 bytes is refused on some libcs: read an empty file then. */
    FILE *f = fmemopen(size ? (void *)data : (void *)&empty, size ? size : 1, "r");
    if (!f)
        abort();
    if (!size)
        (void)getc(f);
    kvp__trace_t t;
    kvp_status_t st = kvp__trace_read(f, "fuzz", 0, &t);
    fclose(f);
    if (st != KVP_OK)
        abort(); /* no I/O error or out of memory can come from these bytes */
    size_t ids = 0;
    for (size_t i = 0; i < t.n; i++) {
        const kvp__trace_req_t *r = &t.reqs[i];
        if (r->input_length < 1 || r->input_length > KVP__TRACE_MAX_INPUT || r->output_length < 0 ||
            r->output_length > KVP__TRACE_MAX_OUTPUT || r->timestamp_ms < 0 ||
            (i && r->timestamp_ms < t.reqs[i - 1].timestamp_ms) ||
            r->num_hash != (uint64_t)(r->input_length + KVP__TRACE_BLOCK_TOKENS - 1) / KVP__TRACE_BLOCK_TOKENS ||
            r->hash_off != ids || r->line < 1 || r->line > t.lines)
            abort();
        for (uint32_t j = 0; j < r->num_hash; j++)
            if (t.hash_ids[r->hash_off + j] < 0 || t.hash_ids[r->hash_off + j] > t.max_hash_id)
                abort();
        ids += r->num_hash;
    }
    if (ids != t.num_hash_ids || t.n + t.skipped > t.lines)
        abort();
    uint64_t prompt = 0, bound = 0;
    if (kvp__trace_bound(&t, &prompt, &bound, NULL) != KVP_OK || bound > prompt)
        abort();
    kvp__trace_cleanup(&t);
    if (kvp__alloc_bytes_in_use() != before)
        abort();
    return 0;
}
