//! Anthropic's Messages API, for Claude Code and the `anthropic` SDKs: `POST /v1/messages`
//! (whole or streamed) and `POST /v1/messages/count_tokens`. A request is translated into a
//! chat request ([`input`]) and runs exactly as `/v1/chat/completions` does: the same prompt
//! rendering, engine and reply readers; only the reply's shape differs ([`output`],
//! [`stream`]). Errors on these paths are Anthropic's `{type: "error", error: {type,
//! message}}`, with its statuses.

mod input;
mod options;
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
use super::{body_bytes, check_prompt, constraint, hooks};

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
    let structured = constraint::from_parts(
        req.format.clone(),
        req.chat.tools.as_ref(),
        req.chat.tool_choice.as_ref(),
    )?;
    let prompt = super::prompt::chat_prompt(&ready, &req.chat, None, structured.format.as_ref())?;
    let constraint = constraint::compile(&ready, &structured)?;
    let echo_ids = (state.hooks && c.x_inferno_prompt_ids == Some(true)).then(|| prompt.clone());
    check_prompt(&ready, prompt.len())?;
    let slot = state.admit()?;
    let head = stream::MessageHead {
        id: log.id.replacen("msg-", "msg_", 1),
        model: c.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| state.model.id.clone()),
        prompt: prompt.len(),
    };
    let job = Job {
        max_tokens: clip_max_tokens(s.max_tokens, prompt.len(), ready.engine.context()),
        forced: hooks::forced_reply(state, &ready, c)?,
        forced_prefix: hooks::forced_prefix(state, &ready, c)?,
        prediction: Vec::new(),
        constraint,
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
        let events = stream::Events::new(head);
        return Ok(super::sse::stream(state.clone(), ready, job, events, log.clone(), slot));
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
        let prompt = super::prompt::chat_prompt(&ready, &req.chat, None, req.format.as_ref())?;
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
        assert_eq!(
            error_body(&ApiError::unavailable("busy", 1))["error"]["type"],
            "overloaded_error"
        );
        assert_eq!(error_body(&ApiError::internal("x"))["error"]["type"], "api_error");
    }

    #[test]
    fn a_tool_loop_becomes_chat_messages() {
        let body = json!({
            "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Need it.", "signature": "x"},
                    {"type": "redacted_thinking", "data": "y"},
                    {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"c": "P"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "21", "is_error": true},
                    {"type": "text", "text": "And?", "cache_control": {"type": "ephemeral"}}]},
            ],
            "tools": [{"name": "w", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "context_management": {"edits": []}, "unknown": 1,
        });
        let r = input::parse(body.to_string().as_bytes(), false).unwrap();
        let roles: Vec<&str> = r.chat.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let a = &r.chat.messages[2];
        assert_eq!(a.reasoning_text(), Some("Need it."));
        let call = &a.tool_calls.as_ref().unwrap()[0];
        assert_eq!(
            (call.id.as_deref(), call.function.arguments_text()),
            (Some("toolu_1"), r#"{"c":"P"}"#.into())
        );
        let t = &r.chat.messages[3];
        assert_eq!(t.tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(t.content.as_ref().unwrap().text().unwrap(), "Error: 21");
        let tools = r.chat.tools.unwrap();
        assert_eq!(tools.as_array().unwrap().len(), 1, "the server tool is left out");
        assert_eq!(r.chat.reasoning_effort.as_deref(), Some("medium"));
        assert!(!r.stream && r.format.is_none());
    }

    #[test]
    fn effort_comes_from_output_config_then_thinking() {
        let effort = |extra: Value| {
            let mut body = json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            input::parse(body.to_string().as_bytes(), false)
                .map(|r| r.chat.reasoning_effort.unwrap())
        };
        assert_eq!(
            effort(json!({"thinking": {"type": "enabled", "budget_tokens": 1024}})).unwrap(),
            "low"
        );
        assert_eq!(
            effort(json!({"thinking": {"type": "enabled", "budget_tokens": 8000}})).unwrap(),
            "medium"
        );
        assert_eq!(
            effort(json!({"thinking": {"type": "adaptive", "display": "omitted"},
                                 "output_config": {"effort": "xhigh"}}))
            .unwrap(),
            "high"
        );
        assert_eq!(effort(json!({"thinking": {"type": "disabled"}})).unwrap(), "low");
        let e = effort(json!({"thinking": {"type": "enabled", "budget_tokens": 100}})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking.budget_tokens"));
        let schema = json!({"output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}});
        let mut body =
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut().unwrap().extend(schema.as_object().unwrap().clone());
        let r = input::parse(body.to_string().as_bytes(), false).unwrap();
        let want = crate::serve::constraint::ReplyFormat::JsonSchema {
            name: "response".into(),
            description: None,
            schema: json!({"type": "object"}),
        };
        assert_eq!(r.format, Some(want));
    }
}
