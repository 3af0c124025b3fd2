/* Unit tests of the reply codecs (src/net/wire_reply.c): each encoder writes
 * exactly the bytes the server's hand-written encoders wrote before they
 * moved to net/ (golden arrays captured from src/server/handlers.c and
 * lreads.c at main 06cb7a1: the wire must not change), and each decoder
 * reads them back and refuses what the client always refused. */
#include <stdlib.h>
#include <string.h>

#include "common/mp.h"
#include "net/wire.h"
#include "net/wire_reply.h"
#include "test.h"

static const uint8_t g_status_get[] = {0x94, 0x01, 0x05, 0x2a, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd8};
static const uint8_t g_status_undecodable[] = {0x94, 0x01, 0x00, 0x00, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xb0};
static const uint8_t g_status_proof[] = {0x94, 0x01, 0x0d, 0xcd, 0x01, 0x2c, 0x00};
static const uint8_t g_hello_nil[] = {0x98, 0x01, 0x01, 0x07, 0x00, 0x01, 0xce, 0x00, 0x01, 0x00, 0x00, 0xce, 0x40, 0x00, 0x00, 0x00, 0xc0};
static const uint8_t g_hello_arena[] = {0x98, 0x01, 0x01, 0xce, 0x00, 0x01, 0x11, 0x70, 0x00, 0x01, 0xce, 0x00, 0x01, 0x00, 0x00, 0xcf, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x9a, 0xce, 0x00, 0x01, 0xe2, 0x40, 0x07, 0xcf, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0xcd, 0x08, 0x03, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x23, 0x45, 0x67, 0x89, 0x01, 0x08, 0xce, 0x00, 0x08, 0x10, 0x40, 0x10, 0x63};
static const uint8_t g_exists[] = {0x95, 0x01, 0x02, 0x09, 0x00, 0xc4, 0x03, 0x01, 0x00, 0x01};
static const uint8_t g_prefix[] = {0x95, 0x01, 0x03, 0x0a, 0x00, 0x02};
static const uint8_t g_remove_all[] = {0x95, 0x01, 0x09, 0x0b, 0x00, 0xce, 0x00, 0x01, 0x86, 0xa0};
static const uint8_t g_stats[] = {0x95, 0x01, 0x0a, 0x0c, 0x00, 0xdc, 0x00, 0x14, 0xcc, 0xc8, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x01, 0x01, 0x01, 0x01, 0xcf, 0x00, 0x00, 0x00, 0x02, 0x02, 0x02, 0x02, 0xca, 0xcf, 0x00, 0x00, 0x00, 0x03, 0x03, 0x03, 0x03, 0x03, 0xcf, 0x00, 0x00, 0x00, 0x04, 0x04, 0x04, 0x04, 0xcc, 0xcf, 0x00, 0x00, 0x00, 0x05, 0x05, 0x05, 0x05, 0x05, 0xcf, 0x00, 0x00, 0x00, 0x06, 0x06, 0x06, 0x06, 0xce, 0xcf, 0x00, 0x00, 0x00, 0x07, 0x07, 0x07, 0x07, 0x07, 0xcf, 0x00, 0x00, 0x00, 0x08, 0x08, 0x08, 0x08, 0xd0, 0xcf, 0x00, 0x00, 0x00, 0x09, 0x09, 0x09, 0x09, 0x09, 0xcf, 0x00, 0x00, 0x00, 0x0a, 0x0a, 0x0a, 0x0a, 0xd2, 0xcf, 0x00, 0x00, 0x00, 0x0b, 0x0b, 0x0b, 0x0b, 0x0b, 0xcf, 0x00, 0x00, 0x00, 0x0c, 0x0c, 0x0c, 0x0c, 0xd4, 0xcf, 0x00, 0x00, 0x00, 0x0d, 0x0d, 0x0d, 0x0d, 0x0d, 0xcf, 0x00, 0x00, 0x00, 0x0e, 0x0e, 0x0e, 0x0e, 0xd6, 0xcf, 0x00, 0x00, 0x00, 0x0f, 0x0f, 0x0f, 0x0f, 0x0f, 0xcf, 0x00, 0x00, 0x00, 0x10, 0x10, 0x10, 0x10, 0xd8, 0xcf, 0x00, 0x00, 0x00, 0x11, 0x11, 0x11, 0x11, 0x11, 0xcf, 0x00, 0x00, 0x00, 0x12, 0x12, 0x12, 0x12, 0xda, 0xcf, 0x00, 0x00, 0x00, 0x13, 0x13, 0x13, 0x13, 0x13};
static const uint8_t g_put[] = {0x95, 0x01, 0x04, 0x0d, 0x00, 0x93, 0x92, 0x00, 0x01, 0x92, 0x00, 0x02, 0x92, 0xeb, 0x00};
static const uint8_t g_get[] = {0x95, 0x01, 0x05, 0x0e, 0x00, 0x93, 0x92, 0x00, 0xcd, 0x04, 0xd2, 0x92, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd8, 0x00, 0x92, 0xfa, 0xce, 0x00, 0x01, 0x11, 0x70};
static const uint8_t g_local[] = {0x97, 0x01, 0x0b, 0x0f, 0x00, 0x93, 0x93, 0x00, 0xcd, 0x10, 0x00, 0xce, 0x00, 0x01, 0x00, 0x00, 0x93, 0xea, 0x0a, 0x00, 0x93, 0x00, 0xcf, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0xcf, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0xcd, 0xff, 0xff, 0xcf, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01};
static const uint8_t g_local_none[] = {0x97, 0x01, 0x0b, 0x10, 0x00, 0x91, 0x93, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd8, 0x00, 0x00, 0x00, 0x00};

