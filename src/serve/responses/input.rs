//! Responses input items → chat messages, so the prompt is rendered by the code chat uses
//! ([`super::super::prompt`]): `instructions` becomes a system message; user, system and
//! developer messages stay messages; an assistant `message` is an assistant message; a
//! `reasoning` item is the `reasoning_content` of the assistant message that follows it; each
//! `function_call` joins the assistant message just before it (as its `tool_calls`, the
//! message's text then being the commentary preamble) or starts one; a
//! `function_call_output` is a `role: "tool"` message with the call's id. Whether reasoning is
//! replayed is the prompt's rule (harmony keeps it only inside an open tool loop). Items need
//! no `id`: Codex sends none.

use serde_json::{Value, json};

use super::super::errors::ApiError;
use super::super::openai_types::{ChatMessage, Content, FunctionCallIn, ToolCallIn};

/// `input` as a list of items (a string is one user message).
pub fn items(input: &Option<Value>) -> Result<Vec<Value>, ApiError> {
    match input {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => {
            Ok(vec![json!({"type": "message", "role": "user", "content": s})])
        }
        Some(Value::Array(a)) => Ok(a.clone()),
        Some(other) => Err(bad(format!("input must be a string or a list of items, not {other}"))),
    }
}

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_param("input", message)
}

fn message(role: &str, text: String) -> ChatMessage {
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

/// The chat messages of `instructions` and the conversation's items.
pub fn messages(instructions: Option<&str>, items: &[Value]) -> Result<Vec<ChatMessage>, ApiError> {
    let mut out: Vec<ChatMessage> = Vec::new();
    if let Some(i) = instructions.filter(|i| !i.is_empty()) {
        out.push(message("system", i.to_string()));
    }
    // Reasoning waiting for the assistant message or call it belongs to.
    let mut reasoning: Option<String> = None;
    // The last message is an assistant message that calls may still join.
    let mut open = false;
    for (i, item) in items.iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or("");
                let text = content_text(i, item.get("content"))?;
                match role {
                    "user" | "system" | "developer" => {
                        reasoning = None;
                        out.push(message(role, text));
                        open = false;
                    }
                    "assistant" => {
                        let mut m = message("assistant", text);
                        m.reasoning_content = reasoning.take();
                        out.push(m);
                        open = true;
                    }
                    other => {
                        return Err(bad(format!(
                            "input[{i}]: unknown role {other:?} (use user, system, developer or assistant)"
                        )));
                    }
                }
            }
            "reasoning" => {
                let text = reasoning_text(item);
                if !text.is_empty() {
                    reasoning = Some(match reasoning.take() {
                        Some(r) => format!("{r}\n{text}"),
                        None => text,
                    });
                }
            }
            "function_call" => {
                let call = function_call(i, item)?;
                let joins = open && out.last().is_some_and(|m| m.role == "assistant");
                if !joins {
                    let mut m = message("assistant", String::new());
                    m.content = None;
                    out.push(m);
                }
                let Some(m) = out.last_mut() else { continue };
                if let Some(r) = reasoning.take() {
                    m.reasoning_content = Some(match m.reasoning_content.take() {
                        Some(old) => format!("{old}\n{r}"),
                        None => r,
                    });
                }
                m.tool_calls.get_or_insert_with(Vec::new).push(call);
                open = true;
            }
            "function_call_output" => {
                let id = str_field(i, item, "call_id")?;
                let mut m = message("tool", content_text(i, item.get("output"))?);
                m.tool_call_id = Some(id.to_string());
                out.push(m);
                open = false;
            }
            other => {
                return Err(bad(format!(
                    "input[{i}]: items of type {other:?} are not supported (use message, reasoning, function_call or function_call_output)"
                )));
            }
        }
    }
    Ok(out)
}

fn str_field<'v>(i: usize, item: &'v Value, key: &str) -> Result<&'v str, ApiError> {
    item.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("input[{i}]: {key} must be a string")))
}

fn function_call(i: usize, item: &Value) -> Result<ToolCallIn, ApiError> {
    let name = str_field(i, item, "name")?;
    let arguments = item.get("arguments").cloned().unwrap_or(Value::Null);
    let id = item.get("call_id").and_then(Value::as_str).map(str::to_string);
    if id.is_none() {
        return Err(bad(format!("input[{i}]: a function_call needs its call_id")));
    }
    Ok(ToolCallIn { id, function: FunctionCallIn { name: name.to_string(), arguments } })
}

/// A reasoning item's text: its `reasoning_text` content, else its summary. Encrypted
/// reasoning alone cannot be read back and is dropped.
fn reasoning_text(item: &Value) -> String {
    let parts = |key: &str, kind: &str| -> Vec<String> {
        item.get(key)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some(kind))
                    .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let content = parts("content", "reasoning_text");
    if content.is_empty() { parts("summary", "summary_text").join("\n") } else { content.join("") }
}

/// A message's (or a call output's) text: a string or text parts, joined.
fn content_text(i: usize, content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                let text = match kind {
                    "input_text" | "output_text" | "text" => p.get("text"),
                    "refusal" => p.get("refusal"),
                    _ => {
                        return Err(bad(format!(
                            "input[{i}]: content parts of type {kind:?} are not supported: this model reads text only"
                        )));
                    }
                };
                match text.and_then(Value::as_str) {
                    Some(t) => out.push_str(t),
                    None => return Err(bad(format!("input[{i}]: a {kind} part needs its text"))),
                }
            }
            Ok(out)
        }
        Some(other) => {
            Err(bad(format!("input[{i}]: content must be a string or parts, not {other}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_loop_becomes_chat_messages() {
        let items: Vec<Value> = serde_json::from_str(
            r#"[{"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "One moment."}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "r1"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "r2"}]}]"#,
        )
        .unwrap();
        let m = messages(Some("Be brief."), &items).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
        assert_eq!(m[2].reasoning_text(), Some("think"));
        assert_eq!(m[2].tool_calls.as_ref().unwrap().len(), 2);
        assert_eq!(m[4].tool_call_id.as_deref(), Some("c2"));
        assert_eq!(m[4].content.as_ref().unwrap().text().unwrap(), "r2");
    }

    #[test]
    fn odd_items_are_400s_naming_input() {
        for bad in [
            r#"[{"type": "item_reference", "id": "x"}]"#,
            r#"[{"role": "robot", "content": "x"}]"#,
            r#"[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]"#,
            r#"[{"type": "function_call", "name": "f", "arguments": "{}"}]"#,
        ] {
            let items: Vec<Value> = serde_json::from_str(bad).unwrap();
            let e = messages(None, &items).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("input"), "{bad}");
        }
    }
}
