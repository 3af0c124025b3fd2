/*
 * Mooncake-format request traces (../shared/data/mooncake-traces/README.md):
 * JSON Lines, one request per line, {"timestamp": ms, "input_length": N,
 * "output_length": M, "hash_ids": [ids]}, 512 tokens per hash id, each id a
 * prefix hash (it stands for its block and everything before it).
 *
 * The reader keeps every line it can trust and skips the rest with a counted
 * warning naming the line (the first few are logged, then one summary):
 * not JSON, a missing or mistyped field, a negative or absurd length
 * (input_length < 1 or > KVP__TRACE_MAX_INPUT, output_length < 0 or >
 * KVP__TRACE_MAX_OUTPUT), a negative id, hash_ids not matching input_length
 * (len != ceil(input_length / 512)), a negative timestamp or one below the
 * previous kept line's, a line over KVP__TRACE_MAX_LINE bytes.  Memory: the
 * requests and one array of every id.
 */
#ifndef KVP_ENGINE_TRACE_H
#define KVP_ENGINE_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvpool/status.h"

#define KVP__TRACE_BLOCK_TOKENS 512       /* tokens per hash id */
#define KVP__TRACE_MAX_INPUT (16 << 20)   /* tokens */
#define KVP__TRACE_MAX_OUTPUT (1 << 20)   /* tokens */
#define KVP__TRACE_MAX_LINE (64 << 20)    /* bytes; a longer line is skipped */

typedef struct kvp__trace_req {
    int64_t timestamp_ms;  /* arrival, relative to the trace start */
    int64_t input_length;  /* prompt tokens, >= 1 */
    int64_t output_length; /* generated tokens, >= 0 */
    size_t hash_off;       /* its ids: trace->hash_ids[hash_off .. hash_off + num_hash) */
    uint32_t num_hash;
    uint32_t line;         /* 1-based line number in the file */
} kvp__trace_req_t;

typedef struct kvp__trace {
    kvp__trace_req_t *reqs; /* kept lines, in file order */
    size_t n;
    int64_t *hash_ids;
    size_t num_hash_ids;
    int64_t max_hash_id;    /* -1 when there are none */
    uint64_t lines;         /* lines read (blank lines included) */
    uint64_t skipped;       /* lines skipped (blank lines not counted) */
} kvp__trace_t;

/* Reads path ("-" = stdin).  limit > 0: stop after that many kept requests.
 * [out] t (caller storage; free with kvp__trace_cleanup even on error).
 * Returns KVP_OK (bad lines skipped and counted); KVP_ERR_NULL_POINTER;
 * KVP_ERR_IO (cannot open/read; logged); KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__trace_load(const char *path, size_t limit, kvp__trace_t *t);
/* The same from an open stream (not closed). */
kvp_status_t kvp__trace_read(FILE *f, const char *name, size_t limit, kvp__trace_t *t);
void kvp__trace_cleanup(kvp__trace_t *t);

/* The infinite-cache bound: for each request in order, its leading hash ids
 * already seen in an earlier request (as any of its ids) x 512 tokens,
 * capped by its input_length.  [out] prompt_tokens_p, bound_tokens_p
 * (sums); per_req (NULL or t->n entries): each request's bound tokens.
 * Returns KVP_OK or KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__trace_bound(const kvp__trace_t *t, uint64_t *prompt_tokens_p,
                              uint64_t *bound_tokens_p, uint64_t *per_req);

/* Synthetic traces (`kvpool trace-gen`). */
typedef struct kvp__trace_gen_params {
    uint64_t requests;       /* total requests */
    uint64_t sessions;       /* multi-turn conversations; 0: requests / turns */
    uint32_t turns;          /* mean turns per session */
    uint32_t system_prompts; /* shared system prompts */
    double rate;             /* mean arrivals per second (Poisson) */
    uint64_t seed;
} kvp__trace_gen_params_t;

/* Defaults (documented in tools/cmd_trace_gen.c's usage). */
void kvp__trace_gen_params_init(kvp__trace_gen_params_t *p);
/* Writes the trace to f, deterministic for the params.  Returns KVP_OK;
 * KVP_ERR_INVALID_ARG (zero requests or turns, sessions > requests,
 * requests > UINT32_MAX, a rate not in [0.001, 1e6] or too low
 * for the requests' time span to fit int64 microseconds; logged); KVP_ERR_IO;
 * KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__trace_gen(const kvp__trace_gen_params_t *p, FILE *f);

#endif
