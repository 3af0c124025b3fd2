#include "common/random.h"

#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "common/log.h"

kvp_status_t kvp__random_bytes(void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom((char *)buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            kvp_error("random: getrandom failed: %s", r < 0 ? strerror(errno) : "no bytes");
            return KVP_ERR_IO;
        }
        got += (size_t)r;
    }
    return KVP_OK;
}
