//! The OpenAI Responses API (what Codex CLI speaks): `POST /v1/responses`, streamed as typed
//! events or not, `GET`/`DELETE /v1/responses/{id}` for stored responses and
//! `POST /v1/responses/input_tokens`. A request's input items are turned into chat messages
//! ([`input`]) and rendered (fitted to the context first), then run through the pipeline chat
//! completions runs; only the request's checks ([`request`]) and the output's shape
//! ([`output`]) are this API's own.
//! Responses created with `store` (OpenAI's default) are kept in memory ([`store`]) for
//! `previous_response_id`.

mod input;
mod output;
mod request;
mod store;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::constraint;
use super::errors::{ApiError, body_bytes};
use super::generation::Outcome;
use super::openai_types::{ChatRequest, parse};
use super::pipeline::{self, GenRequest, Input};
use super::sse::{self, RequestLog, Shape};
use super::state::AppState;
use crate::chat::reply::Delta;
use output::Builder;
use request::{Checked, ResponsesRequest};
pub use store::Store;

/// A request read and rendered.
struct Prepared {
    checked: Checked,
    chat: ChatRequest,
    /// The whole conversation's input items (a previous response's, then this input).
    items: Vec<Value>,
    prompt: Vec<u32>,
    /// `text.format` and the tools a forced `tool_choice` constrains the reply to.
    structured: constraint::ReplyConstraints,
}

