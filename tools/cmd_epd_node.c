/*
 * `kvpool epd-node --role encoder|prefill ...` (hidden: started by `kvpool
 * replay --epd`, src/engine/epd_replay.c): one engine instance (mm.h) with
 * the EC connector's real scheduler, its ZeroMQ collaborators and its
 * worker(s), talking to the replay over stdin/stdout, one JSON line per
 * message (logs go to stderr).
 *
 *   prefill: a consumer scheduler and --consumer-tp consumer workers (TP
 *     ranks, each its own control server on 127.0.0.1, ports chosen free,
 *     its own encoder cache), their worker metadata aggregated as vLLM's
 *     executor does (kvp_ec_worker_meta_aggregate); every output a rank
 *     takes into its encoder cache is checked byte for byte against the
 *     deterministic encoder output (epd.h), on the node's device thread.
 *     A bare ZeroMQ REP echo serves the replay's round-trip baseline.
 *   encoder: a producer scheduler and a producer worker; the engine
 *     "encodes" (the deterministic output, on the node's device thread)
 *     and the worker pushes; every push record
 *     (kvp_ec_worker_params.on_push) goes to the replay.
 *
 * In (replay -> node): {"op":"req",...} (kvp__epd_msg_req_write),
 *   {"op":"rtt","addr":A,"bytes":B,"count":N} (encoder: N round trips now;
 *   frames of B bytes, replies of the largest writing reserve's reply once
 *   one was answered, else of B),
 *   {"op":"rtt_start","addr":A,"bytes":B,"interval_us":U} and
 *   {"op":"rtt_stop"} (encoder: one round trip every U us in between, on a
 *   thread of its own, while the workload runs), {"op":"stats"},
 *   {"op":"quit"} (finish what is queued, report, exit).
 * Out (node -> replay): {"ev":"ready",...}, {"ev":"end","id","outcome"},
 *   {"ev":"push",...} (encoder), {"ev":"event","tid","t_ns"} (prefill: a
 *   readiness event reached the scheduler's inbox), {"ev":"rtt","p50_ns","reply_bytes"},
 *   {"ev":"rtt_loaded","p50_ns","count","paired_p50_ns","paired_count",
 *   "reply_bytes"} (all the samples; those paired with the writing reserves;
 *   the reply size the echo was asked for: a reserve reply's, zmq_rtt.h),
 *   {"ev":"stats",...}, {"ev":"error","msg"} (a line it could not use).
 * Times are CLOCK_MONOTONIC ns: both nodes run on the replay's host.
 *
 * The device thread (engine/device.h) stands in for the GPU: the encoding
 * and the byte checks run there at nice 19 under SCHED_IDLE, the engine
 * thread waiting for each, so they take only the CPU the serving threads
 * leave over; the ready line says its nice value and class (device_nice,
 * device_sched_idle).
 *
 * --drop-events P (prefill; fault injection, not a production knob): the
 * inbox in front of the scheduler loses each readiness event with
 * probability P (deterministic), as a lossy event channel would.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "commands.h"
#include "zmq_rtt.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/log.h"
#include "common/mix.h"
#include "common/strmap.h"
#include "common/thread.h"
#include "common/units.h"
#include "engine/device.h"
#include "engine/epd.h"
#include "engine/mm.h"
#include "kvpool/ec_connector.h"
#include "kvpool/pool.h"
#include "server/metrics.h"

#define MAX_TP 8

typedef struct node node_t;

/* A TP rank's encoder cache (ranks 1..tp-1; rank 0 uses the engine's). */
typedef struct shadow {
    node_t *n;
    kvp__strmap_t map; /* mm_hash -> shadow_ent */
} shadow_t;

typedef struct shadow_ent {
    char *hash;
    kvp_ec_tensor_t t;
    int64_t shape[4];
} shadow_ent_t;

struct node {
    bool prefill;
    size_t tp;
    int64_t size, num_embeds, hidden;
    kvp_ec_config_t cfg;
    char addr_buf[128];
    kvp_pool_t *pool;
    kvp__metrics_t *metrics; /* --metrics-port */
    kvp_ec_worker_t *w[MAX_TP];
    shadow_t shadow[MAX_TP];
    kvp_ec_zmq_t *zmq;
    kvp_ec_inbox_t inner;   /* the ZeroMQ inbox the wrapper drains */
    const kvp_ec_value_t **kept; /* the wrapper's last drain, filtered */
    size_t cap_kept;
    double drop_p;
    uint64_t drop_rng, events, events_dropped;
    kvp_ec_sched_t *sched;
    kvp__mm_t *mm;
    kvp__device_t *dev; /* the stand-in for the GPU: encodes, checks (device.h) */
    uint64_t taken, verified, puts;
    pthread_mutex_t out_mu;
    /* the ZeroMQ echo (prefill) */
    kvp_tool_echo_t echo;
    /* the round-trip sampler during the workload (encoder), paired with
     * the writing reserves (on_push) */
    kvp_tool_sampler_t samp;
};

/* ---------------------------------------------------------------- output */

