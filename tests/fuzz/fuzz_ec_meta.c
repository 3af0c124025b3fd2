/* Fuzz target: the EC metadata and worker-metadata msgpack decoders, and the
 * strict JSON parser readiness events go through.  A decoded value must
 * re-encode and decode to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvpool/ec_connector.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_ec_meta_t m;
    if (kvp_ec_meta_decode(data, size, &m) == KVP_OK) {
        uint8_t *buf;
        size_t len;
        if (kvp_ec_meta_encode(&m, &buf, &len) == KVP_OK) {
            kvp_ec_meta_t again;
            if (kvp_ec_meta_decode(buf, len, &again) != KVP_OK)
                abort();
            uint8_t *buf2;
            size_t len2;
            if (kvp_ec_meta_encode(&again, &buf2, &len2) != KVP_OK || len2 != len || memcmp(buf, buf2, len))
                abort();
            kvp_ec_buf_free(buf2, len2);
            kvp_ec_meta_cleanup(&again);
            kvp_ec_buf_free(buf, len);
        }
        kvp_ec_meta_cleanup(&m);
    }
    kvp_ec_worker_meta_t w;
    if (kvp_ec_worker_meta_decode(data, size, &w) == KVP_OK) {
        uint8_t *buf;
        size_t len;
        if (kvp_ec_worker_meta_encode(&w, &buf, &len) == KVP_OK) {
            kvp_ec_worker_meta_t again;
            if (kvp_ec_worker_meta_decode(buf, len, &again) != KVP_OK)
                abort();
            kvp_ec_worker_meta_cleanup(&again);
            kvp_ec_buf_free(buf, len);
        }
        kvp_ec_worker_meta_cleanup(&w);
    }
    kvp_ec_value_t *v;
    if (kvp_ec_json_parse((const char *)data, size, 32, &v) == KVP_OK)
        kvp_ec_value_free(v);
    return 0;
}
