//! Memory is planned before anything is allocated: a context or model too large for the memory
//! is refused with one line (exit code 7) naming the numbers and the largest context that fits,
//! never an abort in the allocator; `bench --json` reports the plan. On the CPU with the tiny
//! gpt-oss checkpoint (host memory is the budget with `--cpu`).
//!
//! The GPU test (ignored by default) holds the plan against the device memory that dummy-weight
//! loads of the benches/configs shapes really take.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_inferno")
}

fn tiny_gpt_oss() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code 7 and exactly one line, which names the largest context that fits; returns it.
fn refused_in_one_line(out: &Output) -> usize {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!err.contains("backtrace") && !err.contains("memory allocation of"), "{err}");
    assert!(err.starts_with("error: ") && err.contains(" needs "), "{err}");
    assert!(err.contains("(weights ") && err.contains(", KV cache "), "{err}");
    assert!(err.contains(" available (MemAvailable); "), "{err}");
    let n = err.trim_end().rsplit(' ').next().unwrap();
    n.parse().unwrap_or_else(|_| panic!("no largest context at the end: {err}"))
}

#[test]
fn play_refuses_a_context_larger_than_memory_in_one_line() {
    let out = Command::new(bin())
        .arg("play")
        .arg(tiny_gpt_oss())
        .args(["--cpu", "--context", "1000000000", "-p", "hi"])
        .output()
        .unwrap();
    let largest = refused_in_one_line(&out);
    // 1 KiB of KV cache and 256 B of RoPE tables per position: millions fit, not a billion.
    assert!((1000..1_000_000_000).contains(&largest), "{largest}");
    assert!(stderr(&out).contains("at --context 1000000000 "), "{}", stderr(&out));
}

#[test]
fn bench_refuses_huge_prompts_instead_of_allocating_them() {
    for args in [&["-p", "100000000000"][..], &["--context", "1000000000000"]] {
        let out = Command::new(bin())
            .arg("bench")
            .arg(tiny_gpt_oss())
            .args(["--cpu", "-r", "1"])
            .args(args)
            .output()
            .unwrap();
        refused_in_one_line(&out);
    }
}

#[test]
fn bench_json_reports_the_plan() {
    let out = Command::new(bin())
        .arg("bench")
        .arg(tiny_gpt_oss())
        .args(["--cpu", "--dtype", "f32", "-p", "16", "-n", "4", "-r", "1", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["step_tokens"], 2048, "the default step");
    let plan = &v["memory_plan"];
    assert_eq!(plan["context"], 20);
    // The engine's pool for one sequence of 20 positions: 2 blocks of 16 and the padding block
    // in both groups (a sliding group is never larger than the full one), 4 layers × k and v ×
    // 2 kv heads × 64 dims × f32.
    assert_eq!(plan["kv_cache_bytes"], 4 * 2 * 2 * 64 * 48 * 4);
    // cos and sin, 32 frequencies, f32.
    assert_eq!(plan["rope_tables_bytes"], 2 * 20 * 32 * 4);
    let total = plan["total_bytes"].as_u64().unwrap();
    assert!(total < plan["available_bytes"].as_u64().unwrap());
    let text = Command::new(bin())
        .arg("bench")
        .arg(tiny_gpt_oss())
        .args(["--cpu", "-p", "8", "-n", "2", "-r", "1"])
        .output()
        .unwrap();
    assert!(text.status.success(), "{}", stderr(&text));
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("plan:    ") && stdout.contains(" planned (weights "), "{stdout}");
}

#[test]
fn bench_takes_the_step_size_and_refuses_a_bad_one() {
    let run = |step: &str| {
        Command::new(bin())
            .arg("bench")
            .arg(tiny_gpt_oss())
            .args(["--cpu", "--dtype", "f32", "-p", "40", "-n", "2", "-r", "1", "--json"])
            .args(["--step-tokens", step])
            .output()
            .unwrap()
    };
    // A 40-token prompt in steps of 16: three chunks.
    let out = run("16");
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["step_tokens"], 16);
    assert!(v["prefill_tok_s"].as_f64().unwrap() > 0.0, "{v}");
    for bad in ["0", "8193", "many"] {
        let out = run(bad);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains("--step-tokens"), "{bad}: {}", stderr(&out));
    }
}

/// The default memory pool's counters: candle allocates every tensor from it (stream-ordered
/// allocation), so they show exactly what the model holds and its peak.
#[cfg(feature = "cuda")]
mod pool {
    use candle_core::cuda_backend::cudarc::driver::sys;

    pub struct Pool(sys::CUmemoryPool);

    impl Pool {
        pub fn default_of(ordinal: i32) -> Pool {
            let mut dev: sys::CUdevice = 0;
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: plain out-parameter calls on an initialised driver (the device is open).
            unsafe {
                assert_eq!(sys::cuDeviceGet(&mut dev, ordinal), sys::CUresult::CUDA_SUCCESS);
                let r = sys::cuDeviceGetDefaultMemPool(&mut pool, dev);
                assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
            }
            Pool(pool)
        }

