//! Speculative decoding is lossless: with n-gram drafts the engine emits exactly the tokens it
//! emits without them, greedy and sampled (every sampler setting, seeded), alone and in a batch,
//! and stops where plain decoding stops (end ids and `max_tokens` inside an accepted run). On the
//! CPU in f32: the tiny gpt-oss and tiny Llama 3 checkpoints, and SmolLM2-135M-Instruct (real
//! weights) copying a text. Each case also checks that drafts were verified, accepted and
//! rejected, so a drafter that never fires cannot pass it.
//!
//! The GPU runs the same cases in bf16 (the `gpu_` tests, `#[ignore]`d without one), where a
//! verify step stays within the rows every kernel computes alone (`kernels/invariance.rs`), and
//! the full-size gpt-oss-20b and Llama-3.2-1B layouts (random weights) in a batch of 32.

mod common;
use common::collect;

use std::path::PathBuf;

use candle_core::{DType, Device};
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::request::{Event, Request, RequestHandle};
use inferno::engine::spec::{NgramConfig, SpecConfig, SpecStats};
use inferno::generate::{SamplerConfig, StopReason};
use inferno::load::{self, LoadOptions};
use inferno::models::llama::convert;
use inferno::models::llama::load::GgufFile;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Positions of an engine's sequences (the tiny checkpoints were made for 64).
const CONTEXT: usize = 64;

fn fixture(name: &str) -> String {
    let p = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name);
    p.to_str().expect("utf-8 path").to_string()
}

fn smollm2() -> String {
    let p = common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh");
    p.to_str().expect("utf-8 path").to_string()
}

/// Where the cases run: the CPU in f32, or the GPU in bf16.
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Cpu,
    Gpu,
}

impl On {
    fn device(self) -> (Device, DType) {
        match self {
            On::Cpu => (Device::Cpu, DType::F32),
            On::Gpu => (Device::new_cuda(0).expect("a CUDA device"), DType::BF16),
        }
    }
}

/// An engine of `max_seqs` sequences, speculating with `draft_tokens` drafts (0: off). The
/// batch limit is lifted so that a batch of any size speculates, and a single repeated token is
/// enough to draft (the random tiny models rarely copy longer runs; what is checked is the
/// verification, whatever the drafts).
fn start(on: On, model: &str, max_seqs: usize, draft_tokens: usize) -> Engine {
    start_with(on, model, max_seqs, draft_tokens, CONTEXT, NgramConfig { min_n: 1, max_n: 4 })
}

/// [`start`] with a context and n-gram limits of its own.
fn start_with(
    on: On,
    model: &str,
    max_seqs: usize,
    draft_tokens: usize,
    context: usize,
    ngram: NgramConfig,
) -> Engine {
    let (dev, dtype) = on.device();
    let spec = (draft_tokens > 0).then(|| SpecConfig {
        max_batch: usize::MAX,
        ngram,
        ..SpecConfig::ngram(draft_tokens).expect("draft tokens")
    });
    let cfg = EngineConfig {
        max_seqs,
        kv_tokens: max_seqs * context,
        token_budget: 256,
        pipeline: inferno::switches::pipeline(),
        spec,
    };
    let opts = LoadOptions {
        dtype: Some(dtype),
        context: Some(context),
        dummy: false,
        kv_dtype: Default::default(),
    };
    load::start(model, &opts, &dev, move |_| cfg).expect("engine").0
}

#[derive(Clone, Debug)]
struct Case {
    prompt: Vec<u32>,
    sampling: SamplerConfig,
    max_tokens: usize,
    eos_ids: Vec<u32>,
}

fn request(c: &Case) -> Request {
    Request {
        prompt: c.prompt.clone(),
        sampling: c.sampling.clone(),
        max_tokens: c.max_tokens,
        eos_ids: c.eos_ids.clone(),
        interrupt: None,
        logprobs: None,
        forced: Vec::new(),
        constraint: None,
        prediction: Vec::new(),
    }
}

