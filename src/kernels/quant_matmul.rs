//! Products with compressed-tensors weights on the GPU ([`QuantLinear`]), launching
//! `ct_quant.cu`:
//!
//! - decode (at most [`GEMV_ROWS`] rows): the input rows quantized per token (int8 / FP8, as
//!   compressed-tensors' forward does), then a GEMV straight off the 8-bit or 4-bit weights with
//!   both scales applied at the end;
//! - prefill, and what the GEMVs do not cover (activation order, W8A16): the weight dequantized
//!   to bf16 into a temporary, then cuBLAS ([`matmul_f32_out`]). For W8A8 and FP8 both operands
//!   are the *quantized values* (exact in bf16) and the scales are applied to the f32 result:
//!   the int8 / FP8 product, on bf16 tensor cores. A first step: int8 / FP8 tensor-core GEMMs
//!   (cuBLASLt) would halve the prefill's compute and skip the temporary.
//!
//! The CPU path ([`QuantLinear::matmul_f32`] on the host) is the reference the GPU tests use.
//!
//! Not fast yet (H100, `gpu_quant_gemv_timing`, one row): the 8-bit GEMVs take 18–21 µs where
//! our bf16 GEMV takes 9.5–10 (one warp per weight row leaves too few loads in flight for
//! K = 2048, and the activation quantization is a launch of its own); W4A16 is at par. Llama-1B
//! dummy decode: bf16 614, W8A8 467, FP8 477, W4A16 560 tok/s. The way on: gemv_bf16.cu's
//! layout with int8 / E4M3 `mma.sync` (m16n8k32 takes 16-byte chunks the same way) and the
//! quantization fused into the previous norm.

#[cfg(not(feature = "cuda"))]
use candle_core::bail;
use candle_core::{Result, Tensor};

use crate::models::quant::QuantLinear;

/// Rows of x up to which the GEMVs run (the kernels keep one accumulator per row).
pub const GEMV_ROWS: usize = 8;

/// `x` `[rows, in]` times `w`'s weight, f32 `[rows, out]`.
pub fn quant_matmul(x: &Tensor, w: &QuantLinear) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    {
        gpu::quant_matmul(x, w, gpu::Route::Auto)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (x, w);
        bail!("quantized products need the CPU path or a CUDA build")
    }
}

/// The tensors stacked along their first dimension, as `Tensor::cat` does, also for I32 tensors
/// on the GPU (the packed 4-bit words), which candle's CUDA copy kernels do not cover: there
/// each part is copied device to device.
pub fn stack_rows(ts: &[&Tensor]) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let Some(candle_core::Device::Cuda(dev)) = ts.first().map(|t| t.device())
        && ts.iter().all(|t| t.dtype() == candle_core::DType::I32)
    {
        return gpu::stack_i32(ts, dev);
    }
    Tensor::cat(ts, 0)
}

#[cfg(feature = "cuda")]
mod gemv;
#[cfg(feature = "cuda")]
pub(crate) mod gpu;
#[cfg(all(test, feature = "cuda"))]
mod tests;
