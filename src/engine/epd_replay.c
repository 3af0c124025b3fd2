/*
 * `kvpool replay --epd`: the proxy of an encoder -> prefill deployment
 * (epd.h).  It starts (engine/child.h: fork + exec of /proc/self/exe) a `kvpool server` for
 * the cross-encoder cache unless --pool is given, the prefill node, then
 * the encoder node (which needs the prefill node's control address), and
 * talks to both over pipes, one JSON line per message; every line a node
 * writes is parsed and checked, and one that does not parse or names no
 * known event counts as a failure.
 *
 * The flow.  At most `window` requests are in flight (sent, not yet ended
 * on the prefill node); each goes to the encoder node and then, unchanged,
 * to the prefill node.  The workload puts every reuse of an image at least
 * repeat_gap >= window requests after its first use, so the first use has
 * ended (its output taken) before the reuse is sent: a reuse is then a
 * cached reserve at the consumer (its receive pool's resident, or the
 * cross-encoder cache) and every push that moves bytes is taken.  Before
 * the first request the encoder measures bare ZeroMQ REQ/REP round trips to
 * the prefill node's echo socket with frames of a reserve's size, and then
 * samples one every millisecond, on a thread of its own, until the last
 * request has ended.  When all
 * have ended the replay waits until the consumer holds no reservation (or
 * says how many it still holds), asks both nodes to quit, and reports.
 *
 * The figures (the report's definitions, README "Encoder -> prefill replay"):
 *   pushes        push records with status OK (cached ones included)
 *   bytes_pushed  sum of nbytes x shards written, over push records
 *   bytes_taken   bytes the prefill ranks put into their encoder caches
 *   bytes_verified  those equal to the deterministic encoder output
 *   push_gbps     bytes_pushed / the time during which some write was in
 *                 flight (the union of the written pushes' [write start,
 *                 write done] intervals: pushes that overlap share the
 *                 link, so summing their durations would count the shared
 *                 time once per push), 1 GB = 1e9 B
 *   push_p50/p99  reserve sent (producer) -> the last shard's readiness
 *                 event received by the consumer scheduler's inbox, over
 *                 written pushes (CLOCK_MONOTONIC in both processes)
 *   reserve_p50   reserve sent -> answered, over reserves that write;
 *                 reserve_cached_p50: over those answered cached (the
 *                 consumer held the image, or got it from the pool)
 *   reserve_asked_p50  reserve asked (start_save queued it) -> answered,
 *                 over reserves that write: the round trip plus the wait
 *                 for one of the producer's control threads
 *   zmq_rtt       the bare round trip's p50 over the samples paired with
 *                 the writing reserves (for each, the sample that started
 *                 nearest it): the reserves' own moments (on this 2-core VM
 *                 the workload saturates the CPU, the reserves come at its
 *                 busiest, and a round trip is six thread wake-ups: each
 *                 side's caller and its ZeroMQ I/O thread, both ways);
 *                 zmq_rtt_loaded: over all the samples taken while the
 *                 workload ran; zmq_rtt_idle: with the nodes idle after
 *                 it (before it when the encoder died).  Frames of a
 *                 reserve's size both ways: the first image's reserve
 *                 request (zmq_rtt_request_bytes) and, once a reserve was
 *                 answered, the largest writing reserve's reply
 *                 (zmq_rtt_reply_bytes, zmq_rtt_idle_reply_bytes;
 *                 reserve_reply_bytes: what the reserves got); until then
 *                 the request's own size
 *   reserve_service  the consumers' control servers' time per reserve
 *                 request, received -> replied (a parked one without its
 *                 wait for the cross-encoder cache), mean over all
 *                 reserves; _cpu: the server thread's CPU time in it
 *   workload_s    the proxy's loop: first request sent -> last one ended
 *   *_cpu_s, encoder_faults  each process's CPU time (user + system) and
 *                 the encoder's page faults (minor + major) during the
 *                 workload, from /proc/<pid>/stat
 *   device_nice   the nice value of the nodes' stand-ins for the GPU
 *                 (engine/device.h: the encoding and the byte checks run
 *                 there, taking the CPU the serving threads leave over);
 *                 device_sched_idle: both run under SCHED_IDLE
 *   failures      requests failed for good or never ended, outputs used
 *                 before they were in the cache, lines the nodes wrote that
 *                 were not understood, a node that died uninvited
 *   retryable_errors  requests the prefill node failed with a retryable
 *                 error (take_unavailable_requests)
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/json.h"
#include "common/log.h"
#include "common/strmap.h"
#include "engine/child.h"
#include "engine/epd.h"
#include "engine/memcpy_baseline.h"
#include "engine/proc_usage.h"

/* Round trips paired with writing reserves needed for them to be the
 * baseline (cmd_epd_node.c: the sample that started nearest each one). */
#define RTT_PAIRED_MIN 20

void kvp__epd_replay_params_init(kvp__epd_replay_params_t *p)
{
    memset(p, 0, sizeof *p);
    kvp__epd_wl_params_init(&p->wl);
    p->consumer_tp = 1;
    p->window = 8;
    p->push_wait_s = 60;
    p->cache_images = 16;
    p->timeout_s = 280;
}

