#!/bin/sh
# vLLM's own block hashing against kvpool's, inside the vLLM test venv
# (scripts/vllm-env.sh; release build only): with PYTHONHASHSEED=0 and
# without it (vLLM 0.32's fixed sha256_cbor seed), extra keys included.
# Exit 77 (ctest: skipped) where the disk cannot hold the venv.
set -u
SRC=${KVP_SOURCE_DIR:-.}
KVP=${KVP_BIN:-build/kvpool}
. "$SRC/tests/integration/checks.sh"
. "$SRC/tests/integration/vllm_venv.sh"
PY="$venv/bin/python"
export HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=ERROR KVPOOL_LIB="${KVP_LIB:-build/libkvpool.so}"
check vllm_hash_seed_0 env PYTHONHASHSEED=0 "$PY" "$SRC/tests/vllm/hash_vs_vllm.py" "$KVP" 1
check vllm_hash_seed_max env PYTHONHASHSEED=4294967295 "$PY" "$SRC/tests/vllm/hash_vs_vllm.py" "$KVP" 2
check vllm_hash_no_seed env -u PYTHONHASHSEED "$PY" "$SRC/tests/vllm/hash_vs_vllm.py" "$KVP" 3
checks_end
