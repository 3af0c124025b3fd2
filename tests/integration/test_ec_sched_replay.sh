#!/bin/sh
# The C EC scheduler against the original (ecsched-ref/ref.py): the samples
# plus every named mode (the --bad ones included) over a short setting.
# The full run is `../shared/tools/ecsched-ref/check.sh "build/kvpool ec-sched-replay"`.
set -eu
: "${KVP_BIN:?KVP_BIN must name the kvpool binary}"
: "${KVP_SHARED_DIR:?KVP_SHARED_DIR must name the shared directory}"
CHECK="$KVP_SHARED_DIR/tools/ecsched-ref/check.py"
if [ ! -f "$CHECK" ]; then
    echo "test_ec_sched_replay: $CHECK not found" >&2
    exit 1
fi
exec /usr/bin/python3 "$CHECK" --seeds 2 --steps 150 -j 2 "$KVP_BIN ec-sched-replay"
