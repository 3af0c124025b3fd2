/*
 * Bad input to the pool API: each case returns its specific KVP_ERR_*, logs
 * exactly one line, and changes nothing (stats identical before and after,
 * earlier objects still readable, no heap bytes leaked by a refused open).
 * The data-operation cases are the bad_* contracts of pool_contract.h (they
 * run against every backend); here they also run with the log check.  The
 * URI cases are the embedded backend's.
 */
#include "pool_contract.h"

#include "common/alloc.h"
#include "common/log.h"

#define URI "embedded://?capacity=8MiB"

/* ---- log capture: stderr goes to a temp file around each refused call */
static int g_saved_fd = -1;
static FILE *g_cap;

static void cap_begin(void)
{
    kvp__log_set_level(KVP_LOG_DEBUG);
    fflush(stderr);
    g_cap = tmpfile();
    ASSERT(g_cap != NULL);
    g_saved_fd = dup(2);
    ASSERT(g_saved_fd >= 0);
    ASSERT(dup2(fileno(g_cap), 2) == 2);
}

/* Returns the number of lines logged since cap_begin(); echoes them. */
static int cap_end_count(const char *what)
{
    fflush(stderr);
    ASSERT(dup2(g_saved_fd, 2) == 2);
    close(g_saved_fd);
    g_saved_fd = -1;
    rewind(g_cap);
    char line[2048];
    int lines = 0;
    while (fgets(line, sizeof line, g_cap)) {
        if (strchr(line, '\n'))
            lines++;
        fprintf(stderr, "    [%s] %s", what, line);
    }
    fclose(g_cap);
    g_cap = NULL;
    return lines;
}

static void cap_end(const char *what, int refused)
{
    int lines = cap_end_count(what);
    if (refused)
        ASSERT_MSG(lines == 1, "%s logged %d lines, expected exactly 1", what, lines);
}

static void hooks_on(void)
{
    kvp_ct_bad_begin_hook = cap_begin;
    kvp_ct_bad_end_hook = cap_end;
}

/* ---- data operations (the contracts, with the log check) */

TEST(test_bad_key_empty)
{
    hooks_on();
    kvp_contract_bad_key_empty(URI);
}

TEST(test_bad_key_too_long)
{
    hooks_on();
    kvp_contract_bad_key_too_long(URI);
}

TEST(test_bad_value_empty)
{
    hooks_on();
    kvp_contract_bad_value_empty(URI);
}

TEST(test_bad_value_larger_than_capacity)
{
    hooks_on();
    kvp_contract_bad_value_too_large(URI);
}

TEST(test_bad_value_length_overflow)
{
    hooks_on();
    kvp_contract_bad_value_length_overflow(URI);
}

TEST(test_bad_null_buffer)
{
    hooks_on();
    kvp_contract_bad_null_buffer(URI);
}

TEST(test_bad_short_buffer)
{
    hooks_on();
    kvp_contract_bad_short_buffer(URI);
}

TEST(test_bad_duplicate_keys_in_batch)
{
    hooks_on();
    kvp_contract_bad_duplicate_keys(URI);
}

TEST(test_bad_duplicate_keys_in_lookup)
{
    hooks_on();
    kvp_contract_bad_duplicate_keys_lookup(URI);
}

TEST(test_bad_batch_too_large)
{
    hooks_on();
    kvp_contract_bad_batch_too_large(URI);
}

/* ---- kvp_pool_open */

/* open(uri) must fail with one of want[0..nwant), log one line, leave
 * *pool_p NULL and leak nothing. */
