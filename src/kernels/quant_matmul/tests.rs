//! GPU against the CPU reference ([`QuantLinear::matmul_reference`] on the host: dequantized f32
//! weights, per-token fake-quantized inputs) on fresh random weights, inputs and shapes, and the
//! decode GEMVs' batch invariance.

use candle_core::{DType, Device};
use rand::Rng;

use super::gemv;
use super::gpu::{Route, quant_matmul};
use super::stack_quant;
use crate::kernels::testing::{assert_written_and_close, gpu, rng, tensor, uniform, values};
use crate::quant::{ActQuant, QuantLinear, Scheme, WeightFormat};

struct Case {
    name: &'static str,
    scheme: Scheme,
    /// Relative error bound of ct_gemv.cu's products.
    gemv: f64,
    /// Of the prefill path (bf16 GEMM of dequantized weights) and the older 4-bit GEMV.
    gemm: f64,
}

fn cases() -> Vec<Case> {
    let int4 = |group, symmetric| WeightFormat::Int4 { group, symmetric, g_idx: false };
    let w4 = |group, symmetric| Scheme { weight: int4(group, symmetric), act: ActQuant::None };
    // 8-bit: the same quantized values on both sides; int8 sums exact on the GPU, the
    // reference's f32 sums in another order (~1e-7). FP8 on the tensor cores: each 64-value
    // partial sum promoted to f32 (see ct_gemv.cu); measured 5.5e-7 at most on an H100. 4-bit in
    // ct_gemv.cu: exact q − zero times x, f32 sums, the scale per group (~1e-7); the prefill
    // path and the older GEMV round each dequantized weight to bf16 as a bf16 reference does
    // (2^-9 relative), the CPU reference keeps f32.
    vec![
        Case {
            name: "w8a8",
            scheme: Scheme { weight: WeightFormat::Int8, act: ActQuant::Int8Token },
            gemv: 1e-5,
            gemm: 1e-5,
        },
        Case {
            name: "fp8",
            scheme: Scheme { weight: WeightFormat::Fp8, act: ActQuant::Fp8Token },
            gemv: 1e-5,
            gemm: 1e-5,
        },
        Case {
            name: "w8a16",
            scheme: Scheme { weight: WeightFormat::Int8, act: ActQuant::None },
            gemv: 1e-5,
            gemm: 1e-5,
        },
        Case { name: "w4a16", scheme: w4(Some(128), true), gemv: 1e-5, gemm: 4e-3 },
        // GGUF Q8_0: the same codes of x on both sides (numerics.rs's per-block quantization),
        // exact int32 block sums; the prefill path multiplies unquantized bf16 x by the weight
        // rounded to bf16, ~4e-3 from the reference's per-block quantized x.
        Case { name: "q8_0", scheme: crate::quant::gguf_q8::SCHEME, gemv: 1e-5, gemm: 1e-2 },
        // Q4_K and Q6_K: as Q8_0 (the same codes of x, exact int32 sums per block or sub-block,
        // the scales in f32).
        Case {
            name: "q4_k",
            scheme: Scheme { weight: WeightFormat::Q4K, act: ActQuant::Int8Block },
            gemv: 1e-5,
            gemm: 1e-2,
        },
        Case {
            name: "q6_k",
            scheme: Scheme { weight: WeightFormat::Q6K, act: ActQuant::Int8Block },
            gemv: 1e-5,
            gemm: 1e-2,
        },
        Case { name: "w4a16 zp g256", scheme: w4(Some(256), false), gemv: 1e-5, gemm: 4e-3 },
        Case { name: "w4a16 channel", scheme: w4(None, true), gemv: 1e-5, gemm: 4e-3 },
        Case { name: "w4a16 zp g64", scheme: w4(Some(64), false), gemv: 1e-5, gemm: 4e-3 },
        Case {
            name: "w4a16 g_idx",
            scheme: Scheme {
                weight: WeightFormat::Int4 { group: Some(32), symmetric: true, g_idx: true },
                act: ActQuant::None,
            },
            gemv: 1e-5,
            gemm: 4e-3,
        },
    ]
}

