/*
 * A metrics page as text, from a kvp_*_metrics call (kvpool lookup-server,
 * kvpool epd-node).  Such a call renders into the caller's buffer and says
 * how long the whole text is; the figures may grow between asking for the
 * length and rendering (a counter gaining a digit), so a short buffer is
 * grown and the call made again.
 */
#include "commands.h"
#include "common/alloc.h"

char *kvp_tool_text(kvp_tool_text_fn fn, void *ctx, size_t *len_p, size_t *cap_p)
{
    *len_p = *cap_p = 0;
    size_t len = 0;
    kvp_status_t st = fn(ctx, NULL, 0, &len);
    for (int attempt = 0; attempt < 4 && (st == KVP_OK || st == KVP_ERR_BUFFER_TOO_SMALL); attempt++) {
        size_t cap = len + 1 + 256; /* room for figures that grow meanwhile */
        char *text = kvp__malloc(cap);
        if (!text)
            return NULL;
        st = fn(ctx, text, cap, &len);
        if (st == KVP_OK) {
            *len_p = len;
            *cap_p = cap;
            return text;
        }
        kvp__free(text, cap);
    }
    return NULL;
}
