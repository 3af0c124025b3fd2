/* The EC connector's configuration, inside the library. */
#ifndef KVP_EC_CONFIG_H
#define KVP_EC_CONFIG_H

#include "kvpool/ec_connector.h"

/* The caller's config as this library's struct: the defaults, then the
 * caller's first in->size bytes over them (common/sized.h).  KVP_OK,
 * KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (size).  Does not validate the values
 * (kvp_ec_config_validate does). */
kvp_status_t kvp__ec_config_adopt(const kvp_ec_config_t *in, kvp_ec_config_t *out);
/* The same for the scheduler's params (past an older caller's size: zero).
 * KVP_ERR_INVALID_ARG (NULL or a size too small) or KVP_ERR_VERSION, logged. */
kvp_status_t kvp__ec_sched_params_adopt(const kvp_ec_sched_params_t *in, kvp_ec_sched_params_t *out);

#endif
