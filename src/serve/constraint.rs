//! Structured outputs: the request fields that constrain a reply, turned into a grammar the
//! engine enforces token by token ([`crate::engine::constraint`]; llguidance masks the logits
//! on the device every step, so the reply matches whatever the model's weights say).
//!
//! Chat (`/v1/chat/completions`):
//! - `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}` (any JSON
//!   object), `{"type": "json_schema", "json_schema": {"name", "description"?, "schema",
//!   "strict"?}}` (JSON valid against `schema`; `strict` is accepted either way: the schema is
//!   always enforced, and a schema llguidance cannot compile is a 400).
//! - vLLM's extensions (so existing clients keep working): `structured_outputs: {"json" |
//!   "regex" | "choice" | "grammar" | "json_object"}` (vLLM ≥ 0.11) and the older
//!   `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`. `grammar` is llguidance's
//!   Lark dialect (<https://github.com/guidance-ai/llguidance/blob/main/docs/syntax.md>). At most
//!   one constraint per request.
//! - Tools: `tool_choice: "required"` (the reply is a call of one of `tools`) or `{"type":
//!   "function", "function": {"name"}}` (a call of that one), with arguments valid against the
//!   tool's `parameters`; `tools[].function.strict: true` constrains a called tool's arguments
//!   under `tool_choice: "auto"` too (gpt-oss only: a plain model's free reply cannot be told
//!   from a call before it ends).
//!
//! Completions (`/v1/completions`): the same `response_format` and vLLM fields.
//!
//! gpt-oss (harmony): the grammar covers the whole turn but constrains only the answer. Its
//! reasoning (`analysis` messages) and preambles are free text, then comes the `final` message
//! (`<|channel|>final[ <|constrain|>json]<|message|>` + the JSON + `<|return|>`) or a call
//! (`<|channel|>commentary to=functions.NAME[ <|constrain|>json]<|message|>` + arguments +
//! `<|call|>`); with `tool_choice` required or named only a call may come. The schema is also
//! written in the developer message under `# Response Formats`, as openai-harmony does.
//! Plain models: the whole reply is the JSON (or regex, grammar, choice); a forced call is the
//! Llama-style `{"name": …, "parameters": …}` that [`crate::chat::reply::llama`] parses back.
//!
//! For the `/v1/responses` (`text.format`, flat) and `/v1/messages` (`output_config.format`,
//! `tool_choice` `any`/`{"type": "tool", "name"}`) handlers: [`from_format`] reads a format in
//! any of the three shapes, [`Tool`]s and [`ToolChoice`] describe the tools, and
//! [`compile`] gives the [`Constraint`] to put in [`super::generation::Job::constraint`].

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use serde_json::{Value, json};

use super::errors::ApiError;
use super::openai_types::Common;
use super::state::Ready;
use crate::engine::constraint::{Constraint, Grammars};

/// What the reply must be.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplyFormat {
    /// JSON valid against this schema; `name`/`description` label it in harmony's developer
    /// message.
    JsonSchema { name: String, description: Option<String>, schema: Value },
    /// Any JSON object.
    JsonObject,
    /// Text matching this regex (whole).
    Regex(String),
    /// Text of this Lark grammar (llguidance's dialect).
    Grammar(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

/// A function tool as far as constraints go.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its `parameters` schema (`{"type": "object"}` when it has none).
    pub parameters: Value,
    /// `strict: true`: its arguments must match `parameters` whatever `tool_choice` says.
    pub strict: bool,
}

/// `tool_choice`, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// A call of one of the tools (OpenAI `"required"`, Anthropic `"any"`).
    Required,
    /// A call of this tool (OpenAI `{"type": "function", "function": {"name"}}`, Anthropic
    /// `{"type": "tool", "name"}`).
    Named(String),
}

