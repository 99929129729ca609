#!/usr/bin/env bash
# Per-kernel time of a decode run under Nsight Compute, on a GPU machine, from the binary that
# `scripts/gpu-tests.sh build` leaves in .dev/gpu/:
#
#   scripts/gpu-profile.sh LAYOUT STREAMS [GEN_TOKENS]
#
# Runs `inferno bench benches/configs/LAYOUT.json --dummy-weights -p 64 -n GEN_TOKENS -c STREAMS`
# under ncu (every kernel node of the CUDA graphs timed on its own: gpu__time_duration), then
# prints the kernels by total time with their launches and mean time, and what one decode step
# adds up to. Kernel times under ncu exclude the gaps between kernels: the step time bench
# reports minus that sum is what launches, gaps and the host cost.
set -euo pipefail
cd "$(dirname "$0")/.."
layout="$1" streams="$2" gen="${3:-16}"
bin="${TMPDIR:-/tmp}/inferno-bench/inferno"
mkdir -p "$(dirname "$bin")"
[ -x "$bin" ] || { gunzip -c .dev/gpu/inferno.gz >"$bin" && chmod +x "$bin"; }
csv="${TMPDIR:-/tmp}/ncu-$layout-c$streams.csv"
ncu --graph-profiling node --metrics gpu__time_duration.sum --csv --page raw \
    "$bin" bench "benches/configs/$layout.json" --dummy-weights -p 64 -n "$gen" -r 1 -c "$streams" \
    >"$csv" 2>"${csv%.csv}.err"
python3 - "$csv" "$gen" <<'EOF'
import csv, sys, collections
path, gen = sys.argv[1], int(sys.argv[2])
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head, units, data = rows[0], rows[1], rows[2:]
name, dur = head.index("Kernel Name"), head.index("gpu__time_duration.sum")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[units[dur]]
total, count = collections.Counter(), collections.Counter()
for r in data:
    k = r[name].split("(")[0].split("<")[0]
    total[k] += float(r[dur].replace(",", "")) * scale
    count[k] += 1
print(f"{'kernel':<44} {'launches':>8} {'mean us':>9} {'total us':>10} {'per token us':>12}")
for k, t in total.most_common(40):
    print(f"{k[:44]:<44} {count[k]:>8} {t / count[k]:>9.1f} {t:>10.0f} {t / gen:>12.1f}")
print(f"all kernels: {sum(total.values()):.0f} us over {sum(count.values())} launches; per generated token {sum(total.values()) / gen:.0f} us (prefill and loading included)")
EOF
