#!/bin/sh
# `kvpool bench-baseline` (the baselines of bench/compare.sh) on tiny counts:
# memcpy and tcp-raw always, redis when redis-server is installed (one is
# started on a free loopback port without persistence, and stopped).  Each
# run prints one valid JSON row with the fields compare.sh reports; bad
# arguments exit 2 with a message.
set -u
KVP=${KVP_BIN:-build/kvpool}
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-bl.XXXXXX")
RPID=""
cleanup() {
    if [ -n "$RPID" ]; then
        kill "$RPID" 2>/dev/null
        wait "$RPID" 2>/dev/null
    fi
    rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"

# row_ok SYSTEM TRANSPORT OP SIZE_BYTES COUNT CLIENTS [extra args]
row_ok() {
    sys=$1 tr=$2 op=$3 size=$4 count=$5 clients=$6
    shift 6
    "$KVP" bench-baseline --system "$sys" --op "$op" --size "$size" --count "$count" --clients "$clients" \
        --json "$@" >"$T/out" 2>"$T/err" || { sed 's/^/  stderr: /' "$T/err" >&2; return 1; }
    /usr/bin/python3 - "$T/out" "$sys" "$tr" "$op" "$size" "$clients" <<'EOF'
import json, sys
path, system, transport, op, size, clients = sys.argv[1:]
lines = open(path).read().splitlines()
assert len(lines) == 1, lines
assert not any(c.isspace() for c in lines[0]), "not compact: " + lines[0]
r = json.loads(lines[0])
need = ["system", "transport", "op", "size", "clients", "gbps", "p50_us", "p99_us"]
assert list(r)[:8] == need, list(r)
assert (r["system"], r["transport"], r["op"]) == (system, transport, op), r
assert r["size"] == int(size) and r["clients"] == int(clients), r
assert isinstance(r["clients"], int) and isinstance(r["size"], int), r
assert r["gbps"] > 0 and 0 <= r["p50_us"] <= r["p99_us"] and r["p99_us"] > 0, r
assert r["errors"] == 0, r
EOF
}

check memcpy_copy row_ok memcpy - copy 65536 64 1
check memcpy_copy_odd_size row_ok memcpy - copy 1000 10 1
check tcp_raw_put_1 row_ok tcp-raw tcp put 65536 64 1
check tcp_raw_put_8 row_ok tcp-raw tcp put 65536 64 8
check tcp_raw_get_2 row_ok tcp-raw tcp get 1048576 8 2
check tcp_raw_put_uneven row_ok tcp-raw tcp put 3000 10 3
check human_output sh -c "'$KVP' bench-baseline --system memcpy --op copy --size 4KiB --count 10 | grep -q 'GB/s'"
check help sh -c "'$KVP' bench-baseline --help | grep -q '^usage: kvpool bench-baseline'"

bad() { # args...: exit 2 with a message
    "$KVP" bench-baseline "$@" >/dev/null 2>"$T/err"
    [ $? = 2 ] && grep -q 'kvpool bench-baseline' "$T/err"
}
check bad_system bad --system nope --op put --size 1KiB --count 1
check bad_op bad --system tcp-raw --op copy --size 1KiB --count 1
check bad_memcpy_op bad --system memcpy --op put --size 1KiB --count 1
check bad_memcpy_clients bad --system memcpy --op copy --size 1KiB --count 8 --clients 2
check bad_size bad --system memcpy --op copy --size 12XB --count 1
check bad_count bad --system memcpy --op copy --size 1KiB --count 0
check bad_clients_over_count bad --system tcp-raw --op put --size 1KiB --count 2 --clients 4
check missing_system bad --op put --size 1KiB --count 1
check redis_unreachable sh -c "! '$KVP' bench-baseline --system redis --op put --size 1KiB --count 1 --redis-port 1 2>/dev/null"

if command -v redis-server >/dev/null 2>&1; then
    port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$T" --daemonize no \
        --loglevel warning >"$T/redis.log" 2>&1 &
    RPID=$!
    ping() {
        /usr/bin/python3 - "$port" <<'EOF' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"PING\r\n")
sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
EOF
    }
    i=0
    until ping || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
    check redis_started ping
    check redis_put_1 row_ok redis tcp put 65536 32 1 --redis-port "$port"
    check redis_get_1 row_ok redis tcp get 65536 32 1 --redis-port "$port"
    check redis_get_4 row_ok redis tcp get 1048576 8 4 --redis-port "$port"
    # every key the runs stored was dropped again
    dbsize() {
        /usr/bin/python3 - "$port" <<'EOF'
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=2)
s.sendall(b"DBSIZE\r\n")
r = s.recv(64)
sys.exit(0 if r.startswith(b":0\r\n") else 1)
EOF
    }
    check redis_keys_cleaned dbsize
else
    echo "skip redis rows (redis-server is not installed)"
fi

checks_end
