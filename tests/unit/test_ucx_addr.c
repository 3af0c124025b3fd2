/* Unit tests of the UCX worker-address check (src/net/ucx_addr.c), on the
 * addresses of real UCX workers made here: they pass, and every truncation,
 * a trailing byte, tcp, no transport in common, unknown versions, lengths
 * past the end, implausible iface figures and foreign shared-memory modes
 * are refused.  Every single-byte mutation of a real address (0x00, 0xff,
 * each bit flipped) is either refused or, when accepted, given to
 * ucp_ep_create without a crash.  Shared-memory transports without /proc
 * links, tcp only where a test needs a tcp address; nothing is ever sent on
 * the endpoints made. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>
#include <ucs/algorithm/crc.h>
#include <ucs/config/global_opts.h>

#include "common/log.h"
#include "net/ucx.h"
#include "net/ucx_addr.h"
#include "test.h"

#define SHM_TLS "self,posix,sysv,cma"

typedef struct {
    ucp_context_h ctx;
    ucp_worker_h worker;
    uint8_t *addr; /* own copy, exactly len bytes, so ASan sees any overread */
    size_t len;
} wk_t;

/* A context + worker made by UCX directly, for tcp: kvpool's own opener
 * keeps tcp out of UCX. */
static void raw_open(const char *tls, ucp_context_h *ctx_p, ucp_worker_h *worker_p)
{
    ucp_config_t *cfg;
    ASSERT_EQ(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    ASSERT_EQ(ucp_config_modify(cfg, "TLS", tls), UCS_OK);
    ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                           .features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP};
    ucs_status_t st = ucp_init(&params, cfg, ctx_p);
    ucp_config_release(cfg);
    if (st != UCS_OK) {
        *ctx_p = NULL;
        *worker_p = NULL;
        return;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ASSERT_EQ(ucp_worker_create(*ctx_p, &wp, worker_p), UCS_OK);
}

/* Opens a context + worker with UCX_TLS=tls (NULL: as the environment has
 * it) and UCX_ADDRESS_VERSION=version (NULL: default), by kvp__ucx_open, or
 * by UCX directly when `raw`.  Returns 0 (and says so) when a transport of
 * `need` (space-separated; NULL: none) is missing here. */
static int wk_open_how(wk_t *w, int raw, const char *tls, const char *version, const char *need)
{
    setenv("UCX_POSIX_USE_PROC_LINK", "n", 1);
    if (tls)
        setenv("UCX_TLS", tls, 1);
    if (version)
        setenv("UCX_ADDRESS_VERSION", version, 1);
    else
        unsetenv("UCX_ADDRESS_VERSION");
    if (raw)
        raw_open(tls, &w->ctx, &w->worker);
    else
        ASSERT_OK(kvp__ucx_open("test", KVP_UCX_SERVER, &w->ctx, &w->worker));
    if (need) {
        char have[600], want[64];
        snprintf(have, sizeof have, " %s ", w->ctx ? kvp__ucx_transports(w->ctx) : "");
        const char *p = need;
        while (*p) {
            size_t n = strcspn(p, " ");
            snprintf(want, sizeof want, " %.*s ", (int)n, p);
            if (!strstr(have, want)) {
                printf("  skipped: UCX transport %.*s not available here (have:%s)\n", (int)n, p,
                       have);
                kvp__ucx_close(w->ctx, w->worker);
                return 0;
            }
            p += n + (p[n] == ' ');
        }
    }
    ASSERT(w->ctx && w->worker);
    ucp_address_t *a;
    size_t n;
    ASSERT_EQ(ucp_worker_get_address(w->worker, &a, &n), UCS_OK);
    w->addr = malloc(n);
    ASSERT(w->addr);
    memcpy(w->addr, a, n);
    w->len = n;
    ucp_worker_release_address(w->worker, a);
    return 1;
}

static int wk_open(wk_t *w, const char *tls, const char *version, const char *need)
{
    return wk_open_how(w, 0, tls, version, need);
}

/* With tcp: made by UCX itself. */
static int wk_open_tcp(wk_t *w, const char *tls, const char *need)
{
    return wk_open_how(w, 1, tls, NULL, need);
}

static void wk_close(wk_t *w)
{
    free(w->addr);
    kvp__ucx_close(w->ctx, w->worker);
}

/* The check on an exact-size heap copy of buf[0..len). */
static kvp_status_t check(const void *buf, size_t len, const wk_t *own, const char **why_p)
{
    uint8_t *copy = malloc(len ? len : 1);
    ASSERT(copy);
    memcpy(copy, buf, len);
    const char *why = "unset";
    kvp_status_t st = kvp__ucx_addr_check(copy, len, own->addr, own->len, &why);
    if (st == KVP_OK)
        ASSERT(why == NULL);
    else
        ASSERT(st == KVP_ERR_PROTOCOL && why != NULL);
    if (why_p)
        *why_p = why;
    free(copy);
    return st;
}

/* The check refuses buf, for this reason. */
#define assert_refused(buf, len, own, reason)                                   \
    do {                                                                        \
        const char *kvp__why;                                                   \
        ASSERT_EQ(check((buf), (len), (own), &kvp__why), KVP_ERR_PROTOCOL);     \
        ASSERT_STR_EQ(kvp__why, (reason));                                      \
    } while (0)

/* ucp_ep_create on w to addr; a made endpoint is closed at once (a flush
 * with nothing sent: UCX 1.13 refuses a forced close without peer error
 * handling, which its shared-memory transports lack). */
static ucs_status_t try_ep(ucp_worker_h w, const void *addr)
{
    ucp_ep_params_t p = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_NONE,
    };
    ucp_ep_h ep = NULL;
    ucs_status_t st = ucp_ep_create(w, &p, &ep);
    if (st == UCS_OK) {
        ucp_request_param_t prm = {.op_attr_mask = 0};
        ucs_status_ptr_t sp = ucp_ep_close_nbx(ep, &prm);
        if (UCS_PTR_IS_PTR(sp)) {
            for (int i = 0; i < 100000 && ucp_request_check_status(sp) == UCS_INPROGRESS; i++)
                ucp_worker_progress(w);
            ASSERT_MSG(ucp_request_check_status(sp) != UCS_INPROGRESS, "endpoint close hangs");
            ucp_request_free(sp);
        }
    }
    for (int i = 0; i < 4; i++)
        ucp_worker_progress(w);
    return st;
}

