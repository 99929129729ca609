//! Llama's gate/up product and its SwiGLU in one launch for decode steps.
//!
//! A Llama MLP runs `act = silu(x·gateᵀ) · (x·upᵀ)` as the fused gate/up GEMV (f32 out) and then
//! `silu_mul_bf16`: at batch 1 that second kernel is a launch per layer whose time is all
//! latency (it waits for the GEMV, reads 64 KB, writes 16 KB). Here the GEMV's blocks hold the
//! gate and the up rows of the same outputs and write `act` themselves (gemv_bf16.cu's SWIGLU
//! epilogue). Every sum is the plain GEMV's, so the result equals the two-launch path bit for
//! bit; shapes the GEMV does not take (prefill, the CPU) run those two ops.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor, bail};

use super::layer_norm_act::silu_mul_to;
use super::matmul_f32_out::matmul_f32_out;

/// `silu(x·gateᵀ) · (x·upᵀ)` as bf16 `[m, n]` for bf16 `x` `[m, k]` and the fused gate/up weight
/// `w` `[2n, k]` (gate rows first): `silu_mul_to(&matmul_f32_out(x, w)?, BF16)`, in one launch
/// where our GEMV takes the product.
pub fn matmul_swiglu_bf16(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    if fused(&x, &w) {
        return x.apply_op2_no_bwd(&w, &SwiGluGemv { batch: None });
    }
    silu_mul_to(&matmul_f32_out(&x, &w)?, DType::BF16)
}

/// Whether the one-launch kernel applies: bf16 on a GPU, a shape the GEMV takes (up to 16 rows
/// in its SwiGLU variants), an even width, K a multiple of 8 and 16-byte aligned starts.
#[cfg(feature = "cuda")]
fn fused(x: &Tensor, w: &Tensor) -> bool {
    let (Ok((m, k)), Ok((n2, kw))) = (x.dims2(), w.dims2()) else { return false };
    let start = |t: &Tensor| t.layout().start_offset().is_multiple_of(8);
    x.device().is_cuda()
        && x.dtype() == DType::BF16
        && w.dtype() == DType::BF16
        && k == kw
        && k.is_multiple_of(8)
        && n2.is_multiple_of(2)
        && (1..=16).contains(&m)
        && start(x)
        && start(w)
}

#[cfg(not(feature = "cuda"))]
fn fused(_x: &Tensor, _w: &Tensor) -> bool {
    false
}

struct SwiGluGemv {
    /// Forces the GEMV's U (tests; see gemv_bf16/mod.rs).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    batch: Option<usize>,
}

impl CustomOp2 for SwiGluGemv {
    fn name(&self) -> &'static str {
        "matmul_swiglu_bf16"
    }

    /// Never taken: [`matmul_swiglu_bf16`] runs the two ops on the CPU.
    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        bail!("matmul_swiglu_bf16: the one-launch kernel runs on the GPU only")
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice;
        use half::bf16;

        use super::gemv_bf16::{self, Epilogue};

        let ((m, k), (n2, _)) = (l1.shape().dims2()?, l2.shape().dims2()?);
        let dev = s1.device.clone();
        let x = s1.as_cuda_slice::<bf16>()?.slice(l1.start_offset()..);
        let w = s2.as_cuda_slice::<bf16>()?.slice(l2.start_offset()..);
        // SAFETY: the kernel writes all m·n2/2 elements.
        let mut out = unsafe { dev.alloc::<bf16>(m * n2 / 2)? };
        gemv_bf16::launch(&dev, &x, &w, (&mut out, Epilogue::SwiGlu), (m, n2, k), self.batch)?;
        Ok((
            candle_core::CudaStorage { slice: CudaStorageSlice::BF16(out), device: dev },
            Shape::from((m, n2 / 2)),
        ))
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests;
