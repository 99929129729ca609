//! Qwen3 in both weight formats against transformers' Qwen3ForCausalLM, on
//! tests/fixtures/qwen3_tiny (made by scripts/fixtures/qwen3_tiny.sh): a tiny random checkpoint
//! in HF safetensors layout (q/k norms with gains far from 1, head_dim != hidden / heads, tied
//! embeddings, YaRN x4) and the same weights converted to GGUF by llama.cpp's
//! convert_hf_to_gguf.py (NeoX pairs, unpermuted). The models are read and built as the CLI
//! builds them: through the registry, by `model_type` and by GGUF architecture. f32 on the CPU;
//! bf16 on a GPU.

mod common;

use std::path::PathBuf;

use common::one_seq::OneSeq;

use candle_core::{DType, Device, Tensor};
use inferno::models::arch::{Build, Origin};
use inferno::models::registry;
use serde_json::Value;

const CONTEXT: usize = 128;

/// The fixture folder: beside the sources, or under the current directory when the test binary
/// runs from a copy of the repository elsewhere (the GPU machine).
fn dir() -> PathBuf {
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qwen3_tiny"));
    if built.exists() { built } else { PathBuf::from("tests/fixtures/qwen3_tiny") }
}

fn reference() -> Value {
    serde_json::from_str(include_str!("fixtures/qwen3_tiny/reference.json"))
        .expect("reference JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn floats(v: &Value) -> Vec<f32> {
    serde_json::from_value(v.clone()).expect("numbers")
}

/// The checkpoint, as the registry reads and builds it.
fn safetensors(dtype: DType, device: &Device) -> OneSeq {
    let text = std::fs::read_to_string(dir().join("config.json")).unwrap();
    let kind: Value = serde_json::from_str(&text).unwrap();
    let arch = registry::for_model_type(kind["model_type"].as_str()).expect("a known model_type");
    let read = arch.read_hf(&text, None, Some(dtype)).expect("read config.json");
    let d = dir();
    let b = Build { origin: Origin::Checkpoint(&d), dtype, context: CONTEXT, device };
    OneSeq::new(read.config.build(&b).expect("build from safetensors"))
}

/// The GGUF, as the registry reads and builds it.
fn gguf(device: &Device) -> OneSeq {
    let path = dir().join("model.gguf");
    let header = inferno::inspect::gguf::read_header(&path).expect("GGUF header");
    let arch = registry::for_gguf(Some("qwen3"));
    let read = arch.read_gguf(&path, &header, None, device.is_cuda()).expect("read GGUF");
    let b = Build { origin: Origin::Gguf(&path), dtype: read.dtype, context: CONTEXT, device };
    OneSeq::new(read.config.build(&b).expect("build from GGUF"))
}

fn argmax(logits: &Tensor) -> u32 {
    logits.to_dtype(DType::F32).unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap()
}

/// Greedy decoding, one token at a time after the prompt.
fn greedy(model: &mut OneSeq, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut out = vec![argmax(&model.forward_last(prompt, 0).unwrap())];
    while out.len() < steps {
        let pos = prompt.len() + out.len() - 1;
        out.push(argmax(&model.forward_last(&[*out.last().unwrap()], pos).unwrap()));
    }
    out
}

/// Logits for every position of the prompt followed by the reference's greedy tokens.
fn all_logits(model: &mut OneSeq) -> Vec<Vec<f32>> {
    let fx = reference();
    let tokens = [ids(&fx["prompt_ids"]), ids(&fx["greedy_tokens"])].concat();
    let logits = model.forward_all(&tokens, 0).unwrap();
    logits.to_dtype(DType::F32).unwrap().to_vec2().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn check_greedy(model: &mut OneSeq, label: &str) {
    let fx = reference();
    let want = ids(&fx["greedy_tokens"]);
    assert!(want.len() >= 32);
    let got = greedy(model, &ids(&fx["prompt_ids"]), want.len());
    assert_eq!(got, want, "{label}: greedy tokens differ from transformers'");
}

/// The logits rows transformers recorded, within `tolerance`.
fn check_logits(model: &mut OneSeq, tolerance: f32, label: &str) {
    let fx = reference();
    let got = all_logits(model);
    let mut worst = 0f32;
    for (pos, want) in ids(&fx["logit_positions"]).iter().zip(fx["logits"].as_array().unwrap()) {
        worst = worst.max(max_diff(&got[*pos as usize], &floats(want)));
    }
    eprintln!("{label}: max |logit - transformers| = {worst:.2e}");
    assert!(worst < tolerance, "{label}: logits differ from transformers' by {worst}");
}

#[test]
fn f32_safetensors_greedy_and_logits_match_transformers() {
    check_greedy(&mut safetensors(DType::F32, &Device::Cpu), "safetensors");
    check_logits(&mut safetensors(DType::F32, &Device::Cpu), 1e-4, "safetensors");
}

#[test]
fn f32_gguf_greedy_and_logits_match_transformers() {
    check_greedy(&mut gguf(&Device::Cpu), "GGUF");
    check_logits(&mut gguf(&Device::Cpu), 1e-4, "GGUF");
}

/// A Qwen3 GGUF read as a Llama one (interleaved pairs, no q/k norms) gives other logits: the
/// fixture can tell the two apart.
#[test]
fn the_fixture_tells_qwen3_from_llama() {
    use inferno::models::llama::config::Variant;
    use inferno::models::llama::load::{GgufFile, load_gguf_as};
    let mut file = GgufFile::open(&dir().join("model.gguf")).unwrap();
    let mut cfg = file.config_as(inferno::models::qwen3::VARIANT).unwrap();
    cfg.variant = Variant { qk_norm: false, ..cfg.variant };
    let model = load_gguf_as(&mut file, cfg, CONTEXT, &Device::Cpu).unwrap();
    let without_norms = all_logits(&mut OneSeq::new(Box::new(model)));
    let with = all_logits(&mut gguf(&Device::Cpu));
    let worst = with.iter().zip(&without_norms).map(|(a, b)| max_diff(a, b)).fold(0.0, f32::max);
    assert!(worst > 0.5, "dropping the q/k norms changed the logits by {worst} only");
}

fn gpu() -> Device {
    inferno::gpu::open(0).expect("a CUDA device").0
}

/// Teacher-forced top-1 agreement of `model` with transformers' f32 greedy tokens.
fn agreement(model: &mut OneSeq) -> f32 {
    let fx = reference();
    let (prompt, want) = (ids(&fx["prompt_ids"]), ids(&fx["greedy_tokens"]));
    let logits = all_logits(model);
    let hits = (0..want.len())
        .filter(|&i| {
            let row = &logits[prompt.len() - 1 + i];
            let best = (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
            best as u32 == want[i]
        })
        .count();
    hits as f32 / want.len() as f32
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_bf16_and_gguf_agree_with_transformers() {
    let dev = gpu();
    let bf16 = agreement(&mut safetensors(DType::BF16, &dev));
    let gg = agreement(&mut gguf(&dev));
    eprintln!("GPU teacher-forced top-1 agreement: bf16 {bf16:.3}, f32 GGUF {gg:.3}");
    check_greedy(&mut safetensors(DType::F32, &dev), "gpu f32 safetensors");
    assert!(bf16 >= 0.95 && gg >= 0.99, "bf16 {bf16}, GGUF {gg}");
}
