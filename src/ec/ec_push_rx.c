/*
 * The EC push receiver (ec_push.h): one thread, one epoll set holding the
 * data port's listener, its connections, a wake-up eventfd and, when UCX is
 * offered, the UCX worker's event fd.
 *
 * A connection carries one write at a time (the producer waits for the
 * status before it sends the next header), and runs this machine
 * (conn_set_state rejects every other transition):
 *
 *   HEADER  reading a frame head and the write header (net/lane.h reader;
 *           the buffer holds at most KVP__EC_PUSH_WRITE_MAX header bytes, so
 *           a peer cannot make it grow)
 *             -> DATA    the header decoded, the range inside the slab and
 *                        accepted by check(): the reader's destination is
 *                        the slot itself, slab + offset (no bounce buffer)
 *             -> STATUS  a zero-length write (OK), or a refusal: bad header,
 *                        other version, out of bounds, refused by check() --
 *                        decided before any byte of data is read, the
 *                        connection closing after the status
 *   DATA    recv straight into the slot      -> STATUS (OK, last byte landed)
 *   STATUS  writing the 36-byte status frame -> HEADER (OK) or DRAIN
 *   DRAIN   after an error status: our side shut for writing (FIN after
 *           the status), whatever the peer still sends read and dropped
 *           until its EOF, for at most DRAIN_MS -> CLOSED.  (Closing with
 *           unread bytes would send a reset, and a reset can make the peer
 *           lose the status it has not read yet.)
 *   CLOSED  (terminal; the slot is freed at once)
 *
 * Every state may go to CLOSED: EOF, a read error, or idle_ms without a byte
 * either way (a peer that sends nothing, or stops mid-header or mid-data).
 * A connection beyond max_conns is answered KVP_ERR_BUSY and closed at
 * accept.  Peer-caused events log at most a line a second per call site.
 *
 * UCX: puts into a UCX-allocated slab over shared memory (or RDMA) are
 * one-sided and need nothing from this thread; emulated puts (a borrowed
 * slab, UCX's tcp) need the target worker progressed, so the worker's event
 * fd sits in the same epoll set and the thread progresses and re-arms it
 * whenever it fires.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/thread.h"
#include "ec/ec_push.h"
#include "ec/ec_push_ucx.h"
#include "ec/ec_push_wire.h"
#include "net/lane.h"

typedef enum conn_state {
    C_HEADER, /* reading a frame head and write header */
    C_DATA,   /* receiving the data into the slot */
    C_STATUS, /* writing the status frame */
    C_DRAIN,  /* error status written: dropping input until EOF */
    C_CLOSED, /* closed; freed */
    C_NUM
} conn_state_t;

static const unsigned conn_next[C_NUM] = {
    [C_HEADER] = 1u << C_DATA | 1u << C_STATUS | 1u << C_CLOSED,
    [C_DATA] = 1u << C_STATUS | 1u << C_CLOSED,
    [C_STATUS] = 1u << C_HEADER | 1u << C_DRAIN | 1u << C_CLOSED,
    [C_DRAIN] = 1u << C_CLOSED,
    [C_CLOSED] = 0,
};

typedef struct conn {
    int fd;
    conn_state_t state;
    kvp__lane_rx_t rd;        /* HEADER, DATA */
    ucp_dt_iov_t dst;         /* DATA: the slot */
    uint8_t status[KVP__EC_PUSH_STATUS_LEN];
    kvp__lane_tx_t wr;        /* STATUS */
    bool close_after;         /* STATUS: an error status; close once written */
    uint64_t last_ns;         /* last byte either way */
    uint64_t drain_until_ns;  /* DRAIN: closed by then whatever comes */
    struct conn *prev, *next; /* the receiver's list */
} conn_t;

/* epoll data tags for the fixed sources (connections carry their conn_t*). */
static char tag_listen, tag_wake, tag_ucx;

