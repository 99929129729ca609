//! Checkpoints for the tensor-parallel tests: layouts that 2 and 4 ranks can split, random
//! weights from a seeded generator (the same on every run and every rank's process).

use std::path::PathBuf;

use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};

/// The tiny gpt-oss fixture's layout widened so that 4 ranks can split it: 8 query heads over 2
/// key/value heads (replicated at TP4), 4 MXFP4 blocks of intermediate columns, a vocabulary of
/// 250 (pieces of 63, the last padded); random weights, seeded.
pub fn wide_gpt_oss() -> tempfile::TempDir {
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

/// A Llama checkpoint of `config` (a config.json text) with seeded random bf16 weights, its o and
/// down projections damped as the dummy weights are (a random network with full-size updates is
/// chaotic).
pub fn random_llama(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let cfg = inferno::models::llama::LlamaConfig::from_hf_json(config).unwrap();
    let (h, i, d) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (qd, kvd) = (cfg.num_heads * d, cfg.num_kv_heads * d);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut tensors = std::collections::HashMap::new();
    let mut add = |name: String, shape: Vec<usize>, std: f32, base: f32| {
        let n: usize = shape.iter().product();
        let v: Vec<half::bf16> = (0..n)
            .map(|_| half::bf16::from_f32(base + std * rng.random_range(-1.7f32..1.7)))
            .collect();
        tensors.insert(name, Tensor::from_vec(v, shape, &Device::Cpu).unwrap());
    };
    for n in 0..cfg.num_layers {
        let p = format!("model.layers.{n}");
        add(format!("{p}.input_layernorm.weight"), vec![h], 0.0, 1.0);
        add(format!("{p}.post_attention_layernorm.weight"), vec![h], 0.0, 1.0);
        for (proj, rows, cols, std) in
            [("q", qd, h, 0.02), ("k", kvd, h, 0.02), ("v", kvd, h, 0.02), ("o", h, qd, 0.005)]
        {
            add(format!("{p}.self_attn.{proj}_proj.weight"), vec![rows, cols], std, 0.0);
        }
        for (proj, rows, cols, std) in
            [("gate", i, h, 0.02), ("up", i, h, 0.02), ("down", h, i, 0.005)]
        {
            add(format!("{p}.mlp.{proj}_proj.weight"), vec![rows, cols], std, 0.0);
        }
    }
    add("model.embed_tokens.weight".into(), vec![cfg.vocab_size, h], 1.0, 0.0);
    add("model.norm.weight".into(), vec![h], 0.0, 1.0);
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), vec![cfg.vocab_size, h], 0.02, 0.0);
    }
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    dir
}
