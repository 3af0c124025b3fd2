/*
 * The server's event loop, start-up and shutdown.
 *
 * Everything runs on one thread: the UCX worker's callbacks (request AMs,
 * receive and send completions) and the loop that sleeps on the worker's
 * event fd, the sockets, a signalfd and a 1 s timer (deadlines).  The files
 * beside this one hold the rest (server_int.h lists them).
 *
 * Start-up refuses what cannot work or is unsafe: an arena larger than the
 * machine's (or the cgroup's) memory, which the kernel would kill us for
 * while prefaulting; a listener on a network address without a token
 * (unless --insecure); a descriptor limit too low for the connections
 * (the soft limit is raised to the hard one, max_conns clamped below it).
 */
#include "server/server.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/units.h"
#include "net/ucx.h"
#include "server/server_int.h"

#define FD_RESERVE 256u /* descriptors kept for handshakes, metrics, UCX, the loop */

/* ---- start-up checks ---- */

/* The memory this process may use: the machine's, or its cgroup's limit
 * if lower; *what_p says which.  0 if unknown. */
static uint64_t memory_limit(const char **what_p)
{
    uint64_t total = 0, lim = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
                total = (uint64_t)kb * 1024u;
        fclose(f);
    }
    *what_p = "this machine's memory";
    /* cgroup v2 ("0::/path") or v1 ("N:memory:/path") */
    f = fopen("/proc/self/cgroup", "r");
    char path[700] = "";
    int v1 = 0;
    if (f) {
        char line[600];
        while (fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            if (!strncmp(line, "0::", 3) && !path[0])
                snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
            char *m = strstr(line, ":memory:");
            if (m) {
                snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", m + 8);
                v1 = 1;
            }
        }
        fclose(f);
    }
    f = path[0] ? fopen(path, "r") : NULL;
    if (f) {
        char buf[64];
        unsigned long long v;
        if (fgets(buf, sizeof buf, f) && sscanf(buf, "%llu", &v) == 1 && (!v1 || v < (1ull << 60)))
            lim = v;
        fclose(f);
    }
    if (lim && (!total || lim < total)) {
        *what_p = "the memory this process's cgroup may use";
        return lim;
    }
    return total;
}

static int is_loopback(const char *host)
{
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* Raises the descriptor limit as far as allowed; returns the soft limit. */
static uint64_t raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1024;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    return rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : (uint64_t)rl.rlim_cur;
}

static kvp_status_t check_params(server_t *s)
{
    const kvp__server_params_t *p = &s->p;
    if (!is_loopback(p->host) && !p->token && !p->insecure) {
        kvp_error("server: --listen %s is not a loopback address: a token is required (--token-file), or "
                  "--insecure for a network you trust with every key and value",
                  p->host);
        return KVP_ERR_BAD_CONFIG;
    }
    const char *what;
    uint64_t lim = memory_limit(&what);
    if (lim && p->memory > lim) {
        char want[32], have[32];
        kvp__format_size(p->memory, want, sizeof want);
        kvp__format_size(lim, have, sizeof have);
        kvp_error("server: --memory %s is more than %s (%s)", want, what, have);
        return KVP_ERR_BAD_CONFIG;
    }
    uint64_t nofile = raise_nofile();
    uint32_t want = p->max_conns ? p->max_conns : 1024;
    uint64_t room = nofile > FD_RESERVE + 16 ? nofile - FD_RESERVE : 16;
    s->max_conns = want <= room ? want : (uint32_t)room;
    if (s->max_conns < want)
        kvp_warn("server: %llu file descriptors allowed: at most %u connections (not %u)", (unsigned long long)nofile,
                 s->max_conns, want);
    s->max_per_source = p->max_conns_per_source ? p->max_conns_per_source : (s->max_conns + 1) / 2;
    return KVP_OK;
}

/* ---- the loop ---- */

void kvp__listen_pause(server_t *s, uint64_t until_ns)
{
    if (!s->listen_paused)
        epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->listen_src.fd, NULL);
    s->listen_paused = 1;
    s->listen_resume_ns = until_ns;
}

static void listen_resume(server_t *s)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->listen_src};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_src.fd, &ev);
    s->listen_paused = 0;
}

