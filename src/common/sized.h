/*
 * Structs that callers fill and that may grow (kvp_kv_config_t,
 * kvp_ec_config_t, kvp_ec_sched_params_t, kvp_kv_block_params_t) begin with
 * `uint32_t size`: sizeof the struct as the caller's header declared it.
 * Fields are only ever appended, so the caller's bytes are a prefix of this
 * library's struct: the library starts from its defaults and copies the
 * caller's `size` bytes over them, so a field the caller's header did not have
 * keeps its default.  A size that does not cover `size` itself (0 included)
 * is KVP_ERR_INVALID_ARG; one larger than this library's struct (a caller
 * built against a newer header, with fields this library would ignore) is
 * KVP_ERR_VERSION.
 *
 * An appended field can start inside an older struct's tail padding, which
 * the older caller's size covers: so such a caller must have its struct
 * initialised by the library's *_init (which writes the defaults there too)
 * or zeroed, and every field appended must be one whose zero value is
 * harmless.  Interfaces (tables of functions) inside these structs are not
 * sized themselves: one that grows must move behind a pointer first.
 */
#ifndef KVP_COMMON_SIZED_H
#define KVP_COMMON_SIZED_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvpool/status.h"

/* dst: dst_size bytes already holding the defaults; src: the caller's
 * struct.  On KVP_OK dst holds the caller's fields and dst's size is
 * dst_size; on error dst is unchanged. */
static inline kvp_status_t kvp__sized_adopt(void *dst, size_t dst_size, const void *src)
{
    uint32_t size;
    memcpy(&size, src, sizeof size);
    if (size < sizeof size)
        return KVP_ERR_INVALID_ARG;
    if (size > dst_size)
        return KVP_ERR_VERSION;
    memcpy(dst, src, size);
    size = (uint32_t)dst_size;
    memcpy(dst, &size, sizeof size);
    return KVP_OK;
}

#endif
