/*
 * `kvpool bench --ec-scheduler [--json] [--steps N (30)] [--stream PATH] [--no-ref]`
 *
 * The EC scheduler's per-step cost: 256 running requests of 4 images each on
 * a consumer, readiness events arriving every step.  A step is: the clock
 * advances 10 ms, 64 new requests arrive and their 256 readiness events land
 * in the inbox, ensure_cache_available for every running request (the new
 * ones begin their loads, the rest are LOADING or READY), then
 * build_connector_meta (freeing the encoder-cache entries of the requests
 * finishing this step).  Outside the timed part the workers report the
 * loads, and finished requests get request_finished (remote cancels).
 * Timed: ensure_cache_available x 256 + build_connector_meta, per step.
 *
 * The same calls are written as an ec-sched-replay v1 stream and replayed
 * through the original (ecsched-ref/ref.py, found via KVP_SHARED_DIR), timing
 * the same two calls on the seed object, so the ratio compares like with
 * like.  --json: one compact JSON object as the last line of stdout.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "support/ec_scripted.h"
#include "kvpool/ec_connector.h"

#define NREQ 256
#define NIMG 4
#define LIFE 4 /* steps a request runs */
#define NEW_PER_STEP (NREQ / LIFE)
#define WARMUP 8

typedef struct {
    char rid[16];
    char hash[NIMG][24];
    char tid[NIMG][24];
    kvp_ec_feature_t feat[NIMG];
    kvp_ec_item_t items[NIMG];
    kvp_ec_transfer_params_t params;
    kvp_ec_request_t req;
} breq_t;

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static const char *find_ref(char *buf, size_t len)
{
    const char *dirs[3] = {getenv("KVP_SHARED_DIR"), "../shared", "/work/shared"};
    for (int i = 0; i < 3; i++) {
        if (!dirs[i])
            continue;
        snprintf(buf, len, "%s/tools/ecsched-ref/ref.py", dirs[i]);
        struct stat st;
        if (stat(buf, &st) == 0)
            return buf;
    }
    return NULL;
}

static const char *PY_TIMER =
    "import sys, json, time, importlib.util\n"
    "spec = importlib.util.spec_from_file_location('ecref', sys.argv[1])\n"
    "ref = importlib.util.module_from_spec(spec); spec.loader.exec_module(ref)\n"
    "lines = open(sys.argv[2]).read().splitlines()\n"
    "rep = ref.Replayer(ref.parse_config(json.loads(lines[0])))\n"
    "steps = []; cur = 0.0; pc = time.perf_counter\n"
    "for line in lines[1:]:\n"
    "    ev = json.loads(line); op = ev['op']\n"
    "    if op == 'ensure_cache_available':\n"
    "        r = rep.requests[ev['req_id']]; n = ev['num_computed_tokens']\n"
    "        t = pc(); rep.sched.ensure_cache_available(r, n); cur += pc() - t\n"
    "    elif op == 'build_connector_meta':\n"
    "        so = ref.SchedulerOutput(list(ev['free_encoder_mm_hashes']), None)\n"
    "        t = pc(); rep.sched.build_connector_meta(so); cur += pc() - t\n"
    "        steps.append(cur); cur = 0.0\n"
    "    else:\n"
    "        rep.handle(ev)\n"
    "rep.executor.submitted = []\n"
    "s = sorted(steps[int(sys.argv[3]):])\n"
    "print('%.3f %.3f' % (s[len(s)//2] * 1e6, s[min(len(s)-1, int(len(s)*0.99))] * 1e6))\n";