/* One line to the replay (any thread). */
static void emit(node_t *n, kvp__jw_t *b)
{
    if (b->oom)
        return;
    pthread_mutex_lock(&n->out_mu);
    size_t off = 0;
    while (off < b->len) {
        ssize_t k = write(STDOUT_FILENO, b->p + off, b->len - off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break; /* the replay is gone: nothing to tell */
        off += (size_t)k;
    }
    pthread_mutex_unlock(&n->out_mu);
}

static void jkey(kvp__jw_t *b, const char *k)
{
    kvp__jw_puts(b, b->len > 1 ? ",\"" : "\"");
    kvp__jw_puts(b, k);
    kvp__jw_puts(b, "\":");
}
static void jint(kvp__jw_t *b, const char *k, int64_t v) { jkey(b, k), kvp__jw_int(b, v); }
static void jstr(kvp__jw_t *b, const char *k, const char *v) { jkey(b, k), kvp__jw_str(b, v, strlen(v)); }
static void jbool(kvp__jw_t *b, const char *k, bool v) { jkey(b, k), kvp__jw_bool(b, v); }

static void emit_error(node_t *n, const char *msg)
{
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, "{");
    jstr(&b, "ev", "error");
    jstr(&b, "msg", msg);
    kvp__jw_puts(&b, "}\n");
    emit(n, &b);
    kvp__jw_cleanup(&b);
}

/* ---------------------------------------------------------------- callbacks */

static void on_push(void *ctx, const kvp_ec_push_record_t *r)
{
    node_t *n = ctx;
    if (r->status == KVP_OK && r->written > 0)
        kvp_tool_sampler_op(&n->samp, r->reserve_sent_ns, r->reserve_done_ns, r->reserve_reply_bytes);
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, "{");
    jstr(&b, "ev", "push");
    jstr(&b, "tid", r->transfer_id ? r->transfer_id : "");
    jstr(&b, "mm_hash", r->mm_hash ? r->mm_hash : "");
    jstr(&b, "req", r->request_id ? r->request_id : "");
    jint(&b, "nbytes", r->nbytes);
    jint(&b, "shards", (int64_t)r->shards);
    jint(&b, "written", (int64_t)r->written);
    jbool(&b, "cached", r->cached);
    jint(&b, "status", r->status);
    jbool(&b, "retryable", r->retryable);
    jint(&b, "reserve_asked_ns", (int64_t)r->reserve_asked_ns);
    jint(&b, "reserve_sent_ns", (int64_t)r->reserve_sent_ns);
    jint(&b, "reserve_done_ns", (int64_t)r->reserve_done_ns);
    jint(&b, "reserve_reply_bytes", (int64_t)r->reserve_reply_bytes);
    jint(&b, "write_start_ns", (int64_t)r->write_start_ns);
    jint(&b, "write_done_ns", (int64_t)r->write_done_ns);
    jint(&b, "complete_done_ns", (int64_t)r->complete_done_ns);
    jstr(&b, "path", r->written == 0 ? "none" : r->path == KVP_EC_PUSH_UCX ? "ucx" : "tcp");
    kvp__jw_puts(&b, "}\n");
    emit(n, &b);
    kvp__jw_cleanup(&b);
}

static void on_end(void *ctx, const char *id, kvp__mm_outcome_t o)
{
    node_t *n = ctx;
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, "{");
    jstr(&b, "ev", "end");
    jstr(&b, "id", id);
    jstr(&b, "outcome", o == KVP__MM_DONE ? "done" : o == KVP__MM_RETRYABLE ? "retryable" : "failed");
    kvp__jw_puts(&b, "}\n");
    emit(n, &b);
    kvp__jw_cleanup(&b);
}

/* What the GPU would compute, run on the device thread. */
typedef struct {
    const char *hash;
    uint8_t *buf;
    const void *data;
    int64_t nbytes, good;
} dev_job_t;

static void dev_fill(void *arg)
{
    dev_job_t *j = arg;
    kvp__epd_content_fill(j->hash, j->buf, j->nbytes);
}

static void dev_verify(void *arg)
{
    dev_job_t *j = arg;
    j->good = kvp__epd_content_verify(j->hash, j->data, j->nbytes);
}

static void encode(void *ctx, const char *hash, uint8_t *buf, int64_t nbytes)
{
    node_t *n = ctx;
    dev_job_t j = {.hash = hash, .buf = buf, .nbytes = nbytes};
    kvp__device_run(n->dev, dev_fill, &j);
}

/* Every output a rank takes is checked against what it should be. */
static void count_put(node_t *n, const char *hash, const kvp_ec_tensor_t *t)
{
    dev_job_t j = {.hash = hash, .data = t->data, .nbytes = t->nbytes};
    kvp__device_run(n->dev, dev_verify, &j);
    n->puts++;
    n->taken += (uint64_t)t->nbytes;
    n->verified += (uint64_t)j.good;
}

static void on_put(void *ctx, const char *hash, const kvp_ec_tensor_t *t) { count_put(ctx, hash, t); }

/* ---------------------------------------------------------------- the inbox wrapper */

static const char *event_tid(const kvp_ec_value_t *ev)
{
    const kvp_ec_value_t *t = ev && ev->type == KVP_EC_V_OBJECT ? kvp_ec_value_get(ev, "transfer_id") : NULL;
    return t && t->type == KVP_EC_V_STR ? t->u.str.ptr : NULL;
}

static size_t wi_shards(void *ctx)
{
    node_t *n = ctx;
    return n->inner.shard_count(n->inner.ctx);
}

/* The ZeroMQ inbox's drain, timestamped for the replay's push latency
 * (reserve sent -> readiness event received here), and thinned by
 * --drop-events. */
