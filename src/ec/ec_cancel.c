/*
 * The remote-cancel job (E8, the original's _cancel_remote), run by the
 * executor on its own thread: find every consumer shard behind the first
 * control address, send each a cancel, retry the shards that failed once.
 * It talks to the control client only through kvp_ec_control_t, so the
 * ZeroMQ client and the scripted one plug in alike.
 */
#include "common/alloc.h"
#include "common/log.h"
#include "common/strmap.h"
#include "ec/ec_table.h"
#include "kvpool/ec_connector.h"

kvp_status_t kvp_ec_cancel_remote(const kvp_ec_control_t *c, const char *addr, const char *tid, bool *cancelled_p)
{
    *cancelled_p = false;
    const char *const *shards = NULL;
    size_t n = 0;
    bool found = false;
    for (int i = 0; i < KVP_EC_CANCEL_ATTEMPTS && !found; i++)
        found = c->discover_shards(c->ctx, addr, &shards, &n) == KVP_OK;
    if (!found) {
        kvp_warn("Could not discover every EC consumer shard at %s", addr);
        return KVP_ERR_NOT_FOUND;
    }
    /* The shard list belongs to the client until its next call: copy. */
    char **pending = n ? kvp__calloc(n, sizeof *pending) : NULL;
    char **failed = n ? kvp__calloc(n, sizeof *failed) : NULL;
    kvp_status_t first_err = KVP_OK, ret = KVP_OK;
    if (n && (!pending || !failed)) {
        ret = KVP_ERR_NO_MEMORY;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (!(pending[i] = kvp__strdup(shards[i]))) {
            ret = KVP_ERR_NO_MEMORY;
            goto out;
        }
    bool cancelled = false;
    size_t np = n;
    for (int round = 0; round < KVP_EC_CANCEL_ATTEMPTS; round++) {
        size_t nf = 0;
        for (size_t i = 0; i < np; i++) {
            bool one = false;
            kvp_status_t st = c->cancel(c->ctx, pending[i], tid, &one);
            if (st != KVP_OK) {
                if (first_err == KVP_OK)
                    first_err = st;
                failed[nf++] = pending[i];
                pending[i] = NULL;
                continue;
            }
            cancelled |= one;
        }
        if (nf == 0) {
            *cancelled_p = cancelled;
            ret = KVP_OK;
            goto out;
        }
        for (size_t i = 0; i < np; i++)
            kvp__strfree(pending[i]);
        for (size_t i = 0; i < nf; i++) {
            pending[i] = failed[i];
            failed[i] = NULL;
        }
        for (size_t i = nf; i < n; i++)
            pending[i] = NULL;
        np = nf;
    }
    *cancelled_p = cancelled;
    ret = first_err;
out:
    kvp__ec_strv_free(pending, n);
    kvp__ec_strv_free(failed, n);
    return ret;
}