/// Every case's tokens and stop reason, all submitted at once to one engine.
fn run_batch(engine: &Engine, cases: &[Case]) -> Vec<(Vec<u32>, StopReason)> {
    let handles: Vec<RequestHandle> =
        cases.iter().map(|c| engine.submit(request(c)).expect("submit")).collect();
    handles
        .into_iter()
        .map(|h| {
            let (t, f) = collect(h);
            (t, f.reason)
        })
        .collect()
}

/// Each case alone in its own engine.
fn run_alone(
    on: On,
    model: &str,
    cases: &[Case],
    draft_tokens: usize,
) -> (Vec<(Vec<u32>, StopReason)>, SpecStats) {
    run_alone_in(cases, || start(on, model, 1, draft_tokens))
}

/// Each case alone in its own engine from `start`, and the drafts' statistics over all.
fn run_alone_in(
    cases: &[Case],
    start: impl Fn() -> Engine,
) -> (Vec<(Vec<u32>, StopReason)>, SpecStats) {
    let mut stats = SpecStats::default();
    let out = cases
        .iter()
        .map(|c| {
            let e = start();
            let r = run_batch(&e, std::slice::from_ref(c)).remove(0);
            let s = e.stats().spec;
            stats.drafts += s.drafts;
            stats.draft_tokens += s.draft_tokens;
            stats.accepted_tokens += s.accepted_tokens;
            r
        })
        .collect();
    (out, stats)
}

/// Every sampler setting: greedy, plain temperature (the Gumbel path on a GPU), the full chain
/// with top-k/top-p/min-p, and each penalty.
fn sampling(i: usize) -> SamplerConfig {
    let seed = 1000 + i as u64;
    match i % 6 {
        0 => SamplerConfig::greedy(),
        1 => SamplerConfig {
            temperature: 0.7,
            top_k: None,
            top_p: None,
            min_p: None,
            seed,
            ..SamplerConfig::greedy()
        },
        2 => SamplerConfig { seed, ..SamplerConfig::default() },
        3 => SamplerConfig { repeat_penalty: 1.3, repeat_last_n: 16, ..SamplerConfig::greedy() },
        4 => SamplerConfig {
            presence_penalty: 0.8,
            frequency_penalty: 0.4,
            seed,
            ..SamplerConfig::default()
        },
        _ => SamplerConfig {
            temperature: 1.2,
            top_k: Some(5),
            min_p: Some(0.1),
            seed,
            ..SamplerConfig::default()
        },
    }
}

/// Prompts an n-gram drafter has something to say about: a random phrase repeated.
fn copy_prompts(vocab: u32, n: usize) -> Vec<Vec<u32>> {
    let mut rng = StdRng::seed_from_u64(5);
    (0..n)
        .map(|_| {
            let phrase: Vec<u32> =
                (0..3 + rng.random_range(0..5)).map(|_| rng.random_range(1..vocab)).collect();
            let mut p = Vec::new();
            for _ in 0..2 + rng.random_range(0..2) {
                p.extend_from_slice(&phrase);
            }
            p
        })
        .collect()
}

fn cases(prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Case> {
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Case {
            prompt: p.clone(),
            sampling: sampling(i),
            max_tokens: max_tokens - i % 5,
            eos_ids: Vec::new(),
        })
        .collect()
}

fn assert_same(
    label: &str,
    cases: &[Case],
    with: &[(Vec<u32>, StopReason)],
    without: &[(Vec<u32>, StopReason)],
) {
    for (i, (w, wo)) in with.iter().zip(without).enumerate() {
        assert_eq!(w, wo, "{label}: case {i} ({:?}) differs with speculation", cases[i].sampling);
    }
}

fn assert_exercised(label: &str, s: SpecStats) {
    assert!(s.drafts > 0, "{label}: nothing was drafted");
    assert!(s.accepted_tokens > 0, "{label}: no draft token was accepted ({s:?})");
    assert!(s.accepted_tokens < s.draft_tokens, "{label}: no draft token was rejected ({s:?})");
}

