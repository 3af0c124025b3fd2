#!/bin/sh
# `kvpool hash` against an independent Python implementation of vLLM's block
# hashes (Debian python3-cbor2 + hashlib + python3-xxhash): >= 200 random
# token sequences, both algorithms, with and without LoRA / salt / mm keys,
# every byte compared; plus bad-input exit codes.  See hash_ref.py.
set -eu
: "${KVP_BIN:?KVP_BIN must name the kvpool binary}"
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
if ! "$py" -c 'import cbor2, xxhash' 2>/dev/null; then
    echo "test_hash_vs_python: /usr/bin/python3 lacks cbor2 or xxhash (apt-get install python3-cbor2 python3-xxhash)" >&2
    exit 1
fi
# KVP_HASH_REF_SEED replays one run; otherwise each run draws new sequences.
if [ -n "${KVP_HASH_REF_SEED:-}" ]; then
    exec "$py" "$here/hash_ref.py" --count "${KVP_HASH_REF_COUNT:-240}" --rng-seed "$KVP_HASH_REF_SEED"
fi
exec "$py" "$here/hash_ref.py" --count "${KVP_HASH_REF_COUNT:-240}"
