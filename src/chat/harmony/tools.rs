//! Function tools in harmony: OpenAI chat-completions tool definitions rendered as the
//! developer message's `functions` namespace (a TypeScript-like declaration per tool), and the
//! model's commentary messages to `functions.NAME` read back as tool calls.
//!
//! The rendering reproduces `openai-harmony` 0.0.8 (`json_schema_to_typescript` and the tools
//! section), quirks included, because the model was trained on exactly that text: nested
//! properties are indented by four spaces but their braces are not, an enum array renders as
//! `"a" | "b"[]`, a string default is quoted unless the property is an enum, a property's
//! object description is written both above the property and after its `?:`. Checked token for
//! token against the library in `tests/fixtures/harmony.json`.

use anyhow::Result;
use serde_json::Value;

use super::{Channel, HarmonyMessage, Role};
use crate::error::{ErrorKind, fail};

/// The namespace harmony puts function tools in: calls go to `functions.NAME`.
pub const FUNCTIONS: &str = "functions";

/// Deeper schemas are refused: the renderer recurses, and a hostile schema must not overflow the
/// stack (no real tool nests this deep).
/// (serde_json's parser stops at 128 levels anyway; this also covers schemas built in code.)
const MAX_DEPTH: usize = 64;

/// One function tool.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    /// May be empty (then no comment line is written, as in harmony).
    pub description: String,
    /// A JSON schema object; `None` renders as `() => any`.
    pub parameters: Option<Value>,
}

impl ToolDef {
    /// Reads one entry of an OpenAI `tools` array:
    /// `{"type": "function", "function": {"name", "description"?, "parameters"?}}`.
    pub fn from_openai(tool: &Value) -> Result<ToolDef> {
        let bad = |msg: String| fail(ErrorKind::InvalidInput, msg);
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(bad(format!(
                    "tool type {other:?} is not supported: only \"function\""
                )));
            }
            None => return Err(bad("a tool needs \"type\": \"function\"".into())),
        }
        let f = tool
            .get("function")
            .filter(|f| f.is_object())
            .ok_or_else(|| bad("a function tool needs a \"function\" object".into()))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("a function tool needs a \"name\" string".into()))?;
        let description = match f.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(bad(format!("tool {name:?}: \"description\" must be a string"))),
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(_) => {
                return Err(bad(format!(
                    "tool {name:?}: \"parameters\" must be a JSON schema object"
                )));
            }
        };
        let def = ToolDef { name: name.to_string(), description, parameters };
        def.validate()?;
        Ok(def)
    }

    /// The name goes verbatim into the prompt (`type NAME = …`) and comes back as a recipient, so
    /// it is held to OpenAI's rule for function names: no spaces, no markup, nothing that would
    /// change how the model reads the header.
    fn validate(&self) -> Result<()> {
        let ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "tool name {:?} is invalid: use 1 to 64 letters, digits, '_' or '-'",
                    self.name
                ),
            ));
        }
        if let Some(p) = &self.parameters {
            check_depth(p, 0).map_err(|_| {
                fail(
                    ErrorKind::InvalidInput,
                    format!(
                        "tool {:?}: the parameters schema nests deeper than {MAX_DEPTH} levels",
                        self.name
                    ),
                )
            })?;
        }
        Ok(())
    }
}

/// Reads an OpenAI `tools` array; names must be unique (a call names its tool).
pub fn tools_from_openai(tools: &Value) -> Result<Vec<ToolDef>> {
    let list = tools
        .as_array()
        .ok_or_else(|| fail(ErrorKind::InvalidInput, "\"tools\" must be an array"))?;
    let mut out: Vec<ToolDef> = Vec::with_capacity(list.len());
    for t in list {
        let def = ToolDef::from_openai(t)?;
        if out.iter().any(|d| d.name == def.name) {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!("tool {:?} is defined twice", def.name),
            ));
        }
        out.push(def);
    }
    Ok(out)
}

fn check_depth(v: &Value, depth: usize) -> Result<(), ()> {
    if depth > MAX_DEPTH {
        return Err(());
    }
    match v {
        Value::Object(m) => m.values().try_for_each(|x| check_depth(x, depth + 1)),
        Value::Array(a) => a.iter().try_for_each(|x| check_depth(x, depth + 1)),
        _ => Ok(()),
    }
}

/// The developer message's tools section (harmony's `template_tools_section` for the one
/// `functions` namespace, which has no description of its own). Empty for no tools.
pub fn functions_section(tools: &[ToolDef]) -> Result<String> {
    if tools.is_empty() {
        return Ok(String::new());
    }
    let mut lines = vec![format!("## {FUNCTIONS}\n"), format!("namespace {FUNCTIONS} {{\n")];
    for t in tools {
        t.validate()?;
        lines.extend(t.description.lines().map(|l| format!("// {l}")));
        match &t.parameters {
            Some(p) => {
                lines.push(format!("type {} = (_: {}) => any;\n", t.name, typescript(p, "")))
            }
            None => lines.push(format!("type {} = () => any;\n", t.name)),
        }
    }
    lines.push(format!("}} // namespace {FUNCTIONS}"));
    Ok(format!("# Tools\n\n{}", lines.join("\n")))
}

