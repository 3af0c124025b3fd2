/* The EC control protocol codec (src/ec/ec_ctl_wire.h; connectors-spec
 * §3.5, control.py and worker.py): every op decodes, every error text, the
 * batch rules, the bounds, encoder -> decoder round trips, the reply side,
 * and scenario 48 at codec level. */
#include "test.h"

#include "common/alloc.h"
#include "ec/ec_ctl_wire.h"

typedef struct {
    kvp__ec_ctl_dec_t d;
    kvp__ec_ctl_req_t req;
    char err[256];
} fx_t;

static kvp_status_t dec(fx_t *f, const char *json)
{
    return kvp__ec_ctl_decode(&f->d, json, strlen(json), &f->req, f->err, sizeof f->err);
}

static void dec_ok(fx_t *f, const char *json)
{
    kvp_status_t st = dec(f, json);
    ASSERT_MSG(st == KVP_OK, "decode of %s: %d (%s)", json, st, f->err);
}

/* The request fails with exactly this message. */
static void dec_err(fx_t *f, const char *json, const char *want)
{
    kvp_status_t st = dec(f, json);
    ASSERT_MSG(st == KVP_ERR_DECODE, "decode of %s: %d, expected KVP_ERR_DECODE", json, st);
    ASSERT_STR_EQ(f->err, want);
}

static void fx_init(fx_t *f)
{
    memset(f, 0, sizeof *f);
    kvp__ec_ctl_dec_init(&f->d);
}

