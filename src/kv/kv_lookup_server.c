/*
 * The lookup server (include/kvpool/kv_connector.h, "Lookup service over
 * ZeroMQ"): vLLM's LookupKeyServer in C.  One thread owns a REP socket and
 * answers every message in order: LOOKUP through kvp_kv_lookup_pool_query,
 * RESET through the drain callback and the lookup's reset op, anything else
 * "\x00".  The frames are decoded by kv_lookup_wire.c; this file is about
 * sockets, files and the thread.
 *
 * Hostile peers.  A message is read frame by frame; only the first
 * KVP__LW_MAX_FRAMES are kept (the rest are received and dropped, since a
 * REP socket must take a whole message before it can answer), and
 * ZMQ_MAXMSGSIZE caps every frame at what max_hashes allows, so a huge frame
 * costs the sender its connection, not our memory.  Each bad message gets
 * "\x00" and a rate-limited log line; the socket stays in step, so the next
 * client is answered as if nothing happened.
 *
 * The ipc socket file.  libzmq unlinks whatever is at the path before it
 * binds -- that is how vLLM's server "removes a stale file", and also how it
 * would steal a live engine's socket.  So the file is never bound in place:
 *
 *   1. if a socket file is at PATH, a connect() probe decides: refused means
 *      stale (unlinked), accepted means a live server (KVP_ERR_BUSY);
 *   2. libzmq binds inside a fresh mkdtemp() directory next to PATH (0700:
 *      no one else can reach the socket there), the file is chmod 0600;
 *   3. link() gives it its real name -- atomically, and failing with EEXIST
 *      if a competitor got there between 1 and 3 (KVP_ERR_BUSY again);
 *   4. the temporary name and directory are removed.
 *
 * On stop the file is unlinked if PATH is still the inode we linked (a
 * successor's socket is left alone).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/prom.h"
#include "common/sized.h"
#include "common/thread.h"
#include "kv/kv_lookup_wire.h"
#include "kvpool/kv_connector.h"

#define ENDPOINT_MAX 512

struct kvp_kv_lookup_server {
    void *zctx;
    void *sock;
    pthread_t thread;
    kvp_kv_lookup_pool_t *lookup;
    kvp_status_t (*drain)(void *arg);
    void *drain_arg;
    uint32_t max_hashes;
    char endpoint[ENDPOINT_MAX]; /* as bound (a tcp port 0 resolved) */
    bool has_file;               /* ipc: we linked `path` */
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    dev_t dev;
    ino_t ino;
    _Atomic uint64_t requests, lookups, resets, bad_frames, unknown_tags;
};

/* -------------------------------------------------------------- endpoints */

kvp_status_t kvp_kv_lookup_ipc_endpoint(const char *base_path, uint32_t rpc_port,
                                        const char *hostname, uint32_t dp_rank, char *buf,
                                        size_t buf_size)
{
    if (!base_path || !buf)
        return KVP_ERR_NULL_POINTER;
    char host[256];
    if (!hostname) {
        if (gethostname(host, sizeof host) != 0)
            return KVP_ERR_INVALID_ARG;
        host[sizeof host - 1] = '\0';
        hostname = host;
    }
    if (!*base_path || !*hostname || strchr(hostname, '/')) {
        kvp_error("kv lookup: bad ipc endpoint parts (base '%s', host '%s')", base_path, hostname);
        return KVP_ERR_INVALID_ARG;
    }
    int n = snprintf(buf, buf_size, "ipc://%s/lookup_rpc_port_%u_host_%s_dp_rank%u", base_path,
                     rpc_port, hostname, dp_rank);
    if (n < 0)
        return KVP_ERR_INVALID_ARG;
    return (size_t)n < buf_size ? KVP_OK : KVP_ERR_BUFFER_TOO_SMALL;
}

