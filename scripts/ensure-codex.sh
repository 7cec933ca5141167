#!/bin/sh
# Make sure Codex CLI (npm's @openai/codex, a prebuilt binary inside the package) is installed in
# .tools/codex/ of this checkout: tests/clients/test_codex_cli.py runs it against the fake upstream.
# Quick when the right version is already there; otherwise one `npm install` (~100 MB).
set -eu
version=0.171.0
cd "$(dirname "$0")/.."
dir=.tools/codex
codex=$dir/node_modules/.bin/codex
if [ -x "$codex" ] && [ "$("$codex" --version 2>/dev/null)" = "codex-cli $version" ]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "ensure-codex: npm is missing; install node and npm (the nodejs and npm packages)" >&2
    exit 1
fi
mkdir -p "$dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "@openai/codex@$version" >/dev/null
[ "$("$codex" --version)" = "codex-cli $version" ]