int kvp_bench_ec_scheduler(int argc, char **argv)
{
    bool json = false, want_ref = true;
    int steps = 30;
    const char *stream_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--no-ref"))
            want_ref = false;
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--stream") && i + 1 < argc)
            stream_path = argv[++i];
    }
    if (steps < 1)
        steps = 1;
    if (!getenv("KVP_LOG_LEVEL"))
        kvp__log_set_level(KVP_LOG_ERROR);
    char tmp_path[] = "/tmp/kvp-ec-bench-XXXXXX";
    FILE *out = NULL;
    if (want_ref || stream_path) {
        if (stream_path) {
            out = fopen(stream_path, "w");
        } else {
            int fd = mkstemp(tmp_path);
            out = fd >= 0 ? fdopen(fd, "w") : NULL;
            stream_path = tmp_path;
        }
        if (!out) {
            fprintf(stderr, "bench --ec-scheduler: cannot write the stream\n");
            return 1;
        }
        fprintf(out, "{\"op\":\"config\",\"version\":1,\"is_producer\":false,\"is_consumer\":true,"
                     "\"cross_encoder_cache\":false,\"control_addr\":\"tcp://10.0.0.2:5500\","
                     "\"push_wait_timeout_s\":10,\"control_timeout_ms\":30000,\"pool_size\":1073741824,"
                     "\"shard_count\":1,\"hidden_dim\":1024,\"dtype\":\"bfloat16\"}\n");
    }

    kvp__ec_sclock_t clock = {0};
    kvp__ec_sexec_t exec;
    kvp__ec_sctl_t ctl;
    kvp__ec_sinbox_t inbox;
    kvp__ec_sexec_init(&exec);
    kvp__ec_sctl_init(&ctl);
    kvp__ec_sinbox_init(&inbox, 1);
    kvp_ec_config_t cfg;
    kvp_ec_config_init(&cfg);
    cfg.is_consumer = true;
    cfg.control_addr = "tcp://10.0.0.2:5500";
    cfg.push_wait_timeout_s = 10;
    cfg.pool_size = 1 << 30;
    cfg.hidden_dim = 1024;
    kvp_ec_sched_params_t p;
    kvp_ec_sched_params_init(&p);
    p.config = &cfg;
    p.clock = kvp__ec_sclock_iface(&clock);
    p.control = kvp__ec_sctl_iface(&ctl);
    p.executor = kvp__ec_sexec_iface(&exec);
    p.inbox = kvp__ec_sinbox_iface(&inbox);
    kvp_ec_sched_t *s;
    if (kvp_ec_sched_create(&p, &s) != KVP_OK)
        return 1;

    int total = steps + WARMUP;
    breq_t *reqs = calloc((size_t)(total + LIFE) * NEW_PER_STEP, sizeof *reqs);
    uint64_t *step_ns = calloc((size_t)total, sizeof *step_ns);
    char **loaded = calloc(NREQ * NIMG, sizeof *loaded);
    size_t n_loaded = 0;
    if (!reqs || !step_ns || !loaded)
        return 1;
    int next_req = 0;
    for (int step = 0; step < total; step++) {
        clock.now_ms += 10;
        if (out)
            fprintf(out, "{\"op\":\"clock\",\"now_ms\":%" PRId64 "}\n", clock.now_ms);
        /* new requests and their readiness events */
        int first_new = next_req;
        for (int k = 0; k < NEW_PER_STEP; k++, next_req++) {
            breq_t *r = &reqs[next_req];
            snprintf(r->rid, sizeof r->rid, "r%d", next_req);
            if (out)
                fprintf(out, "{\"op\":\"req\",\"req_id\":\"%s\",\"mm_features\":[", r->rid);
            for (int j = 0; j < NIMG; j++) {
                int id = next_req * NIMG + j;
                /* one image in eight repeats an older hash (a local hand-off) */
                int hid = (j == 3 && next_req >= 8 && next_req % 8 == 0) ? (next_req - 8) * NIMG + 3 : id;
                snprintf(r->hash[j], sizeof r->hash[j], "mm%014x", hid);
                snprintf(r->tid[j], sizeof r->tid[j], "tx%d", id);
                r->feat[j] = (kvp_ec_feature_t){r->hash[j], "image", j * 600, 576, 576};
                r->items[j] = (kvp_ec_item_t){r->hash[j], r->tid[j]};
                if (out)
                    fprintf(out,
                            "%s{\"identifier\":\"%s\",\"modality\":\"image\",\"offset\":%d,\"length\":576}",
                            j ? "," : "", r->hash[j], j * 600);
            }
            r->params = (kvp_ec_transfer_params_t){NULL, r->items, NIMG};
            r->req = (kvp_ec_request_t){r->rid, r->feat, NIMG, &r->params};
            if (out) {
                fprintf(out, "],\"ec_transfer_params\":{\"ec_items\":[");
                for (int j = 0; j < NIMG; j++)
                    fprintf(out, "%s{\"mm_hash\":\"%s\",\"transfer_id\":\"%s\"}", j ? "," : "", r->hash[j],
                            r->tid[j]);
                fprintf(out, "]}}\n");
            }
            for (int j = 0; j < NIMG; j++) {
                char ev[256];
                int n = snprintf(ev, sizeof ev,
                                 "{\"ready\":true,\"transfer_id\":\"%s\",\"mm_hash\":\"%s\",\"nbytes\":1179648,"
                                 "\"shape\":[576,1024],\"dtype\":\"bfloat16\",\"shard\":5500}",
                                 r->tid[j], r->hash[j]);
                kvp_ec_value_t *v;
                if (kvp_ec_json_parse(ev, (size_t)n, 32, &v) == KVP_OK)
                    kvp__ec_sinbox_push(&inbox, v);
                if (out)
                    fprintf(out, "{\"op\":\"event\",\"data\":%s}\n", ev);
            }
        }
        /* running: requests [first_new - (LIFE-1)*NEW, next_req) */
        int lo = first_new - (LIFE - 1) * NEW_PER_STEP;
        if (lo < 0)
            lo = 0;
        const char *freed[NEW_PER_STEP * NIMG];
        size_t n_freed = 0;
        if (lo == first_new - (LIFE - 1) * NEW_PER_STEP)
            for (int i = lo; i < lo + NEW_PER_STEP; i++)
                for (int j = 0; j < NIMG; j++)
                    freed[n_freed++] = reqs[i].hash[j];
        if (out) {
            for (int i = lo; i < next_req; i++)
                fprintf(out, "{\"op\":\"ensure_cache_available\",\"req_id\":\"%s\",\"num_computed_tokens\":0}\n",
                        reqs[i].rid);
            fprintf(out, "{\"op\":\"build_connector_meta\",\"free_encoder_mm_hashes\":[");
            for (size_t i = 0; i < n_freed; i++)
                fprintf(out, "%s\"%s\"", i ? "," : "", freed[i]);
            fprintf(out, "],\"preempted_req_ids\":null}\n");
        }
        uint64_t t0 = kvp__now_ns();
        for (int i = lo; i < next_req; i++) {
            bool ok;
            kvp_ec_sched_ensure_cache_available(s, &reqs[i].req, 0, &ok);
        }
        kvp_ec_meta_t meta;
        kvp_ec_sched_build_connector_meta(s, freed, n_freed, NULL, 0, &meta);
        step_ns[step] = kvp__now_ns() - t0;
        /* untimed: the workers load what the meta asked for; finished requests */
        n_loaded = 0;
        for (size_t i = 0; i < meta.n_loads; i++)
            loaded[n_loaded++] = meta.loads[i].mm_hash;
        kvp_ec_worker_meta_t wm = {0};
        wm.loaded = loaded;
        wm.n_loaded = n_loaded;
        kvp_ec_sched_update_connector_output(s, &wm);
        if (out) {
            fprintf(out, "{\"op\":\"update_connector_output\",\"worker_meta\":{\"loaded\":[");
            for (size_t i = 0; i < n_loaded; i++)
                fprintf(out, "%s\"%s\"", i ? "," : "", loaded[i]);
            fprintf(out, "],\"failed_loads\":[],\"reclaimed\":[],\"pending_loads\":false,\"pending_saves\":false,"
                         "\"failed_saves\":[]}}\n");
        }
        kvp_ec_meta_cleanup(&meta);
        if (n_freed) {
            for (int i = lo; i < lo + NEW_PER_STEP; i++) {
                kvp_ec_finished_t fin;
                kvp_ec_sched_request_finished(s, &reqs[i].req, &fin);
                kvp_ec_finished_cleanup(&fin);
                if (out)
                    fprintf(out, "{\"op\":\"request_finished\",\"req_id\":\"%s\"}\n", reqs[i].rid);
            }
        }
    }
    if (out)
        fclose(out);
    size_t table = kvp_ec_sched_table_size(s);
    kvp_ec_sched_destroy(s);
    kvp__ec_sexec_cleanup(&exec);
    kvp__ec_sctl_cleanup(&ctl);
    kvp__ec_sinbox_cleanup(&inbox);

    uint64_t *m = step_ns + WARMUP;
    qsort(m, (size_t)steps, sizeof *m, cmp_u64);
    double med = m[steps / 2] / 1e3, p99 = m[(size_t)(steps * 0.99) < (size_t)steps ? (size_t)(steps * 0.99) : (size_t)steps - 1] / 1e3;

    double ref_med = -1, ref_p99 = -1;
    char refbuf[512];
    const char *ref = want_ref ? find_ref(refbuf, sizeof refbuf) : NULL;
    if (ref) {
        char pyfile[] = "/tmp/kvp-ec-bench-py-XXXXXX";
        int fd = mkstemp(pyfile);
        if (fd >= 0) {
            FILE *pf = fdopen(fd, "w");
            fputs(PY_TIMER, pf);
            fclose(pf);
            char cmd[2048];
            snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s %s %d", pyfile, ref, stream_path, WARMUP);
            FILE *pp = popen(cmd, "r");
            if (pp) {
                if (fscanf(pp, "%lf %lf", &ref_med, &ref_p99) != 2)
                    ref_med = ref_p99 = -1;
                pclose(pp);
            }
            unlink(pyfile);
        }
    }
    if (stream_path == tmp_path)
        unlink(tmp_path);
    printf("ec scheduler: %d requests x %d images, %d events/step, %d steps (+%d warm-up), table %zu records\n",
           NREQ, NIMG, NEW_PER_STEP * NIMG, steps, WARMUP, table);
    printf("  C:      ensure_cache_available x %d + build_connector_meta: median %.1f us/step, p99 %.1f us\n",
           NREQ, med, p99);
    if (ref_med > 0)
        printf("  ref.py: the original on the same stream:                 median %.1f us/step, p99 %.1f us "
               "(C is %.1fx faster)\n",
               ref_med, ref_p99, ref_med / med);
    else
        printf("  ref.py: not run (set KVP_SHARED_DIR, or --no-ref given)\n");
    if (json) {
        printf("{\"bench\":\"ec-scheduler\",\"requests\":%d,\"images\":%d,\"steps\":%d,\"step_us\":%.3f,"
               "\"step_us_p99\":%.3f",
               NREQ, NIMG, steps, med, p99);
        if (ref_med > 0)
            printf(",\"ref_step_us\":%.3f,\"ref_step_us_p99\":%.3f,\"speedup\":%.2f", ref_med, ref_p99,
                   ref_med / med);
        printf("}\n");
    }
    free(reqs);
    free(step_ns);
    free(loaded);
    return 0;
}
