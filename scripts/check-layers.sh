#!/bin/sh
# Layer direction (ARCHITECTURE.md §2): no file includes a header of a layer
# above it.
#
#   tools -> engine;  engine, tools, python -> kv, ec -> client -> cluster, net, store -> common
#   server -> net, store;   include/kvpool/ (the public headers) beneath all
#
# A file's layer is its folder (src/<layer>/, tools/, python/,
# include/kvpool/); an included header's is the first part of its quoted path
# ("kv/kv_sched_int.h" is kv, <kvpool/pool.h> and "kvpool/pool.h" are the
# public headers); a quoted name without a folder is the file's own layer.
# tools and engine reach the connectors through the public headers only (plus
# common/; tools also the server, which the `kvpool server` command runs, and
# tests/support/, whose scripted collaborators the replays plug in).  The
# tests and tests/support/ may include anything and are not checked.
#
# Usage: check-layers.sh [ROOT]    (default: the repository this script is in)
#        check-layers.sh --self-test
# Prints one line per violation, FILE:LINE: ...; exits 1 if there is any.
set -u

allowed() { # layer -> the layers it may include (itself first)
    case $1 in
    kvpool) echo "kvpool" ;;
    common) echo "common kvpool" ;;
    store | net | cluster) echo "$1 common kvpool" ;;
    server) echo "server net store common kvpool" ;;
    client) echo "client cluster net store common kvpool" ;;
    kv | ec) echo "$1 client cluster net store common kvpool" ;;
    engine) echo "engine common kvpool" ;;
    tools) echo "tools engine server support common kvpool" ;;
    python) echo "python kvpool" ;;
    *) echo "" ;;
    esac
}

KNOWN="kvpool common store net cluster server client kv ec engine tools python support"

# Known violations being removed elsewhere (FILE:HEADER), reported but not
# failed (none today).  A listed include that is gone is reported too, so
# the list cannot go stale.
PENDING=""

check_tree() { # root
    root=$1
    bad=0
    for dir in include/kvpool src tools python; do
        [ -d "$root/$dir" ] || continue
        find "$root/$dir" -type f \( -name '*.c' -o -name '*.h' \) | sort
    done >"$TMP/files"
    while read -r f; do
        rel=${f#"$root"/}
        case $rel in
        include/kvpool/*) layer=kvpool ;;
        src/*) layer=${rel#src/} layer=${layer%%/*} ;;
        tools/*) layer=tools ;;
        python/*) layer=python ;;
        esac
        ok=$(allowed "$layer")
        if [ -z "$ok" ]; then
            echo "$rel: folder '$layer' is not a layer of ARCHITECTURE.md §2 (add it to scripts/check-layers.sh)"
            bad=1
            continue
        fi
        # FILE:LINE:HEADER for each #include "x/y.h" or <kvpool/y.h>
        awk -v rel="$rel" '
            /^[ \t]*#[ \t]*include[ \t]*"[^"]*"/ {
                h = $0; sub(/^[^"]*"/, "", h); sub(/".*$/, "", h); print rel ":" FNR ":" h; next }
            /^[ \t]*#[ \t]*include[ \t]*<kvpool\// {
                h = $0; sub(/^[^<]*</, "", h); sub(/>.*$/, "", h); print rel ":" FNR ":" h }
        ' "$f" >"$TMP/incs"
        while IFS=: read -r file line hdr; do
            case $hdr in
            */*) to=${hdr%%/*} ;;
            *) continue ;; # a header of the file's own folder
            esac
            case " $KNOWN " in
            *" $to "*) ;;
            *) continue ;; # not ours (a library's own path)
            esac
            case " $ok " in
            *" $to "*) ;;
            *)
                if [ "$root" = "$ROOT" ] && printf '%s\n' $PENDING | grep -qx "$file:$hdr"; then
                    echo "$file:$line: $layer includes \"$hdr\" (pending: being replaced, see PENDING)"
                    echo "$file:$hdr" >>"$TMP/pending_seen"
                    continue
                fi
                echo "$file:$line: $layer includes \"$hdr\" ($to is not below $layer; $layer may include: $ok)"
                bad=1
                ;;
            esac
        done <"$TMP/incs"
    done <"$TMP/files"
    if [ "$root" = "$ROOT" ]; then
        for p in $PENDING; do
            grep -qx "$p" "$TMP/pending_seen" 2>/dev/null && continue
            echo "PENDING lists $p, which is no longer included: remove it from scripts/check-layers.sh"
            bad=1
        done
    fi
    return $bad
}

# A tree with three violations and two allowed includes of each kind: the
# check must find exactly the three, and pass the tree once they are gone.
self_test() {
    r=$TMP/tree
    mkdir -p "$r/include/kvpool" "$r/src/common" "$r/src/kv" "$r/src/server" "$r/tools"
    printf '#include "kvpool/status.h"\n#include <stdint.h>\n' >"$r/include/kvpool/a.h"
    printf '#include "common/alloc.h"\n' >"$r/include/kvpool/b.h"           # bad: public -> common
    printf '#include "common/log.h"\n#include "kvpool/hash.h"\n#include "local.h"\n' >"$r/src/common/ok.c"
    printf '  #  include "client/backend.h"\n' >"$r/src/common/up.c"           # bad: common -> client
    printf '#include "client/backend.h"\n#include <kvpool/pool.h>\n' >"$r/src/kv/ok.c"
    printf '#include "store/store.h"\n#include "net/wire.h"\n' >"$r/src/server/ok.c"
    printf '#include "server/server.h"\n#include "support/kv_scripted.h"\n' >"$r/tools/ok.c"
    printf '#include "common/log.h"\n#include "ec/ec_table.h"\n' >"$r/tools/bad.c" # bad: tools -> ec
    out=$(check_tree "$r")
    rc=$?
    n=$(printf '%s\n' "$out" | grep -c 'includes')
    if [ $rc -ne 1 ] || [ "$n" -ne 3 ] ||
        ! printf '%s\n' "$out" | grep -q '^include/kvpool/b.h:1: kvpool includes "common/alloc.h"' ||
        ! printf '%s\n' "$out" | grep -q '^src/common/up.c:1: common includes "client/backend.h"' ||
        ! printf '%s\n' "$out" | grep -q '^tools/bad.c:2: tools includes "ec/ec_table.h"'; then
        echo "self-test: expected exactly the 3 planted violations (rc 1), got rc $rc:"
        printf '%s\n' "$out"
        return 1
    fi
    rm "$r/include/kvpool/b.h" "$r/src/common/up.c" "$r/tools/bad.c"
    if ! out=$(check_tree "$r"); then
        echo "self-test: the clean tree was refused:"
        printf '%s\n' "$out"
        return 1
    fi
    mkdir -p "$r/src/nolayer" && printf '\n' >"$r/src/nolayer/x.c"
    if check_tree "$r" >/dev/null; then
        echo "self-test: a folder that is not a layer was accepted"
        return 1
    fi
    echo "self-test: ok (3 planted violations found, clean tree passed, unknown folder refused)"
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvp-layers.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
ROOT=
if [ "${1:-}" = --self-test ]; then
    self_test
    exit $?
fi
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
ROOT=$(cd "$ROOT" && pwd)
if check_tree "$ROOT"; then
    echo "layers: ok ($(wc -l <"$TMP/files") files)"
else
    exit 1
fi
