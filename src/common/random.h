/*
 * Secrets from the kernel's CSPRNG (getrandom(2)): connection keys, nonces.
 * There is no fallback: a process that cannot get random bytes must not make
 * up predictable ones, so callers fail closed on an error.
 */
#ifndef KVP_COMMON_RANDOM_H
#define KVP_COMMON_RANDOM_H

#include <stddef.h>

#include "kvpool/status.h"

/* Fills buf[0..n) (blocks only while the kernel's pool is not yet seeded,
 * at boot).  KVP_OK, or KVP_ERR_IO (logged) when getrandom fails. */
kvp_status_t kvp__random_bytes(void *buf, size_t n);

#endif
