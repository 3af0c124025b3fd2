/*
 * A request's life (remote_int.h has the states and events).
 *
 * A request is POSTED when it enters the table, just before its send is
 * begun.  Its two sides then end independently, in either order: UCX may
 * run a reply's handler before the send's completion, and a lane reply may
 * be read by another thread before the writer has taken mu again.  The
 * reply side has a middle stage when its values are moved with mu not held:
 * UCX receiving them by rendezvous (RECV) or the parsing thread copying a
 * GET_LOCAL's values out of the mapped arena (COPY); then only that mover
 * ends it (UCX may still write into the caller's buffers even after a
 * forced close; the copier still touches the request), so a lost
 * connection only ends the send side and records its status.  A receive
 * that will never end (its worker was destroyed) is abandoned.
 *
 *   POSTED     -> SENT | RECV | COPY | REPLIED | DONE (lost)
 *   SENT       -> RECV_SENT | COPY_SENT | DONE (replied, lost)
 *   RECV       -> RECV_SENT (sent, lost) | REPLIED | DONE (abandoned)
 *   RECV_SENT  -> RECV_SENT (sent, lost) | DONE (replied, abandoned)
 *   COPY       -> COPY_SENT (sent, lost) | REPLIED
 *   COPY_SENT  -> COPY_SENT (sent, lost) | DONE (replied)
 *   REPLIED    -> DONE (sent, lost)
 *   DONE: none (it has left the table and may be freed)
 *
 * The self-transitions of RECV_SENT and COPY_SENT are the send's own
 * completion (or its failure) arriving after a lost connection already
 * ended the send side.  No event leads back to POSTED, so POSTED in the
 * table below means: refused.
 */
#include "client/remote_int.h"

#include "common/alloc.h"
#include "common/log.h"

static const uint8_t g_next[PEND_NUM_STATES][PEV_NUM] = {
    [PEND_POSTED] = {[PEV_SENT] = PEND_SENT, [PEV_RECV] = PEND_RECV, [PEV_COPY] = PEND_COPY,
                     [PEV_REPLIED] = PEND_REPLIED, [PEV_LOST] = PEND_DONE},
    [PEND_SENT] = {[PEV_RECV] = PEND_RECV_SENT, [PEV_COPY] = PEND_COPY_SENT, [PEV_REPLIED] = PEND_DONE,
                   [PEV_LOST] = PEND_DONE},
    [PEND_RECV] = {[PEV_SENT] = PEND_RECV_SENT, [PEV_REPLIED] = PEND_REPLIED, [PEV_LOST] = PEND_RECV_SENT,
                   [PEV_ABANDON] = PEND_DONE},
    [PEND_RECV_SENT] = {[PEV_SENT] = PEND_RECV_SENT, [PEV_REPLIED] = PEND_DONE, [PEV_LOST] = PEND_RECV_SENT,
                        [PEV_ABANDON] = PEND_DONE},
    [PEND_COPY] = {[PEV_SENT] = PEND_COPY_SENT, [PEV_REPLIED] = PEND_REPLIED, [PEV_LOST] = PEND_COPY_SENT},
    [PEND_COPY_SENT] = {[PEV_SENT] = PEND_COPY_SENT, [PEV_REPLIED] = PEND_DONE, [PEV_LOST] = PEND_COPY_SENT},
    [PEND_REPLIED] = {[PEV_SENT] = PEND_DONE, [PEV_LOST] = PEND_DONE},
    [PEND_DONE] = {0},
};

static const char *const g_state_names[PEND_NUM_STATES] = {
    "POSTED", "SENT", "RECV", "RECV_SENT", "COPY", "COPY_SENT", "REPLIED", "DONE",
};
static const char *const g_ev_names[PEV_NUM] = {"sent", "recv", "copy", "replied", "lost", "abandon"};

const char *kvp__remote_pend_state_name(pend_state_t s)
{
    return (unsigned)s < PEND_NUM_STATES ? g_state_names[s] : "UNKNOWN";
}

/* ---- the pending table (under mu) ---- */

