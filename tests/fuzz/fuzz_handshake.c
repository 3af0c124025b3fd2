/* Fuzz target: both sides of the handshake on arbitrary bytes
 * (net/handshake.h).  The input is read as a client's stream by the
 * server's parsers (hello, then the response after it) and as a server's
 * stream by the client's (challenge, then the reply after it, then the
 * address the reply announces).  Nothing may crash or read out of bounds,
 * and nothing out of the limits may be accepted.  The address itself goes
 * through kvpool's UCX address check and endpoint creation in
 * fuzz_ucx_addr.c. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "net/handshake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp__log_set_level(KVP_LOG_ERROR);
    /* A private copy so out-of-bounds reads hit the sanitizer's redzone. */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    size_t used = 0;

    /* The server reading a client. */
    kvp__hs_hello_t h;
    kvp_status_t st = kvp__hs_parse_hello(buf, size, &h, &used);
    if (st == KVP_OK) {
        if (used > size || used > KVP_HS_BUF_MAX)
            abort();
        if (h.version == KVP_HS_V1 && (h.token_len > KVP_HS_TOKEN_MAX || h.addr_len > KVP_HS_ADDR_MAX ||
                                       (h.token_len == 0) != (h.token == NULL)))
            abort();
        if (h.version != KVP_HS_V1 && h.version != KVP_HS_V2)
            abort();
        kvp__hs_response_t r;
        size_t u2;
        if (kvp__hs_parse_response(buf + used, size - used, &r, &u2) == KVP_OK &&
            (u2 != KVP_HS_RESPONSE || u2 > size - used || r.transport > KVP_HS_UCX))
            abort();
    } else if (st != KVP_INPROGRESS && st != KVP_ERR_PROTOCOL && st != KVP_ERR_VERSION) {
        abort();
    }

    /* The client reading a server. */
    kvp__hs_challenge_t c;
    st = kvp__hs_parse_challenge(buf, size, &c, &used);
    if (st == KVP_OK) {
        if (used > size || (c.status == KVP_OK && used != KVP_HS_CHALLENGE) || c.status > 0)
            abort();
        if (c.status == KVP_OK && (c.offers & ~(uint32_t)(KVP_HS_OFFER_TOKEN | KVP_HS_OFFER_UCX)))
            abort();
        kvp__hs_reply_t rep;
        size_t u2;
        if (c.status == KVP_OK && kvp__hs_parse_reply(buf + used, size - used, &rep, &u2) == KVP_OK) {
            if (u2 != KVP_HS_REPLY_V2 || u2 > size - used || rep.addr_len > KVP_HS_ADDR_MAX || rep.status > 0)
                abort();
            /* The macs over what was read (the client checks the server's). */
            uint8_t cn[KVP_HS_NONCE] = {0}, mac[KVP_HS_MAC];
            kvp__hs_server_mac("fuzz-token", cn, c.nonce, rep.conn_key, mac);
            (void)kvp__hs_mac_eq(mac, rep.mac);
        }
    }
    free(buf);
    return 0;
}
