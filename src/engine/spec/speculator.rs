//! The engine's speculation ([`crate::engine::spec`]), at the few points of a step that need it:
//! a sequence starts ([`Speculator::start`]); before a step is planned, the decoding sequences
//! get their drafts ([`Speculator::propose`], `propose.rs`); after it, each verify chunk's
//! outcome feeds its sequence's backoff and acceptance and the statistics
//! ([`Speculator::verified`]); a drafter with a model of its own keeps up with the sequences
//! (`catch_up.rs`: a draft model's prefill, an EAGLE-3 head's taps); a sequence ends
//! ([`Speculator::end`]).
//!
//! An engine without a drafter has a speculator too: a request that carries a prediction drafts
//! from it whatever the engine's drafter.

mod catch_up;
mod propose;

use std::collections::{HashMap, HashSet};

use super::backoff::Backoff;
use super::config::{Draft, Drafter, SpecConfig};
use super::draft::DraftModel;
use super::eagle::EagleDrafter;
use super::length::{Acceptance, expected_tokens, pays};
use crate::engine::kv::blocks::SeqId;
use crate::engine::pool::PoolSize;
use crate::engine::request::Request;
use crate::engine::runner::Runner;
use crate::models::step_cost::StepCost;

/// All of an engine's speculation: its drafter, and each sequence's drafts and what they gave.
pub struct Speculator {
    /// The engine's drafter's settings (`--draft`), `None` without one.
    config: Option<SpecConfig>,
    /// The drafts verified so far and what they gave.
    stats: SpecStats,
    /// How often the engine's drafter's tokens stood lately, over all sequences: where a new
    /// sequence's own acceptance starts (a drafter that keeps missing is not trusted with long
    /// drafts again for each new request; one that keeps landing drafts long from the start).
    recent_acceptance: Acceptance,
    /// New sequences that found the drafter asleep ([`Speculator::drafter_sleeps`]).
    slept: u64,
    /// Sequences of the step last proposed for whose draft is the drafter's (not filler): their
    /// outcome feeds their backoff and the statistics.
    drafted: HashSet<SeqId>,
    /// What speculative steps cost by their rows and the drafter's steps, for the drafts'
    /// lengths and the backoff.
    step_cost: StepCost,
    /// The draft model (`--draft MODEL`), with its own KV pool.
    draft: Option<DraftModel>,
    /// The EAGLE-3 head (`--draft HEAD`), with its own KV pool; the runner then keeps the
    /// taps it reads.
    eagle: Option<EagleDrafter>,
    /// Every sequence the engine holds, from [`Speculator::start`] to [`Speculator::end`].
    seqs: HashMap<SeqId, Seq>,
}

/// A sequence's speculation.
struct Seq {
    /// The prompt's length: the reply follows it.
    prompt_len: usize,
    /// What its request says the reply will repeat (empty: nothing).
    prediction: Vec<u32>,
    /// Where in `prediction` the reply was last found to be ([`super::prediction`]).
    prediction_at: usize,
    /// Speculation's throttle for this sequence.
    backoff: Backoff,
    /// How often its draft tokens stand, for their length.
    acceptance: Acceptance,
    /// Draft tokens verified for this sequence, and those accepted.
    draft_tokens: usize,
    accepted_draft_tokens: usize,
}

impl Speculator {
    /// The speculation of an engine whose drafter is `config`'s, built by `load` (`draft`) with a
    /// pool of `size`, beside the model `runner` runs (an EAGLE-3 head's taps are then the
    /// runner's, every step's, pipelined or not).
    pub fn new(
        config: Option<SpecConfig>,
        draft: Option<Draft>,
        size: &PoolSize,
        runner: &mut Runner,
    ) -> anyhow::Result<Speculator> {
        let mut spec = Speculator {
            config,
            stats: SpecStats::default(),
            recent_acceptance: Acceptance::default(),
            slept: 0,
            drafted: HashSet::new(),
            step_cost: runner.model.step_cost(),
            draft: None,
            eagle: None,
            seqs: HashMap::new(),
        };
        if let Some(d) = draft {
            spec.attach(d, size, runner)?;
        }
        Ok(spec)
    }

    /// Installs the drafter `load` built: a draft model, or an EAGLE-3 head.
    fn attach(&mut self, draft: Draft, size: &PoolSize, runner: &mut Runner) -> anyhow::Result<()> {
        match draft {
            Draft::Model(d) => {
                let vocab = runner.model.vocab_size();
                self.step_cost = self.step_cost.with_drafter(&d.step_cost());
                self.draft = Some(DraftModel::new(d, size, vocab)?);
            }
            Draft::Eagle(head) => {
                self.step_cost =
                    self.step_cost.with_batched_drafter(&StepCost::dense(head.bytes()));
                let e = EagleDrafter::new(*head, size, runner.model.tap_layers())?;
                runner.taps = e.taps().to_vec();
                self.eagle = Some(e);
                if let Some(s) = &mut self.config {
                    s.drafter = Drafter::Eagle;
                }
            }
        }
        // No sequence runs yet: whether one sequence's drafts can pay.
        let k = self.config.map_or(1, |s| s.draft_tokens);
        if self.costly_drafts_pay(0, k) == Some(false) {
            tracing::warn!(
                "the drafter's steps cost {:.2} of the model's (by the bytes each reads): drafts of up to {k} tokens cannot speed decoding up even when all of them stand, so none are made",
                self.step_cost.draft()
            );
        }
        Ok(())
    }

