//! A request's prompt as ids: completions' raw text or ids ([`text_prompt`]), and a chat
//! request's `messages` (and `tools`, `reasoning_effort`) rendered by the code `inferno play`
//! uses: harmony for gpt-oss ([`HarmonyChat`], tools as the `functions`
//! namespace exactly as `openai-harmony` writes it), the model's own chat template otherwise.
//!
//! Harmony history rules: `system` and `developer` messages become the developer
//! instructions (as `play --system` does); an assistant message's reasoning (given as
//! `reasoning_content` or `reasoning`) is sent back while its turn is still inside tool calls and
//! dropped once a later final answer closed the turn; content beside `tool_calls` is the
//! commentary preamble; `role: tool` results are matched to their calls by `tool_call_id`.

use std::time::SystemTime;

use serde_json::{Value, json};

use super::constraint::{ReplyFormat, ToolChoice, harmony_section};
use super::errors::ApiError;
use super::openai_types::{ChatMessage, ChatRequest};
use super::state::Ready;
use crate::chat::harmony::tools::tools_from_openai;
use crate::chat::harmony::{HarmonyChat, HarmonyEncoding, ReasoningEffort, SystemConfig};
use crate::chat::reply::valid_name;

/// The prompt ids of a chat request.
/// `date`: the harmony system message's date instead of today's (a test hook).
/// `format`: the structured output's format, written in harmony's developer message.
pub fn chat_prompt(
    ready: &Ready,
    req: &ChatRequest,
    date: Option<&str>,
    format: Option<&ReplyFormat>,
) -> Result<Vec<u32>, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must not be empty"));
    }
    let tools = tools_in(req)?;
    if ready.harmony {
        harmony_prompt(ready, req, tools, date, format)
    } else {
        template_prompt(ready, req, tools)
    }
}

/// The `tools` to render: none when absent, empty or `tool_choice: "none"`.
/// A `"required"` or named choice is enforced by the reply's grammar ([`super::constraint`]).
fn tools_in(req: &ChatRequest) -> Result<Option<&Value>, ApiError> {
    if ToolChoice::from_openai(req.tool_choice.as_ref())? == ToolChoice::None {
        return Ok(None);
    }
    Ok(req.tools.as_ref().filter(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty())))
}

/// Names of the function tools a request offers (none with `tool_choice: "none"`): the calls
/// a plain model's reply may make.
pub fn tool_names(req: &ChatRequest) -> Vec<String> {
    let Ok(Some(Value::Array(tools))) = tools_in(req) else { return Vec::new() };
    tools
        .iter()
        .filter_map(|t| t.get("function")?.get("name")?.as_str())
        .filter(|n| valid_name(n))
        .map(str::to_string)
        .collect()
}

fn effort(req: &ChatRequest) -> Result<ReasoningEffort, ApiError> {
    let asked = req
        .reasoning_effort
        .as_deref()
        .or(req.reasoning.as_ref().and_then(|r| r.effort.as_deref()));
    match asked {
        None => Ok(ReasoningEffort::default()),
        Some(e) => e
            .parse()
            .map_err(|e: anyhow::Error| ApiError::bad_param("reasoning_effort", e.to_string())),
    }
}

fn text_of(m: &ChatMessage) -> Result<String, ApiError> {
    m.content.as_ref().map_or(Ok(String::new()), |c| c.text())
}

fn harmony_prompt(
    ready: &Ready,
    req: &ChatRequest,
    tools: Option<&Value>,
    date: Option<&str>,
    format: Option<&ReplyFormat>,
) -> Result<Vec<u32>, ApiError> {
    let enc = HarmonyEncoding::new(&ready.text.tokenizer).map_err(|e| ApiError::from_anyhow(&e))?;
    let mut system = SystemConfig { reasoning: effort(req)?, ..SystemConfig::default() }
        .with_date(SystemTime::now());
    if let Some(d) = date {
        system.current_date = Some(d.to_string());
    }
    let mut instructions = Vec::new();
    for m in req.messages.iter().filter(|m| m.role == "system" || m.role == "developer") {
        instructions.push(text_of(m)?);
    }
    let instructions = instructions.into_iter().filter(|s| !s.is_empty()).collect::<Vec<_>>();
    let mut chat =
        HarmonyChat::new(system, (!instructions.is_empty()).then(|| instructions.join("\n\n")));
    if let Some(t) = tools {
        chat.set_tools(
            tools_from_openai(t).map_err(|e| ApiError::bad_param("tools", e.to_string()))?,
        );
    }
    chat.response_formats = harmony_section(format);
    let mut generated_ids = 0;
    for (i, m) in req.messages.iter().enumerate() {
        let bad = |e: anyhow::Error| ApiError::bad_param("messages", format!("messages[{i}]: {e}"));
        match m.role.as_str() {
            "system" | "developer" => {}
            "user" => chat.push_user(&text_of(m)?),
            "assistant" => {
                if let Some(r) = m.reasoning_text() {
                    chat.push_assistant_reasoning(r);
                }
                let text = text_of(m)?;
                let calls = m.tool_calls.as_deref().unwrap_or_default();
                if calls.is_empty() {
                    if !text.is_empty() {
                        chat.push_assistant_final(&text);
                    }
                    continue;
                }
                if !text.is_empty() {
                    chat.push_assistant_preamble(&text);
                }
                for c in calls {
                    if !valid_name(&c.function.name) {
                        return Err(ApiError::bad_param(
                            "messages",
                            format!(
                                "messages[{i}]: tool call name {:?} is invalid",
                                c.function.name
                            ),
                        ));
                    }
                    let id = c.id.clone().unwrap_or_else(|| {
                        generated_ids += 1;
                        format!("call_input_{generated_ids}")
                    });
                    chat.push_tool_call(&id, &c.function.name, &c.function.arguments_text())
                        .map_err(bad)?;
                }
            }
            "tool" => {
                let id = match &m.tool_call_id {
                    Some(id) => id.clone(),
                    // Without an id, the one call still waiting for a result.
                    None => {
                        let pending: Vec<String> =
                            chat.pending_calls().map(|(id, _)| id.to_string()).collect();
                        match pending.as_slice() {
                            [one] => one.clone(),
                            _ => {
                                return Err(ApiError::bad_param(
                                    "messages",
                                    format!("messages[{i}]: a tool message needs tool_call_id"),
                                ));
                            }
                        }
                    }
                };
                chat.push_tool_result(&id, &text_of(m)?).map_err(bad)?;
            }
            other => return Err(unknown_role(i, other)),
        }
    }
    chat.prompt_ids(&enc).map_err(|e| ApiError::from_anyhow(&e))
}