kvp_status_t kvp__epd_faults_parse(const char *spec, kvp__epd_replay_params_t *p)
{
    char buf[256];
    if (!spec || strlen(spec) >= sizeof buf)
        return KVP_ERR_BAD_OPTION;
    strcpy(buf, spec);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *at = strchr(tok, '@'), *end;
        if (!at)
            return KVP_ERR_BAD_OPTION;
        *at++ = 0;
        errno = 0;
        if (!strcmp(tok, "kill-encoder") || !strcmp(tok, "kill-pool")) {
            unsigned long long n = strtoull(at, &end, 10);
            if (errno || *end || !*at || n < 1 || at[0] == '-')
                return KVP_ERR_BAD_OPTION;
            *(tok[5] == 'e' ? &p->kill_encoder_after : &p->kill_pool_after) = n;
        } else if (!strcmp(tok, "drop-events")) {
            double x = strtod(at, &end);
            if (errno || *end || !*at || !(x > 0 && x <= 1))
                return KVP_ERR_BAD_OPTION;
            p->drop_events = x;
        } else {
            return KVP_ERR_BAD_OPTION;
        }
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- the run */

typedef struct xfer {
    char tid[96];
    uint64_t reserve_asked, reserve_sent, reserve_done, write_start, write_done, event_ns;
    int64_t nbytes, written;
    bool pushed, cached;
} xfer_t;

typedef struct stats_line {
    bool have;
    int64_t cross_cache_misses, cross_cache_errors, cross_cache_skipped;
    int64_t reservations_active, bytes_reserved, cross_cache_hits, taken, verified, done, retryable, failed;
    int64_t gather_misses, hook_errors, events_dropped, reserves_cached, pushes_failed, encoded, unfinished;
    int64_t reserve_busy_ns, reserve_cpu_ns, reserve_requests; /* the control servers' serving of reserves */
    int64_t stage_copies, stage_fallbacks; /* the producer's copies of encoder outputs, and those on the heap */
} stats_line_t;

typedef struct run {
    const kvp__epd_replay_params_t *p;
    kvp__epd_workload_t w;
    kvp__child_t server, prefill, encoder;
    char pool_uri[128], consumer_zmq[128], echo[128];
    kvp__strmap_t xfers;       /* tid -> xfer */
    kvp__json_parser_t jp;
    uint32_t next, inflight, sent, ended, done, retryable, failed_reqs;
    uint64_t encoder_not_done, push_records, push_ok, push_failed, bytes_pushed, protocol_errors, via_ucx, via_tcp;
    bool killed_pool;
    bool encoder_dead, killed_encoder, prefill_ready, encoder_ready, rtt_done, rtt_loaded_done;
    int64_t device_nice[2]; /* the nodes' GPU stand-ins (device.h): prefill, encoder */
    bool device_idle[2];    /* ... under SCHED_IDLE */
    double rtt_p50_us;        /* the baseline: rtt_paired, else rtt_all, else rtt_idle */
    double rtt_all_p50_us;    /* sampled all through the workload */
    double rtt_paired_p50_us; /* the sample nearest each writing reserve in time */
    double rtt_idle_p50_us;   /* the nodes idle: after it (before it, if the encoder died) */
    int64_t rtt_idle_reply_bytes; /* the size of its replies */
    int64_t rtt_loaded_count, rtt_paired_count;
    int64_t rtt_reply_bytes;  /* the echo's replies: a reserve reply's size (0: the request's) */
    int64_t reserve_reply_bytes; /* the writing reserves' largest reply */
    uint64_t work_ns;         /* the proxy's loop: first request sent -> the last ended */
    kvp__proc_usage_t use[3];           /* the server's, the prefill node's, the encoder node's CPU in the workload */
    stats_line_t pf, enc;      /* the last stats lines */
    bool waiting_stats;
} run_t;

static xfer_t *xfer_get(run_t *r, const char *tid)
{
    xfer_t *x = kvp__strmap_gets(&r->xfers, tid);
    if (x || strlen(tid) >= sizeof x->tid)
        return x;
    x = kvp__calloc(1, sizeof *x);
    if (!x)
        return NULL;
    strcpy(x->tid, tid);
    if (kvp__strmap_put(&r->xfers, x->tid, strlen(x->tid), x) != KVP_OK) {
        kvp__free(x, sizeof *x);
        return NULL;
    }
    return x;
}

static void bad_line(run_t *r, kvp__child_t *c, const char *why, const char *line, size_t len)
{
    r->protocol_errors++;
    kvp_warn_rl("replay --epd: %s wrote a line it should not (%s): %.*s", c->name, why, (int)(len > 200 ? 200 : len),
                line);
}

static int64_t jint0(const kvp__json_t *o, const char *k)
{
    int64_t v = 0;
    kvp__epd_json_int(o, k, &v);
    return v;
}

static void read_stats(const kvp__json_t *o, stats_line_t *s)
{
    s->have = true;
    s->reservations_active = jint0(o, "reservations_active");
    s->bytes_reserved = jint0(o, "bytes_reserved");
    s->cross_cache_hits = jint0(o, "cross_cache_hits");
    s->cross_cache_misses = jint0(o, "cross_cache_misses");
    s->cross_cache_errors = jint0(o, "cross_cache_errors");
    s->cross_cache_skipped = jint0(o, "cross_cache_skipped");
    s->taken = jint0(o, "taken");
    s->verified = jint0(o, "verified");
    s->done = jint0(o, "done");
    s->retryable = jint0(o, "retryable");
    s->failed = jint0(o, "failed");
    s->gather_misses = jint0(o, "gather_misses");
    s->hook_errors = jint0(o, "hook_errors");
    s->events_dropped = jint0(o, "events_dropped");
    s->reserves_cached = jint0(o, "reserves_cached");
    s->pushes_failed = jint0(o, "pushes_failed");
    s->encoded = jint0(o, "encoded");
    s->unfinished = jint0(o, "unfinished");
    s->reserve_busy_ns = jint0(o, "reserve_busy_ns");
    s->reserve_cpu_ns = jint0(o, "reserve_cpu_ns");
    s->reserve_requests = jint0(o, "reserve_requests");
    s->stage_copies = jint0(o, "stage_copies");
    s->stage_fallbacks = jint0(o, "stage_fallbacks");
}

static void handle(run_t *r, kvp__child_t *c, const char *line, size_t len)
{
    const kvp__json_t *o;
    char ev[16], s[128];
    if (kvp__json_parse(&r->jp, line, len, &o) != KVP_OK || !kvp__epd_json_str(o, "ev", ev, sizeof ev)) {
        bad_line(r, c, "not a JSON object with an ev", line, len);
        return;
    }
    bool prefill = c == &r->prefill;
    if (!strcmp(ev, "ready")) {
        int64_t nice;
        bool idle;
        if (!kvp__epd_json_int(o, "device_nice", &nice) || nice < -20 || nice > 19 ||
            !kvp__epd_json_bool(o, "device_sched_idle", &idle))
            return bad_line(r, c, "ready without device_nice in -20..19 and device_sched_idle", line, len);
        r->device_nice[prefill ? 0 : 1] = nice;
        r->device_idle[prefill ? 0 : 1] = idle;
        if (prefill) {
            if (!kvp__epd_json_str(o, "consumer_zmq", r->consumer_zmq, sizeof r->consumer_zmq) ||
                !kvp__epd_json_str(o, "echo", r->echo, sizeof r->echo))
                return bad_line(r, c, "ready without consumer_zmq and echo", line, len);
            r->prefill_ready = true;
        } else {
            r->encoder_ready = true;
        }
    } else if (!strcmp(ev, "end") && prefill) {
        if (!kvp__epd_json_str(o, "id", s, sizeof s) || !kvp__epd_json_str(o, "outcome", ev, sizeof ev))
            return bad_line(r, c, "end without id and outcome", line, len);
        r->ended++;
        if (r->inflight)
            r->inflight--;
        if (!strcmp(ev, "done"))
            r->done++;
        else if (!strcmp(ev, "retryable"))
            r->retryable++;
        else
            r->failed_reqs++;
    } else if (!strcmp(ev, "end")) {
        /* the encoder instance's request ended: counted on the prefill side */
        if (kvp__epd_json_str(o, "outcome", ev, sizeof ev) && strcmp(ev, "done") && kvp__epd_json_str(o, "id", s, sizeof s))
            kvp_warn_rl("replay --epd: the encoder node ended %s: %s", s, ev);
        r->encoder_not_done += strcmp(ev, "done") != 0;
    } else if (!strcmp(ev, "push") && !prefill) {
        int64_t nb, wr, st, t[5];
        bool cached;
        if (!kvp__epd_json_str(o, "tid", s, sizeof s) || !kvp__epd_json_int(o, "nbytes", &nb) ||
            !kvp__epd_json_int(o, "written", &wr) || !kvp__epd_json_int(o, "status", &st) ||
            !kvp__epd_json_bool(o, "cached", &cached) || !kvp__epd_json_int(o, "reserve_sent_ns", &t[0]) ||
            !kvp__epd_json_int(o, "reserve_done_ns", &t[1]) || !kvp__epd_json_int(o, "write_start_ns", &t[2]) ||
            !kvp__epd_json_int(o, "write_done_ns", &t[3]) || !kvp__epd_json_int(o, "reserve_asked_ns", &t[4]) ||
            nb < 0 || wr < 0 || (t[0] && t[4] > t[0]))
            return bad_line(r, c, "push without its fields", line, len);
        r->push_records++;
        if (st != KVP_OK) {
            r->push_failed++;
            kvp_warn("replay --epd: the push of %s failed after %" PRId64 " of %" PRId64 " shards written: %s", s, wr,
                     jint0(o, "shards"), kvp_status_str((kvp_status_t)st));
            return;
        }
        r->push_ok++;
        char path[8] = "";
        kvp__epd_json_str(o, "path", path, sizeof path);
        r->via_ucx += !strcmp(path, "ucx");
        r->via_tcp += !strcmp(path, "tcp");
        r->bytes_pushed += (uint64_t)nb * (uint64_t)wr;
        int64_t rb = jint0(o, "reserve_reply_bytes");
        if (wr > 0 && rb > r->reserve_reply_bytes)
            r->reserve_reply_bytes = rb;
        xfer_t *x = xfer_get(r, s);
        if (x) {
            x->pushed = true;
            x->cached = cached;
            x->nbytes = nb;
            x->written = wr;
            x->reserve_sent = (uint64_t)t[0];
            x->reserve_done = (uint64_t)t[1];
            x->reserve_asked = (uint64_t)t[4];
            x->write_start = (uint64_t)t[2];
            x->write_done = (uint64_t)t[3];
        }
    } else if (!strcmp(ev, "event") && prefill) {
        int64_t t;
        if (!kvp__epd_json_str(o, "tid", s, sizeof s) || !kvp__epd_json_int(o, "t_ns", &t))
            return bad_line(r, c, "event without tid and t_ns", line, len);
        xfer_t *x = xfer_get(r, s);
        if (x && (uint64_t)t > x->event_ns)
            x->event_ns = (uint64_t)t; /* the last shard's event is the one that counts */
    } else if (!strcmp(ev, "rtt") && !prefill) {
        int64_t ns, rb;
        if (!kvp__epd_json_int(o, "p50_ns", &ns) || !kvp__epd_json_int(o, "reply_bytes", &rb) || ns < 0 || rb < 0)
            return bad_line(r, c, "rtt without p50_ns and reply_bytes >= 0", line, len);
        r->rtt_idle_p50_us = (double)ns / 1e3;
        r->rtt_idle_reply_bytes = rb;
        r->rtt_done = true;
    } else if (!strcmp(ev, "rtt_loaded") && !prefill) {
        int64_t ns, cnt, bns, bcnt, rb;
        if (!kvp__epd_json_int(o, "p50_ns", &ns) || !kvp__epd_json_int(o, "count", &cnt) ||
            !kvp__epd_json_int(o, "paired_p50_ns", &bns) || !kvp__epd_json_int(o, "paired_count", &bcnt) ||
            !kvp__epd_json_int(o, "reply_bytes", &rb) || ns < 0 || cnt < 0 || bns < 0 || bcnt < 0 || rb < 0)
            return bad_line(r, c, "rtt_loaded without p50_ns, count, paired_p50_ns, paired_count and reply_bytes >= 0",
                            line, len);
        r->rtt_reply_bytes = rb;
        r->rtt_all_p50_us = (double)ns / 1e3;
        r->rtt_loaded_count = cnt;
        r->rtt_paired_p50_us = (double)bns / 1e3;
        r->rtt_paired_count = bcnt;
        r->rtt_loaded_done = true;
    } else if (!strcmp(ev, "stats")) {
        read_stats(o, prefill ? &r->pf : &r->enc);
        if (prefill)
            r->waiting_stats = false;
    } else if (!strcmp(ev, "error")) {
        kvp__epd_json_str(o, "msg", s, sizeof s);
        bad_line(r, c, "an error", line, len);
    } else {
        bad_line(r, c, "an unknown event", line, len);
    }
}

/* Reads what c wrote; handles every whole line. */
static void on_line(void *ctx, kvp__child_t *c, const char *line, size_t len) { handle(ctx, c, line, len); }

static void child_read(run_t *r, kvp__child_t *c)
{
    if (kvp__child_read_lines(c, on_line, r) == KVP_ERR_PROTOCOL)
        bad_line(r, c, "a line over 32 MiB", "", 0);
}

/* Polls both nodes for up to ms and handles what they wrote. */
static void pump(run_t *r, int ms)
{
    struct pollfd pf[2];
    kvp__child_t *cs[2];
    nfds_t n = 0;
    kvp__child_t *all[2] = {&r->prefill, &r->encoder};
    for (int i = 0; i < 2; i++)
        if (all[i]->out_fd >= 0 && !all[i]->eof) {
            pf[n] = (struct pollfd){all[i]->out_fd, POLLIN, 0};
            cs[n++] = all[i];
        }
    if (!n) {
        usleep((useconds_t)ms * 1000);
        return;
    }
    if (poll(pf, n, ms) <= 0)
        return;
    for (nfds_t i = 0; i < n; i++)
        if (pf[i].revents)
            child_read(r, cs[i]);
}

static void send_req(run_t *r)
{
    const kvp__epd_req_t *q = &r->w.reqs[r->next++];
    kvp__epd_msg_req_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.id, sizeof m.id, "%s", q->id);
    m.prompt_len = q->prompt_len;
    m.n = q->n_images;
    snprintf(m.consumer_zmq, sizeof m.consumer_zmq, "%s", r->consumer_zmq);
    for (size_t k = 0; k < m.n; k++) {
        snprintf(m.mm_hash[k], sizeof m.mm_hash[k], "%s", r->w.hashes[q->image[k]]);
        kvp__epd_transfer_id(m.transfer_id[k], sizeof m.transfer_id[k], q->id, k);
        m.offset[k] = q->offset[k];
        m.length[k] = m.num_embeds[k] = r->w.num_embeds;
    }
    kvp__jw_t b;
    kvp__jw_init(&b);
    kvp__epd_msg_req_write(&b, &m);
    if (!b.oom) {
        if (!r->encoder_dead && !kvp__child_send(&r->encoder, b.p, b.len))
            r->encoder_dead = true;
        if (!kvp__child_send(&r->prefill, b.p, b.len))
            r->protocol_errors++;
    }
    kvp__jw_cleanup(&b);
    r->sent++;
    r->inflight++;
}

