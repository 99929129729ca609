//! Turning one step's logits into the next token id.
//!
//! Model-independent and CPU-side: the model hands over a logits row (`&mut [f32]`, vocabulary
//! sized, up to 201,088 entries for gpt-oss) and gets back one id. The pipeline, in this order
//! (Hugging Face `generate`'s order; llama.cpp differs only in applying temperature last):
//!
//! 1. **repetition penalty** over the *distinct* ids among the last `repeat_last_n` of the
//!    history, with HF semantics: a positive logit is divided by the penalty, a negative one
//!    multiplied (so the token always becomes less likely for a penalty > 1); then OpenAI's
//!    additive **presence and frequency penalties** over the output part of the history
//!    ([`super::penalty`]; vLLM applies the three in this order too);
//! 2. **temperature** (`temperature <= 0` short-circuits to greedy argmax, ties going to the
//!    lowest id);
//! 3. **top-k**: keep the k highest logits;
//! 4. **softmax**;
//! 5. **top-p** (nucleus): keep the smallest set of most likely tokens whose probability adds up
//!    to at least `top_p` (always at least one token);
//! 6. **min-p**: drop tokens whose probability is below `min_p` times the top token's;
//! 7. renormalise and draw with a seeded RNG.
//!
//! Speed matters because this runs once per generated token on the host. Nothing is ever sorted
//! in full: top-k is one pass keeping values above the running k-th best, min-p is a logit
//! threshold applied while collecting, and top-p probes the best 256 candidates and otherwise
//! bisects by selection (O(n) even for a flat distribution). Buffers are reused between calls.
//! With vocabulary 201,088 on one core: ~0.1 ms with top-k, a few ms without.

use super::penalty::OutputCounts;
use crate::error::{ErrorKind, fail};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cmp::Ordering;

/// How to pick tokens. `Default` is llama.cpp's default sampler (temperature 0.8, top-k 40,
/// top-p 0.95, min-p 0.05, no repetition penalty) with seed 0; a CLI should draw a random seed
/// unless the user gives one.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` (or not finite) means greedy decoding.
    pub temperature: f32,
    /// Keep only the k most likely tokens; `None` or `Some(0)` disables.
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1); `None` or `>= 1` disables, `<= 0` keeps only the top token.
    pub top_p: Option<f32>,
    /// Relative probability floor in (0, 1]; `None` or `<= 0` disables.
    pub min_p: Option<f32>,
    /// Repetition penalty; 1.0 is off, > 1 discourages repeats.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the penalty looks at (0 = none).
    pub repeat_last_n: usize,
    /// OpenAI's presence penalty, in [-2, 2]: subtracted once from the logit of every id that
    /// occurs in the output so far (not the prompt). 0 is off.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty, in [-2, 2]: subtracted from an id's logit once per
    /// occurrence in the output so far. 0 is off.
    pub frequency_penalty: f32,
    /// Seed of the RNG: the same seed, logits and history give the same tokens.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: Some(40),
            top_p: Some(0.95),
            min_p: Some(0.05),
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Deterministic argmax decoding, no penalty.
    pub fn greedy() -> Self {
        SamplerConfig {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            repeat_penalty: 1.0,
            repeat_last_n: 0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }

    /// Rejects settings a user cannot have meant (the sampler itself tolerates them: see the
    /// field docs). For command-line and API input.
    pub fn validate(&self) -> anyhow::Result<()> {
        let bad = |msg: String| Err(fail(ErrorKind::InvalidInput, msg));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad(format!("temperature must be a number >= 0, not {}", self.temperature));
        }
        if let Some(p) = self.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return bad(format!("top-p must be in (0, 1], not {p}"));
        }
        if let Some(p) = self.min_p.filter(|p| !(*p >= 0.0 && *p <= 1.0)) {
            return bad(format!("min-p must be in [0, 1], not {p}"));
        }
        if !(self.repeat_penalty > 0.0 && self.repeat_penalty.is_finite()) {
            return bad(format!(
                "repeat penalty must be a number > 0, not {}",
                self.repeat_penalty
            ));
        }
        for (name, v) in [
            ("presence penalty", self.presence_penalty),
            ("frequency penalty", self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in [-2, 2], not {v}"));
            }
        }
        Ok(())
    }

    /// True when sampling reduces to argmax (no randomness is drawn).
    pub fn is_greedy(&self) -> bool {
        !(self.temperature > 0.0 && self.temperature.is_finite())
    }

    /// True when no penalty changes the logits (repetition, presence, frequency): the draw
    /// needs only the model's logits, not the history.
    pub fn is_unpenalised(&self) -> bool {
        (self.repeat_penalty == 1.0 || self.repeat_last_n == 0)
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }

    /// True for a draw from the whole `softmax(logits / T)`: temperature only, no top-k,
    /// top-p, min-p or penalty (gpt-oss's recommended setting). Such a draw can run on the
    /// device ([`crate::kernels::sample_gumbel`]).
    pub fn is_plain_temperature(&self) -> bool {
        !self.is_greedy()
            && self.top_k.is_none_or(|k| k == 0)
            && self.top_p.is_none_or(|p| p >= 1.0)
            && self.min_p.is_none_or(|m| m <= 0.0)
            && self.is_unpenalised()
    }

    /// Whether the engine may pick the token on the device without this sampler: plain argmax
    /// (anywhere), or a plain-temperature draw (on a GPU, `cuda`). Anything that needs the
    /// penalised or filtered row is sampled on the host.
    pub fn samples_on_device(&self, cuda: bool) -> bool {
        (self.is_greedy() && self.is_unpenalised()) || (cuda && self.is_plain_temperature())
    }
}

