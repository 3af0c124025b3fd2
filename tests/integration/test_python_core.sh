#!/bin/sh
# The kvpool Python package's core (python/kvpool: Pool, errors, hash, kv) over
# the build's libkvpool.so: the unit tests of tests/python with the system
# interpreter (they start their own kvpool server for the kvpool:// suite),
# then `pip install ./python` into a fresh venv and one put/get from it with
# the library the install carried.  Skipped under ASan: ctypes cannot load an
# ASan-instrumented .so into an uninstrumented interpreter (ctest label
# no_asan, so `make test-asan` leaves it out; run anyway, it exits 77, which
# ctest reports as skipped).
set -u
if [ "${KVP_SANITIZE:-}" = 1 ]; then
    echo "skip test_python_core: ASan build (an uninstrumented python3 cannot load an ASan libkvpool.so)"
    exit 77
fi
SRC=${KVP_SOURCE_DIR:-.}
: "${KVP_LIB:?KVP_LIB must name libkvpool.so}"
: "${KVP_BIN:?KVP_BIN must name the kvpool binary}"
. "$SRC/tests/integration/checks.sh"
# /usr/bin/python3 is Debian's, with python3-cbor2 and python3-xxhash (the
# hash reference needs them); another python3 on PATH otherwise.
PY=${KVP_PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=python3
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-pycore.XXXXXX")
trap 'rm -rf "$T"' EXIT

# unittest prints "Ran N tests" and OK/FAILED; the counts go into the summary.
run_unit() { # module
    PYTHONPATH="$SRC/python:$SRC/tests/python" KVPOOL_LIB="$KVP_LIB" \
        "$PY" -m unittest -v "$1" >"$T/$1.log" 2>&1
    rc=$?
    grep -E '^(Ran |OK|FAILED)|(ERROR|FAIL|skipped)' "$T/$1.log" | grep -v ' kvpool [EW] ' | sed "s/^/  $1: /"
    [ $rc -eq 0 ] || sed 's/^/    /' "$T/$1.log" | tail -n 60
    return $rc
}
cd "$SRC/tests/python" || exit 1
check unit_test_errors run_unit test_errors
check unit_test_hash run_unit test_hash
check unit_test_pool run_unit test_pool
check unit_test_kv run_unit test_kv
cd "$T" || exit 1

# The bench runs (small), both sides report a rate, and the JSON has the ratio.
bench_smoke() {
    PYTHONPATH="$SRC/python" KVPOOL_LIB="$KVP_LIB" "$PY" -m kvpool.bench --kvpool-bin "$KVP_BIN" \
        --uri 'embedded://?capacity=64MiB' --size 64KiB --count 50 --rounds 1 --json >"$T/bench.json" &&
        "$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["c_gbps"] > 0 and r["python_gbps"] > 0, r; print("  bench: C %.2f GB/s, Python %.2f GB/s (64 KiB, tiny run)" % (r["c_gbps"], r["python_gbps"]))' "$T/bench.json"
}
check bench_smoke bench_smoke

# tests/python/sched_replay.py: kvpool.sched.Scheduler (the extension over
# the C scheduler) fed duck-typed vLLM objects, decision for decision against
# the original scheduler with the kvsched-ref harness: its samples and 4
# seeds of its 16 modes, 1 seed through the extension's all_token_ids
# fallback, and a stream whose requests change while not scheduled (K13
# deferred-load and K14 offload-only metas read them).  About 15 s on 2 cores.
KVREF="${KVP_SHARED_DIR:-$SRC/../shared}/tools/kvsched-ref"
sched_replay() {
    cmd="'$PY' '$SRC/tests/python/sched_replay.py'"
    cat >"$T/unsched.jsonl" <<'EVENTS'
{"op":"config","version":1,"kv_role":"kv_both","load_async":true,"lookup_async":false,"enable_lookup":true,"block_size":16,"hash_block_size":16,"partial_hits":false}
{"op":"req","req_id":"r1","num_tokens":40,"num_computed_tokens":0,"all_token_ids":[1,2,3],"block_hashes":["0000000000000001","0000000000000002"]}
{"op":"get_num_new_matched_tokens","req_id":"r1","num_computed_tokens":0,"lookup":32}
{"op":"update_state_after_alloc","req_id":"r1","block_ids":[[1,2,3]],"num_external_tokens":32}
{"op":"req","req_id":"r1","append_block_hashes":["0000000000000003"],"append_token_ids":[4,5]}
{"op":"build_connector_meta","finished_req_ids":[],"preempted_req_ids":null,"scheduled_new_reqs":[],"scheduled_cached_reqs":{"req_ids":[],"new_block_ids":[],"num_computed_tokens":[],"resumed_req_ids":[]},"num_scheduled_tokens":{}}
{"op":"req","req_id":"r2","num_tokens":40,"num_computed_tokens":0,"all_token_ids":[1,2,3],"block_hashes":["0000000000000001","0000000000000002"]}
{"op":"get_num_new_matched_tokens","req_id":"r2","num_computed_tokens":0,"lookup":0}
{"op":"update_state_after_alloc","req_id":"r2","block_ids":[[7,8,9]],"num_external_tokens":0}
{"op":"build_connector_meta","finished_req_ids":[],"preempted_req_ids":null,"scheduled_new_reqs":[{"req_id":"r2","num_computed_tokens":0,"block_ids":[[7,8,9]],"prompt_token_ids":[1,2,3],"prefill_token_ids":null}],"scheduled_cached_reqs":{"req_ids":[],"new_block_ids":[],"num_computed_tokens":[],"resumed_req_ids":[]},"num_scheduled_tokens":{"r2":40}}
{"op":"req","req_id":"r2","append_block_hashes":["0000000000000004","0000000000000005"]}
{"op":"build_connector_meta","finished_req_ids":[],"preempted_req_ids":null,"scheduled_new_reqs":[],"scheduled_cached_reqs":{"req_ids":[],"new_block_ids":[],"num_computed_tokens":[],"resumed_req_ids":[]},"num_scheduled_tokens":{},"partial_tail_offloads":[{"req_id":"r2","offloads":[[1,900,40]]}]}
EVENTS
    (
        export KVPOOL_LIB="$KVP_LIB" PYTHONPATH="$SRC/python"
        "$PY" "$KVREF/check.py" --seeds 4 "$cmd" &&
            "$PY" "$KVREF/check.py" --no-samples --seeds 1 "$cmd --all-token-ids" &&
            "$PY" "$KVREF/ref.py" <"$T/unsched.jsonl" >"$T/unsched.want" &&
            "$PY" "$SRC/tests/python/sched_replay.py" <"$T/unsched.jsonl" >"$T/unsched.got" &&
            cmp "$T/unsched.want" "$T/unsched.got" && echo "unscheduled requests: outputs match"
    ) >"$T/sched_replay.log" 2>&1
    rc=$?
    grep -E '^(all outputs match|FAIL|unscheduled)' "$T/sched_replay.log" | sed 's/^/  sched_replay: /'
    [ $rc -eq 0 ] || tail -n 40 "$T/sched_replay.log"
    return $rc
}
if [ -f "$KVREF/check.py" ]; then
    check sched_replay_matches_original sched_replay
else
    echo "skip sched_replay: the kvsched-ref harness is not at $KVREF (KVP_SHARED_DIR)"
fi

# pip install ./python into a venv, offline.  Debian's venv has pip and
# setuptools but not wheel; --system-site-packages lends it python3-wheel.
pip_install() {
    "$PY" -m venv --system-site-packages "$T/venv" >"$T/venv.log" 2>&1 || return 1
    cp -R "$SRC/python" "$T/src" && rm -rf "$T/src/build" "$T/src/kvpool/libkvpool.so"*
    KVPOOL_LIB="$KVP_LIB" KVPOOL_INCLUDE="$SRC/include" "$T/venv/bin/python" -m pip install -q --no-index --no-build-isolation \
        "$T/src" >>"$T/venv.log" 2>&1
}
# From the venv, without KVPOOL_LIB: the package must use the copy it carries.
venv_put_get() {
    env -u KVPOOL_LIB -u PYTHONPATH "$T/venv/bin/python" -c '
import os, sys, kvpool
assert kvpool.__file__.startswith(sys.prefix), kvpool.__file__
assert kvpool.LIB_PATH == os.path.join(os.path.dirname(kvpool.__file__), "libkvpool.so.0"), kvpool.LIB_PATH
with kvpool.Pool("embedded://?capacity=4MiB") as p:
    p.put("venv-key", b"venv-value")
    assert p.get("venv-key") == b"venv-value"
import kvpool.sched  # the scheduler extension the wheel compiled
assert kvpool.sched._ext.__file__.startswith(sys.prefix), kvpool.sched._ext.__file__
print("  venv: kvpool %s from %s, %s" % (kvpool.__version__, kvpool.LIB_PATH,
                                         os.path.basename(kvpool.sched._ext.__file__)))
'
}
if ! "$PY" -c 'import venv, ensurepip' 2>/dev/null; then
    echo "skip pip_install: $PY has no venv/ensurepip module (Debian: apt-get install python3-venv)"
elif ! "$PY" -c 'import setuptools, wheel' 2>/dev/null; then
    echo "skip pip_install: $PY lacks setuptools or wheel for an offline --no-build-isolation install (apt-get install python3-setuptools python3-wheel)"
else
    check pip_install_python pip_install || tail -n 20 "$T/venv.log"
    [ -x "$T/venv/bin/python" ] && check venv_import_put_get venv_put_get
fi
checks_end
