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
//! conversation state a REPL or a server keeps between turns. Function tools (the developer
//! message's `functions` namespace, tool calls and their results) are in [`tools`].

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

use anyhow::{Result, anyhow};
use tokenizers::{Model, Normalizer, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

use crate::error::{ErrorKind, fail};
use crate::template::strftime::strftime;

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
        self.render_prompt_with_formats(system, developer_instructions, tools, None, history)
    }

    /// [`Self::render_prompt_with_tools`] with a `# Response Formats` section (structured
    /// output: the schema the answer follows) last in the developer message.
    pub fn render_prompt_with_formats(
        &self,
        system: &SystemConfig,
        developer_instructions: Option<&str>,
        tools: &[ToolDef],
        response_formats: Option<&str>,
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
        if let Some(formats) = response_formats {
            developer.push(formats.to_string());
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

mod chat;
pub use chat::HarmonyChat;

#[cfg(test)]
#[path = "harmony_tests.rs"]
mod tests;
