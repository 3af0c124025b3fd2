/*
 * Scripted collaborators: a clock set by hand, an executor whose jobs run
 * only when told to, a control client that answers from a script and logs
 * its calls, and an inbox fed by hand.  The replay and the tests plug these
 * in where production plugs in the real clock, a thread pool, ZeroMQ.  Test
 * support: not part of libkvpool or its headers; link kvp_testkit.
 */
#ifndef KVP_TESTKIT_EC_SCRIPTED_H
#define KVP_TESTKIT_EC_SCRIPTED_H

#include "kvpool/ec_connector.h"

/* -- clock -- */
typedef struct {
    int64_t now_ms;
} kvp__ec_sclock_t;
kvp_ec_clock_t kvp__ec_sclock_iface(kvp__ec_sclock_t *c);

/* -- executor -- */
enum { KVP__EC_JOB_PENDING = 0, KVP__EC_JOB_DONE, KVP__EC_JOB_CANCELLED };
typedef struct {
    char *addr;
    char *tid;
    int state;
} kvp__ec_sjob_t;

typedef struct {
    kvp__ec_sjob_t *jobs; /* job id k is jobs[k-1] */
    size_t n, cap;
    bool shut_down;
    uint64_t *cancelled; /* ids cancelled by the last shutdown, ascending */
    size_t n_cancelled;
} kvp__ec_sexec_t;

void kvp__ec_sexec_init(kvp__ec_sexec_t *e);
void kvp__ec_sexec_cleanup(kvp__ec_sexec_t *e);
kvp_ec_executor_t kvp__ec_sexec_iface(kvp__ec_sexec_t *e);
/* The pending job with this id, or NULL. */
kvp__ec_sjob_t *kvp__ec_sexec_pending(kvp__ec_sexec_t *e, int64_t id);
/* Number of jobs submitted so far (the last job id). */
static inline uint64_t kvp__ec_sexec_count(const kvp__ec_sexec_t *e) { return e->n; }

/* -- control client -- */
typedef struct {
    bool is_null; /* the answer None */
    char **addrs;
    size_t n;
} kvp__ec_sdiscover_t;

enum { KVP__EC_REPLY_TIMEOUT = 0, KVP__EC_REPLY_OK, KVP__EC_REPLY_ERROR };
typedef struct {
    int kind;
    bool cancelled; /* OK: the result is an object with a truthy "cancelled" */
} kvp__ec_sreply_t;

typedef struct {
    bool is_cancel; /* false: discover_shards */
    char *addr;
    char *tid;
} kvp__ec_scall_t;

typedef struct {
    kvp__ec_sdiscover_t *discover;
    size_t n_discover, pos_discover;
    kvp__ec_sreply_t *replies;
    size_t n_replies, pos_replies;
    kvp__ec_scall_t *calls;
    size_t n_calls, cap_calls;
    bool closed;
} kvp__ec_sctl_t;

void kvp__ec_sctl_init(kvp__ec_sctl_t *c);
/* Replaces the script (takes ownership of both arrays) and clears the call log. */
void kvp__ec_sctl_script(kvp__ec_sctl_t *c, kvp__ec_sdiscover_t *discover, size_t n_discover,
                         kvp__ec_sreply_t *replies, size_t n_replies);
void kvp__ec_sctl_cleanup(kvp__ec_sctl_t *c);
kvp_ec_control_t kvp__ec_sctl_iface(kvp__ec_sctl_t *c);

/* -- inbox -- */
typedef struct {
    size_t shard_count;
    kvp_ec_value_t **queued;
    size_t n_queued, cap_queued;
    kvp_ec_value_t **drained; /* returned by the last drain */
    size_t n_drained;
    bool closed;
} kvp__ec_sinbox_t;

void kvp__ec_sinbox_init(kvp__ec_sinbox_t *b, size_t shard_count);
void kvp__ec_sinbox_cleanup(kvp__ec_sinbox_t *b);
/* Queues one event (takes ownership; freed with kvp_ec_value_free). */
kvp_status_t kvp__ec_sinbox_push(kvp__ec_sinbox_t *b, kvp_ec_value_t *event);
kvp_ec_inbox_t kvp__ec_sinbox_iface(kvp__ec_sinbox_t *b);

#endif