TEST(test_ucx_addr_own_passes)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    const char *why;
    ASSERT_OK(check(a.addr, a.len, &a, &why));
    ASSERT_OK(kvp__ucx_addr_check(a.addr, a.len, a.addr, a.len, NULL));
    wk_close(&a);
}

TEST(test_ucx_addr_second_worker_passes_and_connects)
{
    wk_t a, b;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    ASSERT(wk_open(&b, SHM_TLS, NULL, NULL));
    const char *why;
    ASSERT_MSG(check(b.addr, b.len, &a, &why) == KVP_OK, "refused: %s", why);
    ASSERT_MSG(check(a.addr, a.len, &b, &why) == KVP_OK, "refused: %s", why);
    ASSERT_EQ(try_ep(a.worker, b.addr), UCS_OK);
    ASSERT_EQ(try_ep(b.worker, a.addr), UCS_OK);
    wk_close(&b);
    wk_close(&a);
}

TEST(test_ucx_addr_v2_second_worker_passes_and_connects)
{
    wk_t a, b;
    ASSERT(wk_open(&a, SHM_TLS, "v2", NULL));
    ASSERT(wk_open(&b, SHM_TLS, "v2", NULL));
    ASSERT_EQ(a.addr[0] & 0x0f, 1); /* really v2 */
    const char *why;
    ASSERT_MSG(check(b.addr, b.len, &a, &why) == KVP_OK, "refused: %s", why);
    ASSERT_EQ(try_ep(a.worker, b.addr), UCS_OK);
    wk_close(&b);
    wk_close(&a);
}

