#!/bin/sh
# The embedded-pool numbers of issue 2, each in one run with its memcpy
# baseline: 1 MiB put/get (2,000 distinct objects), exists and prefix
# (keys/s on one thread), and 1 M objects of 4 KiB in an 8 GiB pool (put/get
# rates and index bytes per object).  Prints one JSON line per result.
# Usage: sh bench/embedded.sh [path/to/kvpool]   (about 2 minutes, ~20 GiB RAM)
set -eu
KVP=${1:-build/kvpool}
run() { "$KVP" bench --json "$@"; }
run --uri 'embedded://?capacity=4GiB' --op put --size 1MiB --count 2000
run --uri 'embedded://?capacity=4GiB' --op get --size 1MiB --count 2000
run --uri 'embedded://?capacity=4GiB' --op mixed --size 1MiB --count 2000
run --uri 'embedded://?capacity=4GiB' --op put --size 1MiB --count 2000 --threads 2
run --uri 'embedded://?capacity=4GiB' --op get --size 1MiB --count 2000 --threads 2
run --uri 'embedded://?capacity=1GiB' --op exists --size 64 --count 100000
run --uri 'embedded://?capacity=1GiB' --op prefix --size 64 --count 100000
run --uri 'embedded://?capacity=8GiB' --op put --size 4KiB --count 1000000
run --uri 'embedded://?capacity=8GiB' --op get --size 4KiB --count 1000000
