//! The drafts of a step: before the scheduler plans a step, each decoding sequence that may
//! speculate gets the drafter's guess of its next tokens.
//!
//! A sequence may speculate when the engine has a drafter or its request a prediction (which
//! it then drafts from, whatever the engine's drafter), the step can verify without changing
//! any row's bits ([`Speculator::draft_limit`]), its backoff allows it, and its next tokens are its
//! sampler's alone: no output constraint (its mask would need the grammar advanced over each
//! draft), no forced tokens left. A draft never reaches past the request's `max_tokens`. The
//! engine says which requests may, and how far (`room`).
//!
//! On a GPU a step runs as a CUDA graph only when every sequence has as many rows as the others:
//! once one sequence drafts, the others that may speculate are padded to the same length with
//! filler (their last token repeated). Filler is a draft like any other (accepted where the
//! target agrees with it), but it does not count in the statistics or the backoff.

use super::{Seq, Speculator};
use crate::engine::kv::blocks::SeqId;
use crate::engine::scheduler::Scheduler;
use crate::engine::spec::config::{Drafter, SpecConfig};
use crate::engine::spec::length::{best_length, best_uniform};
use crate::engine::spec::{ngram, prediction};
use crate::models::batch::BatchModel;

impl Seq {
    /// Up to `k` tokens from this request's prediction after `tokens` (its prompt and reply so
    /// far), and where in the prediction they start; `None` for a request without one.
    fn predicted(&self, tokens: &[u32], k: usize) -> Option<(Vec<u32>, usize)> {
        if self.prediction.is_empty() {
            return None;
        }
        let reply = &tokens[self.prompt_len.min(tokens.len())..];
        Some(prediction::propose(reply, &self.prediction, self.prediction_at, k))
    }
}

