//! Anthropic's Messages API, for Claude Code and the `anthropic` SDKs: `POST /v1/messages`
//! (whole or streamed) and `POST /v1/messages/count_tokens`. A request is translated into a
//! chat request ([`input`]) and runs exactly as `/v1/chat/completions` does: the same prompt
//! rendering, engine and reply readers; only the reply's shape differs ([`output`],
//! [`stream`]). Errors on these paths are Anthropic's `{type: "error", error: {type,
//! message}}`, with its statuses.

mod input;
mod output;
mod stream;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::generation::Job;
use super::params::{clip_max_tokens, settings};
use super::sse::RequestLog;
use super::state::AppState;
use super::{body_bytes, check_prompt, hooks};

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("msg", "/v1/messages");
    run(&state, body, &log).await.unwrap_or_else(|e| {
        log.failed(&e);
        error_response(e)
    })
}

async fn run(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    log: &RequestLog,
) -> Result<Response, ApiError> {
    let req = input::parse(&body_bytes(body)?, false)?;
    let c = &req.chat.common;
    state.model.check(c.model.as_deref())?;
    let ready = state.ready()?;
    let s = settings(c, c.max_tokens, ready.harmony)?;
    if let Some(user) = &c.user {
        tracing::debug!("{} user {user:?}", log.id);
    }
    if req.format.is_some() {
        tracing::debug!("{} output_config.format: not enforced yet", log.id);
    }
    let prompt = super::prompt::chat_prompt(&ready, &req.chat, None)?;
    let echo_ids = (state.hooks && c.x_inferno_prompt_ids == Some(true)).then(|| prompt.clone());
    check_prompt(&ready, prompt.len())?;
    let slot = state.admit()?;
    let head = stream::Head {
        id: log.id.replacen("msg-", "msg_", 1),
        model: c.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| state.model.id.clone()),
        prompt: prompt.len(),
    };
    let job = Job {
        max_tokens: clip_max_tokens(s.max_tokens, prompt.len(), ready.engine.context()),
        forced: hooks::forced_reply(state, &ready, c)?,
        // Harmony has its own tool-call syntax, read by its parser.
        tools: if ready.harmony { Vec::new() } else { super::prompt::tool_names(&req.chat) },
        prompt,
        sampling: s.sampling,
        stop: s.stop,
        harmony: ready.harmony,
        logprobs: None,
        token_ids: false,
    };
    if req.stream {
        return Ok(stream::stream(state.clone(), ready, job, head, log.clone(), slot));
    }
    let (mut body, outcome) = stream::collect(state, &ready, job, &head, log).await?;
    if let Some(ids) = echo_ids {
        body["x_inferno_prompt_ids"] = ids.into();
    }
    drop(slot);
    log.done(200, &outcome, false);
    Ok(axum::Json(body).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's length as `/v1/messages` would render it.
pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let count = || -> Result<Response, ApiError> {
        let req = input::parse(&body_bytes(body)?, true)?;
        state.model.check(req.chat.common.model.as_deref())?;
        let ready = state.ready()?;
        let prompt = super::prompt::chat_prompt(&ready, &req.chat, None)?;
        Ok(axum::Json(json!({"input_tokens": prompt.len()})).into_response())
    };
    count().unwrap_or_else(error_response)
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

    #[test]
    fn errors_have_anthropics_shape() {
        let v = error_body(&ApiError::bad_param("max_tokens", "must be at least 1"));
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["message"], "max_tokens: must be at least 1");
        assert_eq!(error_body(&ApiError::unauthorized())["error"]["type"], "authentication_error");
        assert_eq!(error_body(&ApiError::unavailable("busy", 1))["error"]["type"], "overloaded_error");
        assert_eq!(error_body(&ApiError::internal("x"))["error"]["type"], "api_error");
    }
}
