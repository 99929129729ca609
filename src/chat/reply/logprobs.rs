//! One generated token's log probability and its likeliest alternatives, as text: the
//! engine's numbers ([`TokenLogprobs`], the log-softmax of the raw logits, see
//! [`crate::engine::logprobs`]) with each token's bytes and text. The reply reader keeps them
//! beside the text they belong to; `serve` writes them as its APIs do.
//!
//! A token's `bytes` are its own bytes, even when they are part of a character (byte-level BPE
//! and byte-fallback tokens); `token` is their text, with U+FFFD for such a fragment (vLLM's
//! choice), or `token_id:ID` when the request sets vLLM's `return_tokens_as_token_ids`.
//! Log probabilities below -9999 (an impossible token) are written as -9999, OpenAI's floor:
//! JSON has no -inf.

use tokenizers::Tokenizer;

use crate::engine::logprobs::TokenLogprobs;
use crate::tokenizer::bytes::TokenBytes;

/// OpenAI's value for a token that cannot occur.
pub const FLOOR: f32 = -9999.0;

/// One token as the response shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub token: String,
    pub bytes: Vec<u8>,
}

/// One generated token's entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub piece: Piece,
    pub logprob: f32,
    pub top: Vec<(Piece, f32)>,
}

/// Turns token ids into [`Piece`]s for one tokenizer.
pub struct TokenText<'t> {
    bytes: TokenBytes<'t>,
    as_ids: bool,
}

impl<'t> TokenText<'t> {
    pub fn new(tokenizer: &'t Tokenizer, as_ids: bool) -> Self {
        TokenText { bytes: TokenBytes::new(tokenizer), as_ids }
    }

    pub fn entry(&self, t: &TokenLogprobs) -> Entry {
        Entry {
            piece: self.piece(t.id),
            logprob: floor(t.logprob),
            top: t.top.iter().map(|&(id, lp)| (self.piece(id), floor(lp))).collect(),
        }
    }

    pub fn piece(&self, id: u32) -> Piece {
        let bytes = self.bytes(id);
        let token = if self.as_ids {
            format!("token_id:{id}")
        } else {
            String::from_utf8_lossy(&bytes).into_owned()
        };
        Piece { token, bytes }
    }

    /// The bytes a token stands for ([`TokenBytes`]).
    fn bytes(&self, id: u32) -> Vec<u8> {
        self.bytes.bytes(id)
    }
}

/// A log probability as written: at least [`FLOOR`] (and NaN as it).
pub fn floor(lp: f32) -> f32 {
    if lp >= FLOOR { lp } else { FLOOR }
}
