//! One request's generation, pulled step by step by its handler: submit the prompt to the
//! engine, read the sampled ids, and turn them into [`Delta`]s with the shared output code:
//! the incremental detokenizer and stop strings for plain text, [`HarmonyReply`] for gpt-oss
//! (reasoning, answer and tool calls apart, no markup). The same path `Session` takes for
//! `play`, asynchronously, one per HTTP request.
//!
//! Dropping a [`Generation`] drops its [`RequestHandle`], which cancels the sequence at the
//! engine's next step: a handler whose client went away stops its generation by ending.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::errors::ApiError;
use super::metrics::Metrics;
use super::state::Ready;
use crate::chat::TurnEvent;
use crate::chat::harmony::HarmonyEncoding;
use crate::chat::harmony::tools::function_name;
use crate::chat::turn::HarmonyReply;
use crate::engine::request::{Event, Request, RequestHandle};
use crate::generate::{
    Generation as Stats, SamplerConfig, StopChecker, StopConditions, StopReason, TokenStream,
};

/// What one request asks the engine for.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplerConfig,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Parse the reply as harmony (chat with gpt-oss); else plain text.
    pub harmony: bool,
    /// Test hook: these ids replace the sampled ones (see `INFERNO_TEST_HOOKS`).
    pub forced: Option<Vec<u32>>,
}

/// A piece of the reply, as it streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// A tool call begins: its index among this reply's calls, its id, the function name.
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of a call's arguments (JSON text as the model writes it).
    ToolArgs {
        index: usize,
        text: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    ToolCalls,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// How a generation ended, with its counts and times.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub finish: Finish,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
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

pub struct Generation<'r> {
    handle: RequestHandle,
    reader: Reader<'r>,
    metrics: &'r Metrics,
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: usize,
    /// Set when this side decided the end (a stop string, harmony's end of turn).
    stopped: Option<Finish>,
    forced: Option<VecDeque<u32>>,
    done: bool,
}

impl<'r> Generation<'r> {
    /// Submits the job; `started` is when the request arrived (for TTFT).
    pub fn start(
        ready: &'r Ready,
        job: Job,
        metrics: &'r Metrics,
        started: Instant,
    ) -> Result<Self, ApiError> {
        let tokenizer = &ready.text.tokenizer;
        let reader = if job.harmony {
            let enc = HarmonyEncoding::new(tokenizer).map_err(|e| ApiError::from_anyhow(&e))?;
            Reader::Harmony(Box::new(HarmonyOut::new(enc, job.stop.clone())))
        } else {
            let cond = StopConditions {
                eos_ids: ready.text.eos_ids.clone(),
                stop_strings: job.stop.clone(),
                max_tokens: job.max_tokens,
            };
            let (stream, stop) = (TokenStream::new(tokenizer), StopChecker::new(cond));
            Reader::Plain { stream, stop, on_string: false }
        };
        let eos_ids = match (&job.forced, &reader) {
            // Forced ids: the engine must run exactly as many steps; the reader decides the end.
            (Some(_), _) => Vec::new(),
            (None, Reader::Harmony(h)) => h.stop_ids.clone(),
            (None, Reader::Plain { .. }) => ready.text.eos_ids.clone(),
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
        };
        let handle = ready.engine.submit(request).map_err(|e| ApiError::from_anyhow(&e))?;
        Ok(Generation {
            handle,
            reader,
            metrics,
            started,
            first: None,
            last: None,
            tokens: 0,
            stopped: None,
            forced: job.forced.map(VecDeque::from),
            done: false,
        })
    }

