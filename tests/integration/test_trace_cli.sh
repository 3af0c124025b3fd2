#!/bin/sh
# `kvpool trace-gen` end to end: the same flags give the same bytes, another
# seed other bytes; the trace is valid Mooncake JSON Lines (checked here with
# Python's json, independently of the C reader); the summary names the
# bound; bad flags exit 2 with a message and write no trace.
set -u
KVP=${KVP_BIN:-build/kvpool}
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gen() { # file, flags...
    f=$1
    shift
    "$KVP" trace-gen "$@" >"$f" 2>"$f.err"
}
check trace_gen_runs gen "$tmp/a" --requests 300 --sessions 100 --seed 7
check trace_gen_same_seed_same_bytes sh -c "'$KVP' trace-gen --requests 300 --sessions 100 --seed 7 2>/dev/null | cmp -s - '$tmp/a'"
gen "$tmp/b" --requests 300 --sessions 100 --seed 8
check trace_gen_other_seed_other_bytes sh -c "! cmp -s '$tmp/b' '$tmp/a'"
check trace_gen_summary_names_bound grep -q "300 requests, 100 sessions, .* prompt tokens .* infinite-cache bound [0-9.]* %" "$tmp/a.err"
valid() {
    /usr/bin/python3 - "$1" <<'PY'
import json, sys
prev, seen_max, n = 0, -1, 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    assert sorted(r) == ["hash_ids", "input_length", "output_length", "timestamp"], r
    assert all(type(r[k]) is int for k in ("timestamp", "input_length", "output_length")), r
    assert r["timestamp"] >= prev and r["input_length"] >= 1 and r["output_length"] >= 0, r
    assert len(r["hash_ids"]) == -(-r["input_length"] // 512), r
    for i in r["hash_ids"]:
        assert type(i) is int and i <= seen_max + 1, (i, seen_max)  # dense, in order of first use
        seen_max = max(seen_max, i)
    prev, n = r["timestamp"], n + 1
assert n == 300, n
PY
}
check trace_gen_valid_mooncake_jsonl valid "$tmp/a"
check trace_gen_help sh -c "'$KVP' trace-gen --help | grep -q 'usage: kvpool trace-gen'"
bad() { # flags...: exit 2, a message, no trace on stdout
    "$KVP" trace-gen "$@" >"$tmp/bad.out" 2>"$tmp/bad.err"
    rc=$?
    [ "$rc" -eq 2 ] && [ ! -s "$tmp/bad.out" ] && grep -q "trace-gen" "$tmp/bad.err"
}
check trace_gen_bad_requests_zero bad --requests 0
check trace_gen_bad_requests_negative bad --requests -5
check trace_gen_bad_requests_suffix bad --requests 12k
check trace_gen_bad_requests_overflow bad --requests 99999999999999999999999
check trace_gen_bad_sessions_over_requests bad --requests 10 --sessions 11
check trace_gen_bad_turns bad --turns 0
check trace_gen_bad_rate_zero bad --rate 0
check trace_gen_bad_rate_nan bad --rate nan
check trace_gen_bad_rate_tiny bad --rate 1e-300
check trace_gen_bad_rate_text bad --rate 2x
check trace_gen_bad_seed bad --seed -1
check trace_gen_missing_value bad --requests
check trace_gen_unknown_flag bad --frobnicate 3
check trace_gen_positional bad out.jsonl
checks_end
