//! `x · wᵀ` on the CPU with each row's sums in one fixed order, whatever the number of rows.
//!
//! candle's CPU matmul (the `gemm` crate) picks its kernel and its blocking by the shape: a row
//! alone and the same row among others are summed in different orders, and most of their f32
//! results differ in the last bits (a 64-wide product: 80–90% of the outputs of 3 to 33 rows
//! differ from the same rows alone). The CPU is the reference the GPU's bf16 runs and the
//! lossless tests compare against, so its products must give a row the same bits in a prefill
//! chunk, a decode step of any batch and a verify step. Here every output is eight lane sums
//! over K (lane `l` takes `k ≡ l mod 8`, in order) added in lane order, then the tail: the
//! compiler vectorises the lanes, and threads split the outputs, never a sum.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};

/// `x` `[m, k]` times `w` `[n, k]` transposed, as f32 `[m, n]`, on the CPU: each row of the
/// result the same bits in any `m` (see the module's header). Any float dtypes (summed in f32).
pub fn matmul_rows(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (Ok((_, k)), Ok((_, kw))) = (x.dims2(), w.dims2()) else {
        bail!("matmul_rows: expected [m, k] and [n, k], got {:?} and {:?}", x.dims(), w.dims());
    };
    if k != kw {
        bail!("matmul_rows: inner dims differ: {:?} and {:?}", x.dims(), w.dims());
    }
    let f = |t: &Tensor| t.to_dtype(DType::F32)?.contiguous();
    f(x)?.apply_op2_no_bwd(&f(w)?, &MatmulRows)
}

struct MatmulRows;

impl CustomOp2 for MatmulRows {
    fn name(&self) -> &'static str {
        "matmul_rows"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((m, k), (n, _)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        let x = super::cpu_f32(s1, l1, "matmul_rows")?;
        let w = super::cpu_f32(s2, l2, "matmul_rows")?;
        let out = product(x, w, m, n, k);
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }
}

/// `x` (`m` rows of `k`) times `w` (`n` rows of `k`) transposed, `m · n` f32 sums each in the
/// fixed order of [`dot`]: the CPU product of [`matmul_rows`] and of
/// [`super::matmul_f32_out`]'s reference.
pub(crate) fn product(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        return vec![0f32; m * n];
    }
    // Threads take whole output columns: no sum is split, so the count changes no bit.
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let threads = threads.min((m * n * k / (1 << 16)).max(1)).min(n).max(1);
    if threads == 1 {
        // A small product: a thread would cost more than it saves.
        return columns(x, w, k, 0..n);
    }
    let cols = n.div_ceil(threads);
    let mut out = vec![0f32; m * n];
    let mut parts: Vec<Vec<f32>> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .step_by(cols)
            .map(|c0| s.spawn(move || columns(x, w, k, c0..(c0 + cols).min(n))))
            .collect();
        parts = handles.into_iter().map(|h| h.join().expect("matmul_rows thread")).collect();
    });
    for (t, part) in parts.iter().enumerate() {
        let (c0, width) = (t * cols, part.len() / m.max(1));
        for r in 0..m {
            out[r * n + c0..r * n + c0 + width].copy_from_slice(&part[r * width..][..width]);
        }
    }
    out
}

/// Output columns `cols` of `x · wᵀ` for every row of `x`, row by row (`m · cols.len()` sums).
fn columns(x: &[f32], w: &[f32], k: usize, cols: std::ops::Range<usize>) -> Vec<f32> {
    let mut part = Vec::with_capacity(x.len() / k * cols.len());
    for row in x.chunks_exact(k) {
        part.extend(cols.clone().map(|c| dot(row, &w[c * k..(c + 1) * k])));
    }
    part
}

/// `a · b` in the fixed order: eight lane sums, added in lane order, then the tail.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    let mut s = lanes.iter().fold(0f32, |acc, v| acc + v);
    for (x, y) in ta.iter().zip(tb) {
        s += x * y;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{rng, tensor, uniform, values};

    /// Against candle's f32 matmul (close), and each row alone against the same row among
    /// others (the same bits), on fresh random shapes that are no multiples of 8.
    #[test]
    fn rows_alone_are_rows_in_a_batch_and_close_to_candles() {
        use rand::Rng;
        let mut r = rng("matmul_rows");
        for _ in 0..12 {
            let (m, n, k) = (r.random_range(2..40), r.random_range(1..300), r.random_range(1..200));
            let x = tensor(uniform(&mut r, m * k, -2.0, 2.0), &[m, k], DType::F32);
            let w = tensor(uniform(&mut r, n * k, -2.0, 2.0), &[n, k], DType::F32);
            let all = values(&matmul_rows(&x, &w).expect("op"));
            let want = values(&x.matmul(&w.t().expect("t")).expect("matmul"));
            for (g, e) in all.iter().zip(&want) {
                assert!((g - e).abs() <= 1e-4 * e.abs().max(1.0), "{m}x{n}x{k}: {g} vs {e}");
            }
            for row in 0..m {
                let one = values(&matmul_rows(&x.narrow(0, row, 1).expect("row"), &w).expect("op"));
                let same = one.iter().zip(&all[row * n..]).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{m}x{n}x{k}: row {row} alone differs from itself among {m}");
            }
        }
    }

    /// Empty shapes give empty or zero results, never a panic.
    #[test]
    fn empty_shapes() {
        assert!(product(&[], &[], 0, 0, 3).is_empty());
        assert!(product(&[], &[1.0; 6], 0, 2, 3).is_empty());
        assert!(product(&[1.0; 6], &[], 2, 0, 3).is_empty());
        assert_eq!(product(&[], &[], 2, 3, 0), vec![0.0; 6]);
    }
}
