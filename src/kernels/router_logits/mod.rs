//! The gpt-oss router's logits `h · wᵀ` in f32 (`router_logits.cu` on the GPU).
//!
//! Why not candle's matmul: cuBLAS picks its kernel, and so its order of summation, by shape, so
//! a token's logits in a decode step of one row differ in the last bits from the same token's in
//! a prefill chunk. Routing weights feed every expert's output, so a prefix decoded token by
//! token and then reused from the cache would not equal a fresh prefill of it. This kernel sums
//! each (token, expert) dot in one fixed order whatever the batch. It also replaces cuBLAS's
//! two launches (GEMM and split-K reduction) by one.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};

/// `h` f32 `[tokens, hidden]` times `w` f32 `[experts, hidden]` transposed: f32
/// `[tokens, experts]`. On the GPU with `hidden % 4 == 0` the batch-invariant kernel; otherwise
/// candle's matmul.
pub fn router_logits(h: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (_, hidden) = h.dims2()?;
    let (_, wh) = w.dims2()?;
    if wh != hidden || h.dtype() != DType::F32 || w.dtype() != DType::F32 {
        bail!("router_logits: h {:?} {:?}, w {:?} {:?}", h.dtype(), h.dims(), w.dtype(), w.dims());
    }
    if h.device().is_cuda() && hidden.is_multiple_of(4) {
        return h.contiguous()?.apply_op2_no_bwd(&w.contiguous()?, &RouterLogits);
    }
    h.matmul(&w.t()?)
}

struct RouterLogits;

impl CustomOp2 for RouterLogits {
    fn name(&self) -> &'static str {
        "router_logits"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("router_logits: the CPU takes candle's matmul")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        hs: &candle_core::CudaStorage,
        hl: &Layout,
        ws: &candle_core::CudaStorage,
        wl: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        gpu::launch((hs, hl), (ws, wl))
    }
}

#[cfg(feature = "cuda")]
mod gpu;

#[cfg(all(test, feature = "cuda"))]
mod tests;
