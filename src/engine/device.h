/*
 * The replays' stand-in for an accelerator: one thread at the lowest CPU
 * priority Linux has (SCHED_IDLE, and nice 19 where that is refused) that
 * runs what a GPU would compute -- the epd replay's encoder outputs and
 * its byte-for-byte checks of what the prefill took -- while the engine
 * thread waits for it, as for a device synchronisation.
 *
 * Why.  On a real host the encoder's work runs on the GPU and takes no CPU
 * from the serving threads (the connector's control server, its pushes,
 * the pool server).  Run on the engine thread at normal priority, the
 * stand-in took most of this 2-core VM's CPU during the replay, and every
 * control-plane wake-up queued behind it.  At nice 19 it takes the CPU the
 * serving threads leave over, but a core running it still counts as busy
 * when the kernel places a thread that wakes up, so wake-ups queued on the
 * other core while it ran.  Under SCHED_IDLE the core counts as idle
 * (select_idle_sibling's sched_idle_cpu): a woken serving thread goes
 * there and runs at once.  The engine thread still waits for every
 * result, so the work done and its order are unchanged.
 */
#ifndef KVP_ENGINE_DEVICE_H
#define KVP_ENGINE_DEVICE_H

#include <stdbool.h>

#include "kvpool/status.h"

typedef struct kvp__device kvp__device_t;

/* Starts the thread ("kvp-device", nice 19 and SCHED_IDLE: lowering one's
 * own priority needs no privilege).  KVP_ERR_NO_MEMORY when it cannot
 * start. */
kvp_status_t kvp__device_create(kvp__device_t **d_p);

/* Runs fn(arg) on the device thread and returns when it has returned.
 * One caller at a time (the engine thread); d NULL: runs it here. */
void kvp__device_run(kvp__device_t *d, void (*fn)(void *arg), void *arg);

/* The nice value the device thread runs at (what it got: 19, or what the
 * system allowed); -100 for NULL. */
int kvp__device_nice(const kvp__device_t *d);

/* Whether the device thread runs under SCHED_IDLE (false for NULL). */
bool kvp__device_sched_idle(const kvp__device_t *d);

/* Waits for a run in progress, ends the thread, frees d (NULL: nothing). */
void kvp__device_destroy(kvp__device_t *d);

#endif
