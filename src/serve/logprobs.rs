//! The API's `logprobs`: the engine's numbers ([`TokenLogprobs`], the log-softmax of the raw
//! logits, see [`crate::engine::logprobs`]) as the two response formats write them.
//!
//! - Chat: `choices[].logprobs.content[]` = `{token, logprob, bytes, top_logprobs: [{token,
//!   logprob, bytes}]}`, `top_logprobs` the N most likely tokens.
//! - Completions (the legacy format): `{tokens, token_logprobs, top_logprobs, text_offset}`,
//!   each `top_logprobs` entry a `{token: logprob}` object of the N most likely tokens plus the
//!   chosen one (as OpenAI and vLLM write it; two tokens with the same text share a key).
//!
//! A token's `bytes` are its own bytes, even when they are part of a character (byte-level BPE
//! and byte-fallback tokens); `token` is their text, with U+FFFD for such a fragment (vLLM's
//! choice), or `token_id:ID` when the request sets vLLM's `return_tokens_as_token_ids`.
//! Log probabilities below -9999 (an impossible token) are written as -9999, OpenAI's floor:
//! JSON has no -inf.

use serde_json::{Map, Value, json};
use tokenizers::Tokenizer;

use crate::engine::logprobs::TokenLogprobs;
use crate::tokenizer::bytes::TokenBytes;

/// OpenAI's value for a token that cannot occur.
const FLOOR: f32 = -9999.0;

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

fn floor(lp: f32) -> f32 {
    if lp >= FLOOR { lp } else { FLOOR }
}

/// Chat's `logprobs` object for these entries.
pub fn chat_json(entries: &[Entry]) -> Value {
    let piece = |p: &Piece, lp: f32| json!({"token": p.token, "logprob": lp, "bytes": p.bytes});
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = piece(&e.piece, e.logprob);
            let top: Vec<Value> = e.top.iter().map(|(p, lp)| piece(p, *lp)).collect();
            v["top_logprobs"] = top.into();
            v
        })
        .collect();
    json!({ "content": content })
}

/// The completions `logprobs` object for these entries; `offset` is where the first one's
/// text starts in the completion, and is moved past the last.
pub fn completion_json(entries: &[Entry], offset: &mut usize) -> Value {
    let mut text_offset = Vec::with_capacity(entries.len());
    let mut top = Vec::with_capacity(entries.len());
    for e in entries {
        text_offset.push(*offset);
        // In characters, as the client's language (Python) counts a string's length.
        *offset += String::from_utf8_lossy(&e.piece.bytes).chars().count();
        let mut alternatives = Map::new();
        for (p, lp) in &e.top {
            alternatives.entry(p.token.clone()).or_insert_with(|| (*lp).into());
        }
        alternatives.entry(e.piece.token.clone()).or_insert_with(|| e.logprob.into());
        top.push(Value::Object(alternatives));
    }
    json!({
        "tokens": entries.iter().map(|e| e.piece.token.as_str()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_format_adds_the_chosen_token_and_counts_offsets_in_characters() {
        let p = |t: &str| Piece { token: t.into(), bytes: t.as_bytes().to_vec() };
        let entries = [
            Entry { piece: p("é"), logprob: -1.0, top: vec![(p("a"), -0.5)] },
            Entry { piece: p("b"), logprob: -0.125, top: vec![(p("b"), -0.125), (p("c"), -3.0)] },
        ];
        let mut offset = 2;
        let v = completion_json(&entries, &mut offset);
        assert_eq!(v["text_offset"], json!([2, 3]));
        assert_eq!(offset, 4);
        assert_eq!(v["top_logprobs"], json!([{"a": -0.5, "é": -1.0}, {"b": -0.125, "c": -3.0}]));
        assert_eq!(v["tokens"], json!(["é", "b"]));
        let c = chat_json(&entries[..1]);
        assert_eq!(c["content"][0]["bytes"], json!([0xC3, 0xA9]));
        assert_eq!(c["content"][0]["top_logprobs"][0]["token"], "a");
        assert_eq!(floor(f32::NEG_INFINITY), FLOOR);
        assert_eq!(floor(f32::NAN), FLOOR);
    }
}
