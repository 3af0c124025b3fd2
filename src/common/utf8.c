#include "common/utf8.h"

size_t kvp__utf8_seq_len(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    if (n == 0)
        return 0;
    unsigned b = p[0];
    if (b < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the first continuation byte */
    if (b >= 0xc2 && b <= 0xdf) {
        need = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
        need = 2;
        if (b == 0xe0)
            lo = 0xa0; /* no overlongs */
        else if (b == 0xed)
            hi = 0x9f; /* no surrogates U+D800..U+DFFF */
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 3;
        if (b == 0xf0)
            lo = 0x90; /* no overlongs */
        else if (b == 0xf4)
            hi = 0x8f; /* nothing above U+10FFFF */
    } else {
        return 0;
    }
    if (n - 1 < need)
        return 0;
    if (p[1] < lo || p[1] > hi)
        return 0;
    for (size_t k = 2; k <= need; k++)
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    return need + 1;
}

int kvp__utf8_valid(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) { /* the common case, one byte at a time */
            i++;
            continue;
        }
        size_t l = kvp__utf8_seq_len(s + i, n - i);
        if (!l)
            return 0;
        i += l;
    }
    return 1;
}
