//! A harmony (gpt-oss) reply, read by one parser in two views: [`HarmonyReply`] reports a
//! turn's events with harmony's parts apart (play prints them and keeps the messages as
//! history), and [`Harmony`], the [`ReplyFormat`], turns those events into deltas: reasoning,
//! visible content (with stop strings applied), and tool calls to `functions.NAME` with ids and
//! indexes. No markup reaches any of them.
//!
//! Preambles, commentary messages addressed to no tool, are **content**: OpenAI's harmony guide
//! says the model writes them for the user to see (what it is about to do, before its calls),
//! unlike the analysis channel, and vLLM's harmony parser shows them as content too. Reported as
//! reasoning, a client that hides reasoning would hide them, and the next request would send
//! them back as reasoning, which is dropped once a turn ends. Consecutive visible messages (a
//! preamble, then the final answer) are joined with a newline, as vLLM joins them.
//!
//! Logprobs cover the same text: the content tokens of the final and preamble messages, never
//! a header, a control token, the analysis or a call's arguments (so `content`'s bytes are the
//! entries' bytes, apart from that joining newline, which no token wrote). Their alternatives
//! are the model's most likely tokens at that step, whatever they are, as vLLM reports them.

use std::time::Duration;

use super::events::{Part, TurnEnd, TurnEvent, TurnSink};
use super::format::{
    Delta, FinishReason, PendingLogprobs, ReplyFormat, call_ids, finish_of, valid_name,
};
use super::logprobs::Entry;
use crate::chat::harmony::tools::function_name;
use crate::chat::harmony::{
    Channel, DoneReason, HarmonyEncoding, HarmonyEvent, HarmonyMessage, HarmonyParser,
};
use crate::generate::{Generation, StopChecker, StopConditions, StopReason};

/// A harmony reply as deltas, on top of [`HarmonyReply`]'s events.
pub struct Harmony<'r> {
    enc: HarmonyEncoding<'r>,
    reply: HarmonyReply<'r>,
    stop_ids: Vec<u32>,
    /// Stop strings on the visible text (reasoning and arguments are not cut).
    answer: StopChecker,
    answer_stopped: bool,
    /// The stop string that ended the answer.
    stop_string: Option<String>,
    /// A visible message with text was read: the next one starts on a new line.
    visible_gap: bool,
    /// The message being read has shown text.
    visible_open: bool,
    /// Per call made: whether any argument text came.
    calls: Vec<bool>,
    /// The message being read is a call with this index.
    current: Option<usize>,
    id_prefix: String,
    logprobs: PendingLogprobs,
    /// Text tokens of the reasoning (markup not counted): `usage`'s `reasoning_tokens`.
    reasoning_tokens: usize,
}

/// An owned copy of a [`TurnEvent`].
enum Raw {
    Reasoning(String),
    Visible(String),
    ToolCall(String),
    ToolArgs(String),
    MessageEnd,
}

impl<'r> Harmony<'r> {
    pub fn new(enc: HarmonyEncoding<'r>, stop: Vec<String>) -> Self {
        let cond =
            StopConditions { eos_ids: Vec::new(), stop_strings: stop, max_tokens: usize::MAX };
        Harmony {
            enc,
            reply: HarmonyReply::new(&enc),
            stop_ids: enc.stop_ids(),
            answer: StopChecker::new(cond),
            answer_stopped: false,
            stop_string: None,
            visible_gap: false,
            visible_open: false,
            calls: Vec::new(),
            current: None,
            id_prefix: call_ids(),
            logprobs: PendingLogprobs::default(),
            reasoning_tokens: 0,
        }
    }
}

