#include "net/handshake.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"

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

/* ---- codec (both sides) ---- */

/* Do buf's first bytes (up to 4) match the magic? */
static int magic_ok(const uint8_t *buf, size_t len)
{
    return memcmp(buf, KVP_HS_MAGIC, len < 4 ? len : 4) == 0;
}

kvp_status_t kvp__hs_parse_hello(const uint8_t *buf, size_t len, kvp__hs_hello_t *h, size_t *used_p)
{
    if (!magic_ok(buf, len))
        return KVP_ERR_PROTOCOL;
    if (len < 6)
        return KVP_INPROGRESS;
    memset(h, 0, sizeof *h);
    uint32_t ver = (uint32_t)be(buf + 4, 2);
    if (ver == KVP_HS_V2) {
        if (len < KVP_HS_HELLO_V2)
            return KVP_INPROGRESS;
        if (be(buf + 6, 2) != 0) /* no flags are defined */
            return KVP_ERR_PROTOCOL;
        h->version = KVP_HS_V2;
        memcpy(h->nonce, buf + 8, KVP_HS_NONCE);
        *used_p = KVP_HS_HELLO_V2;
        return KVP_OK;
    }
    if (ver != KVP_HS_V1)
        return KVP_ERR_VERSION;
    if (len < KVP_HS_V1_FIXED)
        return KVP_INPROGRESS;
    uint32_t tl = (uint32_t)be(buf + 6, 2), al = (uint32_t)be(buf + 8, 4);
    if (tl > KVP_HS_TOKEN_MAX || al > KVP_HS_ADDR_MAX)
        return KVP_ERR_PROTOCOL;
    if (len < KVP_HS_V1_FIXED + (size_t)tl)
        return KVP_INPROGRESS;
    h->version = KVP_HS_V1;
    h->token = tl ? buf + KVP_HS_V1_FIXED : NULL;
    h->token_len = tl;
    h->addr_len = al;
    *used_p = KVP_HS_V1_FIXED + tl;
    return KVP_OK;
}

kvp_status_t kvp__hs_parse_response(const uint8_t *buf, size_t len, kvp__hs_response_t *r, size_t *used_p)
{
    if (len < KVP_HS_RESPONSE)
        return len && buf[0] > KVP_HS_UCX ? KVP_ERR_PROTOCOL : KVP_INPROGRESS;
    if (buf[0] > KVP_HS_UCX || buf[1] != 0)
        return KVP_ERR_PROTOCOL;
    r->transport = buf[0];
    memcpy(r->mac, buf + 2, KVP_HS_MAC);
    *used_p = KVP_HS_RESPONSE;
    return KVP_OK;
}

/* A status from the peer: an error of the list, else a protocol error. */
static kvp_status_t peer_status(uint64_t v)
{
    int16_t st = (int16_t)v;
    if (st == KVP_OK)
        return KVP_OK;
    kvp_status_t s = (kvp_status_t)st;
    return st < 0 && st >= -1000 && strcmp(kvp_status_str(s), "unknown status") != 0 ? s : KVP_ERR_PROTOCOL;
}

kvp_status_t kvp__hs_parse_challenge(const uint8_t *buf, size_t len, kvp__hs_challenge_t *c, size_t *used_p)
{
    if (!magic_ok(buf, len))
        return KVP_ERR_PROTOCOL;
    if (len < 8)
        return KVP_INPROGRESS;
    if (be(buf + 4, 2) != KVP_HS_V2)
        return KVP_ERR_VERSION;
    memset(c, 0, sizeof *c);
    c->status = peer_status(be(buf + 6, 2));
    if (c->status != KVP_OK) {
        *used_p = 8;
        return KVP_OK;
    }
    if (len < KVP_HS_CHALLENGE)
        return KVP_INPROGRESS;
    c->offers = (uint32_t)be(buf + 8, 2);
    if (c->offers & ~(KVP_HS_OFFER_TOKEN | KVP_HS_OFFER_UCX))
        return KVP_ERR_PROTOCOL;
    c->uid = (uint32_t)be(buf + 10, 4);
    memcpy(c->nonce, buf + 14, KVP_HS_NONCE);
    *used_p = KVP_HS_CHALLENGE;
    return KVP_OK;
}

