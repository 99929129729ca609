//! Constrained decoding (`inferno::engine::constraint`) below the server:
//!
//! - the token trie of every kind of tokenizer inferno loads (HF byte-level BPE, HF
//!   SentencePiece with byte fallback, a GGUF vocabulary, gpt-oss's o200k_harmony): random walks
//!   through a JSON schema's and a regex's grammar, each step a random token among those the
//!   mask allows, end in text that satisfies them, and special tokens never appear in text;
//! - the engine: a constrained request's tokens (random weights, greedy and sampled) spell JSON
//!   valid against its schema, and an unconstrained request batched with constrained ones gets
//!   exactly the tokens it gets alone (CPU, f32).

mod common;

use std::path::PathBuf;

use candle_core::{DType, Device};
use inferno::engine::constraint::{Constraint, Grammars};
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::request::{Event, Request, RequestHandle};
use inferno::generate::SamplerConfig;
use inferno::load::{self, LoadOptions, Source};
use inferno::tokenizer::bytes::TokenBytes;
use llguidance::api::TopLevelGrammar;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name)
}

/// A schema whose every string, array and number is bounded, so a random walk ends.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 6},
            "kind": {"enum": ["cat", "dog", "bird"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "kind", "age", "tags", "ok"],
        "additionalProperties": false,
        // Compact JSON, as the server asks for: free whitespace lets a random model loop.
        "x-guidance": {"whitespace_flexible": false}
    })
}

/// What [`schema`] says, checked by hand.
fn check_value(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    if sorted != ["age", "kind", "name", "ok", "tags"] {
        return Err(format!("keys {keys:?}"));
    }
    let name = o["name"].as_str().ok_or("name")?;
    if name.chars().count() < 1 || name.chars().count() > 6 {
        return Err(format!("name {name:?}"));
    }
    if !["cat", "dog", "bird"].contains(&o["kind"].as_str().ok_or("kind")?) {
        return Err("kind".into());
    }
    let age = o["age"].as_i64().ok_or("age is not an integer")?;
    if !(0..=120).contains(&age) {
        return Err(format!("age {age}"));
    }
    let tags = o["tags"].as_array().ok_or("tags")?;
    if tags.len() > 2 || tags.iter().any(|t| t.as_str().is_none_or(|s| s.chars().count() > 3)) {
        return Err(format!("tags {tags:?}"));
    }
    o["ok"].as_bool().ok_or("ok")?;
    Ok(())
}

/// Walks `g` with random allowed tokens until only an end id is allowed; the text's bytes.
fn random_walk(g: &mut Constraint, eos: &[u32], rng: &mut StdRng, bytes: &TokenBytes) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..4000 {
        let mask = g.mask().expect("a mask");
        let allowed: Vec<u32> = mask.iter().collect();
        let text: Vec<u32> = allowed.iter().copied().filter(|t| !eos.contains(t)).collect();
        if text.is_empty() {
            return out;
        }
        // Ending when allowed (half the time) keeps walks short.
        if text.len() < allowed.len() && rng.random_bool(0.5) {
            return out;
        }
        let t = text[rng.random_range(0..text.len())];
        assert!(!bytes.is_special(t), "special token {t} allowed inside text");
        out.extend(bytes.bytes(t));
        g.commit(t).expect("commit an allowed token");
    }
    panic!("a random walk did not end: {}", String::from_utf8_lossy(&out));
}

