#!/bin/sh
# kvpool against its baselines, all measured in one run (issue 3, item 7;
# ARCHITECTURE.md §8):
#
#   kvpool   a `kvpool server` on a free loopback port, driven by
#            `kvpool bench --uri kvpool://127.0.0.1:PORT`: once with UCX's
#            default transports (labelled shm: one host, so shared memory) and
#            once with UCX_TLS=tcp for server and client (labelled tcp: the
#            client then takes kvpool's own TCP transport, or UCX's tcp with
#            KVP_COMPARE_TCP_TRANSPORT=ucx);
#            put and get of 64 KiB, 1 MiB and 4 MiB values with 1 and 8
#            clients (bench threads, each with its own connection, as each
#            redis client has its own), distinct keys, each stored object read
#            once; plus prefix lookups of 128 keys (row size = the stored
#            values' size, 64 B).  The pool is reset around every row.
#   redis    a redis-server on a free loopback port, no persistence, driven by
#            `kvpool bench-baseline --system redis` (hiredis, same workload,
#            no pipelining).
#   tcp-raw  one loopback TCP stream of writes of the same size per client
#            (op put; it is the reference for both kvpool-tcp put and get).
#   memcpy   one thread, as `kvpool bench` defines its baseline (op copy).
#
# Usage: sh bench/compare.sh [--json] [--quick] [--repeat N] [path/to/kvpool]
#   --json   JSON Lines on stdout, one compact object per row:
#            system, transport, op, size, clients, gbps, p50_us, p99_us
#   --quick  1/16 of the counts (a smoke run, numbers not meaningful)
#   --repeat N  run the rows the checks read (1 MiB with one client, and the
#            prefix rows) N times, interleaved, and report each one's median
#            run (by GB/s; prefix by p50) with a field runs (default 3)
# Otherwise it prints one table with the ratios kvpool/memcpy, kvpool/redis
# and kvpool-tcp/tcp-raw, then the issue's checks.  Progress goes to stderr.
# Rows that cannot run (no server command or remote backend in this build,
# no redis-server) are listed as skipped; the baselines always run.
# All servers start first; rows run in priority order (1 MiB with one client
# and the prefix rows, which the checks need, first) and the table is sorted.
# The whole run stays within 10 minutes: no row starts after
# KVP_COMPARE_BUDGET_S seconds (default 540), those left are listed as
# skipped, and a row is cut off 30 s past the budget.  Exit status: 0 when every
# row that could run ran cleanly, 1 when some row failed.
# Values are held in RAM several times over (sources, destinations, server):
# about 2 GiB at the largest row.
set -u

ROOT=$(cd "$(dirname "$0")/.." && pwd)
KVP=${KVP_BIN:-$ROOT/build/kvpool}
JSON=0
QUICK=0
REPEAT=3
NEXT=""
for a in "$@"; do
    if [ "$NEXT" = repeat ]; then
        REPEAT=$a
        NEXT=""
        continue
    fi
    case "$a" in
        --json) JSON=1 ;;
        --quick) QUICK=1 ;;
        --repeat=*) REPEAT=${a#--repeat=} ;;
        --repeat) NEXT=repeat ;;
        -h|--help) sed -n '2,/^set -u$/p' "$0" | sed '$d'; exit 0 ;;
        -*) echo "compare: unknown option $a" >&2; exit 2 ;;
        *) KVP=$a ;;
    esac
done
case "$REPEAT" in
    ''|*[!0-9]*|0) echo "compare: --repeat takes a whole number from 1" >&2; exit 2 ;;
