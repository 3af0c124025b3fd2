/*
 * The --epd workload, the deterministic encoder output and the replay's
 * line messages (epd.h).
 */
#include "engine/epd.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/mix.h"

void kvp__epd_wl_params_init(kvp__epd_wl_params_t *p)
{
    memset(p, 0, sizeof *p);
    p->requests = 300;
    p->min_images = 1;
    p->max_images = 3;
    p->size = 4 << 20;
    p->repeat = 1.0 / 3.0;
    p->repeat_gap = 16;
    p->seed = 1;
}

kvp_status_t kvp__epd_shape(int64_t size, int64_t *num_embeds_p, int64_t *hidden_p)
{
    if (size < 2 || size % 2)
        return KVP_ERR_INVALID_ARG;
    int64_t elems = size / 2, hidden = 4096;
    while (elems % hidden)
        hidden /= 2;
    *hidden_p = hidden;
    *num_embeds_p = elems / hidden;
    return KVP_OK;
}

/* A uniform draw in [0, n). */
static uint64_t draw(uint64_t *st, uint64_t n) { return n ? kvp__splitmix64(st) % n : 0; }

/*
 * The generator.  Requests in order; each has k images (uniform in
 * [min_images, max_images]).  An image slot reuses an earlier image with
 * probability `repeat` when one qualifies: first used at least repeat_gap
 * requests earlier and not already in this request (the candidates are the
 * images of requests [0, r - gap), drawn uniformly); otherwise it is a new
 * image.  Prompt: KVP__EPD_TEXT_TOKENS of text, then the image's
 * placeholders (num_embeds tokens), per image, then text again.
 */
kvp_status_t kvp__epd_workload_gen(const kvp__epd_wl_params_t *p, kvp__epd_workload_t *w)
{
    memset(w, 0, sizeof *w);
    if (!p->requests || !p->min_images || p->min_images > p->max_images ||
        p->max_images > KVP__EPD_MAX_IMAGES || p->repeat < 0 || p->repeat > 1)
        return KVP_ERR_INVALID_ARG;
    kvp_status_t st = kvp__epd_shape(p->size, &w->num_embeds, &w->hidden);
    if (st != KVP_OK)
        return st;
    w->p = *p;
    size_t max_hashes = (size_t)p->requests * p->max_images;
    w->reqs = kvp__calloc(p->requests, sizeof *w->reqs);
    w->hashes = kvp__calloc(max_hashes, sizeof *w->hashes);
    /* first_req[h]: the request that first used image h (hashes are in
     * first-use order, so those usable by request r are a prefix). */
    uint32_t *first_req = kvp__calloc(max_hashes, sizeof *first_req);
    if (!w->reqs || !w->hashes || !first_req) {
        kvp__free(first_req, max_hashes * sizeof *first_req);
        kvp__epd_workload_cleanup(w);
        return KVP_ERR_NO_MEMORY;
    }
    uint64_t rng = kvp__mix64(p->seed ^ 0x65706421ull);
    uint64_t thresh = (uint64_t)(p->repeat * 4294967296.0);
    for (uint32_t r = 0; r < p->requests; r++) {
        kvp__epd_req_t *q = &w->reqs[r];
        snprintf(q->id, sizeof q->id, "epd-%05" PRIu32, r);
        q->n_images = p->min_images + (uint32_t)draw(&rng, p->max_images - p->min_images + 1);
        /* images first used before request r - gap */
        uint32_t usable = 0;
        while (usable < w->n_hashes && r >= p->repeat_gap && first_req[usable] < r - p->repeat_gap)
            usable++;
        int64_t pos = 0;
        for (uint32_t k = 0; k < q->n_images; k++) {
            uint32_t img = UINT32_MAX;
            if (usable > 0 && (kvp__splitmix64(&rng) >> 32) < thresh) {
                for (int tries = 0; tries < 8 && img == UINT32_MAX; tries++) {
                    uint32_t c = (uint32_t)draw(&rng, usable);
                    bool dup = false;
                    for (uint32_t j = 0; j < k; j++)
                        dup |= q->image[j] == c;
                    if (!dup)
                        img = c;
                }
                if (img != UINT32_MAX)
                    w->n_repeat_slots++;
            }
            if (img == UINT32_MAX) {
                img = w->n_hashes++;
                first_req[img] = r;
                snprintf(w->hashes[img], KVP__EPD_HASH_LEN, "img-%016" PRIx64,
                         kvp__mix64(p->seed * 0x100000001b3ull + img + 1));
            }
            q->image[k] = img;
            pos += KVP__EPD_TEXT_TOKENS;
            q->offset[k] = pos;
            pos += w->num_embeds;
            w->n_slots++;
        }
        q->prompt_len = pos + KVP__EPD_TEXT_TOKENS;
    }
    kvp__free(first_req, max_hashes * sizeof *first_req);
    return KVP_OK;
}

