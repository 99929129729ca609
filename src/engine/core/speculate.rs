//! The drafts of a step ([`crate::engine::spec`]): before the scheduler plans a step, each
//! decoding sequence that may speculate gets the drafter's guess of its next tokens.
//!
//! A sequence may speculate when the engine has a drafter or its request a prediction (which
//! it then drafts from, whatever the engine's drafter), the step can verify without changing
//! any row's bits ([`Core::draft_limit`]), its backoff allows it, and its next tokens are its
//! sampler's alone: no output constraint (its mask would need the grammar advanced over each
//! draft), no forced tokens left. A draft never reaches past the request's `max_tokens`.
//!
//! On a GPU a step runs as a CUDA graph only when every sequence has as many rows as the others:
//! once one sequence drafts, the others that may speculate are padded to the same length with
//! filler (their last token repeated). Filler is a draft like any other (accepted where the
//! target agrees with it), but it does not count in the statistics or the backoff.

use super::Core;
use crate::engine::spec::length::{best_length, expected_tokens, pays};
use crate::engine::spec::{Drafter, SpecConfig, ngram, prediction};
use crate::models::step_cost::StepCost;

impl super::Live {
    /// Up to `k` tokens from this request's prediction after `tokens` (its prompt and reply so
    /// far), and where in the prediction they start; `None` for a request without one.
    fn predicted(&self, tokens: &[u32], k: usize) -> Option<(Vec<u32>, usize)> {
        if self.req.prediction.is_empty() {
            return None;
        }
        let reply = &tokens[self.req.prompt.len().min(tokens.len())..];
        Some(prediction::propose(reply, &self.req.prediction, self.prediction_at, k))
    }
}

impl Core {
    /// Sets this step's drafts in the scheduler and records whose are the drafter's.
    pub(super) fn propose_drafts(&mut self) {
        self.drafted.clear();
        let Some(k_max) = self.draft_limit() else { return };
        let costly = self.costly_drafts_pay(k_max);
        let running = self.sched.running();
        let mut drafts: Vec<(u64, Vec<u32>, usize)> = Vec::new();
        // Entries of `drafts` the EAGLE-3 head fills.
        let mut heads = Vec::new();
        for id in self.sched.running_ids() {
            let Some(room) = self.draft_room(id) else { continue };
            let Some(seq) = self.sched.get(id) else { continue };
            let Some(l) = self.live.get_mut(&id) else { continue };
            let may = l.backoff.may_draft();
            let k = k_max.min(room);
            // A drafter that runs steps of its own makes only the drafts that pay for them.
            let k = match costly {
                Some(true) if l.req.prediction.is_empty() => {
                    best_length(l.acceptance.rate(), &self.step_cost, running, k)
                }
                Some(false) if l.req.prediction.is_empty() => 0,
                _ => k,
            };
            let draft = if !may || k == 0 {
                Vec::new()
            } else if let Some((draft, at)) = l.predicted(&seq.tokens, k) {
                l.prediction_at = at;
                draft
            } else {
                match (self.spec, &mut self.draft) {
                    (Some(s), _) if s.drafter == Drafter::Ngram => {
                        ngram::propose(&seq.tokens, k, s.ngram)
                    }
                    // A draft that fails is no draft: the sequence decodes one token.
                    (Some(s), Some(d)) if s.drafter == Drafter::Model => {
                        d.propose(id, &seq.tokens, k).unwrap_or_else(|e| {
                            tracing::warn!("draft model: {e:#}");
                            Vec::new()
                        })
                    }
                    // The head guesses for all of them at once, below.
                    (Some(s), _) if s.drafter == Drafter::Eagle => {
                        heads.push(drafts.len());
                        Vec::new()
                    }
                    _ => Vec::new(),
                }
            };
            drafts.push((id, draft, k));
        }
        self.propose_with_head(&mut drafts, &heads);
        let uniform = crate::engine::graphs::enabled(self.runner.device());
        if self.drafts_are_free() {
            self.fit_lengths(&mut drafts, uniform);
        }
        let longest = drafts.iter().map(|d| d.1.len()).max().unwrap_or(0);
        if longest == 0 {
            return;
        }
        for (id, mut draft, k) in drafts {
            if !draft.is_empty() {
                self.drafted.insert(id);
            }
            if uniform {
                let fill = match draft.last() {
                    Some(&t) => t,
                    None => self.sched.get(id).and_then(|s| s.tokens.last().copied()).unwrap_or(0),
                };
                draft.resize(longest.min(k), fill);
            }
            self.sched.set_draft(id, draft);
        }
    }

