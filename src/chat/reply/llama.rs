//! Tool calls in the Llama 3.1 / 3.2 syntax: with custom tools in its prompt, the model
//! answers a call as a bare JSON object, `{"name": "get_weather", "parameters": {"city":
//! "Paris"}}` (Meta's prompt format; `"arguments"` is accepted too, as other fine-tunes write
//! it), possibly after `<|python_tag|>`, and Llama 3.2 may write several separated by `;`.
//!
//! Streamed, such a reply cannot be told from text until it is complete, so [`Sniffer`] holds
//! back a reply that starts with `{` (or the tag) for as long as it can still become calls to
//! tools the request offered, and releases it as text the moment it cannot (a name no tool
//! has, an object that is not a call, text after one). Small models answer in JSON often, and
//! a client that sends no `max_tokens` would otherwise see nothing until the context is full.
//! A reply that starts otherwise streams as text at once.

use serde_json::Value;

/// The tag Llama 3.1 writes before a call (a special token: usually absent from the text).
pub const PYTHON_TAG: &str = "<|python_tag|>";

/// One parsed call: the function and its arguments as a JSON object's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// A whole reply read as calls, or `None` when it is not only calls to `tools`.
pub fn parse_calls(text: &str, tools: &[String]) -> Option<Vec<Call>> {
    let mut rest = text.trim();
    rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest);
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let value = values.next()?.ok()?;
        calls.push(call_of(&value, tools)?);
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest);
    }
    (!calls.is_empty()).then_some(calls)
}

/// Whether `text`, a reply so far, can still grow into calls to `tools`.
fn may_become_calls(text: &str, tools: &[String]) -> bool {
    let mut rest = text.trim_start();
    rest = rest.strip_prefix(PYTHON_TAG).unwrap_or(rest);
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return true;
        }
        if !rest.starts_with('{') {
            return false;
        }
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(value)) if call_of(&value, tools).is_some() => {}
            Some(Err(e)) if e.is_eof() => return name_may_match(rest, tools),
            _ => return false,
        }
        rest = rest[values.byte_offset()..].trim_start();
        rest = rest.strip_prefix(';').unwrap_or(rest);
    }
}

/// For an unfinished object that opens with its `"name"`: whether the name written so far
/// begins one of `tools`. Any other opening is given the benefit of the doubt until the object
/// closes.
fn name_may_match(object: &str, tools: &[String]) -> bool {
    let after_key = object[1..].trim_start().strip_prefix("\"name\"").map(str::trim_start);
    let Some(value) = after_key.and_then(|s| s.strip_prefix(':')).map(str::trim_start) else {
        return true;
    };
    let Some(name) = value.strip_prefix('"') else {
        return value.is_empty();
    };
    if name.contains('\\') {
        return true;
    }
    match name.split_once('"') {
        Some((whole, _)) => tools.iter().any(|t| t == whole),
        None => tools.iter().any(|t| t.starts_with(name)),
    }
}

pub(super) fn call_of(value: &Value, tools: &[String]) -> Option<Call> {
    let obj = value.as_object()?;
    let name = obj.get("name")?.as_str()?;
    if !tools.iter().any(|t| t == name) {
        return None;
    }
    let arguments = match obj.get("parameters").or_else(|| obj.get("arguments")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(args @ Value::Object(_)) => args.to_string(),
        // Arguments written as a JSON string holding the object.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(args @ Value::Object(_)) => args.to_string(),
            _ => return None,
        },
        Some(_) => return None,
    };
    Some(Call { name: name.to_string(), arguments })
}

/// Watches a streamed reply for a call (see the module docs).
pub struct Sniffer {
    tools: Vec<String>,
    state: State,
}

enum State {
    /// Only whitespace (or a prefix of the tag) so far: held.
    Undecided(String),
    /// It looks like a call: everything is held until the end.
    Buffering(String),
    /// Text: shown as it comes.
    Text,
}

impl Sniffer {
    pub fn new(tools: Vec<String>) -> Self {
        Sniffer { tools, state: State::Undecided(String::new()) }
    }

