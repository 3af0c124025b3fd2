/*
 * Fuzz target for the lookup channel's frame decoder (src/kv/kv_lookup_wire.c).
 * Input: byte 0 picks max_hashes (0..255), then frames, each a u16
 * little-endian length and that many bytes (a length past the end takes what
 * is left), as the server would receive them: the first KVP__LW_MAX_FRAMES
 * kept, the rest only counted.  Every frame is an exact-size heap copy, so
 * ASan sees any read past a frame.  Invariants: a LOOKUP is exactly 4 or 5
 * frames whose hashes tile the hashes frame (hash_len 1..32, or 0 with no
 * hashes), never more than max_hashes; a RESET is one frame; anything else
 * names why; the reply decoders accept exactly 4 + 8k bytes / one 0x00|0x01.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kv/kv_lookup_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint32_t max_hashes = data[0];
    size_t off = 1, nframes = 0;
    kvp__lw_frame_t frames[KVP__LW_MAX_FRAMES];
    uint8_t *copies[KVP__LW_MAX_FRAMES];
    size_t lens[KVP__LW_MAX_FRAMES];
    while (off < size) {
        size_t len = off + 2 <= size ? (size_t)(data[off] | data[off + 1] << 8) : 0;
        off = off + 2 <= size ? off + 2 : size;
        if (len > size - off)
            len = size - off;
        if (nframes < KVP__LW_MAX_FRAMES) {
            copies[nframes] = kvp__malloc(len ? len : 1);
            if (!copies[nframes])
                abort();
            memcpy(copies[nframes], data + off, len);
            lens[nframes] = len ? len : 1;
            frames[nframes] = (kvp__lw_frame_t){copies[nframes], len};
        }
        nframes++;
        off += len;
    }
    kvp__lw_msg_t m;
    kvp__lw_kind_t k = kvp__lw_decode(frames, nframes, max_hashes, &m);
    if (k != m.kind)
        abort();
    if (k == KVP__LW_LOOKUP) {
        if (nframes != 4 && nframes != 5)
            abort();
        if (m.hash_len > 32 || m.num_hashes > max_hashes)
            abort();
        if (m.hash_len ? m.num_hashes * m.hash_len != frames[3].len : frames[3].len != 0)
            abort();
        if (m.num_hashes && m.hashes != frames[3].data)
            abort();
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < m.num_hashes * m.hash_len; i++)
            sink ^= m.hashes[i];
        (void)sink;
    } else if (k == KVP__LW_RESET) {
        if (nframes != 1)
            abort();
    } else if (!m.why) {
        abort();
    }
    int64_t hit;
    kvp_status_t st = kvp__lw_decode_hit(data, size, &hit);
    if ((st == KVP_OK) != (size >= 4 && (size - 4) % 8 == 0) || (st == KVP_OK && hit < 0))
        abort();
    bool ack;
    st = kvp__lw_decode_ack(data, size, &ack);
    if ((st == KVP_OK) != (size == 1 && data[0] <= 1))
        abort();
    for (size_t i = 0; i < nframes && i < KVP__LW_MAX_FRAMES; i++)
        kvp__free(copies[i], lens[i]);
    return 0;
}
