//! Running a generation for a response: streamed as server-sent events (`data: {chunk}` lines,
//! `data: [DONE]` at the end, `: keep-alive` comments while nothing else is sent, e.g. during a
//! long prefill), or collected into one body. Every protocol shapes its reply from the same
//! event stream through one [`Shape`], streamed or whole. Both stop the generation as soon as
//! their client is gone: the streaming task watches its channel's receiver (dropped with the
//! connection), the collecting future is dropped with the connection. On shutdown a stream
//! ends with an error event and a collected request with 503.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use tokio::sync::mpsc;

use super::errors::ApiError;
use super::generation::{Job, Outcome, ReplyStream, Step};
use super::state::{AppState, Ready, Slot, shutdown_started};
use crate::chat::reply::Delta;

/// How one protocol shapes a reply from its [`Delta`]s: the events of a stream, or the whole
/// body. Both come from the same calls ([`Self::start`], [`Self::delta`] for each delta, then
/// [`Self::end`] for a stream or [`Self::body`] for a whole reply), so a streamed reply and a
/// whole one agree by construction.
pub trait Shape: Send + 'static {
    /// Events before any delta (chat: the assistant role; Responses: `response.created`).
    fn start(&mut self) -> Vec<Value>;
    /// The events of one delta (none, one, or several: a delta may close and open blocks).
    fn delta(&mut self, d: Delta) -> Vec<Value>;
    /// The events that end a stream: the finish reason, the usage when asked for.
    fn end(&mut self, outcome: &Outcome) -> Vec<Value>;
    /// The whole reply's body, in place of [`Self::end`] when the reply is not streamed.
    fn body(&mut self, outcome: &Outcome) -> Value;
    /// The SSE event that carries a chunk.
    fn event(&self, v: &Value) -> Event {
        Event::default().data(v.to_string())
    }
    /// What ends a stream that failed midway.
    fn failed(&mut self, e: &ApiError) -> Vec<Value> {
        vec![e.body()]
    }
    /// Whether a finished stream ends with `data: [DONE]`.
    fn done_marker(&self) -> bool {
        true
    }
    /// What is sent while nothing else is (a `: keep-alive` comment unless the API has an
    /// event for it).
    fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new().text("keep-alive")
    }
}

/// Who a request is, for its log line.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub id: String,
    pub endpoint: &'static str,
    pub started: Instant,
}

impl RequestLog {
    pub fn new(prefix: &str, endpoint: &'static str) -> Self {
        RequestLog {
            id: format!("{prefix}-{:016x}", rand::random::<u64>()),
            endpoint,
            started: Instant::now(),
        }
    }

    /// One line per request: id, status, tokens, TTFT, decode rate.
    pub fn done(&self, status: u16, o: &Outcome, streamed: bool) {
        tracing::info!(
            "{} {} {status} {}{} · prompt {} ({} cached) · {} tokens · TTFT {:.0} ms · {:.1} tok/s · {:.2} s",
            self.id,
            self.endpoint,
            o.finish.as_str(),
            if streamed { " (stream)" } else { "" },
            o.prompt_tokens,
            o.cached_tokens,
            o.completion_tokens,
            o.ttft.as_secs_f64() * 1e3,
            o.tok_s(),
            self.started.elapsed().as_secs_f64(),
        );
    }

    pub fn failed(&self, e: &ApiError) {
        tracing::info!("{} {} {} {}", self.id, self.endpoint, e.status.as_u16(), e.message);
    }