esac
[ -x "$KVP" ] || { echo "compare: no kvpool binary at $KVP (build it, or pass its path)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "compare: needs python3" >&2; exit 2; }

BUDGET=${KVP_COMPARE_BUDGET_S:-540}
ROW_TIMEOUT=${KVP_COMPARE_ROW_TIMEOUT_S:-150}
T0=$(date +%s)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvpool-compare.XXXXXX")
ROWS=$TMP/rows.jsonl     # normalized rows, in run order
NOTES=$TMP/notes.txt     # "skipped ..." / "FAILED ..." lines
: >"$ROWS"
: >"$NOTES"
PIDS=""
FAILED=0

cleanup() {
    for p in $PIDS; do
        kill "$p" 2>/dev/null
    done
    for p in $PIDS; do
        i=0
        while kill -0 "$p" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        kill -9 "$p" 2>/dev/null
    done
    PIDS=""
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

log() { echo "compare: $*" >&2; }
note() { echo "$*" >>"$NOTES"; log "$*"; }
elapsed() { echo $(($(date +%s) - T0)); }
over_budget() { [ "$(elapsed)" -ge "$BUDGET" ]; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The counts: 256-512 MiB of values per row (written on a 2-core machine
# shared with builds; the whole run must fit in 10 minutes).
count_for() { # size -> count
    case "$1" in
        65536) c=4096 ;;
        1048576) c=512 ;;
        *) c=128 ;;
    esac
    [ "$QUICK" = 1 ] && c=$((c / 16))
    echo "$c"
}

# Normalizes one result line into a row.  $1 system, $2 transport, then the
# raw JSON on stdin (a bench-baseline row, or a `kvpool bench --json` row
# whose threads become clients).
cat >"$TMP/row.py" <<'EOF'
import json, sys
system, transport = sys.argv[1], sys.argv[2]
lines = [l for l in sys.stdin.read().splitlines() if l.strip().startswith("{")]
if not lines:
    sys.exit("no JSON row in the output")
r = json.loads(lines[-1])
if r.get("errors", 0):
    sys.exit("%d errors in the run" % r["errors"])
clients = int(r["clients"]) if "clients" in r else int(r["threads"])
row = {"system": system, "transport": transport, "op": r["op"], "size": int(r["size"]),
       "clients": clients, "gbps": float(r["gbps"]), "p50_us": float(r["p50_us"]),
       "p99_us": float(r["p99_us"])}
print(json.dumps(row, separators=(",", ":")))
EOF

# run_row LABEL SYSTEM TRANSPORT COMMAND...: runs one measurement under the
# row timeout and appends its row (or a note).
run_row() {
    label=$1 system=$2 transport=$3
    shift 3
    if over_budget; then
        note "skipped $label: time budget (${BUDGET}s) spent"
        return
    fi
    log "$label ($(elapsed)s)"
    limit=$((BUDGET + 30 - $(elapsed)))
    [ "$limit" -gt "$ROW_TIMEOUT" ] && limit=$ROW_TIMEOUT
    if timeout -k 5 "$limit" "$@" >"$TMP/out" 2>"$TMP/err" &&
        python3 "$TMP/row.py" "$system" "$transport" <"$TMP/out" >"$TMP/row" 2>>"$TMP/err"; then
        cat "$TMP/row" >>"$ROWS"
    else
        rc=$?
        why=$(grep -v '^[[:space:]]*$' "$TMP/err" | tail -n 1)
        [ "$rc" = 124 ] && why="timed out after ${limit}s"
        note "FAILED $label: ${why:-exit status $rc}"
        FAILED=1
    fi
}

# ---------------------------------------------------------------- servers
# Everything that serves is started first and stays up (an idle server costs
# no CPU); the rows then run in priority order, so that if the time budget
# runs out it is the rows the checks need that have run.
if ! command -v redis-server >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing redis-server (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server >/dev/null 2>&1; }
fi
redis_ping() { # port
    python3 - "$1" <<'EOF' 2>/dev/null
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1)
s.sendall(b"PING\r\n")
sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
EOF
}
RPORT=""
if command -v redis-server >/dev/null 2>&1; then
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$TMP" \
        --daemonize no --loglevel warning >"$TMP/redis.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    until redis_ping "$port" || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
    if redis_ping "$port"; then
        RPORT=$port
        log "redis-server on 127.0.0.1:$RPORT"
    else
        note "FAILED redis rows: redis-server did not answer on 127.0.0.1:$port ($(tail -n 1 "$TMP/redis.log"))"
        FAILED=1
    fi
else
    note "skipped redis rows: redis-server is not installed (apt-get install redis-server)"
fi