static kvp_status_t start_listener(server_t *s)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(s->p.port)};
    if (inet_pton(AF_INET, s->p.host, &sa.sin_addr) != 1) {
        kvp_error("server: --listen host '%s' is not an IPv4 address", s->p.host);
        return KVP_ERR_INVALID_ARG;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 1024) != 0) {
        kvp_error("server: cannot listen on %s:%u: %s", s->p.host, s->p.port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return KVP_ERR_IO;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    s->p.port = ntohs(sa.sin_port);
    s->listen_src = (evsrc_t){SRC_LISTEN, fd};
    kvp_info("server: listening on %s:%u", s->p.host, s->p.port);
    return KVP_OK;
}

/* Writes a port to a file atomically (a temporary renamed over it): a
 * reader never sees a partial number. */
static void write_port(const char *path, uint16_t port)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (f) {
        fprintf(f, "%u\n", port);
        fclose(f);
        rename(tmp, path);
    }
}

/* Writes the metrics port to --metrics-port-file, then the bound port to
 * --port-file, once everything the server serves is up: the port file's
 * appearance means ready. */
static void write_port_files(const server_t *s)
{
    if (s->metrics && s->p.metrics_port_file)
        write_port(s->p.metrics_port_file, kvp__metrics_port(s->metrics));
    if (s->p.port_file)
        write_port(s->p.port_file, s->p.port);
}

static void add_fd(server_t *s, evsrc_t *src, src_kind_t kind, int fd)
{
    *src = (evsrc_t){kind, fd};
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = src};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev);
}

static void on_signal(server_t *s)
{
    struct signalfd_siginfo si;
    while (read(s->signal_src.fd, &si, sizeof si) == sizeof si) {
        if (si.ssi_signo == SIGUSR2) { /* operator: replace the UCX worker */
            s->rebuild = 1;
            continue;
        }
        if (!s->draining) {
            kvp_info("server: signal %u: finishing %llu request(s) in flight, refusing new ones", si.ssi_signo,
                     (unsigned long long)s->inflight);
            s->drain_deadline_ns = kvp__now_ns() + DRAIN_MAX_NS;
        }
        s->draining = 1;
    }
}

/* Gives the current worker its request handler and address, and (once the
 * event loop exists) a place in it. */
static kvp_status_t worker_setup(server_t *s)
{
    if (kvp__ucx_am_handler(s->worker, KVP_AM_REQUEST, kvp__on_request, s) != UCS_OK ||
        ucp_worker_get_address(s->worker, &s->addr, &s->addr_len) != UCS_OK) {
        kvp_error("server: cannot set up the UCX worker");
        return KVP_ERR_IO;
    }
    if (s->epfd >= 0) {
        int wfd = -1;
        ucp_worker_get_efd(s->worker, &wfd);
        add_fd(s, &s->worker_src, SRC_WORKER, wfd);
    }
    return KVP_OK;
}

/* The worker has had events for a while that its progress cannot take: a
 * client killed in the middle of writing a message into the server's
 * shared-memory FIFO leaves a slot that is never completed, and every
 * message behind it, from every client, waits forever.  The only way out is
 * a new worker: its UCX connections are closed (those clients see the
 * connection lost and reconnect to the new worker's address), connections
 * on kvpool's TCP transport are not touched.  Whatever UCX still held for
 * the old worker (transfers to dead peers, endpoints that never flushed)
 * goes with it. */
static void worker_rebuild(server_t *s, int stuck)
{
    if (stuck)
        kvp_error("server: UCX worker stuck (events it cannot progress for %llu ms, likely a client killed "
                  "mid-message); replacing it, UCX clients reconnect",
                  (unsigned long long)(WEDGE_NS / 1000000ull));
    atomic_fetch_add(&s->ctr.worker_rebuilds, 1);
    KVP_LIST_FOR_EACH(n, &s->conns) {
        conn_t *c = KVP_CONTAINER_OF(n, conn_t, link);
        if (c->lane)
            continue;
        if (c->state == CONN_READY)
            kvp__conn_kill(s, c, "UCX worker replaced");
        c->ep = NULL;           /* (goes with the worker) */
        kvp__conn_abandon(s, c); /* their transfers die with the worker */
    }
    epoll_ctl(s->epfd, EPOLL_CTL_DEL, s->worker_src.fd, NULL);
    ucp_worker_release_address(s->worker, s->addr);
    s->addr = NULL;
    ucp_worker_destroy(s->worker);
    s->worker = NULL;
    kvp__abandoned_free(s);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(s->ctx, &wp, &s->worker) != UCS_OK || worker_setup(s) != KVP_OK) {
        kvp_error("server: cannot create a new UCX worker; stopping");
        s->draining = 1;
        s->stop = 1;
    }
}

/* How long a client takes to copy bytes out of the arena: at 4 GB/s (a
 * slow single-core copy), never counted past 1 ms. */
