//! Turning one step's logits into the next token id.
//!
//! Model-independent: the model hands over a logits row (`&mut [f32]`, vocabulary sized, up to
//! 201,088 entries for gpt-oss) and gets back one id. The pipeline, in this order (Hugging Face
//! `generate`'s order; llama.cpp differs only in applying temperature last):
//!
//! 1. **repetition penalty** over the *distinct* ids among the last `repeat_last_n` of the
//!    history, with HF semantics: a positive logit is divided by the penalty, a negative one
//!    multiplied (so the token always becomes less likely for a penalty > 1); then OpenAI's
//!    additive **presence and frequency penalties** over the output part of the history
//!    ([`super::penalty`]; vLLM applies the three in this order too). Both as one sparse list of
//!    [`Penalty`] entries per step;
//! 2. **temperature** (`temperature <= 0` short-circuits to greedy argmax, ties going to the
//!    lowest id);
//! 3. **top-k**: keep the k highest logits (all tokens tied with the k-th stay);
//! 4. **softmax** (weights `exp((l − max) / T)` computed in f64, rounded to f32: [`weight`]);
//! 5. **top-p** (nucleus): keep the smallest head of the ranking whose probability adds up to at
//!    least `top_p` (ties with its last token stay; `top_p <= 0` keeps the top token and its
//!    ties);
//! 6. **min-p**: drop tokens whose probability is below `min_p` times the top token's;
//! 7. renormalise and draw with a seeded RNG.
//!
//! Each filter keeps a set "logit ≥ threshold" ([`keep`] says which), so the device sampler
//! ([`crate::kernels::sample_rows`], used on every CUDA step) finds the same set by selecting
//! per-row thresholds and draws from it by the Gumbel-max trick; this host sampler serves the
//! CPU build, and [`Sampler::distribution`] is the exact distribution the device's tests check
//! their draws against.
//!
//! On the host nothing is ever sorted in full: top-k is one pass keeping values above the
//! running k-th best, min-p is a logit threshold applied while collecting, and top-p probes the
//! best 256 candidates and otherwise bisects by selection (O(n) even for a flat distribution).
//! Buffers are reused between calls. With vocabulary 201,088 on one core: a few ms.

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
    /// top-p, min-p or penalty (gpt-oss's recommended setting): the device draws it without
    /// filtering ([`crate::kernels::sample_gumbel_rows`]).
    pub fn is_plain_temperature(&self) -> bool {
        !self.is_greedy()
            && self.top_k.is_none_or(|k| k == 0)
            && self.top_p.is_none_or(|p| p >= 1.0)
            && self.min_p.is_none_or(|m| m <= 0.0)
            && self.is_unpenalised()
    }

    /// Whether the engine may pick the token on the device without this sampler's host code:
    /// plain argmax (anywhere), or any setting on a GPU (`cuda`: [`crate::kernels::sample_rows`]).
    pub fn samples_on_device(&self, cuda: bool) -> bool {
        cuda || (self.is_greedy() && self.is_unpenalised())
    }
}

/// The filters of one draw as both samplers apply them to a (penalised) logits row: the host's
/// [`keep`] and the device's [`crate::kernels::sample_rows`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Filter {
    /// 1 / temperature; 0 for a greedy row.
    pub inv_t: f32,
    /// Top-k's k; 0 is off (as is a k of at least the vocabulary).
    pub top_k: usize,
    /// Top-p's mass in [0, 1), or `None` (off).
    pub top_p: Option<f64>,
    /// Min-p as a floor on the scaled logit: a token stays when `(l − max) / T ≥ floor`
    /// (`p ≥ min_p · p_max`); −∞ is off.
    pub floor: f32,
}

impl SamplerConfig {
    /// The filters of this configuration, in the form the samplers take.
    pub fn filter(&self) -> Filter {
        Filter {
            inv_t: if self.is_greedy() { 0.0 } else { 1.0 / self.temperature },
            top_k: self.top_k.unwrap_or(0),
            top_p: self.top_p.filter(|&p| p < 1.0).map(|p| p.max(0.0) as f64),
            floor: match self.min_p {
                Some(m) if m > 0.0 => m.min(1.0).ln(),
                _ => f32::NEG_INFINITY,
            },
        }
    }
}

