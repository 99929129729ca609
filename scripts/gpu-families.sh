#!/usr/bin/env bash
# The model families beside llama.cpp on one GPU, same call, same files: for each config in
# benches/configs named on the command line (qwen3-8b, ...), a random-weight checkpoint written
# by transformers' own model class (scripts/fixtures/llama_random.py) with the family's real
# tokenizer, its bf16 GGUF by llama.cpp's converter and a Q4_K_M by llama-quantize; then
# `inferno bench` on each file at 1, 8 and 64 streams and llama.cpp's llama-bench (one stream)
# and llama-batched-bench (8 and 64) on the GGUFs. Files are written once under
# ${TMPDIR:-/tmp}/families and reused by a later call on the same machine.
#
#   scripts/gpu-families.sh INFERNO LLAMA_CPP_DIR LLAMA_BIN_DIR TOKENIZER_DIR CONFIG...
#
# LLAMA_CPP_DIR holds convert_hf_to_gguf.py, LLAMA_BIN_DIR llama-bench, llama-batched-bench and
# llama-quantize (built as docs/performance.md, "Reproducing", says); TOKENIZER_DIR the family's
# tokenizer.json and tokenizer_config.json. Prints one line per measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 5 ] || { sed -n 2,15p "$0"; exit 2; }
inferno="$1" llama_cpp="$2" bin="$3" tok="$4"
shift 4
w="${TMPDIR:-/tmp}/families"
mkdir -p "$w"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
for name in "$@"; do
    hf="$w/$name-hf" bf16="$w/$name-bf16.gguf" q4="$w/$name-q4km.gguf"
    if [ ! -f "$q4" ]; then
        t=$SECONDS
        python3 scripts/fixtures/llama_random.py "benches/configs/$name.json" "$tok" "$hf"
        python3 "$llama_cpp/convert_hf_to_gguf.py" "$hf" --outtype bf16 --outfile "$bf16" >"$w/convert-$name.log" 2>&1 \
            || { tail -20 "$w/convert-$name.log"; exit 1; }
        "$bin/llama-quantize" "$bf16" "$q4.part" Q4_K_M >"$w/quantize-$name.log" 2>&1 \
            || { tail -20 "$w/quantize-$name.log"; exit 1; }
        mv "$q4.part" "$q4"
        echo "$name: files written in $((SECONDS - t)) s"
    fi
    for m in "$hf" "$bf16" "$q4"; do
        for c in 1 8 64; do
            p=512; [ "$c" -gt 1 ] && p=128
            "$inferno" bench "$m" -c "$c" -p "$p" -n 128 -r 3 --json >"$w/bench.json" 2>"$w/bench.err" \
                || { echo "inferno $(basename "$m") c$c: failed"; tail -3 "$w/bench.err"; continue; }
            python3 - "$(basename "$m")" "$c" "$w/bench.json" <<'PY'
import json, sys
m, c, path = sys.argv[1:]
r = json.load(open(path))
if c == "1":
    print(f"inferno {m} ({r['format']}) c1: pp512 {r['prefill_tok_s']:.1f}, tg128 {r['decode_tok_s']:.1f} tok/s")
else:
    print(f"inferno {m} ({r['format']}) c{c}: all-streams decode {r['full_batch_decode_tok_s']:.1f} tok/s")
PY
        done
    done
    for m in "$bf16" "$q4"; do
        "$bin/llama-bench" -m "$m" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>&1 | grep -E "^\| [a-z]" | sed "s|^|llama-bench $(basename "$m") |"
        "$bin/llama-batched-bench" -m "$m" -ngl 99 -fa on -c 20000 -npp 128 -ntg 128 -npl 8,64 2>&1 \
            | grep -E "^\|\s+[0-9]" | sed "s|^|llama-batched-bench $(basename "$m") |"
    done
done
