//! A `tokenizers::Tokenizer` built from a GGUF file's metadata.
//!
//! A GGUF has no tokenizer.json: llama.cpp's converter stores the vocabulary, merges or scores,
//! token types and special ids as `tokenizer.ggml.*` metadata, plus the chat template. We rebuild
//! the equivalent `tokenizers` pipeline so the rest of inferno (chat templates, streaming decode)
//! handles GGUF and safetensors models alike. GGUF files are made for llama.cpp, so where its
//! reading of a key and transformers' differ we follow llama.cpp; the byte-level and
//! SentencePiece modules say where that matters.
//!
//! Token types (llama.cpp's `llama_token_type`): 1 normal, 2 unknown, 3 control, 4 user-defined,
//! 5 unused, 6 byte. Control and unknown tokens (`<|im_start|>`, `<s>`, `<unk>`) become special
//! added tokens and user-defined ones plain added tokens: both are matched whole in the text
//! before any splitting, as llama.cpp does when asked to parse special tokens.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;
use candle_core::quantized::gguf_file::Value;
use tokenizers::models::bpe::{Merges, Vocab};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{AddedToken, Tokenizer};

use super::{byte_bpe, sentencepiece};
use crate::error::{ErrorKind, fail};

const CONTROL: i32 = 3;
const UNKNOWN: i32 = 2;
const USER_DEFINED: i32 = 4;

/// The tokenizer of a GGUF model and what generation needs to know about it.
pub struct GgufTokenizer {
    /// Encodes with `add_special_tokens = true` as the model expects (BOS when `add_bos`).
    pub tokenizer: Tokenizer,
    /// `tokenizer.ggml.bos_token_id` (SentencePiece vocabularies default to 1, as in llama.cpp).
    pub bos_id: Option<u32>,
    /// Ids that end generation: `tokenizer.ggml.eos_token_id`, `eot_token_id` (else
    /// `<end_of_turn>`, as llama.cpp finds it), `eom_token_id`, in that order, without repeats.
    pub eos_ids: Vec<u32>,
    /// `tokenizer.chat_template`: a Jinja template in HF's dialect.
    pub chat_template: Option<String>,
    /// Whether a prompt starts with BOS (`tokenizer.ggml.add_bos_token`, else llama.cpp's default).
    pub add_bos: bool,
}

/// Reads the metadata of the GGUF file at `path` and builds its tokenizer. Our own header reader
/// (`crate::inspect::gguf`), not candle's: candle rejects a whole file for one tensor type it
/// cannot run (MXFP4 in the gpt-oss GGUFs, the IQ quants).
pub fn from_gguf_file(path: &Path) -> anyhow::Result<GgufTokenizer> {
    // The error names the file: "NAME: not a valid GGUF file: …".
    let (_, metadata) = crate::inspect::gguf::read_full(path)
        .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))?;
    from_gguf_metadata(&metadata)
        .with_context(|| format!("{}: reading its tokenizer", path.display()))
}

