#include "net/ucx.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"

kvp_status_t kvp__ucx_status(ucs_status_t st)
{
    switch (st) {
    case UCS_OK: return KVP_OK;
    case UCS_INPROGRESS: return KVP_INPROGRESS;
    case UCS_ERR_NO_MEMORY: return KVP_ERR_NO_MEMORY;
    case UCS_ERR_TIMED_OUT: return KVP_ERR_TIMEOUT;
    case UCS_ERR_CANCELED: return KVP_ERR_CANCELLED;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED: return KVP_ERR_CONN_REFUSED;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT: return KVP_ERR_CONN_LOST;
    default: return KVP_ERR_IO;
    }
}

ucs_status_t kvp__ucx_am_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb, void *arg)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = id,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = cb,
        .arg = arg,
    };
    return ucp_worker_set_am_recv_handler(worker, &hp);
}

const char *kvp__ucx_transports(ucp_context_h ctx)
{
    static __thread char out[512];
    char *text = NULL;
    size_t len = 0;
    out[0] = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return out;
    ucp_context_print_info(ctx, f);
    fclose(f);
    /* Lines look like "#      resource 4  :  md 3  dev 3  flags -- posix/memory". */
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *dash = strstr(line, "-- ");
        if (!strstr(line, "resource") || !dash)
            continue;
        char tl[64];
        if (sscanf(dash + 3, "%63[^/]", tl) != 1)
            continue;
        char probe[70];
        snprintf(probe, sizeof probe, " %s ", tl);
        char padded[520];
        snprintf(padded, sizeof padded, " %s ", out);
        if (strstr(padded, probe))
            continue;
        size_t n = strlen(out);
        snprintf(out + n, sizeof out - n, "%s%s", n ? " " : "", tl);
    }
    free(text);
    return out;
}

/* Settings kvpool's message sizes want, unless the environment sets them.
 * Requests up to KVP_RNDV_MIN (a lookup of 128 keys is about 15 KB) go
 * eager, in one message: UCX's automatic threshold sends them by rendezvous
 * over tcp, which costs a round trip (a 128-key prefix over tcp took 130 us
 * p50 instead of 45).  Larger values always go by rendezvous (the wire code
 * asks for it), so one copy stays the rule. */
static void tune(ucp_config_t *cfg)
{
    static const char *const kv[][2] = {
        {"RNDV_THRESH", "64K"},
    };
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        char env[64];
        snprintf(env, sizeof env, "UCX_%s", kv[i][0]);
        if (getenv(env))
            continue;
        ucs_status_t st = ucp_config_modify(cfg, kv[i][0], kv[i][1]);
        if (st != UCS_OK)
            kvp_warn("UCX: cannot set %s=%s: %s", kv[i][0], kv[i][1], ucs_status_string(st));
    }
}

/*
 * kvpool never lets UCX use tcp.  UCX's tcp transport listens on every
 * interface whatever the server's --listen says, and whoever reaches that
 * listener makes UCX parse a worker address they wrote (ucp_address_unpack
 * does not check its input: one bad address asserts or crashes the
 * process).  Kept to shared memory (reachable only by processes of this uid
 * on this host) and RDMA, UCX parses only what trusted peers send; peers
 * across a plain network use kvpool's own TCP transport (net/lane.h), whose
 * frames kvpool decodes itself.  So UCX_TLS is honoured minus tcp:
 * unset or "all" becomes "^tcp", an exclusion list gets tcp added, tcp is
 * dropped from an inclusion list, and a list of tcp alone leaves "self"
 * (UCX then reaches no other process; clients use kvpool's TCP transport).
 */
static void tls_without_tcp(const char *asked, char *out, size_t cap)
{
    if (!asked || !asked[0] || !strcmp(asked, "all")) {
        snprintf(out, cap, "^tcp");
        return;
    }
    if (asked[0] == '^') {
        snprintf(out, cap, "%s,tcp", asked);
        return;
    }
    char copy[512];
    snprintf(copy, sizeof copy, "%s", asked);
    out[0] = 0;
    char *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (!strcmp(t, "tcp"))
            continue;
        if (!strcmp(t, "all")) {
            snprintf(out, cap, "^tcp");
            return;
        }
        size_t n = strlen(out);
        snprintf(out + n, cap - n, "%s%s", n ? "," : "", t);
    }
    if (!out[0])
        snprintf(out, cap, "self");
}

