use candle_core::{DType, Device, Tensor};

use super::*;
use crate::kernels::testing::{rng, tensor, uniform, values};

/// The reference against candle's f32 matmul of the same (bf16-exact) values.
#[test]
fn reference_is_the_f32_product_of_the_bf16_values() {
    let mut r = rng("matmul_f32_out reference");
    let (m, n, k) = (3, 17, 40);
    let x = tensor(uniform(&mut r, m * k, -2.0, 2.0), &[m, k], DType::BF16);
    let w = tensor(uniform(&mut r, n * k, -2.0, 2.0), &[n, k], DType::BF16);
    let got = values(&matmul_f32_out(&x, &w).expect("op"));
    let f = |t: &Tensor| t.to_dtype(DType::F32).expect("f32");
    let want = values(&f(&x).matmul(&f(&w).t().expect("t")).expect("matmul"));
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{g} vs {w}");
    }
}

/// hi + lo keeps 16 significant bits of `x`: ~2^-17 relative error against the f32 product,
/// where rounding `x` to bf16 gives ~2^-9.
#[test]
fn hi_lo_is_close_to_the_f32_product() {
    let mut r = rng("matmul_hi_lo");
    let (m, n, k) = (5, 33, 200);
    let x = tensor(uniform(&mut r, m * k, -3.0, 3.0), &[m, k], DType::F32);
    let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
    let want =
        values(&x.matmul(&w.to_dtype(DType::F32).expect("f32").t().expect("t")).expect("matmul"));
    let hi_lo =
        crate::kernels::testing::rel_err(&values(&matmul_hi_lo(&x, &w).expect("hi lo")), &want);
    let bf16_only = matmul_f32_out(&x.to_dtype(DType::BF16).expect("bf16"), &w).expect("bf16");
    let bf16_only = crate::kernels::testing::rel_err(&values(&bf16_only), &want);
    eprintln!("relative error: hi + lo {hi_lo:.2e}, bf16 input {bf16_only:.2e}");
    assert!(
        hi_lo < 2e-5 && hi_lo < bf16_only / 30.0,
        "hi + lo {hi_lo:e}, bf16 input {bf16_only:e}"
    );
}

#[test]
fn rejects_mismatched_inputs() {
    let x = Tensor::zeros((2, 8), DType::BF16, &Device::Cpu).expect("x");
    let w = Tensor::zeros((4, 9), DType::BF16, &Device::Cpu).expect("w");
    assert!(matmul_f32_out(&x, &w).is_err());
    assert!(matmul_f32_out(&x.to_dtype(DType::F32).expect("f32"), &x).is_err());
}

/// cuBLAS against the reference on fresh random shapes that are no multiples of anything
/// (one row is a decode step), and the logits are not rounded: values that bf16 cannot
/// hold come back.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_matches_reference() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("matmul_f32_out gpu");
    for (m, n, k) in [(1, 1001, 2880), (7, 333, 64), (130, 517, 96)] {
        let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
        let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
        let want = values(&matmul_f32_out(&x, &w).expect("cpu"));
        let got_t = matmul_f32_out(&x.to_device(&dev).expect("x"), &w.to_device(&dev).expect("w"))
            .expect("gpu");
        assert_eq!(got_t.dtype(), DType::F32);
        let got = values(&got_t);
        crate::kernels::testing::assert_written_and_close(
            &format!("matmul_f32_out {m}x{n}x{k}"),
            &got,
            &want,
            1e-5,
        );
        let off_bf16 = got.iter().filter(|&&v| half::bf16::from_f32(v).to_f32() != v).count();
        assert!(
            off_bf16 > got.len() / 2,
            "{m}x{n}x{k}: only {off_bf16} of {} results are off the bf16 grid",
            got.len()
        );
    }
    // The GEMV's shapes: 1..=64 rows (n-tiles of 8), N not a multiple of 16, K a multiple
    // of 8 but not of 32 (partial groups), K short of one group per warp, long K, tall N
    // with few warps along K (2 and 4 weight tiles per warp).
    for (m, n, k) in [
        (1, 17, 8),
        (8, 33, 24),
        (9, 100, 200),
        (16, 5, 2888),
        (32, 300, 4096),
        (64, 301, 1000),
        (12, 20_001, 72),
        (24, 20_000, 264),
        (40, 20_007, 128),
        // Decode shapes whose launches pick different U on an H100 (gpt-oss's q/k/v: 2;
        // Llama-1B's down: 8).
        (2, 5120, 2880),
        (1, 2048, 8192),
    ] {
        check_gemv(&dev, &mut r, m, n, k);
    }
    for _ in 0..8 {
        use rand::Rng;
        let (m, n, k) =
            (r.random_range(1..=64), r.random_range(1..=700), 8 * r.random_range(1..=400));
        check_gemv(&dev, &mut r, m, n, k);
    }
    let x = tensor(uniform(&mut r, 5 * 999, -1e4, 1e4), &[5, 999], DType::F32);
    let want = values(&hi_lo_split(&x).expect("cpu"));
    let got = values(&hi_lo_split(&x.to_device(&dev).expect("x")).expect("gpu"));
    assert!(
        got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
        "hi_lo_split differs from its reference"
    );
    let (m, n, k) = (3, 2001, 2880);
    let x = tensor(uniform(&mut r, m * k, -3.0, 3.0), &[m, k], DType::F32);
    let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
    let want = values(&matmul_hi_lo(&x, &w).expect("cpu"));
    let got = values(
        &matmul_hi_lo(&x.to_device(&dev).expect("x"), &w.to_device(&dev).expect("w")).expect("gpu"),
    );
    crate::kernels::testing::assert_written_and_close(
        "matmul_hi_lo 3x2001x2880",
        &got,
        &want,
        1e-5,
    );
}

