//! Incremental detokenisation: token ids in, text out as soon as it is complete.
//!
//! Decoding each token on its own is wrong: SentencePiece decoders drop the leading space of the
//! *first* token of a decode, and a character may be split over several byte tokens (byte-level
//! BPE, or SentencePiece byte fallback), decoding to U+FFFD until its last byte arrives. So, as
//! in text-generation-inference, we decode a small window: the tokens already shown since
//! `prefix_offset` and the new ones, and emit the difference from the shown part's decoding.
//!
//! Unlike candle-examples' `TokenOutputStream`, nothing complete is held back: punctuation, CJK
//! and emoji come out on the token that completes them. Only a trailing U+FFFD run (an
//! incomplete UTF-8 sequence) is withheld, and text before it is released immediately.

use anyhow::Result;
use tokenizers::Tokenizer;

const REPLACEMENT: char = '\u{FFFD}';

/// Streaming decoder over one generation. Cheap to create; one per response.
pub struct TokenStream<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the decode window (tokens before it are never decoded again).
    prefix_offset: usize,
    /// Tokens before this were fully shown.
    read_offset: usize,
    /// Bytes of the window's text beyond `decode(ids[prefix_offset..read_offset])` already
    /// shown: text released ahead of an incomplete character.
    shown_ahead: usize,
}

impl<'a> TokenStream<'a> {
    /// A stream that skips special tokens (`<|eot_id|>` and the like decode to nothing).
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        TokenStream {
            tokenizer,
            skip_special_tokens: true,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            shown_ahead: 0,
        }
    }

    /// Whether special tokens are decoded to nothing (default) or to their text (for formats
    /// like gpt-oss's harmony, whose parser needs `<|channel|>` and friends).
    pub fn skip_special_tokens(mut self, skip: bool) -> Self {
        self.skip_special_tokens = skip;
        self
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Adds one token; returns the text it completes, if any.
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let shown = self.decode(self.prefix_offset, self.read_offset)?;
        let window = self.decode(self.prefix_offset, self.ids.len())?;
        let complete = !window.ends_with(REPLACEMENT);
        let ready = if complete { window.as_str() } else { window.trim_end_matches(REPLACEMENT) };
        let Some(fresh) = ready.get(shown.len() + self.shown_ahead..) else {
            // The shown prefix decodes differently in context (or the cut is not a char
            // boundary): wait for more tokens rather than emit something wrong.
            return Ok(None);
        };
        let fresh = (!fresh.is_empty()).then(|| fresh.to_string());
        if complete {
            // A token that decodes to nothing (a skipped special token) does not start the next
            // window: decoders that strip a leading space would then eat the following one.
            if fresh.is_some() {
                self.prefix_offset = self.read_offset;
            }
            self.read_offset = self.ids.len();
            self.shown_ahead = 0;
        } else {
            self.shown_ahead = ready.len() - shown.len();
        }
        Ok(fresh)
    }

    /// Flushes what is left (an incomplete character comes out as U+FFFD, as in a full decode).
    pub fn finish(&mut self) -> Result<Option<String>> {
        let shown = self.decode(self.prefix_offset, self.read_offset)?;
        let window = self.decode(self.prefix_offset, self.ids.len())?;
        let rest = window.get(shown.len() + self.shown_ahead..).unwrap_or("").to_string();
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        self.shown_ahead = 0;
        Ok((!rest.is_empty()).then_some(rest))
    }

    fn decode(&self, from: usize, to: usize) -> Result<String> {
        if from >= to {
            return Ok(String::new());
        }
        self.tokenizer
            .decode(&self.ids[from..to], self.skip_special_tokens)
            .map_err(|e| anyhow::anyhow!("decoding tokens: {e}"))
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
