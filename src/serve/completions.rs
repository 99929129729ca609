//! `POST /v1/completions`: a raw prompt (text, or token ids) continued as plain text, without
//! chat template or harmony parsing, whole or streamed as `text_completion` chunks. With
//! `logprobs: N`, each chunk carries its tokens' log probabilities in the legacy format.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::generation::{Delta, Job, Outcome};
use super::logprobs::{Entry, completion_json};
use super::openai_types::{CompletionRequest, parse};
use super::params::{clip_max_tokens, completion_logprobs, settings};
use super::sse::{self, ChunkHead, Chunker, RequestLog, usage};
use super::state::{AppState, Ready};
use super::{body_bytes, check_prompt, constraint, hooks};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("cmpl", "/v1/completions");
    let result = run(&state, body, &log).await;
    sse::respond(&log, result)
}

async fn run(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    log: &RequestLog,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(&body_bytes(body)?)?;
    state.model.check(req.common.model.as_deref())?;
    let ready = state.ready()?;
    let logprobs = completion_logprobs(req.logprobs.as_ref())?;
    if req.echo == Some(true) {
        return Err(ApiError::bad_param("echo", "echo is not supported by this server"));
    }
    if req.best_of.is_some_and(|b| b != 1) {
        return Err(ApiError::bad_param("best_of", "best_of other than 1 is not supported"));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::bad_param("suffix", "suffix (fill-in-the-middle) is not supported"));
    }
    // Raw text: the library's default sampling, whatever the model.
    let s = settings(&req.common, req.common.max_tokens, false)?;
    let prompt = prompt_ids(&ready, req.prompt.as_ref())?;
    // Raw text: never harmony, so the constraint covers the whole continuation.
    let structured = constraint::from_request(&req.common, None, None)?;
    let constraint = constraint::compile_plain(&ready, &structured)?;
    check_prompt(&ready, prompt.len())?;
    let slot = state.admit()?;
    let job = Job {
        max_tokens: clip_max_tokens(s.max_tokens, prompt.len(), ready.engine.context()),
        forced: hooks::forced_reply(state, &ready, &req.common)?,
        forced_prefix: hooks::forced_prefix(state, &ready, &req.common)?,
        prediction: Vec::new(),
        constraint,
        prompt,
        sampling: s.sampling,
        stop: s.stop,
        harmony: false,
        tools: Vec::new(),
        logprobs,
        token_ids: req.common.return_tokens_as_token_ids == Some(true),
    };
    let head = ChunkHead::new(log, &state.model.id, s.include_usage);
    let mut chunks =
        TextChunks { head, logprobs: logprobs.is_some(), pending: Vec::new(), offset: 0 };
    if s.stream {
        return Ok(sse::stream(state.clone(), ready, job, chunks, log.clone(), slot));
    }
    let (reply, outcome) = sse::collect(state, &ready, job, log).await?;
    drop(slot);
    log.done(200, &outcome, false);
    chunks.pending = reply.logprobs;
    let mut body = chunks.chunk(reply.content, Some(outcome.finish.as_str()));
    body["usage"] = usage(&outcome);
    Ok(axum::Json(body).into_response())
}

/// `prompt`: a string, a list of one string, token ids, or a list of one list of ids.
fn prompt_ids(ready: &Ready, prompt: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("prompt", m.to_string());
    let prompt = prompt.ok_or_else(|| bad("prompt is required"))?;
    let one = match prompt {
        Value::Array(items) if items.len() == 1 && !items[0].is_number() => &items[0],
        Value::Array(items) if items.len() > 1 && !items[0].is_number() => {
            return Err(bad("a list of prompts is not supported: send one prompt per request"));
        }
        other => other,
    };
    match one {
        Value::String(s) if s.is_empty() => Err(bad("the prompt is empty")),
        Value::String(s) => ready.text.encode_raw(s).map_err(|e| ApiError::from_anyhow(&e)),
        Value::Array(ids) => {
            let vocab = ready.engine.vocab_size() as u64;
            ids.iter()
                .map(|v| match v.as_u64() {
                    Some(id) if id < vocab => Ok(id as u32),
                    _ => Err(bad(&format!("token ids must be integers in [0, {vocab}), not {v}"))),
                })
                .collect()
        }
        _ => Err(bad("prompt must be a string or a list of token ids")),
    }
}

struct TextChunks {
    head: ChunkHead,
    /// The request asked for logprobs.
    logprobs: bool,
    /// Entries for the next chunk with text.
    pending: Vec<Entry>,
    /// Characters of the completion before the next entry (`text_offset`).
    offset: usize,
}

const OBJECT: &str = "text_completion";

impl TextChunks {
    /// A chunk with `text` and the log probabilities waiting (all of them in the whole body).
    fn chunk(&mut self, text: String, finish: Option<&str>) -> Value {
        let entries = std::mem::take(&mut self.pending);
        let logprobs = if self.logprobs && (!entries.is_empty() || finish.is_some()) {
            completion_json(&entries, &mut self.offset)
        } else {
            Value::Null
        };
        let choice =
            json!({"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish});
        self.head.frame(OBJECT, json!([choice]))
    }
}

impl Chunker for TextChunks {
    fn first(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn delta(&mut self, d: Delta) -> Option<Value> {
        match d {
            Delta::Content(t) => Some(self.chunk(t, None)),
            // They go out with the text that follows them (or with the last chunk).
            Delta::Logprobs(entries) => {
                self.pending.extend(entries);
                None
            }
            _ => None,
        }
    }

    fn last(&mut self, o: &Outcome) -> Vec<Value> {
        let last = self.chunk(String::new(), Some(o.finish.as_str()));
        std::iter::once(last).chain(self.head.usage_chunk(OBJECT, o)).collect()
    }
}
