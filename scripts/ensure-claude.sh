#!/bin/sh
# Make sure Claude Code is installed in the checkout's own .tools/claude (tests/clients/test_claude_cli.py
# runs it headless against the fake upstream). A pinned version from npm, never a global install,
# never an auto-update: quick and silent when that version is already there.
set -eu
VERSION=2.1.332
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX="$ROOT/.tools/claude"
MANIFEST="$PREFIX/node_modules/@anthropic-ai/claude-code/package.json"
if [ -x "$PREFIX/node_modules/.bin/claude" ] && [ -f "$MANIFEST" ] \
    && grep -q "\"version\": \"$VERSION\"" "$MANIFEST"; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "ensure-claude: npm is missing; install Node.js 18+ (Debian: nodejs npm)" >&2
    exit 1
fi
mkdir -p "$PREFIX"
npm install --prefix "$PREFIX" --no-audit --no-fund --no-save --loglevel=error \
    "@anthropic-ai/claude-code@$VERSION" >/dev/null
"$PREFIX/node_modules/.bin/claude" --version >/dev/null
