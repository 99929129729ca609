//! A projection whose weight is a dense tensor (safetensors), a quantized GGUF tensor (candle's
//! QMatMul, which has CUDA kernels for the GGUF block formats) or a compressed-tensors
//! quantized weight ([`QuantLinear`]), with an optional bias.

use std::sync::Arc;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};

use crate::kernels::cpu_matmul::matmul_rows;
use crate::kernels::{matmul_f32_out, quant_matmul};
use crate::quant::QuantLinear;

#[derive(Clone)]
pub enum Linear {
    Dense { weight: Tensor, bias: Option<Tensor> },
    Quantized { weight: QMatMul, bias: Option<Tensor> },
    Ct { weight: Arc<QuantLinear>, bias: Option<Tensor> },
}

/// A GGUF weight's product (f32): on the CPU its float tensors (F32, F16, BF16, which candle
/// keeps dequantized) take [`matmul_rows`], whose rows do not depend on the batch; its block
/// formats take candle's kernels, which sum each row's dot products alone.
fn quantized(weight: &QMatMul, x: &Tensor) -> candle_core::Result<Tensor> {
    let x = x.to_dtype(DType::F32)?;
    match weight {
        QMatMul::Tensor(w) | QMatMul::TensorF16(w) if x.device().is_cpu() => matmul_rows(&x, w),
        _ => weight.forward(&x),
    }
}

impl Linear {
    /// `x`: `[rows, in]` -> `[rows, out]` in the dtype of `x`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (y, bias) = match self {
            // On the CPU through `matmul_f32`'s products, whose rows do not depend on the batch.
            Linear::Dense { bias, .. } if x.device().is_cpu() => {
                (self.matmul_f32(x)?.to_dtype(x.dtype())?, bias)
            }
            Linear::Dense { weight, bias } => (x.matmul(&weight.t()?)?, bias),
            Linear::Quantized { weight, bias } => {
                // The quantized kernels take and return f32.
                let y = quantized(weight, x)?.to_dtype(x.dtype())?;
                (y, bias)
            }
            Linear::Ct { weight, bias } => (quant_matmul(x, weight)?.to_dtype(x.dtype())?, bias),
        };
        match bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// `x` `[rows, in]` times the weight, as f32 `[rows, out]` without the bias. A bf16 weight
    /// takes `x` in bf16 and keeps the product in f32 ([`matmul_f32_out`]) instead of rounding
    /// it to bf16 as candle's matmul does.
    pub fn matmul_f32(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Dense { weight, .. } if weight.dtype() == DType::BF16 => {
                matmul_f32_out(&x.to_dtype(DType::BF16)?, weight)
            }
            Linear::Dense { weight, .. } if x.device().is_cpu() => {
                matmul_rows(&x.to_dtype(weight.dtype())?, weight)
            }
            Linear::Dense { weight, .. } => {
                x.to_dtype(weight.dtype())?.matmul(&weight.t()?)?.to_dtype(DType::F32)
            }
            Linear::Quantized { weight, .. } => quantized(weight, x),
            Linear::Ct { weight, .. } => quant_matmul(x, weight),
        }
    }

    /// [`Linear::matmul_f32`] plus the bias, added in f32.
    pub fn forward_f32(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.add_bias_f32(self.matmul_f32(x)?)
    }

    /// `y` (f32 `[rows, out]`, a product with this weight) plus the bias, in f32.
    pub fn add_bias_f32(&self, y: Tensor) -> candle_core::Result<Tensor> {
        match self.bias() {
            Some(b) => y.broadcast_add(&b.to_dtype(DType::F32)?),
            None => Ok(y),
        }
    }

    /// Whether the weight is a dense bf16 tensor (not quantized): its products then give a row
    /// the same bits in any step (`kernels/invariance.rs`).
    pub fn is_dense_bf16(&self) -> bool {
        matches!(self, Linear::Dense { weight, .. } if weight.dtype() == DType::BF16)
    }

    pub fn bias(&self) -> Option<&Tensor> {
        match self {
            Linear::Dense { bias, .. }
            | Linear::Quantized { bias, .. }
            | Linear::Ct { bias, .. } => bias.as_ref(),
        }
    }
}
