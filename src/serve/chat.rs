//! `POST /v1/chat/completions`: messages in, the assistant's reply out, whole or streamed as
//! `chat.completion.chunk`s. For gpt-oss the reply's reasoning goes in `reasoning_content`
//! (and, under the name other clients read, `reasoning`), the answer in `content`, function
//! calls in `tool_calls` (streamed: the first delta of a call carries its index, id and name,
//! later ones argument fragments). Other models' replies that are Llama-style tool calls
//! become `tool_calls` too. With `logprobs`, each chunk carries the log probabilities of its
//! content's tokens ([`super::logprobs`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::{Value, json};

use super::constraint;
use super::errors::{ApiError, body_bytes};
use super::generation::Outcome;
use super::logprobs::chat_json;
use super::openai_types::{ChatRequest, parse};
use super::params::chat_logprobs;
use super::pipeline::{self, GenRequest, Input};
use super::sse::{self, ChunkHead, RequestLog, Shape, usage};
use super::state::AppState;
use crate::chat::reply::{Delta, Entry};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("chatcmpl", "/v1/chat/completions");
    let result = async {
        let req = convert(parse(&body_bytes(body)?)?)?;
        let logprobs = req.logprobs.is_some();
        pipeline::run(&state, req, &log, |a| {
            let head = ChunkHead::new(&log, &state.model.id, a.include_usage);
            ChatChunks { head, logprobs, pending: Vec::new(), whole: Collected::default() }
        })
        .await
    };
    sse::respond(&log, result.await)
}

/// A chat completions body as the one request every endpoint runs.
fn convert(req: ChatRequest) -> Result<GenRequest, ApiError> {
    let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
    let structured =
        constraint::from_request(&req.common, req.tools.as_ref(), req.tool_choice.as_ref())?;
    Ok(GenRequest { input: Input::Chat(req), structured, logprobs })
}

struct ChatChunks {
    head: ChunkHead,
    /// The request asked for logprobs.
    logprobs: bool,
    /// Entries for the next content chunk.
    pending: Vec<Entry>,
    /// The reply so far (the whole body).
    whole: Collected,
}

const CHUNK: &str = "chat.completion.chunk";

impl ChatChunks {
    fn chunk(&self, delta: Value, logprobs: Value, finish: Option<&str>) -> Value {
        let choice =
            json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish});
        self.head.frame(CHUNK, json!([choice]))
    }

    /// The `logprobs` of the entries waiting (null when none are).
    fn take_logprobs(&mut self) -> Value {
        match std::mem::take(&mut self.pending) {
            e if e.is_empty() => Value::Null,
            e => chat_json(&e),
        }
    }
}

impl Shape for ChatChunks {
    fn start(&mut self) -> Vec<Value> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), Value::Null, None)]
    }

    fn delta(&mut self, d: Delta) -> Vec<Value> {
        self.whole.add(&d);
        let delta = match d {
            Delta::Reasoning(t) => json!({"reasoning_content": t, "reasoning": t}),
            Delta::Content(t) => {
                let logprobs = self.take_logprobs();
                return vec![self.chunk(json!({"content": t}), logprobs, None)];
            }
            Delta::ToolStart { index, id, name } => json!({"tool_calls": [{
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            }]}),
            Delta::ToolArgs { index, text } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
            }
            // They go out with the content that follows them (or with the last chunk).
            Delta::Logprobs(entries) => {
                self.pending.extend(entries);
                return Vec::new();
            }
        };
        vec![self.chunk(delta, Value::Null, None)]
    }

    fn end(&mut self, o: &Outcome) -> Vec<Value> {
        let logprobs = self.take_logprobs();
        let last = self.chunk(json!({}), logprobs, Some(o.finish.as_str()));
        std::iter::once(last).chain(self.head.usage_chunk(CHUNK, o)).collect()
    }

    /// The non-streamed body.
    fn body(&mut self, o: &Outcome) -> Value {
        let r = std::mem::take(&mut self.whole);
        let calls: Vec<Value> = r
            .calls
            .iter()
            .map(|(id, name, args)| {
                json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}})
            })
            .collect();
        let mut message = json!({"role": "assistant"});
        // With tool calls and no answer, `content` is null (as OpenAI sends it).
        message["content"] =
            if calls.is_empty() || !r.content.is_empty() { r.content.into() } else { Value::Null };
        if !r.reasoning.is_empty() {
            message["reasoning_content"] = r.reasoning.clone().into();
            message["reasoning"] = r.reasoning.into();
        }
        if !calls.is_empty() {
            message["tool_calls"] = calls.into();
        }
        let logprobs = if self.logprobs { chat_json(&r.logprobs) } else { Value::Null };
        let choice = json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": o.finish.as_str()});
        let mut body = self.head.frame("chat.completion", json!([choice]));
        body["usage"] = usage(o);
        body
    }
}

/// The whole reply as the non-streamed body writes it, added up from its deltas.
#[derive(Debug, Default)]
struct Collected {
    reasoning: String,
    content: String,
    /// (id, name, arguments)
    calls: Vec<(String, String, String)>,
    /// Of the content's tokens, when asked for.
    logprobs: Vec<Entry>,
}

impl Collected {
    fn add(&mut self, d: &Delta) {
        match d {
            Delta::Reasoning(t) => self.reasoning.push_str(t),
            Delta::Content(t) => self.content.push_str(t),
            Delta::ToolStart { id, name, .. } => {
                self.calls.push((id.clone(), name.clone(), String::new()))
            }
            Delta::ToolArgs { index, text } => {
                if let Some(c) = self.calls.get_mut(*index) {
                    c.2.push_str(text);
                }
            }
            Delta::Logprobs(entries) => self.logprobs.extend(entries.iter().cloned()),
        }
    }
}
