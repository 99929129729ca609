//! `POST /v1/completions`: a raw prompt (text, or token ids) continued as plain text, without
//! chat template or harmony parsing, whole or streamed as `text_completion` chunks. With
//! `logprobs: N`, each chunk carries its tokens' log probabilities in the legacy format.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use serde_json::{Value, json};

use super::constraint;
use super::errors::{ApiError, body_bytes};
use super::generation::Outcome;
use super::logprobs::completion_json;
use super::openai_types::{CompletionRequest, parse};
use super::params::completion_logprobs;
use super::pipeline::{self, GenRequest, Input};
use super::sse::{self, ChunkHead, RequestLog, Shape, usage};
use super::state::AppState;
use crate::chat::reply::{Delta, Entry};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("cmpl", "/v1/completions");
    let result = async {
        let req = convert(parse(&body_bytes(body)?)?)?;
        let logprobs = req.logprobs.is_some();
        pipeline::run(&state, req, &log, |a| {
            let head = ChunkHead::new(&log, &state.model.id, a.include_usage);
            TextChunks { head, logprobs, pending: Vec::new(), offset: 0, whole: Whole::default() }
        })
        .await
    };
    sse::respond(&log, result.await)
}

/// A completions body as the one request every endpoint runs: its raw prompt, never a chat.
fn convert(req: CompletionRequest) -> Result<GenRequest, ApiError> {
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
    let structured = constraint::from_request(&req.common, None, None)?;
    Ok(GenRequest { input: Input::Text(req.common, req.prompt), structured, logprobs })
}

/// The whole completion so far (the non-streamed body).
#[derive(Default)]
struct Whole {
    text: String,
    logprobs: Vec<Entry>,
}

struct TextChunks {
    head: ChunkHead,
    /// The request asked for logprobs.
    logprobs: bool,
    /// Entries for the next chunk with text.
    pending: Vec<Entry>,
    /// Characters of the completion before the next entry (`text_offset`).
    offset: usize,
    whole: Whole,
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

impl Shape for TextChunks {
    fn start(&mut self) -> Vec<Value> {
        Vec::new()
    }

    fn delta(&mut self, d: Delta) -> Vec<Value> {
        match d {
            Delta::Content(t) => {
                self.whole.text.push_str(&t);
                vec![self.chunk(t, None)]
            }
            // They go out with the text that follows them (or with the last chunk).
            Delta::Logprobs(entries) => {
                self.whole.logprobs.extend(entries.iter().cloned());
                self.pending.extend(entries);
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn end(&mut self, o: &Outcome) -> Vec<Value> {
        let last = self.chunk(String::new(), Some(o.finish.as_str()));
        std::iter::once(last).chain(self.head.usage_chunk(OBJECT, o)).collect()
    }

    /// The non-streamed body: one chunk with all the text and all the entries.
    fn body(&mut self, o: &Outcome) -> Value {
        let whole = std::mem::take(&mut self.whole);
        (self.pending, self.offset) = (whole.logprobs, 0);
        let mut body = self.chunk(whole.text, Some(o.finish.as_str()));
        body["usage"] = usage(o);
        body
    }
}
