/* Unit tests of src/common: status names, sizes and durations, the allocation shim. */
#include <pthread.h>
#include <string.h>

#include "common/alloc.h"
#include "common/thread.h"
#include "common/units.h"
#include "kvpool/status.h"
#include "test.h"

TEST(test_status_every_code_has_name_and_message)
{
#define CHECK_CODE(name, value, msg)                                  \
    ASSERT_STR_EQ(kvp_status_name(name), #name);                      \
    ASSERT_STR_EQ(kvp_status_str(name), msg);                         \
    ASSERT(strlen(msg) > 0);
    KVP_STATUS_LIST(CHECK_CODE)
#undef CHECK_CODE
    ASSERT_STR_EQ(kvp_status_name((kvp_status_t)-12345), "KVP_UNKNOWN_STATUS");
    ASSERT_STR_EQ(kvp_status_str((kvp_status_t)-12345), "unknown status");
    ASSERT_EQ(KVP_OK, 0);
    ASSERT_EQ(KVP_INPROGRESS, 1);
}

TEST(test_parse_size_units)
{
    uint64_t v;
    ASSERT_OK(kvp__parse_size("4GiB", &v));
    ASSERT_EQ(v, 4ull << 30);
    ASSERT_OK(kvp__parse_size("512MiB", &v));
    ASSERT_EQ(v, 512ull << 20);
    ASSERT_OK(kvp__parse_size("64KiB", &v));
    ASSERT_EQ(v, 65536);
    ASSERT_OK(kvp__parse_size("100B", &v));
    ASSERT_EQ(v, 100);
    ASSERT_OK(kvp__parse_size("100", &v));
    ASSERT_EQ(v, 100);
    ASSERT_OK(kvp__parse_size("1.5GB", &v)); /* Mooncake's config form */
    ASSERT_EQ(v, 3ull << 29);
    ASSERT_OK(kvp__parse_size("2 mib", &v));
    ASSERT_EQ(v, 2ull << 20);
    ASSERT_EQ(kvp__parse_size("", &v), KVP_ERR_BAD_SIZE);
    ASSERT_EQ(kvp__parse_size("GiB", &v), KVP_ERR_BAD_SIZE);
    ASSERT_EQ(kvp__parse_size("-1GiB", &v), KVP_ERR_BAD_SIZE);
    ASSERT_EQ(kvp__parse_size("4XiB", &v), KVP_ERR_BAD_SIZE);
    ASSERT_EQ(kvp__parse_size("1.3B", &v), KVP_ERR_BAD_SIZE); /* not whole bytes */
    ASSERT_EQ(kvp__parse_size("99999999999TiB", &v), KVP_ERR_BAD_SIZE);
    ASSERT_EQ(kvp__parse_size(NULL, &v), KVP_ERR_BAD_SIZE);
}

TEST(test_parse_duration)
{
    uint64_t ns;
    ASSERT_OK(kvp__parse_duration_ns("30s", &ns));
    ASSERT_EQ(ns, 30000000000ull);
    ASSERT_OK(kvp__parse_duration_ns("500ms", &ns));
    ASSERT_EQ(ns, 500000000ull);
    ASSERT_OK(kvp__parse_duration_ns("2", &ns));
    ASSERT_EQ(ns, 2000000000ull);
    ASSERT_OK(kvp__parse_duration_ns("1m", &ns));
    ASSERT_EQ(ns, 60000000000ull);
    ASSERT_EQ(kvp__parse_duration_ns("1parsec", &ns), KVP_ERR_BAD_OPTION);
    ASSERT_EQ(kvp__parse_duration_ns("", &ns), KVP_ERR_BAD_OPTION);
}

TEST(test_alloc_shim_counts_and_injects)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    void *p = kvp__malloc(1000);
    ASSERT(p);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base + 1000);
    p = kvp__realloc(p, 1000, 3000);
    ASSERT(p);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base + 3000);
    kvp__free(p, 3000);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
    kvp__alloc_fail_after(1);
    void *a = kvp__malloc(10);
    void *b = kvp__malloc(10);
    kvp__alloc_fail_reset();
    ASSERT(a != NULL);
    ASSERT(b == NULL);
    kvp__free(a, 10);
    ASSERT(kvp__calloc(SIZE_MAX / 2, 4) == NULL); /* overflow refused */
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
}

/* kvp__grow: the one growable-array step (first size, doubling, zeroed
 * tail, room for a batch at once, the array kept on failure). */
TEST(test_alloc_grow_doubles_zeroes_and_keeps_on_failure)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    size_t cap = 0;
    int *a = kvp__grow(NULL, &cap, 1, sizeof *a, 4);
    ASSERT(a != NULL);
    ASSERT_EQ(cap, 4);
    for (size_t i = 0; i < cap; i++)
        ASSERT_EQ(a[i], 0);
    for (int i = 0; i < 4; i++)
        a[i] = i + 1;
    ASSERT(kvp__grow(a, &cap, 4, sizeof *a, 4) == a); /* room already */
    a = kvp__grow(a, &cap, 5, sizeof *a, 4);
    ASSERT(a != NULL);
    ASSERT_EQ(cap, 8);
    ASSERT_EQ(a[3], 4);
    ASSERT_EQ(a[4], 0);
    a = kvp__grow(a, &cap, 100, sizeof *a, 4); /* a batch: doubled until it fits */
    ASSERT(a != NULL);
    ASSERT_EQ(cap, 128);
    ASSERT_EQ(a[0], 1);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base + 128 * sizeof *a);
    kvp__alloc_fail_after(0);
    int *b = kvp__grow(a, &cap, 129, sizeof *a, 4);
    kvp__alloc_fail_reset();
    ASSERT(b == NULL);
    ASSERT_EQ(cap, 128); /* unchanged, a still whole */
    ASSERT_EQ(a[1], 2);
    ASSERT(kvp__grow(a, &cap, SIZE_MAX, sizeof *a, 4) == NULL); /* overflow refused */
    ASSERT_EQ(cap, 128);
    kvp__free(a, cap * sizeof *a);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
    int *c = NULL; /* in place; room for nothing is always there */
    size_t ccap = 0;
    ASSERT_EQ(kvp__grow_in((void **)&c, &ccap, 0, sizeof *c, 16), 0);
    ASSERT(c == NULL);
    ASSERT_EQ(kvp__grow_in((void **)&c, &ccap, 3, sizeof *c, 16), 0);
    ASSERT(c != NULL);
    ASSERT_EQ(ccap, 16);
    kvp__free(c, ccap * sizeof *c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base);
}

static void *named_main(void *arg)
{
    char *got = arg;
    kvp__thread_name("kvp-a-name-longer-than-15");
    pthread_getname_np(pthread_self(), got, 16);
    return NULL;
}

TEST(test_thread_name_is_cut_to_15_bytes)
{
    char got[16] = {0}, main_before[16] = {0}, main_after[16] = {0};
    pthread_getname_np(pthread_self(), main_before, sizeof main_before);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, named_main, got), 0);
    pthread_join(t, NULL);
    ASSERT_STR_EQ(got, "kvp-a-name-long");
    pthread_getname_np(pthread_self(), main_after, sizeof main_after);
    ASSERT_STR_EQ(main_after, main_before); /* the caller's own thread only */
}

TEST_LIST(T(test_status_every_code_has_name_and_message), T(test_thread_name_is_cut_to_15_bytes), T(test_parse_size_units),
          T(test_parse_duration), T(test_alloc_shim_counts_and_injects),
          T(test_alloc_grow_doubles_zeroes_and_keeps_on_failure))