/// Alone, in one batch (of 12 on the CPU), and with end ids inside the runs: the same tokens
/// with and without speculation.
fn lossless(on: On, model: &str) {
    let vocab = start(on, model, 1, 0).vocab_size() as u32;
    let prompts = copy_prompts(vocab, 12);
    let cases = cases(&prompts, 36);

    let (plain, _) = run_alone(on, model, &cases, 0);
    let (spec, alone_stats) = run_alone(on, model, &cases, 4);
    assert_same("alone", &cases, &spec, &plain);

    // Twelve sequences: a GPU's verify steps take the batch-invariant products (up to 127
    // rows), and its plain decode steps of up to 16 rows take them anyway.
    let n = 12;
    let label = format!("batch of {n}");
    let batch = run_batch(&start(on, model, n, 0), &cases[..n]);
    let engine = start(on, model, n, 6);
    let spec_batch = run_batch(&engine, &cases[..n]);
    assert_same(&label, &cases, &spec_batch, &batch);
    let batch_stats = engine.stats().spec;
    assert!(batch_stats.drafts > 0, "{label}: nothing was drafted");
    // Accepted and rejected drafts, over both.
    assert_exercised(
        "alone and in a batch",
        SpecStats {
            drafts: alone_stats.drafts + batch_stats.drafts,
            draft_tokens: alone_stats.draft_tokens + batch_stats.draft_tokens,
            accepted_tokens: alone_stats.accepted_tokens + batch_stats.accepted_tokens,
        },
    );

    // An end id that plain decoding emits mid-reply: both stop at its first occurrence.
    let stopping: Vec<Case> = cases
        .iter()
        .zip(&plain)
        .map(|(c, (tokens, _))| Case { eos_ids: vec![tokens[tokens.len() / 2]], ..c.clone() })
        .collect();
    let (plain_stop, _) = run_alone(on, model, &stopping, 0);
    let (spec_stop, _) = run_alone(on, model, &stopping, 4);
    assert_same("end ids", &stopping, &spec_stop, &plain_stop);
    for (i, (tokens, reason)) in spec_stop.iter().enumerate() {
        assert!(matches!(reason, StopReason::Eos(_)), "case {i}: {reason:?}");
        assert!(tokens.len() <= plain[i].0.len() / 2 + 1, "case {i} ran past its end id");
    }
}

#[test]
fn gpt_oss_speculation_is_lossless() {
    lossless(On::Cpu, &fixture("gpt_oss_tiny"));
}

