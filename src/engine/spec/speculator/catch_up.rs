//! A drafter with a model of its own keeps up with the engine's sequences between their drafts:
//! a draft model prefills a prompt once the target has (so that its first guess does not wait
//! for it), and an EAGLE-3 head takes the taps of every step that keeps them and runs them in
//! passes shared by the step's sequences.

use candle_core::Tensor;

use super::Speculator;
use crate::engine::kv::blocks::SeqId;
use crate::engine::scheduler::{Chunk, Scheduler};

impl Speculator {
    /// Whether a step of `chunks`, with `running` sequences running, keeps the taps the EAGLE-3
    /// head reads: where the head may draft for one of its sequences, and not while more
    /// sequences run than speculation serves (keeping them, and running the head over them,
    /// would cost every step of a batch that never drafts). A step that keeps none runs
    /// without them.
    pub fn wants_taps(&self, chunks: &[Chunk], running: usize) -> bool {
        let Some(e) = &self.eagle else { return false };
        !self.crowded(running) && chunks.iter().any(|c| e.drafts_for(c.id))
    }

    /// More sequences run than speculation serves.
    fn crowded(&self, running: usize) -> bool {
        self.config.is_some_and(|s| running > s.max_batch)
    }

    /// Hands the step's taps (the runner's, taken from `taps`) to the EAGLE-3 head, each
    /// chunk's rows to its sequence. In a crowd the step kept none
    /// ([`Speculator::wants_taps`]): the head forgets those sequences.
    pub fn record_taps(&mut self, chunks: &[Chunk], running: usize, taps: &mut Option<Tensor>) {
        let crowded = self.crowded(running);
        let Some(e) = &mut self.eagle else { return };
        if crowded {
            for c in chunks {
                e.untap(c.id);
            }
            return;
        }
        let Some(taps) = taps.take() else { return };
        let mut row = 0;
        for c in chunks {
            let rows = taps.narrow(0, row, c.len).map_err(anyhow::Error::from);
            if let Err(err) = rows.and_then(|r| e.record(c.id, c.start, r)) {
                tracing::warn!("EAGLE-3 head: {err:#}");
            }
            row += c.len;
        }
    }

    /// Sequence `id`'s prompt prefill just ended: the draft model (if any) computes it too, so
    /// that its first guess does not wait for it; not while its drafts cannot pay (it catches
    /// up when they can, before its first guess).
    pub fn prefilled(&mut self, id: SeqId, sched: &Scheduler) {
        let k = self.config.map_or(1, |s| s.draft_tokens);
        let asleep = self.seqs.get(&id).is_some_and(|s| s.backoff.is_asleep());
        if self.costly_drafts_pay(sched.running(), k) == Some(false) || asleep {
            return;
        }
        let (Some(d), Some(seq)) = (&mut self.draft, sched.get(id)) else { return };
        if let Err(e) = d.catch_up(id, &seq.tokens) {
            tracing::warn!("draft model: {e:#}");
        }
    }

    /// The EAGLE-3 head runs what it can of the step's sequences, each `(id, prefilled)`, in
    /// passes shared by them: a sequence whose prompt just ended (`prefilled`), or whose taps
    /// have piled up (one that has not drafted for a while). Sequences gone from `sched` are
    /// skipped.
    pub fn catch_up(&mut self, sched: &Scheduler, seqs: impl IntoIterator<Item = (SeqId, bool)>) {
        let Some(e) = &mut self.eagle else { return };
        let due: Vec<(SeqId, &[u32])> = seqs
            .into_iter()
            .filter(|&(id, prefilled)| prefilled || e.pending_rows(id) >= EAGLE_PENDING_ROWS)
            .filter_map(|(id, _)| sched.get(id).map(|s| (id, s.tokens.as_slice())))
            .collect();
        if !due.is_empty()
            && let Err(err) = e.catch_up(&due)
        {
            tracing::warn!("EAGLE-3 head: {err:#}");
        }
    }
}

/// Taps a sequence keeps waiting at most before the head runs them (each `3 · hidden` f32s).
const EAGLE_PENDING_ROWS: usize = 64;
