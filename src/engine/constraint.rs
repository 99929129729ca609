//! Constrained decoding: a request may carry a [`Constraint`] (a grammar's parser state, from
//! llguidance), and every step the engine asks it which tokens may come next, masks the other
//! logits of that request's row to -inf on the device before sampling, and commits the
//! sampled token back ([`super::core`]).
//!
//! - [`Grammars`] is built once per model: the token trie of its vocabulary ([`token_env`],
//!   each id's bytes from [`TokenBytes`], special tokens marked so that a grammar names them
//!   `<|end|>` and text can never produce them) and llguidance's parser factory. Compiling a
//!   grammar (JSON schema, regex or Lark) for a request costs little: llguidance builds its
//!   lexer lazily. Its limits bound the work: a schema too big to compile fails at request
//!   time (a 400), and a mask is bounded in lexer fuel and Earley items per step (a few ms at
//!   most), so a step never hangs on a grammar; a mask that fails or allows nothing ends that
//!   request with an error, not the engine.
//! - [`apply_masks`] writes the masks into the step's logits with candle ops: the constrained
//!   rows get an additive 0/-inf row (uploaded as one byte per token, turned into f32 on the
//!   device), added by `index_add`; the other rows are copied untouched, bit for bit, so a row
//!   without a constraint samples exactly what it would alone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use candle_core::Tensor;
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use tokenizers::Tokenizer;

use crate::tokenizer::bytes::TokenBytes;

/// The token trie of a vocabulary of `vocab` ids (the logits' width, which may exceed the
/// tokenizer's: ids without an entry are never allowed). Special tokens are written as
/// llguidance expects (`0xFF` then their text), so grammars can name them and text cannot
/// contain them. `eos` are the ids that end the generation: allowed once the grammar is done.
pub fn token_env(tokenizer: &Tokenizer, vocab: usize, eos: &[u32]) -> anyhow::Result<TokEnv> {
    let bytes = TokenBytes::new(tokenizer);
    let vocab = vocab.max(tokenizer.get_vocab_size(true));
    let words: Vec<Vec<u8>> = (0..vocab as u32)
        .map(|id| {
            let b = bytes.bytes(id);
            // End ids too: one written as plain text would otherwise end a reply mid-string.
            if (bytes.is_special(id) || eos.contains(&id)) && !b.is_empty() {
                [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &b].concat()
            } else {
                b
            }
        })
        .collect();
    let eos: Vec<u32> = eos.iter().copied().filter(|&e| (e as usize) < vocab).collect();
    let Some(&first) = eos.first() else {
        anyhow::bail!("structured output needs an end-of-sequence token, and this model has none")
    };
    let info = TokRxInfo::new(vocab as u32, first);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}

/// A model's grammar compiler: its token trie, llguidance's parser factory, and the grammars
/// compiled last, ready to clone.
pub struct Grammars {
    factory: ParserFactory,
    recent: Mutex<Recent>,
}

/// How many compiled grammars [`Grammars`] keeps: clients send the same few schemas (an app's
/// response format, an agent's tools) again and again.
const RECENT: usize = 64;

/// Compiled grammars by their JSON, oldest first.
#[derive(Default)]
struct Recent {
    order: VecDeque<String>,
    by_json: HashMap<String, Constraint>,
}

impl Grammars {
    /// For a model whose generation ends at `eos`.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, eos: &[u32]) -> anyhow::Result<Grammars> {
        let env = token_env(tokenizer, vocab, eos)?;
        let mut factory = ParserFactory::new_simple(&env).context("building the grammar engine")?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars { factory, recent: Mutex::default() })
    }

    /// A fresh parser state for `grammar`; an error says why it does not compile (too big, an
    /// unsupported schema feature, a syntax error, nothing allowed at the start).
    ///
    /// Its first mask is computed here, on the caller's thread: llguidance builds a lexer's
    /// states as masks need them, and the first mask of a new grammar (hundreds of ms for a
    /// JSON schema over a 128k vocabulary) would otherwise stall the engine's step, every
    /// stream's. A grammar seen lately is a clone of that warmed state.
    pub fn compile(&self, grammar: TopLevelGrammar) -> anyhow::Result<Constraint> {
        let key = serde_json::to_string(&grammar)?;
        if let Some(c) = self.lock().by_json.get(&key) {
            return Ok(c.clone());
        }
        let parser = self.factory.create_parser(grammar)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            anyhow::bail!("{e}");
        }
        let mut c = Constraint { matcher: Box::new(matcher) };
        c.mask()?;
        let mut recent = self.lock();
        if recent.by_json.insert(key.clone(), c.clone()).is_none() {
            recent.order.push_back(key);
            if recent.order.len() > RECENT
                && let Some(old) = recent.order.pop_front()
            {
                recent.by_json.remove(&old);
            }
        }
        Ok(c)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recent> {
        // A panic while holding it leaves a cache, still whole: keep using it.
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn vocab_size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }
}