static void fx_done(fx_t *f)
{
    kvp__ec_ctl_dec_cleanup(&f->d);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

#define RES(tid, extra) "{\"op\":\"reserve\",\"transfer_id\":\"" tid "\",\"mm_hash\":\"H\"" extra "}"
#define GOOD ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"bfloat16\""

TEST(test_ec_ctl_decodes_every_op)
{
    fx_t f;
    fx_init(&f);
    dec_ok(&f, "{\"op\":\"peers\"}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_PEERS);
    dec_ok(&f, "{\"op\":\"event_port\",\"extra\":[1,2]}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_EVENT_PORT);
    dec_ok(&f, "{\"op\":\"status\",\"transfer_id\":\"T1\"}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_STATUS);
    ASSERT_STR_EQ(f.req.transfer_id, "T1");

    dec_ok(&f, "{\"op\":\"reserve\",\"transfer_id\":\"T1\",\"mm_hash\":\"H1\",\"nbytes\":64,\"shape\":[4,8],"
               "\"dtype\":\"bfloat16\"}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_RESERVE);
    ASSERT_EQ(f.req.n_reserves, 1);
    kvp__ec_wire_reserve_t *r = &f.req.reserves[0];
    ASSERT(r->error == NULL);
    ASSERT_STR_EQ(r->transfer_id, "T1");
    ASSERT_STR_EQ(r->mm_hash, "H1");
    ASSERT_STR_EQ(r->dtype_name, "bfloat16");
    ASSERT_EQ(r->t.dtype, KVP_EC_DTYPE_BFLOAT16);
    ASSERT_EQ(r->t.nbytes, 64);
    ASSERT_EQ(r->t.ndim, 2);
    ASSERT_EQ(r->t.shape[0], 4);
    ASSERT_EQ(r->t.shape[1], 8);

    dec_ok(&f, "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"A\",\"mm_hash\":\"HA\",\"nbytes\":4,"
               "\"shape\":[1],\"dtype\":\"float32\"},{\"transfer_id\":\"B\",\"mm_hash\":\"HB\",\"nbytes\":6,"
               "\"shape\":[3],\"dtype\":\"half\"}]}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_RESERVE_BATCH);
    ASSERT_EQ(f.req.n_reserves, 2);
    ASSERT_STR_EQ(f.req.reserves[0].transfer_id, "A");
    ASSERT_EQ(f.req.reserves[0].t.dtype, KVP_EC_DTYPE_FLOAT32);
    ASSERT_STR_EQ(f.req.reserves[1].transfer_id, "B");
    ASSERT_STR_EQ(f.req.reserves[1].dtype_name, "half");
    ASSERT_EQ(f.req.reserves[1].t.dtype, KVP_EC_DTYPE_FLOAT16);

    dec_ok(&f, "{\"op\":\"complete\",\"transfer_id\":\"T1\",\"reservation_id\":\"R1\"}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_COMPLETE);
    ASSERT_EQ(f.req.n_completes, 1);
    ASSERT_STR_EQ(f.req.completes[0].transfer_id, "T1");
    ASSERT_STR_EQ(f.req.completes[0].reservation_id, "R1");

    dec_ok(&f, "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"A\",\"reservation_id\":\"RA\"},"
               "{\"transfer_id\":\"B\",\"reservation_id\":\"RB\"}]}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_COMPLETE_BATCH);
    ASSERT_EQ(f.req.n_completes, 2);
    ASSERT_STR_EQ(f.req.completes[1].transfer_id, "B");
    ASSERT_STR_EQ(f.req.completes[1].reservation_id, "RB");

    dec_ok(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T1\"}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_CANCEL);
    ASSERT_STR_EQ(f.req.transfer_id, "T1");
    ASSERT_STR_EQ(f.req.reservation_id, "");
    ASSERT(!f.req.abandon && !f.req.refresh);
    dec_ok(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T1\",\"reservation_id\":\"R\",\"abandon\":true,\"refresh\":1}");
    ASSERT_STR_EQ(f.req.reservation_id, "R");
    ASSERT(f.req.abandon && f.req.refresh);
    /* bool() of any JSON value */
    dec_ok(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T1\",\"abandon\":\"\",\"refresh\":[0]}");
    ASSERT(!f.req.abandon && f.req.refresh);
    dec_ok(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T1\",\"abandon\":null,\"refresh\":{}}");
    ASSERT(!f.req.abandon && !f.req.refresh);
    fx_done(&f);
}

TEST(test_ec_ctl_integer_ids_are_written_in_decimal)
{
    fx_t f;
    fx_init(&f);
    dec_ok(&f, "{\"op\":\"status\",\"transfer_id\":-42}");
    ASSERT_STR_EQ(f.req.transfer_id, "-42");
    dec_ok(&f, "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":7,\"reservation_id\":9223372036854775807},"
               "{\"transfer_id\":8,\"reservation_id\":\"x\"}]}");
    ASSERT_STR_EQ(f.req.completes[0].transfer_id, "7");
    ASSERT_STR_EQ(f.req.completes[0].reservation_id, "9223372036854775807");
    ASSERT_STR_EQ(f.req.completes[1].transfer_id, "8");
    /* mm_hash is a string only */
    dec_err(&f, "{\"op\":\"reserve\",\"transfer_id\":1,\"mm_hash\":2" GOOD "}", "field 'mm_hash' must be a string");
    dec_ok(&f, "{\"op\":\"reserve\",\"transfer_id\":1,\"mm_hash\":\"2\"" GOOD "}");
    ASSERT_STR_EQ(f.req.reserves[0].transfer_id, "1");
    dec_err(&f, "{\"op\":\"status\",\"transfer_id\":true}", "field 'transfer_id' must be a string or an integer");
    dec_err(&f, "{\"op\":\"status\",\"transfer_id\":1.5}", "field 'transfer_id' must be a string or an integer");
    dec_err(&f, "{\"op\":\"status\",\"transfer_id\":99999999999999999999}",
            "field 'transfer_id' must be a string or an integer");
    fx_done(&f);
}

TEST(test_ec_ctl_malformed_request)
{
    fx_t f;
    fx_init(&f);
    dec_err(&f, "", "malformed control request");
    dec_err(&f, "{\"op\":\"peers\"", "malformed control request");
    dec_err(&f, "{\"op\":\"peers\"}}", "malformed control request");
    dec_err(&f, "[\"peers\"]", "malformed control request");
    dec_err(&f, "\"peers\"", "malformed control request");
    dec_err(&f, "null", "malformed control request");
    dec_err(&f, "{\"op\":\"pe\xff\"}", "malformed control request"); /* not UTF-8 */
    /* nested beyond the reader's bound */
    char deep[200];
    size_t n = 0;
    n += (size_t)snprintf(deep, sizeof deep, "{\"op\":\"peers\",\"x\":");
    for (int i = 0; i < 40; i++)
        deep[n++] = '[';
    for (int i = 0; i < 40; i++)
        deep[n++] = ']';
    deep[n++] = '}';
    ASSERT_EQ(kvp__ec_ctl_decode(&f.d, deep, n, &f.req, f.err, sizeof f.err), KVP_ERR_DECODE);
    ASSERT_STR_EQ(f.err, "malformed control request");
    /* and the decoder goes on */
    dec_ok(&f, "{\"op\":\"peers\"}");
    fx_done(&f);
}

TEST(test_ec_ctl_unknown_op_is_python_repr)
{
    fx_t f;
    fx_init(&f);
    dec_err(&f, "{\"op\":\"x\"}", "unknown control op: 'x'");
    dec_err(&f, "{}", "unknown control op: None");
    dec_err(&f, "{\"op\":null}", "unknown control op: None");
    dec_err(&f, "{\"op\":5}", "unknown control op: 5");
    dec_err(&f, "{\"op\":true}", "unknown control op: True");
    dec_err(&f, "{\"op\":false}", "unknown control op: False");
    dec_err(&f, "{\"op\":\"RESERVE\"}", "unknown control op: 'RESERVE'");
    dec_err(&f, "{\"op\":\"it's\"}", "unknown control op: \"it's\"");
    dec_err(&f, "{\"op\":\"a'b\\\"c\"}", "unknown control op: 'a\\'b\"c'");
    dec_err(&f, "{\"op\":\"back\\\\slash\"}", "unknown control op: 'back\\\\slash'");
    dec_err(&f, "{\"op\":\"t\\tn\\nr\\r\\u0001\\u007f\"}", "unknown control op: 't\\tn\\nr\\r\\x01\\x7f'");
    dec_err(&f, "{\"op\":\"\\u00e9\\u00a0\\u0085\\u2028\"}", "unknown control op: '\xc3\xa9\\xa0\\x85\\u2028'");
    dec_err(&f, "{\"op\":\"\\ud800\"}", "unknown control op: '\\ud800'");
    dec_err(&f, "{\"op\":[]}", "unknown control op: []");
    dec_err(&f, "{\"op\":{}}", "unknown control op: {}");
    /* the last of a repeated key wins, as in a Python dict */
    dec_ok(&f, "{\"op\":\"bogus\",\"op\":\"peers\"}");
    ASSERT_EQ(f.req.op, KVP__EC_OP_PEERS);
    /* a long op is cut in the message, not refused */
    char big[600] = "{\"op\":\"";
    size_t n = strlen(big);
    memset(big + n, 'z', 500);
    memcpy(big + n + 500, "\"}", 3);
    ASSERT_EQ(dec(&f, big), KVP_ERR_DECODE);
    ASSERT(strncmp(f.err, "unknown control op: 'zzzz", 25) == 0);
    ASSERT(strstr(f.err, "...") != NULL);
    fx_done(&f);
}

TEST(test_ec_ctl_missing_and_mistyped_fields)
{
    fx_t f;
    fx_init(&f);
    dec_err(&f, "{\"op\":\"status\"}", "missing field 'transfer_id'");
    dec_err(&f, "{\"op\":\"cancel\"}", "missing field 'transfer_id'");
    dec_err(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T\",\"reservation_id\":null}",
            "field 'reservation_id' must be a string or an integer");
    dec_err(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T\",\"abandon\":0.0}", "field 'abandon' must not be a float");
    dec_err(&f, "{\"op\":\"cancel\",\"transfer_id\":\"T\",\"refresh\":1e3}", "field 'refresh' must not be a float");
    dec_err(&f, "{\"op\":\"complete\",\"transfer_id\":\"T\"}", "missing field 'reservation_id'");
    dec_err(&f, "{\"op\":\"complete\",\"reservation_id\":\"R\"}", "missing field 'transfer_id'");
    dec_err(&f, "{\"op\":\"complete_batch\"}", "missing field 'items'");
    dec_err(&f, "{\"op\":\"complete_batch\",\"items\":{}}", "field 'items' must be a list");
    dec_err(&f, "{\"op\":\"reserve_batch\",\"items\":\"ab\"}", "field 'items' must be a list");
    /* reserve: the seed's order of checks */
    dec_err(&f, "{\"op\":\"reserve\"}", "missing field 'transfer_id'");
    dec_err(&f, "{\"op\":\"reserve\",\"transfer_id\":\"T\"}", "missing field 'mm_hash'");
    dec_err(&f, RES("T", ""), "missing field 'nbytes'");
    dec_err(&f, RES("T", ",\"nbytes\":\"64\""), "field 'nbytes' must be an integer");
    dec_err(&f, RES("T", ",\"nbytes\":64.0"), "field 'nbytes' must be an integer");
    dec_err(&f, RES("T", ",\"nbytes\":true"), "field 'nbytes' must be an integer");
    dec_err(&f, RES("T", ",\"nbytes\":64"), "missing field 'shape'");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":\"48\""), "field 'shape' must be a list of integers");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,\"8\"]"), "field 'shape' must be a list of integers");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8]"), "missing field 'dtype'");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":2"), "field 'dtype' must be a string");
    /* a bad nbytes is reported before a bad dtype, a bad dtype before the size check */
    dec_err(&f, RES("T", ",\"nbytes\":null,\"shape\":[4,8],\"dtype\":\"nope\""), "field 'nbytes' must be an integer");
    dec_err(&f, RES("T", ",\"nbytes\":1,\"shape\":[4,8],\"dtype\":\"nope\""),
            "Unsupported torch dtype string: 'nope'");
    fx_done(&f);
}

TEST(test_ec_ctl_unsupported_dtype_texts)
{
    fx_t f;
    fx_init(&f);
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"torch.bfloat16\""),
            "Unsupported torch dtype string: 'torch.bfloat16'");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"complex64\""),
            "Unsupported torch dtype string: 'complex64'");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"\""), "Unsupported torch dtype string: ''");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"bfloat16 \""),
            "Unsupported torch dtype string: 'bfloat16 '");
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"bf\\u0000\""),
            "Unsupported torch dtype string: 'bf\\x00'");
    /* every dtype kvpool carries, by torch name and alias, with its itemsize */
    static const struct {
        const char *name;
        kvp_ec_dtype_t dt;
        int itemsize;
    } ok[] = {
        {"float32", KVP_EC_DTYPE_FLOAT32, 4}, {"float", KVP_EC_DTYPE_FLOAT32, 4},
        {"float16", KVP_EC_DTYPE_FLOAT16, 2}, {"half", KVP_EC_DTYPE_FLOAT16, 2},
        {"bfloat16", KVP_EC_DTYPE_BFLOAT16, 2}, {"float64", KVP_EC_DTYPE_FLOAT64, 8},
        {"double", KVP_EC_DTYPE_FLOAT64, 8}, {"int8", KVP_EC_DTYPE_INT8, 1},
        {"uint8", KVP_EC_DTYPE_UINT8, 1}, {"int16", KVP_EC_DTYPE_INT16, 2},
        {"short", KVP_EC_DTYPE_INT16, 2}, {"int32", KVP_EC_DTYPE_INT32, 4},
        {"int", KVP_EC_DTYPE_INT32, 4}, {"int64", KVP_EC_DTYPE_INT64, 8},
        {"long", KVP_EC_DTYPE_INT64, 8},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        char req[256];
        snprintf(req, sizeof req, RES("T", ",\"nbytes\":%d,\"shape\":[3,5],\"dtype\":\"%s\""), 15 * ok[i].itemsize,
                 ok[i].name);
        dec_ok(&f, req);
        ASSERT_EQ(f.req.reserves[0].t.dtype, ok[i].dt);
        ASSERT_EQ(kvp_ec_dtype_itemsize(ok[i].dt), ok[i].itemsize);
        ASSERT_STR_EQ(f.req.reserves[0].dtype_name, ok[i].name);
    }
    /* the public parser knows the appended dtypes, with or without torch. */
    kvp_ec_dtype_t dt;
    ASSERT_OK(kvp_ec_dtype_parse("torch.int64", &dt));
    ASSERT_EQ(dt, KVP_EC_DTYPE_INT64);
    ASSERT_STR_EQ(kvp_ec_dtype_name(KVP_EC_DTYPE_UINT8), "uint8");
    ASSERT_EQ(KVP_EC_DTYPE_BFLOAT16, 2); /* the values of the first three never change */
    fx_done(&f);
}

