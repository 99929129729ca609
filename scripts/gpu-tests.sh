#!/usr/bin/env bash
# GPU tests from binaries built elsewhere.
#
#   scripts/gpu-tests.sh build   # on a build machine (no GPU needed): release test binaries that
#                                # contain GPU (#[ignore]d) tests, plus inferno, stripped and
#                                # gzipped into .dev/gpu/
#   scripts/gpu-tests.sh run     # on the GPU machine, from the repo root with .dev/gpu/ present:
#                                # runs every GPU test (--ignored), prints a total line; each test
#                                # binary is stopped after GPU_TEST_TIMEOUT seconds (default 1200)
set -euo pipefail
cd "$(dirname "$0")/.."
out=.dev/gpu

# The binary itself, in the format of a test binary's output: it needs no CUDA library at start-up
# (they are opened at run time: src/gpu/lazy.rs), and still runs a model on the GPU through them.
binary_checks() {
    local bin="$1" failed=0
    if ldd "$bin" | grep -E 'lib(cuda|cublas|cublasLt|curand|nvrtc|cudart)\.so'; then
        echo "test binary_needs_no_cuda_library ... FAILED"
        failed=$((failed + 1))
    else
        echo "test binary_needs_no_cuda_library ... ok"
    fi
    if "$bin" bench benches/configs/tinyllama-1.1b.json --dummy-weights -p 64 -n 16 -r 2; then
        echo "test bench_dummy_weights_runs ... ok"
    else
        echo "test bench_dummy_weights_runs ... FAILED"
        failed=$((failed + 1))
    fi
    # doctor on a working GPU machine: exit 0, the GPU found, the kernels built for it.
    local hub
    hub="$(mktemp -d)"
    if HF_HUB_CACHE="$hub" "$bin" doctor && HF_HUB_CACHE="$hub" "$bin" doctor --json \
        | python3 -c 'import json,sys; r=json.load(sys.stdin); d=r["gpu"]["devices"]; assert d and all(x["kernels_match"] for x in d) and not r["problems"], r'; then
        echo "test doctor_finds_the_gpu_and_no_problem ... ok"
    else
        echo "test doctor_finds_the_gpu_and_no_problem ... FAILED"
        failed=$((failed + 1))
    fi
    rm -rf "$hub"
    if [ "$failed" = 0 ]; then
        echo "test result: ok. 3 passed; 0 failed"
    else
        echo "test result: FAILED. $((3 - failed)) passed; $failed failed"
    fi
}

# The tensor-parallel tests start their other rank as a copy of the test binary (with the same
# arguments), so each runs alone; they need two GPUs and NCCL, and are skipped, visibly, with fewer.
tp_tests() {
    local bin="$1" gpus passed=0 failed=0 t
    gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
    if [ "${gpus:-0}" -lt 2 ]; then
        echo "gpu-tests: skipping tensor_parallel_gpu (needs 2 GPUs; this machine has ${gpus:-0})"
        echo "test result: ok. 0 passed; 0 failed; skipped"
        return 0
    fi
    for t in $("$bin" --list --ignored --format terse | sed 's/: test$//'); do
        if [ -z "${INFERNO_GPT_OSS_20B_DIR:-}" ] && [[ "$t" == *20b_shaped* ]]; then
            echo "gpu-tests: skipping $t (set INFERNO_GPT_OSS_20B_DIR)"
            continue
        fi
        if timeout "${GPU_TEST_TIMEOUT:-1200}" "$bin" --ignored --exact "$t" --test-threads=1 --nocapture; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
        fi
    done
    echo "test result: $([ "$failed" = 0 ] && echo ok || echo FAILED). $passed passed; $failed failed"
    [ "$failed" = 0 ]
}

case "${1:-}" in
build)
    source scripts/cuda-env.sh
    rm -rf "$out" && mkdir -p "$out"
    # conformance: the tests that need scripts/test.sh's clients and assets are then not
    # #[ignore]d, so --ignored below picks the GPU tests alone. The binary takes the same
    # features, so the kernels are compiled once (a build script's run is per feature set).
    cargo build --release --locked --features cuda,conformance
    cargo test --release --locked --features cuda,conformance --no-run --all-targets --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        # Unit tests of the lib and of the bin are both named after the crate: prefix their kind.
        kind = m["target"]["kind"][0]
        name = m["target"]["name"] if kind == "test" else kind + "-" + m["target"]["name"]
        print(name, m["executable"])' >"$out/all.txt"
    while read -r name exe; do
        if [ -n "$("$exe" --list --ignored --format terse 2>/dev/null)" ]; then
            strip -o "$out/$name" "$exe" && gzip -9 "$out/$name"
            echo "gpu-tests: $name ($("$exe" --list --ignored --format terse | wc -l) GPU tests)"
        fi
    done <"$out/all.txt"
    strip -o "$out/inferno" target/release/inferno && gzip -9 "$out/inferno"
    rm "$out/all.txt"
    du -sh "$out"
    ;;
run)
    tmp="${TMPDIR:-/tmp}/inferno-gpu-tests"
    mkdir -p "$tmp"
    log="$tmp/log"
    : >"$log"
    status=0
    # The full-size gpt-oss test needs a 14 GB checkpoint written on the GPU machine first:
    # skipped, visibly, unless one is named.
    skip=()
    if [ -z "${INFERNO_GPT_OSS_20B_DIR:-}" ]; then
        skip=(--skip gpu_20b_shaped)
        echo "gpu-tests: skipping the 20b-shaped agreement tests (set INFERNO_GPT_OSS_20B_DIR to a folder written by scripts/fixtures/gpt_oss_20b_random.py)"
    fi
    for gz in "$out"/*.gz; do
        name="$(basename "$gz" .gz)"
        gunzip -c "$gz" >"$tmp/$name" && chmod +x "$tmp/$name"
        [ "$name" = inferno ] && continue
        echo "== $name"
        # A bound per binary: one hung test must not use up the GPU machine's time unseen.
        set +e
        if [ "$name" = tensor_parallel_gpu ]; then
            tp_tests "$tmp/$name" 2>&1 | tee -a "$log"
            rc=${PIPESTATUS[0]}
        else
            timeout "${GPU_TEST_TIMEOUT:-1200}" "$tmp/$name" --ignored --test-threads=1 --nocapture "${skip[@]}" "${@:2}" 2>&1 \
                | tee -a "$log"
            rc=${PIPESTATUS[0]}
        fi
        set -e
        [ "$rc" = 0 ] || status=1
        if [ "$rc" = 124 ]; then
            echo "test result: FAILED. 0 passed; 1 failed; $name stopped after ${GPU_TEST_TIMEOUT:-1200} s (GPU_TEST_TIMEOUT)" | tee -a "$log"
        fi
    done
    echo "== inferno binary"
    binary_checks "$tmp/inferno" 2>&1 | tee -a "$log"
    tail -n 1 "$log" | grep -q '^test result: ok' || status=1
    awk '/^test result:/ { for (i = 1; i <= NF; i++) {
            if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1) } }
         END { printf "gpu total: %d passed, %d failed\n", p, f }' "$log"
    exit "$status"
    ;;
*)
    echo "usage: scripts/gpu-tests.sh build|run" >&2
    exit 2
    ;;
esac