impl ToolChoice {
    /// OpenAI's chat `tool_choice` (absent: auto).
    pub fn from_openai(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
        let bad = |m: String| ApiError::bad_param("tool_choice", m);
        match v {
            None | Some(Value::Null) => Ok(ToolChoice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Ok(ToolChoice::Auto),
                "none" => Ok(ToolChoice::None),
                "required" => Ok(ToolChoice::Required),
                other => Err(bad(format!(
                    "tool_choice {other:?} is not supported: use \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": …}}}}"
                ))),
            },
            Some(Value::Object(o)) => {
                let kind = o.get("type").and_then(Value::as_str);
                // Responses' flat `{type: function, name}` too.
                let name = o
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .or_else(|| o.get("name"))
                    .and_then(Value::as_str);
                match (kind, name) {
                    (Some("function"), Some(n)) => Ok(ToolChoice::Named(n.to_string())),
                    _ => Err(bad(format!(
                        "tool_choice {} is not supported: a named choice is {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                        Value::Object(o.clone())
                    ))),
                }
            }
            Some(other) => Err(bad(format!("tool_choice {other} must be a string or an object"))),
        }
    }

    /// Anthropic's `tool_choice` (`auto`, `any`, `none`, `{"type": "tool", "name"}`).
    pub fn from_anthropic(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
        let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(ToolChoice::Auto) };
        let kind = v.get("type").and_then(Value::as_str);
        match kind {
            Some("auto") => Ok(ToolChoice::Auto),
            Some("any") => Ok(ToolChoice::Required),
            Some("none") => Ok(ToolChoice::None),
            Some("tool") => match v.get("name").and_then(Value::as_str) {
                Some(n) => Ok(ToolChoice::Named(n.to_string())),
                None => Err(ApiError::bad_param("tool_choice", "tool_choice.name is required")),
            },
            _ => Err(ApiError::bad_param(
                "tool_choice",
                format!("tool_choice {v} is not supported: use auto, any, none or tool"),
            )),
        }
    }

    /// Whether the reply must be a call.
    pub fn forces_call(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Named(_))
    }
}

/// OpenAI chat `tools` (`[{type: "function", function: {name, parameters, strict}}]`, or the
/// flat Responses/Anthropic shape `{name, parameters | input_schema, strict}`).
pub fn tools_of(tools: Option<&Value>) -> Result<Vec<Tool>, ApiError> {
    let Some(list) = tools.filter(|t| !t.is_null()) else { return Ok(Vec::new()) };
    let Some(list) = list.as_array() else {
        return Err(ApiError::bad_param("tools", "tools must be an array"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let f = t.get("function").unwrap_or(t);
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            return Err(ApiError::bad_param("tools", format!("tools[{i}] has no function name")));
        };
        let parameters = f
            .get("parameters")
            .or_else(|| f.get("input_schema"))
            .filter(|p| !p.is_null())
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        let strict = match f.get("strict").or_else(|| t.get("strict")) {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(ApiError::bad_param(
                    "tools",
                    format!("tools[{i}].function.strict must be a boolean, not {other}"),
                ));
            }
        };
        out.push(Tool { name: name.to_string(), parameters, strict });
    }
    Ok(out)
}

