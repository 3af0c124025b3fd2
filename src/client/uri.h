/*
 * Pool URIs: scheme://[authority][/path][?k=v&k=v...].  The parser splits and
 * bounds; each backend interprets the options it knows and refuses the rest.
 */
#ifndef KVP_CLIENT_URI_H
#define KVP_CLIENT_URI_H

#include "kvpool/status.h"

#define KVP_URI_MAX 2048
#define KVP_URI_MAX_OPTS 32

typedef struct kvp__uri {
    char buf[KVP_URI_MAX];           /* the URI, split in place */
    const char *scheme;              /* "embedded", "kvpool", "etcd" */
    const char *authority;           /* "" when absent */
    const char *path;                /* "" when absent, without the leading '/' */
    int nopts;
    const char *key[KVP_URI_MAX_OPTS];
    const char *val[KVP_URI_MAX_OPTS];
    unsigned char used[KVP_URI_MAX_OPTS]; /* set by kvp__uri_opt */
} kvp__uri_t;

/* KVP_OK or KVP_ERR_BAD_URI (logged). */
kvp_status_t kvp__uri_parse(const char *uri, kvp__uri_t *u);
/* The value of option `key`, or NULL; marks it used. */
const char *kvp__uri_opt(kvp__uri_t *u, const char *key);
/* KVP_ERR_BAD_OPTION (logged) if an option was never asked for. */
kvp_status_t kvp__uri_check_unused(const kvp__uri_t *u);

#endif
