/*
 * The Mooncake trace reader and the infinite-cache bound (trace.h).
 *
 * Reading.  A line is read whole (any length up to KVP__TRACE_MAX_LINE; a
 * longer one is drained without being stored and skipped), parsed by the one
 * JSON reader (common/json.h) and checked field by field before anything of
 * it is kept, so a skipped line leaves no trace in the arrays.  The JSON
 * reader keeps only the class of a float, so every field must be a JSON
 * integer: a float timestamp or length is a mistyped field, an integer past
 * int64 an absurd one.  A negative timestamp is skipped like a negative
 * length (times are relative to the trace start).  The first
 * TRACE_WARN_LINES skipped lines are logged naming FILE:LINE and the reason,
 * then one summary with the count.
 *
 * Memory: the kept requests and one array of all their ids, grown by
 * doubling and trimmed to their exact sizes at the end (so the cleanup frees
 * n and num_hash_ids entries, and a trace built by hand is freed the same
 * way).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/json.h"
#include "common/log.h"
#include "engine/trace.h"

#define TRACE_WARN_LINES 10

typedef struct trace_line {
    char *p;
    size_t len, cap;
    bool too_long; /* the line passed KVP__TRACE_MAX_LINE; p holds nothing */
} trace_line_t;

/* One line into b (without its '\n').  Returns 1 (a line), 0 (end of file,
 * nothing read), -1 (out of memory). */
static int trace_getline(FILE *f, trace_line_t *b)
{
    b->len = 0;
    b->too_long = false;
    int c;
    bool any = false;
    while ((c = getc_unlocked(f)) != EOF) {
        any = true;
        if (c == '\n')
            break;
        if (b->too_long)
            continue;
        if (b->len >= KVP__TRACE_MAX_LINE) {
            b->too_long = true;
            continue;
        }
        if (b->len + 1 >= b->cap) {
            size_t ncap = b->cap ? b->cap * 2 : 4096;
            char *np = kvp__realloc(b->p, b->cap, ncap);
            if (!np)
                return -1;
            b->p = np;
            b->cap = ncap;
        }
        b->p[b->len++] = (char)c;
    }
    return any ? 1 : 0;
}

static bool trace_blank(const trace_line_t *b)
{
    for (size_t i = 0; i < b->len; i++)
        if (b->p[i] != ' ' && b->p[i] != '\t' && b->p[i] != '\r')
            return false;
    return true;
}

/* The integer field `key` of obj into *v_p, or a reason (in why) why not. */
static bool trace_int_field(const kvp__json_t *obj, const char *key, int64_t *v_p, char *why,
                            size_t why_len)
{
    const kvp__json_t *v = kvp__json_get(obj, key);
    if (!v) {
        snprintf(why, why_len, "missing field \"%s\"", key);
        return false;
    }
    if (v->type == KVP__JSON_BIGINT) {
        snprintf(why, why_len, "absurd \"%s\" (beyond 64 bits)", key);
        return false;
    }
    if (v->type != KVP__JSON_INT) {
        snprintf(why, why_len, "\"%s\" is not an integer", key);
        return false;
    }
    *v_p = v->u.i;
    return true;
}

/* Checks one parsed line against the rules of trace.h.  true: *r filled
 * (hash_off and line left to the caller) and *ids_p its ids; false: why. */
static bool trace_check(const kvp__json_t *root, int64_t prev_ts, kvp__trace_req_t *r,
                        const kvp__json_t **ids_p, char *why, size_t why_len)
{
    if (root->type != KVP__JSON_OBJECT) {
        snprintf(why, why_len, "not a JSON object");
        return false;
    }
    if (!trace_int_field(root, "timestamp", &r->timestamp_ms, why, why_len) ||
        !trace_int_field(root, "input_length", &r->input_length, why, why_len) ||
        !trace_int_field(root, "output_length", &r->output_length, why, why_len))
        return false;
    const kvp__json_t *ids = kvp__json_get(root, "hash_ids");
    if (!ids) {
        snprintf(why, why_len, "missing field \"hash_ids\"");
        return false;
    }
    if (ids->type != KVP__JSON_ARRAY) {
        snprintf(why, why_len, "\"hash_ids\" is not an array");
        return false;
    }
    if (r->timestamp_ms < 0) {
        snprintf(why, why_len, "negative timestamp %" PRId64, r->timestamp_ms);
        return false;
    }
    if (r->timestamp_ms < prev_ts) {
        snprintf(why, why_len, "timestamp %" PRId64 " below the previous line's %" PRId64,
                 r->timestamp_ms, prev_ts);
        return false;
    }
    if (r->input_length < 1 || r->input_length > KVP__TRACE_MAX_INPUT) {
        snprintf(why, why_len, "input_length %" PRId64 " outside [1, %d]", r->input_length,
                 KVP__TRACE_MAX_INPUT);
        return false;
    }
    if (r->output_length < 0 || r->output_length > KVP__TRACE_MAX_OUTPUT) {
        snprintf(why, why_len, "output_length %" PRId64 " outside [0, %d]", r->output_length,
                 KVP__TRACE_MAX_OUTPUT);
        return false;
    }
    uint64_t want = ((uint64_t)r->input_length + KVP__TRACE_BLOCK_TOKENS - 1) / KVP__TRACE_BLOCK_TOKENS;
    if (ids->n != want) {
        snprintf(why, why_len, "%zu hash_ids for input_length %" PRId64 " (want %" PRIu64 ")",
                 ids->n, r->input_length, want);
        return false;
    }
    for (size_t i = 0; i < ids->n; i++) {
        const kvp__json_t *id = &ids->u.items[i];
        if (id->type != KVP__JSON_INT || id->u.i < 0) {
            snprintf(why, why_len, "hash_ids[%zu] is not a non-negative integer", i);
            return false;
        }
    }
    r->num_hash = (uint32_t)ids->n;
    *ids_p = ids;
    return true;
}

