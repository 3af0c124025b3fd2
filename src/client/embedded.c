/*
 * embedded:// — the storage engine inside the calling process.  Every op
 * completes before submit returns (the async contract's "completes now").
 *
 * Options: capacity (size, default 1GiB), high_watermark (0.95),
 * low_watermark (0.90), hugepages (off|auto|on, default auto),
 * provider (anon|memfd, default anon), put_timeout (duration, default 30s),
 * shards (power of two, default 256), prefault (true|false, default false).
 */
#include <stdlib.h>
#include <string.h>

#include "client/backend.h"
#include "common/log.h"
#include "common/units.h"
#include "store/store.h"

static kvp_status_t parse_bool(const char *name, const char *v, int *out)
{
    if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "on") || !strcmp(v, "yes")) {
        *out = 1;
        return KVP_OK;
    }
    if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "off") || !strcmp(v, "no")) {
        *out = 0;
        return KVP_OK;
    }
    kvp_error("embedded: %s=%s is not a boolean", name, v);
    return KVP_ERR_BAD_OPTION;
}

static kvp_status_t parse_fraction(const char *name, const char *v, double *out)
{
    char *end;
    double d = strtod(v, &end);
    if (*end || !(d > 0.0 && d <= 1.0)) {
        kvp_error("embedded: %s=%s must be a fraction in (0, 1]", name, v);
        return KVP_ERR_BAD_OPTION;
    }
    *out = d;
    return KVP_OK;
}

