#!/usr/bin/env bash
# Builds and installs the `inferno` GPU binary into ~/.cargo/bin. Uses a system CUDA 13 toolkit
# when there is one, else assembles the build pieces from PyPI (scripts/cuda-env.sh).
# The binary runs on every NVIDIA GPU since Ampere; CUDA_COMPUTE_CAP narrows the build to fewer
# (e.g. 86, or 80,90) for a shorter one (docs/cuda-build.md).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/cuda-env.sh
# With the PyPI toolchain, let the binary find libcublas/libcublasLt/libcurand there at run time
# (a machine with only the driver has none): it opens them when a GPU command first needs them
# (src/gpu/loader.rs), and dlopen from the executable searches its run path. The libcuda stub
# directory is never on the run path: the real driver must be the one loaded.
case "${CUDA_HOME:-}" in
*/.cache/inferno/*|"${INFERNO_CACHE:-/nonexistent}"/*) export RUSTFLAGS="$RUSTFLAGS -C link-arg=-Wl,-rpath,$CUDA_HOME/lib" ;;
esac
cargo install --locked --path . --features cuda "$@"

# NCCL for `--tp` (tensor parallelism over several GPUs), opened at run time from
# ~/.cache/inferno/nccl/lib (src/dist/nccl.rs): fetched only on a machine with more than one GPU
# and no libnccl.so.2 already on the loader's path. About 300 MB.
NCCL_VERSION=2.32.3
nccl_dir="$HOME/.cache/inferno/nccl"
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)"
if [ "${gpus:-0}" -gt 1 ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2' \
    && [ ! -f "$nccl_dir/lib/libnccl.so.2" ]; then
    echo "install.sh: fetching NCCL $NCCL_VERSION (nvidia-nccl-cu13) for --tp into $nccl_dir" >&2
    tmp="$(mktemp -d)"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
        "nvidia-nccl-cu13==$NCCL_VERSION" \
        && python3 -m zipfile -e "$tmp"/nvidia_nccl_cu13-*.whl "$tmp/unpack" \
        && mkdir -p "$nccl_dir" && rm -rf "$nccl_dir/lib" \
        && cp -a "$tmp/unpack/nvidia/nccl/lib" "$nccl_dir/lib" \
        || echo "install.sh: could not fetch NCCL; --tp above 1 needs libnccl.so.2 on LD_LIBRARY_PATH" >&2
    rm -rf "$tmp"
fi
