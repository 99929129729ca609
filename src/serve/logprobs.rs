//! The API's `logprobs`: the engine's numbers (the log-softmax of the raw logits, see
//! [`crate::engine::logprobs`]) as the two response formats write them.
//!
//! - Chat: `choices[].logprobs.content[]` = `{token, logprob, bytes, top_logprobs: [{token,
//!   logprob, bytes}]}`, `top_logprobs` the N most likely tokens.
//! - Completions (the legacy format): `{tokens, token_logprobs, top_logprobs, text_offset}`,
//!   each `top_logprobs` entry a `{token: logprob}` object of the N most likely tokens plus the
//!   chosen one (as OpenAI and vLLM write it; two tokens with the same text share a key).
//!
//! The entries themselves (a token's text, bytes and floored log probability) come from the
//! reply reader ([`crate::chat::reply::logprobs`]).

use serde_json::{Map, Value, json};

use crate::chat::reply::{Entry, Piece};

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
    use crate::chat::reply::logprobs::{FLOOR, floor};

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
