#!/usr/bin/env bash
# A screenshot of the chat page (`GET /` of `inferno serve`) with MODEL's replies, taken in
# headless Chromium: to look at the page with a real model, or to show it in a note.
#
#   scripts/ui/screenshot.sh MODEL OUT.png [PROMPT]... [-- SERVE_ARGS...]
#
# Starts `inferno serve MODEL` on 127.0.0.1 (a port the system picks), sends the PROMPTs in one
# conversation (greedy; default: one question), waits for each reply, opens gpt-oss's reasoning
# blocks and writes OUT.png. Needs chromium, chromedriver and the selenium venv that
# scripts/test.sh installs. INFERNO_BIN picks the binary (default target/release/inferno);
# MAX_TOKENS bounds each reply (default 256).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
model="$1" out="$2"
shift 2
prompts=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do prompts+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#prompts[@]} -gt 0 ] || prompts=("Write a Python function that checks whether a word is a palindrome.")
bin="${INFERNO_BIN:-target/release/inferno}"
[ -x "$bin" ] || { echo "screenshot.sh: no inferno binary at $bin (cargo build --release, with --features cuda for the GPU; or set INFERNO_BIN)" >&2; exit 1; }
py="${INFERNO_UI_PYTHON:-${INFERNO_CACHE:-$HOME/.cache/inferno}/py-selenium-4.38.0/bin/python}"
"$py" -c "import selenium" 2>/dev/null || { echo "screenshot.sh: no selenium at $py: run scripts/test.sh once (it makes the venv)" >&2; exit 1; }

log="$(mktemp)"
cleanup() { kill "${pid:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -f "$log"; }
trap cleanup EXIT
"$bin" serve "$model" --port 0 "$@" 2>"$log" &
pid=$!
url=""
for _ in $(seq 600); do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
    url="$(sed -n 's/^inferno serve · \(http:[^ ]*\) .*/\1/p' "$log" | head -n 1)"
    [ -n "$url" ] && curl -sf "$url/health" >/dev/null && break
    sleep 0.5
done
[ -n "$url" ] || { echo "screenshot.sh: the server did not start" >&2; cat "$log" >&2; exit 1; }
args="$(python3 -c 'import json, sys; print(json.dumps({"out": sys.argv[1], "prompts": sys.argv[3:], "open_reasoning": True,
    "settings": {"temperature": 0, "max_tokens": int(sys.argv[2])}}))' "$(realpath -m "$out")" "${MAX_TOKENS:-256}" "${prompts[@]}")"
"$py" scripts/ui/drive.py "$url" shot "$args" >/dev/null
echo "$out"
