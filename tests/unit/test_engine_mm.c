/*
 * The engine model's multimodal path: the --epd workload generator and
 * encoder output (epd.h), the encoder cache manager (vLLM's
 * EncoderCacheManager rules, mm_cache.h) and the engine's bookkeeping with
 * the real EC scheduler (mm.h).
 *
 * TEST SCAFFOLDING: the worker side here is a stand-in (`standin_t` below),
 * not the real kvp_ec_worker: a producer's "push" copies the output into an
 * in-process map and queues the readiness event straight into the consumer
 * scheduler's scripted inbox; a consumer's load takes it from that map.
 * It exercises the engine's hook order and books only; `kvpool replay
 * --epd` (tests/integration/test_epd_replay.sh) runs the real workers over
 * real sockets and never uses this.
 */
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/strmap.h"
#include "engine/epd.h"
#include "engine/mm.h"
#include "engine/mm_cache.h"
#include "support/ec_scripted.h"
#include "test.h"

/* ---------------------------------------------------------------- workload */

TEST(test_epd_shape_4mib_is_512_by_4096_bf16)
{
    int64_t n, h;
    ASSERT_OK(kvp__epd_shape(4 << 20, &n, &h));
    ASSERT_EQ(h, 4096);
    ASSERT_EQ(n, 512);
    ASSERT_OK(kvp__epd_shape(96, &n, &h)); /* 48 elements: hidden 16, 3 rows */
    ASSERT_EQ(h, 16);
    ASSERT_EQ(n, 3);
    ASSERT_EQ(kvp__epd_shape(7, &n, &h), KVP_ERR_INVALID_ARG);
}

TEST(test_epd_workload_defaults_deterministic_with_a_third_repeated)
{
    kvp__epd_wl_params_t p;
    kvp__epd_wl_params_init(&p);
    ASSERT_EQ(p.requests, 300);
    ASSERT_EQ(p.size, 4 << 20);
    kvp__epd_workload_t a, b;
    ASSERT_OK(kvp__epd_workload_gen(&p, &a));
    ASSERT_OK(kvp__epd_workload_gen(&p, &b));
    ASSERT_EQ(a.n_hashes, b.n_hashes);
    ASSERT_MEM_EQ(a.reqs, b.reqs, p.requests * sizeof *a.reqs);
    ASSERT_MEM_EQ(a.hashes, b.hashes, a.n_hashes * sizeof *a.hashes);
    uint32_t slots = 0;
    uint32_t *first = calloc(a.n_hashes, sizeof *first);
    for (uint32_t i = 0; i < a.n_hashes; i++)
        first[i] = UINT32_MAX;
    for (uint32_t r = 0; r < p.requests; r++) {
        const kvp__epd_req_t *q = &a.reqs[r];
        ASSERT(q->n_images >= 1 && q->n_images <= 3);
        int64_t end = 0;
        for (uint32_t k = 0; k < q->n_images; k++) {
            for (uint32_t j = 0; j < k; j++)
                ASSERT_NE(q->image[j], q->image[k]); /* never one image twice in a request */
            ASSERT(q->image[k] < a.n_hashes);
            if (first[q->image[k]] == UINT32_MAX)
                first[q->image[k]] = r;
            else /* a reuse comes at least repeat_gap requests after the first use */
                ASSERT_GE(r - first[q->image[k]], p.repeat_gap + 1);
            ASSERT_GE(q->offset[k], end);
            end = q->offset[k] + a.num_embeds;
            slots++;
        }
        ASSERT_GT(q->prompt_len, end);
    }
    free(first);
    ASSERT_EQ(slots, a.n_slots);
    ASSERT_EQ(a.n_slots - a.n_repeat_slots, a.n_hashes);
    double share = (double)a.n_repeat_slots / a.n_slots;
    ASSERT_MSG(share > 0.25 && share < 0.40, "repeated share %.3f", share);
    /* another seed, another workload */
    p.seed = 2;
    kvp__epd_workload_t c;
    ASSERT_OK(kvp__epd_workload_gen(&p, &c));
    ASSERT(strcmp(a.hashes[0], c.hashes[0]) != 0);
    kvp__epd_workload_cleanup(&a);
    kvp__epd_workload_cleanup(&b);
    kvp__epd_workload_cleanup(&c);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_epd_workload_no_repeat_and_bad_params)
{
    kvp__epd_wl_params_t p;
    kvp__epd_wl_params_init(&p);
    p.repeat = 0;
    p.requests = 50;
    kvp__epd_workload_t w;
    ASSERT_OK(kvp__epd_workload_gen(&p, &w));
    ASSERT_EQ(w.n_repeat_slots, 0);
    ASSERT_EQ(w.n_hashes, w.n_slots);
    kvp__epd_workload_cleanup(&w);
    p.max_images = KVP__EPD_MAX_IMAGES + 1;
    ASSERT_EQ(kvp__epd_workload_gen(&p, &w), KVP_ERR_INVALID_ARG);
    kvp__epd_wl_params_init(&p);
    p.size = 3;
    ASSERT_EQ(kvp__epd_workload_gen(&p, &w), KVP_ERR_INVALID_ARG);
}

TEST(test_epd_content_verify_counts_every_wrong_byte)
{
    uint8_t a[1003], b[1003];
    kvp__epd_content_fill("img-1", a, sizeof a);
    kvp__epd_content_fill("img-2", b, sizeof b);
    ASSERT_EQ(kvp__epd_content_verify("img-1", a, sizeof a), (int64_t)sizeof a);
    ASSERT(memcmp(a, b, sizeof a) != 0); /* the output depends on the hash */
    a[0] ^= 1;
    a[1001] ^= 0x80; /* in the tail past the last whole word */
    ASSERT_EQ(kvp__epd_content_verify("img-1", a, sizeof a), (int64_t)sizeof a - 2);
    ASSERT_LT(kvp__epd_content_verify("img-2", a, sizeof a), 100);
}

