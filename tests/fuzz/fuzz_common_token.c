/*
 * Fuzz target for the token-file parser (common/token.c): whatever the
 * bytes, the result is either a token that is exactly the first line (1..256
 * bytes, no NUL, no CR or LF), or a refusal exactly when no such line exists.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/token.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char buf[KVP__TOKEN_MAX + 1];
    size_t len = 0;
    kvp_status_t st = kvp__token_parse((const char *)data, size, buf, sizeof buf, &len);
    size_t line = 0;
    while (line < size && data[line] != '\n' && data[line] != '\r')
        line++;
    int good = line >= 1 && line <= KVP__TOKEN_MAX && !memchr(data, 0, line);
    if (good != (st == KVP_OK))
        abort();
    if (st == KVP_OK && (len != line || memcmp(buf, data, len) != 0 || buf[len] != 0))
        abort();
    if (st != KVP_OK && (st != KVP_ERR_BAD_CONFIG || len != 0))
        abort();
    return 0;
}