#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_quant_matmul_matches_reference() {
    let dev = gpu();
    let mut r = rng("quant_matmul gpu");
    // Decode shapes (1 to 8 rows; K long, short, not a multiple of a quad step; 8 rows of a
    // K that needs more than 48 KiB of shared memory, and of one that needs two launches),
    // prefill shapes, then random ones.
    let mut shapes = vec![
        (1, 2048, 2048),
        (3, 333, 512),
        (8, 1001, 256),
        (2, 40, 96),
        (8, 40, 8192),
        (7, 50, 12_288),
        (1, 4099, 160),
        (9, 130, 384),
        (100, 77, 128),
    ];
    for _ in 0..6 {
        shapes.push((r.random_range(1..=8), r.random_range(1..=700), 32 * r.random_range(1..=120)));
    }
    for case in cases() {
        for &(m, n, k) in &shapes {
            // Q8_0 rows are whole groups of 64 columns.
            let k = match case.scheme.weight {
                WeightFormat::Q8Block => usize::next_multiple_of(k, 64),
                WeightFormat::Q4K | WeightFormat::Q6K => usize::next_multiple_of(k, 256),
                _ => k,
            };
            let seed = r.random::<u64>();
            let cpu =
                QuantLinear::random(case.scheme, (n, k), 0.02, seed, &Device::Cpu).expect("w");
            let w = cpu.to_device(&dev).expect("to gpu");
            let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
            let want = values(&cpu.matmul_reference(&x).expect("on the CPU").expect("cpu"));
            let xd = x.to_device(&dev).expect("x");
            let fits = gemv::fits(&w, m);
            let mut routes = vec![(Route::Auto, "auto"), (Route::Gemm, "gemm")];
            if fits {
                routes.push((Route::GemvTiles(1), "gemv mt1"));
                if gemv::tiles_allowed(&w, 2) {
                    routes.push((Route::GemvTiles(2), "gemv mt2"));
                }
            }
            for (route, label) in routes {
                let on_gemv = matches!(route, Route::GemvTiles(_)) || route == Route::Auto && fits;
                let tol = if on_gemv { case.gemv } else { case.gemm };
                let got = values(&quant_matmul(&xd, &w, route).expect("gpu"));
                let name = format!("{} {m}x{n}x{k} {label}", case.name);
                assert_written_and_close(&name, &got, &want, tol);
                if on_gemv {
                    check_rows_alone(&xd, &w, route, &got, &name);
                }
            }
        }
    }
}

