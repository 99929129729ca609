//! Tensor parallelism's sharding math on the CPU, ranks as threads (`dist::ThreadGroup`): a model
//! split over 2 and 4 ranks gives the logits of the whole model on one (f32, within 1e-5 of the
//! largest logit) and the same greedy tokens, for gpt-oss (heads, sinks, MXFP4 experts split at
//! block boundaries, key/value heads replicated past their count, a vocabulary that does not
//! divide) and Llama. The GPU run of the same (NCCL, one process per GPU) is
//! `gpu_tp_matches_one_rank` in tests/tensor_parallel_gpu.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use inferno::dist::{Collective, ThreadGroup};
use inferno::load::{self, LoadOptions};

mod common;
use common::one_seq::OneSeq;

const PROMPT: [u32; 21] =
    [3, 17, 99, 4, 250 - 1, 8, 12, 5, 5, 77, 31, 2, 9, 64, 128, 200, 1, 0, 45, 46, 47];
const DECODE: usize = 12;

fn opts() -> LoadOptions {
    LoadOptions { dtype: Some(DType::F32), context: Some(64), dummy: false }
}

/// What rank 0 saw: the prompt's logits `[len, vocab]`, then each greedy step's.
struct Run {
    prompt: Vec<Vec<f32>>,
    steps: Vec<Vec<f32>>,
    tokens: Vec<u32>,
}

fn drive(mut seq: OneSeq) -> Run {
    let prompt: Vec<Vec<f32>> = seq.forward_all(&PROMPT, 0).unwrap().to_vec2().unwrap();
    // Greedy from a fresh sequence through the runner, as the engine decodes.
    let mut seq_logits = seq.forward_last(&PROMPT, 0).unwrap();
    let (mut steps, mut tokens) = (Vec::new(), Vec::new());
    for i in 0..DECODE {
        let row: Vec<f32> = seq_logits.to_vec1().unwrap();
        let next = argmax(&row);
        steps.push(row);
        tokens.push(next);
        seq_logits = seq.forward_last(&[next], PROMPT.len() + i).unwrap();
    }
    Run { prompt, steps, tokens }
}

fn argmax(v: &[f32]) -> u32 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32
}

/// The model in `dir` over `world` ranks (threads); rank 0's run, and every rank's tokens.
fn run(dir: &Path, world: usize) -> Run {
    if world == 1 {
        let model = load::load(dir.to_str().unwrap(), &opts(), &Device::Cpu).unwrap().model;
        return drive(OneSeq::new(model));
    }
    let ends = ThreadGroup::new(world);
    let runs: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = ends
            .into_iter()
            .map(|end| {
                s.spawn(move || {
                    let comm: Arc<dyn Collective> = Arc::new(end);
                    let name = dir.to_str().unwrap();
                    let loaded = load::load_rank(name, &opts(), &Device::Cpu, comm).unwrap();
                    drive(OneSeq::new(loaded.model))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    for (r, other) in runs.iter().enumerate().skip(1) {
        assert_eq!(other.tokens, runs[0].tokens, "rank {r} decoded other tokens than rank 0");
        assert_eq!(other.steps, runs[0].steps, "rank {r}'s logits are not rank 0's bits");
    }
    runs.into_iter().next().unwrap()
}

/// Largest |a − b| over the largest |b|, over all rows.
fn relative(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    let (mut diff, mut scale) = (0f32, 0f32);
    for (ra, rb) in a.iter().zip(b) {
        assert_eq!(ra.len(), rb.len(), "vocabulary sizes differ");
        for (x, y) in ra.iter().zip(rb) {
            diff = diff.max((x - y).abs());
            scale = scale.max(y.abs());
        }
    }
    diff / scale
}

fn check(dir: &Path, worlds: &[usize]) {
    let one = run(dir, 1);
    for &world in worlds {
        let tp = run(dir, world);
        let (p, s) = (relative(&tp.prompt, &one.prompt), relative(&tp.steps, &one.steps));
        eprintln!("TP{world}: prompt logits within {p:.1e}, decode logits within {s:.1e} of TP1");
        assert!(p < 1e-5 && s < 1e-5, "TP{world}: logits off by {p:e} / {s:e}");
        assert_eq!(tp.tokens, one.tokens, "TP{world}: greedy tokens differ");
    }
}

/// The tiny gpt-oss fixture's layout widened so that 4 ranks can split it: 8 query heads over 2
/// key/value heads (replicated at TP4), 4 MXFP4 blocks of intermediate columns, a vocabulary of
/// 250 (pieces of 63, the last padded); random weights, seeded.
fn wide_gpt_oss() -> tempfile::TempDir {
    use rand::{Rng, SeedableRng};
    let dir = tempfile::tempdir().unwrap();
    let fixture =
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"));
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
    cfg["num_attention_heads"] = 8.into();
    cfg["num_key_value_heads"] = 2.into();
    cfg["intermediate_size"] = 128.into();
    cfg["vocab_size"] = 250.into();
    cfg["eos_token_id"] = 249.into();
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let parsed = inferno::models::gpt_oss::GptOssConfig::from_hf_json(&cfg.to_string()).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut tensors = std::collections::HashMap::new();
    for (name, shape) in inferno::models::gpt_oss::memory::checkpoint_tensors(&parsed) {
        let n: usize = shape.iter().product();
        let t = if name.ends_with("_blocks") || name.ends_with("_scales") {
            let (lo, hi) = if name.ends_with("_blocks") { (0, 256) } else { (118, 124) };
            let v: Vec<u8> = (0..n).map(|_| rng.random_range(lo..hi) as u8).collect();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        } else {
            let std = match () {
                _ if name.contains("layernorm") || name == "model.norm.weight" => 0.0,
                _ if name.contains("embed") || name.ends_with("sinks") => 1.0,
                _ if name.ends_with("bias") => 0.05,
                _ => 0.125,
            };
            let base = if std == 0.0 { 1.0 } else { 0.0 };
            let v: Vec<f32> = (0..n).map(|_| base + std * rng.random_range(-1.7f32..1.7)).collect();
            Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
        };
        tensors.insert(name, t);
    }
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    dir
}

#[test]
fn gpt_oss_over_2_and_4_ranks_gives_one_ranks_logits_and_tokens() {
    let dir = wide_gpt_oss();
    check(dir.path(), &[2, 4]);
}

#[test]
fn llama_over_2_and_4_ranks_gives_one_ranks_logits_and_tokens() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama3_tiny"));
    check(&dir, &[2, 4]);
}

#[test]
fn ranks_that_do_not_divide_the_heads_are_refused_in_one_line() {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama3_tiny"));
    let ends = ThreadGroup::new(3);
    let end: Arc<dyn Collective> = Arc::new(ends.into_iter().next().unwrap());
    let err = load::load_rank(dir.to_str().unwrap(), &opts(), &Device::Cpu, end).err().unwrap();
    let msg = format!("{err:#}");
    assert!(msg.contains("--tp 3 must divide the model's 4 attention heads"), "{msg}");
    assert_eq!(msg.lines().count(), 1, "{msg}");
}
