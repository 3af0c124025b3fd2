/*
 * A minimal canonical CBOR encoder (RFC 8949), just the types the block-hash
 * contract needs: unsigned and negative integers, byte strings, text strings,
 * definite-length arrays and null.  For these types the output is byte for
 * byte what Python's `cbor2.dumps(obj, canonical=True)` writes (Python tuples
 * and lists both become arrays): every head uses the shortest form, there are
 * no indefinite lengths, no tags and no floats.
 *
 * The encoder writes into a growable buffer that may start on the caller's
 * stack.  Errors are sticky: once a write fails (out of memory, or a length
 * that overflows size_t), later writes do nothing and kvp__cbor_status()
 * reports the failure, so an encode sequence checks once at the end.
 *
 * Text strings are written as given; checking that they are UTF-8 is the
 * caller's job (kvp__utf8_valid).
 */
#ifndef KVP_COMMON_CBOR_H
#define KVP_COMMON_CBOR_H

#include "common/utf8.h" /* kvp__utf8_valid, for the callers that check text */

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

typedef struct kvp__cbor {
    uint8_t *data;        /* the encoded bytes so far */
    size_t len;           /* bytes used */
    size_t cap;           /* bytes available at data */
    uint8_t *inline_buf;  /* the caller's initial buffer (never freed), or NULL */
    kvp_status_t status;  /* KVP_OK until a write fails */
} kvp__cbor_t;

/* Initializes `c` over the caller's buffer `buf` of `cap` bytes (buf may be
 * NULL with cap 0: the first write allocates).  `buf` must outlive `c`.  When
 * the encoding outgrows it, the encoder moves to heap memory from the
 * allocation shim; kvp__cbor_cleanup() frees that. */
void kvp__cbor_init(kvp__cbor_t *c, uint8_t *buf, size_t cap);
/* Frees heap memory (if any).  `c` may be reused after kvp__cbor_init(). */
void kvp__cbor_cleanup(kvp__cbor_t *c);
/* Forgets the bytes written (keeps the memory) and clears the error. */
void kvp__cbor_reset(kvp__cbor_t *c);
/* KVP_OK, or the first error: KVP_ERR_NO_MEMORY (logged once, by the write
 * that failed). */
kvp_status_t kvp__cbor_status(const kvp__cbor_t *c);

void kvp__cbor_uint(kvp__cbor_t *c, uint64_t v);
/* Any int64: non-negative values as major type 0, negative as major type 1. */
void kvp__cbor_int(kvp__cbor_t *c, int64_t v);
void kvp__cbor_bytes(kvp__cbor_t *c, const void *p, size_t n);
void kvp__cbor_text(kvp__cbor_t *c, const char *s, size_t n);
/* The head of an array of `n` items; the caller then writes the n items. */
void kvp__cbor_array(kvp__cbor_t *c, uint64_t n);
void kvp__cbor_null(kvp__cbor_t *c);


#endif
