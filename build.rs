//! Compiles inferno's own CUDA kernels (every `.cu` file under `src/kernels`, one folder per op)
//! to fat binaries when the `cuda` feature is on.
//!
//! `src/kernels/OP/NAME.cu` becomes `$OUT_DIR/kernels/OP/NAME.fatbin` (named after its path, so
//! two files of one name in different folders stay apart), and `$OUT_DIR/kernels.rs` gets a
//! constant for it, `OP::NAME` (upper case; file and folder names must be snake_case, so
//! constants cannot collide either), which `src/kernels/cuda.rs` includes: the fat binary
//! embedded with `include_bytes!` and the name its module is cached under, loaded at run time.
//! A fat binary holds the machine code for the target, so the driver compiles nothing when it
//! loads (from PTX alone it compiled for 46 s at an H100's first start), and the PTX, which a
//! later GPU compiles. Headers shared by several ops live in
//! `src/kernels/include` (on the include path); an op's own headers sit beside its `.cu` files.
//! The targets are `src/gpu/targets.rs`'s: by default machine code for every architecture
//! from sm_80 to sm_120 and PTX for the newest; `INFERNO_CUDA_ARCHS` or `CUDA_COMPUTE_CAP` (a
//! capability or a list, `compute_XY` for PTX alone) narrows them. ptxas's report of every
//! kernel on every target is checked against that target's limits (registers; static shared
//! memory plus the largest dynamic, `src/kernels/shared_memory.rs`) and kept beside the fat
//! binary as `NAME.usage`. nvcc comes from `$CUDA_HOME/bin` or `PATH`, as
//! `scripts/cuda-env.sh` sets them up; it must be CUDA 13.0 (see docs/cuda-build.md: newer PTX
//! is refused by the GPU machines' driver).
//!
//! No `--use_fast_math`: it turns on flush-to-zero, and the MXFP4 decoder relies on the subnormal
//! scale 2^-127 (E8M0 byte 0) being exact; the kernels are memory-bound, so fast math buys little.
//!
//! It also generates the lazy-binding trampolines that let the binary start without the CUDA
//! libraries (`src/gpu/lazy.rs` says why and how): `$OUT_DIR/cuda_symbols.rs` and
//! `$OUT_DIR/cuda_lazy.s`, from the functions exported by the libraries the link will use.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "src/gpu/codegen.rs"]
mod codegen;
#[path = "src/kernels/shared_memory.rs"]
mod shared_memory;
// The binary reads more of it than the build does.
#[allow(dead_code)]
#[path = "src/gpu/targets.rs"]
mod targets;
// Also used by the tests, which read more of it than the build does.
#[allow(dead_code)]
#[path = "src/gpu/elfdyn.rs"]
mod elfdyn;

const KERNEL_DIR: &str = "src/kernels";

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=CUDA_COMPUTE_CAP");
    println!("cargo::rerun-if-env-changed=INFERNO_CUDA_ARCHS");
    println!("cargo::rerun-if-env-changed=CUDA_HOME");
    println!("cargo::rerun-if-changed=src/kernels/shared_memory.rs");
    println!("cargo::rerun-if-changed=src/gpu/targets.rs");
    println!("cargo::rerun-if-changed=src/gpu/codegen.rs");
    println!("cargo::rerun-if-changed=src/gpu/elfdyn.rs");

    // The folder too, so that a new kernel file triggers a rebuild.
    println!("cargo::rerun-if-changed={KERNEL_DIR}");
    let sources = cuda_sources(Path::new(KERNEL_DIR));
    for path in &sources {
        println!("cargo::rerun-if-changed={}", path.display());
    }
    if env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }

    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    generate_trampolines(&out_dir);
    let kernels: Vec<Kernel> = sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .map(|p| Kernel::new(p, &out_dir))
        .collect();
    write(&out_dir.join("kernels.rs"), &kernel_constants(&kernels));
    let nvcc = find_nvcc();
    let spec = ["INFERNO_CUDA_ARCHS", "CUDA_COMPUTE_CAP"]
        .iter()
        .find_map(|v| env::var(v).ok().filter(|s| !s.trim().is_empty()))
        .unwrap_or_else(|| targets::DEFAULT.to_string());
    let targets = targets::parse(&spec).unwrap_or_else(|e| {
        panic!("inferno: CUDA_COMPUTE_CAP / INFERNO_CUDA_ARCHS = {spec:?}: {e}")
    });
    // The binary checks the GPU against it before its first launch, and `inferno doctor` shows it.
    println!("cargo::rustc-env=INFERNO_CUDA_ARCHS={}", targets::encode(&targets));
    // nvcc compiles one file on one core: run up to cargo's job count at once, the biggest
    // files first (the shortest tail). A failure panics in its thread, which fails the scope.
    let mut kernels: Vec<&Kernel> = kernels.iter().collect();
    kernels.sort_by_key(|k| {
        std::cmp::Reverse(std::fs::metadata(&k.src).map(|m| m.len()).unwrap_or(0))
    });
    let jobs = env::var("NUM_JOBS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, kernels.len().max(1)) {
            scope.spawn(|| {
                while let Some(kernel) =
                    kernels.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                {
                    compile_kernel(&nvcc, &targets, kernel);
                }
            });
        }
    });
}

