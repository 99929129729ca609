//! The constraint masks of a step ([`crate::engine::constraint`]): after the forward pass is
//! enqueued and before sampling, each sampling row whose request carries a constraint gets its
//! allowed-token mask computed on the host and written into its logits on the device.
//!
//! On a GPU the forward pass runs asynchronously: the masks are computed while it runs (as
//! TensorRT-LLM does), so their cost hides behind the step unless it exceeds it. A step with a
//! constrained row is never pipelined ([`super::pipeline`]): its mask needs the token the
//! previous step sampled, which the host must have read and committed first; rows without a
//! constraint in the same step get the same logits, bit for bit, and so the same tokens.

use std::time::Instant;

use candle_core::Tensor;

use super::Core;
use crate::engine::constraint::apply_masks;
use crate::engine::scheduler::Chunk;

impl Core {
    /// `logits` of the sampling `chunks` with their constrained rows masked. A request whose
    /// mask fails is marked broken (it ends after this step, the others go on); its row is left
    /// as it is.
    pub(super) fn constrain(&mut self, logits: Tensor, chunks: &[Chunk]) -> anyhow::Result<Tensor> {
        let t0 = Instant::now();
        let mut masks = Vec::new();
        let mut next_row = 0;
        for c in chunks {
            // A constrained chunk never drafts: its one sampled row.
            let row = next_row;
            next_row += c.sampled_rows();
            let Some(l) = self.live.get_mut(&c.id) else { continue };
            // A forced token replaces the draw: no mask needed (it is committed like any).
            if l.req.forced.len() > l.generated {
                continue;
            }
            let Some(g) = l.req.constraint.as_mut() else { continue };
            match g.mask() {
                Ok(m) => masks.push((row, m)),
                Err(e) => {
                    self.broken.insert(c.id, format!("{e:#}"));
                }
            }
        }
        if masks.is_empty() {
            return Ok(logits);
        }
        let refs: Vec<(usize, &_)> = masks.iter().map(|(r, m)| (*r, m)).collect();
        let out = apply_masks(&logits, &refs)?;
        self.mask_time.0 += masks.len() as u64;
        self.mask_time.1 += t0.elapsed();
        Ok(out)
    }
}