kvp_status_t kvp__hs_parse_reply(const uint8_t *buf, size_t len, kvp__hs_reply_t *r, size_t *used_p)
{
    if (!magic_ok(buf, len))
        return KVP_ERR_PROTOCOL;
    if (len < KVP_HS_REPLY_V2)
        return KVP_INPROGRESS;
    if (be(buf + 4, 2) != KVP_HS_V2)
        return KVP_ERR_PROTOCOL;
    r->status = peer_status(be(buf + 6, 2));
    r->conn_key = be(buf + 8, 8);
    memcpy(r->mac, buf + 16, KVP_HS_MAC);
    r->addr_len = (uint32_t)be(buf + 48, 4);
    if (r->addr_len > KVP_HS_ADDR_MAX)
        return KVP_ERR_PROTOCOL;
    *used_p = KVP_HS_REPLY_V2;
    return KVP_OK;
}

size_t kvp__hs_encode_challenge(uint8_t out[KVP_HS_CHALLENGE], kvp_status_t status, uint32_t offers, uint32_t uid,
                                const uint8_t nonce[KVP_HS_NONCE])
{
    memcpy(out, KVP_HS_MAGIC, 4);
    put_be(out + 4, KVP_HS_V2, 2);
    put_be(out + 6, (uint16_t)(int16_t)status, 2);
    put_be(out + 8, offers, 2);
    put_be(out + 10, uid, 4);
    memcpy(out + 14, nonce, KVP_HS_NONCE);
    return KVP_HS_CHALLENGE;
}

size_t kvp__hs_encode_reply(uint8_t *out, uint32_t version, kvp_status_t status, uint64_t conn_key,
                            const uint8_t *mac, const void *addr, uint32_t addr_len)
{
    memcpy(out, KVP_HS_MAGIC, 4);
    put_be(out + 4, version, 2);
    put_be(out + 6, (uint16_t)(int16_t)status, 2);
    put_be(out + 8, conn_key, 8);
    size_t off = 16;
    if (version == KVP_HS_V2) {
        if (mac)
            memcpy(out + off, mac, KVP_HS_MAC);
        else
            memset(out + off, 0, KVP_HS_MAC);
        off += KVP_HS_MAC;
    }
    put_be(out + off, addr_len, 4);
    off += 4;
    if (addr_len)
        memcpy(out + off, addr, addr_len);
    return off + addr_len;
}

static void mac(const char *token, const char *label, const uint8_t *a, const uint8_t *b, const uint8_t *c,
                size_t clen, uint8_t out[KVP_HS_MAC])
{
    memset(out, 0, KVP_HS_MAC);
    if (!token || !token[0])
        return;
    uint8_t msg[64];
    size_t ll = strlen(label), n = 0;
    memcpy(msg, label, ll);
    n += ll;
    memcpy(msg + n, a, KVP_HS_NONCE);
    n += KVP_HS_NONCE;
    memcpy(msg + n, b, KVP_HS_NONCE);
    n += KVP_HS_NONCE;
    if (clen) {
        memcpy(msg + n, c, clen);
        n += clen;
    }
    unsigned olen = 0;
    if (!HMAC(EVP_sha256(), token, (int)strlen(token), msg, n, out, &olen) || olen != KVP_HS_MAC) {
        /* (never here: a failed HMAC leaves a mac no peer computes) */
        kvp_error("handshake: HMAC-SHA256 failed");
        memset(out, 0xff, KVP_HS_MAC);
    }
}

void kvp__hs_client_mac(const char *token, const uint8_t snonce[KVP_HS_NONCE], const uint8_t cnonce[KVP_HS_NONCE],
                        uint8_t out[KVP_HS_MAC])
{
    mac(token, "kvpool-v2-client", snonce, cnonce, NULL, 0, out);
}

void kvp__hs_server_mac(const char *token, const uint8_t cnonce[KVP_HS_NONCE], const uint8_t snonce[KVP_HS_NONCE],
                        uint64_t conn_key, uint8_t out[KVP_HS_MAC])
{
    uint8_t k[8];
    put_be(k, conn_key, 8);
    mac(token, "kvpool-v2-server", cnonce, snonce, k, sizeof k, out);
}

int kvp__hs_mac_eq(const uint8_t a[KVP_HS_MAC], const uint8_t b[KVP_HS_MAC])
{
    return CRYPTO_memcmp(a, b, KVP_HS_MAC) == 0;
}

/* ---- client ---- */

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

