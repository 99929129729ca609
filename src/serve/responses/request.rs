//! The body of `POST /v1/responses` (and `/v1/responses/input_tokens`), checked field by field
//! so a bad value is a 400 naming it. The fields the Responses API adds to chat's are kept as
//! JSON here and read in [`check`]; sampling fields are chat's ([`Common`]).
//!
//! Accepted and ignored because Codex CLI sends them on every request: hosted `web_search`
//! and `namespace` tools (never offered to the model), `include:
//! ["reasoning.encrypted_content"]` (reasoning comes back as plain `reasoning_text`, which
//! Codex replays), `prompt_cache_key`, `client_metadata`, `reasoning.summary`. Refused: other
//! hosted and custom tools, `background`, `conversation`, `prompt`, logprobs.
//! `truncation: "auto"` drops the conversation's oldest items until it fits (`mod.rs`). `text.format` (json_object, json_schema) and a forced `tool_choice` (required, or
//! a function by name) constrain the reply as on chat ([`crate::serve::constraint`]).

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::super::constraint::{ReplyFormat, ToolChoice, from_format};
use super::super::errors::ApiError;
use super::super::openai_types::Common;

#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    #[serde(flatten)]
    pub common: Common,
    pub input: Option<Value>,
    pub instructions: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub reasoning: Option<Value>,
    pub max_output_tokens: Option<Value>,
    pub metadata: Option<Value>,
    pub include: Option<Value>,
    pub store: Option<Value>,
    pub truncation: Option<Value>,
    pub text: Option<Value>,
    pub previous_response_id: Option<Value>,
    pub background: Option<Value>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
}

/// A request's checked values.
#[derive(Debug, Clone)]
pub struct Checked {
    pub instructions: Option<String>,
    /// Function tools in chat's nested shape (none with `tool_choice: "none"`).
    pub tools: Vec<Value>,
    /// Clamped to what gpt-oss knows: low, medium or high.
    pub effort: Option<&'static str>,
    pub max_output_tokens: Option<i64>,
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// `text.format` as a constraint (none for text).
    pub text_format: Option<ReplyFormat>,
    /// `truncation: "auto"`: the oldest items go until the input fits the context.
    pub truncate: bool,
    /// The request's fields the response object repeats.
    pub echo: Map<String, Value>,
}

fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, message)
}

fn string_of(param: &str, v: &Option<Value>) -> Result<Option<String>, ApiError> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(bad(param, format!("{param} must be a string, not {other}"))),
    }
}

fn bool_of(param: &str, v: &Option<Value>) -> Result<Option<bool>, ApiError> {
    match v {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(bad(param, format!("{param} must be true or false, not {other}"))),
    }
}

