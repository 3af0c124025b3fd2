/* The scripted KV lookup client (see kv_scripted.h). */
#include "support/kv_scripted.h"

#include <string.h>

#include "common/alloc.h"

struct kvp_kv_scripted {
    int64_t hit;
    bool pending;
    bool fail;
    kvp_kv_reset_reply_t reset_reply;
    kvp_kv_lookup_call_t *calls;
    size_t ncalls, calls_cap;
    char **discards;
    size_t ndiscards, discards_cap;
    size_t nresets;
};

static kvp_status_t sc_lookup(void *ctx, const kvp_kv_request_t *req, bool non_block, int64_t *hit_p)
{
    kvp_kv_scripted_t *sc = ctx;
    if (sc->ncalls == sc->calls_cap) {
        size_t nc = sc->calls_cap ? sc->calls_cap * 2 : 8;
        void *p = kvp__realloc(sc->calls, sc->calls_cap * sizeof *sc->calls, nc * sizeof *sc->calls);
        if (!p)
            return KVP_ERR_NO_MEMORY;
        sc->calls = p;
        sc->calls_cap = nc;
    }
    sc->calls[sc->ncalls++] = (kvp_kv_lookup_call_t){req->num_tokens, req->num_block_hashes, non_block};
    if (sc->fail)
        return KVP_ERR_CONN_LOST;
    if (sc->pending)
        return KVP_INPROGRESS;
    *hit_p = sc->hit;
    return KVP_OK;
}

static void sc_discard(void *ctx, const char *req_id)
{
    kvp_kv_scripted_t *sc = ctx;
    if (sc->ndiscards == sc->discards_cap) {
        size_t nc = sc->discards_cap ? sc->discards_cap * 2 : 8;
        void *p = kvp__realloc(sc->discards, sc->discards_cap * sizeof(char *), nc * sizeof(char *));
        if (!p)
            return;
        sc->discards = p;
        sc->discards_cap = nc;
    }
    char *s = kvp__strdup(req_id);
    if (s)
        sc->discards[sc->ndiscards++] = s;
}

static kvp_status_t sc_reset(void *ctx, bool *ack_p)
{
    kvp_kv_scripted_t *sc = ctx;
    sc->nresets++;
    if (sc->reset_reply == KVP_KV_RESET_ERROR)
        return KVP_ERR_REMOTE;
    *ack_p = sc->reset_reply == KVP_KV_RESET_ACK;
    return KVP_OK;
}

static const kvp_kv_lookup_ops_t g_scripted_ops = {sc_lookup, sc_discard, sc_reset};

kvp_status_t kvp_kv_scripted_create(kvp_kv_scripted_t **sc_p)
{
    if (!sc_p)
        return KVP_ERR_NULL_POINTER;
    kvp_kv_scripted_t *sc = kvp__calloc(1, sizeof *sc);
    if (!sc)
        return KVP_ERR_NO_MEMORY;
    *sc_p = sc;
    return KVP_OK;
}

void kvp_kv_scripted_clear(kvp_kv_scripted_t *sc)
{
    for (size_t i = 0; i < sc->ndiscards; i++)
        kvp__free(sc->discards[i], strlen(sc->discards[i]) + 1);
    sc->ndiscards = 0;
    sc->ncalls = 0;
    sc->nresets = 0;
}

void kvp_kv_scripted_destroy(kvp_kv_scripted_t *sc)
{
    if (!sc)
        return;
    kvp_kv_scripted_clear(sc);
    if (sc->calls)
        kvp__free(sc->calls, sc->calls_cap * sizeof *sc->calls);
    if (sc->discards)
        kvp__free(sc->discards, sc->discards_cap * sizeof(char *));
    kvp__free(sc, sizeof *sc);
}

kvp_kv_lookup_client_t kvp_kv_scripted_client(kvp_kv_scripted_t *sc)
{
    return (kvp_kv_lookup_client_t){&g_scripted_ops, sc};
}

void kvp_kv_scripted_set_lookup(kvp_kv_scripted_t *sc, int64_t hit, bool pending)
{
    sc->hit = hit;
    sc->pending = pending;
    sc->fail = false;
}

void kvp_kv_scripted_set_lookup_error(kvp_kv_scripted_t *sc)
{
    sc->fail = true;
}

void kvp_kv_scripted_set_reset(kvp_kv_scripted_t *sc, kvp_kv_reset_reply_t reply)
{
    sc->reset_reply = reply;
}

size_t kvp_kv_scripted_lookups(const kvp_kv_scripted_t *sc, const kvp_kv_lookup_call_t **calls_p)
{
    *calls_p = sc->calls;
    return sc->ncalls;
}

size_t kvp_kv_scripted_discards(const kvp_kv_scripted_t *sc, const char *const **ids_p)
{
    *ids_p = (const char *const *)sc->discards;
    return sc->ndiscards;
}

size_t kvp_kv_scripted_resets(const kvp_kv_scripted_t *sc)
{
    return sc->nresets;
}
