/*
 * Checking a peer's UCX worker address before UCX sees it.
 *
 * Why.  The handshake hands each side the other's packed worker address, and
 * the receiver gives it to ucp_ep_create.  UCX 1.13.1 reads that address in
 * ucp_address_unpack (src/ucp/wireup/address.c) with no bounds at all: it
 * does not know the buffer's length, trusts every length byte and flag, and
 * asserts on what it does not expect.  A truncated or altered address
 * crashes the process inside UCX (seen: SEGV in uct_tcp_ep_set_dest_addr,
 * uct_iface_local_is_reachable and libuct_cma; "score >= 0.0" in select.c;
 * "addr version 15" in address.c).  So kvpool walks the address itself,
 * first, with every read bounded by the length the handshake framed.
 *
 * The format (UCX 1.13.1, a *worker* address as ucp_worker_get_address packs
 * it and as ucp_ep_create unpacks it, with the unpack flags
 * ucp_worker_default_address_pack_flags gives: uuid, name, device and iface
 * addresses, ep addresses, maybe sys_dev; never TL_RSC_IDX).  Integers are in
 * the packer's byte order (kvpool peers share a host type):
 *
 *   header   v1: 1 byte, version in bits 0-3, flags in bits 4-7
 *            v2: 2 bytes, version byte (high nibble 0) then a flags byte
 *            flags: debug info 1, worker uuid 2, client id 4, AM only 8
 *   uuid     8 bytes: always in v1 (unpack reads it whatever the flag says,
 *            the flag being newer than the format), in v2 only with the flag
 *   client   8 bytes, with the client-id flag
 *   name     u8 length + that many bytes, with the debug-info flag
 *   then one record per device; a first byte 0xff instead means "no
 *   transports", which UCX accepts and kvpool refuses:
 *     md       byte: bit 7 "device has no transports"; index in bits 0-4 (v1;
 *              bits 5-6 are md capability flags) or 0-6 (v2, 127 = the index
 *              is the next byte)
 *     dev len  byte: bit 7 last device, bit 6 num_paths follows, bit 5
 *              sys_dev follows; length in bits 0-4 (v2: 31 = next byte)
 *     [num_paths u8] [sys_dev u8] device address
 *     then, unless the device has no transports, one record per transport:
 *       tl name checksum u16 (ucs_crc16_string of the transport's name)
 *       iface attrs: v1 16 bytes (float overhead, bandwidth, latency; u32
 *         priority and capability bits), v2 8 bytes (fp8 overhead,
 *         bandwidth, latency; u8 priority; u16 segment size; u16 flags)
 *       iface len byte: bit 7 last transport of the device, bit 6 ep
 *         addresses follow; length in bits 0-5 (v2: 63 = next byte)
 *       iface address
 *       (ep addresses: only in wireup addresses, never in a worker's)
 *
 * What the check guarantees.  Every byte UCX's unpack will read lies inside
 * the buffer, and UCX reaches the end exactly where the buffer ends; nothing
 * reaches one of UCX's asserts on the format (version, ep-address count,
 * 128-entry limit) or its arithmetic with values it never expects from a
 * UCX peer (a bandwidth that is zero, negative or NaN; a latency or overhead
 * that is negative, infinite or NaN; an md index or sys_dev past its 64-bit
 * map; zero paths).  Floats are also held to plausible ranges (a time of at
 * most a second, a bandwidth from 1 KB/s to 1 PB/s), which every real
 * transport's figures fall in.  Every transport the peer names is one this
 * worker has, with the same device- and iface-address lengths as this
 * worker's own address gives for it: UCX hands those addresses to the
 * transport's reachability and connect code, which reads a fixed-size
 * structure and never looks at the length.  In v2, a transport's segment
 * size (UCX's largest AM fragment to the peer) is at least this worker's:
 * a smaller one, 0 say, trips UCX's asserts when it sizes the endpoint's
 * protocols.  For UCX's shared-memory transports, the few mode bits inside
 * their addresses that change what UCX reads next or how it attaches (see
 * mode_bits_differ) equal this worker's.  tcp is refused outright: a tcp
 * address names an IP and port that UCX would connect to on the peer's
 * say-so, and kvpool's own TCP lane is the path for peers without shared
 * memory or RDMA.
 *
 * What it cannot guarantee.  The content of an address is trusted: a shared
 * memory segment id, a /proc link's pid and fd, a pid for cma, a host or
 * namespace id, an RDMA transport's addresses (whose inner layout the check
 * does not know).  A peer that passes a valid but foreign id makes UCX
 * attach to some other segment or file of the same user, or fail; the trust
 * boundary is the uid (shared memory only works between processes of one
 * user anyway, and the token check comes first).  Nor does the check know
 * the peer's UCX version beyond its format: a later UCX that changes the
 * layout without changing the version nibble would need this file changed.
 * Unified mode (UCX_UNIFIED_MODE=y) packs no iface lengths at all, leaving
 * the reader to take them from its own interfaces, so such an address
 * cannot be bounded from its bytes; under a UCX configuration in unified
 * mode every address is refused.  Being strict about "same as own" costs
 * peers whose configuration differs (a transport only one side has, another
 * shared-memory mode): they are refused, and should use kvpool's TCP lane.
 */
