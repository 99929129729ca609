//! Compiles inferno's own CUDA kernels (`src/kernels/*.cu`) to PTX when the `cuda` feature is on.
//!
//! Each `NAME.cu` becomes `$OUT_DIR/NAME.ptx`, which `src/kernels` embeds with `include_str!` and
//! loads at run time through candle's `CudaDevice::get_or_load_custom_func`. The target is
//! `sm_$CUDA_COMPUTE_CAP` (default 90: H100/H200). nvcc comes from `$CUDA_HOME/bin` or `PATH`, as
//! `scripts/cuda-env.sh` sets them up; it must be CUDA 13.0 (see docs/cuda-build.md: newer PTX is
//! refused by the GPU machines' driver).
//!
//! No `--use_fast_math`: it turns on flush-to-zero, and the MXFP4 decoder relies on the subnormal
//! scale 2^-127 (E8M0 byte 0) being exact; the kernels are memory-bound, so fast math buys little.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNEL_DIR: &str = "src/kernels";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");

    // The folder too, so that a new kernel file triggers a rebuild.
    println!("cargo::rerun-if-changed={KERNEL_DIR}");
    let sources = cuda_sources();
    for path in &sources {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = find_nvcc();
    let cap = env::var("CUDA_COMPUTE_CAP").unwrap_or_else(|_| "90".to_string());
    let cap = cap.trim().trim_start_matches("sm_").replace('.', "");
    for src in sources.iter().filter(|p| p.extension().is_some_and(|e| e == "cu")) {
        let stem = src.file_stem().and_then(|s| s.to_str()).expect("kernel file names are UTF-8");
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let output = Command::new(&nvcc)
            .args(["--ptx", "-O3", "-std=c++17", "--expt-relaxed-constexpr"])
            .arg(format!("-arch=sm_{cap}"))
            .arg("-I")
            .arg(KERNEL_DIR)
            .arg("-o")
            .arg(&ptx)
            .arg(src)
            .output()
            .unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
        if !output.status.success() {
            panic!(
                "nvcc failed on {}:\n{}{}",
                src.display(),
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// Every `.cu` and `.cuh` file under `src/kernels`, sorted.
fn cuda_sources() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(KERNEL_DIR)
        .map(|dir| {
            dir.filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "cu" || e == "cuh"))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// `$CUDA_HOME/bin/nvcc` (or `$CUDA_PATH`), else `nvcc` on `PATH`; a clear failure otherwise.
fn find_nvcc() -> PathBuf {
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(var) {
            let nvcc = Path::new(&home).join("bin").join("nvcc");
            if nvcc.is_file() {
                return nvcc;
            }
        }
    }
    let on_path = Command::new("nvcc").arg("--version").output().is_ok_and(|o| o.status.success());
    if on_path {
        return PathBuf::from("nvcc");
    }
    panic!(
        "inferno: the `cuda` feature (on by default) compiles src/kernels/*.cu and needs nvcc from \
         CUDA 13.0, found neither in $CUDA_HOME/bin nor on PATH. Run `source scripts/cuda-env.sh` \
         first (it assembles the toolkit from PyPI when none is installed), or build a CPU-only \
         binary with `--no-default-features`."
    );
}