    /// The EAGLE-3 head's guesses for entries `heads` of `drafts` (sequence, draft, length),
    /// made together. A proposal that fails is no draft: those sequences decode one token.
    fn propose_with_head(&mut self, drafts: &mut [(u64, Vec<u32>, usize)], heads: &[usize]) {
        let (Some(e), false) = (&mut self.eagle, heads.is_empty()) else { return };
        let (mut which, mut wants) = (Vec::new(), Vec::new());
        for &i in heads {
            let (id, _, k) = drafts[i];
            if let Some(seq) = self.sched.get(id) {
                which.push(i);
                wants.push((id, seq.tokens.as_slice(), k));
            }
        }
        let guesses = e.propose_many(&wants).unwrap_or_else(|err| {
            tracing::warn!("EAGLE-3 head: {err:#}");
            Vec::new()
        });
        for (i, guess) in which.into_iter().zip(guesses) {
            drafts[i].1 = guess;
        }
    }

    /// For a drafter that runs steps of its own (`None` for free drafts, and with
    /// [`SpecConfig::regardless_of_cost`]): whether this step's drafts of at most `k_max` tokens
    /// can pay for those steps (by the engine's step cost). A draft model or head makes each
    /// sequence's drafts alone, so with several sequences running its steps may cost more than
    /// all their drafts could give; a drafter as dear as the model never pays. Then it drafts
    /// for none, and only requests' predictions draft.
    fn costly_drafts_pay(&self, k_max: usize) -> Option<bool> {
        let costly =
            self.spec.is_some_and(|s| s.drafter != Drafter::Ngram && !s.regardless_of_cost);
        costly.then(|| pays(&self.step_cost, self.sched.running(), k_max))
    }

