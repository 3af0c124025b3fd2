/*
 * Fuzz target for the UTF-8 validator (common/utf8.c), against a reference
 * written the other way round: decode each sequence to a code point by the
 * bit pattern alone, then refuse overlong forms, surrogates and values above
 * U+10FFFF.  The validator and kvp__utf8_seq_len must agree with it on every
 * input.
 */
#include <stdint.h>
#include <stdlib.h>

#include "common/utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t ref_len(const uint8_t *p, size_t n)
{
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    size_t l = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3 : (p[0] >> 3) == 30 ? 4 : 0;
    if (!l || l > n)
        return 0;
    uint32_t cp = l == 1 ? p[0] : p[0] & (0x7f >> l);
    for (size_t i = 1; i < l; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min_cp[l] || (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
        return 0;
    return l;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int ok = 1;
    for (size_t i = 0; i < size && ok;) {
        size_t l = ref_len(data + i, size - i);
        if (kvp__utf8_seq_len((const char *)data + i, size - i) != l)
            abort();
        ok = l != 0;
        i += l;
    }
    if (kvp__utf8_valid((const char *)data, size) != ok)
        abort();
    return 0;
}