fn is_enum(s: &Value) -> bool {
    s.get("enum").and_then(Value::as_array).is_some_and(|a| !a.is_empty())
}

fn is_nullable(s: &Value) -> bool {
    s.get("nullable").and_then(Value::as_bool).unwrap_or(false)
}

/// `default: …` as harmony writes it: a string quoted (raw, not JSON-escaped), anything else as
/// compact JSON. An enum's string default is written bare, except in a top-level `oneOf`
/// variant, where harmony writes it as JSON (`enum_bare` false).
fn default_comment(s: &Value, enum_bare: bool) -> Option<String> {
    let d = s.get("default")?;
    Some(match d.as_str() {
        Some(text) if is_enum(s) && enum_bare => format!("default: {text}"),
        Some(_) if is_enum(s) => format!("default: {d}"),
        Some(text) => format!("default: \"{text}\""),
        None => format!("default: {d}"),
    })
}

/// A type with ` | null` added for `nullable: true`, unless it already says null.
fn typescript_nullable(s: &Value, indent: &str) -> String {
    let t = typescript(s, indent);
    if is_nullable(s) && !t.contains("null") { format!("{t} | null") } else { t }
}

/// harmony's `json_schema_to_typescript`.
fn typescript(schema: &Value, indent: &str) -> String {
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        let mut out = String::new();
        for v in variants {
            out.push_str(&format!("\n{indent} | "));
            out.push_str(&typescript_nullable(v, &format!("{indent}   ")));
            let comments: Vec<String> = v
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string)
                .into_iter()
                .chain(default_comment(v, false))
                .collect();
            if !comments.is_empty() {
                out.push_str(&format!(" // {}", comments.join(" ")));
            }
        }
        return out;
    }
    if let Some(types) = schema.get("type").and_then(Value::as_array) {
        let names: Vec<&str> = types
            .iter()
            .filter_map(Value::as_str)
            .map(|t| if t == "integer" { "number" } else { t })
            .collect();
        if !names.is_empty() {
            return names.join(" | ");
        }
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => object(schema, indent),
        Some("string") => {
            let values: Vec<String> = schema
                .get("enum")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_str).map(|s| format!("\"{s}\"")).collect())
                .unwrap_or_default();
            if values.is_empty() { "string".into() } else { values.join(" | ") }
        }
        Some("number" | "integer") => "number".into(),
        Some("boolean") => "boolean".into(),
        Some("array") => match schema.get("items") {
            Some(items) => format!("{}[]", typescript(items, indent)),
            None => "Array<any>".into(),
        },
        _ => "any".into(),
    }
}

/// An object type: `{`, one line per property (its comments above it), `}` at `indent`.
fn object(schema: &Value, indent: &str) -> String {
    let mut out = String::new();
    if let Some(d) = schema.get("description").and_then(Value::as_str) {
        out.push_str(&format!("{indent}// {d}\n"));
    }
    out.push_str("{\n");
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let props = schema.get("properties").and_then(Value::as_object).into_iter().flatten();
    for (key, val) in props {
        let opt = if required.contains(&key.as_str()) { "" } else { "?" };
        if let Some(t) = val.get("title").and_then(Value::as_str) {
            out.push_str(&format!("{indent}// {t}\n{indent}//\n"));
        }
        let one_of = val.get("oneOf").and_then(Value::as_array);
        if val.get("oneOf").is_none()
            && let Some(d) = val.get("description").and_then(Value::as_str)
        {
            out.push_str(&format!("{indent}// {d}\n"));
        }
        if let Some(examples) = val.get("examples").and_then(Value::as_array)
            && !examples.is_empty()
        {
            out.push_str(&format!("{indent}// Examples:\n"));
            for ex in examples.iter().filter_map(Value::as_str) {
                out.push_str(&format!("{indent}// - \"{ex}\"\n"));
            }
        }
        if let Some(variants) = one_of {
            one_of_property(&mut out, key, opt, val, variants, indent);
            continue;
        }
        let t = typescript_nullable(val, &format!("{indent}    "));
        out.push_str(&format!("{indent}{key}{opt}: {t},"));
        // (harmony checks for `oneOf` again here: one that is not an array gets no default)
        if let Some(c) = default_comment(val, true).filter(|_| val.get("oneOf").is_none()) {
            out.push_str(&format!(" // {c}"));
        }
        out.push('\n');
    }
    out.push_str(&format!("{indent}}}"));
    out
}