/// Builds the tokenizer described by `tokenizer.*` keys of a GGUF file's metadata (candle's
/// `gguf_file::Content::metadata`, or `crate::inspect::gguf::read_full`).
pub fn from_gguf_metadata(md: &HashMap<String, Value>) -> anyhow::Result<GgufTokenizer> {
    let md = Meta(md);
    let model = md.str("tokenizer.ggml.model")?.ok_or_else(|| {
        fail(ErrorKind::Other, "the GGUF file has no tokenizer (no tokenizer.ggml.model)")
    })?;
    let vocab = Vocabulary::read(&md)?;
    let (mut tokenizer, add_bos_default, default_bos, default_eos) = match model {
        "gpt2" => {
            let (t, add_bos) = byte_bpe::build(&md, &vocab)?;
            (t, add_bos, None, None)
        }
        "llama" => (sentencepiece::build(&md, &vocab)?, true, Some(1), Some(2)),
        other => {
            return Err(fail(
                ErrorKind::Other,
                format!(
                    "unsupported GGUF tokenizer {other:?} (tokenizer.ggml.model); inferno reads \"gpt2\" \
                     (byte-level BPE) and \"llama\" (SentencePiece)"
                ),
            ));
        }
    };
    add_added_tokens(&mut tokenizer, &vocab)?;

    let bos_id = vocab.special_id(&md, "tokenizer.ggml.bos_token_id", default_bos)?;
    let eos_id = vocab.special_id(&md, "tokenizer.ggml.eos_token_id", default_eos)?;
    let eot_id = vocab.special_id(&md, "tokenizer.ggml.eot_token_id", None)?;
    // llama.cpp finds the end-of-turn token by its text when the file names none
    // (`llama-vocab.cpp`): Gemma's converter writes no eot_token_id, and `<end_of_turn>` ends
    // its turns. Only Gemma's text is taken from llama.cpp's list: its `<|end|>` ends a harmony
    // message, not a reply.
    let eot_id = eot_id.or_else(|| vocab.ids.get("<end_of_turn>").copied());
    let eom_id = vocab.special_id(&md, "tokenizer.ggml.eom_token_id", None)?;
    let mut eos_ids: Vec<u32> = Vec::new();
    for id in [eos_id, eot_id, eom_id].into_iter().flatten() {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    let add_bos = md.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(add_bos_default);
    let add_eos = md.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let bos =
        if add_bos { Some(named(&vocab, bos_id, "add_bos_token", "bos_token_id")?) } else { None };
    let eos =
        if add_eos { Some(named(&vocab, eos_id, "add_eos_token", "eos_token_id")?) } else { None };
    if let Some(post) = post_processor(bos, eos)? {
        tokenizer.with_post_processor(Some(post));
    }

    Ok(GgufTokenizer {
        tokenizer,
        bos_id,
        eos_ids,
        chat_template: md.str("tokenizer.chat_template")?.map(str::to_string),
        add_bos,
    })
}

/// Control and unknown tokens as special added tokens, user-defined ones as plain added tokens.
fn add_added_tokens(tokenizer: &mut Tokenizer, vocab: &Vocabulary) -> anyhow::Result<()> {
    let added = |wanted: &[i32], special: bool| -> Vec<AddedToken> {
        (0..vocab.tokens.len())
            .filter(|&i| vocab.types.get(i).is_some_and(|t| wanted.contains(t)))
            .map(|i| AddedToken::from(vocab.tokens[i].clone(), special).normalized(false))
            .collect()
    };
    tokenizer.add_special_tokens(added(&[CONTROL, UNKNOWN], true)).map_err(anyhow::Error::msg)?;
    tokenizer.add_tokens(added(&[USER_DEFINED], false)).map_err(anyhow::Error::msg)?;
    // An added token whose text the model's vocabulary does not map back to it would get a new id.
    for (i, token) in vocab.tokens.iter().enumerate().filter(|(i, _)| vocab.is_added(*i)) {
        if tokenizer.token_to_id(token) != Some(i as u32) {
            return Err(corrupt(format!(
                "token {i} ({token:?}) cannot be told apart from another token"
            )));
        }
    }
    Ok(())
}

/// `(id, text)` of a token the file asks to add to every sequence; an error if it names none.
fn named(
    vocab: &Vocabulary,
    id: Option<u32>,
    flag: &str,
    key: &str,
) -> anyhow::Result<(u32, String)> {
    let id = id.ok_or_else(|| {
        corrupt(format!("tokenizer.ggml.{flag} is set but tokenizer.ggml.{key} is missing"))
    })?;
    Ok((id, vocab.tokens[id as usize].clone()))
}

/// `BOS $A EOS` as the file asks (either may be absent); `None` when neither is added.
fn post_processor(
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
) -> anyhow::Result<Option<TemplateProcessing>> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    // Template pieces name special tokens by a key of our choosing: token texts may hold ':'.
    let part = |seq: &str, type_id: u32| -> Vec<String> {
        let mut p = Vec::new();
        if bos.is_some() {
            p.push(format!("bos:{type_id}"));
        }
        p.push(format!("{seq}:{type_id}"));
        if eos.is_some() {
            p.push(format!("eos:{type_id}"));
        }
        p
    };
    let single = part("$A", 0);
    let pair = [part("$A", 0), part("$B", 1)].concat();
    let mut specials = Vec::new();
    for (key, token) in [("bos", &bos), ("eos", &eos)] {
        if let Some((id, text)) = token {
            let special = SpecialToken::new(key.to_string(), vec![*id], vec![text.clone()]);
            specials.push(special.map_err(anyhow::Error::msg)?);
        }
    }
    let template = TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(anyhow::Error::msg)?
        .special_tokens(specials)
        .build()
        .map_err(anyhow::Error::msg)?;
    Ok(Some(template))
}