TEST(test_ec_s48_reserve_shape_dtype_nbytes_mismatch)
{
    fx_t f;
    fx_init(&f);
    const char *bad[] = {"63", "65", "0", "128", "32", "-64"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char req[256];
        snprintf(req, sizeof req, RES("T", ",\"nbytes\":%s,\"shape\":[4,8],\"dtype\":\"bfloat16\""), bad[i]);
        dec_err(&f, req, "shape and dtype do not match nbytes");
    }
    dec_ok(&f, RES("T", GOOD));
    ASSERT_EQ(f.req.reserves[0].t.nbytes, 64);
    /* and the error reply the server builds from it */
    ASSERT_EQ(dec(&f, RES("T", ",\"nbytes\":65,\"shape\":[4,8],\"dtype\":\"bfloat16\"")), KVP_ERR_DECODE);
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_error(&b, f.err);
    ASSERT(!b.oom);
    const char want[] = "{\"ok\":false,\"error\":\"shape and dtype do not match nbytes\"}";
    ASSERT_EQ(b.len, strlen(want));
    ASSERT_MEM_EQ(b.p, want, b.len);
    kvp__jw_cleanup(&b);
    fx_done(&f);
}

TEST(test_ec_ctl_size_product_never_overflows)
{
    fx_t f;
    fx_init(&f);
    /* 2^62 * 4 * 4 bytes overflows 64 bits: a mismatch, not a wrap to a small number */
    dec_err(&f, RES("T", ",\"nbytes\":0,\"shape\":[4611686018427387904,4],\"dtype\":\"float32\""),
            "shape and dtype do not match nbytes");
    /* 2^61 * 4 = 2^63 wraps int64 */
    dec_err(&f, RES("T", ",\"nbytes\":-9223372036854775808,\"shape\":[2305843009213693952],\"dtype\":\"float32\""),
            "shape and dtype do not match nbytes");
    /* 2^62 * 4 * 2^62: wraps to 0 in 64 bits */
    dec_err(&f, RES("T", ",\"nbytes\":0,\"shape\":[4611686018427387904,4611686018427387904],\"dtype\":\"int8\""),
            "shape and dtype do not match nbytes");
    /* a zero dim after huge ones: the product is 0 */
    dec_ok(&f, RES("T", ",\"nbytes\":0,\"shape\":[9223372036854775807,9223372036854775807,0],\"dtype\":\"int64\""));
    ASSERT_EQ(f.req.reserves[0].t.nbytes, 0);
    /* the largest product that fits */
    dec_ok(&f, RES("T", ",\"nbytes\":9223372036854775807,\"shape\":[9223372036854775807],\"dtype\":\"uint8\""));
    /* scalars: prod(()) == 1 */
    dec_ok(&f, RES("T", ",\"nbytes\":8,\"shape\":[],\"dtype\":\"float64\""));
    ASSERT_EQ(f.req.reserves[0].t.ndim, 0);
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[-4,-8],\"dtype\":\"bfloat16\""), "shape has a negative dimension");
    fx_done(&f);
}

