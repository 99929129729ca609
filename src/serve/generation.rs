//! One request's generation, pulled step by step as its reply is shaped: submit the prompt to
//! the engine, read the sampled ids, and turn them into [`Delta`]s with the reply reader every
//! front end shares ([`crate::chat::reply`]: the model's chat format, or plain text for a raw
//! continuation). The same path `Session` takes for `play`, asynchronously, one per HTTP
//! request.
//!
//! Dropping a [`ReplyStream`] drops its [`RequestHandle`], which cancels the sequence at the
//! engine's next step: a handler whose client went away stops its generation by ending.

use std::time::{Duration, Instant};

use super::errors::ApiError;
use super::metrics::Metrics;
use super::state::Ready;
use crate::chat::reply::{self, Delta, FinishReason, ReplyFormat, ReplyOptions, TokenText};
use crate::engine::core::OUT_OF_MEMORY;
use crate::engine::request::{Event, Request, RequestHandle};
use crate::generate::{SamplerConfig, StopConditions, StopReason};

/// What one request asks the engine for (built by [`super::pipeline`] alone).
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplerConfig,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Read the reply in the model's chat format; else as plain text (a raw continuation).
    pub chat: bool,
    /// Names of the tools offered to a model whose format reads calls from the reply's text:
    /// a reply that is a call to one of them becomes tool calls. Empty: no calls are read.
    pub tools: Vec<String>,
    /// Log probabilities of each content token and this many alternatives.
    pub logprobs: Option<usize>,
    /// Show logprob tokens as `token_id:ID` (vLLM's `return_tokens_as_token_ids`).
    pub token_ids: bool,
    /// Test hook: the reply is these ids, not sampled ones (see `INFERNO_TEST_HOOKS`).
    pub forced: Option<Vec<u32>>,
    /// Test hook: the reply starts with these ids, then is sampled (empty: none).
    pub forced_prefix: Vec<u32>,
    /// Structured output: the grammar the reply follows ([`super::constraint::compile`]).
    pub constraint: Option<crate::engine::constraint::Constraint>,
    /// Predicted Outputs: ids the reply is expected to repeat (drafts; empty: none).
    pub prediction: Vec<u32>,
}

/// How a generation ended, with its counts and times.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub finish: FinishReason,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// The stop string that ended the reply, if one did.
    pub stop_string: Option<String>,
    /// Of the completion tokens, those of the reasoning's text (gpt-oss's analysis).
    pub reasoning_tokens: usize,
    /// Draft tokens verified (from a prediction or the server's drafter), and those accepted:
    /// `usage`'s `accepted_prediction_tokens` and `rejected_prediction_tokens`.
    pub draft_tokens: usize,
    pub accepted_draft_tokens: usize,
    pub ttft: Duration,
    /// From the first token to the last.
    pub decode: Duration,
}

impl Outcome {
    pub fn tok_s(&self) -> f64 {
        let n = self.completion_tokens.saturating_sub(1);
        if n == 0 { 0.0 } else { n as f64 / self.decode.as_secs_f64().max(1e-9) }
    }
}

pub enum Step {
    Deltas(Vec<Delta>),
    Done { tail: Vec<Delta>, outcome: Outcome },
}

/// One request's reply as its handler pulls it ([`Self::next`]): deltas as they come, then the
/// [`Outcome`].
pub struct ReplyStream<'r> {
    handle: RequestHandle,
    reader: Box<dyn ReplyFormat + Send + 'r>,
    /// Set when logprobs were asked for.
    text: Option<TokenText<'r>>,
    metrics: &'r Metrics,
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: usize,
    /// Set when this side decided the end (a stop string, harmony's end of turn).
    stopped: Option<StopReason>,
    done: bool,
}

