/* The EC connector's configuration, inside the library. */
#ifndef KVP_EC_CONFIG_H
#define KVP_EC_CONFIG_H

#include "kvpool/ec_connector.h"

/* The caller's config as this library's struct: the defaults, then the
 * caller's first in->size bytes over them (common/sized.h).  KVP_OK,
 * KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (size).  Does not validate the values
 * (kvp_ec_config_validate does). */
kvp_status_t kvp__ec_config_adopt(const kvp_ec_config_t *in, kvp_ec_config_t *out);

#endif