fn unknown_role(i: usize, role: &str) -> ApiError {
    ApiError::bad_param(
        "messages",
        format!(
            "messages[{i}]: unknown role {role:?} (use system, developer, user, assistant or tool)"
        ),
    )
}

fn template_prompt(
    ready: &Ready,
    req: &ChatRequest,
    tools: Option<&Value>,
) -> Result<Vec<u32>, ApiError> {
    let template = ready.text.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "this model has no chat template: use /v1/completions with a raw prompt",
        )
    })?;
    // Mistral's templates take call ids of 9 letters and digits only.
    let mistral = crate::chat::reply::mistral::speaks(&ready.text.tokenizer);
    let call_id = |id: &str| match mistral {
        true => crate::chat::reply::mistral::template_call_id(id),
        false => id.to_string(),
    };
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.iter().enumerate() {
        let role = match m.role.as_str() {
            // Templates know `system`; OpenAI's `developer` is its newer name.
            "developer" => "system",
            r @ ("system" | "user" | "assistant" | "tool") => r,
            other => return Err(unknown_role(i, other)),
        };
        // Exactly `play`'s message shape when there is nothing more.
        let mut msg = json!({"role": role, "content": text_of(m)?});
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_empty()) {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| {
                    // Templates (Llama 3.1's) write `arguments | tojson`: a parsed object renders
                    // as the model was trained; text that is not JSON stays text.
                    let args = c.function.arguments_text();
                    let args = serde_json::from_str::<Value>(&args).unwrap_or(Value::String(args));
                    json!({"id": c.id.as_deref().map(call_id), "type": "function", "function": {"name": c.function.name, "arguments": args}})
                })
                .collect();
            msg["tool_calls"] = Value::Array(calls);
        }
        if let Some(id) = &m.tool_call_id {
            msg["tool_call_id"] = call_id(id).into();
        }
        if let Some(name) = &m.name {
            msg["name"] = name.clone().into();
        }
        messages.push(msg);
    }
    let mut extra = serde_json::Map::new();
    match tools {
        Some(t) if template.uses_variable("tools") => {
            extra.insert("tools".into(), t.clone());
        }
        // The template cannot show tools: they go into the system message instead.
        Some(t) => super::tool_prompt::polyfill(&mut messages, t)?,
        None => {}
    }
    if let Some(e) = &req.reasoning_effort {
        extra.insert("reasoning_effort".into(), e.clone().into());
    }
    // Template variables the request set in its own fields (`tools`, `reasoning_effort`) win.
    for (k, v) in req.chat_template_kwargs.iter().flatten() {
        extra.entry(k.clone()).or_insert_with(|| v.clone());
    }
    // A render waits on a worker process for up to its time limit (`template::worker`): the
    // runtime hands this thread's other tasks to another thread meanwhile. (Serve's runtime has
    // several threads; outside a runtime this is a plain call.)
    let rendered = tokio::task::block_in_place(|| {
        template.render_values(&Value::Array(messages), true, &Value::Object(extra))
    })
    .map_err(|e| ApiError::from_anyhow(&e))?;
    ready.text.encode_chat(&rendered).map_err(|e| ApiError::from_anyhow(&e))
}

/// Completions' `prompt` as ids: a string (encoded as raw text), a list of one string, a list of one string, token ids, or a list of one list of ids.
pub fn text_prompt(ready: &Ready, prompt: Option<&Value>) -> Result<Vec<u32>, ApiError> {
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