    pub fn disconnected(&self) {
        tracing::info!(
            "{} {} client disconnected after {:.2} s: generation cancelled",
            self.id,
            self.endpoint,
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// Streams the generation of `job` as SSE.
pub fn stream(
    state: Arc<AppState>,
    ready: Arc<Ready>,
    job: Job,
    mut shape: impl Shape,
    log: RequestLog,
    slot: Slot,
) -> Response {
    let (tx, rx) = mpsc::channel::<Event>(64);
    let keep_alive = shape.keep_alive().interval(Duration::from_secs(state.keep_alive));
    tokio::spawn(async move {
        let _slot = slot;
        match pump(&state, &ready, job, &mut shape, &tx, &log).await {
            Ok(Some(outcome)) => log.done(200, &outcome, true),
            Ok(None) => log.disconnected(),
            Err(e) => {
                log.failed(&e);
                for v in shape.failed(&e) {
                    let _ = tx.send(shape.event(&v)).await;
                }
            }
        }
    });
    Sse::new(Channel(rx)).keep_alive(keep_alive).into_response()
}

/// Runs the generation into the channel; `Ok(None)` when the client went away.
async fn pump(
    state: &AppState,
    ready: &Ready,
    job: Job,
    shape: &mut impl Shape,
    tx: &mpsc::Sender<Event>,
    log: &RequestLog,
) -> Result<Option<Outcome>, ApiError> {
    let mut generation = ReplyStream::start(ready, job, &state.metrics, log.started)?;
    let first = shape.start();
    if !send_all(tx, events(shape, first)).await {
        return Ok(None);
    }
    let shutdown = shutdown_started(state.shutdown.clone());
    tokio::pin!(shutdown);
    loop {
        let step = tokio::select! {
            _ = tx.closed() => return Ok(None),
            _ = &mut shutdown => return Err(ApiError::unavailable("the server is shutting down", 5)),
            step = generation.next() => step?,
        };
        let (deltas, outcome) = match step {
            Some(Step::Deltas(d)) => (d, None),
            Some(Step::Done { tail, outcome }) => (tail, Some(outcome)),
            None => return Err(ApiError::internal("the generation ended without finishing")),
        };
        for d in deltas {
            let chunks = shape.delta(d);
            if !send_all(tx, events(shape, chunks)).await {
                return Ok(None);
            }
        }
        if let Some(outcome) = outcome {
            let last = shape.end(&outcome);
            if !send_all(tx, events(shape, last)).await {
                return Ok(None);
            }
            if shape.done_marker() {
                let _ = tx.send(Event::default().data("[DONE]")).await;
            }
            return Ok(Some(outcome));
        }
    }
}

/// Sends chunks in order; false when the client is gone.
async fn send_all(tx: &mpsc::Sender<Event>, events: Vec<Event>) -> bool {
    for e in events {
        if tx.send(e).await.is_err() {
            return false;
        }
    }
    true
}

fn events(shape: &impl Shape, chunks: Vec<Value>) -> Vec<Event> {
    chunks.iter().map(|v| shape.event(v)).collect()
}

/// Runs the generation to its end through `shape`: its whole body. Dropped (client gone), it
/// cancels the generation.
pub async fn collect(
    state: &AppState,
    ready: &Ready,
    job: Job,
    mut shape: impl Shape,
    log: &RequestLog,
) -> Result<(Value, Outcome), ApiError> {
    let mut generation = ReplyStream::start(ready, job, &state.metrics, log.started)?;
    shape.start();
    let shutdown = shutdown_started(state.shutdown.clone());
    tokio::pin!(shutdown);
    loop {
        let step = tokio::select! {
            _ = &mut shutdown => return Err(ApiError::unavailable("the server is shutting down", 5)),
            step = generation.next() => step?,
        };
        match step {
            Some(Step::Deltas(d)) => d.into_iter().for_each(|d| drop(shape.delta(d))),
            Some(Step::Done { tail, outcome }) => {
                tail.into_iter().for_each(|d| drop(shape.delta(d)));
                return Ok((shape.body(&outcome), outcome));
            }
            None => return Err(ApiError::internal("the generation ended without finishing")),
        }
    }
}

/// A handler's result as the response: an error is logged and sent as an OpenAI error object.
pub fn respond(log: &RequestLog, result: Result<Response, ApiError>) -> Response {
    match result {
        Ok(r) => r,
        Err(e) => {
            log.failed(&e);
            e.into_response()
        }
    }
}

/// What every chunk of one response (and its non-streamed body) repeats: id, creation time,
/// model; and whether the client asked for usage, when each chunk carries `usage: null` and a
/// last chunk without choices carries the numbers.
pub struct ChunkHead {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

impl ChunkHead {
    pub fn new(log: &RequestLog, model: &str, include_usage: bool) -> Self {
        ChunkHead {
            id: log.id.clone(),
            created: crate::util::unix_now(),
            model: model.to_string(),
            include_usage,
        }
    }

    /// An `object` with these `choices`.
    pub fn frame(&self, object: &str, choices: Value) -> Value {
        let mut v = serde_json::json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if self.include_usage {
            v["usage"] = Value::Null;
        }
        v
    }

    /// The chunk that ends a stream with the usage, when it was asked for.
    pub fn usage_chunk(&self, object: &str, o: &Outcome) -> Option<Value> {
        self.include_usage.then(|| {
            let mut v = self.frame(object, serde_json::json!([]));
            v["usage"] = usage(o);
            v
        })
    }
}

/// `usage` of a response. The prediction counts are the verified draft tokens (a prediction's,
/// or the server's `--draft`): accepted ones were emitted as drafted, rejected ones were not.
pub fn usage(o: &Outcome) -> Value {
    serde_json::json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
        "completion_tokens_details": {
            "reasoning_tokens": o.reasoning_tokens,
            "accepted_prediction_tokens": o.accepted_draft_tokens,
            "rejected_prediction_tokens": o.draft_tokens - o.accepted_draft_tokens,
        },
    })
}

/// The receiving end of a stream's channel as the event stream axum sends.
struct Channel(mpsc::Receiver<Event>);

impl futures_core::Stream for Channel {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|e| e.map(Ok))
    }
}
