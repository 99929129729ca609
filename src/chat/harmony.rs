//! OpenAI's harmony chat format (gpt-oss): conversations rendered straight to token ids, and the
//! model's output parsed, as it streams, into messages on channels.
//!
//! A harmony message is `<|start|>{header}<|message|>{content}<|end|>`; the header is the role
//! (a tool's name for tool messages), an optional ` to={recipient}`, an optional
//! `<|channel|>{channel}` and an optional content type (` <|constrain|>json`). An assistant turn
//! is usually two messages: chain of thought on `analysis`, then the answer on `final`, which ends
//! with `<|return|>` (or `<|call|>` for a tool call) instead of `<|end|>`.
//!
//! Rendering follows OpenAI's `harmony` library (v0.0.8) token for token
//! (`tests/fixtures/harmony.json`, made by `scripts/fixtures/harmony.py` from the library itself):
//! control tokens are inserted as ids and every text piece is BPE-encoded on its own **without**
//! special-token matching, so user text such as `"<|end|>"` stays plain text. (`Tokenizer::encode`
//! would match it even with `add_special_tokens = false`; [`HarmonyEncoding::encode_text`] runs
//! only the normalizer, pre-tokenizer and BPE model.) One deliberate difference: harmony drops
//! analysis messages only before the *first* final message, and only when the conversation's
//! last assistant message is final; we drop the analysis of *every* turn that later got a final
//! answer, as the model's Hub chat template does. The two agree for a conversation with one
//! finished turn, and for a tool call in progress (its analysis is kept).
//!
//! Our prompts differ from the Hub template's (`tests/fixtures/chat_templates.json`) in one way
//! only: harmony writes the developer instructions as `# Instructions\n\n{text}`, the template
//! adds a trailing `\n\n`. We write harmony's canonical form.
//!
//! [`HarmonyParser`] is the other direction: fed the sampled ids one by one, it emits
//! [`HarmonyEvent`]s (message start, text deltas per channel, message end, done), so a front-end
//! can show reasoning apart from the answer and never shows markup. [`HarmonyChat`] is the
//! conversation state a REPL keeps between turns.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use anyhow::{Result, anyhow};
use tokenizers::{Model, Normalizer, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

use super::strftime::strftime;
use crate::error::{ErrorKind, fail};

/// harmony's default `model_identity` (also the Hub template's).
pub const DEFAULT_IDENTITY: &str = "You are ChatGPT, a large language model trained by OpenAI.";
/// harmony's default knowledge cutoff.
pub const DEFAULT_KNOWLEDGE_CUTOFF: &str = "2024-06";
/// The system message's last section: every gpt-oss prompt declares these three channels.
const CHANNELS_LINE: &str =
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.";
/// Added under the channels line when the developer message defines function tools.
const TOOLS_CHANNEL_LINE: &str =
    "Calls to these tools must go to the commentary channel: 'functions'.";

// ------------------------------------------------------------------------------- messages

/// How much the model reasons before answering (`Reasoning: …` in the system message).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReasoningEffort {
    Low,
    #[default]
    Medium,
    High,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
        }
    }
}

impl fmt::Display for ReasoningEffort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ReasoningEffort {
    type Err = anyhow::Error;

    /// `low`, `medium` or `high`, in any case.
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "low" => Ok(ReasoningEffort::Low),
            "medium" => Ok(ReasoningEffort::Medium),
            "high" => Ok(ReasoningEffort::High),
            _ => Err(fail(
                ErrorKind::InvalidInput,
                format!("reasoning effort must be low, medium or high, not {s:?}"),
            )),
        }
    }
}

/// The system message's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemConfig {
    pub model_identity: String,
    pub knowledge_cutoff: String,
    /// `YYYY-MM-DD`; harmony leaves it out when unset, the Hub template always writes today.
    pub current_date: Option<String>,
    pub reasoning: ReasoningEffort,
}

impl Default for SystemConfig {
    fn default() -> Self {
        SystemConfig {
            model_identity: DEFAULT_IDENTITY.to_string(),
            knowledge_cutoff: DEFAULT_KNOWLEDGE_CUTOFF.to_string(),
            current_date: None,
            reasoning: ReasoningEffort::default(),
        }
    }
}

impl SystemConfig {
    /// Sets `current_date` to the UTC date of `t` (e.g. `SystemTime::now()`, once per
    /// conversation: a date that changes mid-chat changes the prompt's first tokens).
    pub fn with_date(mut self, t: SystemTime) -> Self {
        self.current_date = Some(strftime(t, "%Y-%m-%d"));
        self
    }

