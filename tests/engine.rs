//! The batching engine (`inferno::engine::core`) on the CPU in f32, with the tiny gpt-oss
//! checkpoint (full and sliding-window layers, sinks, MoE) and the tiny Llama 3 checkpoint:
//!
//! - batched equals alone: 16 requests of different prompt lengths and sampling settings,
//!   submitted at staggered times into one engine, give token for token what each gives alone
//!   (and greedy ones what the single-sequence model path gives);
//! - cancellation mid-prefill and mid-decode frees the cache: after 200 requests with random
//!   cancellations and dropped handles, the engine reports every block free;
//! - prefix reuse: a conversation continued in a second request prefills only the new tokens and
//!   gives exactly what a fresh engine gives;
//! - forced ids and logprobs: teacher forcing, and the raw log-softmax of each step.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::request::{Event, Request, RequestHandle};
use inferno::generate::{SamplerConfig, StopReason};
use inferno::load::{self, LoadOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod common;
use common::collect;
use common::one_seq::OneSeq;

const CONTEXT: usize = 256;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name)
}

fn opts() -> LoadOptions {
    LoadOptions {
        dtype: Some(DType::F32),
        context: Some(CONTEXT),
        dummy: false,
        kv_dtype: Default::default(),
    }
}

/// An engine on the CPU; a small token budget so prompts go in several chunks and mix with
/// other sequences' decode steps.
fn start(model: &str, max_seqs: usize, kv_tokens: usize, budget: usize) -> Engine {
    let path = fixture(model);
    let cfg = EngineConfig {
        max_seqs,
        kv_tokens,
        token_budget: budget,
        pipeline: inferno::switches::pipeline(),
        spec: None,
    };
    let (engine, _) =
        load::start(path.to_str().expect("utf-8 path"), &opts(), &Device::Cpu, move |_| cfg)
            .expect("engine");
    engine
}

fn request(prompt: Vec<u32>, sampling: SamplerConfig, max_tokens: usize) -> Request {
    Request {
        prompt,
        sampling,
        max_tokens,
        eos_ids: Vec::new(),
        interrupt: None,
        logprobs: None,
        forced: Vec::new(),
        constraint: None,
        prediction: Vec::new(),
    }
}

fn random_prompt(rng: &mut StdRng, len: usize, vocab: u32) -> Vec<u32> {
    (0..len).map(|_| rng.random_range(1..vocab)).collect()
}

/// Settings that exercise each sampling path: greedy, plain temperature, the full host chain.
fn sampling(i: usize) -> SamplerConfig {
    match i % 3 {
        0 => SamplerConfig::greedy(),
        1 => SamplerConfig {
            temperature: 0.9,
            top_k: None,
            top_p: None,
            min_p: None,
            seed: 7 + i as u64,
            ..SamplerConfig::default()
        },
        _ => {
            SamplerConfig { repeat_penalty: 1.3, seed: 100 + i as u64, ..SamplerConfig::default() }
        }
    }
}

/// Greedy tokens of the model run alone, one sequence step by step (`OneSeq`, no scheduler):
/// the engine's reference.
fn greedy_single(model: &str, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut m = OneSeq::new(
        load::load(fixture(model).to_str().expect("path"), &opts(), &Device::Cpu)
            .expect("model")
            .model,
    );
    let mut out = Vec::new();
    let mut logits = m.forward_last(prompt, 0).expect("prefill");
    for i in 0..n {
        let id = inferno::generate::sampler::argmax(&logits.to_vec1::<f32>().expect("logits"));
        out.push(id);
        if i + 1 < n {
            logits = m.forward_last(&[id], prompt.len() + i).expect("decode");
        }
    }
    out
}

fn batched_equals_alone(model: &str) {
    let mut rng = StdRng::seed_from_u64(11);
    let vocab = start(model, 1, CONTEXT, 64).vocab_size() as u32;
    let reqs: Vec<(Vec<u32>, SamplerConfig, usize)> = (0..16)
        .map(|i| {
            let len = 1 + rng.random_range(0..70);
            (random_prompt(&mut rng, len, vocab), sampling(i), 4 + rng.random_range(0..20))
        })
        .collect();
    // Alone: one engine per request, so no prefix cache is shared either.
    let alone: Vec<Vec<u32>> = reqs
        .iter()
        .map(|(p, s, n)| {
            let e = start(model, 1, CONTEXT, 16);
            collect(e.submit(request(p.clone(), s.clone(), *n)).expect("submit")).0
        })
        .collect();
    // Batched: half now, the rest once the first has produced a token (mid-flight).
    let engine = start(model, 16, 16 * CONTEXT, 16);
    let mut handles: Vec<RequestHandle> = reqs[..8]
        .iter()
        .map(|(p, s, n)| engine.submit(request(p.clone(), s.clone(), *n)).expect("submit"))
        .collect();
    let first = handles[0].blocking_next();
    assert!(matches!(first, Some(Event::Token(_, _))), "{first:?}");
    let Some(Event::Token(first, _)) = first else { unreachable!() };
    handles.extend(
        reqs[8..]
            .iter()
            .map(|(p, s, n)| engine.submit(request(p.clone(), s.clone(), *n)).expect("submit")),
    );
    let mut batched: Vec<Vec<u32>> = handles.into_iter().map(|h| collect(h).0).collect();
    batched[0].insert(0, first);
    for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
        assert_eq!(b, a, "request {i} ({:?}): batched differs from alone", reqs[i].1);
    }
    // Greedy requests also match the single-sequence model path.
    for (i, (p, s, n)) in reqs.iter().enumerate().filter(|(_, r)| r.1.is_greedy()) {
        assert_eq!(
            alone[i],
            greedy_single(model, p, *n),
            "request {i}: engine vs model path ({s:?})"
        );
    }
    assert!(engine.stats().running == 0);
}

