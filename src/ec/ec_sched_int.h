/* Internal access to a scheduler's parts (tests and invariants only). */
#ifndef KVP_EC_SCHED_INT_H
#define KVP_EC_SCHED_INT_H

#include "ec/ec_table.h"
#include "kvpool/ec_connector.h"

kvp__ec_table_t *kvp__ec_sched_table(kvp_ec_sched_t *s);
const kvp__ec_table_t *kvp__ec_sched_table_view(const kvp_ec_sched_t *s);
size_t kvp__ec_sched_ready_size(const kvp_ec_sched_t *s);

#endif