impl ReplyFormat for Harmony<'_> {
    fn stop_ids(&self) -> Vec<u32> {
        self.stop_ids.clone()
    }

    fn stop_string(&self) -> Option<String> {
        self.stop_string.clone()
    }

    fn reasoning_tokens(&self) -> usize {
        self.reasoning_tokens
    }

    /// One token: its deltas, and the end when the model ended its turn or a stop string came.
    /// Its log probabilities are kept when it is text of a visible message (never markup, nor
    /// reasoning or a call's arguments).
    fn push(
        &mut self,
        id: u32,
        entry: Option<Entry>,
    ) -> anyhow::Result<(Vec<Delta>, Option<StopReason>)> {
        let was_stopped = self.answer_stopped;
        let mut raw = Vec::new();
        let done = self.reply.push(id, &mut |e: &TurnEvent| {
            raw.push(owned(e));
            Ok(())
        })?;
        if !was_stopped && !self.enc.is_special(id) && self.reply.in_visible_content() {
            self.logprobs.push(entry);
        }
        if !self.enc.is_special(id) && self.reply.in_reasoning() {
            self.reasoning_tokens += 1;
        }
        let mut deltas = self.convert(raw);
        self.logprobs.attach(&mut deltas);
        let stop = match &self.stop_string {
            Some(s) if self.answer_stopped => Some(StopReason::StopString(s.clone())),
            _ => done,
        };
        Ok((deltas, stop))
    }

    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<&StopReason>,
    ) -> anyhow::Result<(Vec<Delta>, FinishReason)> {
        let mut raw = Vec::new();
        let reason = if ours.is_some() { StopReason::Eos(0) } else { engine.clone() };
        let generation = Generation {
            tokens: Vec::new(),
            text: String::new(),
            reason,
            prompt_tokens: 0,
            prefilled_tokens: 0,
            time_to_first_token: Duration::ZERO,
            decode_time: Duration::ZERO,
        };
        let end = self.reply.finish(generation, &mut |e: &TurnEvent| {
            raw.push(owned(e));
            Ok(())
        })?;
        let mut tail = self.convert(raw);
        if !self.answer_stopped {
            let rest = self.answer.finish();
            if !rest.is_empty() {
                tail.push(Delta::Content(rest));
            }
        }
        self.logprobs.flush(&mut tail);
        // A call whose arguments never came: `{}`, so clients can parse them.
        for (index, had_args) in self.calls.iter().enumerate() {
            if !had_args {
                tail.push(Delta::ToolArgs { index, text: "{}".into() });
            }
        }
        let finish = if self.answer_stopped {
            FinishReason::Stop
        } else if end.awaiting_tool && !self.calls.is_empty() {
            FinishReason::ToolCalls
        } else if ours.is_some() {
            FinishReason::Stop
        } else {
            finish_of(engine)
        };
        Ok((tail, finish))
    }
}

impl Harmony<'_> {
    fn convert(&mut self, raw: Vec<Raw>) -> Vec<Delta> {
        let mut out = Vec::new();
        for r in raw {
            match r {
                Raw::Reasoning(t) => out.push(Delta::Reasoning(t)),
                Raw::Visible(t) => self.visible(t, &mut out),
                Raw::ToolCall(recipient) => self.call_start(&recipient, &mut out),
                Raw::ToolArgs(text) => match self.current {
                    Some(index) => {
                        if !text.is_empty() {
                            self.calls[index] = true;
                        }
                        out.push(Delta::ToolArgs { index, text });
                    }
                    None => out.push(Delta::Reasoning(text)),
                },
                Raw::MessageEnd => {
                    self.current = None;
                    self.visible_gap |= std::mem::take(&mut self.visible_open);
                }
            }
        }
        out
    }

    /// Text of the answer or a preamble, through the stop strings.
    fn visible(&mut self, text: String, out: &mut Vec<Delta>) {
        if self.answer_stopped || text.is_empty() {
            return;
        }
        let text = if std::mem::take(&mut self.visible_gap) { format!("\n{text}") } else { text };
        self.visible_open = true;
        let step = self.answer.push(0, &text);
        if !step.text.is_empty() {
            out.push(Delta::Content(step.text));
        }
        self.answer_stopped = step.stop.is_some();
        if let Some(StopReason::StopString(s)) = step.stop {
            self.stop_string = Some(s);
        }
    }

    fn call_start(&mut self, recipient: &str, out: &mut Vec<Delta>) {
        match function_name(recipient).filter(|n| valid_name(n)) {
            Some(name) => {
                let index = self.calls.len();
                self.calls.push(false);
                self.current = Some(index);
                let id = format!("{}{index}", self.id_prefix);
                out.push(Delta::ToolStart { index, id, name: name.to_string() });
            }
            // A built-in tool (`browser.search`) or a garbled recipient: not a function call
            // this API can report; its text is shown as reasoning.
            None => self.current = None,
        }
    }
}

fn owned(e: &TurnEvent) -> Raw {
    match e {
        TurnEvent::Reasoning(t) => Raw::Reasoning(t.to_string()),
        TurnEvent::Answer(t) | TurnEvent::Preamble(t) => Raw::Visible(t.to_string()),
        TurnEvent::ToolCall { recipient } => Raw::ToolCall(recipient.to_string()),
        TurnEvent::ToolArguments(t) => Raw::ToolArgs(t.to_string()),
        TurnEvent::MessageEnd(_) | TurnEvent::End(_) => Raw::MessageEnd,
    }
}