TEST(test_ucx_addr_version_differs_refused)
{
    wk_t a, b;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    ASSERT(wk_open(&b, SHM_TLS, "v2", NULL));
    const char *why;
    assert_refused(b.addr, b.len, &a, "UCX address version differs from this worker's");
    ASSERT_EQ(check(a.addr, a.len, &b, &why), KVP_ERR_PROTOCOL);
    wk_close(&b);
    wk_close(&a);
}

static void truncations(const char *version)
{
    wk_t a, b;
    ASSERT(wk_open(&a, SHM_TLS, version, NULL));
    ASSERT(wk_open(&b, SHM_TLS, version, NULL));
    for (size_t n = 0; n < b.len; n++)
        ASSERT_MSG(check(b.addr, n, &a, NULL) == KVP_ERR_PROTOCOL, "%zu of %zu bytes accepted", n,
                   b.len);
    ASSERT_EQ(kvp__ucx_addr_check(NULL, 0, a.addr, a.len, NULL), KVP_ERR_PROTOCOL);
    ASSERT_EQ(kvp__ucx_addr_check(b.addr, b.len, NULL, 0, NULL), KVP_ERR_PROTOCOL);
    wk_close(&b);
    wk_close(&a);
}

TEST(test_ucx_addr_every_truncation_refused)
{
    truncations(NULL);
    truncations("v2");
}

TEST(test_ucx_addr_trailing_byte_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    uint8_t *longer = malloc(a.len + 1);
    memcpy(longer, a.addr, a.len);
    const uint8_t tails[] = {0x00, 0x80, 0xff};
    for (size_t i = 0; i < sizeof tails; i++) {
        longer[a.len] = tails[i];
        assert_refused(longer, a.len + 1, &a, "trailing bytes after the UCX address");
    }
    free(longer);
    wk_close(&a);
}

TEST(test_ucx_addr_too_long_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    uint8_t *big = calloc(1, KVP_UCX_ADDR_MAX + 1);
    memcpy(big, a.addr, a.len);
    assert_refused(big, KVP_UCX_ADDR_MAX + 1, &a, "UCX address longer than KVP_UCX_ADDR_MAX");
    free(big);
    wk_close(&a);
}

/* Every single-byte mutation of worker b's address, checked against worker
 * a's; the accepted ones go to ucp_ep_create on a (UCX then logs an error
 * for each segment id it cannot attach: quiet unless UCX_LOG_LEVEL says). */
static void mutations(const char *version)
{
    if (!getenv("UCX_LOG_LEVEL"))
        (void)ucs_global_opts_set_value("LOG_LEVEL", "fatal");
    wk_t a, b;
    ASSERT(wk_open(&a, SHM_TLS, version, NULL));
    ASSERT(wk_open(&b, SHM_TLS, version, NULL));
    uint8_t *m = malloc(b.len);
    unsigned tried = 0, accepted = 0, made = 0;
    for (size_t off = 0; off < b.len; off++) {
        const uint8_t orig = b.addr[off];
        uint8_t vals[10] = {0x00, 0xff};
        for (int bit = 0; bit < 8; bit++)
            vals[2 + bit] = (uint8_t)(orig ^ (1u << bit));
        for (size_t v = 0; v < sizeof vals; v++) {
            if (vals[v] == orig)
                continue;
            memcpy(m, b.addr, b.len);
            m[off] = vals[v];
            tried++;
            if (check(m, b.len, &a, NULL) != KVP_OK)
                continue;
            accepted++;
            made += try_ep(a.worker, m) == UCS_OK;
        }
    }
    printf("  %s: %u mutations of a %zu-byte address, %u accepted, %u endpoints made\n",
           version ? version : "v1", tried, b.len, accepted, made);
    ASSERT_GT(tried, 0);
    free(m);
    wk_close(&b);
    wk_close(&a);
}

TEST(test_ucx_addr_single_byte_mutations_refused_or_harmless)
{
    mutations(NULL);
}