/* w holds exactly want (and is freed). */
#define ASSERT_BYTES(w, want)                                                 \
    do {                                                                      \
        ASSERT(!(w).err);                                                     \
        ASSERT_EQ((w).len, sizeof(want));                                     \
        ASSERT_MEM_EQ((w).buf, want, sizeof(want));                           \
        kvp__mpw_free(&(w));                                                  \
    } while (0)

static kvp__mpw_t writer(void)
{
    kvp__mpw_t w;
    kvp__mpw_init(&w, NULL, 0);
    return w;
}

/* Decodes the envelope of a golden reply, checking op and req_id. */
static kvp__wire_reply_t envelope(const uint8_t *b, size_t n, uint32_t op, uint64_t req_id)
{
    kvp__wire_reply_t rep;
    ASSERT_OK(kvp__wire_reply_decode(b, n, &rep));
    ASSERT_EQ(rep.op, op);
    ASSERT_EQ(rep.req_id, req_id);
    return rep;
}

static const kvp__wire_arena_t g_arena = {.pid = 123456, .fd = 7, .size = 1ull << 34, .dev = 0x803,
                                          .ino = 0x123456789ull, .populated = 1, .tfd = 8, .tsize = 528448,
                                          .tdev = 0x10, .tino = 99};

TEST(test_wire_reply_status_bytes_unchanged)
{
    kvp__mpw_t w = writer();
    kvp__wire_reply_status_encode(&w, KVP_WOP_GET, 42, KVP_ERR_NOT_FOUND);
    ASSERT_BYTES(w, g_status_get);
    w = writer();
    kvp__wire_reply_status_encode(&w, 0, 0, KVP_ERR_PROTOCOL);
    ASSERT_BYTES(w, g_status_undecodable);
    w = writer();
    kvp__wire_reply_status_encode(&w, KVP_WOP_LOCAL_PROOF, 300, KVP_OK);
    ASSERT_BYTES(w, g_status_proof);
    kvp__wire_reply_t rep = envelope(g_status_get, sizeof g_status_get, KVP_WOP_GET, 42);
    ASSERT_EQ(rep.status, KVP_ERR_NOT_FOUND);
    rep = envelope(g_status_undecodable, sizeof g_status_undecodable, 0, 0);
    ASSERT_EQ(rep.status, KVP_ERR_PROTOCOL);
}