/* ---------------------------------------------------------------- baselines */

/* ---------------------------------------------------------------- report */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double pct_us(uint64_t *v, size_t n, double q)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_u64);
    size_t i = (size_t)ceil(q * (double)n) - 1;
    return (double)v[i > n - 1 ? n - 1 : i] / 1e3;
}

static void jnum(kvp__jw_t *b, const char *k, double v, bool is_int)
{
    char num[64];
    if (is_int)
        snprintf(num, sizeof num, "%.0f", v);
    else
        snprintf(num, sizeof num, "%.3f", isfinite(v) ? v : 0.0);
    kvp__jw_puts(b, b->len > 1 ? ",\"" : "\"");
    kvp__jw_puts(b, k);
    kvp__jw_puts(b, "\":");
    kvp__jw_puts(b, num);
}

typedef struct {
    uint64_t a, b;
} span_t;

static int cmp_span(const void *x, const void *y)
{
    const span_t *p = x, *q = y;
    return p->a < q->a ? -1 : p->a > q->a;
}

/* The length of the union of n intervals (sorts them). */
static uint64_t union_ns(span_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_span);
    uint64_t total = 0, a = 0, b = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || v[i].a > b) {
            total += b - a;
            a = v[i].a;
            b = v[i].b;
        } else if (v[i].b > b) {
            b = v[i].b;
        }
    }
    return n ? total + (b - a) : 0;
}

