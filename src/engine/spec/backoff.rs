//! How often a sequence whose drafts keep failing drafts ([`Backoff`]).

use super::config::{Drafter, SpecConfig};
use crate::models::step_cost::StepCost;

/// A sequence's draft throttle: after a verify step that accepted nothing, the sequence skips
/// drafting for a number of its steps that doubles with each miss in a row, up to a cap (a step
/// that accepts anything resets the doubling). A wrong n-gram draft costs at most about one
/// decode step, so its skips start at 1 and stop at 64. A drafter that runs a model of its own
/// (a draft model, an EAGLE-3 head) pays for a miss with its draft steps as well: its skips
/// start where a miss costs a tenth of the steps skipped ([`Backoff::for_spec`]) and stop at
/// 512; with several sequences in the step they are as many times longer, since one sequence's
/// draft pads every other one's rows too (a CUDA graph's step verifies as many rows for each)
/// and its draft steps hold the whole batch up. Either way a sequence whose drafts all fail
/// spends a bounded share of its time on them (measured in docs/performance.md).
#[derive(Debug, Clone)]
pub struct Backoff {
    misses: u32,
    /// Steps left without drafting.
    skip: u32,
    /// The skip after a first miss, and the largest.
    first: u32,
    max: u32,
    /// Whether the skips grow with the sequences in the step (a costly drafter's).
    per_batch: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff { misses: 0, skip: 0, first: 1, max: 64, per_batch: false }
    }
}

impl Backoff {
    /// The throttle for drafts from a request's prediction: a miss costs a verify step, as an
    /// n-gram's does, but the skips stop at 8: a reply often leaves its prediction for a while
    /// (gpt-oss's reasoning, an edited passage) and comes back to it, and then every step counts.
    pub fn for_prediction() -> Backoff {
        Backoff { max: 8, ..Backoff::default() }
    }

    /// The throttle for drafts from `spec`'s drafter (the default without speculation), whose
    /// steps cost what `cost` says. A sequence whose drafts miss drafts one token next (its
    /// acceptance has fallen, [`super::length`]), so a miss then costs a verify row and the
    /// drafter's catch-up over the tokens it skipped (a prefill chunk of them, whose last row
    /// gives the draft): the first skip is ten times that, so that misses cost at most about a
    /// tenth of a sequence's time.
    pub fn for_spec(spec: Option<&SpecConfig>, cost: &StepCost) -> Backoff {
        match spec {
            Some(s) if s.drafter != Drafter::Ngram && !s.regardless_of_cost => {
                let miss = cost.relative(2) - 1.0 + cost.catch_up();
                let first = (10.0 * miss).ceil().clamp(1.0, 512.0) as u32;
                Backoff { first, max: 512, per_batch: true, ..Backoff::default() }
            }
            _ => Backoff::default(),
        }
    }

    /// The throttle of a sequence that never drafts: it came while the engine's drafter kept
    /// missing ([`super::Speculator`]).
    pub fn asleep() -> Backoff {
        Backoff { skip: u32::MAX, max: u32::MAX, ..Backoff::default() }
    }

    /// Whether the sequence never drafts ([`Backoff::asleep`]).
    pub fn is_asleep(&self) -> bool {
        self.skip == u32::MAX
    }

    /// Whether the sequence drafts in this step (counts a skipped step down).
    pub fn may_draft(&mut self) -> bool {
        if self.is_asleep() {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// Whether the next step may draft (without counting it down).
    pub fn is_open(&self) -> bool {
        self.skip == 0
    }

    /// Records the outcome of a verify step of `sequences` sequences.
    pub fn record(&mut self, accepted: usize, sequences: usize) {
        if accepted > 0 {
            self.misses = 0;
        } else {
            let batch = if self.per_batch { sequences.clamp(1, 512) as u32 } else { 1 };
            let skip = self.first.saturating_mul(1 << self.misses.min(16)).saturating_mul(batch);
            self.skip = skip.min(self.max);
            self.misses += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_after_misses_and_resets_on_a_hit() {
        let mut b = Backoff::default();
        let mut drafted = Vec::new();
        for step in 0..40 {
            if b.may_draft() {
                drafted.push(step);
                b.record(0, 1);
            }
        }
        // Skips of 1, 2, 4, 8, 16 between the drafts.
        assert_eq!(drafted, vec![0, 2, 5, 10, 19, 36]);
        b.record(2, 1);
        let mut next = 0;
        while !b.may_draft() {
            next += 1;
        }
        assert!(next <= 32, "a hit resets the misses, the pending skip runs out");
        b.record(1, 1);
        assert!(b.may_draft());
    }

    /// The steps of 1,000 at which a sequence whose drafts all miss drafts.
    fn drafts_of_misses(b: Backoff) -> Vec<usize> {
        drafts_of_misses_among(b, 1)
    }

    /// [`drafts_of_misses`] for a sequence verifying beside `sequences − 1` others.
    fn drafts_of_misses_among(mut b: Backoff, sequences: usize) -> Vec<usize> {
        (0..1000)
            .filter(|_| {
                let may = b.may_draft();
                if may {
                    b.record(0, sequences);
                }
                may
            })
            .collect()
    }

    #[test]
    fn a_draft_model_backs_off_by_what_a_miss_costs() {
        let spec = SpecConfig::model(3).ok();
        // A dense model drafting for itself: a miss costs 2% of a step for the verify row and
        // 1.3 steps for the catch-up over 16 tokens: skips of 14, 28, 56, 112, 224, 448, 512.
        let own = StepCost::dense(16_000_000_000);
        let b = Backoff::for_spec(spec.as_ref(), &own.with_drafter(&own));
        assert_eq!(drafts_of_misses(b), vec![0, 15, 44, 101, 214, 439, 888]);
        // A draft of a sixth of the bytes misses for 0.24 of a step: skips from 3.
        let small = StepCost::dense(2_666_666_667);
        let b = Backoff::for_spec(spec.as_ref(), &own.with_drafter(&small));
        assert_eq!(drafts_of_misses(b), vec![0, 4, 11, 24, 49, 98, 195, 388, 773]);
        // Beside 3 other sequences, whose rows its drafts pad: skips 4 times as long.
        let b = Backoff::for_spec(spec.as_ref(), &own.with_drafter(&small));
        assert_eq!(drafts_of_misses_among(b, 4), vec![0, 13, 38, 87, 184, 377, 762]);
        // n-gram drafts cost nothing to make: skips from 1, up to 64, whatever the batch.
        let b = Backoff::for_spec(SpecConfig::ngram(4).ok().as_ref(), &own);
        assert_eq!(drafts_of_misses(b)[..7], [0, 2, 5, 10, 19, 36, 69]);
        let b = Backoff::for_spec(SpecConfig::ngram(4).ok().as_ref(), &own);
        assert_eq!(drafts_of_misses_among(b, 8)[..7], [0, 2, 5, 10, 19, 36, 69]);
    }
}
