/*
 * Deterministic 64-bit mixing (splitmix64, Steele, Lea and Flood 2014): for
 * generated workloads, test data and seeds, never for secrets (random.h).
 */
#ifndef KVP_COMMON_MIX_H
#define KVP_COMMON_MIX_H
#include <stdint.h>

#define KVP__MIX_GOLDEN 0x9e3779b97f4a7c15ull

/* splitmix64's output for state x: a bijection, every bit of x in every bit. */
static inline uint64_t kvp__mix64(uint64_t x)
{
    x += KVP__MIX_GOLDEN;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The next value of the splitmix64 stream at *state (advanced). */
static inline uint64_t kvp__splitmix64(uint64_t *state)
{
    uint64_t r = kvp__mix64(*state);
    *state += KVP__MIX_GOLDEN;
    return r;
}
#endif