/// A stateful sampler: owns the RNG and scratch buffers. One per generation stream.
pub struct Sampler {
    cfg: SamplerConfig,
    rng: StdRng,
    /// (token id, weight) candidates; weights are scaled logits, then unnormalised probabilities.
    cand: Vec<(u32, f32)>,
    /// Distinct recent ids for the repetition penalty.
    recent: Vec<u32>,
    /// Occurrences of each id in the output, for the presence and frequency penalties.
    output: OutputCounts,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = StdRng::seed_from_u64(cfg.seed);
        Sampler { cfg, rng, cand: Vec::new(), recent: Vec::new(), output: OutputCounts::new(0) }
    }

    /// The first `prompt_len` ids of every history given to [`Sampler::sample`] are the prompt:
    /// the presence and frequency penalties count only what follows (OpenAI's and vLLM's
    /// definition). Without it the whole history counts as output.
    pub fn with_prompt_len(mut self, prompt_len: usize) -> Self {
        self.output = OutputCounts::new(prompt_len);
        self
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// A seed for one draw made elsewhere (on the device), from this sampler's RNG: the same
    /// `seed` in the config gives the same sequence of draws.
    pub fn next_seed(&mut self) -> u64 {
        self.rng.random()
    }

    /// Picks the next token. `logits` is modified in place (penalised); `history` is the ids so
    /// far (prompt and generated), most recent last. NaN logits are never picked.
    ///
    /// # Panics
    /// If `logits` is empty (a caller bug, not a data error).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "Sampler::sample: empty logits");
        self.apply_repeat_penalty(logits, history);
        self.output.apply(logits, history, self.cfg.presence_penalty, self.cfg.frequency_penalty);
        if self.cfg.is_greedy() {
            return argmax(logits);
        }
        let Some(total) = self.collect_candidates(logits) else {
            // All -inf/NaN, or a +inf that would swallow all the mass: the best-ranked id wins.
            return argmax(logits);
        };
        let kept = self.nucleus(total);
        self.draw(kept)
    }

    /// Step 1: HF-style repetition penalty over the distinct ids of the recent window.
    fn apply_repeat_penalty(&mut self, logits: &mut [f32], history: &[u32]) {
        let penalty = self.cfg.repeat_penalty;
        if penalty == 1.0 || !penalty.is_finite() || penalty <= 0.0 || self.cfg.repeat_last_n == 0 {
            return;
        }
        let start = history.len().saturating_sub(self.cfg.repeat_last_n);
        self.recent.clear();
        self.recent.extend_from_slice(&history[start..]);
        self.recent.sort_unstable();
        self.recent.dedup();
        for &id in &self.recent {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
        }
    }

    /// Steps 2, 3, 4 and 6: fill `cand` with (id, exp((l - max) / T)) for the top-k tokens that
    /// pass the min-p floor. Top-k and min-p commute with the later steps: top-k ranks are the
    /// same before and after temperature, and min-p's floor is relative to the top token, so it
    /// is the same before or after top-p renormalises (it removes a tail of the same ranking).
    /// Returns the softmax normaliser over the top-k set (before min-p), which top-p needs, or
    /// `None` when the largest logit is not finite.
    fn collect_candidates(&mut self, logits: &[f32]) -> Option<f64> {
        let inv_t = 1.0 / self.cfg.temperature;
        // min-p: p_i >= min_p * p_max  <=>  (l_i - max) / T >= ln(min_p).
        let floor = match self.cfg.min_p {
            Some(m) if m > 0.0 => m.min(1.0).ln(),
            _ => f32::NEG_INFINITY,
        };
        self.cand.clear();
        match self.cfg.top_k.filter(|&k| k > 0 && k < logits.len()) {
            Some(k) => {
                self.top_k_logits(logits, k);
                let max = self.cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
                if !max.is_finite() {
                    return None;
                }
                // Softmax over the k survivors only.
                let mut z = 0f64;
                for c in self.cand.iter_mut() {
                    c.1 = ((c.1 - max) * inv_t).exp();
                    z += c.1 as f64;
                }
                let w_floor = floor.exp();
                self.cand.retain(|c| c.1 > 0.0 && c.1 >= w_floor);
                Some(z)
            }
            None => {
                let max = max_non_nan(logits).filter(|m| m.is_finite())?;
                let mut z = 0f64;
                for (i, &l) in logits.iter().enumerate() {
                    let s = (l - max) * inv_t;
                    if s.is_nan() || s == f32::NEG_INFINITY {
                        continue;
                    }
                    let w = s.exp();
                    z += w as f64;
                    if s >= floor && w > 0.0 {
                        self.cand.push((i as u32, w));
                    }
                }
                Some(z)
            }
        }
    }

    /// Step 3: fill `cand` with (id, logit) of the k best logits (ties to the lower id), in one
    /// pass: only values above the running k-th best are collected, and the buffer is cut back
    /// to k whenever it fills up, so a 201k vocabulary costs a comparison per entry.
    fn top_k_logits(&mut self, logits: &[f32], k: usize) {
        let cap = k.saturating_mul(4).max(1024);
        // A value equal to the running threshold arrives after (so has a higher id than) the
        // k-th best it ties with, and ranks below it. NaN and -inf never pass.
        let mut threshold = f32::NEG_INFINITY;
        for (i, &l) in logits.iter().enumerate() {
            if l > threshold {
                self.cand.push((i as u32, l));
                if self.cand.len() >= cap {
                    self.cand.select_nth_unstable_by(k - 1, by_weight_desc);
                    self.cand.truncate(k);
                    threshold = self.cand[k - 1].1;
                }
            }
        }
        if self.cand.len() > k {
            self.cand.select_nth_unstable_by(k - 1, by_weight_desc);
            self.cand.truncate(k);
        }
    }

    /// Step 5: keep the smallest head of the ranking whose mass reaches `top_p` of `total`,
    /// without sorting the vocabulary: probe the best 256 first (a peaked distribution ends
    /// there), then bisect by selection, so even a flat distribution costs O(n). Returns how
    /// many leading entries of `cand` survive (ranked above the rest, not sorted among
    /// themselves); when no top-p applies the order of `cand` is left as it is.
    fn nucleus(&mut self, total: f64) -> usize {
        const SMALL: usize = 256;
        let p = match self.cfg.top_p {
            Some(p) if p < 1.0 => p.max(0.0) as f64,
            _ => return self.cand.len(),
        };
        let target = p * total;
        // Invariant: cand[..lo] ranks above cand[lo..hi], which ranks above cand[hi..]; the mass
        // of cand[..lo] is `acc` < target; the cut lies in (lo, hi].
        let (mut lo, mut hi, mut acc) = (0, self.cand.len(), 0f64);
        loop {
            let len = hi - lo;
            if len <= SMALL {
                let part = &mut self.cand[lo..hi];
                part.sort_unstable_by(by_weight_desc);
                for (i, c) in part.iter().enumerate() {
                    acc += c.1 as f64;
                    if acc >= target {
                        return lo + i + 1;
                    }
                }
                // Rounding, or min-p already removed the tail: keep everything left.
                return hi;
            }
            let m = if lo == 0 { SMALL } else { len / 2 };
            self.cand[lo..hi].select_nth_unstable_by(m - 1, by_weight_desc);
            let mass: f64 = self.cand[lo..lo + m].iter().map(|c| c.1 as f64).sum();
            if acc + mass >= target {
                hi = lo + m;
            } else {
                acc += mass;
                lo += m;
            }
        }
    }

    /// Step 7: draw from the first `kept` candidates in proportion to their weights.
    fn draw(&mut self, kept: usize) -> u32 {
        let cand = &self.cand[..kept.max(1)];
        let total: f64 = cand.iter().map(|c| c.1 as f64).sum();
        let u = self.rng.random::<f64>() * total;
        let mut acc = 0f64;
        for c in cand {
            acc += c.1 as f64;
            if u < acc {
                return c.0;
            }
        }
        // Only reachable through rounding at the very top of the range.
        cand.iter().rev().find(|c| c.1 > 0.0).unwrap_or(&cand[0]).0
    }
}

/// Descending by weight, ties by ascending id (so results do not depend on scan order).
fn by_weight_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Index of the largest logit, ties to the lowest id; NaN never wins (index 0 if all are NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NAN;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v || (best_v.is_nan() && !v.is_nan()) {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

/// Largest logit that is not NaN, or `None` when all are NaN (or -inf).
fn max_non_nan(logits: &[f32]) -> Option<f32> {
    // A plain comparison loop: NaN compares false and is skipped; much faster than f32::max.
    let mut m = f32::NEG_INFINITY;
    for &v in logits {
        if v > m {
            m = v;
        }
    }
    (m > f32::NEG_INFINITY).then_some(m)
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;