/// A response format in any of the APIs' shapes: chat's `response_format` (`{type,
/// json_schema: {name, schema, strict}}`), Responses' flat `text.format` (`{type, name,
/// schema, strict}`) and Anthropic's `output_config.format` (`{type: "json_schema", schema}`).
/// `{type: "text"}` or null is no constraint; an unknown type or a missing schema is a 400
/// naming `field`.
pub fn from_format(v: &Value, field: &str) -> Result<Option<ReplyFormat>, ApiError> {
    let bad = |m: String| ApiError::bad_param(field, m);
    if v.is_null() {
        return Ok(None);
    }
    let Some(o) = v.as_object() else {
        return Err(bad(format!("{field} must be an object")));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(ReplyFormat::JsonObject)),
        Some("json_schema") => {
            let inner = o.get("json_schema").unwrap_or(v);
            if !inner.is_object() {
                return Err(bad(format!("{field}.json_schema must be an object")));
            }
            let schema = match inner.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => s.clone(),
                Some(other) => {
                    return Err(bad(format!("{field}: the schema must be an object, not {other}")));
                }
                None => return Err(bad(format!("{field}: json_schema needs a schema"))),
            };
            let name = match inner.get("name") {
                None | Some(Value::Null) => "response".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => {
                    return Err(bad(format!("{field}: name must be a string, not {other}")));
                }
            };
            if let Some(s) = inner.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(bad(format!("{field}: strict must be a boolean, not {s}")));
            }
            let description = inner.get("description").and_then(Value::as_str).map(str::to_string);
            Ok(Some(ReplyFormat::JsonSchema { name, description, schema }))
        }
        Some(other) => Err(bad(format!(
            "{field} type {other:?} is not supported: use text, json_object or json_schema"
        ))),
        None => Err(bad(format!("{field} needs a type (text, json_object or json_schema)"))),
    }
}

/// vLLM's fields: `structured_outputs` (one of json, regex, choice, grammar, json_object) and
/// the older `guided_*`.
pub fn from_vllm(c: &Common) -> Result<Option<ReplyFormat>, ApiError> {
    let mut found = Vec::new();
    if let Some(so) = c.structured_outputs.as_ref().filter(|v| !v.is_null()) {
        let Some(o) = so.as_object() else {
            return Err(ApiError::bad_param(
                "structured_outputs",
                "structured_outputs must be an object",
            ));
        };
        for (k, v) in o {
            if v.is_null() || v == &Value::Bool(false) {
                continue;
            }
            let field = format!("structured_outputs.{k}");
            match k.as_str() {
                "json" | "regex" | "choice" | "grammar" => found.push(vllm_format(k, v, &field)?),
                "json_object" => found.push(ReplyFormat::JsonObject),
                // Options of the above, not constraints of their own.
                "disable_fallback"
                | "disable_any_whitespace"
                | "disable_additional_properties"
                | "whitespace_pattern"
                | "backend" => {}
                other => {
                    return Err(ApiError::bad_param(
                        &field,
                        format!(
                            "structured_outputs.{other} is not supported: use json, regex, choice, grammar or json_object"
                        ),
                    ));
                }
            }
        }
    }
    let guided = [
        ("json", &c.guided_json),
        ("regex", &c.guided_regex),
        ("choice", &c.guided_choice),
        ("grammar", &c.guided_grammar),
    ];
    for (k, v) in guided {
        if let Some(v) = v.as_ref().filter(|v| !v.is_null()) {
            found.push(vllm_format(k, v, &format!("guided_{k}"))?);
        }
    }
    if found.len() > 1 {
        return Err(ApiError::bad_param(
            "structured_outputs",
            "give at most one of structured_outputs' json, regex, choice, grammar, json_object (or guided_*)",
        ));
    }
    Ok(found.pop())
}

fn vllm_format(kind: &str, v: &Value, field: &str) -> Result<ReplyFormat, ApiError> {
    let bad = |m: &str| ApiError::bad_param(field, format!("{field} {m}"));
    match kind {
        "json" => match v {
            Value::Object(_) => Ok(ReplyFormat::JsonSchema {
                name: "response".into(),
                description: None,
                schema: v.clone(),
            }),
            // vLLM also takes the schema as a JSON string.
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(schema @ Value::Object(_)) => Ok(ReplyFormat::JsonSchema {
                    name: "response".into(),
                    description: None,
                    schema,
                }),
                _ => Err(bad("must be a JSON schema (an object, or its JSON text)")),
            },
            _ => Err(bad("must be a JSON schema object")),
        },
        "regex" => match v.as_str() {
            Some(r) if !r.is_empty() => Ok(ReplyFormat::Regex(r.to_string())),
            _ => Err(bad("must be a non-empty string")),
        },
        "grammar" => match v.as_str() {
            Some(g) if !g.trim().is_empty() => Ok(ReplyFormat::Grammar(g.to_string())),
            _ => Err(bad("must be a non-empty string (a Lark grammar)")),
        },
        _ => match v.as_array() {
            Some(a) if !a.is_empty() && a.iter().all(Value::is_string) => Ok(ReplyFormat::Choice(
                a.iter().filter_map(Value::as_str).map(str::to_string).collect(),
            )),
            _ => Err(bad("must be a non-empty array of strings")),
        },
    }
}

