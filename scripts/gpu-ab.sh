#!/usr/bin/env bash
# A/B of inferno builds or settings on a GPU machine: every variant runs every bench case, in
# alternation over ROUNDS rounds (so a drift of the machine shows in both), each run bounded by
# a timeout and printed as it ends (nothing is lost when the call's limit stops the script).
#
#   scripts/gpu-ab.sh VARIANTS CASES [ROUNDS]
#
# VARIANTS: a file, one "label command..." a line: the command that stands for `inferno`, e.g.
#   main      /tmp/ab/inferno-main
#   new       /tmp/ab/inferno-new
#   nopdl     env INFERNO_PDL=0 /tmp/ab/inferno-new
# CASES: a file, one set of `bench` arguments a line (--dummy-weights --json are added), e.g.
#   benches/configs/gpt-oss-20b.json -p 1024 -n 128 -r 2
# ROUNDS: default 2. AB_TIMEOUT: seconds a run may take (default 120). Prints one line a run:
# case, variant, prefill and decode tok/s (single stream medians), then the GPU's name.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n 2,15p "$0"; exit 2; }
variants="$1" cases="$2" rounds="${3:-2}"
out="$(mktemp)"
trap 'rm -f "$out" "$out.err"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
for ((round = 1; round <= rounds; round++)); do
    while read -r args; do
        [ -z "$args" ] && continue
        while read -r label cmd; do
            [ -z "$label" ] && continue
            # shellcheck disable=SC2086
            if timeout "${AB_TIMEOUT:-120}" $cmd bench $args --dummy-weights --json </dev/null >"$out" 2>"$out.err"; then
                python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
case, label = sys.argv[2], sys.argv[3]
print("%-48s %-12s prefill %10.1f  decode %8.1f" % (case, label, r["prefill_tok_s"], r["decode_tok_s"]))' \
                    "$out" "$args" "$label"
            else
                printf '%-48s %-12s FAILED or timed out: %s\n' "$args" "$label" "$(tail -n 1 "$out.err")"
            fi
        done <"$variants"
    done <"$cases"
done