TEST(test_ec_ctl_reserve_batch_item_errors_are_per_item)
{
    fx_t f;
    fx_init(&f);
    dec_ok(&f, "{\"op\":\"reserve_batch\",\"items\":["
               "{\"transfer_id\":\"A\",\"mm_hash\":\"HA\",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"bfloat16\"},"
               "{\"transfer_id\":\"B\",\"mm_hash\":\"HB\",\"nbytes\":65,\"shape\":[4,8],\"dtype\":\"bfloat16\"},"
               "[1,2],"
               "{\"transfer_id\":\"D\",\"mm_hash\":\"HD\",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"x\"},"
               "{\"mm_hash\":\"HE\"},"
               "{\"transfer_id\":\"F\",\"mm_hash\":\"HF\",\"nbytes\":2,\"shape\":[1],\"dtype\":\"int16\"}]}");
    ASSERT_EQ(f.req.n_reserves, 6);
    ASSERT(f.req.reserves[0].error == NULL);
    ASSERT_STR_EQ(f.req.reserves[0].transfer_id, "A");
    ASSERT_STR_EQ(f.req.reserves[1].error, "shape and dtype do not match nbytes");
    ASSERT_STR_EQ(f.req.reserves[2].error, "reserve item must be an object");
    ASSERT_STR_EQ(f.req.reserves[3].error, "Unsupported torch dtype string: 'x'");
    ASSERT_STR_EQ(f.req.reserves[4].error, "missing field 'transfer_id'");
    ASSERT(f.req.reserves[5].error == NULL);
    ASSERT_STR_EQ(f.req.reserves[5].transfer_id, "F");
    ASSERT_EQ(f.req.reserves[5].t.dtype, KVP_EC_DTYPE_INT16);
    /* an empty batch is a batch */
    dec_ok(&f, "{\"op\":\"reserve_batch\",\"items\":[]}");
    ASSERT_EQ(f.req.n_reserves, 0);
    dec_ok(&f, "{\"op\":\"complete_batch\",\"items\":[]}");
    ASSERT_EQ(f.req.n_completes, 0);
    /* a bad complete_batch item fails the whole request, as in the seed */
    dec_err(&f, "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"A\",\"reservation_id\":\"R\"},"
                "{\"transfer_id\":\"B\"}]}",
            "missing field 'reservation_id'");
    dec_err(&f, "{\"op\":\"complete_batch\",\"items\":[7]}", "complete item must be an object");
    /* a bad single reserve is the request's error */
    dec_err(&f, RES("T", ",\"nbytes\":64,\"shape\":[4,8],\"dtype\":\"x\""), "Unsupported torch dtype string: 'x'");
    fx_done(&f);
}