/// A corrupt-tokenizer error: the file is broken, not merely unsupported.
pub(super) fn corrupt(msg: impl std::fmt::Display) -> anyhow::Error {
    fail(ErrorKind::Integrity, format!("invalid GGUF tokenizer: {msg}"))
}

/// `tokenizer.ggml.merges` entries ("a b") as pairs, split at the first space after the first
/// character, as llama.cpp does.
pub(super) fn parse_merges(merges: &[&str]) -> anyhow::Result<Merges> {
    merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let first = m.chars().next().map_or(0, char::len_utf8);
            match m[first..].find(' ') {
                Some(at) => Ok((m[..first + at].to_string(), m[first + at + 1..].to_string())),
                None => {
                    Err(corrupt(format!("tokenizer.ggml.merges[{i}] = {m:?} is not two tokens")))
                }
            }
        })
        .collect()
}

/// The token list with its types and reverse map.
pub(super) struct Vocabulary {
    pub tokens: Vec<String>,
    /// Token → id. Every token is distinct (llama.cpp refuses a vocabulary that repeats one).
    pub ids: Vocab,
    /// `tokenizer.ggml.token_type`, or empty when the file has none (all tokens normal).
    pub types: Vec<i32>,
}

impl Vocabulary {
    fn read(md: &Meta) -> anyhow::Result<Self> {
        let raw = md
            .str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| corrupt("tokenizer.ggml.tokens is missing"))?;
        if raw.is_empty() || u32::try_from(raw.len()).is_err() {
            return Err(corrupt(format!("tokenizer.ggml.tokens has {} entries", raw.len())));
        }
        // llama.cpp renames empty tokens so that they stay distinct.
        let tokens: Vec<String> = raw
            .iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t.to_string() })
            .collect();
        let types = md.i32_array("tokenizer.ggml.token_type")?.unwrap_or_default();
        if !types.is_empty() && types.len() < tokens.len() {
            return Err(corrupt(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let mut ids = Vocab::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            if let Some(first) = ids.insert(t.clone(), i as u32) {
                return Err(corrupt(format!(
                    "tokenizer.ggml.tokens lists {t:?} twice (ids {first} and {i})"
                )));
            }
        }
        Ok(Vocabulary { tokens, ids, types })
    }

    /// Whether token `i` is matched whole in the text (control, unknown or user-defined).
    pub fn is_added(&self, i: usize) -> bool {
        self.types.get(i).is_some_and(|t| [CONTROL, UNKNOWN, USER_DEFINED].contains(t))
    }

    /// A special token id from `key`, or `default` when absent and in range; out of range is an error.
    fn special_id(
        &self,
        md: &Meta,
        key: &str,
        default: Option<u32>,
    ) -> anyhow::Result<Option<u32>> {
        let n = self.tokens.len();
        match md.u32(key)? {
            Some(id) if (id as usize) < n => Ok(Some(id)),
            Some(id) => {
                Err(corrupt(format!("{key} = {id} is outside the vocabulary of {n} tokens")))
            }
            None => Ok(default.filter(|&id| (id as usize) < n)),
        }
    }
}

/// Typed access to GGUF metadata; a key of the wrong type is a corrupt file.
pub(super) struct Meta<'a>(pub &'a HashMap<String, Value>);

