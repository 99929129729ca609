//! The binary on machines without CUDA (a login or download node, a GPU node missing a
//! library): it must start, `--version`, `--help`, `list` and `download` must work, and `play`
//! and `bench` must stop with exit code 8 and one line naming what is missing.
//!
//! Each case runs a copy of the built binary (its run path, if any, blanked) with an empty
//! environment, so the only CUDA libraries it can reach are the ones a case puts on
//! `LD_LIBRARY_PATH`: none, a fake driver built here with `cc` (whose behaviour the `FAKE_CUDA*`
//! variables choose), or the fake driver plus the real CUDA libraries that
//! `scripts/cuda-env.sh` put on this process's `LD_LIBRARY_PATH`.
#![cfg(all(target_os = "linux", feature = "cuda"))]

mod common;
#[path = "../src/gpu/elfdyn.rs"]
mod elfdyn;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The CUDA libraries the binary must not need at start-up.
const CUDA_LIBS: [&str; 6] =
    ["libcuda", "libcublas", "libcublasLt", "libcurand", "libnvrtc", "libcudart"];

/// A fresh folder (empty HF cache, home) and the copy of the binary the tests share.
struct Sandbox {
    dir: tempfile::TempDir,
    bin: &'static Path,
}

/// The binary, copied once into a folder of its own with its run path blanked. Once, and before
/// any test starts a process: a file being written while another thread forks can make exec of
/// it fail with "text file busy".
fn isolated_binary() -> &'static Path {
    static BIN: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    let (_, bin) = BIN.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("inferno");
        std::fs::copy(env!("CARGO_BIN_EXE_inferno"), &bin).unwrap();
        blank_run_paths(&bin);
        (dir, bin)
    });
    bin
}

impl Sandbox {
    fn new() -> Sandbox {
        let bin = isolated_binary();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("hub")).unwrap();
        Sandbox { dir, bin }
    }

    /// Runs the binary with only `env` besides HOME, PATH and the HF variables.
    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        Command::new(self.bin)
            .args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("PATH", "/usr/bin:/bin")
            .env("HF_HUB_CACHE", self.dir.path().join("hub"))
            .env("HF_TOKEN_PATH", self.dir.path().join("no-token"))
            // Nothing listens on port 9 of the loopback: downloads fail fast, with exit code 5.
            .env("HF_ENDPOINT", "http://127.0.0.1:9")
            .env("INFERNO_RETRY_DELAY_MS", "20")
            .envs(env.iter().copied())
            .output()
            .unwrap()
    }

    /// A folder holding a fake `libcuda.so.1` (see [`FAKE_DRIVER`]).
    fn fake_driver(&self) -> PathBuf {
        let dir = self.dir.path().join("fake-driver");
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("fake.c");
        std::fs::write(&src, FAKE_DRIVER).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
            .arg(dir.join("libcuda.so.1"))
            .arg(&src)
            .output()
            .unwrap_or_else(|e| panic!("{cc}: {e} (a C compiler builds the fake driver)"));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        dir
    }
}

/// A driver with the entry points the probe calls. `FAKE_CUDA=34` makes it a stub,
/// `FAKE_CUDA=100` a driver that sees no GPU, `FAKE_CUDA_VERSION` sets its CUDA version. It
/// has no context functions, so a call past the probe finds a function missing.
const FAKE_DRIVER: &str = r#"
#include <stdlib.h>
static int mode(void) { const char *m = getenv("FAKE_CUDA"); return m ? atoi(m) : 0; }
int cuDriverGetVersion(int *v) {
    const char *s = getenv("FAKE_CUDA_VERSION");
    if (mode() == 34) return 34;
    *v = s ? atoi(s) : 13000;
    return 0;
}
int cuInit(unsigned flags) { return mode() == 100 ? 100 : mode(); }
int cuDeviceGetCount(int *n) { *n = 1; return 0; }
int cuDeviceGet(int *d, int ordinal) { *d = ordinal; return 0; }
int cuGetErrorName(int e, const char **s) { *s = "CUDA_ERROR_FAKE"; return 0; }
"#;

/// Overwrites the binary's run path strings with a folder that does not exist, so only what a
/// case puts on LD_LIBRARY_PATH is reachable (`scripts/install.sh` records a run path).
fn blank_run_paths(bin: &Path) {
    let elf = elfdyn::read(bin).unwrap();
    if elf.run_paths.is_empty() {
        return;
    }
    let mut bytes = std::fs::read(bin).unwrap();
    for (text, offset) in &elf.run_paths {
        let start = usize::try_from(*offset).unwrap();
        let blank = format!("/{}", "x".repeat(text.len().saturating_sub(1)));
        bytes[start..start + text.len()].copy_from_slice(&blank.as_bytes()[..text.len()]);
    }
    std::fs::write(bin, bytes).unwrap();
}