/// llguidance's defaults, with the step limits that bound one mask's time (~15 ms worst case
/// at its documented speeds) and the grammar size a request may send.
fn limits() -> ParserLimits {
    ParserLimits {
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_grammar_size: 500_000,
        initial_lexer_fuel: 1_000_000,
        ..ParserLimits::default()
    }
}

/// One request's parser state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Box<Matcher>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Constraint {
    /// The tokens that may come next (the end-of-generation ids once the grammar is done).
    /// An error when the grammar failed or allows nothing.
    pub fn mask(&mut self) -> anyhow::Result<SimpleVob> {
        let m = self.matcher.compute_mask_or_eos();
        let m = match m {
            Ok(m) => m,
            Err(e) => anyhow::bail!("the output constraint failed: {e}"),
        };
        if m.num_set() == 0 {
            anyhow::bail!("the output constraint allows no token here");
        }
        Ok(m)
    }

    /// Moves the parser past `token` (sampled under its mask, or forced).
    pub fn commit(&mut self, token: u32) -> anyhow::Result<()> {
        if self.matcher.is_stopped() {
            // Past the grammar's end only the end-of-generation ids come (they stop the request).
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| anyhow::anyhow!("token {token} breaks the output constraint: {e}"))
    }
}

/// `logits` (`[R, vocab]` f32) with each `(row, mask)`'s disallowed tokens at -inf; rows not
/// listed are copied unchanged (bit for bit). A mask shorter than the row disallows the rest.
/// The masks go to the device as their bit words, and one kernel writes them
/// ([`crate::kernels::token_mask`]).
pub fn apply_masks(logits: &Tensor, masks: &[(usize, &SimpleVob)]) -> anyhow::Result<Tensor> {
    if masks.is_empty() {
        return Ok(logits.clone());
    }
    let rows = logits.dims2()?.0;
    let words = masks.iter().map(|(_, m)| m.as_slice().len()).max().unwrap_or(0).max(1);
    let mut which = vec![-1i32; rows];
    let mut bits = vec![0u32; masks.len() * words];
    for (i, (row, mask)) in masks.iter().enumerate() {
        anyhow::ensure!(*row < rows, "mask for row {row} of {rows}");
        which[*row] = i as i32;
        // Only the mask's own length counts: a token past it is disallowed, whatever the
        // spare bits of its last word hold.
        let len = mask.len();
        let w = &mask.as_slice()[..len.div_ceil(32).min(mask.as_slice().len())];
        let out = &mut bits[i * words..][..w.len()];
        out.copy_from_slice(w);
        if len % 32 != 0
            && let Some(last) = out.get_mut(len / 32)
        {
            *last &= (1u32 << (len % 32)) - 1;
        }
    }
    let dev = logits.device();
    let which = Tensor::from_vec(which, rows, dev)?;
    let bits = Tensor::from_vec(bits, (masks.len(), words), dev)?;
    Ok(crate::kernels::token_mask::token_mask(logits, &which, &bits)?)
}

/// The CPU reference of [`apply_masks`] for one row.
pub fn apply_mask_host(row: &mut [f32], mask: &SimpleVob) {
    for (t, v) in row.iter_mut().enumerate() {
        if t >= mask.len() || !mask.is_allowed(t as u32) {
            *v = f32::NEG_INFINITY;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use rand::{Rng, SeedableRng};

    /// Random logits and random masks on some rows: the masked rows equal the host reference,
    /// the other rows are the same bits as before.
    #[test]
    fn masks_apply_like_the_host_reference_and_leave_other_rows_alone() {
        let seed = rand::random::<u64>();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        for _ in 0..20 {
            let rows = rng.random_range(1..6);
            let vocab = rng.random_range(1..300);
            let data: Vec<f32> = (0..rows * vocab).map(|_| rng.random_range(-30.0..30.0)).collect();
            let logits = Tensor::from_vec(data.clone(), (rows, vocab), &Device::Cpu).unwrap();
            let mut masks = Vec::new();
            for r in 0..rows {
                if rng.random_bool(0.5) {
                    // Masks may be shorter than the row (ids beyond the tokenizer).
                    let len = rng.random_range(0..=vocab);
                    let mut m = SimpleVob::alloc(len);
                    for t in 0..len {
                        if rng.random_bool(0.3) {
                            m.allow_token(t as u32);
                        }
                    }
                    masks.push((r, m));
                }
            }
            let refs: Vec<(usize, &SimpleVob)> = masks.iter().map(|(r, m)| (*r, m)).collect();
            let out = apply_masks(&logits, &refs).unwrap().to_vec2::<f32>().unwrap();
            for (r, got) in out.iter().enumerate() {
                let mut want = data[r * vocab..(r + 1) * vocab].to_vec();
                if let Some((_, m)) = masks.iter().find(|(row, _)| *row == r) {
                    apply_mask_host(&mut want, m);
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&want), "seed {seed} row {r}");
            }
        }
    }
}