/// A kernel file: `src/kernels/OP/NAME.cu`, its fat binary and the name of its constant in
/// `kernels.rs`.
struct Kernel {
    src: PathBuf,
    fatbin: PathBuf,
    /// The folders from `src/kernels` down (the modules of `kernels.rs`), then the file's stem.
    modules: Vec<String>,
    stem: String,
}

impl Kernel {
    fn new(src: &Path, out_dir: &Path) -> Self {
        let rel = src.strip_prefix(KERNEL_DIR).expect("kernel files are under src/kernels");
        let name =
            |s: &std::ffi::OsStr| s.to_str().expect("kernel file names are UTF-8").to_owned();
        let modules: Vec<String> = rel
            .parent()
            .into_iter()
            .flat_map(|p| p.components())
            .map(|c| name(c.as_os_str()))
            .collect();
        let stem = name(rel.file_stem().expect("a kernel file has a name"));
        for part in modules.iter().chain([&stem]) {
            let ok = part.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !ok {
                panic!("{}: kernel folders and files are named in snake_case", src.display());
            }
        }
        let fatbin = out_dir.join("kernels").join(rel).with_extension("fatbin");
        Kernel { src: src.to_owned(), fatbin, modules, stem }
    }

    /// The path below `src/kernels` without the extension: `OP/NAME`.
    fn key(&self) -> String {
        self.modules.iter().chain([&self.stem]).cloned().collect::<Vec<_>>().join("/")
    }
}

/// `kernels.rs`: for each kernel file a constant `NAME` (the stem in upper case) in the modules
/// of its folders, `Fatbin { module, image }`, the image embedded from `$OUT_DIR/kernels`.
fn kernel_constants(kernels: &[Kernel]) -> String {
    let mut sorted: Vec<&Kernel> = kernels.iter().collect();
    sorted.sort_by(|a, b| (&a.modules, &a.stem).cmp(&(&b.modules, &b.stem)));
    let mut out = String::from("// Generated by build.rs from the .cu files under src/kernels.\n");
    let mut open: Vec<&str> = Vec::new();
    for k in sorted {
        let common = open.iter().zip(&k.modules).take_while(|(a, b)| **a == b.as_str()).count();
        while open.len() > common {
            open.pop();
            out += &format!("{}}}\n", "    ".repeat(open.len()));
        }
        for m in &k.modules[common..] {
            out += &format!("{}pub mod {m} {{\n", "    ".repeat(open.len()));
            open.push(m);
            out += &format!("{}use super::Fatbin;\n", "    ".repeat(open.len()));
        }
        let indent = "    ".repeat(open.len());
        let path = k.fatbin.to_str().expect("OUT_DIR is UTF-8");
        out += &format!(
            "{indent}/// `src/kernels/{key}.cu`, compiled.\n{indent}pub const {name}: Fatbin = \
             Fatbin {{ module: \"inferno/{key}\", image: include_bytes!({path:?}) }};\n",
            key = k.key(),
            name = k.stem.to_uppercase(),
        );
    }
    while open.pop().is_some() {
        out += &format!("{}}}\n", "    ".repeat(open.len()));
    }
    out
}