#include "net/ucx_addr.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ucp/api/ucp.h>
#include <ucs/algorithm/crc.h>

enum {
    ADDR_V1 = 0,
    ADDR_V2 = 1,

    HDR_DEBUG_INFO = 1u << 0,
    HDR_WORKER_UUID = 1u << 1,
    HDR_CLIENT_ID = 1u << 2,
    HDR_AM_ONLY = 1u << 3,
    HDR_FLAGS_KNOWN = (1u << 4) - 1,

    NULL_RESOURCE = 0xff,     /* first device byte of an empty address list */
    MD_EMPTY_DEV = 0x80,      /* device record without transports */
    MD_MASK_V1 = 0x1f,
    MD_MASK_V2 = 0x7f,
    MD_INDEX_MAX = 64,        /* UCX keeps md indexes in a 64-bit map */
    DEV_LAST = 1u << 7,
    DEV_NUM_PATHS = 1u << 6,
    DEV_SYS_DEVICE = 1u << 5,
    DEV_LEN_MASK = (1u << 5) - 1,
    SYS_DEV_MAX = 64,         /* UCP_MAX_SYS_DEVICES (a 64-bit map again) */
    SYS_DEV_UNKNOWN = 0xff,
    TL_LAST = 1u << 7,
    TL_HAS_EP_ADDR = 1u << 6,
    TL_LEN_MASK = (1u << 6) - 1,
    TL_MAX = 128,             /* UCP_MAX_RESOURCES */

    ATTR_V1_SIZE = 16,
    ATTR_V2_SIZE = 8,
    V1_CAP_UNKNOWN = 0x3fc00000, /* prio_cap_flags bits 22-29 are not used */
    V2_FLAGS_KNOWN = 0x03ff,     /* UCP_ADDR_IFACE_FLAG_* bits 0-9 */
    FP8_EXP_MASK = 0x0f,         /* exponent 15: NaN or infinity */
};

#define TIME_MAX_S 1.0   /* overhead, latency: seconds */
#define BW_MIN 1e3       /* bandwidth: bytes per second */
#define BW_MAX 1e15

/* Bounded reader over buf[0..len). */
typedef struct rd {
    const uint8_t *p;
    size_t len, pos;
} rd_t;

static int rd_u8(rd_t *r, uint8_t *v)
{
    if (r->pos >= r->len)
        return 0;
    *v = r->p[r->pos++];
    return 1;
}

/* The next n bytes, or NULL when fewer remain. */
static const uint8_t *rd_take(rd_t *r, size_t n)
{
    if (n > r->len - r->pos)
        return NULL;
    const uint8_t *q = r->p + r->pos;
    r->pos += n;
    return q;
}

/* A value in the `mask` bits of byte `first`; in v2, the value `mask` itself
 * says the real value is the whole next byte. */
static int rd_ext(rd_t *r, uint8_t first, unsigned mask, int v2, unsigned *v)
{
    *v = first & mask;
    if (v2 && *v == mask) {
        uint8_t b;
        if (!rd_u8(r, &b))
            return 0;
        *v = b;
    }
    return 1;
}