TEST(test_ucx_addr_v2_single_byte_mutations_refused_or_harmless)
{
    mutations("v2");
}

TEST(test_ucx_addr_tcp_refused)
{
    wk_t a, b;
    if (!wk_open_tcp(&a, "tcp", "tcp"))
        return;
    ASSERT(wk_open_tcp(&b, "tcp", NULL));
    assert_refused(b.addr, b.len, &a, "UCX address names the tcp transport");
    assert_refused(a.addr, a.len, &a, "UCX address names the tcp transport");
    wk_close(&b);
    wk_close(&a);
}

TEST(test_ucx_addr_tcp_among_others_refused)
{
    wk_t a;
    if (!wk_open_tcp(&a, SHM_TLS ",tcp", "posix tcp"))
        return;
    assert_refused(a.addr, a.len, &a, "UCX address names the tcp transport");
    wk_close(&a);
}

TEST(test_ucx_addr_no_transport_in_common_refused)
{
    wk_t peer, own;
    if (!wk_open(&peer, "posix,sysv", NULL, "posix sysv"))
        return;
    if (!wk_open_tcp(&own, "tcp", "tcp")) {
        wk_close(&peer);
        return;
    }
    assert_refused(peer.addr, peer.len, &own, "no UCX transport in common");
    wk_close(&own);
    wk_close(&peer);
}

TEST(test_ucx_addr_foreign_transport_refused)
{
    wk_t peer, own;
    ASSERT(wk_open(&peer, SHM_TLS, NULL, NULL));
    if (!wk_open(&own, "self,posix", NULL, "self posix")) {
        wk_close(&peer);
        return;
    }
    const char *why;
    assert_refused(peer.addr, peer.len, &own, "UCX address names a transport this worker does not have");
    /* The other way round is fine: every transport own names, peer has. */
    ASSERT_OK(check(own.addr, own.len, &peer, &why));
    wk_close(&own);
    wk_close(&peer);
}

TEST(test_ucx_addr_unknown_versions_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    uint8_t *m = malloc(a.len);
    for (unsigned v = 2; v <= 15; v++) {
        memcpy(m, a.addr, a.len);
        m[0] = (uint8_t)((m[0] & 0xf0) | v);
        assert_refused(m, a.len, &a, "unknown UCX address version");
    }
    free(m);
    wk_close(&a);
}

TEST(test_ucx_addr_empty_list_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    ASSERT_EQ(a.addr[0], 0x20); /* v1, uuid flag only */
    uint8_t m[10];
    memcpy(m, a.addr, 9);
    m[9] = 0xff;
    assert_refused(m, sizeof m, &a, "UCX address lists no transports");
    wk_close(&a);
}

/* v2: the first device's length byte rewritten in its extended form (31 in
 * the low bits, the length in the next byte) is the same address and
 * passes; the extension claiming 255 runs past the end. */
TEST(test_ucx_addr_v2_extension_huge_length_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, "v2", NULL));
    ASSERT_EQ(a.addr[0], 0x01);
    ASSERT_EQ(a.addr[1], 0x02); /* uuid flag only: the first md byte is at 10 */
    ASSERT_LT(a.addr[10] & 0x7f, 0x7f);
    const size_t at = 11; /* first device length byte */
    uint8_t *m = malloc(a.len + 1);
    memcpy(m, a.addr, at);
    m[at] = (uint8_t)((a.addr[at] & 0xe0) | 0x1f);
    m[at + 1] = a.addr[at] & 0x1f;
    memcpy(m + at + 2, a.addr + at + 1, a.len - at - 1);
    const char *why;
    ASSERT_MSG(check(m, a.len + 1, &a, &why) == KVP_OK, "refused: %s", why);
    m[at + 1] = 0xff;
    assert_refused(m, a.len + 1, &a, "UCX device address runs past the end");
    /* The md index extension: 127 in the byte, then the index; 64 is past
     * UCX's 64-bit md map. */
    memcpy(m, a.addr, 10);
    m[10] = (uint8_t)((a.addr[10] & 0x80) | 0x7f);
    m[11] = 64;
    memcpy(m + 12, a.addr + 11, a.len - 11);
    assert_refused(m, a.len + 1, &a, "UCX memory domain index out of range");
    free(m);
    wk_close(&a);
}

