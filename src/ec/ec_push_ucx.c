/*
 * The EC push's UCX context (ec_push_ucx.h).
 */
#include "ec/ec_push_ucx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "net/ucx.h"

/* Is the transport `name` in the space-separated list? */
static bool has_tl(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0))
            return true;
    return false;
}

kvp_status_t kvp__ec_ucx_open(const char *who, bool allow_tcp, kvp__ec_ucx_t *u)
{
    memset(u, 0, sizeof *u);
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        kvp_error("%s: UCX configuration: %s", who, ucs_status_string(st));
        return KVP_ERR_IO;
    }
    const char *asked = getenv("UCX_TLS");
    if (!allow_tcp && (!asked || !asked[0] || !strcmp(asked, "all")) &&
        (st = ucp_config_modify(cfg, "TLS", "^tcp")) != UCS_OK) {
        kvp_error("%s: UCX_TLS=^tcp: %s", who, ucs_status_string(st));
        ucp_config_release(cfg);
        return KVP_ERR_IO;
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP,
    };
    st = ucp_init(&params, cfg, &u->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        kvp_info("%s: UCX (RMA) unavailable: %s; the EC push uses its TCP stream", who, ucs_status_string(st));
        u->ctx = NULL;
        return KVP_ERR_UNSUPPORTED;
    }
    snprintf(u->tls, sizeof u->tls, "%s", kvp__ucx_transports(u->ctx));
    u->tcp = has_tl(u->tls, "tcp");
    if (u->tcp && !allow_tcp) {
        kvp_info("%s: UCX_TLS=%s yields tcp, which kvpool keeps out of UCX: the EC push uses its TCP stream", who,
                 asked ? asked : "");
        ucp_cleanup(u->ctx);
        u->ctx = NULL;
        return KVP_ERR_UNSUPPORTED;
    }
    u->shm = has_tl(u->tls, "posix") || has_tl(u->tls, "sysv") || has_tl(u->tls, "xpmem");
    for (const char *t = u->tls; *t; t += strcspn(t, " "), t += *t == ' ')
        if (!strncmp(t, "rc", 2) || !strncmp(t, "dc", 2) || !strncmp(t, "ud", 2))
            u->rdma = true;
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_SINGLE,
    };
    if ((st = ucp_worker_create(u->ctx, &wp, &u->worker)) != UCS_OK) {
        kvp_error("%s: UCX worker: %s", who, ucs_status_string(st));
        ucp_cleanup(u->ctx);
        u->ctx = NULL;
        return KVP_ERR_IO;
    }
    kvp_info("%s: UCX RMA transports: %s", who, u->tls);
    return KVP_OK;
}

void kvp__ec_ucx_close(kvp__ec_ucx_t *u)
{
    if (u->worker)
        ucp_worker_destroy(u->worker);
    if (u->ctx)
        ucp_cleanup(u->ctx);
    u->worker = NULL;
    u->ctx = NULL;
}

kvp_status_t kvp__ec_ucx_wait(ucp_worker_h w, ucs_status_ptr_t sp, uint64_t deadline_ns)
{
    if (sp == NULL)
        return KVP_OK;
    if (UCS_PTR_IS_ERR(sp))
        return kvp__ucx_status(UCS_PTR_STATUS(sp));
    ucs_status_t st;
    while ((st = ucp_request_check_status(sp)) == UCS_INPROGRESS) {
        if (kvp__now_ns() >= deadline_ns) {
            ucp_request_free(sp); /* released when it completes */
            return KVP_ERR_TIMEOUT;
        }
        ucp_worker_progress(w);
    }
    ucp_request_free(sp);
    return kvp__ucx_status(st);
}
