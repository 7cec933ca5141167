#!/bin/sh
# Make sure redis-server is on PATH (the Redis store's tests start a real one). CI starts from a
# fresh Debian machine as root, so install it from the distribution's packages when missing.
set -eu
if command -v redis-server >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-redis: redis-server is missing; run as root or install the redis-server package" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends redis-server >/dev/null
command -v redis-server >/dev/null