static kvp_status_t tcp_connect(const char *host, uint16_t port, uint64_t deadline, int *fd_p)
{
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ps[8];
    snprintf(ps, sizeof ps, "%u", port);
    int gai = getaddrinfo(host, ps, &hints, &ai);
    if (gai != 0 || !ai) {
        kvp_error("connect: cannot resolve '%s': %s", host, gai ? gai_strerror(gai) : "no address");
        return gai == EAI_AGAIN ? KVP_ERR_TIMEOUT : KVP_ERR_HOST_UNKNOWN;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        freeaddrinfo(ai);
        kvp_error("connect: socket: %s", strerror(errno));
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
        /* (rate-limited: handles that retry with backoff, many at once,
         * against a server that is down would each log every attempt) */
        kvp_error_rl("connect: %s:%u: %s", host, port, kvp_status_str(st));
        close(fd);
        return st;
    }
    *fd_p = fd;
    return KVP_OK;
}

static kvp_status_t not_kvpool(const char *host, uint16_t port)
{
    kvp_error("connect: %s:%u is not a kvpool server (bad handshake reply)", host, port);
    return KVP_ERR_PROTOCOL;
}

/* A server's refusal, as the client reports it. */
static kvp_status_t refused(const char *host, uint16_t port, kvp_status_t st)
{
    kvp_error("connect: %s:%u refused the connection: %s", host, port, kvp_status_str(st));
    return st;
}

/* One connection and its handshake, until deadline.  *lost_p: the server
 * closed the connection in the middle of it (nothing logged then). */
static kvp_status_t hs_attempt(const char *host, uint16_t port, const char *token, kvp__hs_want_t want,
                               uint64_t deadline, kvp__hs_result_t *res, bool *lost_p)
{
    memset(res, 0, sizeof *res);
    res->fd = -1;
    *lost_p = false;
    int fd;
    kvp_status_t st = tcp_connect(host, port, deadline, &fd);
    if (st != KVP_OK)
        return st;
    uint8_t hello[KVP_HS_HELLO_V2], cnonce[KVP_HS_NONCE], ch[KVP_HS_CHALLENGE];
    if ((st = kvp__random_bytes(cnonce, sizeof cnonce)) != KVP_OK)
        goto out;
    memcpy(hello, KVP_HS_MAGIC, 4);
    put_be(hello + 4, KVP_HS_V2, 2);
    put_be(hello + 6, 0, 2);
    memcpy(hello + 8, cnonce, KVP_HS_NONCE);
    st = io_all(fd, hello, sizeof hello, 1, deadline);
    if (st == KVP_OK)
        st = io_all(fd, ch, 8, 0, deadline);
    if (st != KVP_OK)
        goto io_failed;
    kvp__hs_challenge_t c;
    size_t used;
    kvp_status_t ps = kvp__hs_parse_challenge(ch, 8, &c, &used);
    if (ps == KVP_INPROGRESS) {
        if ((st = io_all(fd, ch + 8, sizeof ch - 8, 0, deadline)) != KVP_OK)
            goto io_failed;
        ps = kvp__hs_parse_challenge(ch, sizeof ch, &c, &used);
    }
    if (ps == KVP_ERR_VERSION) {
        /* A server of another version answers in its own format and closes. */
        kvp_error("connect: %s:%u speaks handshake version %u, this client %u: upgrade the older one", host, port,
                  (unsigned)be(ch + 4, 2), KVP_HS_V2);
        st = KVP_ERR_VERSION;
        goto out;
    }
    if (ps != KVP_OK) {
        st = not_kvpool(host, port);
        goto out;
    }
    if (c.status != KVP_OK) {
        st = refused(host, port, c.status);
        goto out;
    }
    if ((c.offers & KVP_HS_OFFER_TOKEN) && (!token || !token[0])) {
        kvp_error("connect: %s:%u requires a token (token_file= in the URI, or KVPOOL_TOKEN)", host, port);
        st = KVP_ERR_AUTH;
        goto out;
    }
    /* UCX shared memory only works between processes of one uid (each
     * side maps the other's segments); another uid takes TCP. */
    int ucx = want != KVP_HS_WANT_TCP && (c.offers & KVP_HS_OFFER_UCX) && c.uid == (uint32_t)geteuid();
    if (want == KVP_HS_WANT_UCX_ONLY && !ucx) {
        kvp_error("connect: %s:%u offers no UCX transport to this process (%s); use transport=tcp or auto", host,
                  port, !(c.offers & KVP_HS_OFFER_UCX) ? "the server's UCX keeps to shared memory and RDMA, none here"
                                                       : "the server runs as another user");
        st = KVP_ERR_UNSUPPORTED;
        goto out;
    }
    const char *tok = (c.offers & KVP_HS_OFFER_TOKEN) ? token : NULL;
    uint8_t resp[KVP_HS_RESPONSE];
    resp[0] = ucx ? KVP_HS_UCX : KVP_HS_TCP;
    resp[1] = 0;
    kvp__hs_client_mac(tok, c.nonce, cnonce, resp + 2);
    uint8_t fixed[KVP_HS_REPLY_V2];
    st = io_all(fd, resp, sizeof resp, 1, deadline);
    if (st == KVP_OK)
        st = io_all(fd, fixed, sizeof fixed, 0, deadline);
    if (st != KVP_OK)
        goto io_failed;
    kvp__hs_reply_t rep;
    if (kvp__hs_parse_reply(fixed, sizeof fixed, &rep, &used) != KVP_OK) {
        st = not_kvpool(host, port);
        goto out;
    }
    if (rep.status != KVP_OK) {
        st = refused(host, port, rep.status);
        goto out;
    }
    uint32_t al = rep.addr_len;
    uint64_t key = rep.conn_key;
    if ((ucx && al == 0) || (!ucx && al != 0)) {
        st = not_kvpool(host, port);
        goto out;
    }
    if (tok) {
        uint8_t want_mac[KVP_HS_MAC];
        kvp__hs_server_mac(tok, cnonce, c.nonce, key, want_mac);
        if (!kvp__hs_mac_eq(want_mac, rep.mac)) {
            kvp_error("connect: %s:%u could not prove it holds the token: not the server you meant", host, port);
            st = KVP_ERR_AUTH;
            goto out;
        }
    }
    if (al) {
        res->addr = kvp__malloc(al);
        if (!res->addr) {
            st = KVP_ERR_NO_MEMORY;
            goto out;
        }
        if ((st = io_all(fd, res->addr, al, 0, deadline)) != KVP_OK) {
            kvp__free(res->addr, al);
            res->addr = NULL;
            goto io_failed;
        }
        res->addr_len = al;
    }
    res->fd = fd;
    res->conn_key = key;
    res->transport = ucx ? KVP_HS_UCX : KVP_HS_TCP;
    return KVP_OK;
io_failed:
    if (st == KVP_ERR_CONN_LOST)
        *lost_p = true;
    else
        kvp_error("connect: handshake with %s:%u: %s", host, port, kvp_status_str(st));
out:
    close(fd);
    return st;
}

