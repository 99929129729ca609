//! Mistral's replies: the answer as text, and tool calls after the `[TOOL_CALLS]` control token
//! in either syntax Mistral's tokenizers use:
//!
//! ```text
//! [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]    v3 to v7 (7B v0.3, Small 2501/2503)
//! [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}                          v11 on (Small 3.2, Devstral, Magistral)
//! ```
//!
//! In the second, each call has its own `[TOOL_CALLS]`. Both tokens are special ids, never text
//! (the detokenizer drops them), so the reader watches the ids. Everything after the first
//! `[TOOL_CALLS]` is held until the reply ends and read as calls to tools the request offered;
//! anything else (a name no tool has, arguments that are no JSON object, calls without tools
//! offered) is shown as the text it came as, the markers written out.
//!
//! Mistral's templates take a call id of exactly 9 letters and digits (its v3 template raises
//! on any other), so the calls get such ids ([`nine_char_id`]), and a conversation that comes
//! back with ids of other shapes has them cut to their last 9 by [`template_call_id`].

use rand::Rng;
use tokenizers::Tokenizer;

use super::format::{Delta, FinishReason, PendingLogprobs, ReplyFormat, finish_of};
use super::llama::{Call, call_of};
use super::logprobs::Entry;
use super::plain::ReplyText;
use crate::generate::{StopConditions, StopReason};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

/// Whether a tokenizer speaks this format: it has Mistral's `[TOOL_CALLS]` control token.
pub fn speaks(tokenizer: &Tokenizer) -> bool {
    tokenizer.token_to_id(TOOL_CALLS).is_some()
}

/// A call id Mistral's templates take: 9 letters and digits.
pub fn nine_char_id() -> String {
    const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut r = rand::rng();
    (0..9).map(|_| ALNUM[r.random_range(0..ALNUM.len())] as char).collect()
}

/// The id a conversation's call goes back to a Mistral template with: its last 9 letters and
/// digits (vLLM's mapping too), so an id such as `call_0abc…` from another client still
/// renders; one with fewer is left as it is, for the template to refuse.
pub fn template_call_id(id: &str) -> String {
    let alnum: Vec<char> = id.chars().filter(char::is_ascii_alphanumeric).collect();
    match alnum.len() {
        n if n >= 9 => alnum[n - 9..].iter().collect(),
        _ => id.to_string(),
    }
}

/// What follows `[TOOL_CALLS]`, as it comes: text, and the `[ARGS]` and `[TOOL_CALLS]` markers.
#[derive(Debug, Default)]
struct Held {
    /// The text since the first `[TOOL_CALLS]`, markers written out (what is shown when it is
    /// no call).
    raw: String,
    /// v11: each call's name and arguments' text; the last one still growing.
    parts: Vec<(String, Option<String>)>,
}

impl Held {
    fn marker(&mut self, args: bool) {
        if args {
            self.raw.push_str(ARGS);
            if let Some((_, a @ None)) = self.parts.last_mut() {
                *a = Some(String::new());
            }
        } else {
            self.raw.push_str(TOOL_CALLS);
            self.parts.push((String::new(), None));
        }
    }

    fn text(&mut self, text: &str) {
        self.raw.push_str(text);
        if let Some((name, args)) = self.parts.last_mut() {
            args.as_mut().unwrap_or(name).push_str(text);
        }
    }

    /// The calls, when everything held is calls to `tools` in one of the two syntaxes.
    fn calls(&self, tools: &[String]) -> Option<Vec<Call>> {
        let v11 = self.parts.iter().any(|(_, a)| a.is_some());
        if v11 {
            return self
                .parts
                .iter()
                .map(|(name, args)| {
                    let args: serde_json::Value = serde_json::from_str(args.as_ref()?).ok()?;
                    let value = serde_json::json!({"name": name.trim(), "arguments": args});
                    call_of(&value, tools)
                })
                .collect();
        }
        let [(body, None)] = &self.parts[..] else { return None };
        match serde_json::from_str::<serde_json::Value>(body.trim()).ok()? {
            serde_json::Value::Array(items) if !items.is_empty() => {
                items.iter().map(|v| call_of(v, tools)).collect()
            }
            one @ serde_json::Value::Object(_) => Some(vec![call_of(&one, tools)?]),
            _ => None,
        }
    }
}

pub struct Mistral<'r> {
    reply: ReplyText<'r>,
    tools: Vec<String>,
    tool_calls: u32,
    args: Option<u32>,
    /// After the first `[TOOL_CALLS]`: everything since.
    held: Option<Held>,
    logprobs: PendingLogprobs,
}

impl<'r> Mistral<'r> {
    pub fn new(tokenizer: &'r Tokenizer, cond: StopConditions, tools: Vec<String>) -> Self {
        Mistral {
            reply: ReplyText::new(tokenizer, cond),
            tools,
            tool_calls: tokenizer.token_to_id(TOOL_CALLS).unwrap_or(u32::MAX),
            args: tokenizer.token_to_id(ARGS),
            held: None,
            logprobs: PendingLogprobs::default(),
        }
    }
}

