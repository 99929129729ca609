//! The Messages request's options beyond the conversation: `tools` and `tool_choice` as
//! chat's, the reasoning effort gpt-oss's `Reasoning:` line takes (from `output_config.effort`
//! or `thinking`), and `output_config.format` (a JSON schema the answer is constrained to).

use serde_json::{Map, Value, json};

use super::super::constraint::{ReplyFormat, from_format};
use super::super::errors::ApiError;
use super::input::field;

/// `tools` as OpenAI function tools, and `tool_choice` as chat's. Anthropic's server tools
/// (a dated `type` such as `web_search_20250305`, no `input_schema`) run on Anthropic's side
/// only: they are left out, so the model never sees a tool nobody would run.
pub(super) fn tools(o: &Map<String, Value>) -> Result<(Option<Value>, Option<Value>), ApiError> {
    let mut functions = Vec::new();
    match o.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for (i, t) in list.iter().enumerate() {
                let custom = matches!(t.get("type"), None | Some(Value::Null))
                    || t.get("type").and_then(Value::as_str) == Some("custom");
                if !custom && t.get("input_schema").is_none() {
                    tracing::debug!("tools[{i}]: server tool {:?} left out", t.get("type"));
                    continue;
                }
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| field("tools", format!("tools[{i}]: name must be a string")))?;
                let schema = match t.get("input_schema") {
                    Some(s @ Value::Object(_)) => s.clone(),
                    _ => {
                        return Err(field(
                            "tools",
                            format!("tools[{i}]: input_schema must be an object"),
                        ));
                    }
                };
                let mut f = json!({"name": name, "parameters": schema});
                if let Some(d) = t.get("description").and_then(Value::as_str) {
                    f["description"] = d.into();
                }
                functions.push(json!({"type": "function", "function": f}));
            }
        }
        Some(_) => return Err(field("tools", "tools must be an array")),
    }
    let choice = match o.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(c) => match c.get("type").and_then(Value::as_str) {
            Some("auto") => None,
            Some("none") => Some(Value::String("none".into())),
            // Forced calls, in chat's words: the reply is then constrained to a call.
            Some("any") => Some(Value::String("required".into())),
            Some("tool") => match c.get("name").and_then(Value::as_str) {
                Some(n) => Some(json!({"type": "function", "function": {"name": n}})),
                None => return Err(field("tool_choice", "tool_choice.name must be a string")),
            },
            _ => {
                return Err(field(
                    "tool_choice",
                    "tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\"",
                ));
            }
        },
    };
    Ok(((!functions.is_empty()).then_some(Value::Array(functions)), choice))
}

/// gpt-oss's `Reasoning:` level: `output_config.effort` when given, else from `thinking`
/// (a budget under 4096 tokens is low, under 16384 medium, more high; `adaptive` is the
/// default medium; `disabled` is low, as gpt-oss always reasons).
pub(super) fn effort(o: &Map<String, Value>) -> Result<&'static str, ApiError> {
    if let Some(e) = o.get("output_config").and_then(|c| c.get("effort")).filter(|e| !e.is_null()) {
        return match e.as_str() {
            Some("low") => Ok("low"),
            Some("medium") => Ok("medium"),
            Some("high" | "xhigh" | "max") => Ok("high"),
            _ => Err(field(
                "output_config.effort",
                format!("output_config.effort must be low, medium, high, xhigh or max, not {e}"),
            )),
        };
    }
    let Some(t) = o.get("thinking").filter(|t| !t.is_null()) else { return Ok("medium") };
    match t.get("type").and_then(Value::as_str) {
        Some("enabled") => match t.get("budget_tokens").and_then(Value::as_i64) {
            Some(b) if b < 1024 => {
                Err(field("thinking.budget_tokens", "thinking.budget_tokens must be at least 1024"))
            }
            Some(b) if b < 4096 => Ok("low"),
            Some(b) if b < 16384 => Ok("medium"),
            Some(_) => Ok("high"),
            None => {
                Err(field("thinking.budget_tokens", "thinking.budget_tokens must be an integer"))
            }
        },
        Some("adaptive") => Ok("medium"),
        Some("disabled") => Ok("low"),
        _ => Err(field(
            "thinking",
            "thinking.type must be \"enabled\", \"adaptive\" or \"disabled\"",
        )),
    }
}

/// `output_config.format`: `{type: "json_schema", schema: {…}}`, as a constraint.
pub(super) fn output_format(config: Option<&Value>) -> Result<Option<ReplyFormat>, ApiError> {
    let config = match config {
        None | Some(Value::Null) => return Ok(None),
        Some(c @ Value::Object(_)) => c,
        Some(_) => return Err(field("output_config", "output_config must be an object")),
    };
    let Some(format) = config.get("format").filter(|f| !f.is_null()) else { return Ok(None) };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(field(
            "output_config.format",
            "output_config.format.type must be \"json_schema\"",
        ));
    }
    match format.get("schema") {
        Some(Value::Object(_)) => from_format(format, "output_config.format"),
        _ => Err(field(
            "output_config.format.schema",
            "output_config.format.schema must be a JSON schema object",
        )),
    }
}
