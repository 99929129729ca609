#!/usr/bin/env bash
# Builds and installs the `inferno` GPU binary into ~/.cargo/bin. Uses a system CUDA 13 toolkit
# when there is one, else assembles the build pieces from PyPI (scripts/cuda-env.sh).
# Set CUDA_COMPUTE_CAP for GPUs other than Hopper (default 90), e.g. 89 for Ada, 80 for A100.
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
cargo install --locked --path . "$@"
