//! Test helpers for the kernels: fresh random inputs from a printed seed, error norms, the GPU.

use candle_core::{DType, Device, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A generator seeded at random, or from `INFERNO_TEST_SEED` to replay a failure; the seed is
/// printed (visible with `--nocapture` or when the test fails).
pub(super) fn rng(test: &str) -> StdRng {
    let seed = crate::switches::test_var("INFERNO_TEST_SEED")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("{test}: seed {seed} (INFERNO_TEST_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

/// `n` values uniform in `[lo, hi)`.
pub(super) fn uniform(rng: &mut StdRng, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(lo..hi)).collect()
}

/// A CPU tensor of `values` in `shape`, converted to `dtype`.
pub(super) fn tensor(values: Vec<f32>, shape: &[usize], dtype: DType) -> Tensor {
    Tensor::from_vec(values, shape, &Device::Cpu)
        .and_then(|t| t.to_dtype(dtype))
        .expect("test tensor")
}

/// All elements of `t` as f32, in row-major order, on the host.
pub(super) fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1())
        .expect("tensor values")
}

/// ‖got − want‖ / ‖want‖ in f64 (want must not be all zeros).
pub(super) fn rel_err(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let (mut diff, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        diff += (f64::from(g) - f64::from(w)).powi(2);
        norm += f64::from(w).powi(2);
    }
    assert!(norm > 0.0, "reference is all zeros");
    (diff / norm).sqrt()
}

/// The first CUDA device; GPU tests are `#[ignore]`d, so this runs only when asked for.
#[cfg(feature = "cuda")]
pub(super) fn gpu() -> Device {
    Device::new_cuda(0)
        .expect("GPU tests need a CUDA GPU (run them with --ignored on a GPU machine)")
}

/// Mean wall time of `f` on the GPU in microseconds, after warm-up runs, synchronizing around.
#[cfg(feature = "cuda")]
pub(super) fn time_us(dev: &Device, runs: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    dev.synchronize().expect("synchronize");
    let t0 = std::time::Instant::now();
    for _ in 0..runs {
        f();
    }
    dev.synchronize().expect("synchronize");
    t0.elapsed().as_secs_f64() * 1e6 / runs as f64
}

/// Mean GPU time of `f` in microseconds as a decode step runs it: `runs` calls captured in one
/// CUDA graph and replayed, so that host overhead between launches does not count (a short
/// kernel launched from the host one at a time measures the host instead).
#[cfg(feature = "cuda")]
pub(super) fn graph_time_us(dev: &Device, runs: usize, mut f: impl FnMut()) -> f64 {
    use candle_core::cuda_backend::WrapErr;
    use candle_core::cuda_backend::cudarc::driver::sys::{
        CUgraphInstantiate_flags, CUstreamCaptureMode,
    };
    let Device::Cuda(cuda) = dev else { panic!("not a CUDA device") };
    // Eagerly first: loads the kernels, which a capture may not.
    f();
    dev.synchronize().expect("synchronize");
    let stream = cuda.cuda_stream();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .w()
        .expect("capture");
    for _ in 0..runs {
        f();
    }
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).w().expect("end capture");
    let graph = graph.expect("a non-empty graph");
    graph.launch().w().expect("replay");
    dev.synchronize().expect("synchronize");
    let replays = 5;
    let t0 = std::time::Instant::now();
    for _ in 0..replays {
        graph.launch().w().expect("replay");
    }
    dev.synchronize().expect("synchronize");
    t0.elapsed().as_secs_f64() * 1e6 / (replays * runs) as f64
}

#[cfg(feature = "cuda")]
/// A GPU-vs-CPU check: every output element was written (outputs are poisoned with NaN before
/// the kernel runs) and the relative error is under `tol`.
pub(super) fn assert_written_and_close(name: &str, got: &[f32], want: &[f32], tol: f64) {
    let unwritten = got.iter().filter(|v| v.is_nan()).count();
    assert_eq!(unwritten, 0, "{name}: {unwritten} output elements not written (or NaN)");
    let err = rel_err(got, want);
    eprintln!("{name}: relative error {err:.2e}");
    assert!(err < tol, "{name}: relative error {err:e}");
}
