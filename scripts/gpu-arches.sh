#!/usr/bin/env bash
# The older architectures' kernel paths, tested and timed on a newer GPU (docs/cuda-build.md):
# builds whose kernels are PTX alone for compute capability XY, which the driver compiles with
# __CUDA_ARCH__ = XY0, so every branch an sm_XY GPU takes runs, against the same references.
#
#   scripts/gpu-arches.sh pack NAME SPEC [TEST...]   # here: builds with CUDA_COMPUTE_CAP=SPEC
#       (e.g. compute_80; `all` for the default build) the inferno binary and the lib's test
#       binary (every kernel's GPU test) plus the named integration tests, stripped and
#       xz-compressed, into .dev/arch-NAME/
#   scripts/gpu-arches.sh run NAME... [-- TEST ARGS]  # on the GPU machine: for each pack, the GPU
#       tests of its binaries, `doctor`, and the decode benchmarks of BENCH_LAYOUTS (default
#       gpt-oss-20b llama-3.2-1b; random weights, -p 512 -n 128 -r 3); a table last
#   scripts/gpu-arches.sh peer LLAMA_CPP_DIR LLAMA_BENCH GPTOSS_TOKENIZER_JSON LLAMA3_TOKENIZER_DIR NAME...
#       # on the GPU machine: each pack's inferno and llama-bench (built for the same target, e.g.
#       -DCMAKE_CUDA_ARCHITECTURES=80-virtual as docs/performance.md, "Reproducing", builds it,
#       llama-quantize beside it)
#       on the same random gpt-oss-20b and Llama-3.2-1B files (docs/performance.md, "Before Hopper")
#
# A pack's candle library is built for the pack's targets too (scripts/cuda-env.sh), so a
# compute_80 pack runs candle's GGUF kernels as an Ampere GPU does, from their PTX.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
pack)
    [ $# -ge 3 ] || { sed -n 2,20p "$0"; exit 2; }
    name="$2" spec="$3"
    shift 3
    export INFERNO_CUDA_ARCHS="$spec"
    source scripts/cuda-env.sh
    out=".dev/arch-$name"
    rm -rf "$out" && mkdir -p "$out"
    tests=(--lib)
    for t in "$@"; do tests+=(--test "$t"); done
    # conformance keeps the asset tests out of --ignored (the GPU tests alone); same features
    # for both, so the kernels are compiled once.
    cargo build --release --locked --features cuda,conformance
    cargo test --release --locked --features cuda,conformance --no-run "${tests[@]}" --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        kind = m["target"]["kind"][0]
        print(m["target"]["name"] if kind == "test" else kind + "-" + m["target"]["name"], m["executable"])' \
        | while read -r t exe; do strip -o "$out/$t" "$exe" && xz -T0 -6 "$out/$t"; done
    strip -o "$out/inferno" target/release/inferno && xz -T0 -6 "$out/inferno"
    du -sh "$out"/*
    ;;
run)
    shift
    packs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do packs+=("$1") && shift; done
    [ "${1:-}" = -- ] && shift
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    table="${OUT:-/tmp}/arches.txt"
    : >"$table"
    for name in "${packs[@]}"; do
        dir="${TMPDIR:-/tmp}/arch-$name"
        mkdir -p "$dir"
        for xz in ".dev/arch-$name"/*.xz; do
            xz -dc "$xz" >"$dir/$(basename "$xz" .xz)" && chmod +x "$dir/$(basename "$xz" .xz)"
        done
        echo "== $name: doctor"
        [ -x "$dir/inferno" ] && { "$dir/inferno" doctor 2>&1 | grep -E "GPU 0|kernels built" || true; }
        for t in "$dir"/*; do
            [ "$(basename "$t")" = inferno ] && continue
            echo "== $name: $(basename "$t")"
            set +e
            timeout "${GPU_TEST_TIMEOUT:-600}" "$t" --ignored --test-threads=1 "$@" 2>&1 | tee "$dir/log-$(basename "$t")" \
                | grep -E "^test .*(FAILED|ok)$|^test result|panicked" | grep -vE "^test .* ok$"
            set -e
            grep "^test result" "$dir/log-$(basename "$t")" | sed "s/^/$name $(basename "$t"): /" >>"$table"
        done
        [ -x "$dir/inferno" ] || continue
        for layout in ${BENCH_LAYOUTS:-gpt-oss-20b llama-3.2-1b}; do
            "$dir/inferno" bench "benches/configs/$layout.json" --dummy-weights -p 512 -n 128 -r 3 \
                --json >"$dir/bench-$layout.json" 2>"$dir/bench-$layout.err" \
                || { tail -3 "$dir/bench-$layout.err"; continue; }
            python3 - "$name" "$layout" "$dir/bench-$layout.json" >>"$table" <<'EOF'
import json, sys
name, layout, path = sys.argv[1:]
r = json.load(open(path))
print(f"{name} {layout}: prefill pp512 {r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.1f} tok/s")
EOF
        done
    done
    echo "== summary"
    cat "$table"
    ;;
peer)
    # The packs' inferno against one llama-bench on the same files: a random gpt-oss-20b
    # checkpoint and its GGUF (llama.cpp's converter, Q8_0 beside the MXFP4 experts), a random
    # Llama-3.2-1B-shaped checkpoint and its bf16 and Q4_K_M GGUFs (llama-quantize). Files are
    # written once under ${TMPDIR:-/tmp}/arch-peer and reused.
    [ $# -ge 6 ] || { sed -n 2,20p "$0"; exit 2; }
    llama_cpp="$2" llama_bench="$3" gptoss_tok="$4" llama3_tok="$5"
    shift 5
    w="${TMPDIR:-/tmp}/arch-peer"
    mkdir -p "$w"
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    if [ ! -f "$w/oss20b.gguf" ]; then
        python3 scripts/fixtures/gpt_oss_20b_random.py benches/configs/gpt-oss-20b.json "$w/oss20b-hf" --checkpoint-only
        cp "$gptoss_tok" "$w/oss20b-hf/tokenizer.json"
        python3 "$llama_cpp/convert_hf_to_gguf.py" "$w/oss20b-hf" --outtype q8_0 --outfile "$w/oss20b.part" >"$w/convert-20b.log" 2>&1 \
            || { tail -20 "$w/convert-20b.log"; exit 1; }
        mv "$w/oss20b.part" "$w/oss20b.gguf"
    fi
    if [ ! -f "$w/l1b-q4km.gguf" ]; then
        python3 scripts/fixtures/llama_random.py benches/configs/llama-3.2-1b.json "$llama3_tok" "$w/l1b-hf"
        python3 "$llama_cpp/convert_hf_to_gguf.py" "$w/l1b-hf" --outtype bf16 --outfile "$w/l1b-bf16.gguf" >"$w/convert-1b.log" 2>&1 \
            || { tail -20 "$w/convert-1b.log"; exit 1; }
        "$(dirname "$llama_bench")/llama-quantize" "$w/l1b-bf16.gguf" "$w/l1b-q4km.part" Q4_K_M >"$w/quantize.log" 2>&1 \
            || { tail -20 "$w/quantize.log"; exit 1; }
        mv "$w/l1b-q4km.part" "$w/l1b-q4km.gguf"
    fi
    for name in "$@"; do
        bin="${TMPDIR:-/tmp}/arch-$name/inferno"
        mkdir -p "$(dirname "$bin")"
        xz -dc ".dev/arch-$name/inferno.xz" >"$bin" && chmod +x "$bin"
        for m in oss20b-hf oss20b.gguf l1b-hf l1b-bf16.gguf l1b-q4km.gguf; do
            "$bin" bench "$w/$m" -p 512 -n 128 -r 3 --json >"$w/bench.json" 2>"$w/bench.err" \
                || { echo "inferno $name $m: failed"; tail -3 "$w/bench.err"; continue; }
            python3 - "$name" "$m" "$w/bench.json" <<'EOF2'
import json, sys
name, model, path = sys.argv[1:]
r = json.load(open(path))
print(f"inferno {name} {model} ({r['format']}): pp512 {r['prefill_tok_s']:.1f}, tg128 {r['decode_tok_s']:.1f} tok/s")
EOF2
        done
    done
    for m in oss20b.gguf l1b-bf16.gguf l1b-q4km.gguf; do
        "$llama_bench" -m "$w/$m" -ngl 99 -fa 1 -p 512 -n 128 -r 3 -o md 2>&1 | grep -E "^\| [a-z]"
    done
    ;;
*)
    sed -n 2,20p "$0"
    exit 2
    ;;
esac