fn prepare(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Prepared, ApiError> {
    let req: ResponsesRequest = parse(&body_bytes(body)?)?;
    state.model.check(req.common.model.as_deref())?;
    let ready = state.ready()?;
    let checked = request::check(&req)?;
    let mut items = match &checked.previous_response_id {
        None => Vec::new(),
        Some(id) => {
            let prev = state.responses.get(id).ok_or_else(|| {
                ApiError::bad_param(
                    "previous_response_id",
                    format!("no stored response has the id {id:?} (it was not stored, was deleted or is the oldest dropped)"),
                )
            })?;
            let mut v = prev.input;
            v.extend(prev.response["output"].as_array().cloned().unwrap_or_default());
            v
        }
    };
    items.extend(input::items(&req.input)?);
    if items.is_empty() {
        return Err(ApiError::bad_param("input", "input is empty"));
    }
    let mut common = req.common.clone();
    common.max_tokens = None;
    let mut chat = ChatRequest {
        common,
        messages: Vec::new(),
        max_completion_tokens: checked.max_output_tokens,
        logprobs: None,
        top_logprobs: None,
        tools: (!checked.tools.is_empty()).then(|| Value::Array(checked.tools.clone())),
        tool_choice: None,
        reasoning_effort: checked.effort.map(str::to_string),
        chat_template_kwargs: None,
        reasoning: None,
        prediction: None,
    };
    let date = chat.common.x_inferno_date.as_deref().filter(|_| state.hooks);
    let structured = constraint::from_parts(
        checked.text_format.clone(),
        chat.tools.as_ref(),
        req.tool_choice.as_ref(),
    )?;
    let context = ready.engine.context();
    let prompt = loop {
        chat.messages = input::messages(checked.instructions.as_deref(), &items)?;
        let prompt = super::prompt::chat_prompt(&ready, &chat, date, structured.format.as_ref())
            .map_err(as_input_error)?;
        if prompt.len() < context || !checked.truncate || !drop_oldest(&mut items) {
            break prompt;
        }
    };
    if prompt.len() >= context {
        let mut e = ApiError::bad_param(
            "input",
            format!(
                "the input is {} tokens; this model's context holds {context} (input and output): shorten it, pass truncation \"auto\", or restart the server with a larger --context",
                prompt.len()
            ),
        );
        e.code = Some("context_length_exceeded");
        return Err(e);
    }
    Ok(Prepared { checked, chat, items, prompt, structured })
}

/// `truncation: "auto"` (OpenAI's: input items dropped from the conversation's start): drops
/// the oldest turn that is not a system or developer message, with the items that belong to it
/// (up to the next user message, so a tool call goes with its output and the conversation still
/// opens with the user). The newest user message stays; `false` when nothing more can go.
fn drop_oldest(items: &mut Vec<Value>) -> bool {
    let role = |i: &Value| i.get("role").and_then(Value::as_str).unwrap_or("").to_string();
    let kept = |i: &Value| matches!(role(i).as_str(), "system" | "developer");
    let is_user = |i: &Value| role(i) == "user";
    let Some(first) = items.iter().position(|i| !kept(i)) else { return false };
    // The turn that starts at `first` ends before the next user message.
    let end = items[first + 1..].iter().position(is_user).map(|p| first + 1 + p);
    let Some(end) = end else { return false };
    let mut n = 0;
    items.retain(|i| {
        let here = n;
        n += 1;
        kept(i) || !(first..end).contains(&here)
    });
    true
}

/// Chat's errors name `messages`; here they are about `input`.
fn as_input_error(mut e: ApiError) -> ApiError {
    if e.param.as_deref() == Some("messages") {
        e.param = Some("input".into());
    }
    e
}

pub async fn create(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("resp", "/v1/responses");
    let result = run(&state, body, &log).await;
    sse::respond(&log, result)
}

async fn run(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    log: &RequestLog,
) -> Result<Response, ApiError> {
    let p = prepare(state, body)?;
    log_tool_outputs(log, &p.items);
    let id = log.id.replacen('-', "_", 1);
    let builder = Builder::new(id, state.model.id.clone(), p.checked.echo.clone());
    let keep = p.checked.store.then(|| (state.clone(), p.items));
    let req = GenRequest {
        input: Input::Rendered(p.chat, p.prompt),
        structured: p.structured,
        logprobs: None,
    };
    pipeline::run(state, req, log, |_| Events { builder, keep }).await
}

/// With `-v`: the tool results a request brings back (tests read them from the log).
fn log_tool_outputs(log: &RequestLog, items: &[Value]) {
    if !tracing::enabled!(tracing::Level::DEBUG) {
        return;
    }
    for item in items.iter().filter(|i| i["type"] == "function_call_output") {
        let out = item["output"].to_string();
        let out: String = out.chars().take(200).collect();
        tracing::debug!("{} function_call_output {} {out}", log.id, item["call_id"]);
    }
}

/// The stream's events; at the end the response is stored when asked.
struct Events {
    builder: Builder,
    keep: Option<(Arc<AppState>, Vec<Value>)>,
}

impl Events {
    fn finish(&mut self, o: &Outcome) -> (Vec<Value>, Value) {
        let (events, response) = self.builder.finish(o);
        if let Some((state, items)) = self.keep.take() {
            state.responses.put(self.builder.id.clone(), items, response.clone());
        }
        (events, response)
    }
}

impl Shape for Events {
    fn start(&mut self) -> Vec<Value> {
        self.builder.start()
    }

    fn delta(&mut self, d: Delta) -> Vec<Value> {
        self.builder.push(d)
    }

    fn end(&mut self, o: &Outcome) -> Vec<Value> {
        self.finish(o).0
    }

    fn body(&mut self, o: &Outcome) -> Value {
        self.finish(o).1
    }

    fn event(&self, v: &Value) -> Event {
        let kind = v["type"].as_str().unwrap_or("message");
        Event::default().event(kind).data(v.to_string())
    }

    fn failed(&mut self, e: &ApiError) -> Vec<Value> {
        self.builder.failed(e)
    }

    fn done_marker(&self) -> bool {
        false
    }
}

/// `POST /v1/responses/input_tokens`: the prompt's length, nothing generated.
pub async fn input_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match prepare(&state, body) {
        Ok(p) => {
            axum::Json(json!({"object": "response.input_tokens", "input_tokens": p.prompt.len()}))
                .into_response()
        }
        Err(e) => e.into_response(),
    }
}

fn missing(id: &str) -> ApiError {
    let mut e = ApiError::not_found(format!(
        "no stored response has the id {id:?} (it was not stored, was deleted or is the oldest dropped)"
    ));
    e.param = Some("response_id".into());
    e
}

/// `GET /v1/responses/{id}`.
pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match state.responses.get(&id) {
        Some(s) => axum::Json(s.response).into_response(),
        None => missing(&id).into_response(),
    }
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    if state.responses.delete(&id) {
        axum::Json(json!({"id": id, "object": "response.deleted", "deleted": true})).into_response()
    } else {
        missing(&id).into_response()
    }
}
