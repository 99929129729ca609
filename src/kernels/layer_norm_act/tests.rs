use candle_core::DType;

use super::*;
use crate::kernels::testing::{rng, tensor, uniform, values};

/// The kernel's reference: (`x + (delta + bias)`, its RMSNorm in f32) with a plain f32 sum of
/// squares per row.
fn add_rms_norm_reference(
    x: &[f32],
    delta: Option<&[f32]>,
    bias: Option<&[f32]>,
    w: &[f32],
    eps: f32,
) -> (Vec<f32>, Vec<f32>) {
    let n = w.len();
    let v: Vec<f32> = match delta {
        Some(d) => x
            .iter()
            .zip(d)
            .enumerate()
            .map(|(i, (x, d))| x + bias.map_or(*d, |b| d + b[i % n]))
            .collect(),
        None => x.to_vec(),
    };
    let mut h = Vec::with_capacity(v.len());
    for row in v.chunks_exact(n) {
        let ss: f32 = row.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / n as f32 + eps).sqrt();
        h.extend(row.iter().zip(w).map(|(v, w)| v * inv * w));
    }
    (v, h)
}

/// Within one bf16 rounding step of the f32 value (the two sides may round a value near a
/// boundary apart).
fn assert_bf16_close(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= w.abs() / 128.0 + 1e-6, "{name}[{i}]: {g} vs {w}");
    }
}

/// The f32 values within `tol` of the reference's, relative to the row's largest.
fn assert_f32_close(name: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * scale, "{name}[{i}]: {g} vs {w}");
    }
}

/// Random f32 inputs of add_rms_norm: x, delta, bias, w.
fn norm_inputs(r: &mut rand::rngs::StdRng, rows: usize, n: usize) -> [Tensor; 4] {
    [
        tensor(uniform(r, rows * n, -4.0, 4.0), &[rows, n], DType::F32),
        tensor(uniform(r, rows * n, -2.0, 2.0), &[rows, n], DType::F32),
        tensor(uniform(r, n, -1.0, 1.0), &[n], DType::F32),
        tensor(uniform(r, n, -1.5, 1.5), &[n], DType::F32),
    ]
}

/// The reference against candle's unfused ops (what CPU and f32 models run), with and
/// without a delta and a bias; and the bf16 SwiGLU against the f32 one.
#[test]
fn references_match_candle_ops() {
    let mut r = rng("layer_norm_act reference");
    let (rows, n) = (3, 70);
    let [x, d, b, w] = norm_inputs(&mut r, rows, n);
    for (delta, bias) in [(None, None), (Some(&d), None), (Some(&d), Some(&b))] {
        let got = add_rms_norm(&x, delta, bias, &w, 1e-5, DType::F32, false).expect("ops");
        let (v, h) = add_rms_norm_reference(
            &values(&x),
            delta.map(values).as_deref(),
            bias.map(values).as_deref(),
            &values(&w),
            1e-5,
        );
        let name = format!("delta {} bias {}", delta.is_some(), bias.is_some());
        assert_eq!(values(&got.x), v, "{name}: the residual stream");
        assert_f32_close(&name, &values(&got.h), &h, 1e-5);
        let both = add_rms_norm(&x, delta, bias, &w, 1e-5, DType::BF16, true).expect("ops");
        let h32 = both.h32.expect("the f32 norm");
        assert_f32_close(&name, &values(&h32), &h, 1e-5);
        assert_eq!(values(&both.h), values(&h32.to_dtype(DType::BF16).expect("bf16")));
    }
    assert!(add_rms_norm(&x, None, Some(&b), &w, 1e-5, DType::F32, false).is_err());
    let gu = tensor(uniform(&mut r, rows * 2 * n, -6.0, 6.0), &[rows, 2 * n], DType::F32);
    let got = values(&silu_mul_to(&gu, DType::BF16).expect("bf16"));
    let want = values(&silu_mul_to(&gu, DType::F32).expect("f32"));
    assert_bf16_close("silu_mul", &got, &want);
}

/// The kernels against the references on random shapes (the residual stream bit for bit,
/// the norm in f32 and bf16), and a row alone equals the same row in a batch bit for bit.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_reference() {
    use rand::Rng;
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("layer_norm_act gpu");
    // Widths that are multiples of 4 take the kernel's registers path (gpt-oss's 2880 and
    // Llama's 2048 among them), the others its strided loop.
    for case in 0..15 {
        let n = match case {
            0 => 2880,
            1 => 2048,
            2..=7 => 4 * r.random_range(1..=1500),
            _ => r.random_range(1..=3000),
        };
        let rows = r.random_range(1..=40);
        let cpu = norm_inputs(&mut r, rows, n);
        let [x, d, b, w] = cpu.clone().map(|t| t.to_device(&dev).expect("to GPU"));
        let (delta, bias) = match case % 3 {
            0 => (None, None),
            1 => (Some(&d), None),
            _ => (Some(&d), Some(&b)),
        };
        let name = format!("add_rms_norm {rows}x{n} case {}", case % 3);
        let (v, h) = add_rms_norm_reference(
            &values(&cpu[0]),
            delta.map(|_| values(&cpu[1])).as_deref(),
            bias.map(|_| values(&cpu[2])).as_deref(),
            &values(&cpu[3]),
            1e-6,
        );
        let got = add_rms_norm(&x, delta, bias, &w, 1e-6, DType::BF16, true).expect("gpu");
        assert_eq!(values(&got.x), v, "{name}: the residual stream");
        assert_bf16_close(&name, &values(&got.h), &h);
        let h32 = values(got.h32.as_ref().expect("the f32 norm"));
        assert_f32_close(&format!("{name} f32"), &h32, &h, 1e-5);
        // The bf16 output is the f32 one rounded once.
        let rounded: Vec<f32> = h32.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
        assert_eq!(values(&got.h), rounded, "{name}: bf16 = round(f32)");
        let row = |t: &Tensor| t.narrow(0, rows - 1, 1).expect("row");
        let one =
            add_rms_norm(&row(&x), delta.map(row).as_ref(), bias, &w, 1e-6, DType::BF16, false)
                .expect("gpu");
        let all = values(&got.h);
        assert!(
            values(&one.h)
                .iter()
                .zip(&all[(rows - 1) * n..])
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: the last row alone differs"
        );
        let gu = tensor(uniform(&mut r, rows * 2 * n, -8.0, 8.0), &[rows, 2 * n], DType::F32);
        let want = values(&silu_mul_to(&gu, DType::BF16).expect("cpu"));
        let got = values(&silu_mul_to(&gu.to_device(&dev).expect("gu"), DType::BF16).expect("gpu"));
        assert_bf16_close(&format!("silu_mul {rows}x{n}"), &got, &want);
    }
}
