//! A Messages request body read field by field (so every 400 names its field, as Anthropic's
//! do) and translated into the chat structs the rest of the server renders: `system` and
//! mid-conversation `role: "system"` turns become system messages, `tool_use` blocks an
//! assistant message's `tool_calls`, `tool_result` blocks `role: "tool"` messages, `thinking`
//! blocks its reasoning (which the prompt keeps only inside an open tool loop). Unknown fields,
//! `cache_control`, `context_management` and `redacted_thinking` are ignored: Claude Code sends
//! new ones with every release and a proxy that rejects them breaks it.

use serde_json::{Map, Value, json};

use super::super::constraint::ReplyFormat;
use super::super::errors::ApiError;
use super::super::openai_types::{
    ChatMessage, ChatRequest, Common, Content, FunctionCallIn, StopField, ToolCallIn,
};
use super::options::{effort, output_format, tools};

/// A Messages request as the server runs it.
pub struct MessagesRequest {
    /// The conversation and its settings (`chat.common.stream` says whether to stream).
    pub chat: ChatRequest,
    /// `output_config.format`: the JSON schema the answer is constrained to.
    pub format: Option<ReplyFormat>,
}

/// `body` as a Messages request; `count`: the count_tokens body (no `max_tokens`, no `stream`).
pub fn parse(body: &[u8], count: bool) -> Result<MessagesRequest, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    let Value::Object(o) = value else {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    };
    let model = match o.get("model") {
        Some(Value::String(m)) => Some(m.clone()),
        None if count => None,
        _ => return Err(field("model", "model is required and must be a string")),
    };
    let max_tokens = match o.get("max_tokens") {
        Some(v) => match v.as_i64().filter(|&n| n >= 1) {
            Some(n) => Some(n),
            None => return Err(field("max_tokens", "max_tokens must be an integer of at least 1")),
        },
        None if count => None,
        None => return Err(field("max_tokens", "max_tokens is required")),
    };
    let stream = !count && opt_bool(&o, "stream")?.unwrap_or(false);
    let mut messages = system(o.get("system"))?;
    let Some(Value::Array(list)) = o.get("messages") else {
        return Err(field("messages", "messages is required and must be an array"));
    };
    if list.is_empty() {
        return Err(field("messages", "messages must not be empty"));
    }
    for (i, m) in list.iter().enumerate() {
        message(i, m, &mut messages)?;
    }
    let (tools, tool_choice) = tools(&o)?;
    let common = Common {
        model,
        stream: Some(stream),
        max_tokens,
        temperature: number(&o, "temperature", 0.0, false)?,
        top_p: number(&o, "top_p", 0.0, true)?,
        top_k: match o.get("top_k") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .filter(|&k| k >= 1)
                    .ok_or_else(|| field("top_k", "top_k must be a positive integer"))?,
            ),
        },
        stop: stop_sequences(o.get("stop_sequences"))?.map(StopField::Many),
        user: metadata(o.get("metadata"))?,
        // Test hook (see `hooks`): honoured only with `INFERNO_TEST_HOOKS=1`.
        x_inferno_force_reply: o
            .get("x_inferno_force_reply")
            .and_then(Value::as_str)
            .map(str::to_string),
        x_inferno_prompt_ids: o.get("x_inferno_prompt_ids").and_then(Value::as_bool),
        ..Common::default()
    };
    let format = output_format(o.get("output_config"))?;
    let chat = ChatRequest {
        common,
        messages,
        max_completion_tokens: None,
        logprobs: None,
        top_logprobs: None,
        tools,
        tool_choice,
        reasoning_effort: Some(effort(&o)?.to_string()),
        chat_template_kwargs: None,
        reasoning: None,
        prediction: None,
    };
    Ok(MessagesRequest { chat, format })
}

pub(super) fn field(name: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(name, message)
}

fn opt_bool(o: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(field(name, format!("{name} must be true or false"))),
    }
}

/// A number in `[lo, 1]` (`lo` itself excluded when `open`).
fn number(
    o: &Map<String, Value>,
    name: &str,
    lo: f64,
    open: bool,
) -> Result<Option<f64>, ApiError> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64().filter(|&x| x <= 1.0 && (x > lo || (!open && x == lo))) {
            Some(x) => Ok(Some(x)),
            None => {
                let range = if open { "(0, 1]" } else { "[0, 1]" };
                Err(field(name, format!("{name} must be a number in {range}, not {v}")))
            }
        },
    }
}

fn stop_sequences(v: Option<&Value>) -> Result<Option<Vec<String>>, ApiError> {
    let bad = || field("stop_sequences", "stop_sequences must be an array of strings");
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| s.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()
            .map(Some),
        Some(_) => Err(bad()),
    }
}

/// `metadata.user_id`, for the log.
fn metadata(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(m.get("user_id").and_then(Value::as_str).map(str::to_string)),
        Some(_) => Err(field("metadata", "metadata must be an object")),
    }
}