struct kvp__ec_push_rx {
    kvp__ec_push_rx_params_t p;
    char host[KVP__EC_HOST_MAX + 1];
    uint16_t port;
    uint8_t *slab;
    enum { SLAB_BORROWED, SLAB_UCX, SLAB_MMAP } slab_kind;
    int listen_fd, epfd, wake_fd;
    pthread_t thread;
    bool started;
    conn_t *conns;            /* the thread's only */
    size_t nconns;
    kvp__ec_ucx_t ucx;        /* ctx NULL: no UCX */
    ucp_mem_h mem;            /* the slab's mapping */
    bool ucx_offered;
    char *session;            /* kvp__strdup'ed */
    struct {
        _Atomic uint64_t conns_open, conns_total, conns_refused, conns_idle_closed;
        _Atomic uint64_t writes, bytes, bad_headers, out_of_bounds;
    } st;
};

#define DRAIN_MS 1000

#define STAT_ADD(rx, f, n) atomic_fetch_add_explicit(&(rx)->st.f, (n), memory_order_relaxed)

static void conn_set_state(conn_t *c, conn_state_t to)
{
    if (!(conn_next[c->state] & 1u << to)) {
        kvp_error("ec push rx: connection state %d -> %d is not in the table", c->state, to);
        to = C_CLOSED;
    }
    c->state = to;
}

