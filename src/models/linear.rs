//! A projection whose weight is either a dense tensor (safetensors) or a quantized GGUF tensor
//! (candle's QMatMul, which has CUDA kernels for the GGUF block formats), with an optional bias.

use candle_core::quantized::QMatMul;
use candle_core::{DType, Module, Tensor};

pub enum Linear {
    Dense { weight: Tensor, bias: Option<Tensor> },
    Quantized { weight: QMatMul, bias: Option<Tensor> },
}

impl Linear {
    /// `x`: `[rows, in]` -> `[rows, out]` in the dtype of `x`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (y, bias) = match self {
            Linear::Dense { weight, bias } => (x.matmul(&weight.t()?)?, bias),
            Linear::Quantized { weight, bias } => {
                // The quantized kernels take and return f32.
                let y = weight.forward(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype())?;
                (y, bias)
            }
        };
        match bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }
}