/// The folder on this process's LD_LIBRARY_PATH holding the real `libcublas.so.*`.
fn real_cuda_libs() -> Option<PathBuf> {
    let path = std::env::var("LD_LIBRARY_PATH").ok()?;
    path.split(':').map(PathBuf::from).find(|d| {
        std::fs::read_dir(d).is_ok_and(|mut it| {
            it.any(|e| {
                e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcublas.so."))
            })
        })
    })
}

/// Whether the system loader would find a `libcuda.so.1` without LD_LIBRARY_PATH (a machine
/// with the NVIDIA driver installed): then "no driver" cannot be tested here.
fn system_has_driver() -> bool {
    let cached = ["/sbin/ldconfig", "/usr/sbin/ldconfig"].iter().any(|ldconfig| {
        Command::new(ldconfig)
            .arg("-p")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1 "))
    });
    let dirs = ["/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"];
    cached
        || dirs.iter().any(|d| Path::new(d).join("libcuda.so.1").exists())
        || Path::new("/usr/lib/aarch64-linux-gnu/libcuda.so.1").exists()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Exit code 8 and exactly one line on stderr, `error: ` then something that contains `what`.
#[track_caller]
fn assert_no_device(out: &Output, what: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(8), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(what), "wanted {what:?} in: {err}");
}

#[track_caller]
fn assert_ok(out: &Output) {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
}

#[test]
fn the_binary_needs_no_cuda_library_to_start() {
    let elf = elfdyn::read(Path::new(env!("CARGO_BIN_EXE_inferno"))).unwrap();
    for needed in &elf.needed {
        let stem = needed.split(".so").next().unwrap_or(needed);
        assert!(!CUDA_LIBS.contains(&stem), "DT_NEEDED {needed}: all of {:?}", elf.needed);
    }
    // The trampolines are hidden: the binary exports no CUDA name that could interpose on the
    // libraries' calls to each other.
    let exported: Vec<&String> = elf
        .functions
        .iter()
        .filter(|f| ["cu", "nvrtc", "__cuda"].iter().any(|p| f.starts_with(p)))
        .collect();
    assert!(exported.is_empty(), "exported: {exported:?}");
}

#[test]
fn without_any_cuda_library_the_cpu_commands_work() {
    let sandbox = Sandbox::new();
    let out = sandbox.run(&["--version"], &[]);
    assert_ok(&out);
    assert!(text(&out.stdout).starts_with("inferno "), "{}", text(&out.stdout));
    assert_ok(&sandbox.run(&["--help"], &[]));
    assert_ok(&sandbox.run(&["play", "--help"], &[]));
    let out = sandbox.run(&["list"], &[]);
    assert_ok(&out);
    let out = sandbox.run(&["list", "--json"], &[]);
    assert_ok(&out);
    assert_eq!(text(&out.stdout).trim(), "[]");
    // download runs: it gets as far as the network (exit code 5), not killed by the loader.
    let out = sandbox.run(&["download", "org/model"], &[]);
    assert_eq!(out.status.code(), Some(5), "stderr: {}", text(&out.stderr));
}

/// The CPU path (a debugging aid) touches no CUDA function, so it runs without CUDA too.
#[test]
fn without_any_cuda_library_play_runs_on_the_cpu() {
    let gguf = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    let gguf = gguf.to_string_lossy().into_owned();
    let args =
        ["play", &gguf, "--cpu", "--prompt", "Hi", "--max-tokens", "3", "--temperature", "0"];
    let out = Sandbox::new().run(&args, &[]);
    assert_ok(&out);
    assert!(!text(&out.stdout).trim().is_empty(), "no reply");
}

#[test]
fn without_the_driver_play_and_bench_say_so() {
    if system_has_driver() {
        eprintln!("skipped: this machine's loader finds an NVIDIA driver without LD_LIBRARY_PATH");
        return;
    }
    let sandbox = Sandbox::new();
    let no_driver = "no NVIDIA driver: libcuda.so.1 was not found";
    assert_no_device(&sandbox.run(&["play", "org/model", "--prompt", "hi"], &[]), no_driver);
    assert_no_device(&sandbox.run(&["bench", "org/model"], &[]), no_driver);
    assert_no_device(&sandbox.run(&["bench", "org/model", "--gpu", "1"], &[]), no_driver);
}

