//! The reply's deltas as Anthropic content blocks: reasoning → `thinking`, answer and
//! preambles → `text`, calls → `tool_use`. [`ContentBlocks`] turns each delta into the stream's
//! `content_block_start`/`_delta`/`_stop` events and keeps the content they add up to, so the
//! streamed and the whole reply are the same blocks by construction.
//!
//! Errors on these paths are Anthropic's `{type: "error", error: {type, message}}`, with its
//! statuses ([`error_response`]).
//!
//! A thinking block carries an opaque `signature` (a keyed SHA-256 of its text), sent as one
//! `signature_delta` just before the block stops, as Anthropic sends it; clients send it back
//! and it is accepted without a check. A call's `input_json_delta` pieces join into its JSON
//! object; a call without arguments gets `{}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::super::errors::ApiError;
use super::super::generation::Outcome;
use crate::chat::reply::{Delta, FinishReason};

/// Mixed into the thinking signatures (which only this server reads, and never checks).
const SIGNATURE_KEY: &[u8] = b"inferno thinking signature v1\0";

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Text,
    Thinking,
    /// The call with this index among the reply's calls.
    Tool(usize),
}

struct Call {
    /// Its block's index in `content`.
    block: usize,
    args: String,
    closed: bool,
}

#[derive(Default)]
pub struct ContentBlocks {
    /// The content so far (a block's text grows as its deltas come).
    pub content: Vec<Value>,
    open: Option<Open>,
    calls: Vec<Call>,
}

impl ContentBlocks {
    /// The events `d` makes (none for log probabilities, which this API does not have).
    pub fn push(&mut self, d: Delta) -> Vec<Value> {
        let mut events = Vec::new();
        match d {
            Delta::Reasoning(t) => self.add_text(Open::Thinking, &t, &mut events),
            Delta::Content(t) => self.add_text(Open::Text, &t, &mut events),
            Delta::ToolStart { index, id, name } => {
                self.close(&mut events);
                let block =
                    json!({"type": "tool_use", "id": tool_id(&id), "name": name, "input": {}});
                let at = self.start(block, Open::Tool(index), &mut events);
                while self.calls.len() <= index {
                    self.calls.push(Call { block: at, args: String::new(), closed: false });
                }
                self.calls[index].block = at;
            }
            Delta::ToolArgs { index, text } => {
                let Some(call) = self.calls.get_mut(index).filter(|c| !c.closed) else {
                    return events; // the `{}` of a call already closed with `{}`
                };
                if !text.is_empty() {
                    call.args.push_str(&text);
                    events.push(delta(
                        call.block,
                        json!({"type": "input_json_delta", "partial_json": text}),
                    ));
                }
            }
            Delta::Logprobs(_) => {}
        }
        events
    }

    /// The events that close the last block.
    pub fn finish(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        self.close(&mut events);
        events
    }

    fn add_text(&mut self, kind: Open, text: &str, events: &mut Vec<Value>) {
        if text.is_empty() {
            return;
        }
        if self.open != Some(kind) {
            self.close(events);
            let block = match kind {
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            self.start(block, kind, events);
        }
        let at = self.content.len() - 1;
        let (key, delta_type) = if kind == Open::Thinking {
            ("thinking", "thinking_delta")
        } else {
            ("text", "text_delta")
        };
        let mut whole = self.content[at][key].as_str().unwrap_or_default().to_string();
        whole.push_str(text);
        self.content[at][key] = whole.into();
        events.push(delta(at, json!({"type": delta_type, key: text})));
    }

    fn start(&mut self, block: Value, kind: Open, events: &mut Vec<Value>) -> usize {
        let index = self.content.len();
        // Blocks start empty on the wire; their content comes as deltas.
        events.push(json!({"type": "content_block_start", "index": index, "content_block": block}));
        self.content.push(block);
        self.open = Some(kind);
        index
    }

    fn close(&mut self, events: &mut Vec<Value>) {
        let Some(kind) = self.open.take() else { return };
        let at = self.content.len() - 1;
        match kind {
            Open::Text => {}
            Open::Thinking => {
                let sig = signature(self.content[at]["thinking"].as_str().unwrap_or_default());
                self.content[at]["signature"] = sig.clone().into();
                events.push(delta(at, json!({"type": "signature_delta", "signature": sig})));
            }
            Open::Tool(i) => {
                let call = &mut self.calls[i];
                call.closed = true;
                if call.args.trim().is_empty() {
                    call.args = "{}".into();
                    events
                        .push(delta(at, json!({"type": "input_json_delta", "partial_json": "{}"})));
                }
                self.content[at]["input"] = tool_input(&call.args);
            }
        }
        events.push(json!({"type": "content_block_stop", "index": at}));
    }
}

fn delta(index: usize, d: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": d})
}

/// Anthropic's id shape for a call: `toolu_…`.
fn tool_id(id: &str) -> String {
    format!("toolu_{}", id.strip_prefix("call_").unwrap_or(id))
}

/// The arguments as the `input` object; text that is no JSON object (the model's mistake)
/// is kept under `_raw` rather than failing the reply or losing it.
fn tool_input(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            tracing::warn!("a tool call's arguments are not a JSON object: {args:.200}");
            json!({"_raw": args})
        }
    }
}

