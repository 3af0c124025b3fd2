/* Fuzz target: the EC control protocol decoders (src/ec/ec_ctl_wire.h).
 * The bytes go to the request decoder, the reply decoder and the reserve
 * result decoder.  What decodes is re-encoded with the encoders and must
 * decode again to the same request (or result); a refused request's error
 * reply must carry its message back unchanged. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ec/ec_ctl_wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(c)         \
    do {                 \
        if (!(c))        \
            abort();     \
    } while (0)

static bool tensor_eq(const kvp__ec_tensor_t *a, const kvp__ec_tensor_t *b)
{
    return a->nbytes == b->nbytes && a->ndim == b->ndim && a->dtype == b->dtype &&
           !memcmp(a->shape, b->shape, a->ndim * sizeof a->shape[0]);
}

/* The server's error reply for a refused request carries err back. */
static void error_reply_round_trip(const char *err)
{
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__ec_ctl_put_error(&b, err);
    CHECK(!b.oom);
    kvp__json_parser_t p;
    kvp__json_parser_init(&p);
    bool ok;
    const kvp__json_t *result;
    const char *msg;
    CHECK(kvp__ec_ctl_decode_reply(&p, b.p, b.len, &ok, &result, &msg) == KVP_OK);
    CHECK(!ok && result == NULL && !strcmp(msg, err));
    kvp__json_parser_cleanup(&p);
    kvp__jw_cleanup(&b);
}

/* Re-encodes req and checks that d2 decodes the same request. */
static void round_trip(const kvp__ec_ctl_req_t *req, kvp__ec_ctl_dec_t *d2)
{
    kvp__jw_t b;
    kvp__jw_init(&b);
    const char **tids = NULL, **hashes = NULL;
    kvp__ec_tensor_t *ts = NULL;
    size_t n_good = 0;
    switch (req->op) {
    case KVP__EC_OP_PEERS:
    case KVP__EC_OP_EVENT_PORT: kvp__ec_ctl_put_simple(&b, req->op); break;
    case KVP__EC_OP_STATUS: kvp__ec_ctl_put_status(&b, req->transfer_id); break;
    case KVP__EC_OP_CANCEL:
        kvp__ec_ctl_put_cancel(&b, req->transfer_id, req->reservation_id, req->abandon, req->refresh);
        break;
    case KVP__EC_OP_RESERVE:
    case KVP__EC_OP_RESERVE_BATCH: {
        size_t n = req->n_reserves ? req->n_reserves : 1;
        tids = calloc(n, sizeof *tids);
        hashes = calloc(n, sizeof *hashes);
        ts = calloc(n, sizeof *ts);
        for (size_t i = 0; i < req->n_reserves; i++) {
            const kvp__ec_wire_reserve_t *r = &req->reserves[i];
            if (r->error) {
                error_reply_round_trip(r->error);
                continue;
            }
            tids[n_good] = r->transfer_id;
            hashes[n_good] = r->mm_hash;
            ts[n_good] = r->t;
            n_good++;
        }
        CHECK(req->op == KVP__EC_OP_RESERVE_BATCH || n_good == 1);
        kvp__ec_ctl_put_reserve(&b, tids, hashes, ts, n_good, req->op == KVP__EC_OP_RESERVE_BATCH);
        break;
    }
    case KVP__EC_OP_COMPLETE:
    case KVP__EC_OP_COMPLETE_BATCH:
        kvp__ec_ctl_put_complete(&b, req->completes, req->n_completes, req->op == KVP__EC_OP_COMPLETE_BATCH);
        break;
    }
    CHECK(!b.oom);
    /* ensure_ascii and quoted integer ids can make the copy larger than a
     * frame the decoder takes: then there is nothing to compare */
    if (b.len <= KVP__EC_CTL_MAX_FRAME) {
        kvp__ec_ctl_req_t again;
        char err[256];
        CHECK(kvp__ec_ctl_decode(d2, b.p, b.len, &again, err, sizeof err) == KVP_OK);
        CHECK(again.op == req->op);
        switch (req->op) {
        case KVP__EC_OP_PEERS:
        case KVP__EC_OP_EVENT_PORT: break;
        case KVP__EC_OP_STATUS: CHECK(!strcmp(again.transfer_id, req->transfer_id)); break;
        case KVP__EC_OP_CANCEL:
            CHECK(!strcmp(again.transfer_id, req->transfer_id));
            CHECK(!strcmp(again.reservation_id, req->reservation_id));
            CHECK(again.abandon == req->abandon && again.refresh == req->refresh);
            break;
        case KVP__EC_OP_RESERVE:
        case KVP__EC_OP_RESERVE_BATCH:
            CHECK(again.n_reserves == n_good);
            for (size_t i = 0; i < n_good; i++) {
                const kvp__ec_wire_reserve_t *r = &again.reserves[i];
                CHECK(r->error == NULL);
                CHECK(!strcmp(r->transfer_id, tids[i]) && !strcmp(r->mm_hash, hashes[i]));
                CHECK(tensor_eq(&r->t, &ts[i]));
            }
            break;
        case KVP__EC_OP_COMPLETE:
        case KVP__EC_OP_COMPLETE_BATCH:
            CHECK(again.n_completes == req->n_completes);
            for (size_t i = 0; i < req->n_completes; i++) {
                CHECK(!strcmp(again.completes[i].transfer_id, req->completes[i].transfer_id));
                CHECK(!strcmp(again.completes[i].reservation_id, req->completes[i].reservation_id));
            }
            break;
        }
    }
    free(tids);
    free(hashes);
    free(ts);
    kvp__jw_cleanup(&b);
}

