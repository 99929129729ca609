//! Anthropic's Messages API, for Claude Code and the `anthropic` SDKs: `POST /v1/messages`
//! (whole or streamed) and `POST /v1/messages/count_tokens`. A request is translated into a
//! chat request ([`input`]) and runs through the pipeline `/v1/chat/completions` runs: the
//! same prompt rendering, engine and reply reader; only the reply's shape differs ([`output`],
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
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::constraint;
use super::errors::{ApiError, body_bytes};
use super::pipeline::{self, GenRequest, Input};
use super::sse::RequestLog;
use super::state::AppState;
use input::MessagesRequest;
pub use output::error_response;

pub async fn handle(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let log = RequestLog::new("msg", "/v1/messages");
    let result = async {
        let req = input::parse(&body_bytes(body)?, false)?;
        let model = req.chat.common.model.clone().filter(|m| !m.is_empty());
        let model = model.unwrap_or_else(|| state.model.id.clone());
        let id = log.id.replacen("msg-", "msg_", 1);
        pipeline::run(&state, convert(req)?, &log, |a| {
            stream::Events::new(stream::MessageHead { id, model, prompt: a.prompt_tokens })
        })
        .await
    };
    result.await.unwrap_or_else(|e| {
        log.failed(&e);
        error_response(e)
    })
}

/// A Messages request as the one request every endpoint runs: a chat, never with logprobs.
fn convert(req: MessagesRequest) -> Result<GenRequest, ApiError> {
    let chat = req.chat;
    let structured =
        constraint::from_parts(req.format, chat.tools.as_ref(), chat.tool_choice.as_ref())?;
    Ok(GenRequest { input: Input::Chat(chat), structured, logprobs: None })
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

#[cfg(test)]
mod tests {
    use super::output::error_body;
    use super::*;
    use serde_json::Value;

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
        assert!(r.chat.common.stream == Some(false) && r.format.is_none());
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
