/*
 * kvpool status codes.
 *
 * Every kvpool call returns a kvp_status_t: KVP_OK (0) when it completed,
 * KVP_INPROGRESS (1) when an async call was accepted and its completion will
 * fire exactly once, or a negative KVP_ERR_* when it failed (and, for an async
 * call, no completion will ever fire).  The list below is the only place the
 * codes are defined; it also builds kvp_status_name() and kvp_status_str().
 * Values never change once released: append new codes, never renumber.
 *
 * Groups (by what the caller must do):
 *   -1..-19   caller errors: the call was refused, nothing changed
 *   -20..-39  resource errors: out of memory or pool space, retry may work
 *   -40..-59  lookup results and object states
 *   -60..-79  transport / remote errors: the connection may need rebuilding
 *   -80..-99  decoder and state-machine errors: bad input from outside
 */
#ifndef KVPOOL_STATUS_H
#define KVPOOL_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#ifndef KVP_API
#define KVP_API __attribute__((visibility("default")))
#endif

/* X(NAME, value, message) */
#define KVP_STATUS_LIST(X)                                                         \
    X(KVP_OK, 0, "success")                                                        \
    X(KVP_INPROGRESS, 1, "operation in progress; completion will fire once")       \
    X(KVP_ERR_INVALID_ARG, -1, "invalid argument")                                 \
    X(KVP_ERR_NULL_POINTER, -2, "required pointer or buffer is NULL")              \
    X(KVP_ERR_KEY_LENGTH, -3, "key length must be 1..512 bytes")                   \
    X(KVP_ERR_VALUE_EMPTY, -4, "value is empty")                                   \
    X(KVP_ERR_VALUE_TOO_LARGE, -5, "value larger than the pool or 256 MiB limit")  \
    X(KVP_ERR_BUFFER_TOO_SMALL, -6, "buffer too small for the value")              \
    X(KVP_ERR_DUPLICATE_KEY, -7, "the same key appears twice in one batch")        \
    X(KVP_ERR_BAD_URI, -8, "malformed or unsupported URI")                         \
    X(KVP_ERR_BAD_OPTION, -9, "unknown option or option value out of range")       \
    X(KVP_ERR_BAD_SIZE, -10, "malformed size (use B, KiB, MiB or GiB)")            \
    X(KVP_ERR_UNSUPPORTED, -11, "operation not supported by this backend")         \
    X(KVP_ERR_BATCH_TOO_LARGE, -12, "too many keys in one batch")                  \
    X(KVP_ERR_BAD_CONFIG, -13, "invalid configuration")                            \
    X(KVP_ERR_NO_MEMORY, -20, "out of memory")                                     \
    X(KVP_ERR_NO_SPACE, -21, "pool full: nothing evictable frees enough space")    \
    X(KVP_ERR_BUSY, -22, "resource busy, try again")                               \
    X(KVP_ERR_NOT_FOUND, -40, "key not found")                                     \
    X(KVP_ERR_EXPIRED, -41, "reservation expired before commit")                   \
    X(KVP_ERR_CANCELLED, -42, "operation cancelled")                               \
    X(KVP_ERR_CLOSED, -43, "handle is closing or closed")                          \
    X(KVP_ERR_TIMEOUT, -60, "operation timed out")                                 \
    X(KVP_ERR_CONN_LOST, -61, "connection to the server lost")                     \
    X(KVP_ERR_CONN_REFUSED, -62, "connection refused")                             \
    X(KVP_ERR_AUTH, -63, "authentication failed")                                  \
    X(KVP_ERR_IO, -64, "I/O error")                                                \
    X(KVP_ERR_REMOTE, -65, "remote side reported an error")                        \
    X(KVP_ERR_HOST_UNKNOWN, -66, "host name does not resolve")                     \
    X(KVP_ERR_PROTOCOL, -80, "protocol violation")                                 \
    X(KVP_ERR_DECODE, -81, "malformed encoded data")                               \
    X(KVP_ERR_VERSION, -82, "unsupported protocol or format version")              \
    X(KVP_ERR_STATE, -83, "call not valid in the current state")                   \
    X(KVP_ERR_INTERNAL, -99, "internal error")

typedef enum kvp_status {
#define KVP__STATUS_ENUM(name, value, msg) name = (value),
    KVP_STATUS_LIST(KVP__STATUS_ENUM)
#undef KVP__STATUS_ENUM
} kvp_status_t;

/* Human-readable message for a status; never NULL ("unknown status" for
 * values not in the list). The string is static. */
KVP_API const char *kvp_status_str(kvp_status_t status);

/* The code's name, e.g. "KVP_ERR_NOT_FOUND"; never NULL. Static string. */
KVP_API const char *kvp_status_name(kvp_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* KVPOOL_STATUS_H */
