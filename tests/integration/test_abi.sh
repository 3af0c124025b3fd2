#!/bin/sh
# libkvpool.so is the public ABI and nothing else:
#   exports_match_headers  the dynamic symbols it defines are exactly the
#                          functions declared KVP_API in include/kvpool/*.h
#                          (nothing extra, no kvp__ internal, no third-party
#                          symbol; every declared function is there);
#   self_contained_link    a program using pool.h builds with only
#                          -Iinclude -L<build> -lkvpool and runs;
#   install_pkg_config     `cmake --install` into a DESTDIR leaves the library,
#                          the headers and a kvpool.pc with which the same
#                          program builds (pkg-config --cflags --libs kvpool).
set -u
SRC=${KVP_SOURCE_DIR:-.}
LIB=${KVP_LIB:-build/libkvpool.so}
BUILD=${KVP_BUILD_DIR:-$(dirname "$LIB")}
CC=${KVP_CC:-cc}
SAN=
[ -n "${KVP_SANITIZE:-}" ] && SAN="-fsanitize=address,undefined" # the .so leaves the runtime to the program
T=$(mktemp -d "${TMPDIR:-/tmp}/kvp-abi.XXXXXX")
trap 'rm -rf "$T"' EXIT
. "${KVP_SOURCE_DIR:-.}/tests/integration/checks.sh"

# The functions declared KVP_API: the headers through the preprocessor with
# KVP_API as a marker (comments and macros gone), each declaration on one
# line, the name the identifier just before its first "(".
declared() {
    for h in "$SRC"/include/kvpool/*.h; do
        echo "#include \"kvpool/$(basename "$h")\""
    done | $CC -E -P -DKVP_API=__kvp_api_marker__ -I"$SRC/include" - | tr '\n' ' ' | tr ';' '\n' |
        grep '__kvp_api_marker__' |
        sed -e 's/^.*__kvp_api_marker__//' -e 's/(.*$//' -e 's/[[:space:]]*$//' -e 's/^.*[^A-Za-z0-9_]//' | sort -u
}

exports_match_headers() {
    declared >"$T/declared"
    nm -D --defined-only "$LIB" | awk '{print $NF}' | sort -u >"$T/exported"
    [ -s "$T/declared" ] || { echo "  no KVP_API declaration parsed"; return 1; }
    comm -13 "$T/declared" "$T/exported" >"$T/extra"
    comm -23 "$T/declared" "$T/exported" >"$T/missing"
    echo "  $(wc -l <"$T/exported") exported, $(wc -l <"$T/declared") declared"
    [ -s "$T/extra" ] && { echo "  exported but not declared KVP_API:"; sed 's/^/    /' "$T/extra"; }
    [ -s "$T/missing" ] && { echo "  declared KVP_API but not exported:"; sed 's/^/    /' "$T/missing"; }
    [ ! -s "$T/extra" ] && [ ! -s "$T/missing" ]
}

cat >"$T/prog.c" <<'PROG'
#include <stdio.h>
#include <string.h>

#include "kvpool/pool.h"

int main(void)
{
    kvp_pool_t *p = NULL;
    kvp_status_t st = kvp_pool_open("embedded://?capacity=1MiB", &p);
    if (st != KVP_OK) {
        fprintf(stderr, "open: %s\n", kvp_status_str(st));
        return 1;
    }
    char val[] = "hello", out[16] = {0};
    kvp_key_t k = {"k", 1};
    kvp_iov_t in_iov = {val, sizeof val}, out_iov = {out, sizeof out};
    kvp_sgl_t in = {&in_iov, 1}, outs = {&out_iov, 1};
    kvp_key_result_t r;
    if (kvp_pool_put(p, &k, &in, 1, &r) != KVP_OK || kvp_pool_get(p, &k, &outs, 1, &r) != KVP_OK ||
        r.status != KVP_OK || r.size != sizeof val || strcmp(out, val) != 0) {
        fprintf(stderr, "put/get failed\n");
        return 1;
    }
    kvp_pool_close(p);
    printf("%s\n", out);
    return 0;
}
PROG

self_contained_link() {
    dir=$(cd "$(dirname "$LIB")" && pwd)
    # shellcheck disable=SC2086
    $CC $SAN "$T/prog.c" -I"$SRC/include" -L"$dir" -lkvpool -Wl,-rpath,"$dir" -o "$T/prog" &&
        [ "$("$T/prog")" = hello ]
}

install_pkg_config() {
    DESTDIR="$T/dest" cmake --install "$BUILD" --prefix /opt/kvp >"$T/install.log" 2>&1 ||
        { cat "$T/install.log"; return 1; }
    pc=$(find "$T/dest/opt/kvp" -name kvpool.pc)
    [ -n "$pc" ] || { echo "  no kvpool.pc installed"; return 1; }
    for h in "$SRC"/include/kvpool/*.h; do
        cmp -s "$h" "$T/dest/opt/kvp/include/kvpool/$(basename "$h")" || { echo "  $h not installed"; return 1; }
    done
    # the .pc names the prefix installed to; DESTDIR is a staging root only
    grep -qx 'prefix=/opt/kvp' "$pc" || { echo "  $pc:"; cat "$pc"; return 1; }
    flags=$(PKG_CONFIG_SYSROOT_DIR="$T/dest" PKG_CONFIG_LIBDIR=$(dirname "$pc") pkg-config --cflags --libs kvpool) ||
        return 1
    libdir=$(dirname "$(dirname "$pc")")
    # shellcheck disable=SC2086
    $CC $SAN "$T/prog.c" $flags -o "$T/prog2" && [ "$(LD_LIBRARY_PATH="$libdir" "$T/prog2")" = hello ]
}

check exports_match_headers exports_match_headers
check self_contained_link self_contained_link
check install_pkg_config install_pkg_config
checks_end
