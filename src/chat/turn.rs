//! One assistant turn of a chat, whatever the model's format, reported as events to a sink
//! instead of printed: the REPL prints them, a server turns them into response chunks, tests
//! collect them. So the format logic (chat templates, harmony parsing by channel) and the
//! history rules are written once, here, and every front end shows the same turn.
//!
//! - HF chat templates: the reply is text, streamed as decoded ([`TurnEvent::Answer`] only).
//! - gpt-oss harmony: the sampled ids are parsed by channel ([`HarmonyReply`]): reasoning,
//!   answer and tool calls come apart and no markup reaches any event. Only the final answer
//!   is kept in the history, so a later prompt never carries an earlier turn's reasoning.
//!
//! A turn that fails (the model, the prompt or the sink) leaves the conversation as it was
//! before it: the user's message is taken back.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::SystemTime;

use super::Conversation;
use super::harmony::tools::function_name;
use super::harmony::{
    Channel, DoneReason, HarmonyChat, HarmonyEncoding, HarmonyEvent, HarmonyMessage, HarmonyParser,
    ReasoningEffort, SystemConfig,
};
use crate::engine::Session;
use crate::error::{ErrorKind, fail};
use crate::generate::{Generation, Sampler, SamplerConfig, StopConditions, StopReason};
use crate::load::text::TextSide;

