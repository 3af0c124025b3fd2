/*
 * A minimal MessagePack writer and a bounded, allocation-free reader, for the
 * wire protocol's headers.  The reader never reads past `end`: every read
 * checks the bytes it needs and, on any mismatch or shortage, sets `err` and
 * returns a zero value; callers check kvp__mp_ok() once at the end of a
 * message (sticky error, like a stream's failbit).
 *
 * Two integer and string forms: the wire headers (net/wire.c) use
 * kvp__mpw_int and kvp__mpw_str, whose bytes are frozen by the wire protocol
 * (a negative below -32 is always int64, a string over 255 bytes always
 * str32).  The connector metadata codecs use the _small forms: msgpack's
 * smallest encoding for every value, byte for byte what libmsgpack-c and
 * Python's msgpack.packb write.
 */
#ifndef KVP_COMMON_MP_H
#define KVP_COMMON_MP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp__mpw {
    uint8_t *buf;
    size_t len, cap;
    int err;            /* allocation failed */
    int owned;          /* buf allocated by the writer (grown via kvp__realloc) */
} kvp__mpw_t;

/* A writer over caller storage (owned = 0; grows into heap memory if needed). */
void kvp__mpw_init(kvp__mpw_t *w, void *storage, size_t cap);
void kvp__mpw_free(kvp__mpw_t *w);
void kvp__mpw_array(kvp__mpw_t *w, uint32_t n);
void kvp__mpw_map(kvp__mpw_t *w, uint32_t n);
void kvp__mpw_uint(kvp__mpw_t *w, uint64_t v);
void kvp__mpw_int(kvp__mpw_t *w, int64_t v);
void kvp__mpw_nil(kvp__mpw_t *w);
void kvp__mpw_bool(kvp__mpw_t *w, int v);
void kvp__mpw_bin(kvp__mpw_t *w, const void *p, uint32_t n);
void kvp__mpw_str(kvp__mpw_t *w, const char *s, uint32_t n);
/* Smallest forms (int8/16/32 for negatives, str16 between 256 and 65535 bytes). */
void kvp__mpw_int_small(kvp__mpw_t *w, int64_t v);
void kvp__mpw_str_small(kvp__mpw_t *w, const char *s, uint32_t n);
/* The written bytes as one exact-size kvp__malloc block (1 byte when empty),
 * freed with kvp__free(buf, len ? len : 1); the writer is freed either way.
 * 0, or -1 when a write or the copy ran out of memory. */
int kvp__mpw_finish(kvp__mpw_t *w, uint8_t **buf_p, size_t *len_p);

typedef struct kvp__mpr {
    const uint8_t *p, *end;
    int err;
} kvp__mpr_t;

static inline void kvp__mpr_init(kvp__mpr_t *r, const void *p, size_t n)
{
    r->p = p;
    r->end = (const uint8_t *)p + n;
    r->err = 0;
}
static inline int kvp__mpr_ok(const kvp__mpr_t *r) { return !r->err; }
/* Array header; returns the count (0 on error).  `max` bounds it. */
uint32_t kvp__mpr_array(kvp__mpr_t *r, uint32_t max);
/* The same, and the count is also bounded by the bytes left (each element
 * takes at least one), so a decoder may size an allocation by it. */
uint32_t kvp__mpr_array_fit(kvp__mpr_t *r, uint32_t max);
uint64_t kvp__mpr_uint(kvp__mpr_t *r);
int64_t kvp__mpr_int(kvp__mpr_t *r);
int kvp__mpr_bool(kvp__mpr_t *r);
/* 1 if the next value is nil (consumed), else 0 (nothing consumed). */
int kvp__mpr_nil(kvp__mpr_t *r);
/* bin or str: a view into the input, length bounded by max. */
const uint8_t *kvp__mpr_bytes(kvp__mpr_t *r, uint32_t max, uint32_t *len_p);
/* str only, or bin only (kvp__mpr_bytes takes either). */
const uint8_t *kvp__mpr_str(kvp__mpr_t *r, uint32_t max, uint32_t *len_p);
const uint8_t *kvp__mpr_bin(kvp__mpr_t *r, uint32_t max, uint32_t *len_p);
/* Skips one value of any type (nesting bounded). */
void kvp__mpr_skip(kvp__mpr_t *r);
/* 1 when every byte was consumed. */
static inline int kvp__mpr_done(const kvp__mpr_t *r) { return !r->err && r->p == r->end; }

#endif