#[test]
fn llama_speculation_is_lossless() {
    lossless(On::Cpu, &fixture("llama3_tiny"));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_gpt_oss_speculation_is_lossless_bf16() {
    lossless(On::Gpu, &fixture("gpt_oss_tiny"));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_llama_speculation_is_lossless_bf16() {
    lossless(On::Gpu, &fixture("llama3_tiny"));
}

/// SmolLM2 asked to repeat a paragraph with one change: long accepted runs, and the same reply.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn smollm2_copying_speculates_and_is_lossless() {
    smollm2_copying(On::Cpu);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_smollm2_copying_speculates_and_is_lossless_bf16() {
    smollm2_copying(On::Gpu);
}

fn smollm2_copying(on: On) {
    // A GGUF Llama computes in f32, whose products on a GPU are cuBLAS's (no speculation there):
    // the GPU runs inferno's HF conversion of it in bf16.
    let converted = tempfile::tempdir().expect("tempdir");
    let model = match on {
        On::Cpu => smollm2(),
        On::Gpu => {
            let mut gguf = GgufFile::open(std::path::Path::new(&smollm2())).expect("GGUF");
            convert::write_hf_checkpoint(&mut gguf, converted.path()).expect("convert");
            converted.path().to_str().expect("utf-8 path").to_string()
        }
    };
    let path = load::source::resolve(&smollm2(), false).expect("path");
    let source = load::source::Source::detect(&path, false).expect("source");
    let text = load::text::load(&source).expect("tokenizer");
    let ask = "Repeat the following paragraph exactly, but write \"river\" instead of \"stream\":\n\n\
        A small stream ran behind the old mill. In spring the stream was loud and fast, carrying \
        leaves and branches down to the valley. Children from the village came to watch the water \
        and to throw stones into the stream, counting the rings that spread across its surface.";
    let template = text.template.as_ref().expect("SmolLM2 has a chat template");
    let messages = [inferno::template::Message::new("user", ask)];
    let rendered = template.render(&messages, true, &serde_json::Value::Null).expect("render");
    let prompt = text.encode_chat(&rendered).expect("prompt");
    let base = Case {
        prompt,
        sampling: SamplerConfig::greedy(),
        max_tokens: 80,
        eos_ids: text.eos_ids.clone(),
    };
    let cases = vec![
        base.clone(),
        Case {
            sampling: SamplerConfig { seed: 3, temperature: 0.5, ..SamplerConfig::default() },
            ..base.clone()
        },
    ];
    let engine = |k| start_with(on, &model, 1, k, 512, NgramConfig::default());
    let (plain, _) = run_alone_in(&cases, || engine(0));
    let (spec, stats) = run_alone_in(&cases, || engine(6));
    assert_same("SmolLM2", &cases, &spec, &plain);
    assert!(
        stats.mean_accepted_length() > 2.0,
        "copying should accept long runs: {stats:?} (mean length {:.2})",
        stats.mean_accepted_length()
    );
}

/// Each token's log probabilities from one engine: (id, logprob, top ids).
fn logprob_run(engine: &Engine, case: &Case) -> Vec<(u32, f32, Vec<u32>)> {
    let mut req = request(case);
    req.logprobs = Some(3);
    let mut h = engine.submit(req).expect("submit");
    let mut out = Vec::new();
    loop {
        match h.blocking_next() {
            Some(Event::Token(t, Some(lp))) => {
                out.push((t, lp.logprob, lp.top.iter().map(|x| x.0).collect()))
            }
            Some(Event::Token(t, None)) => panic!("token {t} came without its logprobs"),
            Some(Event::Finished(_)) => return out,
            Some(Event::Failed(m)) => panic!("request failed: {m}"),
            None => panic!("the engine dropped the request"),
        }
    }
}

/// A verify step's rows give each token the log probabilities a one-token step gives it, and a
/// conversation continued after drafts were rejected reuses the cache and replies as a fresh
/// engine does.
#[test]
fn logprobs_and_a_continued_conversation_under_speculation() {
    let model = fixture("llama3_tiny");
    let vocab = start(On::Cpu, &model, 1, 0).vocab_size() as u32;
    let prompts = copy_prompts(vocab, 4);
    let mut drafts = 0;
    for (i, case) in cases(&prompts, 24).iter().enumerate() {
        let spec = start(On::Cpu, &model, 1, 4);
        let with = logprob_run(&spec, case);
        drafts += spec.stats().spec.drafts;
        let without = logprob_run(&start(On::Cpu, &model, 1, 0), case);
        assert_eq!(with.len(), without.len(), "case {i}");
        for (j, (w, wo)) in with.iter().zip(&without).enumerate() {
            assert_eq!((w.0, &w.2), (wo.0, &wo.2), "case {i} token {j}");
            assert!((w.1 - wo.1).abs() < 1e-4, "case {i} token {j}: logprob {} vs {}", w.1, wo.1);
        }
        // The reply and a second turn: the spec engine's cache holds the first turn.
        let mut next = case.prompt.clone();
        next.extend(with.iter().map(|t| t.0));
        next.extend_from_slice(&case.prompt[..3]);
        let turn = Case { prompt: next, max_tokens: 12, ..case.clone() };
        let (again, finish) = collect(spec.submit(request(&turn)).expect("submit"));
        assert!(finish.cached_tokens > 0, "case {i}: the second turn reused nothing");
        let fresh = run_batch(&start(On::Cpu, &model, 1, 0), std::slice::from_ref(&turn));
        assert_eq!(again, fresh[0].0, "case {i}: the second turn differs from a fresh engine's");
    }
    assert!(drafts > 0, "nothing was drafted");
}

/// A draft model: the engine runs it beside the model with its own KV pool and verifies its
/// guesses. The model drafting for itself guesses every greedy token right and some sampled
/// ones; the replies are plain decoding's either way, alone and in a batch. Its steps cost what
/// the model's do, so drafting cannot pay: the engine makes no drafts unless told to draft at a
/// loss (which the losslessness checks do).
#[test]
fn a_draft_model_is_lossless() {
    draft_model_lossless(On::Cpu);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_a_draft_model_is_lossless_bf16() {
    draft_model_lossless(On::Gpu);
}

fn draft_model_lossless(on: On) {
    let model = fixture("llama3_tiny");
    let (dev, dtype) = on.device();
    let vocab = start(on, &model, 1, 0).vocab_size() as u32;
    let cases = cases(&copy_prompts(vocab, 6), 30);
    let with_draft_costing = |n: usize, regardless_of_cost: bool| {
        let spec = SpecConfig {
            max_batch: usize::MAX,
            regardless_of_cost,
            ..SpecConfig::model(3).expect("k")
        };
        let cfg = EngineConfig {
            max_seqs: n,
            kv_tokens: n * CONTEXT,
            token_budget: 256,
            pipeline: inferno::switches::pipeline(),
            spec: Some(spec),
        };
        let opts = LoadOptions {
            dtype: Some(dtype),
            context: Some(CONTEXT),
            dummy: false,
            kv_dtype: Default::default(),
        };
        load::start_with_draft(&model, Some(&model), &opts, &dev, move |_| cfg).expect("engine").0
    };
    let with_draft = |n: usize| with_draft_costing(n, true);
    let (plain, _) = run_alone(on, &model, &cases, 0);
    let (kept, stats) = run_alone_in(&cases[..2], || with_draft_costing(1, false));
    assert_same("draft model that cannot pay", &cases[..2], &kept, &plain[..2]);
    assert_eq!(stats.drafts, 0, "a draft as dear as the model drafted");
    let (drafted, stats) = run_alone_in(&cases, || with_draft(1));
    assert_same("draft model, alone", &cases, &drafted, &plain);
    assert_exercised("draft model, alone", stats);
    let n = 6;
    let batch = run_batch(&start(on, &model, n, 0), &cases[..n]);
    let engine = with_draft(n);
    assert_same("draft model, batch", &cases, &run_batch(&engine, &cases[..n]), &batch);
    assert!(engine.stats().spec.drafts > 0, "the batch drafted nothing");
}

/// A draft whose vocabulary is not the model's is refused in one line.
#[test]
fn a_draft_with_another_vocabulary_is_refused() {
    let (model, draft) = (fixture("llama3_tiny"), fixture("gpt_oss_tiny"));
    let opts = LoadOptions {
        dtype: Some(DType::F32),
        context: Some(CONTEXT),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let cfg = EngineConfig {
        spec: Some(SpecConfig::model(3).expect("k")),
        ..EngineConfig::single(CONTEXT)
    };
    let err = load::start_with_draft(&model, Some(&draft), &opts, &Device::Cpu, move |_| cfg)
        .err()
        .expect("refused");
    let msg = format!("{err:#}");
    assert!(msg.contains("vocabulary") && msg.contains("tokenizer"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

/// A draft whose tokenizer gives tokens other ids is refused even when the vocabularies are the
/// same size; the same tokenizer in another format (SmolLM2's GGUF and its HF conversion) is
/// accepted.
#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_draft_with_another_tokenizer_is_refused() {
    let gguf = smollm2();
    let dir = tempfile::tempdir().expect("tempdir");
    // `inferno convert` writes the tokenizer beside the weights.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["convert", &gguf, dir.path().to_str().expect("utf-8 path")])
        .output()
        .expect("inferno convert");
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
    let draft = dir.path().to_str().expect("utf-8 path").to_string();
    let opts = LoadOptions {
        dtype: Some(DType::F32),
        context: Some(256),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let engine = |draft: &str| {
        let cfg = EngineConfig {
            spec: Some(SpecConfig::model(2).expect("k")),
            ..EngineConfig::single(256)
        };
        load::start_with_draft(&gguf, Some(draft), &opts, &Device::Cpu, move |_| cfg).map(|e| e.0)
    };
    engine(&draft).expect("the same tokenizer in another format is accepted");
    // Two tokens trade ids: the same size, another tokenizer.
    let path = dir.path().join("tokenizer.json");
    let mut t: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    let vocab = t["model"]["vocab"].as_object_mut().expect("BPE vocab");
    let (a, b) = (vocab["t"].clone(), vocab["u"].clone());
    vocab.insert("t".into(), b);
    vocab.insert("u".into(), a);
    std::fs::write(&path, t.to_string()).expect("write");
    let msg = format!("{:#}", engine(&draft).err().expect("refused"));
    assert!(msg.contains("tokenizer differs") && msg.contains("2 tokens"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}

/// `bench --verify-cost -c 3`: steps of three sequences' rows, one line per draft count, with
/// rates for all three sequences (here on the CPU, in f32).
#[test]
fn verify_cost_times_steps_of_several_sequences() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["bench", &fixture("gpt_oss_tiny"), "--cpu", "--verify-cost", "-c", "3", "-p", "20"])
        .output()
        .expect("run inferno");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("3 sequences at position 20"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.split_whitespace().next().is_some_and(|w| ["1", "2", "3", "4", "5", "9"].contains(&w))
        })
        .collect();
    assert_eq!(rows.len(), 6, "{text}");
    // The draft lengths' cost model of the three sequences' step: 1.00 for one row each, more
    // for more.
    let model = |r: &str| r.split_whitespace().nth(4).and_then(|w| w.parse::<f64>().ok());
    assert_eq!(model(rows[0]), Some(1.0), "{text}");
    assert!(rows.windows(2).all(|w| model(w[1]) > model(w[0])), "{text}");
    assert!(rows[0].contains("(no speculation)"), "{text}");
}

/// An engine of 32 sequences for a full-size layout of `benches/configs` (random weights, bf16)
/// whose steps stay within the rows every kernel computes alone: prefill chunks of at most 127
/// tokens (the MoE's slot tiles end at 127), verify steps within `invariant_rows`.
fn full_size_engine(config: &str, draft_tokens: usize) -> Engine {
    // The plain engine computes as a speculating one does: batch invariant (what a process
    // with a drafter turns on, `INFERNO_BATCH_INVARIANT=auto`).
    inferno::kernels::invariance::require();
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/benches/configs")).join(config);
    let spec = (draft_tokens > 0).then(|| SpecConfig {
        max_batch: usize::MAX,
        ngram: NgramConfig { min_n: 1, max_n: 4 },
        ..SpecConfig::ngram(draft_tokens).expect("draft tokens")
    });
    let cfg = EngineConfig {
        max_seqs: 32,
        kv_tokens: 32 * 256,
        token_budget: 127,
        pipeline: inferno::switches::pipeline(),
        spec,
    };
    let opts = LoadOptions {
        dtype: Some(DType::BF16),
        context: Some(256),
        dummy: true,
        kv_dtype: Default::default(),
    };
    let dev = Device::new_cuda(0).expect("a CUDA device");
    load::start(path.to_str().expect("utf-8 path"), &opts, &dev, move |_| cfg).expect("engine").0
}

/// The full-size layouts in a batch of 32: each sequence's tokens (greedy and every sampler
/// setting) are the same alone as in the batch, and the same with speculation as without. Half
/// the requests predict their plain reply with edits (drafts accepted in part), the others draft
/// n-grams; the batch verifies drafts while all 32 run (under the old limit of 8 rows, no
/// sequence drafts until at most 4 run).
fn full_size_batch_of_32(config: &str) {
    let plain_engine = full_size_engine(config, 0);
    let vocab = plain_engine.vocab_size() as u32;
    let cases = cases(&copy_prompts(vocab, 32), 40);
    let plain = run_batch(&plain_engine, &cases);
    for (i, c) in cases.iter().enumerate() {
        let alone = run_batch(&plain_engine, std::slice::from_ref(c)).remove(0);
        assert_eq!(
            alone, plain[i],
            "{config}: case {i} ({:?}) alone differs from the batch of 32",
            c.sampling
        );
    }
    drop(plain_engine);
    let engine = full_size_engine(config, 4);
    let mut rng = StdRng::seed_from_u64(12);
    let handles: Vec<RequestHandle> = cases
        .iter()
        .zip(&plain)
        .enumerate()
        .map(|(i, (c, (p, _)))| {
            let prediction = if i % 2 == 1 {
                let mut e = p.clone();
                let at = rng.random_range(0..e.len());
                e[at] = (e[at] + 1) % vocab;
                e
            } else {
                Vec::new()
            };
            engine.submit(Request { prediction, ..request(c) }).expect("submit")
        })
        .collect();
    let spec: Vec<(Vec<u32>, StopReason)> = handles
        .into_iter()
        .map(|h| {
            let (t, f) = collect(h);
            (t, f.reason)
        })
        .collect();
    assert_same(&format!("{config}, batch of 32"), &cases, &spec, &plain);
    let stats = engine.stats().spec;
    println!("{config}: batch of 32 with speculation: {stats:?}");
    assert_exercised(config, stats);
    assert!(stats.drafts >= 64, "{config}: only {} drafts in the batch of 32", stats.drafts);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_gpt_oss_20b_layout_batch_of_32_is_lossless_bf16() {
    full_size_batch_of_32("gpt-oss-20b.json");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_llama_1b_layout_batch_of_32_is_lossless_bf16() {
    full_size_batch_of_32("llama-3.2-1b.json");
}

/// Predicted Outputs: an engine without a drafter, each request carrying a prediction, emits the
/// tokens plain decoding emits, alone and in a batch, with every sampler setting; an exact
/// prediction (the plain reply) is accepted almost whole, an edited one in part, an unrelated
/// one rejected without harm, and the counts come back in the request's `Finish`.
fn predictions_lossless(on: On, model: &str) {
    let vocab = start(on, model, 1, 0).vocab_size() as u32;
    let cases = cases(&copy_prompts(vocab, 6), 30);
    let plain: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| run_batch(&start(on, model, 1, 0), std::slice::from_ref(c)).remove(0).0)
        .collect();
    let mut rng = StdRng::seed_from_u64(11);
    let edit = move |t: &[u32], rng: &mut StdRng| -> Vec<u32> {
        let mut e: Vec<u32> = t
            .iter()
            .map(|&x| if rng.random_range(0..5) == 0 { (x + 1) % vocab } else { x })
            .collect();
        e.drain(e.len() / 3..e.len() / 3 + 2);
        e
    };
    type Predict = Box<dyn Fn(&[u32], &mut StdRng) -> Vec<u32>>;
    let kinds: [(&str, Predict); 3] = [
        ("exact", Box::new(|t: &[u32], _: &mut StdRng| t.to_vec())),
        ("edited", Box::new(edit)),
        (
            "unrelated",
            Box::new(move |_: &[u32], r: &mut StdRng| {
                (0..40).map(|_| r.random_range(0..vocab)).collect()
            }),
        ),
    ];
    for (kind, predict) in &kinds {
        let requests: Vec<Request> = cases
            .iter()
            .zip(&plain)
            .map(|(c, p)| Request { prediction: predict(p, &mut rng), ..request(c) })
            .collect();
        // Alone, each in its own engine.
        let mut accepted = 0;
        let mut drafted = 0;
        for (i, req) in requests.iter().enumerate() {
            let e = start(on, model, 1, 0);
            let (tokens, finish) = collect(e.submit(req.clone()).expect("submit"));
            assert_eq!(tokens, plain[i], "{kind} prediction, case {i} ({:?})", cases[i].sampling);
            assert!(finish.accepted_draft_tokens <= finish.draft_tokens, "{kind}, case {i}");
            accepted += finish.accepted_draft_tokens;
            drafted += finish.draft_tokens;
        }
        let generated: usize = plain.iter().map(Vec::len).sum();
        match *kind {
            "exact" => assert!(accepted * 3 >= generated * 2, "exact: {accepted} of {generated}"),
            "edited" => {
                assert!(accepted > 0 && accepted < drafted, "edited: {accepted} of {drafted}")
            }
            _ => assert!(drafted > 0, "unrelated: nothing drafted"),
        }
        // Together in one engine: all six sequences.
        let n = cases.len();
        let e = start(on, model, n, 0);
        let handles: Vec<RequestHandle> =
            requests[..n].iter().map(|r| e.submit(r.clone()).expect("submit")).collect();
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(collect(h).0, plain[i], "{kind} prediction in a batch, case {i}");
        }
        // An unrelated prediction may give a batch nothing to draft.
        assert!(
            *kind == "unrelated" || e.stats().spec.drafts > 0,
            "{kind}: nothing drafted in the batch"
        );
    }
}

#[test]
fn gpt_oss_predictions_are_lossless() {
    predictions_lossless(On::Cpu, &fixture("gpt_oss_tiny"));
}

#[test]
fn llama_predictions_are_lossless() {
    predictions_lossless(On::Cpu, &fixture("llama3_tiny"));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_gpt_oss_predictions_are_lossless_bf16() {
    predictions_lossless(On::Gpu, &fixture("gpt_oss_tiny"));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_llama_predictions_are_lossless_bf16() {
    predictions_lossless(On::Gpu, &fixture("llama3_tiny"));
}

/// A verify step whose last draft is rejected keeps as many tokens as it sampled rows: the next
/// step's history is as long as the last row's (the sequence and every draft) but ends in the
/// sequence's own token. The presence and frequency penalties must count that token, not the
/// rejected draft. Each request predicts its plain reply with one token changed, at every
/// position in turn, so that some verify step rejects exactly its last draft; the penalties are
/// strong enough that a wrong count changes the token.
fn penalised_predictions(on: On, model: &str) {
    let vocab = start(on, model, 1, 0).vocab_size() as u32;
    let prompts = copy_prompts(vocab, 3);
    let samplers = [
        SamplerConfig { presence_penalty: 1.5, frequency_penalty: 2.0, ..SamplerConfig::greedy() },
        SamplerConfig {
            presence_penalty: 0.8,
            frequency_penalty: 1.0,
            seed: 7,
            ..SamplerConfig::default()
        },
    ];
    let mut rejected = 0;
    for (p, sampling) in prompts.iter().zip(samplers.iter().cycle()) {
        let case =
            Case { prompt: p.clone(), sampling: sampling.clone(), max_tokens: 24, eos_ids: vec![] };
        let plain = run_batch(&start(on, model, 1, 0), std::slice::from_ref(&case)).remove(0).0;
        for m in 1..plain.len() {
            let mut prediction = plain.clone();
            prediction[m] = (prediction[m] + 1) % vocab;
            let e = start(on, model, 1, 0);
            let req = Request { prediction, ..request(&case) };
            let (tokens, finish) = collect(e.submit(req).expect("submit"));
            assert_eq!(tokens, plain, "{sampling:?}, prediction changed at {m}");
            rejected += usize::from(finish.draft_tokens > finish.accepted_draft_tokens);
        }
    }
    assert!(rejected > 0, "no prediction was rejected");
}

#[test]
fn penalised_predictions_count_what_was_kept() {
    penalised_predictions(On::Cpu, &fixture("gpt_oss_tiny"));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu_penalised_predictions_count_what_was_kept_bf16() {
    penalised_predictions(On::Gpu, &fixture("gpt_oss_tiny"));
}
