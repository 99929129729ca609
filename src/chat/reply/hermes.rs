//! Qwen3's replies: reasoning between `<think>` and `</think>` (kept apart, as harmony's
//! analysis channel is), the answer, and tool calls in the Hermes syntax Qwen's template asks
//! for, one JSON object per block:
//!
//! ```text
//! <think>
//! The user wants the weather.
//! </think>
//!
//! <tool_call>
//! {"name": "get_weather", "arguments": {"city": "Paris"}}
//! </tool_call>
//! ```
//!
//! The tags are ordinary added tokens (not special), so they arrive as text and are read from
//! the text: a piece that may be the start of a tag is held back until it is or is not one. A
//! call is read when its block closes and must name a tool the request offered; anything else
//! in a block (or a block without tools offered) is shown as text, as it came. The template
//! puts no `<think>` in the prompt of these models (it writes an empty block when thinking is
//! off), so a reply starts outside the reasoning.

use tokenizers::Tokenizer;

use super::format::{Delta, FinishReason, PendingLogprobs, ReplyFormat, call_ids, finish_of};
use super::llama::parse_calls;
use super::logprobs::Entry;
use super::plain::ReplyText;
use crate::generate::{StopConditions, StopReason};

const THINK: &str = "<think>";
const END_THINK: &str = "</think>";
const CALL: &str = "<tool_call>";
const END_CALL: &str = "</tool_call>";

/// Whether a tokenizer speaks this format: it has Qwen's reasoning and call tags as tokens.
pub fn speaks(tokenizer: &Tokenizer) -> bool {
    [THINK, END_THINK, CALL, END_CALL].iter().all(|t| tokenizer.token_to_id(t).is_some())
}

/// Where the reader is in the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Answer,
    Reasoning,
    /// Inside a `<tool_call>` block: held until it closes.
    Call,
}

pub struct Hermes<'r> {
    reply: ReplyText<'r>,
    text: Sections,
    /// Tokens read while reasoning.
    reasoning_tokens: usize,
    logprobs: PendingLogprobs,
}

impl<'r> Hermes<'r> {
    pub fn new(tokenizer: &'r Tokenizer, cond: StopConditions, tools: Vec<String>) -> Self {
        Hermes {
            reply: ReplyText::new(tokenizer, cond),
            text: Sections::new(tools),
            reasoning_tokens: 0,
            logprobs: PendingLogprobs::default(),
        }
    }
}

/// The reply's text read into its sections.
struct Sections {
    tools: Vec<String>,
    section: Section,
    /// Text not yet read: a possible tag's start, or a call block's body.
    held: String,
    /// Calls read so far, and the ids' prefix.
    calls: usize,
    ids: String,
    /// The answer's leading whitespace is dropped (after the reasoning, or between calls: the
    /// template's separators, however the text is split).
    trim: bool,
}

impl Sections {
    fn new(tools: Vec<String>) -> Sections {
        let (held, ids) = (String::new(), call_ids());
        Sections { tools, section: Section::Answer, held, calls: 0, ids, trim: false }
    }

    /// Reads `text` on from what was held: the deltas it completes. At the `end`, nothing is
    /// held back.
    fn read(&mut self, text: &str, end: bool) -> Vec<Delta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let tags: &[&str] = match self.section {
                Section::Answer => &[THINK, CALL],
                Section::Reasoning => &[END_THINK],
                Section::Call => &[END_CALL],
            };
            let found = tags.iter().filter_map(|t| self.held.find(t).map(|at| (at, *t))).min();
            let Some((at, tag)) = found else {
                // No whole tag: show what cannot be the start of one (a call's body waits).
                let keep = if end { 0 } else { partial_tag(&self.held, tags) };
                if self.section != Section::Call || end {
                    let shown: String = self.held.drain(..self.held.len() - keep).collect();
                    self.emit(&mut out, shown, end);
                }
                return out;
            };
            let before: String = self.held.drain(..at + tag.len()).take(at).collect();
            match (self.section, tag) {
                (Section::Answer, THINK) => {
                    self.emit(&mut out, before, false);
                    self.section = Section::Reasoning;
                }
                (Section::Answer, _) => {
                    self.emit(&mut out, before, false);
                    self.section = Section::Call;
                }
                (Section::Reasoning, _) => {
                    self.emit(&mut out, before, false);
                    self.section = Section::Answer;
                    self.trim = true;
                }
                (Section::Call, _) => {
                    self.section = Section::Answer;
                    self.call(&mut out, before);
                }
            }
        }
    }

    /// A closed call block's body: a call to an offered tool, else its text as it came.
    fn call(&mut self, out: &mut Vec<Delta>, body: String) {
        match parse_calls(&body, &self.tools).filter(|c| c.len() == 1) {
            Some(calls) => {
                for call in calls {
                    let index = self.calls;
                    let id = format!("{}{index}", self.ids);
                    out.push(Delta::ToolStart { index, id, name: call.name });
                    out.push(Delta::ToolArgs { index, text: call.arguments });
                    self.calls += 1;
                }
                self.trim = true;
            }
            None => out.push(Delta::Content(format!("{CALL}{body}{END_CALL}"))),
        }
    }

    /// Text of the current section (an unclosed call block at the end, as text).
    fn emit(&mut self, out: &mut Vec<Delta>, mut text: String, end: bool) {
        if self.trim && self.section == Section::Answer {
            text = text.trim_start().to_string();
            self.trim = text.is_empty();
        }
        if text.is_empty() {
            return;
        }
        out.push(match self.section {
            Section::Reasoning => Delta::Reasoning(text),
            Section::Call if end => Delta::Content(format!("{CALL}{text}")),
            _ => Delta::Content(text),
        });
    }
}