pub fn check(r: &ResponsesRequest) -> Result<Checked, ApiError> {
    if bool_of("background", &r.background)? == Some(true) {
        return Err(bad("background", "background responses are not supported: omit background"));
    }
    for (name, v) in [("conversation", &r.conversation), ("prompt", &r.prompt)] {
        if v.is_some() {
            return Err(bad(name, format!("{name} is not supported by this server: send input")));
        }
    }
    let truncate = match string_of("truncation", &r.truncation)?.as_deref() {
        None | Some("disabled") => false,
        Some("auto") => true,
        Some(o) => {
            return Err(bad(
                "truncation",
                format!("truncation must be \"auto\" or \"disabled\", not {o:?}"),
            ));
        }
    };
    if let Some(t) = r.common.temperature.filter(|t| !(0.0..=2.0).contains(t)) {
        return Err(bad("temperature", format!("temperature must be from 0 to 2, not {t}")));
    }
    if let Some(p) = r.common.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        return Err(bad("top_p", format!("top_p must be above 0 and at most 1, not {p}")));
    }
    let tool_choice = tool_choice(&r.tool_choice)?;
    let parallel = bool_of("parallel_tool_calls", &r.parallel_tool_calls)?;
    let tools =
        if tool_choice == ToolChoice::None { Vec::new() } else { function_tools(&r.tools)? };
    let max_output_tokens = match &r.max_output_tokens {
        None => None,
        Some(v) => match v.as_i64() {
            Some(n) if n >= 1 => Some(n),
            _ => {
                return Err(bad(
                    "max_output_tokens",
                    format!("max_output_tokens must be an integer of at least 1, not {v}"),
                ));
            }
        },
    };
    let (effort, reasoning) = reasoning(&r.reasoning)?;
    let (text_format, text) = text(&r.text)?;
    check_include(&r.include)?;
    check_metadata(&r.metadata)?;
    let mut echo = Map::new();
    echo.insert("instructions".into(), r.instructions.clone().unwrap_or(Value::Null));
    echo.insert("tools".into(), r.tools.clone().unwrap_or(json!([])));
    echo.insert("tool_choice".into(), r.tool_choice.clone().unwrap_or_else(|| "auto".into()));
    echo.insert("parallel_tool_calls".into(), parallel.unwrap_or(true).into());
    echo.insert("temperature".into(), json!(r.common.temperature));
    echo.insert("top_p".into(), json!(r.common.top_p));
    echo.insert("max_output_tokens".into(), json!(max_output_tokens));
    echo.insert("reasoning".into(), reasoning);
    echo.insert("text".into(), text);
    echo.insert("truncation".into(), if truncate { "auto" } else { "disabled" }.into());
    echo.insert("metadata".into(), r.metadata.clone().unwrap_or(json!({})));
    let store = bool_of("store", &r.store)?.unwrap_or(true);
    echo.insert("store".into(), store.into());
    let previous_response_id = string_of("previous_response_id", &r.previous_response_id)?;
    echo.insert("previous_response_id".into(), json!(previous_response_id));
    Ok(Checked {
        instructions: string_of("instructions", &r.instructions)?,
        tools,
        effort,
        max_output_tokens,
        store,
        previous_response_id,
        text_format,
        truncate,
        echo,
    })
}

/// `tool_choice`: auto, none, required, or a function by name (`{type: "function", name}`);
/// a forced choice constrains the reply to a call ([`crate::serve::constraint`]).
fn tool_choice(v: &Option<Value>) -> Result<ToolChoice, ApiError> {
    ToolChoice::from_openai(v.as_ref())
}