# Largest row: 512 MiB of values stored at once (get preloads its objects).
SERVER_MEMORY=${KVP_COMPARE_SERVER_MEMORY:-2GiB}
# Environment for every process of a row set, server and clients alike
# (they must agree on the transports): `env $UCXENV cmd ...`.
ucx_env() { # shm|tcp
    if [ "$1" = tcp ]; then echo "UCX_TLS=tcp"; else echo "-u UCX_TLS"; fi
}
# shellcheck disable=SC2034 # read through eval in kvpool_row
URI_shm=""
# shellcheck disable=SC2034
URI_tcp=""
start_kvpool() { # shm|tcp: sets URI_<transport> once the server answers
    trans=$1
    UCXENV=$(ucx_env "$trans")
    rm -f "$TMP/port"
    port=""
    if "$KVP" server --help 2>/dev/null | grep -q -- '--port-file'; then
        env $UCXENV "$KVP" server --listen 127.0.0.1:0 --port-file "$TMP/port" --memory "$SERVER_MEMORY" \
            --log-level warn >"$TMP/server-$trans.log" 2>&1 &
        SPID=$!
        PIDS="$PIDS $SPID"
        i=0
        while [ ! -s "$TMP/port" ] && kill -0 "$SPID" 2>/dev/null && [ $i -lt 300 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        sleep 0.1 # the port file may still be being written
        port=$(tr -dc 0-9 <"$TMP/port" 2>/dev/null)
    else
        port=$(free_port)
        env $UCXENV "$KVP" server --listen "127.0.0.1:$port" --memory "$SERVER_MEMORY" --log-level warn \
            >"$TMP/server-$trans.log" 2>&1 &
        SPID=$!
        PIDS="$PIDS $SPID"
    fi
    uri="kvpool://127.0.0.1:${port:-0}"
    # tcp rows: what a client gets with UCX_TLS=tcp (transport=auto: kvpool's
    # own TCP transport), or UCX's tcp with KVP_COMPARE_TCP_TRANSPORT=ucx
    [ "$trans" = tcp ] && uri="$uri?transport=${KVP_COMPARE_TCP_TRANSPORT:-auto}"
    # Ready when the pool answers a stats call.
    i=0
    : >"$TMP/stats.err"
    while [ -n "$port" ] && [ $i -lt 60 ] && kill -0 "$SPID" 2>/dev/null; do
        if env $UCXENV "$KVP" stats "$uri" --timeout 1000 >/dev/null 2>"$TMP/stats.err"; then
            eval "URI_$trans=\$uri"
            log "kvpool server ($trans) on $uri"
            return
        fi
        # a build without the remote backend will never answer
        grep -q 'not supported\|not part of this build' "$TMP/stats.err" && break
        sleep 0.5
        i=$((i + 1))
    done
    if grep -q 'not supported\|not part of this build' "$TMP/stats.err"; then
        note "skipped kvpool $trans rows: the kvpool:// client backend is not in this build"
    else
        why=$(tail -n 1 "$TMP/stats.err")
        [ -z "$why" ] && why=$(tail -n 1 "$TMP/server-$trans.log" 2>/dev/null)
        note "FAILED kvpool $trans rows: server not ready: ${why:-no answer}"
        FAILED=1
    fi
    kill "$SPID" 2>/dev/null
}
if "$KVP" server --help >/dev/null 2>&1; then
    start_kvpool shm
    start_kvpool tcp
else
    note "skipped kvpool rows: this kvpool has no server command yet"
fi

# ---------------------------------------------------------------- rows
kvpool_row() { # transport op size clients count
    eval "u=\$URI_$1"
    [ -n "$u" ] || return 0
    e=$(ucx_env "$1")
    # bench uses the same keys every run: each row starts from an empty pool
    env $e "$KVP" reset "$u" --timeout 30000 >/dev/null 2>&1
    if [ "$2" = prefix ]; then
        run_row "kvpool $1 prefix 128 keys" kvpool "$1" \
            env $e "$KVP" bench --uri "$u" --op prefix --size "$3" --count "$5" --batch 128 --json
    else
        run_row "kvpool $1 $2 size=$3 clients=$4" kvpool "$1" \
            env $e "$KVP" bench --uri "$u" --op "$2" --size "$3" --count "$5" --threads "$4" --conns "$4" --json
    fi
    env $e "$KVP" reset "$u" --timeout 30000 >/dev/null 2>&1
}
rows_for() { # size clients: every system's rows of that shape
    size=$1 c=$2
    n=$(count_for "$size")
    [ "$c" = 1 ] && run_row "memcpy copy size=$size" memcpy - \
        "$KVP" bench-baseline --system memcpy --op copy --size "$size" --count "$n" --json
    run_row "tcp-raw put size=$size clients=$c" tcp-raw tcp \
        "$KVP" bench-baseline --system tcp-raw --op put --size "$size" --count "$n" --clients "$c" --json
    if [ -n "$RPORT" ]; then
        for op in put get; do
            run_row "redis $op size=$size clients=$c" redis tcp \
                "$KVP" bench-baseline --system redis --op "$op" --size "$size" --count "$n" \
                --clients "$c" --redis-port "$RPORT" --json
        done
    fi
    for trans in shm tcp; do
        for op in put get; do
            kvpool_row "$trans" "$op" "$size" "$c" "$n"
        done
    done
}
PREFIX_COUNT=4000 # keys stored; 1,000 lookups of 128 keys whatever the count
[ "$QUICK" = 1 ] && PREFIX_COUNT=1000
rep=0
while [ $rep -lt "$REPEAT" ]; do # what the checks need, first, REPEAT times over
    rows_for 1048576 1
    kvpool_row shm prefix 64 1 "$PREFIX_COUNT"
    kvpool_row tcp prefix 64 1 "$PREFIX_COUNT"
    rep=$((rep + 1))
done
rows_for 65536 1
rows_for 4194304 1
rows_for 1048576 8
rows_for 65536 8
rows_for 4194304 8

# ---------------------------------------------------------------- report
# Repeated rows become their median run (by GB/s; prefix rows by p50), with
# the number of runs.
python3 - "$ROWS" >"$TMP/agg.jsonl" <<'EOF'
import json, sys
groups = {}
for l in open(sys.argv[1]):
    if l.strip():
        r = json.loads(l)
        groups.setdefault((r["system"], r["transport"], r["op"], r["size"], r["clients"]), []).append(r)
for runs in groups.values():
    runs.sort(key=lambda r: -r["p50_us"] if r["op"] == "prefix" else r["gbps"])
    r = dict(runs[len(runs) // 2])
    r["runs"] = len(runs)
    print(json.dumps(r, separators=(",", ":")))
EOF
if [ "$JSON" = 1 ]; then
    cat "$TMP/agg.jsonl"
else
    python3 - "$TMP/agg.jsonl" "$NOTES" "$(elapsed)" "$REPEAT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
ORDER = {"memcpy": 0, "tcp-raw": 1, "redis": 2, "kvpool": 3}
OPS = {"copy": 0, "put": 1, "get": 2, "prefix": 3}
rows.sort(key=lambda r: (ORDER.get(r["system"], 9), r["transport"], r["op"] == "prefix", r["size"],
                         r["clients"], OPS.get(r["op"], 9)))
notes = [l.rstrip("\n") for l in open(sys.argv[2]) if l.strip()]

def find(system, op=None, size=None, clients=None, transport=None):
    for r in rows:
        if r["system"] == system and (op is None or r["op"] == op) and (size is None or r["size"] == size) \
           and (clients is None or r["clients"] == clients) and (transport is None or r["transport"] == transport):
            return r
    return None

def human(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return "%d %s" % (n // f, unit)
    return "%d B" % n

def ratio(a, b):
    return a / b if b else None

def fmt(x, spec="%.2f"):
    return "-" if x is None else spec % x

print("%-8s %-4s %-6s %8s %3s %9s %10s %10s  %8s %8s %9s" % (
    "system", "tr", "op", "size", "cl", "GB/s", "p50 us", "p99 us", "/memcpy", "/redis", "/tcp-raw"))
for r in rows:
    rm = rr = rt = None
    if r["system"] == "kvpool" and r["op"] in ("put", "get"):
        m = find("memcpy", size=r["size"])
        rm = ratio(r["gbps"], m["gbps"]) if m else None
        d = find("redis", r["op"], r["size"], r["clients"])
        rr = ratio(r["gbps"], d["gbps"]) if d else None
        if r["transport"] == "tcp":
            t = find("tcp-raw", "put", r["size"], r["clients"])
            rt = ratio(r["gbps"], t["gbps"]) if t else None
    gb = "-" if r["op"] == "prefix" else "%.3f" % r["gbps"]
    print("%-8s %-4s %-6s %8s %3d %9s %10.1f %10.1f  %8s %8s %9s" % (
        r["system"], r["transport"], r["op"], human(r["size"]), r["clients"], gb, r["p50_us"], r["p99_us"],
        fmt(rm), fmt(rr), fmt(rt)))
for n in notes:
    print(n)

print("\nchecks (1 client, 1 MiB; median of %s runs on a shared machine):" % sys.argv[4])
MiB = 1 << 20
def check(name, value, want, ok):
    if value is None:
        print("  %-52s n/a (row missing)" % name)
    else:
        print("  %-52s %-8s %s" % (name, value, "PASS" if ok else "FAIL (want %s)" % want))
for op in ("put", "get"):
    k = find("kvpool", op, MiB, 1, "shm")
    m = find("memcpy", size=MiB)
    d = find("redis", op, MiB, 1)
    t = find("tcp-raw", "put", MiB, 1)
    kt = find("kvpool", op, MiB, 1, "tcp")
    x = ratio(k["gbps"], m["gbps"]) if k and m else None
    check("kvpool shm %s / memcpy" % op, None if x is None else "%.2f" % x, ">= 0.50", x is not None and x >= 0.5)
    x = ratio(k["gbps"], d["gbps"]) if k and d else None
    check("kvpool shm %s / redis" % op, None if x is None else "%.2f" % x, ">= 3", x is not None and x >= 3)
    x = ratio(kt["gbps"], t["gbps"]) if kt and t else None
    check("kvpool tcp %s / tcp-raw" % op, None if x is None else "%.2f" % x, ">= 0.80", x is not None and x >= 0.8)
p = find("kvpool", "prefix", transport="shm")
check("kvpool shm prefix of 128 keys, p50 us", None if p is None else "%.1f" % p["p50_us"], "<= 60",
      p is not None and p["p50_us"] <= 60)
print("\n%d rows in %s s" % (len(rows), sys.argv[3]))
EOF
fi
[ "$JSON" = 1 ] && log "$(wc -l <"$TMP/agg.jsonl") rows, $(wc -l <"$NOTES") notes (above) in $(elapsed) s"
exit "$FAILED"