/// Bytes at the end of `text` that begin one of `tags` (held until they are known).
fn partial_tag(text: &str, tags: &[&str]) -> usize {
    let mut keep = 0;
    for tag in tags {
        for n in 1..tag.len().min(text.len() + 1) {
            if text.is_char_boundary(text.len() - n) && text.ends_with(&tag[..n]) {
                keep = keep.max(n);
            }
        }
    }
    keep
}

impl ReplyFormat for Hermes<'_> {
    fn stop_ids(&self) -> Vec<u32> {
        self.reply.eos_ids()
    }

    fn stop_string(&self) -> Option<String> {
        self.reply.stop_string()
    }

    fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    fn push(
        &mut self,
        id: u32,
        entry: Option<Entry>,
    ) -> anyhow::Result<(Vec<Delta>, Option<StopReason>)> {
        if !self.reply.is_eos(id) {
            match self.text.section {
                Section::Reasoning => self.reasoning_tokens += 1,
                _ => self.logprobs.push(entry),
            }
        }
        let (text, stop) = self.reply.push(id)?;
        let mut deltas = self.text.read(&text, false);
        self.logprobs.attach(&mut deltas);
        Ok((deltas, stop))
    }

    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<&StopReason>,
    ) -> anyhow::Result<(Vec<Delta>, FinishReason)> {
        let tail = self.reply.finish()?;
        let mut deltas = self.text.read(&tail, true);
        self.logprobs.flush(&mut deltas);
        let finish = match self.text.calls {
            0 => finish_of(ours.unwrap_or(engine)),
            _ => FinishReason::ToolCalls,
        };
        Ok((deltas, finish))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reply's text read in `pieces`.
    fn read_all(pieces: &[&str], tools: &[&str]) -> Vec<Delta> {
        let mut h = Sections::new(tools.iter().map(|t| t.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            out.extend(h.read(p, false));
        }
        out.extend(h.read("", true));
        merge(out)
    }

    /// Neighbouring deltas of one kind joined (streaming splits them anywhere).
    fn merge(deltas: Vec<Delta>) -> Vec<Delta> {
        let mut out: Vec<Delta> = Vec::new();
        for d in deltas {
            match (out.last_mut(), d) {
                (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
                (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
                (_, d) => out.push(d),
            }
        }
        out
    }

    /// Every split of `text` into two pieces reads the same.
    fn every_split(text: &str, tools: &[&str]) -> Vec<Delta> {
        let whole = read_all(&[text], tools);
        for at in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
            let split = read_all(&[&text[..at], &text[at..]], tools);
            assert_eq!(strip_ids(&split), strip_ids(&whole), "split at {at}");
        }
        whole
    }

    fn strip_ids(d: &[Delta]) -> Vec<Delta> {
        d.iter()
            .map(|d| match d {
                Delta::ToolStart { index, name, .. } => {
                    Delta::ToolStart { index: *index, id: String::new(), name: name.clone() }
                }
                d => d.clone(),
            })
            .collect()
    }

    #[test]
    fn reasoning_then_answer() {
        let got = every_split("<think>\nAdd them.\n</think>\n\nIt is 4.", &[]);
        assert_eq!(
            got,
            [Delta::Reasoning("\nAdd them.\n".into()), Delta::Content("It is 4.".into())]
        );
    }

    #[test]
    fn an_empty_think_block_leaves_the_answer_alone() {
        let got = every_split("<think>\n\n</think>\n\nHello <b>there</b>", &[]);
        assert_eq!(
            got,
            [Delta::Reasoning("\n\n".into()), Delta::Content("Hello <b>there</b>".into())]
        );
    }

    #[test]
    fn calls_to_offered_tools_are_read() {
        let text = "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1}}\n</tool_call>";
        let got = strip_ids(&every_split(text, &["get_weather", "add"]));
        assert_eq!(
            got,
            [
                Delta::Reasoning("\nweather\n".into()),
                Delta::ToolStart { index: 0, id: String::new(), name: "get_weather".into() },
                Delta::ToolArgs { index: 0, text: r#"{"city":"Paris"}"#.into() },
                Delta::ToolStart { index: 1, id: String::new(), name: "add".into() },
                Delta::ToolArgs { index: 1, text: r#"{"a":1}"#.into() },
            ]
        );
    }

    #[test]
    fn a_block_that_is_no_call_stays_text() {
        let text = "Try <tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call> later";
        assert_eq!(every_split(text, &["add"]), [Delta::Content(text.into())]);
        let open = "Then <tool_call>{\"name\": \"add\"";
        assert_eq!(every_split(open, &["add"]), [Delta::Content(open.into())]);
        let lt = "a < b and <thin ice>";
        assert_eq!(every_split(lt, &[]), [Delta::Content(lt.into())]);
    }
}
