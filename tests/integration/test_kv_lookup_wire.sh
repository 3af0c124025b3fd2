#!/bin/sh
# The KV lookup service over ZeroMQ end to end (connectors-spec §2.4):
#   - vLLM's frames from an independent Python client (lookup_wire.py client)
#     against `kvpool lookup-server` over a kvpool:// pool server;
#   - the C client (`kvpool lookup`) against a Python REP server
#     (lookup_wire.py server): exact frames, 4 + 8k byte replies accepted,
#     others a hit of 0;
#   - the fault: the lookup server killed (SIGKILL, leaving its socket file)
#     while a client keeps lookups going: misses within the timeout, no
#     hang; restarted (the stale file unlinked), hits again on the same client;
#   - the command line: groups parsing, wildcard refusal, clean stop.
# Only 127.0.0.1 and ipc paths under a mktemp -d directory.
set -u
KVP=${KVP_BIN:-build/kvpool}
SRC=${KVP_SOURCE_DIR:-.}
PY=/usr/bin/python3
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-lkw.XXXXXX")
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$T"
}
trap cleanup EXIT
. "$SRC/tests/integration/checks.sh"

if ! $PY -c 'import zmq, cbor2, xxhash' 2>/dev/null; then
    echo "skip: python3-zmq / python3-cbor2 / python3-xxhash missing"
    exit 0
fi

# wait_line FILE TEXT: until FILE holds TEXT (5 s at most).
wait_line() {
    i=0
    while ! grep -q "$2" "$1" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    grep -q "$2" "$1" 2>/dev/null
}

# The pool server the lookup servers share (it outlives their restarts).
"$KVP" server --listen 127.0.0.1:0 --port-file "$T/pool.port" --memory 64MiB --log-level error \
    >"$T/pool.log" 2>&1 &
PIDS="$PIDS $!"
wait_line "$T/pool.port" '[0-9]' || { echo "FAIL pool_server_start"; cat "$T/pool.log"; exit 1; }
sleep 0.1
POOL="kvpool://127.0.0.1:$(tr -dc 0-9 <"$T/pool.port")"

# start_ls EP LOG: a lookup server over POOL; sets LS_PID once it listens.
start_ls() {
    "$KVP" lookup-server --pool "$POOL" --endpoint "$1" --model /models/m --block-size 16 \
        --print-metrics >"$2" 2>"$2.err" &
    LS_PID=$!
    PIDS="$PIDS $LS_PID"
    wait_line "$2" '^listening on '
}

EP="ipc://$T/lookup_rpc_port_0_host_test_dp_rank0"
check lookup_server_listens start_ls "$EP" "$T/ls1.out"
check lookup_server_prints_endpoint grep -qx "listening on $EP" "$T/ls1.out"
check ipc_socket_owner_only sh -c "[ \"\$(stat -c %a '$T/lookup_rpc_port_0_host_test_dp_rank0')\" = 600 ]"

echo "--- vLLM's client (Python) against kvpool lookup-server"
check python_vllm_client $PY "$SRC/tests/integration/lookup_wire.py" client "$EP" "$POOL"

kill -TERM "$LS_PID"
wait "$LS_PID" 2>/dev/null
check sigterm_clean_exit_0 test $? -eq 0
check sigterm_removes_socket_file test ! -e "$T/lookup_rpc_port_0_host_test_dp_rank0"
check metrics_counted_garbage grep -q '^kvpool_lookup_server_bad_frames_total [1-9]' "$T/ls1.out"
check metrics_counted_unknown_tags grep -q '^kvpool_lookup_server_unknown_tags_total [1-9]' "$T/ls1.out"

echo "--- the C client against a Python REP server"
check python_rep_server $PY "$SRC/tests/integration/lookup_wire.py" server "$T"

echo "--- fault: the lookup server killed and restarted under a client"
TOKS=$(seq -s ' ' 100 131)
echo "kv block" >"$T/value"  # 32 tokens: 2 blocks of 16
for h in $("$KVP" hash --seed 0 --block-size 16 $TOKS); do
    "$KVP" put "$POOL" "m@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@$h" "$T/value"
