//! Byte-level BPE vocabularies from GGUF files (`tokenizer.ggml.model = "gpt2"`: Llama 3,
//! SmolLM, Qwen, gpt-oss …), rebuilt as a `tokenizers` BPE.
//!
//! The file holds what a tokenizer.json holds: tokens spelled in GPT-2's byte alphabet (each byte
//! shown as one printable character, a space as `Ġ`) and the merges in rank order. Text is cut by
//! the rule `tokenizer.ggml.pre` names ([`super::pre_split`]), mapped to that alphabet, merged,
//! and decoded by mapping back.

use std::collections::HashSet;
use std::sync::LazyLock;

use tokenizers::Tokenizer;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::BPE;

use super::gguf::{Meta, Vocabulary, corrupt, parse_merges};
use super::pre_split;

/// The byte-level tokenizer the metadata describes, without its added tokens; also whether
/// llama.cpp adds BOS by default for this pre-tokenizer.
pub(super) fn build(md: &Meta, vocab: &Vocabulary) -> anyhow::Result<(Tokenizer, bool)> {
    let rule = pre_split::lookup(md.str("tokenizer.ggml.pre")?)?;
    let merges = md
        .str_array("tokenizer.ggml.merges")?
        .ok_or_else(|| corrupt("a byte-level BPE vocabulary needs tokenizer.ggml.merges"))?;
    let merges = parse_merges(&merges)?;

    // transformers' rule for files written with raw text instead of the byte alphabet: respell
    // such tokens. Added tokens keep their text, as in a tokenizer.json: they are matched in the
    // raw text, never merged, and the decoder passes characters outside the alphabet through.
    let mut ids = vocab.ids.clone();
    for (i, token) in vocab.tokens.iter().enumerate() {
        if !vocab.is_added(i) && !token.chars().all(|c| ALPHABET.contains(&c)) {
            ids.remove(token);
            ids.insert(respell(token), i as u32);
        }
    }
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .ignore_merges(rule.ignore_merges)
        .build()
        .map_err(|e| corrupt(format!("the byte-level BPE vocabulary is inconsistent: {e}")))?;

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(pre_split::pre_tokenizer(&rule)?));
    tokenizer.with_decoder(Some(ByteLevel::new(false, true, false)));
    Ok((tokenizer, rule.add_bos_default))
}

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand for themselves, the other 68 bytes
/// for U+0100 onwards, in byte order.
fn byte_char(b: u8) -> char {
    let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable {
        char::from(b)
    } else {
        let rank =
            (0..b).filter(|&x| !matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)).count();
        char::from_u32(0x100 + rank as u32).unwrap_or(char::REPLACEMENT_CHARACTER)
    }
}

static ALPHABET: LazyLock<HashSet<char>> = LazyLock::new(|| (0..=255u8).map(byte_char).collect());

fn respell(token: &str) -> String {
    token.bytes().map(byte_char).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_gpt2s() {
        assert_eq!(ALPHABET.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(0xAD), 'Ń');
        assert_eq!(respell("é"), "Ã©");
    }
}