/// `kernel.src` to its fat binary for `targets` (one `-gencode` each), then ptxas's resources
/// of every kernel on every machine-code target checked against that target's limits; panics
/// with nvcc's output, or with the kernels over a limit.
fn compile_kernel(nvcc: &Path, targets: &[targets::Target], kernel: &Kernel) {
    let dir = kernel.fatbin.parent().expect("the fat binary has a folder");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let gencodes = targets.iter().map(|t| {
        let code = t.name();
        format!("-gencode=arch=compute_{},code={code}", t.cap)
    });
    let output = Command::new(nvcc)
        .args(["--fatbin", "-O3", "-std=c++17", "--expt-relaxed-constexpr", "--resource-usage"])
        // Machine code for seven targets is most of the binary: the size mode packs it about
        // three times smaller than nvcc's default, and the driver unpacks a module as it loads.
        .arg("--compress-mode=size")
        .args(gencodes)
        .arg("-I")
        .arg(Path::new(KERNEL_DIR).join("include"))
        .arg("-o")
        .arg(&kernel.fatbin)
        .arg(&kernel.src)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", nvcc.display()));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        panic!("nvcc failed on {}:\n{report}", kernel.src.display());
    }
    write(&kernel.fatbin.with_extension("usage"), &report);
    let over = over_limits(&report);
    if !over.is_empty() {
        panic!(
            "{}: kernels over a target's limits (static shared memory from ptxas plus the largest \
             dynamic, src/kernels/shared_memory.rs):\n{}",
            kernel.src.display(),
            over.join("\n")
        );
    }
}

/// The kernels of ptxas's `--resource-usage` report ("Compiling entry function 'NAME' for
/// 'sm_XY'", then "Used R registers, … S bytes smem, …") over the limits of their target.
fn over_limits(report: &str) -> Vec<String> {
    let mut over = Vec::new();
    let mut current: Option<(String, u32)> = None;
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let name = parts.next().unwrap_or_default().to_string();
            let cap = parts.nth(1).and_then(|t| t.trim_start_matches("sm_").parse().ok());
            current = cap.map(|c| (name, c));
        } else if let (Some((name, cap)), Some(used)) = (&current, line.split("Used ").nth(1)) {
            let words: Vec<&str> = used.split([' ', ',']).filter(|w| !w.is_empty()).collect();
            let number_before = |unit: &[&str]| -> usize {
                words
                    .windows(unit.len() + 1)
                    .find(|w| w[1..] == *unit)
                    .and_then(|w| w[0].parse().ok())
                    .unwrap_or(0)
            };
            let registers = number_before(&["registers"]) as u32;
            let fixed = number_before(&["bytes", "smem"]);
            let dynamic = shared_memory::largest(name);
            let limit = targets::shared_per_block(*cap);
            if registers > targets::MAX_REGISTERS {
                over.push(format!("  {name} on sm_{cap}: {registers} registers"));
            }
            if fixed.saturating_add(dynamic) > limit {
                over.push(format!(
                    "  {name} on sm_{cap}: {fixed} bytes static + {dynamic} dynamic shared memory, \
                     over the {limit} a block may take"
                ));
            }
        }
    }
    over
}

/// Every `.cu` and `.cuh` file under `dir`, sorted.
fn cuda_sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return files };
    for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
        if path.is_dir() {
            files.extend(cuda_sources(&path));
        } else if path.extension().is_some_and(|e| e == "cu" || e == "cuh") {
            files.push(path);
        }
    }
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
        "inferno: the `cuda` feature compiles the .cu files under src/kernels and \
         needs nvcc from CUDA 13.0, found neither in $CUDA_HOME/bin nor on PATH. Run `source scripts/cuda-env.sh` \
         first (it assembles the toolkit from PyPI when none is installed), or build a CPU-only \
         binary without `--features cuda`."
    );
}

