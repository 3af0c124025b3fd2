#!/bin/sh
# The 64-connection mixed load of issue 3 for 20 s (make test runs it for 3 s):
# 4 processes x 16 threads, each its own connection to one kvpool server (two
# processes over UCX, two over kvpool's TCP transport), plus a fifth process
# whose 16 threads share one TCP-transport connection; every get verified
# byte for byte.  Usage: sh bench/soak.sh [seconds]
set -eu
cd "$(dirname "$0")/.."
KVP_TEST_LOAD_SECONDS=${1:-20} KVP_BIN=$PWD/build/kvpool KVP_TEST_TIMEOUT=600 \
    build/test_server test_server_64_connections_mixed_load_verified