static void open_bad_any(const char *uri, const kvp_status_t *want, int nwant)
{
    uint64_t base = kvp__alloc_bytes_in_use();
    kvp_pool_t *pool = (kvp_pool_t *)&pool; /* not NULL: open must clear it */
    cap_begin();
    kvp_status_t st = kvp_pool_open(uri, &pool);
    int lines = cap_end_count(uri ? uri : "(null)");
    int ok = 0;
    for (int i = 0; i < nwant; i++)
        ok |= st == want[i];
    if (st == KVP_OK && pool && pool != (kvp_pool_t *)&pool)
        kvp_pool_close(pool);
    ASSERT_MSG(ok, "kvp_pool_open(\"%s\") = %s, expected %s%s%s%s%s", uri ? uri : "(null)",
               kvp_status_name(st), kvp_status_name(want[0]), nwant > 1 ? " or " : "",
               nwant > 1 ? kvp_status_name(want[1]) : "", nwant > 2 ? " or " : "",
               nwant > 2 ? kvp_status_name(want[2]) : "");
    ASSERT_MSG(pool == NULL, "kvp_pool_open(\"%s\") failed but *pool_p is not NULL",
               uri ? uri : "(null)");
    ASSERT_MSG(lines == 1, "kvp_pool_open(\"%s\") logged %d lines, expected exactly 1",
               uri ? uri : "(null)", lines);
    ASSERT_MSG(kvp__alloc_bytes_in_use() == base, "kvp_pool_open(\"%s\") leaked %lld bytes",
               uri ? uri : "(null)", (long long)(kvp__alloc_bytes_in_use() - base));
}

static void open_bad(const char *uri, kvp_status_t want)
{
    open_bad_any(uri, &want, 1);
}

TEST(test_bad_uri_null)
{
    open_bad(NULL, KVP_ERR_NULL_POINTER);
    cap_begin();
    kvp_status_t st = kvp_pool_open(URI, NULL);
    int lines = cap_end_count("open(uri, NULL)");
    ASSERT_EQ(st, KVP_ERR_NULL_POINTER);
    ASSERT_EQ(lines, 1);
}

TEST(test_bad_uri_empty)
{
    open_bad("", KVP_ERR_BAD_URI);
}

TEST(test_bad_uri_no_scheme)
{
    open_bad("capacity=8MiB", KVP_ERR_BAD_URI);
    open_bad("embedded", KVP_ERR_BAD_URI);
    open_bad("embedded:", KVP_ERR_BAD_URI);
    open_bad("embedded:/?capacity=8MiB", KVP_ERR_BAD_URI);
    open_bad("embedded//?capacity=8MiB", KVP_ERR_BAD_URI);
    open_bad("://?capacity=8MiB", KVP_ERR_BAD_URI);
    open_bad("?capacity=8MiB", KVP_ERR_BAD_URI);
}

TEST(test_bad_uri_unknown_scheme)
{
    open_bad("foo://?capacity=8MiB", KVP_ERR_BAD_URI);
    open_bad("http://localhost:80/", KVP_ERR_BAD_URI);
    open_bad("EMBEDDED_X://?capacity=8MiB", KVP_ERR_BAD_URI);
}

TEST(test_bad_uri_too_long)
{
    /* A very long URI (past any fixed parse buffer) is refused, not truncated. */
    size_t n = 10000;
    char *u = (char *)kvp_ct_xmalloc(n + 64);
    strcpy(u, "embedded://?capacity=8MiB&shards=1");
    size_t len = strlen(u);
    while (len < n)
        u[len++] = '1'; /* shards=1111...: one long value */
    u[len] = 0;
    static const kvp_status_t want[] = {KVP_ERR_BAD_URI, KVP_ERR_BAD_OPTION};
    open_bad_any(u, want, 2);
    free(u);
}

TEST(test_bad_uri_malformed_query)
{
    /* Which of BAD_URI and BAD_OPTION is not pinned down by pool.h. */
    static const kvp_status_t want[] = {KVP_ERR_BAD_URI, KVP_ERR_BAD_OPTION};
    open_bad_any("embedded://?capacity", want, 2);
    open_bad_any("embedded://?=8MiB", want, 2);
    open_bad_any("embedded://?capacity=8MiB&=1", want, 2);
    /* An option with an empty value: malformed URI or bad option/size. */
    static const kvp_status_t empty[] = {KVP_ERR_BAD_URI, KVP_ERR_BAD_OPTION, KVP_ERR_BAD_SIZE};
    static const char *opts[] = {"capacity=", "capacity=8MiB&high_watermark=",
                                 "capacity=8MiB&low_watermark=", "capacity=8MiB&hugepages=",
                                 "capacity=8MiB&provider=", "capacity=8MiB&put_timeout=",
                                 "capacity=8MiB&shards="};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        char uri[128];
        snprintf(uri, sizeof uri, "embedded://?%s", opts[i]);
        open_bad_any(uri, empty, 3);
    }
}

