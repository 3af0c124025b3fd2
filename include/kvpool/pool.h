/*
 * kvpool pool client: the one API through which everything reads and writes
 * the pool, whatever backend the URI names.
 *
 *   embedded://?capacity=4GiB[&high_watermark=0.95][&low_watermark=0.90]
 *              [&hugepages=off|auto|on][&provider=anon|memfd][&put_timeout=30s]
 *              [&shards=N][&prefault=true|false]
 *       the storage engine inside the calling process (no daemon).
 *   kvpool://HOST:PORT[?timeout=5s][&token_file=PATH][&transport=auto|ucx|tcp]
 *       one kvpool server (docs/protocol.md); the token may also come from the
 *       KVPOOL_TOKEN environment variable.  transport: ucx moves everything
 *       with UCX (shared memory on one host, RDMA or tcp across hosts); tcp
 *       uses kvpool's own TCP transport (values go straight between the
 *       socket and the caller's buffers); auto (the default) takes tcp where
 *       UCX could only use tcp to reach the server, else ucx.
 *   etcd://HOST:PORT/NAME   a cluster found through etcd (not built yet:
 *       KVP_ERR_UNSUPPORTED)
 *
 * Object model.  A key is 1..KVP_KEY_MAX bytes (any bytes; the KV connector
 * uses printable store keys).  A value is 1 B..KVP_VALUE_MAX, written once and
 * immutable.  Put of a key that already exists is an idempotent success: the
 * key's result is KVP_OK with KVP_RESULT_EXISTED set and the stored value is
 * left as it was.  Values are passed as scatter lists (kvp_sgl_t): one KV
 * block is one slice per layer tensor.
 *
 * Batches.  Every data operation takes N keys.  Arguments are validated for
 * the whole batch first: a NULL pointer, a key of bad length, an empty or
 * oversized value, or a key repeated in a PUT/GET/REMOVE/PIN/UNPIN batch
 * fails the whole call with that specific status, logs one line, and changes
 * nothing.  The lookups (EXISTS, PREFIX) read nothing but the index and
 * answer per position, so a repeated key there is allowed (Mooncake's
 * batch_is_exist behaves the same) and costs no duplicate scan on the
 * hottest path.
 * Once validated, each key gets its own result: batches are not
 * all-or-nothing (one key may be stored while another gets KVP_ERR_NO_SPACE).
 * The call then returns KVP_OK even if some keys failed; look at results[].
 * Per-key outcomes: PUT: KVP_OK (stored, or KVP_RESULT_EXISTED), KVP_ERR_NO_SPACE;
 * GET: KVP_OK (size = value size), KVP_ERR_NOT_FOUND, KVP_ERR_BUFFER_TOO_SMALL
 * (the destination is shorter than the value: nothing is copied for that key
 * and size tells the length needed); REMOVE/PIN/UNPIN: KVP_OK, KVP_ERR_NOT_FOUND.
 *
 * Thread safety.  One kvp_pool_t may be shared by any number of threads.
 *
 * Async contract (STYLE.md §6).  kvp_pool_submit() either completes now
 * (returns KVP_OK; the callback never fires), fails now (returns an error;
 * the callback never fires), or returns KVP_INPROGRESS and the callback
 * fires exactly once, from a backend thread.  Until it fires, every buffer
 * and array passed in the op must stay valid and untouched.  The embedded
 * backend always completes now.
 */
#ifndef KVPOOL_POOL_H
#define KVPOOL_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_KEY_MAX 512u                       /* bytes */
#define KVP_VALUE_MAX (256ull * 1024 * 1024)   /* bytes */
#define KVP_BATCH_MAX 65536u                   /* keys in one call */

typedef struct kvp_pool kvp_pool_t;

/* A key: `len` bytes at `data` (not NUL-terminated; owned by the caller and
 * only read during the call, or until completion for async calls). */
typedef struct kvp_key {
    const void *data;
    uint32_t len;
} kvp_key_t;

/* One slice of a scatter list. */
typedef struct kvp_iov {
    void *base;
    size_t len;
} kvp_iov_t;

/* A scatter list: the value is the concatenation of iov[0..iovcnt).  For put
 * the slices are read; for get they are written (their total length is the
 * buffer's capacity).  Slices of length 0 are allowed and skipped. */
typedef struct kvp_sgl {
    const kvp_iov_t *iov;
    uint32_t iovcnt;
} kvp_sgl_t;

/* Per-key result flags. */
#define KVP_RESULT_EXISTED 0x1u /* put: the key was already stored (success) */

/* Per-key outcome of a batch operation. */
typedef struct kvp_key_result {
    kvp_status_t status; /* KVP_OK, KVP_ERR_NOT_FOUND, KVP_ERR_NO_SPACE, ... */
    uint32_t flags;      /* KVP_RESULT_* */
    uint64_t size;       /* get: the value's size; put: bytes stored */
} kvp_key_result_t;

/* Statistics.  Object counters count objects; *_bytes count value bytes.
 * The accounting identity committed == live + evicted + removed + reset holds
 * in every snapshot (kvp_pool_stats takes a consistent one). */
typedef struct kvp_pool_stats {
    uint64_t capacity_bytes;   /* arena size */
    uint64_t used_bytes;       /* arena bytes allocated (live + reserved + in-flight frees) */
    uint64_t live_bytes;       /* value bytes of live objects */
    uint64_t live;             /* committed objects now visible */
    uint64_t committed;        /* puts that created an object (since open) */
    uint64_t evicted;          /* left through eviction */
    uint64_t removed;          /* left through remove */
    uint64_t reset;            /* left through remove_all */
    uint64_t expired_put;      /* reservations reclaimed after put_timeout */
    uint64_t reserved;         /* reservations now open (not visible) */
    uint64_t pinned;           /* live objects pinned */
    uint64_t leased;           /* live objects under a read lease now */
    uint64_t put_existed;      /* puts answered "existed" */
    uint64_t put_no_space;     /* puts refused for lack of space */
    uint64_t get_hits;
    uint64_t get_misses;
    uint64_t evicted_bytes;
    uint64_t index_bytes;      /* heap bytes held by the index */
    uint64_t high_watermark_bytes;
    uint64_t low_watermark_bytes;
} kvp_pool_stats_t;