static kvp_status_t wi_drain(void *ctx, const char *addr, const kvp_ec_value_t *const **events_p, size_t *n_p)
{
    node_t *n = ctx;
    const kvp_ec_value_t *const *evs = NULL;
    size_t ne = 0;
    kvp_status_t st = n->inner.drain(n->inner.ctx, addr, &evs, &ne);
    *events_p = NULL;
    *n_p = 0;
    if (st != KVP_OK || !ne)
        return st;
    uint64_t now = kvp__now_ns();
    if (kvp__grow_in((void **)&n->kept, &n->cap_kept, ne, sizeof *n->kept, 64) != 0)
        return KVP_ERR_NO_MEMORY;
    size_t k = 0;
    for (size_t i = 0; i < ne; i++) {
        n->events++;
        if (n->drop_p > 0 && (double)(kvp__splitmix64(&n->drop_rng) >> 11) / 9007199254740992.0 < n->drop_p) {
            n->events_dropped++;
            continue;
        }
        n->kept[k++] = evs[i];
        const char *tid = event_tid(evs[i]);
        if (!tid)
            continue; /* malformed: the scheduler drops it, and so do we */
        kvp__jw_t b;
        kvp__jw_init(&b);
        kvp__jw_puts(&b, "{");
        jstr(&b, "ev", "event");
        jstr(&b, "tid", tid);
        jint(&b, "t_ns", (int64_t)now);
        kvp__jw_puts(&b, "}\n");
        emit(n, &b);
        kvp__jw_cleanup(&b);
    }
    *events_p = n->kept;
    *n_p = k;
    return KVP_OK;
}

static void wi_close(void *ctx)
{
    node_t *n = ctx;
    n->inner.close(n->inner.ctx);
}

/* ---------------------------------------------------------------- the TP ranks */

static bool sh_has(void *ctx, const char *hash) { return kvp__strmap_gets(&((shadow_t *)ctx)->map, hash); }

static bool sh_get(void *ctx, const char *hash, kvp_ec_tensor_t *t)
{
    shadow_ent_t *e = kvp__strmap_gets(&((shadow_t *)ctx)->map, hash);
    if (e)
        *t = e->t;
    return e != NULL;
}

static void sh_drop(shadow_t *s, const char *hash)
{
    shadow_ent_t *e = kvp__strmap_del(&s->map, hash, strlen(hash));
    if (e) {
        kvp__strfree(e->hash);
        kvp__free(e, sizeof *e);
    }
}

static void sh_put(void *ctx, const char *hash, const kvp_ec_tensor_t *t)
{
    shadow_t *s = ctx;
    count_put(s->n, hash, t);
    sh_drop(s, hash);
    shadow_ent_t *e = kvp__calloc(1, sizeof *e);
    if (!e || t->ndim > 4 || !(e->hash = kvp__strdup(hash))) {
        kvp__free(e, sizeof *e);
        return;
    }
    e->t = *t;
    memcpy(e->shape, t->shape, t->ndim * sizeof *t->shape);
    e->t.shape = e->shape;
    if (kvp__strmap_put(&s->map, e->hash, strlen(e->hash), e) != KVP_OK) {
        kvp__strfree(e->hash);
        kvp__free(e, sizeof *e);
    }
}

static void sh_cleanup(shadow_t *s)
{
    for (size_t i = 0; i < s->map.cap; i++)
        if (s->map.slots[i].key) {
            shadow_ent_t *e = s->map.slots[i].val;
            kvp__strfree(e->hash);
            kvp__free(e, sizeof *e);
        }
    kvp__strmap_cleanup(&s->map);
}

static kvp_ec_encoder_cache_t rank_cache(node_t *n, size_t r, const kvp_ec_encoder_cache_t *engine_cache)
{
    if (r == 0)
        return *engine_cache;
    kvp_ec_encoder_cache_t c = {sh_has, sh_get, sh_put, &n->shadow[r]};
    return c;
}

static kvp_status_t tp_start_load(void *ctx, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache)
{
    node_t *n = ctx;
    kvp_status_t first = KVP_OK;
    for (size_t r = 0; r < n->tp; r++) {
        if (r) /* the model runner's update_states, on this rank's cache */
            for (size_t i = 0; i < meta->n_freed; i++)
                sh_drop(&n->shadow[r], meta->freed[i]);
        kvp_ec_encoder_cache_t c = rank_cache(n, r, cache);
        kvp_status_t st = kvp_ec_worker_start_load_caches(n->w[r], meta, &c);
        if (st != KVP_OK && first == KVP_OK)
            first = st;
    }
    return first;
}

static kvp_status_t tp_start_save(void *ctx, const kvp_ec_meta_t *meta, const kvp_ec_encoder_cache_t *cache)
{
    node_t *n = ctx;
    return kvp_ec_worker_start_save_caches(n->w[0], meta, cache);
}

static kvp_status_t tp_save(void *ctx, const char *hash, const kvp_ec_tensor_t *t)
{
    node_t *n = ctx;
    return kvp_ec_worker_save_caches(n->w[0], hash, t);
}

static kvp_status_t tp_get_finished(void *ctx, const char *const *fin, size_t nf)
{
    node_t *n = ctx;
    kvp_status_t first = KVP_OK;
    for (size_t r = 0; r < n->tp; r++) {
        kvp_status_t st = kvp_ec_worker_get_finished(n->w[r], fin, nf);
        if (st != KVP_OK && first == KVP_OK)
            first = st;
    }
    return first;
}

