//! What every reply format shares: the [`ReplyFormat`] trait a format implements, the
//! [`Delta`]s it reads a reply into, and the small pieces formats build on (call ids, names,
//! log probabilities waiting for their text).

use super::logprobs::Entry;
use crate::generate::{StopConditions, StopReason};

/// A piece of the reply, as it streams.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Reasoning(String),
    Content(String),
    /// A tool call begins: its index among this reply's calls, its id, the function name.
    ToolStart {
        index: usize,
        id: String,
        name: String,
    },
    /// A fragment of a call's arguments (JSON text as the model writes it).
    ToolArgs {
        index: usize,
        text: String,
    },
    /// Log probabilities of the tokens of the content that follows (or, last, of tokens whose
    /// text a stop string cut).
    Logprobs(Vec<Entry>),
}

/// Why a reply ended, as OpenAI's `finish_reason` names it (Messages and Responses map it to
/// their own words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::ToolCalls => "tool_calls",
        }
    }
}

/// The finish reason of a generation that stopped for `reason`.
pub fn finish_of(reason: &StopReason) -> FinishReason {
    match reason {
        StopReason::MaxTokens | StopReason::ContextFull => FinishReason::Length,
        _ => FinishReason::Stop,
    }
}

/// How one chat format reads a reply, token by token. The caller feeds every sampled id in
/// order until [`Self::push`] or the engine ends the reply, then calls [`Self::finish`] once.
pub trait ReplyFormat {
    /// The ids the engine itself stops on (the format's end of turn): the end-of-sequence ids,
    /// harmony's `<|return|>` and `<|call|>`.
    fn stop_ids(&self) -> Vec<u32>;

    /// One sampled id, with its log probabilities when they were asked for: the deltas it
    /// completes, and why the reply ends here when it does (the model ended its turn, a stop
    /// string came).
    fn push(
        &mut self,
        id: u32,
        entry: Option<Entry>,
    ) -> anyhow::Result<(Vec<Delta>, Option<StopReason>)>;

    /// After the last id: what is left of the reply, and why it ended. `engine`: why the
    /// engine stopped; `ours`: what [`Self::push`] said, when it ended the reply.
    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<&StopReason>,
    ) -> anyhow::Result<(Vec<Delta>, FinishReason)>;

    /// The stop string that ended the reply, if one did.
    fn stop_string(&self) -> Option<String>;

    /// Tokens of reasoning text read so far (markup not counted): `usage`'s
    /// `reasoning_tokens`.
    fn reasoning_tokens(&self) -> usize {
        0
    }
}

/// What a reply is read for.
#[derive(Debug, Clone, Default)]
pub struct ReplyOptions {
    /// The end-of-sequence ids, the stop strings (the reply's visible text ends before the
    /// first of them) and the token budget. A format with its own end-of-turn tokens (harmony)
    /// stops on those instead of the ids.
    pub stop: StopConditions,
    /// Names of the functions the request offered: a reply in the format's call syntax that
    /// names one of them is read as calls. Empty: no calls are read.
    pub tools: Vec<String>,
    /// Raw text (a completion, `play --raw`): no chat format, whatever the model.
    pub raw: bool,
}

/// Log-probability entries waiting for the content they belong to: a token's text can come
/// out later than the token (an incomplete character, a possible stop string, a possible tool
/// call), and a chunk's logprobs describe the tokens of its text.
#[derive(Default)]
pub struct PendingLogprobs(Vec<Entry>);

impl PendingLogprobs {
    pub fn push(&mut self, entry: Option<Entry>) {
        self.0.extend(entry);
    }

    /// Puts the waiting entries just before the first content of `deltas`, if there is any.
    pub fn attach(&mut self, deltas: &mut Vec<Delta>) {
        if self.0.is_empty() {
            return;
        }
        if let Some(at) = deltas.iter().position(|d| matches!(d, Delta::Content(_))) {
            deltas.insert(at, Delta::Logprobs(std::mem::take(&mut self.0)));
        }
    }

    /// At the end: the waiting entries go out, with content or alone.
    pub fn flush(&mut self, deltas: &mut Vec<Delta>) {
        self.attach(deltas);
        if !self.0.is_empty() {
            deltas.push(Delta::Logprobs(std::mem::take(&mut self.0)));
        }
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// The prefix of one reply's tool call ids (`call_…`, then the call's index).
pub fn call_ids() -> String {
    format!("call_{:016x}", rand::random::<u64>())
}

/// A function name as OpenAI allows it, so no markup or stray text ever becomes a tool name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}