/// A property whose schema is a `oneOf`: one `| variant` line each, the property's description
/// above it unless the first variant repeats it.
fn one_of_property(
    out: &mut String,
    key: &str,
    opt: &str,
    val: &Value,
    variants: &[Value],
    indent: &str,
) {
    let desc = val.get("description").and_then(Value::as_str);
    let first_desc = variants.first().and_then(|v| v.get("description")).and_then(Value::as_str);
    let desc_above = desc.filter(|d| Some(*d) != first_desc);
    if let Some(d) = desc_above {
        out.push_str(&format!("{indent}// {d}\n"));
    }
    if let Some(c) = default_comment(val, true) {
        out.push_str(&format!("{indent}// {c}\n"));
    }
    out.push_str(&format!("{indent}{key}{opt}:\n"));
    for (i, v) in variants.iter().enumerate() {
        out.push_str(&format!("{indent} | "));
        out.push_str(&typescript_nullable(v, &format!("{indent}   ")));
        let mut comments = Vec::new();
        if !(i == 0 && desc_above.is_some())
            && let Some(d) = v.get("description").and_then(Value::as_str)
            && Some(d) != desc
        {
            comments.push(d.to_string());
        }
        comments.extend(default_comment(v, true));
        if !comments.is_empty() {
            out.push_str(&format!(" // {}", comments.join(" ")));
        }
        out.push('\n');
    }
    out.push_str(&format!("{indent},\n"));
}

// ------------------------------------------------------------------------------- tool calls

/// A call the model made: a commentary message to `functions.NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    /// The message text as the model wrote it (meant to be JSON; not checked here, so a server
    /// can decide how to report invalid JSON).
    pub arguments: String,
}

/// The function name a recipient addresses (`functions.get_weather` → `get_weather`); `None`
/// for other recipients (`assistant`, a built-in tool like `browser.search`).
pub fn function_name(recipient: &str) -> Option<&str> {
    recipient.strip_prefix(FUNCTIONS)?.strip_prefix('.').filter(|n| !n.is_empty())
}

/// The function calls among a reply's messages, in order.
pub fn tool_calls(reply: &[HarmonyMessage]) -> Vec<ToolCall> {
    reply
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .filter_map(|m| {
            let name = function_name(m.recipient.as_deref()?)?;
            Some(ToolCall { name: name.to_string(), arguments: m.content.clone() })
        })
        .collect()
}

/// The assistant message that calls `name` with `arguments`, as harmony renders a past call:
/// `<|start|>assistant to=functions.NAME<|channel|>commentary <|constrain|>json<|message|>…<|call|>`.
pub fn call_message(name: &str, arguments: &str) -> HarmonyMessage {
    HarmonyMessage::assistant(Channel::Commentary, arguments)
        .with_recipient(format!("{FUNCTIONS}.{name}"))
        .with_content_type("<|constrain|>json")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bad_tool_definitions_are_clear_errors() {
        let cases = [
            (json!({"type": "retrieval"}), "only \"function\""),
            (json!({"function": {"name": "f"}}), "\"type\": \"function\""),
            (json!({"type": "function"}), "\"function\" object"),
            (json!({"type": "function", "function": {"description": "x"}}), "\"name\" string"),
            (json!({"type": "function", "function": {"name": "a b"}}), "is invalid"),
            (json!({"type": "function", "function": {"name": "<|call|>"}}), "is invalid"),
            (
                json!({"type": "function", "function": {"name": "f", "parameters": "x"}}),
                "schema object",
            ),
            (
                json!({"type": "function", "function": {"name": "f", "description": 3}}),
                "must be a string",
            ),
        ];
        for (tool, want) in cases {
            let err = ToolDef::from_openai(&tool).unwrap_err();
            assert_eq!(crate::error::kind_of(&err), ErrorKind::InvalidInput);
            assert!(err.to_string().contains(want), "{tool}: {err}");
        }
        let twice = json!([{"type": "function", "function": {"name": "f"}},
                           {"type": "function", "function": {"name": "f"}}]);
        assert!(tools_from_openai(&twice).unwrap_err().to_string().contains("defined twice"));
        assert!(tools_from_openai(&json!({})).is_err());
    }

    #[test]
    fn a_schema_too_deep_is_refused_not_a_stack_overflow() {
        let mut schema = json!({"type": "string"});
        for _ in 0..40 {
            schema = json!({"type": "object", "properties": {"x": schema}});
        }
        let tool = json!({"type": "function", "function": {"name": "f", "parameters": schema}});
        let err = ToolDef::from_openai(&tool).unwrap_err();
        assert!(err.to_string().contains("nests deeper"), "{err}");
    }

    #[test]
    fn function_names_from_recipients() {
        assert_eq!(function_name("functions.get_weather"), Some("get_weather"));
        assert_eq!(function_name("functions."), None);
        assert_eq!(function_name("functionsx.f"), None);
        assert_eq!(function_name("browser.search"), None);
        assert_eq!(function_name("assistant"), None);
    }
}