impl Speculator {
    /// This step's drafts, each sequence's (as `sched` holds the sequences, `model` runs them;
    /// `room`: the draft tokens a request may verify next, `None` where it may not speculate),
    /// for the scheduler to fit into the step. Records whose drafts are the drafter's.
    pub fn propose(
        &mut self,
        sched: &Scheduler,
        model: &dyn BatchModel,
        room: impl Fn(SeqId) -> Option<usize>,
    ) -> Vec<(SeqId, Vec<u32>)> {
        self.drafted.clear();
        let Some(k_max) = self.draft_limit(sched, model) else { return Vec::new() };
        let running = sched.running();
        let costly = self.costly_drafts_pay(running, k_max);
        let mut drafts: Vec<(SeqId, Vec<u32>, usize)> = Vec::new();
        // Entries of `drafts` the EAGLE-3 head fills.
        let mut heads = Vec::new();
        for id in sched.running_ids() {
            let Some(left) = room(id) else { continue };
            let Some(seq) = sched.get(id) else { continue };
            let Some(s) = self.seqs.get_mut(&id) else { continue };
            let may = s.backoff.may_draft();
            let k = k_max.min(left);
            // A drafter that runs steps of its own makes only the drafts that pay for them.
            let k = match costly {
                Some(true) if s.prediction.is_empty() => {
                    best_length(s.acceptance.rate(), &self.step_cost, running, k)
                }
                Some(false) if s.prediction.is_empty() => 0,
                _ => k,
            };
            let draft = if !may || k == 0 {
                Vec::new()
            } else if let Some((draft, at)) = s.predicted(&seq.tokens, k) {
                s.prediction_at = at;
                draft
            } else {
                match (self.config, &mut self.draft) {
                    (Some(c), _) if c.drafter == Drafter::Ngram => {
                        ngram::propose(&seq.tokens, k, c.ngram)
                    }
                    // A draft that fails is no draft: the sequence decodes one token.
                    (Some(c), Some(d)) if c.drafter == Drafter::Model => {
                        d.propose(id, &seq.tokens, k).unwrap_or_else(|e| {
                            tracing::warn!("draft model: {e:#}");
                            Vec::new()
                        })
                    }
                    // The head guesses for all of them at once, below.
                    (Some(c), _) if c.drafter == Drafter::Eagle => {
                        heads.push(drafts.len());
                        Vec::new()
                    }
                    _ => Vec::new(),
                }
            };
            drafts.push((id, draft, k));
        }
        self.propose_with_head(sched, &mut drafts, &heads);
        let uniform = crate::engine::graphs::enabled(model.device());
        if self.drafts_are_free() {
            self.fit_lengths(&mut drafts, uniform);
        }
        let longest = drafts.iter().map(|d| d.1.len()).max().unwrap_or(0);
        if longest == 0 {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(drafts.len());
        for (id, mut draft, k) in drafts {
            if !draft.is_empty() {
                self.drafted.insert(id);
            }
            if uniform {
                let fill = match draft.last() {
                    Some(&t) => t,
                    None => sched.get(id).and_then(|s| s.tokens.last().copied()).unwrap_or(0),
                };
                draft.resize(longest.min(k), fill);
            }
            out.push((id, draft));
        }
        out
    }

    /// The EAGLE-3 head's guesses for entries `heads` of `drafts` (sequence, draft, length),
    /// made together. A proposal that fails is no draft: those sequences decode one token.
    fn propose_with_head(
        &mut self,
        sched: &Scheduler,
        drafts: &mut [(SeqId, Vec<u32>, usize)],
        heads: &[usize],
    ) {
        let (Some(e), false) = (&mut self.eagle, heads.is_empty()) else { return };
        let (mut which, mut wants) = (Vec::new(), Vec::new());
        for &i in heads {
            let (id, _, k) = drafts[i];
            if let Some(seq) = sched.get(id) {
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

    /// Whether this step's drafts cost nothing to make (n-gram lookups, requests'
    /// predictions), so that they are cut to length once made. A draft model's or an EAGLE-3
    /// head's drafts cost steps of their own, so their length is chosen before they are made
    /// (in an engine with either, a request's predicted drafts keep `--draft-tokens`).
    fn drafts_are_free(&self) -> bool {
        self.config.is_none_or(|s| s.drafter == Drafter::Ngram)
    }

    /// Cuts each of `drafts` (sequence, draft, room) to the length that emits the most tokens
    /// per unit of step time, from how often the sequence's draft tokens stand
    /// ([`crate::engine::spec::length`]). With `uniform` (a CUDA graph's step, where every
    /// sequence that may speculate verifies as many rows) one length for all of them, a
    /// sequence without a draft of its own counted as one whose filler never stands.
    fn fit_lengths(&self, drafts: &mut [(SeqId, Vec<u32>, usize)], uniform: bool) {
        let rate = |id: &SeqId, draft: &[u32]| match self.seqs.get(id) {
            Some(s) if !draft.is_empty() => s.acceptance.rate(),
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
    fn draft_limit(&self, sched: &Scheduler, model: &dyn BatchModel) -> Option<usize> {
        let config = self.config_now()?;
        let running = sched.running();
        if running == 0 || running > config.max_batch || sched.waiting() > 0 {
            return None;
        }
        let decoding = sched
            .running_ids()
            .iter()
            .all(|&id| sched.get(id).is_some_and(|s| s.computed + 1 == s.tokens.len()));
        if !decoding {
            return None;
        }
        let rows = model.invariant_rows();
        let k = (rows / running).saturating_sub(1).min(config.draft_tokens);
        (k > 0).then_some(k)
    }

    /// What this step speculates with: the engine's drafter, or while a request carries a
    /// prediction and the engine has none, [`SpecConfig::for_predictions`].
    fn config_now(&self) -> Option<SpecConfig> {
        self.config.or_else(|| {
            let any = self.seqs.values().any(|s| !s.prediction.is_empty());
            any.then(SpecConfig::for_predictions)
        })
    }

    /// Whether sequence `id` would draft if its tokens so far were all it had (the pipelined
    /// decode stops going ahead for it, so that its next step can verify); `room`: its request
    /// may speculate.
    pub fn would_draft(
        &self,
        id: SeqId,
        room: bool,
        sched: &Scheduler,
        model: &dyn BatchModel,
    ) -> bool {
        let (Some(seq), Some(s)) = (sched.get(id), self.seqs.get(&id)) else { return false };
        // The cheap checks first: this runs for every sequence of every pipelined step.
        let may = s.backoff.is_open() && room;
        let Some(k_max) = self.draft_limit(sched, model).filter(|_| may) else { return false };
        if let Some((draft, _)) = s.predicted(&seq.tokens, 1) {
            return !draft.is_empty();
        }
        let running = sched.running();
        match self.config {
            Some(c) => match c.drafter {
                Drafter::Ngram => !ngram::propose(&seq.tokens, 1, c.ngram).is_empty(),
                // A draft model or head always has a guess, where its drafts pay.
                Drafter::Model => {
                    self.draft.is_some() && self.costly_drafts_pay(running, k_max) != Some(false)
                }
                Drafter::Eagle => {
                    self.eagle.as_ref().is_some_and(|e| e.drafts_for(id))
                        && self.costly_drafts_pay(running, k_max) != Some(false)
                }
            },
            None => false,
        }
    }
}