        fn attr(&self, attr: sys::CUmemPool_attribute) -> u64 {
            let mut v: u64 = 0;
            // SAFETY: these attributes are u64 (cuuint64_t) values.
            let r =
                unsafe { sys::cuMemPoolGetAttribute(self.0, attr, (&mut v as *mut u64).cast()) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
            v
        }

        pub fn used(&self) -> u64 {
            self.attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        /// Held by the pool, used or not (what it has not yet given back to the driver).
        pub fn reserved(&self) -> u64 {
            self.attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
        }

        pub fn high(&self) -> u64 {
            self.attr(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        }

        /// The high watermark can only be reset to zero; it then follows the next allocation.
        pub fn reset_high(&self) {
            let mut zero: u64 = 0;
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
            // SAFETY: as above.
            let r =
                unsafe { sys::cuMemPoolSetAttribute(self.0, attr, (&mut zero as *mut u64).cast()) };
            assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        }
    }
}

/// One load measured against its plan; prints the numbers (the lead's report quotes them).
#[cfg(feature = "cuda")]
fn measure(
    device: &candle_core::Device,
    pool: &pool::Pool,
    name: &str,
    dummy: bool,
    context: usize,
) -> Vec<String> {
    use inferno::load::{self, LoadOptions};
    // What the memory pool keeps unused is given back first (`gpu::mempool`), as plans see it.
    let free = || inferno::gpu::available(device).expect("free memory");
    device.synchronize().unwrap();
    let (free0, used0) = (free(), pool.used());
    let opts =
        LoadOptions { dtype: None, context: Some(context), dummy, kv_dtype: Default::default() };
    let loaded = load::load(name, &opts, device).expect("load");
    let info = loaded.info.clone();
    // The KV pool an engine of one sequence allocates.
    let mut model = common::one_seq::OneSeq::new(loaded.split().0);
    device.synchronize().unwrap();
    let resident = pool.used() - used0;
    // The worst step for the workspace: a full step of the engine's default token budget at the
    // end of the context (its attention reads every position), then decode steps (the runner
    // captures its CUDA graph). The positions before it are filled first, as a sequence that
    // long would have.
    let n = inferno::engine::core::DEFAULT_TOKEN_BUDGET.min(context);
    if context > n {
        let before: Vec<u32> = (0..(context - n) as u32).map(|t| t % 1000).collect();
        model.forward_last(&before, 0).expect("filling the context");
        device.synchronize().unwrap();
    }
    pool.reset_high();
    let prompt: Vec<u32> = (0..n as u32).collect();
    model.forward_last(&prompt, context - n).expect("prefill");
    for pos in 0..4 {
        model.forward_last(&[7], pos).expect("decode");
    }
    device.synchronize().unwrap();
    let workspace = pool.high().saturating_sub(resident + used0);
    let outside_pool = free0.saturating_sub(free()).saturating_sub(pool.used() - used0);
    let p = info.plan;
    let planned_resident = p.weights + p.kv_cache + p.rope_tables;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "{name} @ {context}: resident {:.1} MiB (planned {:.1}), workspace {:.1} MiB (planned {:.1}), outside the pool {:.1} MiB (planned runtime {:.1}; the pool holds {:.1} MiB unused), free-memory drop after loading {:.1} MiB",
        mib(resident),
        mib(planned_resident),
        mib(workspace),
        mib(p.workspace),
        mib(outside_pool),
        mib(p.runtime),
        mib(pool.reserved() - pool.used()),
        mib(info.device_bytes.unwrap_or(0)),
    );
    let slack = planned_resident / 50 + (32 << 20);
    let checks = [
        (resident.abs_diff(planned_resident) <= slack, "resident"),
        (workspace <= p.workspace, "the workspace bound does not hold"),
        (p.workspace <= 4 * workspace + (64 << 20), "the workspace is far over"),
        (outside_pool <= p.runtime, "the runtime allowance is too small"),
    ];
    checks.iter().filter(|(ok, _)| !ok).map(|(_, what)| format!("{name}: {what}")).collect()
}

/// Tolerances, stated. Resident bytes (weights, KV cache, RoPE tables) come from the formulas
/// the models allocate by (exact on the CPU, see src/load/plan/tests.rs); on the GPU they
/// must agree within 2% + 32 MiB, room for the stream-ordered allocator's rounding. The
/// workspace is an upper bound that must hold, and be no more than 4× + 64 MiB what the worst
/// step takes. What the CUDA libraries take outside the pool (cuBLAS workspaces, modules,
/// the decode graph's memory, what the pool keeps) must fit the runtime allowance. Cases: the
/// benches/configs shapes with random weights, and the SmolLM2 Q4_1 GGUF (quantized tensors
/// padded on the GPU); INFERNO_ASSETS names the folder holding it (scripts/gpu-tests.sh).
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_plan_matches_the_memory_of_dummy_loads() {
    let (device, _) = inferno::load::open_device(0, false).expect("a CUDA device");
    let pool = pool::Pool::default_of(0);
    // Every case is measured and printed before any failure is reported.
    let mut failures = Vec::new();
    for (config, context) in
        [("tinyllama-1.1b", 2048), ("llama-3.1-8b", 8192), ("gpt-oss-20b", 8192)]
    {
        // Beside the sources, or under the current directory when the test binary runs from a
        // copy of the repository elsewhere (the GPU machine, scripts/gpu-tests.sh).
        let built = format!("{}/benches/configs/{config}.json", env!("CARGO_MANIFEST_DIR"));
        let path = if std::path::Path::new(&built).exists() {
            built
        } else {
            format!("benches/configs/{config}.json")
        };
        failures.extend(measure(&device, &pool, &path, true, context));
    }
    let gguf = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    failures.extend(measure(&device, &pool, gguf.to_str().unwrap(), false, 8192));
    assert!(failures.is_empty(), "{failures:#?}");
}
