/*
 * A process's CPU time and page faults: see proc_usage.h.
 */
#include "engine/proc_usage.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

kvp__proc_usage_t kvp__proc_usage(pid_t pid)
{
    kvp__proc_usage_t u = {0};
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = pid > 0 ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    ssize_t k = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (k <= 0)
        return u;
    buf[k] = 0;
    /* after the command's closing parenthesis: field 3 (state) on; minflt is
     * field 10, majflt 12, utime 14, stime 15 (clock ticks) */
    const char *c = strrchr(buf, ')');
    unsigned long long f[16] = {0};
    int n = 0;
    for (c = c && c[1] == ' ' ? c + 2 : NULL; c && *c && n < 16; n++) {
        f[n] = strtoull(*c == '-' ? c + 1 : c, NULL, 10);
        c = strchr(c, ' ');
        c = c ? c + 1 : NULL;
    }
    long hz = sysconf(_SC_CLK_TCK);
    if (n < 13 || hz <= 0)
        return u;
    /* f[0] is field 3 */
    u.faults = f[10 - 3] + f[12 - 3];
    u.cpu_ns = (f[14 - 3] + f[15 - 3]) * (1000000000ull / (uint64_t)hz);
    u.have = true;
    return u;
}

kvp__proc_usage_t kvp__proc_usage_since(kvp__proc_usage_t a, kvp__proc_usage_t b)
{
    kvp__proc_usage_t d = {a.have && b.have, b.cpu_ns - a.cpu_ns, b.faults - a.faults};
    return d.have ? d : (kvp__proc_usage_t){0};
}