#[test]
fn gpt_oss_batched_equals_alone() {
    batched_equals_alone("gpt_oss_tiny");
}

#[test]
fn gpt_oss_gguf_batched_equals_alone() {
    batched_equals_alone("gpt_oss_tiny_gguf/model.gguf");
}

#[test]
fn llama_batched_equals_alone() {
    batched_equals_alone("llama3_tiny");
}

/// Waits until the engine has nothing running (finishing requests is asynchronous).
fn wait_idle(engine: &Engine) {
    let t0 = Instant::now();
    while engine.stats().running + engine.stats().waiting > 0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "engine still busy: {:?}", engine.stats());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn cancellations_free_the_cache() {
    let mut rng = StdRng::seed_from_u64(5);
    // A pool too small for all requests at once: some wait, some get preempted.
    let engine = start("gpt_oss_tiny", 8, 1024, 32);
    let vocab = engine.vocab_size() as u32;
    let mut live: Vec<RequestHandle> = Vec::new();
    let (mut cancelled, mut finished) = (0, 0);
    for i in 0..200 {
        let len = 1 + rng.random_range(0..120);
        let h = engine
            .submit(request(
                random_prompt(&mut rng, len, vocab),
                sampling(i),
                1 + rng.random_range(0..30),
            ))
            .expect("submit");
        live.push(h);
        // Now and then: cancel one (possibly mid-prefill), drop one, or read one to its end.
        if live.len() > 6 || rng.random_bool(0.3) {
            let k = rng.random_range(0..live.len());
            let mut h = live.swap_remove(k);
            match rng.random_range(0..3) {
                0 => {
                    h.cancel();
                    cancelled += 1;
                }
                1 => {
                    // Read a few tokens first: mid-decode.
                    for _ in 0..rng.random_range(0..4) {
                        if !matches!(h.blocking_next(), Some(Event::Token(_, _))) {
                            break;
                        }
                    }
                    drop(h);
                    cancelled += 1;
                }
                _ => {
                    let (_, f) = collect(h);
                    assert!(matches!(f.reason, StopReason::MaxTokens), "{:?}", f.reason);
                    finished += 1;
                }
            }
        }
    }
    for h in live {
        collect(h);
        finished += 1;
    }
    wait_idle(&engine);
    let s = engine.stats();
    assert_eq!(s.free_blocks, s.total_blocks, "leaked KV blocks: {s:?}");
    assert!(cancelled > 20 && finished > 20, "cancelled {cancelled}, finished {finished}");
}

#[test]
fn a_continued_conversation_prefills_only_the_new_tokens() {
    for model in ["gpt_oss_tiny", "llama3_tiny"] {
        let mut rng = StdRng::seed_from_u64(3);
        let engine = start(model, 4, 4 * CONTEXT, 16);
        let vocab = engine.vocab_size() as u32;
        // Turn 1: a prompt of 70 tokens and a 40-token reply (longer than the tiny window).
        let first = random_prompt(&mut rng, 70, vocab);
        let (reply, f1) = collect(
            engine.submit(request(first.clone(), SamplerConfig::greedy(), 40)).expect("submit"),
        );
        assert_eq!(f1.cached_tokens, 0);
        // Turn 2 diverges right at the end of turn 1's prompt (harmony drops the reasoning) ...
        let mut second = first.clone();
        second.extend(random_prompt(&mut rng, 9, vocab));
        // ... and turn 3 continues after the reply (a chat template keeps it).
        let mut third = first.clone();
        third.extend(&reply);
        third.extend(random_prompt(&mut rng, 5, vocab));
        for (prompt, at_least) in [(&second, 64), (&third, 96)] {
            let (tokens, f) = collect(
                engine
                    .submit(request(prompt.clone(), SamplerConfig::greedy(), 20))
                    .expect("submit"),
            );
            assert!(
                f.cached_tokens >= at_least && f.cached_tokens % 16 == 0,
                "{model}: {} of {} prompt tokens came from the cache",
                f.cached_tokens,
                prompt.len()
            );
            let fresh = start(model, 1, CONTEXT, 16);
            let (want, g) = collect(
                fresh.submit(request(prompt.clone(), SamplerConfig::greedy(), 20)).expect("submit"),
            );
            assert_eq!(g.cached_tokens, 0);
            assert_eq!(tokens, want, "{model}: reused prefix differs from a fresh run");
        }
    }
}

