//! What a chat turn reports to its front end, event by event (play prints them; tests collect
//! them): the view of a reply with harmony's messages and parts apart, which
//! [`super::harmony::HarmonyReply`] produces and the plain turn sends as answers.

use crate::generate::Generation;

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