fn walk_tokenizer(tok: &Tokenizer, eos: &[u32], label: &str) {
    let seed = rand::random::<u64>();
    let mut rng = StdRng::seed_from_u64(seed);
    let vocab = tok.get_vocab_size(true) + 3; // logits wider than the vocabulary
    let grammars = Grammars::new(tok, vocab, eos).expect("grammars");
    let bytes = TokenBytes::new(tok);
    let re = regex::Regex::new(r"^[a-c]{2,5}-\d{3}$").unwrap();
    for _ in 0..10 {
        let mut g = grammars.compile(TopLevelGrammar::from_json_schema(schema())).unwrap();
        let out = random_walk(&mut g, eos, &mut rng, &bytes);
        let text = String::from_utf8(out).expect("utf-8");
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{label} seed {seed}: {text:?} is not JSON: {e}"));
        check_value(&v).unwrap_or_else(|e| panic!("{label} seed {seed}: {text}: {e}"));
        let mut g = grammars.compile(TopLevelGrammar::from_regex(r"[a-c]{2,5}-\d{3}")).unwrap();
        let out = String::from_utf8(random_walk(&mut g, eos, &mut rng, &bytes)).unwrap();
        assert!(re.is_match(&out), "{label} seed {seed}: {out:?}");
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn random_walks_satisfy_the_grammar_for_every_tokenizer_kind() {
    let asset = |name| common::asset(name, "scripts/assets/gptoss-tokenizer.sh");
    let o200k = Tokenizer::from_file(asset("gptoss-tokenizer.json")).unwrap();
    walk_tokenizer(&o200k, &[200002, 200012], "o200k_harmony (HF byte-level BPE)");
    let llama2 = Tokenizer::from_file(asset("llama2-tokenizer.json")).unwrap();
    walk_tokenizer(&llama2, &[2], "Llama 2 (HF SentencePiece, byte fallback)");
    let smollm2 =
        common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    let gguf = inferno::tokenizer::from_gguf_file(&smollm2).unwrap();
    walk_tokenizer(&gguf.tokenizer, &gguf.eos_ids, "SmolLM2 GGUF (byte-BPE)");
    let gguf = inferno::tokenizer::from_gguf_file(&fixture("llama3_tiny/model.gguf")).unwrap();
    walk_tokenizer(&gguf.tokenizer, &gguf.eos_ids, "tiny Llama 3 GGUF");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the gpt-oss tokenizer: scripts/test.sh")]
fn special_tokens_are_named_by_grammars_and_never_text() {
    let tok = Tokenizer::from_file(common::asset(
        "gptoss-tokenizer.json",
        "scripts/assets/gptoss-tokenizer.sh",
    ))
    .unwrap();
    let grammars = Grammars::new(&tok, 201088, &[200002]).unwrap();
    let id = |s: &str| tok.token_to_id(s).unwrap();
    let lark = r#"start: <|channel|> "final" <|message|> /[a-z]+/ <|return|>"#;
    let mut g = grammars.compile(TopLevelGrammar::from_lark(lark.into())).unwrap();
    let m = g.mask().unwrap();
    assert_eq!(m.iter().collect::<Vec<_>>(), vec![id("<|channel|>")]);
    g.commit(id("<|channel|>")).unwrap();
    for t in tok.encode("final", false).unwrap().get_ids() {
        g.commit(*t).unwrap();
    }
    let m = g.mask().unwrap();
    assert_eq!(m.iter().collect::<Vec<_>>(), vec![id("<|message|>")]);
    g.commit(id("<|message|>")).unwrap();
    let m = g.mask().unwrap();
    assert!(!m.is_allowed(id("<|return|>")) && !m.is_allowed(id("<|end|>")));
    g.commit(tok.encode("abc", false).unwrap().get_ids()[0]).unwrap();
    assert!(g.mask().unwrap().is_allowed(id("<|return|>")));
    // A token the grammar does not allow is refused.
    assert!(g.commit(id("<|end|>")).is_err());
}

const CONTEXT: usize = 256;

fn engine(max_seqs: usize) -> Engine {
    let path = fixture("llama3_tiny/model.gguf");
    let opts = LoadOptions {
        dtype: Some(DType::F32),
        context: Some(CONTEXT),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let cfg = EngineConfig {
        max_seqs,
        kv_tokens: 4096,
        token_budget: 64,
        pipeline: inferno::switches::pipeline(),
        spec: None,
    };
    let (engine, _) =
        load::start(path.to_str().unwrap(), &opts, &Device::Cpu, move |_| cfg).unwrap();
    engine
}

fn request(prompt: Vec<u32>, sampling: SamplerConfig, constraint: Option<Constraint>) -> Request {
    Request {
        prompt,
        sampling,
        max_tokens: 120,
        eos_ids: vec![],
        interrupt: None,
        logprobs: None,
        forced: Vec::new(),
        constraint,
        prediction: Vec::new(),
    }
}

fn tokens(mut h: RequestHandle) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        match h.blocking_next() {
            Some(Event::Token(t, _)) => out.push(t),
            Some(Event::Finished(_)) => return out,
            Some(Event::Failed(m)) => panic!("request failed: {m}"),
            None => panic!("the engine dropped the request"),
        }
    }
}

#[test]
fn constrained_rows_follow_the_schema_and_leave_their_neighbours_untouched() {
    let seed = rand::random::<u64>();
    let mut rng = StdRng::seed_from_u64(seed);
    let source = Source::detect(&fixture("llama3_tiny/model.gguf"), false).unwrap();
    let text = load::text::load(&source).unwrap();
    let e = engine(8);
    let eos = text.eos_ids.clone();
    let grammars = Grammars::new(&text.tokenizer, e.vocab_size(), &eos).unwrap();
    let bytes = TokenBytes::new(&text.tokenizer);
    let vocab = e.vocab_size() as u32;
    let prompt = |rng: &mut StdRng| {
        (0..rng.random_range(3..20)).map(|_| rng.random_range(1..vocab)).collect::<Vec<u32>>()
    };
    let sampled = |seed| SamplerConfig { temperature: 1.0, seed, ..SamplerConfig::greedy() };
    let free: Vec<(Vec<u32>, SamplerConfig)> =
        vec![(prompt(&mut rng), SamplerConfig::greedy()), (prompt(&mut rng), sampled(seed))];
    let alone: Vec<Vec<u32>> = free
        .iter()
        .map(|(p, s)| tokens(e.submit(request(p.clone(), s.clone(), None)).unwrap()))
        .collect();
    // The same requests among constrained ones (greedy and sampled), submitted together.
    let mut handles = Vec::new();
    for (i, s) in
        [SamplerConfig::greedy(), sampled(seed ^ 1), sampled(seed ^ 2)].into_iter().enumerate()
    {
        let g = grammars.compile(TopLevelGrammar::from_json_schema(schema())).unwrap();
        let mut r = request(prompt(&mut rng), s, Some(g));
        r.eos_ids = eos.clone();
        r.max_tokens = 200 + i;
        handles.push((true, e.submit(r).unwrap()));
    }
    for (p, s) in &free {
        handles.push((false, e.submit(request(p.clone(), s.clone(), None)).unwrap()));
    }
    let mut batched = Vec::new();
    for (constrained, h) in handles {
        let toks = tokens(h);
        if !constrained {
            batched.push(toks);
            continue;
        }
        let body: Vec<u8> =
            toks.iter().filter(|t| !eos.contains(t)).flat_map(|&t| bytes.bytes(t)).collect();
        let text = String::from_utf8(body).unwrap();
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("seed {seed}: {text:?} is not JSON: {e}"));
        check_value(&v).unwrap_or_else(|e| panic!("seed {seed}: {text}: {e}"));
        assert!(eos.contains(toks.last().unwrap()), "seed {seed}: ended without an end id");
    }
    assert_eq!(batched, alone, "seed {seed}: unconstrained rows changed beside constrained ones");
}

#[test]
fn a_token_the_grammar_refuses_ends_its_request_not_the_engine() {
    let source = Source::detect(&fixture("llama3_tiny/model.gguf"), false).unwrap();
    let text = load::text::load(&source).unwrap();
    let e = engine(4);
    let grammars = Grammars::new(&text.tokenizer, e.vocab_size(), &text.eos_ids).unwrap();
    let g = grammars.compile(TopLevelGrammar::from_regex("ab+")).unwrap();
    // A forced first token that is not "a…" breaks the grammar.
    let bad = text.tokenizer.token_to_id("z").expect("a token z");
    let mut r = request(vec![1, 2, 3], SamplerConfig::greedy(), Some(g));
    r.forced = vec![bad];
    let mut h = e.submit(r).unwrap();
    let end = loop {
        match h.blocking_next() {
            Some(Event::Token(..)) => {}
            Some(other) => break other,
            None => panic!("dropped"),
        }
    };
    match end {
        Event::Failed(m) => assert!(m.contains("breaks the output constraint"), "{m}"),
        other => panic!("expected a failure, got {other:?}"),
    }
    // The engine still serves, constrained and not.
    let g = grammars.compile(TopLevelGrammar::from_regex("ab+")).unwrap();
    let mut r = request(vec![4, 5], SamplerConfig::greedy(), Some(g));
    r.max_tokens = 6;
    let out: Vec<u8> = tokens(e.submit(r).unwrap())
        .iter()
        .flat_map(|&t| TokenBytes::new(&text.tokenizer).bytes(t))
        .collect();
    assert!(out.starts_with(b"ab"), "{:?}", String::from_utf8_lossy(&out));
    let out = tokens(e.submit(request(vec![4, 5], SamplerConfig::greedy(), None)).unwrap());
    assert_eq!(out.len(), 120);
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the Llama 2 tokenizer: scripts/test.sh")]
fn unsatisfiable_schemas_fail_to_compile() {
    let tok = Tokenizer::from_file(common::asset(
        "llama2-tokenizer.json",
        "scripts/assets/gptoss-tokenizer.sh",
    ))
    .unwrap();
    let grammars = Grammars::new(&tok, tok.get_vocab_size(true), &[2]).unwrap();
    for schema in [
        json!({"type": "string", "minLength": 5, "maxLength": 2}),
        json!({"type": "integer", "minimum": 5, "maximum": 2}),
        json!({"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]}),
    ] {
        let r = grammars.compile(TopLevelGrammar::from_json_schema(schema.clone()));
        assert!(r.is_err(), "{schema} compiled");
    }
}

/// A grammar compiled again is a copy of the first one's state at its start: walking one copy
/// leaves the other, and the masks each allows first are the same.
#[test]
fn a_grammar_compiled_again_starts_fresh() {
    let gguf = inferno::tokenizer::from_gguf_file(&fixture("llama3_tiny/model.gguf")).unwrap();
    let (tok, eos) = (&gguf.tokenizer, &gguf.eos_ids);
    let grammars = Grammars::new(tok, tok.get_vocab_size(true), eos).unwrap();
    let bytes = TokenBytes::new(tok);
    let mut rng = StdRng::seed_from_u64(rand::random());
    let mut first = grammars.compile(TopLevelGrammar::from_json_schema(schema())).unwrap();
    let start: Vec<u32> = first.mask().unwrap().iter().collect();
    let text = random_walk(&mut first, eos, &mut rng, &bytes);
    check_value(&serde_json::from_slice(&text).unwrap()).unwrap();
    let mut again = grammars.compile(TopLevelGrammar::from_json_schema(schema())).unwrap();
    assert_eq!(again.mask().unwrap().iter().collect::<Vec<u32>>(), start);
    let text = random_walk(&mut again, eos, &mut rng, &bytes);
    check_value(&serde_json::from_slice(&text).unwrap()).unwrap();
}
