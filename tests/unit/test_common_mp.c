/* Unit tests of the msgpack additions in src/common/mp.c (the wire forms are tested in test_wire.c). */
#include <string.h>

#include "common/alloc.h"
#include "common/mp.h"
#include "test.h"

static size_t encode(void (*put)(kvp__mpw_t *, int64_t), int64_t v, uint8_t *out)
{
    kvp__mpw_t w;
    kvp__mpw_init(&w, NULL, 0);
    put(&w, v);
    size_t n = w.len;
    memcpy(out, w.buf, n);
    kvp__mpw_free(&w);
    return n;
}

/* kvp__mpw_int keeps the wire's bytes (int64 below -32); the _small form is msgpack's smallest. */
TEST(test_mp_int_small_is_smallest_and_int_keeps_wire_form)
{
    uint8_t b[16];
    ASSERT_EQ(encode(kvp__mpw_int, -33, b), 9);
    ASSERT_EQ(b[0], 0xd3);
    ASSERT_EQ(encode(kvp__mpw_int_small, -33, b), 2);
    ASSERT_MEM_EQ(b, "\xd0\xdf", 2);
    ASSERT_EQ(encode(kvp__mpw_int_small, -32768, b), 3);
    ASSERT_MEM_EQ(b, "\xd1\x80\x00", 3);
    ASSERT_EQ(encode(kvp__mpw_int_small, INT32_MIN, b), 5);
    ASSERT_EQ(encode(kvp__mpw_int_small, (int64_t)INT32_MIN - 1, b), 9);
    ASSERT_EQ(encode(kvp__mpw_int_small, 200, b), 2);
    ASSERT_MEM_EQ(b, "\xcc\xc8", 2);
    for (int64_t v = -70000; v < 70000; v += 7) { /* reads back through kvp__mpr_int */
        size_t n = encode(kvp__mpw_int_small, v, b);
        kvp__mpr_t r;
        kvp__mpr_init(&r, b, n);
        ASSERT_EQ(kvp__mpr_int(&r), v);
        ASSERT(kvp__mpr_done(&r));
    }
}

TEST(test_mp_str_small_uses_str16_and_readers_are_typed)
{
    static char s[300];
    memset(s, 'x', sizeof s);
    kvp__mpw_t w;
    kvp__mpw_init(&w, NULL, 0);
    kvp__mpw_str_small(&w, s, 300);
    kvp__mpw_str(&w, s, 300);
    kvp__mpw_bin(&w, s, 3);
    ASSERT_MEM_EQ(w.buf, "\xda\x01\x2c", 3);
    ASSERT_MEM_EQ(w.buf + 303, "\xdb\x00\x00\x01\x2c", 5);
    kvp__mpr_t r;
    uint32_t n;
    kvp__mpr_init(&r, w.buf, w.len);
    ASSERT(kvp__mpr_str(&r, 300, &n) != NULL && n == 300);
    ASSERT(kvp__mpr_str(&r, 300, &n) != NULL && n == 300);
    ASSERT(kvp__mpr_bin(&r, 3, &n) != NULL && n == 3);
    ASSERT(kvp__mpr_done(&r));
    kvp__mpr_init(&r, w.buf, w.len);
    ASSERT(kvp__mpr_bin(&r, 1000, &n) == NULL); /* a str is not a bin */
    ASSERT(!kvp__mpr_ok(&r));
    kvp__mpr_init(&r, w.buf + 608, w.len - 608);
    ASSERT(kvp__mpr_str(&r, 1000, &n) == NULL); /* a bin is not a str */
    kvp__mpr_init(&r, w.buf, w.len);
    ASSERT(kvp__mpr_str(&r, 299, &n) == NULL); /* over max */
    kvp__mpw_free(&w);
}

TEST(test_mp_array_fit_bounds_the_count_by_the_input)
{
    const uint8_t ok[] = {0x93, 0x01, 0x02, 0x03};
    const uint8_t big[] = {0xdd, 0x00, 0x10, 0x00, 0x00, 0x01};
    kvp__mpr_t r;
    kvp__mpr_init(&r, ok, sizeof ok);
    ASSERT_EQ(kvp__mpr_array_fit(&r, 3), 3);
    ASSERT(kvp__mpr_ok(&r));
    kvp__mpr_init(&r, ok, 3); /* 3 items claimed, 2 bytes left */
    ASSERT_EQ(kvp__mpr_array_fit(&r, 3), 0);
    ASSERT(!kvp__mpr_ok(&r));
    kvp__mpr_init(&r, big, sizeof big);
    ASSERT_EQ(kvp__mpr_array(&r, UINT32_MAX), 1u << 20); /* the plain reader takes it */
    kvp__mpr_init(&r, big, sizeof big);
    ASSERT_EQ(kvp__mpr_array_fit(&r, UINT32_MAX), 0);
    ASSERT(!kvp__mpr_ok(&r));
}

TEST(test_mp_finish_copies_exactly_and_frees_the_writer)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    uint8_t stack[4];
    kvp__mpw_t w;
    kvp__mpw_init(&w, stack, sizeof stack);
    kvp__mpw_str_small(&w, "hello world", 11); /* outgrows the caller's storage */
    uint8_t *buf;
    size_t len;
    ASSERT_EQ(kvp__mpw_finish(&w, &buf, &len), 0);
    ASSERT_EQ(len, 12);
    ASSERT_MEM_EQ(buf, "\xabhello world", 12);
    kvp__free(buf, len);
    kvp__mpw_init(&w, NULL, 0);
    ASSERT_EQ(kvp__mpw_finish(&w, &buf, &len), 0); /* empty: one byte, len 0 */
    ASSERT_EQ(len, 0);
    kvp__free(buf, 1);
    kvp__mpw_init(&w, NULL, 0);
    kvp__alloc_fail_after(0);
    kvp__mpw_nil(&w);
    ASSERT_EQ(kvp__mpw_finish(&w, &buf, &len), -1);
    kvp__alloc_fail_reset();
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
}

TEST_LIST(T(test_mp_int_small_is_smallest_and_int_keeps_wire_form), T(test_mp_str_small_uses_str16_and_readers_are_typed),
          T(test_mp_array_fit_bounds_the_count_by_the_input), T(test_mp_finish_copies_exactly_and_frees_the_writer))
