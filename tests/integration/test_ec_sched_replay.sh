#!/bin/sh
# The C EC scheduler against the original (ecsched-ref/ref.py) running on the
# seed's real transfer table (`--table vllm`: vLLM's mooncake/state.py, read
# by path from the vLLM test venv of scripts/vllm-env.sh): the samples plus
# every named mode (the --bad ones included) over a short setting.  The full
# run is `ECSCHED_VLLM_STATE=<state.py> ../shared/tools/ecsched-ref/check.sh
# --table vllm "build/kvpool ec-sched-replay"`.
#
# ref.py runs under /usr/bin/python3 and only reads state.py (it does not
# load libkvpool), so this runs in the ASan build too.  Where the venv cannot
# be had (scripts/vllm-env.sh exits 77: no room for it) the check falls back
# to the table inferred from the spec on the modes where the two tables
# agree (producer-only, role none, no inbox: the six differences all need a
# consumer's inbox), and says that the real-table check was skipped.
set -eu
: "${KVP_BIN:?KVP_BIN must name the kvpool binary}"
: "${KVP_SHARED_DIR:?KVP_SHARED_DIR must name the shared directory}"
: "${KVP_SOURCE_DIR:?KVP_SOURCE_DIR must name the source directory}"
CHECK="$KVP_SHARED_DIR/tools/ecsched-ref/check.py"
if [ ! -f "$CHECK" ]; then
    echo "test_ec_sched_replay: $CHECK not found" >&2
    exit 1
fi
SHORT="--seeds 2 --steps 150 -j 2"

venv_rc=0
venv=$(sh "$KVP_SOURCE_DIR/scripts/vllm-env.sh") || venv_rc=$?
if [ "$venv_rc" = 77 ]; then
    echo "test_ec_sched_replay: SKIPPED the real-table check (--table vllm): no vLLM venv" \
        "(scripts/vllm-env.sh exited 77); checking the modes where the inferred table agrees instead"
    # shellcheck disable=SC2086
    exec /usr/bin/python3 "$CHECK" --table inferred --no-samples \
        --modes prod,prod-cec,prod-nocec,none,cons-noinbox,bad-prod $SHORT "$KVP_BIN ec-sched-replay"
fi
if [ "$venv_rc" != 0 ]; then
    echo "test_ec_sched_replay: FAIL scripts/vllm-env.sh exited $venv_rc" >&2
    exit 1
fi
venv=$(printf '%s\n' "$venv" | tail -n 1)
state=
for f in "$venv"/lib/python3*/site-packages/vllm/distributed/ec_transfer/ec_connector/mooncake/state.py; do
    [ -f "$f" ] && state=$f
done
if [ -z "$state" ]; then
    echo "test_ec_sched_replay: FAIL no vllm/.../mooncake/state.py in the vLLM venv $venv" >&2
    exit 1
fi
echo "test_ec_sched_replay: the real table: $state"
ECSCHED_VLLM_STATE=$state
export ECSCHED_VLLM_STATE
# shellcheck disable=SC2086
exec /usr/bin/python3 "$CHECK" --table vllm $SHORT "$KVP_BIN ec-sched-replay"