typedef enum kvp_op_type {
    KVP_OP_EXISTS = 1, /* present[i] = 1 if keys[i] is live, else 0 */
    KVP_OP_PREFIX,     /* *prefix_len = m: keys[0..m) all live, keys[m] not */
    KVP_OP_PUT,        /* store values[i] under keys[i] */
    KVP_OP_GET,        /* copy the value of keys[i] into values[i] */
    KVP_OP_REMOVE,     /* remove keys[i]; results[i] = OK or NOT_FOUND */
    KVP_OP_PIN,        /* pin keys[i]: never evicted until unpinned */
    KVP_OP_UNPIN,
    KVP_OP_REMOVE_ALL, /* drop every object; *removed = how many */
} kvp_op_type_t;

typedef void (*kvp_op_cb)(void *arg, kvp_status_t status);

/* One operation for kvp_pool_submit.  The caller owns the struct and every
 * array it points to; all must stay valid until the call returns, or, when it
 * returns KVP_INPROGRESS, until the callback has fired. */
typedef struct kvp_op {
    kvp_op_type_t type;
    const kvp_key_t *keys;      /* [in] n keys (not REMOVE_ALL) */
    size_t n;
    const kvp_sgl_t *values;    /* [in] PUT: n sources; [in/out] GET: n destinations */
    kvp_key_result_t *results;  /* [out] n results (PUT, GET, REMOVE, PIN, UNPIN) */
    uint8_t *present;           /* [out] EXISTS: n flags */
    size_t *prefix_len;         /* [out] PREFIX */
    uint64_t *removed;          /* [out] REMOVE_ALL, may be NULL */
    uint32_t timeout_ms;        /* 0 = the backend's default; kvpool://: also bounds a
                                 * reconnect the op needs (then, from its post, the request) */
    kvp_op_cb cb;               /* completion for KVP_INPROGRESS; may be NULL for sync use */
    void *cb_arg;
} kvp_op_t;

/* Opens the pool named by `uri` and returns its handle in *pool_p.
 * Errors: KVP_ERR_NULL_POINTER, KVP_ERR_BAD_URI (malformed or unknown scheme),
 * KVP_ERR_BAD_OPTION (unknown option, value out of range, capacity 0),
 * KVP_ERR_BAD_SIZE, KVP_ERR_UNSUPPORTED (scheme not built in),
 * KVP_ERR_NO_MEMORY. On error *pool_p is left NULL. */
KVP_API kvp_status_t kvp_pool_open(const char *uri, kvp_pool_t **pool_p);

/* Closes the pool; waits for operations in flight. NULL is a no-op. */
KVP_API void kvp_pool_close(kvp_pool_t *pool);

/* Submits one operation (see the async contract above). */
KVP_API kvp_status_t kvp_pool_submit(kvp_pool_t *pool, kvp_op_t *op);

/* Runs one operation to completion, blocking: the op as for kvp_pool_submit
 * (its cb and cb_arg are overwritten), timeout_ms honoured.  Returns the
 * op's status. */
KVP_API kvp_status_t kvp_pool_run(kvp_pool_t *pool, kvp_op_t *op);

/* Blocking wrappers: each runs one kvp_op_t to completion. */
KVP_API kvp_status_t kvp_pool_exists(kvp_pool_t *pool, const kvp_key_t *keys, size_t n,
                                     uint8_t *present);
KVP_API kvp_status_t kvp_pool_prefix(kvp_pool_t *pool, const kvp_key_t *keys, size_t n,
                                     size_t *prefix_len_p);
KVP_API kvp_status_t kvp_pool_put(kvp_pool_t *pool, const kvp_key_t *keys,
                                  const kvp_sgl_t *values, size_t n, kvp_key_result_t *results);
KVP_API kvp_status_t kvp_pool_get(kvp_pool_t *pool, const kvp_key_t *keys,
                                  const kvp_sgl_t *values, size_t n, kvp_key_result_t *results);
KVP_API kvp_status_t kvp_pool_remove(kvp_pool_t *pool, const kvp_key_t *keys, size_t n,
                                     kvp_key_result_t *results);
KVP_API kvp_status_t kvp_pool_pin(kvp_pool_t *pool, const kvp_key_t *keys, size_t n, int pin,
                                  kvp_key_result_t *results);
KVP_API kvp_status_t kvp_pool_remove_all(kvp_pool_t *pool, uint64_t *removed_p);
KVP_API kvp_status_t kvp_pool_stats(kvp_pool_t *pool, kvp_pool_stats_t *stats_p);

/* Registers [addr, addr+len) for zero-copy transfers with network backends
 * (kvpool:// maps it with UCX once).  The embedded backend reads and writes
 * caller memory directly, so there it only validates the arguments. */
KVP_API kvp_status_t kvp_pool_register(kvp_pool_t *pool, void *addr, size_t len);
KVP_API kvp_status_t kvp_pool_deregister(kvp_pool_t *pool, void *addr);

/* Convenience: a key from a NUL-terminated string. */
static inline kvp_key_t kvp_key_str(const char *s)
{
    kvp_key_t k;
    size_t n = 0;
    while (s[n])
        n++;
    k.data = s;
    k.len = (uint32_t)n;
    return k;
}

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_POOL_H */
