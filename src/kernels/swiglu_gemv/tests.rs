use candle_core::{DType, Tensor};

use super::*;
use crate::kernels::testing::{rng, tensor, uniform, values};

fn bits(t: &Tensor) -> Vec<u16> {
    t.to_dtype(DType::BF16)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<half::bf16>())
        .expect("bf16 values")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// The one-launch kernel against the two-launch path on the GPU (bit for bit, every U up to
/// 8 rows) and against the CPU's two ops (the same f32 sums up to order, one bf16 rounding).
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_swiglu_gemv_matches_two_launches() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("swiglu gemv");
    // Widths not a multiple of 8 outputs (a partial tile), 9..16 rows (two x tiles, and
    // two weight tiles per warp at few warps along K), Llama-1B's and TinyLlama's MLPs.
    let mut shapes = vec![(1, 2 * 37, 72), (8, 2 * 100, 200), (9, 2 * 8, 2888), (16, 2 * 3000, 64)];
    shapes.extend([(1, 2 * 8192, 2048), (3, 2 * 5632, 2048)]);
    for _ in 0..6 {
        use rand::Rng;
        shapes.push((
            r.random_range(1..=16),
            2 * r.random_range(1..=900),
            8 * r.random_range(1..=300),
        ));
    }
    for (m, n2, k) in shapes {
        let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
        let w = tensor(uniform(&mut r, n2 * k, -0.2, 0.2), &[n2, k], DType::BF16);
        let (xd, wd) = (x.to_device(&dev).expect("x"), w.to_device(&dev).expect("w"));
        let name = format!("swiglu gemv {m}x{n2}x{k}");
        let two = silu_mul_to(&matmul_f32_out(&xd, &wd).expect("gemv"), DType::BF16).expect("silu");
        let one = matmul_swiglu_bf16(&xd, &wd).expect("fused");
        assert_eq!(one.dims(), [m, n2 / 2], "{name}");
        assert!(bits(&one) == bits(&two), "{name}: differs from the GEMV + silu_mul_bf16");
        for u in [8, 4, 2].into_iter().filter(|_| m <= 8) {
            let forced = xd.apply_op2_no_bwd(&wd, &SwiGluGemv { batch: Some(u) }).expect("forced");
            assert!(bits(&forced) == bits(&two), "{name}: U = {u} differs");
        }
        let cpu = values(&matmul_swiglu_bf16(&x, &w).expect("cpu"));
        crate::kernels::testing::assert_written_and_close(&name, &values(&one), &cpu, 1e-2);
    }
}