static double ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

/* The size of a reserve request for the first image (the frame the
 * round-trip baseline sends). */
static size_t reserve_frame_bytes(const run_t *r)
{
    char f[512];
    int n = snprintf(f, sizeof f,
                     "{\"op\":\"reserve\",\"transfer_id\":\"%s#0\",\"mm_hash\":\"%s\",\"nbytes\":%" PRId64
                     ",\"shape\":[%" PRId64 ",%" PRId64 "],\"dtype\":\"bfloat16\"}",
                     r->w.reqs[0].id, r->w.hashes[0], r->p->wl.size, r->w.num_embeds, r->w.hidden);
    return n > 0 ? (size_t)n : 128;
}

/* The bare round trip with the nodes idle: 2,000 of them, frames of a
 * reserve request's size, replies of what the encoder node's sampler saw
 * a writing reserve get (the request's size before any). */
static void idle_rtt(run_t *r, uint64_t deadline)
{
    char line[256];
    int n = snprintf(line, sizeof line, "{\"op\":\"rtt\",\"addr\":\"%s\",\"bytes\":%zu,\"count\":2000}\n", r->echo,
                     reserve_frame_bytes(r));
    r->rtt_done = false;
    kvp__child_send(&r->encoder, line, (size_t)n);
    while (!r->rtt_done && !r->encoder.eof && kvp__now_ns() < deadline)
        pump(r, 20);
}

