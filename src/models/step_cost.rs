//! What a model's step of several rows costs against a one-row step, from the bytes it reads:
//! what speculative decoding sizes its drafts by ([`crate::engine::spec::length`]). A model
//! rather than a timing, so that the steps an engine takes do not depend on the machine's
//! noise.
//!
//! Against steps measured on an H100 (docs/performance.md; each sequence its own ids) it errs
//! by under 6% for one sequence's verify steps of gpt-oss-20b and Llama-3.2-1B, and for 20b's
//! steps of 8 sequences of 2 and 3 rows; it errs low, by 11% for 8 sequences' 5 rows of 20b and
//! 16–21% for Llama's 3 and 5 (the products leave the one-row GEMV's regime there), and more
//! past 8 sequences, where speculation does not run. For gpt-oss-120b's 128 experts it errs
//! high, by up to 15% (one sequence's 5 rows: 2.4 against 2.10).
//!
//! A drafter that runs a model of its own (a draft model, an EAGLE-3 head) adds what its draft
//! tokens cost to make: each a step of the drafter, in the same currency, the bytes it reads
//! against the model's; and after a sequence has not drafted for a while, a prefill chunk of
//! the drafter over the tokens it skipped. A draft model's steps run one sequence at a time; an
//! EAGLE-3 head's make every sequence's drafts in one step of a row each
//! ([`StepCost::speculative`]).

/// What a step of so many rows costs against a one-row step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// A step's time per extra row beyond the weight reads (the attention, the activations,
    /// the experts' tiles): ~2% of a one-row step on the layouts measured (Llama-3.2-1B 9 rows
    /// of one sequence: 1.146×; gpt-oss-20b 8 to 64 rows: 2–3%).
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
    /// Whether the drafter makes all the sequences' drafts in one step (rows of a dense
    /// drafter: [`PER_ROW`] each beyond the first), rather than one sequence at a time.
    batched: bool,
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

/// A step's time per extra row beyond its weight reads, against a one-row step.
const PER_ROW: f64 = 0.02;

impl StepCost {
    /// A dense model whose one-row step reads `bytes`: the weights are read once whatever the
    /// rows.
    pub fn dense(bytes: u64) -> StepCost {
        StepCost { per_row: PER_ROW, moe: None, bytes, draft: 0.0, catch_up: 0.0, batched: false }
    }

    /// A mixture of `experts` experts, `top_k` a token, whose `top_k` experts make `share` of a
    /// one-row step's `bytes`.
    pub fn moe(experts: usize, top_k: usize, share: f64, bytes: u64) -> StepCost {
        let moe = (experts > 0 && top_k > 0 && top_k <= experts).then_some(Experts {
            experts: experts as f64,
            top_k: top_k as f64,
            share: share.clamp(0.0, 1.0),
        });
        StepCost { per_row: PER_ROW, moe, bytes, draft: 0.0, catch_up: 0.0, batched: false }
    }

    /// This model's steps with drafts made by a drafter whose steps cost what `drafter` says
    /// (one one-row step of it a draft token).
    pub fn with_drafter(self, drafter: &StepCost) -> StepCost {
        let draft = drafter.bytes as f64 / self.bytes.max(1) as f64;
        StepCost { draft, catch_up: draft * drafter.relative(CATCH_UP_ROWS), ..self }
    }

    /// [`StepCost::with_drafter`] for a drafter that makes every sequence's drafts in one step
    /// (an EAGLE-3 head).
    pub fn with_batched_drafter(self, drafter: &StepCost) -> StepCost {
        StepCost { batched: true, ..self.with_drafter(drafter) }
    }

    /// What making one draft token costs against a one-row step.
    pub fn draft(&self) -> f64 {
        self.draft
    }

    /// What the drafter's catch-up after a pause costs against a one-row step.
    pub fn catch_up(&self) -> f64 {
        self.catch_up
    }

    /// The time of a step of `rows` rows (of one sequence or several) over that of one row.
    /// Rows route independently, so `r` rows read the distinct experts of `r · top_k` draws:
    /// `E · (1 − (1 − k/E)^r)` of them in expectation.
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

