/* Unit tests of the pool URI parser (src/client/uri.c). */
#include <string.h>

#include "client/uri.h"
#include "test.h"

TEST(test_uri_parse_parts_and_options)
{
    kvp__uri_t u;
    ASSERT_OK(kvp__uri_parse("embedded://?capacity=4GiB&low_watermark=0.5", &u));
    ASSERT_STR_EQ(u.scheme, "embedded");
    ASSERT_STR_EQ(u.authority, "");
    ASSERT_EQ(u.nopts, 2);
    ASSERT_STR_EQ(kvp__uri_opt(&u, "capacity"), "4GiB");
    ASSERT_EQ(kvp__uri_check_unused(&u), KVP_ERR_BAD_OPTION); /* low_watermark unread */
    ASSERT_STR_EQ(kvp__uri_opt(&u, "low_watermark"), "0.5");
    ASSERT_OK(kvp__uri_check_unused(&u));
    ASSERT_OK(kvp__uri_parse("etcd://127.0.0.1:2379/cluster1", &u));
    ASSERT_STR_EQ(u.authority, "127.0.0.1:2379");
    ASSERT_STR_EQ(u.path, "cluster1");
}

TEST(test_uri_parse_malformed)
{
    kvp__uri_t u;
    ASSERT_EQ(kvp__uri_parse("", &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse(NULL, &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse("embedded", &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse("://x", &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse("Emb#dded://", &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse("embedded://?capacity", &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse("embedded://?=4", &u), KVP_ERR_BAD_URI);
    ASSERT_EQ(kvp__uri_parse("embedded://?a=1&a=2", &u), KVP_ERR_BAD_URI);
    char longuri[4000];
    memset(longuri, 'a', sizeof longuri - 1);
    longuri[sizeof longuri - 1] = 0;
    memcpy(longuri, "embedded://?", 12);
    ASSERT_EQ(kvp__uri_parse(longuri, &u), KVP_ERR_BAD_URI);
}

TEST_LIST(T(test_uri_parse_parts_and_options), T(test_uri_parse_malformed))
