/*
 * A strict JSON reader with Python's json.loads acceptance rules, for the
 * kv-sched-replay format (one document per line).  Differences from a
 * generic reader that the replay needs: numbers are classified the way
 * Python classifies them (an integer literal is an int, anything with a
 * fraction or exponent, NaN and +-Infinity are floats), booleans are never
 * ints, duplicate object keys resolve to the last one, and strings are
 * decoded to UTF-8 (lone surrogates as 3-byte sequences).  Integers outside
 * int64 are reported as KVP__JSON_BIGINT.
 *
 * Nodes live in a per-document arena: kvp__json_parse() resets it, so a
 * returned tree is valid until the next parse or cleanup.  Depth is bounded.
 */
#ifndef KVP_KV_JSON_H
#define KVP_KV_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef enum kvp__json_type {
    KVP__JSON_NULL,
    KVP__JSON_FALSE,
    KVP__JSON_TRUE,
    KVP__JSON_INT,
    KVP__JSON_BIGINT,
    KVP__JSON_FLOAT,
    KVP__JSON_STRING,
    KVP__JSON_ARRAY,
    KVP__JSON_OBJECT,
} kvp__json_type_t;

typedef struct kvp__json {
    kvp__json_type_t type;
    uint32_t key_len;         /* object members: the key */
    const char *key;
    size_t n;                 /* string bytes / array items / object members */
    union {
        int64_t i;                /* INT */
        const char *s;            /* STRING: n bytes + NUL */
        struct kvp__json *items;  /* ARRAY, OBJECT (members carry key) */
    } u;
} kvp__json_t;

typedef struct kvp__json_chunk kvp__json_chunk_t;

typedef struct kvp__json_parser {
    kvp__json_chunk_t *chunks;
    kvp__json_t *stack;
    size_t nstack, stack_cap;
    char *sbuf;
    size_t sbuf_cap;
    unsigned max_depth;
} kvp__json_parser_t;

void kvp__json_parser_init(kvp__json_parser_t *p);
void kvp__json_parser_cleanup(kvp__json_parser_t *p);
/* Parses text[0..len) as one JSON document (surrounding whitespace allowed).
 * KVP_OK and *root_p, KVP_ERR_DECODE, or KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__json_parse(kvp__json_parser_t *p, const char *text, size_t len,
                             const kvp__json_t **root_p);

/* The member named key of an object (the last one if repeated), or NULL. */
const kvp__json_t *kvp__json_get(const kvp__json_t *obj, const char *key);

#endif
