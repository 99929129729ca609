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
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::generation::{Delta, Job, Outcome};
use super::logprobs::{Entry, chat_json};
use super::openai_types::{ChatRequest, parse};
use super::params::{chat_logprobs, clip_max_tokens, settings};
use super::sse::{self, ChunkHead, Chunker, Collected, RequestLog, usage};
use super::state::AppState;
use super::{body_bytes, check_prompt, constraint, hooks};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("chatcmpl", "/v1/chat/completions");
    let result = run(&state, body, &log).await;
    sse::respond(&log, result)
}

async fn run(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    log: &RequestLog,
) -> Result<Response, ApiError> {
    let req: ChatRequest = parse(&body_bytes(body)?)?;
    state.model.check(req.common.model.as_deref())?;
    let ready = state.ready()?;
    let logprobs = chat_logprobs(req.logprobs, req.top_logprobs)?;
    let s =
        settings(&req.common, req.max_completion_tokens.or(req.common.max_tokens), ready.harmony)?;
    if let Some(user) = &req.common.user {
        tracing::debug!("{} user {user:?}", log.id);
    }
    let date = req.common.x_inferno_date.as_deref().filter(|_| state.hooks);
    let structured =
        constraint::from_request(&req.common, req.tools.as_ref(), req.tool_choice.as_ref())?;
    let prompt = super::prompt::chat_prompt(&ready, &req, date, structured.format.as_ref())?;
    let constraint = constraint::compile(&ready, &structured)?;
    let echo_ids =
        (state.hooks && req.common.x_inferno_prompt_ids == Some(true)).then(|| prompt.clone());
    check_prompt(&ready, prompt.len())?;
    let slot = state.admit()?;
    let job = Job {
        max_tokens: clip_max_tokens(s.max_tokens, prompt.len(), ready.engine.context()),
        forced: hooks::forced_reply(state, &ready, &req.common)?,
        forced_prefix: hooks::forced_prefix(state, &ready, &req.common)?,
        prediction: super::params::prediction(&ready, req.prediction.as_ref())?,
        constraint,
        // Harmony has its own tool-call syntax, read by its parser.
        tools: if ready.harmony { Vec::new() } else { super::prompt::tool_names(&req) },
        prompt,
        sampling: s.sampling,
        stop: s.stop,
        harmony: ready.harmony,
        logprobs,
        token_ids: req.common.return_tokens_as_token_ids == Some(true),
    };
    let head = ChunkHead::new(log, &state.model.id, s.include_usage);
    let chunks = ChatChunks { head, logprobs: logprobs.is_some(), pending: Vec::new() };
    if s.stream {
        return Ok(sse::stream(state.clone(), ready, job, chunks, log.clone(), slot));
    }
    let (reply, outcome) = sse::collect(state, &ready, job, log).await?;
    drop(slot);
    log.done(200, &outcome, false);
    let mut body = chunks.response(reply, &outcome);
    if let Some(ids) = echo_ids {
        body["x_inferno_prompt_ids"] = ids.into();
    }
    Ok(axum::Json(body).into_response())
}

struct ChatChunks {
    head: ChunkHead,
    /// The request asked for logprobs.
    logprobs: bool,
    /// Entries for the next content chunk.
    pending: Vec<Entry>,
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

    /// The non-streamed body.
    fn response(&self, r: Collected, o: &Outcome) -> Value {
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

impl Chunker for ChatChunks {
    fn first(&mut self) -> Vec<Value> {
        vec![self.chunk(json!({"role": "assistant", "content": ""}), Value::Null, None)]
    }

    fn delta(&mut self, d: Delta) -> Option<Value> {
        let delta = match d {
            Delta::Reasoning(t) => json!({"reasoning_content": t, "reasoning": t}),
            Delta::Content(t) => {
                let logprobs = self.take_logprobs();
                return Some(self.chunk(json!({"content": t}), logprobs, None));
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
                return None;
            }
        };
        Some(self.chunk(delta, Value::Null, None))
    }

    fn last(&mut self, o: &Outcome) -> Vec<Value> {
        let logprobs = self.take_logprobs();
        let last = self.chunk(json!({}), logprobs, Some(o.finish.as_str()));
        std::iter::once(last).chain(self.head.usage_chunk(CHUNK, o)).collect()
    }
}