/// The GEMV (taken by force) against the reference, and batch invariance: every row of an
/// m-row product is bit for bit that row's product alone.
#[cfg(feature = "cuda")]
fn check_gemv(dev: &Device, r: &mut rand::rngs::StdRng, m: usize, n: usize, k: usize) {
    let x = tensor(uniform(r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
    let w = tensor(uniform(r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
    let want = values(&matmul_f32_out(&x, &w).expect("cpu"));
    let (xd, wd) = (x.to_device(dev).expect("x"), w.to_device(dev).expect("w"));
    let gemv = MatmulF32Out { route: Route::Gemv(None) };
    let got = values(&xd.apply_op2_no_bwd(&wd, &gemv).expect("gpu"));
    let name = format!("gemv {m}x{n}x{k}");
    crate::kernels::testing::assert_written_and_close(&name, &got, &want, 1e-5);
    // Up to 8 rows, every batch size U: the same bits as the one the launch picked.
    for u in crate::kernels::gemv_bf16::BATCHES.into_iter().filter(|_| m <= 8) {
        let op = MatmulF32Out { route: Route::Gemv(Some(u)) };
        let forced = values(&xd.apply_op2_no_bwd(&wd, &op).expect("gpu"));
        assert!(
            forced.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: U = {u} differs from the chosen U"
        );
    }
    for row in [0, m - 1] {
        let one =
            values(&xd.narrow(0, row, 1).expect("row").apply_op2_no_bwd(&wd, &gemv).expect("gpu"));
        assert!(
            one.iter().zip(&got[row * n..(row + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{name}: row {row} alone differs from the same row in the batch"
        );
    }
    // The rows kernel, with either number of weight tiles per warp: the GEMV's bits.
    for mt in [1, 2] {
        let op = MatmulF32Out { route: Route::Rows(Some(mt)) };
        let rows = values(&xd.apply_op2_no_bwd(&wd, &op).expect("gpu"));
        let bad = rows.iter().zip(&got).position(|(a, b)| a.to_bits() != b.to_bits());
        assert!(bad.is_none(), "{name}: the rows kernel (MT {mt}) differs at {bad:?}");
    }
}

/// The rows kernel against the GEMV alone for more rows than one GEMV launch takes (several
/// row blocks, the last one partial), at shapes with several warps along K and with one: each
/// row is the bits the GEMV gives it alone (a decode step's row), and the products are close
/// to the reference.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_rows_kernel_gives_each_row_its_alone_bits() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("gemv rows");
    for (m, n, k) in [(65, 300, 2880), (130, 5120, 2880), (200, 20_011, 136), (256, 2048, 8192)] {
        let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16);
        let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16);
        let want = values(&matmul_f32_out(&x, &w).expect("cpu"));
        let (xd, wd) = (x.to_device(&dev).expect("x"), w.to_device(&dev).expect("w"));
        let name = format!("rows {m}x{n}x{k}");
        for mt in [1, 2] {
            let op = MatmulF32Out { route: Route::Rows(Some(mt)) };
            let got = values(&xd.apply_op2_no_bwd(&wd, &op).expect("gpu"));
            crate::kernels::testing::assert_written_and_close(&name, &got, &want, 1e-5);
            let gemv = MatmulF32Out { route: Route::Gemv(None) };
            for row in [0, 1, m / 2, m - 1] {
                let x1 = xd.narrow(0, row, 1).expect("row");
                let one = values(&x1.apply_op2_no_bwd(&wd, &gemv).expect("gpu"));
                let bad = one
                    .iter()
                    .zip(&got[row * n..][..n])
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert!(
                    bad.is_none(),
                    "{name} MT {mt}: row {row} differs from itself alone at {bad:?}"
                );
            }
        }
    }
}

/// Not a check: our GEMV and rows kernel against cuBLAS (µs) at the decode shapes of gpt-oss-20b
/// and Llama-3.2-1B, from one row to [`crate::kernels::gemv_bf16::INVARIANT_ROWS`].
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_gemv_timing() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("gemv timing");
    let shapes = [
        ("gpt-oss qkv", 5120, 2880),
        ("gpt-oss o", 2880, 4096),
        ("gpt-oss head", 201_088, 2880),
        ("llama qkv", 3072, 2048),
        ("llama o", 2048, 2048),
        ("llama gate+up", 16_384, 2048),
        ("llama down", 2048, 8192),
        ("llama head", 128_256, 2048),
    ];
    for (name, n, k) in shapes {
        let w = tensor(uniform(&mut r, n * k, -1.0, 1.0), &[n, k], DType::BF16)
            .to_device(&dev)
            .expect("w");
        let mut line = format!("gemv timing: {name:<14} {n:>6}x{k:<5}");
        for m in [1, 8, 16, 32, 64, 128, 256] {
            let x = tensor(uniform(&mut r, m * k, -1.0, 1.0), &[m, k], DType::BF16)
                .to_device(&dev)
                .expect("x");
            let mut us = [0.0; 3];
            let routes = [Route::Gemv(None), Route::Rows(None), Route::Cublas];
            for (i, route) in routes.into_iter().enumerate() {
                let op = MatmulF32Out { route };
                us[i] = crate::kernels::testing::time_us(&dev, 50, || {
                    x.apply_op2_no_bwd(&w, &op).expect("matmul");
                });
            }
            let [gemv, rows, blas] = us;
            line += &format!(" | m{m} gemv {gemv:.1} rows {rows:.1} cuBLAS {blas:.1}");
        }
        eprintln!("{line}");
    }
}

/// The LM head's product (`matmul_hi_lo`, f32 rows as bf16 hi + lo) gives a row the same bits in
/// a verify step (batch invariance on) of up to 128 rows as alone: the sizes a speculative
/// verify step may have, through the GEMV (up to 32 rows of hi + lo) and the rows kernel. The
/// tiny gpt-oss's width and 20b's.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: cargo test --release --lib kernels -- --ignored"]
fn gpu_hi_lo_rows_alone_equal_rows_in_a_step() {
    let dev = crate::kernels::testing::gpu();
    let mut r = rng("hi lo invariance");
    let mut differ = Vec::new();
    let _verifying = crate::kernels::invariance::Step::new(true);
    for (n, k) in [(256, 64), (2048, 2880)] {
        let w = tensor(uniform(&mut r, n * k, -0.5, 0.5), &[n, k], DType::BF16)
            .to_device(&dev)
            .unwrap();
        for rows in (2..=8).chain([17, 40, 100, 128]) {
            let x = tensor(uniform(&mut r, rows * k, -3.0, 3.0), &[rows, k], DType::F32)
                .to_device(&dev)
                .unwrap();
            let all = values(&matmul_hi_lo(&x, &w).unwrap());
            for t in 0..rows {
                let alone = values(&matmul_hi_lo(&x.narrow(0, t, 1).unwrap(), &w).unwrap());
                if alone.iter().zip(&all[t * n..][..n]).any(|(a, b)| a.to_bits() != b.to_bits()) {
                    differ.push(format!("[{n}, {k}], {rows} rows: row {t}"));
                }
            }
        }
    }
    assert!(differ.is_empty(), "rows differ from themselves alone: {differ:#?}");
}