/* A reserve_batch / complete_batch of n items. */
static char *batch_of(size_t n, bool reserve, size_t *len_p)
{
    size_t cap = 64 + n * 128;
    char *s = malloc(cap);
    size_t len = (size_t)snprintf(s, cap, "{\"op\":\"%s\",\"items\":[", reserve ? "reserve_batch" : "complete_batch");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(s + len, cap - len,
                                reserve ? "%s{\"transfer_id\":%zu,\"mm_hash\":\"h\",\"nbytes\":1,\"shape\":[1],"
                                          "\"dtype\":\"int8\"}"
                                        : "%s{\"transfer_id\":%zu,\"reservation_id\":\"r\"}",
                                i ? "," : "", i);
    len += (size_t)snprintf(s + len, cap - len, "]}");
    *len_p = len;
    return s;
}

TEST(test_ec_ctl_limits)
{
    fx_t f;
    fx_init(&f);
    /* frame size */
    size_t big = KVP__EC_CTL_MAX_FRAME + 1;
    char *s = malloc(big + 1);
    memset(s, ' ', big);
    memcpy(s, "{\"op\":\"peers\"}", 14);
    s[big] = 0;
    ASSERT_EQ(kvp__ec_ctl_decode(&f.d, s, big, &f.req, f.err, sizeof f.err), KVP_ERR_DECODE);
    ASSERT_STR_EQ(f.err, "control request larger than 65536 bytes");
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, s, big - 1, &f.req, f.err, sizeof f.err));
    free(s);
    /* items: 1024 of complete_batch fit a frame; 1025 do not pass */
    size_t len;
    s = batch_of(KVP__EC_CTL_MAX_ITEMS, false, &len);
    ASSERT_LE(len, KVP__EC_CTL_MAX_FRAME);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, s, len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.n_completes, KVP__EC_CTL_MAX_ITEMS);
    ASSERT_STR_EQ(f.req.completes[1023].transfer_id, "1023");
    free(s);
    s = batch_of(KVP__EC_CTL_MAX_ITEMS + 1, false, &len);
    ASSERT_EQ(kvp__ec_ctl_decode(&f.d, s, len, &f.req, f.err, sizeof f.err), KVP_ERR_DECODE);
    ASSERT_STR_EQ(f.err, "too many items (at most 1024)");
    free(s);
    s = batch_of(600, true, &len);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, s, len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.n_reserves, 600);
    ASSERT_STR_EQ(f.req.reserves[599].transfer_id, "599");
    ASSERT(f.req.reserves[599].error == NULL);
    free(s);
    /* ndim */
    dec_ok(&f, RES("T", ",\"nbytes\":1,\"shape\":[1,1,1,1,1,1,1,1],\"dtype\":\"int8\""));
    ASSERT_EQ(f.req.reserves[0].t.ndim, 8);
    dec_err(&f, RES("T", ",\"nbytes\":1,\"shape\":[1,1,1,1,1,1,1,1,1],\"dtype\":\"int8\""),
            "shape has more than 8 dimensions");
    /* id length: 255 bytes pass, 256 do not; NUL and empty ids */
    char id[300], req[512];
    memset(id, 'i', 255);
    id[255] = 0;
    snprintf(req, sizeof req, "{\"op\":\"status\",\"transfer_id\":\"%s\"}", id);
    dec_ok(&f, req);
    ASSERT_EQ(strlen(f.req.transfer_id), 255);
    snprintf(req, sizeof req, "{\"op\":\"status\",\"transfer_id\":\"%si\"}", id);
    dec_err(&f, req, "field 'transfer_id' longer than 255 bytes");
    snprintf(req, sizeof req, "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"%si\"" GOOD "}", id);
    dec_err(&f, req, "field 'mm_hash' longer than 255 bytes");
    dec_err(&f, "{\"op\":\"status\",\"transfer_id\":\"a\\u0000b\"}", "field 'transfer_id' contains a NUL character");
    dec_err(&f, RES("", GOOD), "field 'transfer_id' must not be empty");
    dec_err(&f, "{\"op\":\"reserve\",\"transfer_id\":\"T\",\"mm_hash\":\"\"" GOOD "}",
            "field 'mm_hash' must not be empty");
    /* err is truncated to errlen, never overrun */
    char small[8];
    ASSERT_EQ(kvp__ec_ctl_decode(&f.d, "{}", 2, &f.req, small, sizeof small), KVP_ERR_DECODE);
    ASSERT_STR_EQ(small, "unknown");
    fx_done(&f);
}

static void jw_eq(kvp__jw_t *b, const char *want)
{
    ASSERT(!b->oom);
    ASSERT_MSG(b->len == strlen(want) && !memcmp(b->p, want, b->len), "wrote %.*s\n expected %s", (int)b->len,
               b->p, want);
    b->len = 0;
}

