//! TokenStream tests on tokenizers built here (byte-level BPE; SentencePiece-style BPE with byte
//! fallback) and on real ones from `scripts/assets/gptoss-tokenizer.sh`.
//!
//! The property checked: after every token, the text streamed so far contains at least
//! `decode(ids so far)` minus a trailing run of U+FFFD (an incomplete character), and is a
//! prefix of the final text; after `finish` it equals `decode(all ids)`. For byte-level
//! tokenizers "contains at least" is "equals". (SentencePiece's ByteFallback decoder turns a
//! whole run of byte tokens into U+FFFDs while its last character is incomplete, so there the
//! prefix decode can show *less* than was correctly streamed one token earlier.)

use super::*;
use serde_json::{Value, json};
use std::str::FromStr;

const TEXTS: &[&str] = &[
    "Hello world! The theme: \"tests\", 42 + 0.5 = 42.5?",
    "Café, naïve, déjà vu — Ångström. Œuvre ñandú",
    "中文测试：你好，世界。日本語のテキスト、한국어 텍스트",
    "Emoji: 😀!🎉 family 👨‍👩‍👧‍👦 flag 🇫🇷 skin 👍🏽 keycap 1️⃣ crab🦀🧬 end",
    "fn main() {\n    let x = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\n",
    "spaces:    four,\t\ttabs,\n\n\nnewlines,   trailing   ",
    "mixed😀中é!😀😀",
];

/// Streams `ids` and checks the no-hold-back property after each token.
fn check_stream(tok: &Tokenizer, ids: &[u32], skip_special: bool) {
    let strict = !is_byte_fallback(tok);
    let last = tok.decode(ids, skip_special).expect("decode");
    let mut stream = TokenStream::new(tok).skip_special_tokens(skip_special);
    let mut out = String::new();
    for (i, &id) in ids.iter().enumerate() {
        if let Some(piece) = stream.push(id).expect("push") {
            assert!(!piece.is_empty(), "push returned Some(\"\")");
            out.push_str(&piece);
        }
        let full = tok.decode(&ids[..=i], skip_special).expect("decode");
        let complete = full.trim_end_matches(REPLACEMENT);
        if strict {
            assert_eq!(
                out, complete,
                "after token {i} ({id}): streamed text is not the complete prefix"
            );
        } else {
            assert!(
                out.starts_with(complete),
                "after token {i} ({id}): {out:?} holds back part of {complete:?}"
            );
        }
        assert!(
            last.starts_with(&out),
            "after token {i} ({id}): {out:?} is not a prefix of {last:?}"
        );
    }
    if let Some(rest) = stream.finish().expect("finish") {
        out.push_str(&rest);
    }
    assert_eq!(out, last);
}

fn is_byte_fallback(tok: &Tokenizer) -> bool {
    tok.get_vocab(true).contains_key("<0xF0>")
}

fn check_texts(tok: &Tokenizer, texts: &[&str], add_special: bool) {
    for text in texts {
        let ids = tok.encode(*text, add_special).expect("encode").get_ids().to_vec();
        check_stream(tok, &ids, true);
        check_stream(tok, &ids, false);
    }
}

// ---------------------------------------------------------------- tokenizers built in the test

/// GPT-2's byte → printable-char table used by byte-level BPE.
fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return b as char;
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap()
}

fn byte_str(bytes: &[u8]) -> String {
    bytes.iter().map(|&b| byte_char(b)).collect()
}

/// A small byte-level BPE (gpt-oss / Llama 3 style): every byte is a token, a few merges, one
/// merge that glues `!` to the first byte of a 4-byte emoji (so a token holds a complete char
/// and a partial one), and a special token.
fn byte_level_bpe() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), json!(b as u32));
    }
    let merges: [(&[u8], &[u8]); 8] = [
        (b" ", b"t"),
        (b"h", b"e"),
        (b" t", b"he"),
        (b"!", &[0xF0]),
        (&[0xF0], &[0x9F]),
        (&[0xE4], &[0xB8]),
        (b" ", b"w"),
        (b"o", b"r"),
    ];
    let mut merge_list = Vec::new();
    for (a, b) in merges {
        let (a, b) = (byte_str(a), byte_str(b));
        vocab.insert(format!("{a}{b}"), json!(vocab.len()));
        merge_list.push(json!([a, b]));
    }
    let special = vocab.len();
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": special, "content": "<|end|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merge_list}
    });
    from_json(&spec)
}

