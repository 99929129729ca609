//! The generation loop: prompt ids in, sampled ids out one by one, with timings and the stop
//! reason. No text: the front end reads the ids (`chat::reply`).
//!
//! Every generation is a request to the engine ([`Engine`]), which batches it with whatever
//! else runs; a chat re-renders the whole conversation every turn and the engine's prefix cache
//! runs only what it does not hold.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use super::core::Engine;
use super::request::{Event, Request};
use crate::generate::{Generation, Sampler, StopReason};

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

    /// [`Self::generate`] with no end-of-sequence ids: the engine stops only on the budget, the
    /// context or `on_token`'s word.
    pub fn generate_tokens(
        &mut self,
        prompt: &[u32],
        sampler: &mut Sampler,
        max_tokens: usize,
        interrupt: &Arc<AtomicBool>,
        on_token: &mut dyn FnMut(u32) -> anyhow::Result<Option<StopReason>>,
    ) -> anyhow::Result<Generation> {
        self.generate(prompt, sampler, max_tokens, Vec::new(), interrupt, on_token)
    }

    /// The token loop under every generation: submits `prompt` to the engine and hands each
    /// sampled id to `on_token` until it returns a stop reason, `max_tokens` are made, one of
    /// `eos_ids` is sampled (and handed on), the context is full or `interrupt` is set.
    /// `on_token` sees every sampled id (special tokens included); reading them as text is the
    /// reply reader's (`chat::reply`), so `text` is left empty.
    pub fn generate(
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
