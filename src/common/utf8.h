/*
 * The one UTF-8 validator.  Well-formed means what RFC 3629 allows and what
 * Python's str.encode("utf-8") can produce: no overlong forms, no surrogates
 * (U+D800..U+DFFF), nothing above U+10FFFF, no truncated sequence.
 */
#ifndef KVP_COMMON_UTF8_H
#define KVP_COMMON_UTF8_H

#include <stddef.h>

/* The length (1..4) of the well-formed sequence at s[0..n), or 0 when it is
 * not one (n == 0 included). */
size_t kvp__utf8_seq_len(const char *s, size_t n);
/* 1 if s[0..n) is well-formed UTF-8. */
int kvp__utf8_valid(const char *s, size_t n);

#endif