/// What the penalties do to one id's logit: `l → (l > 0 ? l / factor : l · factor) − sub`
/// (a factor of 1 and a sub of 0 change nothing, bit for bit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Penalty {
    pub id: u32,
    /// The repetition penalty, or 1 for an id outside the recent window.
    pub factor: f32,
    /// `presence + frequency · count`, or 0 for an id not in the output.
    pub sub: f32,
}

/// Applies `penalties` (distinct ids inside the row) to `logits`.
pub fn apply_penalties(logits: &mut [f32], penalties: &[Penalty]) {
    for p in penalties {
        if let Some(l) = logits.get_mut(p.id as usize) {
            let r = if *l > 0.0 { *l / p.factor } else { *l * p.factor };
            *l = r - p.sub;
        }
    }
}

/// A token that survived the filters: id, (penalised) logit, unnormalised probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cand {
    pub id: u32,
    pub logit: f32,
    pub weight: f32,
}

/// `exp(s)` as both samplers compute a weight: in f64, rounded to f32 (so a GPU's `exp` and the
/// host's give the same float, and the two pick the same top-p cut).
pub fn weight(s: f32) -> f32 {
    (s as f64).exp() as f32
}

/// Steps 3–6 on a penalised row: fills `cand` with the kept tokens and their weights, or returns
/// `false` when the largest logit is not finite (the caller takes the argmax). Every filter keeps
/// a set of the form "logit ≥ threshold" (ties at the boundary all stay), so the device finds
/// the same set by selecting thresholds:
/// - top-k keeps `l ≥ v_k`, the k-th largest finite logit (all finite ones when fewer);
/// - top-p keeps `l ≥ c`, the largest value whose head `{l ≥ c}` of the top-k set holds at least
///   `top_p` of the top-k set's mass (everything when rounding never gets there);
/// - min-p keeps `(l − max) / T ≥ floor`;
/// - a weight that underflows to 0 is dropped (it could never be drawn).
pub fn keep(
    f: &Filter,
    logits: &[f32],
    cand: &mut Vec<Cand>,
    scratch: &mut Vec<(u32, f32)>,
) -> bool {
    cand.clear();
    let Some(max) = max_non_nan(logits).filter(|m| m.is_finite()) else { return false };
    let v_k = match f.top_k {
        k if k > 0 && k < logits.len() => kth_largest(logits, k, scratch),
        _ => f32::NEG_INFINITY,
    };
    // The softmax normaliser over the top-k set (before min-p), which top-p needs.
    let mut z = 0f64;
    for (i, &l) in logits.iter().enumerate() {
        let kept_by_k = l >= v_k && l > f32::NEG_INFINITY;
        if !kept_by_k {
            continue; // NaN, −∞, or below the top-k threshold
        }
        let s = (l - max) * f.inv_t;
        let w = weight(s);
        z += w as f64;
        if s >= f.floor && w > 0.0 {
            cand.push(Cand { id: i as u32, logit: l, weight: w });
        }
    }
    if let Some(p) = f.top_p
        && let Some(c) = nucleus_cut(cand, p * z)
    {
        cand.retain(|x| x.logit >= c);
    }
    true
}

/// The k-th largest finite logit (−∞ when fewer than k are finite), in one pass: only values
/// above the running k-th best are collected, and the buffer is cut back to k whenever it fills
/// up, so a 201k vocabulary costs a comparison per entry.
fn kth_largest(logits: &[f32], k: usize, buf: &mut Vec<(u32, f32)>) -> f32 {
    buf.clear();
    let cap = k.saturating_mul(4).max(1024);
    let mut threshold = f32::NEG_INFINITY; // NaN and −∞ never pass
    for (i, &l) in logits.iter().enumerate() {
        if l > threshold {
            buf.push((i as u32, l));
            if buf.len() >= cap {
                buf.select_nth_unstable_by(k - 1, by_value_desc);
                buf.truncate(k);
                threshold = buf[k - 1].1;
            }
        }
    }
    if buf.len() < k {
        return f32::NEG_INFINITY;
    }
    buf.select_nth_unstable_by(k - 1, by_value_desc);
    buf[k - 1].1
}

