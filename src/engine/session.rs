//! The generation loop: prompt ids in, streamed text out, with timings and the stop reason.
//!
//! Every generation is a request to the engine ([`Engine`]), which batches it with whatever
//! else runs; a chat re-renders the whole conversation every turn and the engine's prefix cache
//! runs only what it does not hold.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use tokenizers::Tokenizer;

use super::core::Engine;
use super::request::{Event, Request};
use crate::generate::{Generation, Sampler, StopChecker, StopConditions, StopReason, TokenStream};

/// A conversation's view of the engine: one request per turn. The KV cache lives in the
/// engine's pool, content-addressed: a turn whose prompt starts with an earlier turn's tokens
/// reuses their blocks (the prefix cache), exactly as a fresh run would compute them.
pub struct Session {
    engine: Engine,
}

impl Session {
    pub fn new(engine: Engine) -> Self {
        Session { engine }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Forget the conversation (`/clear`): nothing to do, the prefix cache only ever serves
    /// exact matches.
    pub fn reset(&mut self) {}

    /// Generates after `prompt`, calling `on_text` with each piece of text as soon as it may be
    /// shown. `interrupt` is polled between steps (Ctrl-C).
    pub fn generate(
        &mut self,
        tokenizer: &Tokenizer,
        prompt: &[u32],
        sampler: &mut Sampler,
        cond: StopConditions,
        interrupt: &Arc<AtomicBool>,
        on_text: &mut dyn FnMut(&str) -> anyhow::Result<()>,
    ) -> anyhow::Result<Generation> {
        let eos = cond.eos_ids.clone();
        let mut stop = StopChecker::new(cond);
        let mut stream = TokenStream::new(tokenizer);
        let max_tokens = stop.remaining();
        let mut text = String::new();
        let mut out = self.run(prompt, sampler, max_tokens, eos, interrupt, &mut |id| {
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

    /// The token loop under every generation: submits `prompt` to the engine and hands each
    /// sampled id to `on_token` until it returns a stop reason, `max_tokens` are made, the
    /// context is full or `interrupt` is set. `on_token` sees every sampled id (special tokens
    /// included).
    pub fn generate_tokens(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        interrupt: &Arc<AtomicBool>,
        on_token: &mut dyn FnMut(u32) -> anyhow::Result<Option<StopReason>>,
    ) -> anyhow::Result<Generation> {
        self.run(prompt, sampler, max_tokens, Vec::new(), interrupt, on_token)
    }

    fn run(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        eos_ids: Vec<u32>,
        interrupt: &Arc<AtomicBool>,
        on_token: &mut dyn FnMut(u32) -> anyhow::Result<Option<StopReason>>,
    ) -> anyhow::Result<Generation> {
        // Each turn draws its seed from the session's sampler: a seeded chat is reproducible
        // as a whole.
        let mut sampling = sampler.config().clone();
        sampling.seed = sampler.next_seed();
        let request = Request {
            prompt: prompt.to_vec(),
            sampling,
            max_tokens,
            eos_ids,
            interrupt: Some(interrupt.clone()),
            logprobs: None,
            forced: Vec::new(),
            constraint: None,
            prediction: Vec::new(),
        };
        let started = Instant::now();
        let mut handle = self.engine.submit(request)?;
        let mut tokens = Vec::new();
        let mut first = None;
        let mut stopped = None;
        let finish = loop {
            match handle.blocking_next() {
                Some(Event::Token(id, _)) => {
                    if stopped.is_some() {
                        continue; // sampled before the engine saw the cancellation
                    }
                    first.get_or_insert_with(|| started.elapsed());
                    tokens.push(id);
                    if let Some(reason) = on_token(id)? {
                        stopped = Some(reason);
                        handle.cancel();
                    }
                }
                Some(Event::Finished(f)) => break f,
                Some(Event::Failed(msg)) => return Err(anyhow::anyhow!(msg)),
                None => return Err(anyhow::anyhow!("the engine stopped during the generation")),
            }
        };
        let ttft = first.unwrap_or(finish.time_to_first_token);
        Ok(Generation {
            tokens,
            text: String::new(),
            reason: stopped.unwrap_or(finish.reason),
            prompt_tokens: finish.prompt_tokens,
            prefilled_tokens: finish.prompt_tokens - finish.cached_tokens,
            time_to_first_token: ttft,
            decode_time: started.elapsed().saturating_sub(ttft),
        })
    }
}