TEST(test_wire_reply_hello_bytes_unchanged_and_round_trip)
{
    kvp__mpw_t w = writer();
    kvp__wire_reply_hello_encode(&w, 7, KVP_BATCH_MAX, 1ull << 30, NULL);
    ASSERT_BYTES(w, g_hello_nil);
    w = writer();
    kvp__wire_reply_hello_encode(&w, 70000, KVP_BATCH_MAX, 5ull << 32, &g_arena);
    ASSERT_BYTES(w, g_hello_arena);

    kvp__wire_hello_t h;
    kvp__wire_reply_t rep = envelope(g_hello_nil, sizeof g_hello_nil, KVP_WOP_HELLO, 7);
    ASSERT_OK(kvp__wire_reply_hello_decode(&rep, &h));
    ASSERT_EQ(h.protocol, KVP_WIRE_VERSION);
    ASSERT_EQ(h.max_batch, KVP_BATCH_MAX);
    ASSERT_EQ(h.max_value, 1ull << 30);
    ASSERT(!h.has_arena);
    rep = envelope(g_hello_arena, sizeof g_hello_arena, KVP_WOP_HELLO, 70000);
    ASSERT_OK(kvp__wire_reply_hello_decode(&rep, &h));
    ASSERT(h.has_arena);
    ASSERT_EQ(h.max_value, 5ull << 32);
    ASSERT_MEM_EQ(&h.arena, &g_arena, sizeof g_arena);
    /* No arena field at all (a server that ends after max_value): none. */
    rep = envelope(g_hello_nil, sizeof g_hello_nil - 1, KVP_WOP_HELLO, 7);
    ASSERT_OK(kvp__wire_reply_hello_decode(&rep, &h));
    ASSERT(!h.has_arena);
    /* An arena of 9 fields, or one cut short, or max_value missing: refused. */
    uint8_t b[sizeof g_hello_arena];
    memcpy(b, g_hello_arena, sizeof b);
    b[24] = 0x99;
    rep = envelope(b, sizeof b, KVP_WOP_HELLO, 70000);
    ASSERT_EQ(kvp__wire_reply_hello_decode(&rep, &h), KVP_ERR_PROTOCOL);
    rep = envelope(g_hello_arena, sizeof g_hello_arena - 1, KVP_WOP_HELLO, 70000);
    ASSERT_EQ(kvp__wire_reply_hello_decode(&rep, &h), KVP_ERR_PROTOCOL);
    rep = envelope(g_hello_nil, 6, KVP_WOP_HELLO, 7);
    ASSERT_EQ(kvp__wire_reply_hello_decode(&rep, &h), KVP_ERR_PROTOCOL);
}

TEST(test_wire_reply_small_ops_bytes_unchanged_and_round_trip)
{
    const uint8_t present[3] = {1, 0, 1};
    kvp__mpw_t w = writer();
    kvp__wire_reply_exists_encode(&w, 9, present, 3);
    ASSERT_BYTES(w, g_exists);
    w = writer();
    kvp__wire_reply_prefix_encode(&w, 10, 2);
    ASSERT_BYTES(w, g_prefix);
    w = writer();
    kvp__wire_reply_remove_all_encode(&w, 11, 100000);
    ASSERT_BYTES(w, g_remove_all);

    uint8_t got[4] = {9, 9, 9, 9};
    kvp__wire_reply_t rep = envelope(g_exists, sizeof g_exists, KVP_WOP_EXISTS, 9);
    ASSERT_OK(kvp__wire_reply_exists_decode(&rep, 3, got));
    ASSERT_MEM_EQ(got, present, 3);
    ASSERT_EQ(got[3], 9);
    rep = envelope(g_exists, sizeof g_exists, KVP_WOP_EXISTS, 9);
    ASSERT_EQ(kvp__wire_reply_exists_decode(&rep, 4, got), KVP_ERR_PROTOCOL); /* not the count asked */

    uint64_t m = 0;
    rep = envelope(g_prefix, sizeof g_prefix, KVP_WOP_PREFIX, 10);
    ASSERT_OK(kvp__wire_reply_prefix_decode(&rep, 3, &m));
    ASSERT_EQ(m, 2);
    rep = envelope(g_prefix, sizeof g_prefix, KVP_WOP_PREFIX, 10);
    ASSERT_EQ(kvp__wire_reply_prefix_decode(&rep, 1, &m), KVP_ERR_PROTOCOL); /* more than asked */
    rep = envelope(g_prefix, sizeof g_prefix - 1, KVP_WOP_PREFIX, 10);
    ASSERT_EQ(kvp__wire_reply_prefix_decode(&rep, 3, &m), KVP_ERR_PROTOCOL);

    rep = envelope(g_remove_all, sizeof g_remove_all, KVP_WOP_REMOVE_ALL, 11);
    ASSERT_OK(kvp__wire_reply_remove_all_decode(&rep, &m));
    ASSERT_EQ(m, 100000);
    rep = envelope(g_remove_all, sizeof g_remove_all - 1, KVP_WOP_REMOVE_ALL, 11);
    ASSERT_EQ(kvp__wire_reply_remove_all_decode(&rep, &m), KVP_ERR_PROTOCOL);
}

