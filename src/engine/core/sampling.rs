//! A step's sampling: each sampling chunk's rows drawn by its request's sampler (one row, or a
//! verify chunk's row per draft and one more, each with the history up to it and its token's
//! index in the reply), what a verify chunk's drafts keep, and handing the tokens out in order.

use std::collections::HashMap;

use super::Core;
use crate::engine::logprobs::{TokenLogprobs, token_logprobs};
use crate::engine::runner::{SampleSpec, StepOut, plain_draws, sample_rows};
use crate::engine::scheduler::Chunk;

/// A sampled (or forced) id and, when its request asked, its log probabilities.
pub(super) type Sampled = (u32, Option<Box<TokenLogprobs>>);

/// What a sampling chunk gives: how many of its drafts stand, and the tokens it emits (those
/// drafts and the one sampled after them).
pub(super) struct SampledRun {
    pub(super) accepted: usize,
    pub(super) tokens: Vec<Sampled>,
}

impl Core {
    /// Each sampling chunk's tokens (forced where the request forces it; a verify chunk's
    /// accepted drafts and the token after them) and, for requests that asked, their log
    /// probabilities.
    pub(super) fn sample(
        &mut self,
        step: &StepOut,
        chunks: &[Chunk],
    ) -> anyhow::Result<Vec<SampledRun>> {
        let ids = match step {
            StepOut::Logits(logits) => self.draw(logits, chunks)?,
            StepOut::Ids(ids) => ids.to_vec1::<u32>()?,
        };
        let Core { live, sched, spec, broken, .. } = self;
        let mut out = Vec::with_capacity(chunks.len());
        let mut r = 0;
        for c in chunks {
            let rows = &ids[r..r + c.sampled_rows()];
            let first = r;
            r += rows.len();
            let Some(l) = live.get_mut(&c.id) else {
                out.push(SampledRun { accepted: 0, tokens: vec![(rows[0], None)] });
                continue;
            };
            let (accepted, picked) = if c.drafts == 0 {
                let id = l.req.forced.get(l.generated).copied().unwrap_or(rows[0]);
                if let Some(Err(e)) = l.req.constraint.as_mut().map(|g| g.commit(id)) {
                    broken.insert(c.id, format!("{e:#}"));
                }
                (0, vec![id])
            } else {
                let draft = sched.get(c.id).map_or(&[][..], |s| &s.draft[..]);
                let accepted =
                    crate::engine::spec::accepted(&draft[..c.drafts.min(draft.len())], rows);
                spec.verified(c.id, c.drafts, accepted, chunks.len());
                (accepted, rows[..=accepted].to_vec())
            };
            let mut tokens = Vec::with_capacity(picked.len());
            for (j, id) in picked.into_iter().enumerate() {
                let scores = match (l.req.logprobs, step) {
                    // Only this row leaves the device, and only for a request that asked.
                    (Some(k), StepOut::Logits(logits)) => {
                        let row = logits.get(first + j)?.to_vec1::<f32>()?;
                        Some(Box::new(token_logprobs(&row, id, k)))
                    }
                    // `rank_draws` never draws on the ranks for a request that asked.
                    (Some(_), StepOut::Ids(_)) => {
                        anyhow::bail!("log probabilities of ids drawn on ranks")
                    }
                    (None, _) => None,
                };
                tokens.push((id, scores));
            }
            out.push(SampledRun { accepted, tokens });
        }
        Ok(out)
    }

    /// Each sampled row's `(1/T, seed)` where the step's ids can be drawn on the ranks of a model
    /// split by vocabulary ([`crate::engine::runner::Runner::forward_drawn`]): every sampling
    /// chunk's request greedy or plain temperature, without log probabilities or a constraint
    /// (they need the whole logits on the host). `ahead` as [`Core::with_specs`].
    pub(super) fn rank_draws(&mut self, chunks: &[Chunk], ahead: usize) -> Option<Vec<(f32, u64)>> {
        if !self.runner.draws_on_ranks() {
            return None;
        }
        let sampling: Vec<Chunk> = chunks.iter().filter(|c| c.sample).copied().collect();
        let plain = |c: &Chunk| {
            self.live
                .get(&c.id)
                .is_some_and(|l| l.req.logprobs.is_none() && l.req.constraint.is_none())
        };
        if sampling.is_empty() || !sampling.iter().all(plain) {
            return None;
        }
        let cuda = self.runner.device().is_cuda();
        self.with_specs(&sampling, ahead, |specs| plain_draws(specs, cuda)).ok().flatten()
    }

    /// Each sampled row's id as its chunk's sampler draws it (rows in chunk order).
    fn draw(&mut self, logits: &candle_core::Tensor, chunks: &[Chunk]) -> anyhow::Result<Vec<u32>> {
        self.with_specs(chunks, 0, |specs| sample_rows(logits, specs))?
    }

    /// `f` on the sampling specs of `chunks` (each chunk's sampler, history and drafts, in chunk
    /// order); `ahead`: tokens of each sequence already drawn but not handed out (a pipelined
    /// step's), which come before these in the reply.
    pub(super) fn with_specs<R>(
        &mut self,
        chunks: &[Chunk],
        ahead: usize,
        f: impl FnOnce(&mut [SampleSpec]) -> R,
    ) -> anyhow::Result<R> {
        // Samplers live in `live`, histories in the scheduler: borrow both fields, each sampler
        // once, in chunk order. A verify chunk's rows see its drafts too, so its history is the
        // sequence and the drafts joined.
        let Core { live, sched, .. } = self;
        let joined: Vec<Option<Vec<u32>>> = chunks
            .iter()
            .map(|c| {
                let s = sched.get(c.id).filter(|_| c.drafts > 0)?;
                Some([&s.tokens[..], &s.draft[..c.drafts]].concat())
            })
            .collect();
        let order: HashMap<u64, usize> =
            chunks.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
        let mut specs: Vec<Option<SampleSpec>> = chunks.iter().map(|_| None).collect();
        for (id, l) in live.iter_mut() {
            if let Some(&i) = order.get(id) {
                let history = match &joined[i] {
                    Some(h) => &h[..],
                    None => sched.get(*id).map_or(&[][..], |q| &q.tokens),
                };
                let (drafts, index) = (chunks[i].drafts, (l.generated + ahead) as u64);
                specs[i] = Some(SampleSpec { sampler: &mut l.sampler, history, drafts, index });
            }
        }
        let mut specs: Vec<SampleSpec> = specs
            .into_iter()
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow::anyhow!("a sampling sequence has no request"))?;
        Ok(f(&mut specs))
    }

    /// Hands a chunk's sampled tokens to its request in order (the scheduler has them already),
    /// until one of them finishes it: what follows a stop is dropped, as plain decoding would
    /// never have made it.
    pub(super) fn emit_run(&mut self, id: u64, tokens: Vec<Sampled>) {
        let Some(len) = self.sched.get(id).map(|s| s.tokens.len()) else { return };
        let base = len - tokens.len();
        for (j, (tok, scores)) in tokens.into_iter().enumerate() {
            if !self.emit(id, tok, scores, base + j + 1) {
                return;
            }
        }
    }
}