impl Meta<'_> {
    fn wrong(key: &str, want: &str, got: &Value) -> anyhow::Error {
        corrupt(format!("{key} should be {want}, is {}", type_name(got)))
    }

    pub fn str(&self, key: &str) -> anyhow::Result<Option<&str>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Self::wrong(key, "a string", v)),
        }
    }

    pub fn bool(&self, key: &str) -> anyhow::Result<Option<bool>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(Self::wrong(key, "a bool", v)),
        }
    }

    /// Any integer type that fits a u32: writers differ.
    pub fn u32(&self, key: &str) -> anyhow::Result<Option<u32>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(v) => int(v)
                .and_then(|i| u32::try_from(i).ok())
                .map(Some)
                .ok_or_else(|| Self::wrong(key, "a token id", v)),
        }
    }

    pub fn str_array(&self, key: &str) -> anyhow::Result<Option<Vec<&str>>> {
        self.array(key, "an array of strings", |v| match v {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// Scores: llama.cpp accepts f32 or i32 arrays.
    pub fn f32_array(&self, key: &str) -> anyhow::Result<Option<Vec<f32>>> {
        self.array(key, "an array of numbers", |v| match v {
            Value::F32(f) => Some(*f),
            Value::F64(f) => Some(*f as f32),
            other => int(other).map(|i| i as f32),
        })
    }

    pub fn i32_array(&self, key: &str) -> anyhow::Result<Option<Vec<i32>>> {
        self.array(key, "an array of integers", |v| int(v).and_then(|i| i32::try_from(i).ok()))
    }

    fn array<'a, T>(
        &'a self,
        key: &str,
        want: &str,
        item: impl Fn(&'a Value) -> Option<T>,
    ) -> anyhow::Result<Option<Vec<T>>> {
        match self.0.get(key) {
            None => Ok(None),
            Some(Value::Array(values)) => values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    item(v).ok_or_else(|| {
                        corrupt(format!("{key}[{i}] should be {want} item, is {}", type_name(v)))
                    })
                })
                .collect::<anyhow::Result<Vec<T>>>()
                .map(Some),
            Some(v) => Err(Self::wrong(key, want, v)),
        }
    }
}

