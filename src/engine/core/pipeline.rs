//! Pipelined decode: the next step is enqueued before the host reads this one's ids.
//!
//! Without it, every decode step ends in a stream sync: the GPU idles while the host copies
//! the ids back, hands the tokens out, schedules and uploads the next step (~45–50 µs per token
//! on an H100, 2–4% of a batch-1 step). Here a graph decode step leaves its sampled ids on the
//! device, the end of the step marked ([`Readback`]), and returns; the next loop enqueues the
//! following step, whose input ids are those device ids, and only then reads the previous ids
//! on a stream that waits for that mark alone. The host thus reads ids one
//! step behind the GPU, and stops are seen one step late: a sequence that stopped (EOS, max
//! tokens, a cancellation) has one extra step computed, whose token is discarded (its KV write
//! lands in a slot of its own block, which goes back with the rest).
//!
//! A step is enqueued ahead only when the scheduler would have planned exactly it: every
//! running sequence decodes, none waits, and the KV blocks for the next position are there.
//! And only when its draw needs nothing the host learns from the ids: no repetition, presence
//! or frequency penalty (they read the history), no forced tokens, no log probabilities (the
//! logits buffer is reused by the next step), no output constraint (its mask needs the token
//! just sampled, see [`super::masks`]), no draft in sight (a verify step needs the tokens on the
//! host, [`crate::engine::spec::Speculator::would_draft`]). Otherwise the step is read at once
//! as before. An EAGLE-3 head's taps are kept from every step, pipelined or not: a sequence that
//! backs off from drafting decodes at the pipelined speed.

use std::time::Instant;

use candle_core::Tensor;

use super::Core;
use crate::engine::readback::Readback;
use crate::engine::runner::{StepOut, device_ids};
use crate::engine::scheduler::Chunk;

/// A decode step enqueued whose ids the host has not read yet.
pub(super) struct InFlight {
    chunks: Vec<Chunk>,
    /// Its sampled ids on the device: the next step's input.
    ids: Tensor,
    readback: Readback,
    t0: Instant,
}

impl Core {
    /// After a graph decode step's logits (or its ids drawn on the ranks): draws its ids on the
    /// device, marks the step's end and leaves the step in flight (true), when every sequence's
    /// draw allows it.
    pub(super) fn defer(&mut self, out: &StepOut, chunks: &[Chunk], t0: Instant) -> bool {
        let drawn = matches!(out, StepOut::Ids(_));
        if !self.pipelined
            || !self.runner.has_graph_for(chunks, drawn)
            || !chunks.iter().all(|c| self.drawn_blind(c.id, 0))
        {
            return false;
        }
        match self.launch_draw(out, chunks, t0, 0) {
            Ok(step) => {
                self.in_flight = Some(step);
                true
            }
            // Nothing was handed out: the ordinary path reports the error, or succeeds.
            Err(e) => {
                trace(|| format!("not deferred: {e:#}"));
                false
            }
        }
    }

    /// Enqueues the step after `step` when it is the one the scheduler would plan, then reads
    /// `step`'s ids and hands them out.
    pub(super) fn advance(&mut self, step: InFlight) {
        let next = match self.next_step(&step) {
            Ok(next) => next,
            // `step`'s ids are drawn: read them, and let the next step run unpipelined, where
            // running out of memory again fails only what it must ([`super::oom`]).
            Err(e) if crate::error::is_out_of_memory(&e) => {
                trace(|| format!("not ahead: {e:#}"));
                None
            }
            Err(e) => {
                // The GPU's state is unknown: fail the step's sequences, as `step` does.
                let msg = format!("{e:#}");
                self.fail_chunks(&step.chunks, &msg);
                return;
            }
        };
        let ids = match step.readback.wait(&mut self.readback) {
            Ok(ids) if ids.len() == step.chunks.len() => Ok(ids),
            Ok(ids) => Err(format!("{} ids for {} sequences", ids.len(), step.chunks.len())),
            Err(e) => Err(format!("{e:#}")),
        };
        let ids = match ids {
            Ok(ids) => ids,
            Err(e) => {
                let msg = format!("reading the sampled ids back from the GPU: {e}");
                self.fail_chunks(&step.chunks, &msg);
                return;
            }
        };
        self.count_step(&step.chunks, step.t0);
        for (c, id) in step.chunks.iter().zip(ids) {
            self.spec.pipelined(c.id);
            self.sched.complete(c, 0, &[id], &mut self.blocks);
            self.emit_run(c.id, vec![(id, None)]);
        }
        self.spec.catch_up(&self.sched, step.chunks.iter().map(|c| (c.id, false)));
        self.publish(step.chunks.len());
        self.in_flight = next;
    }

