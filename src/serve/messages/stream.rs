//! A Messages reply's shape: streamed as Anthropic sends it (every event an `event: X` line and
//! `data: {"type": "X", …}`, since the SDKs dispatch on the event name; `ping`s while nothing
//! else goes out; no `[DONE]`), or one message built from the same blocks. A failure after the
//! 200 is an `error` event.

use axum::response::sse::{Event, KeepAlive};
use serde_json::{Value, json};

use super::super::errors::ApiError;
use super::super::generation::Outcome;
use super::super::sse::Shape;
use super::output::{self, ContentBlocks};
use crate::chat::reply::Delta;

/// What the message object repeats: its id, the model name, the prompt's length.
pub struct MessageHead {
    pub id: String,
    pub model: String,
    pub prompt: usize,
}

/// A Messages reply: streamed, `message_start`, each block's events, `message_delta` with the
/// stop reason and usage, `message_stop`; whole, the message those events add up to.
pub struct Events {
    pub head: MessageHead,
    blocks: ContentBlocks,
}

impl Events {
    pub fn new(head: MessageHead) -> Self {
        Events { head, blocks: ContentBlocks::default() }
    }
}

impl Shape for Events {
    fn start(&mut self) -> Vec<Value> {
        let h = &self.head;
        let start = output::message(&h.id, &h.model, Vec::new(), None, h.prompt);
        vec![json!({"type": "message_start", "message": start})]
    }

    /// One delta may open, fill and close blocks.
    fn delta(&mut self, d: Delta) -> Vec<Value> {
        self.blocks.push(d)
    }

    fn end(&mut self, o: &Outcome) -> Vec<Value> {
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

    fn body(&mut self, o: &Outcome) -> Value {
        self.blocks.finish();
        let h = &self.head;
        let content = std::mem::take(&mut self.blocks.content);
        output::message(&h.id, &h.model, content, Some(o), h.prompt)
    }

    /// The SDKs dispatch on the event name: every event has one.
    fn event(&self, v: &Value) -> Event {
        let name = v["type"].as_str().unwrap_or("error").to_string();
        Event::default().event(name).data(v.to_string())
    }

    fn failed(&mut self, e: &ApiError) -> Vec<Value> {
        vec![output::error_body(e)]
    }

    fn done_marker(&self) -> bool {
        false
    }

    fn keep_alive(&self) -> KeepAlive {
        KeepAlive::new().event(self.event(&json!({"type": "ping"})))
    }
}
