//! The constraint masks of a step ([`crate::engine::constraint`]): after the forward pass is
//! enqueued and before sampling, each sampling row whose request carries a constraint gets its
//! allowed-token mask computed on the host and written into its logits on the device.
//!
//! On a GPU the forward pass runs asynchronously: the masks are computed while it runs (as
//! TensorRT-LLM does), so their cost hides behind the step unless it exceeds it. A step with a
//! constrained row is never pipelined ([`super::pipeline`]): its mask needs the token the
//! previous step sampled, which the host must have read and committed first; rows without a
//! constraint in the same step get the same logits, bit for bit, and so the same tokens.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::Tensor;
use rayon::prelude::*;

use super::Core;

/// What the masks of a run cost on the host (`INFERNO_STEP_STATS`).
#[derive(Default)]
pub(super) struct MaskTime {
    pub rows: u64,
    pub steps: u64,
    pub compute: std::time::Duration,
    pub write: std::time::Duration,
}
use crate::engine::constraint::apply_masks;
use crate::engine::scheduler::Chunk;

impl Core {
    /// `logits` of the sampling `chunks` with their constrained rows masked. A request whose
    /// mask fails is marked broken (it ends after this step, the others go on); its row is left
    /// as it is.
    ///
    /// The masks are computed in parallel, one request's on one of rayon's threads: a mask
    /// walks the grammar's parser over the whole vocabulary's trie (hundreds of µs for a JSON
    /// schema over a 128k vocabulary), so 64 constrained streams in one after the other would
    /// outlast the step they hide behind many times over.
    pub(super) fn constrain(&mut self, logits: Tensor, chunks: &[Chunk]) -> anyhow::Result<Tensor> {
        let t0 = Instant::now();
        // A constrained chunk never drafts: its one sampled row.
        let mut rows = HashMap::new();
        let mut next_row = 0;
        for c in chunks {
            rows.insert(c.id, next_row);
            next_row += c.sampled_rows();
        }
        let mut todo: Vec<_> = self
            .live
            .iter_mut()
            .filter_map(|(id, l)| {
                let row = *rows.get(id)?;
                // A forced token replaces the draw: no mask needed (it is committed like any).
                if l.req.forced.len() > l.generated {
                    return None;
                }
                Some((*id, row, l.req.constraint.as_mut()?))
            })
            .collect();
        if todo.is_empty() {
            return Ok(logits);
        }
        let computed: Vec<_> =
            todo.par_iter_mut().map(|(id, row, g)| (*id, *row, g.mask())).collect();
        let mut masks = Vec::with_capacity(computed.len());
        for (id, row, m) in computed {
            match m {
                Ok(m) => masks.push((row, m)),
                Err(e) => {
                    self.broken.insert(id, format!("{e:#}"));
                }
            }
        }
        if masks.is_empty() {
            return Ok(logits);
        }
        // Rows in order: the same upload for the same step, however the threads finished.
        masks.sort_unstable_by_key(|(row, _)| *row);
        let t1 = Instant::now();
        let refs: Vec<(usize, &_)> = masks.iter().map(|(r, m)| (*r, m)).collect();
        let out = apply_masks(&logits, &refs)?;
        self.mask_time.rows += masks.len() as u64;
        self.mask_time.steps += 1;
        self.mask_time.compute += t1 - t0;
        self.mask_time.write += t1.elapsed();
        Ok(out)
    }
}