    /// The step after `step`, enqueued (its ids drawn, its end marked), or `None` when the
    /// scheduler might plan another one.
    fn next_step(&mut self, step: &InFlight) -> anyhow::Result<Option<InFlight>> {
        let chunks: Vec<Chunk> =
            step.chunks.iter().map(|c| Chunk { start: c.start + 1, ..*c }).collect();
        let same_batch = self.sched.waiting() == 0
            && self.sched.running() == chunks.len()
            && chunks.iter().all(|c| self.sched.get(c.id).is_some());
        if !same_batch
            || chunks.iter().any(|c| {
                c.start + 2 > self.max_context
                    || !self.drawn_blind(c.id, 1)
                    || self.would_draft(c.id)
            })
        {
            trace(|| format!("not ahead: same batch {same_batch}"));
            return Ok(None);
        }
        for c in &chunks {
            if let Err(e) = self.blocks.ensure(c.id, c.start, c.start + 1) {
                trace(|| format!("not ahead: {e}"));
                return Ok(None);
            }
        }
        let t0 = Instant::now();
        self.runner.keep_taps = self.spec.wants_taps(&chunks, self.sched.running());
        let draws = self.rank_draws(&chunks, 1);
        let ran = self.runner.forward_after(&chunks, &step.ids, &self.blocks, draws.as_deref())?;
        let Some(out) = ran else {
            trace(|| "not ahead: no decode graph".into());
            return Ok(None);
        };
        self.pipelined_steps += 1;
        // The step's taps (an EAGLE-3 head's) join the pending ones now, before the next
        // replay rewrites the graph's buffer.
        self.spec.record_taps(&chunks, self.sched.running(), &mut self.runner.last_taps);
        // `step`'s tokens are drawn but not handed out yet: these are each reply's next.
        self.launch_draw(&out, &chunks, t0, 1).map(Some)
    }

    /// Draws `chunks`' ids from the step's logits on the device (or takes those the ranks drew)
    /// and marks the end of the step; `ahead`: tokens of each sequence drawn before these but
    /// not handed out yet (their draw indices come first).
    fn launch_draw(
        &mut self,
        out: &StepOut,
        chunks: &[Chunk],
        t0: Instant,
        ahead: usize,
    ) -> anyhow::Result<InFlight> {
        let ids = match out {
            StepOut::Logits(logits) => {
                self.with_specs(chunks, ahead, |specs| device_ids(logits, specs))??
            }
            StepOut::Ids(ids) => ids.clone(),
        };
        let readback = Readback::enqueue(&ids)?;
        Ok(InFlight { chunks: chunks.to_vec(), ids, readback, t0 })
    }

    /// Whether sequence `id`'s token `ahead` steps after its next one can be drawn before the
    /// host has read the ones in between, and is worth drawing: an unpenalised draw, no forced
    /// token, no log probabilities, and below its token limit.
    fn drawn_blind(&self, id: u64, ahead: usize) -> bool {
        self.live.get(&id).is_some_and(|l| {
            let cfg = l.sampler.config();
            cfg.is_unpenalised()
                && l.req.constraint.is_none()
                && l.req.logprobs.is_none()
                && l.req.forced.len() <= l.generated
                && l.generated + ahead < l.req.max_tokens
        })
    }
}

/// `INFERNO_PIPELINE_TRACE=1`: why steps are not pipelined, on stderr (for performance work).
fn trace(what: impl FnOnce() -> String) {
    if crate::switches::pipeline_trace() {
        eprintln!("inferno pipeline: {}", what());
    }
}
