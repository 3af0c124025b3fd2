/*
 * A tiny test harness (after libuv's runner): each test runs in its own child
 * process with a timeout, so a crash or hang fails that test only.  Typed
 * assertions print both sides.  Usage:
 *
 *   TEST(test_k1_lookup_disabled) { ASSERT_EQ(1, 1); }
 *   TEST_LIST(T(test_k1_lookup_disabled))
 *
 * `./test_x` runs all; `./test_x NAME` runs one in-process (for gdb).
 * Environment: KVP_TEST_TIMEOUT (seconds, default 300), KVP_TEST_NOFORK=1.
 */
#ifndef KVP_TESTS_TEST_H
#define KVP_TESTS_TEST_H

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    const char *name;
    void (*fn)(void);
} kvp_test_t;

#define TEST(name) static void name(void)
#define T(name) {#name, name}

#define KVP__FAIL(...)                                                          \
    do {                                                                        \
        fprintf(stderr, "%s:%d: assertion failed: ", __FILE__, __LINE__);       \
        fprintf(stderr, __VA_ARGS__);                                           \
        fprintf(stderr, "\n");                                                  \
        fflush(stderr);                                                         \
        abort();                                                                \
    } while (0)

#define ASSERT(cond)                                    \
    do {                                                \
        if (!(cond))                                    \
            KVP__FAIL("%s", #cond);                     \
    } while (0)
#define ASSERT_MSG(cond, ...)                           \
    do {                                                \
        if (!(cond))                                    \
            KVP__FAIL(__VA_ARGS__);                     \
    } while (0)
#define KVP__ASSERT_INT(a, op, b)                                                          \
    do {                                                                                   \
        long long kvp__a = (long long)(a), kvp__b = (long long)(b);                        \
        if (!(kvp__a op kvp__b))                                                           \
            KVP__FAIL("%s %s %s (%lld vs %lld)", #a, #op, #b, kvp__a, kvp__b);             \
    } while (0)
#define ASSERT_EQ(a, b) KVP__ASSERT_INT(a, ==, b)
#define ASSERT_NE(a, b) KVP__ASSERT_INT(a, !=, b)
#define ASSERT_LT(a, b) KVP__ASSERT_INT(a, <, b)
#define ASSERT_LE(a, b) KVP__ASSERT_INT(a, <=, b)
#define ASSERT_GT(a, b) KVP__ASSERT_INT(a, >, b)
#define ASSERT_GE(a, b) KVP__ASSERT_INT(a, >=, b)
#define ASSERT_OK(expr)                                                                    \
    do {                                                                                   \
        int kvp__s = (int)(expr);                                                          \
        if (kvp__s != 0)                                                                   \
            KVP__FAIL("%s returned %d, expected 0 (KVP_OK)", #expr, kvp__s);               \
    } while (0)
#define ASSERT_STR_EQ(a, b)                                                                \
    do {                                                                                   \
        const char *kvp__a = (a), *kvp__b = (b);                                           \
        if (!kvp__a || !kvp__b || strcmp(kvp__a, kvp__b) != 0)                             \
            KVP__FAIL("%s == %s (\"%s\" vs \"%s\")", #a, #b, kvp__a ? kvp__a : "(null)",    \
                      kvp__b ? kvp__b : "(null)");                                         \
    } while (0)
#define ASSERT_MEM_EQ(a, b, n) ASSERT_MSG(memcmp((a), (b), (n)) == 0, "%s == %s (%zu bytes)", #a, #b, (size_t)(n))

static inline int kvp__test_run_one(const kvp_test_t *t, int timeout_s)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        return 0;
    }
    if (pid == 0) {
        alarm((unsigned)timeout_s);
        t->fn();
        fflush(stdout);
        _exit(0);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        ;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        return 1;
    if (WIFSIGNALED(st))
        fprintf(stderr, "  %s: killed by signal %d%s\n", t->name, WTERMSIG(st),
                WTERMSIG(st) == SIGALRM ? " (timeout)" : "");
    else
        fprintf(stderr, "  %s: exit status %d\n", t->name, WEXITSTATUS(st));
    return 0;
}

static inline int kvp__test_main(const kvp_test_t *tests, size_t n, int argc, char **argv)
{
    const char *to = getenv("KVP_TEST_TIMEOUT");
    int timeout_s = to ? atoi(to) : 300;
    int nofork = getenv("KVP_TEST_NOFORK") != NULL;
    size_t passed = 0, failed = 0;
    for (size_t i = 0; i < n; i++) {
        if (argc > 1) {
            int want = 0;
            for (int a = 1; a < argc; a++)
                want |= strcmp(argv[a], tests[i].name) == 0;
            if (!want)
                continue;
        }
        int ok;
        if (nofork || argc > 1) {
            tests[i].fn();
            ok = 1;
        } else {
            ok = kvp__test_run_one(&tests[i], timeout_s);
        }
        printf("%s %s\n", ok ? "ok  " : "FAIL", tests[i].name);
        fflush(stdout);
        if (ok)
            passed++;
        else
            failed++;
    }
    printf("%zu passed, %zu failed\n", passed, failed);
    return (failed || passed == 0) ? 1 : 0;
}

#define TEST_LIST(...)                                                              \
    int main(int argc, char **argv)                                                 \
    {                                                                               \
        static const kvp_test_t kvp__tests[] = {__VA_ARGS__};                       \
        return kvp__test_main(kvp__tests, sizeof kvp__tests / sizeof kvp__tests[0], \
                              argc, argv);                                          \
    }

#endif
