#!/usr/bin/env bash
# A soak of `inferno serve`: SOAK_SEQUENTIAL (1000) sequential generations, then MINUTES (30) of
# mixed load from SOAK_CLIENTS (8) clients: short and long prompts, streams, cancelled streams,
# structured outputs (response_format) and tool calls (tool_choice "required"). The serve
# process is sampled every SOAK_SAMPLE_S (5) s: device memory (nvidia-smi, when there is one),
# RSS, open file descriptors and threads. Prints a start-vs-end table (the medians of the first
# and last tenth of the mixed load after warm-up, the first SOAK_WARMUP (0.2) of it) with the
# p50/p99 latency of short requests, and fails when a request failed or growth passed its
# threshold: SOAK_MAX_DEVICE_MB (64), SOAK_MAX_RSS_MB (128), SOAK_MAX_FDS (16),
# SOAK_MAX_THREADS (8).
#   scripts/soak.sh MODEL [MINUTES]
#   SOAK_SERVE_ARGS="--cpu --context 2048" SOAK_SEQUENTIAL=30 scripts/soak.sh model.gguf 2
# Only 127.0.0.1 is contacted (SOAK_PORT, default 18080); every loop ends by count or deadline.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:?usage: scripts/soak.sh MODEL [MINUTES]}"
minutes="${2:-30}"
port="${SOAK_PORT:-18080}"
bin="${INFERNO_BIN:-target/release/inferno}"
if [ ! -x "$bin" ]; then
    source scripts/cuda-env.sh
    cargo build --release --locked --features cuda
fi

log="$(mktemp)"
# shellcheck disable=SC2086 # SOAK_SERVE_ARGS is a list of flags
"$bin" serve "$model" --host 127.0.0.1 --port "$port" ${SOAK_SERVE_ARGS:-} 2>"$log" &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT

# Ready when /health says 200; bounded by SOAK_LOAD_TIMEOUT (600) s.
python3 - "$port" "$pid" "${SOAK_LOAD_TIMEOUT:-600}" <<'PY' || { cat "$log" >&2; exit 1; }
import http.client, os, sys, time
port, pid, limit = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    os.kill(pid, 0)  # raises when serve has exited
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        c.request("GET", "/health")
        if c.getresponse().status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit("serve was not ready in time")
PY
grep -E "^(inferno serve|memory|batch)" "$log" >&2 || true
python3 scripts/soak.py 127.0.0.1 "$port" "$pid" "$minutes"