/// What a turn produced, as it streams. Text is never markup: plain models' text has stop
/// strings held back, harmony's has no control tokens.
#[derive(Debug, Clone, Copy)]
pub enum TurnEvent<'a> {
    /// Chain of thought (harmony analysis, and channels the format does not define).
    Reasoning(&'a str),
    /// Harmony commentary addressed to no tool: a preamble, which OpenAI's harmony guide says
    /// the model writes for the user to see (e.g. what it is about to call and why).
    Preamble(&'a str),
    /// Text of the answer: everything a plain model says, harmony's final channel.
    Answer(&'a str),
    /// The model began a message to a tool (harmony commentary to e.g. `functions.get_weather`);
    /// its arguments follow as [`TurnEvent::ToolArguments`].
    ToolCall {
        recipient: &'a str,
    },
    ToolArguments(&'a str),
    /// A harmony message ended (plain models have one message and send none).
    MessageEnd(Part),
    /// The turn is over; always the last event of a turn that did not fail.
    End(&'a TurnEnd),
}

/// Which kind of harmony message a [`TurnEvent::MessageEnd`] closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Reasoning,
    Preamble,
    Answer,
    ToolCall,
}

/// How a turn ended: the generation's stats and stop reason (`text` is the answer only).
#[derive(Debug, Clone)]
pub struct TurnEnd {
    pub generation: Generation,
    /// Harmony: the model ended its turn with `<|call|>`, waiting for a tool's result.
    pub awaiting_tool: bool,
    /// The token budget ran out inside reasoning, before any answer came.
    pub cut_in_reasoning: bool,
}

/// Where a turn's events go.
pub trait TurnSink {
    /// An error stops the turn (a closed pipe, a client gone): it then fails as a whole.
    fn event(&mut self, e: &TurnEvent) -> anyhow::Result<()>;
}

impl<F: FnMut(&TurnEvent) -> anyhow::Result<()>> TurnSink for F {
    fn event(&mut self, e: &TurnEvent) -> anyhow::Result<()> {
        self(e)
    }
}

/// How one turn samples and when it stops. Harmony turns stop on `<|return|>`/`<|call|>` and
/// the token budget only: their ids and stop strings do not apply to the parsed output.
pub struct Sampling<'a> {
    /// Carried across turns: a seeded chat is reproducible as a whole.
    pub sampler: &'a mut Sampler,
    pub stop: StopConditions,
    /// Polled between tokens (Ctrl-C, a cancelled request).
    pub interrupt: &'a Arc<AtomicBool>,
}

/// The sampling of a chat when nothing is set: gpt-oss's recommendation (temperature 1.0,
/// top_p 1.0, nothing else) for harmony models, the library default otherwise. `play` starts
/// from it and `serve` uses it for the fields a request leaves out.
pub fn default_sampling(harmony: bool) -> SamplerConfig {
    let cfg = SamplerConfig::default();
    if harmony {
        return SamplerConfig { temperature: 1.0, top_k: None, top_p: None, min_p: None, ..cfg };
    }
    cfg
}

/// A conversation in the format the model speaks, with its history.
pub enum Dialogue {
    Plain(Conversation),
    Harmony(HarmonyChat),
}

impl Dialogue {
    /// Harmony when the tokenizer has its control tokens (gpt-oss) and the text is not raw.
    pub fn for_model(
        text: &TextSide,
        system: Option<String>,
        raw: bool,
        effort: ReasoningEffort,
    ) -> Dialogue {
        if !raw && HarmonyEncoding::new(&text.tokenizer).is_ok() {
            let cfg = SystemConfig { reasoning: effort, ..SystemConfig::default() }
                .with_date(SystemTime::now());
            return Dialogue::Harmony(HarmonyChat::new(cfg, system));
        }
        Dialogue::Plain(Conversation::new(system, raw || text.template.is_none()))
    }

    pub fn effort(&self) -> Option<ReasoningEffort> {
        match self {
            Dialogue::Harmony(h) => Some(h.system.reasoning),
            Dialogue::Plain(_) => None,
        }
    }

    pub fn clear(&mut self) {
        match self {
            Dialogue::Plain(c) => c.clear(),
            Dialogue::Harmony(h) => h.clear(),
        }
    }

    pub fn set_system(&mut self, system: Option<String>) {
        match self {
            Dialogue::Plain(c) => c.system = system,
            Dialogue::Harmony(h) => h.set_instructions(system),
        }
        self.clear();
    }

    pub fn set_effort(&mut self, effort: ReasoningEffort) -> anyhow::Result<()> {
        match self {
            Dialogue::Harmony(h) => {
                h.set_reasoning(effort);
                Ok(())
            }
            Dialogue::Plain(_) => Err(fail(
                ErrorKind::InvalidInput,
                "reasoning effort applies to gpt-oss models only",
            )),
        }
    }

    /// The prompt the model would continue now.
    pub fn prompt_ids(&self, text: &TextSide) -> anyhow::Result<Vec<u32>> {
        match self {
            Dialogue::Plain(c) => c.prompt_ids(text),
            Dialogue::Harmony(h) => h.prompt_ids(&HarmonyEncoding::new(&text.tokenizer)?),
        }
    }

    /// Drops the oldest turns (never the system or developer message) until the prompt for
    /// the next turn, with `user`'s message when given, leaves `reserve` of `context` tokens
    /// for the reply; returns how many it dropped. Stops when only the newest turn is left,
    /// even if that does not fit: the engine then refuses the prompt with its length. Raw
    /// completion has no history to drop.
    pub fn fit(
        &mut self,
        text: &TextSide,
        user: Option<&str>,
        context: usize,
        reserve: usize,
    ) -> anyhow::Result<usize> {
        if matches!(self, Dialogue::Plain(c) if c.raw) {
            return Ok(0);
        }
        if let Some(u) = user {
            self.push_user(u);
        }
        let mut dropped = 0;
        let fitted = loop {
            match self.prompt_ids(text) {
                Ok(ids) if ids.len() + reserve <= context => break Ok(dropped),
                Ok(_) if self.drop_oldest_turn() => dropped += 1,
                Ok(_) => break Ok(dropped),
                Err(e) => break Err(e),
            }
        };
        if user.is_some() {
            self.undo_turn();
        }
        fitted
    }

    fn push_user(&mut self, user: &str) {
        match self {
            Dialogue::Plain(c) => c.push_user(user),
            Dialogue::Harmony(h) => h.push_user(user),
        }
    }

    fn undo_turn(&mut self) {
        match self {
            Dialogue::Plain(c) => c.undo_turn(),
            Dialogue::Harmony(h) => h.undo_turn(),
        }
    }

    fn drop_oldest_turn(&mut self) -> bool {
        match self {
            Dialogue::Plain(c) => c.drop_oldest_turn(),
            Dialogue::Harmony(h) => h.drop_oldest_turn(),
        }
    }

    /// Runs one user turn on `session`, sending its events to `sink`, and records it in the
    /// history (or, when it fails, takes the user's message back).
    pub fn turn(
        &mut self,
        session: &mut Session,
        text: &TextSide,
        user: &str,
        sampling: Sampling,
        sink: &mut dyn TurnSink,
    ) -> anyhow::Result<TurnEnd> {
        match self {
            Dialogue::Plain(c) => {
                c.push_user(user);
                let result = plain_turn(c, session, text, sampling, sink);
                if result.is_err() {
                    c.undo_turn();
                }
                result
            }
            Dialogue::Harmony(h) => {
                h.push_user(user);
                let result = harmony_turn(h, session, text, sampling, sink);
                if result.is_err() {
                    h.undo_turn();
                }
                result
            }
        }
    }
}

fn plain_turn(
    chat: &mut Conversation,
    session: &mut Session,
    text: &TextSide,
    s: Sampling,
    sink: &mut dyn TurnSink,
) -> anyhow::Result<TurnEnd> {
    let ids = chat.prompt_ids(text)?;
    let generation =
        session.generate(&text.tokenizer, &ids, s.sampler, s.stop, s.interrupt, &mut |t| {
            sink.event(&TurnEvent::Answer(t))
        })?;
    chat.push_assistant(&generation.text);
    let end = TurnEnd { generation, awaiting_tool: false, cut_in_reasoning: false };
    sink.event(&TurnEvent::End(&end))?;
    Ok(end)
}

fn harmony_turn(
    chat: &mut HarmonyChat,
    session: &mut Session,
    text: &TextSide,
    s: Sampling,
    sink: &mut dyn TurnSink,
) -> anyhow::Result<TurnEnd> {
    let enc = HarmonyEncoding::new(&text.tokenizer)?;
    let ids = chat.prompt_ids(&enc)?;
    let mut reply = HarmonyReply::new(&enc);
    let max_tokens = s.stop.max_tokens;
    let generation =
        session.generate_tokens(&ids, s.sampler, max_tokens, s.interrupt, &mut |id| {
            reply.push(id, sink)
        })?;
    let end = reply.finish(generation, sink)?;
    // Answer-only history: the analysis of a turn that ended in an answer is never sent back.
    chat.record_reply(reply.messages());
    sink.event(&TurnEvent::End(&end))?;
    Ok(end)
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
