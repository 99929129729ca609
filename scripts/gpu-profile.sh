#!/usr/bin/env bash
# Per-kernel table of decode steps under Nsight Compute, on a GPU machine:
#
#   scripts/gpu-profile.sh LAYOUT|MODEL_FILE STREAMS [GEN_TOKENS] [STEPS]
#   scripts/gpu-profile.sh --prefill LAYOUT PROMPT_TOKENS
#
# Runs `inferno bench benches/configs/LAYOUT.json --dummy-weights -p 64 -n GEN_TOKENS -c STREAMS`
# (or `inferno bench MODEL_FILE ...`, a GGUF of real or random weights; greedy) under ncu, every
# kernel node of the CUDA graphs timed on its own with warm caches and the clocks left alone
# (gpu__time_duration, DRAM bytes read and written), then prints the
# kernels of the last STEPS decode steps (default 3; a step ends with the argmax's last kernel)
# as a markdown table: launches, mean time, time, DRAM bytes and rate per step. Kernels run one
# at a time under ncu (no PDL overlap, no gaps): the sum is above a graph replay's time.
# With --prefill it profiles `-p PROMPT_TOKENS -n 1 -r 1` instead and prints every kernel of the
# two prefills (the warm-up's and the run's; no decode step runs) per prefill, with the prompt's
# share of the time per kernel family.
# PROMPT (default 64) sets the decode steps' context for the first form (-p PROMPT). SKIP
# (default 0) leaves out the last SKIP steps: with STREAMS > 1 the prompts prefill over several
# steps, so the streams finish over as many steps at the end, with fewer rows each; for a table of
# steps in which all of them decode, take GEN_TOKENS past the prefill's steps and SKIP them (64
# streams of 64 tokens prefill in 2 steps of 2,048: `scripts/gpu-profile.sh gpt-oss-20b 64 16 3`
# with SKIP=2).
# TP=N profiles `--tp N`: rank 0's kernels only (the other ranks run at full speed and wait for
# it), the collectives left out (their kernels wait on the other ranks: replayed alone they would
# wait for ever). What the sums cost a step comes from bench's step times with and without them
# (INFERNO_TP_SKIP_SUMS=1), not from here.
# The binary: $BIN, else the one `scripts/gpu-tests.sh build` leaves in .dev/gpu/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$1" = --prefill ]; then
    layout="$2" prompt="$3" streams=1 gen=1 steps=prefill
else
    layout="$1" streams="$2" gen="${3:-8}" steps="${4:-3}" prompt="${PROMPT:-64}"
fi
bin="${BIN:-${TMPDIR:-/tmp}/inferno-bench/inferno}"
if [ ! -x "$bin" ]; then
    mkdir -p "$(dirname "$bin")"
    gunzip -c .dev/gpu/inferno.gz >"$bin" && chmod +x "$bin"
fi
# A layout of benches/configs with dummy weights, or a model file (a GGUF of real or random
# weights).
model=("benches/configs/$layout.json" --dummy-weights)
[ -f "$layout" ] && model=("$layout")
csv="${TMPDIR:-/tmp}/ncu-$(basename "$layout")-c$streams${TP:+-tp$TP}.csv"
# Decode steps without bench's warm-up run (under ncu every kernel runs alone, so it would take as
# long as the run): the run's last steps replay the graphs the run itself captured. Only the
# last steps are profiled: the engine starts the profiler a few steps before the ones the table
# shows (a run of GEN_TOKENS takes about GEN_TOKENS steps after its prefill), so the loading, the
# dummy weights' initialisation and the prefill run at full speed.
warmup=0 from=$((gen - steps - ${SKIP:-0} - 2)) start=off
[ "$from" -lt 1 ] && from=1
[ "$steps" = prefill ] && warmup=1 from=0 start=on
tp=() ranks=()
if [ -n "${TP:-}" ]; then
    tp=(--tp "$TP")
    ranks=(--target-processes application-only --kernel-name regex:'^(?!.*(all_reduce|all_gather|broadcast|nccl)).*')
fi
INFERNO_BENCH_WARMUP=$warmup INFERNO_PROFILE_FROM_STEP=$from \
    ncu --profile-from-start $start --graph-profiling node --cache-control none \
    --clock-control none "${ranks[@]}" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv --page raw \
    "$bin" bench "${model[@]}" "${tp[@]}" -p "$prompt" -n "$gen" -r 1 -c "$streams" \
    >"$csv" 2>"${csv%.csv}.err"
python3 - "$csv" "$steps" "${SKIP:-0}" <<'EOF'
import csv, sys, collections
path, steps, skip = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [r for r in csv.reader(l for l in open(path) if l.startswith('"'))]
head, units, data = rows[0], rows[1], rows[2:]
col = {k: head.index(k) for k in ("Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")}
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
byte = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1}
t_scale = scale[units[col["gpu__time_duration.sum"]]]
num = lambda s: float(s.replace(",", "") or 0)
# A decode step ends with the greedy argmax's last kernel (one GPU's, or the pick of a draw on
# the ranks with --tp): keep the last `steps` steps.
last = ("argmax_rows_final", "argmax_shard_pick")
ends = [i for i, r in enumerate(data) if r[col["Kernel Name"]].startswith(last)]
if steps == "prefill":
    # Everything the two prefills ran (the dummy weights' initialisation included: it is
    # counted per prefill too, and shows as its own kernels).
    window, steps = data, 2
else:
    steps = int(steps)
    if len(ends) <= steps + skip:
        sys.exit(f"only {len(ends)} steps profiled")
    last = len(ends) - 1 - skip
    window = data[ends[last - steps] + 1 : ends[last] + 1]
t, b, n = collections.Counter(), collections.Counter(), collections.Counter()
for r in window:
    k = r[col["Kernel Name"]].split("(")[0].split("<")[0]
    t[k] += num(r[col["gpu__time_duration.sum"]]) * t_scale
    for c in ("dram__bytes_read.sum", "dram__bytes_write.sum"):
        b[k] += num(r[col[c]]) * byte[units[col[c]]]
    n[k] += 1
print(f"| kernel | launches per step | mean µs | µs per step | MB per step | TB/s |")
print("|---|---|---|---|---|---|")
for k, us in t.most_common():
    print(f"| `{k[:40]}` | {n[k] / steps:g} | {us / n[k]:.1f} | {us / steps:.1f} | {b[k] / steps / 1e6:.1f} | {b[k] / us / 1e6:.2f} |")
tot_t, tot_b = sum(t.values()) / steps, sum(b.values()) / steps
print(f"| all | {sum(n.values()) / steps:g} | | {tot_t:.0f} | {tot_b / 1e6:.0f} | {tot_b / tot_t / 1e6:.2f} |")
EOF