/// The function tools, in chat's shape. Codex's hosted `web_search` and `namespace` groups
/// are left out (the model is not offered them); other non-function tools are refused.
fn function_tools(v: &Option<Value>) -> Result<Vec<Value>, ApiError> {
    let list = match v {
        None => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(other) => return Err(bad("tools", format!("tools must be an array, not {other}"))),
    };
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "function" => {
                let Some(name) = t.get("name").and_then(Value::as_str) else {
                    return Err(bad("tools", format!("tools[{i}]: a function tool needs a name")));
                };
                let mut f = json!({"name": name});
                for k in ["description", "parameters", "strict"] {
                    if let Some(x) = t.get(k).filter(|x| !x.is_null()) {
                        f[k] = x.clone();
                    }
                }
                out.push(json!({"type": "function", "function": f}));
            }
            "web_search" | "web_search_preview" | "namespace" => {
                tracing::debug!("tools[{i}]: {kind} tool ignored (not offered to the model)");
            }
            _ => {
                return Err(bad(
                    "tools",
                    format!(
                        "tools[{i}]: tools of type {kind:?} are not supported: only function tools"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// `reasoning.effort` clamped to gpt-oss's three levels, and the `reasoning` to echo.
fn reasoning(v: &Option<Value>) -> Result<(Option<&'static str>, Value), ApiError> {
    let r = match v {
        None => return Ok((None, json!({"effort": null, "summary": null}))),
        Some(r @ Value::Object(_)) => r,
        Some(other) => {
            return Err(bad("reasoning", format!("reasoning must be an object, not {other}")));
        }
    };
    let effort = match r.get("effort") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => Some(match e.as_str() {
            "none" | "minimal" | "low" => "low",
            "medium" => "medium",
            "high" | "xhigh" | "max" => "high",
            _ => return Err(effort_error(&json!(e))),
        }),
        Some(other) => return Err(effort_error(other)),
    };
    match r.get("summary") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if ["auto", "concise", "detailed"].contains(&s.as_str()) => {}
        Some(other) => {
            return Err(bad(
                "reasoning.summary",
                format!("reasoning.summary must be auto, concise or detailed, not {other}"),
            ));
        }
    }
    let summary = r.get("summary").cloned().unwrap_or(Value::Null);
    Ok((effort, json!({"effort": effort, "summary": summary})))
}

fn effort_error(v: &Value) -> ApiError {
    bad(
        "reasoning.effort",
        format!("reasoning.effort must be none, minimal, low, medium, high, xhigh or max, not {v}"),
    )
}

/// `text.format` (and the `text` to echo).
fn text(v: &Option<Value>) -> Result<(Option<ReplyFormat>, Value), ApiError> {
    let Some(t) = v else { return Ok((None, json!({"format": {"type": "text"}}))) };
    if !t.is_object() {
        return Err(bad("text", format!("text must be an object, not {t}")));
    }
    match t.get("verbosity") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if ["low", "medium", "high"].contains(&s.as_str()) => {}
        Some(o) => {
            return Err(bad(
                "text.verbosity",
                format!("text.verbosity must be low, medium or high, not {o}"),
            ));
        }
    }
    let format = match t.get("format") {
        None | Some(Value::Null) => None,
        Some(f) => text_format(f)?,
    };
    let mut echo = t.clone();
    if echo.get("format").is_none_or(Value::is_null) {
        echo["format"] = json!({"type": "text"});
    }
    Ok((format, echo))
}

fn text_format(f: &Value) -> Result<Option<ReplyFormat>, ApiError> {
    let p = "text.format";
    match f.get("type").and_then(Value::as_str) {
        Some("text") | Some("json_object") => from_format(f, p),
        Some("json_schema") => {
            let name = f.get("name").and_then(Value::as_str).unwrap_or("");
            let name_ok = !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return Err(bad(
                    p,
                    format!("{p}.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -, not {name:?}"),
                ));
            }
            let Some(schema) = f.get("schema").filter(|s| s.is_object()) else {
                return Err(bad(p, format!("{p}.schema must be a JSON Schema object")));
            };
            if let Some(o) = f.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(bad(p, format!("{p}.strict must be true or false, not {o}")));
            }
            let _ = schema;
            from_format(f, p)
        }
        _ => Err(bad(p, format!("{p} must have type text, json_object or json_schema, not {f}"))),
    }
}

/// `include`: what OpenAI allows; only the encrypted reasoning is meaningful here (and
/// ignored: plain reasoning text comes back instead), the hosted tools' ones are moot.
fn check_include(v: &Option<Value>) -> Result<(), ApiError> {
    const MOOT: [&str; 7] = [
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    ];
    let Some(v) = v else { return Ok(()) };
    let Some(list) = v.as_array() else {
        return Err(bad("include", format!("include must be an array of strings, not {v}")));
    };
    for x in list {
        match x.as_str() {
            Some(s) if MOOT.contains(&s) => {}
            Some("message.output_text.logprobs") => {
                return Err(bad(
                    "include",
                    "message.output_text.logprobs is not supported on /v1/responses: use /v1/chat/completions",
                ));
            }
            _ => return Err(bad("include", format!("include: unknown value {x}"))),
        }
    }
    Ok(())
}

/// `metadata`: at most 16 string values, keys up to 64 characters, values up to 512.
fn check_metadata(v: &Option<Value>) -> Result<(), ApiError> {
    let Some(v) = v else { return Ok(()) };
    let Some(m) = v.as_object() else {
        return Err(bad("metadata", format!("metadata must be an object, not {v}")));
    };
    if m.len() > 16 {
        return Err(bad("metadata", format!("metadata holds at most 16 pairs, not {}", m.len())));
    }
    for (k, x) in m {
        let ok = k.chars().count() <= 64 && x.as_str().is_some_and(|s| s.chars().count() <= 512);
        if !ok {
            return Err(bad(
                "metadata",
                format!("metadata {k:?}: keys are up to 64 characters, values strings up to 512"),
            ));
        }
    }
    Ok(())
}
