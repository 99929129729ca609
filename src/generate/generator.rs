//! The generation loop: prompt ids in, streamed text out, with timings and the stop reason.
//!
//! The KV cache is reused across calls: a chat re-renders the whole conversation every turn, and
//! only the part after the longest common prefix with what the cache already holds is run.
//! Greedy decoding picks the token on the device (one id crosses to the host, not the logits).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokenizers::Tokenizer;

use super::{Sampler, StopChecker, StopConditions, StopReason, TokenStream};
use crate::error::{ErrorKind, fail};
use crate::models::CausalLm;

/// What one generation did.
#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens actually run (the rest came from the cache).
    pub prefilled_tokens: usize,
    pub time_to_first_token: Duration,
    pub decode_time: Duration,
}

impl Generation {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prefilled_tokens as f64 / self.time_to_first_token.as_secs_f64().max(1e-9)
    }
    /// Tokens after the first, over the time after the first.
    pub fn decode_tok_s(&self) -> f64 {
        let n = self.tokens.len().saturating_sub(1);
        if n == 0 { 0.0 } else { n as f64 / self.decode_time.as_secs_f64().max(1e-9) }
    }
}

/// A model with the token ids its KV cache currently holds.
pub struct Session {
    pub model: Box<dyn CausalLm>,
    cached: Vec<u32>,
}

impl Session {
    pub fn new(model: Box<dyn CausalLm>) -> Self {
        Session { model, cached: Vec::new() }
    }

    /// Forget the cache contents (e.g. `/clear`).
    pub fn reset(&mut self) {
        self.cached.clear();
    }

    /// Generates after `prompt`, calling `on_text` with each piece of text as soon as it may be
    /// shown. `interrupt` is polled between tokens (Ctrl-C).
    pub fn generate(
        &mut self,
        tokenizer: &Tokenizer,
        prompt: &[u32],
        sampler: &mut Sampler,
        cond: StopConditions,
        interrupt: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Generation> {
        let mut stop = StopChecker::new(cond);
        let mut stream = TokenStream::new(tokenizer);
        let max_tokens = stop.remaining();
        let mut text = String::new();
        let mut out = self.generate_tokens(prompt, sampler, max_tokens, interrupt, &mut |id| {
            let piece = if stop.is_eos(id) { None } else { stream.push(id)? };
            let step = stop.push(id, piece.as_deref().unwrap_or(""));
            if !step.text.is_empty() {
                text.push_str(&step.text);
                on_text(&step.text)?;
            }
            Ok(step.stop)
        })?;
        if !matches!(out.reason, StopReason::StopString(_)) {
            let tail = format!("{}{}", stop.finish(), stream.finish()?.unwrap_or_default());
            if !tail.is_empty() {
                text.push_str(&tail);
                on_text(&tail)?;
            }
        }
        out.text = text;
        Ok(out)
    }

    /// The token loop under every generation: runs the uncached part of `prompt`, then samples
    /// until `on_token` returns a stop reason, `max_tokens` are made, the context is full or
    /// `interrupt` is set. `on_token` sees every sampled id (special tokens included).
    pub fn generate_tokens(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        interrupt: &AtomicBool,
        on_token: &mut dyn FnMut(u32) -> anyhow::Result<Option<StopReason>>,
    ) -> anyhow::Result<Generation> {
        let context = self.model.context_length();
        if prompt.is_empty() {
            return Err(fail(ErrorKind::InvalidInput, "the prompt is empty"));
        }
        if prompt.len() >= context {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "the prompt is {} tokens, the context holds {context}: shorten it or raise --context",
                    prompt.len()
                ),
            ));
        }
        // The model may continue from an earlier position than the common prefix (a ring cache
        // that a longer reply overwrote): it re-runs those prompt tokens, exactly as fresh.
        let common = common_prefix(&self.cached, prompt).min(prompt.len() - 1);
        let reuse = match self.model.rewind(common) {
            Ok(r) => r.min(common),
            Err(e) => {
                self.cached.clear();
                return Err(e);
            }
        };
        self.cached.truncate(reuse);
        let started = Instant::now();
        let mut history = prompt.to_vec();
        let mut out = Generation {
            tokens: Vec::new(),
            text: String::new(),
            reason: StopReason::MaxTokens,
            prompt_tokens: prompt.len(),
            prefilled_tokens: prompt.len() - reuse,
            time_to_first_token: Duration::ZERO,
            decode_time: Duration::ZERO,
        };
        let mut pending: Vec<u32> = prompt[reuse..].to_vec();
        let mut pos = reuse;
        let reason = loop {
            if out.tokens.len() >= max_tokens {
                break StopReason::MaxTokens;
            }
            if interrupt.load(Ordering::Relaxed) {
                break StopReason::Interrupted;
            }
            if pos + pending.len() > context {
                break StopReason::ContextFull;
            }
            let logits = match self.model.forward_last(&pending, pos) {
                Ok(l) => l,
                Err(e) => {
                    // What the caches hold after a failed step is unknown: start over next time.
                    self.cached.clear();
                    return Err(e);
                }
            };
            self.cached.extend_from_slice(&pending);
            if out.tokens.is_empty() && pending.len() > 1 {
                // A prompt is in: the next turn's prompt usually diverges right here. (A prompt
                // that only adds a token to the cache keeps the earlier, likelier point.)
                self.model.checkpoint()?;
            }
            pos += pending.len();
            let id = if sampler.config().is_greedy() {
                crate::kernels::argmax(&logits)?.to_scalar::<u32>()?
            } else if sampler.config().is_plain_temperature() && logits.device().is_cuda() {
                // On the device: no copy of the logits, no 201k exponentials on the host.
                let seed = sampler.next_seed();
                crate::kernels::sample_gumbel(&logits, sampler.config().temperature, seed)?
                    .to_scalar::<u32>()?
            } else {
                let mut host = logits.to_vec1::<f32>()?;
                sampler.sample(&mut host, &history)
            };
            if out.tokens.is_empty() {
                out.time_to_first_token = started.elapsed();
            }
            history.push(id);
            out.tokens.push(id);
            if let Some(reason) = on_token(id)? {
                break reason;
            }
            pending.clear();
            pending.push(id);
        };
        out.decode_time = started.elapsed().saturating_sub(out.time_to_first_token);
        out.reason = reason;
        Ok(out)
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefix() {
        assert_eq!(super::common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(super::common_prefix(&[], &[1]), 0);
    }
}