    /// The system message text: sections joined by a blank line.
    pub fn text(&self) -> String {
        self.text_with_tools(false)
    }

    /// The system message text for a conversation that defines function tools or not: with
    /// tools, harmony adds a line to the channels section saying where calls go.
    pub fn text_with_tools(&self, function_tools: bool) -> String {
        let top: Vec<String> = [
            (!self.model_identity.is_empty()).then(|| self.model_identity.clone()),
            (!self.knowledge_cutoff.is_empty())
                .then(|| format!("Knowledge cutoff: {}", self.knowledge_cutoff)),
            self.current_date.as_ref().map(|d| format!("Current date: {d}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        let mut sections = Vec::new();
        if !top.is_empty() {
            sections.push(top.join("\n"));
        }
        sections.push(format!("Reasoning: {}", self.reasoning));
        let mut channels = CHANNELS_LINE.to_string();
        if function_tools {
            channels.push('\n');
            channels.push_str(TOOLS_CHANNEL_LINE);
        }
        sections.push(channels);
        sections.join("\n\n")
    }
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    /// A tool's output; the header carries the tool's name ([`HarmonyMessage::name`]).
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    fn parse(s: &str) -> Option<Role> {
        [Role::System, Role::Developer, Role::User, Role::Assistant, Role::Tool]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// The channel of an assistant message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Channel {
    /// Chain of thought: not for end users, dropped from later prompts.
    Analysis,
    /// Tool calls, and preambles the model writes before them.
    Commentary,
    /// The answer.
    Final,
    /// A name the format does not define (the model made it up).
    Other(String),
}

impl Channel {
    pub fn parse(s: &str) -> Channel {
        match s {
            "analysis" => Channel::Analysis,
            "commentary" => Channel::Commentary,
            "final" => Channel::Final,
            other => Channel::Other(other.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Channel::Analysis => "analysis",
            Channel::Commentary => "commentary",
            Channel::Final => "final",
            Channel::Other(s) => s,
        }
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HarmonyMessage {
    pub role: Role,
    /// The author's name: required for [`Role::Tool`] (`functions.get_weather`), where it is
    /// written instead of the role; written as `role:name` otherwise.
    pub name: Option<String>,
    /// ` to={recipient}` in the header: the tool an assistant message calls (it then ends with
    /// `<|call|>`), or `assistant` on a tool's result.
    pub recipient: Option<String>,
    pub channel: Option<Channel>,
    /// ` {content_type}` in the header; `<|constrain|>json` is written with the special token.
    pub content_type: Option<String>,
    pub content: String,
}

impl HarmonyMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        HarmonyMessage {
            role,
            name: None,
            recipient: None,
            channel: None,
            content_type: None,
            content: content.into(),
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message on `channel`.
    pub fn assistant(channel: Channel, content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content).with_channel(channel)
    }

    /// A tool's result, addressed back to the assistant on the commentary channel.
    pub fn tool_result(tool: impl Into<String>, content: impl Into<String>) -> Self {
        let mut m = Self::new(Role::Tool, content).with_channel(Channel::Commentary);
        m.name = Some(tool.into());
        m.recipient = Some("assistant".into());
        m
    }

    pub fn with_channel(mut self, channel: Channel) -> Self {
        self.channel = Some(channel);
        self
    }

    pub fn with_recipient(mut self, recipient: impl Into<String>) -> Self {
        self.recipient = Some(recipient.into());
        self
    }

    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    fn is_assistant_on(&self, channel: &Channel) -> bool {
        self.role == Role::Assistant && self.channel.as_ref() == Some(channel)
    }
}

// ------------------------------------------------------------------------------- rendering

/// The control tokens of the format, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    pub start: u32,
    pub end: u32,
    pub message: u32,
    pub channel: u32,
    /// Ends the final message of a turn (sampling stops).
    pub return_: u32,
    /// Ends a tool call (sampling stops).
    pub call: u32,
    pub constrain: u32,
}

/// Renders harmony conversations to ids with one tokenizer (gpt-oss's o200k_harmony).
/// Cheap to create: it only looks up the control tokens.
#[derive(Clone, Copy)]
pub struct HarmonyEncoding<'t> {
    tokenizer: &'t Tokenizer,
    ids: SpecialIds,
    /// The lowest id of the tokenizer's added tokens: ids from here on are never content.
    first_added: u32,
}

impl fmt::Debug for HarmonyEncoding<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HarmonyEncoding").field("ids", &self.ids).finish_non_exhaustive()
    }
}

impl<'t> HarmonyEncoding<'t> {
    /// Looks up the control tokens by name; fails if the tokenizer lacks any of them (it is not
    /// a harmony tokenizer).
    pub fn new(tokenizer: &'t Tokenizer) -> Result<Self> {
        let id = |name: &str| {
            tokenizer.token_to_id(name).ok_or_else(|| {
                fail(
                    ErrorKind::InvalidInput,
                    format!("the tokenizer has no {name} token: the harmony format needs gpt-oss's tokenizer"),
                )
            })
        };
        let ids = SpecialIds {
            start: id("<|start|>")?,
            end: id("<|end|>")?,
            message: id("<|message|>")?,
            channel: id("<|channel|>")?,
            return_: id("<|return|>")?,
            call: id("<|call|>")?,
            constrain: id("<|constrain|>")?,
        };
        let control =
            [ids.start, ids.end, ids.message, ids.channel, ids.return_, ids.call, ids.constrain];
        let added = tokenizer.get_added_vocabulary().get_added_tokens_decoder().keys().copied();
        let first_added = added.chain(control).min().unwrap_or(u32::MAX);
        Ok(HarmonyEncoding { tokenizer, ids, first_added })
    }

    pub fn tokenizer(&self) -> &'t Tokenizer {
        self.tokenizer
    }

    pub fn ids(&self) -> SpecialIds {
        self.ids
    }

    /// The ids that end an assistant turn when sampled: `<|return|>` and `<|call|>` (harmony's
    /// `stop_tokens_for_assistant_actions`). Not `<|end|>`: it only ends the analysis message,
    /// and the model goes on with the final one.
    pub fn stop_ids(&self) -> Vec<u32> {
        vec![self.ids.return_, self.ids.call]
    }

    /// True for added/special tokens (never message text).
    pub fn is_special(&self, id: u32) -> bool {
        id >= self.first_added
    }

    /// BPE ids of plain text, with no special-token matching (harmony's `encode_ordinary`):
    /// `"<|end|>"` in `text` becomes the ids of `<`, `|`, `end`, … .
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let err = |e: tokenizers::Error| anyhow!("tokenizing harmony text: {e}");
        let mut pieces = PreTokenizedString::from(text);
        if let Some(n) = self.tokenizer.get_normalizer() {
            pieces.normalize(|s| n.normalize(s)).map_err(err)?;
        }
        if let Some(p) = self.tokenizer.get_pre_tokenizer() {
            p.pre_tokenize(&mut pieces).map_err(err)?;
        }
        let model = self.tokenizer.get_model();
        pieces.tokenize(|s| model.tokenize(s.get())).map_err(err)?;
        Ok(pieces.into_encoding(None, 0, OffsetType::None).map_err(err)?.get_ids().to_vec())
    }

