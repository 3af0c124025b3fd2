/*
 * Fuzz target for the KV connector metadata decoder (kv_meta_decode.c): any
 * input either fails to decode with a status, or decodes to a meta that
 * re-encodes and decodes to an equal meta.  Never a crash, a leak or an
 * over-read (built with sanitizers under libFuzzer).
 */
#include <stdint.h>
#include <stdlib.h>

#include "kvpool/kv_connector.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_kv_meta_t *m = NULL;
    kvp_status_t st = kvp_kv_meta_decode(data, size, &m);
    if (st != KVP_OK) {
        if (m != NULL || (st != KVP_ERR_DECODE && st != KVP_ERR_VERSION && st != KVP_ERR_NULL_POINTER))
            abort();
        return 0;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kvp_kv_meta_encode(m, &buf, &len) != KVP_OK)
        abort();
    kvp_kv_meta_t *m2 = NULL;
    if (kvp_kv_meta_decode(buf, len, &m2) != KVP_OK || !kvp_kv_meta_equal(m, m2))
        abort();
    kvp_kv_meta_free(m2);
    kvp_kv_meta_buf_free(buf, len);
    kvp_kv_meta_free(m);
    return 0;
}
