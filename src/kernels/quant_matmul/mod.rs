//! Products with compressed-tensors weights on the GPU ([`QuantLinear`]):
//!
//! - decode (at most [`GEMV_ROWS`] rows): `ct_gemv.cu`, one launch per product, on
//!   gemv_bf16.cu's tensor-core design. W8A8: int8 × int8 `mma.m16n8k32` with exact int32 sums;
//!   FP8: E4M3 × E4M3 `mma` with each 64-value partial sum promoted to f32; both quantize the
//!   rows of x per token inside the kernel (into shared memory) and apply both scales in the
//!   epilogue. W4A16: int4 codes decoded to exact bf16 integers for a bf16 `mma`, each group's
//!   scale on its partial sum (groups that are multiples of 128 columns, or one per row; groups
//!   of 32 or 64 take `ct_quant.cu`'s one-warp-per-row GEMV). A row's result does not depend on
//!   the batch (tests check it bit for bit).
//! - prefill, and what the GEMVs do not cover (activation order, W8A16): the weight dequantized
//!   to bf16 into a temporary, then cuBLAS ([`matmul_f32_out`]). For W8A8 and FP8 both operands
//!   are the *quantized values* (exact in bf16) and the scales are applied to the f32 result:
//!   the int8 / FP8 product, on bf16 tensor cores. int8 / FP8 tensor-core GEMMs (cuBLASLt)
//!   would halve the prefill's compute and skip the temporary; they are not written.
//!
//! The CPU path ([`QuantLinear::matmul_reference`] on the host) is the reference the GPU tests
//! use; [`quant_matmul`] takes it wherever the weight was dequantized. Batched Llama stacks the
//! q/k/v and gate/up weights ([`stack_quant`]) as it does dense ones: two GEMVs where there were
//! five.
//!
//! Measured (H100, `gpu_quant_gemv_timing`: CUDA-graph replays, weights cycled from memory, one
//! row, µs, bf16 / W8A8 / FP8 / W4A16): q/k/v 6.3 / 6.1 / 6.5 / 5.0, o 5.3 / 5.1 / 5.4 / 4.3,
//! gate+up 25.5 / 17.5 / 17.6 / 12.8, down 14.4 / 11.7 / 12.2 / 10.7. Llama-1B dummy decode 615 /
//! 693 / 674 / 725 tok/s; docs/performance.md, "Quantized weights on our own GEMVs", says why a
//! step gains less than its weights' bytes shrink: the rest of the step is the same for every
//! format, so faster GEMVs alone cannot close the gap. What is left here: the small products are
//! latency-bound (~5 µs, as bf16's), gate+up reads at 1.9 TB/s (8-bit) and 1.3 TB/s (4-bit) where
//! bf16's reads at 2.6; at 8 rows the 8-bit kernels lose to bf16 (every block quantizes all 8 rows
//! of x: quantizing once, in the norm or SwiGLU kernel before, is the way on).

#[cfg(not(feature = "cuda"))]
use candle_core::bail;
use candle_core::{Result, Tensor};

use crate::quant::QuantLinear;

pub use stack::stack_quant;

/// Rows of x up to which the GEMVs run (the kernels keep one accumulator per row).
pub const GEMV_ROWS: usize = 8;

/// `x` `[rows, in]` times `w`'s weight, f32 `[rows, out]` (no bias): the CPU reference where the
/// weight is dequantized (on the host), the kernels otherwise.
pub fn quant_matmul(x: &Tensor, w: &QuantLinear) -> Result<Tensor> {
    if let Some(y) = w.matmul_reference(x) {
        return y;
    }
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
mod stack;
#[cfg(all(test, feature = "cuda"))]
mod tests;