/// Everything that constrains one chat reply.
#[derive(Debug, Clone, Default)]
pub struct ReplyConstraints {
    pub format: Option<ReplyFormat>,
    pub tools: Vec<Tool>,
    pub choice: Option<ToolChoice>,
}

impl ReplyConstraints {
    /// Whether the reply is constrained at all (harmony: strict tools count; a plain model's
    /// auto choice is never constrained by tools).
    fn needed(&self, harmony: bool) -> bool {
        let choice = self.choice.clone().unwrap_or(ToolChoice::Auto);
        let strict = harmony && choice == ToolChoice::Auto && self.tools.iter().any(|t| t.strict);
        self.format.is_some() || choice.forces_call() || strict
    }

    /// The tools a call may name under the choice (an unknown named tool is a 400).
    fn callable(&self) -> Result<Vec<&Tool>, ApiError> {
        match self.choice.clone().unwrap_or(ToolChoice::Auto) {
            ToolChoice::None => Ok(Vec::new()),
            ToolChoice::Named(n) => match self.tools.iter().find(|t| t.name == n) {
                Some(t) => Ok(vec![t]),
                None => Err(ApiError::bad_param(
                    "tool_choice",
                    format!("tool_choice names {n:?}, which is not among tools"),
                )),
            },
            ToolChoice::Required if self.tools.is_empty() => {
                Err(ApiError::bad_param("tool_choice", "tool_choice \"required\" needs tools"))
            }
            _ => Ok(self.tools.iter().collect()),
        }
    }
}

/// `schema` with llguidance's options for inferno's JSON: compact (`,` and `:` without
/// spaces, no free whitespace), as OpenAI writes it: free whitespace lets a small model loop on
/// newlines until the token limit. A schema's own `x-guidance` wins.
fn compact(schema: &Value) -> Value {
    let options = json!({"whitespace_flexible": false});
    match schema {
        Value::Object(o) if o.contains_key("x-guidance") => schema.clone(),
        Value::Object(o) => {
            let mut o = o.clone();
            o.insert("x-guidance".into(), options);
            Value::Object(o)
        }
        // `true`: any JSON.
        _ => json!({"x-guidance": options}),
    }
}

/// The grammar of a plain model's reply.
fn plain_grammar(r: &ReplyConstraints) -> Result<TopLevelGrammar, ApiError> {
    if r.choice.as_ref().is_some_and(ToolChoice::forces_call) {
        // The Llama-style call `chat::reply::llama` reads back: one object per call, name first.
        let calls: Vec<Value> = r
            .callable()?
            .iter()
            .map(|t| {
                json!({"type": "object", "properties": {
                    "name": {"const": t.name}, "parameters": t.parameters},
                    "required": ["name", "parameters"], "additionalProperties": false})
            })
            .collect();
        return Ok(TopLevelGrammar::from_json_schema(compact(&json!({"anyOf": calls}))));
    }
    Ok(match r.format.as_ref() {
        Some(ReplyFormat::JsonSchema { schema, .. }) => {
            TopLevelGrammar::from_json_schema(compact(schema))
        }
        Some(ReplyFormat::JsonObject) | None => {
            TopLevelGrammar::from_json_schema(compact(&json!({"type": "object"})))
        }
        Some(ReplyFormat::Regex(rx)) => TopLevelGrammar::from_regex(rx),
        Some(ReplyFormat::Grammar(g)) => TopLevelGrammar::from_lark(g.clone()),
        Some(ReplyFormat::Choice(c)) => {
            TopLevelGrammar::from_lark(format!("start: {}", choice_alternatives(c)))
        }
    })
}