static void conn_close(kvp__ec_push_rx_t *rx, conn_t *c)
{
    conn_set_state(c, C_CLOSED);
    epoll_ctl(rx->epfd, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    kvp__lane_rx_free(&c->rd);
    if (c->prev)
        c->prev->next = c->next;
    else
        rx->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    rx->nconns--;
    STAT_ADD(rx, conns_open, (uint64_t)-1);
    kvp__free(c, sizeof *c);
}

static void want_out(kvp__ec_push_rx_t *rx, conn_t *c, bool out)
{
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0), .data.ptr = c};
    epoll_ctl(rx->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Starts the status frame; the connection closes after it unless OK. */
static void begin_status(conn_t *c, kvp_status_t st, uint64_t landed)
{
    kvp__ec_push_status_encode(c->status, st, landed);
    kvp__lane_tx_init(&c->wr, c->status, KVP__EC_PUSH_STATUS_LEN, NULL, 0);
    c->close_after = st != KVP_OK;
    conn_set_state(c, C_STATUS);
}

/* A header is in: decide, before a byte of data moves. */
static void on_frame(kvp__ec_push_rx_t *rx, conn_t *c)
{
    kvp__ec_push_write_hdr_t h;
    kvp_status_t st = kvp__ec_push_write_decode(kvp__lane_rx_header(&c->rd), c->rd.hdr_len, c->rd.data_len, &h);
    if (st != KVP_OK) {
        STAT_ADD(rx, bad_headers, 1);
        kvp_warn_rl("ec push rx: bad write header (%s): closing the connection", kvp_status_str(st));
        begin_status(c, st, 0);
        return;
    }
    if (h.offset > rx->p.slab_size || h.length > rx->p.slab_size - h.offset ||
        (st = rx->p.check(rx->p.check_ctx, h.offset, h.length, h.rid)) != KVP_OK) {
        STAT_ADD(rx, out_of_bounds, 1);
        kvp_warn_rl("ec push rx: write of %llu bytes at offset %llu (reservation '%s') refused: not in a "
                    "reservation being written",
                    (unsigned long long)h.length, (unsigned long long)h.offset, h.rid);
        begin_status(c, KVP_ERR_INVALID_ARG, 0);
        return;
    }
    if (h.length == 0) {
        STAT_ADD(rx, writes, 1);
        begin_status(c, KVP_OK, 0);
        return;
    }
    c->dst = (ucp_dt_iov_t){rx->slab + h.offset, (size_t)h.length};
    kvp__lane_rx_into(&c->rd, &c->dst, 1);
    conn_set_state(c, C_DATA);
}

/* Writes what it can of the status; 0 (keep the connection), -1 (close it). */
static int drive_status(kvp__ec_push_rx_t *rx, conn_t *c)
{
    int w = kvp__lane_tx_write(&c->wr, c->fd);
    if (w < 0)
        return -1;
    if (w == 0) {
        want_out(rx, c, true);
        return 0;
    }
    want_out(rx, c, false);
    if (c->close_after) {
        shutdown(c->fd, SHUT_WR);
        c->drain_until_ns = kvp__now_ns() + DRAIN_MS * 1000000ull;
        conn_set_state(c, C_DRAIN);
        return 0;
    }
    kvp__lane_rx_reset(&c->rd);
    conn_set_state(c, C_HEADER);
    return 0;
}

/* The one driver: runs the machine as far as the socket allows.  0, or -1
 * (close it). */
static int drive(kvp__ec_push_rx_t *rx, conn_t *c)
{
    for (int rounds = 0; rounds < 64; rounds++) {
        if (c->state == C_STATUS)
            return drive_status(rx, c);
        if (c->state == C_DRAIN) {
            static __thread uint8_t sink[65536];
            ssize_t k = recv(c->fd, sink, sizeof sink, MSG_DONTWAIT);
            if (k > 0)
                continue;
            return k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
        }
        kvp__lane_ev_t ev = kvp__lane_rx_step(&c->rd, c->fd);
        switch (ev) {
        case KVP_LANE_AGAIN: return 0;
        case KVP_LANE_PROGRESS: c->last_ns = kvp__now_ns(); break;
        case KVP_LANE_HEAD_IN:
            c->last_ns = kvp__now_ns();
            if (c->rd.hdr_len > KVP__EC_PUSH_WRITE_MAX) {
                STAT_ADD(rx, bad_headers, 1);
                kvp_warn_rl("ec push rx: write header of %u bytes: closing the connection", c->rd.hdr_len);
                begin_status(c, KVP_ERR_PROTOCOL, 0);
            }
            break;
        case KVP_LANE_FRAME:
            c->last_ns = kvp__now_ns();
            on_frame(rx, c);
            break;
        case KVP_LANE_DATA_IN:
            c->last_ns = kvp__now_ns();
            STAT_ADD(rx, writes, 1);
            STAT_ADD(rx, bytes, c->rd.data_len);
            begin_status(c, KVP_OK, c->rd.data_len);
            break;
        case KVP_LANE_BAD:
            STAT_ADD(rx, bad_headers, 1);
            kvp_warn_rl("ec push rx: malformed frame: closing the connection");
            begin_status(c, KVP_ERR_PROTOCOL, 0);
            break;
        case KVP_LANE_EOF:
            if (!kvp__lane_rx_idle(&c->rd))
                kvp_info_rl("ec push rx: peer closed mid-write");
            return -1;
        case KVP_LANE_ERROR: return -1;
        }
    }
    return 0; /* fairness: come back on the next round (level-triggered) */
}

static void on_accept(kvp__ec_push_rx_t *rx)
{
    for (;;) {
        int fd = accept4(rx->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        STAT_ADD(rx, conns_total, 1);
        if (rx->nconns >= rx->p.max_conns) {
            STAT_ADD(rx, conns_refused, 1);
            kvp_warn_rl("ec push rx: %zu connections open (max_conns): refusing one", rx->nconns);
            uint8_t frame[KVP_LANE_HEAD + KVP__EC_PUSH_STATUS_LEN];
            kvp__lane_head_encode(frame, KVP__EC_PUSH_STATUS_LEN, 0);
            kvp__ec_push_status_encode(frame + KVP_LANE_HEAD, KVP_ERR_BUSY, 0);
            ssize_t k = send(fd, frame, sizeof frame, MSG_DONTWAIT | MSG_NOSIGNAL);
            (void)k;
            close(fd);
            continue;
        }
        conn_t *c = kvp__calloc(1, sizeof *c);
        if (!c || kvp__lane_rx_init(&c->rd, KVP_LANE_HEAD + KVP__EC_PUSH_WRITE_MAX, NULL, 0) != 0) {
            if (c)
                kvp__free(c, sizeof *c);
            close(fd);
            continue;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->fd = fd;
        c->state = C_HEADER;
        c->last_ns = kvp__now_ns();
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(rx->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
            kvp__lane_rx_free(&c->rd);
            kvp__free(c, sizeof *c);
            close(fd);
            continue;
        }
        c->next = rx->conns;
        if (rx->conns)
            rx->conns->prev = c;
        rx->conns = c;
        rx->nconns++;
        STAT_ADD(rx, conns_open, 1);
    }
}

static void reap_idle(kvp__ec_push_rx_t *rx, uint64_t now)
{
    uint64_t idle_ns = (uint64_t)rx->p.idle_ms * 1000000ull;
    for (conn_t *c = rx->conns, *n; c; c = n) {
        n = c->next;
        if (c->state == C_DRAIN ? now > c->drain_until_ns : now - c->last_ns > idle_ns) {
            if (c->state != C_DRAIN)
                STAT_ADD(rx, conns_idle_closed, 1);
            kvp_info_rl("ec push rx: connection idle for %lld ms: closing it", (long long)rx->p.idle_ms);
            conn_close(rx, c);
        }
    }
}

/* Progresses the UCX worker until it can be armed; 1 if it could not be
 * armed (poll again soon). */
static int ucx_progress(kvp__ec_push_rx_t *rx)
{
    for (int i = 0; i < 1000; i++) {
        while (ucp_worker_progress(rx->ucx.worker))
            ;
        ucs_status_t st = ucp_worker_arm(rx->ucx.worker);
        if (st == UCS_OK)
            return 0;
        if (st != UCS_ERR_BUSY)
            return 1;
    }
    return 1;
}

static void *rx_thread(void *arg)
{
    kvp__ec_push_rx_t *rx = arg;
    kvp__thread_name("kvp-ec-push-rx");
    int ucx_busy = rx->ucx_offered ? ucx_progress(rx) : 0;
    uint64_t next_reap = kvp__now_ns();
    int tick = rx->p.idle_ms < 400 ? (int)(rx->p.idle_ms / 4 + 1) : 100;
    for (;;) {
        struct epoll_event evs[64];
        int n = epoll_wait(rx->epfd, evs, 64, ucx_busy ? 0 : tick);
        bool stop = false, ucx_ev = false;
        for (int i = 0; i < n; i++) {
            void *tag = evs[i].data.ptr;
            if (tag == &tag_wake) {
                stop = true;
            } else if (tag == &tag_listen) {
                on_accept(rx);
            } else if (tag == &tag_ucx) {
                ucx_ev = true;
            } else {
                conn_t *c = tag;
                if (drive(rx, c) != 0)
                    conn_close(rx, c);
            }
        }
        if (stop)
            break;
        if (rx->ucx_offered && (ucx_ev || ucx_busy))
            ucx_busy = ucx_progress(rx);
        uint64_t now = kvp__now_ns();
        if (now >= next_reap) {
            reap_idle(rx, now);
            next_reap = now + (uint64_t)tick * 1000000ull;
        }
    }
    return NULL;
}

static kvp_status_t start_listener(kvp__ec_push_rx_t *rx)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(rx->p.host, NULL, &hints, &ai) != 0 || !ai) {
        kvp_error("ec push rx: cannot resolve host '%s'", rx->p.host);
        return KVP_ERR_INVALID_ARG;
    }
    struct sockaddr_in sa = *(struct sockaddr_in *)ai->ai_addr;
    freeaddrinfo(ai);
    sa.sin_port = htons(rx->p.port);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 256) != 0) {
        kvp_error("ec push rx: cannot listen on %s:%u: %s", rx->p.host, rx->p.port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return KVP_ERR_IO;
    }
    socklen_t sl = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &sl);
    rx->port = ntohs(sa.sin_port);
    inet_ntop(AF_INET, &sa.sin_addr, rx->host, sizeof rx->host);
    rx->listen_fd = fd;
    return KVP_OK;
}

