//! How many tokens a sequence drafts: the length whose expected tokens per unit of step time is
//! highest, from the sequence's own acceptance and what a step of so many rows costs.
//!
//! A draft of `k` tokens whose tokens each stand with chance `α` (given the ones before stood)
//! emits `1 + α + … + α^k` tokens a step. A dense model's extra rows are almost free while the
//! step stays small (it reads the same weights), so long drafts pay even at a low `α`. A mixture
//! of experts' are not: each row routes to experts of its own, so 3 rows of gpt-oss-20b read
//! ~1.5× a one-row step's bytes and 5 rows ~2×, and a draft of 4 at `α` = 0.5 (1.94 tokens for
//! 2.07 steps' time) is slower than no draft at all, where a draft of 1 gives 1.5 tokens for
//! 1.32. Sequences that verify together share a step, so their drafts cost what the step's rows
//! add to their plain step ([`StepCost::speculative`]).
//!
//! A draft model's or an EAGLE-3 head's draft tokens cost a step of the drafter each on top,
//! one sequence at a time: a Llama-3.2-1B draft for Llama-3.1-8B (~0.15 of a step a token)
//! drafts 4 at `α` = 0.8 where free drafts would take all 8, and not at all for 8 sequences;
//! a model drafting for itself never gains.
//!
//! The cost is a model of the bytes a step reads ([`StepCost`]), not a timing: timings would make
//! a sequence's draft lengths, and so its steps, depend on the machine's noise.

use crate::models::step_cost::StepCost;

/// Tokens a verify step emits in expectation: the accepted drafts and the one it samples.
pub fn expected_tokens(alpha: f64, drafts: usize) -> f64 {
    (0..=drafts).map(|i| alpha.powi(i as i32)).sum()
}

/// Whether drafts of at most `k_max` tokens, for each of `sequences` sequences verifying
/// together, can emit more than a token a sequence per plain step's time even when every draft
/// token stands: a drafter whose steps cost about what the model's do (the model drafting for
/// itself; gpt-oss-20b for 120b, ~0.7 of its step) never can.
pub fn pays(cost: &StepCost, sequences: usize, k_max: usize) -> bool {
    (1..=k_max).any(|k| expected_tokens(1.0, k) > cost.speculative(sequences, k))
}

/// The draft length of 1 to `k_max` tokens that emits the most tokens per unit of step time
/// for a sequence whose step holds `sequences` sequences drafting alike (the shortest of
/// equals).
pub fn best_length(alpha: f64, cost: &StepCost, sequences: usize, k_max: usize) -> usize {
    best(k_max, |k| expected_tokens(alpha, k) / cost.speculative(sequences, k))
}

/// The one draft length that sequences verifying together (each as many rows as the others, as
/// a CUDA graph's step has them) take: the most tokens over the step's time.
pub fn best_uniform(alphas: &[f64], cost: &StepCost, k_max: usize) -> usize {
    best(k_max, |k| {
        let tokens: f64 = alphas.iter().map(|&a| expected_tokens(a, k)).sum();
        tokens / cost.speculative(alphas.len(), k)
    })
}

/// The length of 1 to `k_max` with the highest `rate` (the shortest of equals).
fn best(k_max: usize, rate: impl Fn(usize) -> f64) -> usize {
    (1..=k_max.max(1)).fold(1, |best, k| if rate(k) > rate(best) * (1.0 + 1e-9) { k } else { best })
}

/// A sequence's acceptance per draft token, from its own verify steps, recent ones weighing
/// most (a reply moves between copying its input and writing new text). A new sequence starts
/// from the engine's: the same record over every sequence's verify steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    stood: f64,
    tried: f64,
}

/// The weight an earlier verify step keeps at each new one: about the last 8 count.
const DECAY: f64 = 0.875;

impl Default for Acceptance {
    /// Before any verify step: a rate of 0.8 weighing as one tried token, so that a new
    /// sequence drafts long (drafts that miss are cut down within a few steps).
    fn default() -> Self {
        Acceptance { stood: 0.8, tried: 1.0 }
    }
}

impl Acceptance {
    /// A verify step of `drafts` draft tokens kept `accepted`: tokens up to the first miss were
    /// tried (the ones after it say nothing about the chance of a token standing).
    pub fn record(&mut self, drafts: usize, accepted: usize) {
        if drafts == 0 {
            return;
        }
        let tried = (accepted + 1).min(drafts) as f64;
        self.stood = DECAY * self.stood + accepted.min(drafts) as f64;
        self.tried = DECAY * self.tried + tried;
    }

