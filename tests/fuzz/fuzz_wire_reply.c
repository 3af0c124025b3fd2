/* Fuzz target: every reply decoder of net/wire_reply.h, on arbitrary bytes.
 * The first byte is the key count the request named (what the client passes
 * as expect), the rest the reply header.  Each decoder runs on its own copy
 * of the decoded envelope, whatever the op field says, so every decoder sees
 * every input.  They must never crash or read out of bounds, and what they
 * accept must keep the bounds they promise. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/wire.h"
#include "net/wire_reply.h"

static kvp_key_result_t g_res[KVP_BATCH_MAX];
static kvp__wire_local_item_t g_items[KVP_BATCH_MAX];
static uint8_t g_present[KVP_BATCH_MAX + 1];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint32_t expect = data[0]; /* 0..255: within KVP_BATCH_MAX */
    size--;
    /* A private copy so out-of-bounds reads hit the sanitizer's redzone. */
    uint8_t *buf = malloc(size);
    memcpy(buf, data + 1, size);
    kvp__wire_reply_t rep0;
    if (kvp__wire_reply_decode(buf, size, &rep0) != KVP_OK) {
        free(buf);
        return 0;
    }
    if (rep0.op > KVP_WOP_MAX || rep0.status > 1 || rep0.status < -1000)
        abort();
    kvp__wire_reply_t rep;
    (void)kvp__wire_reply_data_check(&rep0, size);

    kvp__wire_hello_t h;
    rep = rep0;
    if (kvp__wire_reply_hello_decode(&rep, &h) == KVP_OK && h.has_arena != 0 && h.has_arena != 1)
        abort();

    g_present[expect] = 0xa5; /* a guard just past what may be written */
    rep = rep0;
    (void)kvp__wire_reply_exists_decode(&rep, expect, g_present);
    if (g_present[expect] != 0xa5)
        abort();

    uint64_t m = 0;
    rep = rep0;
    if (kvp__wire_reply_prefix_decode(&rep, expect, &m) == KVP_OK && m > expect)
        abort();
    rep = rep0;
    (void)kvp__wire_reply_remove_all_decode(&rep, &m);

    kvp_pool_stats_t st;
    uint32_t nf = 0;
    rep = rep0;
    if (kvp__wire_reply_stats_decode(&rep, &st, &nf) == KVP_OK && nf > KVP_WIRE_NSTATS)
        abort();

    static const uint32_t result_ops[] = {KVP_WOP_PUT, KVP_WOP_REMOVE, KVP_WOP_GET};
    for (size_t k = 0; k < sizeof result_ops / sizeof result_ops[0]; k++) {
        uint64_t total = 0;
        rep = rep0;
        rep.op = result_ops[k];
        if (kvp__wire_reply_results_decode(&rep, expect, g_res, &total) != KVP_OK)
            continue;
        uint64_t sum = 0;
        for (uint32_t i = 0; i < expect; i++) {
            if (g_res[i].status > 0 || g_res[i].status < -1000)
                abort();
            if (g_res[i].status == KVP_OK && rep.op == KVP_WOP_GET)
                sum += g_res[i].size;
        }
        if (rep.op == KVP_WOP_GET && sum != total)
            abort();
    }

    uint64_t slot, gen;
    uint32_t nok = 0;
    rep = rep0;
    if (kvp__wire_reply_local_decode(&rep, expect, g_items, &slot, &gen, &nok) == KVP_OK) {
        uint32_t ok = 0;
        for (uint32_t i = 0; i < expect; i++) {
            if (g_items[i].status > 0 || g_items[i].status < -1000)
                abort();
            ok += g_items[i].status == KVP_OK;
        }
        if (ok != nok)
            abort();
    }
    free(buf);
    return 0;
}
