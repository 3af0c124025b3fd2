/*
 * The memcpy baseline the replays report their data paths against, as
 * `kvpool bench` defines it: one thread copying distinct sources into
 * distinct, pre-faulted destinations.
 */
#ifndef KVP_ENGINE_MEMCPY_BASELINE_H
#define KVP_ENGINE_MEMCPY_BASELINE_H

#include <stdint.h>

/* GB/s (1e9 B/s) copying blocks of `size` bytes (8..64 of them, about
 * 256 MiB in all); 0 when size < 1 or the buffers cannot be mapped. */
double kvp__memcpy_baseline_gbps(int64_t size);

#endif
