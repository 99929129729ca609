//! gpt-oss from a GGUF file: tests/fixtures/gpt_oss_tiny_gguf, the tiny HF fixture converted by
//! llama.cpp's own convert_hf_to_gguf.py (MXFP4 experts, Q8_0 attention/embedding/output, F32
//! norms, biases, sinks and router), made by scripts/fixtures/gpt_oss_gguf.sh.
//!
//! Two references, both transformers' GptOssForCausalLM in f32:
//! - on exactly the GGUF's weights (its Q8_0 tensors dequantized by llama.cpp's gguf-py and put in
//!   place of the HF ones): logits within 1e-3 and all 40 greedy tokens identical, the bar of the
//!   HF fixture's own test (tests/gpt_oss_reference.rs);
//! - on the HF checkpoint the GGUF came from. Q8_0 rounds each weight by up to half a step
//!   (amax/254 of its 32-weight block), which moved transformers' logits by up to
//!   `q8_0_logit_shift` (0.085 on a logit range of ±4, recorded by the fixture script), so the
//!   bound is that shift plus the 1e-3 f32 tolerance; and the greedy tokens must equal the HF
//!   fixture's for as long as transformers' run on the GGUF weights does (11 of 40 steps: at the
//!   12th the HF margin is 0.016, below what the rounding moves).

use std::path::PathBuf;

use candle_core::{DType, Device};
use inferno::models::gpt_oss::{GptOssConfig, gguf};
use serde_json::Value;

mod common;
use common::one_seq::OneSeq;

const STEPS: usize = 40;

fn fixtures() -> PathBuf {
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"));
    if built.exists() { built } else { PathBuf::from("tests/fixtures") }
}

fn gguf_path() -> PathBuf {
    fixtures().join("gpt_oss_tiny_gguf/model.gguf")
}

fn json(path: &str) -> Value {
    serde_json::from_slice(&std::fs::read(fixtures().join(path)).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn model(device: &Device) -> OneSeq {
    OneSeq::new(Box::new(gguf::load(&gguf_path(), DType::F32, 64, device).unwrap()))
}

fn max_diff(got: &[Vec<f32>], want: &Value) -> f32 {
    let want: Vec<Vec<f32>> = serde_json::from_value(want.clone()).unwrap();
    assert_eq!(got.len(), want.len());
    let mut worst = 0f32;
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            worst = worst.max((a - b).abs());
        }
    }
    worst
}

fn greedy(model: &mut OneSeq, prompt: &[u32]) -> Vec<u32> {
    let mut logits = model.forward_last(prompt, 0).unwrap();
    let mut out = Vec::new();
    for i in 0..STEPS {
        let next = logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        out.push(next);
        if i + 1 < STEPS {
            logits = model.forward_last(&[next], prompt.len() + i).unwrap();
        }
    }
    out
}

fn check_against_references(device: &Device) {
    let fx = json("gpt_oss_tiny_gguf/reference.json");
    let hf = json("gpt_oss_tiny/reference.json");
    let prompt = ids(&fx["prompt_ids"]);
    assert_eq!(prompt, ids(&hf["prompt_ids"]));
    let mut m = model(device);
    let logits: Vec<Vec<f32>> = m.forward_all(&prompt, 0).unwrap().to_vec2().unwrap();

    let exact = max_diff(&logits, &fx["prompt_logits"]);
    let shift = fx["q8_0_logit_shift"].as_f64().unwrap() as f32;
    let vs_hf = max_diff(&logits, &hf["prompt_logits"]);
    eprintln!(
        "max |logit - ref(GGUF weights)| = {exact:.2e}, vs HF {vs_hf:.4} (Q8_0 shift {shift:.4})"
    );
    assert!(exact < 1e-3, "logits differ from transformers on the GGUF's weights by {exact}");
    assert!(
        vs_hf <= shift + 1e-3,
        "logits differ from the HF fixture's by {vs_hf} > {shift} + 1e-3"
    );

    let tokens = greedy(&mut model(device), &prompt);
    assert_eq!(tokens, ids(&fx["greedy_tokens"]), "greedy differs from transformers on the GGUF");
    let shared = fx["greedy_tokens_shared_with_hf"].as_u64().unwrap() as usize;
    assert!(shared >= 10, "the fixture's Q8_0 rounding changed the HF greedy run too early");
    assert_eq!(tokens[..shared], ids(&hf["greedy_tokens"])[..shared]);
}

