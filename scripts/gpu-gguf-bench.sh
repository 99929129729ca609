#!/usr/bin/env bash
# gpt-oss GGUF speed on a GPU machine: inferno on a GGUF written by llama.cpp's own converter,
# against inferno on the HF checkpoint it came from and, when given, llama.cpp's llama-bench on
# the same file (docs/performance.md, "Side by side with llama.cpp").
#
#   scripts/gpu-gguf-bench.sh LLAMA_CPP_DIR TOKENIZER_JSON [LLAMA_BENCH]
#
# From the repo root with .dev/gpu/inferno.gz (scripts/gpu-tests.sh build). LLAMA_CPP_DIR holds
# convert_hf_to_gguf.py, conversion/ and gguf-py/ (as scripts/fixtures/gpt_oss_gguf.sh caches
# them from the llama-cpp-python 0.3.36 sdist); TOKENIZER_JSON is gpt-oss's tokenizer.json
# (scripts/assets/gptoss-tokenizer.sh). LLAMA_BENCH: a llama-bench built there (docs/performance.md,
# "Reproducing"). Writes a random checkpoint in the exact gpt-oss-20b layout
# (13.8 GB, ~25 s) and its GGUF (12.1 GB, ~65 s) under ${TMPDIR:-/tmp}/gguf-bench, or reuses
# them; GGUF_BENCH_PREPARE_ONLY=1 stops after writing them (to split the work over two calls).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,14p "$0"; exit 2; }
llama_cpp="$1" tokenizer="$2" llama_bench="${3:-}"
work="${TMPDIR:-/tmp}/gguf-bench"
mkdir -p "$work"
bin="$work/inferno"
gunzip -c .dev/gpu/inferno.gz >"$bin" && chmod +x "$bin"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# A warm machine keeps /tmp between calls: the files of an earlier call are reused.
if [ ! -f "$work/oss20b.gguf" ]; then
    python3 scripts/fixtures/gpt_oss_20b_random.py benches/configs/gpt-oss-20b.json "$work/hf" --checkpoint-only
    cp "$tokenizer" "$work/hf/tokenizer.json"
    python3 "$llama_cpp/convert_hf_to_gguf.py" "$work/hf" --outtype q8_0 --outfile "$work/oss20b.gguf.part" \
        >"$work/convert.log" 2>&1 || { tail -20 "$work/convert.log"; exit 1; }
    mv "$work/oss20b.gguf.part" "$work/oss20b.gguf"
fi
[ "${GGUF_BENCH_PREPARE_ONLY:-0}" = 1 ] && { ls -la "$work"; exit 0; }
for model in "$work/oss20b.gguf" "$work/hf"; do
    for c in 1 8; do
        "$bin" bench "$model" -p 512 -n 128 -r 3 -c "$c" --json >"$work/bench.json"
        python3 - "$model" "$c" "$work/bench.json" <<'PY'
import json, sys
model, c, path = sys.argv[1:]
r = json.load(open(path))
rate = r["decode_tok_s"] if c == "1" else r["full_batch_decode_tok_s"]
print(f"inferno {r['format']:<18} c={c}  pp512 {r['prefill_tok_s']:9.1f}  decode {rate:8.1f} tok/s"
      f"  load {r['load_seconds']:.1f} s  device {r['model_device_bytes'] / 1e9:.2f} GB")
PY
    done
done
if [ -n "$llama_bench" ]; then
    "$llama_bench" -m "$work/oss20b.gguf" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md
fi