    /// The prompt for the assistant's next turn: the system message, the developer message
    /// (`# Instructions\n\n{text}`, only when there are instructions), `history` (analysis of
    /// finished turns dropped), then `<|start|>assistant`.
    pub fn render_prompt(
        &self,
        system: &SystemConfig,
        developer_instructions: Option<&str>,
        history: &[HarmonyMessage],
    ) -> Result<Vec<u32>> {
        self.render_prompt_with_tools(system, developer_instructions, &[], history)
    }

    /// [`Self::render_prompt`] for a conversation with function tools: the developer message
    /// (written when there are instructions or tools) is `# Instructions\n\n{text}` and the
    /// `# Tools` section, joined by a blank line, and the system message says that calls go
    /// to the commentary channel.
    pub fn render_prompt_with_tools(
        &self,
        system: &SystemConfig,
        developer_instructions: Option<&str>,
        tools: &[ToolDef],
        history: &[HarmonyMessage],
    ) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let system_text = system.text_with_tools(!tools.is_empty());
        self.render_message(&HarmonyMessage::new(Role::System, system_text), &mut out)?;
        let mut developer = Vec::new();
        if let Some(text) = developer_instructions.filter(|t| !t.is_empty()) {
            developer.push(format!("# Instructions\n\n{text}"));
        }
        if !tools.is_empty() {
            developer.push(tools::functions_section(tools)?);
        }
        if !developer.is_empty() {
            let m = HarmonyMessage::new(Role::Developer, developer.join("\n\n"));
            self.render_message(&m, &mut out)?;
        }
        // Analysis before the last final answer belongs to a finished turn.
        let last_final = history.iter().rposition(|m| m.is_assistant_on(&Channel::Final));
        for (i, m) in history.iter().enumerate() {
            if m.is_assistant_on(&Channel::Analysis) && last_final.is_some_and(|f| i < f) {
                continue;
            }
            self.render_message(m, &mut out)?;
        }
        out.push(self.ids.start);
        out.extend(self.encode_text(Role::Assistant.as_str())?);
        Ok(out)
    }

    /// Appends one message: `<|start|>{header}<|message|>{content}<|end|>`, or `<|call|>` at the
    /// end of an assistant message with a recipient (a tool call).
    pub fn render_message(&self, m: &HarmonyMessage, out: &mut Vec<u32>) -> Result<()> {
        out.push(self.ids.start);
        match (m.role, &m.name) {
            (Role::Tool, Some(name)) => out.extend(self.encode_text(name)?),
            (Role::Tool, None) => {
                return Err(fail(ErrorKind::InvalidInput, "a tool message needs the tool's name"));
            }
            (role, name) => {
                out.extend(self.encode_text(role.as_str())?);
                if let Some(name) = name {
                    out.extend(self.encode_text(&format!(":{name}"))?);
                }
            }
        }
        if let Some(r) = m.recipient.as_deref().filter(|r| *r != "all") {
            out.extend(self.encode_text(&format!(" to={r}"))?);
        }
        if let Some(c) = &m.channel {
            out.push(self.ids.channel);
            out.extend(self.encode_text(c.as_str())?);
        }
        if let Some(ct) = &m.content_type {
            match ct.strip_prefix(CONSTRAIN) {
                Some(rest) => {
                    out.extend(self.encode_text(" ")?);
                    out.push(self.ids.constrain);
                    out.extend(self.encode_text(rest)?);
                }
                None => out.extend(self.encode_text(&format!(" {ct}"))?),
            }
        }
        out.push(self.ids.message);
        out.extend(self.encode_text(&m.content)?);
        let call = m.role == Role::Assistant && m.recipient.is_some();
        out.push(if call { self.ids.call } else { self.ids.end });
        Ok(())
    }

    /// A parser for the model's continuation of a prompt from [`Self::render_prompt`] (which
    /// ends in `<|start|>assistant`, so the first message's role is known).
    pub fn parser(&self) -> HarmonyParser<'t> {
        HarmonyParser::new(*self)
    }
}