/// Writes `cuda_symbols.rs` and `cuda_lazy.s` (see `src/gpu/lazy.rs`) for the CUDA libraries the
/// link will find, in the order and folders it will search.
fn generate_trampolines(out_dir: &Path) {
    for var in codegen::CUDA_ROOT_VARS.iter().chain(&["LIBRARY_PATH"]) {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let target = |v: &str| env::var(format!("CARGO_CFG_TARGET_{v}")).unwrap_or_default();
    let link_env = codegen::LinkEnv {
        cuda_roots: codegen::CUDA_ROOT_VARS
            .iter()
            .filter_map(env::var_os)
            .map(PathBuf::from)
            .collect(),
        encoded_rustflags: env::var("CARGO_ENCODED_RUSTFLAGS").unwrap_or_default(),
        library_path: env::var("LIBRARY_PATH").unwrap_or_default(),
        multiarch: codegen::multiarch(&target("ARCH"), &target("ENV")),
    };
    let dirs = codegen::search_dirs(&link_env);
    link_static_cudart(&dirs);
    let libs: Vec<codegen::Found> = codegen::LINKED.iter().map(|name| find(name, &dirs)).collect();
    let symbols = codegen::assign(&libs);
    assert!(symbols.len() < 1 << 16, "more CUDA functions than the aarch64 stubs can index");
    write(&out_dir.join("cuda_symbols.rs"), &codegen::rust_tables(&libs, &symbols));
    let asm = codegen::asm(&target("ARCH"), &symbols).unwrap_or_else(|| {
        println!(
            "cargo::warning=no lazy CUDA trampolines for {}: the binary will need the CUDA \
             libraries to start",
            target("ARCH")
        );
        String::new()
    });
    write(&out_dir.join("cuda_lazy.s"), &asm);
}

/// Links the CUDA runtime statically, as nvcc does by default. candle-kernels links nvcc-built
/// kernels (`libmoe.a`) whose static constructors register their fat binaries with the runtime
/// when the process starts, and asks for `-lcudart`. A lazy trampoline would have to open
/// libcudart.so right then, before `main`, so the runtime is not trampolined: the static
/// runtime records the registrations itself and opens libcuda.so.1 only at its first real call.
/// `+whole-archive` makes its definitions win over libcudart.so's whatever the link order, so
/// `--as-needed` drops libcudart.so as well.
fn link_static_cudart(dirs: &[PathBuf]) {
    let Some(dir) = dirs.iter().find(|d| d.join("libcudart_static.a").is_file()) else {
        println!(
            "cargo::warning=libcudart_static.a not found: the binary will need libcudart.so to start"
        );
        return;
    };
    println!("cargo::rerun-if-changed={}", dir.join("libcudart_static.a").display());
    println!("cargo::rustc-link-search=native={}", dir.display());
    println!("cargo::rustc-link-lib=static:-bundle,+whole-archive=cudart_static");
}

/// `-l{link_name}` as the linker will find it, with its SONAME and exported functions. A library
/// that is not found or not readable gets no trampolines (the link then fails or binds it the
/// old way, which `tests/no_cuda.rs` reports).
fn find(link_name: &'static str, dirs: &[PathBuf]) -> codegen::Found {
    let fallback =
        codegen::Found { link_name, soname: format!("lib{link_name}.so"), functions: Vec::new() };
    let Some(path) = codegen::find_library(link_name, dirs) else {
        println!("cargo::warning=lib{link_name}.so not found for the lazy CUDA trampolines");
        return fallback;
    };
    println!("cargo::rerun-if-changed={}", path.display());
    match elfdyn::read(&path) {
        Ok(elf) => codegen::Found {
            link_name,
            soname: elf.soname.unwrap_or(fallback.soname),
            functions: elf.functions,
        },
        Err(e) => {
            println!("cargo::warning=lazy CUDA trampolines: {e}");
            fallback
        }
    }
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