/// A harmony reply as it streams: sampled ids in, [`TurnEvent`]s out. Apart from the session
/// loop, so whatever produces the ids (a batched engine, a test) gets the same events.
pub struct HarmonyReply<'t> {
    parser: HarmonyParser<'t>,
    /// The message being read is a tool call (its text is arguments, not reasoning).
    in_tool_call: bool,
    answer: String,
}

impl<'t> HarmonyReply<'t> {
    /// For the continuation of a prompt from [`HarmonyChat::prompt_ids`].
    pub fn new(enc: &HarmonyEncoding<'t>) -> Self {
        HarmonyReply { parser: enc.parser(), in_tool_call: false, answer: String::new() }
    }

    /// Feeds one sampled id; says when the model has ended its turn.
    pub fn push(&mut self, id: u32, sink: &mut dyn TurnSink) -> anyhow::Result<Option<StopReason>> {
        for e in self.parser.push(id)? {
            self.send(&e, sink)?;
        }
        Ok(self.parser.done().map(|_| StopReason::Eos(id)))
    }

    /// Closes the reply after sampling stopped; the generation's text becomes the answer.
    pub fn finish(
        &mut self,
        mut generation: Generation,
        sink: &mut dyn TurnSink,
    ) -> anyhow::Result<TurnEnd> {
        // Read before `finish` closes the message: where the budget ran out.
        let cut_in_reasoning = matches!(generation.reason, StopReason::MaxTokens)
            && self.parser.current_channel() == Some(&Channel::Analysis);
        for e in self.parser.finish()? {
            self.send(&e, sink)?;
        }
        generation.text = std::mem::take(&mut self.answer);
        let awaiting_tool = self.parser.done() == Some(DoneReason::Call);
        Ok(TurnEnd { generation, awaiting_tool, cut_in_reasoning })
    }

    /// Whether the message being read is one the user sees (the answer or a preamble): its
    /// text tokens are the reply's visible content, its markup and other messages are not.
    pub fn in_visible_content(&self) -> bool {
        match self.parser.current_channel() {
            Some(Channel::Final | Channel::Other(_) | Channel::Commentary) => !self.in_tool_call,
            _ => false,
        }
    }

    /// Whether the message being read is reasoning (analysis, not a call to a tool).
    pub fn in_reasoning(&self) -> bool {
        self.parser.current_channel() == Some(&Channel::Analysis) && !self.in_tool_call
    }

    /// The reply's messages so far, analysis included (what [`HarmonyChat::record_reply`] reads).
    pub fn messages(&self) -> &[HarmonyMessage] {
        self.parser.messages()
    }

    /// Where the model slips, the message still becomes what it was meant to be: a call to a
    /// function is a tool call on whatever channel it came (gpt-oss sometimes writes calls on
    /// `analysis`), and text on a channel harmony does not have is shown as the answer rather
    /// than lost.
    fn send(&mut self, e: &HarmonyEvent, sink: &mut dyn TurnSink) -> anyhow::Result<()> {
        match e {
            HarmonyEvent::MessageStart { channel, recipient: Some(r) }
                if *channel == Channel::Commentary || function_name(r).is_some() =>
            {
                self.in_tool_call = true;
                sink.event(&TurnEvent::ToolCall { recipient: r })
            }
            HarmonyEvent::MessageStart { .. } => {
                self.in_tool_call = false;
                Ok(())
            }
            HarmonyEvent::Text { text, .. } if self.in_tool_call => {
                sink.event(&TurnEvent::ToolArguments(text))
            }
            HarmonyEvent::Text { channel: Channel::Final | Channel::Other(_), text } => {
                self.answer.push_str(text);
                sink.event(&TurnEvent::Answer(text))
            }
            HarmonyEvent::Text { channel: Channel::Commentary, text } => {
                sink.event(&TurnEvent::Preamble(text))
            }
            HarmonyEvent::Text { text, .. } => sink.event(&TurnEvent::Reasoning(text)),
            HarmonyEvent::MessageEnd { channel } => {
                let part = match channel {
                    _ if self.in_tool_call => Part::ToolCall,
                    Channel::Final | Channel::Other(_) => Part::Answer,
                    Channel::Commentary => Part::Preamble,
                    _ => Part::Reasoning,
                };
                self.in_tool_call = false;
                sink.event(&TurnEvent::MessageEnd(part))
            }
            HarmonyEvent::Done { .. } => Ok(()),
        }
    }
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
