#!/bin/sh
# Install the Debian packages kvpool's build and tests need, and only those
# that are missing.  Idempotent: when everything is present it does nothing
# (no apt-get update, no network).  Runs as root on Debian 12; as another
# user it only reports what is missing.
set -eu

PKGS="build-essential cmake pkg-config clang-14 libclang-rt-14-dev
libssl-dev libxxhash-dev
libucx-dev libmicrohttpd-dev libhiredis-dev libzmq3-dev
python3 python3-dev python3-venv python3-setuptools python3-wheel python3-cbor2 python3-xxhash python3-zmq"

missing=""
for p in $PKGS; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$st" in
        *"install ok installed"*) ;;
        *) missing="$missing $p" ;;
    esac
done

[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing Debian packages:$missing (run as root to install)" >&2
    exit 1
fi
echo "install-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