static int report(run_t *r, double mc, double wall_s)
{
    size_t n = r->xfers.n, nlat = 0, nres = 0, ncres = 0, nask = 0;
    uint64_t *lat = kvp__calloc(n ? n : 1, sizeof *lat), *res = kvp__calloc(n ? n : 1, sizeof *res);
    uint64_t *ask = kvp__calloc(n ? n : 1, sizeof *ask);
    uint64_t *cres = kvp__calloc(n ? n : 1, sizeof *cres), *wr = kvp__calloc(n ? n : 1, sizeof *wr);
    span_t *spans = kvp__calloc(n ? n : 1, sizeof *spans);
    size_t nwr = 0;
    uint64_t write_ns = 0, written_bytes = 0, no_event = 0;
    for (size_t i = 0; lat && res && ask && cres && wr && spans && i < r->xfers.cap; i++) {
        const xfer_t *x = r->xfers.slots[i].val;
        if (!r->xfers.slots[i].key || !x->pushed)
            continue;
        if (x->written > 0) {
            spans[nwr].a = x->write_start;
            spans[nwr].b = x->write_done > x->write_start ? x->write_done : x->write_start;
            wr[nwr++] = x->write_done > x->write_start ? x->write_done - x->write_start : 0;
            written_bytes += (uint64_t)x->nbytes * (uint64_t)x->written;
            res[nres++] = x->reserve_done - x->reserve_sent;
            if (x->reserve_asked && x->reserve_done >= x->reserve_asked)
                ask[nask++] = x->reserve_done - x->reserve_asked;
            if (x->event_ns > x->reserve_sent)
                lat[nlat++] = x->event_ns - x->reserve_sent;
            else
                no_event++;
        } else if (x->cached) {
            cres[ncres++] = x->reserve_done - x->reserve_sent;
        }
    }
    if (spans)
        write_ns = union_ns(spans, nwr);
    kvp__free(spans, (n ? n : 1) * sizeof *spans);
    double push_gbps = write_ns ? (double)written_bytes / ((double)write_ns / 1e9) / 1e9 : 0;
    double p50 = pct_us(lat, nlat, 0.5), p99 = pct_us(lat, nlat, 0.99), r50 = pct_us(res, nres, 0.5);
    double cr50 = pct_us(cres, ncres, 0.5), a50 = pct_us(ask, nask, 0.5);
    double nrq = r->pf.reserve_requests > 0 ? (double)r->pf.reserve_requests : 1;
    double svc_us = (double)r->pf.reserve_busy_ns / nrq / 1e3, svc_cpu_us = (double)r->pf.reserve_cpu_ns / nrq / 1e3;
    uint64_t unfinished = r->sent - r->ended;
    uint64_t failures = r->failed_reqs + unfinished + r->protocol_errors + (uint64_t)r->pf.gather_misses;
    bool prefill_crashed = !(r->prefill.exited && WIFEXITED(r->prefill.status) && WEXITSTATUS(r->prefill.status) == 0);
    bool encoder_crashed = !r->killed_encoder && !(r->encoder.exited && WIFEXITED(r->encoder.status) &&
                                                   WEXITSTATUS(r->encoder.status) == 0);
    failures += prefill_crashed + encoder_crashed;
    int64_t left = r->pf.reservations_active;

    printf("kvpool replay --epd: %u requests (%u images, %u repeated), %" PRId64 " B per image, consumer TP %u, %s\n",
           r->p->wl.requests, r->w.n_slots, r->w.n_repeat_slots, r->p->wl.size, r->p->consumer_tp,
           r->pool_uri[0] ? r->pool_uri : "no cross-encoder cache");
    printf("  requests sent %u: done %u, retryable errors %u, failed %u, unfinished %" PRIu64 "\n", r->sent, r->done,
           r->retryable, r->failed_reqs, unfinished);
    printf("  pushes %" PRIu64 " (%zu wrote, %zu cached, %" PRIu64 " failed), %.1f MB pushed\n", r->push_ok, nres,
           ncres, r->push_failed, (double)r->bytes_pushed / 1e6);
    printf("  taken into the prefill encoder cache %.1f MB, verified %.1f MB%s\n", (double)r->pf.taken / 1e6,
           (double)r->pf.verified / 1e6, r->pf.taken == r->pf.verified ? " (every byte)" : " (MISMATCH)");
    printf("  cross-encoder cache hits %" PRId64 ", cached reserves %" PRId64 ", encoded on the prefill node %" PRId64
           "\n",
           r->pf.cross_cache_hits, r->pf.reserves_cached, r->pf.encoded);
    printf("  cross-encoder cache lookups: %" PRId64 " misses, %" PRId64 " pool errors, %" PRId64
           " skipped (pool backing off or at its cap)\n",
           r->pf.cross_cache_misses, r->pf.cross_cache_errors, r->pf.cross_cache_skipped);
    printf("  push bandwidth %.2f GB/s (memcpy baseline %.2f GB/s, %.0f %%; %" PRIu64 " over UCX, %" PRIu64
           " over TCP; write p50 %.0f us, p90 %.0f us, p99 %.0f us)\n",
           push_gbps, mc, mc > 0 ? 100 * push_gbps / mc : 0.0, r->via_ucx, r->via_tcp, pct_us(wr, nwr, 0.5),
           pct_us(wr, nwr, 0.9), pct_us(wr, nwr, 0.99));
    printf("  push latency (reserve -> readiness event) p50 %.0f us, p99 %.0f us%s\n", p50, p99,
           no_event ? " (some pushes had no event)" : "");
    printf("  reserve round trip p50 %.0f us (writing), %.0f us (cached); bare ZeroMQ REQ/REP %.0f us paired "
           "with them (%" PRId64 " writing reserves, each with the sample that started nearest it; %.2fx), %.0f us all through the workload (%" PRId64
           " samples; %.2fx), %.0f us idle (%.2fx; answered with %" PRId64 "); frames of %zu bytes, answered with %" PRId64 "\n",
           r50, cr50, r->rtt_paired_p50_us, r->rtt_paired_count, ratio(r50, r->rtt_paired_p50_us), r->rtt_all_p50_us,
           r->rtt_loaded_count, ratio(r50, r->rtt_all_p50_us), r->rtt_idle_p50_us, ratio(r50, r->rtt_idle_p50_us),
           r->rtt_idle_reply_bytes, reserve_frame_bytes(r), r->rtt_reply_bytes);
    printf("  the control server served a reserve in %.1f us on average, %.1f us of them on its CPU (%" PRId64
           " reserves, received -> replied); the rest of a round trip is the client, ZeroMQ, TCP and thread "
           "wake-ups\n",
           svc_us, svc_cpu_us, r->pf.reserve_requests);
    printf("  a writing reserve from asked to answered p50 %.0f us (from start_save queueing it to its reply: "
           "the round trip above plus its wait for one of the producer's two control threads)\n",
           a50);
    printf("  CPU during the workload: encoder node %.2f s (%" PRIu64 " page faults; %" PRId64
           " outputs copied to push, %" PRId64 " of them on the heap), prefill node %.2f s (%" PRIu64
           " page faults), pool server %.2f s\n",
           (double)r->use[2].cpu_ns / 1e9, r->use[2].faults, r->enc.stage_copies, r->enc.stage_fallbacks,
           (double)r->use[1].cpu_ns / 1e9, r->use[1].faults, (double)r->use[0].cpu_ns / 1e9);
    printf("  the GPU's work (encoding; the prefill node's byte checks) ran on each node's device thread at nice "
           "%" PRId64 "%s (encoder) and %" PRId64 "%s (prefill), taking the CPU the serving threads left over\n",
           r->device_nice[1], r->device_idle[1] ? " under SCHED_IDLE" : "", r->device_nice[0],
           r->device_idle[0] ? " under SCHED_IDLE" : "");
    printf("  events dropped (fault) %" PRId64 ", consumer reservations left %" PRId64 " (%" PRId64 " B)%s%s\n",
           r->pf.events_dropped, left, r->pf.bytes_reserved, r->killed_encoder ? ", encoder killed" : "",
           r->killed_pool ? ", pool server killed" : "");
    printf("  failures %" PRIu64 " (protocol %" PRIu64 ", gather misses %" PRId64 ", nodes %d), workload %.2f s, wall %.1f s\n",
           failures, r->protocol_errors, r->pf.gather_misses, prefill_crashed + encoder_crashed, (double)r->work_ns / 1e9,
           wall_s);
    if (r->p->json) {
        kvp__jw_t b;
        kvp__jw_init(&b);
        kvp__jw_puts(&b, "{");
        jnum(&b, "requests", r->sent, true);
        jnum(&b, "pushes", (double)r->push_ok, true);
        jnum(&b, "bytes_pushed", (double)r->bytes_pushed, true);
        jnum(&b, "bytes_taken", (double)r->pf.taken, true);
        jnum(&b, "bytes_verified", (double)r->pf.verified, true);
        jnum(&b, "cross_cache_hits", (double)r->pf.cross_cache_hits, true);
        jnum(&b, "failures", (double)failures, true);
        jnum(&b, "retryable_errors", r->retryable, true);
        jnum(&b, "push_gbps", push_gbps, false);
        jnum(&b, "memcpy_gbps", mc, false);
        jnum(&b, "push_p50_us", p50, false);
        jnum(&b, "push_p99_us", p99, false);
        jnum(&b, "reserve_p50_us", r50, false);
        jnum(&b, "reserve_cached_p50_us", cr50, false);
        jnum(&b, "reserve_asked_p50_us", a50, false);
        jnum(&b, "zmq_rtt_us", r->rtt_p50_us, false);
        jnum(&b, "zmq_rtt_paired_us", r->rtt_paired_p50_us, false);
        jnum(&b, "zmq_rtt_paired_samples", (double)r->rtt_paired_count, true);
        jnum(&b, "zmq_rtt_loaded_us", r->rtt_all_p50_us, false);
        jnum(&b, "zmq_rtt_idle_us", r->rtt_idle_p50_us, false);
        jnum(&b, "zmq_rtt_request_bytes", (double)reserve_frame_bytes(r), true);
        jnum(&b, "zmq_rtt_reply_bytes", (double)r->rtt_reply_bytes, true);
        jnum(&b, "zmq_rtt_idle_reply_bytes", (double)r->rtt_idle_reply_bytes, true);
        jnum(&b, "reserve_reply_bytes", (double)r->reserve_reply_bytes, true);
        jnum(&b, "reserve_service_us", svc_us, false);
        jnum(&b, "reserve_service_cpu_us", svc_cpu_us, false);
        jnum(&b, "encoder_cpu_s", (double)r->use[2].cpu_ns / 1e9, false);
        jnum(&b, "prefill_cpu_s", (double)r->use[1].cpu_ns / 1e9, false);
        jnum(&b, "server_cpu_s", (double)r->use[0].cpu_ns / 1e9, false);
        jnum(&b, "encoder_faults", (double)r->use[2].faults, true);
        jnum(&b, "device_nice", (double)(r->device_nice[0] < r->device_nice[1] ? r->device_nice[0] : r->device_nice[1]),
             true);
        kvp__jw_puts(&b, ",\"device_sched_idle\":");
        kvp__jw_bool(&b, r->device_idle[0] && r->device_idle[1]);
        jnum(&b, "workload_s", (double)r->work_ns / 1e9, false);
        kvp__jw_puts(&b, "}\n");
        if (!b.oom)
            fwrite(b.p, 1, b.len, stdout);
        kvp__jw_cleanup(&b);
    }
    fflush(stdout);
    kvp__free(lat, (n ? n : 1) * sizeof *lat);
    kvp__free(res, (n ? n : 1) * sizeof *res);
    kvp__free(ask, (n ? n : 1) * sizeof *ask);
    kvp__free(cres, (n ? n : 1) * sizeof *cres);
    kvp__free(wr, (n ? n : 1) * sizeof *wr);
    return failures || r->pf.taken != r->pf.verified || left > 0 ? 1 : 0;
}

