#include "support/ec_scripted.h"

#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"
#include "ec/ec_table.h"

/* ---- clock ---- */

static int64_t sclock_now(void *ctx) { return ((kvp__ec_sclock_t *)ctx)->now_ms; }

kvp_ec_clock_t kvp__ec_sclock_iface(kvp__ec_sclock_t *c)
{
    kvp_ec_clock_t i = {sclock_now, c};
    return i;
}

/* ---- executor ---- */

void kvp__ec_sexec_init(kvp__ec_sexec_t *e) { memset(e, 0, sizeof *e); }

void kvp__ec_sexec_cleanup(kvp__ec_sexec_t *e)
{
    for (size_t i = 0; i < e->n; i++) {
        kvp__strfree(e->jobs[i].addr);
        kvp__strfree(e->jobs[i].tid);
    }
    if (e->jobs)
        kvp__free(e->jobs, e->cap * sizeof *e->jobs);
    if (e->cancelled)
        kvp__free(e->cancelled, e->n_cancelled * sizeof *e->cancelled);
    memset(e, 0, sizeof *e);
}

static kvp_status_t sexec_submit(void *ctx, const char *addr, const char *tid, uint64_t *job_p)
{
    kvp__ec_sexec_t *e = ctx;
    if (e->shut_down)
        return KVP_ERR_CLOSED; /* "cannot schedule new futures after shutdown" */
    if (e->n == e->cap) {
        size_t ncap = e->cap ? e->cap * 2 : 64;
        kvp__ec_sjob_t *nj = kvp__realloc(e->jobs, e->cap * sizeof *nj, ncap * sizeof *nj);
        if (!nj)
            return KVP_ERR_NO_MEMORY;
        e->jobs = nj;
        e->cap = ncap;
    }
    kvp__ec_sjob_t *j = &e->jobs[e->n];
    j->addr = kvp__strdup(addr);
    j->tid = kvp__strdup(tid);
    j->state = KVP__EC_JOB_PENDING;
    if (!j->addr || !j->tid) {
        kvp__strfree(j->addr);
        kvp__strfree(j->tid);
        return KVP_ERR_NO_MEMORY;
    }
    *job_p = ++e->n;
    return KVP_OK;
}

static void sexec_shutdown(void *ctx)
{
    kvp__ec_sexec_t *e = ctx;
    e->shut_down = true;
    if (e->cancelled)
        kvp__free(e->cancelled, e->n_cancelled * sizeof *e->cancelled);
    e->cancelled = NULL;
    e->n_cancelled = 0;
    size_t n = 0;
    for (size_t i = 0; i < e->n; i++)
        n += e->jobs[i].state == KVP__EC_JOB_PENDING;
    if (!n)
        return;
    e->cancelled = kvp__malloc(n * sizeof *e->cancelled);
    for (size_t i = 0; i < e->n; i++) {
        if (e->jobs[i].state != KVP__EC_JOB_PENDING)
            continue;
        e->jobs[i].state = KVP__EC_JOB_CANCELLED;
        if (e->cancelled)
            e->cancelled[e->n_cancelled++] = i + 1;
    }
}

kvp_ec_executor_t kvp__ec_sexec_iface(kvp__ec_sexec_t *e)
{
    kvp_ec_executor_t i = {sexec_submit, sexec_shutdown, e};
    return i;
}

kvp__ec_sjob_t *kvp__ec_sexec_pending(kvp__ec_sexec_t *e, int64_t id)
{
    if (id < 1 || (uint64_t)id > e->n)
        return NULL;
    kvp__ec_sjob_t *j = &e->jobs[id - 1];
    return j->state == KVP__EC_JOB_PENDING ? j : NULL;
}

/* ---- control client ---- */

void kvp__ec_sctl_init(kvp__ec_sctl_t *c) { memset(c, 0, sizeof *c); }

static void free_script(kvp__ec_sctl_t *c)
{
    for (size_t i = 0; i < c->n_discover; i++)
        kvp__ec_strv_free(c->discover[i].addrs, c->discover[i].n);
    if (c->discover)
        kvp__free(c->discover, c->n_discover * sizeof *c->discover);
    if (c->replies)
        kvp__free(c->replies, c->n_replies * sizeof *c->replies);
    c->discover = NULL;
    c->replies = NULL;
    c->n_discover = c->n_replies = c->pos_discover = c->pos_replies = 0;
}

static void free_calls(kvp__ec_sctl_t *c)
{
    for (size_t i = 0; i < c->n_calls; i++) {
        kvp__strfree(c->calls[i].addr);
        kvp__strfree(c->calls[i].tid);
    }
    c->n_calls = 0;
}

void kvp__ec_sctl_script(kvp__ec_sctl_t *c, kvp__ec_sdiscover_t *discover, size_t n_discover,
                         kvp__ec_sreply_t *replies, size_t n_replies)
{
    free_script(c);
    free_calls(c);
    c->discover = discover;
    c->n_discover = n_discover;
    c->replies = replies;
    c->n_replies = n_replies;
}

void kvp__ec_sctl_cleanup(kvp__ec_sctl_t *c)
{
    free_script(c);
    free_calls(c);
    if (c->calls)
        kvp__free(c->calls, c->cap_calls * sizeof *c->calls);
    memset(c, 0, sizeof *c);
}

