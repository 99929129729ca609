//! GPU against the CPU reference ([`QuantLinear::matmul_f32`] on the host: dequantized f32
//! weights, per-token fake-quantized inputs) on fresh random weights and inputs.

use candle_core::{DType, Device};

use super::gpu::{Route, quant_matmul};
use crate::kernels::testing::{assert_written_and_close, gpu, rng, tensor, uniform, values};
use crate::models::quant::{ActQuant, QuantLinear, Scheme, WeightFormat};

fn schemes() -> Vec<(&'static str, Scheme, f64)> {
    let int4 = |group, symmetric, g_idx| WeightFormat::Int4 { group, symmetric, g_idx };
    // 8-bit: the same quantized values on both sides, sums in another order (~1e-6). 4-bit:
    // the GPU rounds each dequantized weight to bf16 as a bf16 reference does (2^-9 relative),
    // the CPU reference keeps f32.
    vec![
        ("w8a8", Scheme { weight: WeightFormat::Int8, act: ActQuant::Int8Token }, 1e-5),
        ("fp8", Scheme { weight: WeightFormat::Fp8, act: ActQuant::Fp8Token }, 1e-5),
        ("w8a16", Scheme { weight: WeightFormat::Int8, act: ActQuant::None }, 1e-5),
        ("w4a16", Scheme { weight: int4(Some(128), true, false), act: ActQuant::None }, 4e-3),
        ("w4a16 zp", Scheme { weight: int4(Some(64), false, false), act: ActQuant::None }, 4e-3),
        ("w4a16 g_idx", Scheme { weight: int4(Some(32), true, true), act: ActQuant::None }, 4e-3),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_quant_matmul_matches_reference() {
    use rand::Rng;
    let dev = gpu();
    let mut r = rng("quant_matmul gpu");
    for (name, scheme, tol) in schemes() {
        for (m, n, k) in
            [(1, 2048, 2048), (3, 333, 512), (8, 1001, 256), (9, 130, 384), (100, 77, 128)]
        {
            let seed = r.random::<u64>();
            let cpu = QuantLinear::random(scheme, (n, k), 0.02, seed, &Device::Cpu).expect("w");
            let w = cpu.to_device(&dev).expect("to gpu");
            let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
            let want = values(&cpu.matmul_f32(&x).expect("cpu"));
            let xd = x.to_device(&dev).expect("x");
            for route in [Route::Auto, Route::Gemm] {
                let got = values(&quant_matmul(&xd, &w, route).expect("gpu"));
                let label = format!(
                    "{name} {m}x{n}x{k} {}",
                    if route == Route::Auto { "auto" } else { "gemm" }
                );
                assert_written_and_close(&label, &got, &want, tol);
            }
        }
    }
}

/// Not a check: decode GEMVs against our bf16 GEMV at the Llama-3.2-1B shapes.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_quant_gemv_timing() {
    let dev = gpu();
    let mut r = rng("quant gemv timing");
    let shapes =
        [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate+up", 16_384, 2048), ("down", 2048, 8192)];
    for (name, n, k) in shapes {
        let x =
            tensor(uniform(&mut r, k, -1.0, 1.0), &[1, k], DType::BF16).to_device(&dev).expect("x");
        let wb = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16)
            .to_device(&dev)
            .expect("w");
        let base = crate::kernels::testing::time_us(&dev, 50, || {
            crate::kernels::matmul_f32_out(&x, &wb).expect("bf16");
        });
        let mut line = format!("quant gemv timing: {name:<8} {n:>6}x{k:<5} bf16 {base:.1} us");
        for (label, scheme, _) in
            schemes().into_iter().filter(|s| ["w8a8", "fp8", "w4a16"].contains(&s.0))
        {
            let w = QuantLinear::random(scheme, (n, k), 0.02, 1, &dev).expect("w");
            let us = crate::kernels::testing::time_us(&dev, 50, || {
                quant_matmul(&x, &w, Route::Auto).expect("q");
            });
            line += &format!(" | {label} {us:.1} us ({:.2}x)", base / us);
        }
        eprintln!("{line}");
    }
}