    /// Whether new sequence `id` finds the drafter asleep: a draft model or head whose recent
    /// drafts (the engine's record over every sequence) stand too rarely for one draft token of
    /// a sequence alone to pay for its verify row and the drafter's step. Such a sequence never
    /// drafts, and the drafter never runs for it (no prompt of its to catch up, no taps kept):
    /// sequences that keep coming no longer pay for a drafter that keeps missing. One new
    /// sequence in [`WAKE_EVERY`] drafts anyway, so that the record follows the drafter when the
    /// requests change.
    pub(super) fn drafter_sleeps(&mut self, id: u64) -> bool {
        let Some(k) = self.spec.map(|s| s.draft_tokens) else { return false };
        if self.costly_drafts_pay(k) != Some(true)
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

    /// Whether this step's drafts cost nothing to make (n-gram lookups, requests'
    /// predictions), so that they are cut to length once made. A draft model's or an EAGLE-3
    /// head's drafts cost steps of their own, so their length is chosen before they are made
    /// (in an engine with either, a request's predicted drafts keep `--draft-tokens`).
    fn drafts_are_free(&self) -> bool {
        self.spec.is_none_or(|s| s.drafter == Drafter::Ngram)
    }

    /// Cuts each of `drafts` (sequence, draft, room) to the length that emits the most tokens
    /// per unit of step time, from how often the sequence's draft tokens stand
    /// ([`crate::engine::spec::length`]). With `uniform` (a CUDA graph's step, where every
    /// sequence that may speculate verifies as many rows) one length for all of them, a
    /// sequence without a draft of its own counted as one whose filler never stands.
    fn fit_lengths(&self, drafts: &mut [(u64, Vec<u32>, usize)], uniform: bool) {
        use crate::engine::spec::length::best_uniform;
        let rate = |id: &u64, draft: &[u32]| match self.live.get(id) {
            Some(l) if !draft.is_empty() => l.acceptance.rate(),
            _ => 0.0,
        };
        let longest = drafts.iter().map(|d| d.1.len()).max().unwrap_or(0);
        if longest == 0 {
            return;
        }
        let drafting = drafts.iter().filter(|d| !d.1.is_empty()).count();
        let shared = uniform.then(|| {
            let rates: Vec<f64> = drafts.iter().map(|(id, d, _)| rate(id, d)).collect();
            best_uniform(&rates, &self.step_cost, longest)
        });
        for (id, draft, room) in drafts.iter_mut() {
            let k = match shared {
                Some(k) => k,
                None if draft.is_empty() => continue,
                None => best_length(rate(id, draft), &self.step_cost, drafting, draft.len()),
            };
            draft.truncate(k);
            *room = (*room).min(k);
        }
    }

    /// Draft tokens each sequence may verify in the next step (`None`: no speculation): while
    /// at most `max_batch` sequences run, none of them still prefilling, and the step's rows
    /// (each sequence's last token and its drafts) stay within what the model computes as one
    /// row alone ([`crate::models::batch::BatchModel::invariant_rows`]), so that verifying
    /// changes no bit of any row.
    fn draft_limit(&self) -> Option<usize> {
        let spec = self.spec_now()?;
        let running = self.sched.running();
        if running == 0 || running > spec.max_batch || self.sched.waiting() > 0 {
            return None;
        }
        let decoding = self
            .sched
            .running_ids()
            .iter()
            .all(|&id| self.sched.get(id).is_some_and(|s| s.computed + 1 == s.tokens.len()));
        if !decoding {
            return None;
        }
        let rows = self.runner.model.invariant_rows();
        let k = (rows / running).saturating_sub(1).min(spec.draft_tokens);
        (k > 0).then_some(k)
    }

    /// What this step speculates with: the engine's drafter, or while a request carries a
    /// prediction and the engine has none, [`SpecConfig::for_predictions`].
    fn spec_now(&self) -> Option<SpecConfig> {
        self.spec.or_else(|| {
            let any = self.live.values().any(|l| !l.req.prediction.is_empty());
            any.then(SpecConfig::for_predictions)
        })
    }

    /// Draft tokens sequence `id` may verify in its next step (`None`: it may not speculate):
    /// its tokens are its sampler's, and a draft leaves room for one more token within
    /// `max_tokens` (that it decodes, [`Core::draft_limit`] has checked).
    fn draft_room(&self, id: u64) -> Option<usize> {
        let l = self.live.get(&id)?;
        let own = l.req.constraint.is_none() && l.req.forced.len() <= l.generated;
        let room = l.req.max_tokens.saturating_sub(l.generated + 1);
        (own && room > 0).then_some(room)
    }

    /// Whether sequence `id` would draft if its tokens so far were all it had (the pipelined
    /// decode stops going ahead for it, so that its next step can verify).
    pub(super) fn would_draft(&self, id: u64) -> bool {
        let (Some(seq), Some(l)) = (self.sched.get(id), self.live.get(&id)) else { return false };
        // The cheap checks first: this runs for every sequence of every pipelined step.
        let may = l.backoff.is_open() && self.draft_room(id).is_some();
        let Some(k_max) = self.draft_limit().filter(|_| may) else { return false };
        if let Some((draft, _)) = l.predicted(&seq.tokens, 1) {
            return !draft.is_empty();
        }
        match self.spec {
            Some(s) => match s.drafter {
                Drafter::Ngram => !ngram::propose(&seq.tokens, 1, s.ngram).is_empty(),
                // A draft model or head always has a guess, where its drafts pay.
                Drafter::Model => {
                    self.draft.is_some() && self.costly_drafts_pay(k_max) != Some(false)
                }
                Drafter::Eagle => {
                    self.eagle.as_ref().is_some_and(|e| e.drafts_for(id))
                        && self.costly_drafts_pay(k_max) != Some(false)
                }
            },
            None => false,
        }
    }

    /// A prompt's prefill just ended: the draft model (if any) computes it too, so that its
    /// first guess does not wait for it; not while its drafts cannot pay (it catches up when
    /// they can, before its first guess).
    pub(super) fn draft_catch_up(&mut self, id: u64) {
        let k = self.spec.map_or(1, |s| s.draft_tokens);
        let asleep = self.live.get(&id).is_some_and(|l| l.backoff.is_asleep());
        if self.costly_drafts_pay(k) == Some(false) || asleep {
            return;
        }
        let (Some(d), Some(seq)) = (&mut self.draft, self.sched.get(id)) else { return };
        if let Err(e) = d.catch_up(id, &seq.tokens) {
            tracing::warn!("draft model: {e:#}");
        }
    }

    /// Installs the drafter `load` built: a draft model, or an EAGLE-3 head (whose taps the
    /// runner then keeps, every step's, pipelined or not).
    pub(super) fn attach_draft(
        &mut self,
        draft: crate::engine::spec::Draft,
        cfg: &crate::engine::core::EngineConfig,
    ) -> anyhow::Result<()> {
        use crate::engine::spec::{Draft, draft::DraftModel, eagle::EagleDrafter};
        match draft {
            Draft::Model(d) => {
                let vocab = self.runner.model.vocab_size();
                self.step_cost = self.step_cost.with_drafter(&d.step_cost());
                self.draft = Some(DraftModel::new(d, cfg, vocab)?);
            }
            Draft::Eagle(head) => {
                self.step_cost =
                    self.step_cost.with_batched_drafter(&StepCost::dense(head.bytes()));
                let e = EagleDrafter::new(*head, cfg, self.runner.model.tap_layers())?;
                self.runner.taps = e.taps().to_vec();
                self.eagle = Some(e);
                if let Some(s) = &mut self.spec {
                    s.drafter = Drafter::Eagle;
                }
            }
        }
        // No sequence runs yet: whether one sequence's drafts can pay.
        let k = self.spec.map_or(1, |s| s.draft_tokens);
        if self.costly_drafts_pay(k) == Some(false) {
            tracing::warn!(
                "the drafter's steps cost {:.2} of the model's (by the bytes each reads): drafts of up to {k} tokens cannot speed decoding up even when all of them stand, so none are made",
                self.step_cost.draft()
            );
        }
        Ok(())
    }

    /// Whether a step of `chunks` keeps the taps the EAGLE-3 head reads: where the head may
    /// draft for one of its sequences, and not while more sequences run than speculation serves
    /// (keeping them, and running the head over them, would cost every step of a batch that
    /// never drafts). A step that keeps none runs without them.
    pub(super) fn wants_taps(&self, chunks: &[crate::engine::scheduler::Chunk]) -> bool {
        let Some(e) = &self.eagle else { return false };
        !self.crowded() && chunks.iter().any(|c| e.drafts_for(c.id))
    }

    /// More sequences run than speculation serves.
    fn crowded(&self) -> bool {
        let running = self.sched.running();
        self.spec.is_some_and(|s| running > s.max_batch)
    }

    /// Hands the step's taps to the EAGLE-3 head, each chunk's rows to its sequence. In a crowd
    /// the step kept none ([`Core::wants_taps`]): the head forgets those sequences.
    pub(super) fn record_taps(&mut self, chunks: &[crate::engine::scheduler::Chunk]) {
        let crowded = self.crowded();
        let Some(e) = &mut self.eagle else { return };
        if crowded {
            for c in chunks {
                e.untap(c.id);
            }
            return;
        }
        let Some(taps) = self.runner.last_taps.take() else { return };
        let mut row = 0;
        for c in chunks {
            let rows = taps.narrow(0, row, c.len).map_err(anyhow::Error::from);
            if let Err(err) = rows.and_then(|r| e.record(c.id, c.start, r)) {
                tracing::warn!("EAGLE-3 head: {err:#}");
            }
            row += c.len;
        }
    }

    /// The EAGLE-3 head runs what it can of the step's sequences, each `(id, prefilled)`, in
    /// passes shared by them: a sequence whose prompt just ended (`prefilled`), or whose taps
    /// have piled up (one that has not drafted for a while).
    pub(super) fn eagle_catch_up(&mut self, seqs: impl IntoIterator<Item = (u64, bool)>) {
        let Some(e) = &mut self.eagle else { return };
        let due: Vec<(u64, &[u32])> = seqs
            .into_iter()
            .filter(|&(id, prefilled)| prefilled || e.pending_rows(id) >= EAGLE_PENDING_ROWS)
            .filter_map(|(id, _)| self.sched.get(id).map(|s| (id, s.tokens.as_slice())))
            .collect();
        if !due.is_empty()
            && let Err(err) = e.catch_up(&due)
        {
            tracing::warn!("EAGLE-3 head: {err:#}");
        }
    }
}

/// One new sequence in so many drafts while the drafter sleeps ([`Core::drafter_sleeps`]).
const WAKE_EVERY: u64 = 16;

/// Taps a sequence keeps waiting at most before the head runs them (each `3 · hidden` f32s).
const EAGLE_PENDING_ROWS: usize = 64;
