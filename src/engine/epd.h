/*
 * `kvpool replay --epd`: encoder -> prefill disaggregation on one host.
 *
 * The replay (epd_replay.c) starts an encoder node and a prefill node
 * (`kvpool epd-node`, tools/cmd_epd_node.c), each an engine model instance
 * (mm.h) with the EC connector's real scheduler and worker, and plays the
 * proxy: every image of every request gets a transfer id, the request goes
 * with ec_transfer_params {consumer_zmq, ec_items:[{mm_hash, transfer_id}]}
 * to both nodes, the encoder computes and pushes, the prefill node waits for
 * the readiness events, takes the outputs into its encoder cache and checks
 * every byte against the deterministic encoder output below.
 *
 * This header: the generated workload, the deterministic encoder output,
 * and the one-JSON-line messages between the replay and the nodes.
 */
#ifndef KVP_ENGINE_EPD_H
#define KVP_ENGINE_EPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/json.h"
#include "kvpool/ec_connector.h"

#define KVP__EPD_MAX_IMAGES 8    /* per request */
#define KVP__EPD_HASH_LEN 24     /* "img-" + 16 hex digits + NUL, rounded */
#define KVP__EPD_TEXT_TOKENS 32  /* text before each image, and after the last */

/* ---------------------------------------------------------------- workload */

typedef struct kvp__epd_wl_params {
    uint32_t requests;       /* 300 */
    uint32_t min_images, max_images; /* 1..3: a request's image count is uniform in between */
    int64_t size;            /* encoder output bytes per image (4 MiB) */
    double repeat;           /* share of image slots that reuse an earlier image (1/3) */
    uint32_t repeat_gap;     /* a reuse names an image first seen >= this many requests earlier */
    uint64_t seed;
} kvp__epd_wl_params_t;

void kvp__epd_wl_params_init(kvp__epd_wl_params_t *p);

/* Shape [num_embeds, hidden] bfloat16 with nbytes = size: the widest hidden
 * in 4096, 2048, ..., 1 that divides size/2.  KVP_ERR_INVALID_ARG when size
 * is odd or < 2. */
kvp_status_t kvp__epd_shape(int64_t size, int64_t *num_embeds_p, int64_t *hidden_p);

typedef struct kvp__epd_req {
    char id[24];                        /* "epd-00042" */
    uint32_t n_images;
    uint32_t image[KVP__EPD_MAX_IMAGES]; /* indices into the workload's hashes */
    int64_t offset[KVP__EPD_MAX_IMAGES]; /* placeholder positions in the prompt */
    int64_t prompt_len;
} kvp__epd_req_t;

typedef struct kvp__epd_workload {
    kvp__epd_wl_params_t p;
    int64_t num_embeds, hidden;
    kvp__epd_req_t *reqs;     /* p.requests */
    char (*hashes)[KVP__EPD_HASH_LEN]; /* distinct images, in first-use order */
    uint32_t n_hashes;
    uint32_t n_slots, n_repeat_slots; /* image slots, and those that reuse an earlier image */
} kvp__epd_workload_t;

/* Deterministic for the params.  A request never names one image twice; a
 * reused image was first used at least repeat_gap requests earlier (so with
 * that many requests in flight at most, its first use has finished). */
kvp_status_t kvp__epd_workload_gen(const kvp__epd_wl_params_t *p, kvp__epd_workload_t *w);
void kvp__epd_workload_cleanup(kvp__epd_workload_t *w);

/* ---------------------------------------------------------------- content */

/* The encoder output of mm_hash: byte i is f(mm_hash, i), cheap to make and
 * to check (splitmix64 of the hash's seed and i/8). */
uint64_t kvp__epd_content_seed(const char *mm_hash);
void kvp__epd_content_fill(const char *mm_hash, uint8_t *buf, int64_t nbytes);
/* Bytes of buf[0..nbytes) equal to f(mm_hash, .): nbytes when all are. */
int64_t kvp__epd_content_verify(const char *mm_hash, const uint8_t *buf, int64_t nbytes);

/* ---------------------------------------------------------------- messages */

/* A request as the proxy sends it (the nodes parse it back into this). */
typedef struct kvp__epd_msg_req {
    char id[64];
    int64_t prompt_len;
    size_t n;
    char mm_hash[KVP__EPD_MAX_IMAGES][64];
    char transfer_id[KVP__EPD_MAX_IMAGES][80];
    int64_t offset[KVP__EPD_MAX_IMAGES], length[KVP__EPD_MAX_IMAGES], num_embeds[KVP__EPD_MAX_IMAGES];
    char consumer_zmq[128];
} kvp__epd_msg_req_t;

/* {"op":"req","id":..,"prompt_len":..,"features":[{"mm_hash","modality",
 * "offset","length","num_embeds"}],"ec_transfer_params":{"consumer_zmq":..,
 * "ec_items":[{"mm_hash","transfer_id"}]}} + "\n" */
void kvp__epd_msg_req_write(kvp__jw_t *b, const kvp__epd_msg_req_t *r);
/* Parses one "req" object; KVP_ERR_DECODE with a reason in err. */
kvp_status_t kvp__epd_msg_req_read(const kvp__json_t *root, kvp__epd_msg_req_t *r, char *err, size_t errlen);

/* Typed member access for the line readers (false: missing or wrong type). */
bool kvp__epd_json_int(const kvp__json_t *o, const char *key, int64_t *v);
bool kvp__epd_json_str(const kvp__json_t *o, const char *key, char *buf, size_t len);
bool kvp__epd_json_bool(const kvp__json_t *o, const char *key, bool *v);

/* The proxy's transfer id of slot k of request `id`: "<id>#<k>". */
void kvp__epd_transfer_id(char *buf, size_t len, const char *req_id, size_t k);

#endif

/* ---------------------------------------------------------------- the replay */

typedef struct kvp__epd_replay_params {
    kvp__epd_wl_params_t wl;
    uint32_t consumer_tp;     /* consumer TP ranks in the prefill node (1) */
    const char *pool_uri;     /* the cross-encoder cache; NULL: a `kvpool server` the replay starts */
    bool no_pool;             /* --pool none: no cross-encoder cache */
    uint32_t window;          /* requests in flight at most (8, <= wl.repeat_gap) */
    uint64_t push_wait_s;     /* the consumer's push_wait_timeout (60) */
    uint64_t lease_ms;        /* the workers' reservation lease (0: 300 s) */
    uint64_t cache_images;    /* each instance's encoder cache, in images (16) */
    uint64_t kill_encoder_after; /* --faults kill-encoder@N: SIGKILL after N pushes (0: never) */
    double drop_events;       /* --faults drop-events@P */
    uint64_t kill_pool_after; /* --faults kill-pool@N: SIGKILL the pool server the replay started after N pushes */
    uint64_t timeout_s;       /* the whole run (280) */
    bool json;
} kvp__epd_replay_params_t;

void kvp__epd_replay_params_init(kvp__epd_replay_params_t *p);
/* Parses --faults SPEC: comma-separated kill-encoder@N, kill-pool@N and drop-events@P.
 * KVP_ERR_BAD_OPTION on anything else. */
kvp_status_t kvp__epd_faults_parse(const char *spec, kvp__epd_replay_params_t *p);
/* Runs it; the exit status (0; 1: failures, a mismatch or a node that did
 * not behave; 2: refused up front). */
int kvp__epd_replay_main(const kvp__epd_replay_params_t *p);
