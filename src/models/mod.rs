//! Transformer models. Each architecture lives in its own folder with a serde config that mirrors
//! the checkpoint's `config.json`, loaders for the weight formats it accepts, and a forward pass
//! with a preallocated KV cache. Generation (sampling, detokenising) lives outside, in `generate`.

pub mod batch;
pub mod gguf;
pub mod gpt_oss;
pub mod head;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod memory;
pub mod quant;
pub mod rope;

use candle_core::Tensor;

/// A decoder-only language model with a KV cache, driven one chunk of tokens at a time.
pub trait CausalLm {
    /// Runs `tokens` at positions `start..start + tokens.len()` (the cache must hold exactly
    /// `start` positions), appends them to the cache and returns the f32 logits of the last
    /// position, shape `[vocab]`.
    fn forward_last(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor>;
    /// Like [`CausalLm::forward_last`] but returns the logits of every position, `[len, vocab]`
    /// (teacher-forced evaluation).
    fn forward_all(&mut self, tokens: &[u32], start: usize) -> anyhow::Result<Tensor>;
    /// Prepares the caches to continue a sequence whose first `want` positions are the same
    /// tokens they last held, and returns the position to continue from: `want`, or an earlier
    /// one when the caches no longer hold everything the positions from `want` on attend to
    /// (a sliding-window ring overwritten by a longer continuation). The caller re-runs its
    /// tokens from the returned position; the result is what a fresh cache would give.
    fn rewind(&mut self, want: usize) -> anyhow::Result<usize>;
    /// Remembers the caches at their current end (a prompt just prefilled) as a point
    /// [`CausalLm::rewind`] can return to: the next chat turn usually diverges right there.
    fn checkpoint(&mut self) -> anyhow::Result<()>;
    /// How many positions the KV cache holds.
    fn context_length(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// The bytes its weights, KV cache and RoPE tables hold (what memory plans predict).
    fn allocated(&self) -> memory::Allocated;
    /// The same model for the batched engine.
    fn into_batch(self: Box<Self>) -> Box<dyn batch::BatchModel>;
}
