#!/usr/bin/env bash
# nvcc as candle-kernels' build runs it (scripts/cuda-env.sh points NVCC here). cudaforge, which
# builds candle's kernels, compiles for one compute capability (CUDA_COMPUTE_CAP): its PTX, which
# the driver compiles for any GPU at least that new, and a static library of machine code for
# that GPU alone (the GGUF mmvq/mmq kernels QMatMul calls first). This wrapper gives that
# library the targets of INFERNO_CUDA_GENCODES instead (cuda-env.sh: machine code for each major
# version of the build's targets, PTX for the newest), so one binary runs candle's kernels on
# every architecture ours are built for. The PTX (`--ptx`) passes through unchanged:
# cuda-env.sh sets CUDA_COMPUTE_CAP to the oldest target, whose PTX runs on all of them.
set -euo pipefail
real="${INFERNO_REAL_NVCC:?scripts/cuda-env.sh sets INFERNO_REAL_NVCC to the real nvcc}"
for a in "$@"; do
    case "$a" in --ptx | -ptx) exec "$real" "$@" ;; esac
done
args=()
for a in "$@"; do
    case "$a" in
    -gencode=* | --generate-code=*)
        # shellcheck disable=SC2206 # one word per -gencode
        [ -n "${INFERNO_CUDA_GENCODES:-}" ] && args+=($INFERNO_CUDA_GENCODES) || args+=("$a")
        ;;
    *) args+=("$a") ;;
    esac
done
# Seven targets' machine code is most of the binary: nvcc's size mode packs it about three
# times smaller than its default, and the driver unpacks a module as it loads it.
exec "$real" "${args[@]}" --compress-mode=size
