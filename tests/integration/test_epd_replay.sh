#!/bin/sh
# `kvpool replay --epd` end to end (issue 16, items 5 and 6): a generated
# multimodal workload through an encoder process and a prefill process (the
# EC connector's real scheduler, ZeroMQ collaborators and workers over
# 127.0.0.1) with the replay as the proxy.  Every run: the prefill node
# verifies every byte it takes.  Then consumer TP 2, a second run against
# the same pool server (the cross-encoder cache holds every image of the
# first), the encoder killed mid-run, readiness events lost, and the pool
# of the cross-encoder cache killed mid-run.  Release
# build only (ASan runs the engine's unit tests instead).
set -u
KVP=${KVP_BIN:-build/kvpool}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-epd.XXXXXX")
SRV_PID=""
trap '[ -n "$SRV_PID" ] && kill $SRV_PID 2>/dev/null; rm -rf "$T"' EXIT
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"
if [ "${KVP_SANITIZE:-0}" = 1 ]; then
    echo "skip: replays run in the release build"
    exit 77
fi

# epd NAME ARGS...: runs it, keeps stdout/stderr/rc; the JSON line in $T/NAME.json
epd() {
    name=$1
    shift
    "$KVP" replay --epd "$@" --json >"$T/$name.out" 2>"$T/$name.err"
    echo $? >"$T/$name.rc"
    tail -n 1 "$T/$name.out" >"$T/$name.json"
}
# jcheck NAME PYTHON-EXPR: the expression over the JSON object j (and rc) is true
jcheck() {
    /usr/bin/python3 - "$T/$1.json" "$(cat "$T/$1.rc")" "$2" <<'PY' || { sed 's/^/    /' "$T/$1.err" | grep -v 'EC waited' | tail -n 5 >&2; return 1; }
import json, sys
try:
    j = json.load(open(sys.argv[1]))
except ValueError:
    print("    no JSON last line", file=sys.stderr); sys.exit(1)
rc = int(sys.argv[2])
ok = eval(sys.argv[3])
if not ok:
    print("    rc", rc, "json", json.dumps(j)[:700], file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}
FIELDS="['requests','pushes','bytes_pushed','bytes_taken','bytes_verified','cross_cache_hits','failures','retryable_errors','push_gbps','memcpy_gbps','push_p50_us','push_p99_us','reserve_p50_us','reserve_cached_p50_us','reserve_asked_p50_us','zmq_rtt_us','zmq_rtt_paired_us','zmq_rtt_paired_samples','zmq_rtt_loaded_us','zmq_rtt_idle_us','zmq_rtt_request_bytes','zmq_rtt_reply_bytes','zmq_rtt_idle_reply_bytes','reserve_reply_bytes','reserve_service_us','reserve_service_cpu_us','encoder_cpu_s','prefill_cpu_s','server_cpu_s','encoder_faults','device_nice','device_sched_idle','workload_s']"
# every clean run: exit 0, all done, every byte taken verified, every push taken
CLEAN='rc == 0 and j["failures"] == 0 and j["retryable_errors"] == 0 and j["bytes_taken"] > 0 and j["bytes_verified"] == j["bytes_taken"] and j["bytes_taken"] >= j["bytes_pushed"] > 0'

# ------------------------------------------------ the default pool (a server the replay starts)
epd base --requests 60 --push-wait-s 10
check replay_epd_clean_run jcheck base "$CLEAN and j['requests'] == 60 and j['pushes'] > 0"
check replay_epd_json_fields jcheck base "sorted(j) == sorted($FIELDS) and all(isinstance(j[k], (int, float)) for k in j)"
check replay_epd_figures_measured jcheck base "j['push_gbps'] > 0 and j['memcpy_gbps'] > 0 and 0 < j['push_p50_us'] <= j['push_p99_us'] and j['reserve_p50_us'] > 0 and j['zmq_rtt_us'] > 0"
# the baseline is the bare round trip paired with each writing reserve (the
# sample that started nearest it), from the same samples as the loaded one
check replay_epd_rtt_paired_with_reserves jcheck base "j['zmq_rtt_paired_samples'] >= 20 and j['zmq_rtt_us'] == j['zmq_rtt_paired_us'] > 0 and j['zmq_rtt_loaded_us'] > 0 and j['zmq_rtt_idle_us'] > 0"
# the baseline's frames are a reserve's: the request's size, and the reply
# the reserves got (the idle one too: measured again after the workload)
check replay_epd_rtt_frames_of_a_reserve jcheck base "100 < j['zmq_rtt_request_bytes'] < j['zmq_rtt_reply_bytes'] == j['zmq_rtt_idle_reply_bytes'] == j['reserve_reply_bytes']"
# a writing reserve from asked (start_save queued it) to answered: its round
# trip plus its wait for a control thread, so never shorter than the round trip
check replay_epd_reserve_asked_to_answered jcheck base "0 < j['reserve_p50_us'] <= j['reserve_asked_p50_us'] < j['workload_s'] * 1e6"
# the control server's own share of a reserve: measured, its CPU part inside its wall-clock time
check replay_epd_reserve_service_measured jcheck base "0 < j['reserve_service_cpu_us'] <= j['reserve_service_us'] + 1"
# each node's CPU during the workload, from /proc (the encoder encodes and
# pushes, the prefill node checks every byte: tens of ms at least; the
# pool server's share can be under the 10 ms a clock tick counts)
check replay_epd_process_cpu_measured jcheck base "j['encoder_cpu_s'] > 0 and j['prefill_cpu_s'] > 0 and j['server_cpu_s'] >= 0 and j['encoder_faults'] > 0"
# the GPU's work (encoding, the byte checks) ran on each node's device
# thread at nice 19 under SCHED_IDLE (engine/device.h), and the table says so
check replay_epd_gpu_stand_in_at_nice_19_sched_idle jcheck base "j['device_nice'] == 19 and j['device_sched_idle'] is True"
check replay_epd_table_words sh -c "grep -q 'verified' '$T/base.out' && grep -q 'push bandwidth' '$T/base.out' && grep -q 'reservations left 0 ' '$T/base.out' && grep -q 'device thread at nice 19 under SCHED_IDLE (encoder) and 19 under SCHED_IDLE (prefill)' '$T/base.out'"

# ------------------------------------------------ consumer TP 2 (two workers, metadata aggregated)
epd tp2 --requests 30 --size 1MiB --consumer-tp 2 --push-wait-s 10
check replay_epd_consumer_tp2 jcheck tp2 "$CLEAN and j['requests'] == 30 and j['reserve_service_us'] > 0"

# ------------------------------------------------ a pool server of our own, two runs
"$KVP" server --listen 127.0.0.1:0 --port-file "$T/server.port" --memory 512MiB --log-level error \
    >"$T/server.log" 2>&1 &
SRV_PID=$!
i=0
while [ ! -s "$T/server.port" ] && kill -0 "$SRV_PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
sleep 0.2
URI="kvpool://127.0.0.1:$(tr -dc 0-9 <"$T/server.port")"
epd first --requests 40 --size 1MiB --pool "$URI" --push-wait-s 10
check replay_epd_against_given_pool jcheck first "$CLEAN"
# the same workload again: a new prefill instance whose reserves find the
# images in the cross-encoder cache (repeats included)
epd second --requests 40 --size 1MiB --pool "$URI" --push-wait-s 10
check replay_epd_cross_encoder_cache_hits jcheck second "rc == 0 and j['failures'] == 0 and j['retryable_errors'] == 0 and j['bytes_taken'] > 0 and j['bytes_verified'] == j['bytes_taken'] >= j['bytes_pushed'] and j['cross_cache_hits'] >= 40 and j['reserve_cached_p50_us'] > 0"
kill $SRV_PID 2>/dev/null
wait $SRV_PID 2>/dev/null
SRV_PID=""
# the same pool URI with its server gone (nothing listens there now): the
# nodes start all the same (the pool handle connects lazily), every push
# goes, and the cross-encoder cache's lookups fail and back off
epd downpool --requests 20 --size 1MiB --pool "$URI" --push-wait-s 10
check replay_epd_pool_down_from_the_start jcheck downpool "$CLEAN and j['requests'] == 20 and j['cross_cache_hits'] == 0"
check replay_epd_pool_down_from_the_start_backs_off sh -c "grep -Eq 'lookups: [0-9]+ misses, [1-9][0-9]* pool errors, [1-9][0-9]* skipped' '$T/downpool.out'"

# ------------------------------------------------ faults
# the encoder killed (SIGKILL) after 5 pushes, well inside the first window
# (8 requests, 1-3 images each): the requests in flight fail
# with a retryable error after the push wait; the run still ends and reports
epd kill --requests 60 --size 1MiB --faults kill-encoder@5 --push-wait-s 2 --lease-ms 2000
check replay_epd_kill_encoder_retryable jcheck kill "j['failures'] == 0 and j['retryable_errors'] > 0 and j['bytes_verified'] == j['bytes_taken'] and j['requests'] < 60"
check replay_epd_kill_encoder_said_so grep -q 'encoder killed' "$T/kill.out"
# no idle baseline after the workload without the encoder: the one before
# it, whose replies were the request's size (no reserve answered yet)
check replay_epd_kill_encoder_idle_baseline_from_before jcheck kill "j['zmq_rtt_idle_us'] > 0 and j['zmq_rtt_idle_reply_bytes'] == j['zmq_rtt_request_bytes']"
# nothing the dead producer reserved may stay reserved past its lease
check replay_epd_kill_encoder_nothing_leaks sh -c "[ \$(cat '$T/kill.rc') = 0 ] && grep -q 'reservations left 0 ' '$T/kill.out'"

# readiness events lost: only the requests whose event was lost fail
# (retryable).  No repeated images (--repeat 0): with repeats, a later
# cached reserve of the same image can rescue the waiter before its push
# wait ends, so how many fail would depend on timing.  Without them every
# lost event fails exactly the one request that needed the image (two lost
# events of one request fail it once), and the seeded drops are the same
# every run.
epd drop --requests 40 --size 1MiB --repeat 0 --faults drop-events@0.1 --push-wait-s 2 --lease-ms 2000
DROPPED=$(sed -n 's/.*events dropped (fault) \([0-9]*\),.*/\1/p' "$T/drop.out")
check replay_epd_drop_events_retryable jcheck drop "rc == 0 and j['failures'] == 0 and 0 < j['retryable_errors'] <= int('${DROPPED:-0}') and j['bytes_verified'] == j['bytes_taken']"
DONE=$(sed -n 's/.*requests sent 40: done \([0-9]*\), retryable errors [0-9]*, failed 0, unfinished 0.*/\1/p' "$T/drop.out")
check replay_epd_drop_events_only_those jcheck drop "int('${DONE:-0}') + j['retryable_errors'] == j['requests'] == 40"
check replay_epd_drop_events_nothing_leaks grep -q 'reservations left 0 ' "$T/drop.out"

# the pool down for the cross-encoder cache: the pool server the replay
# started is killed (SIGKILL) after 20 pushes; every push still goes and
# every request succeeds, and lookups back off instead of each reserve
# waiting for a dead pool
epd killpool --requests 80 --size 1MiB --faults kill-pool@20 --push-wait-s 5
check replay_epd_pool_down_pushes_still_work jcheck killpool "$CLEAN and j['requests'] == 80 and j['pushes'] >= 150"
check replay_epd_pool_down_lookups_back_off sh -c "grep -q 'pool server killed' '$T/killpool.out' && grep -Eq 'lookups: [0-9]+ misses, [1-9][0-9]* pool errors, [1-9][0-9]* skipped' '$T/killpool.out'"

# epd-node --metrics-port 0: the prefill node's workers (two TP ranks)
# serve their figures as Prometheus text; its URL is in the ready line
sleep 4 | "$KVP" epd-node --role prefill --size 1MiB --consumer-tp 2 --pool-size 16MiB --metrics-port 0 \
    >"$T/node.out" 2>"$T/node.err" &
i=0
while ! grep -q '"metrics"' "$T/node.out" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
MURL=$(sed -n 's/.*"metrics":"\([^"]*\)".*/\1/p' "$T/node.out")
/usr/bin/python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" \
    "$MURL" >"$T/node.metrics" 2>/dev/null
check epd_node_metrics_per_rank sh -c "grep -qx 'kvpool_ec_reservations_active{rank=\"0\"} 0' '$T/node.metrics' && grep -qx 'kvpool_ec_reservations_active{rank=\"1\"} 0' '$T/node.metrics' && grep -qx '# TYPE kvpool_ec_reserves_total counter' '$T/node.metrics' && grep -qx 'kvpool_ec_reserve_requests_total{rank=\"1\"} 0' '$T/node.metrics' && grep -qx '# TYPE kvpool_ec_reserve_cpu_seconds_total counter' '$T/node.metrics'"
wait
check replay_epd_usage_errors sh -c "'$KVP' replay --epd --faults frob@1 >/dev/null 2>&1; [ \$? = 2 ] && '$KVP' replay --epd --size 3 >/dev/null 2>&1; [ \$? = 2 ] && '$KVP' replay --epd --frob >/dev/null 2>&1; [ \$? = 2 ] && '$KVP' replay --epd --help | grep -q 'kvpool server'"
checks_end
