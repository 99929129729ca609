//! [`HarmonyChat`]: the conversation state kept between turns (a REPL's history, or a server
//! request's messages), rendered by [`HarmonyEncoding::render_prompt_with_tools`].

use anyhow::Result;

use super::tools::{self, ToolDef};
use super::{Channel, HarmonyEncoding, HarmonyMessage, ReasoningEffort, Role, SystemConfig};
use crate::error::{ErrorKind, fail};

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
    /// The developer message's `# Response Formats` section (structured output), if any.
    pub response_formats: Option<String>,
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

    /// The text an assistant wrote before its tool calls (OpenAI `content` beside
    /// `tool_calls`): a commentary message without recipient, as harmony writes a preamble.
    pub fn push_assistant_preamble(&mut self, text: &str) {
        self.messages.push(HarmonyMessage::assistant(Channel::Commentary, text));
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
            // Text on a channel harmony does not have was shown as the answer: kept as one.
            .filter(|m| {
                let other = matches!(m.channel, Some(Channel::Other(_))) && m.recipient.is_none();
                (m.is_assistant_on(&Channel::Final) || (other && m.role == Role::Assistant))
                    && !m.content.is_empty()
            })
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

    /// Forgets the oldest turn (its user message and everything up to the next user message,
    /// tool calls and results included); false when no turn comes before the last user
    /// message.
    pub fn drop_oldest_turn(&mut self) -> bool {
        let Some(next) = self.messages.iter().skip(1).position(|m| m.role == Role::User) else {
            return false;
        };
        let cut = next + 1;
        self.messages.drain(..cut);
        self.calls.retain(|c| c.at >= cut);
        for c in &mut self.calls {
            c.at -= cut;
        }
        true
    }

    /// Forgets the turns (keeps the system settings and instructions).
    pub fn clear(&mut self) {
        self.messages.clear();
        self.calls.clear();
    }

    /// The prompt for the next assistant turn.
    pub fn prompt_ids(&self, enc: &HarmonyEncoding) -> Result<Vec<u32>> {
        enc.render_prompt_with_formats(
            &self.system,
            self.instructions.as_deref(),
            &self.tools,
            self.response_formats.as_deref(),
            &self.messages,
        )
    }
}
