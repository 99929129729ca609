//! gpt-oss against transformers' GptOssForCausalLM on a tiny checkpoint in the exact HF layout
//! (MXFP4 experts, sinks, sliding + full layers, YaRN): tests/fixtures/gpt_oss_tiny, made by
//! scripts/fixtures/gpt_oss_tiny.py. f32 logits within 1e-3 and identical greedy tokens.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use inferno::models::gpt_oss::load;
use serde_json::Value;

mod common;
use common::one_seq::OneSeq;

const STEPS: usize = 40;

/// The fixture folder: beside the sources, or under the current directory when the test binary
/// runs from a copy of the repository elsewhere (the GPU machine).
fn dir() -> PathBuf {
    let built = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"));
    if built.exists() { built } else { PathBuf::from("tests/fixtures/gpt_oss_tiny") }
}

fn reference() -> Value {
    serde_json::from_str(include_str!("fixtures/gpt_oss_tiny/reference.json"))
        .expect("reference JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// The tiny model, run as the engine runs it; with `chunk`, prompts run in steps of that size
/// (3: the sliding layers' window of 8 spans several steps, and their blocks of 16 several
/// windows).
fn tiny(device: &Device, dtype: DType, chunk: Option<usize>) -> OneSeq {
    let mut model = OneSeq::new(Box::new(load::load(&dir(), dtype, 64, device).unwrap()));
    if let Some(c) = chunk {
        model.chunk = c;
    }
    model
}

fn check_logits(device: &Device, dtype: DType, tolerance: f32, chunk: Option<usize>) {
    let fx = reference();
    let mut model = tiny(device, dtype, chunk);
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

fn check_greedy(device: &Device, chunk: Option<usize>) {
    let fx = reference();
    let mut model = tiny(device, DType::F32, chunk);
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

/// Greedy decoding token by token (on a GPU: replays of the runner's CUDA graph; `plain`: the
/// model's per-op step) from the fixture's prompt: every token (prompt and decoded) and the
/// decode steps' logits stacked `[steps, vocab]`, which belong to positions `prompt − 1 ..`.
fn decode(model: &mut OneSeq, prompt: &[u32], steps: usize, plain: bool) -> (Vec<u32>, Tensor) {
    let step = |m: &mut OneSeq, t: &[u32], at: usize| match plain {
        true => m.forward_last_plain(t, at).unwrap(),
        false => m.forward_last(t, at).unwrap(),
    };
    let mut logits = vec![step(model, prompt, 0)];
    let mut tokens = prompt.to_vec();
    for _ in 0..steps {
        let next = logits.last().unwrap().argmax(0).unwrap().to_scalar::<u32>().unwrap();
        tokens.push(next);
        logits.push(step(model, &[next], tokens.len() - 1));
    }
    (tokens, Tensor::stack(&logits, 0).unwrap())
}

/// A fresh model's prefill logits at the positions `decode` produced logits for.
fn prefill(
    device: &Device,
    dtype: DType,
    chunk: Option<usize>,
    tokens: &[u32],
    prompt: usize,
    steps: usize,
) -> Tensor {
    let all = tiny(device, dtype, chunk).forward_all(tokens, 0).unwrap();
    all.narrow(0, prompt - 1, steps + 1).unwrap().to_dtype(DType::F32).unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
}

/// Decoding gives the logits that a fresh model computes for the same positions in one prefill.
fn check_decode_matches_prefill(device: &Device, chunk: Option<usize>, tolerance: f32) {
    let prompt = ids(&reference()["prompt_ids"]);
    let (tokens, decoded) = decode(&mut tiny(device, DType::F32, chunk), &prompt, 20, false);
    let worst = max_diff(&decoded, &prefill(device, DType::F32, chunk, &tokens, prompt.len(), 20));
    eprintln!("decode vs prefill (f32, chunk {chunk:?}): max |logit difference| = {worst:.2e}");
    assert!(worst < tolerance, "decoded logits differ from prefill logits by {worst}");
}

/// In bf16, decode steps (on a GPU a CUDA graph with bias and RoPE fused in f32) and prefill
/// round differently, so neither matches the other exactly: each is measured against f32
/// prefill logits on the same tokens, and decode must be about as close as prefill and as the
/// ordinary per-op decode path.
fn check_bf16_decode_is_as_accurate_as_prefill(device: &Device) {
    let prompt = ids(&reference()["prompt_ids"]);
    let (tokens, decoded) = decode(&mut tiny(device, DType::BF16, None), &prompt, 20, false);
    let (plain_tokens, plain_decoded) =
        decode(&mut tiny(device, DType::BF16, None), &prompt, 20, true);
    let exact = prefill(device, DType::F32, None, &tokens, prompt.len(), 20);
    let err_decode = max_diff(&decoded, &exact);
    let err_prefill =
        max_diff(&prefill(device, DType::BF16, None, &tokens, prompt.len(), 20), &exact);
    let err_plain = max_diff(
        &plain_decoded,
        &prefill(device, DType::F32, None, &plain_tokens, prompt.len(), 20),
    );
    eprintln!(
        "bf16 against f32 logits (max |difference|): decode {err_decode:.3}, per-op decode {err_plain:.3}, prefill {err_prefill:.3}"
    );
    let bar = 1.5 * err_prefill.max(err_plain).max(1e-2);
    assert!(
        err_decode <= bar,
        "bf16 decode error {err_decode} vs prefill {err_prefill}, per-op decode {err_plain}"
    );
}

#[test]
fn cpu_decode_matches_prefill() {
    check_decode_matches_prefill(&Device::Cpu, None, 1e-4);
    check_decode_matches_prefill(&Device::Cpu, Some(3), 1e-4);
}

#[test]
fn f32_cpu_logits_match_transformers() {
    check_logits(&Device::Cpu, DType::F32, 1e-3, None);
}

#[test]
fn f32_cpu_greedy_matches_transformers() {
    check_greedy(&Device::Cpu, None);
}

#[test]
fn chunked_prefill_matches_transformers() {
    check_logits(&Device::Cpu, DType::F32, 1e-3, Some(3));
    check_greedy(&Device::Cpu, Some(3));
}

fn gpu() -> Device {
    inferno::gpu::open(0).expect("a CUDA device").0
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_f32_logits_and_greedy_match_transformers() {
    let dev = gpu();
    check_logits(&dev, DType::F32, 1e-3, None);
    check_greedy(&dev, None);
    check_logits(&dev, DType::F32, 1e-3, Some(3));
    check_greedy(&dev, Some(3));
    check_decode_matches_prefill(&dev, None, 1e-4);
    check_decode_matches_prefill(&dev, Some(3), 1e-4);
    check_bf16_decode_is_as_accurate_as_prefill(&dev);
}

/// Full size: a random checkpoint in the exact gpt-oss-20b layout written by
/// scripts/fixtures/gpt_oss_20b_random.py (directory in INFERNO_GPT_OSS_20B_DIR), bf16 at 8k
/// context, teacher-forced top-1 agreement with transformers' f32 predictions.
#[test]
#[ignore = "needs a CUDA GPU and the 20b-shaped checkpoint (INFERNO_GPT_OSS_20B_DIR): scripts/fixtures/gpt_oss_20b_random.py"]
fn gpu_20b_shaped_bf16_teacher_forced_agreement() {
    let dir = PathBuf::from(
        std::env::var("INFERNO_GPT_OSS_20B_DIR").expect("set INFERNO_GPT_OSS_20B_DIR"),
    );
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let dev = gpu();
    let tokens = ids(&fx["ids"]);
    let want = ids(&fx["f32_argmax"]);
    let margins: Vec<f64> = fx["f32_margins"]
        .as_array()
        .expect("f32_margins")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let (free_before, _) = inferno::gpu::memory(&dev).unwrap();
    let mut model = OneSeq::new(Box::new(load::load(&dir, DType::BF16, 8192, &dev).unwrap()));
    let (free_loaded, _) = inferno::gpu::memory(&dev).unwrap();
    // What generation does with a prompt (logits of its last position only).
    model.forward_last(&tokens, 0).unwrap();
    let (free_prefilled, _) = inferno::gpu::memory(&dev).unwrap();
    eprintln!(
        "20b-shaped bf16, GPU memory: {:.2} GB after load with an 8k-token KV pool, {:.2} GB after a {}-token prompt",
        (free_before - free_loaded) as f64 / 1e9,
        (free_before - free_prefilled) as f64 / 1e9,
        tokens.len()
    );
    let probes: Vec<usize> = fx["probe_positions"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).map(|p| p as usize).collect())
        .unwrap_or_default();
    let probe_logits: Vec<Vec<f32>> = fx["f32_probe_logits"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect())
                .collect()
        })
        .unwrap_or_default();
    let agreement = |model: &mut OneSeq, what: &str| -> (f64, f32) {
        let logits = model.forward_all(&tokens, 0).unwrap();
        let diffs: Vec<(usize, f32)> = probes
            .iter()
            .zip(&probe_logits)
            .map(|(&p, want)| {
                let row: Vec<f32> = logits.get(p).unwrap().to_vec1().unwrap();
                (p, row.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max))
            })
            .collect();
        let worst = diffs.iter().map(|&(_, d)| d).fold(0f32, f32::max);
        let diffs: Vec<String> = diffs.iter().map(|(p, d)| format!("{p}: {d:.2e}")).collect();
        eprintln!("{what}: max |logit − transformers f32| at positions {}", diffs.join(", "));
        let got: Vec<u32> = logits.argmax(1).unwrap().to_vec1().unwrap();
        let misses: Vec<String> = (0..want.len())
            .filter(|&i| got[i] != want[i])
            .map(|i| format!("{i} ({:.3})", margins.get(i).copied().unwrap_or(f64::NAN)))
            .collect();
        let agree = 1.0 - misses.len() as f64 / want.len() as f64;
        eprintln!(
            "{what}: top-1 agreement with transformers f32 {:.2}% over {} positions",
            agree * 100.0,
            want.len()
        );
        eprintln!("  misses at position (f32 top-1 margin): {}", misses.join(", "));
        (agree, worst)
    };
    let (agree, _) = agreement(&mut model, "bf16");
    eprintln!(
        "  transformers' own bf16: {:.2}%",
        fx["transformers_bf16_agreement"].as_f64().unwrap_or(f64::NAN) * 100.0
    );
    drop(model);
    // The same weights in f32 against the f32 reference at full size: exact up to summation order.
    let mut model =
        OneSeq::new(Box::new(load::load(&dir, DType::F32, tokens.len(), &dev).unwrap()));
    let (f32_agree, f32_worst) = agreement(&mut model, "f32");
    assert!(
        !probes.is_empty() && f32_worst < 1e-3,
        "f32 logits are {f32_worst} off transformers' f32 (probes: {probes:?})"
    );
    // The bar (99% top-1 over 256+ positions), on a checkpoint that is not chaotic
    // (gpt_oss_20b_random.py says why), and at least as close to f32 as transformers' own bf16 on
    // the same weights.
    assert!(
        want.len() >= 256,
        "the reference covers only {} positions; the bar is over 256+",
        want.len()
    );
    assert!(agree >= 0.99, "bf16 top-1 agreement with transformers f32 is {agree}, under 99%");
    let yardstick =
        fx["transformers_bf16_agreement"].as_f64().expect("transformers_bf16_agreement");
    assert!(agree >= yardstick, "agreement {agree} is below transformers' own bf16 ({yardstick})");
    assert!(f32_agree >= 0.998, "f32 top-1 agreement with transformers f32 is {f32_agree}");
}

/// `--kv-dtype fp8|int8` on the 20b-shaped checkpoint (INFERNO_GPT_OSS_20B_DIR, as above): bf16
/// compute, teacher-forced top-1 agreement with transformers' f32 with 8-bit KV and with bf16 KV
/// on the same positions (what the 8 bits cost), in decode-sized steps of 64 so that most keys
/// are read back from earlier steps' pools. H200, keys rotated: bf16 KV 99.61%, INT8 KV 99.02%,
/// FP8 KV 97.95% (21 of 1,024 positions flip; transformers' own bf16 run: 92.68%). The bf16
/// bar, 99%, holds with INT8; E4M3's 3 mantissa bits do not reach it here (docs/performance.md),
/// so FP8's bars are: at least as close to f32 as transformers' own bf16, and within 3 points
/// of bf16 KV.
#[test]
#[ignore = "needs a CUDA GPU and the 20b-shaped checkpoint (INFERNO_GPT_OSS_20B_DIR): scripts/fixtures/gpt_oss_20b_random.py"]
fn gpu_20b_shaped_fp8_kv_teacher_forced_agreement() {
    use inferno::models::batch::{BatchModel, KvDtype};
    let dir = PathBuf::from(
        std::env::var("INFERNO_GPT_OSS_20B_DIR").expect("set INFERNO_GPT_OSS_20B_DIR"),
    );
    let fx: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let (tokens, want) = (ids(&fx["ids"]), ids(&fx["f32_argmax"]));
    let dev = gpu();
    let agreement = |kv: KvDtype| -> Vec<bool> {
        let mut model = load::load(&dir, DType::BF16, 8192, &dev).unwrap();
        model.set_kv_dtype(kv);
        let mut seq = OneSeq::new(Box::new(model));
        seq.chunk = 64;
        let logits = seq.forward_all(&tokens, 0).unwrap();
        let got: Vec<u32> = logits.argmax(1).unwrap().to_vec1().unwrap();
        got.iter().zip(&want).map(|(a, b)| a == b).collect()
    };
    let bf16 = agreement(KvDtype::Compute);
    let fp8 = agreement(KvDtype::Fp8);
    let int8 = agreement(KvDtype::Int8);
    let pct = |v: &[bool]| 100.0 * v.iter().filter(|&&x| x).count() as f64 / v.len() as f64;
    let flipped = bf16.iter().zip(&fp8).filter(|(a, b)| a != b).count();
    eprintln!(
        "20b-shaped, bf16 compute, top-1 agreement with transformers f32 over {} positions: bf16 \
         KV {:.2}%, fp8 KV {:.2}% ({flipped} positions differ between the two), int8 KV {:.2}%",
        want.len(),
        pct(&bf16),
        pct(&fp8),
        pct(&int8)
    );
    assert!(want.len() >= 256, "the reference covers only {} positions", want.len());
    let yardstick = 100.0 * fx["transformers_bf16_agreement"].as_f64().expect("yardstick");
    assert!(pct(&fp8) >= yardstick, "fp8 KV {:.2}% is under transformers' bf16", pct(&fp8));
    assert!(pct(&bf16) - pct(&fp8) <= 3.0, "fp8 KV costs {:.2} points", pct(&bf16) - pct(&fp8));
    assert!(pct(&int8) >= 99.0, "int8 KV top-1 agreement {:.2}% is under 99%", pct(&int8));
}