const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";

mod parser;
pub mod tools;
pub use parser::{DoneReason, HarmonyEvent, HarmonyParser};
pub use tools::{ToolCall, ToolDef};

// ------------------------------------------------------------------------------- chat state

/// A conversation with gpt-oss as a REPL or a server keeps it: system settings, developer
/// instructions (the user's system prompt), function tools and the turns so far. A turn still
/// inside tool calls keeps its analysis (the model needs its reasoning to go on after a
/// result); once a turn ends in a final answer its analysis is no longer sent back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarmonyChat {
    pub system: SystemConfig,
    /// Written as the developer message; `None` leaves it out.
    pub instructions: Option<String>,
    /// Written as the developer message's `functions` namespace.
    pub tools: Vec<ToolDef>,
    messages: Vec<HarmonyMessage>,
    /// The function calls in `messages`, so a result can be matched to its call by id.
    calls: Vec<CallRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct CallRecord {
    /// Index of the call's message in `messages`.
    at: usize,
    id: String,
    name: String,
    answered: bool,
}

impl HarmonyChat {
    pub fn new(system: SystemConfig, instructions: Option<String>) -> Self {
        HarmonyChat {
            system,
            instructions: instructions.filter(|s| !s.is_empty()),
            ..HarmonyChat::default()
        }
    }

    /// Sets or removes the developer instructions (`--system`, `/system`).
    pub fn set_instructions(&mut self, instructions: Option<String>) {
        self.instructions = instructions.filter(|s| !s.is_empty());
    }

    pub fn set_reasoning(&mut self, effort: ReasoningEffort) {
        self.system.reasoning = effort;
    }

    pub fn messages(&self) -> &[HarmonyMessage] {
        &self.messages
    }

    pub fn push_user(&mut self, text: &str) {
        self.messages.push(HarmonyMessage::user(text));
    }

    pub fn push_assistant_final(&mut self, text: &str) {
        self.messages.push(HarmonyMessage::assistant(Channel::Final, text));
    }

    /// Sets the function tools (OpenAI `tools`, see [`tools::tools_from_openai`]).
    pub fn set_tools(&mut self, tools: Vec<ToolDef>) {
        self.tools = tools;
    }

    /// An earlier assistant message's reasoning (OpenAI `reasoning_content`): sent back only
    /// while its turn is still inside tool calls.
    pub fn push_assistant_reasoning(&mut self, text: &str) {
        self.messages.push(HarmonyMessage::assistant(Channel::Analysis, text));
    }

