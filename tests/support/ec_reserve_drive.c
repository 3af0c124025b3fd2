/* See ec_reserve_drive.h. */
#include "support/ec_reserve_drive.h"

#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/json.h"
#include "ec/ec_client.h"
#include "ec/ec_ctl_wire.h"
#include "ec/ec_worker_int.h"
#include "kvpool/pool.h"

kvp_status_t kvp__rd_client_create(int64_t timeout_ms, kvp__rd_client_t **c_p)
{
    return kvp__ec_client_create(timeout_ms, c_p);
}

void kvp__rd_client_destroy(kvp__rd_client_t *c) { kvp__ec_client_destroy(c); }

kvp_status_t kvp__rd_reserve_once(kvp__rd_client_t *c, const char *addr, const char *tid, const char *hash,
                                  uint64_t size, int64_t hidden, uint64_t *ns_p, bool *cached_p, size_t *frame_p,
                                  size_t *reply_p)
{
    if (hidden < 1 || size < 2 * (uint64_t)hidden)
        return KVP_ERR_INVALID_ARG;
    kvp__ec_tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype = KVP_EC_DTYPE_BFLOAT16;
    t.ndim = 2;
    t.shape[1] = hidden;
    t.shape[0] = (int64_t)(size / (2 * (uint64_t)hidden));
    t.nbytes = (uint64_t)t.shape[0] * (uint64_t)hidden * 2;
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_reserve(&b, &tid, &hash, &t, 1, false);
    if (b.oom) {
        kvp__jw_cleanup(&b);
        return KVP_ERR_NO_MEMORY;
    }
    if (frame_p)
        *frame_p = b.len;
    kvp__ec_reply_t rep;
    kvp__ec_reply_init(&rep);
    uint64_t t0 = kvp__now_ns();
    kvp_status_t st = kvp__ec_client_request(c, addr, b.p, b.len, &rep);
    *ns_p = kvp__now_ns() - t0;
    kvp__jw_cleanup(&b);
    if (reply_p)
        *reply_p = rep.bytes;
    kvp__ec_reserve_out_t o;
    const char *session = NULL;
    uint64_t ptr = 0;
    if (st == KVP_OK)
        st = kvp__ec_ctl_decode_reserve_result(rep.result, &o, &session, &ptr);
    kvp__ec_reply_cleanup(&rep);
    if (st != KVP_OK)
        return st;
    *cached_p = o.cached;
    bool cancelled = false;
    return kvp__ec_client_cancel(c, addr, tid, o.reservation_id, true, false, &cancelled);
}

kvp_status_t kvp__rd_put_entries(const char *uri, const char *model, uint64_t n, uint64_t size,
                                 void (*hash_of)(char *buf, size_t len, uint64_t i))
{
    kvp_pool_t *pool = NULL;
    kvp_status_t st = kvp_pool_open(uri, &pool);
    if (st != KVP_OK)
        return st;
    uint8_t *v = kvp__malloc(size);
    if (!v) {
        kvp_pool_close(pool);
        return KVP_ERR_NO_MEMORY;
    }
    memset(v, 0x5a, size);
    for (uint64_t i = 0; i < n && st == KVP_OK; i++) {
        char hash[128], key[KVP_KEY_MAX + 1];
        size_t klen;
        hash_of(hash, sizeof hash, i);
        st = kvp__ec_store_key(model, hash, key, sizeof key, &klen);
        kvp_key_t k = {key, (uint32_t)klen};
        kvp_iov_t iov = {v, size};
        kvp_sgl_t sgl = {&iov, 1};
        kvp_key_result_t res;
        if (st == KVP_OK)
            st = kvp_pool_put(pool, &k, &sgl, 1, &res);
        if (st == KVP_OK && res.status != KVP_OK)
            st = res.status;
    }
    kvp__free(v, size);
    kvp_pool_close(pool);
    return st;
}