/* A v1 address with one device and `n` transport records of transport
 * `tl`, built by hand: header and uuid from `own`, the given iface figures,
 * zero-filled addresses of the given lengths.  Returns its length. */
typedef struct {
    float ovh, bw, lat;
    uint32_t prio_cap;
    uint8_t dev_flags; /* NUM_PATHS / SYS_DEVICE */
    uint8_t extra;     /* the num_paths or sys_dev byte */
} fig_t;

static size_t build_v1(uint8_t *out, const wk_t *own, const char *tl, unsigned n, unsigned dev_len,
                       unsigned iface_len, const fig_t *f)
{
    size_t p = 0;
    memcpy(out, own->addr, 9);
    p = 9;
    out[p++] = 0x00;                                   /* md 0 */
    out[p++] = (uint8_t)(0x80 | f->dev_flags | dev_len); /* last device */
    if (f->dev_flags)
        out[p++] = f->extra;
    memset(out + p, 0, dev_len);
    p += dev_len;
    uint16_t csum = ucs_crc16_string(tl);
    for (unsigned i = 0; i < n; i++) {
        memcpy(out + p, &csum, 2);
        memcpy(out + p + 2, &f->ovh, 4);
        memcpy(out + p + 6, &f->bw, 4);
        memcpy(out + p + 10, &f->lat, 4);
        memcpy(out + p + 14, &f->prio_cap, 4);
        p += 18;
        out[p++] = (uint8_t)((i + 1 == n ? 0x80 : 0) | iface_len);
        memset(out + p, 0, iface_len);
        p += iface_len;
    }
    return p;
}

/* The self transport's lengths in own (v1 address from SHM_TLS: self is the
 * first device, md 0, no device address, an 8-byte iface address). */
static void self_lengths(const wk_t *a, unsigned *dev_len, unsigned *iface_len)
{
    ASSERT_EQ(a->addr[0], 0x20);
    *dev_len = a->addr[10] & 0x1f;
    uint16_t csum;
    memcpy(&csum, a->addr + 11 + *dev_len, 2);
    ASSERT_EQ(csum, ucs_crc16_string("self"));
    *iface_len = a->addr[11 + *dev_len + 18] & 0x3f;
}

TEST(test_ucx_addr_iface_figures_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    unsigned dl, il;
    self_lengths(&a, &dl, &il);
    uint8_t buf[256];
    const char *why;
    const fig_t good = {.ovh = 1e-8f, .bw = 6e9f, .lat = 1e-7f, .prio_cap = 0x1b00};
    size_t n = build_v1(buf, &a, "self", 1, dl, il, &good);
    ASSERT_MSG(check(buf, n, &a, &why) == KVP_OK, "refused: %s", why);

    const float bad_bw[] = {0.0f, -1e9f, NAN, INFINITY, 1e-3f, 1e30f};
    for (size_t i = 0; i < sizeof bad_bw / sizeof bad_bw[0]; i++) {
        fig_t f = good;
        f.bw = bad_bw[i];
        n = build_v1(buf, &a, "self", 1, dl, il, &f);
        assert_refused(buf, n, &a, "UCX iface bandwidth not positive, not finite or implausible");
    }
    const float bad_t[] = {-1e-9f, NAN, INFINITY, -INFINITY, 10.0f};
    for (size_t i = 0; i < sizeof bad_t / sizeof bad_t[0]; i++) {
        fig_t f = good;
        f.ovh = bad_t[i];
        n = build_v1(buf, &a, "self", 1, dl, il, &f);
        assert_refused(buf, n, &a, "UCX iface overhead negative, not finite or over a second");
        f = good;
        f.lat = bad_t[i];
        n = build_v1(buf, &a, "self", 1, dl, il, &f);
        assert_refused(buf, n, &a, "UCX iface latency negative, not finite or over a second");
    }
    fig_t f = good;
    f.prio_cap |= 1u << 25;
    n = build_v1(buf, &a, "self", 1, dl, il, &f);
    assert_refused(buf, n, &a, "unknown UCX iface capability bits");
    wk_close(&a);
}