    /// Feeds the reply's next text (`tag`: the token was `<|python_tag|>`); returns what can
    /// be shown now.
    pub fn push(&mut self, text: &str, tag: bool) -> String {
        match &mut self.state {
            State::Text => text.to_string(),
            State::Buffering(buf) => {
                buf.push_str(text);
                self.release_if_text()
            }
            State::Undecided(held) => {
                held.push_str(text);
                let start = held.trim_start();
                if tag || start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                    self.state = State::Buffering(std::mem::take(held));
                    self.release_if_text()
                } else if start.is_empty() || PYTHON_TAG.starts_with(start) {
                    String::new()
                } else {
                    let shown = std::mem::take(held);
                    self.state = State::Text;
                    shown
                }
            }
        }
    }

    /// Once the held reply can no longer be calls: all of it, and text from now on.
    fn release_if_text(&mut self) -> String {
        match &mut self.state {
            State::Buffering(buf) if !may_become_calls(buf, &self.tools) => {
                let shown = std::mem::take(buf);
                self.state = State::Text;
                shown
            }
            _ => String::new(),
        }
    }

    /// The end of the reply, with its last text: the calls it made, or the text still to show.
    pub fn finish(&mut self, text: &str) -> Result<Vec<Call>, String> {
        let shown = self.push(text, false);
        match std::mem::replace(&mut self.state, State::Text) {
            State::Buffering(buf) => parse_calls(&buf, &self.tools).ok_or(buf),
            State::Undecided(held) => Err(held),
            State::Text => Err(shown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<String> {
        vec!["get_weather".into(), "add".into()]
    }

    #[test]
    fn llama_calls_parse_and_anything_else_does_not() {
        let one = r#" {"name": "get_weather", "parameters": {"city": "Paris", "days": 2}} "#;
        let want =
            Call { name: "get_weather".into(), arguments: r#"{"city":"Paris","days":2}"#.into() };
        assert_eq!(parse_calls(one, &tools()), Some(vec![want.clone()]));
        let tagged = format!("{PYTHON_TAG}{one}");
        assert_eq!(parse_calls(&tagged, &tools()), Some(vec![want]));
        let two =
            r#"{"name": "add", "arguments": {"a": 1}}; {"name": "add", "arguments": "{\"a\": 2}"}"#;
        let calls = parse_calls(two, &tools()).unwrap();
        assert_eq!(
            calls.iter().map(|c| c.arguments.as_str()).collect::<Vec<_>>(),
            [r#"{"a":1}"#, r#"{"a":2}"#]
        );
        assert_eq!(parse_calls(r#"{"name": "add"}"#, &tools()).unwrap()[0].arguments, "{}");
        for not_a_call in [
            r#"{"name": "rm_rf", "parameters": {}}"#,
            r#"{"name": "add", "parameters": {}} and some text"#,
            r#"{"name": "add", "parameters": [1]}"#,
            r#"{"name": "add", "parameters": "not json"}"#,
            r#"{"name": "add", "parameters": {"#,
            r#"{"city": "Paris"}"#,
            "[1, 2]",
            "",
            "Sure! The weather is nice.",
        ] {
            assert_eq!(parse_calls(not_a_call, &tools()), None, "{not_a_call}");
        }
    }

    #[test]
    fn a_streamed_call_is_held_and_text_is_not() {
        let mut s = Sniffer::new(tools());
        assert_eq!(s.push("\n", false), "");
        assert_eq!(s.push(r#"{"name": "add", "#, false), "");
        assert_eq!(s.push(r#""parameters": {"a": 1}}"#, false), "");
        let calls = s.finish("").unwrap();
        assert_eq!(calls[0].name, "add");

        let mut s = Sniffer::new(tools());
        assert_eq!(s.push(" ", false), "");
        assert_eq!(s.push("Hi", false), " Hi");
        assert_eq!(s.push(" there", false), " there");
        assert_eq!(s.finish("!"), Err("!".into()));

        // Held like a call until it cannot be one, then shown whole.
        let mut s = Sniffer::new(tools());
        assert_eq!(s.push("{", false), "");
        assert_eq!(s.push("not", false), "{not");
        assert_eq!(s.finish(" json}"), Err(" json}".into()));

        // The tag token alone starts a call.
        let mut s = Sniffer::new(tools());
        assert_eq!(s.push("", true), "");
        assert_eq!(s.finish(r#"{"name": "add"}"#).unwrap()[0].name, "add");
    }

    #[test]
    fn a_held_reply_is_released_once_it_cannot_be_a_call() {
        // (pieces, how many pieces are held before all of it is shown)
        let cases: [(&[&str], usize); 6] = [
            (&[r#"{"name": "ad"#, r#"d", "parameters": {"#, r#""a": 1}}"#], usize::MAX),
            (&[r#"{"name": "ge"#, r#"o", "#], 1),
            (&[r#"{"name": "add"#, r#"ition""#], 1),
            (&[r#"{"answer": "#, r#"42}"#], 1),
            (&[r#"{"name": "add"}"#, r#" and then"#], 1),
            (&[r#"{"name": "add"}; "#, r#"{"name": "add"}"#, r#" {"name": "x"#], 2),
        ];
        for (pieces, held) in cases {
            let mut s = Sniffer::new(tools());
            let mut shown = String::new();
            for (i, piece) in pieces.iter().enumerate() {
                let out = s.push(piece, false);
                if i < held {
                    assert_eq!(out, "", "{pieces:?} piece {i}");
                }
                shown.push_str(&out);
            }
            match s.finish("") {
                Ok(calls) => assert!(held == usize::MAX && calls[0].name == "add", "{pieces:?}"),
                Err(rest) => {
                    shown.push_str(&rest);
                    assert_eq!(shown, pieces.concat(), "{pieces:?}");
                    assert_ne!(held, usize::MAX, "{pieces:?}");
                }
            }
        }
    }
}
