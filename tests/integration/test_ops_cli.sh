#!/bin/sh
# The operator commands (`kvpool put|get|exists|rm|reset|stats`) as people and
# scripts use them.  Every call is a new process, so an embedded:// pool is
# empty each time: against it this checks output formats, exit statuses and
# the one-line errors.  With KVP_TEST_SERVER_URI=kvpool://HOST:PORT (a running
# server, which this test then owns: it is reset), or else against a server
# it starts itself when this kvpool has one, it also runs the whole
# put -> exists -> get (byte-compared) -> rm -> reset flow.
# Exit statuses: 0 ok, 1 key not found, 2 bad command line, 3 other errors.
set -u
KVP=${KVP_BIN:-build/kvpool}
SRC=${KVP_SOURCE_DIR:-.}
EMB='embedded://?capacity=4MiB'
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-ops.XXXXXX")
trap 'rm -rf "$T"' EXIT
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"

# expect_err RC CMD...: exits exactly RC with exactly one line on stderr,
# "kvpool <cmd>: ...", and nothing on stdout.
expect_err() {
    want=$1
    shift
    "$KVP" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    lines=$(wc -l <"$T/err")
    if [ "$rc" != "$want" ] || [ "$lines" != 1 ] || ! grep -q "^kvpool $1: " "$T/err" || [ -s "$T/out" ]; then
        echo "  want rc $want and one stderr line; got rc $rc, $lines lines:" >&2
        sed 's/^/    stderr: /' "$T/err" >&2
        sed 's/^/    stdout: /' "$T/out" | head -n 3 >&2
        return 1
    fi
    return 0
}

# expect_ok CMD...: exits 0 with nothing on stderr; stdout kept in $T/out.
expect_ok() {
    "$KVP" "$@" >"$T/out" 2>"$T/err"
    rc=$?
    if [ "$rc" != 0 ] || [ -s "$T/err" ]; then
        echo "  want rc 0, quiet stderr; got rc $rc:" >&2
        sed 's/^/    stderr: /' "$T/err" >&2
        return 1
    fi
    return 0
}

head -c 3000 /dev/urandom >"$T/small"
: >"$T/empty"
mkdir "$T/dir"
echo keep >"$T/keep"

# ---------------------------------------------------------------- help and usage
for c in put get exists rm reset stats; do
    check "help_$c" sh -c "'$KVP' $c --help | grep -q '^usage: kvpool $c '"
done
check usage_missing_args expect_err 2 put "$EMB" k1
check usage_too_many expect_err 2 rm "$EMB" k1 k2
check usage_unknown_option expect_err 2 exists "$EMB" k1 --frobnicate
check usage_bad_timeout expect_err 2 get "$EMB" k1 "$T/x" --timeout 0
check usage_bad_timeout_text expect_err 2 get "$EMB" k1 "$T/x" --timeout soon
LONGKEY=$(printf '%0513d' 0)
check usage_key_too_long expect_err 2 exists "$EMB" "$LONGKEY"
check usage_json_only_stats expect_err 2 exists "$EMB" k1 --json

# ---------------------------------------------------------------- embedded pool
check exists_empty_pool sh -c "'$KVP' exists '$EMB' a b c >'$T/out' && printf '0\n0\n0\n' | cmp -s - '$T/out'"
check exists_repeated_key_answers_each sh -c "'$KVP' exists '$EMB' a a b a >'$T/out' && printf '0\n0\n0\n0\n' | cmp -s - '$T/out'"
check exists_key_after_dashdash sh -c "'$KVP' exists '$EMB' -- --not-an-option >'$T/out' && printf '0\n' | cmp -s - '$T/out'"
check put_file expect_ok put "$EMB" k1 "$T/small"
check put_stdin sh -c "'$KVP' put '$EMB' k1 - <'$T/small'"
check put_quiet_stdout sh -c "[ -z \"\$('$KVP' put '$EMB' k1 '$T/small')\" ]"
check put_max_key expect_ok put "$EMB" "$(printf '%0512d' 0)" "$T/small"
check put_missing_file expect_err 3 put "$EMB" k1 "$T/nope"
check put_empty_file expect_err 3 put "$EMB" k1 "$T/empty"
check put_directory expect_err 3 put "$EMB" k1 "$T/dir"
check put_unreadable_proc_mem expect_err 3 put "$EMB" k1 /proc/self/mem
if [ "$(id -u)" != 0 ]; then
    cp "$T/small" "$T/noread" && chmod 000 "$T/noread"
    check put_unreadable_mode expect_err 3 put "$EMB" k1 "$T/noread"
