//! SmolLM2-135M-Instruct (real weights) against transformers' outputs on identical weights
//! (tests/fixtures/smollm2_reference.json, made by scripts/fixtures/llama_reference.py).
//!
//! The HF-format checkpoint is inferno's own GGUF → HF conversion of the real GGUF; its tensors
//! are checked against transformers' conversion by hash first. CPU tests run everywhere; the GPU
//! ones are ignored unless run with --include-ignored on a GPU machine.

mod common;

use std::path::PathBuf;

use common::one_seq::OneSeq;

use candle_core::{DType, Device, Tensor};
use inferno::models::llama::convert;
use inferno::models::llama::load::{self, GgufFile};
use serde_json::Value;
use sha2::{Digest, Sha256};

const GREEDY_STEPS: usize = 32;

fn fixture() -> Value {
    let text = include_str!("fixtures/smollm2_reference.json");
    serde_json::from_str(text).expect("fixture is JSON")
}

fn gguf_path() -> PathBuf {
    common::asset("SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/assets/smollm2-gguf.sh")
}

/// The HF-format copy, converted once per test process.
fn hf_checkpoint() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = common::process_tempdir();
        let mut gguf = GgufFile::open(&gguf_path()).expect("open GGUF");
        convert::write_hf_checkpoint(&mut gguf, &dir).expect("convert");
        dir
    })
    .clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn one_seq(model: anyhow::Result<inferno::models::llama::Llama>) -> OneSeq {
    OneSeq::new(Box::new(model.expect("model")))
}

fn argmax(logits: &Tensor) -> u32 {
    logits.argmax(0).unwrap().to_scalar::<u32>().unwrap()
}

fn greedy(model: &mut OneSeq, prompt: &[u32], steps: usize) -> Vec<u32> {
    let mut out = Vec::new();
    let mut next = argmax(&model.forward_last(prompt, 0).unwrap());
    let mut pos = prompt.len();
    out.push(next);
    while out.len() < steps {
        next = argmax(&model.forward_last(&[next], pos).unwrap());
        pos += 1;
        out.push(next);
    }
    out
}

/// Every greedy case agrees with the reference for GREEDY_STEPS tokens.
fn check_greedy(mut load: impl FnMut() -> OneSeq, steps: usize, label: &str) {
    let fx = fixture();
    for case in fx["greedy"].as_array().unwrap() {
        let mut model = load();
        let want = ids(&case["tokens"]);
        let got = greedy(&mut model, &ids(&case["prompt_ids"]), steps);
        assert_eq!(got, want[..steps], "{label}: prompt {:?}", case["prompt"].as_str().unwrap());
    }
}

fn teacher_forced_agreement(model: &mut OneSeq) -> f64 {
    let fx = fixture();
    let tokens = ids(&fx["teacher_forced"]["ids"]);
    let want = ids(&fx["teacher_forced"]["argmax"]);
    let logits = model.forward_all(&tokens, 0).unwrap();
    let got: Vec<u32> = logits.argmax(1).unwrap().to_vec1().unwrap();
    score(&got, &want)
}

/// The share of positions where `got` is transformers' f32 argmax; prints each miss with the
/// reference's top-1 margin there (a miss at a near-tie is rounding, not a bug).
fn score(got: &[u32], want: &[u32]) -> f64 {
    let margins = fixture()["teacher_forced"]["margins"].clone();
    let mut same = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if g == w {
            same += 1;
        } else {
            eprintln!("  position {i}: got {g}, want {w}, reference margin {}", margins[i]);
        }
    }
    same as f64 / want.len() as f64
}

