#!/bin/sh
# Install context-proxy into a virtualenv: the one install step shared by `make` and the Dockerfile.
#   scripts/install.sh VENV [EXTRAS]      e.g. scripts/install.sh .venv test
set -eu
venv=${1:?usage: scripts/install.sh VENV [EXTRAS]}
extras=${2:-}
cd "$(dirname "$0")/.."
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
# pip byte-compiles on one core (39 of its 75 s on the CI machine); compileall -j 0 does it on all.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile -e ".${extras:+[$extras]}"
"$venv/bin/python" -m compileall -q -j 0 "$venv/lib" >/dev/null
