//! A plain model's reply (a chat template's, or raw text) read into deltas: the incremental
//! detokenizer and stop strings, and, when the request offered tools, Llama-style tool calls
//! ([`super::llama`]) in place of their JSON text.

use tokenizers::Tokenizer;

use super::format::{Delta, FinishReason, PendingLogprobs, ReplyFormat, call_ids, finish_of};
use super::llama::{PYTHON_TAG, Sniffer};
use super::logprobs::Entry;
use crate::generate::{StopChecker, StopConditions, StopReason, TokenStream};

/// A reply's text as it comes, for the formats that read text: the incremental detokenizer
/// and the stop strings.
pub struct ReplyText<'r> {
    stream: TokenStream<'r>,
    /// The model's end-of-sequence ids (the engine stops on them).
    eos_ids: Vec<u32>,
    stop: StopChecker,
    /// A stop string ended it (what follows it is never shown).
    on_string: bool,
    /// Which one.
    stop_string: Option<String>,
}

impl<'r> ReplyText<'r> {
    pub fn new(tokenizer: &'r Tokenizer, cond: StopConditions) -> Self {
        ReplyText {
            stream: TokenStream::new(tokenizer),
            eos_ids: cond.eos_ids.clone(),
            stop: StopChecker::new(cond),
            on_string: false,
            stop_string: None,
        }
    }

    pub fn eos_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    pub fn stop_string(&self) -> Option<String> {
        self.stop_string.clone()
    }

    /// Whether `id` ends the reply (it is then no part of its text, nor of its logprobs).
    pub fn is_eos(&self, id: u32) -> bool {
        self.stop.is_eos(id)
    }

    /// One token: the text it completes, and the end when a stop string or an end-of-sequence
    /// id came.
    pub fn push(&mut self, id: u32) -> anyhow::Result<(String, Option<StopReason>)> {
        let piece = if self.is_eos(id) { None } else { self.stream.push(id)? };
        let step = self.stop.push(id, piece.as_deref().unwrap_or(""));
        self.on_string = matches!(step.stop, Some(StopReason::StopString(_)));
        if let Some(StopReason::StopString(s)) = &step.stop {
            self.stop_string = Some(s.clone());
        }
        Ok((step.text, step.stop))
    }

    /// After the last token: the text still held back (none after a stop string).
    pub fn finish(&mut self) -> anyhow::Result<String> {
        if self.on_string {
            return Ok(String::new());
        }
        let rest = self.stream.finish()?.unwrap_or_default();
        Ok(format!("{}{rest}", self.stop.finish()))
    }
}

pub struct Plain<'r> {
    text: ReplyText<'r>,
    /// With tools offered: the reply may be a call.
    calls: Option<Sniffer>,
    python_tag: Option<u32>,
    logprobs: PendingLogprobs,
}

impl<'r> Plain<'r> {
    pub fn new(tokenizer: &'r Tokenizer, cond: StopConditions, tools: Vec<String>) -> Self {
        Plain {
            text: ReplyText::new(tokenizer, cond),
            calls: (!tools.is_empty()).then(|| Sniffer::new(tools)),
            python_tag: tokenizer.token_to_id(PYTHON_TAG),
            logprobs: PendingLogprobs::default(),
        }
    }
}

impl ReplyFormat for Plain<'_> {
    fn stop_ids(&self) -> Vec<u32> {
        self.text.eos_ids()
    }

    fn stop_string(&self) -> Option<String> {
        self.text.stop_string()
    }

    /// One token (with its log probabilities when asked): the deltas it completes, and the
    /// end when a stop string or an end-of-sequence id came.
    fn push(
        &mut self,
        id: u32,
        entry: Option<Entry>,
    ) -> anyhow::Result<(Vec<Delta>, Option<StopReason>)> {
        if !self.text.is_eos(id) {
            self.logprobs.push(entry);
        }
        let (text, stop) = self.text.push(id)?;
        let text = match &mut self.calls {
            Some(sniffer) => sniffer.push(&text, Some(id) == self.python_tag),
            None => text,
        };
        let mut deltas = content(text);
        self.logprobs.attach(&mut deltas);
        Ok((deltas, stop))
    }

    /// What is left after the last token, and how the reply ended (`ours`: this side stopped
    /// it). Tokens a stop string cut stay in the logprobs (vLLM's choice: the text is cut, not
    /// the tokens).
    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<&StopReason>,
    ) -> anyhow::Result<(Vec<Delta>, FinishReason)> {
        let tail = self.text.finish()?;
        let finish = finish_of(ours.unwrap_or(engine));
        let Some(sniffer) = &mut self.calls else {
            let mut deltas = content(tail);
            self.logprobs.flush(&mut deltas);
            return Ok((deltas, finish));
        };
        match sniffer.finish(&tail) {
            Ok(calls) => {
                // A call is not content: its tokens have no place in `logprobs.content`.
                self.logprobs.clear();
                let ids = call_ids();
                let mut deltas = Vec::new();
                for (index, call) in calls.into_iter().enumerate() {
                    let id = format!("{ids}{index}");
                    deltas.push(Delta::ToolStart { index, id, name: call.name });
                    deltas.push(Delta::ToolArgs { index, text: call.arguments });
                }
                Ok((deltas, FinishReason::ToolCalls))
            }
            Err(text) => {
                let mut deltas = content(text);
                self.logprobs.flush(&mut deltas);
                Ok((deltas, finish))
            }
        }
    }
}

fn content(text: String) -> Vec<Delta> {
    if text.is_empty() { Vec::new() } else { vec![Delta::Content(text)] }
}
