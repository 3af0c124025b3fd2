/* Unit tests of src/common/token.c: the token file is its first line, 1..256 bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/token.h"
#include "test.h"

static kvp_status_t parse(const char *s, size_t n, char *buf, size_t *len)
{
    return kvp__token_parse(s, n, buf, KVP__TOKEN_MAX + 1, len);
}

TEST(test_token_is_the_first_line_without_its_end)
{
    char buf[KVP__TOKEN_MAX + 1];
    size_t len;
    ASSERT_OK(parse("secret\n", 7, buf, &len));
    ASSERT_STR_EQ(buf, "secret");
    ASSERT_EQ(len, 6);
    ASSERT_OK(parse("secret\r\nsecond line", 19, buf, &len));
    ASSERT_STR_EQ(buf, "secret");
    ASSERT_OK(parse("s", 1, buf, &len)); /* no line end at all */
    ASSERT_STR_EQ(buf, "s");
    ASSERT_EQ(len, 1);
}

TEST(test_token_must_be_1_to_256_bytes_without_nul)
{
    char buf[KVP__TOKEN_MAX + 1], big[KVP__TOKEN_MAX + 2];
    size_t len = 99;
    ASSERT_EQ(parse("", 0, buf, &len), KVP_ERR_BAD_CONFIG);
    ASSERT_EQ(len, 0);
    ASSERT_EQ(parse("\nsecret\n", 8, buf, &len), KVP_ERR_BAD_CONFIG); /* empty first line */
    ASSERT_EQ(parse("ab\0cd\n", 6, buf, &len), KVP_ERR_BAD_CONFIG);    /* not cut at the NUL */
    memset(big, 'x', sizeof big);
    ASSERT_OK(parse(big, KVP__TOKEN_MAX, buf, &len));
    ASSERT_EQ(len, KVP__TOKEN_MAX);
    ASSERT_EQ(parse(big, KVP__TOKEN_MAX + 1, buf, &len), KVP_ERR_BAD_CONFIG);
    ASSERT_EQ(kvp__token_parse("a", 1, buf, KVP__TOKEN_MAX, &len), KVP_ERR_INVALID_ARG);
}

static void write_file(const char *path, const char *s, size_t n)
{
    FILE *f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(s, 1, n, f), n);
    fclose(f);
}

TEST(test_token_file_read_reads_and_refuses)
{
    char path[] = "/tmp/kvp_token_XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    close(fd);
    char buf[KVP__TOKEN_MAX + 1], big[400];
    size_t len;
    write_file(path, "tok\n", 4);
    ASSERT_OK(kvp__token_file_read(path, buf, sizeof buf, &len));
    ASSERT_STR_EQ(buf, "tok");
    memset(big, 'y', sizeof big);
    write_file(path, big, sizeof big); /* a first line longer than the limit */
    ASSERT_EQ(kvp__token_file_read(path, buf, sizeof buf, &len), KVP_ERR_BAD_CONFIG);
    big[KVP__TOKEN_MAX] = '\n'; /* exactly 256 bytes, then more lines */
    write_file(path, big, sizeof big);
    ASSERT_OK(kvp__token_file_read(path, buf, sizeof buf, &len));
    ASSERT_EQ(len, KVP__TOKEN_MAX);
    write_file(path, "", 0);
    ASSERT_EQ(kvp__token_file_read(path, buf, sizeof buf, &len), KVP_ERR_BAD_CONFIG);
    unlink(path);
    ASSERT_EQ(kvp__token_file_read(path, buf, sizeof buf, &len), KVP_ERR_IO);
}

TEST_LIST(T(test_token_is_the_first_line_without_its_end), T(test_token_must_be_1_to_256_bytes_without_nul),
          T(test_token_file_read_reads_and_refuses))