static uint64_t copy_ns(uint64_t bytes)
{
    uint64_t ns = bytes / 4u;
    return ns < 1000000u ? ns : 1000000u;
}

static void loop(server_t *s)
{
    uint64_t spin_until = 0;
    kvp__ucx_armer_t armer = {0};
    for (;;) {
        if (s->stop)
            return;
        if (s->rebuild) {
            s->rebuild = 0;
            kvp_warn("server: SIGUSR2: replacing the UCX worker");
            worker_rebuild(s, 0);
            continue;
        }
        int did = 0;
        while (ucp_worker_progress(s->worker))
            did = 1;
        uint64_t now = kvp__now_ns();
        if (s->listen_paused && now >= s->listen_resume_ns)
            listen_resume(s);
        /* Keep polling 50 us after activity: lower latency.  After
         * answering local reads, for as long as their clients take to copy
         * the bytes as well: they send their next request (which releases
         * the leases) right after, and a sleeping server would add its
         * wake-up to every such get (docs/transport.md §9). */
        if (did)
            spin_until = now + SPIN_NS + copy_ns(s->local_replied);
        s->local_replied = 0;
        int timeout = now < spin_until ? 0 : (s->draining ? 10 : 1000);
        if (s->listen_paused && timeout) {
            uint64_t ms = (s->listen_resume_ns - now) / 1000000ull + 1;
            timeout = ms < (uint64_t)timeout ? (int)ms : timeout;
        }
        timeout = kvp__ucx_arm(s->worker, &armer, timeout, did, now, 0, WEDGE_NS);
        if (timeout < 0) {
            worker_rebuild(s, 1);
            continue;
        }
        struct epoll_event evs[16];
        int n = epoll_wait(s->epfd, evs, 16, timeout);
        int deadlines = 0;
        for (int i = 0; i < n; i++) {
            evsrc_t *src = evs[i].data.ptr;
            switch (src->kind) {
            case SRC_LISTEN: kvp__on_accept(s); break;
            case SRC_CONN: kvp__on_conn_event(s, (conn_t *)src, evs[i].events); break;
            case SRC_SIGNAL: on_signal(s); break;
            case SRC_TIMER: {
                uint64_t x;
                (void)!read(src->fd, &x, sizeof x);
                deadlines = 1;
                break;
            }
            case SRC_WORKER: break;
            }
        }
        /* Only now, the batch done: reaping frees connections, and a later
         * event of the same batch may name one. */
        if (deadlines)
            (void)kvp__store_reap(s->store);
        if (deadlines || n == 0 || s->draining)
            kvp__reap_conns(s, deadlines);
        if (s->draining && s->inflight == 0)
            return;
        if (s->draining && kvp__now_ns() > s->drain_deadline_ns) {
            /* Transfers with peers that stopped answering: do not wait forever. */
            kvp_warn("server: gave up on %llu request(s) after %llu s of draining (puts %llu, "
                     "replies %llu, headers %llu)",
                     (unsigned long long)s->inflight, (unsigned long long)(DRAIN_MAX_NS / 1000000000ull),
                     (unsigned long long)s->inflight_puts, (unsigned long long)s->inflight_replies,
                     (unsigned long long)s->inflight_in_data);
            return;
        }
    }
}

/* Does the worker reach any other process (a transport besides self)? */
static int reaches_peers(ucp_context_h ctx)
{
    char tls[512];
    snprintf(tls, sizeof tls, "%s", kvp__ucx_transports(ctx));
    char *save = NULL;
    for (char *t = strtok_r(tls, " ", &save); t; t = strtok_r(NULL, " ", &save))
        if (strcmp(t, "self") != 0)
            return 1;
    return 0;
}

/* The metrics endpoint's page: the store's stats and the server's counters. */
static char *render_metrics(void *arg, size_t *len_p, size_t *cap_p)
{
    server_t *s = arg;
    return kvp__metrics_render(s->store, &s->ctr, len_p, cap_p);
}

