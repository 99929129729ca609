//! What every decoder here shares after its layers: the final norm (in f32, [`rms_norm`]) and
//! the LM head producing f32 logits.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::linear::Linear;
use crate::dist::{Collective, Shard, collective};
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

    /// [`Head::logits`] of a head split by vocabulary ([`Head::shard`]): each rank's piece
    /// gathered, `[rows, vocab]` on every rank; or, with `local`, this rank's piece alone.
    pub fn gathered_logits(
        &self,
        hidden: &Tensor,
        comm: Option<&Arc<dyn Collective>>,
        vocab: usize,
        local: bool,
    ) -> anyhow::Result<Tensor> {
        let mine = self.logits(hidden)?;
        let Some(c) = comm.filter(|_| !local) else { return Ok(mine) };
        let all = collective::all_gather_cols(c.as_ref(), &mine)?;
        Ok(if all.dim(1)? == vocab { all } else { all.narrow(1, 0, vocab)?.contiguous()? })
    }

    /// The rows of the vocabulary rank `shard` computes, padded with zero rows to the share every
    /// rank has (`ceil(vocab / world)`: the gathered logits are equal pieces); on `device`.
    pub fn shard(&self, shard: Shard, device: &Device) -> anyhow::Result<Head> {
        let Linear::Dense { weight, bias } = &self.lm_head else {
            anyhow::bail!("--tp above 1 needs a dense LM head")
        };
        Ok(Head {
            norm: self.norm.to_device(device)?,
            lm_head: Linear::Dense {
                weight: vocab_rows(weight, shard, device)?,
                bias: bias.as_ref().map(|b| vocab_rows(b, shard, device)).transpose()?,
            },
            eps: self.eps,
        })
    }
}

/// Rank `shard`'s rows of `t` (`[vocab, ..]`, one row per id), padded with zero rows to the
/// share every rank has (`ceil(vocab / world)`), on `device`.
pub fn vocab_rows(t: &Tensor, shard: Shard, device: &Device) -> anyhow::Result<Tensor> {
    let (range, per) = shard.vocab(t.dim(0)?);
    let mine = t.narrow(0, range.start, range.len())?;
    let t = if range.len() < per {
        let mut dims = t.dims().to_vec();
        dims[0] = per - range.len();
        Tensor::cat(&[mine, Tensor::zeros(dims, t.dtype(), t.device())?], 0)?
    } else {
        mine
    };
    Ok(t.contiguous()?.to_device(device)?)
}