fi
check get_missing_key expect_err 1 get "$EMB" k1 "$T/got"
check get_missing_leaves_no_file test ! -e "$T/got"
check get_missing_keeps_old_file sh -c "'$KVP' get '$EMB' k1 '$T/keep' 2>/dev/null; [ \$? = 1 ] && [ \"\$(cat '$T/keep')\" = keep ]"
check get_missing_no_temp_files sh -c "[ -z \"\$(ls '$T' | grep kvpool-tmp)\" ]"
check get_missing_stdout expect_err 1 get "$EMB" k1 -
check rm_missing expect_err 1 rm "$EMB" k1
check rm_missing_force expect_ok rm -f "$EMB" k1
check reset_empty sh -c "'$KVP' reset '$EMB' >'$T/out' && printf '0\n' | cmp -s - '$T/out'"
check stats_human sh -c "'$KVP' stats 'embedded://?capacity=64MiB' >'$T/out' && grep -q '64.0 MiB' '$T/out' && grep -q 'committed 0 = live 0 + evicted 0 + removed 0 + reset 0.*(holds)' '$T/out'"
# --json carries every field of kvp_pool_stats_t (read from pool.h) and the identity.
stats_json_ok() {
    "$KVP" stats 'embedded://?capacity=64MiB' --json >"$T/out" || return 1
    /usr/bin/python3 - "$SRC/include/kvpool/pool.h" "$T/out" <<'EOF'
import json, re, sys
h = open(sys.argv[1]).read()
body = re.search(r"typedef struct kvp_pool_stats \{(.*?)\} kvp_pool_stats_t;", h, re.S).group(1)
fields = re.findall(r"uint64_t\s+(\w+);", body)
lines = open(sys.argv[2]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
missing = [f for f in fields if f not in r]
assert fields and not missing, missing
assert r["identity_holds"] is True, r
assert r["capacity_bytes"] > 60 << 20 and r["live"] == 0, r
EOF
}
check stats_json_all_fields stats_json_ok
check stats_human_lists_all_fields sh -c "
    '$KVP' stats 'embedded://?capacity=64MiB' >'$T/out' || exit 1
    for f in \$(sed -n '/typedef struct kvp_pool_stats {/,/} kvp_pool_stats_t;/p' '$SRC/include/kvpool/pool.h' |
               sed -n 's/^ *uint64_t *\\([a-z_]*\\);.*/\\1/p'); do
        grep -q \"^  \$f \" '$T/out' || { echo \"  missing \$f\" >&2; exit 1; }
    done"

# ---------------------------------------------------------------- bad URIs, unreachable servers
bad_uri_args() { # command uri -> that command's arguments with the URI
    case "$1" in
        exists | rm) echo "$1|$2|k1" ;;
        put) echo "$1|$2|k1|$T/small" ;;
        get) echo "$1|$2|k1|$T/got" ;;
        *) echo "$1|$2" ;;
    esac
}
for c in exists put get rm reset stats; do
    for u in 'nope://x' 'no-scheme' 'embedded://?capacity=banana' 'embedded://?frob=1'; do
        oldifs=$IFS
        IFS='|'
        set -f
        # shellcheck disable=SC2046
        set -- $(bad_uri_args "$c" "$u")
        set +f
        IFS=$oldifs
        check "bad_uri_${c}_$(echo "$u" | tr -c 'a-z0-9\n' _)" expect_err 3 "$@"
    done
done
# A refused connection and an address that never answers both fail with one
# line within the call timeout (plus start-up), whatever the backend does.
timed_err() { # max_seconds, args...
    max=$1
    shift
    t0=$(date +%s)
    expect_err 3 "$@" || return 1
    [ $(($(date +%s) - t0)) -le "$max" ] || { echo "  took over ${max}s" >&2; return 1; }
}
check unreachable_refused timed_err 6 exists kvpool://127.0.0.1:1 k1 --timeout 2000
check unreachable_blackhole timed_err 6 get kvpool://10.255.255.1:7000 k1 "$T/got" --timeout 2000
check unreachable_stats timed_err 6 stats kvpool://10.255.255.1:7000 --timeout 2000
check unreachable_leaves_no_file test ! -e "$T/got"
# A peer that accepts connections and never says a word.
/usr/bin/python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen(64)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
conns = []
while True:
    c, _ = s.accept()
    conns.append(c)
