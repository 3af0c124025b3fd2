/*
 * The EC push data plane's two formats, encoder and decoder side by side
 * (ec_push_wire.c; fuzzed by tests/fuzz/fuzz_ec_push_wire.c).
 *
 * 1. The session string (the reserve reply's dst_session): one printable
 *    ASCII string, fields separated by ';', in this order, each at most once:
 *
 *      kvp-ec1                      format and version (required, first)
 *      ;tcp=HOST:PORT               the receiver's data port (optional)
 *      ;base=HEX                    the slab's address in the consumer (required)
 *      ;size=HEX                    the slab's length, > 0 (required)
 *      ;ucx=HEX                     the receiver's UCX worker address (optional)
 *      ;rkey=HEX                    the packed rkey of the slab (with ucx only)
 *
 *    HOST: 1..KVP__EC_HOST_MAX characters of [A-Za-z0-9.-_]; PORT: decimal
 *    1..65535 without leading zeros; base and size: 1..16 hex digits, and
 *    base + size must not overflow; ucx and rkey: lowercase or uppercase hex
 *    of an even length, at most KVP_UCX_ADDR_MAX and KVP__EC_RKEY_MAX bytes
 *    decoded.  At least one path (tcp, or ucx with rkey).  Unknown or
 *    repeated keys, fields out of order, anything else: KVP_ERR_DECODE.  The
 *    whole string is at most KVP__EC_SESSION_MAX bytes.
 *
 *    dst_ptr (the slot) must satisfy base <= dst_ptr and dst_ptr + len <=
 *    base + size (kvp__ec_session_range); the producer checks this before
 *    any write.  Over TCP the receiver checks the slot again against its
 *    reservations; over UCX RMA it cannot (one-sided), so the producer's
 *    check is the only one there.
 *
 * 2. The TCP frames, inside kvpool's TCP framing (net/lane.h: u32 hdr_len,
 *    u64 data_len, header, data; big-endian):
 *
 *      write   header  "KVPE" u16 version(1) u8 kind(1) u8 rid_len
 *                      u64 offset u64 length  rid[rid_len]
 *              data    exactly `length` bytes (length == data_len)
 *      status  header  "KVPE" u16 version(1) u8 kind(2) u8 0
 *                      i32 status u32 0 u64 landed
 *              data    none (data_len 0)
 *
 *    offset: the slot's offset in the slab; rid: the reservation id, 0..
 *    KVP__EC_PUSH_RID_MAX printable bytes (0x21..0x7e).  The receiver answers
 *    every write with one status frame: KVP_OK once the last byte landed
 *    (landed == length), or an error before any byte moved (the range is out
 *    of the slab or not reserved: KVP_ERR_INVALID_ARG; a malformed header:
 *    KVP_ERR_PROTOCOL; another version: KVP_ERR_VERSION; too many
 *    connections: KVP_ERR_BUSY), after which it closes the connection.
 */
#ifndef KVP_EC_PUSH_WIRE_H
#define KVP_EC_PUSH_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"
#include "net/ucx_addr.h"

#define KVP__EC_SESSION_PREFIX "kvp-ec1"
#define KVP__EC_HOST_MAX 253u
#define KVP__EC_RKEY_MAX 4096u
/* prefix + every field at its longest */
#define KVP__EC_SESSION_MAX (64u + KVP__EC_HOST_MAX + 2u * KVP_UCX_ADDR_MAX + 2u * KVP__EC_RKEY_MAX)

typedef struct kvp__ec_session {
    char host[KVP__EC_HOST_MAX + 1]; /* "" and port 0: no TCP path */
    uint16_t port;
    uint64_t base, size;             /* the slab in the consumer's address space */
    uint8_t ucx_addr[KVP_UCX_ADDR_MAX];
    size_t ucx_addr_len;             /* 0: no UCX path (rkey_len 0 too) */
    uint8_t rkey[KVP__EC_RKEY_MAX];
    size_t rkey_len;
} kvp__ec_session_t;

/* Parses s (NUL-terminated, read up to KVP__EC_SESSION_MAX + 1 bytes) into
 * *out.  KVP_OK, or KVP_ERR_DECODE (anything the format above does not
 * allow; *out then undefined).  Never reads past the terminator. */
kvp_status_t kvp__ec_session_decode(const char *s, kvp__ec_session_t *out);
/* Writes the session string of s into out[0..cap) (NUL-terminated).  Returns
 * its length, or 0 when s breaks the rules above or cap is too small. */
size_t kvp__ec_session_encode(const kvp__ec_session_t *s, char *out, size_t cap);
/* The bounds rule: KVP_OK and *offset_p = dst_ptr - base when [dst_ptr,
 * dst_ptr + len) lies inside [base, base + size); KVP_ERR_INVALID_ARG
 * otherwise (overflow included). */
kvp_status_t kvp__ec_session_range(const kvp__ec_session_t *s, uint64_t dst_ptr, uint64_t len, uint64_t *offset_p);

#define KVP__EC_PUSH_MAGIC "KVPE"
#define KVP__EC_PUSH_VERSION 1u
#define KVP__EC_PUSH_KIND_WRITE 1u
#define KVP__EC_PUSH_KIND_STATUS 2u
#define KVP__EC_PUSH_RID_MAX 64u
#define KVP__EC_PUSH_WRITE_FIXED 24u
#define KVP__EC_PUSH_WRITE_MAX (KVP__EC_PUSH_WRITE_FIXED + KVP__EC_PUSH_RID_MAX)
#define KVP__EC_PUSH_STATUS_LEN 24u

typedef struct kvp__ec_push_write_hdr {
    uint64_t offset, length;
    char rid[KVP__EC_PUSH_RID_MAX + 1]; /* NUL-terminated */
} kvp__ec_push_write_hdr_t;

/* Encodes a write header into out (KVP__EC_PUSH_WRITE_MAX bytes).  Returns
 * its length, or 0 when rid is longer than KVP__EC_PUSH_RID_MAX or holds a
 * byte outside 0x21..0x7e. */
size_t kvp__ec_push_write_encode(uint8_t out[KVP__EC_PUSH_WRITE_MAX], uint64_t offset, uint64_t length,
                                 const char *rid);
/* Decodes the header of a lane frame with data_len bytes of data.  KVP_OK;
 * KVP_ERR_VERSION (the magic matches, the version does not); KVP_ERR_PROTOCOL
 * (anything else: short or long header, bad magic or kind, rid_len beyond
 * the header or KVP__EC_PUSH_RID_MAX, a bad rid byte, length != data_len). */
kvp_status_t kvp__ec_push_write_decode(const uint8_t *hdr, size_t hdr_len, uint64_t data_len,
                                       kvp__ec_push_write_hdr_t *out);

/* Encodes a status header into out. */
void kvp__ec_push_status_encode(uint8_t out[KVP__EC_PUSH_STATUS_LEN], kvp_status_t status, uint64_t landed);
/* Decodes a status frame's header (data_len must be 0).  KVP_OK with
 * *status_p (one of the statuses listed above) and *landed_p, else
 * KVP_ERR_PROTOCOL or KVP_ERR_VERSION. */
kvp_status_t kvp__ec_push_status_decode(const uint8_t *hdr, size_t hdr_len, uint64_t data_len,
                                        kvp_status_t *status_p, uint64_t *landed_p);

#endif