void kvp__remote_do_add(remote_t *r, pending_t *p)
{
    pending_t **b = &r->bucket[p->req_id % KVP_REMOTE_NBUCKETS];
    p->next = *b;
    *b = p;
    r->npending++;
}

static void do_remove(remote_t *r, pending_t *p)
{
    pending_t **pp = &r->bucket[p->req_id % KVP_REMOTE_NBUCKETS];
    while (*pp && *pp != p)
        pp = &(*pp)->next;
    if (*pp) {
        *pp = p->next;
        r->npending--;
    }
}

pending_t *kvp__remote_pending_new(uint32_t wop, opctx_t *parent)
{
    pending_t *p = kvp__calloc(1, sizeof *p); /* (PEND_POSTED) */
    if (!p)
        return NULL;
    p->wop = wop;
    p->parent = parent;
    p->op = parent ? parent->op : NULL;
    kvp__mpw_init(&p->w, p->wbuf, sizeof p->wbuf);
    kvp__mpw_init(&p->w2, p->w2buf, sizeof p->w2buf);
    return p;
}

void kvp__remote_pending_free(pending_t *p)
{
    kvp__lmap_put(p->lmap);
    kvp__free(p->segs, p->segs_cap * sizeof *p->segs);
    kvp__mpw_free(&p->w);
    kvp__mpw_free(&p->w2);
    kvp__free(p->iov, p->niov * sizeof *p->iov);
    kvp__free(p, sizeof *p);
}

/* p became DONE: takes it out of the table and retires it.  Returns the
 * caller op to complete when p was its last request. */
static opctx_t *do_retire_request(remote_t *r, pending_t *p)
{
    do_remove(r, p);
    if (p->wop == KVP_WOP_GET_LOCAL)
        r->local_inflight--;
    if (p->repost && p->parent && !p->timed_out && p->status == KVP_OK) {
        /* (the progress thread posts it again; its op stays open) */
        p->next = r->reposts;
        r->reposts = p;
        kvp__remote_wake(r);
        return NULL;
    }
    opctx_t *oc = p->parent;
    if (!oc) {
        pthread_cond_broadcast(&r->cv);
        return NULL; /* an internal op: its waiter frees it */
    }
    if (p->status != KVP_OK && oc->status == KVP_OK)
        oc->status = p->status;
    kvp__remote_pending_free(p);
    return --oc->left == 0 ? oc : NULL;
}

opctx_t *kvp__remote_do_advance(remote_t *r, pending_t *p, pend_ev_t ev)
{
    pend_state_t from = p->state;
    pend_state_t to = (unsigned)ev < PEV_NUM ? (pend_state_t)g_next[from][ev] : PEND_POSTED;
    if (to == PEND_POSTED) {
        kvp_error("remote: request %llu: event %s refused in state %s", (unsigned long long)p->req_id,
                  (unsigned)ev < PEV_NUM ? g_ev_names[ev] : "?", kvp__remote_pend_state_name(from));
        return NULL;
    }
    int was_recv = from == PEND_RECV || from == PEND_RECV_SENT;
    int is_recv = to == PEND_RECV || to == PEND_RECV_SENT;
    if (is_recv && !was_recv)
        r->recv_active++;
    else if (was_recv && !is_recv)
        r->recv_active--;
    p->state = to;
    return to == PEND_DONE ? do_retire_request(r, p) : NULL;
}

opctx_t *kvp__remote_do_lost(remote_t *r, pending_t *p, kvp_status_t st)
{
    kvp_status_t why = p->timed_out ? KVP_ERR_TIMEOUT : st;
    if (kvp__remote_awaits_reply(p))
        p->status = why;
    else if (kvp__remote_reply_open(p) && p->status == KVP_OK)
        p->status = why; /* its receive (or copy) ends it, with this status */
    return kvp__remote_do_advance(r, p, PEV_LOST);
}

void kvp__remote_fire(opctx_t *oc)
{
    if (!oc)
        return;
    kvp_op_t *op = oc->op;
    kvp_status_t st = oc->status;
    if (op->type == KVP_OP_PREFIX && st == KVP_OK)
        *op->prefix_len = oc->prefix;
    kvp__free(oc, sizeof *oc);
    if (op->cb)
        op->cb(op->cb_arg, st);
}
