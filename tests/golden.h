/*
 * Expected bytes for golden-encoding tests, written out piece by piece:
 *   gold_t g = {.n = 0};  G(&g, 0x94, 0x01);  g_fill(&g, 'a', 31);
 */
#ifndef KVP_TESTS_GOLDEN_H
#define KVP_TESTS_GOLDEN_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    uint8_t b[2048];
    size_t n;
} gold_t;

static inline void g_bytes(gold_t *g, const uint8_t *p, size_t n)
{
    memcpy(g->b + g->n, p, n);
    g->n += n;
}
#define G(g, ...) g_bytes((g), (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__}))

static inline void g_fill(gold_t *g, int c, size_t n)
{
    memset(g->b + g->n, c, n);
    g->n += n;
}

/* Four strings at msgpack's head boundaries: 31 'a' (fixstr), 32 'b' and
 * 255 'c' (str8), 256 'd' (str16), NUL-terminated, for encoders' inputs. */
static inline void golden_strs(const char *out[4])
{
    static char s31[32], s32[33], s255[256], s256[257];
    memset(s31, 'a', 31);
    memset(s32, 'b', 32);
    memset(s255, 'c', 255);
    memset(s256, 'd', 256);
    out[0] = s31;
    out[1] = s32;
    out[2] = s255;
    out[3] = s256;
}

/* Their smallest msgpack encodings, in that order. */
static inline void g_golden_strs(gold_t *g)
{
    G(g, 0xbf);
    g_fill(g, 'a', 31);
    G(g, 0xd9, 0x20);
    g_fill(g, 'b', 32);
    G(g, 0xd9, 0xff);
    g_fill(g, 'c', 255);
    G(g, 0xda, 0x01, 0x00);
    g_fill(g, 'd', 256);
}

#endif