void kvp__epd_workload_cleanup(kvp__epd_workload_t *w)
{
    size_t max_hashes = (size_t)w->p.requests * w->p.max_images;
    kvp__free(w->reqs, w->p.requests * sizeof *w->reqs);
    kvp__free(w->hashes, max_hashes * sizeof *w->hashes);
    memset(w, 0, sizeof *w);
}

/* ---------------------------------------------------------------- content */

uint64_t kvp__epd_content_seed(const char *mm_hash)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a, then mixed */
    for (const char *s = mm_hash; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return kvp__mix64(h);
}

static inline uint64_t word_at(uint64_t seed, uint64_t w) { return kvp__mix64(seed + w * KVP__MIX_GOLDEN); }

void kvp__epd_content_fill(const char *mm_hash, uint8_t *buf, int64_t nbytes)
{
    uint64_t seed = kvp__epd_content_seed(mm_hash);
    int64_t words = nbytes / 8;
    for (int64_t w = 0; w < words; w++) {
        uint64_t v = word_at(seed, (uint64_t)w);
        memcpy(buf + w * 8, &v, 8); /* little-endian byte order on every host we run */
    }
    if (nbytes % 8) {
        uint64_t v = word_at(seed, (uint64_t)words);
        memcpy(buf + words * 8, &v, (size_t)(nbytes % 8));
    }
}

int64_t kvp__epd_content_verify(const char *mm_hash, const uint8_t *buf, int64_t nbytes)
{
    uint64_t seed = kvp__epd_content_seed(mm_hash);
    int64_t words = nbytes / 8, good = 0;
    for (int64_t w = 0; w < words; w++) {
        uint64_t v = word_at(seed, (uint64_t)w), got;
        memcpy(&got, buf + w * 8, 8);
        if (got == v) {
            good += 8;
        } else {
            for (int b = 0; b < 8; b++)
                good += ((got >> (8 * b)) & 0xff) == ((v >> (8 * b)) & 0xff);
        }
    }
    if (nbytes % 8) {
        uint64_t v = word_at(seed, (uint64_t)words);
        for (int64_t b = 0; b < nbytes % 8; b++)
            good += buf[words * 8 + b] == ((v >> (8 * b)) & 0xff);
    }
    return good;
}

/* ---------------------------------------------------------------- messages */

void kvp__epd_transfer_id(char *buf, size_t len, const char *req_id, size_t k)
{
    snprintf(buf, len, "%s#%zu", req_id, k);
}

static void key(kvp__jw_t *b, const char *k, bool first)
{
    if (!first)
        kvp__jw_puts(b, ",");
    kvp__jw_str(b, k, strlen(k));
    kvp__jw_puts(b, ":");
}

static void str_member(kvp__jw_t *b, const char *k, const char *v, bool first)
{
    key(b, k, first);
    kvp__jw_str(b, v, strlen(v));
}

static void int_member(kvp__jw_t *b, const char *k, int64_t v, bool first)
{
    key(b, k, first);
    kvp__jw_int(b, v);
}

void kvp__epd_msg_req_write(kvp__jw_t *b, const kvp__epd_msg_req_t *r)
{
    kvp__jw_puts(b, "{");
    str_member(b, "op", "req", true);
    str_member(b, "id", r->id, false);
    int_member(b, "prompt_len", r->prompt_len, false);
    key(b, "features", false);
    kvp__jw_puts(b, "[");
    for (size_t i = 0; i < r->n; i++) {
        kvp__jw_puts(b, i ? ",{" : "{");
        str_member(b, "mm_hash", r->mm_hash[i], true);
        str_member(b, "modality", "image", false);
        int_member(b, "offset", r->offset[i], false);
        int_member(b, "length", r->length[i], false);
        int_member(b, "num_embeds", r->num_embeds[i], false);
        kvp__jw_puts(b, "}");
    }
    kvp__jw_puts(b, "]");
    key(b, "ec_transfer_params", false);
    kvp__jw_puts(b, "{");
    str_member(b, "consumer_zmq", r->consumer_zmq, true);
    key(b, "ec_items", false);
    kvp__jw_puts(b, "[");
    for (size_t i = 0; i < r->n; i++) {
        kvp__jw_puts(b, i ? ",{" : "{");
        str_member(b, "mm_hash", r->mm_hash[i], true);
        str_member(b, "transfer_id", r->transfer_id[i], false);
        kvp__jw_puts(b, "}");
    }
    kvp__jw_puts(b, "]}}\n");
}

