#include "common/prom.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>

void kvp__prom_printf(kvp__prom_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bool room = p->buf && p->len < p->cap;
    int n = vsnprintf(room ? p->buf + p->len : NULL, room ? p->cap - p->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0)
        p->len += (size_t)n;
}

void kvp__prom_head(kvp__prom_t *p, const char *name, const char *type, const char *help)
{
    kvp__prom_printf(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void kvp__prom_counter(kvp__prom_t *p, const char *name, const char *help, uint64_t v)
{
    kvp__prom_head(p, name, "counter", help);
    kvp__prom_printf(p, "%s %llu\n", name, (unsigned long long)v);
}
