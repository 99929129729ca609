#!/usr/bin/env bash
# The engine's benchmark table (docs/performance.md) on a GPU machine, from the binary that
# `scripts/gpu-tests.sh build` leaves in .dev/gpu/:
#
#   scripts/gpu-bench.sh [LAYOUT...] [-- BENCH FLAGS]
#
# LAYOUT is a config under benches/configs (default: gpt-oss-20b llama-3.2-1b); each runs with
# random weights at 1, 8 and 64 streams (override with STREAMS="1 8"), -p 512 -n 128 -r 3.
# Prints one line per run; full JSON goes to $OUT/bench-*.json when $OUT is set.
set -euo pipefail
cd "$(dirname "$0")/.."
layouts=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do layouts+=("$1") && shift; done
[ "${1:-}" = -- ] && shift
[ ${#layouts[@]} -gt 0 ] || layouts=(gpt-oss-20b llama-3.2-1b)
bin="${TMPDIR:-/tmp}/inferno-bench/inferno"
mkdir -p "$(dirname "$bin")"
gunzip -c .dev/gpu/inferno.gz >"$bin" && chmod +x "$bin"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for layout in "${layouts[@]}"; do
    for c in ${STREAMS:-1 8 64}; do
        json="${OUT:-/tmp}/bench-$layout-c$c.json"
        "$bin" bench "benches/configs/$layout.json" --dummy-weights -p 512 -n 128 -r 3 -c "$c" \
            --json "$@" >"$json"
        python3 - "$layout" "$c" "$json" <<'EOF'
import json, sys
layout, c, path = sys.argv[1:]
r = json.load(open(path))
if int(c) == 1:
    print(f"{layout:<14} c=1   prefill pp512 {r['prefill_tok_s']:9.1f} tok/s   decode {r['decode_tok_s']:8.1f} tok/s")
else:
    print(f"{layout:<14} c={c:<3} decode {r['full_batch_decode_tok_s']:9.1f} tok/s ({r['full_batch_step_ms']:.2f} ms step)"
          f"   aggregate {r['aggregate_tok_s']:8.1f}   per stream {r['decode_tok_s']:6.1f}"
          f"   TTFT p50/p99 {r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} ms")
EOF
    done
done
