//! Tools for a model whose chat template cannot render them (SmolLM2, TinyLlama, many
//! fine-tunes): instead of refusing the request, which breaks clients that always send tools
//! (Open WebUI's default chat offers its built-in ones), the tools are described in the system
//! message, with the reply syntax [`crate::chat::reply::llama`] reads back: a call is a bare JSON
//! object `{"name": …, "arguments": {…}}`, several one per line. The conversation's earlier
//! calls are written in that same syntax and tool results become user messages, since such
//! templates know no `tool` role (llama.cpp's chat-template polyfills make the same moves).
//!
//! Whether a small model follows the instruction is up to the model; what this guarantees is
//! that the request works, that a reply written as asked becomes `tool_calls`, and that
//! anything else stays text.

use serde_json::{Value, json};

use super::errors::ApiError;

/// Rewrites template `messages` (already in `{role, content, tool_calls?, tool_call_id?}` form)
/// for a template without tool support, describing `tools` (OpenAI's list) in the system
/// message.
pub fn polyfill(messages: &mut Vec<Value>, tools: &Value) -> Result<(), ApiError> {
    let block = describe(tools)?;
    let mut names: Vec<(String, String)> = Vec::new(); // (call id, function name)
    for m in messages.iter_mut() {
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array).cloned() {
            let mut text = m["content"].as_str().unwrap_or_default().to_string();
            for c in &calls {
                let (name, args) = (&c["function"]["name"], &c["function"]["arguments"]);
                if let Some(id) = c["id"].as_str() {
                    names.push((id.to_string(), name.as_str().unwrap_or_default().to_string()));
                }
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&json!({"name": name, "arguments": args}).to_string());
            }
            m["content"] = text.into();
            strip(m, "tool_calls");
        }
        if m["role"] == "tool" {
            let name = m["name"].as_str().map(str::to_string).or_else(|| {
                let id = m["tool_call_id"].as_str()?;
                names.iter().find(|(i, _)| i == id).map(|(_, n)| n.clone())
            });
            let content = m["content"].as_str().unwrap_or_default();
            m["content"] = match name {
                Some(n) => format!("Result of the call to {n}:\n{content}"),
                None => format!("Result of the tool call:\n{content}"),
            }
            .into();
            m["role"] = "user".into();
            strip(m, "tool_call_id");
            strip(m, "name");
        }
    }
    match messages.first_mut() {
        Some(first) if first["role"] == "system" => {
            let text = first["content"].as_str().unwrap_or_default();
            first["content"] =
                if text.is_empty() { block } else { format!("{text}\n\n{block}") }.into();
        }
        _ => messages.insert(0, json!({"role": "system", "content": block})),
    }
    Ok(())
}

fn strip(m: &mut Value, key: &str) {
    if let Some(o) = m.as_object_mut() {
        o.remove(key);
    }
}

/// The system-message text that offers `tools` (OpenAI's `[{type: "function", function:
/// {name, description?, parameters?}}]`).
fn describe(tools: &Value) -> Result<String, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_param("tools", "tools must be a list of function tools"))?;
    let mut text = String::from(
        "You can call the tools below. To call one, reply with only a JSON object and nothing \
         else: {\"name\": \"<tool name>\", \"arguments\": {<the arguments its parameters \
         describe>}}. For several calls, write one such object per line. When no tool is \
         needed, answer normally.\n\nTools:",
    );
    for (i, t) in list.iter().enumerate() {
        let f = t.get("function").unwrap_or(t);
        let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_param("tools", format!("tools[{i}] has no function name"))
        })?;
        text.push_str("\n- ");
        text.push_str(name);
        if let Some(d) = f.get("description").and_then(Value::as_str).filter(|d| !d.is_empty()) {
            text.push_str(": ");
            text.push_str(d.trim());
        }
        let params = f.get("parameters").filter(|p| !p.is_null());
        text.push_str("\n  arguments: ");
        text.push_str(&params.map_or_else(|| "{}".to_string(), Value::to_string));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::reply::llama::parse_calls;

    fn weather() -> Value {
        json!([{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
    }

    #[test]
    fn tools_go_into_the_system_message_and_calls_read_back() {
        let mut m = vec![json!({"role": "user", "content": "Weather in Paris?"})];
        polyfill(&mut m, &weather()).unwrap();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0]["role"], "system");
        let sys = m[0]["content"].as_str().unwrap();
        assert!(sys.contains("- get_weather: Current weather."), "{sys}");
        assert!(sys.contains(r#""city":{"type":"string"}"#), "{sys}");
        // The syntax the instruction asks for is what the reply parser reads.
        let reply = r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#;
        let calls = parse_calls(reply, &["get_weather".into()]).unwrap();
        assert_eq!(calls[0].arguments, r#"{"city":"Paris"}"#);
    }

    #[test]
    fn an_existing_system_message_keeps_its_text_first() {
        let mut m = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
        ];
        polyfill(&mut m, &weather()).unwrap();
        assert_eq!(m.len(), 2);
        assert!(m[0]["content"].as_str().unwrap().starts_with("Be brief.\n\nYou can call"));
    }

    #[test]
    fn history_calls_become_json_text_and_results_user_messages() {
        let mut m = vec![
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}),
            json!({"role": "tool", "content": "cold", "tool_call_id": "c1"}),
        ];
        polyfill(&mut m, &weather()).unwrap();
        let call = m[2]["content"].as_str().unwrap();
        assert!(m[2].get("tool_calls").is_none());
        let parsed = parse_calls(call, &["get_weather".into()]).unwrap();
        assert_eq!(parsed[0].arguments, r#"{"city":"Oslo"}"#);
        assert_eq!(m[3]["role"], "user");
        assert_eq!(m[3]["content"], "Result of the call to get_weather:\ncold");
        assert!(m[3].get("tool_call_id").is_none());
    }

    #[test]
    fn a_tool_without_a_name_is_a_400_naming_tools() {
        let mut m = vec![json!({"role": "user", "content": "x"})];
        let e = polyfill(&mut m, &json!([{"type": "function", "function": {}}])).unwrap_err();
        assert!(e.message.contains("tools[0]"), "{}", e.message);
        let e = polyfill(&mut m, &json!({"a": 1})).unwrap_err();
        assert!(e.message.contains("list"), "{}", e.message);
    }
}