static void trace_free_arrays(kvp__trace_t *t, size_t reqs_cap, size_t hash_cap)
{
    kvp__free(t->reqs, reqs_cap * sizeof *t->reqs);
    kvp__free(t->hash_ids, hash_cap * sizeof *t->hash_ids);
    t->reqs = NULL;
    t->hash_ids = NULL;
    t->n = t->num_hash_ids = 0;
    t->max_hash_id = -1;
}

/* Shrinks *arr_p from cap to n elements (freed when n is 0). */
static int trace_trim(void **arr_p, size_t cap, size_t n, size_t elem)
{
    if (n == cap)
        return 0;
    if (n == 0) {
        kvp__free(*arr_p, cap * elem);
        *arr_p = NULL;
        return 0;
    }
    void *p = kvp__realloc(*arr_p, cap * elem, n * elem);
    if (!p)
        return -1;
    *arr_p = p;
    return 0;
}

kvp_status_t kvp__trace_read(FILE *f, const char *name, size_t limit, kvp__trace_t *t)
{
    if (!t)
        return KVP_ERR_NULL_POINTER;
    memset(t, 0, sizeof *t);
    t->max_hash_id = -1;
    if (!f)
        return KVP_ERR_NULL_POINTER;
    if (!name)
        name = "(trace)";

    kvp_status_t st = KVP_OK;
    size_t reqs_cap = 0, hash_cap = 0;
    trace_line_t b = {0};
    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    int64_t prev_ts = 0;
    char why[160];

    while (limit == 0 || t->n < limit) {
        int got = trace_getline(f, &b);
        if (got < 0) {
            st = KVP_ERR_NO_MEMORY;
            break;
        }
        if (got == 0)
            break;
        t->lines++;
        const kvp__json_t *root, *ids = NULL;
        kvp__trace_req_t r;
        memset(&r, 0, sizeof r);
        bool ok = false;
        if (b.too_long) {
            snprintf(why, sizeof why, "line longer than %d MiB", KVP__TRACE_MAX_LINE >> 20);
        } else if (trace_blank(&b)) {
            continue;
        } else {
            kvp_status_t ps = kvp__json_parse(&jp, b.p, b.len, &root);
            if (ps == KVP_ERR_NO_MEMORY) {
                st = ps;
                break;
            }
            if (ps != KVP_OK)
                snprintf(why, sizeof why, "not JSON");
            else
                ok = trace_check(root, prev_ts, &r, &ids, why, sizeof why);
        }
        if (!ok) {
            t->skipped++;
            if (t->skipped <= TRACE_WARN_LINES)
                kvp_warn("%s:%" PRIu64 ": skipped: %s", name, t->lines, why);
            continue;
        }
        if (kvp__grow_in((void **)&t->reqs, &reqs_cap, t->n + 1, sizeof *t->reqs, 1024) != 0 ||
            kvp__grow_in((void **)&t->hash_ids, &hash_cap, t->num_hash_ids + r.num_hash,
                         sizeof *t->hash_ids, 16384) != 0) {
            st = KVP_ERR_NO_MEMORY;
            break;
        }
        r.hash_off = t->num_hash_ids;
        r.line = t->lines > UINT32_MAX ? UINT32_MAX : (uint32_t)t->lines;
        for (uint32_t i = 0; i < r.num_hash; i++) {
            int64_t id = ids->u.items[i].u.i;
            t->hash_ids[t->num_hash_ids++] = id;
            if (id > t->max_hash_id)
                t->max_hash_id = id;
        }
        t->reqs[t->n++] = r;
        prev_ts = r.timestamp_ms;
    }
    if (st == KVP_OK && ferror(f)) {
        kvp_error("%s: read error after line %" PRIu64, name, t->lines);
        st = KVP_ERR_IO;
    }
    kvp__free(b.p, b.cap);
    kvp__json_parser_cleanup(&jp);
    if (t->skipped > 0)
        kvp_warn("%s: skipped %" PRIu64 " bad line%s of %" PRIu64 " (the first %" PRIu64 " named above)",
                 name, t->skipped, t->skipped == 1 ? "" : "s", t->lines,
                 t->skipped < TRACE_WARN_LINES ? t->skipped : (uint64_t)TRACE_WARN_LINES);
    if (st == KVP_OK) {
        if (trace_trim((void **)&t->reqs, reqs_cap, t->n, sizeof *t->reqs) != 0)
            st = KVP_ERR_NO_MEMORY;
        else if ((reqs_cap = t->n, trace_trim((void **)&t->hash_ids, hash_cap, t->num_hash_ids,
                                              sizeof *t->hash_ids)) != 0)
            st = KVP_ERR_NO_MEMORY;
    }
    if (st != KVP_OK) {
        if (st == KVP_ERR_NO_MEMORY)
            kvp_error("%s: out of memory at line %" PRIu64, name, t->lines);
        trace_free_arrays(t, reqs_cap, hash_cap);
    }
    return st;
}