/// Batch invariance: the first and last rows alone give the same bits as in the batch.
fn check_rows_alone(
    x: &candle_core::Tensor,
    w: &QuantLinear,
    route: Route,
    got: &[f32],
    name: &str,
) {
    let (m, n) = (x.dim(0).expect("m"), w.out);
    for row in [0, m - 1] {
        let one = values(&quant_matmul(&x.narrow(0, row, 1).expect("row"), w, route).expect("one"));
        assert!(
            one.iter().zip(&got[row * n..(row + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: row {row} alone differs from the same row in the batch"
        );
    }
}

/// Copies of a weight that together exceed the H100's 50 MB L2 several times: a timing that
/// cycles through them reads weights from memory, as a decode step does (each layer's weights
/// are different bytes), instead of from L2.
fn copies_for(bytes: usize) -> usize {
    (200_000_000usize.div_ceil(bytes)).clamp(1, 32)
}

/// Not a check: decode GEMVs against our bf16 GEMV at the Llama-3.2-1B shapes (1 and 8 rows),
/// with the tiles per warp chosen and forced; GPU time in a replayed CUDA graph, as in a decode
/// step, cycling through copies of the weight so that it comes from memory.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_quant_gemv_timing() {
    use crate::kernels::testing::graph_time_us;
    let dev = gpu();
    let mut r = rng("quant gemv timing");
    let shapes =
        [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate+up", 16_384, 2048), ("down", 2048, 8192)];
    for m in [1, 8] {
        for (name, n, k) in shapes {
            let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16)
                .to_device(&dev)
                .expect("x");
            let wb: Vec<_> = (0..copies_for(2 * n * k))
                .map(|_| {
                    tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16)
                        .to_device(&dev)
                        .expect("w")
                })
                .collect();
            let mut i = 0;
            let base = graph_time_us(&dev, 64, || {
                i += 1;
                crate::kernels::matmul_f32_out(&x, &wb[i % wb.len()]).expect("bf16");
            });
            drop(wb);
            let mut line =
                format!("quant gemv timing: m{m} {name:<8} {n:>6}x{k:<5} bf16 {base:.1} us");
            for case in cases()
                .into_iter()
                .filter(|c| ["w8a8", "fp8", "w4a16", "q8_0", "q4_k", "q6_k"].contains(&c.name))
            {
                let ws: Vec<_> = (0..copies_for(n * k / 2))
                    .map(|s| QuantLinear::random(case.scheme, (n, k), 0.02, s as u64, &dev))
                    .collect::<anyhow::Result<_>>()
                    .expect("w");
                let mut routes = vec![(Route::Auto, "auto"), (Route::GemvTiles(1), "mt1")];
                if gemv::tiles_allowed(&ws[0], 2) {
                    routes.push((Route::GemvTiles(2), "mt2"));
                }
                for (route, label) in routes {
                    let us = graph_time_us(&dev, 64, || {
                        i += 1;
                        quant_matmul(&x, &ws[i % ws.len()], route).expect("q");
                    });
                    line += &format!(" | {} {label} {us:.1} ({:.2}x)", case.name, base / us);
                }
            }
            eprintln!("{line}");
        }
    }
}

/// Stacking on the GPU (the packed 4-bit words by device copies) gives the CPU's stack, and the
/// stacked product is the parts' products side by side.
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_stacked_weights_match_the_parts() {
    let dev = gpu();
    let mut r = rng("quant stack gpu");
    for case in cases()
        .into_iter()
        .filter(|c| ["w8a8", "fp8", "w4a16 zp g256", "q8_0", "q4_k", "q6_k"].contains(&c.name))
    {
        let parts: Vec<QuantLinear> = [(96, 1), (32, 2), (48, 3)]
            .into_iter()
            .map(|(out, seed)| QuantLinear::random(case.scheme, (out, 512), 0.02, seed, &dev))
            .collect::<anyhow::Result<_>>()
            .expect("parts");
        let refs: Vec<&QuantLinear> = parts.iter().collect();
        let (all, views) = stack_quant(&refs).expect("stack").expect("stackable");
        let cpu: Vec<QuantLinear> =
            parts.iter().map(|p| p.to_device(&Device::Cpu).expect("cpu")).collect();
        let (cpu_all, _) = stack_quant(&cpu.iter().collect::<Vec<_>>()).expect("c").expect("s");
        let bytes = |t: &candle_core::Tensor| {
            t.flatten_all().expect("flat").to_dtype(DType::F32).and_then(|t| t.to_vec1::<f32>())
        };
        let (gq, cq) = (all.q.to_device(&Device::Cpu).expect("q"), &cpu_all.q);
        let same = match gq.dtype() {
            DType::I32 => {
                gq.flatten_all().and_then(|t| t.to_vec1::<i32>()).expect("q")
                    == cq.flatten_all().and_then(|t| t.to_vec1::<i32>()).expect("q")
            }
            _ => bytes(&gq).expect("q") == bytes(cq).expect("q"),
        };
        assert!(same, "{}: stacked codes differ from the CPU's", case.name);
        let x = tensor(uniform(&mut r, 3 * 512, -1.0, 1.0), &[3, 512], DType::BF16);
        let xd = x.to_device(&dev).expect("x");
        let got = values(&quant_matmul(&xd, &all, Route::Auto).expect("all"));
        let each: Vec<candle_core::Tensor> =
            views.iter().map(|v| quant_matmul(&xd, v, Route::Auto).expect("view")).collect();
        let want = values(&candle_core::Tensor::cat(&each, 1).expect("cat"));
        assert_written_and_close(&format!("{} stacked", case.name), &got, &want, case.gemv);
    }
}