/* Every rank's metadata, aggregated (loaded intersected, the rest united);
 * a rank that reports None is left out. */
static kvp_status_t tp_build_meta(void *ctx, kvp_ec_worker_meta_t *out, bool *has_p)
{
    node_t *n = ctx;
    memset(out, 0, sizeof *out);
    *has_p = false;
    for (size_t r = 0; r < n->tp; r++) {
        kvp_ec_worker_meta_t m;
        bool has = false;
        memset(&m, 0, sizeof m);
        kvp_status_t st = kvp_ec_worker_build_meta(n->w[r], &m, &has);
        if (st != KVP_OK) {
            kvp_ec_worker_meta_cleanup(&m);
            kvp_ec_worker_meta_cleanup(out);
            *has_p = false;
            return st;
        }
        if (!has)
            continue;
        if (!*has_p) {
            *out = m;
            *has_p = true;
            continue;
        }
        kvp_ec_worker_meta_t agg;
        memset(&agg, 0, sizeof agg);
        st = kvp_ec_worker_meta_aggregate(out, &m, &agg);
        kvp_ec_worker_meta_cleanup(&m);
        kvp_ec_worker_meta_cleanup(out);
        if (st != KVP_OK) {
            *has_p = false;
            return st;
        }
        *out = agg;
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- set-up */

/* commands.h: a base port with base..base+n-1 free on 127.0.0.1 just now
 * (a later bind may still lose a race: the caller retries). */
int kvp_tool_free_ports(size_t nports)
{
    for (int attempt = 0; attempt < 32; attempt++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        socklen_t len = sizeof a;
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &len)) {
            if (fd >= 0)
                close(fd);
            return -1;
        }
        close(fd);
        int base = ntohs(a.sin_port);
        bool ok = base + (int)nports <= 65535;
        for (size_t r = 1; ok && r < nports; r++) {
            int f2 = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in b = a;
            b.sin_port = htons((uint16_t)(base + (int)r));
            ok = f2 >= 0 && bind(f2, (struct sockaddr *)&b, sizeof b) == 0;
            if (f2 >= 0)
                close(f2);
        }
        if (ok)
            return base;
    }
    return -1;
}

typedef struct opts {
    const char *role, *pool_uri, *consumer_zmq, *model;
    uint64_t tp, size, pool_size, push_wait_s, lease_ms, control_timeout_ms, cache_images, seed;
    uint64_t metrics_port; /* UINT64_MAX: none */
    double drop_p;
} opts_t;

static kvp_status_t make_workers(node_t *n, const opts_t *o)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        int base = 0;
        if (n->prefill) {
            base = kvp_tool_free_ports(n->tp);
            if (base < 0)
                return KVP_ERR_IO;
            n->cfg.ec_port = base;
            n->cfg.control_addr = NULL;
            n->cfg.ec_ip = "127.0.0.1";
        }
        char err[256] = "";
        kvp_status_t st = kvp_ec_config_validate(&n->cfg, n->addr_buf, sizeof n->addr_buf, err, sizeof err);
        if (st != KVP_OK) {
            kvp_error("epd-node: bad EC config: %s", err);
            return st;
        }
        size_t r;
        for (r = 0; r < n->tp; r++) {
            kvp_ec_worker_params_t wp;
            kvp_ec_worker_params_init(&wp);
            wp.config = &n->cfg;
            wp.tp_rank = (int64_t)r;
            wp.bind_host = "127.0.0.1";
            wp.lease_ms = (int64_t)o->lease_ms;
            wp.reap_interval_ms = o->lease_ms && o->lease_ms < 4000 ? (int64_t)o->lease_ms / 4 : 0;
            wp.pool = n->pool;
            wp.model = o->model;
            if (!n->prefill) {
                wp.on_push = on_push;
                wp.on_push_ctx = n;
            }
            st = kvp_ec_worker_create(&wp, &n->w[r]);
            if (st != KVP_OK)
                break;
        }
        if (r == n->tp)
            return KVP_OK;
        for (size_t k = 0; k < r; k++) {
            kvp_ec_worker_destroy(n->w[k]);
            n->w[k] = NULL;
        }
        if (st != KVP_ERR_IO || !n->prefill)
            return st; /* only a lost port race is worth another try */
    }
    return KVP_ERR_IO;
}

/* --metrics-port: the workers' kvp_ec_worker_metrics, one rank each. */
static kvp_status_t workers_text(void *ctx, char *buf, size_t cap, size_t *len_p)
{
    node_t *n = ctx;
    return kvp_ec_worker_metrics(n->w, n->tp, buf, cap, len_p);
}

static char *render_metrics(void *arg, size_t *len_p, size_t *cap_p)
{
    return kvp_tool_text(workers_text, arg, len_p, cap_p);
}

