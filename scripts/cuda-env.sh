#!/usr/bin/env bash
# Source this file: it makes a CUDA 13.0 build environment available to cargo.
#
# Why: candle-core's `cuda` feature compiles its kernels with nvcc at build time and links
# libcuda/libcublas/libcurand. Development and CI machines have no CUDA toolkit and no GPU, so
# when no usable toolkit is present we assemble one from NVIDIA's PyPI wheels (pinned, CUDA 13.0
# to match the GPU machines' driver: newer PTX is refused by it) plus a stub libcuda.so whose
# entry points all return CUDA_ERROR_STUB_LIBRARY. The unpacked toolchain is cached outside the
# checkout (INFERNO_CACHE, default ~/.cache/inferno) and reused by later builds.
#
# A real toolkit (nvcc 13.x and a libcuda) is used as is.
#
# The GPU targets: every architecture from Ampere on (src/gpu/targets.rs), unless
# CUDA_COMPUTE_CAP (or INFERNO_CUDA_ARCHS) names fewer: a capability or a list (`86`, `8.6`,
# `80,89,90`; `compute_80` for PTX alone). build.rs reads the list from INFERNO_CUDA_ARCHS;
# candle's kernels get it through scripts/nvcc-fat.sh (it says why).

_inferno_cuda_setup() {

    local want_major=13

    if command -v nvcc >/dev/null 2>&1 && nvcc --version | grep -q "release ${want_major}\." \
        && { ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; }; then
        echo "cuda-env: using the system CUDA toolkit ($(command -v nvcc))" >&2
        _inferno_cuda_targets "$(command -v nvcc)"
        return
    fi

    local cache="${INFERNO_CACHE:-$HOME/.cache/inferno}"
    local prefix="$cache/cuda-13.0.88"
    if [ ! -f "$prefix/.complete" ]; then
        echo "cuda-env: assembling the CUDA 13.0 build toolchain from PyPI into $prefix" >&2
        local wheels="$cache/wheels-13.0.88"
        mkdir -p "$wheels"
        python3 -m pip download --quiet --no-deps --only-binary=:all: \
            --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
            -d "$wheels" \
            nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
            nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96 nvidia-cublas==13.1.0.3 \
            nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88 || return 1
        rm -rf "$prefix.tmp" && mkdir -p "$prefix.tmp/unpack"
        local w
        for w in "$wheels"/*.whl; do
            python3 -m zipfile -e "$w" "$prefix.tmp/unpack" || return 1
        done
        # Every wheel puts its files under nvidia/cu13/{bin,include,lib,nvvm}.
        cp -a "$prefix.tmp/unpack/nvidia/cu13/." "$prefix.tmp/" || return 1
        rm -rf "$prefix.tmp/unpack"
        chmod +x "$prefix.tmp"/bin/* "$prefix.tmp"/nvvm/bin/* 2>/dev/null
        local lib
        for lib in cublas cublasLt cudart nvrtc curand; do
            local real
            real="$(cd "$prefix.tmp/lib" && ls lib${lib}.so.* 2>/dev/null | head -n1)"
            [ -n "$real" ] && ln -sf "$real" "$prefix.tmp/lib/lib${lib}.so"
        done
        rm -rf "$prefix" && mv "$prefix.tmp" "$prefix" && touch "$prefix/.complete"
    fi

    # The stub must export every symbol the cudarc version in Cargo.lock binds: key it by that version.
    local cudarc
    cudarc="$(_inferno_cudarc_src)" || return 1
    local stubdir="$cache/libcuda-stub-$(basename "$(dirname "$(dirname "$(dirname "$cudarc")")")")"
    if [ ! -f "$stubdir/libcuda.so.1" ]; then
        _inferno_cuda_stub "$cudarc" "$stubdir.tmp" || return 1
        rm -rf "$stubdir" && mv "$stubdir.tmp" "$stubdir"
    fi

    export CUDA_HOME="$prefix" CUDA_PATH="$prefix"
    export PATH="$prefix/bin:$PATH"
    export LIBRARY_PATH="$prefix/lib:$stubdir${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$prefix/lib:$stubdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export RUSTFLAGS="${RUSTFLAGS:-} -L $prefix/lib -L $stubdir"
    echo "cuda-env: using the PyPI CUDA toolchain in $prefix" >&2
    _inferno_cuda_targets "$prefix/bin/nvcc"
}

# INFERNO_CUDA_ARCHS (the build's targets), CUDA_COMPUTE_CAP (candle's: the oldest of them),
# INFERNO_CUDA_GENCODES and NVCC (scripts/nvcc-fat.sh, which gives candle's library all of them).
_inferno_cuda_targets() {
    local spec="${INFERNO_CUDA_ARCHS:-${CUDA_COMPUTE_CAP:-all}}"
    local word cap sass=() ptx=() oldest=999 newest=0
    for word in ${spec//[,;]/ }; do
        [ "$word" = all ] && { sass+=(80 86 89 90 100 120); continue; }
        case "$word" in
        compute_*) cap="${word#compute_}"; ptx+=("${cap//./}") ;;
        *) cap="${word#sm_}"; sass+=("${cap//./}") ;;
        esac
    done
    for cap in "${sass[@]}" "${ptx[@]}"; do
        [[ "$cap" =~ ^[0-9]+$ ]] || { echo "cuda-env: CUDA_COMPUTE_CAP=$spec: '$cap' is not a compute capability" >&2; return 1; }
        [ "$cap" -lt "$oldest" ] && oldest="$cap"
        [ "$cap" -gt "$newest" ] && newest="$cap"
    done
    [ "${#ptx[@]}" -gt 0 ] || ptx=("$newest")
    # candle's library takes machine code once per major version (sm_80 code runs on 8.6 and 8.9
    # too): its GGUF kernels have no path of their own there, and each target costs minutes.
    local gencodes="" majors=" "
    for cap in $(printf '%s\n' "${sass[@]}" | sort -n); do
        [[ "$majors" == *" $((cap / 10)) "* ]] && continue
        majors+="$((cap / 10)) "
        gencodes+=" -gencode=arch=compute_$cap,code=sm_$cap"
    done
    for cap in "${ptx[@]}"; do gencodes+=" -gencode=arch=compute_$cap,code=compute_$cap"; done
    # INFERNO_CANDLE_FAT=0 gives candle's library the oldest target's PTX alone: a machine
    # without a GPU (CI) never runs it, and ptxas's machine code for its GGUF kernels is most of
    # their build time (docs/cuda-build.md, "What every target costs"). A GPU that runs such a build
    # compiles the PTX at its first start.
    [ "${INFERNO_CANDLE_FAT:-1}" = 0 ] && gencodes=" -gencode=arch=compute_$oldest,code=compute_$oldest"
    export INFERNO_CUDA_ARCHS="$spec" CUDA_COMPUTE_CAP="$oldest" INFERNO_CUDA_GENCODES="${gencodes# }"
    export INFERNO_REAL_NVCC="$1"
    # candle's builder compiles its library on half the threads by default: one on a 2-core
    # machine, which then waits on it (candle-core and everything above it need the library).
    export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
    # candle's build reruns when NVCC or CUDA_COMPUTE_CAP changes, not when INFERNO_CUDA_GENCODES
    # does: NVCC is a link to the wrapper at a path of its own per set of targets, so a build for
    # other targets rebuilds candle's library instead of linking the last one.
    local key link
    key="$(printf '%s' "$gencodes" | cksum | cut -d' ' -f1)"
    link="${INFERNO_CACHE:-$HOME/.cache/inferno}/nvcc-fat-$key/nvcc"
    mkdir -p "$(dirname "$link")" \
        && ln -sfn "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/nvcc-fat.sh" "$link" || return 1
    export NVCC="$link"
    echo "cuda-env: GPU targets $spec (candle's PTX for $oldest)" >&2
}

# The driver library is not on PyPI. Stub every driver entry point cudarc can bind so the binary
# links and, on a machine without a GPU, fails cleanly at the first CUDA call. build.rs also takes
# the driver's function names for its lazy trampolines from this library (src/gpu/lazy.rs).
_inferno_cuda_stub() {
    local src="$1" dir="$2"
    rm -rf "$dir" && mkdir -p "$dir"
    local names="$dir/names.txt"
    grep -rhoE 'pub unsafe fn cu[A-Za-z0-9_]+\(' "$src" | sed -E 's/pub unsafe fn (cu[A-Za-z0-9_]+)\(/\1/' | sort -u >"$names"
    if [ ! -s "$names" ]; then
        echo "cuda-env: no driver entry points found in $src" >&2
        return 1
    fi
    {
        echo '/* generated by scripts/cuda-env.sh: every call fails with CUDA_ERROR_STUB_LIBRARY */'
        while read -r n; do echo "int $n(void){return 34;}"; done <"$names"
    } >"$dir/stub.c"
    gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/libcuda.so" "$dir/stub.c" || return 1
    ln -sf libcuda.so "$dir/libcuda.so.1"
    echo "cuda-env: libcuda stub with $(wc -l <"$names") entry points" >&2
}

# The driver bindings of the cudarc version that Cargo.lock pins (fetched if needed).
_inferno_cudarc_src() {
    local root="${CARGO_HOME:-$HOME/.cargo}/registry/src"
    local ver
    ver="$(grep -A1 '^name = "cudarc"' Cargo.lock 2>/dev/null | sed -nE 's/^version = "(.*)"/\1/p')"
    [ -n "$ver" ] || { echo "cuda-env: run from the repository root (no cudarc in Cargo.lock)" >&2; return 1; }
    local dir
    dir="$(ls -d "$root"/*/cudarc-"$ver"/src/driver/sys 2>/dev/null | head -n1)"
    if [ -z "$dir" ]; then
        cargo fetch --locked >&2 || return 1
        dir="$(ls -d "$root"/*/cudarc-"$ver"/src/driver/sys 2>/dev/null | head -n1)"
    fi
    [ -n "$dir" ] || { echo "cuda-env: cudarc $ver sources not found" >&2; return 1; }
    echo "$dir"
}

_inferno_cuda_setup