/// `"a" | "b"`: Lark string literals (JSON's escapes are Lark's).
fn choice_alternatives(c: &[String]) -> String {
    let lit: Vec<String> = c.iter().map(|s| Value::String(s.clone()).to_string()).collect();
    lit.join(" | ")
}

/// Lark for a value of `format` (inside a harmony message).
fn lark_value(format: Option<&ReplyFormat>) -> String {
    match format {
        Some(ReplyFormat::JsonSchema { schema, .. }) => format!("%json {}", compact(schema)),
        Some(ReplyFormat::JsonObject) | None => {
            format!("%json {}", compact(&json!({"type": "object"})))
        }
        Some(ReplyFormat::Regex(rx)) => format!("/{}/", rx.replace('/', "\\/")),
        Some(ReplyFormat::Choice(c)) => format!("({})", choice_alternatives(c)),
        // A Lark grammar's own `start`, renamed.
        Some(ReplyFormat::Grammar(_)) => "answer_start".to_string(),
    }
}

/// The gpt-oss turn: free analysis and preambles, then the constrained answer or call.
fn harmony_grammar(r: &ReplyConstraints) -> Result<TopLevelGrammar, ApiError> {
    let calls = r.callable()?;
    let forced = r.choice.as_ref().is_some_and(ToolChoice::forces_call);
    let mut tails = Vec::new();
    let mut rules = Vec::new();
    if !forced {
        let body = match &r.format {
            Some(format) => lark_value(Some(format)),
            None => "FREE".to_string(),
        };
        let constrain =
            if matches!(r.format, Some(ReplyFormat::JsonSchema { .. } | ReplyFormat::JsonObject)) {
                "(\" \" <|constrain|> \"json\")?"
            } else {
                ""
            };
        rules.push(format!(
            "final: <|channel|> \"final\" {constrain} <|message|> {body} <|return|>"
        ));
        tails.push("final".to_string());
    }
    for (i, t) in calls.iter().enumerate() {
        if !crate::chat::reply::valid_name(&t.name) {
            return Err(ApiError::bad_param("tools", format!("tool name {:?} is invalid", t.name)));
        }
        let schema = if t.strict || forced { &t.parameters } else { &json!({"type": "object"}) };
        let args = format!("%json {}", compact(schema));
        rules.push(format!(
            "call{i}: <|channel|> \"commentary to=functions.{}\" (\" \" <|constrain|> \"json\")? <|message|> {args} <|call|>",
            t.name
        ));
        tails.push(format!("call{i}"));
    }
    let preamble = if forced { "" } else { "| preamble" };
    let mut lark = format!(
        "start: (before <|start|> \"assistant\")* ({})\n\
         before: analysis {preamble}\n\
         analysis: <|channel|> \"analysis\" <|message|> FREE <|end|>\n\
         preamble: <|channel|> \"commentary\" <|message|> FREE <|end|>\n\
         FREE: /(?s:.*)/\n",
        tails.join(" | ")
    );
    for rule in rules {
        lark.push_str(&rule);
        lark.push('\n');
    }
    if let Some(ReplyFormat::Grammar(g)) = &r.format {
        lark.push_str(&rename_start(g));
    }
    Ok(TopLevelGrammar::from_lark(lark))
}

/// A user's Lark grammar with its `start` rule renamed `answer_start` (to nest it).
fn rename_start(g: &str) -> String {
    let re = regex::Regex::new(r"\bstart\b").expect("static regex");
    format!("{}\n", re.replace_all(g, "answer_start"))
}

/// The field a compile error of `r` is reported under.
fn field_of(r: &ReplyConstraints) -> &'static str {
    match (&r.format, &r.choice) {
        (_, Some(c)) if c.forces_call() => "tools",
        (Some(ReplyFormat::JsonSchema { .. } | ReplyFormat::JsonObject), _) => "response_format",
        (Some(_), _) => "structured_outputs",
        _ => "tools",
    }
}