' "$T/silent.port" &
SILENT=$!
trap 'kill $SILENT 2>/dev/null; rm -rf "$T"' EXIT
i=0
while [ ! -s "$T/silent.port" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
SP=$(cat "$T/silent.port" 2>/dev/null)
check silent_server_get timed_err 5 get "kvpool://127.0.0.1:$SP" k1 "$T/got" --timeout 1500
check silent_server_exists timed_err 5 exists "kvpool://127.0.0.1:$SP" k1 --timeout 1500
check silent_server_stats timed_err 5 stats "kvpool://127.0.0.1:$SP" --timeout 1500
check silent_server_leaves_no_file test ! -e "$T/got"
kill $SILENT 2>/dev/null

# ---------------------------------------------------------------- against a server
# KVP_TEST_SERVER_URI names one to use; otherwise, when this kvpool has a
# server command and the kvpool:// backend, the test starts its own.
SRV_PID=""
if [ -z "${KVP_TEST_SERVER_URI:-}" ] && "$KVP" server --help >/dev/null 2>&1; then
    "$KVP" server --listen 127.0.0.1:0 --port-file "$T/server.port" --memory 64MiB --log-level error \
        >"$T/server.log" 2>&1 &
    SRV_PID=$!
    trap 'kill $SRV_PID 2>/dev/null; wait $SRV_PID 2>/dev/null; rm -rf "$T"' EXIT
    i=0
    while [ ! -s "$T/server.port" ] && kill -0 "$SRV_PID" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    sleep 0.1
    port=$(tr -dc 0-9 <"$T/server.port" 2>/dev/null)
    if [ -n "$port" ] && "$KVP" stats "kvpool://127.0.0.1:$port" --timeout 5000 >/dev/null 2>"$T/err"; then
        KVP_TEST_SERVER_URI="kvpool://127.0.0.1:$port"
        echo "using a server started here: $KVP_TEST_SERVER_URI"
    elif grep -q 'not part of this build\|not supported' "$T/err"; then
        echo "skip own server: the kvpool:// backend is not in this build"
    else
        fail=$((fail + 1))
        echo "FAIL own_server_start: $(cat "$T/err") $(tail -n 2 "$T/server.log")"
    fi
fi
if [ -n "${KVP_TEST_SERVER_URI:-}" ]; then
    S=$KVP_TEST_SERVER_URI
    head -c 1500000 /dev/urandom >"$T/big" # over the first 1 MiB get buffer
    check srv_reset expect_ok reset "$S"
    check srv_exists_before sh -c "'$KVP' exists '$S' kA kB >'$T/out' && printf '0\n0\n' | cmp -s - '$T/out'"
    check srv_put_small expect_ok put "$S" kA "$T/small"
    check srv_put_big expect_ok put "$S" kB "$T/big"
    check srv_put_existing expect_ok put "$S" kA "$T/big"
    check srv_exists_after sh -c "'$KVP' exists '$S' kA kC kB kA >'$T/out' && printf '1\n0\n1\n1\n' | cmp -s - '$T/out'"
    check srv_get_small sh -c "'$KVP' get '$S' kA '$T/gotA' && cmp -s '$T/small' '$T/gotA'"
    check srv_get_big sh -c "'$KVP' get '$S' kB '$T/gotB' && cmp -s '$T/big' '$T/gotB'"
    check srv_get_stdout sh -c "'$KVP' get '$S' kB - | cmp -s '$T/big' -"
    check srv_get_overwrites sh -c "cp '$T/keep' '$T/gotK' && '$KVP' get '$S' kA '$T/gotK' && cmp -s '$T/small' '$T/gotK'"
    check srv_stats_json sh -c "'$KVP' stats '$S' --json | /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r[\"identity_holds\"] and r[\"live\"] >= 2 and r[\"put_existed\"] >= 1, r'"
    check srv_rm expect_ok rm "$S" kA
    check srv_rm_again expect_err 1 rm "$S" kA
    check srv_get_removed expect_err 1 get "$S" kA "$T/gotR"
    check srv_exists_after_rm sh -c "'$KVP' exists '$S' kA kB >'$T/out' && printf '0\n1\n' | cmp -s - '$T/out'"
    check srv_reset_counts sh -c "[ \"\$('$KVP' reset '$S')\" = 1 ]"
    check srv_exists_after_reset sh -c "'$KVP' exists '$S' kA kB >'$T/out' && printf '0\n0\n' | cmp -s - '$T/out'"
    check srv_stats_human sh -c "'$KVP' stats '$S' | grep -q '(holds)'"
    # bench with one connection per thread: every get verified by size, no errors
    check srv_bench_conns sh -c "'$KVP' bench --uri '$S' --op get --size 64KiB --count 90 --threads 3 --conns 3 --json |
        /usr/bin/python3 -c 'import json, sys; r = json.loads(sys.stdin.read()); assert r[\"errors\"] == 0 and r[\"gbps\"] > 0, r'"
    check srv_reset_after_bench expect_ok reset "$S"
    if [ -n "$SRV_PID" ]; then
        check srv_still_running kill -0 "$SRV_PID"
        if [ "$fail" != 0 ]; then
            echo "  server log (last lines):"
            tail -n 15 "$T/server.log" | sed 's/^/    /'
        fi
        kill "$SRV_PID" 2>/dev/null
        wait "$SRV_PID" 2>/dev/null
        # a stopped server: one line, exit 3, quickly
        check srv_stopped_exists timed_err 5 exists "$S" kA --timeout 2000
    fi
else
    echo "skip server flow (set KVP_TEST_SERVER_URI=kvpool://HOST:PORT to run it)"
fi

checks_end
