//! What every decoder here shares around its layers: RMSNorm in f32 and the final norm + LM head
//! producing f32 logits.

use candle_core::{DType, Tensor};

use super::linear::Linear;
use crate::kernels::matmul_hi_lo;

/// RMSNorm of `x` computed in f32 (the weight is upcast): `x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    // candle-nn's fused kernel: one launch instead of seven (square, sum, divide, add, sqrt,
    // divide, multiply), which matters in decode, where every launch costs host time.
    let xf = x.to_dtype(DType::F32)?.contiguous()?;
    candle_nn::ops::rms_norm(&xf, &w.to_dtype(DType::F32)?, eps as f32)
}

/// Final norm and LM head.
#[derive(Clone)]
pub struct Head {
    pub norm: Tensor,
    pub lm_head: Linear,
    pub eps: f64,
}

impl Head {
    /// f32 logits `[rows, vocab]` of final hidden states `[rows, hidden]`. A bf16 head takes
    /// the f32 normed state as bf16 hi + lo and keeps its product in f32 ([`matmul_hi_lo`]):
    /// rounded to bf16, logits within ~1/32 of each other would tie or swap, and the rounded
    /// input alone flips near-ties too.
    pub fn logits(&self, hidden: &Tensor) -> anyhow::Result<Tensor> {
        let h = rms_norm(hidden, &self.norm, self.eps)?;
        Ok(match &self.lm_head {
            Linear::Dense { weight, .. } if weight.dtype() == DType::BF16 => {
                self.lm_head.add_bias_f32(matmul_hi_lo(&h, weight)?)?
            }
            _ => self.lm_head.forward_f32(&h)?,
        })
    }
}