bool kvp__epd_json_int(const kvp__json_t *o, const char *k, int64_t *v)
{
    const kvp__json_t *m = o ? kvp__json_get(o, k) : NULL;
    if (!m || m->type != KVP__JSON_INT)
        return false;
    *v = m->u.i;
    return true;
}

bool kvp__epd_json_str(const kvp__json_t *o, const char *k, char *buf, size_t len)
{
    const kvp__json_t *m = o ? kvp__json_get(o, k) : NULL;
    if (!m || m->type != KVP__JSON_STRING || m->n >= len || memchr(m->u.s, 0, m->n))
        return false;
    memcpy(buf, m->u.s, m->n + 1);
    return true;
}

bool kvp__epd_json_bool(const kvp__json_t *o, const char *k, bool *v)
{
    const kvp__json_t *m = o ? kvp__json_get(o, k) : NULL;
    if (!m || (m->type != KVP__JSON_TRUE && m->type != KVP__JSON_FALSE))
        return false;
    *v = m->type == KVP__JSON_TRUE;
    return true;
}

#define BAD(...) (snprintf(err, errlen, __VA_ARGS__), KVP_ERR_DECODE)

kvp_status_t kvp__epd_msg_req_read(const kvp__json_t *root, kvp__epd_msg_req_t *r, char *err, size_t errlen)
{
    memset(r, 0, sizeof *r);
    if (!root || root->type != KVP__JSON_OBJECT)
        return BAD("not an object");
    if (!kvp__epd_json_str(root, "id", r->id, sizeof r->id) || !r->id[0])
        return BAD("id: a non-empty string under %zu bytes", sizeof r->id);
    if (!kvp__epd_json_int(root, "prompt_len", &r->prompt_len) || r->prompt_len < 1)
        return BAD("prompt_len: a positive integer");
    const kvp__json_t *f = kvp__json_get(root, "features");
    if (!f || f->type != KVP__JSON_ARRAY || f->n > KVP__EPD_MAX_IMAGES)
        return BAD("features: an array of at most %d", KVP__EPD_MAX_IMAGES);
    r->n = f->n;
    for (size_t i = 0; i < f->n; i++) {
        const kvp__json_t *o = &f->u.items[i];
        char modality[16];
        if (!kvp__epd_json_str(o, "mm_hash", r->mm_hash[i], sizeof r->mm_hash[i]) ||
            !kvp__epd_json_str(o, "modality", modality, sizeof modality) ||
            !kvp__epd_json_int(o, "offset", &r->offset[i]) || !kvp__epd_json_int(o, "length", &r->length[i]) ||
            !kvp__epd_json_int(o, "num_embeds", &r->num_embeds[i]))
            return BAD("features[%zu]: mm_hash, modality, offset, length, num_embeds", i);
        if (r->offset[i] < 0 || r->length[i] < 1 || r->num_embeds[i] < 1 || r->num_embeds[i] > r->length[i] ||
            r->offset[i] + r->length[i] > r->prompt_len)
            return BAD("features[%zu]: a placeholder outside the prompt", i);
    }
    const kvp__json_t *p = kvp__json_get(root, "ec_transfer_params");
    if (!p || p->type != KVP__JSON_OBJECT)
        return BAD("ec_transfer_params: an object");
    if (!kvp__epd_json_str(p, "consumer_zmq", r->consumer_zmq, sizeof r->consumer_zmq))
        return BAD("ec_transfer_params.consumer_zmq: a string");
    const kvp__json_t *items = kvp__json_get(p, "ec_items");
    if (!items || items->type != KVP__JSON_ARRAY || items->n != r->n)
        return BAD("ec_transfer_params.ec_items: one per feature");
    for (size_t i = 0; i < items->n; i++) {
        char h[64];
        if (!kvp__epd_json_str(&items->u.items[i], "mm_hash", h, sizeof h) || strcmp(h, r->mm_hash[i]) ||
            !kvp__epd_json_str(&items->u.items[i], "transfer_id", r->transfer_id[i], sizeof r->transfer_id[i]))
            return BAD("ec_items[%zu]: the feature's mm_hash and a transfer_id", i);
    }
    return KVP_OK;
}
