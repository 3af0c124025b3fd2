/* Unit tests of src/common/strmap.c: the string map and the string set. */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"
#include "test.h"

TEST(test_strmap_put_get_replace_del)
{
    kvp__strmap_t m;
    kvp__strmap_init(&m);
    int a = 1, b = 2;
    ASSERT(kvp__strmap_gets(&m, "x") == NULL); /* empty map: no slots yet */
    ASSERT_OK(kvp__strmap_put(&m, "x", 1, &a));
    ASSERT(kvp__strmap_gets(&m, "x") == &a);
    ASSERT_OK(kvp__strmap_put(&m, "x", 1, &b)); /* put replaces */
    ASSERT_EQ(m.n, 1);
    ASSERT(kvp__strmap_gets(&m, "x") == &b);
    ASSERT_OK(kvp__strmap_put(&m, "", 0, &a)); /* the empty key is a key */
    ASSERT(kvp__strmap_get(&m, "", 0) == &a);
    ASSERT(kvp__strmap_get(&m, "xy", 1) == &b); /* by length, not NUL */
    ASSERT(kvp__strmap_del(&m, "x", 1) == &b);
    ASSERT(kvp__strmap_del(&m, "x", 1) == NULL);
    ASSERT_EQ(m.n, 1);
    uint64_t h = kvp__strmap_hash("", 0);
    ASSERT(kvp__strmap_get_h(&m, "", 0, h) == &a);
    ASSERT(kvp__strmap_del_h(&m, "", 0, h) == &a);
    ASSERT_EQ(m.n, 0);
    kvp__strmap_cleanup(&m);
    ASSERT(m.slots == NULL);
}

/* Backward-shift deletion keeps every probe run whole: after deleting any
 * subset, every remaining key is still found and no deleted one is. */
TEST(test_strmap_deletes_keep_probe_runs_unbroken)
{
    enum { N = 2000 };
    static char keys[N][12];
    kvp__strmap_t m;
    kvp__strmap_init(&m);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "k%d", i);
        ASSERT_OK(kvp__strmap_put(&m, keys[i], strlen(keys[i]), keys[i]));
    }
    ASSERT_EQ(m.n, N);
    ASSERT_LE(m.n * 2, m.cap); /* load <= 1/2 */
    for (int i = 0; i < N; i += 3)
        ASSERT(kvp__strmap_del(&m, keys[i], strlen(keys[i])) == keys[i]);
    for (int i = 0; i < N; i++) {
        void *v = kvp__strmap_gets(&m, keys[i]);
        if (i % 3 == 0)
            ASSERT(v == NULL);
        else
            ASSERT(v == keys[i]);
    }
    size_t live = 0;
    for (size_t i = 0; i < m.cap; i++)
        live += m.slots[i].key != NULL;
    ASSERT_EQ(live, m.n);
    kvp__strmap_clear(&m);
    ASSERT_EQ(m.n, 0);
    ASSERT(kvp__strmap_gets(&m, keys[1]) == NULL);
    kvp__strmap_cleanup(&m);
}

TEST(test_strmap_put_out_of_memory_leaves_map_unchanged)
{
    kvp__strmap_t m;
    kvp__strmap_init(&m);
    int a;
    kvp__alloc_fail_after(0);
    kvp_status_t st = kvp__strmap_put(&m, "a", 1, &a);
    kvp__alloc_fail_reset();
    ASSERT_EQ(st, KVP_ERR_NO_MEMORY);
    ASSERT_EQ(m.n, 0);
    ASSERT(kvp__strmap_gets(&m, "a") == NULL);
    kvp__strmap_cleanup(&m);
}

TEST(test_strset_owns_copies)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp__strset_t s;
    kvp__strmap_init(&s);
    char buf[8] = "abc";
    bool added;
    ASSERT_OK(kvp__strset_add(&s, buf, &added));
    ASSERT(added);
    strcpy(buf, "zzz"); /* the set holds its own copy */
    ASSERT(kvp__strset_has(&s, "abc"));
    ASSERT(!kvp__strset_has(&s, "zzz"));
    ASSERT_OK(kvp__strset_add(&s, "abc", &added));
    ASSERT(!added);
    ASSERT_OK(kvp__strset_add(&s, "def", NULL));
    kvp__strset_discard(&s, "abc");
    kvp__strset_discard(&s, "abc");
    ASSERT(!kvp__strset_has(&s, "abc"));
    ASSERT_EQ(s.n, 1);
    kvp__strset_cleanup(&s);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), base); /* every copy freed */
}

TEST_LIST(T(test_strmap_put_get_replace_del), T(test_strmap_deletes_keep_probe_runs_unbroken),
          T(test_strmap_put_out_of_memory_leaves_map_unchanged), T(test_strset_owns_copies))
