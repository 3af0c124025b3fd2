/*
 * Fuzz target for the string map (common/strmap.c): each input byte is a put
 * (bit 7 clear) or a delete of one of 73 keys (the empty key, 8 one-byte and
 * 64 two-byte keys, so keys are prefixes of each other), run against the map
 * and a presence-array model.  After every step the counts agree, and at the
 * end every key is found exactly when the model has it: backward-shift
 * deletion must never lose or resurrect an entry.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/strmap.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { NKEYS = 73 };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char keys[NKEYS][3];
    static size_t lens[NKEYS];
    static int vals[NKEYS];
    bool present[NKEYS] = {0};
    size_t n = 0;
    for (int id = 0; id < NKEYS; id++) {
        int c = id - 9;
        lens[id] = id == 0 ? 0 : id < 9 ? 1 : 2;
        keys[id][0] = (char)('a' + (id < 9 ? id - 1 : c / 8));
        keys[id][1] = (char)('a' + (c >= 0 ? c % 8 : 0));
    }
    kvp__strmap_t m;
    kvp__strmap_init(&m);
    for (size_t i = 0; i < size; i++) {
        int id = (data[i] & 0x7f) % NKEYS;
        if (data[i] & 0x80) {
            void *v = kvp__strmap_del(&m, keys[id], lens[id]);
            if (v != (present[id] ? &vals[id] : NULL))
                abort();
            n -= present[id];
            present[id] = false;
        } else {
            if (kvp__strmap_put(&m, keys[id], lens[id], &vals[id]) != KVP_OK)
                abort();
            n += !present[id];
            present[id] = true;
        }
        if (m.n != n)
            abort();
    }
    for (int id = 0; id < NKEYS; id++)
        if (kvp__strmap_get(&m, keys[id], lens[id]) != (present[id] ? &vals[id] : NULL))
            abort();
    kvp__strmap_cleanup(&m);
    return 0;
}
