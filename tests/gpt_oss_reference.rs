//! gpt-oss against transformers' GptOssForCausalLM on a tiny checkpoint in the exact HF layout
//! (MXFP4 experts, sinks, sliding + full layers, YaRN): tests/fixtures/gpt_oss_tiny, made by
//! scripts/fixtures/gpt_oss_tiny.py. f32 logits within 1e-3 and identical greedy tokens.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use inferno::models::CausalLm;
use inferno::models::gpt_oss::load;
use serde_json::Value;

const STEPS: usize = 40;

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"))
}

fn reference() -> Value {
    serde_json::from_str(include_str!("fixtures/gpt_oss_tiny/reference.json")).expect("reference JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn check_logits(device: &Device, dtype: DType, tolerance: f32) {
    let fx = reference();
    let mut model = load::load(&dir(), dtype, 64, device).unwrap();
    let prompt = ids(&fx["prompt_ids"]);
    let got: Vec<Vec<f32>> = model.forward_all(&prompt, 0).unwrap().to_vec2().unwrap();
    let want: Vec<Vec<f32>> = serde_json::from_value(fx["prompt_logits"].clone()).unwrap();
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(&want) {
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs());
        }
    }
    eprintln!("max |logit - reference| = {worst:.2e}");
    assert!(worst < tolerance, "logits differ from transformers by {worst}");
}

fn check_greedy(device: &Device) {
    let fx = reference();
    let mut model = load::load(&dir(), DType::F32, 64, device).unwrap();
    let prompt = ids(&fx["prompt_ids"]);
    let want = ids(&fx["greedy_tokens"]);
    let argmax = |t: Tensor| t.argmax(0).unwrap().to_scalar::<u32>().unwrap();
    let mut got = vec![argmax(model.forward_last(&prompt, 0).unwrap())];
    while got.len() < STEPS {
        let pos = prompt.len() + got.len() - 1;
        got.push(argmax(model.forward_last(&[*got.last().unwrap()], pos).unwrap()));
    }
    assert_eq!(got, want[..STEPS]);
}

#[test]
fn f32_cpu_logits_match_transformers() {
    check_logits(&Device::Cpu, DType::F32, 1e-3);
}

#[test]
fn f32_cpu_greedy_matches_transformers() {
    check_greedy(&Device::Cpu);
}

fn gpu() -> Device {
    inferno::gpu::open(0).expect("a CUDA device").0
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_f32_logits_and_greedy_match_transformers() {
    let dev = gpu();
    check_logits(&dev, DType::F32, 1e-3);
    check_greedy(&dev);
}
