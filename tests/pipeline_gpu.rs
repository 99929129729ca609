//! The pipelined decode (src/engine/core/pipeline.rs: the next step enqueued before the host
//! reads this one's ids, stops seen one step late) gives exactly the tokens of the unpipelined
//! one, on the GPU, for both architectures: greedy and seeded sampling, a stop on an EOS id and
//! on max_tokens, several sequences at once (a decode graph captured after the first steps were
//! read back), and a cancellation mid-stream.
//!
//! Ignored by default (CI has no GPU); scripts/gpu-tests.sh runs it. The two engines differ in
//! `EngineConfig::pipeline` alone.

mod common;

use std::path::PathBuf;

use candle_core::DType;
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::request::{Event, Finish, Request};
use inferno::generate::{SamplerConfig, StopReason};
use inferno::load::{self, LoadOptions};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn start(model: &str, pipelined: bool) -> Engine {
    let (device, _) = inferno::gpu::open(0).expect("a CUDA device");
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(model);
    let opts = LoadOptions {
        dtype: Some(DType::BF16),
        context: Some(512),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let cfg = EngineConfig {
        max_seqs: 4,
        kv_tokens: 2048,
        token_budget: 64,
        pipeline: pipelined,
        spec: None,
    };
    let (engine, _) = load::start(path.to_str().expect("utf-8 path"), &opts, &device, move |_| cfg)
        .expect("engine");
    engine
}

/// Tokens and how they stopped.
fn reason_of((tokens, finish): (Vec<u32>, Finish)) -> (Vec<u32>, StopReason) {
    (tokens, finish.reason)
}

fn request(prompt: &[u32], sampling: SamplerConfig, max_tokens: usize, eos: &[u32]) -> Request {
    Request {
        prompt: prompt.to_vec(),
        sampling,
        max_tokens,
        eos_ids: eos.to_vec(),
        interrupt: None,
        logprobs: None,
        forced: Vec::new(),
        constraint: None,
        prediction: Vec::new(),
    }
}

/// What one engine produces for the fixed scenario, and its pipelined step count.
fn scenario(model: &str, pipelined: bool) -> (Vec<(Vec<u32>, StopReason)>, u64) {
    let engine = start(model, pipelined);
    let vocab = engine.vocab_size() as u32;
    let mut r = StdRng::seed_from_u64(11);
    let mut prompt = || (0..12).map(|_| r.random_range(0..vocab)).collect::<Vec<u32>>();
    let (p1, p2, p3) = (prompt(), prompt(), prompt());
    let greedy = SamplerConfig::greedy();
    let seeded = SamplerConfig { temperature: 0.8, top_p: Some(0.9), seed: 7, ..greedy.clone() };
    let run = |req: Request| reason_of(common::collect(engine.submit(req).expect("submit")));
    let mut out = Vec::new();
    let first = run(request(&p1, greedy.clone(), 40, &[]));
    // The 11th greedy token as the EOS id: the same request stops at its first occurrence.
    let eos = first.0[10];
    out.push(first);
    out.push(run(request(&p1, greedy.clone(), 40, &[eos])));
    out.push(run(request(&p2, seeded.clone(), 40, &[])));
    // Three at once, stopping at different steps.
    let handles: Vec<_> = [(&p1, 5), (&p2, 17), (&p3, 30)]
        .into_iter()
        .map(|(p, n)| engine.submit(request(p, seeded.clone(), n, &[])).expect("submit"))
        .collect();
    out.extend(handles.into_iter().map(|h| reason_of(common::collect(h))));
    // A cancellation after 5 tokens: what arrived is a prefix of the uncancelled stream.
    let mut h = engine.submit(request(&p1, greedy.clone(), 40, &[])).expect("submit");
    let mut got = Vec::new();
    let reason = loop {
        match h.blocking_next() {
            Some(Event::Token(t, _)) => {
                got.push(t);
                if got.len() == 5 {
                    h.cancel();
                }
            }
            Some(Event::Finished(f)) => break f.reason,
            other => panic!("unexpected event {other:?}"),
        }
    };
    assert!(got.len() >= 5 && out[0].0.starts_with(&got), "{model}: cancelled stream {got:?}");
    assert!(matches!(reason, StopReason::Interrupted | StopReason::MaxTokens), "{reason:?}");
    let stats = engine.stats();
    // Graphs for 1 and 4 rows, the second captured after the first readbacks.
    assert_eq!(stats.failed_graphs, 0, "{model}: a decode graph failed to capture");
    (out, stats.pipelined_steps)
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_pipelined_decode_gives_the_same_tokens() {
    for model in ["gpt_oss_tiny", "llama3_tiny"] {
        let (plain, plain_steps) = scenario(model, false);
        let (piped, piped_steps) = scenario(model, true);
        eprintln!("{model}: pipelined steps {piped_steps} (unpipelined engine: {plain_steps})");
        assert_eq!(plain_steps, 0, "{model}: an engine without the pipeline still pipelined");
        // Most decode steps of the scenario (~200) go ahead of the host.
        assert!(piped_steps > 100, "{model}: only {piped_steps} steps were pipelined");
        assert_eq!(plain[1].1, StopReason::Eos(plain[0].0[10]), "{model}: the EOS stop");
        for (i, (a, b)) in plain.iter().zip(&piped).enumerate() {
            assert_eq!(a, b, "{model}: request {i} differs with the pipeline");
        }
    }
}
