/*
 * The membership filter: a counting Bloom filter, blocked, over 64-bit key
 * hashes.  The pool server keeps one over its live keys in shared memory
 * (the local-read table, server/lreads.c), so that a client on its host
 * answers "absent" for a key without a round trip (docs/transport.md §10).
 *
 * Layout: nblocks blocks of KVP_CF_BLOCK one-byte counters, one cache line
 * each.  A key's hash picks one block and KVP_CF_K counters in it; the key
 * may be present when all KVP_CF_K are non-zero, and is absent otherwise.
 * A counter that reaches 255 stays there (never decremented again): it
 * can only cause false positives, never a false negative.
 *
 * Writers (the server's store) change the counters of a key only under
 * that key's own lock, add before the key is visible and del after it is
 * gone; each counter is changed atomically, so keys under different locks
 * may share counters.  Readers (other processes, through a read-only
 * mapping) use acquire loads: a key whose add happened before the reader
 * learnt of it (the put's reply) is always seen as maybe-present.
 */
#ifndef KVP_COMMON_CFILTER_H
#define KVP_COMMON_CFILTER_H

#include <stdatomic.h>
#include <stdint.h>

#define KVP_CF_BLOCK 64u /* counters (bytes) per block */
#define KVP_CF_K 4u      /* counters per key */

typedef struct kvp__cfilter {
    _Atomic uint8_t *c;  /* nblocks * KVP_CF_BLOCK counters; NULL = no filter */
    uint64_t nblocks;
    /* The writer's own figures (not in the shared memory). */
    _Atomic uint64_t keys;      /* adds minus dels */
    _Atomic uint64_t saturated; /* counters that reached 255 (stuck) */
} kvp__cfilter_t;

/* mem: nblocks * KVP_CF_BLOCK bytes, KVP_CF_BLOCK-aligned; zeroed by the
 * writer's init, taken as is by a reader's attach. */
void kvp__cfilter_init(kvp__cfilter_t *f, void *mem, uint64_t nblocks);
void kvp__cfilter_attach(kvp__cfilter_t *f, const void *mem, uint64_t nblocks);

void kvp__cfilter_add(kvp__cfilter_t *f, uint64_t h);
void kvp__cfilter_del(kvp__cfilter_t *f, uint64_t h);
/* 0: the key of hash h is not in the set; 1: it may be. */
int kvp__cfilter_maybe(const kvp__cfilter_t *f, uint64_t h);

#endif