TEST(test_wire_reply_stats_bytes_unchanged_and_round_trip)
{
    kvp_pool_stats_t st;
    uint64_t f[KVP_WIRE_NSTATS];
    for (size_t i = 0; i < KVP_WIRE_NSTATS; i++)
        f[i] = i * 0x0101010101ull + (i & 1 ? 0 : 200);
    memcpy(&st, f, sizeof f);
    kvp__mpw_t w = writer();
    kvp__wire_reply_stats_encode(&w, 12, &st);
    ASSERT_BYTES(w, g_stats);
    kvp_pool_stats_t got;
    memset(&got, 0xee, sizeof got);
    uint32_t nf = 0;
    kvp__wire_reply_t rep = envelope(g_stats, sizeof g_stats, KVP_WOP_STATS, 12);
    ASSERT_OK(kvp__wire_reply_stats_decode(&rep, &got, &nf));
    ASSERT_EQ(nf, KVP_WIRE_NSTATS);
    ASSERT_MEM_EQ(&got, &st, sizeof st);
    /* NULL storage: only checked. */
    rep = envelope(g_stats, sizeof g_stats, KVP_WOP_STATS, 12);
    ASSERT_OK(kvp__wire_reply_stats_decode(&rep, NULL, NULL));
    rep = envelope(g_stats, sizeof g_stats - 1, KVP_WOP_STATS, 12);
    ASSERT_EQ(kvp__wire_reply_stats_decode(&rep, &got, &nf), KVP_ERR_PROTOCOL);
    /* Fewer fields (an older server): the rest keep their values. */
    uint8_t two[] = {0x95, 0x01, 0x0a, 0x0c, 0x00, 0x92, 0x05, 0x06};
    memset(&got, 0, sizeof got);
    got.get_hits = 77;
    rep = envelope(two, sizeof two, KVP_WOP_STATS, 12);
    ASSERT_OK(kvp__wire_reply_stats_decode(&rep, &got, &nf));
    ASSERT_EQ(nf, 2);
    uint64_t g0, g1;
    memcpy(&g0, &got, 8);
    memcpy(&g1, (char *)&got + 8, 8);
    ASSERT_EQ(g0, 5);
    ASSERT_EQ(g1, 6);
    ASSERT_EQ(got.get_hits, 77);
}

