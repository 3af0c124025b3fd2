#!/bin/sh
# `kvpool replay` end to end (issue 15, item 7): short synthetic traces
# through engine instances sharing a pool -- forced preemptions, chunked
# prefill, async and sync loads, TP 2, producer and consumer roles, store
# pressure, the prefix router, load_policy both, a kvpool:// server, and that
# server killed mid-replay.  Every run must verify every block it loaded and
# find no corruption; a replay with a deliberately corrupted save must find
# it and exit 1.  Bad trace lines are skipped and counted.  Release build
# only (ASan runs the engine's unit tests instead).
set -u
KVP=${KVP_BIN:-build/kvpool}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-replay.XXXXXX")
SRV_PID=""
trap '[ -n "$SRV_PID" ] && kill $SRV_PID 2>/dev/null; rm -rf "$T"' EXIT
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"
if [ "${KVP_SANITIZE:-0}" = 1 ]; then
    echo "skip: replays run in the release build"
    exit 77
fi
export KVP_ENGINE_CHECK=1 # the block pool's books after every step

"$KVP" trace-gen --requests 150 --sessions 50 --seed 3 >"$T/t.jsonl" 2>/dev/null

# replay NAME ARGS...: runs it, keeps stdout/stderr/rc; the JSON line in $T/NAME.json
replay() {
    name=$1
    shift
    "$KVP" replay "$@" --json >"$T/$name.out" 2>"$T/$name.err"
    echo $? >"$T/$name.rc"
    tail -n 1 "$T/$name.out" >"$T/$name.json"
}
# jcheck NAME PYTHON-EXPR: the expression over the JSON object j (and rc) is true
jcheck() {
    /usr/bin/python3 - "$T/$1.json" "$(cat "$T/$1.rc")" "$2" <<'PY' || { sed 's/^/    /' "$T/$1.err" | tail -n 5 >&2; return 1; }
import json, sys
j = json.load(open(sys.argv[1])); rc = int(sys.argv[2])
ok = eval(sys.argv[3])
if not ok:
    print("    rc", rc, "json", json.dumps(j)[:600], file=sys.stderr)
sys.exit(0 if ok else 1)
PY
}
# Every run: exit 0, all served, every loaded block verified, no corruption.
CLEAN='rc == 0 and j["corruptions"] == 0 and j["blocks_verified"] == j["blocks_loaded"] and j["requests"] + j["rejected"] == 150'

replay base "$T/t.jsonl" --instances 2 --plot "$T/base.svg"
check replay_two_instances jcheck base "$CLEAN and j['blocks_loaded'] > 1000 and j['pool_hit_tokens'] > 0"
check replay_hit_rate_near_bound jcheck base "j['hit_rate'] >= 0.9 * j['bound_hit_rate'] and j['bound_hit_rate'] > 0.3"
check replay_ttft_lower_with_pool jcheck base "j['ttft_p50_ms'] < j['ttft_p50_ms_no_pool']"
check replay_table_words sh -c "grep -q 'hit rate' '$T/base.out' && grep -q 'verified' '$T/base.out'"
check replay_plot_svg /usr/bin/python3 -c "
import sys, xml.dom.minidom as m
d = m.parse('$T/base.svg'); assert d.documentElement.tagName == 'svg'
assert len(d.getElementsByTagName('polyline')) >= 4"
replay again "$T/t.jsonl" --instances 2
check replay_deterministic /usr/bin/python3 -c "
import json
a, b = (json.loads(open('$T/%s.json' % n).read()) for n in ('base', 'again'))
vary = {'wall_s', 'measured_gbps'}
d = {k: (a[k], b[k]) for k in a if k not in vary and a[k] != b[k]}
assert not d, d"

replay preempt "$T/t.jsonl" --instances 2 --gpu-tokens 40000 --token-budget 1024 --no-baseline
check replay_forced_preemptions_chunked_prefill jcheck preempt "$CLEAN and j['preemptions'] > 0 and j['rejected'] > 0"
replay sync "$T/t.jsonl" --instances 2 --tp 2 --sync-loads --no-baseline
check replay_tp2_sync_loads jcheck sync "$CLEAN and j['blocks_loaded'] > 1000"
# 2 KV heads over 2 ranks: each rank its own key namespace (and cache bytes)
replay tpkeys "$T/t.jsonl" --instances 2 --model small --tp 2 --gpu-tokens 20000 --limit 20 --no-baseline
check replay_tp2_own_namespaces jcheck tpkeys "rc == 0 and j['corruptions'] == 0 and j['requests'] + j['rejected'] == 20 and j['blocks_verified'] == j['blocks_loaded'] > 0"
replay roles "$T/t.jsonl" --instances 2 --roles kv_producer,kv_consumer --async-lookups --no-baseline
check replay_producer_consumer jcheck roles "$CLEAN and j['pool_hit_tokens'] > 0"
replay pressure "$T/t.jsonl" --instances 2 --pool 'embedded://?capacity=8MiB' --no-baseline
check replay_store_pressure jcheck pressure "$CLEAN and j['evictions'] > 0"
replay prefix "$T/t.jsonl" --instances 2 --router prefix --no-baseline
check replay_prefix_router jcheck prefix "$CLEAN and j['local_hit_tokens'] > 1.5 * $(/usr/bin/python3 -c "import json; print(json.load(open('$T/base.json'))['local_hit_tokens'])")"
# a link so slow (125 kB/s) that recomputing beats loading: faster declines
# the loads, and the requests that would have waited for them do not
replay policy "$T/t.jsonl" --instances 2 --link-gbps 0.001 --load-policy both --limit 60
check replay_load_policy_both jcheck policy "rc == 0 and j['corruptions'] == 0 and j['requests'] == 60 and j['pool_hit_tokens'] > 0 and j['ttft_p99_ms_faster'] < j['ttft_p99_ms'] and j['ttft_p50_ms_faster'] <= j['ttft_p50_ms']"