/* A context for `who` (multi_thread: its workers are shared by threads);
 * tls gets the UCX_TLS it was made with. */
static kvp_status_t context_create(const char *who, int multi_thread, ucp_context_h *ctx_p, char *tls, size_t cap)
{
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) {
        kvp_error("%s: UCX configuration: %s", who, ucs_status_string(st));
        return KVP_ERR_IO;
    }
    tune(cfg);
    const char *asked = getenv("UCX_TLS");
    tls_without_tcp(asked, tls, cap);
    if ((st = ucp_config_modify(cfg, "TLS", tls)) != UCS_OK) {
        kvp_error("%s: UCX_TLS=%s: %s", who, tls, ucs_status_string(st));
        ucp_config_release(cfg);
        return KVP_ERR_IO;
    }
    if (asked && strcmp(asked, tls) != 0 && strstr(asked, "tcp"))
        kvp_info("%s: UCX_TLS=%s: kvpool keeps tcp out of UCX (its own TCP transport serves network peers): "
                 "using %s", who, asked, tls);
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = multi_thread,
    };
    st = ucp_init(&params, cfg, ctx_p);
    if (st != UCS_OK && asked && ucp_config_modify(cfg, "TLS", "^tcp") == UCS_OK) {
        /* The transports asked for are missing here (say RDMA on a host
         * without a NIC): fall back to whatever UCX finds, loudly. */
        kvp_warn("%s: UCX_TLS=%s unusable here (%s); falling back to all available transports",
                 who, asked, ucs_status_string(st));
        st = ucp_init(&params, cfg, ctx_p);
    }
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        kvp_error("%s: UCX init failed: %s", who, ucs_status_string(st));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

