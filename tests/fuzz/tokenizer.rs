//! The tokenizers rebuilt from GGUF metadata (src/tokenizer): the SmolLM2 GGUF's real
//! `tokenizer.*` keys (its vocabulary cut to its first tokens and merges, so a case builds in
//! milliseconds), edited value by value: keys removed, values of other types, array items
//! replaced, arrays cut, other models and pre-tokenizers. A tokenizer that builds must then
//! encode and decode anything without panicking.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use candle_core::quantized::gguf_file::Value;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;

use super::run::{fuzz, interesting_int};

type Meta = HashMap<String, Value>;

/// The `tokenizer.*` keys the builders read.
pub const KEYS: &[&str] = &[
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id",
    "tokenizer.ggml.eom_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.add_bos_token",
    "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
];

/// The SmolLM2 tokenizer metadata, its arrays cut to the first `n` items.
fn seed() -> &'static Meta {
    static SEED: OnceLock<Meta> = OnceLock::new();
    SEED.get_or_init(|| {
        let path = crate::common::asset(
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "scripts/assets/smollm2-gguf.sh",
        );
        let (_, md) = inferno::inspect::gguf::read_full(&path).unwrap();
        md.into_iter()
            .filter(|(k, _)| k.starts_with("tokenizer."))
            .map(|(k, v)| match v {
                Value::Array(items) => (k, Value::Array(items.into_iter().take(600).collect())),
                v => (k, v),
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum MetaEdit {
    Remove(&'static str),
    Set(&'static str, Value),
    Item(&'static str, Index, Value),
    Cut(&'static str, Index),
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        interesting_int().prop_map(|v| Value::U32(v as u32)),
        (0u32..700).prop_map(Value::U32),
        any::<i32>().prop_map(Value::I32),
        (-2i32..8).prop_map(Value::I32),
        interesting_int().prop_map(Value::U64),
        any::<f32>().prop_map(Value::F32),
        any::<bool>().prop_map(Value::Bool),
        prop::sample::select(vec![
            "llama",
            "gpt2",
            "bert",
            "t5",
            "",
            "smollm",
            "llama-bpe",
            "qwen2",
            "gpt-4o",
            "default",
            "<0x41>",
            "<0xZZ>",
            "<0x>",
            "Ġ",
            "▁",
            "a b",
            "a",
            " ",
            "<|im_start|>",
            "Ġ Ġ Ġ",
        ])
        .prop_map(|s| Value::String(s.to_string())),
        "\\PC{0,6}".prop_map(Value::String),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => scalar(),
        1 => vec(scalar(), 0..8).prop_map(Value::Array),
    ]
}

fn meta_edit() -> impl Strategy<Value = MetaEdit> {
    let key = prop::sample::select(KEYS);
    prop_oneof![
        1 => key.clone().prop_map(MetaEdit::Remove),
        3 => (key.clone(), value()).prop_map(|(k, v)| MetaEdit::Set(k, v)),
        4 => (key.clone(), any::<Index>(), scalar()).prop_map(|(k, i, v)| MetaEdit::Item(k, i, v)),
        1 => (key, any::<Index>()).prop_map(|(k, i)| MetaEdit::Cut(k, i)),
    ]
}

fn apply(edits: &[MetaEdit]) -> Meta {
    let mut md = seed().clone();
    for e in edits {
        match e {
            MetaEdit::Remove(k) => {
                md.remove(*k);
            }
            MetaEdit::Set(k, v) => {
                md.insert(k.to_string(), v.clone());
            }
            MetaEdit::Item(k, i, v) => {
                if let Some(Value::Array(items)) = md.get_mut(*k)
                    && !items.is_empty()
                {
                    let at = i.index(items.len());
                    items[at] = v.clone();
                }
            }
            MetaEdit::Cut(k, i) => {
                if let Some(Value::Array(items)) = md.get_mut(*k) {
                    let at = i.index(items.len() + 1);
                    items.truncate(at);
                }
            }
        }
    }
    md
}

/// Texts with the specials, byte tokens and whitespace tokenizers special-case.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,40}",
        prop::sample::select(vec![
            "<|im_start|>user\nhi<|im_end|>",
            "  \t\n\r ",
            "<0x41><s></s><unk>",
            "é🦀\u{0}\u{feff}",
            "",
        ])
        .prop_map(str::to_string),
    ]
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn tokenizers_from_edited_gguf_metadata() {
    let ids = prop_oneof![0u32..700, any::<u32>()];
    let strategy = (vec(meta_edit(), 1..6), text(), vec(ids, 0..24));
    fuzz("gguf_tokenizer", 3000, Duration::from_secs(10), strategy, |(edits, text, ids)| {
        let md = apply(&edits);
        let Ok(t) = inferno::tokenizer::gguf::from_gguf_metadata(&md) else { return Ok(()) };
        if let Ok(enc) = t.tokenizer.encode(text.as_str(), true) {
            let _ = t.tokenizer.decode(enc.get_ids(), false);
        }
        let _ = t.tokenizer.decode(&ids, false);
        let _ = t.tokenizer.decode(&ids, true);
        let bytes = inferno::tokenizer::bytes::TokenBytes::new(&t.tokenizer);
        for &id in &ids {
            let _ = (bytes.bytes(id), bytes.is_special(id));
        }
        Ok(())
    });
}