    /// The chance that a draft token stands, given the ones before it stood.
    pub fn rate(&self) -> f64 {
        (self.stood / self.tried.max(1e-9)).clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss-20b's experts: 4 of 32 a token, 1.27 of the 3.7 GB a one-row step reads.
    fn gpt_oss_20b() -> StepCost {
        StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000)
    }

    #[test]
    fn a_moe_drafts_short_unless_its_drafts_stand() {
        let c = gpt_oss_20b();
        assert_eq!(best_length(0.3, &c, 1, 4), 1);
        assert_eq!(best_length(0.5, &c, 1, 4), 1);
        assert!(best_length(0.9, &c, 1, 8) >= 4);
        assert_eq!(best_length(1.0, &c, 1, 8), 8);
        // The chosen length beats the longest one it passed over.
        let rate = |a: f64, k| expected_tokens(a, k) / c.speculative(1, k);
        for a in [0.2, 0.5, 0.7, 0.8, 0.95] {
            let k = best_length(a, &c, 1, 8);
            assert!((1..=8).all(|j| rate(a, k) >= rate(a, j) - 1e-12), "α {a}: {k}");
        }
    }

    #[test]
    fn a_dense_model_drafts_long_once_drafts_stand_at_all() {
        let c = StepCost::dense(2_470_000_000);
        assert_eq!(best_length(0.9, &c, 1, 8), 8);
        assert!(best_length(0.6, &c, 1, 8) >= 4);
        assert!(best_length(0.05, &c, 1, 8) <= 2);
        // 8 sequences' rows together leave the weights' one read behind: shorter drafts.
        assert!(best_length(0.6, &c, 8, 8) < best_length(0.6, &c, 1, 8));
        assert_eq!(best_length(0.5, &c, 1, 0), 1);
    }

    #[test]
    fn a_drafter_that_runs_steps_drafts_what_pays_for_them() {
        let target = StepCost::dense(16_000_000_000);
        let small = target.with_drafter(&StepCost::dense(2_470_000_000));
        assert_eq!(best_length(0.8, &target, 1, 8), 8);
        assert_eq!(best_length(0.8, &small, 1, 8), 4);
        assert_eq!(best_length(0.2, &small, 1, 8), 1);
        assert!(pays(&small, 1, 8));
        // As its own draft the model emits under a token per step's time at any acceptance.
        let own = target.with_drafter(&target);
        assert_eq!(best_length(0.99, &own, 1, 8), 1);
        assert!(!pays(&own, 1, 8));
        // 8 sequences' drafts of the small model, made one sequence at a time, cost more than
        // their shared verify step gives.
        assert!(pays(&small, 2, 8));
        assert!(!pays(&small, 8, 8));
        // n-gram drafts always pay once they stand.
        assert!(pays(&StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000), 1, 1));
    }

    #[test]
    fn filler_shortens_a_shared_length() {
        let c = gpt_oss_20b();
        assert_eq!(best_uniform(&[0.8], &c, 8), best_length(0.8, &c, 1, 8));
        // Three sequences without drafts of their own verify filler that never stands.
        let with_filler = best_uniform(&[0.8, 0.0, 0.0, 0.0], &c, 8);
        assert!(with_filler < best_length(0.8, &c, 4, 8), "{with_filler}");
        assert_eq!(best_uniform(&[0.9; 4], &c, 8), best_length(0.9, &c, 4, 8));
        assert_eq!(best_uniform(&[], &c, 3), 1);
    }

    #[test]
    fn acceptance_follows_the_recent_steps() {
        let mut a = Acceptance::default();
        assert!(a.rate() > 0.7);
        for _ in 0..16 {
            a.record(4, 0);
        }
        assert!(a.rate() < 0.05, "{}", a.rate());
        for _ in 0..16 {
            a.record(4, 4);
        }
        assert!(a.rate() > 0.9, "{}", a.rate());
        // Two of four stood: three were tried (the third missed, the fourth says nothing).
        let mut b = Acceptance { stood: 0.0, tried: 0.0 };
        b.record(4, 2);
        assert!((b.rate() - 2.0 / 3.0).abs() < 1e-12);
        b.record(0, 0);
        assert!((b.rate() - 2.0 / 3.0).abs() < 1e-12);
    }
}