static kvp_status_t node_start(node_t *n, const opts_t *o)
{
    kvp_status_t st = kvp__epd_shape((int64_t)o->size, &n->num_embeds, &n->hidden);
    if (st != KVP_OK)
        return st;
    n->size = (int64_t)o->size;
    n->tp = n->prefill ? (size_t)o->tp : 1;
    n->drop_p = o->drop_p;
    n->drop_rng = kvp__mix64(o->seed ^ 0xd509ull);
    for (size_t r = 0; r < MAX_TP; r++) {
        n->shadow[r].n = n;
        kvp__strmap_init(&n->shadow[r].map);
    }
    if ((st = kvp__device_create(&n->dev)) != KVP_OK)
        return st;
    /* A kvpool:// pool that is down (or not up yet) must not keep the node
     * from serving: the cross-encoder cache is an optimisation, so the
     * handle connects lazily (lookups back off while it is unreachable, and
     * it connects once the server answers) unless the URI says otherwise. */
    char uri[1024];
    const char *pool_uri = o->pool_uri;
    if (pool_uri && !strncmp(pool_uri, "kvpool://", 9) && !strstr(pool_uri, "connect=")) {
        int w = snprintf(uri, sizeof uri, "%s%sconnect=lazy", pool_uri, strchr(pool_uri, '?') ? "&" : "?");
        if (w > 0 && (size_t)w < sizeof uri)
            pool_uri = uri;
    }
    if (pool_uri && (st = kvp_pool_open(pool_uri, &n->pool)) != KVP_OK) {
        kvp_error("epd-node: cannot open the pool %s: %s", o->pool_uri, kvp_status_str(st));
        return st;
    }
    kvp_ec_config_init(&n->cfg);
    n->cfg.is_producer = !n->prefill;
    n->cfg.is_consumer = n->prefill;
    n->cfg.cross_encoder_cache = n->pool != NULL;
    n->cfg.control_addr = n->prefill ? NULL : o->consumer_zmq;
    n->cfg.tp_size = (int64_t)n->tp;
    n->cfg.push_wait_timeout_s = (int64_t)o->push_wait_s;
    n->cfg.control_timeout_ms = (int64_t)o->control_timeout_ms;
    n->cfg.pool_size = (int64_t)o->pool_size;
    n->cfg.hidden_dim = n->hidden;
    n->cfg.dtype = KVP_EC_DTYPE_BFLOAT16;
    if ((st = make_workers(n, o)) != KVP_OK) {
        kvp_error("epd-node: the workers did not start: %s", kvp_status_str(st));
        return st;
    }
    if ((st = kvp_ec_zmq_create(n->cfg.control_timeout_ms, 0, &n->zmq)) != KVP_OK)
        return st;
    n->inner = kvp_ec_zmq_inbox(n->zmq);
    kvp_ec_sched_params_t sp;
    kvp_ec_sched_params_init(&sp);
    sp.config = &n->cfg;
    sp.clock = kvp_ec_clock_monotonic();
    sp.control = kvp_ec_zmq_control(n->zmq);
    sp.executor = kvp_ec_zmq_executor(n->zmq);
    kvp_ec_inbox_t wrapped = {wi_shards, wi_drain, wi_close, n};
    sp.inbox = wrapped;
    if ((st = kvp_ec_sched_create(&sp, &n->sched)) != KVP_OK)
        return st;
    kvp__mm_params_t mp;
    memset(&mp, 0, sizeof mp);
    mp.sched = n->sched;
    mp.producer = !n->prefill;
    mp.consumer = n->prefill;
    kvp__mm_worker_t wk = {tp_start_load, tp_start_save, tp_save, tp_get_finished, tp_build_meta, n};
    mp.worker = wk;
    mp.encoder_cache_embeds = (int64_t)o->cache_images * n->num_embeds;
    mp.encoder_budget = mp.encoder_cache_embeds;
    mp.token_budget = 8192 > 4 * (n->num_embeds + KVP__EPD_TEXT_TOKENS) ? 8192 : 4 * (n->num_embeds + 64);
    mp.max_num_seqs = 256;
    mp.hidden = n->hidden;
    mp.dtype = KVP_EC_DTYPE_BFLOAT16;
    mp.encode = encode;
    mp.on_put = on_put;
    mp.on_end = on_end;
    mp.cb_ctx = n;
    if ((st = kvp__mm_create(&mp, &n->mm)) != KVP_OK)
        return st;
    if (n->prefill && (st = kvp_tool_echo_start(&n->echo) == 0 ? KVP_OK : KVP_ERR_IO) != KVP_OK)
        return st;
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, "{");
    jstr(&b, "ev", "ready");
    jstr(&b, "role", n->prefill ? "prefill" : "encoder");
    jint(&b, "pid", (int64_t)getpid());
    jint(&b, "device_nice", kvp__device_nice(n->dev));
    jbool(&b, "device_sched_idle", kvp__device_sched_idle(n->dev));
    if (n->prefill) {
        jstr(&b, "consumer_zmq", kvp_ec_worker_control_addr(n->w[0]));
        jstr(&b, "echo", n->echo.addr);
    }
    if (o->metrics_port != UINT64_MAX) {
        if (kvp__metrics_start("127.0.0.1", (uint16_t)o->metrics_port, render_metrics, n, &n->metrics) != KVP_OK) {
            kvp__jw_cleanup(&b);
            return KVP_ERR_IO;
        }
        char url[64];
        snprintf(url, sizeof url, "http://127.0.0.1:%u/metrics", (unsigned)kvp__metrics_port(n->metrics));
        jstr(&b, "metrics", url);
    }
    kvp__jw_puts(&b, "}\n");
    emit(n, &b);
    kvp__jw_cleanup(&b);
    return KVP_OK;
}

