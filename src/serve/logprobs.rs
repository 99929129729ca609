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

use std::collections::HashSet;

use serde_json::{Map, Value, json};
use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;

use crate::engine::logprobs::TokenLogprobs;

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
    tokenizer: &'t Tokenizer,
    /// The vocabulary is GPT-2's byte-level alphabet (SmolLM2, Llama 3, gpt-oss).
    byte_level: bool,
    /// Added tokens (`<|eot_id|>`, …) are stored as their text, never byte-mapped.
    added: HashSet<u32>,
    as_ids: bool,
}

impl<'t> TokenText<'t> {
    pub fn new(tokenizer: &'t Tokenizer, as_ids: bool) -> Self {
        let byte_level = matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let added = tokenizer.get_added_tokens_decoder().into_keys().collect();
        TokenText { tokenizer, byte_level, added, as_ids }
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

    /// The bytes a token stands for, from its vocabulary entry (decoding one token alone
    /// would turn a character's fragment into U+FFFD and drop a SentencePiece leading space).
    fn bytes(&self, id: u32) -> Vec<u8> {
        let Some(raw) = self.tokenizer.id_to_token(id) else { return Vec::new() };
        if self.added.contains(&id) {
            return raw.into_bytes();
        }
        if self.byte_level {
            let mapped: Option<Vec<u8>> = raw.chars().map(byte_level_byte).collect();
            return mapped.unwrap_or_else(|| raw.into_bytes());
        }
        if let Some(b) = byte_fallback(&raw) {
            return vec![b];
        }
        // SentencePiece marks a word's leading space with U+2581.
        raw.replace('\u{2581}', " ").into_bytes()
    }
}

fn floor(lp: f32) -> f32 {
    if lp >= FLOOR { lp } else { FLOOR }
}

/// The byte GPT-2's byte-level alphabet writes as `c`: printable Latin-1 bytes stand for
/// themselves, the other 68 bytes (controls, space, 0x7F..=0xA0, 0xAD) are U+0100.. in order.
fn byte_level_byte(c: char) -> Option<u8> {
    let printable = matches!(c, '!'..='~' | '\u{A1}'..='\u{AC}' | '\u{AE}'..='\u{FF}');
    if printable {
        return u8::try_from(c as u32).ok();
    }
    match (c as u32).checked_sub(256)? {
        n @ 0..=32 => Some(n as u8),
        n @ 33..=66 => Some((127 + n - 33) as u8),
        67 => Some(0xAD),
        _ => None,
    }
}

/// `<0xAB>`: a SentencePiece byte-fallback token.
fn byte_fallback(raw: &str) -> Option<u8> {
    let hex = raw.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
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
    fn the_byte_level_alphabet_is_gpt2s() {
        // GPT-2's bytes_to_unicode, written out: every byte has exactly one character.
        let mut seen = std::collections::HashSet::new();
        for c in ('!'..='~').chain('\u{A1}'..='\u{AC}').chain('\u{AE}'..='\u{FF}') {
            assert!(seen.insert(byte_level_byte(c).unwrap()));
        }
        for n in 0..68u32 {
            let b = byte_level_byte(char::from_u32(256 + n).unwrap()).unwrap();
            assert!(seen.insert(b), "byte {b} twice");
        }
        assert_eq!(seen.len(), 256);
        assert_eq!(byte_level_byte('\u{120}'), Some(b' '), "Ġ is the space");
        assert_eq!(byte_level_byte('\u{10A}'), Some(b'\n'), "Ċ is the newline");
        assert_eq!(byte_level_byte('\u{144}'), None);
        assert_eq!(byte_fallback("<0xE2>"), Some(0xE2));
        assert_eq!(byte_fallback("<0xE>"), None);
    }

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
