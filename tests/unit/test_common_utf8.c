/* Unit tests of src/common/utf8.c (kvp__utf8_valid is also covered in test_hash.c). */
#include "common/utf8.h"
#include "test.h"

TEST(test_utf8_seq_len_is_the_sequence_length_or_0)
{
    ASSERT_EQ(kvp__utf8_seq_len("a", 1), 1);
    ASSERT_EQ(kvp__utf8_seq_len("", 0), 0);
    ASSERT_EQ(kvp__utf8_seq_len("\xc3\xa9z", 3), 2);
    ASSERT_EQ(kvp__utf8_seq_len("\xe6\xbc\xa2", 3), 3);
    ASSERT_EQ(kvp__utf8_seq_len("\xf0\x9f\x98\x80", 4), 4);
    ASSERT_EQ(kvp__utf8_seq_len("\xf0\x9f\x98", 3), 0);   /* truncated */
    ASSERT_EQ(kvp__utf8_seq_len("\xed\xa0\x80", 3), 0);   /* a surrogate */
    ASSERT_EQ(kvp__utf8_seq_len("\xc0\x80", 2), 0);       /* overlong */
    ASSERT_EQ(kvp__utf8_seq_len("\xf4\x90\x80\x80", 4), 0); /* > U+10FFFF */
    ASSERT_EQ(kvp__utf8_seq_len("\x80", 1), 0);
}

TEST(test_utf8_valid_checks_every_sequence)
{
    ASSERT(kvp__utf8_valid("a\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80z", 11));
    ASSERT(!kvp__utf8_valid("a\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98", 10));
    ASSERT(!kvp__utf8_valid("abc\xff", 4));
}

TEST_LIST(T(test_utf8_seq_len_is_the_sequence_length_or_0), T(test_utf8_valid_checks_every_sequence))