static void node_stop(node_t *n)
{
    kvp__metrics_stop(n->metrics);
    kvp_tool_echo_stop(&n->echo);
    if (n->sched)
        kvp_ec_sched_close(n->sched);
    kvp__mm_destroy(n->mm); /* the encoder cache points into the workers' pools: first */
    kvp__device_destroy(n->dev);
    n->dev = NULL;
    for (size_t r = 0; r < MAX_TP; r++)
        sh_cleanup(&n->shadow[r]);
    for (size_t r = 0; r < n->tp; r++)
        kvp_ec_worker_destroy(n->w[r]);
    kvp_ec_sched_destroy(n->sched);
    kvp_ec_zmq_destroy(n->zmq);
    kvp__free(n->kept, n->cap_kept * sizeof *n->kept);
    if (n->pool)
        kvp_pool_close(n->pool);
    kvp_tool_sampler_destroy(&n->samp); /* after the workers: on_push reports to it */
}

/* ---------------------------------------------------------------- the loop */

static void emit_stats(node_t *n)
{
    kvp_ec_worker_stats_t sum;
    memset(&sum, 0, sizeof sum);
    for (size_t r = 0; r < n->tp; r++) {
        kvp_ec_worker_stats_t s;
        memset(&s, 0, sizeof s);
        s.size = sizeof s;
        kvp_ec_worker_stats(n->w[r], &s);
        sum.reservations_active += s.reservations_active;
        sum.bytes_reserved += s.bytes_reserved;
        sum.reserves += s.reserves;
        sum.reserves_cached += s.reserves_cached;
        sum.cross_cache_hits += s.cross_cache_hits;
        sum.cross_cache_misses += s.cross_cache_misses;
        sum.cross_cache_errors += s.cross_cache_errors;
        sum.cross_cache_skipped += s.cross_cache_skipped;
        sum.takes += s.takes;
        sum.takes_failed += s.takes_failed;
        sum.expired += s.expired;
        sum.events_sent += s.events_sent;
        sum.events_dropped += s.events_dropped;
        sum.push_bytes += s.push_bytes;
        sum.pushes += s.pushes;
        sum.pushes_failed += s.pushes_failed;
        sum.bytes_pushed += s.bytes_pushed;
        sum.cross_cache_puts += s.cross_cache_puts;
        sum.pushes_pending += s.pushes_pending;
        sum.reserve_busy_ns += s.reserve_busy_ns;
        sum.reserve_cpu_ns += s.reserve_cpu_ns;
        sum.reserve_requests += s.reserve_requests;
        sum.stage_copies += s.stage_copies;
        sum.stage_fallbacks += s.stage_fallbacks;
    }
    kvp__mm_stats_t ms;
    kvp__mm_stats(n->mm, &ms);
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__jw_puts(&b, "{");
    jstr(&b, "ev", "stats");
    jint(&b, "reservations_active", (int64_t)sum.reservations_active);
    jint(&b, "bytes_reserved", (int64_t)sum.bytes_reserved);
    jint(&b, "reserves", (int64_t)sum.reserves);
    jint(&b, "reserves_cached", (int64_t)sum.reserves_cached);
    jint(&b, "reserve_busy_ns", (int64_t)sum.reserve_busy_ns);
    jint(&b, "reserve_cpu_ns", (int64_t)sum.reserve_cpu_ns);
    jint(&b, "reserve_requests", (int64_t)sum.reserve_requests);
    jint(&b, "cross_cache_hits", (int64_t)sum.cross_cache_hits);
    jint(&b, "cross_cache_misses", (int64_t)sum.cross_cache_misses);
    jint(&b, "cross_cache_errors", (int64_t)sum.cross_cache_errors);
    jint(&b, "cross_cache_skipped", (int64_t)sum.cross_cache_skipped);
    jint(&b, "takes", (int64_t)sum.takes);
    jint(&b, "takes_failed", (int64_t)sum.takes_failed);
    jint(&b, "expired", (int64_t)sum.expired);
    jint(&b, "push_bytes_received", (int64_t)sum.push_bytes);
    jint(&b, "pushes", (int64_t)sum.pushes);
    jint(&b, "pushes_failed", (int64_t)sum.pushes_failed);
    jint(&b, "pushes_pending", (int64_t)sum.pushes_pending);
    jint(&b, "cross_cache_puts", (int64_t)sum.cross_cache_puts);
    jint(&b, "stage_copies", (int64_t)sum.stage_copies);
    jint(&b, "stage_fallbacks", (int64_t)sum.stage_fallbacks);
    jint(&b, "taken", (int64_t)n->taken);
    jint(&b, "verified", (int64_t)n->verified);
    jint(&b, "puts", (int64_t)n->puts);
    jint(&b, "events", (int64_t)n->events);
    jint(&b, "events_dropped", (int64_t)n->events_dropped);
    jint(&b, "done", (int64_t)ms.done);
    jint(&b, "retryable", (int64_t)ms.retryable);
    jint(&b, "failed", (int64_t)ms.failed);
    jint(&b, "gather_misses", (int64_t)ms.gather_misses);
    jint(&b, "hook_errors", (int64_t)ms.hook_errors);
    jint(&b, "encoded", (int64_t)ms.encoded);
    jint(&b, "steps", (int64_t)ms.steps);
    jint(&b, "unfinished", (int64_t)kvp__mm_unfinished(n->mm));
    kvp__jw_puts(&b, "}\n");
    emit(n, &b);
    kvp__jw_cleanup(&b);
}