/* 1: something accepts connections at path; 0: refused (stale); -1: error. */
static int ipc_probe(const char *path)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int r = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int err = errno;
    close(fd);
    if (r == 0 || err == EACCES || err == EAGAIN) /* EAGAIN: a live, busy backlog */
        return 1;
    return err == ECONNREFUSED || err == ENOENT ? 0 : -1;
}

/* Step 1 of the top: clears a stale socket file at path. */
static kvp_status_t ipc_clear_stale(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? KVP_OK : KVP_ERR_IO;
    if (!S_ISSOCK(st.st_mode)) {
        kvp_error("kv lookup server: %s exists and is not a socket", path);
        return KVP_ERR_BUSY;
    }
    int r = ipc_probe(path);
    if (r > 0) {
        kvp_error("kv lookup server: %s: a live server answers there (not stolen)", path);
        return KVP_ERR_BUSY;
    }
    if (r < 0) {
        kvp_error("kv lookup server: probing %s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    struct stat again; /* unlink only the inode that was probed */
    if (lstat(path, &again) == 0 && again.st_ino == st.st_ino && again.st_dev == st.st_dev &&
        unlink(path) != 0 && errno != ENOENT)
        return KVP_ERR_IO;
    kvp_info("kv lookup server: removed the stale socket file %s", path);
    return KVP_OK;
}

/* Steps 2-4 of the top. */
static kvp_status_t ipc_bind(kvp_kv_lookup_server_t *s, const char *path)
{
    size_t len = strlen(path);
    if (len == 0 || len + 1 > sizeof s->path) {
        kvp_error("kv lookup server: ipc path of %zu bytes (need 1..%zu)", len, sizeof s->path - 1);
        return KVP_ERR_BAD_CONFIG;
    }
    kvp_status_t st = ipc_clear_stale(path);
    if (st != KVP_OK)
        return st;
    const char *slash = strrchr(path, '/');
    int dlen = slash ? (int)(slash - path) : 1;
    char dir[sizeof s->path + 32], tmp[sizeof dir + 4];
    snprintf(dir, sizeof dir, "%.*s/.kvp-lookup-XXXXXX", dlen, slash ? path : ".");
    if (strlen(dir) + 3 > sizeof s->path) {
        kvp_error("kv lookup server: %s: its directory's path is too long for a socket", path);
        return KVP_ERR_BAD_CONFIG;
    }
    if (!mkdtemp(dir)) {
        kvp_error("kv lookup server: mkdtemp next to %s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    snprintf(tmp, sizeof tmp, "%s/s", dir);
    char ep[sizeof tmp + 8];
    snprintf(ep, sizeof ep, "ipc://%s", tmp);
    st = KVP_OK;
    if (zmq_bind(s->sock, ep) != 0) {
        kvp_error("kv lookup server: bind %s: %s", ep, zmq_strerror(zmq_errno()));
        st = KVP_ERR_IO;
    } else if (chmod(tmp, 0600) != 0) {
        kvp_error("kv lookup server: chmod %s: %s", tmp, strerror(errno));
        st = KVP_ERR_IO;
    } else if (link(tmp, path) != 0) {
        int err = errno;
        kvp_error("kv lookup server: %s: %s", path,
                  err == EEXIST ? "another server bound it first" : strerror(err));
        st = err == EEXIST ? KVP_ERR_BUSY : KVP_ERR_IO;
    }
    if (st != KVP_OK)
        zmq_unbind(s->sock, ep);
    unlink(tmp);
    rmdir(dir);
    if (st != KVP_OK)
        return st;
    struct stat sb;
    if (stat(path, &sb) == 0) {
        s->dev = sb.st_dev;
        s->ino = sb.st_ino;
    }
    memcpy(s->path, path, len + 1);
    s->has_file = true;
    snprintf(s->endpoint, sizeof s->endpoint, "ipc://%s", path);
    return KVP_OK;
}

static bool is_wildcard(const char *host)
{
    static const char *const wild[] = {"",     "*",   "0.0.0.0", "::",
                                       "[::]", "[*]", "[0:0:0:0:0:0:0:0]"};
    for (size_t i = 0; i < sizeof wild / sizeof wild[0]; i++)
        if (strcmp(host, wild[i]) == 0)
            return true;
    return false;
}

/* tcp://HOST:PORT with HOST named (an address, a [v6] address or a name,
 * resolved here to its first address) and PORT 0..65535 (0: any). */
static kvp_status_t tcp_bind(kvp_kv_lookup_server_t *s, const char *rest)
{
    const char *colon = strrchr(rest, ':');
    char host[256];
    size_t hlen = colon ? (size_t)(colon - rest) : 0;
    if (!colon || hlen >= sizeof host || !colon[1] || strlen(colon + 1) > 5 ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || atoi(colon + 1) > 65535) {
        kvp_error("kv lookup server: bad tcp endpoint 'tcp://%s' (need tcp://HOST:PORT)", rest);
        return KVP_ERR_BAD_URI;
    }
    memcpy(host, rest, hlen);
    host[hlen] = '\0';
    if (is_wildcard(host)) {
        kvp_error("kv lookup server: 'tcp://%s': a wildcard host is refused (name the host)", rest);
        return KVP_ERR_BAD_CONFIG;
    }
    char addr[sizeof host];
    bool v6 = host[0] == '[';
    if (v6) {
        snprintf(addr, sizeof addr, "%s", host);
    } else {
        struct addrinfo hints, *ai = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_socktype = SOCK_STREAM;
        if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) {
            kvp_error("kv lookup server: host '%s' does not resolve", host);
            return KVP_ERR_BAD_CONFIG;
        }
        const struct addrinfo *use = ai; /* an IPv4 address if there is one */
        for (const struct addrinfo *p = ai; p; p = p->ai_next)
            if (p->ai_family == AF_INET) {
                use = p;
                break;
            }
        char txt[INET6_ADDRSTRLEN];
        v6 = use->ai_family == AF_INET6;
        const void *a = v6 ? (const void *)&((struct sockaddr_in6 *)use->ai_addr)->sin6_addr
                           : (const void *)&((struct sockaddr_in *)use->ai_addr)->sin_addr;
        inet_ntop(use->ai_family, a, txt, sizeof txt);
        freeaddrinfo(ai);
        snprintf(addr, sizeof addr, v6 ? "[%s]" : "%s", txt);
    }
    int on = 1;
    if (v6)
        zmq_setsockopt(s->sock, ZMQ_IPV6, &on, sizeof on);
    char ep[ENDPOINT_MAX];
    int port = atoi(colon + 1);
    if (port)
        snprintf(ep, sizeof ep, "tcp://%s:%d", addr, port);
    else
        snprintf(ep, sizeof ep, "tcp://%s:*", addr);
    if (zmq_bind(s->sock, ep) != 0) {
        kvp_error("kv lookup server: bind %s: %s", ep, zmq_strerror(zmq_errno()));
        return KVP_ERR_IO;
    }
    size_t n = sizeof s->endpoint;
    if (zmq_getsockopt(s->sock, ZMQ_LAST_ENDPOINT, s->endpoint, &n) != 0)
        snprintf(s->endpoint, sizeof s->endpoint, "%s", ep);
    return KVP_OK;
}

/* ----------------------------------------------------------------- serving */

static int reply(kvp_kv_lookup_server_t *s, const void *data, size_t len)
{
    while (zmq_send(s->sock, data, len, 0) < 0) {
        if (zmq_errno() != EINTR)
            return -1;
    }
    return 0;
}

static int answer_err(kvp_kv_lookup_server_t *s)
{
    static const uint8_t err = KVP__LW_RESP_ERR;
    return reply(s, &err, 1);
}

static int answer_lookup(kvp_kv_lookup_server_t *s, const kvp__lw_msg_t *m)
{
    kvp_kv_lookup_result_t res;
    kvp_status_t st = kvp_kv_lookup_pool_query(s->lookup, m->num_tokens, m->hashes, m->num_hashes,
                                               m->hash_len, m->apply_eagle, &res);
    int64_t hit = st == KVP_OK && res.hit_tokens > 0 ? res.hit_tokens : 0;
    if (st != KVP_OK)
        kvp_warn_rl("kv lookup server: lookup failed: %s (answered 0)", kvp_status_str(st));
    if (hit > (int64_t)UINT32_MAX)
        hit = 0;
    uint8_t out[4];
    kvp__lw_put_u32(out, (uint32_t)hit);
    atomic_fetch_add_explicit(&s->lookups, 1, memory_order_relaxed);
    return reply(s, out, sizeof out);
}

static int answer_reset(kvp_kv_lookup_server_t *s)
{
    atomic_fetch_add_explicit(&s->resets, 1, memory_order_relaxed);
    kvp_status_t st = s->drain ? s->drain(s->drain_arg) : KVP_OK;
    bool ack = false;
    if (st == KVP_OK) {
        kvp_kv_lookup_client_t c = kvp_kv_lookup_pool_client(s->lookup);
        st = c.ops->reset(c.ctx, &ack);
    }
    if (st != KVP_OK || !ack) {
        kvp_error("kv lookup server: reset failed: %s", st != KVP_OK ? kvp_status_str(st) : "NACK");
        return answer_err(s);
    }
    kvp_info("kv lookup server: store reset");
    static const uint8_t ok = KVP__LW_RESP_OK;
    return reply(s, &ok, 1);
}

/* Receives one whole message: the first KVP__LW_MAX_FRAMES frames into
 * parts (initialised here; the caller closes *nkept of them), the rest
 * dropped.  0, or -1 when the context is shutting down. */
static int recv_message(void *sock, zmq_msg_t *parts, size_t *nkept, size_t *nframes)
{
    *nkept = *nframes = 0;
    for (int more = 1; more;) {
        zmq_msg_t spill, *m = *nkept < KVP__LW_MAX_FRAMES ? &parts[*nkept] : &spill;
        zmq_msg_init(m);
        while (zmq_msg_recv(m, sock, 0) < 0) {
            if (zmq_errno() != EINTR) {
                zmq_msg_close(m);
                return -1;
            }
        }
        more = zmq_msg_more(m);
        (*nframes)++;
        if (m == &spill)
            zmq_msg_close(m);
        else
            (*nkept)++;
    }
    return 0;
}

static void *serve(void *arg)
{
    kvp_kv_lookup_server_t *s = arg;
    kvp__thread_name("kvp-kv-lookup");
    zmq_msg_t parts[KVP__LW_MAX_FRAMES];
    for (;;) {
        size_t nkept, nframes;
        if (recv_message(s->sock, parts, &nkept, &nframes) != 0) {
            for (size_t i = 0; i < nkept; i++)
                zmq_msg_close(&parts[i]);
            break;
        }
        atomic_fetch_add_explicit(&s->requests, 1, memory_order_relaxed);
        kvp__lw_frame_t frames[KVP__LW_MAX_FRAMES];
        for (size_t i = 0; i < nkept; i++)
            frames[i] = (kvp__lw_frame_t){zmq_msg_data(&parts[i]), zmq_msg_size(&parts[i])};
        kvp__lw_msg_t m;
        int rc;
        switch (kvp__lw_decode(frames, nframes, s->max_hashes, &m)) {
        case KVP__LW_LOOKUP:
            rc = answer_lookup(s, &m);
            break;
        case KVP__LW_RESET:
            rc = answer_reset(s);
            break;
        case KVP__LW_UNKNOWN_TAG:
            atomic_fetch_add_explicit(&s->unknown_tags, 1, memory_order_relaxed);
            kvp_warn_rl("kv lookup server: %s (%zu frames, first of %zu bytes): answered \\x00",
                        m.why, nframes, nkept ? frames[0].len : 0);
            rc = answer_err(s);
            break;
        default:
            atomic_fetch_add_explicit(&s->bad_frames, 1, memory_order_relaxed);
            kvp_warn_rl("kv lookup server: malformed message: %s (%zu frames): answered \\x00",
                        m.why, nframes);
            rc = answer_err(s);
            break;
        }
        for (size_t i = 0; i < nkept; i++)
            zmq_msg_close(&parts[i]);
        if (rc != 0 && zmq_errno() == ETERM)
            break;
    }
    return NULL;
}

/* --------------------------------------------------------------- lifecycle */

void kvp_kv_lookup_server_params_init(kvp_kv_lookup_server_params_t *params)
{
    if (!params)
        return;
    memset(params, 0, sizeof *params);
    params->size = (uint32_t)sizeof *params;
    params->max_hashes = 1u << 20;
}

static void server_free(kvp_kv_lookup_server_t *s)
{
    if (s->sock)
        zmq_close(s->sock);
    if (s->zctx)
        zmq_ctx_term(s->zctx);
    kvp__free(s, sizeof *s);
}

kvp_status_t kvp_kv_lookup_server_start(const kvp_kv_lookup_server_params_t *params,
                                        kvp_kv_lookup_server_t **server_p)
{
    if (!params || !server_p)
        return KVP_ERR_NULL_POINTER;
    *server_p = NULL;
    kvp_kv_lookup_server_params_t pp;
    kvp_kv_lookup_server_params_init(&pp);
    kvp_status_t ast = kvp__sized_adopt(&pp, sizeof pp, params);
    if (ast != KVP_OK) {
        kvp_error("kv lookup server: params.size %u (call kvp_kv_lookup_server_params_init)",
                  params->size);
        return ast;
    }
    params = &pp;
    if (!params->endpoint || !params->lookup || params->max_hashes == 0) {
        kvp_error("kv lookup server: params need endpoint, lookup, max_hashes");
        return params->endpoint && params->lookup ? KVP_ERR_BAD_CONFIG : KVP_ERR_NULL_POINTER;
    }
    const char *ep = params->endpoint;
    bool ipc = strncmp(ep, "ipc://", 6) == 0, tcp = strncmp(ep, "tcp://", 6) == 0;
    if (!ipc && !tcp) {
        kvp_error("kv lookup server: endpoint '%s' is neither ipc:// nor tcp://", ep);
        return KVP_ERR_BAD_URI;
    }
    kvp_kv_lookup_server_t *s = kvp__calloc(1, sizeof *s);
    if (!s)
        return KVP_ERR_NO_MEMORY;
    s->lookup = params->lookup;
    s->drain = params->drain;
    s->drain_arg = params->drain_arg;
    s->max_hashes = params->max_hashes;
    s->zctx = zmq_ctx_new();
    s->sock = s->zctx ? zmq_socket(s->zctx, ZMQ_REP) : NULL;
    if (!s->sock) {
        server_free(s);
        return KVP_ERR_NO_MEMORY;
    }
    int linger = 0;
    int64_t maxmsg = kvp__lw_max_msg_size(s->max_hashes);
    zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s->sock, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg);
    kvp_status_t st = ipc ? ipc_bind(s, ep + 6) : tcp_bind(s, ep + 6);
    if (st == KVP_OK && pthread_create(&s->thread, NULL, serve, s) != 0)
        st = KVP_ERR_NO_MEMORY;
    if (st != KVP_OK) {
        if (s->has_file)
            unlink(s->path);
        server_free(s);
        return st;
    }
    *server_p = s;
    return KVP_OK;
}

void kvp_kv_lookup_server_stop(kvp_kv_lookup_server_t *s)
{
    if (!s)
        return;
    zmq_ctx_shutdown(s->zctx); /* the thread's recv/send fail with ETERM */
    pthread_join(s->thread, NULL);
    struct stat sb;
    if (s->has_file && stat(s->path, &sb) == 0 && sb.st_dev == s->dev && sb.st_ino == s->ino)
        unlink(s->path);
    server_free(s);
}

const char *kvp_kv_lookup_server_endpoint(const kvp_kv_lookup_server_t *s)
{
    return s ? s->endpoint : NULL;
}

void kvp_kv_lookup_server_stats(const kvp_kv_lookup_server_t *s,
                                kvp_kv_lookup_server_stats_t *stats_p)
{
    if (!stats_p)
        return;
    memset(stats_p, 0, sizeof *stats_p);
    if (!s)
        return;
    stats_p->requests = atomic_load_explicit(&s->requests, memory_order_relaxed);
    stats_p->lookups = atomic_load_explicit(&s->lookups, memory_order_relaxed);
    stats_p->resets = atomic_load_explicit(&s->resets, memory_order_relaxed);
    stats_p->bad_frames = atomic_load_explicit(&s->bad_frames, memory_order_relaxed);
    stats_p->unknown_tags = atomic_load_explicit(&s->unknown_tags, memory_order_relaxed);
}

/* ----------------------------------------------------------------- metrics */

kvp_status_t kvp_kv_lookup_server_metrics(const kvp_kv_lookup_server_t *s, char *buf,
                                          size_t buf_size, size_t *len_p)
{
    if (!s || !len_p || (!buf && buf_size))
        return KVP_ERR_NULL_POINTER;
    kvp_kv_lookup_server_stats_t ss;
    kvp_kv_lookup_stats_t ls;
    kvp_kv_lookup_server_stats(s, &ss);
    kvp_kv_lookup_pool_stats(s->lookup, &ls);
    kvp__prom_t b = {buf, buf_size, 0};
    kvp__prom_counter(&b, "kvpool_lookup_server_requests_total", "Messages received on the lookup socket.",
                      ss.requests);
    kvp__prom_counter(&b, "kvpool_lookup_server_lookups_total", "Well-formed LOOKUPs answered.", ss.lookups);
    kvp__prom_counter(&b, "kvpool_lookup_server_resets_total", "RESETs received (ACK or NACK).", ss.resets);
    kvp__prom_counter(&b, "kvpool_lookup_server_bad_frames_total", "Malformed messages answered \\x00.",
                      ss.bad_frames);
    kvp__prom_counter(&b, "kvpool_lookup_server_unknown_tags_total", "Unknown message tags answered \\x00.",
                      ss.unknown_tags);
    kvp__prom_counter(&b, "kvpool_lookups_total", "Lookups computed against the pool.", ls.lookups);
    kvp__prom_counter(&b, "kvpool_lookup_hit_tokens_total", "Sum of the hits answered, in tokens.", ls.hit_tokens);
    kvp__prom_counter(&b, "kvpool_lookup_queried_tokens_total", "Sum of the tokens asked about.", ls.queried_tokens);
    kvp__prom_counter(&b, "kvpool_lookup_keys_probed_total", "Store keys asked of the pool.", ls.keys_probed);
    kvp__prom_counter(&b, "kvpool_lookup_resets_total", "Pool resets done by the lookup.", ls.resets);
    kvp__prom_head(&b, "kvpool_lookup_misses_total", "counter", "Lookups by why the hit stopped where it did.");
    for (int r = 0; r < KVP_KV_MISS__COUNT; r++)
        kvp__prom_printf(&b, "kvpool_lookup_misses_total{reason=\"%s\"} %llu\n",
                         kvp_kv_miss_reason_name((kvp_kv_miss_reason_t)r), (unsigned long long)ls.reasons[r]);
    *len_p = b.len;
    return b.len < buf_size ? KVP_OK : KVP_ERR_BUFFER_TOO_SMALL;
}