static kvp_status_t embedded_params(kvp__uri_t *u, kvp__store_params_t *p)
{
    kvp_status_t st;
    const char *v;
    kvp__store_params_default(p);
    p->capacity = 1ull << 30;
    if (u->authority[0] || u->path[0]) {
        kvp_error("embedded: takes no host or path (got '%s/%s'); use embedded://?capacity=...",
                  u->authority, u->path);
        return KVP_ERR_BAD_URI;
    }
    if ((v = kvp__uri_opt(u, "capacity"))) {
        if ((st = kvp__parse_size(v, &p->capacity)) != KVP_OK) {
            kvp_error("embedded: capacity=%s is not a size (use B, KiB, MiB, GiB)", v);
            return st;
        }
        if (p->capacity < 65536) {
            kvp_error("embedded: capacity=%s is too small (minimum 64KiB)", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    if ((v = kvp__uri_opt(u, "high_watermark")) && (st = parse_fraction("high_watermark", v, &p->high_watermark)))
        return st;
    if ((v = kvp__uri_opt(u, "low_watermark")) && (st = parse_fraction("low_watermark", v, &p->low_watermark)))
        return st;
    if (!(p->low_watermark < p->high_watermark)) {
        kvp_error("embedded: low_watermark %.3f must be below high_watermark %.3f", p->low_watermark,
                  p->high_watermark);
        return KVP_ERR_BAD_OPTION;
    }
    if ((v = kvp__uri_opt(u, "hugepages"))) {
        int b;
        if (!strcmp(v, "auto"))
            p->huge = KVP_HUGE_AUTO;
        else if (parse_bool("hugepages", v, &b) == KVP_OK)
            p->huge = b ? KVP_HUGE_ON : KVP_HUGE_OFF;
        else
            return KVP_ERR_BAD_OPTION;
    }
    if ((v = kvp__uri_opt(u, "provider"))) {
        if (!strcmp(v, "anon") || !strcmp(v, "plain"))
            p->mem_kind = KVP_MEM_ANON;
        else if (!strcmp(v, "memfd"))
            p->mem_kind = KVP_MEM_MEMFD;
        else {
            kvp_error("embedded: provider=%s (expected anon or memfd)", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    if ((v = kvp__uri_opt(u, "put_timeout"))) {
        if (kvp__parse_duration_ns(v, &p->put_timeout_ns) != KVP_OK || p->put_timeout_ns == 0) {
            kvp_error("embedded: put_timeout=%s is not a positive duration (e.g. 30s, 500ms)", v);
            return KVP_ERR_BAD_OPTION;
        }
    }
    if ((v = kvp__uri_opt(u, "shards"))) {
        char *end;
        unsigned long n = strtoul(v, &end, 10);
        if (*end || n == 0 || n > 65536 || (n & (n - 1))) {
            kvp_error("embedded: shards=%s must be a power of two in 1..65536", v);
            return KVP_ERR_BAD_OPTION;
        }
        p->shards = (uint32_t)n;
    }
    if ((v = kvp__uri_opt(u, "prefault")) && (st = parse_bool("prefault", v, &p->prefault)))
        return st;
    return kvp__uri_check_unused(u);
}

static kvp_status_t embedded_open(kvp__uri_t *u, void **impl_p)
{
    kvp__store_params_t p;
    kvp_status_t st = embedded_params(u, &p);
    if (st != KVP_OK)
        return st;
    return kvp__store_create(&p, (kvp__store_t **)impl_p);
}

static void embedded_close(void *impl) { kvp__store_destroy(impl); }

static uint64_t sgl_len(const kvp_sgl_t *v)
{
    uint64_t t = 0;
    for (uint32_t i = 0; i < v->iovcnt; i++)
        t += v->iov[i].len;
    return t;
}

static kvp_status_t embedded_submit(void *impl, kvp_op_t *op, int will_drive)
{
    (void)will_drive;
    kvp__store_t *s = impl;
    size_t i;
    switch (op->type) {
    case KVP_OP_EXISTS:
        kvp__store_exists_batch(s, op->keys, op->n, op->present);
        return KVP_OK;
    case KVP_OP_PREFIX:
        *op->prefix_len = kvp__store_prefix(s, op->keys, op->n);
        return KVP_OK;
    case KVP_OP_PUT:
        for (i = 0; i < op->n; i++) {
            kvp_key_result_t *r = &op->results[i];
            uint64_t total = sgl_len(&op->values[i]);
            r->flags = 0;
            r->size = total;
            r->status = kvp__store_put(s, op->keys[i].data, op->keys[i].len, &op->values[i], total,
                                       &r->flags);
        }
        return KVP_OK;
    case KVP_OP_GET:
        for (i = 0; i < op->n; i++) {
            kvp_key_result_t *r = &op->results[i];
            r->flags = 0;
            r->status = kvp__store_get(s, op->keys[i].data, op->keys[i].len, &op->values[i],
                                       sgl_len(&op->values[i]), &r->size);
        }
        return KVP_OK;
    case KVP_OP_REMOVE:
        for (i = 0; i < op->n; i++) {
            op->results[i].flags = 0;
            op->results[i].size = 0;
            op->results[i].status = kvp__store_remove(s, op->keys[i].data, op->keys[i].len);
        }
        return KVP_OK;
    case KVP_OP_PIN:
    case KVP_OP_UNPIN:
        for (i = 0; i < op->n; i++) {
            op->results[i].flags = 0;
            op->results[i].size = 0;
            op->results[i].status =
                kvp__store_pin(s, op->keys[i].data, op->keys[i].len, op->type == KVP_OP_PIN);
        }
        return KVP_OK;
    case KVP_OP_REMOVE_ALL: {
        uint64_t n = kvp__store_remove_all(s);
        if (op->removed)
            *op->removed = n;
        return KVP_OK;
    }
    }
    return KVP_ERR_INVALID_ARG;
}

static kvp_status_t embedded_stats(void *impl, kvp_pool_stats_t *st)
{
    kvp__store_stats(impl, st);
    return KVP_OK;
}

static uint64_t embedded_max_value(void *impl) { return kvp__store_max_value(impl); }

const kvp__backend_ops_t kvp__embedded_backend = {
    .scheme = "embedded",
    .open = embedded_open,
    .close = embedded_close,
    .submit = embedded_submit,
    .stats = embedded_stats,
    .max_value = embedded_max_value,
};
