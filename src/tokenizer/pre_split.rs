//! How a byte-level BPE vocabulary from a GGUF file cuts text into pieces before merging.
//!
//! BPE merges only ever join bytes inside one piece, and a vocabulary's merges were learned on
//! text cut one particular way: cut it differently and the ids change. A GGUF names its rule in
//! `tokenizer.ggml.pre` ("llama-bpe", "smollm", "qwen2", …). GGUF files are made for llama.cpp,
//! so a name means what llama.cpp does with it (`llm_tokenizer_bpe` in `src/llama-vocab.cpp`): a
//! list of regexes applied in turn, each cutting every piece the previous one left, with matches
//! and the text between them both kept as pieces. That is `Split(regex, Isolated)` in
//! `tokenizers`. Where llama.cpp rewrote a tokenizer.json regex for `std::regex` (spelling out
//! `(?i:…)`), we use the tokenizer.json original: onig runs it as is.
//!
//! transformers' GGUF loader differs in two ways we do not follow: it drops the digit split of
//! "smollm" (SmolLM's own tokenizer.json has it; it happens not to change SmolLM2's ids), and it
//! ignores llama.cpp's `ignore_merges` for Llama 3 (whose tokenizer.json sets it).

use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::error::{ErrorKind, fail};

/// GPT-2's rule: contractions, letters, digits, other symbols, each with one leading space.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3 (tiktoken cl100k): numbers in groups of up to three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2: as Llama 3, but every digit on its own.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 3.5: as Qwen 2, with combining marks kept on their letters.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// o200k (gpt-4o, gpt-oss, Llama 4): words split at case changes.
const GPT4O: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
/// Mistral's tekken.
const TEKKEN: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);
/// Each digit alone: llama.cpp's first pass for StarCoder-derived vocabularies (SmolLM).
const DIGIT: &str = r"\p{N}";

/// llama.cpp's rule for "default" or a file naming none.
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"];

/// What one `tokenizer.ggml.pre` name asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreSplit {
    /// The regexes, applied in turn.
    pub regexes: &'static [&'static str],
    /// Look a whole piece up in the vocabulary before merging (tokenizer.json `ignore_merges`).
    pub ignore_merges: bool,
    /// llama.cpp's `add_bos` when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos_default: bool,
}

const fn rule(regexes: &'static [&'static str]) -> PreSplit {
    PreSplit { regexes, ignore_merges: false, add_bos_default: false }
}

#[rustfmt::skip]
const RULES: &[(&[&str], PreSplit)] = &[
    (&["default"], rule(DEFAULT)),
    (&["gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4", "trillion"], rule(&[GPT2])),
    (&["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"], rule(&[DIGIT, GPT2])),
    (&["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
        PreSplit { regexes: &[LLAMA3], ignore_merges: true, add_bos_default: true }),
    (&["dbrx", "smaug-bpe"], rule(&[LLAMA3])),
    (&["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"], rule(&[QWEN2])),
    (&["qwen35"], rule(&[QWEN35])),
    (&["gpt-4o", "llama4", "minimax-m2"], rule(&[GPT4O])),
    (&["tekken"], PreSplit { regexes: &[TEKKEN], ignore_merges: true, add_bos_default: true }),
];

/// The rule for a `tokenizer.ggml.pre` value; `None` (key absent) is llama.cpp's "default".
pub fn lookup(pre: Option<&str>) -> anyhow::Result<PreSplit> {
    let name = pre.unwrap_or("default");
    RULES.iter().find(|(names, _)| names.contains(&name)).map(|(_, r)| *r).ok_or_else(|| {
        fail(
            ErrorKind::Other,
            format!(
                "unsupported GGUF pre-tokenizer {name:?} (tokenizer.ggml.pre); supported: {}",
                supported()
            ),
        )
    })
}

fn supported() -> String {
    RULES.iter().flat_map(|(names, _)| names.iter().copied()).collect::<Vec<_>>().join(", ")
}

/// The `tokenizers` pre-tokenizer for a rule: the splits, then the bytes-to-characters mapping.
pub fn pre_tokenizer(rule: &PreSplit) -> anyhow::Result<PreTokenizerWrapper> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(rule.regexes.len() + 1);
    for re in rule.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| anyhow::anyhow!("compiling pre-tokenizer regex {re:?}: {e}"))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, true, false).into());
    Ok(Sequence::new(steps).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    /// The pieces a rule cuts `text` into, in byte-level spelling.
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        let pt = pre_tokenizer(&lookup(Some(pre)).unwrap()).unwrap();
        let mut s = PreTokenizedString::from(text);
        pt.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(p, _, _)| p.to_string())
            .collect()
    }

    #[test]
    fn every_rule_compiles() {
        for (names, rule) in RULES {
            pre_tokenizer(rule).unwrap_or_else(|e| panic!("{names:?}: {e}"));
        }
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines_apart() {
        assert_eq!(
            pieces("llama-bpe", "Hi 1234567\n\n  x"),
            ["Hi", "Ġ", "123", "456", "7", "ĊĊ", "Ġ", "Ġx"]
        );
        assert_eq!(pieces("llama-bpe", "I'M ok"), ["I", "'M", "Ġok"], "contractions ignore case");
    }

    #[test]
    fn smollm_splits_every_digit() {
        assert_eq!(pieces("smollm", "x 2024 ²"), ["x", "Ġ", "2", "0", "2", "4", "Ġ", "Â²"]);
        assert_eq!(pieces("gpt2", "x 2024"), ["x", "Ġ2024"]);
    }

    #[test]
    fn qwen2_and_gpt4o() {
        assert_eq!(pieces("qwen2", "ab 123"), ["ab", "Ġ", "1", "2", "3"]);
        assert_eq!(pieces("gpt-4o", "HelloWorld 12345"), ["Hello", "World", "Ġ", "123", "45"]);
    }

    #[test]
    fn default_cuts_punctuation_first() {
        assert_eq!(pieces("default", "a+=b"), ["a", "+=", "b"]);
        assert_eq!(lookup(None).unwrap(), lookup(Some("default")).unwrap());
    }

    #[test]
    fn flags_follow_llama_cpp() {
        let llama3 = lookup(Some("llama-bpe")).unwrap();
        assert!(llama3.ignore_merges && llama3.add_bos_default);
        let smollm = lookup(Some("smollm")).unwrap();
        assert!(!smollm.ignore_merges && !smollm.add_bos_default);
    }

    #[test]
    fn unknown_name_is_a_clear_error() {
        let err = lookup(Some("klingon-bpe")).unwrap_err();
        assert_eq!(crate::error::kind_of(&err), ErrorKind::Other);
        let msg = err.to_string();
        assert!(
            msg.contains("\"klingon-bpe\"") && msg.contains("llama-bpe") && !msg.contains('\n'),
            "{msg}"
        );
    }
}