/* The slab: the caller's, or UCX shared memory (one-sided puts), or
 * anonymous memory. */
static kvp_status_t setup_slab(kvp__ec_push_rx_t *rx)
{
    if (rx->p.slab) {
        rx->slab = rx->p.slab;
        if (rx->ucx.ctx) {
            ucp_mem_map_params_t mp = {
                .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                .address = rx->slab,
                .length = rx->p.slab_size,
            };
            if (ucp_mem_map(rx->ucx.ctx, &mp, &rx->mem) != UCS_OK)
                rx->mem = NULL;
        }
        return KVP_OK;
    }
    if (rx->ucx.ctx && (rx->ucx.shm || rx->ucx.rdma)) {
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                          UCP_MEM_MAP_PARAM_FIELD_FLAGS,
            .address = NULL,
            .length = rx->p.slab_size,
            .flags = UCP_MEM_MAP_ALLOCATE,
        };
        ucp_mem_attr_t at = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
        if (ucp_mem_map(rx->ucx.ctx, &mp, &rx->mem) == UCS_OK) {
            if (ucp_mem_query(rx->mem, &at) == UCS_OK && at.length >= rx->p.slab_size) {
                /* Allocate every page now: a producer's first write into a
                 * page of the shared segment would otherwise take the fault
                 * and zero it inside the push (about 1 ms per 4 MiB). */
                (void)madvise(at.address, at.length, MADV_POPULATE_WRITE);
                rx->slab = at.address;
                rx->slab_kind = SLAB_UCX;
                return KVP_OK;
            }
            ucp_mem_unmap(rx->ucx.ctx, rx->mem);
            rx->mem = NULL;
        }
        kvp_warn("ec push rx: UCX could not allocate a %llu-byte slab; using anonymous memory (RMA puts "
                 "would be emulated: UCX not offered)", (unsigned long long)rx->p.slab_size);
    }
    void *p = mmap(NULL, rx->p.slab_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return KVP_ERR_NO_MEMORY;
    (void)madvise(p, rx->p.slab_size, MADV_HUGEPAGE);
    rx->slab = p;
    rx->slab_kind = SLAB_MMAP;
    if (rx->ucx.ctx && rx->p.ucx_force) {
        ucp_mem_map_params_t mp = {
            .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            .address = rx->slab,
            .length = rx->p.slab_size,
        };
        if (ucp_mem_map(rx->ucx.ctx, &mp, &rx->mem) != UCS_OK)
            rx->mem = NULL;
    }
    return KVP_OK;
}

