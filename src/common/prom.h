/*
 * Prometheus text exposition into a caller's buffer: the metrics pages of
 * the programs and servers built on the library (the KV lookup server's,
 * the EC worker's).  Writes what fits and counts what the whole text
 * needs, so a caller can ask for the size first (buf NULL, cap 0).
 */
#ifndef KVP_COMMON_PROM_H
#define KVP_COMMON_PROM_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp__prom {
    char *buf;
    size_t cap, len; /* len: what the text needs, also past cap */
} kvp__prom_t;

void kvp__prom_printf(kvp__prom_t *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A metric's HELP and TYPE lines (type: "counter", "gauge"); its series
 * follow (kvp__prom_printf). */
void kvp__prom_head(kvp__prom_t *p, const char *name, const char *type, const char *help);
/* A counter without labels: its head and its one series. */
void kvp__prom_counter(kvp__prom_t *p, const char *name, const char *help, uint64_t v);

#endif