/// `system`: a string or text blocks, as the first system message.
fn system(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let text = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => text_blocks("system", blocks)?,
        Some(_) => {
            return Err(field("system", "system must be a string or an array of text blocks"));
        }
    };
    Ok(vec![chat_message("system", text)])
}

/// The text of blocks that may only be text (`system`, a system turn, a tool result).
fn text_blocks(at: &str, blocks: &[Value]) -> Result<String, ApiError> {
    let mut texts = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        match (kind(b), b.get("text").and_then(Value::as_str)) {
            ("text", Some(t)) => texts.push(t),
            (k, _) => return Err(unsupported(&format!("{at}[{j}]"), k)),
        }
    }
    Ok(texts.join("\n"))
}

fn kind(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

fn unsupported(at: &str, kind: &str) -> ApiError {
    let why = match kind {
        "image" | "document" => {
            format!("{kind} blocks are not supported: this model reads text only")
        }
        "" => "a content block needs a string `type` (and a string `text` for text)".to_string(),
        k => format!("blocks of type {k:?} are not supported here"),
    };
    field("messages", format!("{at}: {why}"))
}

pub(super) fn chat_message(role: &str, text: String) -> ChatMessage {
    ChatMessage {
        role: role.to_string(),
        content: Some(Content::Text(text)),
        name: None,
        tool_calls: None,
        tool_call_id: None,
        reasoning_content: None,
        reasoning: None,
    }
}

/// One Messages turn, as one or more chat messages appended to `out`.
fn message(i: usize, m: &Value, out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let at = format!("messages[{i}]");
    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
    let blocks = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => {
            return Err(field(
                "messages",
                format!("{at}: content must be a string or an array of blocks"),
            ));
        }
    };
    match role {
        "user" => user(&at, &blocks, out),
        "assistant" => assistant(&at, &blocks, out),
        "system" => {
            out.push(chat_message("system", text_blocks(&at, &blocks)?));
            Ok(())
        }
        r => Err(field(
            "messages",
            format!("{at}: role must be \"user\" or \"assistant\", not {r:?}"),
        )),
    }
}

/// A user turn: its tool results as tool messages and its text as a user message, in order.
fn user(at: &str, blocks: &[Value], out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let mut text: Vec<&str> = Vec::new();
    let flush = |text: &mut Vec<&str>, out: &mut Vec<ChatMessage>| {
        if !text.is_empty() {
            out.push(chat_message("user", std::mem::take(text).join("\n")));
        }
    };
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match kind(b) {
            "text" => text.push(str_field(&at, b, "text")?),
            "tool_result" => {
                flush(&mut text, out);
                out.push(tool_result(&at, b)?);
            }
            k => return Err(unsupported(&at, k)),
        }
    }
    flush(&mut text, out);
    Ok(())
}

fn str_field<'v>(at: &str, b: &'v Value, name: &str) -> Result<&'v str, ApiError> {
    b.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| field("messages", format!("{at}: {name} must be a string")))
}

/// A `tool_result` block as a `role: "tool"` message; an error result says so in its text.
fn tool_result(at: &str, b: &Value) -> Result<ChatMessage, ApiError> {
    let id = str_field(at, b, "tool_use_id")?;
    let text = match b.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_blocks(&format!("{at}.content"), parts)?,
        Some(_) => {
            return Err(field(
                "messages",
                format!("{at}: content must be a string or text blocks"),
            ));
        }
    };
    let text = match b.get("is_error") {
        Some(Value::Bool(true)) => format!("Error: {text}"),
        None | Some(Value::Null | Value::Bool(false)) => text,
        Some(_) => return Err(field("messages", format!("{at}: is_error must be true or false"))),
    };
    let mut m = chat_message("tool", text);
    m.tool_call_id = Some(id.to_string());
    Ok(m)
}

/// An assistant turn: thinking → reasoning, text → content, `tool_use` → tool calls.
fn assistant(at: &str, blocks: &[Value], out: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let (mut thinking, mut text, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        match kind(b) {
            "text" => text.push(str_field(&at, b, "text")?),
            // The signature is ours and opaque: accepted back without a check.
            "thinking" => thinking.push(str_field(&at, b, "thinking")?),
            "redacted_thinking" => {}
            "tool_use" => {
                let input = match b.get("input") {
                    Some(v @ Value::Object(_)) => v.to_string(),
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(_) => {
                        return Err(field("messages", format!("{at}: input must be an object")));
                    }
                };
                calls.push(ToolCallIn {
                    id: Some(str_field(&at, b, "id")?.to_string()),
                    function: FunctionCallIn {
                        name: str_field(&at, b, "name")?.to_string(),
                        arguments: Value::String(input),
                    },
                });
            }
            k => return Err(unsupported(&at, k)),
        }
    }
    let mut m = chat_message("assistant", text.join(""));
    m.reasoning_content = Some(thinking.join("\n")).filter(|t| !t.is_empty());
    m.tool_calls = Some(calls).filter(|c| !c.is_empty());
    out.push(m);
    Ok(())
}
