//! The one reader of a model's reply: sampled ids in, [`Delta`]s out (the answer's text,
//! reasoning, tool calls, and the log probabilities of the answer's tokens), for every front
//! end (`play`'s turns, every `serve` endpoint) and every chat format.
//!
//! A format is one implementation of [`ReplyFormat`]:
//! - [`plain`]: the text a chat template's model writes, through the incremental detokenizer
//!   and the stop strings; with tools offered, Llama 3's JSON tool calls ([`llama`]).
//! - [`harmony`]: gpt-oss's channels (reasoning, answer, preambles and calls apart, no markup).
//! - [`hermes`]: Qwen3's `<think>…</think>` reasoning and Hermes `<tool_call>` blocks.
//! - [`mistral`]: Mistral's calls after its `[TOOL_CALLS]` control token.
//!
//! [`reader`] chooses the format for a model. **Adding a format** is one new implementation of [`ReplyFormat`] in a file here, built on the
//! same pieces ([`crate::generate::TokenStream`], [`crate::generate::StopChecker`],
//! [`PendingLogprobs`], [`call_ids`]), plus one line in [`reader`] choosing it; play and serve
//! read every format through the trait and do not change.

pub mod events;
pub mod format;
pub mod harmony;
pub mod hermes;
pub mod llama;
pub mod logprobs;
pub mod mistral;
pub mod plain;

use crate::chat::harmony::HarmonyEncoding;
use crate::load::text::TextSide;
pub use events::{Part, TurnEnd, TurnEvent, TurnSink};
pub use format::{
    Delta, FinishReason, PendingLogprobs, ReplyFormat, ReplyOptions, call_ids, finish_of,
    valid_name,
};
pub use harmony::{Harmony, HarmonyReply};
pub use hermes::Hermes;
pub use logprobs::{Entry, Piece, TokenText};
pub use mistral::Mistral;
pub use plain::Plain;

/// The reader of a reply from the model whose text side is `text`: the one place that maps a
/// model to its reply format (add a format's line here).
pub fn reader<'t>(
    text: &'t TextSide,
    opts: ReplyOptions,
) -> anyhow::Result<Box<dyn ReplyFormat + Send + 't>> {
    if !opts.raw
        && let Ok(enc) = HarmonyEncoding::new(&text.tokenizer)
    {
        return Ok(Box::new(Harmony::new(enc, opts.stop.stop_strings)));
    }
    if !opts.raw && hermes::speaks(&text.tokenizer) {
        return Ok(Box::new(Hermes::new(&text.tokenizer, opts.stop, opts.tools)));
    }
    if !opts.raw && mistral::speaks(&text.tokenizer) {
        return Ok(Box::new(Mistral::new(&text.tokenizer, opts.stop, opts.tools)));
    }
    Ok(Box::new(Plain::new(&text.tokenizer, opts.stop, opts.tools)))
}
