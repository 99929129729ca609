#!/usr/bin/env bash
# Runs every fuzz target of tests/fuzz.rs for SECONDS each (default 60) on fresh random inputs,
# one target at a time; CI runs the same targets on a fixed number of cases. A failure prints
# its seed and the smallest input proptest shrank it to: replay it with
#   INFERNO_FUZZ_SEED=<seed> cargo test --release --features conformance --test fuzz -- <target>
# then keep it as a test in tests/fuzz/regressions.rs. A crash that kills the process (a stack
# overflow, an abort) prints no input: rerun that target with INFERNO_FUZZ_TRACE=1, which
# prints each input before it runs.
#   scripts/fuzz.sh [SECONDS] [FILTER]   e.g. scripts/fuzz.sh 600 template
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
filter="${2:-}"
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS] [FILTER]" >&2; exit 2; }

source scripts/cuda-env.sh || { echo "fuzz.sh: could not set up the CUDA build toolchain" >&2; exit 1; }
# The seeds and the server's model: the real SmolLM2 GGUF and gpt-oss tokenizer.
scripts/assets/smollm2-gguf.sh >/dev/null
bash scripts/assets/gptoss-tokenizer.sh >/dev/null

export INFERNO_FUZZ_SECONDS="$seconds"
log=target/fuzz-last.log
echo "fuzz.sh: $seconds s per target; the whole output goes to $log" >&2
# The features of scripts/test.sh's build, which this one reuses; conformance runs the targets
# that need the assets (without it they are ignored).
# shellcheck disable=SC2086
cargo test --release --locked --features cuda,conformance --test fuzz -- --test-threads 1 --nocapture $filter 2>&1 \
    | tee "$log" | grep --line-buffered -E '^fuzz |^test |panicked|found:|test result'
exit "${PIPESTATUS[0]}"
