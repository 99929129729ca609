//! What every decoder here shares after its layers: the final norm (in f32, [`rms_norm`]) and
//! the LM head producing f32 logits.

use candle_core::{DType, Tensor};

use super::linear::Linear;
use crate::kernels::{matmul_hi_lo, rms_norm};

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