    /// The next deltas, or the end; `Ok(None)` after the end.
    pub async fn next(&mut self) -> Result<Option<Step>, ApiError> {
        while !self.done {
            match self.handle.next().await {
                Some(Event::Token(id)) => {
                    if self.stopped.is_some() {
                        continue; // sampled before the engine saw the cancellation
                    }
                    let id = self.forced.as_mut().and_then(VecDeque::pop_front).unwrap_or(id);
                    self.timing();
                    self.tokens += 1;
                    let (deltas, stop) =
                        self.reader.push(id).map_err(|e| ApiError::from_anyhow(&e))?;
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
                        .finish(&f.reason, self.stopped)
                        .map_err(|e| ApiError::from_anyhow(&e))?;
                    let now = Instant::now();
                    let first = self.first.unwrap_or(now);
                    let outcome = Outcome {
                        finish,
                        prompt_tokens: f.prompt_tokens,
                        cached_tokens: f.cached_tokens,
                        completion_tokens: self.tokens,
                        ttft: first.duration_since(self.started),
                        decode: self.last.unwrap_or(now).duration_since(first),
                    };
                    self.record(&outcome);
                    return Ok(Some(Step::Done { tail, outcome }));
                }
                Some(Event::Failed(msg)) => {
                    self.done = true;
                    return Err(if msg.contains("shutting down") {
                        ApiError::unavailable(msg, 5)
                    } else {
                        ApiError::internal(format!("generation failed: {msg}"))
                    });
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

impl Drop for Generation<'_> {
    fn drop(&mut self) {
        if !self.done {
            // The handler is gone before the end: its client disconnected (or it failed).
            self.metrics.cancelled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

fn finish_of(reason: &StopReason) -> Finish {
    match reason {
        StopReason::MaxTokens | StopReason::ContextFull => Finish::Length,
        _ => Finish::Stop,
    }
}

enum Reader<'r> {
    /// `on_string`: a stop string ended it (what follows it is never shown).
    Plain {
        stream: TokenStream<'r>,
        stop: StopChecker,
        on_string: bool,
    },
    Harmony(Box<HarmonyOut<'r>>),
}

impl Reader<'_> {
    fn push(&mut self, id: u32) -> anyhow::Result<(Vec<Delta>, Option<Finish>)> {
        match self {
            Reader::Plain { stream, stop, on_string } => {
                let piece = if stop.is_eos(id) { None } else { stream.push(id)? };
                let step = stop.push(id, piece.as_deref().unwrap_or(""));
                *on_string = matches!(step.stop, Some(StopReason::StopString(_)));
                let deltas = content(step.text);
                Ok((deltas, step.stop.as_ref().map(finish_of)))
            }
            Reader::Harmony(h) => h.push(id),
        }
    }

    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<Finish>,
    ) -> anyhow::Result<(Vec<Delta>, Finish)> {
        match self {
            Reader::Plain { stream, stop, on_string } => {
                let mut tail = String::new();
                if !*on_string {
                    tail = format!("{}{}", stop.finish(), stream.finish()?.unwrap_or_default());
                }
                Ok((content(tail), ours.unwrap_or_else(|| finish_of(engine))))
            }
            Reader::Harmony(h) => h.finish(engine, ours),
        }
    }
}

fn content(text: String) -> Vec<Delta> {
    if text.is_empty() { Vec::new() } else { vec![Delta::Content(text)] }
}

/// A harmony reply read into deltas: reasoning, answer (with stop strings applied), and tool
/// calls to `functions.NAME` with ids and indexes.
struct HarmonyOut<'r> {
    reply: HarmonyReply<'r>,
    stop_ids: Vec<u32>,
    /// Stop strings on the answer text (reasoning and arguments are not cut).
    answer: StopChecker,
    answer_stopped: bool,
    /// Per call made: whether any argument text came.
    calls: Vec<bool>,
    /// The message being read is a call with this index.
    current: Option<usize>,
    id_prefix: String,
}

/// An owned copy of a [`TurnEvent`].
enum Raw {
    Reasoning(String),
    Answer(String),
    ToolCall(String),
    ToolArgs(String),
    MessageEnd,
}

impl<'r> HarmonyOut<'r> {
    fn new(enc: HarmonyEncoding<'r>, stop: Vec<String>) -> Self {
        let cond =
            StopConditions { eos_ids: Vec::new(), stop_strings: stop, max_tokens: usize::MAX };
        HarmonyOut {
            reply: HarmonyReply::new(&enc),
            stop_ids: enc.stop_ids(),
            answer: StopChecker::new(cond),
            answer_stopped: false,
            calls: Vec::new(),
            current: None,
            id_prefix: format!("call_{:016x}", rand::random::<u64>()),
        }
    }

    fn push(&mut self, id: u32) -> anyhow::Result<(Vec<Delta>, Option<Finish>)> {
        let mut raw = Vec::new();
        let done = self.reply.push(id, &mut |e: &TurnEvent| {
            raw.push(owned(e));
            Ok(())
        })?;
        let deltas = self.convert(raw);
        let stop = if self.answer_stopped || done.is_some() { Some(Finish::Stop) } else { None };
        Ok((deltas, stop))
    }

    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<Finish>,
    ) -> anyhow::Result<(Vec<Delta>, Finish)> {
        let mut raw = Vec::new();
        let reason = if ours.is_some() { StopReason::Eos(0) } else { engine.clone() };
        let stats = Stats {
            tokens: Vec::new(),
            text: String::new(),
            reason,
            prompt_tokens: 0,
            prefilled_tokens: 0,
            time_to_first_token: Duration::ZERO,
            decode_time: Duration::ZERO,
        };
        let end = self.reply.finish(stats, &mut |e: &TurnEvent| {
            raw.push(owned(e));
            Ok(())
        })?;
        let mut tail = self.convert(raw);
        if !self.answer_stopped {
            let rest = self.answer.finish();
            if !rest.is_empty() {
                tail.push(Delta::Content(rest));
            }
        }
        // A call whose arguments never came: `{}`, so clients can parse them.
        for (index, had_args) in self.calls.iter().enumerate() {
            if !had_args {
                tail.push(Delta::ToolArgs { index, text: "{}".into() });
            }
        }
        let finish = if self.answer_stopped {
            Finish::Stop
        } else if end.awaiting_tool && !self.calls.is_empty() {
            Finish::ToolCalls
        } else if ours.is_some() {
            Finish::Stop
        } else {
            finish_of(engine)
        };
        Ok((tail, finish))
    }

    fn convert(&mut self, raw: Vec<Raw>) -> Vec<Delta> {
        let mut out = Vec::new();
        for r in raw {
            match r {
                Raw::Reasoning(t) => out.push(Delta::Reasoning(t)),
                Raw::Answer(t) if !self.answer_stopped => {
                    let step = self.answer.push(0, &t);
                    if !step.text.is_empty() {
                        out.push(Delta::Content(step.text));
                    }
                    self.answer_stopped = step.stop.is_some();
                }
                Raw::Answer(_) => {}
                Raw::ToolCall(recipient) => {
                    match function_name(&recipient).filter(|n| valid_name(n)) {
                        Some(name) => {
                            let index = self.calls.len();
                            self.calls.push(false);
                            self.current = Some(index);
                            let id = format!("{}{index}", self.id_prefix);
                            out.push(Delta::ToolStart { index, id, name: name.to_string() });
                        }
                        // A built-in tool (`browser.search`) or a garbled recipient: not a function
                        // call this API can report; its text is shown as reasoning.
                        None => self.current = None,
                    }
                }
                Raw::ToolArgs(text) => match self.current {
                    Some(index) => {
                        if !text.is_empty() {
                            self.calls[index] = true;
                        }
                        out.push(Delta::ToolArgs { index, text });
                    }
                    None => out.push(Delta::Reasoning(text)),
                },
                Raw::MessageEnd => self.current = None,
            }
        }
        out
    }
}

fn owned(e: &TurnEvent) -> Raw {
    match e {
        TurnEvent::Reasoning(t) => Raw::Reasoning(t.to_string()),
        TurnEvent::Answer(t) => Raw::Answer(t.to_string()),
        TurnEvent::ToolCall { recipient } => Raw::ToolCall(recipient.to_string()),
        TurnEvent::ToolArguments(t) => Raw::ToolArgs(t.to_string()),
        TurnEvent::MessageEnd(_) | TurnEvent::End(_) => Raw::MessageEnd,
    }
}

/// A function name as OpenAI allows it, so no markup or stray text ever becomes a tool name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}
