//! One assistant turn of a chat as `play` holds it, whatever the model's format, reported as
//! events to a sink instead of printed: the REPL prints them, tests collect them. The reply is
//! read by the reader every front end shares ([`super::reply`]); the history rules live here.
//!
//! - HF chat templates: the reply is read by the model's reply format ([`reply::reader`]):
//!   for the plain format, text streamed as decoded ([`TurnEvent::Answer`] only, stop strings
//!   held back).
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
use super::harmony::{HarmonyChat, HarmonyEncoding, ReasoningEffort, SystemConfig};
use super::reply::{self, Delta, HarmonyReply, ReplyOptions, TurnEnd, TurnEvent, TurnSink};
use crate::engine::Session;
use crate::error::{ErrorKind, fail};
use crate::generate::{Sampler, SamplerConfig, StopConditions};
use crate::load::text::TextSide;

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

    /// Turns a thinking model's reasoning on or off (its template's `enable_thinking`):
    /// refused for gpt-oss (it always reasons; its effort is the knob) and for a template
    /// without the switch.
    pub fn set_thinking(&mut self, text: &TextSide, on: bool) -> anyhow::Result<()> {
        match self {
            Dialogue::Harmony(_) => Err(fail(
                ErrorKind::InvalidInput,
                "gpt-oss always reasons: set its effort (low, medium or high) instead",
            )),
            Dialogue::Plain(c) => match &text.template {
                Some(t) if !c.raw && t.mentions("enable_thinking") => {
                    c.thinking = Some(on);
                    Ok(())
                }
                _ => Err(fail(
                    ErrorKind::InvalidInput,
                    "this model's chat template has no thinking switch (enable_thinking)",
                )),
            },
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

/// A chat-template model's turn, its reply read by the model's reply format
/// ([`reply::reader`]): plain text for the formats we have, reasoning and calls apart for a
/// format that writes them.
fn plain_turn(
    chat: &mut Conversation,
    session: &mut Session,
    text: &TextSide,
    s: Sampling,
    sink: &mut dyn TurnSink,
) -> anyhow::Result<TurnEnd> {
    let ids = chat.prompt_ids(text)?;
    let max_tokens = s.stop.max_tokens;
    let opts = ReplyOptions { stop: s.stop, tools: Vec::new(), raw: chat.raw };
    let mut reply = reply::reader(text, opts)?;
    let mut answer = String::new();
    let mut show = |deltas: Vec<Delta>, answer: &mut String| -> anyhow::Result<()> {
        for d in deltas {
            match d {
                Delta::Content(t) => {
                    answer.push_str(&t);
                    sink.event(&TurnEvent::Answer(&t))?;
                }
                Delta::Reasoning(t) => sink.event(&TurnEvent::Reasoning(&t))?,
                Delta::ToolStart { name, .. } => {
                    sink.event(&TurnEvent::ToolCall { recipient: &name })?
                }
                Delta::ToolArgs { text, .. } => sink.event(&TurnEvent::ToolArguments(&text))?,
                Delta::Logprobs(_) => {}
            }
        }
        Ok(())
    };
    let eos_ids = reply.stop_ids();
    let mut generation =
        session.generate(&ids, s.sampler, max_tokens, eos_ids, s.interrupt, &mut |id| {
            let (deltas, stop) = reply.push(id, None)?;
            show(deltas, &mut answer)?;
            Ok(stop)
        })?;
    let (tail, _) = reply.finish(&generation.reason, None)?;
    show(tail, &mut answer)?;
    generation.text = answer;
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