    /// Sequence `id` of request `req` arrives while `running` sequences run: its throttle, and
    /// the acceptance its drafts' lengths start from.
    pub fn start(&mut self, id: SeqId, req: &Request, running: usize) {
        let predicted = !req.prediction.is_empty();
        let asleep = !predicted && self.drafter_sleeps(id, running);
        let backoff = if predicted {
            Backoff::for_prediction()
        } else if asleep {
            Backoff::asleep()
        } else {
            Backoff::for_spec(self.config.as_ref(), &self.step_cost)
        };
        let acceptance = if predicted { Acceptance::default() } else { self.recent_acceptance };
        let seq = Seq {
            prompt_len: req.prompt.len(),
            prediction: req.prediction.clone(),
            prediction_at: 0,
            backoff,
            acceptance,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
        };
        self.seqs.insert(id, seq);
    }

    /// Sequence `id` has ended (finished, failed or cancelled): the drafters forget it. Its
    /// draft tokens verified, and those accepted.
    pub fn end(&mut self, id: SeqId) -> (usize, usize) {
        if let Some(d) = &mut self.draft {
            d.free(id);
        }
        if let Some(e) = &mut self.eagle {
            e.free(id);
        }
        self.seqs.remove(&id).map_or((0, 0), |s| (s.draft_tokens, s.accepted_draft_tokens))
    }

    /// A verify step of `sequences` sequences checked `drafts` of sequence `id`'s draft tokens
    /// and kept `accepted` of them. A draft of the drafter's (not filler) counts in the
    /// sequence's backoff and acceptance, the statistics, and, unless its request carries a
    /// prediction, the engine's recent acceptance.
    pub fn verified(&mut self, id: SeqId, drafts: usize, accepted: usize, sequences: usize) {
        if !self.drafted.contains(&id) {
            return;
        }
        let Some(s) = self.seqs.get_mut(&id) else { return };
        s.backoff.record(accepted, sequences);
        s.acceptance.record(drafts, accepted);
        if s.prediction.is_empty() {
            self.recent_acceptance.record(drafts, accepted);
        }
        s.draft_tokens += drafts;
        s.accepted_draft_tokens += accepted;
        self.stats.drafts += 1;
        self.stats.draft_tokens += drafts as u64;
        self.stats.accepted_tokens += accepted as u64;
    }

    /// A pipelined step of sequence `id` (one without a draft): it counts the sequence's
    /// backoff down as a step that proposes does.
    pub fn pipelined(&mut self, id: SeqId) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.backoff.may_draft();
        }
    }

    /// The drafts verified so far and what they gave.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// For a drafter that runs steps of its own (`None` for free drafts, and with
    /// [`SpecConfig::regardless_of_cost`]): whether drafts of at most `k_max` tokens, with
    /// `running` sequences in the step, can pay for those steps (by the engine's step cost). A
    /// draft model or head makes each sequence's drafts alone, so with several sequences
    /// running its steps may cost more than all their drafts could give; a drafter as dear as
    /// the model never pays. Then it drafts for none, and only requests' predictions draft.
    fn costly_drafts_pay(&self, running: usize, k_max: usize) -> Option<bool> {
        let costly =
            self.config.is_some_and(|s| s.drafter != Drafter::Ngram && !s.regardless_of_cost);
        costly.then(|| pays(&self.step_cost, running, k_max))
    }

    /// Whether new sequence `id` finds the drafter asleep: a draft model or head whose recent
    /// drafts (the engine's record over every sequence) stand too rarely for one draft token of
    /// a sequence alone to pay for its verify row and the drafter's step. Such a sequence never
    /// drafts, and the drafter never runs for it (no prompt of its to catch up, no taps kept):
    /// sequences that keep coming no longer pay for a drafter that keeps missing. One new
    /// sequence in [`WAKE_EVERY`] drafts anyway, so that the record follows the drafter when the
    /// requests change.
    fn drafter_sleeps(&mut self, id: SeqId, running: usize) -> bool {
        let Some(k) = self.config.map(|s| s.draft_tokens) else { return false };
        if self.costly_drafts_pay(running, k) != Some(true)
            || expected_tokens(self.recent_acceptance.rate(), 1) > self.step_cost.speculative(1, 1)
        {
            return false;
        }
        self.slept += 1;
        if self.slept.is_multiple_of(WAKE_EVERY) {
            return false;
        }
        if let Some(e) = &mut self.eagle {
            e.untap(id);
        }
        true
    }
}

/// One new sequence in so many drafts while the drafter sleeps ([`Speculator::drafter_sleeps`]).
const WAKE_EVERY: u64 = 16;

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

    /// Draft tokens a verify step checks on average ([`super::length`] cuts drafts short).
    pub fn mean_draft_length(&self) -> f64 {
        self.draft_tokens as f64 / self.drafts.max(1) as f64
    }

    /// Tokens a verify step emits on average (the accepted ones and the one it samples).
    pub fn mean_accepted_length(&self) -> f64 {
        1.0 + self.accepted_tokens as f64 / self.drafts.max(1) as f64
    }
}