    /// An assistant's call of function `name` (OpenAI `tool_calls[]`), rendered as harmony
    /// renders a past call; `id` is what its result will name.
    pub fn push_tool_call(&mut self, id: &str, name: &str, arguments: &str) -> Result<()> {
        if self.calls.iter().any(|c| c.id == id) {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!("tool call id {id:?} is used twice"),
            ));
        }
        self.calls.push(CallRecord {
            at: self.messages.len(),
            id: id.to_string(),
            name: name.to_string(),
            answered: false,
        });
        self.messages.push(tools::call_message(name, arguments));
        Ok(())
    }

    /// A tool's result (OpenAI `role: "tool"`), matched to its call by `call_id`: rendered as
    /// `functions.NAME to=assistant` on the commentary channel. A result without a call, or a
    /// second result for one call, is an error: harmony needs the name, and the model would
    /// read a result nobody asked for.
    pub fn push_tool_result(&mut self, call_id: &str, content: &str) -> Result<()> {
        let call = self.calls.iter_mut().find(|c| c.id == call_id).ok_or_else(|| {
            fail(
                ErrorKind::InvalidInput,
                format!("tool message for call {call_id:?}: no assistant tool call has that id"),
            )
        })?;
        if call.answered {
            return Err(fail(
                ErrorKind::InvalidInput,
                format!("tool call {call_id:?} already has a result"),
            ));
        }
        call.answered = true;
        let name = format!("{}.{}", tools::FUNCTIONS, call.name);
        self.messages.push(HarmonyMessage::tool_result(name, content));
        Ok(())
    }

    /// The function calls not yet given a result: (id, name).
    pub fn pending_calls(&self) -> impl Iterator<Item = (&str, &str)> {
        self.calls.iter().filter(|c| !c.answered).map(|c| (c.id.as_str(), c.name.as_str()))
    }

    /// Records a reply that ended in a tool call (`<|call|>`, [`HarmonyParser::messages`])
    /// whole: analysis, preambles and the call, since the turn goes on after the result and the
    /// model needs its reasoning then. Function calls get the ids `call_N`; returns them, in
    /// order, for [`Self::push_tool_result`]. Records nothing and returns nothing for a reply
    /// without a call (that is [`Self::record_reply`]'s case).
    pub fn record_tool_calls(&mut self, reply: &[HarmonyMessage]) -> Vec<String> {
        if !reply.iter().any(|m| m.role == Role::Assistant && m.recipient.is_some()) {
            return Vec::new();
        }
        let mut ids = Vec::new();
        for m in reply.iter().filter(|m| m.role == Role::Assistant) {
            if let Some(name) = m.recipient.as_deref().and_then(tools::function_name) {
                // The first free `call_N`: ids pushed by hand may already use some.
                let id = (self.calls.len()..)
                    .map(|n| format!("call_{n}"))
                    .find(|id| self.calls.iter().all(|c| &c.id != id))
                    .unwrap_or_default();
                let name = name.to_string();
                let at = self.messages.len();
                self.calls.push(CallRecord { at, id: id.clone(), name, answered: false });
                ids.push(id);
            }
            self.messages.push(m.clone());
        }
        ids
    }

    /// Records a reply from [`HarmonyParser::messages`]: its final message(s) only, so the
    /// next prompt has the answer ending in `<|end|>` and no analysis. Returns false (and
    /// records nothing) when the reply has no final text, e.g. stopped while still reasoning
    /// or in a tool call (a caller that runs tools records those with
    /// [`Self::record_tool_calls`]).
    pub fn record_reply(&mut self, reply: &[HarmonyMessage]) -> bool {
        let finals: Vec<&HarmonyMessage> = reply
            .iter()
            .filter(|m| m.is_assistant_on(&Channel::Final) && !m.content.is_empty())
            .collect();
        for m in &finals {
            self.push_assistant_final(&m.content);
        }
        !finals.is_empty()
    }

    /// Takes back the last user message and anything after it (a turn that failed).
    pub fn undo_turn(&mut self) {
        if let Some(at) = self.messages.iter().rposition(|m| m.role == Role::User) {
            self.messages.truncate(at);
            self.calls.retain(|c| c.at < at);
        }
    }

    /// Forgets the turns (keeps the system settings and instructions).
    pub fn clear(&mut self) {
        self.messages.clear();
        self.calls.clear();
    }

    /// The prompt for the next assistant turn.
    pub fn prompt_ids(&self, enc: &HarmonyEncoding) -> Result<Vec<u32>> {
        enc.render_prompt_with_tools(
            &self.system,
            self.instructions.as_deref(),
            &self.tools,
            &self.messages,
        )
    }
}

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