TEST(test_ec_ctl_request_round_trips)
{
    fx_t f;
    fx_init(&f);
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_simple(&b, KVP__EC_OP_PEERS);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.op, KVP__EC_OP_PEERS);
    jw_eq(&b, "{\"op\":\"peers\"}");
    kvp__ec_ctl_put_simple(&b, KVP__EC_OP_EVENT_PORT);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.op, KVP__EC_OP_EVENT_PORT);
    b.len = 0;
    kvp__ec_ctl_put_status(&b, "T\"1");
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_STR_EQ(f.req.transfer_id, "T\"1");
    jw_eq(&b, "{\"op\":\"status\",\"transfer_id\":\"T\\\"1\"}");

    kvp__ec_tensor_t ts[2] = {{.nbytes = 64, .shape = {4, 8}, .ndim = 2, .dtype = KVP_EC_DTYPE_BFLOAT16},
                              {.nbytes = 24, .shape = {3}, .ndim = 1, .dtype = KVP_EC_DTYPE_INT64}};
    const char *tids[2] = {"T1", "T2"}, *hashes[2] = {"H1", "H\xc3\xa9"};
    kvp__ec_ctl_put_reserve(&b, tids, hashes, ts, 1, false);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.op, KVP__EC_OP_RESERVE);
    ASSERT_STR_EQ(f.req.reserves[0].mm_hash, "H1");
    ASSERT_EQ(f.req.reserves[0].t.nbytes, 64);
    jw_eq(&b, "{\"op\":\"reserve\",\"transfer_id\":\"T1\",\"mm_hash\":\"H1\",\"nbytes\":64,\"shape\":[4,8],"
              "\"dtype\":\"bfloat16\"}");
    kvp__ec_ctl_put_reserve(&b, tids, hashes, ts, 2, true);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.op, KVP__EC_OP_RESERVE_BATCH);
    ASSERT_EQ(f.req.n_reserves, 2);
    for (size_t i = 0; i < 2; i++) {
        ASSERT(f.req.reserves[i].error == NULL);
        ASSERT_STR_EQ(f.req.reserves[i].transfer_id, tids[i]);
        ASSERT_STR_EQ(f.req.reserves[i].mm_hash, hashes[i]);
        ASSERT_EQ(f.req.reserves[i].t.nbytes, ts[i].nbytes);
        ASSERT_EQ(f.req.reserves[i].t.ndim, ts[i].ndim);
        ASSERT_EQ(f.req.reserves[i].t.dtype, ts[i].dtype);
        ASSERT_MEM_EQ(f.req.reserves[i].t.shape, ts[i].shape, ts[i].ndim * sizeof ts[i].shape[0]);
    }
    jw_eq(&b, "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":\"T1\",\"mm_hash\":\"H1\",\"nbytes\":64,"
              "\"shape\":[4,8],\"dtype\":\"bfloat16\"},{\"transfer_id\":\"T2\",\"mm_hash\":\"H\\u00e9\",\"nbytes\":24,"
              "\"shape\":[3],\"dtype\":\"int64\"}]}");

    kvp__ec_wire_complete_t cs[2] = {{"T1", "R1"}, {"T2", "R2"}};
    kvp__ec_ctl_put_complete(&b, cs, 1, false);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.op, KVP__EC_OP_COMPLETE);
    ASSERT_STR_EQ(f.req.completes[0].reservation_id, "R1");
    jw_eq(&b, "{\"op\":\"complete\",\"transfer_id\":\"T1\",\"reservation_id\":\"R1\"}");
    kvp__ec_ctl_put_complete(&b, cs, 2, true);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_EQ(f.req.n_completes, 2);
    ASSERT_STR_EQ(f.req.completes[1].transfer_id, "T2");
    ASSERT_STR_EQ(f.req.completes[1].reservation_id, "R2");
    jw_eq(&b, "{\"op\":\"complete_batch\",\"items\":[{\"transfer_id\":\"T1\",\"reservation_id\":\"R1\"},"
              "{\"transfer_id\":\"T2\",\"reservation_id\":\"R2\"}]}");

    /* make_cancel_request's shape, and the scheduler's (transfer id only) */
    kvp__ec_ctl_put_cancel(&b, "T1", "R1", true, true);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT(f.req.abandon && f.req.refresh);
    ASSERT_STR_EQ(f.req.reservation_id, "R1");
    jw_eq(&b, "{\"op\":\"cancel\",\"transfer_id\":\"T1\",\"reservation_id\":\"R1\",\"abandon\":true,\"refresh\":true}");
    kvp__ec_ctl_put_cancel(&b, "T1", "", false, false);
    jw_eq(&b, "{\"op\":\"cancel\",\"transfer_id\":\"T1\",\"reservation_id\":\"\"}");
    kvp__ec_ctl_put_cancel(&b, "T1", NULL, false, false);
    ASSERT_OK(kvp__ec_ctl_decode(&f.d, b.p, b.len, &f.req, f.err, sizeof f.err));
    ASSERT_STR_EQ(f.req.reservation_id, "");
    ASSERT(!f.req.abandon && !f.req.refresh);
    jw_eq(&b, "{\"op\":\"cancel\",\"transfer_id\":\"T1\"}");
    kvp__jw_cleanup(&b);
    fx_done(&f);
}

typedef struct {
    kvp__json_parser_t p;
    bool ok;
    const kvp__json_t *result;
    const char *error;
} rep_t;

static kvp_status_t reply(rep_t *r, const char *s, size_t n)
{
    return kvp__ec_ctl_decode_reply(&r->p, s, n, &r->ok, &r->result, &r->error);
}

