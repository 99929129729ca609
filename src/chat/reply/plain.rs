//! A plain model's reply (a chat template's, or raw text) read into deltas: the incremental
//! detokenizer and stop strings, and, when the request offered tools, Llama-style tool calls
//! ([`super::llama`]) in place of their JSON text.

use tokenizers::Tokenizer;

use super::format::{Delta, FinishReason, PendingLogprobs, ReplyFormat, call_ids, finish_of};
use super::llama::{PYTHON_TAG, Sniffer};
use super::logprobs::Entry;
use crate::generate::{StopChecker, StopConditions, StopReason, TokenStream};

pub struct Plain<'r> {
    stream: TokenStream<'r>,
    /// The model's end-of-sequence ids (the engine stops on them).
    eos_ids: Vec<u32>,
    stop: StopChecker,
    /// A stop string ended it (what follows it is never shown).
    on_string: bool,
    /// Which one.
    stop_string: Option<String>,
    /// With tools offered: the reply may be a call.
    calls: Option<Sniffer>,
    python_tag: Option<u32>,
    logprobs: PendingLogprobs,
}

impl<'r> Plain<'r> {
    pub fn new(tokenizer: &'r Tokenizer, cond: StopConditions, tools: Vec<String>) -> Self {
        Plain {
            stream: TokenStream::new(tokenizer),
            eos_ids: cond.eos_ids.clone(),
            stop: StopChecker::new(cond),
            on_string: false,
            stop_string: None,
            calls: (!tools.is_empty()).then(|| Sniffer::new(tools)),
            python_tag: tokenizer.token_to_id(PYTHON_TAG),
            logprobs: PendingLogprobs::default(),
        }
    }
}

impl ReplyFormat for Plain<'_> {
    fn stop_ids(&self) -> Vec<u32> {
        self.eos_ids.clone()
    }

    fn stop_string(&self) -> Option<String> {
        self.stop_string.clone()
    }

    /// One token (with its log probabilities when asked): the deltas it completes, and the
    /// end when a stop string or an end-of-sequence id came.
    fn push(
        &mut self,
        id: u32,
        entry: Option<Entry>,
    ) -> anyhow::Result<(Vec<Delta>, Option<StopReason>)> {
        let eos = self.stop.is_eos(id);
        // The end-of-sequence token is not part of the reply's text, so not of its logprobs.
        if !eos {
            self.logprobs.push(entry);
        }
        let piece = if eos { None } else { self.stream.push(id)? };
        let step = self.stop.push(id, piece.as_deref().unwrap_or(""));
        self.on_string = matches!(step.stop, Some(StopReason::StopString(_)));
        if let Some(StopReason::StopString(s)) = &step.stop {
            self.stop_string = Some(s.clone());
        }
        let text = match &mut self.calls {
            Some(sniffer) => sniffer.push(&step.text, Some(id) == self.python_tag),
            None => step.text,
        };
        let mut deltas = content(text);
        self.logprobs.attach(&mut deltas);
        Ok((deltas, step.stop))
    }

    /// What is left after the last token, and how the reply ended (`ours`: this side stopped
    /// it). Tokens a stop string cut stay in the logprobs (vLLM's choice: the text is cut, not
    /// the tokens).
    fn finish(
        &mut self,
        engine: &StopReason,
        ours: Option<&StopReason>,
    ) -> anyhow::Result<(Vec<Delta>, FinishReason)> {
        let mut tail = String::new();
        if !self.on_string {
            let rest = self.stream.finish()?.unwrap_or_default();
            tail = format!("{}{rest}", self.stop.finish());
        }
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
