/*
 * Sizes and durations as people write them on command lines and in URIs.
 * Sizes: a non-negative integer or decimal with an optional unit B, KiB, MiB,
 * GiB, TiB (powers of 1024; also K/KB/M/MB/G/GB as 1024-based aliases, as
 * Mooncake's config accepts).  Durations: a number with unit ns, us, ms, s, m,
 * h (bare number = seconds).
 */
#ifndef KVP_COMMON_UNITS_H
#define KVP_COMMON_UNITS_H
#include <stdint.h>
#include "kvpool/status.h"

/* KVP_OK, or KVP_ERR_BAD_SIZE for anything malformed, negative or over 2^63. */
kvp_status_t kvp__parse_size(const char *s, uint64_t *bytes_p);
/* KVP_OK, or KVP_ERR_BAD_OPTION. */
kvp_status_t kvp__parse_duration_ns(const char *s, uint64_t *ns_p);
/* A strict decimal integer in [lo, hi]: digits only (no sign, blank or
 * suffix), no overflow.  KVP_OK, or KVP_ERR_BAD_OPTION (s NULL included). */
kvp_status_t kvp__parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *v_p);
/* "1.5 GiB"-style rendering into buf (always NUL-terminated). */
void kvp__format_size(uint64_t bytes, char *buf, int buflen);

#endif