TEST(test_ucx_addr_device_fields_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    unsigned dl, il;
    self_lengths(&a, &dl, &il);
    uint8_t buf[256];
    const char *why;
    fig_t f = {.ovh = 1e-8f, .bw = 6e9f, .lat = 1e-7f, .dev_flags = 0x40, .extra = 2};
    size_t n = build_v1(buf, &a, "self", 1, dl, il, &f);
    ASSERT_MSG(check(buf, n, &a, &why) == KVP_OK, "refused: %s", why);
    f.extra = 0;
    n = build_v1(buf, &a, "self", 1, dl, il, &f);
    assert_refused(buf, n, &a, "UCX device with zero paths");
    f.dev_flags = 0x20;
    f.extra = 63;
    n = build_v1(buf, &a, "self", 1, dl, il, &f);
    ASSERT_MSG(check(buf, n, &a, &why) == KVP_OK, "refused: %s", why);
    f.extra = 64;
    n = build_v1(buf, &a, "self", 1, dl, il, &f);
    assert_refused(buf, n, &a, "UCX system device index out of range");
    /* Lengths other than own's for the same transport. */
    f.dev_flags = 0;
    n = build_v1(buf, &a, "self", 1, dl, il + 1, &f);
    assert_refused(buf, n, &a, "UCX transport address lengths or segment size differ from this worker's");
    n = build_v1(buf, &a, "self", 1, dl + 4, il, &f);
    assert_refused(buf, n, &a, "UCX transport address lengths or segment size differ from this worker's");
    /* An ep address flag on the iface length byte. */
    n = build_v1(buf, &a, "self", 1, dl, il, &f);
    buf[11 + dl + 18] |= 0x40;
    assert_refused(buf, n, &a, "endpoint addresses in a UCX worker address");
    wk_close(&a);
}

TEST(test_ucx_addr_more_than_128_transports_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    unsigned dl, il;
    self_lengths(&a, &dl, &il);
    uint8_t *buf = malloc(KVP_UCX_ADDR_MAX);
    const fig_t f = {.ovh = 1e-8f, .bw = 6e9f, .lat = 1e-7f};
    const char *why;
    size_t n = build_v1(buf, &a, "self", 128, dl, il, &f);
    ASSERT_LE(n, KVP_UCX_ADDR_MAX);
    ASSERT_MSG(check(buf, n, &a, &why) == KVP_OK, "refused: %s", why);
    n = build_v1(buf, &a, "self", 129, dl, il, &f);
    ASSERT_LE(n, KVP_UCX_ADDR_MAX);
    assert_refused(buf, n, &a, "more than 128 UCX transport entries");
    free(buf);
    wk_close(&a);
}

/* Offset of transport `tl`'s record in a v1 address (its checksum), found
 * by its checksum followed, 18 bytes on, by an iface length byte of
 * iface_len; -1 if absent. */
static long find_tl_v1(const wk_t *a, const char *tl, unsigned iface_len)
{
    uint16_t csum = ucs_crc16_string(tl);
    for (size_t i = 11; i + 19 + iface_len <= a->len; i++) {
        uint16_t c;
        memcpy(&c, a->addr + i, 2);
        if (c == csum && (a->addr[i + 18] & 0x3f) == iface_len)
            return (long)i;
    }
    return -1;
}