/// Step 5: the logit `c` of the token at which the mass of the ranking (by logit, descending)
/// first reaches `target`, without sorting the vocabulary: probe the best 256 first (a peaked
/// distribution ends there), then bisect by selection, so even a flat distribution costs O(n).
/// `None` when the mass never reaches `target` (rounding, or min-p already removed the tail).
fn nucleus_cut(cand: &mut [Cand], target: f64) -> Option<f32> {
    const SMALL: usize = 256;
    // Invariant: cand[..lo] ranks above cand[lo..hi], which ranks above cand[hi..]; the mass
    // of cand[..lo] is `acc` < target; the cut lies in (lo, hi].
    let (mut lo, mut hi, mut acc) = (0, cand.len(), 0f64);
    loop {
        let len = hi - lo;
        if len <= SMALL {
            let part = &mut cand[lo..hi];
            part.sort_unstable_by(by_logit_desc);
            for c in part.iter() {
                acc += c.weight as f64;
                if acc >= target {
                    return Some(c.logit);
                }
            }
            return None;
        }
        let m = if lo == 0 { SMALL } else { len / 2 };
        cand[lo..hi].select_nth_unstable_by(m - 1, by_logit_desc);
        let mass: f64 = cand[lo..lo + m].iter().map(|c| c.weight as f64).sum();
        if acc + mass >= target {
            hi = lo + m;
        } else {
            acc += mass;
            lo += m;
        }
    }
}

/// The seed of draw `index` of a stream seeded `seed`: SplitMix64's finaliser over both, so
/// neighbouring indices and seeds give unrelated seeds.
pub fn draw_seed(seed: u64, index: u64) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    mix(mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15)) ^ index)
}

/// A stateful sampler: owns the draw counter and scratch buffers. One per generation stream.
///
/// Draw `i` of a stream is a function of `(seed, i)` alone ([`draw_seed`]), not of a running
/// RNG: the engine sets `i` to the index of the token being drawn ([`Sampler::seek`]), so a
/// speculative step that samples several positions at once and keeps only some of them draws
/// exactly what one-token steps would have drawn at those positions.
pub struct Sampler {
    cfg: SamplerConfig,
    /// Index of the next draw.
    index: u64,
    /// The kept tokens of the current draw.
    cand: Vec<Cand>,
    /// (id, logit) buffer of top-k's selection.
    scratch: Vec<(u32, f32)>,
    /// Distinct recent ids for the repetition penalty.
    recent: Vec<u32>,
    /// Occurrences of each id in the output, for the presence and frequency penalties.
    output: OutputCounts,
    /// This step's penalties, by id.
    penalties: Vec<Penalty>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Self {
        Sampler {
            cfg,
            index: 0,
            cand: Vec::new(),
            scratch: Vec::new(),
            recent: Vec::new(),
            output: OutputCounts::new(0),
            penalties: Vec::new(),
        }
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

    /// A seed for one draw made elsewhere (on the device): [`draw_seed`] of the config's seed
    /// and the current index, which then moves on by one.
    pub fn next_seed(&mut self) -> u64 {
        let seed = draw_seed(self.cfg.seed, self.index);
        self.index += 1;
        seed
    }

    /// Makes `index` the next draw's index (the engine: the index of the token being drawn in
    /// its reply).
    pub fn seek(&mut self, index: u64) {
        self.index = index;
    }

    /// Picks the next token (draw [`Sampler::seek`]'s index, then the index moves on by one).
    /// `logits` is modified in place (penalised); `history` is the ids so far (prompt and
    /// generated), most recent last. NaN logits are never picked.
    ///
    /// # Panics
    /// If `logits` is empty (a caller bug, not a data error).
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        match self.prepare(logits, history) {
            Some(id) => id,
            None => self.draw(),
        }
    }

