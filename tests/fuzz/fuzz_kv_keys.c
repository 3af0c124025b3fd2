/*
 * Fuzz target for the store-key parser (src/kv/kv_keys.c).
 * Invariants: parse never crashes or reads outside [data, data+size); a key
 * that parses formats back to exactly the same bytes; the parsed views point
 * inside the input.  Built without libFuzzer it replays
 * tests/fuzz/corpus/fuzz_kv_keys/ as an ordinary test.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "kvpool/kv_connector.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exact-size heap copy, so ASan sees any read past the end. */
    char *s = kvp__malloc(size ? size : 1);
    if (!s)
        return 0;
    if (size)
        memcpy(s, data, size);

    kvp_kv_store_key_t k;
    if (kvp_kv_store_key_parse(s, size, &k) == KVP_OK) {
        if (k.model_name < s || k.model_name + k.model_name_len > s + size)
            abort();
        if (k.cache_prefix &&
            (k.cache_prefix < s || k.cache_prefix + k.cache_prefix_len > s + size))
            abort();
        char out[KVP_KV_STORE_KEY_MAX + 1];
        size_t len = 0;
        if (kvp_kv_store_key_format(&k, out, sizeof out, &len) != KVP_OK)
            abort();
        if (len != size || memcmp(out, s, size) != 0)
            abort();
    }
    const char *name;
    size_t name_len;
    if (kvp_kv_store_key_model_name(s, size, &name, &name_len) == KVP_OK &&
        (name < s || name + name_len > s + size || name_len == 0))
        abort();

    kvp__free(s, size ? size : 1);
    return 0;
}
