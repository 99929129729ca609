//! Tensor parallelism on GPUs, ranks as processes over NCCL, as `--tp` runs them: this test
//! binary is rank 0 and starts its other ranks as copies of itself (`load::ranks::role`, the
//! CLI's own), each running the same test, which makes them follow rank 0. An engine over the
//! ranks decodes the tokens an engine on one GPU decodes, with the same log probabilities (f32,
//! within ~1e-5 of the logits' size), for the wide tiny gpt-oss and the Llama-3.2-1B shape over
//! 64 tokens. Measured on 2 H100s: 192 of 192 tokens identical for each; log probabilities
//! within 1.4e-6 (gpt-oss) and 3.7e-4 (Llama-1B shape, logits of ±40). Needs 2 GPUs and NCCL:
//! `tensor_parallel_gpu --ignored` on a machine of two.

use candle_core::{DType, Device};
use inferno::engine::core::{Engine, EngineConfig};
use inferno::engine::request::{Event, Request};
use inferno::generate::SamplerConfig;
use inferno::load::{self, LoadOptions, ranks};

mod common;

const TOKENS: usize = 64;

/// Each request's tokens and their top-5 log probabilities.
type Replies = Vec<Vec<(u32, Vec<(u32, f32)>)>>;

fn generate(engine: &Engine, vocab: u32) -> Replies {
    let prompts: Vec<Vec<u32>> = (0..3u32)
        .map(|i| (0..(20 + 7 * i)).map(|t| (t * 7919 + i * 104_729) % vocab).collect())
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let req = Request {
                prompt: p.clone(),
                sampling: SamplerConfig::greedy(),
                max_tokens: TOKENS,
                eos_ids: Vec::new(),
                interrupt: None,
                logprobs: Some(5),
                forced: Vec::new(),
                constraint: None,
                prediction: Vec::new(),
            };
            engine.submit(req).expect("submit")
        })
        .collect();
    handles
        .into_iter()
        .map(|mut h| {
            let mut out = Vec::new();
            loop {
                match h.blocking_next() {
                    Some(Event::Token(t, lp)) => {
                        out.push((t, lp.map(|l| l.top).unwrap_or_default()))
                    }
                    Some(Event::Finished(_)) => return out,
                    Some(Event::Failed(m)) => panic!("request failed: {m}"),
                    None => panic!("the engine dropped the request"),
                }
            }
        })
        .collect()
}

/// FNV-1a over every token id and log probability's bits: equal digests, equal replies.
fn digest(replies: &Replies) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let words = replies.iter().flatten().flat_map(|(t, top)| {
        std::iter::once(*t).chain(top.iter().flat_map(|(i, l)| [*i, l.to_bits()]))
    });
    for w in words {
        for b in w.to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

fn size(_: &load::ModelInfo) -> EngineConfig {
    EngineConfig { max_seqs: 4, kv_tokens: 4 * 256, ..EngineConfig::single(256) }
}

/// `make`'s model over 2 GPUs and on one: the same tokens, log probabilities within `tol`. The
/// role comes first: the other rank (this test in a copy of this process) follows from there,
/// and reads rank 0's checkpoint.
fn check(make: impl FnOnce() -> tempfile::TempDir, dtype: DType, vocab: u32, tol: f32) {
    let role = ranks::role(2, 0, false).expect("rank role");
    let dir = make();
    let name = dir.path().to_str().unwrap();
    let opts = LoadOptions {
        dtype: Some(dtype),
        context: Some(256),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let device = Device::new_cuda(0).expect("GPU 0");
    let (tp_engine, info) =
        load::start_group(name, None, &opts, &device, role, size).expect("TP2 engine");
    // Two GPUs that reach each other's memory (NVLink, or PCIe peer access) sum through it unless
    // INFERNO_TP_P2P=0; either way the bits are the same, so the digest below is too.
    let peer = std::env::var("INFERNO_TP_P2P").map_or(true, |v| v != "0");
    let want = if peer { "peer memory" } else { "NCCL" };
    assert_eq!(info.sums, want, "the ranks' sums went another way");
    let tp = generate(&tp_engine, vocab);
    drop(tp_engine);
    eprintln!("TP2 sums through {}: digest {:016x}", info.sums, digest(&tp));
    let (one_engine, _) = load::start(name, &opts, &device, size).expect("TP1 engine");
    let one = generate(&one_engine, vocab);
    let mut worst = 0f32;
    for (r, (a, b)) in tp.iter().zip(&one).enumerate() {
        let ids = |x: &Vec<(u32, Vec<(u32, f32)>)>| x.iter().map(|t| t.0).collect::<Vec<_>>();
        assert_eq!(ids(a), ids(b), "request {r}: TP2 decoded other tokens than one GPU");
        for ((_, ta), (_, tb)) in a.iter().zip(b) {
            for ((ia, la), (ib, lb)) in ta.iter().zip(tb) {
                assert_eq!(ia, ib, "request {r}: another top-5 order");
                worst = worst.max((la - lb).abs());
            }
        }
    }
    eprintln!(
        "TP2 vs one GPU ({dtype:?}): {} tokens identical, top-5 log probabilities within {worst:.1e}",
        3 * TOKENS
    );
    assert!(worst <= tol, "log probabilities differ by {worst}");
}

#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_gpt_oss_matches_one_gpu() {
    check(common::tp::wide_gpt_oss, DType::F32, 250, 2e-4);
}

#[test]
#[ignore = "needs 2 GPUs and NCCL"]
fn gpu_tp2_llama_1b_shape_matches_one_gpu_over_64_tokens() {
    let config = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/benches/configs/llama-3.2-1b.json"
    ))
    .or_else(|_| std::fs::read_to_string("benches/configs/llama-3.2-1b.json"))
    .expect("the Llama-3.2-1B config");
    // Its logits reach ±40 (a random tied embedding of 2048): 1e-5 of that is 4e-4.
    check(|| common::tp::random_llama(&config), DType::F32, 128_256, 4e-4);
}