/* ---------------------------------------------------------------- main */

static kvp_status_t start_server(run_t *r, const char *dir)
{
    char port_file[256], mem[32], *argv[12];
    snprintf(port_file, sizeof port_file, "%s/server.port", dir);
    /* room for every distinct image, and some */
    uint64_t need = (uint64_t)r->w.n_hashes * (uint64_t)r->p->wl.size * 5 / 4 + (64u << 20);
    snprintf(mem, sizeof mem, "%" PRIu64 "MiB", (need >> 20) + 1);
    int i = 0;
    argv[i++] = "kvpool", argv[i++] = "server", argv[i++] = "--listen", argv[i++] = "127.0.0.1:0";
    argv[i++] = "--port-file", argv[i++] = port_file, argv[i++] = "--memory", argv[i++] = mem;
    argv[i++] = "--log-level", argv[i++] = "error", argv[i] = NULL;
    r->server.name = "kvpool server";
    kvp_status_t st = kvp__child_spawn(&r->server, argv, false);
    if (st != KVP_OK)
        return st;
    /* It writes the port file once its arena is faulted in: 10 s, and 4 s
     * more per GiB of arena (this VM faults in about 1 GiB/s), while it
     * lives. */
    uint64_t waits = (10 + 4 * (need >> 30)) * 20;
    for (uint64_t k = 0; k < waits; k++) {
        FILE *f = fopen(port_file, "r");
        unsigned port = 0;
        if (f) {
            int got = fscanf(f, "%u", &port);
            fclose(f);
            if (got == 1 && port) {
                snprintf(r->pool_uri, sizeof r->pool_uri, "kvpool://127.0.0.1:%u", port);
                usleep(100000);
                return KVP_OK;
            }
        }
        if (waitpid(r->server.pid, &r->server.status, WNOHANG) == r->server.pid) {
            r->server.exited = true;
            return KVP_ERR_IO;
        }
        usleep(50000);
    }
    return KVP_ERR_TIMEOUT;
}