kvp_status_t kvp__trace_load(const char *path, size_t limit, kvp__trace_t *t)
{
    if (!t)
        return KVP_ERR_NULL_POINTER;
    memset(t, 0, sizeof *t);
    t->max_hash_id = -1;
    if (!path)
        return KVP_ERR_NULL_POINTER;
    if (strcmp(path, "-") == 0)
        return kvp__trace_read(stdin, "(stdin)", limit, t);
    FILE *f = fopen(path, "rb");
    if (!f) {
        kvp_error("%s: cannot open: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    kvp_status_t st = kvp__trace_read(f, path, limit, t);
    fclose(f);
    return st;
}

void kvp__trace_cleanup(kvp__trace_t *t)
{
    if (!t)
        return;
    trace_free_arrays(t, t->n, t->num_hash_ids);
    t->lines = t->skipped = 0;
}

/*
 * The infinite-cache bound.  A request can reuse the KV of its leading run
 * of ids that an earlier request already held (ids are prefix hashes, so the
 * run stops at the first id not seen before: what follows it has another
 * prefix); it reuses that many full blocks, but never more tokens than its
 * prompt (the last id usually covers a partial block).  "Seen before" means
 * in an earlier request as any of its ids, not only as a leading one.
 *
 * Ids are arbitrary non-negative integers, so instead of a bitmap over
 * 0..max_hash_id the (id, request) pairs are sorted once: the first pair of
 * an id's run names the first request that held it, found by a binary
 * search.  O(M log M) for M ids, 16 bytes per id, for any id values.
 */
typedef struct trace_pair {
    int64_t id;
    size_t req;
} trace_pair_t;

static int trace_pair_cmp(const void *a, const void *b)
{
    const trace_pair_t *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->req < y->req ? -1 : x->req > y->req;
}

/* The first request that holds id (pairs sorted; id is present). */
static size_t trace_first_req(const trace_pair_t *pairs, size_t m, int64_t id)
{
    size_t lo = 0, hi = m;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pairs[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return pairs[lo].req;
}

kvp_status_t kvp__trace_bound(const kvp__trace_t *t, uint64_t *prompt_tokens_p,
                              uint64_t *bound_tokens_p, uint64_t *per_req)
{
    uint64_t prompt = 0, bound = 0;
    size_t m = 0;
    for (size_t r = 0; r < t->n; r++)
        m += t->reqs[r].num_hash;
    trace_pair_t *pairs = m ? kvp__malloc(m * sizeof *pairs) : NULL;
    if (m && !pairs)
        return KVP_ERR_NO_MEMORY;
    size_t at = 0;
    for (size_t r = 0; r < t->n; r++)
        for (uint32_t j = 0; j < t->reqs[r].num_hash; j++)
            pairs[at++] = (trace_pair_t){t->hash_ids[t->reqs[r].hash_off + j], r};
    if (m)
        qsort(pairs, m, sizeof *pairs, trace_pair_cmp);
    for (size_t r = 0; r < t->n; r++) {
        const kvp__trace_req_t *q = &t->reqs[r];
        uint32_t k = 0;
        while (k < q->num_hash && trace_first_req(pairs, m, t->hash_ids[q->hash_off + k]) < r)
            k++;
        uint64_t hit = (uint64_t)k * KVP__TRACE_BLOCK_TOKENS;
        if (hit > (uint64_t)q->input_length)
            hit = (uint64_t)q->input_length;
        prompt += (uint64_t)q->input_length;
        bound += hit;
        if (per_req)
            per_req[r] = hit;
    }
    kvp__free(pairs, m * sizeof *pairs);
    if (prompt_tokens_p)
        *prompt_tokens_p = prompt;
    if (bound_tokens_p)
        *bound_tokens_p = bound;
    return KVP_OK;
}
