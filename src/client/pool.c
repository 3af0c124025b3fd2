/*
 * pool.h front end: picks the backend from the URI scheme, validates every
 * batch once for all backends (so each backend sees only well-formed input),
 * and turns submit into the blocking wrappers.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "client/backend.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "kvpool/pool.h"

struct kvp_pool {
    const kvp__backend_ops_t *ops;
    void *impl;
    uint64_t max_value;
};

static const kvp__backend_ops_t *const g_backends[] = {&kvp__embedded_backend, &kvp__remote_backend};

kvp_status_t kvp__pool_test_recover(kvp_pool_t *pool)
{
    return pool && pool->ops->test_recover ? pool->ops->test_recover(pool->impl) : KVP_ERR_UNSUPPORTED;
}

kvp_status_t kvp_pool_open(const char *uri, kvp_pool_t **pool_p)
{
    if (!pool_p) {
        kvp_error("pool_open: pool_p is NULL");
        return KVP_ERR_NULL_POINTER;
    }
    *pool_p = NULL;
    if (!uri) {
        kvp_error("pool_open: uri is NULL");
        return KVP_ERR_NULL_POINTER;
    }
    kvp__uri_t *u = kvp__malloc(sizeof *u);
    if (!u)
        return KVP_ERR_NO_MEMORY;
    kvp_status_t st = kvp__uri_parse(uri, u);
    if (st != KVP_OK)
        goto out;
    const kvp__backend_ops_t *ops = NULL;
    for (size_t i = 0; i < sizeof g_backends / sizeof g_backends[0]; i++)
        if (strcmp(u->scheme, g_backends[i]->scheme) == 0)
            ops = g_backends[i];
    if (!ops) {
        if (!strcmp(u->scheme, "etcd")) {
            kvp_error("pool_open: the %s:// backend is not part of this build", u->scheme);
            st = KVP_ERR_UNSUPPORTED;
        } else {
            kvp_error("pool_open: unknown scheme '%s' (embedded, kvpool, etcd)", u->scheme);
            st = KVP_ERR_BAD_URI;
        }
        goto out;
    }
    kvp_pool_t *pool = kvp__calloc(1, sizeof *pool);
    if (!pool) {
        st = KVP_ERR_NO_MEMORY;
        goto out;
    }
    st = ops->open(u, &pool->impl);
    if (st != KVP_OK) {
        kvp__free(pool, sizeof *pool);
        goto out;
    }
    pool->ops = ops;
    pool->max_value = ops->max_value(pool->impl);
    *pool_p = pool;
out:
    kvp__free(u, sizeof *u);
    return st;
}

void kvp_pool_close(kvp_pool_t *pool)
{
    if (!pool)
        return;
    pool->ops->close(pool->impl);
    kvp__free(pool, sizeof *pool);
}

static int key_eq(const kvp_key_t *a, const kvp_key_t *b)
{
    return a->len == b->len && memcmp(a->data, b->data, a->len) == 0;
}

/* KVP_OK when no key repeats; O(n^2) for small batches, a hash set above. */
static kvp_status_t check_duplicates(const kvp_key_t *keys, size_t n, size_t *dup_p)
{
    if (n <= 16) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (key_eq(&keys[i], &keys[j])) {
                    *dup_p = i;
                    return KVP_ERR_DUPLICATE_KEY;
                }
        return KVP_OK;
    }
    size_t cap = 32;
    while (cap < 2 * n)
        cap <<= 1;
    uint32_t *slot = kvp__malloc(cap * sizeof *slot); /* index + 1; 0 = empty */
    if (!slot)
        return KVP_ERR_NO_MEMORY;
    memset(slot, 0, cap * sizeof *slot);
    kvp_status_t st = KVP_OK;
    for (size_t i = 0; i < n && st == KVP_OK; i++) {
        size_t h = (size_t)XXH3_64bits(keys[i].data, keys[i].len) & (cap - 1);
        while (slot[h]) {
            if (key_eq(&keys[slot[h] - 1], &keys[i])) {
                *dup_p = i;
                st = KVP_ERR_DUPLICATE_KEY;
                break;
            }
            h = (h + 1) & (cap - 1);
        }
        slot[h] = (uint32_t)(i + 1);
    }
    kvp__free(slot, cap * sizeof *slot);
    return st;
}

