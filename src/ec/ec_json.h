/*
 * JSON values for readiness events, and the Python conversions the original
 * applies to them (str(), int(), truthiness), so a malformed event is
 * dropped exactly where the original drops it.
 */
#ifndef KVP_EC_JSON_H
#define KVP_EC_JSON_H

#include "common/json.h"
#include "kvpool/ec_connector.h"

/* Python str(v) as a new owned string (kvp__strfree).  KVP_ERR_NO_MEMORY. */
kvp_status_t kvp__ec_py_str(const kvp_ec_value_t *v, char **out_p);
/* Python int(v): KVP_EC_ERR_NONE, KVP_EC_ERR_TYPE (null, list, object) or
 * KVP_EC_ERR_VALUE (a string that is not an integer, or one outside int64:
 * the original would accept a huge integer; kvpool refuses it). */
kvp_ec_error_t kvp__ec_py_int(const kvp_ec_value_t *v, int64_t *out_p);

/* v in canonical JSON (Python json.dumps(sort_keys=True, separators=(",", ":"),
 * ensure_ascii=True)): keys sorted by code point, through the common writer. */
void kvp__ec_value_write(kvp__jw_t *b, const kvp_ec_value_t *v);

/* Python's repr(s) of the str s[0..n) (UTF-8 or WTF-8) appended to b, as
 * the seed's f"{x!r}" writes it, stopping with "..." past max bytes. */
void kvp__ec_py_repr(kvp__jw_t *b, const char *s, size_t n, size_t max);

#endif
