/*
 * JSON values for readiness events, and the Python conversions the original
 * applies to them (str(), int(), truthiness), so a malformed event is
 * dropped exactly where the original drops it.
 */
#ifndef KVP_EC_JSON_H
#define KVP_EC_JSON_H

#include "kvpool/ec_connector.h"

/* Python truthiness; NULL (a missing key) is falsy. */
bool kvp__ec_py_truthy(const kvp_ec_value_t *v);
/* Python str(v) as a new owned string (kvp__strfree).  KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_py_str(const kvp_ec_value_t *v, char **out_p);
/* Python int(v): KVP_EC_ERR_NONE, KVP_EC_ERR_TYPE (null, list, object) or
 * KVP_EC_ERR_VALUE (a string that is not an integer, or one outside int64:
 * the original would accept a huge integer; kvpool refuses it). */
kvp_ec_error_t kvp__ec_py_int(const kvp_ec_value_t *v, int64_t *out_p);

/* Canonical JSON writer helpers (Python json.dumps(sort_keys, no spaces,
 * ensure_ascii)).  A growable byte buffer. */
typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} kvp__ec_buf_t;

void kvp__ec_buf_init(kvp__ec_buf_t *b);
void kvp__ec_buf_cleanup(kvp__ec_buf_t *b);
void kvp__ec_buf_put(kvp__ec_buf_t *b, const char *s, size_t n);
void kvp__ec_buf_puts(kvp__ec_buf_t *b, const char *s);
void kvp__ec_buf_int(kvp__ec_buf_t *b, int64_t v);
/* A JSON string literal of s[0..n), escaped as ensure_ascii does. */
void kvp__ec_buf_jstr(kvp__ec_buf_t *b, const char *s, size_t n);
/* Any value, canonical form (keys sorted by code point). */
void kvp__ec_buf_value(kvp__ec_buf_t *b, const kvp_ec_value_t *v);

#endif