impl<'r> ReplyStream<'r> {
    /// Submits the job; `started` is when the request arrived (for TTFT).
    pub fn start(
        ready: &'r Ready,
        job: Job,
        metrics: &'r Metrics,
        started: Instant,
    ) -> Result<Self, ApiError> {
        let tokenizer = &ready.text.tokenizer;
        let stop = StopConditions {
            eos_ids: ready.text.eos_ids.clone(),
            stop_strings: job.stop,
            max_tokens: job.max_tokens,
        };
        let opts = ReplyOptions { stop, tools: job.tools, raw: !job.chat };
        let reader = reply::reader(&ready.text, opts).map_err(|e| ApiError::from_anyhow(&e))?;
        let eos_ids = match &job.forced {
            // Forced ids: the engine must run exactly as many steps; the reader decides the end.
            Some(_) => Vec::new(),
            None => reader.stop_ids(),
        };
        let max_tokens = match &job.forced {
            Some(ids) => ids.len().min(job.max_tokens),
            None => job.max_tokens,
        };
        let request = Request {
            prompt: job.prompt,
            sampling: job.sampling,
            max_tokens,
            eos_ids,
            interrupt: None,
            logprobs: job.logprobs,
            forced: job.forced.unwrap_or(job.forced_prefix),
            constraint: job.constraint,
            prediction: job.prediction,
        };
        let handle = ready.engine.submit(request).map_err(|e| ApiError::from_anyhow(&e))?;
        Ok(ReplyStream {
            handle,
            reader,
            text: job.logprobs.map(|_| TokenText::new(tokenizer, job.token_ids)),
            metrics,
            started,
            first: None,
            last: None,
            tokens: 0,
            stopped: None,
            done: false,
        })
    }

    /// The next deltas, or the end; `Ok(None)` after the end.
    pub async fn next(&mut self) -> Result<Option<Step>, ApiError> {
        while !self.done {
            match self.handle.next().await {
                Some(Event::Token(id, scores)) => {
                    if self.stopped.is_some() {
                        continue; // sampled before the engine saw the cancellation
                    }
                    self.timing();
                    self.tokens += 1;
                    let entry = self.text.as_ref().zip(scores).map(|(t, s)| t.entry(&s));
                    let (deltas, stop) =
                        self.reader.push(id, entry).map_err(|e| ApiError::from_anyhow(&e))?;
                    if let Some(f) = stop {
                        self.stopped = Some(f);
                        self.handle.cancel();
                    }
                    if !deltas.is_empty() {
                        return Ok(Some(Step::Deltas(deltas)));
                    }
                }
                Some(Event::Finished(f)) => {
                    self.done = true;
                    let (tail, finish) = self
                        .reader
                        .finish(&f.reason, self.stopped.as_ref())
                        .map_err(|e| ApiError::from_anyhow(&e))?;
                    let now = Instant::now();
                    let first = self.first.unwrap_or(now);
                    let outcome = Outcome {
                        finish,
                        prompt_tokens: f.prompt_tokens,
                        cached_tokens: f.cached_tokens,
                        completion_tokens: self.tokens,
                        stop_string: self.reader.stop_string(),
                        reasoning_tokens: self.reader.reasoning_tokens(),
                        draft_tokens: f.draft_tokens,
                        accepted_draft_tokens: f.accepted_draft_tokens,
                        ttft: first.duration_since(self.started),
                        decode: self.last.unwrap_or(now).duration_since(first),
                    };
                    self.record(&outcome);
                    return Ok(Some(Step::Done { tail, outcome }));
                }
                Some(Event::Failed(msg)) => {
                    self.done = true;
                    // 503s: the request itself was fine (out of memory: it may succeed later).
                    return Err(
                        if msg.contains("shutting down") || msg.starts_with(OUT_OF_MEMORY) {
                            ApiError::unavailable(msg, 5)
                        } else {
                            ApiError::internal(format!("generation failed: {msg}"))
                        },
                    );
                }
                None => {
                    self.done = true;
                    return Err(ApiError::unavailable("the engine has stopped", 5));
                }
            }
        }
        Ok(None)
    }

    fn timing(&mut self) {
        let now = Instant::now();
        match self.last {
            None => {
                self.first = Some(now);
                self.metrics.ttft.observe(now.duration_since(self.started));
            }
            Some(last) => self.metrics.itl.observe(now.duration_since(last)),
        }
        self.last = Some(now);
    }

    fn record(&self, o: &Outcome) {
        use std::sync::atomic::Ordering::Relaxed;
        self.metrics.prompt_tokens.fetch_add(o.prompt_tokens as u64, Relaxed);
        self.metrics.cached_tokens.fetch_add(o.cached_tokens as u64, Relaxed);
        self.metrics.generated_tokens.fetch_add(o.completion_tokens as u64, Relaxed);
        self.metrics.count_finish(o.finish.as_str());
    }
}

impl Drop for ReplyStream<'_> {
    fn drop(&mut self) {
        if !self.done {
            // The handler is gone before the end: its client disconnected (or it failed).
            self.metrics.cancelled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