/* Bits inside shared-memory addresses that change how UCX reads them. */
TEST(test_ucx_addr_shm_mode_bits_refused)
{
    wk_t a, b;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    ASSERT(wk_open(&b, SHM_TLS, NULL, NULL));
    long posix = find_tl_v1(&b, "posix", 8), cma = find_tl_v1(&b, "cma", 4);
    if (posix < 0 || cma < 0) {
        printf("  skipped: no posix or cma transport here\n");
        wk_close(&b);
        wk_close(&a);
        return;
    }
    struct {
        long at;
        uint8_t bit;
        const char *what;
    } flips[] = {
        {posix + 19 + 7, 0x80, "posix segment id: /proc link"},
        {posix + 19 + 7, 0x40, "posix segment id: shm_open (else a file in a directory)"},
        {posix + 19 + 7, 0x10, "posix segment id: pid namespace follows"},
        {posix - 1, 0x80, "posix device address: IPC namespace follows"},
        {cma + 19 + 3, 0x80, "cma pid: pid namespace follows"},
        {cma - 1, 0x80, "cma device address: IPC namespace follows"},
    };
    uint8_t *m = malloc(b.len);
    for (size_t i = 0; i < sizeof flips / sizeof flips[0]; i++) {
        memcpy(m, b.addr, b.len);
        m[flips[i].at] ^= flips[i].bit;
        const char *why;
        ASSERT_MSG(check(m, b.len, &a, &why) == KVP_ERR_PROTOCOL, "accepted: %s", flips[i].what);
        ASSERT_STR_EQ(why, "UCX shared-memory address mode bits differ from this worker's");
    }
    free(m);
    wk_close(&b);
    wk_close(&a);
}

/* Unified mode packs no iface lengths: nothing can be checked. */
TEST(test_ucx_addr_unified_mode_refused)
{
    setenv("UCX_UNIFIED_MODE", "y", 1);
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    assert_refused(a.addr, a.len, &a, "UCX unified mode addresses cannot be checked (UCX_UNIFIED_MODE=y)");
    wk_close(&a);
}

TEST(test_ucx_addr_header_flags_refused)
{
    wk_t a;
    ASSERT(wk_open(&a, SHM_TLS, NULL, NULL));
    uint8_t *m = malloc(a.len);
    const char *why;
    /* AM-only: a wireup address, never a worker's. */
    memcpy(m, a.addr, a.len);
    m[0] |= 0x80;
    assert_refused(m, a.len, &a, "UCX address header flags differ from this worker's");
    /* Client id and debug info add fields the walk must then find. */
    memcpy(m, a.addr, a.len);
    m[0] |= 0x40;
    ASSERT_EQ(check(m, a.len, &a, &why), KVP_ERR_PROTOCOL);
    m[0] = (uint8_t)((a.addr[0] & 0xef) | 0x10);
    ASSERT_EQ(check(m, a.len, &a, &why), KVP_ERR_PROTOCOL);
    free(m);
    wk_close(&a);
}

TEST_LIST(T(test_ucx_addr_own_passes), T(test_ucx_addr_second_worker_passes_and_connects),
          T(test_ucx_addr_v2_second_worker_passes_and_connects),
          T(test_ucx_addr_version_differs_refused), T(test_ucx_addr_every_truncation_refused),
          T(test_ucx_addr_trailing_byte_refused), T(test_ucx_addr_too_long_refused),
          T(test_ucx_addr_single_byte_mutations_refused_or_harmless),
          T(test_ucx_addr_v2_single_byte_mutations_refused_or_harmless),
          T(test_ucx_addr_tcp_refused), T(test_ucx_addr_tcp_among_others_refused),
          T(test_ucx_addr_no_transport_in_common_refused),
          T(test_ucx_addr_foreign_transport_refused), T(test_ucx_addr_unknown_versions_refused),
          T(test_ucx_addr_empty_list_refused), T(test_ucx_addr_v2_extension_huge_length_refused),
          T(test_ucx_addr_iface_figures_refused), T(test_ucx_addr_device_fields_refused),
          T(test_ucx_addr_more_than_128_transports_refused),
          T(test_ucx_addr_shm_mode_bits_refused), T(test_ucx_addr_unified_mode_refused),
          T(test_ucx_addr_header_flags_refused))