static const char *op_name(kvp_op_type_t t)
{
    static const char *names[] = {"?", "exists", "prefix", "put", "get", "remove", "pin", "unpin", "remove_all"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

/* Checks a scatter list; *total_p = its length, saturated at UINT64_MAX
 * (slice lengths that would wrap around count as too large, never small). */
static kvp_status_t check_sgl(const kvp_sgl_t *v, uint64_t *total_p)
{
    uint64_t t = 0;
    if (v->iovcnt && !v->iov)
        return KVP_ERR_NULL_POINTER;
    for (uint32_t i = 0; i < v->iovcnt; i++) {
        if (v->iov[i].len && !v->iov[i].base)
            return KVP_ERR_NULL_POINTER;
        t = v->iov[i].len > UINT64_MAX - t ? UINT64_MAX : t + v->iov[i].len;
    }
    *total_p = t;
    return KVP_OK;
}

static kvp_status_t validate(const kvp_pool_t *pool, const kvp_op_t *op)
{
    const char *name = op_name(op->type);
    if (op->type < KVP_OP_EXISTS || op->type > KVP_OP_REMOVE_ALL) {
        kvp_error("pool: unknown op type %d", (int)op->type);
        return KVP_ERR_INVALID_ARG;
    }
    if (op->type == KVP_OP_REMOVE_ALL)
        return KVP_OK;
    if (op->n > KVP_BATCH_MAX) {
        kvp_error("pool %s: %zu keys in one batch (max %u)", name, op->n, KVP_BATCH_MAX);
        return KVP_ERR_BATCH_TOO_LARGE;
    }
    if (op->n && !op->keys) {
        kvp_error("pool %s: keys is NULL", name);
        return KVP_ERR_NULL_POINTER;
    }
    for (size_t i = 0; i < op->n; i++) {
        if (op->keys[i].len == 0 || op->keys[i].len > KVP_KEY_MAX) {
            kvp_error("pool %s: key %zu has length %u (must be 1..%u)", name, i, op->keys[i].len,
                      KVP_KEY_MAX);
            return KVP_ERR_KEY_LENGTH;
        }
        if (!op->keys[i].data) {
            kvp_error("pool %s: key %zu data is NULL", name, i);
            return KVP_ERR_NULL_POINTER;
        }
    }
    switch (op->type) {
    case KVP_OP_EXISTS:
        if (op->n && !op->present) {
            kvp_error("pool exists: present is NULL");
            return KVP_ERR_NULL_POINTER;
        }
        return KVP_OK;
    case KVP_OP_PREFIX:
        if (!op->prefix_len) {
            kvp_error("pool prefix: prefix_len is NULL");
            return KVP_ERR_NULL_POINTER;
        }
        return KVP_OK;
    default:
        break;
    }
    if (op->n && !op->results) {
        kvp_error("pool %s: results is NULL", name);
        return KVP_ERR_NULL_POINTER;
    }
    if (op->type == KVP_OP_PUT || op->type == KVP_OP_GET) {
        if (op->n && !op->values) {
            kvp_error("pool %s: values is NULL", name);
            return KVP_ERR_NULL_POINTER;
        }
        for (size_t i = 0; i < op->n; i++) {
            uint64_t total;
            if (check_sgl(&op->values[i], &total) != KVP_OK) {
                kvp_error("pool %s: value %zu has a NULL buffer", name, i);
                return KVP_ERR_NULL_POINTER;
            }
            if (op->type == KVP_OP_PUT && total == 0) {
                kvp_error("pool put: value %zu is empty", i);
                return KVP_ERR_VALUE_EMPTY;
            }
            if (op->type == KVP_OP_PUT && total > pool->max_value) {
                kvp_error("pool put: value %zu is %llu bytes (max %llu for this pool)", i,
                          (unsigned long long)total, (unsigned long long)pool->max_value);
                return KVP_ERR_VALUE_TOO_LARGE;
            }
        }
    }
    size_t dup = 0;
    kvp_status_t st = check_duplicates(op->keys, op->n, &dup);
    if (st == KVP_ERR_DUPLICATE_KEY)
        kvp_error("pool %s: key %zu repeats an earlier key of the batch", name, dup);
    return st;
}

static kvp_status_t submit(kvp_pool_t *pool, kvp_op_t *op, int will_drive)
{
    if (!pool || !op) {
        kvp_error("pool_submit: %s is NULL", pool ? "op" : "pool");
        return KVP_ERR_NULL_POINTER;
    }
    kvp_status_t st = validate(pool, op);
    if (st != KVP_OK)
        return st;
    return pool->ops->submit(pool->impl, op, will_drive);
}

kvp_status_t kvp_pool_submit(kvp_pool_t *pool, kvp_op_t *op) { return submit(pool, op, 0); }

int kvp__pool_probe(kvp_pool_t *pool, kvp_op_t *op)
{
    if (!pool || !op || !pool->ops->probe || (op->type != KVP_OP_EXISTS && op->type != KVP_OP_PREFIX) ||
        validate(pool, op) != KVP_OK)
        return -1;
    return pool->ops->probe(pool->impl, op) ? 1 : 0;
}

/* Blocking completion for backends that answer KVP_INPROGRESS. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int done;
    kvp_status_t status;
} waiter_t;

static void waiter_cb(void *arg, kvp_status_t status)
{
    waiter_t *w = arg;
    pthread_mutex_lock(&w->mu);
    w->status = status;
    atomic_store(&w->done, 1);
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* How long a waiting caller drives the transport before it sleeps: a round
 * trip plus the op's bytes at 1 GB/s (the slowest transport's pace), so a
 * large transfer over TCP is driven to its end instead of being handed to
 * a thread that must first wake up; never more than 20 ms. */
#define SYNC_SPIN_BASE_NS 200000ull
#define SYNC_SPIN_MAX_NS 20000000ull

static uint64_t op_bytes(const kvp_op_t *op)
{
    if (op->type != KVP_OP_PUT && op->type != KVP_OP_GET)
        return 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < op->n; i++)
        for (uint32_t j = 0; j < op->values[i].iovcnt; j++)
            bytes += op->values[i].iov[j].len;
    return bytes;
}

static kvp_status_t run_sync(kvp_pool_t *pool, kvp_op_t *op)
{
    waiter_t w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    op->cb = waiter_cb;
    op->cb_arg = &w;
    kvp_status_t st = submit(pool, op, pool && pool->ops->drive != NULL);
    if (st == KVP_INPROGRESS) {
        if (pool->ops->drive) {
            uint64_t spin = SYNC_SPIN_BASE_NS + op_bytes(op);
            if (spin > SYNC_SPIN_MAX_NS)
                spin = SYNC_SPIN_MAX_NS;
            pool->ops->drive(pool->impl, &w.done, kvp__now_ns() + spin);
        }
        pthread_mutex_lock(&w.mu);
        while (!w.done)
            pthread_cond_wait(&w.cv, &w.mu);
        pthread_mutex_unlock(&w.mu);
        st = w.status;
    }
    return st;
}

kvp_status_t kvp_pool_run(kvp_pool_t *pool, kvp_op_t *op)
{
    if (!op)
        return KVP_ERR_NULL_POINTER;
    return run_sync(pool, op);
}

kvp_status_t kvp_pool_exists(kvp_pool_t *pool, const kvp_key_t *keys, size_t n, uint8_t *present)
{
    kvp_op_t op = {.type = KVP_OP_EXISTS, .keys = keys, .n = n, .present = present};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_prefix(kvp_pool_t *pool, const kvp_key_t *keys, size_t n, size_t *prefix_len_p)
{
    kvp_op_t op = {.type = KVP_OP_PREFIX, .keys = keys, .n = n, .prefix_len = prefix_len_p};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_put(kvp_pool_t *pool, const kvp_key_t *keys, const kvp_sgl_t *values, size_t n,
                          kvp_key_result_t *results)
{
    kvp_op_t op = {.type = KVP_OP_PUT, .keys = keys, .n = n, .values = values, .results = results};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_get(kvp_pool_t *pool, const kvp_key_t *keys, const kvp_sgl_t *values, size_t n,
                          kvp_key_result_t *results)
{
    kvp_op_t op = {.type = KVP_OP_GET, .keys = keys, .n = n, .values = values, .results = results};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_remove(kvp_pool_t *pool, const kvp_key_t *keys, size_t n,
                             kvp_key_result_t *results)
{
    kvp_op_t op = {.type = KVP_OP_REMOVE, .keys = keys, .n = n, .results = results};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_pin(kvp_pool_t *pool, const kvp_key_t *keys, size_t n, int pin,
                          kvp_key_result_t *results)
{
    kvp_op_t op = {.type = pin ? KVP_OP_PIN : KVP_OP_UNPIN, .keys = keys, .n = n, .results = results};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_remove_all(kvp_pool_t *pool, uint64_t *removed_p)
{
    kvp_op_t op = {.type = KVP_OP_REMOVE_ALL, .removed = removed_p};
    return run_sync(pool, &op);
}

kvp_status_t kvp_pool_stats(kvp_pool_t *pool, kvp_pool_stats_t *stats_p)
{
    if (!pool || !stats_p) {
        kvp_error("pool_stats: %s is NULL", pool ? "stats_p" : "pool");
        return KVP_ERR_NULL_POINTER;
    }
    return pool->ops->stats(pool->impl, stats_p);
}

kvp_status_t kvp_pool_register(kvp_pool_t *pool, void *addr, size_t len)
{
    if (!pool || !addr || !len) {
        kvp_error("pool_register: NULL pool or empty region");
        return !pool || !addr ? KVP_ERR_NULL_POINTER : KVP_ERR_INVALID_ARG;
    }
    return pool->ops->reg ? pool->ops->reg(pool->impl, addr, len) : KVP_OK;
}

kvp_status_t kvp_pool_deregister(kvp_pool_t *pool, void *addr)
{
    if (!pool || !addr) {
        kvp_error("pool_deregister: NULL argument");
        return KVP_ERR_NULL_POINTER;
    }
    return pool->ops->dereg ? pool->ops->dereg(pool->impl, addr) : KVP_OK;
}