impl ReplyFormat for Mistral<'_> {
    fn stop_ids(&self) -> Vec<u32> {
        self.reply.eos_ids()
    }

    fn stop_string(&self) -> Option<String> {
        self.reply.stop_string()
    }

    fn push(
        &mut self,
        id: u32,
        entry: Option<Entry>,
    ) -> anyhow::Result<(Vec<Delta>, Option<StopReason>)> {
        if id == self.tool_calls || Some(id) == self.args {
            self.held.get_or_insert_with(Held::default).marker(id != self.tool_calls);
            return Ok((Vec::new(), None));
        }
        if !self.reply.is_eos(id) && self.held.is_none() {
            self.logprobs.push(entry);
        }
        let (text, stop) = self.reply.push(id)?;
        let mut deltas = Vec::new();
        match &mut self.held {
            Some(held) => held.text(&text),
            None if !text.is_empty() => deltas.push(Delta::Content(text)),
            None => {}
        }
        self.logprobs.attach(&mut deltas);
        Ok((deltas, stop))
    }

    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<&StopReason>,
    ) -> anyhow::Result<(Vec<Delta>, FinishReason)> {
        let tail = self.reply.finish()?;
        let finish = finish_of(ours.unwrap_or(engine));
        let Some(mut held) = self.held.take() else {
            let mut deltas = if tail.is_empty() { Vec::new() } else { vec![Delta::Content(tail)] };
            self.logprobs.flush(&mut deltas);
            return Ok((deltas, finish));
        };
        held.text(&tail);
        let mut deltas = Vec::new();
        match held.calls(&self.tools) {
            Some(calls) => {
                for (index, call) in calls.into_iter().enumerate() {
                    deltas.push(Delta::ToolStart { index, id: nine_char_id(), name: call.name });
                    deltas.push(Delta::ToolArgs { index, text: call.arguments });
                }
                self.logprobs.clear();
                Ok((deltas, FinishReason::ToolCalls))
            }
            None => {
                deltas.push(Delta::Content(held.raw));
                self.logprobs.flush(&mut deltas);
                Ok((deltas, finish))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Piece<'a> {
        Calls,
        Args,
        Text(&'a str),
    }
    use Piece::*;

    fn read(pieces: &[Piece], tools: &[&str]) -> Option<Vec<Call>> {
        let mut held = Held::default();
        for p in pieces {
            match p {
                Calls => held.marker(false),
                Args => held.marker(true),
                Text(t) => held.text(t),
            }
        }
        held.calls(&tools.iter().map(|t| t.to_string()).collect::<Vec<_>>())
    }

    fn call(name: &str, arguments: &str) -> Call {
        Call { name: name.into(), arguments: arguments.into() }
    }

    #[test]
    fn the_json_array_of_v3_to_v7() {
        let body = r#"[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": {"a": 1}}]"#;
        let got = read(&[Calls, Text(&body[..9]), Text(&body[9..])], &["get_weather", "add"]);
        let want = vec![call("get_weather", r#"{"city":"Paris"}"#), call("add", r#"{"a":1}"#)];
        assert_eq!(got, Some(want));
    }

    #[test]
    fn names_and_args_of_v11() {
        let pieces =
            [Calls, Text("get_"), Text("weather"), Args, Text(r#"{"city": "#), Text(r#""Paris"}"#)];
        assert_eq!(
            read(&pieces, &["get_weather"]),
            Some(vec![call("get_weather", r#"{"city":"Paris"}"#)])
        );
        let two =
            [Calls, Text("add"), Args, Text(r#"{"a": 1}"#), Calls, Text("add"), Args, Text("{}")];
        assert_eq!(read(&two, &["add"]), Some(vec![call("add", r#"{"a":1}"#), call("add", "{}")]));
    }

    #[test]
    fn anything_else_is_no_call() {
        let weather = r#"[{"name": "get_weather", "arguments": {}}]"#;
        assert_eq!(read(&[Calls, Text(weather)], &["add"]), None, "a tool not offered");
        assert_eq!(read(&[Calls, Text(weather)], &[]), None, "no tools offered");
        assert_eq!(read(&[Calls, Text("[{\"name\": \"add\"")], &["add"]), None, "cut short");
        assert_eq!(read(&[Calls, Text("add"), Args, Text("[1]")], &["add"]), None, "no object");
        assert_eq!(read(&[Calls, Text("add"), Args], &["add"]), None, "no arguments");
        assert_eq!(read(&[Calls, Text("add")], &["add"]), None, "a bare name");
    }

    #[test]
    fn the_text_held_is_shown_with_its_markers() {
        let mut held = Held::default();
        held.marker(false);
        held.text("rm");
        held.marker(true);
        held.text("{}");
        assert_eq!(held.raw, "[TOOL_CALLS]rm[ARGS]{}");
    }

    #[test]
    fn ids_fit_the_templates() {
        let id = nine_char_id();
        assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
        assert_eq!(template_call_id("call_0123456789abcdef"), "789abcdef");
        assert_eq!(template_call_id("abcDEF123"), "abcDEF123");
        assert_eq!(template_call_id("c_1"), "c_1", "too short: the template refuses it");
    }
}
