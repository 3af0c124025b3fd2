/*
 * kvp__assert (src/common/assert.h): in a build with KVP_DEBUG (Debug, so the
 * ASan and fuzz builds) a false invariant prints itself and aborts; in a
 * release build it is compiled out and its expression is not evaluated.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/assert.h"
#include "test.h"

static int g_evaluated;

static int touch(int v)
{
    g_evaluated++;
    return v;
}

/* Runs kvp__assert(touch(v) == 1) in a child; its wait status, stderr in err. */
static int run_assert_child(int v, char *err, size_t errlen)
{
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        kvp__assert(touch(v) == 1);
        _exit(g_evaluated == (KVP__ASSERT_ON ? 1 : 0) ? 0 : 3);
    }
    close(fds[1]);
    size_t n = 0;
    ssize_t r;
    while (n + 1 < errlen && (r = read(fds[0], err + n, errlen - 1 - n)) > 0)
        n += (size_t)r;
    err[n] = 0;
    close(fds[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        ;
    return st;
}

TEST(test_assert_false_invariant_aborts_in_debug_builds)
{
    char err[512];
    int st = run_assert_child(2, err, sizeof err);
    if (KVP__ASSERT_ON) {
        ASSERT_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "wait status %#x", st);
        ASSERT(strstr(err, "internal invariant failed: touch(v) == 1") != NULL);
        ASSERT(strstr(err, "test_common_assert.c:") != NULL);
    } else {
        /* release: compiled out, the expression never ran */
        ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "wait status %#x", st);
        ASSERT_STR_EQ(err, "");
    }
}

TEST(test_assert_true_invariant_passes)
{
    char err[512];
    int st = run_assert_child(1, err, sizeof err);
    ASSERT_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "wait status %#x (evaluated wrongly?)", st);
    ASSERT_STR_EQ(err, "");
}

/* A Debug build (CMake defines KVP_EXPECT_ASSERT for this test there) checks. */
TEST(test_assert_on_in_debug_builds)
{
#if defined(KVP_EXPECT_ASSERT)
    ASSERT_EQ(KVP__ASSERT_ON, 1);
#endif
    printf("  kvp__assert is %s in this build\n", KVP__ASSERT_ON ? "on" : "off");
}

TEST_LIST(T(test_assert_false_invariant_aborts_in_debug_builds), T(test_assert_true_invariant_passes),
          T(test_assert_on_in_debug_builds))