TEST(test_bad_capacity_zero)
{
    open_bad("embedded://?capacity=0", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=0B", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=0GiB", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=0MiB&provider=memfd", KVP_ERR_BAD_OPTION);
}

TEST(test_bad_size_malformed)
{
    open_bad("embedded://?capacity=abc", KVP_ERR_BAD_SIZE);
    open_bad("embedded://?capacity=8XiB", KVP_ERR_BAD_SIZE);
    open_bad("embedded://?capacity=-8MiB", KVP_ERR_BAD_SIZE);
    open_bad("embedded://?capacity=MiB", KVP_ERR_BAD_SIZE);
    open_bad("embedded://?capacity=8MiBs", KVP_ERR_BAD_SIZE);
    open_bad("embedded://?capacity=1.5B", KVP_ERR_BAD_SIZE);
    open_bad("embedded://?capacity=99999999999999999999GiB", KVP_ERR_BAD_SIZE);
}

TEST(test_bad_option_unknown)
{
    open_bad("embedded://?capacity=8MiB&colour=blue", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?colour=blue&capacity=8MiB", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&high_watermark=0.9&capacityy=1", KVP_ERR_BAD_OPTION);
}

TEST(test_bad_option_watermarks)
{
    open_bad("embedded://?capacity=8MiB&high_watermark=1.5", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&high_watermark=0", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&high_watermark=-0.5", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&high_watermark=abc", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&low_watermark=2", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&low_watermark=x", KVP_ERR_BAD_OPTION);
    /* low above high (explicit, and against the default 0.95). */
    open_bad("embedded://?capacity=8MiB&high_watermark=0.5&low_watermark=0.7", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&low_watermark=0.99", KVP_ERR_BAD_OPTION);
}

TEST(test_bad_option_hugepages)
{
    open_bad("embedded://?capacity=8MiB&hugepages=maybe", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&hugepages=2", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&hugepages=ON%20", KVP_ERR_BAD_OPTION);
}

TEST(test_bad_option_provider)
{
    open_bad("embedded://?capacity=8MiB&provider=disk", KVP_ERR_BAD_OPTION);
}

TEST(test_bad_option_put_timeout)
{
    open_bad("embedded://?capacity=8MiB&put_timeout=abc", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&put_timeout=5parsecs", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&put_timeout=-1s", KVP_ERR_BAD_OPTION);
}

TEST(test_bad_option_shards)
{
    open_bad("embedded://?capacity=8MiB&shards=0", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&shards=-1", KVP_ERR_BAD_OPTION);
    open_bad("embedded://?capacity=8MiB&shards=abc", KVP_ERR_BAD_OPTION);
}

/* A refused open leaves other pools alone. */
TEST(test_bad_open_leaves_pool_alone)
{
    kvp_ct_fixture_t f;
    kvp_ct_fixture_open(&f, URI);
    open_bad("embedded://?capacity=0", KVP_ERR_BAD_OPTION);
    open_bad("nope://", KVP_ERR_BAD_URI);
    kvp_ct_fixture_check(&f, "after refused opens");
    kvp_ct_fixture_close(&f);
}

TEST_LIST(T(test_bad_key_empty), T(test_bad_key_too_long), T(test_bad_value_empty),
          T(test_bad_value_larger_than_capacity), T(test_bad_value_length_overflow),
          T(test_bad_null_buffer), T(test_bad_short_buffer),
          T(test_bad_duplicate_keys_in_batch), T(test_bad_duplicate_keys_in_lookup),
          T(test_bad_batch_too_large), T(test_bad_uri_null), T(test_bad_uri_empty),
          T(test_bad_uri_no_scheme), T(test_bad_uri_unknown_scheme), T(test_bad_uri_too_long),
          T(test_bad_uri_malformed_query), T(test_bad_capacity_zero), T(test_bad_size_malformed),
          T(test_bad_option_unknown), T(test_bad_option_watermarks), T(test_bad_option_hugepages),
          T(test_bad_option_provider), T(test_bad_option_put_timeout), T(test_bad_option_shards),
          T(test_bad_open_leaves_pool_alone))
