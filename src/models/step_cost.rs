//! What a model's step of several rows of one sequence costs against a one-row step, from the
//! bytes it reads: what speculative decoding sizes its drafts by
//! ([`crate::engine::spec::length`]). A model rather than a timing, so that the steps an engine
//! takes do not depend on the machine's noise. Against the verify steps of one sequence measured
//! on an H100 (docs/performance.md) it errs by under 6% for gpt-oss-20b and Llama-3.2-1B; for
//! gpt-oss-120b's 128 experts it errs high, by up to 15% (5 rows: 2.4 against 2.10).
//!
//! A drafter that runs a model of its own (a draft model, an EAGLE-3 head) adds what its draft
//! tokens cost to make: each a step of the drafter, in the same currency, the bytes it reads
//! against the model's; and after a sequence has not drafted for a while, a prefill chunk of
//! the drafter over the tokens it skipped. Its steps run one sequence at a time, where the
//! model's verify rows share one step ([`StepCost::for_sequences`]).

/// What a step of `rows` rows of one sequence costs against a one-row step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// A step's time per extra row beyond the weight reads (the attention, the activations):
    /// ~2% of a one-row step on the dense layouts measured (Llama-3.2-1B 9 rows: 1.146×).
    per_row: f64,
    moe: Option<Experts>,
    /// Bytes a one-row step reads.
    bytes: u64,
    /// What making one draft token costs against a one-row step (0: n-gram and predicted
    /// drafts, which cost a lookup).
    draft: f64,
    /// What the drafter's catch-up over the tokens a sequence skipped costs against a one-row
    /// step ([`CATCH_UP_ROWS`] of them).
    catch_up: f64,
}

/// Tokens a drafter catches up over after a sequence has not drafted for a while: what its
/// backoff skips at the least ([`crate::engine::spec::Backoff`]). A mixture of experts reads
/// most of its experts for them.
const CATCH_UP_ROWS: usize = 16;

/// A mixture of experts' share of a one-row step: `top_k` of `experts` per token per layer,
/// whose bytes are `share` of what a one-row step reads.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Experts {
    experts: f64,
    top_k: f64,
    share: f64,
}

impl StepCost {
    /// A dense model whose one-row step reads `bytes`: the weights are read once whatever the
    /// rows.
    pub fn dense(bytes: u64) -> StepCost {
        StepCost { per_row: 0.02, moe: None, bytes, draft: 0.0, catch_up: 0.0 }
    }

    /// A mixture of `experts` experts, `top_k` a token, whose `top_k` experts make `share` of a
    /// one-row step's `bytes`.
    pub fn moe(experts: usize, top_k: usize, share: f64, bytes: u64) -> StepCost {
        let moe = (experts > 0 && top_k > 0 && top_k <= experts).then_some(Experts {
            experts: experts as f64,
            top_k: top_k as f64,
            share: share.clamp(0.0, 1.0),
        });
        StepCost { per_row: 0.0, moe, bytes, draft: 0.0, catch_up: 0.0 }
    }

    /// This model's steps with drafts made by a drafter whose steps cost what `drafter` says
    /// (one one-row step of it a draft token).
    pub fn with_drafter(self, drafter: &StepCost) -> StepCost {
        let draft = drafter.bytes as f64 / self.bytes.max(1) as f64;
        StepCost { draft, catch_up: draft * drafter.relative(CATCH_UP_ROWS), ..self }
    }

    /// The cost of a step of `n` sequences' drafts, each sequence's drafter steps run alone,
    /// against a plain step of the `n` sequences (whose rows share the step): the drafter's
    /// share grows `n`-fold where the model's step grows by its extra rows.
    pub fn for_sequences(self, n: usize) -> StepCost {
        let scale = n.max(1) as f64 / self.relative(n);
        StepCost { draft: self.draft * scale, catch_up: self.catch_up * scale, ..self }
    }

    /// What the drafter's catch-up after a pause costs against a one-row step.
    pub fn catch_up(&self) -> f64 {
        self.catch_up
    }

    /// What making one draft token costs against a one-row step.
    pub fn draft(&self) -> f64 {
        self.draft
    }

    /// The time of a step of `rows` rows over that of one row. Rows route independently, so
    /// `r` rows read the distinct experts of `r · top_k` draws: `E · (1 − (1 − k/E)^r)` of them
    /// in expectation.
    pub fn relative(&self, rows: usize) -> f64 {
        let r = rows.max(1) as f64;
        let extra = self.per_row * (r - 1.0);
        match self.moe {
            None => 1.0 + extra,
            Some(m) => {
                let distinct = m.experts * (1.0 - (1.0 - m.top_k / m.experts).powf(r));
                (1.0 - m.share) + m.share * distinct / m.top_k + extra
            }
        }
    }

    /// The time of a speculative step of `drafts` draft tokens, making them and verifying them
    /// with the sequence's last token, over that of a one-row step.
    pub fn speculative(&self, drafts: usize) -> f64 {
        self.relative(1 + drafts) + self.draft * drafts as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moe_model_matches_the_measured_verify_steps() {
        // docs/performance.md, H100: 3 / 5 / 9 rows at 3,398 / 4,385 / 6,003 µs against 2,206.
        for (rows, measured) in [(3, 3398.0 / 2206.0), (5, 4385.0 / 2206.0), (9, 6003.0 / 2206.0)] {
            let model = StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000).relative(rows);
            assert!((model / measured - 1.0).abs() < 0.06, "{rows} rows: {model} vs {measured}");
        }
        // Llama-3.2-1B: 1,286 / 1,319 / 1,417 µs against 1,236.
        for (rows, measured) in [(3, 1286.0 / 1236.0), (5, 1319.0 / 1236.0), (9, 1417.0 / 1236.0)] {
            let model = StepCost::dense(2_470_000_000).relative(rows);
            assert!((model / measured - 1.0).abs() < 0.05, "{rows} rows: {model} vs {measured}");
        }
        assert_eq!(StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000).relative(1), 1.0);
        assert_eq!(StepCost::dense(2_470_000_000).relative(0), 1.0);
    }

    #[test]
    fn a_drafter_adds_its_steps_by_their_bytes() {
        let target = StepCost::dense(16_000_000_000);
        assert_eq!(target.speculative(3), target.relative(4));
        // A 1B draft for an 8B target: each draft token ~0.16 of a step, its catch-up 16 rows
        // of the dense draft.
        let with = target.with_drafter(&StepCost::dense(2_500_000_000));
        assert!((with.draft() - 0.15625).abs() < 1e-12);
        assert!((with.speculative(3) - (target.relative(4) + 3.0 * 0.15625)).abs() < 1e-12);
        assert!((with.catch_up() - 0.15625 * 1.3).abs() < 1e-12);
        // The model as its own draft: a draft token costs a whole step.
        assert_eq!(target.with_drafter(&target).draft(), 1.0);
        // A mixture of experts catches up over most of its experts.
        let moe = StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000);
        assert!(moe.with_drafter(&moe).catch_up() > 3.0);
        // 8 sequences draft one after another but verify in one step.
        let eight = with.for_sequences(8);
        assert!((eight.draft() - 0.15625 * 8.0 / 1.14).abs() < 1e-12);
        assert_eq!(eight.relative(3), with.relative(3));
    }
}
