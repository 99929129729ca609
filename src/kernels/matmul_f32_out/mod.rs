//! `x · wᵀ` for bf16 `x` and `w` with the result *kept* in f32: the LM head's product, and
//! the q/k/v and o projections' ([`crate::models::linear::Linear::matmul_f32`]).
//!
//! candle's bf16 matmul accumulates in f32 but rounds its output to bf16, and a logit near 10
//! then moves by up to 1/32 (bf16 keeps 8 significant bits). Logits closer than that tie or
//! swap, which flips greedy picks and skews sampling for no gain: the head's output is 201k
//! values per token, not a tensor anyone stores. On a 20b-shaped random gpt-oss checkpoint
//! (damped, 512 positions) this rounding cost 11 of the 14 bf16 top-1 misses
//! scripts/analysis/gpt_oss_precision.py counts. cuBLAS's GemmEx takes bf16 inputs and writes
//! f32; candle has no way to ask for it, so this op calls it on candle's cuBLAS handle and
//! stream. Decode-sized products take our tensor-core kernels instead (`gemv_bf16/`): where they
//! are faster (up to 16 rows), and up to `gemv_bf16::INVARIANT_ROWS` rows where a row must get
//! the same bits in any batch (`kernels/invariance.rs`).

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};
use half::bf16;

use super::F32Reader;

/// `x` (`[m, k]`) times `w` (`[n, k]`) transposed: f32 `[m, n]`, from bf16 inputs with f32
/// accumulation and no rounding of the result.
pub fn matmul_f32_out(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (Ok((m, k)), Ok((n, kw))) = (x.dims2(), w.dims2()) else {
        bail!("matmul_f32_out: expected [m, k] and [n, k], got {:?} and {:?}", x.dims(), w.dims());
    };
    if k != kw || x.dtype() != DType::BF16 || w.dtype() != DType::BF16 {
        bail!(
            "matmul_f32_out: expected bf16 [{m}, k] and [{n}, k] with equal k, got {:?} {:?} and {:?} {:?}",
            x.dtype(),
            x.dims(),
            w.dtype(),
            w.dims()
        );
    }
    x.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &MatmulF32Out { route: Route::Auto })
}

/// `x · wᵀ` for f32 `x` (`[m, k]`) and bf16 `w` (`[n, k]`): f32 `[m, n]` with `x` carried as two
/// bf16 halves, `hi = bf16(x)` and `lo = bf16(x − hi)` (16 significant bits instead of 8), in
/// one GEMM of `2m` rows whose two halves are added. For the LM head: the final hidden state is
/// f32 and rounding it to bf16 alone flips a 20b-shaped random checkpoint's top-1 at ~1% of
/// positions (gpt_oss_precision.py, "only head_in"). A decode step's GEMM with two rows reads
/// the head's weights once, as with one: the cost is the split's launch and the final add.
pub fn matmul_hi_lo(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let m = x.dim(0)?;
    let y = matmul_f32_out(&hi_lo_split(x)?, w)?;
    y.narrow(0, 0, m)? + y.narrow(0, m, m)?
}

/// `[m, k]` values as bf16 `[2m, k]`: the rows of `hi = bf16(x)`, then those of `lo = bf16(x − hi)`
/// (round to nearest even, as `half` and `__float2bfloat16_rn` do).
pub fn hi_lo_split(x: &Tensor) -> Result<Tensor> {
    if x.rank() != 2 {
        bail!("hi_lo_split: expected [m, k], got {:?}", x.dims());
    }
    x.to_dtype(DType::F32)?.contiguous()?.apply_op1_no_bwd(&HiLoSplit)
}

struct HiLoSplit;

impl CustomOp1 for HiLoSplit {
    fn name(&self) -> &'static str {
        "hi_lo_split"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (m, k) = l.shape().dims2()?;
        let x = super::cpu_f32(s, l, "hi_lo_split")?;
        let hi: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        let lo = x.iter().zip(&hi).map(|(&v, h)| bf16::from_f32(v - h.to_f32()));
        let out: Vec<bf16> = hi.iter().copied().chain(lo).collect();
        Ok((CpuStorage::BF16(out), Shape::from((2 * m, k))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::hi_lo_split(s, l)
    }
}

/// Which product [`MatmulF32Out`] runs on the GPU: as [`super::gemv_bf16::kernel_for`] routes
/// it, or one of the three by force (tests and timings compare them).
#[derive(Clone, Copy, PartialEq)]
// Only the GPU tests and timings force a route.
#[cfg_attr(any(not(feature = "cuda"), not(test)), allow(dead_code))]
enum Route {
    Auto,
    Cublas,
    /// Our GEMV, with U forced for up to 8 rows (`gemv_bf16::launch`'s `batch`).
    Gemv(Option<usize>),
    /// Our rows kernel, with its weight tiles per warp forced (`gemv_bf16::launch_rows`'s `mt`).
    Rows(Option<usize>),
}

struct MatmulF32Out {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    route: Route,
}

impl CustomOp2 for MatmulF32Out {
    fn name(&self) -> &'static str {
        "matmul_f32_out"
    }

    /// The reference: each output an f32 sum of exact bf16 products, in the CPU's one fixed
    /// order (`cpu_matmul`), so that a row's sums do not depend on the rows beside it.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let ((m, k), (n, _)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        let to_f32 = |s: &CpuStorage, l: &Layout, len: usize| -> Result<Vec<f32>> {
            let r = F32Reader::new(s, "matmul_f32_out")?;
            Ok((0..len).map(|i| r.get(l.start_offset() + i)).collect())
        };
        let (x, w) = (to_f32(s1, l1, m * k)?, to_f32(s2, l2, n * k)?);
        let out = super::cpu_matmul::product(&x, &w, m, n, k);
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::matmul(self.route, (s1, l1), (s2, l2))
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(test)]
mod tests;