    /// The distribution [`Sampler::sample`] draws from for this row and history: (id,
    /// probability) of every token it can pick, by id (one id with probability 1 where it takes
    /// the argmax). Penalises `logits` in place as `sample` does; draws nothing.
    pub fn distribution(&mut self, logits: &mut [f32], history: &[u32]) -> Vec<(u32, f64)> {
        let index = self.index;
        let decided = self.prepare(logits, history);
        self.index = index;
        if let Some(id) = decided {
            return vec![(id, 1.0)];
        }
        let total: f64 = self.cand.iter().map(|c| c.weight as f64).sum();
        let mut out: Vec<(u32, f64)> =
            self.cand.iter().map(|c| (c.id, c.weight as f64 / total)).collect();
        out.sort_by_key(|x| x.0);
        out
    }

    /// This step's penalties for `history` over a vocabulary of `vocab` ids (steps 1: the
    /// repetition penalty over the distinct ids of the recent window, then presence and
    /// frequency over the output), one entry per touched id.
    pub fn penalties(&mut self, history: &[u32], vocab: usize) -> &[Penalty] {
        self.penalties.clear();
        let factor = self.cfg.repeat_penalty;
        if factor != 1.0 && factor.is_finite() && factor > 0.0 && self.cfg.repeat_last_n > 0 {
            let start = history.len().saturating_sub(self.cfg.repeat_last_n);
            self.recent.clear();
            self.recent.extend(history[start..].iter().filter(|&&id| (id as usize) < vocab));
            self.recent.sort_unstable();
            self.recent.dedup();
            self.penalties.extend(self.recent.iter().map(|&id| Penalty { id, factor, sub: 0.0 }));
        }
        let (presence, frequency) = (self.cfg.presence_penalty, self.cfg.frequency_penalty);
        if presence != 0.0 || frequency != 0.0 {
            let repeated = self.penalties.len();
            for (id, n) in self.output.counts(history) {
                if id as usize >= vocab {
                    continue;
                }
                let sub = presence + frequency * n as f32;
                match self.penalties[..repeated].binary_search_by_key(&id, |p| p.id) {
                    Ok(i) => self.penalties[i].sub = sub,
                    Err(_) => self.penalties.push(Penalty { id, factor: 1.0, sub }),
                }
            }
        }
        &self.penalties
    }

    /// Penalises `logits`, then either decides (greedy, or no finite maximum: the argmax) or
    /// leaves the kept tokens in `cand`.
    fn prepare(&mut self, logits: &mut [f32], history: &[u32]) -> Option<u32> {
        assert!(!logits.is_empty(), "Sampler: empty logits");
        // A token decided without a draw still takes its index, so that the next draw's does
        // not depend on how this one was decided.
        let decided = |s: &mut Self, id: u32| {
            s.index += 1;
            Some(id)
        };
        self.penalties(history, logits.len());
        apply_penalties(logits, &self.penalties);
        if self.cfg.is_greedy() {
            return decided(self, argmax(logits));
        }
        // All −∞/NaN, or a +∞ that would swallow all the mass: the best-ranked id wins.
        let kept = keep(&self.cfg.filter(), logits, &mut self.cand, &mut self.scratch);
        if !kept || self.cand.is_empty() {
            return decided(self, argmax(logits));
        }
        None
    }

    /// Step 7: draw from the kept candidates in proportion to their weights.
    fn draw(&mut self) -> u32 {
        let u = StdRng::seed_from_u64(self.next_seed()).random::<f64>();
        let cand = &self.cand;
        let total: f64 = cand.iter().map(|c| c.weight as f64).sum();
        let u = u * total;
        let mut acc = 0f64;
        for c in cand {
            acc += c.weight as f64;
            if u < acc {
                return c.id;
            }
        }
        // Only reachable through rounding at the very top of the range.
        cand.iter().rev().find(|c| c.weight > 0.0).unwrap_or(&cand[0]).id
    }
}

/// Descending by value, ties by ascending id (so results do not depend on scan order).
fn by_value_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Descending by logit, ties by ascending id.
fn by_logit_desc(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
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