typedef struct tl {
    uint16_t csum;      /* ucs_crc16_string(transport name) */
    uint8_t dev_len;    /* device address length */
    uint8_t iface_len;  /* iface address length */
    uint16_t seg_size;  /* v2: largest AM fragment received, in 64-byte units */
    const uint8_t *dev;   /* device address (dev_len bytes, in the walked buffer) */
    const uint8_t *iface; /* iface address (iface_len bytes) */
} tl_t;

/* What a walk learns of an address. */
typedef struct walk {
    unsigned version;
    unsigned flags;     /* header flags */
    unsigned ntl;
    tl_t tl[TL_MAX];
} walk_t;

static int time_ok(float t)
{
    return isfinite(t) && t >= 0.0f && t <= TIME_MAX_S;
}

static const char *attr_v1_bad(const uint8_t *a)
{
    float ovh, bw, lat;
    uint32_t prio_cap;
    memcpy(&ovh, a, 4);
    memcpy(&bw, a + 4, 4);
    memcpy(&lat, a + 8, 4);
    memcpy(&prio_cap, a + 12, 4);
    if (!time_ok(ovh))
        return "UCX iface overhead negative, not finite or over a second";
    if (!time_ok(lat))
        return "UCX iface latency negative, not finite or over a second";
    if (!(isfinite(bw) && bw >= BW_MIN && bw <= BW_MAX))
        return "UCX iface bandwidth not positive, not finite or implausible";
    if (prio_cap & V1_CAP_UNKNOWN)
        return "unknown UCX iface capability bits";
    return NULL;
}

static const char *attr_v2_bad(const uint8_t *a)
{
    uint16_t flags;
    memcpy(&flags, a + 6, 2);
    if ((a[0] & FP8_EXP_MASK) == FP8_EXP_MASK || (a[2] & FP8_EXP_MASK) == FP8_EXP_MASK)
        return "UCX iface overhead or latency not finite";
    if ((a[1] & FP8_EXP_MASK) == FP8_EXP_MASK || (a[1] & FP8_EXP_MASK) == 0)
        return "UCX iface bandwidth zero or not finite";
    if (flags & ~V2_FLAGS_KNOWN)
        return "unknown UCX iface flag bits";
    return NULL;
}

/* Walks a worker address the way ucp_address_unpack will, bounded; NULL when
 * it is well formed (and *w filled), else the reason. */
