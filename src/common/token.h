/*
 * The shared-secret token file (server --token-file, the client's token_file
 * option): the token is the file's first line without its line end ("\n",
 * "\r\n" or a lone "\r"), 1..KVP__TOKEN_MAX bytes, no NUL byte.  Anything
 * else is refused with a status, never truncated into a different token.
 */
#ifndef KVP_COMMON_TOKEN_H
#define KVP_COMMON_TOKEN_H

#include <stddef.h>

#include "kvpool/status.h"

#define KVP__TOKEN_MAX 256

/* The token in data[0..n) (a file's bytes, or its first bytes) into
 * buf[0..cap) NUL-terminated, its length in *len_p.  KVP_OK;
 * KVP_ERR_BAD_CONFIG when the first line is empty, longer than
 * KVP__TOKEN_MAX or holds a NUL; KVP_ERR_INVALID_ARG when cap <= KVP__TOKEN_MAX. */
kvp_status_t kvp__token_parse(const char *data, size_t n, char *buf, size_t cap, size_t *len_p);
/* kvp__token_parse over the file at path; KVP_ERR_IO when it cannot be read. */
kvp_status_t kvp__token_file_read(const char *path, char *buf, size_t cap, size_t *len_p);

#endif
