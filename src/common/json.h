/*
 * The one JSON reader and the one JSON writer.
 *
 * The reader is strict, with Python's json.loads acceptance rules: numbers
 * are classified as Python classifies them (an integer literal is an int,
 * anything with a fraction or exponent, NaN and +-Infinity are floats; only
 * the class of a float is kept, no caller needs its value), booleans are
 * never ints, an integer outside int64 is KVP__JSON_BIGINT, and strings must
 * be well-formed UTF-8 (common/utf8.h) without raw control characters.
 * Strings are decoded to UTF-8; a \u escape of a lone surrogate becomes its
 * 3-byte (WTF-8) form, so it round-trips through the writer.  Objects keep
 * every member in input order, duplicates included: kvp__json_get finds the
 * last one, as Python's dict keeps the last value.  Nesting is bounded: a
 * value inside more than max_depth containers is refused.
 *
 * Nodes live in the parser's arena: kvp__json_parse() reuses it, so a
 * returned tree is valid until the next parse or the cleanup.
 *
 * The writer is Python's json.dumps(ensure_ascii=True, separators=(",",
 * ":")) for what kvpool writes (no floats): a growable buffer whose
 * out-of-memory is sticky (oom), checked once at the end.
 */
#ifndef KVP_COMMON_JSON_H
#define KVP_COMMON_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
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
    uint32_t key_len;         /* object members: the key (NUL-terminated) */
    const char *key;
    size_t n;                 /* string bytes / array items / object members */
    union {
        int64_t i;                /* INT */
        const char *s;            /* STRING: n bytes + NUL */
        struct kvp__json *items;  /* ARRAY, OBJECT (members carry key) */
    } u;
} kvp__json_t;

typedef struct kvp__json_parser {
    kvp__arena_t arena; /* the nodes and strings of the last document */
    kvp__json_t *stack;
    size_t nstack, stack_cap;
    char *sbuf;
    size_t sbuf_cap;
    unsigned max_depth; /* 128 after init; the caller may change it */
} kvp__json_parser_t;

void kvp__json_parser_init(kvp__json_parser_t *p);
void kvp__json_parser_cleanup(kvp__json_parser_t *p);
/* Parses text[0..len) as one JSON document (surrounding whitespace allowed).
 * KVP_OK and *root_p, KVP_ERR_DECODE, or KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__json_parse(kvp__json_parser_t *p, const char *text, size_t len,
                             const kvp__json_t **root_p);

/* The member named key of an object (the last one if repeated), or NULL. */
const kvp__json_t *kvp__json_get(const kvp__json_t *obj, const char *key);

/* ---- writer ---- */

typedef struct kvp__jw {
    char *p;
    size_t len, cap;
    bool oom;
} kvp__jw_t;

void kvp__jw_init(kvp__jw_t *b);
void kvp__jw_cleanup(kvp__jw_t *b);
/* Raw bytes (already JSON, or the text around it). */
void kvp__jw_put(kvp__jw_t *b, const char *s, size_t n);
void kvp__jw_puts(kvp__jw_t *b, const char *s);
void kvp__jw_int(kvp__jw_t *b, int64_t v);
void kvp__jw_uint(kvp__jw_t *b, uint64_t v);
void kvp__jw_bool(kvp__jw_t *b, bool v);
/* A string literal of s[0..n) (UTF-8, or WTF-8), escaped as ensure_ascii does:
 * \" \\ \n \r \t \b \f, other controls and every non-ASCII code point as
 * \uXXXX (surrogate pairs above U+FFFF).  A byte that starts no sequence is
 * written as the code point of its value. */
void kvp__jw_str(kvp__jw_t *b, const char *s, size_t n);

#endif
