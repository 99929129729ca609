//! GPU smoke test: a CUDA device is found, kernels run, and their results match the CPU.
//!
//! Ignored by default (CI has no GPU; `cargo test` reports them as ignored). On a GPU machine run
//! the test binaries with `--include-ignored` (scripts/gpu-tests.sh does that).

use candle_core::{DType, Device, Tensor};

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let diff =
        (a - b).unwrap().sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    let norm = b.sqr().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap() as f64;
    (diff / norm).sqrt()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn cuda_device_runs_kernels_that_match_the_cpu() {
    let (gpu, info) = inferno::gpu::open(0).expect("a CUDA device");
    eprintln!(
        "GPU 0: {} ({} MiB total, {} MiB free)",
        info.name,
        info.total_bytes >> 20,
        info.free_bytes >> 20
    );
    assert!(info.total_bytes > 0);

    // Fresh random inputs every run; matmul (cuBLAS), softmax and elementwise kernels (candle's nvcc-built PTX).
    let a = Tensor::randn(0f32, 1.0, (257, 513), &Device::Cpu).unwrap();
    let b = Tensor::randn(0f32, 1.0, (513, 129), &Device::Cpu).unwrap();
    let cpu =
        candle_nn::ops::softmax_last_dim(&(a.matmul(&b).unwrap().tanh().unwrap() * 3.0).unwrap())
            .unwrap();
    let ga = a.to_device(&gpu).unwrap();
    let gb = b.to_device(&gpu).unwrap();
    let out =
        candle_nn::ops::softmax_last_dim(&(ga.matmul(&gb).unwrap().tanh().unwrap() * 3.0).unwrap())
            .unwrap();
    let back = out.to_device(&Device::Cpu).unwrap();
    let err = rel_err(&back, &cpu);
    eprintln!("f32 relative error GPU vs CPU: {err:.2e}");
    // cuBLAS may use TF32 for f32 matmuls: allow ~1e-3.
    assert!(err < 2e-3, "GPU result differs from CPU: {err}");

    // bf16 path.
    let bf = ga.to_dtype(DType::BF16).unwrap().matmul(&gb.to_dtype(DType::BF16).unwrap()).unwrap();
    let bf = bf.to_dtype(DType::F32).unwrap().to_device(&Device::Cpu).unwrap();
    let err = rel_err(&bf, &a.matmul(&b).unwrap());
    eprintln!("bf16 relative error GPU vs CPU f32: {err:.2e}");
    assert!(err < 1e-2, "bf16 matmul error {err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn a_missing_device_is_a_clear_error() {
    let err = inferno::gpu::open(4096).expect_err("device 4096 does not exist");
    assert_eq!(inferno::error::kind_of(&err), inferno::error::ErrorKind::NoDevice);
    assert!(err.to_string().contains("no CUDA device 4096"), "{err}");
}