/* One line from the replay; false: quit. */
static bool handle_line(node_t *n, kvp__json_parser_t *jp, const char *line, size_t len, bool *quit)
{
    const kvp__json_t *root;
    char op[16], err[160];
    if (kvp__json_parse(jp, line, len, &root) != KVP_OK || !kvp__epd_json_str(root, "op", op, sizeof op)) {
        emit_error(n, "not a JSON object with an op");
        return true;
    }
    if (!strcmp(op, "quit")) {
        *quit = true;
    } else if (!strcmp(op, "stats")) {
        emit_stats(n);
    } else if (!strcmp(op, "rtt")) {
        char addr[128];
        int64_t bytes, count;
        if (!kvp__epd_json_str(root, "addr", addr, sizeof addr) || !kvp__epd_json_int(root, "bytes", &bytes) ||
            !kvp__epd_json_int(root, "count", &count) || bytes < 1 || bytes > 60000 || count < 1 ||
            count > 100000) {
            emit_error(n, "rtt: addr, bytes (1..60000), count (1..100000)");
            return true;
        }
        size_t rb = kvp_tool_sampler_reply_bytes(&n->samp);
        uint64_t p50 = kvp_tool_ping_p50(addr, (size_t)bytes, rb, (size_t)count);
        kvp__jw_t b;
        kvp__jw_init(&b);
        kvp__jw_puts(&b, "{");
        jstr(&b, "ev", "rtt");
        jint(&b, "p50_ns", (int64_t)p50);
        jint(&b, "reply_bytes", (int64_t)(rb ? rb : (size_t)bytes));
        kvp__jw_puts(&b, "}\n");
        emit(n, &b);
        kvp__jw_cleanup(&b);
    } else if (!strcmp(op, "rtt_start")) {
        char addr[128];
        int64_t bytes, iv;
        if (!kvp__epd_json_str(root, "addr", addr, sizeof addr) || !kvp__epd_json_int(root, "bytes", &bytes) ||
            !kvp__epd_json_int(root, "interval_us", &iv) || bytes < 1 || bytes > 60000 || iv < 0 || iv > 1000000 ||
            kvp_tool_sampler_start(&n->samp, addr, (size_t)bytes, (uint64_t)iv) != 0) {
            emit_error(n, "rtt_start: addr, bytes (1..60000), interval_us (0..1000000), once");
            return true;
        }
    } else if (!strcmp(op, "rtt_stop")) {
        kvp_tool_sampler_result_t sr;
        kvp_tool_sampler_stop(&n->samp, &sr);
        kvp__jw_t b;
        kvp__jw_init(&b);
        kvp__jw_puts(&b, "{");
        jstr(&b, "ev", "rtt_loaded");
        jint(&b, "p50_ns", (int64_t)sr.p50_ns);
        jint(&b, "count", (int64_t)sr.count);
        jint(&b, "paired_p50_ns", (int64_t)sr.paired_p50_ns);
        jint(&b, "paired_count", (int64_t)sr.paired_count);
        jint(&b, "reply_bytes", (int64_t)kvp_tool_sampler_reply_bytes(&n->samp));
        kvp__jw_puts(&b, "}\n");
        emit(n, &b);
        kvp__jw_cleanup(&b);
    } else if (!strcmp(op, "req")) {
        kvp__epd_msg_req_t r;
        if (kvp__epd_msg_req_read(root, &r, err, sizeof err) != KVP_OK) {
            emit_error(n, err);
            return true;
        }
        kvp_ec_feature_t f[KVP__EPD_MAX_IMAGES];
        kvp_ec_item_t it[KVP__EPD_MAX_IMAGES];
        for (size_t i = 0; i < r.n; i++) {
            f[i] = (kvp_ec_feature_t){r.mm_hash[i], "image", r.offset[i], r.length[i], r.num_embeds[i]};
            it[i] = (kvp_ec_item_t){r.mm_hash[i], r.transfer_id[i]};
        }
        kvp_ec_transfer_params_t params = {r.consumer_zmq, it, r.n};
        kvp__mm_req_t mr = {r.id, r.prompt_len, f, r.n, &params};
        kvp_status_t st = kvp__mm_add(n->mm, &mr);
        if (st != KVP_OK) {
            snprintf(err, sizeof err, "req %s refused: %s", r.id, kvp_status_str(st));
            emit_error(n, err);
            on_end(n, r.id, KVP__MM_FAILED);
        }
    } else {
        emit_error(n, "unknown op");
    }
    return true;
}

