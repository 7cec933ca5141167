#!/bin/sh
# Make sure Gemini CLI (npm's @google/gemini-cli) is installed in .tools/gemini/ of this checkout:
# tests/clients/test_gemini_cli.py runs it against the fake upstream. Quick when the right version is
# already there; otherwise one `npm install`.
set -eu
version=0.61.0
cd "$(dirname "$0")/.."
dir=.tools/gemini
gemini=$dir/node_modules/.bin/gemini
if [ -x "$gemini" ] && [ "$(HOME="${TMPDIR:-/tmp}" "$gemini" --version 2>/dev/null)" = "$version" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "ensure-gemini: npm is missing; install node and npm (the nodejs and npm packages)" >&2
    exit 1
fi
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "@google/gemini-cli@$version" >/dev/null
[ "$(HOME="${TMPDIR:-/tmp}" "$gemini" --version)" = "$version" ]