/// The model's grammar compiler, built on first use (the token trie of its vocabulary).
pub fn grammars(ready: &Ready) -> Result<Arc<Grammars>, ApiError> {
    let built = ready.grammars.get_or_init(|| {
        let vocab = ready.engine.vocab_size();
        Grammars::new(&ready.text.tokenizer, vocab, &ready.text.eos_ids)
            .map(Arc::new)
            .map_err(|e| format!("{e:#}"))
    });
    built.clone().map_err(|e| {
        ApiError::bad_request(format!("structured output is not available for this model: {e}"))
    })
}

/// The engine's constraint for `r` (`None` when nothing constrains the reply); a grammar that
/// does not compile (an unsupported or unsatisfiable schema, a bad regex, too big) is a 400.
pub fn compile(ready: &Ready, r: &ReplyConstraints) -> Result<Option<Constraint>, ApiError> {
    compile_as(ready, r, ready.harmony)
}

/// [`compile`] for a raw continuation (`/v1/completions`: never harmony, whatever the model).
pub fn compile_plain(ready: &Ready, r: &ReplyConstraints) -> Result<Option<Constraint>, ApiError> {
    compile_as(ready, r, false)
}

fn compile_as(
    ready: &Ready,
    r: &ReplyConstraints,
    harmony: bool,
) -> Result<Option<Constraint>, ApiError> {
    if !r.needed(harmony) {
        return Ok(None);
    }
    let grammar = if harmony { harmony_grammar(r)? } else { plain_grammar(r)? };
    let field = field_of(r);
    grammars(ready)?.compile(grammar).map(Some).map_err(|e| {
        ApiError::bad_param(field, format!("{field}: the constraint does not compile: {e:#}"))
    })
}

/// The developer message's `# Response Formats` section for a JSON schema (openai-harmony's
/// rendering), or `None`.
pub fn harmony_section(format: Option<&ReplyFormat>) -> Option<String> {
    let Some(ReplyFormat::JsonSchema { name, description, schema }) = format else { return None };
    let desc = description.as_deref().map(|d| format!("// {d}\n")).unwrap_or_default();
    Some(format!("# Response Formats\n\n## {name}\n\n{desc}{schema}"))
}

/// The constraint fields of a chat or completions request (`tools`, `tool_choice`: chat's).
pub fn from_request(
    c: &Common,
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
) -> Result<ReplyConstraints, ApiError> {
    let format = c
        .response_format
        .as_ref()
        .map(|f| from_format(f, "response_format"))
        .transpose()?
        .flatten();
    let vllm = from_vllm(c)?;
    if format.is_some() && vllm.is_some() {
        return Err(ApiError::bad_param(
            "structured_outputs",
            "give either response_format or structured_outputs (guided_*), not both",
        ));
    }
    from_parts(format.or(vllm), tools, tool_choice)
}

