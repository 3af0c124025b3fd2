/*
 * The lookup channel's frames (connectors-spec §2.4; vLLM's protocol.py and
 * LookupKeyClient/LookupKeyServer), decoded and encoded without ZeroMQ, so
 * the server, the client and the fuzz target share one bounded decoder:
 *
 *   LOOKUP  "lookup" / u32 BE num_tokens / u16 BE hash_len / hashes [/ u8 apply_eagle]
 *           -> u32 BE hit   (a reply of 4 + 8k bytes is accepted: the newer
 *                            servers append u64 tail_key_boundaries)
 *   RESET   "reset"  -> "\x01" (ACK) or "\x00" (NACK)
 *
 * Anything else -- an unknown tag, a wrong frame count, hash_len 0 with
 * hashes, hash_len over 32 or not dividing the hashes, more than max_hashes,
 * an apply_eagle frame that is not one byte, a RESET with payload -- is a
 * bad message, answered "\x00" by the server.  Pure functions: no
 * allocation, no state; a decoded message points into the caller's frames.
 */
#ifndef KVP_KV_LOOKUP_WIRE_H
#define KVP_KV_LOOKUP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpool/status.h"

#define KVP__LW_TAG_LOOKUP "lookup"
#define KVP__LW_TAG_RESET "reset"
#define KVP__LW_RESP_OK 0x01u
#define KVP__LW_RESP_ERR 0x00u
/* The most frames a well-formed message has (LOOKUP with apply_eagle). */
#define KVP__LW_MAX_FRAMES 5u

typedef struct kvp__lw_frame {
    const uint8_t *data; /* may be NULL when len == 0 */
    size_t len;
} kvp__lw_frame_t;

typedef enum kvp__lw_kind {
    KVP__LW_LOOKUP = 0,
    KVP__LW_RESET,
    KVP__LW_UNKNOWN_TAG, /* the first frame is no known tag */
    KVP__LW_BAD,         /* a known tag with malformed frames */
} kvp__lw_kind_t;

typedef struct kvp__lw_msg {
    kvp__lw_kind_t kind;
    uint32_t num_tokens;
    uint32_t hash_len;
    const uint8_t *hashes; /* num_hashes * hash_len bytes, inside the hashes frame */
    size_t num_hashes;
    bool apply_eagle;      /* true when the frame is absent */
    const char *why;       /* UNKNOWN_TAG / BAD: what was wrong (static text) */
} kvp__lw_msg_t;

/* Decodes one received message of nframes frames (nframes counts every frame
 * received, also those past KVP__LW_MAX_FRAMES, which are not read: frames
 * holds min(nframes, KVP__LW_MAX_FRAMES) entries).  Returns msg->kind. */
kvp__lw_kind_t kvp__lw_decode(const kvp__lw_frame_t *frames, size_t nframes, uint32_t max_hashes,
                              kvp__lw_msg_t *msg);

/* The LOOKUP request's number frames. */
void kvp__lw_put_u32(uint8_t out[4], uint32_t v);
void kvp__lw_put_u16(uint8_t out[2], uint16_t v);

/* A LOOKUP reply: KVP_OK and *hit_p for 4 + 8k bytes (the first u32);
 * KVP_ERR_DECODE otherwise. */
kvp_status_t kvp__lw_decode_hit(const uint8_t *data, size_t len, int64_t *hit_p);
/* A RESET reply: KVP_OK and *ack_p for one byte 0x01 / 0x00; KVP_ERR_DECODE otherwise. */
kvp_status_t kvp__lw_decode_ack(const uint8_t *data, size_t len, bool *ack_p);

/* The largest message a server with max_hashes accepts (its ZMQ_MAXMSGSIZE:
 * libzmq applies it to each frame). */
int64_t kvp__lw_max_msg_size(uint32_t max_hashes);

#endif
