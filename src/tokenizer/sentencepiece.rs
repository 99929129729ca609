//! SentencePiece BPE vocabularies from GGUF files (`tokenizer.ggml.model = "llama"`: Llama 2,
//! TinyLlama, Mistral v0.1 …), rebuilt as a `tokenizers` BPE.
//!
//! The file has pieces and scores, not merges. SentencePiece BPE repeatedly joins the adjacent
//! pair whose joined piece scores best, which is a BPE whose merges are ranked by that score, so
//! we derive the merges the way transformers does (`generate_merges`): every split of every piece
//! into two pieces of the vocabulary, best score first.
//!
//! The rest is the shape of Llama 2's own tokenizer.json: spaces become `▁` and one `▁` is put in
//! front of each run of plain text (a normalizer, so also after a special token), unknown
//! characters fall back to `<0xNN>` byte pieces, and decoding undoes both. That is what
//! sentencepiece and llama.cpp do. transformers' GGUF loader uses `Metaspace(prepend_scheme =
//! "first")` instead, which skips the `▁` when the text already starts with a space or follows a
//! special token; we do not follow it there (tests/fixtures/spm_tiny_tokenizer.json shows both).

use std::collections::{HashMap, HashSet};

use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{NormalizerWrapper, Tokenizer};

use super::gguf::{Meta, Vocabulary, corrupt, parse_merges};

const SPACE: &str = "\u{2581}"; // ▁

/// The SentencePiece tokenizer the metadata describes, without its added tokens.
pub(super) fn build(md: &Meta, vocab: &Vocabulary) -> anyhow::Result<Tokenizer> {
    let merges = match md.str_array("tokenizer.ggml.merges")? {
        Some(merges) => parse_merges(&merges)?,
        None => {
            let scores = md.f32_array("tokenizer.ggml.scores")?.ok_or_else(|| {
                corrupt("a SentencePiece vocabulary needs tokenizer.ggml.scores or tokenizer.ggml.merges")
            })?;
            if scores.len() < vocab.tokens.len() {
                return Err(corrupt(format!(
                    "tokenizer.ggml.scores has {} entries for {} tokens",
                    scores.len(),
                    vocab.tokens.len()
                )));
            }
            merges_from_scores(&vocab.tokens, &scores, &vocab.ids)
        }
    };
    let unk_id = md.u32("tokenizer.ggml.unknown_token_id")?.unwrap_or(0);
    let mut bpe = BPE::builder()
        .vocab_and_merges(vocab.ids.clone(), merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = vocab.tokens.get(unk_id as usize) {
        bpe = bpe.unk_token(unk.clone());
    }
    let bpe = bpe
        .build()
        .map_err(|e| corrupt(format!("the SentencePiece vocabulary is inconsistent: {e}")))?;

    // llama.cpp's default for a SentencePiece vocabulary is to add the `▁` prefix.
    let add_prefix = md.bool("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    let replace = Replace::new(" ", SPACE).map_err(anyhow::Error::msg)?;
    let normalizer: NormalizerWrapper = if add_prefix {
        NormalizerSequence::new(vec![Prepend::new(SPACE.to_string()).into(), replace.into()]).into()
    } else {
        replace.into()
    };
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(SPACE, " ").map_err(anyhow::Error::msg)?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer.with_normalizer(Some(normalizer)).map_err(anyhow::Error::msg)?;
    tokenizer.with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// transformers' `generate_merges(vocab, scores)`: for each piece (in file order, first
/// occurrence), each split into two pieces that are both in the vocabulary, ordered by the ids of
/// the halves; then all of them by the joined piece's score, then by the halves' lengths in
/// characters, largest first. The sort is stable, as Python's is.
pub(super) fn merges_from_scores(tokens: &[String], scores: &[f32], ids: &Vocab) -> Merges {
    // Python's dict(zip(tokens, scores)): first position, last score.
    let mut score: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
    for (t, s) in tokens.iter().zip(scores) {
        score.insert(t, *s);
    }
    let mut seen: HashSet<&str> = HashSet::with_capacity(tokens.len());
    let mut merges: Vec<(&str, &str, f32)> = Vec::new();
    for token in tokens {
        if !seen.insert(token) {
            continue;
        }
        let Some(&joined_score) = score.get(token.as_str()) else { continue };
        let mut local: Vec<(&str, &str, u32, u32)> = Vec::new();
        for (at, _) in token.char_indices().skip(1) {
            let (l, r) = token.split_at(at);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                local.push((l, r, li, ri));
            }
        }
        local.sort_by_key(|&(_, _, li, ri)| (li, ri));
        merges.extend(local.into_iter().map(|(l, r, _, _)| (l, r, joined_score)));
    }
    merges.sort_by(|a, b| {
        let key = |m: &(&str, &str, f32)| (m.0.chars().count(), m.1.chars().count());
        b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal).then_with(|| key(b).cmp(&key(a)))
    });
    merges.into_iter().map(|(l, r, _)| (l.to_string(), r.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(tokens: &[&str]) -> (Vec<String>, Vocab) {
        let tokens: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
        let ids = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        (tokens, ids)
    }

    #[test]
    fn merges_are_ranked_by_the_joined_score() {
        let (tokens, ids) = vocab(&["a", "b", "c", "ab", "bc", "abc"]);
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let merges = merges_from_scores(&tokens, &scores, &ids);
        let pairs: Vec<(&str, &str)> =
            merges.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        // bc (-1) before ab (-2) before the two ways to make abc (-3); of those, the longer left
        // half first ("ab"+"c" and "a"+"bc" tie on score; lengths (2,1) > (1,2)).
        assert_eq!(pairs, [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
    }

    #[test]
    fn splits_fall_on_characters_not_bytes() {
        let (tokens, ids) = vocab(&["é", "▁", "▁é"]);
        let merges = merges_from_scores(&tokens, &[0.0, 0.0, -1.0], &ids);
        assert_eq!(merges, [("▁".to_string(), "é".to_string())]);
    }

    #[test]
    fn negative_zero_ties_with_zero() {
        // 0.0 and -0.0 are equal in Python, so the halves' lengths decide: ("ab", "b") first.
        let (tokens, ids) = vocab(&["a", "b", "ab", "abb"]);
        let merges = merges_from_scores(&tokens, &[0.0, 0.0, 0.0, -0.0], &ids);
        assert_eq!(
            merges,
            [("ab".to_string(), "b".to_string()), ("a".to_string(), "b".to_string())]
        );
    }
}
