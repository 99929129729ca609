//! The elementwise steps around a layer's products in one launch each (`layer_norm_act.cu`):
//! the residual add (with the product's bias) in front of an RMSNorm and the norm itself, to
//! the products' input dtype; and SwiGLU from the fused gate/up product. bf16 outputs of f32
//! inputs on the GPU take the kernels; everything else (CPU, f32 models) takes candle's ops,
//! the unfused steps computing the same values ([`rms_norm`]: candle-nn's fused norm, which the
//! models' final norm takes too).

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Result, Shape, Tensor, bail};
use half::bf16;

use super::cpu_f32;

/// RMSNorm of `x` computed in f32 (the weight is upcast): `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<Tensor> {
    // candle-nn's fused kernel: one launch instead of seven (square, sum, divide, add, sqrt,
    // divide, multiply), which matters in decode, where every launch costs host time.
    let xf = x.to_dtype(DType::F32)?.contiguous()?;
    candle_nn::ops::rms_norm(&xf, &w.to_dtype(DType::F32)?, eps as f32)
}

/// The residual stream after a layer's step and its RMSNorm: what [`add_rms_norm`] returns.
pub struct Normed {
    /// `x + (delta + bias)`, f32.
    pub x: Tensor,
    /// RMSNorm of `x` in the products' dtype: computed in f32, rounded once.
    pub h: Tensor,
    /// The same norm in f32, when asked for.
    pub h32: Option<Tensor>,
}

/// `x + (delta + bias)` (f32 `[rows, n]`, bias `[n]`; the bias only with a delta) and its
/// RMSNorm with weight `w` in `dtype`, in one launch on the GPU. With `keep_f32` the norm also
/// comes unrounded ([`Normed::h32`]), from the same launch: for a layer whose next step reads
/// both (gpt-oss: the router in f32, the experts in bf16).
pub fn add_rms_norm(
    x: &Tensor,
    delta: Option<&Tensor>,
    bias: Option<&Tensor>,
    w: &Tensor,
    eps: f64,
    dtype: DType,
    keep_f32: bool,
) -> Result<Normed> {
    if bias.is_some() && delta.is_none() {
        bail!("add_rms_norm: a bias needs the product it belongs to");
    }
    #[cfg(feature = "cuda")]
    if dtype == DType::BF16
        && x.device().is_cuda()
        && [Some(x), delta, bias, Some(w)].into_iter().flatten().all(|t| t.dtype() == DType::F32)
    {
        return gpu::add_rms_norm(x, delta, bias, w, eps as f32, keep_f32);
    }
    let x = match (delta, bias) {
        (Some(d), Some(b)) => (x + d.broadcast_add(&b.to_dtype(DType::F32)?)?)?,
        (Some(d), None) => (x + d)?,
        _ => x.clone(),
    };
    let h32 = rms_norm(&x, w, eps)?;
    Ok(Normed { h: h32.to_dtype(dtype)?, h32: keep_f32.then_some(h32), x })
}

/// The residual add and norm that follow a product, [`add_rms_norm`]'s arguments but the
/// product itself, which a tensor-parallel model first sums over its ranks
/// (`dist::collective::sum_add_norm`, one launch for both where it can).
#[derive(Clone, Copy)]
pub struct AddNorm<'a> {
    pub x: &'a Tensor,
    pub bias: Option<&'a Tensor>,
    pub w: &'a Tensor,
    pub eps: f64,
    pub dtype: DType,
    pub keep_f32: bool,
}

impl AddNorm<'_> {
    /// [`add_rms_norm`] of `x + (delta + bias)`.
    pub fn apply(&self, delta: &Tensor) -> Result<Normed> {
        add_rms_norm(self.x, Some(delta), self.bias, self.w, self.eps, self.dtype, self.keep_f32)
    }
}

/// The threads of `add_rms_norm_bf16`'s block for rows `n` wide: one per 4 values, in whole
/// warps, up to 1,024 (its fast path holds up to 16 values a thread in registers). The sum
/// fused with it launches as many, so that its norm adds in the same order.
#[cfg(feature = "cuda")]
pub(crate) fn norm_threads(n: usize) -> usize {
    n.div_ceil(4).next_multiple_of(32).clamp(32, 1024)
}

/// `silu(g) · u` in `dtype` for the fused gate/up product `gu` (f32 `[rows, 2n]`, gate first).
pub fn silu_mul_to(gu: &Tensor, dtype: DType) -> Result<Tensor> {
    let n = gu.dim(1)? / 2;
    if dtype != DType::BF16 || gu.dtype() != DType::F32 {
        let act = (gu.narrow(1, 0, n)?.silu()? * gu.narrow(1, n, n)?)?;
        return act.to_dtype(dtype);
    }
    gu.contiguous()?.apply_op1_no_bwd(&SiluMulBf16)
}

#[cfg(feature = "cuda")]
mod gpu;

struct SiluMulBf16;

impl CustomOp1 for SiluMulBf16 {
    fn name(&self) -> &'static str {
        "silu_mul_bf16"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (rows, n2) = l.shape().dims2()?;
        let n = n2 / 2;
        let gu = cpu_f32(s, l, "silu_mul_bf16")?;
        let mut out = Vec::with_capacity(rows * n);
        for row in gu.chunks_exact(n2) {
            let (g, u) = row.split_at(n);
            out.extend(g.iter().zip(u).map(|(g, u)| bf16::from_f32(g / (1.0 + (-g).exp()) * u)));
        }
        Ok((CpuStorage::BF16(out), Shape::from((rows, n))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::silu_mul_bf16(s, l)
    }
}

#[cfg(test)]
mod tests;
