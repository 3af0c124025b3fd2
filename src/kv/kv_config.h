/* The KV connector's configuration, inside the library. */
#ifndef KVP_KV_CONFIG_H
#define KVP_KV_CONFIG_H

#include "kvpool/kv_connector.h"

/* The caller's config as this library's struct: the defaults, then the
 * caller's first in->size bytes over them (common/sized.h).  KVP_OK,
 * KVP_ERR_NULL_POINTER, KVP_ERR_INVALID_ARG / KVP_ERR_VERSION (size; logged).
 * Does not validate the values (kvp_kv_config_validate does). */
kvp_status_t kvp__kv_config_adopt(const kvp_kv_config_t *in, kvp_kv_config_t *out);

#endif
