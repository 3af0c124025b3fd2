/*
 * kvp__assert(cond): a check of an internal invariant, something no input,
 * peer or caller can make false, only a bug in kvpool itself (a record in two
 * state lists, an arena block that is both free and leased).  Never for input:
 * bad input gets an error status (STYLE.md §9).
 *
 * Active when KVP_DEBUG is defined (CMake's KVP_ASSERT option: on in Debug
 * builds, so in the ASan and fuzz builds): a false cond prints the expression
 * and where, and aborts.  Otherwise it compiles to nothing and cond is not
 * evaluated (it must have no side effect), so the release hot paths pay
 * nothing.
 */
#ifndef KVP_COMMON_ASSERT_H
#define KVP_COMMON_ASSERT_H

#ifdef KVP_DEBUG
#include <stdio.h>
#include <stdlib.h>

#define KVP__ASSERT_ON 1

__attribute__((noreturn, cold)) static inline void kvp__assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "kvpool: internal invariant failed: %s (%s:%d)\n", expr, file, line);
    fflush(stderr);
    abort();
}

#define kvp__assert(cond) ((cond) ? (void)0 : kvp__assert_fail(#cond, __FILE__, __LINE__))
#else
#define KVP__ASSERT_ON 0
/* sizeof: cond still type-checks (no rot in release), but is not evaluated. */
#define kvp__assert(cond) ((void)sizeof(!(cond)))
#endif

#endif
