#!/usr/bin/env bash
# Installs the pinned Codex CLI (@openai/codex, which speaks only the Responses API) from npm
# into a cache folder, for tests/serve_codex.rs, and prints the path of its `codex` command.
# Idempotent: does nothing when that version is there.
#
# Installs into ${INFERNO_CACHE:-$HOME/.cache/inferno}/codex-$VERSION.
set -euo pipefail

VERSION=0.169.0
DEST="${INFERNO_CACHE:-$HOME/.cache/inferno}/codex-$VERSION"
BIN="$DEST/node_modules/.bin/codex"

if [[ ! -x "$BIN" ]] || ! "$BIN" --version 2>/dev/null | grep -q "$VERSION"; then
    command -v npm >/dev/null || { echo "codex-cli.sh: npm is needed to install @openai/codex" >&2; exit 1; }
    echo "codex-cli.sh: installing @openai/codex@$VERSION into $DEST" >&2
    rm -rf "$DEST.part"
    mkdir -p "$DEST.part"
    npm install --silent --no-audit --no-fund --prefix "$DEST.part" "@openai/codex@$VERSION" >&2
    rm -rf "$DEST"
    mv "$DEST.part" "$DEST"
fi
echo "$BIN"