/* A server with more handshakes in progress than its caps (server/conn.c,
 * "the handshake gate") closes the one that made progress least recently:
 * on a loaded host that can be a healthy client that had not yet been
 * scheduled to answer its challenge.  So a handshake the server closed is
 * tried again, at most HS_ATTEMPTS times in all, after 10-40 ms (random,
 * so that the clients displaced together do not come back together), while
 * the deadline allows.  A server that went away answers the next connect
 * with a refusal; the loss is what is reported then. */
#define HS_ATTEMPTS 3

kvp_status_t kvp__hs_client(const char *host, uint16_t port, const char *token, kvp__hs_want_t want,
                            uint32_t timeout_ms, kvp__hs_result_t *res)
{
    uint64_t deadline = kvp__now_ns() + (uint64_t)timeout_ms * 1000000ull;
    bool lost = false;
    kvp_status_t st = hs_attempt(host, port, token, want, deadline, res, &lost);
    for (int attempt = 1; lost && attempt < HS_ATTEMPTS; attempt++) {
        uint8_t r = 0;
        (void)kvp__random_bytes(&r, 1);
        uint64_t pause = (10ull + r % 31u) * 1000000ull;
        if (kvp__now_ns() + pause >= deadline)
            break;
        kvp_warn_rl("connect: %s:%u closed the connection during the handshake; trying again", host, port);
        usleep((useconds_t)(pause / 1000u));
        bool again = false;
        kvp_status_t st2 = hs_attempt(host, port, token, want, deadline, res, &again);
        if (st2 == KVP_ERR_CONN_REFUSED || st2 == KVP_ERR_HOST_UNKNOWN)
            break; /* gone: the loss is the answer */
        st = st2;
        lost = again;
    }
    if (lost)
        kvp_error("connect: handshake with %s:%u: %s", host, port, kvp_status_str(st));
    return st;
}