/* Decides whether UCX is offered and builds the session string. */
static kvp_status_t build_session(kvp__ec_push_rx_t *rx)
{
    kvp__ec_session_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    if (rx->p.paths & KVP__EC_PATH_TCP) {
        const char *adv = rx->p.advertise_host && rx->p.advertise_host[0] ? rx->p.advertise_host : rx->host;
        snprintf(s->host, sizeof s->host, "%s", adv);
        s->port = rx->port;
    }
    s->base = (uint64_t)(uintptr_t)rx->slab;
    s->size = rx->p.slab_size;
    bool one_sided = rx->mem && (rx->ucx.rdma || (rx->slab_kind == SLAB_UCX && rx->ucx.shm));
    if (rx->mem && (one_sided || rx->p.ucx_force)) {
        ucp_address_t *addr = NULL;
        size_t alen = 0;
        void *rk = NULL;
        size_t rklen = 0;
        if (ucp_worker_get_address(rx->ucx.worker, &addr, &alen) == UCS_OK) {
            if (ucp_rkey_pack(rx->ucx.ctx, rx->mem, &rk, &rklen) == UCS_OK) {
                if (alen <= sizeof s->ucx_addr && rklen <= sizeof s->rkey && alen && rklen) {
                    memcpy(s->ucx_addr, addr, alen);
                    s->ucx_addr_len = alen;
                    memcpy(s->rkey, rk, rklen);
                    s->rkey_len = rklen;
                    rx->ucx_offered = true;
                }
                ucp_rkey_buffer_release(rk);
            }
            ucp_worker_release_address(rx->ucx.worker, addr);
        }
    }
    kvp_status_t st = KVP_OK;
    char *buf = kvp__malloc(KVP__EC_SESSION_MAX + 1);
    size_t n = buf ? kvp__ec_session_encode(s, buf, KVP__EC_SESSION_MAX + 1) : 0;
    if (!buf)
        st = KVP_ERR_NO_MEMORY;
    else if (n == 0)
        st = KVP_ERR_INVALID_ARG; /* no path at all */
    else if (!(rx->session = kvp__strdup(buf)))
        st = KVP_ERR_NO_MEMORY;
    if (buf)
        kvp__free(buf, KVP__EC_SESSION_MAX + 1);
    kvp__free(s, sizeof *s);
    return st;
}