static kvp_status_t worker_create(const char *who, ucp_context_h ctx, int multi_thread, ucp_worker_h *worker_p)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = multi_thread ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t st = ucp_worker_create(ctx, &wp, worker_p);
    if (st != UCS_OK) {
        kvp_error("%s: UCX worker: %s", who, ucs_status_string(st));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

kvp_status_t kvp__ucx_open(const char *who, kvp__ucx_role_t role, ucp_context_h *ctx_p,
                           ucp_worker_h *worker_p)
{
    int multi_thread = role == KVP_UCX_CLIENT;
    char tls[600];
    kvp_status_t st = context_create(who, multi_thread, ctx_p, tls, sizeof tls);
    if (st != KVP_OK)
        return st;
    if ((st = worker_create(who, *ctx_p, multi_thread, worker_p)) != KVP_OK) {
        ucp_cleanup(*ctx_p);
        return st;
    }
    kvp_info("%s: UCX transports available: %s (UCX_TLS=%s)", who, kvp__ucx_transports(*ctx_p), tls);
    return KVP_OK;
}

void kvp__ucx_close(ucp_context_h ctx, ucp_worker_h worker)
{
    if (worker)
        ucp_worker_destroy(worker);
    if (ctx)
        ucp_cleanup(ctx);
}

/* ---- the process's client context ----
 * ucp_init reads the configuration and opens every transport's resources
 * (about 4 ms on this 2-core VM, more with more devices), so the kvpool://
 * handles of a process share one context, each with its own worker (a
 * context with mt_workers_shared serves workers of different threads).  A child made by fork() does not use its parent's:
 * UCX's resources do not survive a fork, so the child makes its own (and
 * leaves the inherited one alone: it is the parent's to clean up). */
static struct {
    pthread_mutex_t mu;
    ucp_context_h ctx;
    unsigned refs;
    pid_t pid;          /* the process that made ctx */
    int shm, rdma;      /* kvp__ucx_kinds of ctx */
} g_client = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void kinds_of(ucp_context_h ctx, int *shm_p, int *rdma_p)
{
    char tls[512];
    snprintf(tls, sizeof tls, "%s", kvp__ucx_transports(ctx));
    int shm = 0, rdma = 0;
    char *save = NULL;
    for (char *t = strtok_r(tls, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (!strcmp(t, "posix") || !strcmp(t, "sysv") || !strcmp(t, "xpmem") || !strcmp(t, "cma") ||
            !strcmp(t, "knem"))
            shm = 1;
        else if (!strncmp(t, "rc", 2) || !strncmp(t, "dc", 2) || !strncmp(t, "ud", 2))
            rdma = 1;
    }
    *shm_p = shm;
    *rdma_p = rdma;
}

kvp_status_t kvp__ucx_client_open(ucp_context_h *ctx_p, ucp_worker_h *worker_p)
{
    pthread_mutex_lock(&g_client.mu);
    if (g_client.ctx && g_client.pid != getpid()) { /* inherited across fork() */
        g_client.ctx = NULL;
        g_client.refs = 0;
    }
    if (!g_client.ctx) {
        char tls[600];
        kvp_status_t st = context_create("client", 1, &g_client.ctx, tls, sizeof tls);
        if (st != KVP_OK) {
            g_client.ctx = NULL;
            pthread_mutex_unlock(&g_client.mu);
            return st;
        }
        g_client.pid = getpid();
        kinds_of(g_client.ctx, &g_client.shm, &g_client.rdma);
        kvp_info("client: UCX transports available: %s (UCX_TLS=%s)", kvp__ucx_transports(g_client.ctx), tls);
    }
    ucp_context_h ctx = g_client.ctx;
    g_client.refs++;
    pthread_mutex_unlock(&g_client.mu);
    if (worker_create("client", ctx, 1, worker_p) != KVP_OK) {
        kvp__ucx_client_close(ctx, NULL);
        return KVP_ERR_IO;
    }
    *ctx_p = ctx;
    return KVP_OK;
}

void kvp__ucx_client_close(ucp_context_h ctx, ucp_worker_h worker)
{
    if (worker)
        ucp_worker_destroy(worker);
    if (!ctx)
        return;
    pthread_mutex_lock(&g_client.mu);
    if (ctx == g_client.ctx && g_client.pid == getpid() && --g_client.refs == 0) {
        ucp_cleanup(ctx);
        g_client.ctx = NULL;
    }
    pthread_mutex_unlock(&g_client.mu);
}

unsigned kvp__ucx_context_refs(void)
{
    pthread_mutex_lock(&g_client.mu);
    unsigned n = g_client.ctx && g_client.pid == getpid() ? g_client.refs : 0;
    pthread_mutex_unlock(&g_client.mu);
    return n;
}

void kvp__ucx_kinds(ucp_context_h ctx, int *shm_p, int *rdma_p)
{
    pthread_mutex_lock(&g_client.mu);
    int cached = ctx == g_client.ctx && g_client.pid == getpid();
    *shm_p = g_client.shm;
    *rdma_p = g_client.rdma;
    pthread_mutex_unlock(&g_client.mu);
    if (!cached)
        kinds_of(ctx, shm_p, rdma_p);
}

int kvp__ucx_host_is_local(const char *host)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai)
        return 0;
    struct in_addr a = ((struct sockaddr_in *)ai->ai_addr)->sin_addr;
    freeaddrinfo(ai);
    if ((ntohl(a.s_addr) >> 24) == 127)
        return 1;
    struct ifaddrs *ifs = NULL;
    int local = 0;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !local; i = i->ifa_next)
            local = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                    ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == a.s_addr;
        freeifaddrs(ifs);
    }
    return local;
}

int kvp__ucx_ep_close(ucp_worker_h worker, ucp_ep_h ep, unsigned timeout_ms)
{
    ucp_request_param_t prm = {.op_attr_mask = 0};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
    if (sp == NULL || UCS_PTR_IS_ERR(sp))
        return 1; /* the endpoint is released even when the flush failed */
    uint64_t until = kvp__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (ucp_request_check_status(sp) == UCS_INPROGRESS && kvp__now_ns() < until)
        ucp_worker_progress(worker);
    int done = ucp_request_check_status(sp) != UCS_INPROGRESS;
    ucp_request_free(sp); /* (a close still pending frees its request when it ends) */
    return done;
}

int kvp__ucx_arm(ucp_worker_h worker, kvp__ucx_armer_t *a, int timeout, int did, uint64_t now,
                 uint64_t last_progress_ns, uint64_t wedge_ns)
{
    if (!timeout || ucp_worker_arm(worker) != UCS_ERR_BUSY) {
        a->busy = 0;
        a->busy_since = 0;
        return timeout;
    }
    if (did || !a->busy_since) {
        a->busy_since = did ? 0 : now;
    } else if (now - a->busy_since > wedge_ns && now - last_progress_ns > wedge_ns) {
        a->busy_since = 0;
        a->busy = 0;
        return -1;
    }
    return did || ++a->busy < 1000 ? 0 : 1;
}