TEST(test_epd_msg_req_round_trip_and_bad_lines)
{
    kvp__epd_msg_req_t r, back;
    memset(&r, 0, sizeof r);
    strcpy(r.id, "epd-00001");
    r.prompt_len = 200;
    r.n = 2;
    strcpy(r.consumer_zmq, "tcp://127.0.0.1:5555");
    for (size_t i = 0; i < 2; i++) {
        snprintf(r.mm_hash[i], sizeof r.mm_hash[i], "img-%zu", i);
        kvp__epd_transfer_id(r.transfer_id[i], sizeof r.transfer_id[i], r.id, i);
        r.offset[i] = 32 + 80 * (int64_t)i;
        r.length[i] = r.num_embeds[i] = 40;
    }
    ASSERT_STR_EQ(r.transfer_id[1], "epd-00001#1");
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__epd_msg_req_write(&b, &r);
    ASSERT(!b.oom && b.p[b.len - 1] == '\n');
    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    const kvp__json_t *root;
    ASSERT_OK(kvp__json_parse(&jp, b.p, b.len, &root));
    char err[128];
    ASSERT_OK(kvp__epd_msg_req_read(root, &back, err, sizeof err));
    ASSERT_MEM_EQ(&r, &back, sizeof r);
    const char *bad[] = {
        "[]",
        "{\"id\":\"x\",\"prompt_len\":10,\"features\":[],\"ec_transfer_params\":{}}",
        "{\"id\":\"x\",\"prompt_len\":10,\"features\":[{\"mm_hash\":\"h\",\"modality\":\"image\",\"offset\":5,"
        "\"length\":10,\"num_embeds\":10}],\"ec_transfer_params\":{\"consumer_zmq\":\"a\",\"ec_items\":"
        "[{\"mm_hash\":\"h\",\"transfer_id\":\"t\"}]}}", /* past the prompt */
        "{\"id\":\"x\",\"prompt_len\":30,\"features\":[{\"mm_hash\":\"h\",\"modality\":\"image\",\"offset\":5,"
        "\"length\":10,\"num_embeds\":10}],\"ec_transfer_params\":{\"consumer_zmq\":\"a\",\"ec_items\":"
        "[{\"mm_hash\":\"other\",\"transfer_id\":\"t\"}]}}", /* an item for another hash */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ASSERT_OK(kvp__json_parse(&jp, bad[i], strlen(bad[i]), &root));
        ASSERT_EQ(kvp__epd_msg_req_read(root, &back, err, sizeof err), KVP_ERR_DECODE);
        ASSERT(err[0]);
    }
    kvp__json_parser_cleanup(&jp);
    kvp__jw_cleanup(&b);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* ---------------------------------------------------------------- the manager */

typedef struct {
    kvp_ec_feature_t f[4];
    uint8_t cached[4];
    kvp__ecm_req_t r;
} ecm_rq_t;

static void ecm_rq(ecm_rq_t *q, const char *id, const char *h0, const char *h1, int64_t embeds)
{
    memset(q, 0, sizeof *q);
    q->f[0] = (kvp_ec_feature_t){h0, "image", 0, embeds, embeds};
    q->f[1] = (kvp_ec_feature_t){h1, "image", embeds, embeds, embeds};
    q->r = (kvp__ecm_req_t){id, q->f, h1 ? 2 : 1, q->cached};
}

TEST(test_ecm_evicts_oldest_freeable_first_and_reports_it_once)
{
    kvp__ecm_t m;
    kvp__ecm_init(&m, 30);
    ecm_rq_t a, b, c;
    ecm_rq(&a, "a", "HA", NULL, 10);
    ecm_rq(&b, "b", "HB", NULL, 10);
    ecm_rq(&c, "c", "HC", "HD", 10);
    ASSERT(kvp__ecm_can_allocate(&m, &a.r, 0, 100, 0));
    ASSERT_OK(kvp__ecm_allocate(&m, &a.r, 0));
    ASSERT_OK(kvp__ecm_allocate(&m, &b.r, 0));
    ASSERT_EQ(m.num_free, 10);
    ASSERT_EQ(m.num_freeable, 10);
    /* nobody can free anything yet: 20 more do not fit */
    ASSERT(!kvp__ecm_can_allocate(&m, &c.r, 1, 100, 10));
    kvp__ecm_free(&m, &a.r); /* HA freeable first, then HB */
    kvp__ecm_free(&m, &b.r);
    ASSERT_EQ(m.num_freeable, 30);
    ASSERT_OK(kvp__ecm_check(&m));
    /* the compute budget binds before the space */
    ASSERT(!kvp__ecm_can_allocate(&m, &c.r, 0, 9, 0));
    ASSERT(kvp__ecm_can_allocate(&m, &c.r, 0, 100, 0)); /* fits in the free 10 */
    ASSERT_OK(kvp__ecm_allocate(&m, &c.r, 0));
    ASSERT(kvp__ecm_can_allocate(&m, &c.r, 1, 100, 0)); /* evicts HA (the oldest) */
    ASSERT(!kvp__ecm_has(&m, "HA"));
    ASSERT(kvp__ecm_has(&m, "HB"));
    ASSERT_OK(kvp__ecm_allocate(&m, &c.r, 1));
    ASSERT_EQ(m.evictions, 1u);
    /* b comes back for HB: a hit that leaves the freeable list */
    ASSERT(kvp__ecm_check_and_update(&m, &b.r, 0));
    ASSERT_EQ(m.num_freeable, 0);
    ASSERT_OK(kvp__ecm_check(&m));
    kvp_ec_strlist_t freed;
    ASSERT_OK(kvp__ecm_get_freed(&m, &freed));
    ASSERT_EQ(freed.n, 1);
    ASSERT_STR_EQ(freed.v[0], "HA");
    kvp_ec_strlist_cleanup(&freed);
    ASSERT_OK(kvp__ecm_get_freed(&m, &freed));
    ASSERT_EQ(freed.n, 0); /* once */
    kvp__ecm_cleanup(&m);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_ecm_freed_hash_cached_again_is_not_reported)
{
    kvp__ecm_t m;
    kvp__ecm_init(&m, 10);
    ecm_rq_t a, b;
    ecm_rq(&a, "a", "HA", NULL, 10);
    ecm_rq(&b, "b", "HB", NULL, 10);
    ASSERT_OK(kvp__ecm_allocate(&m, &a.r, 0));
    kvp__ecm_free(&m, &a.r);
    ASSERT(kvp__ecm_can_allocate(&m, &b.r, 0, 100, 0)); /* evicts HA */
    ASSERT_OK(kvp__ecm_allocate(&m, &b.r, 0));
    kvp__ecm_free(&m, &b.r);
    ASSERT(kvp__ecm_can_allocate(&m, &a.r, 0, 100, 0)); /* evicts HB, HA comes back */
    ASSERT_OK(kvp__ecm_allocate(&m, &a.r, 0));
    kvp_ec_strlist_t freed;
    ASSERT_OK(kvp__ecm_get_freed(&m, &freed));
    ASSERT_EQ(freed.n, 1); /* HB only: HA is cached again */
    ASSERT_STR_EQ(freed.v[0], "HB");
    kvp_ec_strlist_cleanup(&freed);
    kvp__ecm_cleanup(&m);
}

TEST(test_ecm_input_stays_referenced_while_another_input_has_its_hash)
{
    kvp__ecm_t m;
    kvp__ecm_init(&m, 100);
    ecm_rq_t a;
    ecm_rq(&a, "a", "H", "H", 10);
    ASSERT_OK(kvp__ecm_allocate(&m, &a.r, 0));
    ASSERT(kvp__ecm_check_and_update(&m, &a.r, 1));
    kvp__ecm_free_input(&m, &a.r, 0);
    ASSERT_EQ(m.num_freeable, 90); /* input 1 still holds H */
    kvp__ecm_free_input(&m, &a.r, 1);
    ASSERT_EQ(m.num_freeable, 100);
    ASSERT_OK(kvp__ecm_check(&m));
    kvp__ecm_cleanup(&m);
}

/* ---------------------------------------------------------------- the engine */

/* TEST SCAFFOLDING: the stand-in worker (see the top of this file). */
typedef struct wire_buf {
    char *tid, *hash;
    uint8_t *data;
    int64_t nbytes;
    int64_t shape[2];
} wire_buf_t;

typedef struct standin {
    bool producer;
    kvp__strmap_t *wire;         /* tid -> wire_buf (shared by the pair) */
    kvp__ec_sinbox_t *peer_inbox; /* the consumer scheduler's inbox */
    struct { char *tid, *hash; } pending[256]; /* pushes waiting for their source */
    size_t n_pending;
    char *loaded[256];
    size_t n_loaded;
    char *failed[256];
    size_t n_failed;
    int pending_saves_left;      /* build_meta says pending_saves this many more times */
    uint64_t pushes, meta_pushes, loads, freed_seen, get_finished_ids, save_calls;
    char last_freed[64];
    char order[512];             /* one letter per call: S start_save, L start_load, E save, F get_finished, M build_meta */
} standin_t;

static void mark(standin_t *w, char c)
{
    size_t n = strlen(w->order);
    if (n + 1 < sizeof w->order)
        w->order[n] = c, w->order[n + 1] = 0;
}

static void deliver(standin_t *w, const char *tid, const char *hash, const kvp_ec_tensor_t *t)
{
    wire_buf_t *b = calloc(1, sizeof *b);
    b->tid = strdup(tid);
    b->hash = strdup(hash);
    b->nbytes = t->nbytes;
    b->data = malloc((size_t)t->nbytes);
    memcpy(b->data, t->data, (size_t)t->nbytes);
    b->shape[0] = t->shape[0];
    b->shape[1] = t->shape[1];
    ASSERT_OK(kvp__strmap_put(w->wire, b->tid, strlen(b->tid), b));
    char ev[512];
    snprintf(ev, sizeof ev,
             "{\"ready\":true,\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"reservation_id\":\"r-%s\","
             "\"nbytes\":%lld,\"shape\":[%lld,%lld],\"dtype\":\"bfloat16\",\"shard\":5500}",
             tid, hash, tid, (long long)t->nbytes, (long long)t->shape[0], (long long)t->shape[1]);
    kvp_ec_value_t *v;
    ASSERT_OK(kvp_ec_json_parse(ev, strlen(ev), 16, &v));
    ASSERT_OK(kvp__ec_sinbox_push(w->peer_inbox, v));
    w->pushes++;
}

static kvp_status_t si_start_save(void *ctx, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache)
{
    standin_t *w = ctx;
    mark(w, 'S');
    for (size_t i = 0; i < meta->n_freed; i++, w->freed_seen++)
        snprintf(w->last_freed, sizeof w->last_freed, "%s", meta->freed[i]);
    for (size_t i = 0; i < meta->n_pushes; i++) {
        const kvp_ec_push_spec_t *p = &meta->pushes[i];
        w->meta_pushes++;
        ASSERT(p->consumer_zmq && p->transfer_id && p->request_id);
        ASSERT_EQ(p->ndim, 2);
        kvp_ec_tensor_t t;
        if (cache->get(cache->ctx, p->mm_hash, &t)) { /* a source cached from an earlier step */
            ASSERT_EQ(t.nbytes, p->nbytes);
            deliver(w, p->transfer_id, p->mm_hash, &t);
        } else {
            ASSERT(w->n_pending < 256);
            w->pending[w->n_pending].tid = strdup(p->transfer_id);
            w->pending[w->n_pending++].hash = strdup(p->mm_hash);
        }
    }
    return KVP_OK;
}

static kvp_status_t si_save(void *ctx, const char *hash, const kvp_ec_tensor_t *t)
{
    standin_t *w = ctx;
    mark(w, 'E');
    w->save_calls++;
    for (size_t i = 0; i < w->n_pending;) {
        if (strcmp(w->pending[i].hash, hash)) {
            i++;
            continue;
        }
        deliver(w, w->pending[i].tid, hash, t);
        free(w->pending[i].tid);
        free(w->pending[i].hash);
        w->pending[i] = w->pending[--w->n_pending];
    }
    return KVP_OK;
}

static kvp_status_t si_start_load(void *ctx, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache)
{
    standin_t *w = ctx;
    mark(w, 'L');
    for (size_t i = 0; i < meta->n_freed; i++, w->freed_seen++)
        snprintf(w->last_freed, sizeof w->last_freed, "%s", meta->freed[i]);
    for (size_t i = 0; i < meta->n_loads; i++) {
        const kvp_ec_load_spec_t *l = &meta->loads[i];
        w->loads++;
        wire_buf_t *b = NULL;
        if (!cache->has(cache->ctx, l->mm_hash)) {
            if (l->local) { /* a resident: any buffer of that hash */
                for (size_t s = 0; s < w->wire->cap && !b; s++)
                    if (w->wire->slots[s].key && !strcmp(((wire_buf_t *)w->wire->slots[s].val)->hash, l->mm_hash))
                        b = w->wire->slots[s].val;
            } else {
                b = kvp__strmap_gets(w->wire, l->transfer_id);
            }
            if (!b) {
                w->failed[w->n_failed++] = kvp__strdup(l->mm_hash);
                continue;
            }
            kvp_ec_tensor_t t = {b->data, b->nbytes, b->shape, 2, KVP_EC_DTYPE_BFLOAT16};
            cache->put(cache->ctx, l->mm_hash, &t);
        }
        w->loaded[w->n_loaded++] = kvp__strdup(l->mm_hash);
    }
    return KVP_OK;
}

static kvp_status_t si_get_finished(void *ctx, const char *const *fin, size_t n)
{
    standin_t *w = ctx;
    ASSERT(fin != NULL); /* an empty list, never NULL: the real producer reads NULL as "every orphan" */
    mark(w, 'F');
    w->get_finished_ids += n;
    return KVP_OK;
}

static char **take_list(char **src, size_t *n, size_t *out_n)
{
    *out_n = *n;
    if (!*n)
        return NULL;
    char **v = kvp__malloc(*n * sizeof *v);
    memcpy(v, src, *n * sizeof *v);
    *n = 0;
    return v;
}

static kvp_status_t si_build_meta(void *ctx, kvp_ec_worker_meta_t *out, bool *has_p)
{
    standin_t *w = ctx;
    mark(w, 'M');
    memset(out, 0, sizeof *out);
    out->loaded = take_list(w->loaded, &w->n_loaded, &out->n_loaded);
    out->failed_loads = take_list(w->failed, &w->n_failed, &out->n_failed_loads);
    out->pending_saves = w->pending_saves_left > 0;
    if (w->pending_saves_left > 0)
        w->pending_saves_left--;
    *has_p = true;
    return KVP_OK;
}

static kvp__mm_worker_t standin_iface(standin_t *w)
{
    kvp__mm_worker_t i = {si_start_load, si_start_save, si_save, si_get_finished, si_build_meta, w};
    return i;
}

static void standin_cleanup(standin_t *w)
{
    for (size_t i = 0; i < w->n_pending; i++)
        free(w->pending[i].tid), free(w->pending[i].hash);
    for (size_t i = 0; i < w->n_loaded; i++)
        kvp__strfree(w->loaded[i]);
    for (size_t i = 0; i < w->n_failed; i++)
        kvp__strfree(w->failed[i]);
}

static void wire_cleanup(kvp__strmap_t *wire)
{
    for (size_t s = 0; s < wire->cap; s++) {
        wire_buf_t *b = wire->slots[s].val;
        if (!wire->slots[s].key)
            continue;
        free(b->tid), free(b->hash), free(b->data), free(b);
    }
    kvp__strmap_cleanup(wire);
}

/* One side: a real scheduler on scripted collaborators, an engine and its
 * callbacks' counts. */
typedef struct side {
    kvp__ec_sclock_t clock;
    kvp__ec_sexec_t exec;
    kvp__ec_sctl_t ctl;
    kvp__ec_sinbox_t inbox;
    kvp_ec_sched_t *s;
    standin_t w;
    kvp__mm_t *mm;
    uint64_t ended[3], put_bytes, verified;
    char last_end[64];
} side_t;

static void on_put(void *ctx, const char *hash, const kvp_ec_tensor_t *t)
{
    side_t *sd = ctx;
    sd->put_bytes += (uint64_t)t->nbytes;
    sd->verified += (uint64_t)kvp__epd_content_verify(hash, t->data, t->nbytes);
}

static void on_end(void *ctx, const char *id, kvp__mm_outcome_t o)
{
    side_t *sd = ctx;
    sd->ended[o]++;
    snprintf(sd->last_end, sizeof sd->last_end, "%s", id);
}

static void encode(void *ctx, const char *hash, uint8_t *buf, int64_t n)
{
    (void)ctx;
    kvp__epd_content_fill(hash, buf, n);
}

static void side_init(side_t *sd, bool producer, int64_t hidden, int64_t cache_embeds, int64_t pool)
{
    memset(sd, 0, sizeof *sd);
    kvp__ec_sexec_init(&sd->exec);
    kvp__ec_sctl_init(&sd->ctl);
    kvp__ec_sinbox_init(&sd->inbox, producer ? 0 : 1);
    kvp_ec_config_t c;
    kvp_ec_config_init(&c);
    c.is_producer = producer;
    c.is_consumer = !producer;
    c.control_addr = "tcp://127.0.0.1:5500";
    c.push_wait_timeout_s = 10;
    c.pool_size = pool;
    c.hidden_dim = hidden;
    c.dtype = KVP_EC_DTYPE_BFLOAT16;
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &c;
    p.clock = kvp__ec_sclock_iface(&sd->clock);
    p.control = kvp__ec_sctl_iface(&sd->ctl);
    p.executor = kvp__ec_sexec_iface(&sd->exec);
    p.inbox = kvp__ec_sinbox_iface(&sd->inbox);
    ASSERT_OK(kvp_ec_sched_create(&p, &sd->s));
    sd->w.producer = producer;
    kvp__mm_params_t mp = {0};
    mp.sched = sd->s;
    mp.producer = producer;
    mp.consumer = !producer;
    mp.worker = standin_iface(&sd->w);
    mp.encoder_cache_embeds = cache_embeds;
    mp.encoder_budget = cache_embeds;
    mp.token_budget = 8192;
    mp.max_num_seqs = 64;
    mp.hidden = hidden;
    mp.dtype = KVP_EC_DTYPE_BFLOAT16;
    mp.encode = encode;
    mp.on_put = on_put;
    mp.on_end = on_end;
    mp.cb_ctx = sd;
    ASSERT_OK(kvp__mm_create(&mp, &sd->mm));
}

static void side_free(side_t *sd)
{
    kvp__mm_destroy(sd->mm);
    kvp_ec_sched_close(sd->s);
    kvp_ec_sched_destroy(sd->s);
    standin_cleanup(&sd->w);
    kvp__ec_sexec_cleanup(&sd->exec);
    kvp__ec_sctl_cleanup(&sd->ctl);
    kvp__ec_sinbox_cleanup(&sd->inbox);
}

static void step_ok(side_t *sd)
{
    ASSERT_OK(kvp__mm_step(sd->mm));
    ASSERT_OK(kvp__mm_check(sd->mm));
}

/* A request of k images hash[0..k) of `embeds` each, transfer ids id#i. */
static void add_req(side_t *sd, const char *id, const char *const *hash, size_t k, int64_t embeds)
{
    kvp_ec_feature_t f[8];
    kvp_ec_item_t it[8];
    char tids[8][64];
    int64_t pos = 0;
    for (size_t i = 0; i < k; i++) {
        pos += 4;
        f[i] = (kvp_ec_feature_t){hash[i], "image", pos, embeds, embeds};
        pos += embeds;
        kvp__epd_transfer_id(tids[i], sizeof tids[i], id, i);
        it[i] = (kvp_ec_item_t){hash[i], tids[i]};
    }
    kvp_ec_transfer_params_t params = {"tcp://127.0.0.1:5500", it, k};
    kvp__mm_req_t r = {id, pos + 4, f, k, &params};
    ASSERT_OK(kvp__mm_add(sd->mm, &r));
}

typedef struct rec_q {
    const char *tid;
    kvp_ec_state_t st;
    bool found;
} rec_q_t;

static int rec_visit(void *ctx, const kvp_ec_record_view_t *rec)
{
    rec_q_t *q = ctx;
    if (strcmp(rec->transfer_id, q->tid))
        return 0;
    q->st = rec->state;
    q->found = true;
    return 1;
}

static kvp_ec_state_t rec_state(side_t *sd, const char *tid, bool *found)
{
    rec_q_t q = {tid, KVP_EC_WAITING_EVENT, false};
    kvp_ec_sched_table_visit(sd->s, rec_visit, &q);
    *found = q.found;
    return q.st;
}

/* Consumer: the request waits (WAITING_EVENT) until the events come, the
 * loads go out in the next meta, the worker's `loaded` makes them READY,
 * and only then are its tokens scheduled, with the inputs as external
 * loads (has_cache_item) -- the hooks in vLLM's order. */
TEST(test_mm_consumer_waits_for_events_then_loads_then_schedules)
{
    side_t prod, cons;
    kvp__strmap_t wire;
    kvp__strmap_init(&wire);
    side_init(&cons, false, 8, 1000, 1 << 20);
    cons.w.wire = &wire;
    side_init(&prod, true, 8, 1000, 1 << 20);
    prod.w.wire = &wire;
    prod.w.peer_inbox = &cons.inbox;
    const char *h[2] = {"img-a", "img-b"};
    add_req(&cons, "r1", h, 2, 4);
    step_ok(&cons);
    kvp__mm_stats_t st;
    kvp__mm_stats(cons.mm, &st);
    ASSERT_EQ(st.idle_steps, 1u); /* nothing scheduled: no event yet */
    ASSERT_GE(st.ensure_false, 1u);
    bool found;
    ASSERT_EQ(rec_state(&cons, "r1#0", &found), KVP_EC_WAITING_EVENT);
    ASSERT(found);
    /* the encoder instance runs the same request */
    add_req(&prod, "r1", h, 2, 4);
    step_ok(&prod);
    ASSERT_EQ(prod.w.meta_pushes, 2u);
    ASSERT_EQ(prod.w.pushes, 2u); /* pushed once the outputs were computed */
    ASSERT_EQ(prod.ended[KVP__MM_DONE], 1u);
    ASSERT_STR_EQ(prod.w.order, "SEEFM"); /* start_save, save x2, get_finished, build_meta */
    /* the consumer drains the events in ensure_cache_available (begin_load:
     * LOADING, the request still not ready), the loads go out with this
     * step's meta, and `loaded` comes back in its worker meta */
    step_ok(&cons);
    ASSERT_EQ(cons.w.loads, 2u);
    kvp__mm_stats(cons.mm, &st);
    ASSERT_EQ(st.idle_steps, 2u);
    ASSERT_EQ(rec_state(&cons, "r1#0", &found), KVP_EC_READY);
    ASSERT_EQ(rec_state(&cons, "r1#1", &found), KVP_EC_READY);
    ASSERT_EQ(cons.ended[KVP__MM_DONE], 0u);
    ASSERT_STR_EQ(cons.w.order, "LFMLFM"); /* start_load, get_finished, build_meta per step */
    step_ok(&cons); /* ensure_cache_available true: scheduled, external loads */
    kvp__mm_stats(cons.mm, &st);
    ASSERT_EQ(st.loaded_external, 2u);
    ASSERT_EQ(st.encoded, 0u);
    ASSERT_EQ(st.gather_misses, 0u);
    ASSERT_EQ(cons.ended[KVP__MM_DONE], 1u);
    ASSERT_EQ(cons.put_bytes, 2u * 64);
    ASSERT_EQ(cons.verified, cons.put_bytes);
    /* its id reaches get_finished in the next step */
    ASSERT(kvp__mm_busy(cons.mm));
    step_ok(&cons);
    ASSERT_EQ(cons.w.get_finished_ids, 1u);
    ASSERT(!kvp__mm_busy(cons.mm));
    side_free(&prod);
    side_free(&cons);
    wire_cleanup(&wire);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* No event within push_wait_timeout: take_unavailable_requests names the
 * request and it fails with a retryable error; no hook fails. */
TEST(test_mm_push_wait_timeout_fails_request_retryable)
{
    side_t cons;
    kvp__strmap_t wire;
    kvp__strmap_init(&wire);
    side_init(&cons, false, 8, 1000, 1 << 20);
    cons.w.wire = &wire;
    const char *h[1] = {"img-a"};
    add_req(&cons, "r1", h, 1, 4);
    step_ok(&cons);
    cons.clock.now_ms += 9000;
    step_ok(&cons);
    ASSERT_EQ(cons.ended[KVP__MM_RETRYABLE], 0u);
    cons.clock.now_ms += 2000; /* past the 10 s deadline */
    step_ok(&cons);
    ASSERT_EQ(cons.ended[KVP__MM_RETRYABLE], 1u);
    ASSERT_STR_EQ(cons.last_end, "r1");
    kvp__mm_stats_t st;
    kvp__mm_stats(cons.mm, &st);
    ASSERT_EQ(st.retryable, 1u);
    ASSERT_EQ(st.hook_errors, 0u);
    ASSERT_EQ(kvp__mm_unfinished(cons.mm), 0);
    side_free(&cons);
    wire_cleanup(&wire);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* The encoder cache holds two outputs: a third evicts the oldest freeable,
 * the next meta's `freed` names it and the model runner drops it; the
 * producer pushes a cached source from start_save_caches without encoding
 * it again. */
TEST(test_mm_encoder_cache_capacity_evicts_and_frees_reach_meta)
{
    side_t prod, cons;
    kvp__strmap_t wire;
    kvp__strmap_init(&wire);
    side_init(&cons, false, 8, 1000, 1 << 20);
    side_init(&prod, true, 8, 8, 1 << 20); /* room for two 4-embedding outputs */
    prod.w.wire = &wire;
    prod.w.peer_inbox = &cons.inbox;
    const char *ha[1] = {"img-a"}, *hb[1] = {"img-b"}, *hc[1] = {"img-c"};
    add_req(&prod, "r1", ha, 1, 4);
    step_ok(&prod);
    add_req(&prod, "r2", hb, 1, 4);
    step_ok(&prod);
    kvp__mm_stats_t st;
    kvp__mm_stats(prod.mm, &st);
    ASSERT_EQ(st.cache_entries, 2);
    add_req(&prod, "r3", ha, 1, 4); /* a hit: no encode, the push binds the cached source */
    step_ok(&prod);
    kvp__mm_stats(prod.mm, &st);
    ASSERT_EQ(st.encoded, 2u);
    ASSERT_EQ(st.cache_hits, 1u);
    ASSERT_EQ(prod.w.pushes, 3u);
    kvp_ec_tensor_t t;
    ASSERT(kvp__mm_cache_get(prod.mm, "img-b", &t));
    const uint8_t *b_buf = t.data;
    kvp__mm_stats(prod.mm, &st);
    ASSERT_EQ(st.outputs_reused, 0u);
    ASSERT_EQ(st.spare_bytes, 0);
    add_req(&prod, "r4", hc, 1, 4); /* evicts img-b (freeable longest) */
    step_ok(&prod);
    ASSERT_EQ(prod.w.freed_seen, 1u);
    ASSERT_STR_EQ(prod.w.last_freed, "img-b");
    ASSERT(!kvp__mm_cache_get(prod.mm, "img-b", &t));
    ASSERT(kvp__mm_cache_get(prod.mm, "img-a", &t));
    ASSERT(kvp__mm_cache_get(prod.mm, "img-c", &t));
    /* img-b's buffer, freed in the same step before the encoder ran, is
     * img-c's (as a caching allocator reuses device memory), and holds
     * img-c's output */
    ASSERT(t.data == b_buf);
    ASSERT_EQ(kvp__epd_content_verify("img-c", t.data, t.nbytes), t.nbytes);
    kvp__mm_stats(prod.mm, &st);
    ASSERT_EQ(st.outputs_reused, 1u);
    ASSERT_EQ(st.spare_bytes, 0); /* taken again */
    kvp__mm_stats(prod.mm, &st);
    ASSERT_EQ(st.evictions, 1u);
    ASSERT_EQ(prod.ended[KVP__MM_DONE], 4u);
    side_free(&prod);
    side_free(&cons);
    wire_cleanup(&wire);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* has_pending_push_work (the workers' pending_saves) keeps the engine
 * stepping after its last request ended. */
TEST(test_mm_pending_push_work_keeps_stepping)
{
    side_t prod, cons;
    kvp__strmap_t wire;
    kvp__strmap_init(&wire);
    side_init(&cons, false, 8, 1000, 1 << 20);
    side_init(&prod, true, 8, 1000, 1 << 20);
    prod.w.wire = &wire;
    prod.w.peer_inbox = &cons.inbox;
    prod.w.pending_saves_left = 3;
    const char *h[1] = {"img-a"};
    add_req(&prod, "r1", h, 1, 4);
    int steps = 0;
    while (kvp__mm_busy(prod.mm) && steps < 20) {
        step_ok(&prod);
        steps++;
    }
    ASSERT_EQ(prod.ended[KVP__MM_DONE], 1u);
    ASSERT_EQ(steps, 4); /* the request's step plus three with saves pending */
    side_free(&prod);
    side_free(&cons);
    wire_cleanup(&wire);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* update_state_after_free: a repeated image the consumer already holds
 * (its own local cache) is never loaded again; its transfer is cancelled
 * when the input is freed, and a remote cancel goes to the consumer's
 * control address for the AVAILABLE record. */
TEST(test_mm_repeat_in_local_cache_cancels_its_transfer_after_free)
{
    side_t prod, cons;
    kvp__strmap_t wire;
    kvp__strmap_init(&wire);
    side_init(&cons, false, 8, 1000, 1 << 20);
    cons.w.wire = &wire;
    side_init(&prod, true, 8, 1000, 1 << 20);
    prod.w.wire = &wire;
    prod.w.peer_inbox = &cons.inbox;
    const char *h[1] = {"img-a"};
    add_req(&cons, "r1", h, 1, 4);
    add_req(&prod, "r1", h, 1, 4);
    step_ok(&prod);
    for (int i = 0; i < 4; i++)
        step_ok(&cons);
    ASSERT_EQ(cons.ended[KVP__MM_DONE], 1u);
    /* r2 names img-a again: the consumer's encoder cache still has it */
    add_req(&prod, "r2", h, 1, 4);
    step_ok(&prod);
    add_req(&cons, "r2", h, 1, 4);
    uint64_t jobs0 = kvp__ec_sexec_count(&cons.exec);
    for (int i = 0; i < 3 && cons.ended[KVP__MM_DONE] < 2; i++)
        step_ok(&cons);
    ASSERT_EQ(cons.ended[KVP__MM_DONE], 2u);
    kvp__mm_stats_t st;
    kvp__mm_stats(cons.mm, &st);
    ASSERT_EQ(st.cache_hits, 1u);
    ASSERT_EQ(cons.w.loads, 1u); /* r1's only */
    bool found;
    kvp_ec_state_t s = rec_state(&cons, "r2#0", &found);
    ASSERT(found); /* the event came (AVAILABLE), then the free cancelled it */
    ASSERT_EQ(s, KVP_EC_CANCELLED);
    ASSERT_EQ(kvp__ec_sexec_count(&cons.exec), jobs0 + 1);
    ASSERT_STR_EQ(cons.exec.jobs[jobs0].tid, "r2#0");
    ASSERT_STR_EQ(cons.exec.jobs[jobs0].addr, "tcp://127.0.0.1:5500");
    side_free(&prod);
    side_free(&cons);
    wire_cleanup(&wire);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

/* A generated workload through a producer and a consumer engine (stand-in
 * wire): every request done, every output put verified, repeats hit. */
static void standin_pair_run(int64_t prod_cache_images);

TEST(test_mm_generated_workload_through_standin_pair) { standin_pair_run(64); }

/* An encoder cache of 4 images: requests are scheduled in parts (the text
 * before an input that does not fit yet), and every push still gets its
 * source. */
TEST(test_mm_small_encoder_cache_every_push_gets_its_source) { standin_pair_run(4); }

static void standin_pair_run(int64_t prod_cache_images)
{
    kvp__epd_wl_params_t wp;
    kvp__epd_wl_params_init(&wp);
    wp.requests = 40;
    wp.size = 256;
    wp.repeat_gap = 4;
    kvp__epd_workload_t w;
    ASSERT_OK(kvp__epd_workload_gen(&wp, &w));
    side_t prod, cons;
    kvp__strmap_t wire;
    kvp__strmap_init(&wire);
    side_init(&cons, false, w.hidden, 64 * w.num_embeds, 1 << 20);
    cons.w.wire = &wire;
    side_init(&prod, true, w.hidden, prod_cache_images * w.num_embeds, 1 << 20);
    prod.w.wire = &wire;
    prod.w.peer_inbox = &cons.inbox;
    for (uint32_t r = 0; r < wp.requests; r++) {
        const kvp__epd_req_t *q = &w.reqs[r];
        kvp_ec_feature_t f[KVP__EPD_MAX_IMAGES];
        kvp_ec_item_t it[KVP__EPD_MAX_IMAGES];
        char tids[KVP__EPD_MAX_IMAGES][64];
        for (uint32_t k = 0; k < q->n_images; k++) {
            f[k] = (kvp_ec_feature_t){w.hashes[q->image[k]], "image", q->offset[k], w.num_embeds, w.num_embeds};
            kvp__epd_transfer_id(tids[k], sizeof tids[k], q->id, k);
            it[k] = (kvp_ec_item_t){w.hashes[q->image[k]], tids[k]};
        }
        kvp_ec_transfer_params_t params = {"tcp://127.0.0.1:5500", it, q->n_images};
        kvp__mm_req_t mr = {q->id, q->prompt_len, f, q->n_images, &params};
        ASSERT_OK(kvp__mm_add(prod.mm, &mr));
        ASSERT_OK(kvp__mm_add(cons.mm, &mr));
    }
    for (int i = 0; i < 400 && (kvp__mm_busy(prod.mm) || kvp__mm_busy(cons.mm)); i++) {
        if (kvp__mm_busy(prod.mm))
            step_ok(&prod);
        if (kvp__mm_busy(cons.mm))
            step_ok(&cons);
    }
    ASSERT_EQ(prod.ended[KVP__MM_DONE], wp.requests);
    ASSERT_EQ(cons.ended[KVP__MM_DONE], wp.requests);
    ASSERT_EQ(cons.ended[KVP__MM_RETRYABLE] + cons.ended[KVP__MM_FAILED], 0u);
    ASSERT_GT(cons.put_bytes, 0u);
    ASSERT_EQ(cons.verified, cons.put_bytes);
    kvp__mm_stats_t st;
    kvp__mm_stats(cons.mm, &st);
    ASSERT_EQ(st.gather_misses, 0u);
    ASSERT_EQ(st.hook_errors, 0u);
    ASSERT_EQ(st.encoded, 0u); /* the prefill instance encodes nothing itself */
    kvp__mm_stats(prod.mm, &st);
    ASSERT_EQ(st.hook_errors, 0u);
    ASSERT_EQ(prod.w.pushes, w.n_slots); /* one push per image slot */
    /* freed outputs' buffers were written again (where the cache had to
     * free any), and no more of them are kept than the encoder cache holds */
    if (prod_cache_images < (int64_t)w.n_hashes)
        ASSERT_GT(st.outputs_reused, 0u);
    ASSERT_LE(st.spare_bytes, prod_cache_images * wp.size);
    ASSERT_LE(st.outputs_reused, st.encoded);
    side_free(&prod);
    side_free(&cons);
    wire_cleanup(&wire);
    kvp__epd_workload_cleanup(&w);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST(test_mm_add_refuses_bad_requests)
{
    side_t cons;
    side_init(&cons, false, 8, 1000, 1 << 20);
    kvp_ec_feature_t f[2] = {{"h", "image", 10, 8, 4}, {"g", "image", 12, 4, 4}}; /* overlap */
    kvp__mm_req_t r = {"x", 40, f, 2, NULL};
    ASSERT_EQ(kvp__mm_add(cons.mm, &r), KVP_ERR_INVALID_ARG);
    f[1].offset = 30;
    f[1].length = 20; /* past the prompt */
    ASSERT_EQ(kvp__mm_add(cons.mm, &r), KVP_ERR_INVALID_ARG);
    f[1].length = 5;
    ASSERT_OK(kvp__mm_add(cons.mm, &r));
    ASSERT_EQ(kvp__mm_add(cons.mm, &r), KVP_ERR_DUPLICATE_KEY);
    side_free(&cons);
    ASSERT_EQ(kvp__alloc_bytes_in_use(), 0);
}

TEST_LIST(T(test_epd_shape_4mib_is_512_by_4096_bf16), T(test_epd_workload_defaults_deterministic_with_a_third_repeated),
          T(test_epd_workload_no_repeat_and_bad_params), T(test_epd_content_verify_counts_every_wrong_byte),
          T(test_epd_msg_req_round_trip_and_bad_lines), T(test_ecm_evicts_oldest_freeable_first_and_reports_it_once),
          T(test_ecm_freed_hash_cached_again_is_not_reported),
          T(test_ecm_input_stays_referenced_while_another_input_has_its_hash),
          T(test_mm_consumer_waits_for_events_then_loads_then_schedules),
          T(test_mm_push_wait_timeout_fails_request_retryable),
          T(test_mm_encoder_cache_capacity_evicts_and_frees_reach_meta), T(test_mm_pending_push_work_keeps_stepping),
          T(test_mm_repeat_in_local_cache_cancels_its_transfer_after_free),
          T(test_mm_generated_workload_through_standin_pair), T(test_mm_small_encoder_cache_every_push_gets_its_source), T(test_mm_add_refuses_bad_requests))