#[test]
fn f32_cpu_matches_transformers_on_the_gguf_and_the_hf_weights() {
    check_against_references(&Device::Cpu);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_f32_matches_transformers_on_the_gguf_and_the_hf_weights() {
    check_against_references(&inferno::gpu::open(0).expect("a CUDA device").0);
}

#[test]
fn config_from_metadata_equals_the_hf_config() {
    let text = std::fs::read_to_string(fixtures().join("gpt_oss_tiny/config.json")).unwrap();
    let want = GptOssConfig::from_hf_json(&text).unwrap();
    let g = inferno::models::gguf::GgufTensors::open(&gguf_path()).unwrap();
    let got = gguf::config(&g).unwrap();
    // The GGUF stores the epsilon as an f32.
    assert!((got.rms_norm_eps - want.rms_norm_eps).abs() < 1e-12);
    let same = |c: &GptOssConfig| GptOssConfig { rms_norm_eps: 0.0, ..c.clone() };
    assert_eq!(format!("{:?}", same(&got)), format!("{:?}", same(&want)));
    assert_eq!(got.sliding, [true, false, true, false]);
}

#[test]
fn tokenizer_from_metadata_equals_the_tokenizer_json() {
    use inferno::chat::harmony::{HarmonyEncoding, HarmonyMessage, SystemConfig};
    let hf = tokenizers::Tokenizer::from_file(fixtures().join("gpt_oss_tiny_gguf/tokenizer.json"))
        .unwrap();
    let g = inferno::tokenizer::from_gguf_file(&gguf_path()).unwrap();
    assert_eq!(g.tokenizer.get_vocab_size(true), hf.get_vocab_size(true));
    for id in 0..256 {
        assert_eq!(g.tokenizer.id_to_token(id), hf.id_to_token(id), "token {id}");
    }
    for text in [
        "What is 2 + 2? The answer is 4.",
        "  We'll SEE; they're HERE.\n\n\tdef f(x):\n\t\treturn [1, 22, 333, 4444]\n",
        "CamelCaseWords and UPPERlower, 12345678 ... !!",
        "<|start|>user<|message|>hi<|end|><|start|>assistant",
    ] {
        for special in [false, true] {
            let a = g.tokenizer.encode(text, special).unwrap();
            let b = hf.encode(text, special).unwrap();
            assert_eq!(a.get_ids(), b.get_ids(), "{text:?} (special {special})");
        }
        let ids = hf.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(g.tokenizer.decode(&ids, false).unwrap(), hf.decode(&ids, false).unwrap());
    }
    // bos <|startoftext|>, eos <|return|>: the real ids less 199998 − 235.
    assert_eq!((g.bos_id, g.eos_ids.as_slice()), (Some(235), &[239][..]));
    // Harmony renders the same ids with either tokenizer.
    let (a, b) = (HarmonyEncoding::new(&g.tokenizer).unwrap(), HarmonyEncoding::new(&hf).unwrap());
    assert_eq!(a.ids(), b.ids());
    let chat = [HarmonyMessage::user("What is 2 + 2?")];
    let sys = SystemConfig::default();
    let rendered = a.render_prompt(&sys, Some("Be brief."), &chat).unwrap();
    assert_eq!(rendered, b.render_prompt(&sys, Some("Be brief."), &chat).unwrap());
    assert_eq!(rendered[0], 235 + 8, "<|start|>");
}

#[test]
fn listed_as_gpt_oss_mxfp4_q8_0() {
    let info = inferno::inspect::inspect(&gguf_path()).unwrap();
    assert_eq!(info.architecture.as_deref(), Some("gpt-oss"));
    assert_eq!(info.format, "GGUF MXFP4 + Q8_0");
    assert_eq!(info.context_length, Some(64));
}

/// A damaged copy of the fixture: truncated at several points, or with a tensor's type or
/// shape rewritten. Each is one line (Integrity, exit code 6), never a panic.
#[test]
fn corrupt_or_truncated_files_are_one_line_errors() {
    let full = std::fs::read(gguf_path()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.gguf");
    let load = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        match gguf::load(&path, DType::F32, 64, &Device::Cpu) {
            Ok(_) => panic!("a damaged file loaded"),
            Err(e) => e,
        }
    };
    let check = |e: anyhow::Error, what: &str| {
        let msg = format!("{e:#}");
        assert_eq!(inferno::error::kind_of(&e), inferno::error::ErrorKind::Integrity, "{msg}");
        assert!(!msg.contains('\n'), "{what}: not one line: {msg}");
        assert!(msg.contains("bad.gguf"), "{what}: does not name the file: {msg}");
        msg
    };
    for cut in [10, 1000, full.len() / 2, full.len() - 1] {
        check(load(&full[..cut]), &format!("cut at {cut}"));
    }
    // The first MXFP4 tensor's type rewritten as Q8_0 (more bytes: runs past the file or into
    // the next tensor), then its outermost dimension (expert count) changed.
    let name = b"blk.0.ffn_down_exps.weight";
    let at = full.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let ty = at + 4 + 3 * 8; // n_dims, then 3 u64 dims
    assert_eq!(full[ty..ty + 4], 39u32.to_le_bytes());
    let mut bytes = full.clone();
    bytes[ty..ty + 4].copy_from_slice(&8u32.to_le_bytes());
    check(load(&bytes), "type");
    let mut bytes = full.clone();
    bytes[at + 4 + 16..at + 4 + 24].copy_from_slice(&4u64.to_le_bytes());
    let msg = check(load(&bytes), "shape");
    assert!(msg.contains("blk.0.ffn_down_exps.weight has shape [4, 64, 64]"), "{msg}");

    // Through the CLI: exit code 6 and one line on stderr.
    std::fs::write(&path, &full[..full.len() / 2]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["play", path.to_str().unwrap(), "--cpu", "-p", "hi"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}
