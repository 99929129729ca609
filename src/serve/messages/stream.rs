//! Running a Messages generation: streamed as Anthropic sends it (every event an `event: X`
//! line and `data: {"type": "X", …}`, since the SDKs dispatch on the event name; `ping`s while
//! nothing else goes out; no `[DONE]`), or collected into one message. As for chat, a client
//! that goes away cancels the generation (the task sees its channel closed and drops the
//! [`ReplyStream`]); a failure after the 200 is an `error` event.

use axum::response::sse::{Event, KeepAlive};
use serde_json::{Value, json};

use super::super::errors::ApiError;
use super::super::generation::{Delta, Job, Outcome, ReplyStream, Step};
use super::super::sse::{Chunker, RequestLog};
use super::super::state::{AppState, Ready, shutdown_started};
use super::output::{self, ContentBlocks};

/// What the message object repeats: its id, the model name, the prompt's length.
pub struct MessageHead {
    pub id: String,
    pub model: String,
    pub prompt: usize,
}

/// A Messages stream as [`super::super::sse::stream`] runs it: `message_start`, each block's events,
/// `message_delta` with the stop reason and usage, `message_stop`.
pub struct Events {
    pub head: MessageHead,
    blocks: ContentBlocks,
}

impl Events {
    pub fn new(head: MessageHead) -> Self {
        Events { head, blocks: ContentBlocks::default() }
    }
}

impl Chunker for Events {
    fn first(&mut self) -> Vec<Value> {
        let h = &self.head;
        let start = output::message(&h.id, &h.model, Vec::new(), None, h.prompt);
        vec![json!({"type": "message_start", "message": start})]
    }

    fn delta(&mut self, _: Delta) -> Option<Value> {
        None // `deltas` is used: one delta may open, fill and close blocks
    }

    fn deltas(&mut self, d: Delta) -> Vec<Value> {
        self.blocks.push(d)
    }

    fn last(&mut self, o: &Outcome) -> Vec<Value> {
        let mut events = self.blocks.finish();
        let (reason, sequence) = output::stop_reason(o);
        events.push(json!({
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": output::usage(o),
        }));
        events.push(json!({"type": "message_stop"}));
        events
    }

    /// The SDKs dispatch on the event name: every event has one.
    fn event(&self, v: &Value) -> Event {
        let name = v["type"].as_str().unwrap_or("error").to_string();
        Event::default().event(name).data(v.to_string())
    }

    fn failed(&mut self, e: &ApiError) -> Vec<Value> {
        vec![super::error_body(e)]
    }

    fn done_marker(&self) -> bool {
        false
    }

    fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new().event(self.event(&json!({"type": "ping"})))
    }
}

/// The whole message, for a request that is not streamed. Dropped (client gone), it cancels
/// the generation.
pub async fn collect(
    state: &AppState,
    ready: &Ready,
    job: Job,
    head: &MessageHead,
    log: &RequestLog,
) -> Result<(Value, Outcome), ApiError> {
    let mut generation = ReplyStream::start(ready, job, &state.metrics, log.started)?;
    let mut blocks = ContentBlocks::default();
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
