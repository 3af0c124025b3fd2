/*
 * The EC push between two processes (ec_push_drive.h).
 */
#include "support/ec_push_drive.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "ec/ec_push.h"
#include "ec/ec_push_wire.h"

static kvp_status_t accept_all(void *ctx, uint64_t off, uint64_t len, const char *rid)
{
    (void)ctx, (void)off, (void)len, (void)rid;
    return KVP_OK;
}

uint8_t *kvp__pd_big(uint64_t n)
{
    uint8_t *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, n, MADV_HUGEPAGE);
    memset(p, 1, n);
    return p;
}

const char *const kvp__pd_path_names[KVP__PD_NUM] = {"tcp", "ucx", "auto", "ucx_emul", "ucx_tcp", "auto_tcp"};

typedef struct {
    pid_t pid;
    int to_child;
    char *session;
} recv_proc_t;

/* Forks a receiver for path p; its session string comes back over a pipe. */
static int recv_start(kvp__pd_path_t p, uint64_t slab_bytes, recv_proc_t *r)
{
    int up[2], down[2];
    if (pipe(up) || pipe(down))
        return -1;
    r->pid = fork();
    if (r->pid == 0) {
        close(up[0]);
        close(down[1]);
        uint8_t *slab = (p == KVP__PD_TCP || p == KVP__PD_UCX_EMUL || p == KVP__PD_UCX_TCP) ? kvp__pd_big(slab_bytes) : NULL;
        kvp__ec_push_rx_params_t rp = {
            .host = "127.0.0.1",
            .slab = slab,
            .slab_size = slab_bytes,
            .paths = p == KVP__PD_TCP ? KVP__EC_PATH_TCP : KVP__EC_PATH_TCP | KVP__EC_PATH_UCX,
            .check = accept_all,
            .ucx_force = p == KVP__PD_UCX_EMUL || p == KVP__PD_UCX_TCP,
        };
        kvp__ec_push_rx_t *rx;
        if (kvp__ec_push_rx_create(&rp, &rx) != KVP_OK)
            _exit(2);
        if (!slab)
            memset(kvp__ec_push_rx_slab(rx), 1, slab_bytes); /* faulted in, like the baselines */
        const char *s = kvp__ec_push_rx_session(rx);
        uint32_t n = (uint32_t)strlen(s);
        if (write(up[1], &n, 4) != 4 || write(up[1], s, n) != (ssize_t)n)
            _exit(3);
        char c;
        ssize_t k = read(down[0], &c, 1);
        (void)k;
        kvp__ec_push_rx_destroy(rx);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    r->to_child = down[1];
    uint32_t n = 0;
    if (read(up[0], &n, 4) != 4 || n > KVP__EC_SESSION_MAX) {
        close(up[0]);
        return -1;
    }
    r->session = calloc(1, n + 1);
    ssize_t got = 0;
    while (got < (ssize_t)n) {
        ssize_t k = read(up[0], r->session + got, n - (size_t)got);
        if (k <= 0)
            break;
        got += k;
    }
    close(up[0]);
    return got == (ssize_t)n ? 0 : -1;
}

static void recv_stop(recv_proc_t *r)
{
    if (write(r->to_child, "x", 1) != 1)
        kill(r->pid, SIGKILL);
    close(r->to_child);
    waitpid(r->pid, NULL, 0);
    free(r->session);
}

/* All runs of path p at one size: gbps[run]; *used_p: the path the writes took. */
int kvp__pd_push_runs(kvp__pd_path_t p, uint64_t size, uint64_t slab_bytes, uint64_t iters, int runs,
                      const uint8_t *src, double *gbps, const char **used_p)
{
    recv_proc_t r;
    *used_p = "none";
    if (recv_start(p, slab_bytes, &r) != 0)
        return -1;
    unsigned used0 = 0, *used_path = &used0;
    kvp__ec_session_t *s = calloc(1, sizeof *s);
    int rc = kvp__ec_session_decode(r.session, s) == KVP_OK ? 0 : -1;
    kvp__ec_push_tx_params_t tp = {
        .paths = p == KVP__PD_TCP ? KVP__EC_PATH_TCP : p == KVP__PD_AUTO || p == KVP__PD_AUTO_TCP ? KVP__EC_PATH_TCP | KVP__EC_PATH_UCX
                                                                                 : KVP__EC_PATH_UCX,
        .timeout_ms = 30000,
        .ucx_force = p == KVP__PD_UCX_EMUL || p == KVP__PD_UCX_TCP,
    };
    kvp__ec_push_tx_t *tx = NULL;
    if (rc == 0 && kvp__ec_push_tx_create(&tp, &tx) != KVP_OK)
        rc = -1;
    uint64_t n = iters, slots = slab_bytes / size;
    /* warm-up: connection, endpoint, rkey, and every slot once (the
     * producer's mapping of a UCX slab faults in on first touch) */
    if (rc == 0 && kvp__ec_push_tx_write(tx, r.session, "", s->base, src, size, used_path) != KVP_OK)
        rc = -1;
    for (uint64_t i = 1; rc == 0 && i < slots && i < n; i++)
        if (kvp__ec_push_tx_write(tx, r.session, "", s->base + i * size, src, size, NULL) != KVP_OK)
            rc = -1;
    for (int run = 0; rc == 0 && run < runs; run++) {
        uint64_t t0 = kvp__now_ns();
        for (uint64_t i = 0; i < n && rc == 0; i++) {
            unsigned used;
            if (kvp__ec_push_tx_write(tx, r.session, "", s->base + (i % slots) * size, src, size, &used) != KVP_OK ||
                used != *used_path)
                rc = -1;
        }
        gbps[run] = (double)(n * size) / (double)(kvp__now_ns() - t0);
    }
    kvp__ec_push_tx_destroy(tx);
    free(s);
    recv_stop(&r);
    if (rc == 0)
        *used_p = used0 == KVP__EC_PATH_UCX ? "ucx" : used0 == KVP__EC_PATH_TCP ? "tcp" : "none";
    return rc;
}
