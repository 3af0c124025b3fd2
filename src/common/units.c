#include "common/units.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Parses "<number><unit>" where number may have one decimal point. */
static int parse_number(const char *s, double *v_p, const char **end_p)
{
    const char *p = s;
    int digits = 0, dot = 0;
    while (*p == ' ')
        p++;
    const char *start = p;
    for (; *p; p++) {
        if (*p >= '0' && *p <= '9')
            digits++;
        else if (*p == '.' && !dot)
            dot = 1;
        else
            break;
    }
    if (!digits)
        return -1;
    char tmp[64];
    size_t n = (size_t)(p - start);
    if (n >= sizeof tmp)
        return -1;
    memcpy(tmp, start, n);
    tmp[n] = 0;
    *v_p = strtod(tmp, NULL);
    while (*p == ' ')
        p++;
    *end_p = p;
    return 0;
}

typedef struct unit {
    const char *unit;
    double mult;
} unit_t;

/* "<number><unit>" scaled by the unit's multiplier (units[]: n of them,
 * matched ignoring case when nocase), into a uint64; integral: the result
 * must be a whole number.  0, or -1 for anything else. */
static int parse_scaled(const char *s, const unit_t *units, size_t n, int nocase, int integral, uint64_t *out_p)
{
    double v;
    const char *u;
    if (!s || parse_number(s, &v, &u) != 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if ((nocase ? strcasecmp(u, units[i].unit) : strcmp(u, units[i].unit)) != 0)
            continue;
        double x = v * units[i].mult;
        if (!(x >= 0) || x > 9.2e18 || (integral && x != floor(x)))
            return -1;
        *out_p = (uint64_t)x;
        return 0;
    }
    return -1;
}

kvp_status_t kvp__parse_size(const char *s, uint64_t *bytes_p)
{
    static const unit_t units[] = {
        {"", 1},
        {"b", 1},
        {"k", 1024.0},
        {"kb", 1024.0},
        {"kib", 1024.0},
        {"m", 1048576.0},
        {"mb", 1048576.0},
        {"mib", 1048576.0},
        {"g", 1073741824.0},
        {"gb", 1073741824.0},
        {"gib", 1073741824.0},
        {"t", 1099511627776.0},
        {"tb", 1099511627776.0},
        {"tib", 1099511627776.0},
    };
    return parse_scaled(s, units, sizeof units / sizeof units[0], 1, 1, bytes_p) ? KVP_ERR_BAD_SIZE : KVP_OK;
}

kvp_status_t kvp__parse_duration_ns(const char *s, uint64_t *ns_p)
{
    static const unit_t units[] = {
        {"", 1e9}, {"ns", 1}, {"us", 1e3}, {"ms", 1e6}, {"s", 1e9}, {"m", 60e9}, {"h", 3600e9},
    };
    return parse_scaled(s, units, sizeof units / sizeof units[0], 0, 0, ns_p) ? KVP_ERR_BAD_OPTION : KVP_OK;
}

void kvp__format_size(uint64_t bytes, char *buf, int buflen)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 4) {
        v /= 1024.0;
        i++;
    }
    if (i == 0)
        snprintf(buf, (size_t)buflen, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, (size_t)buflen, "%.1f %s", v, names[i]);
}

kvp_status_t kvp__parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *v_p)
{
    if (!s || !(s[0] >= '0' && s[0] <= '9'))
        return KVP_ERR_BAD_OPTION;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return KVP_ERR_BAD_OPTION;
    *v_p = v;
    return KVP_OK;
}
