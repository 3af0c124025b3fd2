#!/bin/sh
# KvpoolConnector inside real vLLM engines (tests/vllm/test_engine_*.py), in
# the vLLM test venv (scripts/vllm-env.sh; release build only).  Each module
# starts its engine(s) once; their unittest counts and engine start-up times
# are printed.  Exit 77 (ctest: skipped) where the disk cannot hold the venv.
set -u
SRC=${KVP_SOURCE_DIR:-.}
KVP=${KVP_BIN:-build/kvpool}
. "$SRC/tests/integration/checks.sh"
. "$SRC/tests/integration/vllm_venv.sh"
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-vllm.XXXXXX")
trap 'rm -rf "$T"' EXIT
# Everything the tests write (model configs, logs, lookup sockets) goes under $T.
export HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_LOGGING_LEVEL=WARNING TMPDIR="$T" \
    VLLM_RPC_BASE_PATH="$T" KVPOOL_BIN="$KVP" \
    KVPOOL_LIB="$(cd "$(dirname "${KVP_LIB:-build/libkvpool.so}")" && pwd)/$(basename "${KVP_LIB:-build/libkvpool.so}")"
export PYTHONPATH="$SRC/python"

run_module() { # module [env...]
    mod=$1
    shift
    start=$(date +%s)
    env "$@" "$venv/bin/python" -u "$SRC/tests/vllm/$mod.py" >"$T/$mod.log" 2>&1
    rc=$?
    grep -E '^(Ran |OK|FAILED)|^  engine|(ERROR|FAIL):|skipped' "$T/$mod.log" | sed "s/^/  $mod: /"
    echo "  $mod: $(( $(date +%s) - start )) s"
    [ $rc -eq 0 ] || tail -n 80 "$T/$mod.log" | sed 's/^/    /'
    return $rc
}
check connector_config run_module test_connector_config
check engine_local run_module test_engine_local VLLM_ENABLE_V1_MULTIPROCESSING=0
check engine_options run_module test_engine_options VLLM_ENABLE_V1_MULTIPROCESSING=0
check engine_shared run_module test_engine_shared
check engine_mp run_module test_engine_mp

# vLLM 0.32's MooncakeStoreScheduler against the C scheduler on the hook calls
# of a real engine run (recorded here, small), and its K12 control (the hook
# time per step: bench/sched_overhead.py, on a full recording).
sched_vs_vllm032() {
    start=$(date +%s)
    env VLLM_ENABLE_V1_MULTIPROCESSING=0 "$venv/bin/python" -u "$SRC/tests/vllm/sched_record.py" \
        "$T/sched.pkl" --small >"$T/sched_record.log" 2>&1 &&
        "$venv/bin/python" -u "$SRC/tests/vllm/sched_vs_vllm032.py" "$T/sched.pkl" \
            >"$T/sched_vs.log" 2>&1
    rc=$?
    grep -hE '^  recorded|expected difference|agreement|FAIL|unexpected' \
        "$T/sched_record.log" "$T/sched_vs.log" 2>/dev/null | sed 's/^ */  sched_vs_vllm032: /'
    [ $rc -eq 0 ] || tail -n 60 "$T/sched_record.log" "$T/sched_vs.log" 2>/dev/null |
        sed 's/^/    /'
    echo "  sched_vs_vllm032: $(( $(date +%s) - start )) s"
    return $rc
}
check sched_vs_vllm032 sched_vs_vllm032
checks_end
