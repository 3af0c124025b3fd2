/* Fuzz target: the server's request decoder, the client's reply decoder,
 * the handshake parser and the TCP transport's frame head, on arbitrary
 * bytes.  They must never crash, read out
 * of bounds or accept a request that breaks the limits. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/handshake.h"
#include "net/lane.h"
#include "net/wire.h"

static kvp_key_t g_keys[KVP_BATCH_MAX];
static uint64_t g_sizes[KVP_BATCH_MAX];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy so out-of-bounds reads hit the sanitizer's redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    kvp__wire_req_t rq;
    if (size && kvp__wire_req_decode(buf, size, &rq, g_keys, g_sizes, KVP_BATCH_MAX) == KVP_OK) {
        if (rq.op > KVP_WOP_MAX || rq.nkeys > KVP_BATCH_MAX)
            abort();
        uint64_t total = 0;
        for (uint32_t i = 0; i < rq.nkeys; i++) {
            if (rq.keys[i].len == 0 || rq.keys[i].len > KVP_KEY_MAX)
                abort();
            if ((const uint8_t *)rq.keys[i].data < buf ||
                (const uint8_t *)rq.keys[i].data + rq.keys[i].len > buf + size)
                abort();
            if (rq.op == KVP_WOP_PUT)
                total += rq.sizes[i];
        }
        if (rq.op == KVP_WOP_PUT && total != rq.payload)
            abort();
        if (rq.nreleased > KVP_RELEASED_MAX)
            abort();
    }
    kvp__wire_reply_t rep;
    if (size && kvp__wire_reply_decode(buf, size, &rep) == KVP_OK)
        kvp__mpr_skip(&rep.body);
    kvp__hs_hello_t h;
    size_t used;
    if (kvp__hs_parse_hello(buf, size, &h, &used) == KVP_OK &&
        (used > size || used > KVP_HS_BUF_MAX || (h.version != KVP_HS_V1 && h.version != KVP_HS_V2) ||
         (h.token_len == 0) != (h.token == NULL) || h.token_len > KVP_HS_TOKEN_MAX))
        abort();
    kvp__hs_response_t hr;
    if (kvp__hs_parse_response(buf, size, &hr, &used) == KVP_OK && (used != KVP_HS_RESPONSE || hr.transport > 1))
        abort();
    uint32_t hl;
    uint64_t dl;
    if (size >= KVP_LANE_HEAD && kvp__lane_head_decode(buf, &hl, &dl) == 0 &&
        (hl == 0 || hl > KVP_WIRE_HEADER_MAX || dl > KVP_WIRE_PAYLOAD_MAX))
        abort();
    free(buf);
    return 0;
}