pub fn signature(thinking: &str) -> String {
    let mut h = Sha256::new();
    h.update(SIGNATURE_KEY);
    h.update(thinking.as_bytes());
    format!("inferno1{}", hex::encode(h.finalize()))
}

/// `stop_reason` and `stop_sequence`.
pub fn stop_reason(o: &Outcome) -> (&'static str, Value) {
    match (o.finish, &o.stop_string) {
        (FinishReason::ToolCalls, _) => ("tool_use", Value::Null),
        (FinishReason::Length, _) => ("max_tokens", Value::Null),
        (FinishReason::Stop, Some(s)) => ("stop_sequence", s.clone().into()),
        (FinishReason::Stop, None) => ("end_turn", Value::Null),
    }
}

/// `usage`: `input_tokens` is the part of the prompt not read from the prefix cache.
pub fn usage(o: &Outcome) -> Value {
    json!({
        "input_tokens": o.prompt_tokens.saturating_sub(o.cached_tokens),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": o.cached_tokens,
        "output_tokens": o.completion_tokens,
    })
}

/// The message object: `content` empty and no stop reason for `message_start`.
pub fn message(
    id: &str,
    model: &str,
    content: Vec<Value>,
    o: Option<&Outcome>,
    prompt: usize,
) -> Value {
    let (reason, sequence) = match o {
        Some(o) => {
            let (r, s) = stop_reason(o);
            (Value::from(r), s)
        }
        None => (Value::Null, Value::Null),
    };
    let usage = match o {
        Some(o) => usage(o),
        None => json!({"input_tokens": prompt, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 0, "output_tokens": 0}),
    };
    json!({
        "id": id, "type": "message", "role": "assistant", "model": model, "content": content,
        "stop_reason": reason, "stop_sequence": sequence, "usage": usage,
    })
}

/// Anthropic's `error.type` for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// The error as Anthropic's body; the field at fault leads the message (`max_tokens: …`).
pub fn error_body(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(p) if !e.message.starts_with(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": error_type(e.status), "message": message}})
}

/// An error on the Messages paths, in Anthropic's shape.
pub fn error_response(e: ApiError) -> Response {
    let mut resp = (e.status, axum::Json(error_body(&e))).into_response();
    if let Some(s) = e.retry_after {
        resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(deltas: Vec<Delta>) -> (Vec<Value>, Vec<Value>) {
        let mut b = ContentBlocks::default();
        let mut events: Vec<Value> = deltas.into_iter().flat_map(|d| b.push(d)).collect();
        events.extend(b.finish());
        (events, b.content)
    }

    #[test]
    fn thinking_text_and_a_call_become_blocks_in_order() {
        let (events, content) = run(vec![
            Delta::Reasoning("Let me ".into()),
            Delta::Reasoning("think.".into()),
            Delta::Content("Calling.".into()),
            Delta::ToolStart { index: 0, id: "call_ab0".into(), name: "f".into() },
            Delta::ToolArgs { index: 0, text: "{\"x\":".into() },
            Delta::ToolArgs { index: 0, text: " 1}".into() },
        ]);
        assert_eq!(content[0]["thinking"], "Let me think.");
        assert_eq!(content[0]["signature"], signature("Let me think."));
        assert_eq!(content[1], json!({"type": "text", "text": "Calling."}));
        assert_eq!(
            content[2],
            json!({"type": "tool_use", "id": "toolu_ab0", "name": "f", "input": {"x": 1}})
        );
        let types: Vec<&str> = events
            .iter()
            .map(|e| e["delta"]["type"].as_str().unwrap_or(e["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            types,
            [
                "content_block_start",
                "thinking_delta",
                "thinking_delta",
                "signature_delta",
                "content_block_stop",
                "content_block_start",
                "text_delta",
                "content_block_stop",
                "content_block_start",
                "input_json_delta",
                "input_json_delta",
                "content_block_stop",
            ]
        );
        // Blocks start empty on the wire.
        assert_eq!(events[0]["content_block"]["thinking"], "");
        assert_eq!(events[8]["content_block"]["input"], json!({}));
    }

    #[test]
    fn a_call_without_arguments_gets_one_empty_object() {
        let (events, content) = run(vec![
            Delta::ToolStart { index: 0, id: "call_a0".into(), name: "f".into() },
            Delta::ToolStart { index: 1, id: "call_a1".into(), name: "g".into() },
            Delta::ToolArgs { index: 1, text: "{}".into() },
            // The reader's `{}` for call 0, after its block closed with one.
            Delta::ToolArgs { index: 0, text: "{}".into() },
        ]);
        assert_eq!(content[0]["input"], json!({}));
        assert_eq!(content[1]["input"], json!({}));
        let pieces: Vec<(u64, &str)> = events
            .iter()
            .filter_map(|e| Some((e["index"].as_u64()?, e["delta"]["partial_json"].as_str()?)))
            .collect();
        assert_eq!(pieces, [(0, "{}"), (1, "{}")]);
    }
}
