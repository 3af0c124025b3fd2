/*
 * The EC push between two processes, for `kvpool bench --ec-push`
 * (tools/bench_ec_push.c): a forked receiver per path and timed producer
 * writes through the push data plane (src/ec/ec_push.h), which tools may
 * not include themselves (scripts/check-layers.sh).  Test support: not part
 * of libkvpool; link kvp_testkit.
 */
#ifndef KVP_TESTKIT_EC_PUSH_DRIVE_H
#define KVP_TESTKIT_EC_PUSH_DRIVE_H

#include <stdint.h>

/* The paths (see tools/bench_ec_push.c for what each is). */
typedef enum {
    KVP__PD_TCP, KVP__PD_UCX, KVP__PD_AUTO, KVP__PD_UCX_EMUL, KVP__PD_UCX_TCP, KVP__PD_AUTO_TCP, KVP__PD_NUM
} kvp__pd_path_t;
extern const char *const kvp__pd_path_names[KVP__PD_NUM];

/* Forks a receiver for path p over a slab of slab_bytes (faulted in),
 * writes every slot of `size` bytes once (warm-up), then `runs` times
 * `iters` writes of src[0..size) into rotating slots, timing each run:
 * gbps[run].  *used_p: "ucx", "tcp", or "none" (failed).  0, or -1 (a
 * write failed, or the receiver did not start).  The caller sets UCX_TLS
 * for the phase before the call. */
int kvp__pd_push_runs(kvp__pd_path_t p, uint64_t size, uint64_t slab_bytes, uint64_t iters, int runs,
                      const uint8_t *src, double *gbps, const char **used_p);
/* Anonymous memory of n bytes, huge-page advised and faulted in (NULL on failure). */
uint8_t *kvp__pd_big(uint64_t n);

#endif