/// A Llama 2 style SentencePiece BPE: `▁` for spaces, ASCII letters and a few merges in the
/// vocabulary, everything else through `<0xNN>` byte-fallback tokens.
fn sentencepiece_bpe() -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    for t in ["<unk>", "<s>", "</s>"] {
        vocab.insert(t.into(), json!(vocab.len()));
    }
    for b in 0..=255u8 {
        vocab.insert(format!("<0x{b:02X}>"), json!(vocab.len()));
    }
    for c in ('a'..='z')
        .chain('A'..='Z')
        .chain('0'..='9')
        .chain(".,!?:;'\"(){}[]+-=".chars())
        .chain(['▁'])
    {
        vocab.insert(c.to_string(), json!(vocab.len()));
    }
    let merges = [
        ("▁", "t"),
        ("h", "e"),
        ("▁t", "he"),
        ("▁", "H"),
        ("▁H", "e"),
        ("l", "l"),
        ("▁", "w"),
        ("o", "r"),
    ];
    let mut merge_list = Vec::new();
    for (a, b) in merges {
        vocab.insert(format!("{a}{b}"), json!(vocab.len()));
        merge_list.push(json!([a, b]));
    }
    let special = |id: usize, s: &str| {
        json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
               "normalized": false, "special": true})
    };
    let spec = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
                  "vocab": vocab, "merges": merge_list}
    });
    from_json(&spec)
}

fn from_json(spec: &Value) -> Tokenizer {
    Tokenizer::from_str(&spec.to_string()).expect("test tokenizer spec")
}

#[test]
fn byte_level_bpe_streams_exactly() {
    let tok = byte_level_bpe();
    // The emoji really is split over several tokens, one of them "!" + its first byte.
    let ids = tok.encode("a!😀", false).unwrap().get_ids().to_vec();
    assert_eq!(ids.len(), 5, "{ids:?}");
    check_texts(&tok, TEXTS, false);
}

#[test]
fn complete_text_before_a_partial_character_is_released_at_once() {
    let tok = byte_level_bpe();
    let ids = tok.encode("a!😀", false).unwrap().get_ids().to_vec();
    let mut s = TokenStream::new(&tok);
    let pieces: Vec<Option<String>> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
    // "!" + 0xF0: the "!" is complete and must not wait for the emoji's other three bytes.
    let want = [Some("a"), Some("!"), None, None, Some("😀")].map(|p| p.map(str::to_string));
    assert_eq!(pieces, want);
    assert_eq!(s.finish().unwrap(), None);
}

#[test]
fn special_tokens_skipped_or_shown_mid_stream() {
    let tok = byte_level_bpe();
    let ids = tok.encode("the end<|end|> the rest", false).unwrap().get_ids().to_vec();
    check_stream(&tok, &ids, true);
    check_stream(&tok, &ids, false);
    let tok = sentencepiece_bpe();
    let ids = tok.encode("Hello</s> world</s></s> again", true).unwrap().get_ids().to_vec();
    check_stream(&tok, &ids, true);
    check_stream(&tok, &ids, false);
}

#[test]
fn sentencepiece_byte_fallback_streams_exactly() {
    let tok = sentencepiece_bpe();
    let ids = tok.encode("é", false).unwrap().get_ids().to_vec();
    assert!(ids.len() >= 3, "é should be ▁ plus two byte-fallback tokens: {ids:?}");
    check_texts(&tok, TEXTS, true);
    check_texts(&tok, TEXTS, false);
}

#[test]
fn incomplete_tail_is_flushed_as_replacement_char() {
    let tok = byte_level_bpe();
    let ids = tok.encode("x😀", false).unwrap().get_ids().to_vec();
    let mut s = TokenStream::new(&tok);
    assert_eq!(s.push(ids[0]).unwrap().as_deref(), Some("x"));
    assert_eq!(s.push(ids[1]).unwrap(), None);
    assert_eq!(s.finish().unwrap().as_deref(), Some("\u{FFFD}"));
}

// ---------------------------------------------------------------- real tokenizers

fn real_tokenizer(file: &str) -> Tokenizer {
    crate::test_assets::tokenizer(file).clone()
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn gptoss_tokenizer_streams_exactly() {
    let tok = real_tokenizer("gptoss-tokenizer.json");
    let multi_token_emoji = TEXTS[3];
    let ids = tok.encode(multi_token_emoji, false).unwrap().get_ids().to_vec();
    let pieces: Vec<String> = ids.iter().map(|&i| tok.decode(&[i], false).unwrap()).collect();
    assert!(
        pieces.iter().any(|p| p.contains(REPLACEMENT)),
        "want an emoji split over tokens: {pieces:?}"
    );
    check_texts(&tok, TEXTS, false);
    // Harmony markup kept when special tokens are shown.
    let ids =
        tok.encode("<|start|>assistant<|channel|>final<|message|>Hi 😀<|return|>", false).unwrap();
    check_stream(&tok, ids.get_ids(), false);
    check_stream(&tok, ids.get_ids(), true);
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the Llama 2 tokenizer: scripts/test.sh")]
fn llama2_tokenizer_streams_exactly() {
    let tok = real_tokenizer("llama2-tokenizer.json");
    let ids = tok.encode("🦀", false).unwrap().get_ids().to_vec();
    assert!(ids.len() >= 4, "want byte fallback for the emoji: {ids:?}");
    check_texts(&tok, TEXTS, true);
}
