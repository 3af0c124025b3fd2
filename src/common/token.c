#include "common/token.h"

#include <stdio.h>
#include <string.h>

kvp_status_t kvp__token_parse(const char *data, size_t n, char *buf, size_t cap, size_t *len_p)
{
    if (!buf || !len_p || cap <= KVP__TOKEN_MAX || (!data && n))
        return KVP_ERR_INVALID_ARG;
    buf[0] = 0;
    *len_p = 0;
    size_t l = 0;
    while (l < n && data[l] != '\n' && data[l] != '\r')
        l++;
    if (l == 0 || l > KVP__TOKEN_MAX || memchr(data, 0, l))
        return KVP_ERR_BAD_CONFIG;
    memcpy(buf, data, l);
    buf[l] = 0;
    *len_p = l;
    return KVP_OK;
}

kvp_status_t kvp__token_file_read(const char *path, char *buf, size_t cap, size_t *len_p)
{
    if (!path)
        return KVP_ERR_INVALID_ARG;
    FILE *f = fopen(path, "rb");
    if (!f)
        return KVP_ERR_IO;
    /* One byte past the longest token plus "\r\n" tells too long from a line end. */
    char data[KVP__TOKEN_MAX + 3];
    size_t n = fread(data, 1, sizeof data, f);
    int bad = ferror(f);
    fclose(f);
    if (bad)
        return KVP_ERR_IO;
    return kvp__token_parse(data, n, buf, cap, len_p);
}
