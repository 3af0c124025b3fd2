#!/bin/sh
# Mooncake for bench/vllm_side_by_side.py: python/requirements-bench.txt
# installed with `pip install --no-deps --target` into a directory outside
# the clone keyed by the file's hash (scripts/keyed-env.sh), never into the
# shared vLLM venv.  Creates it or reuses it; prints its path as the last
# line (put it on PYTHONPATH; mooncake_master is DIR/mooncake/mooncake_master).
#
#   KVPOOL_VENV_ROOT   where it lives (default /var/cache/kvpool)
#   KVPOOL_PYTHON      the interpreter whose pip installs it; its version must
#                      be the one that runs the bench (default python3)
#
# Exit 0: ready.  Exit 77: not enough disk (printed).  Else: install failed.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
req="$here/python/requirements-bench.txt"
py=${KVPOOL_PYTHON:-python3}
. "$here/scripts/keyed-env.sh"
if ! keyed_env_open mooncake "$req"; then
    keyed_env_need_gib 1 "the Mooncake install"
    echo "mooncake-env: installing into $keyed_dir (about 200 MB)" >&2
    "$py" -m pip install -q --disable-pip-version-check --no-deps --target "$keyed_dir" -r "$req" >&2
    keyed_env_done
fi
echo "$keyed_dir"
