#!/bin/sh
# A/B of two kvpool binaries in one run: each binary gets its own server
# (shm: UCX's default transports; tcp: UCX_TLS=tcp for server and client,
# so kvpool's own TCP transport), both up at once, and the same rows as
# bench/compare.sh's checks (put and get of SIZE, one client, 512 values,
# the pool reset around each row) run for A and B alternately, the order
# swapped every round, so both see the same machine at the same time.
# Prints, per row, the median GB/s and p50 of each binary over the rounds,
# and B/A.  On a noisy VM trust the medians of many rounds, not one.
#
# Usage: sh bench/ab.sh A_BIN B_BIN [--rounds N] [--size SIZE] [--json]
#   default 12 rounds of 1MiB; --json: one JSON object per row on stdout
set -u
A=${1:?usage: sh bench/ab.sh A_BIN B_BIN [--rounds N] [--size SIZE] [--json]}
B=${2:?usage: sh bench/ab.sh A_BIN B_BIN [--rounds N] [--size SIZE] [--json]}
shift 2
ROUNDS=12 SIZE=1MiB JSON=0
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS=$2; shift ;;
        --size) SIZE=$2; shift ;;
        --json) JSON=1 ;;
        *) echo "ab: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
TMP=$(mktemp -d /tmp/kvp-ab-XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

tls_env() { if [ "$1" = tcp ]; then echo "UCX_TLS=tcp"; else echo "-u UCX_TLS"; fi; }

# start BIN NAME TRANSPORT: a server; its URI in $TMP/NAME.uri
start() {
    env $(tls_env "$3") "$1" server --listen 127.0.0.1:0 --port-file "$TMP/$2.port" --memory 2GiB \
        --log-level error >"$TMP/$2.log" 2>&1 &
    PIDS="$PIDS $!"
    i=0
    while [ ! -s "$TMP/$2.port" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    [ -s "$TMP/$2.port" ] || { echo "ab: the $2 server did not start: $(tail -n 1 "$TMP/$2.log")" >&2; exit 1; }
    sleep 0.1
    echo "kvpool://127.0.0.1:$(tr -dc 0-9 <"$TMP/$2.port")" >"$TMP/$2.uri"
}
for t in shm tcp; do
    start "$A" "a-$t" "$t"
    start "$B" "b-$t" "$t"
done
echo "ab: A=$A B=$B, $ROUNDS rounds of $SIZE" >&2

: >"$TMP/rows"
r=1
while [ $r -le "$ROUNDS" ]; do
    order="a b"
    [ $((r % 2)) = 0 ] && order="b a"
    for t in shm tcp; do
        for op in put get; do
            for v in $order; do
                if [ $v = a ]; then bin=$A; else bin=$B; fi
                u=$(cat "$TMP/$v-$t.uri")
                e=$(tls_env "$t")
                env $e "$bin" reset "$u" --timeout 30000 >/dev/null 2>&1
                [ $op = get ] && env $e "$bin" bench --uri "$u" --op put --size "$SIZE" --count 512 >/dev/null 2>&1
                line=$(env $e "$bin" bench --uri "$u" --op $op --size "$SIZE" --count 512 --json 2>/dev/null | tail -n 1)
                echo "$v $t $op $line" >>"$TMP/rows"
            done
        done
    done
    echo "ab: round $r of $ROUNDS" >&2
    r=$((r + 1))
done

python3 - "$TMP/rows" "$JSON" "$SIZE" <<'EOF'
import json, statistics, sys
rows, as_json, size = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
data = {}
for l in open(rows):
    v, t, op, js = l.split(" ", 3)
    try:
        j = json.loads(js)
    except ValueError:
        continue
    data.setdefault((t, op), {}).setdefault(v, []).append(j)
if not as_json:
    print("%-4s %-4s %6s  %10s %10s %7s  %9s %9s" % ("tr", "op", "size", "A GB/s", "B GB/s", "B/A", "A p50us", "B p50us"))
for (t, op), by in sorted(data.items()):
    a, b = by.get("a", []), by.get("b", [])
    if not a or not b:
        continue
    med = lambda xs, k: statistics.median(x[k] for x in xs)
    ga, gb, pa, pb = med(a, "gbps"), med(b, "gbps"), med(a, "p50_us"), med(b, "p50_us")
    if as_json:
        print(json.dumps({"transport": t, "op": op, "size": size, "rounds": min(len(a), len(b)),
                          "a_gbps": ga, "b_gbps": gb, "ratio": gb / ga, "a_p50_us": pa, "b_p50_us": pb}))
    else:
        print("%-4s %-4s %6s  %10.2f %10.2f %7.2f  %9.1f %9.1f" % (t, op, size, ga, gb, gb / ga, pa, pb))
EOF
