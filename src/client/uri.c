#include "client/uri.h"

#include <string.h>

#include "common/log.h"

kvp_status_t kvp__uri_parse(const char *uri, kvp__uri_t *u)
{
    memset(u, 0, sizeof *u);
    if (!uri) {
        kvp_error("uri: NULL");
        return KVP_ERR_BAD_URI;
    }
    size_t len = strlen(uri);
    if (len == 0 || len >= sizeof u->buf) {
        kvp_error("uri: length %zu out of range (1..%d)", len, KVP_URI_MAX - 1);
        return KVP_ERR_BAD_URI;
    }
    memcpy(u->buf, uri, len + 1);
    char *sep = strstr(u->buf, "://");
    if (!sep || sep == u->buf) {
        kvp_error("uri: '%s' has no scheme (expected scheme://...)", uri);
        return KVP_ERR_BAD_URI;
    }
    *sep = 0;
    u->scheme = u->buf;
    for (const char *c = u->scheme; *c; c++) {
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '+' || *c == '-')) {
            kvp_error("uri: bad scheme in '%s'", uri);
            return KVP_ERR_BAD_URI;
        }
    }
    char *rest = sep + 3;
    char *q = strchr(rest, '?');
    if (q)
        *q++ = 0;
    char *slash = strchr(rest, '/');
    if (slash) {
        *slash = 0;
        u->path = slash + 1;
    } else {
        u->path = "";
    }
    u->authority = rest;
    while (q && *q) {
        char *amp = strchr(q, '&');
        if (amp)
            *amp = 0;
        char *eq = strchr(q, '=');
        if (!eq || eq == q || !eq[1]) {
            kvp_error("uri: option '%s' is not key=value", q);
            return KVP_ERR_BAD_URI;
        }
        *eq = 0;
        if (u->nopts == KVP_URI_MAX_OPTS) {
            kvp_error("uri: more than %d options", KVP_URI_MAX_OPTS);
            return KVP_ERR_BAD_URI;
        }
        for (int i = 0; i < u->nopts; i++) {
            if (strcmp(u->key[i], q) == 0) {
                kvp_error("uri: option '%s' given twice", q);
                return KVP_ERR_BAD_URI;
            }
        }
        u->key[u->nopts] = q;
        u->val[u->nopts] = eq + 1;
        u->nopts++;
        q = amp ? amp + 1 : NULL;
    }
    return KVP_OK;
}

const char *kvp__uri_opt(kvp__uri_t *u, const char *key)
{
    for (int i = 0; i < u->nopts; i++) {
        if (strcmp(u->key[i], key) == 0) {
            u->used[i] = 1;
            return u->val[i];
        }
    }
    return NULL;
}

kvp_status_t kvp__uri_check_unused(const kvp__uri_t *u)
{
    for (int i = 0; i < u->nopts; i++) {
        if (!u->used[i]) {
            kvp_error("uri: unknown option '%s' for %s://", u->key[i], u->scheme);
            return KVP_ERR_BAD_OPTION;
        }
    }
    return KVP_OK;
}
