/* Fuzz target: the UCX worker-address check (src/net/ucx_addr.c) on
 * arbitrary bytes, and UCX itself on whatever the check accepts.  Two
 * workers are made on the first input (address formats v1 and v2, shared
 * memory transports only, no /proc links); each input is checked against
 * both workers' own addresses, and only an accepted input reaches
 * ucp_ep_create on that worker, whose endpoint is closed at once (nothing
 * is ever sent on it).  A crash inside UCX on an accepted input means
 * the check is too loose. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include "common/log.h"
#include "net/ucx.h"
#include "net/ucx_addr.h"

typedef struct {
    ucp_context_h ctx;
    ucp_worker_h worker;
    uint8_t *own;
    size_t own_len;
} fz_worker_t;

/* LeakSanitizer (ASan and libFuzzer builds) is told to pass over memory
 * that UCX allocated, for two reasons outside kvpool:
 *  - UCX 1.13.1's shared-memory endpoint constructor leaks its segment hash
 *    table (three small blocks) when attaching the peer's FIFO fails: the
 *    error path in src/uct/sm/mm/base/mm_ep.c skips
 *    uct_mm_ep_cleanup_remote_segs, and every stale or altered segment id
 *    reaches it;
 *  - while a worker lives, some of its blocks are referenced only from
 *    UCX's mmap'd memory pools, which LeakSanitizer does not scan, so
 *    libFuzzer's check after each input sees them as lost (they are freed
 *    by the teardown below).
 * A stack through UCX's libraries is UCX's allocation (UCX is built without
 * frame pointers, so the stack often ends in its allocator); kvpool's own
 * allocations stay checked. */
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void);
__attribute__((visibility("default"))) const char *__lsan_default_suppressions(void)
{
    return "leak:libucs.so\n"
           "leak:libuct.so\n"
           "leak:libucp.so\n";
}

static fz_worker_t g_w[2];
static int g_ready;
static unsigned long g_inputs, g_accepted, g_made; /* KVP_FUZZ_STATS=1 prints them */

/* At exit, before LeakSanitizer looks (atexit, not a destructor: those run
 * after its check). */
static void teardown(void)
{
    if (getenv("KVP_FUZZ_STATS"))
        fprintf(stderr, "fuzz_ucx_addr: %lu inputs, %lu accepted checks, %lu endpoints made\n",
                g_inputs, g_accepted, g_made);
    for (int i = 0; i < 2; i++) {
        free(g_w[i].own);
        kvp__ucx_close(g_w[i].ctx, g_w[i].worker);
        memset(&g_w[i], 0, sizeof g_w[i]);
    }
}

static void setup(void)
{
    kvp__log_set_level(KVP_LOG_ERROR);
    setenv("UCX_POSIX_USE_PROC_LINK", "n", 0);
    setenv("UCX_TLS", "self,posix,sysv,cma", 0);
    /* Endpoints to stale or altered segment ids fail with an error each. */
    if (!getenv("UCX_LOG_LEVEL"))
        (void)ucs_global_opts_set_value("LOG_LEVEL", "fatal");
    const char *was = getenv("UCX_ADDRESS_VERSION");
    char *saved = was ? strdup(was) : NULL;
    static const char *const versions[2] = {"v1", "v2"};
    for (int i = 0; i < 2; i++) {
        setenv("UCX_ADDRESS_VERSION", versions[i], 1);
        if (kvp__ucx_open("fuzz", KVP_UCX_SERVER, &g_w[i].ctx, &g_w[i].worker) != KVP_OK)
            abort();
        ucp_address_t *a;
        size_t n;
        if (ucp_worker_get_address(g_w[i].worker, &a, &n) != UCS_OK)
            abort();
        g_w[i].own = malloc(n);
        if (!g_w[i].own)
            abort();
        memcpy(g_w[i].own, a, n);
        g_w[i].own_len = n;
        ucp_worker_release_address(g_w[i].worker, a);
    }
    if (saved)
        setenv("UCX_ADDRESS_VERSION", saved, 1);
    else
        unsetenv("UCX_ADDRESS_VERSION");
    free(saved);
    atexit(teardown);
    g_ready = 1;
}

/* Closes ep with a flush (nothing was sent on it; UCX 1.13 refuses a forced
 * close without peer error handling), progressing a bounded while; a close
 * still pending then ends with the worker. */
static void ep_close(ucp_worker_h worker, ucp_ep_h ep)
{
    ucp_request_param_t prm = {.op_attr_mask = 0};
    ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
    if (!UCS_PTR_IS_PTR(sp))
        return;
    for (int i = 0; i < 10000 && ucp_request_check_status(sp) == UCS_INPROGRESS; i++)
        ucp_worker_progress(worker);
    ucp_request_free(sp);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_ready)
        setup();
    /* A private copy so out-of-bounds reads hit the sanitizer's redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        abort();
    memcpy(buf, data, size);
    g_inputs++;
    for (int i = 0; i < 2; i++) {
        const char *why = "unset";
        kvp_status_t st = kvp__ucx_addr_check(buf, size, g_w[i].own, g_w[i].own_len, &why);
        if (st != KVP_OK) {
            if (st != KVP_ERR_PROTOCOL || !why)
                abort();
            continue;
        }
        if (why || size == 0 || size > KVP_UCX_ADDR_MAX)
            abort();
        g_accepted++;
        ucp_ep_params_t p = {
            .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
            .address = (const ucp_address_t *)buf,
            .err_mode = UCP_ERR_HANDLING_MODE_NONE,
        };
        ucp_ep_h ep = NULL;
        if (ucp_ep_create(g_w[i].worker, &p, &ep) == UCS_OK) {
            g_made++;
            ep_close(g_w[i].worker, ep);
        }
        for (int k = 0; k < 4; k++)
            ucp_worker_progress(g_w[i].worker);
    }
    free(buf);
    return 0;
}