#[test]
fn a_driver_that_cannot_run_is_named() {
    let sandbox = Sandbox::new();
    let driver = sandbox.fake_driver();
    let lib_path = driver.to_string_lossy().into_owned();
    let play = |extra: &[(&str, &str)]| {
        let mut env = vec![("LD_LIBRARY_PATH", lib_path.as_str())];
        env.extend_from_slice(extra);
        sandbox.run(&["play", "org/model", "--prompt", "hi"], &env)
    };
    let stub =
        format!("no NVIDIA driver: {} is a stub libcuda", driver.join("libcuda.so.1").display());
    assert_no_device(&play(&[("FAKE_CUDA", "34")]), &stub);
    assert_no_device(
        &play(&[("FAKE_CUDA_VERSION", "12040")]),
        "the NVIDIA driver supports CUDA 12.4; inferno needs CUDA 13.0 or newer",
    );
    assert_no_device(&play(&[("FAKE_CUDA", "100")]), "no CUDA device: the NVIDIA driver (");
    assert_no_device(&play(&[("FAKE_CUDA", "999")]), "failed to start: CUDA_ERROR_FAKE (999)");
    let out = sandbox.run(&["bench", "org/model", "--gpu", "3"], &[("LD_LIBRARY_PATH", &lib_path)]);
    assert_no_device(&out, "no CUDA device 3: the NVIDIA driver sees 1 GPU (use --gpu 0)");
}

#[test]
fn a_missing_cuda_library_is_named_with_the_folders_searched() {
    let sandbox = Sandbox::new();
    let driver = sandbox.fake_driver();
    let lib_path = driver.to_string_lossy().into_owned();
    let play =
        || sandbox.run(&["play", "org/model", "--prompt", "hi"], &[("LD_LIBRARY_PATH", &lib_path)]);
    let out = play();
    assert_no_device(&out, &format!("no libcublas: libcublas.so.13 was not found in {lib_path}, "));
    assert!(text(&out.stderr).contains("run scripts/install.sh"), "{}", text(&out.stderr));

    // cuBLAS without the cuBLASLt it loads: the loader's reason.
    let Some(real) = real_cuda_libs() else {
        panic!("no libcublas.so.* on LD_LIBRARY_PATH: run under `source scripts/cuda-env.sh`");
    };
    link_libraries(&real, &driver, &["libcublas"]);
    assert_no_device(
        &play(),
        "libcublas.so.13 could not be loaded: libcublasLt.so.13: cannot open",
    );
    link_libraries(&real, &driver, &["libcublasLt"]);
    assert_no_device(
        &play(),
        &format!("no libcurand: libcurand.so.10 was not found in {lib_path}, "),
    );
}

/// Symlinks `from/NAME.so*` into `to` for each NAME.
fn link_libraries(from: &Path, to: &Path, names: &[&str]) {
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if names.iter().any(|n| file.starts_with(&format!("{n}.so"))) {
            std::os::unix::fs::symlink(entry.path(), to.join(&file)).unwrap();
        }
    }
}

/// The probe requires the libraries that GPU commands call: every library with a trampoline
/// left in the binary (`--gc-sections` drops the others) must be in `probe::REQUIRED`.
#[test]
fn the_probe_checks_every_library_the_binary_calls() {
    let bytes = std::fs::read(env!("CARGO_BIN_EXE_inferno")).unwrap();
    let file = object::read::elf::ElfFile64::<object::Endianness>::parse(&*bytes).unwrap();
    let mut called: Vec<&str> = object::Object::symbols(&file)
        .filter_map(|s| {
            object::ObjectSymbol::name(&s).ok()?.strip_prefix("inferno_cuda_stub_")?.parse().ok()
        })
        .map(|index: usize| {
            generated::LIBRARIES[usize::from(generated::SYMBOLS[index].0)].link_name
        })
        .collect();
    called.sort_unstable();
    called.dedup();
    assert!(called.contains(&"cuda") && called.contains(&"cublas"), "{called:?} (no symbols?)");
    for lib in &called {
        assert!(inferno::gpu::probe::REQUIRED.contains(lib), "{lib} is called but not checked");
    }
}

