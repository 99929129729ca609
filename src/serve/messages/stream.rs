//! Running a Messages generation: streamed as Anthropic sends it (every event an `event: X`
//! line and `data: {"type": "X", …}`, since the SDKs dispatch on the event name; `ping`s while
//! nothing else goes out; no `[DONE]`), or collected into one message. As for chat, a client
//! that goes away cancels the generation (the task sees its channel closed and drops the
//! [`Generation`]); a failure after the 200 is an `error` event.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::super::errors::ApiError;
use super::super::generation::{Generation, Job, Outcome, Step};
use super::super::sse::RequestLog;
use super::super::state::{AppState, Ready, Slot, shutdown_started};
use super::output::{self, Blocks};

/// What the message object repeats: its id, the model name, the prompt's length.
pub struct Head {
    pub id: String,
    pub model: String,
    pub prompt: usize,
}

fn event(v: Value) -> Event {
    let name = v["type"].as_str().unwrap_or("error").to_string();
    Event::default().event(name).data(v.to_string())
}

/// Streams the generation of `job` as Messages events.
pub fn stream(
    state: Arc<AppState>,
    ready: Arc<Ready>,
    job: Job,
    head: Head,
    log: RequestLog,
    slot: Slot,
) -> Response {
    let (tx, rx) = mpsc::channel::<Event>(64);
    let keep_alive = Duration::from_secs(state.keep_alive);
    tokio::spawn(async move {
        let _slot = slot;
        match pump(&state, &ready, job, &head, &tx, &log).await {
            Ok(Some(outcome)) => log.done(200, &outcome, true),
            Ok(None) => log.disconnected(),
            Err(e) => {
                log.failed(&e);
                let _ = tx.send(event(super::error_body(&e))).await;
            }
        }
    });
    let ping = event(json!({"type": "ping"}));
    Sse::new(Channel(rx))
        .keep_alive(KeepAlive::new().interval(keep_alive).event(ping))
        .into_response()
}

/// Runs the generation into the channel; `Ok(None)` when the client went away.
async fn pump(
    state: &AppState,
    ready: &Ready,
    job: Job,
    head: &Head,
    tx: &mpsc::Sender<Event>,
    log: &RequestLog,
) -> Result<Option<Outcome>, ApiError> {
    let mut generation = Generation::start(ready, job, &state.metrics, log.started)?;
    let start = output::message(&head.id, &head.model, Vec::new(), None, head.prompt);
    if tx.send(event(json!({"type": "message_start", "message": start}))).await.is_err() {
        return Ok(None);
    }
    let mut blocks = Blocks::default();
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
        let mut events: Vec<Value> = deltas.into_iter().flat_map(|d| blocks.push(d)).collect();
        if let Some(o) = &outcome {
            events.extend(blocks.finish());
            let (reason, sequence) = output::stop_reason(o);
            events.push(json!({
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": output::usage(o),
            }));
            events.push(json!({"type": "message_stop"}));
        }
        for e in events {
            if tx.send(event(e)).await.is_err() {
                return Ok(None);
            }
        }
        if outcome.is_some() {
            return Ok(outcome);
        }
    }
}

/// The whole message, for a request that is not streamed. Dropped (client gone), it cancels
/// the generation.
pub async fn collect(
    state: &AppState,
    ready: &Ready,
    job: Job,
    head: &Head,
    log: &RequestLog,
) -> Result<(Value, Outcome), ApiError> {
    let mut generation = Generation::start(ready, job, &state.metrics, log.started)?;
    let mut blocks = Blocks::default();
    let shutdown = shutdown_started(state.shutdown.clone());
    tokio::pin!(shutdown);
    loop {
        let step = tokio::select! {
            _ = &mut shutdown => return Err(ApiError::unavailable("the server is shutting down", 5)),
            step = generation.next() => step?,
        };
        match step {
            Some(Step::Deltas(deltas)) => {
                for d in deltas {
                    blocks.push(d);
                }
            }
            Some(Step::Done { tail, outcome }) => {
                for d in tail {
                    blocks.push(d);
                }
                blocks.finish();
                let body = output::message(
                    &head.id,
                    &head.model,
                    blocks.content,
                    Some(&outcome),
                    head.prompt,
                );
                return Ok((body, outcome));
            }
            None => return Err(ApiError::internal("the generation ended without finishing")),
        }
    }
}

/// The receiving end of a stream's channel as the event stream axum sends.
struct Channel(mpsc::Receiver<Event>);

impl futures_core::Stream for Channel {
    type Item = Result<Event, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|e| e.map(Ok))
    }
}
