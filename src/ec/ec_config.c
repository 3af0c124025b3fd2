/* EC connector configuration: defaults and the validation of §3.1. */
#include "ec/ec_config.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "common/sized.h"

static const struct {
    const char *name;
    int itemsize;
} g_dtypes[] = {
    [KVP_EC_DTYPE_FLOAT32] = {"float32", 4},
    [KVP_EC_DTYPE_FLOAT16] = {"float16", 2},
    [KVP_EC_DTYPE_BFLOAT16] = {"bfloat16", 2},
    [KVP_EC_DTYPE_FLOAT64] = {"float64", 8},
    [KVP_EC_DTYPE_INT8] = {"int8", 1},
    [KVP_EC_DTYPE_UINT8] = {"uint8", 1},
    [KVP_EC_DTYPE_INT16] = {"int16", 2},
    [KVP_EC_DTYPE_INT32] = {"int32", 4},
    [KVP_EC_DTYPE_INT64] = {"int64", 8},
};
#define N_DTYPES (sizeof g_dtypes / sizeof g_dtypes[0])

const char *kvp_ec_dtype_name(kvp_ec_dtype_t d) { return (unsigned)d < N_DTYPES ? g_dtypes[d].name : NULL; }
int kvp_ec_dtype_itemsize(kvp_ec_dtype_t d) { return (unsigned)d < N_DTYPES ? g_dtypes[d].itemsize : 0; }

kvp_status_t kvp_ec_dtype_parse(const char *name, kvp_ec_dtype_t *dtype_p)
{
    if (!name)
        return KVP_ERR_BAD_CONFIG;
    if (!strncmp(name, "torch.", 6))
        name += 6;
    for (size_t i = 0; i < N_DTYPES; i++)
        if (!strcmp(name, g_dtypes[i].name)) {
            *dtype_p = (kvp_ec_dtype_t)i;
            return KVP_OK;
        }
    return KVP_ERR_BAD_CONFIG;
}

void kvp_ec_config_init_size(kvp_ec_config_t *cfg, size_t size)
{
    if (!cfg || size < sizeof cfg->size)
        return;
    kvp_ec_config_t d = {0};
    d.tp_size = d.pp_size = d.dp_size = 1;
    d.push_wait_timeout_s = 60;
    d.control_timeout_ms = 30000;
    d.dtype = KVP_EC_DTYPE_BFLOAT16;
    d.max_pending_events = -1;
    d.max_terminal_records = -1;
    /* a newer caller (size > sizeof d): its extra fields untouched, and the
     * size kept, so that every call refuses the config (KVP_ERR_VERSION) */
    memcpy(cfg, &d, size < sizeof d ? size : sizeof d);
    cfg->size = (uint32_t)size;
}

kvp_status_t kvp__ec_config_adopt(const kvp_ec_config_t *in, kvp_ec_config_t *out)
{
    kvp_ec_config_init(out);
    return kvp__sized_adopt(out, sizeof *out, in);
}

kvp_status_t kvp__ec_sched_params_adopt(const kvp_ec_sched_params_t *in, kvp_ec_sched_params_t *out)
{
    if (!in)
        return KVP_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out); /* the defaults: every field past an older caller's size is zero */
    kvp_status_t st = kvp__sized_adopt(out, sizeof *out, in);
    if (st != KVP_OK)
        kvp_error("EC scheduler params: size %u (this library's struct has %zu bytes)", (unsigned)in->size,
                  sizeof *out);
    return st;
}

static kvp_status_t bad(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static kvp_status_t bad(char *err, size_t errlen, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return KVP_ERR_BAD_CONFIG;
}

kvp_status_t kvp_ec_config_validate(const kvp_ec_config_t *in, char *addr_buf, size_t addr_len, char *err,
                                    size_t errlen)
{
    if (err && errlen)
        err[0] = 0;
    if (!in)
        return bad(err, errlen, "no config");
    kvp_ec_config_t adopted;
    kvp_status_t st = kvp__ec_config_adopt(in, &adopted);
    if (st != KVP_OK) {
        bad(err, errlen, "config size %u (this library's struct has %zu bytes)", (unsigned)in->size, sizeof adopted);
        return st;
    }
    const kvp_ec_config_t *c = &adopted;
    int64_t tp = c->tp_size ? c->tp_size : 1, pp = c->pp_size ? c->pp_size : 1, dp = c->dp_size ? c->dp_size : 1;
    if (tp < 1 || pp < 1 || dp < 1)
        return bad(err, errlen, "tp_size, pp_size and dp_size must be >= 1");
    if (c->is_producer && (tp > 1 || pp > 1 || dp > 1))
        return bad(err, errlen,
                   "an EC producer needs tensor, pipeline and data parallel size 1 (got TP=%" PRId64 " PP=%" PRId64
                   " DP=%" PRId64 ")",
                   tp, pp, dp);
    if (c->dp_index < 0 || c->dp_index >= dp)
        return bad(err, errlen, "dp_index %" PRId64 " outside 0..%" PRId64, c->dp_index, dp - 1);
    int64_t port = 0;
    if (c->ec_port) {
        if (c->ec_port < 1 || c->ec_port > 65535)
            return bad(err, errlen, "ec_port %" PRId64 " outside 1..65535", c->ec_port);
        port = c->ec_port + c->dp_index * tp;
        if (port + tp - 1 > 65535)
            return bad(err, errlen,
                       "control ports %" PRId64 "..%" PRId64 " (ec_port + dp_index*tp_size, one per TP rank) "
                       "must lie within 1..65535",
                       port, port + tp - 1);
    }
    if (c->control_timeout_ms < 1)
        return bad(err, errlen, "control_timeout_ms must be >= 1 (got %" PRId64 ")", c->control_timeout_ms);
    if (c->push_wait_timeout_s < 0)
        return bad(err, errlen, "push_wait_timeout_s must be >= 0 (got %" PRId64 ")", c->push_wait_timeout_s);
    if (c->push_wait_timeout_s > INT64_MAX / 2000)
        return bad(err, errlen, "push_wait_timeout_s too large");
    if (c->pool_size < 1)
        return bad(err, errlen, "pool_size (ec_buffer_size) must be > 0 (got %" PRId64 ")", c->pool_size);
    if (c->is_producer && c->hidden_dim < 1)
        return bad(err, errlen, "a producer needs the encoder hidden size > 0 (got %" PRId64 ")", c->hidden_dim);
    if (!kvp_ec_dtype_name(c->dtype))
        return bad(err, errlen, "unknown dtype");
    if (c->control_addr) {
        if (!c->control_addr[0])
            return bad(err, errlen, "control_addr must not be empty");
    } else {
        if (!c->ec_ip || !c->ec_ip[0] || !port)
            return bad(err, errlen, "no control address: set control_addr, or ec_ip and ec_port");
        if (addr_buf && addr_len) {
            int n = snprintf(addr_buf, addr_len, "tcp://%s:%" PRId64, c->ec_ip, port);
            if (n < 0 || (size_t)n >= addr_len)
                return bad(err, errlen, "control address too long");
        }
    }
    return KVP_OK;
}
