#include "net/handshake.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

static uint64_t be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

static void put_be(uint8_t *p, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

kvp_status_t kvp__hs_parse_hello(const uint8_t *buf, size_t len, kvp__hs_hello_t *h, size_t *used_p)
{
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, KVP_HS_MAGIC, m) != 0)
        return KVP_ERR_PROTOCOL;
    if (len < KVP_HS_HELLO_FIXED)
        return KVP_INPROGRESS;
    if (be(buf + 4, 2) != KVP_HS_VERSION)
        return KVP_ERR_VERSION;
    uint32_t tl = (uint32_t)be(buf + 6, 2), al = (uint32_t)be(buf + 8, 4);
    if (tl > KVP_HS_TOKEN_MAX || al > KVP_HS_ADDR_MAX)
        return KVP_ERR_PROTOCOL;
    size_t need = KVP_HS_HELLO_FIXED + (size_t)tl + al;
    if (len < need)
        return KVP_INPROGRESS;
    h->token = tl ? buf + KVP_HS_HELLO_FIXED : NULL;
    h->token_len = tl;
    h->addr = al ? buf + KVP_HS_HELLO_FIXED + tl : NULL;
    h->addr_len = al;
    *used_p = need;
    return KVP_OK;
}

size_t kvp__hs_encode_reply(uint8_t *out, kvp_status_t status, uint64_t conn_key, const void *addr,
                            uint32_t addr_len)
{
    memcpy(out, KVP_HS_MAGIC, 4);
    put_be(out + 4, KVP_HS_VERSION, 2);
    put_be(out + 6, (uint16_t)(int16_t)status, 2);
    put_be(out + 8, conn_key, 8);
    put_be(out + 16, addr_len, 4);
    if (addr_len)
        memcpy(out + KVP_HS_REPLY_FIXED, addr, addr_len);
    return KVP_HS_REPLY_FIXED + addr_len;
}

static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = kvp__now_ns();
        if (now >= deadline)
            return 0;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, (int)((deadline - now) / 1000000ull) + 1);
        if (rc > 0)
            return 1;
        if (rc < 0 && errno != EINTR)
            return -1;
    }
}

static kvp_status_t io_all(int fd, void *buf, size_t n, int writing, uint64_t deadline)
{
    char *p = buf;
    while (n) {
        ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return KVP_ERR_CONN_LOST;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KVP_ERR_CONN_LOST;
        int w = wait_fd(fd, writing ? POLLOUT : POLLIN, deadline);
        if (w == 0)
            return KVP_ERR_TIMEOUT;
        if (w < 0)
            return KVP_ERR_IO;
    }
    return KVP_OK;
}

kvp_status_t kvp__hs_client(const char *host, uint16_t port, const char *token, const void *addr,
                            uint32_t addr_len, uint32_t timeout_ms, int *fd_p, uint64_t *key_p,
                            void **srv_addr_p, uint32_t *srv_addr_len_p)
{
    uint64_t deadline = kvp__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    if (getaddrinfo(host, ps, &hints, &ai) != 0 || !ai) {
        kvp_error("connect: cannot resolve '%s'", host);
        return KVP_ERR_CONN_REFUSED;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        return KVP_ERR_IO;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    kvp_status_t st = KVP_OK;
    if (rc != 0 && errno != EINPROGRESS) {
        st = KVP_ERR_CONN_REFUSED;
    } else if (rc != 0) {
        int w = wait_fd(fd, POLLOUT, deadline);
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (w == 0)
            st = KVP_ERR_TIMEOUT;
        else if (w < 0 || err)
            st = KVP_ERR_CONN_REFUSED;
    }
    if (st != KVP_OK) {
        kvp_error("connect: %s:%u: %s", host, port, kvp_status_str(st));
        close(fd);
        return st;
    }
    uint32_t tl = token ? (uint32_t)strlen(token) : 0;
    size_t hl = KVP_HS_HELLO_FIXED + tl + addr_len;
    uint8_t *hello = kvp__malloc(hl);
    if (!hello) {
        close(fd);
        return KVP_ERR_NO_MEMORY;
    }
    memcpy(hello, KVP_HS_MAGIC, 4);
    put_be(hello + 4, KVP_HS_VERSION, 2);
    put_be(hello + 6, tl, 2);
    put_be(hello + 8, addr_len, 4);
    if (tl)
        memcpy(hello + KVP_HS_HELLO_FIXED, token, tl);
    if (addr_len)
        memcpy(hello + KVP_HS_HELLO_FIXED + tl, addr, addr_len);
    st = io_all(fd, hello, hl, 1, deadline);
    kvp__free(hello, hl);
    uint8_t fixed[KVP_HS_REPLY_FIXED];
    if (st == KVP_OK)
        st = io_all(fd, fixed, sizeof fixed, 0, deadline);
    if (st != KVP_OK) {
        kvp_error("connect: handshake with %s:%u: %s", host, port, kvp_status_str(st));
        close(fd);
        return st;
    }
    int16_t status = (int16_t)be(fixed + 6, 2);
    uint32_t al = (uint32_t)be(fixed + 16, 4);
    if (memcmp(fixed, KVP_HS_MAGIC, 4) != 0 || be(fixed + 4, 2) != KVP_HS_VERSION ||
        al > KVP_HS_ADDR_MAX || (status == KVP_OK && al == 0)) {
        kvp_error("connect: %s:%u is not a kvpool server (bad handshake reply)", host, port);
        close(fd);
        return KVP_ERR_PROTOCOL;
    }
    if (status != KVP_OK) {
        kvp_error("connect: %s:%u refused the connection: %s", host, port,
                  kvp_status_str((kvp_status_t)status));
        close(fd);
        return (kvp_status_t)status;
    }
    void *sa = kvp__malloc(al);
    if (!sa) {
        close(fd);
        return KVP_ERR_NO_MEMORY;
    }
    st = io_all(fd, sa, al, 0, deadline);
    if (st != KVP_OK) {
        kvp__free(sa, al);
        close(fd);
        return st;
    }
    *fd_p = fd;
    *key_p = be(fixed + 8, 8);
    *srv_addr_p = sa;
    *srv_addr_len_p = al;
    return KVP_OK;
}
