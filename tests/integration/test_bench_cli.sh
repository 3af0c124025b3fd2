#!/bin/sh
# `kvpool bench` end to end on small workloads: every op runs without errors
# and --json prints one compact object per result with the documented fields;
# bad arguments exit non-zero with a message.
set -u
KVP=${KVP_BIN:-build/kvpool}
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"
json_ok() { # op size count threads
    out=$("$KVP" bench --uri 'embedded://?capacity=64MiB' --op "$1" --size "$2" --count "$3" --threads "$4" --json) || return 1
    printf '%s\n' "$out" | /usr/bin/python3 -c '
import json, sys
lines = [l for l in sys.stdin.read().splitlines() if l.strip()]
assert len(lines) >= 1, "no output"
r = json.loads(lines[-1])
need = ["op", "size", "count", "threads", "ops_per_s", "gbps", "p50_us", "p99_us", "memcpy_gbps", "ratio"]
missing = [k for k in need if k not in r]
assert not missing, missing
assert r["op"] == sys.argv[1] and r["count"] == int(sys.argv[2]) and r["threads"] == int(sys.argv[3]), r
assert r["ops_per_s"] > 0 and r["memcpy_gbps"] > 0 and r["p99_us"] >= r["p50_us"] >= 0, r
assert r["errors"] == 0, r
if r["op"] in ("exists", "prefix"):
    assert r["keys_per_s"] > 0, r
else:
    assert r["gbps"] > 0 and r["ratio"] > 0, r
' "$1" "$3" "$4"
}
check bench_put_json json_ok put 64KiB 200 1
check bench_get_json json_ok get 64KiB 200 2
check bench_mixed_json json_ok mixed 4KiB 500 2
check bench_exists_json json_ok exists 64 2000 1
check bench_prefix_json json_ok prefix 64 2000 1
check bench_bad_op sh -c "! '$KVP' bench --op frobnicate 2>/dev/null"
check bench_bad_size sh -c "! '$KVP' bench --size 12XB 2>/dev/null"
check bench_conns_needs_kvpool_uri sh -c "! '$KVP' bench --uri 'embedded://?capacity=16MiB' --conns 2 --count 10 --size 1KiB 2>/dev/null"
check bench_bad_conns sh -c "! '$KVP' bench --conns 0 2>/dev/null"
check bench_bad_uri sh -c "! '$KVP' bench --uri 'nope://x' --count 10 --size 1KiB 2>/dev/null"
check bench_human_output sh -c "'$KVP' bench --uri 'embedded://?capacity=16MiB' --op get --size 4KiB --count 100 | grep -q 'memcpy baseline'"
check bench_lookup_json sh -c "'$KVP' bench --lookup --count 100 --json | tail -n 1 | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r[\"blocks\"] == 1000 and r[\"count\"] == 100, r
assert r[\"lookup_p99_us\"] >= r[\"lookup_p50_us\"] > 0 and r[\"zmq_rtt_us\"] > 0, r
'"
# the EC reserve against the bare round trip, spaced (--gap-us) and not
check bench_ec_reserve_json sh -c "'$KVP' bench --ec-reserve --rounds 2 --per-round 3 --size 64KiB --gap-us 500 --json | tail -n 1 | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r[\"rounds\"] == 2 and r[\"per_round\"] == 3 and r[\"pool\"] is False, r
assert r[\"zmq_rtt_us\"] > 0 and r[\"reserve_p50_us\"] > 0 and r[\"reserve_over_rtt\"] > 0, r
assert 100 < r[\"frame\"] < r[\"reply_frame\"], r
'"
check bench_ec_reserve_bad_gap sh -c "! '$KVP' bench --ec-reserve --gap-us 2000000 2>/dev/null"
checks_end