replay corrupt "$T/t.jsonl" --instances 2 --debug-corrupt-every 50 --no-baseline
check replay_detects_corruption jcheck corrupt "rc == 1 and j['corruptions'] > 0"

# bad lines: skipped, counted, named; the rest replays
{ head -n 20 "$T/t.jsonl"; echo 'not json'; echo '{"timestamp": 1}';
  echo '{"timestamp": 999999999, "input_length": 600, "output_length": 1, "hash_ids": [1]}';
  echo '{"timestamp": 999999999, "input_length": -5, "output_length": 1, "hash_ids": []}'; } >"$T/bad.jsonl"
KVP_LOG_LEVEL=warn replay bad "$T/bad.jsonl" --no-baseline
check replay_bad_lines_served jcheck bad 'rc == 0 and j["requests"] == 20'
check replay_bad_lines_counted grep -q '4 trace line(s) skipped' "$T/bad.err"
check replay_bad_lines_named grep -q 'bad.jsonl:21' "$T/bad.err"
check replay_refuses_what_does_not_fit sh -c "'$KVP' replay '$T/t.jsonl' --model llama8b-like --gpu-tokens 100000000 >/dev/null 2>'$T/fit.err'; [ \$? = 2 ] && grep -q 'needs about' '$T/fit.err'"
check replay_usage_errors sh -c "'$KVP' replay >/dev/null 2>&1; [ \$? = 2 ] && '$KVP' replay x --block-size 100 >/dev/null 2>&1; [ \$? = 2 ] && '$KVP' replay x --frob >/dev/null 2>&1; [ \$? = 2 ]"

# ---------------------------------------------------------------- a kvpool:// server
"$KVP" server --listen 127.0.0.1:0 --port-file "$T/server.port" --memory 512MiB --log-level error \
    >"$T/server.log" 2>&1 &
SRV_PID=$!
i=0
while [ ! -s "$T/server.port" ] && kill -0 "$SRV_PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
sleep 0.2
URI="kvpool://127.0.0.1:$(tr -dc 0-9 <"$T/server.port")"
replay server "$T/t.jsonl" --instances 2 --pool "$URI" --no-baseline
check replay_against_server jcheck server "$CLEAN and j['blocks_loaded'] > 1000"
check replay_server_same_figures /usr/bin/python3 -c "
import json
a, b = (json.loads(open('$T/%s.json' % n).read()) for n in ('base', 'server'))
for k in ('hit_rate', 'pool_hit_tokens', 'local_hit_tokens', 'ttft_p50_ms', 'blocks_verified'):
    assert a[k] == b[k], (k, a[k], b[k])"

# the server killed mid-replay: lookups and loads fail, tokens are recomputed,
# the replay finishes and says how many
"$KVP" trace-gen --requests 400 --sessions 100 --seed 5 >"$T/long.jsonl" 2>/dev/null
"$KVP" replay "$T/long.jsonl" --instances 2 --pool "$URI" --pool-timeout-ms 500 --no-baseline --json \
    >"$T/kill.out" 2>"$T/kill.err" &
RP=$!
i=0 # until the server holds a few thousand of its blocks (not a fixed time)
while [ $i -lt 300 ] && kill -0 $RP 2>/dev/null; do
    n=$("$KVP" stats "$URI" --json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["live"])' 2>/dev/null)
    [ "${n:-0}" -gt 3000 ] && break
    sleep 0.05
    i=$((i + 1))
done
kill -9 $SRV_PID
wait $SRV_PID 2>/dev/null
SRV_PID=""
wait $RP
echo $? >"$T/kill.rc"
tail -n 1 "$T/kill.out" >"$T/kill.json"
/usr/bin/python3 -c "import json; j = json.load(open('$T/kill.json')); print('  server killed: %d requests, %d load errors, %d save errors, %d lookup errors, %d blocks verified' % (j['requests'], j['load_errors'], j['save_errors'], j['lookup_errors'], j['blocks_verified']))" 2>/dev/null
check replay_server_killed_recomputes jcheck kill "rc == 0 and j['corruptions'] == 0 and j['requests'] + j['rejected'] == 400 and j['load_errors'] + j['save_errors'] + j['lookup_errors'] > 0"
checks_end
