/*
 * The transfer table seen from outside (ec_connector.h, "observability"):
 * read-only views for metrics, tests and `kvpool ec-sched-replay`, which
 * prints the table through these calls instead of ec_table.h.
 */
#include "ec/ec_sched_int.h"

void kvp_ec_sched_table_visit(const kvp_ec_sched_t *s, int (*cb)(void *ctx, const kvp_ec_record_view_t *rec),
                              void *ctx)
{
    KVP_LIST_FOR_EACH_ENTRY(r, &kvp__ec_sched_table_view(s)->order, const kvp__ec_rec_t, order) {
        kvp_ec_record_view_t v = {r->tid, r->hash, r->req, r->state, r->has_deadline, r->deadline};
        if (cb(ctx, &v))
            return;
    }
}

uint64_t kvp_ec_sched_table_version(const kvp_ec_sched_t *s) { return kvp__ec_sched_table_view(s)->version; }
size_t kvp_ec_sched_table_size(const kvp_ec_sched_t *s) { return kvp__ec_sched_table_view(s)->records.n; }
int64_t kvp_ec_sched_resident_bytes(const kvp_ec_sched_t *s)
{
    return (int64_t)kvp__ec_sched_table_view(s)->resident_bytes;
}