static kvp_status_t start_node(run_t *r, kvp__child_t *c, bool prefill)
{
    const kvp__epd_replay_params_t *p = r->p;
    char size[32], tp[16], pw[32], lease[32], cache[32], drop[32], seed[32], pool_size[32], *argv[40];
    snprintf(size, sizeof size, "%" PRId64, p->wl.size);
    snprintf(tp, sizeof tp, "%u", p->consumer_tp);
    snprintf(pw, sizeof pw, "%" PRIu64, p->push_wait_s);
    snprintf(lease, sizeof lease, "%" PRIu64, p->lease_ms);
    snprintf(cache, sizeof cache, "%" PRIu64, p->cache_images);
    snprintf(drop, sizeof drop, "%.6f", p->drop_events);
    snprintf(seed, sizeof seed, "%" PRIu64, p->wl.seed);
    /* the receive pool: two windows of images in flight, and residents */
    snprintf(pool_size, sizeof pool_size, "%" PRId64,
             (int64_t)(2 * p->window * p->wl.max_images + 2 * p->cache_images) * p->wl.size);
    int i = 0;
    argv[i++] = "kvpool", argv[i++] = "epd-node", argv[i++] = "--role", argv[i++] = prefill ? "prefill" : "encoder";
    argv[i++] = "--size", argv[i++] = size, argv[i++] = "--push-wait-s", argv[i++] = pw;
    argv[i++] = "--cache-images", argv[i++] = cache, argv[i++] = "--seed", argv[i++] = seed;
    argv[i++] = "--pool-size", argv[i++] = pool_size;
    if (r->pool_uri[0])
        argv[i++] = "--pool", argv[i++] = r->pool_uri;
    if (p->lease_ms)
        argv[i++] = "--lease-ms", argv[i++] = lease;
    if (prefill) {
        argv[i++] = "--consumer-tp", argv[i++] = tp;
        if (p->drop_events > 0)
            argv[i++] = "--drop-events", argv[i++] = drop;
    } else {
        argv[i++] = "--consumer-zmq", argv[i++] = r->consumer_zmq;
    }
    argv[i] = NULL;
    c->name = prefill ? "the prefill node" : "the encoder node";
    kvp_status_t st = kvp__child_spawn(c, argv, true);
    if (st != KVP_OK)
        return st;
    uint64_t t0 = kvp__now_ns();
    bool *ready = prefill ? &r->prefill_ready : &r->encoder_ready;
    while (!*ready && !c->eof && kvp__now_ns() - t0 < 30000000000ull)
        pump(r, 50);
    return *ready ? KVP_OK : KVP_ERR_TIMEOUT;
}