/// A format (already read) with chat-shaped `tools` and `tool_choice`; a forced call and a
/// format together are a 400.
pub fn from_parts(
    format: Option<ReplyFormat>,
    tools: Option<&Value>,
    tool_choice: Option<&Value>,
) -> Result<ReplyConstraints, ApiError> {
    let choice = ToolChoice::from_openai(tool_choice)?;
    let tools = if choice == ToolChoice::None { Vec::new() } else { tools_of(tools)? };
    if choice.forces_call() && format.is_some() {
        return Err(ApiError::bad_param(
            "tool_choice",
            "a forced tool call and a response format cannot both constrain one reply",
        ));
    }
    Ok(ReplyConstraints { format, tools, choice: Some(choice) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_param(e: ApiError) -> (u16, Option<String>) {
        (e.status.as_u16(), e.param)
    }

    #[test]
    fn formats_in_every_shape_and_bad_ones_name_the_field() {
        let schema = json!({"type": "object"});
        let chat = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}});
        let flat = json!({"type": "json_schema", "name": "n", "schema": schema});
        let anthropic = json!({"type": "json_schema", "schema": schema});
        for f in [&chat, &flat] {
            let want = ReplyFormat::JsonSchema {
                name: "n".into(),
                description: None,
                schema: schema.clone(),
            };
            assert_eq!(from_format(f, "response_format").unwrap(), Some(want));
        }
        assert!(matches!(
            from_format(&anthropic, "x").unwrap(),
            Some(ReplyFormat::JsonSchema { .. })
        ));
        assert_eq!(from_format(&json!({"type": "text"}), "x").unwrap(), None);
        assert_eq!(
            from_format(&json!({"type": "json_object"}), "x").unwrap(),
            Some(ReplyFormat::JsonObject)
        );
        for bad in [
            json!({"type": "yaml"}),
            json!({}),
            json!("json"),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"schema": 1}}),
            json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}),
            json!({"type": "json_schema", "json_schema": {"schema": {}, "name": 3}}),
        ] {
            assert_eq!(
                status_param(from_format(&bad, "text.format").unwrap_err()),
                (400, Some("text.format".into())),
                "{bad}"
            );
        }
    }

    #[test]
    fn vllm_fields_and_tool_choices() {
        let c = |v: Value| -> Common { serde_json::from_value(v).unwrap() };
        let r = from_vllm(&c(json!({"structured_outputs": {"regex": "a+"}}))).unwrap();
        assert_eq!(r, Some(ReplyFormat::Regex("a+".into())));
        let r = from_vllm(&c(json!({"guided_choice": ["x", "y"]}))).unwrap();
        assert_eq!(r, Some(ReplyFormat::Choice(vec!["x".into(), "y".into()])));
        let r = from_vllm(&c(json!({"guided_json": "{\"type\": \"object\"}"}))).unwrap();
        assert!(matches!(r, Some(ReplyFormat::JsonSchema { .. })));
        let e = from_vllm(&c(json!({"structured_outputs": {"yaml": "x"}}))).unwrap_err();
        assert_eq!(status_param(e), (400, Some("structured_outputs.yaml".into())));
        let e = from_vllm(&c(json!({"guided_regex": "a", "guided_grammar": "start: \"a\""})))
            .unwrap_err();
        assert_eq!(status_param(e), (400, Some("structured_outputs".into())));
        assert_eq!(
            ToolChoice::from_openai(Some(&json!("required"))).unwrap(),
            ToolChoice::Required
        );
        let named = json!({"type": "function", "function": {"name": "f"}});
        assert_eq!(ToolChoice::from_openai(Some(&named)).unwrap(), ToolChoice::Named("f".into()));
        assert_eq!(
            ToolChoice::from_anthropic(Some(&json!({"type": "any"}))).unwrap(),
            ToolChoice::Required
        );
        let tool = json!({"type": "tool", "name": "f"});
        assert_eq!(ToolChoice::from_anthropic(Some(&tool)).unwrap(), ToolChoice::Named("f".into()));
        for bad in [json!("always"), json!(3), json!({"type": "function"})] {
            let e = ToolChoice::from_openai(Some(&bad)).unwrap_err();
            assert_eq!(status_param(e), (400, Some("tool_choice".into())), "{bad}");
        }
        let tools = json!([{"type": "function", "function": {"name": "f", "strict": true, "parameters": {"type": "object"}}},
                           {"name": "g", "input_schema": {"type": "object", "properties": {}}}]);
        let t = tools_of(Some(&tools)).unwrap();
        assert_eq!((t[0].strict, t[1].strict, t[1].name.as_str()), (true, false, "g"));
        let r = ReplyConstraints {
            format: None,
            tools: t,
            choice: Some(ToolChoice::Named("h".into())),
        };
        assert_eq!(status_param(r.callable().unwrap_err()), (400, Some("tool_choice".into())));
    }
}