    /// The time of a speculative step of `sequences` sequences that each verify `drafts` draft
    /// tokens with their last token, and of making their drafts (one sequence at a time, or all
    /// at once by a batched drafter), over that of a plain step of the sequences.
    pub fn speculative(&self, sequences: usize, drafts: usize) -> f64 {
        let n = sequences.max(1);
        let steps = if self.batched { 1.0 + PER_ROW * (n - 1) as f64 } else { n as f64 };
        let made = self.draft * drafts as f64 * steps;
        (self.relative(n * (1 + drafts)) + made) / self.relative(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_matches_the_measured_verify_steps() {
        let gpt_oss = StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000);
        // docs/performance.md, H100: 3 / 5 / 9 rows at 3,398 / 4,385 / 6,003 µs against 2,206.
        for (rows, measured) in [(3, 3398.0 / 2206.0), (5, 4385.0 / 2206.0), (9, 6003.0 / 2206.0)] {
            let model = gpt_oss.relative(rows);
            assert!((model / measured - 1.0).abs() < 0.06, "{rows} rows: {model} vs {measured}");
        }
        // 8 sequences of 2 and 3 rows: 7,159 and 8,135 µs against 5,473; 5 rows (9,910) errs
        // low.
        for (rows, measured, within) in
            [(2, 7159.0 / 5473.0, 0.06), (3, 8135.0 / 5473.0, 0.06), (5, 9910.0 / 5473.0, 0.12)]
        {
            let model = gpt_oss.speculative(8, rows - 1);
            assert!((model / measured - 1.0).abs() < within, "8 × {rows}: {model} vs {measured}");
        }
        // Llama-3.2-1B: 1,286 / 1,319 / 1,417 µs against 1,236; 8 sequences of 2 rows 1,563
        // against 1,359.
        let llama = StepCost::dense(2_470_000_000);
        for (rows, measured) in [(3, 1286.0 / 1236.0), (5, 1319.0 / 1236.0), (9, 1417.0 / 1236.0)] {
            let model = llama.relative(rows);
            assert!((model / measured - 1.0).abs() < 0.05, "{rows} rows: {model} vs {measured}");
        }
        let model = llama.speculative(8, 1);
        assert!((model / (1563.0 / 1359.0) - 1.0).abs() < 0.05, "8 × 2: {model}");
        assert_eq!(gpt_oss.relative(1), 1.0);
        assert_eq!(llama.relative(0), 1.0);
        assert_eq!(llama.speculative(3, 0), 1.0);
    }

    #[test]
    fn a_drafter_adds_its_steps_by_their_bytes() {
        let target = StepCost::dense(16_000_000_000);
        assert_eq!(target.speculative(1, 3), target.relative(4));
        // A 1B draft for an 8B target: each draft token ~0.16 of a step, its catch-up 16 rows
        // of the dense draft.
        let with = target.with_drafter(&StepCost::dense(2_500_000_000));
        assert!((with.draft() - 0.15625).abs() < 1e-12);
        assert!((with.speculative(1, 3) - (target.relative(4) + 3.0 * 0.15625)).abs() < 1e-12);
        assert!((with.catch_up() - 0.15625 * 1.3).abs() < 1e-12);
        // The model as its own draft: a draft token costs a whole step.
        assert_eq!(target.with_drafter(&target).draft(), 1.0);
        // A mixture of experts catches up over most of its experts.
        let moe = StepCost::moe(32, 4, 1.27 / 3.7, 3_700_000_000);
        assert!(moe.with_drafter(&moe).catch_up() > 3.0);
        // 8 sequences make their drafts one after another but verify them in one step.
        let eight = (with.relative(16) + 8.0 * 0.15625) / with.relative(8);
        assert!((with.speculative(8, 1) - eight).abs() < 1e-12);
        // A batched drafter (an EAGLE-3 head) makes them in one step of 8 rows: 1.14 steps.
        let batched = target.with_batched_drafter(&StepCost::dense(2_500_000_000));
        let eight = (with.relative(24) + 2.0 * 0.15625 * 1.14) / with.relative(8);
        assert!((batched.speculative(8, 2) - eight).abs() < 1e-12);
        assert_eq!(batched.speculative(1, 3), with.speculative(1, 3));
    }
}