int kvp__epd_replay_main(const kvp__epd_replay_params_t *p)
{
    static run_t r; /* one per process */
    memset(&r, 0, sizeof r);
    r.p = p;
    r.server.in_fd = r.server.out_fd = r.prefill.in_fd = r.prefill.out_fd = r.encoder.in_fd = r.encoder.out_fd = -1;
    if (p->window < 1 || p->window > p->wl.repeat_gap || p->consumer_tp < 1 || p->consumer_tp > 8) {
        fprintf(stderr, "kvpool replay --epd: the window must be 1..repeat gap (%u), consumer TP 1..8\n",
                p->wl.repeat_gap);
        return 2;
    }
    kvp_status_t st = kvp__epd_workload_gen(&p->wl, &r.w);
    if (st != KVP_OK) {
        fprintf(stderr, "kvpool replay --epd: bad workload (%s): --size must be even\n", kvp_status_str(st));
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    kvp__strmap_init(&r.xfers);
    kvp__json_parser_init(&r.jp);
    uint64_t t0 = kvp__now_ns(), deadline = t0 + p->timeout_s * 1000000000ull;
    double mc = kvp__memcpy_baseline_gbps(p->wl.size);
    char dir[] = "/tmp/kvp-epd.XXXXXX";
    int rc = 1;
    if (!mkdtemp(dir)) {
        fprintf(stderr, "kvpool replay --epd: mkdtemp: %s\n", strerror(errno));
        goto out;
    }
    /* A node's stdout is its channel to us: UCX, which logs to stdout
     * unless told otherwise, logs to stderr in the nodes (UCX reads this at
     * load, so it goes into the environment they are started with; a
     * caller's own choice wins). */
    setenv("UCX_LOG_FILE", "/dev/stderr", 0);
    if (p->pool_uri)
        snprintf(r.pool_uri, sizeof r.pool_uri, "%s", p->pool_uri);
    else if (!p->no_pool && (st = start_server(&r, dir)) != KVP_OK) {
        fprintf(stderr, "kvpool replay --epd: the pool server did not start: %s\n", kvp_status_str(st));
        goto out;
    }
    if ((st = start_node(&r, &r.prefill, true)) != KVP_OK || (st = start_node(&r, &r.encoder, false)) != KVP_OK) {
        fprintf(stderr, "kvpool replay --epd: a node did not start: %s\n", kvp_status_str(st));
        goto out;
    }
    /* the ZeroMQ baseline, between the same two processes, idle before the
     * workload (so that a fault run has it too; replies of the request's
     * size, as no reserve was answered yet) ... */
    {
        idle_rtt(&r, deadline);
        /* ... and sampled all through the workload, on the machine the
         * reserves see */
        char line[256];
        int n = snprintf(line, sizeof line, "{\"op\":\"rtt_start\",\"addr\":\"%s\",\"bytes\":%zu,\"interval_us\":1000}\n",
                     r.echo, reserve_frame_bytes(&r));
        kvp__child_send(&r.encoder, line, (size_t)n);
    }
    /* the proxy */
    uint64_t work_t0 = kvp__now_ns();
    kvp__child_t *const procs[3] = {&r.server, &r.prefill, &r.encoder};
    kvp__proc_usage_t use0[3];
    for (int i = 0; i < 3; i++)
        use0[i] = kvp__proc_usage(procs[i]->pid);
    while (kvp__now_ns() < deadline) {
        while (!r.encoder_dead && r.next < p->wl.requests && r.inflight < p->window)
            send_req(&r);
        if (r.ended >= r.sent && (r.encoder_dead || r.next >= p->wl.requests))
            break;
        if (r.prefill.eof)
            break;
        pump(&r, 5);
        if (r.encoder.eof && !r.encoder_dead) {
            r.encoder_dead = true; /* uninvited: the report counts it */
            kvp_warn("replay --epd: the encoder node exited");
        }
        if (p->kill_pool_after && r.server.pid && !r.killed_pool && r.push_records >= p->kill_pool_after) {
            kill(r.server.pid, SIGKILL);
            r.killed_pool = true;
            kvp_info("replay --epd: killed the pool server after %" PRIu64 " pushes", r.push_records);
        }
        if (p->kill_encoder_after && !r.killed_encoder && r.push_records >= p->kill_encoder_after) {
            kill(r.encoder.pid, SIGKILL);
            r.killed_encoder = r.encoder_dead = true;
            kvp_info("replay --epd: killed the encoder node after %" PRIu64 " pushes", r.push_records);
        }
    }
    r.work_ns = kvp__now_ns() - work_t0;
    for (int i = 0; i < 3; i++)
        r.use[i] = kvp__proc_usage_since(use0[i], kvp__proc_usage(procs[i]->pid));
    if (!r.encoder_dead) {
        kvp__child_send(&r.encoder, "{\"op\":\"rtt_stop\"}\n", 18);
        while (!r.rtt_loaded_done && !r.encoder.eof && kvp__now_ns() < deadline)
            pump(&r, 20);
        /* ... and idle again, now with replies of a reserve reply's size */
        if (r.rtt_loaded_done)
            idle_rtt(&r, deadline);
    }
    if (!r.rtt_loaded_done) /* the encoder died (a fault run): only the idle figure */
        r.rtt_p50_us = r.rtt_idle_p50_us;
    else
        r.rtt_p50_us = r.rtt_paired_count >= RTT_PAIRED_MIN ? r.rtt_paired_p50_us : r.rtt_all_p50_us;
    /* nothing may stay reserved at the consumer once its leases ran out */
    uint64_t wait_ns = (p->lease_ms ? p->lease_ms + 3000 : 5000) * 1000000ull, t_wait = kvp__now_ns();
    do {
        r.waiting_stats = true;
        kvp__child_send(&r.prefill, "{\"op\":\"stats\"}\n", 15);
        while (r.waiting_stats && !r.prefill.eof && kvp__now_ns() < deadline)
            pump(&r, 20);
        if (!r.pf.reservations_active || r.prefill.eof)
            break;
        pump(&r, 200);
    } while (kvp__now_ns() - t_wait < wait_ns && kvp__now_ns() < deadline);
    /* quit: each node finishes, reports and exits */
    if (!r.encoder_dead)
        kvp__child_send(&r.encoder, "{\"op\":\"quit\"}\n", 14);
    kvp__child_send(&r.prefill, "{\"op\":\"quit\"}\n", 14);
    if (r.encoder.in_fd >= 0)
        close(r.encoder.in_fd), r.encoder.in_fd = -1;
    close(r.prefill.in_fd), r.prefill.in_fd = -1;
    uint64_t t_quit = kvp__now_ns();
    while ((!r.prefill.eof || (!r.encoder_dead && !r.encoder.eof)) && kvp__now_ns() - t_quit < 20000000000ull)
        pump(&r, 50);
    kvp__child_reap(&r.prefill, 5000);
    kvp__child_reap(&r.encoder, 5000);
    rc = report(&r, mc, (double)(kvp__now_ns() - t0) / 1e9);
out:
    if (r.prefill.pid)
        kvp__child_reap(&r.prefill, 2000);
    if (r.encoder.pid)
        kvp__child_reap(&r.encoder, 2000);
    if (r.server.pid) {
        kill(r.server.pid, SIGTERM);
        kvp__child_reap(&r.server, 5000);
    }
    kvp__child_close(&r.prefill);
    kvp__child_close(&r.encoder);
    char pf[300];
    snprintf(pf, sizeof pf, "%s/server.port", dir);
    unlink(pf);
    rmdir(dir);
    for (size_t i = 0; i < r.xfers.cap; i++)
        if (r.xfers.slots[i].key)
            kvp__free(r.xfers.slots[i].val, sizeof(xfer_t));
    kvp__strmap_cleanup(&r.xfers);
    kvp__json_parser_cleanup(&r.jp);
    kvp__epd_workload_cleanup(&r.w);
    return rc;
}
