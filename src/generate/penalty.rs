//! OpenAI's presence and frequency penalties, exactly as OpenAI documents them and vLLM
//! implements them: for every id `t` of the vocabulary,
//!
//! `logit[t] -= presence * (count[t] > 0) + frequency * count[t]`
//!
//! where `count[t]` is how often `t` occurs in the generated output so far. The prompt does not
//! count (unlike the multiplicative repetition penalty, which looks at prompt and output).
//! Negative values encourage repeats.

use std::collections::HashMap;

/// How often each id occurs in the output part of a history, kept up to date as the history
/// changes: each call counts only the ids added since the last one, and takes back those the
/// last one had past where the two part. A speculative step asks for its rows' histories, the
/// sequence and its drafts; the next step's history then holds another token where a draft was
/// rejected, at a length the counts may already have reached, so a count kept by length alone
/// would go on counting the rejected draft.
#[derive(Debug, Clone)]
pub struct OutputCounts {
    /// Ids of the history before this index are the prompt.
    prompt_len: usize,
    /// The output ids counted, in order.
    counted: Vec<u32>,
    counts: HashMap<u32, u32>,
}

impl OutputCounts {
    pub fn new(prompt_len: usize) -> Self {
        OutputCounts { prompt_len, counted: Vec::new(), counts: HashMap::new() }
    }

    /// Brings the counts up to date with `history` (prompt first) and returns (id, count) of
    /// every id in the output so far, in no particular order.
    pub fn counts(&mut self, history: &[u32]) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.update(history);
        self.counts.iter().map(|(&id, &n)| (id, n))
    }

    /// Subtracts the penalties from `logits` for the output in `history` (prompt first). Ids
    /// outside the vocabulary are ignored. (The sampler goes through [`OutputCounts::counts`]
    /// and [`super::sampler::Penalty`], with this same arithmetic.)
    #[cfg(test)]
    fn apply(&mut self, logits: &mut [f32], history: &[u32], presence: f32, frequency: f32) {
        if presence == 0.0 && frequency == 0.0 {
            return;
        }
        for (id, n) in self.counts(history) {
            if let Some(l) = logits.get_mut(id as usize) {
                *l -= presence + frequency * n as f32;
            }
        }
    }

    /// Occurrences of `id` in the output counted so far.
    pub fn count(&self, id: u32) -> u32 {
        self.counts.get(&id).copied().unwrap_or(0)
    }

    fn update(&mut self, history: &[u32]) {
        let output = history.get(self.prompt_len..).unwrap_or(&[]);
        // The common case, a history grown from the last one, is one comparison of memory.
        let same = if output.starts_with(&self.counted) {
            self.counted.len()
        } else {
            self.counted.iter().zip(output).take_while(|(a, b)| a == b).count()
        };
        for id in self.counted.drain(same..) {
            if let Some(n) = self.counts.get_mut(&id) {
                *n -= 1;
                if *n == 0 {
                    self.counts.remove(&id);
                }
            }
        }
        for &id in &output[same..] {
            *self.counts.entry(id).or_default() += 1;
        }
        self.counted.extend_from_slice(&output[same..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The formula written out over a plain count of the output (the oracle).
    fn direct(logits: &[f32], output: &[u32], presence: f32, frequency: f32) -> Vec<f32> {
        (0..logits.len())
            .map(|t| {
                let n = output.iter().filter(|&&o| o as usize == t).count() as f32;
                let seen = if n > 0.0 { 1.0 } else { 0.0 };
                logits[t] - presence * seen - frequency * n
            })
            .collect()
    }

    #[test]
    fn matches_the_formula_step_by_step_and_ignores_the_prompt() {
        let prompt = [0u32, 1, 1, 2];
        let output = [3u32, 1, 3, 3, 4, 9];
        let base = [1.0f32, 0.5, -0.5, 2.0, 0.0];
        for (presence, frequency) in [(0.5, 0.0), (0.0, 0.7), (1.5, -0.4), (-2.0, 2.0)] {
            let mut counts = OutputCounts::new(prompt.len());
            // Grows one id at a time, as a generation does: the incremental count stays exact.
            for n in 0..=output.len() {
                let history: Vec<u32> = prompt.iter().chain(&output[..n]).copied().collect();
                let mut got = base;
                counts.apply(&mut got, &history, presence, frequency);
                let want = direct(&base, &output[..n], presence, frequency);
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() < 1e-6, "{presence} {frequency} n={n}: {got:?} {want:?}");
                }
            }
            assert_eq!(counts.count(3), 3);
            assert_eq!(counts.count(2), 0, "prompt ids are not output");
        }
    }

    /// Speculative steps: each asks for the counts of the sequence plus 0 to k of its drafts,
    /// then the sequence keeps some drafts and one token of its own, so the next history may
    /// replace ids the counts have seen at any length, as long or longer than before. Random
    /// drafts and rollbacks, checked against a plain count of every history asked for.
    #[test]
    fn a_rolled_back_draft_is_no_longer_counted() {
        use rand::{Rng, SeedableRng, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(7);
        let base = [0.0f32; 6];
        for trial in 0..200 {
            let prompt: Vec<u32> =
                (0..rng.random_range(0..4)).map(|_| rng.random_range(0..6)).collect();
            let mut seq = prompt.clone();
            let mut counts = OutputCounts::new(prompt.len());
            for _ in 0..12 {
                let k = rng.random_range(1..8);
                let drafts: Vec<u32> = (0..k).map(|_| rng.random_range(0..6)).collect();
                for j in 0..=k {
                    let history = [&seq[..], &drafts[..j]].concat();
                    let mut got = base;
                    counts.apply(&mut got, &history, 0.5, 1.0);
                    let want = direct(&base, &history[prompt.len()..], 0.5, 1.0);
                    assert_eq!(got.to_vec(), want, "trial {trial}: {history:?}");
                }
                let kept = rng.random_range(0..=k);
                seq.extend_from_slice(&drafts[..kept]);
                seq.push(rng.random_range(0..6));
            }
        }
    }

    #[test]
    fn off_is_a_no_op_and_a_shorter_history_recounts() {
        let mut counts = OutputCounts::new(0);
        let mut l = [1.0f32, 2.0];
        counts.apply(&mut l, &[0, 0, 1], 0.0, 0.0);
        assert_eq!(l, [1.0, 2.0]);
        counts.apply(&mut l, &[0, 0, 1], 0.0, 1.0);
        assert_eq!(l, [-1.0, 1.0]);
        let mut l = [1.0f32, 2.0];
        counts.apply(&mut l, &[1], 0.0, 1.0);
        assert_eq!(l, [1.0, 1.0]);
    }
}