kvp_status_t kvp__ec_push_rx_create(const kvp__ec_push_rx_params_t *p, kvp__ec_push_rx_t **rx_p)
{
    if (!p || !rx_p || !p->host || !p->slab_size || !p->check || !(p->paths & (KVP__EC_PATH_TCP | KVP__EC_PATH_UCX)) ||
        p->idle_ms < 0)
        return KVP_ERR_INVALID_ARG;
    kvp__ec_push_rx_t *rx = kvp__calloc(1, sizeof *rx);
    if (!rx)
        return KVP_ERR_NO_MEMORY;
    rx->p = *p;
    if (!rx->p.max_conns)
        rx->p.max_conns = 64;
    if (!rx->p.idle_ms)
        rx->p.idle_ms = 30000;
    rx->listen_fd = rx->epfd = rx->wake_fd = -1;
    kvp_status_t st = KVP_OK;
    if ((p->paths & KVP__EC_PATH_TCP) && (st = start_listener(rx)) != KVP_OK)
        goto fail;
    if (p->paths & KVP__EC_PATH_UCX)
        (void)kvp__ec_ucx_open("ec push rx", p->ucx_force, &rx->ucx); /* logged; TCP serves without it */
    if ((st = setup_slab(rx)) != KVP_OK || (st = build_session(rx)) != KVP_OK)
        goto fail;
    rx->epfd = epoll_create1(EPOLL_CLOEXEC);
    rx->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (rx->epfd < 0 || rx->wake_fd < 0) {
        st = KVP_ERR_IO;
        goto fail;
    }
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &tag_wake};
    epoll_ctl(rx->epfd, EPOLL_CTL_ADD, rx->wake_fd, &ev);
    if (rx->listen_fd >= 0) {
        ev.data.ptr = &tag_listen;
        epoll_ctl(rx->epfd, EPOLL_CTL_ADD, rx->listen_fd, &ev);
    }
    int efd = -1;
    if (rx->ucx_offered && ucp_worker_get_efd(rx->ucx.worker, &efd) == UCS_OK) {
        ev.data.ptr = &tag_ucx;
        epoll_ctl(rx->epfd, EPOLL_CTL_ADD, efd, &ev);
    }
    if (pthread_create(&rx->thread, NULL, rx_thread, rx) != 0) {
        st = KVP_ERR_IO;
        goto fail;
    }
    rx->started = true;
    kvp_info("ec push rx: session %.120s%s", rx->session, strlen(rx->session) > 120 ? "..." : "");
    *rx_p = rx;
    return KVP_OK;
fail:
    kvp__ec_push_rx_destroy(rx);
    return st;
}

void kvp__ec_push_rx_destroy(kvp__ec_push_rx_t *rx)
{
    if (!rx)
        return;
    if (rx->started) {
        uint64_t one = 1;
        ssize_t k = write(rx->wake_fd, &one, sizeof one);
        (void)k;
        pthread_join(rx->thread, NULL);
    }
    while (rx->conns)
        conn_close(rx, rx->conns);
    if (rx->epfd >= 0)
        close(rx->epfd);
    if (rx->wake_fd >= 0)
        close(rx->wake_fd);
    if (rx->listen_fd >= 0)
        close(rx->listen_fd);
    if (rx->mem)
        ucp_mem_unmap(rx->ucx.ctx, rx->mem); /* frees a SLAB_UCX slab */
    if (rx->slab_kind == SLAB_MMAP)
        munmap(rx->slab, rx->p.slab_size);
    kvp__ec_ucx_close(&rx->ucx);
    kvp__strfree(rx->session);
    kvp__free(rx, sizeof *rx);
}

uint8_t *kvp__ec_push_rx_slab(const kvp__ec_push_rx_t *rx) { return rx->slab; }
const char *kvp__ec_push_rx_session(const kvp__ec_push_rx_t *rx) { return rx->session; }
uint16_t kvp__ec_push_rx_port(const kvp__ec_push_rx_t *rx) { return rx->port; }

void kvp__ec_push_rx_stats(kvp__ec_push_rx_t *rx, kvp__ec_push_rx_stats_t *st)
{
    st->conns_open = atomic_load(&rx->st.conns_open);
    st->conns_total = atomic_load(&rx->st.conns_total);
    st->conns_refused = atomic_load(&rx->st.conns_refused);
    st->conns_idle_closed = atomic_load(&rx->st.conns_idle_closed);
    st->writes = atomic_load(&rx->st.writes);
    st->bytes = atomic_load(&rx->st.bytes);
    st->bad_headers = atomic_load(&rx->st.bad_headers);
    st->out_of_bounds = atomic_load(&rx->st.out_of_bounds);
}