fn sha256_f32(t: &Tensor) -> String {
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    hex::encode(Sha256::digest(&bytes))
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn gguf_to_hf_conversion_matches_transformers_bit_for_bit() {
    let mut gguf = GgufFile::open(&gguf_path()).unwrap();
    let tensors = convert::hf_tensors(&mut gguf).unwrap();
    for (name, want) in fixture()["tensors_sha256"].as_object().unwrap() {
        assert_eq!(sha256_f32(&tensors[name.as_str()]), want.as_str().unwrap(), "{name}");
    }
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn f32_cpu_greedy_matches_transformers() {
    let dir = hf_checkpoint();
    check_greedy(
        || one_seq(load::load_safetensors(&dir, Some(DType::F32), 256, &Device::Cpu)),
        GREEDY_STEPS,
        "cpu f32",
    );
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn f32_cpu_teacher_forced_matches_transformers() {
    let mut model =
        one_seq(load::load_safetensors(&hf_checkpoint(), Some(DType::F32), 512, &Device::Cpu));
    let agree = teacher_forced_agreement(&mut model);
    assert!(agree >= 0.99, "top-1 agreement {agree}");
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn a_prompt_longer_than_the_context_is_refused() {
    use inferno::engine::core::EngineConfig;
    use inferno::engine::request::Request;
    use inferno::load::LoadOptions;
    let opts = LoadOptions {
        dtype: Some(DType::F32),
        context: Some(8),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let dir = hf_checkpoint();
    let (engine, _) = inferno::load::start(dir.to_str().unwrap(), &opts, &Device::Cpu, |i| {
        EngineConfig::single(i.context)
    })
    .unwrap();
    let request = Request {
        prompt: vec![1; 9],
        sampling: inferno::generate::SamplerConfig::greedy(),
        max_tokens: 1,
        eos_ids: Vec::new(),
        interrupt: None,
        logprobs: None,
        forced: Vec::new(),
        constraint: None,
        prediction: Vec::new(),
    };
    let err = engine.submit(request).err().expect("a refusal");
    assert!(err.to_string().contains("the context holds 8"), "{err}");
}

fn gpu() -> Device {
    inferno::gpu::open(0).expect("a CUDA device").0
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_f32_safetensors_greedy_matches_transformers() {
    let dir = hf_checkpoint();
    let dev = gpu();
    check_greedy(
        || one_seq(load::load_safetensors(&dir, Some(DType::F32), 256, &dev)),
        GREEDY_STEPS,
        "gpu f32",
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_bf16_teacher_forced_agreement_is_at_least_98_percent() {
    let mut model =
        one_seq(load::load_safetensors(&hf_checkpoint(), Some(DType::BF16), 512, &gpu()));
    let agree = teacher_forced_agreement(&mut model);
    eprintln!("bf16 GPU teacher-forced top-1 agreement: {:.2}%", agree * 100.0);
    assert!(agree >= 0.98, "top-1 agreement {agree}");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_gguf_output_is_close_to_the_reference() {
    let dev = gpu();
    let fx = fixture();
    let mut first_token_matches = 0;
    let mut prefix_lengths = Vec::new();
    let cases = fx["greedy"].as_array().unwrap();
    for case in cases {
        let mut gguf = GgufFile::open(&gguf_path()).unwrap();
        let mut model = one_seq(load::load_gguf(&mut gguf, 256, &dev));
        let want = ids(&case["tokens"]);
        let got = greedy(&mut model, &ids(&case["prompt_ids"]), 16);
        let prefix = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        prefix_lengths.push(prefix);
        first_token_matches += usize::from(prefix > 0);
    }
    eprintln!("GGUF (Q4_1 kernels) greedy prefix agreement per prompt: {prefix_lengths:?}");
    assert_eq!(first_token_matches, cases.len(), "first tokens: {prefix_lengths:?}");
    // Beyond the first token, greedy prefixes only say where the first near-tie falls: the
    // Q4_1 kernels quantize activations to 8 bits, and a one-ulp change in RMSNorm (candle-nn's
    // fused kernel) moved two prompts from 15 agreeing tokens to 1. Teacher forcing counts
    // every position instead: measured 87.1% on an H200 (candle's 8-bit activations against an
    // f32 reference on the same dequantized weights); a wrong dequantization or layout lands
    // far below the bar.
    let mut gguf = GgufFile::open(&gguf_path()).unwrap();
    let mut model = one_seq(load::load_gguf(&mut gguf, 512, &dev));
    let agree = teacher_forced_agreement(&mut model);
    eprintln!("GGUF (Q4_1 kernels) teacher-forced top-1 agreement: {:.2}%", agree * 100.0);
    assert!(agree >= 0.85, "top-1 agreement {agree}");
}

/// The engine's batched step (what `play`, `bench` and `serve` run: fused products, GEMVs,
/// paged attention) teacher-forced one decode step per position in bf16 on the GPU (the
/// runner's CUDA graph), against transformers' argmax: the bar of the prefill test above.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_bf16_engine_teacher_forced_agreement_is_at_least_98_percent() {
    use inferno::load::LoadOptions;

    let dev = gpu();
    let fx = fixture();
    let tokens = ids(&fx["teacher_forced"]["ids"]);
    let want = ids(&fx["teacher_forced"]["argmax"]);
    let opts = LoadOptions {
        dtype: Some(DType::BF16),
        context: Some(1024),
        dummy: false,
        kv_dtype: Default::default(),
    };
    let dir = hf_checkpoint();
    let loaded = inferno::load::load(dir.to_str().unwrap(), &opts, &dev).unwrap();
    let mut model = OneSeq::new(loaded.split().0);
    let mut got = Vec::new();
    for (i, t) in tokens.iter().enumerate().take(want.len()) {
        let logits = model.forward_last(&[*t], i).unwrap().unsqueeze(0).unwrap();
        got.push(inferno::kernels::argmax_rows(&logits).unwrap().to_vec1::<u32>().unwrap()[0]);
    }
    let agree = score(&got, &want);
    eprintln!("bf16 GPU engine teacher-forced top-1 agreement: {:.2}%", agree * 100.0);
    assert!(agree >= 0.98, "top-1 agreement {agree}");
}

/// `--kv-dtype fp8|int8` on real weights: SmolLM2-135M-Instruct in bf16, teacher-forced over
/// the fixture's natural text in decode-sized steps of 64 (so most keys are read back from
/// earlier steps' 8-bit pools), against transformers' f32 argmax, with bf16 KV on the same
/// positions: what the 8 bits cost on a trained model's weights rather than random ones (the
/// 20b-shaped checkpoint's test in gpt_oss_reference.rs). Prints every position where an 8-bit
/// cache changes the bf16-KV argmax, with the reference's top-1 margin there.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_bf16_8bit_kv_teacher_forced_agreement_on_real_weights() {
    use inferno::models::batch::{BatchModel, KvDtype};
    let fx = fixture();
    let tokens = ids(&fx["teacher_forced"]["ids"]);
    let want = ids(&fx["teacher_forced"]["argmax"]);
    let margins = &fx["teacher_forced"]["margins"];
    let dev = gpu();
    let run = |kv: KvDtype| -> Vec<u32> {
        let mut model =
            load::load_safetensors(&hf_checkpoint(), Some(DType::BF16), 1024, &dev).unwrap();
        model.set_kv_dtype(kv);
        let mut seq = OneSeq::new(Box::new(model));
        seq.chunk = 64;
        let logits = seq.forward_all(&tokens, 0).unwrap();
        logits.argmax(1).unwrap().to_vec1().unwrap()
    };
    let bf16 = run(KvDtype::Compute);
    let pct = |got: &[u32]| {
        100.0 * got.iter().zip(&want).filter(|(a, b)| a == b).count() as f64 / want.len() as f64
    };
    let mut results = Vec::new();
    for (name, kv) in [("fp8", KvDtype::Fp8), ("int8", KvDtype::Int8)] {
        let got = run(kv);
        let flips: Vec<(usize, f64)> = (0..want.len())
            .filter(|&i| got[i] != bf16[i])
            .map(|i| (i, margins[i].as_f64().unwrap_or(f64::NAN)))
            .collect();
        eprintln!(
            "SmolLM2-135M bf16, top-1 agreement with transformers f32 over {} positions: bf16 KV \
             {:.2}%, {name} KV {:.2}%; positions where {name} differs from bf16 KV (reference \
             margin): {flips:?}",
            want.len(),
            pct(&bf16),
            pct(&got)
        );
        results.push((name, pct(&got)));
    }
    // Floors under what an H200 measured (bf16 KV 98.48%, INT8 KV 95.45%, FP8 KV 87.50%): a
    // broken code path lands far below them. The 8 bits' cost here is the keys' rounding
    // (docs/performance.md, "8-bit KV cache"); E4M3's 3 mantissa bits cost a trained model far
    // more than INT8 does.
    for (name, agree) in results {
        let floor = if name == "fp8" { 85.0 } else { 93.0 };
        assert!(agree >= floor, "{name} KV agreement {agree:.2}% is under {floor}%");
    }
    assert!(pct(&bf16) >= 98.0, "bf16 KV agreement {:.2}% is under 98%", pct(&bf16));
}