TEST(test_wire_reply_results_bytes_unchanged_and_round_trip)
{
    kvp_key_result_t res[3] = {{.status = KVP_OK, .flags = 1, .size = 100},
                               {.status = KVP_OK, .flags = 2, .size = 200},
                               {.status = KVP_ERR_NO_SPACE, .flags = 0, .size = 300}};
    kvp__mpw_t w = writer();
    kvp__wire_reply_results_encode(&w, KVP_WOP_PUT, 13, res, 3);
    ASSERT_BYTES(w, g_put);
    /* A GET, streamed as the server leases. */
    w = writer();
    kvp__wire_reply_keys_begin(&w, KVP_WOP_GET, 14, 3);
    kvp__wire_reply_key(&w, KVP_OK, 1234);
    kvp__wire_reply_key(&w, KVP_ERR_NOT_FOUND, 0);
    kvp__wire_reply_key(&w, KVP_ERR_BUFFER_TOO_SMALL, 70000);
    ASSERT_BYTES(w, g_get);
    /* ... and the same through the all-at-once encoder (sizes for GET). */
    kvp_key_result_t gr[3] = {{.status = KVP_OK, .size = 1234, .flags = 9},
                              {.status = KVP_ERR_NOT_FOUND},
                              {.status = KVP_ERR_BUFFER_TOO_SMALL, .size = 70000}};
    w = writer();
    kvp__wire_reply_results_encode(&w, KVP_WOP_GET, 14, gr, 3);
    ASSERT_BYTES(w, g_get);

    kvp_key_result_t got[3];
    memset(got, 0, sizeof got);
    for (int i = 0; i < 3; i++)
        got[i].size = 555; /* a put keeps its own sizes */
    uint64_t total = 1;
    kvp__wire_reply_t rep = envelope(g_put, sizeof g_put, KVP_WOP_PUT, 13);
    ASSERT_OK(kvp__wire_reply_results_decode(&rep, 3, got, NULL));
    for (int i = 0; i < 3; i++) {
        ASSERT_EQ(got[i].status, res[i].status);
        ASSERT_EQ(got[i].flags, res[i].flags);
        ASSERT_EQ(got[i].size, 555);
    }
    rep = envelope(g_get, sizeof g_get, KVP_WOP_GET, 14);
    ASSERT_OK(kvp__wire_reply_results_decode(&rep, 3, got, &total));
    ASSERT_EQ(total, 1234);
    ASSERT_EQ(got[0].size, 1234);
    ASSERT_EQ(got[0].flags, 0);
    ASSERT_EQ(got[1].status, KVP_ERR_NOT_FOUND);
    ASSERT_EQ(got[2].status, KVP_ERR_BUFFER_TOO_SMALL);
    ASSERT_EQ(got[2].size, 70000);
    /* REMOVE/PIN/UNPIN: sizes cleared. */
    uint8_t rm[sizeof g_put];
    memcpy(rm, g_put, sizeof rm);
    rm[2] = KVP_WOP_REMOVE;
    rep = envelope(rm, sizeof rm, KVP_WOP_REMOVE, 13);
    ASSERT_OK(kvp__wire_reply_results_decode(&rep, 3, got, NULL));
    ASSERT_EQ(got[0].size, 0);
    ASSERT_EQ(got[1].flags, 2);
    /* Refused: another count than asked, truncation, an item of 3 fields,
     * a positive status. */
    rep = envelope(g_get, sizeof g_get, KVP_WOP_GET, 14);
    ASSERT_EQ(kvp__wire_reply_results_decode(&rep, 2, got, &total), KVP_ERR_PROTOCOL);
    for (size_t n = 5; n < sizeof g_get; n++) {
        rep = envelope(g_get, n, KVP_WOP_GET, 14);
        ASSERT_EQ(kvp__wire_reply_results_decode(&rep, 3, got, &total), KVP_ERR_PROTOCOL);
    }
    uint8_t bad[sizeof g_put];
    memcpy(bad, g_put, sizeof bad);
    bad[6] = 0x93;
    rep = envelope(bad, sizeof bad, KVP_WOP_PUT, 13);
    ASSERT_EQ(kvp__wire_reply_results_decode(&rep, 3, got, NULL), KVP_ERR_PROTOCOL);
    memcpy(bad, g_put, sizeof bad);
    bad[7] = 0x01;
    rep = envelope(bad, sizeof bad, KVP_WOP_PUT, 13);
    ASSERT_EQ(kvp__wire_reply_results_decode(&rep, 3, got, NULL), KVP_ERR_PROTOCOL);
    /* GET sizes whose sum wraps (to 1,234 here, which a reply's data could
     * have) are refused, not summed. */
    w = writer();
    kvp__wire_reply_keys_begin(&w, KVP_WOP_GET, 14, 2);
    kvp__wire_reply_key(&w, KVP_OK, UINT64_MAX);
    kvp__wire_reply_key(&w, KVP_OK, 1235);
    ASSERT(!w.err);
    rep = envelope(w.buf, w.len, KVP_WOP_GET, 14);
    ASSERT_EQ(kvp__wire_reply_results_decode(&rep, 2, got, &total), KVP_ERR_PROTOCOL);
    kvp__mpw_free(&w);
}

