//! Speculative decoding: a decoding sequence guesses its next few tokens (a draft), and one step
//! runs its last token and the draft as one chunk whose every row is sampled. Row `j` samples
//! the token after draft `j` exactly as a one-token step at that position would (the same
//! logits, bit for bit, wherever the step's kernels give a row the same arithmetic in any batch;
//! the same sampler, history and draw index). The draft is accepted while each row's token equals
//! the next draft; the first row that differs gives its own token, and a fully accepted draft
//! gives the last row's token as a bonus. So a step emits 1 to k + 1 tokens, and they are the
//! tokens plain decoding would have emitted, greedy or sampled (the sample-and-compare form of
//! rejection sampling for a deterministic draft: the chance a draft token is kept is the
//! target's probability of it, and a rejected position's token is drawn from the target's
//! distribution; docs/speculation.md, "Why the output is the target's").
//!
//! - [`ngram`]: prompt lookup over the sequence's own tokens;
//! - [`draft`]: a smaller model with the same tokenizer, run greedily beside the target;
//! - [`eagle`]: an EAGLE-3 head on the target's hidden states;
//! - [`prediction`]: lookup in the text a request says its reply will repeat (OpenAI's
//!   Predicted Outputs), for that request, with or without an engine drafter.
//! - [`Backoff`]: when a sequence's drafts keep failing it drafts less often; where a costly
//!   drafter's drafts keep failing for every sequence, new ones start with it asleep and never
//!   draft (the engine's `drafter_sleeps`);
//! - [`length`]: how long a sequence's drafts are, from how often its draft tokens stand and
//!   what a step's extra rows cost.
//!
//! The engine (`core.rs`) asks for drafts before each step for the sequences that may take one
//! ([`SpecConfig::max_batch`]), the scheduler fits them into the step (`scheduler.rs`), and
//! [`accepted`] decides what the sampled rows keep.

pub mod draft;
pub mod eagle;
pub mod length;
pub mod ngram;
pub mod prediction;

use crate::models::step_cost::StepCost;

pub use ngram::NgramConfig;

/// Where drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drafter {
    /// Prompt lookup over the sequence's own tokens ([`ngram`]).
    Ngram,
    /// A smaller model with the same tokenizer, loaded beside the target ([`draft`]).
    Model,
    /// An EAGLE-3 head reading the target's hidden states ([`eagle`]).
    Eagle,
}

/// What `--draft MODEL|HEAD` loads beside the model.
pub enum Draft {
    Model(Box<dyn crate::models::batch::BatchModel>),
    Eagle(Box<crate::models::eagle3::Eagle3Head>),
}

/// Speculation settings of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    pub drafter: Drafter,
    /// Draft tokens a sequence verifies in one step at most (`--draft-tokens`).
    pub draft_tokens: usize,
    /// Sequences speculate only while at most this many run: past it a step's extra rows cost
    /// more than the tokens they save.
    pub max_batch: usize,
    pub ngram: NgramConfig,
    /// A draft model or head drafts `draft_tokens` whenever it may, whatever its steps cost,
    /// backing off as n-gram drafts do (tests of what verifying its drafts does); otherwise its
    /// drafts are as long as they pay for, it makes none where they cannot pay ([`length`]),
    /// and its misses back off by their cost ([`Backoff::for_spec`]).
    pub regardless_of_cost: bool,
}

/// Draft tokens a step verifies at most: a graph step's rows for one sequence all fit in one
/// 16-token block (`engine/graphs.rs`).
pub const MAX_DRAFT_TOKENS: usize = 15;

/// Default `--draft-tokens`.
pub const DEFAULT_DRAFT_TOKENS: usize = 4;

impl SpecConfig {
    /// Drafts of up to `draft_tokens` tokens from a draft model.
    pub fn model(draft_tokens: usize) -> anyhow::Result<SpecConfig> {
        Ok(SpecConfig { drafter: Drafter::Model, ..SpecConfig::ngram(draft_tokens)? })
    }

    /// What an engine without a drafter speculates with while a request carries a prediction:
    /// up to 8 tokens a step (a prediction's runs are long; a GPU verifies fewer, by
    /// [`crate::models::batch::BatchModel::invariant_rows`]).
    pub fn for_predictions() -> SpecConfig {
        SpecConfig {
            drafter: Drafter::Ngram,
            draft_tokens: 8,
            max_batch: 8,
            ngram: NgramConfig::default(),
            regardless_of_cost: false,
        }
    }

    /// N-gram drafting of up to `draft_tokens` tokens, with the default limits.
    pub fn ngram(draft_tokens: usize) -> anyhow::Result<SpecConfig> {
        if draft_tokens == 0 || draft_tokens > MAX_DRAFT_TOKENS {
            return Err(crate::error::fail(
                crate::error::ErrorKind::InvalidInput,
                format!("--draft-tokens must be 1 to {MAX_DRAFT_TOKENS}, not {draft_tokens}"),
            ));
        }
        Ok(SpecConfig {
            drafter: Drafter::Ngram,
            draft_tokens,
            max_batch: 8,
            ngram: NgramConfig::default(),
            regardless_of_cost: false,
        })
    }
}

/// How many of `drafts` the sampled rows accept: `sampled[j]` is row `j`'s token (row 0 is the
/// sequence's last token's, row `j` draft `j`'s), and draft `j` stands while every row before it
/// sampled exactly the draft after it. The tokens emitted are `sampled[..=accepted]`.
pub fn accepted(drafts: &[u32], sampled: &[u32]) -> usize {
    drafts.iter().zip(sampled).take_while(|(d, s)| d == s).count()
}

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
    /// acceptance has fallen, [`length`]), so a miss then costs a verify row and the drafter's
    /// catch-up over the tokens it skipped (a prefill chunk of them, whose last row gives the
    /// draft): the first skip is ten times that, so that misses cost at most about a tenth of a
    /// sequence's time.
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
    /// missing (the engine's `drafter_sleeps`).
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

/// Counts for bench and `/metrics` (vLLM's names: a draft is one verify of one sequence).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Drafts verified.
    pub drafts: u64,
    /// Draft tokens verified.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
}

impl SpecStats {
    /// Accepted draft tokens per drafted one.
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted_tokens as f64 / self.draft_tokens.max(1) as f64
    }

    /// Draft tokens a verify step checks on average ([`length`] cuts drafts short).
    pub fn mean_draft_length(&self) -> f64 {
        self.draft_tokens as f64 / self.drafts.max(1) as f64
    }

    /// Tokens a verify step emits on average (the accepted ones and the one it samples).
    pub fn mean_accepted_length(&self) -> f64 {
        1.0 + self.accepted_tokens as f64 / self.drafts.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_matching_prefix() {
        assert_eq!(accepted(&[5, 6, 7], &[5, 6, 7, 8]), 3);
        assert_eq!(accepted(&[5, 6, 7], &[5, 9, 7, 8]), 1);
        assert_eq!(accepted(&[5, 6, 7], &[4, 6, 7, 8]), 0);
        assert_eq!(accepted(&[], &[4]), 0);
    }

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

    #[test]
    fn draft_tokens_are_bounded() {
        assert!(SpecConfig::ngram(0).is_err());
        assert!(SpecConfig::ngram(MAX_DRAFT_TOKENS + 1).is_err());
        assert_eq!(SpecConfig::ngram(4).map(|c| c.draft_tokens).ok(), Some(4));
    }
}
