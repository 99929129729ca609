//! Mistral's sliding window against transformers' MistralForCausalLM, on
//! tests/fixtures/mistral_tiny (made by scripts/fixtures/mistral_tiny.sh): a tiny random
//! checkpoint whose every layer sees its last 8 positions, with a 24-token prompt and 48
//! generated tokens; transformers' tokens with full attention differ from the first one. Built
//! through the registry as the CLI builds it; f32 on the CPU, bf16 on a GPU.

mod common;

use candle_core::{DType, Device};
use common::reference::{Fixture, gpu};

fn fixture() -> Fixture {
    Fixture::new("mistral_tiny", include_str!("fixtures/mistral_tiny/reference.json"))
}

#[test]
fn f32_sliding_window_greedy_and_logits_match_transformers() {
    let f = fixture();
    assert_ne!(f.ids("full_attention_tokens"), f.ids("greedy_tokens"));
    f.check_greedy(&mut f.safetensors(DType::F32, &Device::Cpu), "safetensors");
    f.check_logits(&mut f.safetensors(DType::F32, &Device::Cpu), 1e-4, "safetensors");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored on a GPU machine (scripts/gpu-tests.sh)"]
fn gpu_sliding_window_matches_transformers() {
    let (f, dev) = (fixture(), gpu());
    f.check_greedy(&mut f.safetensors(DType::F32, &dev), "gpu f32");
    let bf16 = f.agreement(&mut f.safetensors(DType::BF16, &dev));
    eprintln!("GPU bf16 teacher-forced top-1 agreement: {bf16:.3}");
    assert!(bf16 >= 0.95, "bf16 {bf16}");
}