static int node_loop(node_t *n)
{
    kvp__json_parser_t jp;
    kvp__json_parser_init(&jp);
    size_t cap = 1 << 16, len = 0;
    char *buf = kvp__malloc(cap);
    bool quit = false, eof = false;
    uint64_t idle0 = 0;
    int rc = 0;
    if (!buf)
        return 1;
    while (!(quit || eof) || kvp__mm_busy(n->mm)) {
        kvp__mm_stats_t ms;
        kvp__mm_stats(n->mm, &ms);
        bool idle = ms.idle_steps != idle0; /* the last step scheduled nothing */
        idle0 = ms.idle_steps;
        int timeout = kvp__mm_busy(n->mm) ? (idle ? 1 : 0) : 20;
        struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
        if (!eof && poll(&pfd, 1, timeout) > 0) {
            if (len + 4096 > cap) {
                char *nb = kvp__realloc(buf, cap, cap * 2);
                if (!nb) {
                    rc = 1;
                    break;
                }
                buf = nb, cap *= 2;
            }
            ssize_t k = read(STDIN_FILENO, buf + len, cap - len);
            if (k <= 0 && !(k < 0 && errno == EINTR))
                eof = true; /* the replay is gone: finish and leave */
            else if (k > 0)
                len += (size_t)k;
            size_t start = 0;
            for (size_t i = 0; i < len; i++)
                if (buf[i] == '\n') {
                    handle_line(n, &jp, buf + start, i - start, &quit);
                    start = i + 1;
                }
            memmove(buf, buf + start, len - start);
            len -= start;
        } else if (eof && timeout) {
            usleep((useconds_t)timeout * 1000);
        }
        if (kvp__mm_busy(n->mm)) {
            kvp_status_t st = kvp__mm_step(n->mm);
            if (st != KVP_OK) {
                kvp_error("epd-node: step failed: %s", kvp_status_str(st));
                rc = 1;
                break;
            }
        }
    }
    emit_stats(n);
    kvp__free(buf, cap);
    kvp__json_parser_cleanup(&jp);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvpool epd-node --role encoder|prefill --size BYTES [--pool URI] [--consumer-zmq ADDR]\n"
               "         [--consumer-tp N] [--pool-size BYTES] [--push-wait-s S] [--lease-ms MS]\n"
               "         [--control-timeout-ms MS] [--cache-images N] [--drop-events P] [--seed N]\n"
               "         [--metrics-port P]  (the workers' figures as Prometheus text on 127.0.0.1:P,\n"
               "         0 = any free port; its URL in the ready line)\n"
               "  started by `kvpool replay --epd` (JSON lines on stdin/stdout); not for direct use\n");
}

int kvp_cmd_epd_node(int argc, char **argv)
{
    opts_t o = {0};
    o.tp = 1;
    o.size = 4 << 20;
    o.pool_size = 256u << 20;
    o.push_wait_s = 60;
    o.control_timeout_ms = 5000;
    o.cache_images = 16;
    o.model = "epd-model";
    o.seed = 1;
    o.metrics_port = UINT64_MAX;
    for (int i = 1; i < argc; i += 2) { /* --option value */
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--role"))
            o.role = v;
        else if (!strcmp(a, "--pool"))
            o.pool_uri = v;
        else if (!strcmp(a, "--consumer-zmq"))
            o.consumer_zmq = v;
        else if (!strcmp(a, "--consumer-tp"))
            ok = kvp__parse_u64(v, 1, MAX_TP, &o.tp) == KVP_OK;
        else if (!strcmp(a, "--size"))
            ok = kvp__parse_size(v, &o.size) == KVP_OK;
        else if (!strcmp(a, "--pool-size"))
            ok = kvp__parse_size(v, &o.pool_size) == KVP_OK;
        else if (!strcmp(a, "--push-wait-s"))
            ok = kvp__parse_u64(v, 0, 3600, &o.push_wait_s) == KVP_OK;
        else if (!strcmp(a, "--lease-ms"))
            ok = kvp__parse_u64(v, 100, 3600000, &o.lease_ms) == KVP_OK;
        else if (!strcmp(a, "--control-timeout-ms"))
            ok = kvp__parse_u64(v, 1, 600000, &o.control_timeout_ms) == KVP_OK;
        else if (!strcmp(a, "--cache-images"))
            ok = kvp__parse_u64(v, 1, 1 << 20, &o.cache_images) == KVP_OK;
        else if (!strcmp(a, "--seed"))
            ok = kvp__parse_u64(v, 0, UINT64_MAX, &o.seed) == KVP_OK;
        else if (!strcmp(a, "--metrics-port"))
            ok = kvp__parse_u64(v, 0, 65535, &o.metrics_port) == KVP_OK;
        else if (!strcmp(a, "--drop-events")) {
            char *end;
            o.drop_p = v ? strtod(v, &end) : -1;
            ok = v && !*end && o.drop_p >= 0 && o.drop_p <= 1;
        } else {
            fprintf(stderr, "kvpool epd-node: unknown option %s\n", a);
            usage(stderr);
            return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvpool epd-node: bad value for %s\n", a);
            return 2;
        }
    }
    if (!o.role || (strcmp(o.role, "encoder") && strcmp(o.role, "prefill")) ||
        (!strcmp(o.role, "encoder") && !o.consumer_zmq)) {
        usage(stderr);
        return 2;
    }
    static node_t n; /* big; one per process */
    memset(&n, 0, sizeof n);
    pthread_mutex_init(&n.out_mu, NULL);
    kvp_tool_sampler_init(&n.samp);
    n.prefill = !strcmp(o.role, "prefill");
    kvp__thread_name(n.prefill ? "kvp-prefill" : "kvp-encoder");
    kvp_status_t st = node_start(&n, &o);
    int rc;
    if (st != KVP_OK) {
        char msg[160];
        snprintf(msg, sizeof msg, "start failed: %s", kvp_status_str(st));
        emit_error(&n, msg);
        rc = 1;
    } else {
        rc = node_loop(&n);
    }
    node_stop(&n);
    return rc;
}