static const char *walk(const uint8_t *p, size_t len, walk_t *w)
{
    rd_t r = {p, len, 0};
    uint8_t b;
    if (len == 0)
        return "empty UCX address";
    if (len > KVP_UCX_ADDR_MAX)
        return "UCX address longer than KVP_UCX_ADDR_MAX";
    (void)rd_u8(&r, &b);
    w->version = b & 0x0fu;
    if (w->version == ADDR_V1) {
        w->flags = b >> 4;
    } else if (w->version == ADDR_V2) {
        if (b >> 4)
            return "unknown bits in a v2 UCX address header";
        if (!rd_u8(&r, &b))
            return "truncated UCX address header";
        if (b & ~HDR_FLAGS_KNOWN)
            return "unknown UCX address header flags";
        w->flags = b;
    } else {
        return "unknown UCX address version";
    }
    int v2 = w->version == ADDR_V2;
    if ((!v2 || (w->flags & HDR_WORKER_UUID)) && !rd_take(&r, 8))
        return "truncated UCX worker uuid";
    if ((w->flags & HDR_CLIENT_ID) && !rd_take(&r, 8))
        return "truncated UCX client id";
    if ((w->flags & HDR_DEBUG_INFO) && (!rd_u8(&r, &b) || !rd_take(&r, b)))
        return "truncated UCX worker name";
    if (r.pos >= len)
        return "UCX address ends before its device list";
    if (p[r.pos] == NULL_RESOURCE)
        return "UCX address lists no transports";

    w->ntl = 0;
    int last_dev;
    do {
        uint8_t mdb, devb;
        unsigned md, dev_len;
        if (!rd_u8(&r, &mdb) || !rd_ext(&r, mdb, v2 ? MD_MASK_V2 : MD_MASK_V1, v2, &md))
            return "truncated UCX device record";
        if (md >= MD_INDEX_MAX)
            return "UCX memory domain index out of range";
        if (!rd_u8(&r, &devb) || !rd_ext(&r, devb, DEV_LEN_MASK, v2, &dev_len))
            return "truncated UCX device record";
        last_dev = devb & DEV_LAST;
        if (devb & DEV_NUM_PATHS) {
            if (!rd_u8(&r, &b))
                return "truncated UCX device record";
            if (b == 0)
                return "UCX device with zero paths";
        }
        if (devb & DEV_SYS_DEVICE) {
            if (!rd_u8(&r, &b))
                return "truncated UCX device record";
            if (b >= SYS_DEV_MAX && b != SYS_DEV_UNKNOWN)
                return "UCX system device index out of range";
        }
        const uint8_t *dev = rd_take(&r, dev_len);
        if (!dev)
            return "UCX device address runs past the end";
        int last_tl = mdb & MD_EMPTY_DEV;
        while (!last_tl) {
            if (w->ntl >= TL_MAX)
                return "more than 128 UCX transport entries";
            const uint8_t *csum = rd_take(&r, 2);
            const uint8_t *attr = csum ? rd_take(&r, v2 ? ATTR_V2_SIZE : ATTR_V1_SIZE) : NULL;
            if (!attr)
                return "truncated UCX transport record";
            const char *why = v2 ? attr_v2_bad(attr) : attr_v1_bad(attr);
            if (why)
                return why;
            uint8_t lenb;
            unsigned iface_len;
            if (!rd_u8(&r, &lenb) || !rd_ext(&r, lenb, TL_LEN_MASK, v2, &iface_len))
                return "truncated UCX transport record";
            if (lenb & TL_HAS_EP_ADDR)
                return "endpoint addresses in a UCX worker address";
            last_tl = lenb & TL_LAST;
            const uint8_t *iface = rd_take(&r, iface_len);
            if (!iface)
                return "UCX iface address runs past the end";
            tl_t *t = &w->tl[w->ntl++];
            t->dev = dev;
            t->iface = iface;
            memcpy(&t->csum, csum, 2);
            t->dev_len = (uint8_t)dev_len;
            t->iface_len = (uint8_t)iface_len;
            t->seg_size = 0;
            if (v2)
                memcpy(&t->seg_size, attr + 4, 2);
        }
    } while (!last_dev);
    if (r.pos != len)
        return "trailing bytes after the UCX address";
    if (w->ntl == 0)
        return "UCX address lists no transports";
    return NULL;
}

/* Mode bits inside the addresses of UCX 1.13.1's shared-memory transports,
 * which tell UCX how much to read or which way to attach; a peer's must
 * equal own's for the same transport (its lengths already do):
 *  - the device address of posix, sysv, xpmem, cma and knem (one host, "a
 *    system id"): bit 63 says an IPC namespace id follows;
 *  - posix's iface address begins with the FIFO segment id, whose bits
 *    60-63 pick /proc link, shm_open or a file in a directory (a file with
 *    no directory in the address asserts), huge pages, and a pid namespace
 *    id that follows;
 *  - cma's iface address is the pid, whose bit 31 says a pid namespace id
 *    follows. */
#define SM_DEV_NS_BIT 0x8000000000000000ull
#define POSIX_SEG_MODE_BITS 0xf000000000000000ull
#define CMA_PID_NS_BIT 0x80000000u

/* Whether the `mask` bits of the native u64 (len 8) or u32 (len 4) at a and
 * b differ. */
static int bits_differ(const uint8_t *a, const uint8_t *b, unsigned len, uint64_t mask)
{
    if (len == 4) {
        uint32_t x, y;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        return ((x ^ y) & mask) != 0;
    }
    uint64_t x, y;
    memcpy(&x, a, 8);
    memcpy(&y, b, 8);
    return ((x ^ y) & mask) != 0;
}

/* Transport name checksums the rules name (ucs_crc16_string of the name,
 * as UCX packs them). */
typedef struct names {
    uint16_t tcp, posix, cma;
    uint16_t sm_dev[5]; /* transports with a shared-memory device address */
} names_t;

static void names_init(names_t *n)
{
    static const char *const sm_dev[5] = {"posix", "sysv", "xpmem", "cma", "knem"};
    n->tcp = ucs_crc16_string("tcp");
    n->posix = ucs_crc16_string("posix");
    n->cma = ucs_crc16_string("cma");
    for (size_t i = 0; i < 5; i++)
        n->sm_dev[i] = ucs_crc16_string(sm_dev[i]);
}