kvp_status_t kvp__server_run(const kvp__server_params_t *params)
{
    kvp_status_t st;
    /* Block the stop signals before any thread exists (UCX starts some), so
     * every thread inherits the mask and they arrive only via the signalfd. */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &mask, NULL);
    signal(SIGPIPE, SIG_IGN);
    server_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    s->p = *params;
    s->epfd = -1;
    s->lr.fd = -1;
    kvp__conns_init(s);
    if ((st = check_params(s)) != KVP_OK) {
        kvp__free(s, sizeof *s);
        return st;
    }
    s->keys_buf = kvp__calloc(KVP_BATCH_MAX, sizeof *s->keys_buf);
    s->sizes_buf = kvp__calloc(KVP_BATCH_MAX, sizeof *s->sizes_buf);
    /* The sink for the bytes of keys a batch put does not store (they
     * existed): one address range as large as the largest value, reserved
     * but never backed until written, and never freed while the server
     * runs, so receives in flight can always write into it. */
    s->discard = mmap(NULL, KVP_VALUE_MAX, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (s->discard == MAP_FAILED)
        s->discard = NULL;
    if (!s->keys_buf || !s->sizes_buf || !s->discard) {
        st = KVP_ERR_NO_MEMORY;
        goto err_bufs;
    }
    kvp__store_params_t sp;
    kvp__store_params_default(&sp);
    sp.capacity = params->memory;
    /* Faulted in at start: a server's arena is its whole reason to exist,
     * and first-touch page faults on the put path cost more than the copy
     * itself.  A memfd, so that clients on this host can map it and copy
     * values out themselves (local reads; docs/transport.md §9); else
     * anonymous memory with transparent huge pages. */
    sp.mem_kind = params->no_local_reads ? KVP_MEM_ANON : KVP_MEM_MEMFD;
    sp.huge = KVP_HUGE_AUTO;
    sp.prefault = !params->no_prefault;
    if (params->put_timeout_ns)
        sp.put_timeout_ns = params->put_timeout_ns;
    st = kvp__store_create(&sp, &s->store);
    if (st != KVP_OK)
        goto err_bufs;
    uint64_t eighth = params->memory / 8;
    s->put_resv_max = eighth > (64ull << 20) ? eighth : (64ull << 20);
    s->stage_max = s->put_resv_max;
    s->hdr_max = 64ull << 20;
    if ((st = kvp__lr_init(s)) != KVP_OK)
        goto err_store;
    st = kvp__ucx_open("server", KVP_UCX_SERVER, &s->ctx, &s->worker);
    if (st != KVP_OK)
        goto err_lr;
    s->ucx_offered = reaches_peers(s->ctx);
    st = worker_setup(s);
    if (st != KVP_OK)
        goto err_ucx;
    s->epfd = epoll_create1(EPOLL_CLOEXEC);
    st = start_listener(s);
    if (st != KVP_OK)
        goto err_addr;
    if (params->metrics) {
        st = kvp__metrics_start(params->metrics_host ? params->metrics_host : params->host, params->metrics_port,
                                render_metrics, s, &s->metrics);
        if (st != KVP_OK)
            goto err_listener;
    }
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    struct itimerspec its = {{1, 0}, {1, 0}};
    timerfd_settime(tfd, 0, &its, NULL);
    int wfd = -1;
    ucp_worker_get_efd(s->worker, &wfd);
    add_fd(s, &s->signal_src, SRC_SIGNAL, sfd);
    add_fd(s, &s->timer_src, SRC_TIMER, tfd);
    add_fd(s, &s->worker_src, SRC_WORKER, wfd);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = &s->listen_src};
    epoll_ctl(s->epfd, EPOLL_CTL_ADD, s->listen_src.fd, &lev);
    write_port_files(s);
    kvp_info("server: ready (arena %llu bytes, UCX transports %s%s, token %s, local reads %s, at most %u "
             "connections)",
             (unsigned long long)params->memory, kvp__ucx_transports(s->ctx),
             s->ucx_offered ? "" : " (no UCX peers: kvpool's TCP transport only)", params->token ? "required" : "none",
             s->lr.fd >= 0 ? "on" : "off", s->max_conns);

    loop(s);

    kvp_info("server: stopped");
    close(tfd);
    close(sfd);
    kvp__conns_destroy(s);
    kvp__metrics_stop(s->metrics);
    st = KVP_OK;
err_listener:
    close(s->listen_src.fd);
err_addr:
    if (s->epfd >= 0)
        close(s->epfd);
    ucp_worker_release_address(s->worker, s->addr);
err_ucx:
    kvp__ucx_close(s->ctx, s->worker);
    /* The worker is gone, so no callback can still come for these. */
    kvp__abandoned_free(s);
err_lr:
    kvp__lr_destroy(s);
err_store:
    kvp__store_destroy(s->store);
err_bufs:
    if (s->discard)
        munmap(s->discard, KVP_VALUE_MAX);
    kvp__free(s->keys_buf, KVP_BATCH_MAX * sizeof *s->keys_buf);
    kvp__free(s->sizes_buf, KVP_BATCH_MAX * sizeof *s->sizes_buf);
    kvp__free(s, sizeof *s);
    return st;
}
