//! What every decoder here shares around its layers: RMSNorm in f32 and the final norm + LM head
//! producing f32 logits, plus the [`Decoder`] trait that turns "hidden states for these tokens"
//! into a [`CausalLm`].

use candle_core::{DType, Tensor};

use super::CausalLm;
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

/// A decoder stack: hidden states for a chunk of tokens (appending to its KV cache) and a head.
pub trait Decoder {
    /// Final hidden states `[tokens, hidden]` (before the final norm) for positions
    /// `start..start + tokens.len()`, at most [`Decoder::prefill_chunk`] of them.
    fn hidden_chunk(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor>;
    /// The most tokens one [`Decoder::hidden_chunk`] runs: longer prompts go in pieces, which
    /// bounds the activations (the memory plan counts one chunk) and sizes gpt-oss's rings.
    fn prefill_chunk(&self) -> usize;
    /// [`Decoder::hidden_chunk`] over any number of tokens, chunk by chunk.
    fn hidden(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let capacity = self.cache_capacity();
        anyhow::ensure!(!tokens.is_empty(), "no tokens to run");
        anyhow::ensure!(
            start + tokens.len() <= capacity,
            "context full: {} positions requested, {capacity} available",
            start + tokens.len()
        );
        let chunk = self.prefill_chunk();
        let mut outputs = Vec::new();
        for (i, piece) in tokens.chunks(chunk).enumerate() {
            outputs.push(self.hidden_chunk(piece, start + i * chunk)?);
        }
        if outputs.len() == 1 {
            return Ok(outputs.remove(0));
        }
        Ok(Tensor::cat(&outputs, 0)?)
    }
    fn head(&self) -> &Head;
    fn cache_capacity(&self) -> usize;
    fn vocab(&self) -> usize;
    fn allocated(&self) -> super::memory::Allocated;
    /// Logits `[vocab]` for one decode step, when the model has a faster path for it than
    /// `hidden` + head (gpt-oss: a replayed CUDA graph); `None`: take the ordinary path.
    fn decode_step(&mut self, _token: u32, _start: usize) -> Option<anyhow::Result<Tensor>> {
        None
    }
    /// See [`CausalLm::rewind`]; caches that keep every position (linear) continue anywhere.
    fn rewind(&mut self, want: usize) -> anyhow::Result<usize> {
        Ok(want)
    }
    /// See [`CausalLm::checkpoint`].
    fn checkpoint(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// See [`CausalLm::into_batch`].
    fn into_batch(self: Box<Self>) -> Box<dyn super::batch::BatchModel>;
}

impl<T: Decoder> CausalLm for T {
    fn forward_last(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        if let [token] = tokens
            && let Some(logits) = self.decode_step(*token, start)
        {
            return logits;
        }
        let h = self.hidden(tokens, start)?;
        let last = h.narrow(0, tokens.len() - 1, 1)?;
        Ok(self.head().logits(&last)?.squeeze(0)?)
    }

    fn forward_all(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor> {
        let h = self.hidden(tokens, start)?;
        self.head().logits(&h)
    }

    fn context_length(&self) -> usize {
        self.cache_capacity()
    }

    fn rewind(&mut self, want: usize) -> anyhow::Result<usize> {
        Decoder::rewind(self, want)
    }

    fn checkpoint(&mut self) -> anyhow::Result<()> {
        Decoder::checkpoint(self)
    }

    fn vocab_size(&self) -> usize {
        self.vocab()
    }

    fn allocated(&self) -> super::memory::Allocated {
        Decoder::allocated(self)
    }

    fn into_batch(self: Box<Self>) -> Box<dyn super::batch::BatchModel> {
        Decoder::into_batch(self)
    }
}
