#!/usr/bin/env bash
# Open WebUI's default chat against `inferno serve`, driven as a person would: headless
# Chromium opens the page, types a message, and waits for the streamed answer. Open WebUI's
# default settings attach its built-in tools to every chat, which a model whose chat template
# has no tool support must still take.
#
#   scripts/openwebui/check.sh MODEL [SERVE_ARGS...]
#
# MODEL is what `inferno serve` takes (a cached id, a folder, a .gguf). Installs Open WebUI
# (pinned; about 7 GB with its dependencies, so not part of scripts/test.sh) into
# ${INFERNO_CACHE:-~/.cache/inferno}/openwebui-$VERSION, and Debian's chromium and
# chromium-driver. Writes a screenshot to ${OUT_DIR:-.dev/openwebui}/MODEL_NAME.png and exits
# non-zero when the page shows an error or no answer.
# OWUI_TIMEOUT (seconds, default 600) bounds the wait for the answer: a model on the CPU takes
# minutes to prefill the built-in tools' descriptions.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n 2,15p "$0"; exit 2; }
model="$1"; shift
VERSION=0.12.4
SELENIUM=4.38.0
venv="${INFERNO_CACHE:-$HOME/.cache/inferno}/openwebui-$VERSION"
if ! "$venv/bin/python" -c "import open_webui, selenium" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "open-webui==$VERSION" "selenium==$SELENIUM"
fi
command -v chromium >/dev/null && command -v chromedriver >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver; }
bin="${INFERNO_BIN:-target/release/inferno}"
[ -x "$bin" ] || { echo "check.sh: no inferno binary at $bin (cargo build --release, with --features cuda for the GPU; or set INFERNO_BIN)" >&2; exit 1; }

work="$(mktemp -d)"
serve_port=18080 ui_port=18081
cleanup() { kill "${ui_pid:-}" "${serve_pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin" serve "$model" --port "$serve_port" "$@" 2>"$work/serve.log" &
serve_pid=$!
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$serve_port/health" >/dev/null && break
    kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.log" >&2; exit 1; }
    sleep 1
done
id="$(curl -sf "http://127.0.0.1:$serve_port/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')"

# Open WebUI offline, without sign-in, with inferno as its one OpenAI connection.
(cd "$work" && exec env DATA_DIR="$work/data" WEBUI_AUTH=False OFFLINE_MODE=True HF_HUB_OFFLINE=1 \
    ENABLE_OLLAMA_API=False OPENAI_API_BASE_URL="http://127.0.0.1:$serve_port/v1" OPENAI_API_KEY=none \
    DEFAULT_MODELS="$id" ENABLE_VERSION_UPDATE_CHECK=False ANONYMIZED_TELEMETRY=False \
    "$venv/bin/open-webui" serve --host 127.0.0.1 --port "$ui_port" >"$work/ui.log" 2>&1) &
ui_pid=$!
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$ui_port/health" >/dev/null && break
    kill -0 "$ui_pid" 2>/dev/null || { tail -50 "$work/ui.log" >&2; exit 1; }
    sleep 1
done
out="${OUT_DIR:-.dev/openwebui}"
mkdir -p "$out"
shot="$out/$(basename "$model" | tr -c 'A-Za-z0-9._\n-' '_').png"
status=0
"$venv/bin/python" scripts/openwebui/drive.py "http://127.0.0.1:$ui_port" "$shot" || status=$?
cp "$work/serve.log" "$out/serve.log"; cp "$work/ui.log" "$out/ui.log"
echo "--- inferno serve's log (requests; whole logs in $out) ---"
grep -E ' /v1/| no such endpoint| method not allowed' "$work/serve.log" || true
exit "$status"