/// The build's table of trampolines (`build.rs`, `src/gpu/codegen.rs`).
mod generated {
    pub struct Library {
        pub link_name: &'static str,
        #[allow(dead_code)]
        pub soname: &'static str,
    }
    include!(concat!(env!("OUT_DIR"), "/cuda_symbols.rs"));
}

/// With every library present the probe passes and the first call the fake driver lacks
/// reaches a lazy trampoline that cannot bind: one line and exit code 8 from the trampoline.
#[test]
fn a_function_missing_from_the_driver_stops_the_process_with_one_line() {
    let sandbox = Sandbox::new();
    let driver = sandbox.fake_driver();
    let Some(real) = real_cuda_libs() else {
        panic!("no libcublas.so.* on LD_LIBRARY_PATH: run under `source scripts/cuda-env.sh`");
    };
    let lib_path = format!("{}:{}", driver.display(), real.display());
    let out =
        sandbox.run(&["play", "org/model", "--prompt", "hi"], &[("LD_LIBRARY_PATH", &lib_path)]);
    let fake = driver.join("libcuda.so.1");
    assert_no_device(&out, &format!("error: {} has no function cu", fake.display()));
}

/// `inferno doctor` on a machine without the driver: it runs, names the problem with a fix,
/// reports the cache (and that a token is set, never the token), plans each cached model from
/// its headers (the same plan `play` checks), lists the switches, and exits nonzero.
#[test]
fn doctor_without_the_driver_reports_the_cache_and_the_fix() {
    let sandbox = Sandbox::new();
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = sandbox.dir.path().join("hub/models--test--tiny-gpt-oss");
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gpt_oss_tiny");
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(f), snapshot.join(f)).unwrap();
    }
    let token = "hf_doctor_must_not_print_this";
    let out = sandbox.run(&["doctor"], &[("HF_TOKEN", token)]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("no NVIDIA driver") && stdout.contains("fix: "), "{stdout}");
    assert!(stdout.contains("1 model revision(s)"), "{stdout}");
    assert!(stdout.contains("HF_TOKEN is set") && !stdout.contains(token), "{stdout}");
    assert!(stdout.contains("test/tiny-gpt-oss@01234567: needs"), "{stdout}");
    assert!(stdout.contains("ok INFERNO_CUDA_GRAPH=1 (default)"), "{stdout}");
    assert!(!stdout.contains("INFERNO_TEST_HOOKS"), "test knobs show only when set: {stdout}");

    let env = [("HF_TOKEN", token), ("INFERNO_PDL", "maybe"), ("INFERNO_STEP_STATS", "1")];
    let out = sandbox.run(&["doctor", "--json"], &env);
    assert_eq!(out.status.code(), Some(1));
    assert!(!text(&out.stdout).contains(token));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    assert!(v["gpu"]["driver_error"].as_str().is_some_and(|e| e.contains("libcuda.so.1")), "{v}");
    assert_eq!(v["cache"]["models"], 1);
    assert_eq!(v["cache"]["hf_token_set"], true);
    assert!(!v["problems"].as_array().unwrap().is_empty());
    let switch = |name: &str| {
        let all = v["switches"].as_array().expect("switches");
        all.iter().find(|s| s["name"] == name).cloned().unwrap_or_else(|| panic!("{name}: {v}"))
    };
    let pdl = switch("INFERNO_PDL");
    assert_eq!((&pdl["set"], &pdl["value"]), (&"maybe".into(), &"1".into()), "{pdl}");
    assert_eq!(pdl["error"], "expected 0 or 1");
    let stats = switch("INFERNO_STEP_STATS");
    assert_eq!((&stats["set"], &stats["value"]), (&"1".into(), &"1".into()), "{stats}");
    assert!(switch("INFERNO_PIPELINE")["set"].is_null());
    let problems = v["problems"].to_string();
    assert!(problems.contains("INFERNO_PDL=maybe is not accepted"), "{problems}");
    // The model's plan is the loader's: the same numbers `play` checks before loading.
    let opts = inferno::load::LoadOptions {
        dtype: None,
        context: None,
        dummy: false,
        kv_dtype: Default::default(),
    };
    let (_, spec) = inferno::load::prepare(
        &snapshot.to_string_lossy(),
        &opts,
        inferno::load::plan::Target::Gpu,
    )
    .unwrap();
    let model = &v["models"][0];
    assert_eq!(model["needed_bytes"], spec.plan(spec.context).total(), "{v}");
    assert_eq!(model["context"], spec.context);
    assert!(model["fits"].is_null(), "no GPU to check against: {v}");
}
