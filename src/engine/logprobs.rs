//! Log probabilities of the tokens a request generates, for the API's `logprobs`.
//!
//! Which distribution: the log-softmax of the model's **raw** logits for that step, before the
//! repetition, presence and frequency penalties, temperature and the top-k/top-p/min-p filters.
//! That is vLLM's default (`logprobs_mode = "raw_logprobs"`: "logprobs computed from raw model
//! outputs before any logit processing"), so clients see the same numbers from both servers,
//! and the numbers are the model's, comparable between requests whatever their sampling
//! settings (a greedy token is then always the top-1 entry, a penalised one need not be).
//!
//! Computed on the host from a copy of the request's own logits row, only for requests that
//! ask: the others keep the device sampling path and copy nothing.

use std::cmp::Ordering;

/// The chosen token of one step and the most likely alternatives, as natural logs.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub id: u32,
    pub logprob: f32,
    /// The `k` most likely ids, most likely first (ties to the lower id).
    pub top: Vec<(u32, f32)>,
}

/// `log_softmax(row)[id]` and the `k` best entries. NaN logits count as impossible (-inf);
/// sums run in f64, so a 201k vocabulary loses no precision.
pub fn token_logprobs(row: &[f32], id: u32, k: usize) -> TokenLogprobs {
    let lse = log_sum_exp(row);
    let at = |i: u32| row.get(i as usize).map_or(f32::NEG_INFINITY, |&l| logprob(l, lse));
    let top = top_k(row, k).into_iter().map(|i| (i, at(i))).collect();
    TokenLogprobs { id, logprob: at(id), top }
}

fn logprob(logit: f32, lse: f64) -> f32 {
    if logit.is_nan() { f32::NEG_INFINITY } else { (logit as f64 - lse) as f32 }
}

/// `ln Σ exp(row)` over the non-NaN entries.
fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, |m, &l| m.max(l));
    if !max.is_finite() {
        // All -inf (nothing possible) or a +inf (it takes all the mass): the max itself.
        return max as f64;
    }
    let sum: f64 = row.iter().filter(|l| !l.is_nan()).map(|&l| ((l - max) as f64).exp()).sum();
    max as f64 + sum.ln()
}

/// Ids of the `k` largest logits, largest first, ties to the lower id; NaN never ranks.
fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    if k == 0 {
        return Vec::new();
    }
    let mut cand: Vec<(u32, f32)> =
        row.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l)).collect();
    let k = k.min(cand.len());
    if k == 0 {
        return Vec::new();
    }
    let order =
        |a: &(u32, f32), b: &(u32, f32)| -> Ordering { b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)) };
    cand.select_nth_unstable_by(k - 1, order);
    cand.truncate(k);
    cand.sort_unstable_by(order);
    cand.into_iter().map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_by_hand() {
        // Probabilities 0.5, 0.25, 0.125, 0.125.
        let row = [8f32.ln(), 4f32.ln(), 2f32.ln(), 2f32.ln()];
        let lp = token_logprobs(&row, 2, 3);
        assert!((lp.logprob - 0.125f32.ln()).abs() < 1e-6, "{lp:?}");
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [0, 1, 2], "descending, the tie of 2 and 3 to the lower id");
        for ((_, got), want) in lp.top.iter().zip([0.5f32, 0.25, 0.125]) {
            assert!((got - want.ln()).abs() < 1e-6, "{lp:?}");
        }
        assert!(token_logprobs(&row, 0, 0).top.is_empty());
        assert_eq!(token_logprobs(&row, 1, 10).top.len(), 4, "k is capped by the vocabulary");
    }

    #[test]
    fn large_logits_and_nan_stay_finite() {
        let row = [1000.0, 999.0, f32::NAN, f32::NEG_INFINITY];
        let lp = token_logprobs(&row, 1, 4);
        let p0 = 1.0 / (1.0 + (-1f64).exp());
        assert!((lp.top[0].1 as f64 - p0.ln()).abs() < 1e-6, "{lp:?}");
        assert_eq!(lp.top.len(), 3, "NaN never ranks");
        assert_eq!(lp.top[2], (3, f32::NEG_INFINITY));
        assert_eq!(token_logprobs(&row, 2, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(token_logprobs(&row, 99, 0).logprob, f32::NEG_INFINITY, "out of range");
    }
}