fn int(v: &Value) -> Option<i128> {
    Some(match v {
        Value::U8(x) => (*x).into(),
        Value::I8(x) => (*x).into(),
        Value::U16(x) => (*x).into(),
        Value::I16(x) => (*x).into(),
        Value::U32(x) => (*x).into(),
        Value::I32(x) => (*x).into(),
        Value::U64(x) => (*x).into(),
        Value::I64(x) => (*x).into(),
        _ => return None,
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::U8(_) => "u8",
        Value::I8(_) => "i8",
        Value::U16(_) => "u16",
        Value::I16(_) => "i16",
        Value::U32(_) => "u32",
        Value::I32(_) => "i32",
        Value::U64(_) => "u64",
        Value::I64(_) => "i64",
        Value::F32(_) => "f32",
        Value::F64(_) => "f64",
        Value::Bool(_) => "a bool",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::kind_of;

    fn strings(v: &[&str]) -> Value {
        Value::Array(v.iter().map(|s| Value::String(s.to_string())).collect())
    }

    /// A tiny Llama-3-shaped byte-level vocabulary: "hi", " hi", two control tokens, one
    /// user-defined token.
    fn byte_level() -> HashMap<String, Value> {
        let tokens = ["h", "i", "Ġ", "hi", "Ġhi", "<|begin|>", "<|eot|>", "<think>", "<|end|>"];
        let types = [1, 1, 1, 1, 1, 3, 3, 4, 3];
        HashMap::from([
            ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".to_string(), Value::String("llama-bpe".into())),
            ("tokenizer.ggml.tokens".to_string(), strings(&tokens)),
            ("tokenizer.ggml.token_type".to_string(), Value::Array(types.map(Value::I32).to_vec())),
            ("tokenizer.ggml.merges".to_string(), strings(&["h i", "Ġ hi"])),
            ("tokenizer.ggml.bos_token_id".to_string(), Value::U32(5)),
            ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(8)),
            ("tokenizer.ggml.eot_token_id".to_string(), Value::I32(6)),
            ("tokenizer.ggml.eom_token_id".to_string(), Value::U64(8)),
            ("tokenizer.chat_template".to_string(), Value::String("{{ messages }}".into())),
        ])
    }

    fn ids(t: &GgufTokenizer, text: &str, special: bool) -> Vec<u32> {
        t.tokenizer.encode(text, special).unwrap().get_ids().to_vec()
    }

    fn err(md: &HashMap<String, Value>) -> (ErrorKind, String) {
        let e = from_gguf_metadata(md).err().expect("should fail");
        (kind_of(&e), format!("{e:#}"))
    }

    #[test]
    fn byte_level_vocabulary() {
        let t = from_gguf_metadata(&byte_level()).unwrap();
        assert_eq!(t.bos_id, Some(5));
        assert_eq!(t.eos_ids, [8, 6], "eos, then eot; eom repeats eos");
        assert!(t.add_bos, "llama.cpp adds BOS for llama-bpe when the file does not say");
        assert_eq!(t.chat_template.as_deref(), Some("{{ messages }}"));
        assert_eq!(ids(&t, "hi hi", true), [5, 3, 4]);
        assert_eq!(ids(&t, "hi<|eot|><think>hi", false), [3, 6, 7, 3]);
        assert_eq!(
            t.tokenizer.decode(&[5, 3, 4, 6, 7], false).unwrap(),
            "<|begin|>hi hi<|eot|><think>"
        );
        assert_eq!(
            t.tokenizer.decode(&[5, 3, 4, 6, 7], true).unwrap(),
            "hi hi<think>",
            "user-defined is not special"
        );
    }

    #[test]
    fn add_bos_and_add_eos_flags_win() {
        let mut md = byte_level();
        md.insert("tokenizer.ggml.add_bos_token".into(), Value::Bool(false));
        md.insert("tokenizer.ggml.add_eos_token".into(), Value::Bool(true));
        let t = from_gguf_metadata(&md).unwrap();
        assert!(!t.add_bos);
        assert_eq!(ids(&t, "hi", true), [3, 8]);
        assert_eq!(ids(&t, "hi", false), [3]);
    }

    #[test]
    fn unsupported_or_missing_tokenizer() {
        let mut md = byte_level();
        md.insert("tokenizer.ggml.model".into(), Value::String("bert".into()));
        let (kind, msg) = err(&md);
        assert_eq!(kind, ErrorKind::Other);
        assert!(
            msg.contains("unsupported GGUF tokenizer \"bert\"") && !msg.contains('\n'),
            "{msg}"
        );

        md.remove("tokenizer.ggml.model");
        assert!(err(&md).1.contains("no tokenizer"));

        let mut md = byte_level();
        md.insert("tokenizer.ggml.pre".into(), Value::String("klingon".into()));
        assert!(err(&md).1.contains("unsupported GGUF pre-tokenizer \"klingon\""));
    }

    #[test]
    fn corrupt_metadata_is_an_integrity_error() {
        let cases: [(&str, Value, &str); 6] = [
            (
                "tokenizer.ggml.tokens",
                Value::String("h".into()),
                "tokenizer.ggml.tokens should be an array of strings",
            ),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::U8(1)]),
                "tokenizer.ggml.tokens[0] should be",
            ),
            (
                "tokenizer.ggml.bos_token_id",
                Value::U32(99),
                "bos_token_id = 99 is outside the vocabulary of 9",
            ),
            ("tokenizer.ggml.eos_token_id", Value::I32(-1), "eos_token_id should be a token id"),
            ("tokenizer.ggml.merges", strings(&["hi"]), "merges[0] = \"hi\" is not two tokens"),
            (
                "tokenizer.ggml.token_type",
                Value::Array(vec![Value::I32(1)]),
                "token_type has 1 entries for 9",
            ),
        ];
        for (key, value, want) in cases {
            let mut md = byte_level();
            md.insert(key.into(), value);
            let (kind, msg) = err(&md);
            assert_eq!(kind, ErrorKind::Integrity, "{msg}");
            assert!(msg.contains(want), "{key}: {msg}");
        }
        let mut md = byte_level();
        md.insert(
            "tokenizer.ggml.tokens".into(),
            strings(&["h", "i", "Ġ", "hi", "Ġhi", "<|begin|>", "h", "<think>", "i"]),
        );
        assert!(err(&md).1.contains("lists \"h\" twice (ids 0 and 6)"));
        let mut md = byte_level();
        md.insert("tokenizer.ggml.merges".into(), strings(&["h x"]));
        assert!(err(&md).1.contains("inconsistent"), "a merge of a token that does not exist");
        let mut md = byte_level();
        md.remove("tokenizer.ggml.bos_token_id");
        assert!(
            err(&md).1.contains("add_bos_token is set but tokenizer.ggml.bos_token_id is missing")
        );
    }

    #[test]
    fn merges_split_after_the_first_character() {
        let m = parse_merges(&["a b", "é  x", "Ġ Ġ"]).unwrap();
        assert_eq!(m[0], ("a".into(), "b".into()));
        assert_eq!(m[1], ("é".into(), " x".into()));
        assert_eq!(m[2], ("Ġ".into(), "Ġ".into()));
    }

    #[test]
    fn a_file_that_is_not_gguf() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("x.gguf");
        std::fs::write(&path, b"not a gguf file at all").unwrap();
        let e = from_gguf_file(&path).err().expect("should fail");
        assert_eq!(kind_of(&e), ErrorKind::Integrity);
        assert!(e.to_string().contains("x.gguf: not a valid GGUF file"), "{e}");
    }
}
