/* Metadata structs: cleanup, and the names of the error classes. */
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/strmap.h"
#include "ec/ec_table.h"
#include "kvpool/ec_connector.h"

static void shape_free(int64_t *shape, size_t ndim)
{
    if (shape)
        kvp__free(shape, ndim * sizeof *shape);
}

/* What a push and a load spec both own. */
static void spec_free(char *mm_hash, char *dtype, char *transfer_id, int64_t *shape, size_t ndim)
{
    kvp__strfree(mm_hash);
    kvp__strfree(dtype);
    kvp__strfree(transfer_id);
    shape_free(shape, ndim);
}

void kvp_ec_meta_cleanup(kvp_ec_meta_t *m)
{
    if (!m)
        return;
    kvp__ec_strv_free(m->freed, m->n_freed);
    for (size_t i = 0; i < m->n_store_candidates; i++) {
        kvp__strfree(m->store_candidates[i].identifier);
        kvp__strfree(m->store_candidates[i].spec.dtype);
        shape_free(m->store_candidates[i].spec.shape, m->store_candidates[i].spec.ndim);
    }
    if (m->store_candidates)
        kvp__free(m->store_candidates, m->n_store_candidates * sizeof *m->store_candidates);
    for (size_t i = 0; i < m->n_pushes; i++) {
        kvp_ec_push_spec_t *p = &m->pushes[i];
        spec_free(p->mm_hash, p->dtype, p->transfer_id, p->shape, p->ndim);
        kvp__strfree(p->consumer_zmq);
        kvp__strfree(p->request_id);
    }
    kvp__free(m->pushes, m->n_pushes * sizeof *m->pushes);
    for (size_t i = 0; i < m->n_loads; i++)
        spec_free(m->loads[i].mm_hash, m->loads[i].dtype, m->loads[i].transfer_id, m->loads[i].shape,
                  m->loads[i].ndim);
    kvp__free(m->loads, m->n_loads * sizeof *m->loads);
    memset(m, 0, sizeof *m);
}

void kvp_ec_worker_meta_cleanup(kvp_ec_worker_meta_t *w)
{
    if (!w)
        return;
    kvp__ec_strv_free(w->loaded, w->n_loaded);
    kvp__ec_strv_free(w->failed_loads, w->n_failed_loads);
    kvp__ec_strv_free(w->reclaimed, w->n_reclaimed);
    kvp__ec_strv_free(w->failed_saves, w->n_failed_saves);
    memset(w, 0, sizeof *w);
}

void kvp_ec_finished_cleanup(kvp_ec_finished_t *f)
{
    if (!f)
        return;
    for (size_t i = 0; f->items && i < f->n_items; i++) {
        kvp__strfree(f->items[i].identifier);
        kvp__strfree(f->items[i].modality);
        kvp__strfree(f->items[i].transfer_id);
    }
    kvp__free(f->items, f->n_items * sizeof *f->items);
    memset(f, 0, sizeof *f);
}

void kvp_ec_strlist_cleanup(kvp_ec_strlist_t *l)
{
    if (l) {
        kvp__ec_strv_free(l->v, l->n);
        l->v = NULL;
        l->n = 0;
    }
}

const char *kvp_ec_error_name(kvp_ec_error_t e)
{
    switch (e) {
    case KVP_EC_ERR_NONE: return "None";
    case KVP_EC_ERR_INDEX: return "IndexError";
    case KVP_EC_ERR_VALUE: return "ValueError";
    case KVP_EC_ERR_RUNTIME: return "RuntimeError";
    case KVP_EC_ERR_KEY: return "KeyError";
    case KVP_EC_ERR_TYPE: return "TypeError";
    case KVP_EC_ERR_ASSERTION: return "AssertionError";
    case KVP_EC_ERR_INVALID_TRANSITION: return "InvalidSchedulerTransferTransition";
    case KVP_EC_ERR_NO_MEMORY: return "MemoryError";
    }
    return "Exception";
}

static int64_t mono_ms(void *ctx)
{
    (void)ctx;
    return (int64_t)(kvp__now_ns() / 1000000u);
}

kvp_ec_clock_t kvp_ec_clock_monotonic(void)
{
    kvp_ec_clock_t c = {mono_ms, NULL};
    return c;
}