done
# fault NAME EP: a client keeps lookups going at EP while the server there is
# killed and restarted at the same endpoint.  Each client line: HIT MS.  Hits
# (16: the last token is recomputed) before the kill, misses (0) within the
# timeout + slack while it is down, hits again at the end on the same client.
fault() {
    n=$1
    start_ls "$2" "$T/$n.ls.out" || { echo "FAIL ${n}_start"; return; }
    ep=$(sed -n 's/^listening on //p' "$T/$n.ls.out")
    "$KVP" lookup "$ep" --seed 0 --block-size 16 --timeout-ms 400 --repeat 40 --interval-ms 50 $TOKS \
        >"$T/$n.client" 2>"$T/$n.client.err" &
    CL_PID=$!
    PIDS="$PIDS $CL_PID"
    sleep 0.6
    kill -KILL "$LS_PID"
    sleep 1.2
    check "${n}_restart_listens" start_ls "$ep" "$T/$n.ls2.out"
    wait "$CL_PID"
    check "${n}_hits_before_kill" sh -c "head -n 3 '$T/$n.client' | awk '\$1 != 16 { exit 1 }'"
    check "${n}_misses_while_down" sh -c "awk '\$1 == 0' '$T/$n.client' | grep -q ."
    check "${n}_no_hang_past_timeout" sh -c "awk '\$2 > 1400 { exit 1 }' '$T/$n.client'"
    check "${n}_hits_after_restart" sh -c "tail -n 3 '$T/$n.client' | awk '\$1 != 16 { exit 1 }'"
    check "${n}_all_calls_answered" sh -c "[ \$(wc -l <'$T/$n.client') -eq 40 ]"
    FAULT_EP=$ep
}
# ipc: SIGKILL leaves the socket file behind; the restart must find it stale.
fault fault_ipc "ipc://$T/lookup_rpc_port_1_host_test_dp_rank0"
kill -TERM "$LS_PID"
# tcp: port 0 resolved, then the same port again.
fault fault_tcp "tcp://127.0.0.1:0"
check tcp_port_resolved sh -c "echo '$FAULT_EP' | grep -q '^tcp://127.0.0.1:[1-9][0-9]*$'"
# The in-process form with -v names the reason.
check lookup_in_process_reason sh -c "'$KVP' lookup --pool '$POOL' --model /models/m --block-size 16 --seed 0 -v $TOKS | grep -qx 'reason capped_last_token\|reason none'"
check lookup_remote_hit sh -c "[ \"\$('$KVP' lookup '$FAULT_EP' --seed 0 --block-size 16 $TOKS 7)\" = 32 ]"
kill -TERM "$LS_PID"

echo "--- the command line"
# a live server's ipc socket is not stolen
EP3="ipc://$T/live"
start_ls "$EP3" "$T/ls4.out"
check live_socket_not_stolen sh -c "! '$KVP' lookup-server --pool '$POOL' --endpoint '$EP3' --model m --block-size 16 >/dev/null 2>&1"
check live_socket_still_answers sh -c "[ \"\$('$KVP' lookup '$EP3' --seed 0 --block-size 16 $TOKS 7)\" = 32 ]"
kill -TERM "$LS_PID"
# answers within a second of starting: a lookup sent as it starts is answered
"$KVP" lookup-server --pool 'embedded://?capacity=4MiB' --endpoint "ipc://$T/quick" --model m \
    --block-size 16 >/dev/null 2>&1 &
LS_PID=$!
PIDS="$PIDS $LS_PID"
check answers_within_1s_of_start sh -c "[ \"\$('$KVP' lookup 'ipc://$T/quick' --timeout-ms 1000 --seed 0 --block-size 16 $TOKS)\" = 0 ]"
kill -TERM "$LS_PID"
# --groups: one full-attention group spelled out is the default's equal
"$KVP" lookup-server --pool 'embedded://?capacity=4MiB' --endpoint "ipc://$T/groups" --model m \
    --block-size 16 --groups full:16 >"$T/groups.out" 2>&1 &
LS_PID=$!
PIDS="$PIDS $LS_PID"
check groups_full_16_listens wait_line "$T/groups.out" '^listening on '
kill -TERM "$LS_PID"
# --metrics-port 0: Prometheus text over HTTP on a port it picks and prints
"$KVP" lookup-server --pool 'embedded://?capacity=4MiB' --endpoint "ipc://$T/metrics" --model m \
    --block-size 16 --metrics-port 0 >"$T/metrics.out" 2>&1 &
LS_PID=$!
PIDS="$PIDS $LS_PID"
check metrics_port_listens wait_line "$T/metrics.out" '^listening on '
"$KVP" lookup "ipc://$T/metrics" --seed 0 --block-size 16 $TOKS >/dev/null 2>&1
MURL=$(sed -n 's/^metrics on //p' "$T/metrics.out")
$PY -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" \
    "$MURL" >"$T/metrics.txt" 2>/dev/null
check metrics_http_counts_the_lookup grep -qx 'kvpool_lookup_server_lookups_total 1' "$T/metrics.txt"
check metrics_http_counts_the_reason grep -q '^kvpool_lookup_misses_total{reason="missing_block"} 1' "$T/metrics.txt"
kill -TERM "$LS_PID"
check tcp_wildcard_refused sh -c "'$KVP' lookup-server --pool 'embedded://?capacity=4MiB' --endpoint 'tcp://0.0.0.0:0' --model m --block-size 16 >/dev/null 2>&1; [ \$? -eq 2 ]"
check groups_bad_kind_exit_2 sh -c "'$KVP' lookup-server --pool 'embedded://?capacity=4MiB' --endpoint '$EP3' --model m --block-size 16 --groups 'full:16,attn:16' 2>/dev/null; [ \$? -eq 2 ]"
check groups_swa_needs_window_exit_2 sh -c "'$KVP' lookup-server --pool 'embedded://?capacity=4MiB' --endpoint '$EP3' --model m --block-size 16 --groups 'swa:16' 2>/dev/null; [ \$? -eq 2 ]"
check groups_align_only_mamba_exit_2 sh -c "'$KVP' lookup-server --pool 'embedded://?capacity=4MiB' --endpoint '$EP3' --model m --block-size 16 --groups 'full:16:align' 2>/dev/null; [ \$? -eq 2 ]"
check missing_required_exit_2 sh -c "'$KVP' lookup-server --pool 'embedded://?capacity=4MiB' --endpoint '$EP3' 2>/dev/null; [ \$? -eq 2 ]"
check lookup_needs_seed_exit_2 sh -c "'$KVP' lookup '$EP3' --block-size 16 1 2 3 2>/dev/null; [ \$? -eq 2 ]"
checks_end