TEST(test_wire_reply_local_bytes_unchanged_and_round_trip)
{
    kvp__mpw_t w = writer();
    kvp__wire_reply_local_begin(&w, 15, 3);
    kvp__wire_reply_local_item(&w, KVP_OK, 4096, 65536);
    kvp__wire_reply_local_item(&w, KVP_ERR_BUSY, 10, 0);
    kvp__wire_reply_local_item(&w, KVP_OK, 1ull << 33, 1ull << 35);
    kvp__wire_reply_local_end(&w, 65535, 0x100000001ull);
    ASSERT_BYTES(w, g_local);
    w = writer();
    kvp__wire_reply_local_begin(&w, 16, 1);
    kvp__wire_reply_local_item(&w, KVP_ERR_NOT_FOUND, 0, 0);
    kvp__wire_reply_local_end(&w, 0, 0);
    ASSERT_BYTES(w, g_local_none);

    kvp__wire_local_item_t it[3];
    uint64_t slot = 1, gen = 1;
    uint32_t nok = 9;
    kvp__wire_reply_t rep = envelope(g_local, sizeof g_local, KVP_WOP_GET_LOCAL, 15);
    ASSERT_OK(kvp__wire_reply_local_decode(&rep, 3, it, &slot, &gen, &nok));
    ASSERT_EQ(nok, 2);
    ASSERT_EQ(it[0].status, KVP_OK);
    ASSERT_EQ(it[0].size, 4096);
    ASSERT_EQ(it[0].offset, 65536);
    ASSERT_EQ(it[1].status, KVP_ERR_BUSY);
    ASSERT_EQ(it[2].size, 1ull << 33);
    ASSERT_EQ(it[2].offset, 1ull << 35);
    ASSERT_EQ(slot, 65535);
    ASSERT_EQ(gen, 0x100000001ull);
    rep = envelope(g_local_none, sizeof g_local_none, KVP_WOP_GET_LOCAL, 16);
    ASSERT_OK(kvp__wire_reply_local_decode(&rep, 1, it, &slot, &gen, &nok));
    ASSERT_EQ(nok, 0);
    ASSERT_EQ(slot, 0);
    for (size_t n = 5; n < sizeof g_local; n++) {
        rep = envelope(g_local, n, KVP_WOP_GET_LOCAL, 15);
        ASSERT_EQ(kvp__wire_reply_local_decode(&rep, 3, it, &slot, &gen, &nok), KVP_ERR_PROTOCOL);
    }
    rep = envelope(g_local, sizeof g_local, KVP_WOP_GET_LOCAL, 15);
    ASSERT_EQ(kvp__wire_reply_local_decode(&rep, 4, it, &slot, &gen, &nok), KVP_ERR_PROTOCOL);
}

TEST(test_wire_reply_data_only_on_an_ok_get)
{
    kvp__wire_reply_t rep = envelope(g_get, sizeof g_get, KVP_WOP_GET, 14);
    ASSERT_OK(kvp__wire_reply_data_check(&rep, 1234));
    ASSERT_OK(kvp__wire_reply_data_check(&rep, 0));
    rep = envelope(g_status_get, sizeof g_status_get, KVP_WOP_GET, 42);
    ASSERT_EQ(kvp__wire_reply_data_check(&rep, 1), KVP_ERR_PROTOCOL);
    ASSERT_OK(kvp__wire_reply_data_check(&rep, 0));
    rep = envelope(g_put, sizeof g_put, KVP_WOP_PUT, 13);
    ASSERT_EQ(kvp__wire_reply_data_check(&rep, 1), KVP_ERR_PROTOCOL);
}

TEST_LIST(T(test_wire_reply_status_bytes_unchanged), T(test_wire_reply_hello_bytes_unchanged_and_round_trip),
          T(test_wire_reply_small_ops_bytes_unchanged_and_round_trip),
          T(test_wire_reply_stats_bytes_unchanged_and_round_trip),
          T(test_wire_reply_results_bytes_unchanged_and_round_trip),
          T(test_wire_reply_local_bytes_unchanged_and_round_trip), T(test_wire_reply_data_only_on_an_ok_get))
