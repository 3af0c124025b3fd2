#!/bin/sh
# Layer direction (ARCHITECTURE.md §2): scripts/check-layers.sh first proves
# it refuses a tree with planted upward includes (--self-test), then checks
# this repository.
set -u
SRC=${KVP_SOURCE_DIR:-.}
sh "$SRC/scripts/check-layers.sh" --self-test || exit 1
sh "$SRC/scripts/check-layers.sh" "$SRC"