TEST(test_ec_ctl_reply_round_trips)
{
    rep_t r;
    kvp__json_parser_init(&r.p);
    kvp__jw_t b;
    kvp__jw_init(&b);

    kvp__ec_reserve_out_t o = {.reservation_id = "0123456789abcdef0123456789abcdef",
                               .offset = 512, .nbytes = 64, .write = true, .ready = false, .cached = false};
    kvp__ec_ctl_put_ok_begin(&b);
    kvp__ec_ctl_put_reserve_result(&b, &o, "tcp://127.0.0.1:7000", 18446744073709551615ull);
    kvp__ec_ctl_put_ok_end(&b);
    ASSERT(!b.oom);
    const char want[] = "{\"ok\":true,\"result\":{\"reservation_id\":\"0123456789abcdef0123456789abcdef\","
                        "\"dst_session\":\"tcp://127.0.0.1:7000\",\"dst_ptr\":18446744073709551615,\"nbytes\":64,"
                        "\"write\":true,\"ready\":false,\"cached\":false}}";
    ASSERT_MEM_EQ(b.p, want, sizeof want - 1);
    ASSERT_EQ(b.len, sizeof want - 1);
    b.len = 0;
    /* a dst_ptr that fits int64 round-trips */
    kvp__ec_ctl_put_ok_begin(&b);
    o.ready = o.cached = true;
    o.write = false;
    kvp__ec_ctl_put_reserve_result(&b, &o, "sess", 140737488355328ull);
    kvp__ec_ctl_put_ok_end(&b);
    ASSERT_OK(reply(&r, b.p, b.len));
    ASSERT(r.ok);
    kvp__ec_reserve_out_t back;
    const char *sess;
    uint64_t ptr;
    ASSERT_OK(kvp__ec_ctl_decode_reserve_result(r.result, &back, &sess, &ptr));
    ASSERT_STR_EQ(back.reservation_id, o.reservation_id);
    ASSERT_STR_EQ(sess, "sess");
    ASSERT_EQ(ptr, 140737488355328ull);
    ASSERT_EQ(back.nbytes, 64);
    ASSERT(!back.write && back.ready && back.cached && !back.cancelled);
    b.len = 0;

    /* the cancelled variant (worker.py) */
    kvp__ec_reserve_out_t c = {.nbytes = 64, .cancelled = true};
    kvp__ec_ctl_put_reserve_result(&b, &c, "ignored", 99);
    const char *cw = "{\"reservation_id\":\"\",\"dst_session\":\"\",\"dst_ptr\":0,\"nbytes\":64,\"write\":false,"
                     "\"ready\":false,\"cancelled\":true}";
    char full[256];
    int fl = snprintf(full, sizeof full, "{\"ok\":true,\"result\":%s}", cw);
    ASSERT_OK(reply(&r, full, (size_t)fl));
    ASSERT_OK(kvp__ec_ctl_decode_reserve_result(r.result, &back, &sess, &ptr));
    ASSERT(back.cancelled && !back.write && !back.ready && !back.cached);
    ASSERT_STR_EQ(back.reservation_id, "");
    ASSERT_EQ(ptr, 0);
    jw_eq(&b, cw);

    /* error replies */
    kvp__ec_ctl_put_error(&b, "EC consumer buffer pool is full");
    ASSERT_OK(reply(&r, b.p, b.len));
    ASSERT(!r.ok && r.result == NULL);
    ASSERT_STR_EQ(r.error, "EC consumer buffer pool is full");
    b.len = 0;
    ASSERT_OK(reply(&r, "{\"ok\":false}", 12));
    ASSERT_STR_EQ(r.error, "EC control request failed");
    ASSERT_OK(reply(&r, "{\"ok\":0,\"error\":17}", 19));
    ASSERT(!r.ok);
    ASSERT_STR_EQ(r.error, "17");
    ASSERT_OK(reply(&r, "{}", 2));
    ASSERT(!r.ok);
    /* ok without a result: None */
    ASSERT_OK(reply(&r, "{\"ok\":true}", 11));
    ASSERT(r.ok && r.result && r.result->type == KVP__JSON_NULL);

    /* the other results */
    uint16_t ports[3] = {5000, 5001, 65535};
    kvp__ec_ctl_put_peers_result(&b, ports, 3);
    jw_eq(&b, "{\"ports\":[5000,5001,65535]}");
    kvp__ec_status_t st = {.mm_hash = "H", .ready = true, .reservation_id = "r1",
                           .t = {.nbytes = 64, .shape = {4, 8}, .ndim = 2, .dtype = KVP_EC_DTYPE_BFLOAT16}};
    kvp__ec_ctl_put_status_result(&b, &st);
    jw_eq(&b, "{\"mm_hash\":\"H\",\"ready\":true,\"reservation_id\":\"r1\",\"nbytes\":64,\"shape\":[4,8],"
              "\"dtype\":\"bfloat16\"}");
    kvp__ec_ctl_put_status_result(&b, NULL);
    jw_eq(&b, "null");
    kvp__ec_ctl_put_complete_result(&b, true, false);
    jw_eq(&b, "{\"completed\":true,\"became_ready\":false}");
    kvp__ec_ctl_put_cancel_result(&b, true, false);
    jw_eq(&b, "{\"cancelled\":true}");
    kvp__ec_ctl_put_cancel_result(&b, true, true);
    jw_eq(&b, "{\"cancelled\":true,\"deferred\":true}");
    kvp__ec_ctl_put_event(&b, "T1", &st, 5001);
    const char ev[] = "{\"transfer_id\":\"T1\",\"mm_hash\":\"H\",\"ready\":true,\"reservation_id\":\"r1\",\"nbytes\":64,"
                      "\"shape\":[4,8],\"dtype\":\"bfloat16\",\"shard\":5001}";
    ASSERT_EQ(b.len, sizeof ev - 1);
    ASSERT_MEM_EQ(b.p, ev, b.len);
    /* the event is what the scheduler's reader takes */
    kvp_ec_value_t *v;
    ASSERT_OK(kvp_ec_json_parse(b.p, b.len, 8, &v));
    ASSERT(kvp_ec_value_truthy(kvp_ec_value_get(v, "ready")));
    ASSERT_EQ(kvp_ec_value_get(v, "shard")->u.i, 5001);
    kvp_ec_value_free(v);
    kvp__jw_cleanup(&b);
    kvp__json_parser_cleanup(&r.p);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_ctl_reply_decoder_rejects_bad_replies)
{
    rep_t r;
    kvp__json_parser_init(&r.p);
    ASSERT_EQ(reply(&r, "[true]", 6), KVP_ERR_DECODE);
    ASSERT_EQ(reply(&r, "", 0), KVP_ERR_DECODE);
    ASSERT_EQ(reply(&r, "{\"ok\":", 6), KVP_ERR_DECODE);
    ASSERT_EQ(reply(&r, "{\"ok\":1.0}", 10), KVP_ERR_DECODE);
    kvp__ec_reserve_out_t o;
    const char *sess;
    uint64_t ptr;
    static const char *bad[] = {
        "5",
        "{\"dst_session\":\"s\",\"dst_ptr\":1,\"nbytes\":1}",
        "{\"reservation_id\":\"r\",\"dst_ptr\":1,\"nbytes\":1}",
        "{\"reservation_id\":\"r\",\"dst_session\":\"s\",\"nbytes\":1}",
        "{\"reservation_id\":\"r\",\"dst_session\":\"s\",\"dst_ptr\":1}",
        "{\"reservation_id\":7,\"dst_session\":\"s\",\"dst_ptr\":1,\"nbytes\":1}",
        "{\"reservation_id\":\"r\",\"dst_session\":\"s\",\"dst_ptr\":-1,\"nbytes\":1}",
        "{\"reservation_id\":\"r\",\"dst_session\":\"s\",\"dst_ptr\":1,\"nbytes\":\"1\"}",
        "{\"reservation_id\":\"0123456789abcdef0123456789abcdef0\",\"dst_session\":\"s\",\"dst_ptr\":1,\"nbytes\":1}",
        "{\"reservation_id\":\"r\",\"dst_session\":\"s\",\"dst_ptr\":1,\"nbytes\":1,\"write\":0.5}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvp__json_parser_t p;
        kvp__json_parser_init(&p);
        const kvp__json_t *root;
        ASSERT_OK(kvp__json_parse(&p, bad[i], strlen(bad[i]), &root));
        ASSERT_MSG(kvp__ec_ctl_decode_reserve_result(root, &o, &sess, &ptr) == KVP_ERR_DECODE, "accepted %s", bad[i]);
        kvp__json_parser_cleanup(&p);
    }
    ASSERT_EQ(kvp__ec_ctl_decode_reserve_result(NULL, &o, &sess, &ptr), KVP_ERR_DECODE);
    kvp__json_parser_cleanup(&r.p);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ec_ctl_decoder_out_of_memory_is_reported)
{
    /* every allocation failure is KVP_ERR_NO_MEMORY or a decode that still
     * works, never a crash or a leak */
    const char *req = "{\"op\":\"reserve_batch\",\"items\":[{\"transfer_id\":1,\"mm_hash\":\"h\",\"nbytes\":1,"
                      "\"shape\":[1],\"dtype\":\"int8\"},{\"transfer_id\":\"b\"}]}";
    for (long n = 0; n < 64; n++) {
        fx_t f;
        fx_init(&f);
        kvp__alloc_fail_after(n);
        kvp_status_t st = dec(&f, req);
        kvp__alloc_fail_reset();
        ASSERT_MSG(st == KVP_OK || st == KVP_ERR_NO_MEMORY, "fail after %ld: %d", n, st);
        if (st == KVP_OK) {
            ASSERT_EQ(f.req.n_reserves, 2);
            ASSERT_STR_EQ(f.req.reserves[0].transfer_id, "1");
            ASSERT_STR_EQ(f.req.reserves[1].error, "missing field 'mm_hash'");
        }
        fx_done(&f);
    }
}

TEST_LIST(T(test_ec_ctl_decodes_every_op), T(test_ec_ctl_integer_ids_are_written_in_decimal),
          T(test_ec_ctl_malformed_request), T(test_ec_ctl_unknown_op_is_python_repr),
          T(test_ec_ctl_missing_and_mistyped_fields), T(test_ec_ctl_unsupported_dtype_texts),
          T(test_ec_s48_reserve_shape_dtype_nbytes_mismatch), T(test_ec_ctl_size_product_never_overflows),
          T(test_ec_ctl_reserve_batch_item_errors_are_per_item), T(test_ec_ctl_limits),
          T(test_ec_ctl_request_round_trips), T(test_ec_ctl_reply_round_trips),
          T(test_ec_ctl_reply_decoder_rejects_bad_replies), T(test_ec_ctl_decoder_out_of_memory_is_reported))
