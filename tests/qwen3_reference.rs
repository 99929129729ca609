//! Qwen3 in both weight formats against transformers' Qwen3ForCausalLM, on
//! tests/fixtures/qwen3_tiny (made by scripts/fixtures/qwen3_tiny.sh): a tiny random checkpoint
//! in HF safetensors layout (q/k norms with gains far from 1, head_dim != hidden / heads, tied
//! embeddings, YaRN x4) and the same weights converted to GGUF by llama.cpp's
//! convert_hf_to_gguf.py (NeoX pairs, unpermuted). The models are read and built as the CLI
//! builds them: through the registry, by `model_type` and by GGUF architecture. f32 on the CPU;
//! bf16 on a GPU.

mod common;

use candle_core::{DType, Device};
use common::one_seq::OneSeq;
use common::reference::{CONTEXT, Fixture, gpu, max_diff};

fn fixture() -> Fixture {
    Fixture::new("qwen3_tiny", include_str!("fixtures/qwen3_tiny/reference.json"))
}

#[test]
fn f32_safetensors_greedy_and_logits_match_transformers() {
    let f = fixture();
    f.check_greedy(&mut f.safetensors(DType::F32, &Device::Cpu), "safetensors");
    f.check_logits(&mut f.safetensors(DType::F32, &Device::Cpu), 1e-4, "safetensors");
}

#[test]
fn f32_gguf_greedy_and_logits_match_transformers() {
    let f = fixture();
    f.check_greedy(&mut f.gguf("qwen3", &Device::Cpu), "GGUF");
    f.check_logits(&mut f.gguf("qwen3", &Device::Cpu), 1e-4, "GGUF");
}

/// A Qwen3 GGUF read without its q/k norms gives other logits: the fixture can tell the two
/// apart.
#[test]
fn the_fixture_tells_qwen3_from_llama() {
    use inferno::models::llama::config::Variant;
    use inferno::models::llama::load::{GgufFile, load_gguf_as};
    let f = fixture();
    let mut file = GgufFile::open(&f.dir().join("model.gguf")).unwrap();
    let mut cfg = file.config_as(inferno::models::qwen3::VARIANT).unwrap();
    cfg.variant = Variant { qk_norm: false, ..cfg.variant };
    let model = load_gguf_as(&mut file, cfg, CONTEXT, &Device::Cpu).unwrap();
    let without_norms = f.all_logits(&mut OneSeq::new(Box::new(model)));
    let with = f.all_logits(&mut f.gguf("qwen3", &Device::Cpu));
    let worst = with.iter().zip(&without_norms).map(|(a, b)| max_diff(a, b)).fold(0.0, f32::max);
    assert!(worst > 0.5, "dropping the q/k norms changed the logits by {worst} only");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_bf16_and_gguf_agree_with_transformers() {
    let (f, dev) = (fixture(), gpu());
    let bf16 = f.agreement(&mut f.safetensors(DType::BF16, &dev));
    let gg = f.agreement(&mut f.gguf("qwen3", &dev));
    eprintln!("GPU teacher-forced top-1 agreement: bf16 {bf16:.3}, f32 GGUF {gg:.3}");
    f.check_greedy(&mut f.safetensors(DType::F32, &dev), "gpu f32 safetensors");
    assert!(bf16 >= 0.95 && gg >= 0.99, "bf16 {bf16}, GGUF {gg}");
}
