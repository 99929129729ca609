//! What a model's step of several rows of one sequence costs against a one-row step, from the
//! bytes it reads: what speculative decoding sizes its drafts by
//! ([`crate::engine::spec::length`]). A model rather than a timing, so that the steps an engine
//! takes do not depend on the machine's noise. Against the verify steps of one sequence measured
//! on an H100 (docs/performance.md) it errs by under 6% for gpt-oss-20b and Llama-3.2-1B; for
//! gpt-oss-120b's 128 experts it errs high, by up to 15% (5 rows: 2.4 against 2.10).

/// What a step of `rows` rows of one sequence costs against a one-row step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepCost {
    /// A step's time per extra row beyond the weight reads (the attention, the activations):
    /// ~2% of a one-row step on the dense layouts measured (Llama-3.2-1B 9 rows: 1.146×).
    per_row: f64,
    moe: Option<Experts>,
}

/// A mixture of experts' share of a one-row step: `top_k` of `experts` per token per layer,
/// whose bytes are `share` of what a one-row step reads.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Experts {
    experts: f64,
    top_k: f64,
    share: f64,
}

impl StepCost {
    /// A dense model: the weights are read once whatever the rows.
    pub fn dense() -> StepCost {
        StepCost { per_row: 0.02, moe: None }
    }

    /// A mixture of `experts` experts, `top_k` a token, whose `top_k` experts make `share` of a
    /// one-row step's bytes.
    pub fn moe(experts: usize, top_k: usize, share: f64) -> StepCost {
        let moe = (experts > 0 && top_k > 0 && top_k <= experts).then_some(Experts {
            experts: experts as f64,
            top_k: top_k as f64,
            share: share.clamp(0.0, 1.0),
        });
        StepCost { per_row: 0.0, moe }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_moe_model_matches_the_measured_verify_steps() {
        // docs/performance.md, H100: 3 / 5 / 9 rows at 3,398 / 4,385 / 6,003 µs against 2,206.
        for (rows, measured) in [(3, 3398.0 / 2206.0), (5, 4385.0 / 2206.0), (9, 6003.0 / 2206.0)] {
            let model = StepCost::moe(32, 4, 1.27 / 3.7).relative(rows);
            assert!((model / measured - 1.0).abs() < 0.06, "{rows} rows: {model} vs {measured}");
        }
        // Llama-3.2-1B: 1,286 / 1,319 / 1,417 µs against 1,236.
        for (rows, measured) in [(3, 1286.0 / 1236.0), (5, 1319.0 / 1236.0), (9, 1417.0 / 1236.0)] {
            let model = StepCost::dense().relative(rows);
            assert!((model / measured - 1.0).abs() < 0.05, "{rows} rows: {model} vs {measured}");
        }
        assert_eq!(StepCost::moe(32, 4, 1.27 / 3.7).relative(1), 1.0);
        assert_eq!(StepCost::dense().relative(0), 1.0);
    }
}
