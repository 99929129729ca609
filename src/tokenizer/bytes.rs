//! The bytes each token id stands for, read from the vocabulary: what a token contributes to
//! the output whatever comes before it. Decoding one id alone would not do: a byte-level or
//! byte-fallback token holding part of a character decodes to U+FFFD, and SentencePiece drops
//! a word's leading space at the start of a text. Used by logprobs (`bytes`) and by the
//! grammar engine's token trie (constrained decoding), for every tokenizer inferno loads: HF
//! `tokenizer.json` (byte-level BPE, SentencePiece), GGUF byte-BPE and SentencePiece (turned
//! into the same `tokenizers::Tokenizer` by [`super::gguf`]) and harmony's o200k.

use std::collections::HashSet;

use tokenizers::Tokenizer;
use tokenizers::decoders::DecoderWrapper;

/// Turns token ids into their bytes for one tokenizer.
pub struct TokenBytes<'t> {
    tokenizer: &'t Tokenizer,
    /// The vocabulary is GPT-2's byte-level alphabet (SmolLM2, Llama 3, gpt-oss).
    byte_level: bool,
    /// Added tokens (`<|eot_id|>`, …) are stored as their text, never byte-mapped.
    added: HashSet<u32>,
    /// The added tokens marked special (never part of a text).
    special: HashSet<u32>,
}

impl<'t> TokenBytes<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        let byte_level = matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_)));
        let decoder = tokenizer.get_added_tokens_decoder();
        let special = decoder.iter().filter(|(_, t)| t.special).map(|(&id, _)| id).collect();
        let added = decoder.into_keys().collect();
        TokenBytes { tokenizer, byte_level, added, special }
    }

    /// Whether `id` is a special added token (never part of text: `<|end|>`, `<|eot_id|>`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.contains(&id)
    }

    /// The bytes `id` stands for (empty for an id the vocabulary lacks).
    pub fn bytes(&self, id: u32) -> Vec<u8> {
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
}
