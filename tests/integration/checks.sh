# The integration tests' checks: `. "$SRC/tests/integration/checks.sh"`,
# then `check NAME COMMAND...` per check (ok/FAIL line each), and
# `checks_end` last (the counts, and the script's exit status).
pass=0
fail=0
check() { # name, command...
    name=$1
    shift
    if "$@"; then pass=$((pass + 1)); echo "ok   $name"; else fail=$((fail + 1)); echo "FAIL $name"; fi
}
checks_end() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