static kvp_status_t log_call(kvp__ec_sctl_t *c, bool is_cancel, const char *addr, const char *tid)
{
    if (c->n_calls == c->cap_calls) {
        size_t ncap = c->cap_calls ? c->cap_calls * 2 : 8;
        kvp__ec_scall_t *nc = kvp__realloc(c->calls, c->cap_calls * sizeof *nc, ncap * sizeof *nc);
        if (!nc)
            return KVP_ERR_NO_MEMORY;
        c->calls = nc;
        c->cap_calls = ncap;
    }
    kvp__ec_scall_t *k = &c->calls[c->n_calls];
    k->is_cancel = is_cancel;
    k->addr = kvp__strdup(addr);
    k->tid = tid ? kvp__strdup(tid) : NULL;
    if (!k->addr || (tid && !k->tid)) {
        kvp__strfree(k->addr);
        kvp__strfree(k->tid);
        return KVP_ERR_NO_MEMORY;
    }
    c->n_calls++;
    return KVP_OK;
}

static kvp_status_t sctl_discover(void *ctx, const char *addr, const char *const **addrs_p, size_t *n_p)
{
    kvp__ec_sctl_t *c = ctx;
    kvp_status_t st = log_call(c, false, addr, NULL);
    if (st != KVP_OK)
        return st;
    if (c->pos_discover >= c->n_discover)
        return KVP_ERR_NOT_FOUND;
    kvp__ec_sdiscover_t *d = &c->discover[c->pos_discover++];
    if (d->is_null)
        return KVP_ERR_NOT_FOUND;
    *addrs_p = (const char *const *)d->addrs;
    *n_p = d->n;
    return KVP_OK;
}

static kvp_status_t sctl_cancel(void *ctx, const char *addr, const char *tid, bool *cancelled_p)
{
    kvp__ec_sctl_t *c = ctx;
    *cancelled_p = false;
    kvp_status_t st = log_call(c, true, addr, tid);
    if (st != KVP_OK)
        return st;
    if (c->pos_replies >= c->n_replies)
        return KVP_ERR_TIMEOUT;
    kvp__ec_sreply_t *r = &c->replies[c->pos_replies++];
    if (r->kind == KVP__EC_REPLY_TIMEOUT)
        return KVP_ERR_TIMEOUT;
    if (r->kind == KVP__EC_REPLY_ERROR)
        return KVP_ERR_REMOTE;
    *cancelled_p = r->cancelled;
    return KVP_OK;
}

static void sctl_close(void *ctx) { ((kvp__ec_sctl_t *)ctx)->closed = true; }

kvp_ec_control_t kvp__ec_sctl_iface(kvp__ec_sctl_t *c)
{
    kvp_ec_control_t i = {sctl_discover, sctl_cancel, sctl_close, c};
    return i;
}

/* ---- inbox ---- */

void kvp__ec_sinbox_init(kvp__ec_sinbox_t *b, size_t shard_count)
{
    memset(b, 0, sizeof *b);
    b->shard_count = shard_count;
}

static void free_drained(kvp__ec_sinbox_t *b)
{
    for (size_t i = 0; i < b->n_drained; i++)
        kvp_ec_value_free(b->drained[i]);
    if (b->drained)
        kvp__free(b->drained, b->n_drained * sizeof *b->drained);
    b->drained = NULL;
    b->n_drained = 0;
}

void kvp__ec_sinbox_cleanup(kvp__ec_sinbox_t *b)
{
    free_drained(b);
    for (size_t i = 0; i < b->n_queued; i++)
        kvp_ec_value_free(b->queued[i]);
    if (b->queued)
        kvp__free(b->queued, b->cap_queued * sizeof *b->queued);
    memset(b, 0, sizeof *b);
}

kvp_status_t kvp__ec_sinbox_push(kvp__ec_sinbox_t *b, kvp_ec_value_t *ev)
{
    if (b->n_queued == b->cap_queued) {
        size_t ncap = b->cap_queued ? b->cap_queued * 2 : 16;
        kvp_ec_value_t **nq = kvp__realloc(b->queued, b->cap_queued * sizeof *nq, ncap * sizeof *nq);
        if (!nq) {
            kvp_ec_value_free(ev);
            return KVP_ERR_NO_MEMORY;
        }
        b->queued = nq;
        b->cap_queued = ncap;
    }
    b->queued[b->n_queued++] = ev;
    return KVP_OK;
}

static size_t sinbox_shards(void *ctx) { return ((kvp__ec_sinbox_t *)ctx)->shard_count; }

static kvp_status_t sinbox_drain(void *ctx, const char *addr, const kvp_ec_value_t *const **events_p, size_t *n_p)
{
    (void)addr;
    kvp__ec_sinbox_t *b = ctx;
    free_drained(b);
    *events_p = NULL;
    *n_p = 0;
    if (!b->n_queued)
        return KVP_OK;
    if (b->closed || b->shard_count == 0) {
        for (size_t i = 0; i < b->n_queued; i++)
            kvp_ec_value_free(b->queued[i]);
        b->n_queued = 0;
        return KVP_OK;
    }
    kvp_ec_value_t **d = kvp__malloc(b->n_queued * sizeof *d);
    if (!d)
        return KVP_ERR_NO_MEMORY;
    memcpy(d, b->queued, b->n_queued * sizeof *d);
    b->drained = d;
    b->n_drained = b->n_queued;
    b->n_queued = 0;
    *events_p = (const kvp_ec_value_t *const *)d;
    *n_p = b->n_drained;
    return KVP_OK;
}

static void sinbox_close(void *ctx) { ((kvp__ec_sinbox_t *)ctx)->closed = true; }

kvp_ec_inbox_t kvp__ec_sinbox_iface(kvp__ec_sinbox_t *b)
{
    kvp_ec_inbox_t i = {sinbox_shards, sinbox_drain, sinbox_close, b};
    return i;
}