/// A KV pool larger than the memory that is free is refused before anything is allocated,
/// with the memory error kind (exit code 7) and a line that says what to lower.
#[test]
fn an_oversized_pool_is_refused_with_the_numbers() {
    let path = fixture("gpt_oss_tiny");
    let cfg = EngineConfig {
        max_seqs: 64,
        kv_tokens: 1 << 40,
        token_budget: 64,
        pipeline: inferno::switches::pipeline(),
        spec: None,
    };
    let err = load::start(path.to_str().expect("path"), &opts(), &Device::Cpu, move |_| cfg)
        .err()
        .expect("a refusal");
    assert_eq!(inferno::error::kind_of(&err), inferno::error::ErrorKind::Memory, "{err:#}");
    let msg = format!("{err}");
    assert!(msg.contains("KV cache") && msg.contains("lower"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
}

/// Greedy decoding with a repetition penalty picks from the penalised logits (a device argmax of
/// the raw row would ignore the penalty): the engine equals the host sampler run on the
/// model alone.
#[test]
fn greedy_with_a_repetition_penalty_applies_it() {
    let cfg = SamplerConfig { repeat_penalty: 3.0, repeat_last_n: 64, ..SamplerConfig::greedy() };
    let engine = start("llama3_tiny", 1, CONTEXT, 16);
    let vocab = engine.vocab_size() as u32;
    let prompt = random_prompt(&mut StdRng::seed_from_u64(9), 12, vocab);
    let (got, _) =
        collect(engine.submit(request(prompt.clone(), cfg.clone(), 24)).expect("submit"));
    let mut m = OneSeq::new(
        load::load(fixture("llama3_tiny").to_str().expect("path"), &opts(), &Device::Cpu)
            .expect("model")
            .model,
    );
    let mut sampler = inferno::generate::Sampler::new(cfg);
    let mut history = prompt.clone();
    let mut logits = m.forward_last(&prompt, 0).expect("prefill");
    let mut want = Vec::new();
    for _ in 0..24 {
        let id = sampler.sample(&mut logits.to_vec1::<f32>().expect("row"), &history);
        want.push(id);
        history.push(id);
        logits = m.forward_last(&[id], history.len() - 1).expect("decode");
    }
    assert_eq!(got, want);
}

/// A request with forced ids and logprobs, run beside another request: the engine continues
/// from the forced ids (teacher forcing), and each step's logprobs are the log-softmax of the
/// logits of the model alone for that prefix (the raw logits: the request samples
/// with a penalty and a temperature, which must not change them).
#[test]
fn forced_ids_are_teacher_forcing_and_logprobs_are_the_raw_log_softmax() {
    let engine = start("llama3_tiny", 4, 4 * CONTEXT, 16);
    let vocab = engine.vocab_size() as u32;
    let mut rng = StdRng::seed_from_u64(21);
    let prompt = random_prompt(&mut rng, 10, vocab);
    let forced = random_prompt(&mut rng, 12, vocab);
    let cfg = SamplerConfig { frequency_penalty: 1.0, temperature: 0.7, ..sampling(1) };
    let mut req = request(prompt.clone(), cfg, forced.len());
    req.logprobs = Some(5);
    req.forced = forced.clone();
    let other = engine.submit(request(random_prompt(&mut rng, 30, vocab), sampling(2), 20));
    let mut h = engine.submit(req).expect("submit");
    let mut steps = Vec::new();
    loop {
        match h.blocking_next() {
            Some(Event::Token(id, scores)) => steps.push((id, scores.expect("logprobs asked"))),
            Some(Event::Finished(_)) => break,
            other => panic!("{other:?}"),
        }
    }
    drop(other);
    let ids: Vec<u32> = steps.iter().map(|s| s.0).collect();
    assert_eq!(ids, forced);
    let mut m = OneSeq::new(
        load::load(fixture("llama3_tiny").to_str().expect("path"), &opts(), &Device::Cpu)
            .expect("model")
            .model,
    );
    let mut logits = m.forward_last(&prompt, 0).expect("prefill");
    for (i, (id, scores)) in steps.iter().enumerate() {
        let row: Vec<f64> =
            logits.to_vec1::<f32>().expect("row").iter().map(|&l| l as f64).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        assert_eq!(scores.id, *id);
        assert!((scores.logprob as f64 - (row[*id as usize] - lse)).abs() < 1e-4, "step {i}");
        let mut best: Vec<usize> = (0..row.len()).collect();
        best.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
        assert_eq!(scores.top.len(), 5);
        for ((t, lp), want) in scores.top.iter().zip(&best) {
            assert_eq!(*t as usize, *want, "step {i}");
            assert!((*lp as f64 - (row[*want] - lse)).abs() < 1e-4, "step {i}");
        }
        logits = m.forward_last(&[*id], prompt.len() + i).expect("decode");
    }
}