static int mode_bits_differ(const names_t *n, const tl_t *peer, const tl_t *own)
{
    int sm = 0;
    for (size_t i = 0; i < 5; i++)
        sm |= peer->csum == n->sm_dev[i];
    if (sm && peer->dev_len >= 8 && bits_differ(peer->dev, own->dev, 8, SM_DEV_NS_BIT))
        return 1;
    if (peer->csum == n->posix && peer->iface_len >= 8 &&
        bits_differ(peer->iface, own->iface, 8, POSIX_SEG_MODE_BITS))
        return 1;
    if (peer->csum == n->cma && peer->iface_len >= 4 &&
        bits_differ(peer->iface, own->iface, 4, CMA_PID_NS_BIT))
        return 1;
    return 0;
}

/* Whether this process's UCX configuration (environment and config files,
 * read as kvp__ucx_open reads them) is in unified mode; read once.  -1: the
 * configuration cannot be read, so no context could be made from it. */
static int g_unified;
static pthread_once_t g_unified_once = PTHREAD_ONCE_INIT;

static void read_unified(void)
{
    ucp_config_t *cfg;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK) {
        g_unified = -1;
        return;
    }
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    if (!f) {
        g_unified = -1;
    } else {
        ucp_config_print(cfg, f, NULL, UCS_CONFIG_PRINT_CONFIG);
        fclose(f);
        const char *at = text ? strstr(text, "UCX_UNIFIED_MODE=") : NULL;
        g_unified = at && at[sizeof "UCX_UNIFIED_MODE=" - 1] == 'y';
    }
    free(text);
    ucp_config_release(cfg);
}

static const char *check(const void *peer, size_t peer_len, const void *own, size_t own_len)
{
    walk_t pw, ow;
    if (!peer || !peer_len)
        return "no UCX address";
    if (!own || !own_len)
        return "no own UCX address to compare with";
    pthread_once(&g_unified_once, read_unified);
    if (g_unified < 0)
        return "UCX configuration unreadable";
    if (g_unified)
        return "UCX unified mode addresses cannot be checked (UCX_UNIFIED_MODE=y)";
    if (walk(own, own_len, &ow))
        return "this worker's own UCX address is not in the format the check reads";
    const char *why = walk(peer, peer_len, &pw);
    if (why)
        return why;
    if (pw.version != ow.version)
        return "UCX address version differs from this worker's";
    if ((pw.flags ^ ow.flags) & (HDR_WORKER_UUID | HDR_AM_ONLY))
        return "UCX address header flags differ from this worker's";

    names_t names;
    names_init(&names);
    unsigned common = 0, foreign = 0, mismatched = 0, modes = 0;
    for (unsigned i = 0; i < pw.ntl; i++) {
        const tl_t *t = &pw.tl[i];
        if (t->csum == names.tcp)
            return "UCX address names the tcp transport";
        int named = 0, fits = 0, moded = 0;
        for (unsigned j = 0; j < ow.ntl && !fits; j++) {
            const tl_t *o = &ow.tl[j];
            if (o->csum != t->csum)
                continue;
            named = 1;
            if (o->dev_len != t->dev_len || o->iface_len != t->iface_len ||
                t->seg_size < o->seg_size)
                continue;
            if (mode_bits_differ(&names, t, o))
                moded = 1;
            else
                fits = 1;
        }
        common += named;
        foreign += !named;
        modes += named && !fits && moded;
        mismatched += named && !fits && !moded;
    }
    if (!common)
        return "no UCX transport in common";
    if (foreign)
        return "UCX address names a transport this worker does not have";
    if (mismatched)
        return "UCX transport address lengths or segment size differ from this worker's";
    if (modes)
        return "UCX shared-memory address mode bits differ from this worker's";
    return NULL;
}

kvp_status_t kvp__ucx_addr_check(const void *peer, size_t peer_len, const void *own, size_t own_len,
                                 const char **why_p)
{
    const char *why = check(peer, peer_len, own, own_len);
    if (why_p)
        *why_p = why;
    return why ? KVP_ERR_PROTOCOL : KVP_OK;
}