static void reply_side(const uint8_t *data, size_t size)
{
    kvp__json_parser_t p;
    kvp__json_parser_init(&p);
    bool ok;
    const kvp__json_t *result;
    const char *msg;
    if (kvp__ec_ctl_decode_reply(&p, data, size, &ok, &result, &msg) == KVP_OK) {
        CHECK(ok ? result != NULL : msg != NULL);
        kvp__ec_reserve_out_t o;
        const char *sess;
        uint64_t ptr;
        if (ok && kvp__ec_ctl_decode_reserve_result(result, &o, &sess, &ptr) == KVP_OK) {
            CHECK(strlen(o.reservation_id) <= KVP__EC_RID_LEN);
            /* re-encode; the cancelled variant carries only nbytes */
            kvp__jw_t b;
            kvp__jw_init(&b);
            kvp__ec_ctl_put_ok_begin(&b);
            kvp__ec_ctl_put_reserve_result(&b, &o, sess, ptr);
            kvp__ec_ctl_put_ok_end(&b);
            CHECK(!b.oom);
            kvp__json_parser_t p2;
            kvp__json_parser_init(&p2);
            bool ok2;
            const kvp__json_t *r2;
            const char *m2;
            CHECK(kvp__ec_ctl_decode_reply(&p2, b.p, b.len, &ok2, &r2, &m2) == KVP_OK && ok2);
            kvp__ec_reserve_out_t o2;
            const char *sess2;
            uint64_t ptr2;
            CHECK(kvp__ec_ctl_decode_reserve_result(r2, &o2, &sess2, &ptr2) == KVP_OK);
            CHECK(o2.nbytes == o.nbytes && o2.cancelled == o.cancelled);
            if (!o.cancelled) {
                CHECK(!strcmp(o2.reservation_id, o.reservation_id) && !strcmp(sess2, sess) && ptr2 == ptr);
                CHECK(o2.write == o.write && o2.ready == o.ready && o2.cached == o.cached);
            }
            kvp__json_parser_cleanup(&p2);
            kvp__jw_cleanup(&b);
        }
    }
    kvp__json_parser_cleanup(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* one decoder reused across inputs, as a server reuses it */
    static kvp__ec_ctl_dec_t d, d2;
    static bool init;
    if (!init) {
        kvp__ec_ctl_dec_init(&d);
        kvp__ec_ctl_dec_init(&d2);
        init = true;
    }
    kvp__ec_ctl_req_t req;
    char err[256];
    memset(err, 'x', sizeof err);
    kvp_status_t st = kvp__ec_ctl_decode(&d, data, size, &req, err, sizeof err);
    if (st == KVP_OK) {
        round_trip(&req, &d2);
    } else {
        CHECK(st == KVP_ERR_DECODE || st == KVP_ERR_NO_MEMORY);
        CHECK(memchr(err, 0, sizeof err) != NULL);
        if (st == KVP_ERR_DECODE) {
            CHECK(err[0] != 0);
            error_reply_round_trip(err);
        }
    }
    reply_side(data, size);
    return 0;
}
