/*
 * The lookup channel's frames (kv_lookup_wire.h).  Every length is checked
 * before it is used; nothing is allocated; a decoded message is a view of
 * the caller's frames.
 */
#include "kv/kv_lookup_wire.h"

#include <string.h>

#include "kvpool/hash.h"

static bool frame_is(const kvp__lw_frame_t *f, const char *tag)
{
    size_t n = strlen(tag);
    return f->len == n && memcmp(f->data, tag, n) == 0;
}

static uint32_t get_be(const uint8_t *p, size_t n)
{
    uint32_t v = 0;
    for (size_t i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

static kvp__lw_kind_t bad(kvp__lw_msg_t *msg, kvp__lw_kind_t kind, const char *why)
{
    msg->kind = kind;
    msg->why = why;
    return kind;
}

kvp__lw_kind_t kvp__lw_decode(const kvp__lw_frame_t *frames, size_t nframes, uint32_t max_hashes,
                              kvp__lw_msg_t *msg)
{
    memset(msg, 0, sizeof *msg);
    msg->apply_eagle = true;
    if (nframes == 0)
        return bad(msg, KVP__LW_UNKNOWN_TAG, "empty message");
    if (frame_is(&frames[0], KVP__LW_TAG_RESET)) {
        if (nframes != 1)
            return bad(msg, KVP__LW_BAD, "reset with payload frames");
        msg->kind = KVP__LW_RESET;
        return msg->kind;
    }
    if (!frame_is(&frames[0], KVP__LW_TAG_LOOKUP))
        return bad(msg, KVP__LW_UNKNOWN_TAG, "unknown message tag");
    if (nframes != 4 && nframes != 5)
        return bad(msg, KVP__LW_BAD, "lookup needs 4 or 5 frames");
    if (frames[1].len != 4)
        return bad(msg, KVP__LW_BAD, "num_tokens frame is not 4 bytes");
    if (frames[2].len != 2)
        return bad(msg, KVP__LW_BAD, "hash_len frame is not 2 bytes");
    uint32_t hash_len = get_be(frames[2].data, 2);
    size_t blob = frames[3].len;
    if (hash_len == 0 && blob != 0)
        return bad(msg, KVP__LW_BAD, "hash_len 0 with hashes");
    if (hash_len > KVP_HASH_MAX_LEN)
        return bad(msg, KVP__LW_BAD, "hash_len over 32");
    if (hash_len && blob % hash_len)
        return bad(msg, KVP__LW_BAD, "hash_len does not divide the hashes");
    size_t n = hash_len ? blob / hash_len : 0;
    if (n > max_hashes)
        return bad(msg, KVP__LW_BAD, "more hashes than the server accepts");
    if (nframes == 5) {
        if (frames[4].len != 1)
            return bad(msg, KVP__LW_BAD, "apply_eagle frame is not 1 byte");
        msg->apply_eagle = frames[4].data[0] != 0;
    }
    msg->kind = KVP__LW_LOOKUP;
    msg->num_tokens = get_be(frames[1].data, 4);
    msg->hash_len = hash_len;
    msg->hashes = n ? frames[3].data : NULL;
    msg->num_hashes = n;
    return msg->kind;
}

void kvp__lw_put_u32(uint8_t out[4], uint32_t v)
{
    out[0] = (uint8_t)(v >> 24);
    out[1] = (uint8_t)(v >> 16);
    out[2] = (uint8_t)(v >> 8);
    out[3] = (uint8_t)v;
}

void kvp__lw_put_u16(uint8_t out[2], uint16_t v)
{
    out[0] = (uint8_t)(v >> 8);
    out[1] = (uint8_t)v;
}

kvp_status_t kvp__lw_decode_hit(const uint8_t *data, size_t len, int64_t *hit_p)
{
    if (len < 4 || (len - 4) % 8 || !data)
        return KVP_ERR_DECODE;
    *hit_p = (int64_t)get_be(data, 4);
    return KVP_OK;
}

kvp_status_t kvp__lw_decode_ack(const uint8_t *data, size_t len, bool *ack_p)
{
    if (len != 1 || !data || (data[0] != KVP__LW_RESP_OK && data[0] != KVP__LW_RESP_ERR))
        return KVP_ERR_DECODE;
    *ack_p = data[0] == KVP__LW_RESP_OK;
    return KVP_OK;
}

int64_t kvp__lw_max_msg_size(uint32_t max_hashes)
{
    return (int64_t)max_hashes * KVP_HASH_MAX_LEN + 64;
}
