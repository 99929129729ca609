#!/usr/bin/env bash
# Llama decode and prefill side by side with llama.cpp's llama-bench, on identical files, on a GPU
# machine (docs/performance.md, "Side by side with llama.cpp"):
#
#   scripts/gpu-llama-peer-bench.sh LAYOUT LLAMA_CPP_DIR TOKENIZER_DIR LLAMA_BENCH
#
# From the repo root with .dev/gpu/inferno.gz (scripts/gpu-tests.sh build). LAYOUT: a config
# under benches/configs (llama-3.2-1b, llama-3.1-8b); LLAMA_CPP_DIR holds convert_hf_to_gguf.py,
# conversion/ and gguf-py/ and LLAMA_BENCH is llama-bench, built as docs/performance.md,
# "Reproducing", says;
# TOKENIZER_DIR: the Llama 3.1 tokenizer (scripts/assets/llama3-tokenizer.sh). Writes a random
# bf16 checkpoint (scripts/fixtures/llama_random.py) and its bf16 and Q8_0 GGUFs (llama.cpp's
# converter) under ${TMPDIR:-/tmp}/llama-peer/LAYOUT, reused when there; then runs both engines
# on each file: -p 512 -n 128, 3 repetitions.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 4 ] || { sed -n 2,14p "$0"; exit 2; }
layout="$1" llama_cpp="$2" tokenizer="$3" llama_bench="$4"
work="${TMPDIR:-/tmp}/llama-peer/$layout"
mkdir -p "$work"
bin="$work/inferno"
gunzip -c .dev/gpu/inferno.gz >"$bin" && chmod +x "$bin"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ ! -f "$work/q8_0.gguf" ]; then
    python3 scripts/fixtures/llama_random.py "benches/configs/$layout.json" "$tokenizer" "$work/hf"
    for t in bf16 q8_0; do
        python3 "$llama_cpp/convert_hf_to_gguf.py" "$work/hf" --outtype "$t" --outfile "$work/$t.part" \
            >"$work/convert-$t.log" 2>&1 || { tail -20 "$work/convert-$t.log"; exit 1; }
        mv "$work/$t.part" "$work/$t.gguf"
    done
fi
for model in "$work/hf" "$work/bf16.gguf" "$work/q8_0.gguf"; do
    echo "== inferno $(basename "$model")"
    "$bin" bench "$model" -p 512 -n 128 -r 3 2>&1 | grep -E "^(format|prefill|decode)|rror" || true
done
for t in bf16 q8_0; do
    "$llama_bench" -m "$work/$t.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>&1 | grep -E "^\|"
done
