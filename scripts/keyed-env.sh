# Sourced, not run: one home for the environments kept outside the clone
# (scripts/vllm-env.sh's vLLM venv, scripts/mooncake-env.sh's Mooncake
# install).  Each lives in $KVPOOL_VENV_ROOT (default /var/cache/kvpool) as
# NAME-<first 16 hex digits of the sha256 of its requirements file>, so a
# changed file makes a new one and a machine that comes back keeps the old;
# a .complete marker says it was fully built (anything without one is a
# partial build, removed and redone), and one flock on $root/.lock
# serialises every builder.
#
#   keyed_env_open NAME REQFILE   sets keyed_dir, takes the lock (held until
#                                 the caller exits); returns 0 when keyed_dir
#                                 is complete, 1 when the caller must build it
#                                 (it is removed first)
#   keyed_env_need_gib GIB WHAT   exit 77 with the reason when the root has
#                                 less than GIB GiB free
#   keyed_env_done                marks keyed_dir complete
keyed_env_open() { # NAME REQFILE
    keyed_name=$1
    keyed_root=${KVPOOL_VENV_ROOT:-/var/cache/kvpool}
    keyed_dir="$keyed_root/$1-$(sha256sum "$2" | cut -c1-16)"
    mkdir -p "$keyed_root"
    exec 9>"$keyed_root/.lock"
    flock 9
    [ -f "$keyed_dir/.complete" ] && return 0
    rm -rf "$keyed_dir"
    return 1
}

keyed_env_need_gib() { # GIB WHAT
    avail_kb=$(df -Pk "$keyed_root" | awk 'NR == 2 { print $4 }')
    if [ "$avail_kb" -lt $(($1 * 1024 * 1024)) ]; then
        echo "$keyed_name-env: skip: $keyed_root has $((avail_kb / 1024 / 1024)) GiB free; $2 needs about $1 GiB" >&2
        exit 77
    fi
}

keyed_env_done() {
    touch "$keyed_dir/.complete"
}
