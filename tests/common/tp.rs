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

/// A group of ranks on the CPU whose ranks 1.. are threads (see [`follower_threads`]).
pub struct Group {
    /// Rank 0's end of the group.
    pub leader: std::sync::Arc<dyn inferno::dist::Collective>,
    /// What rank 0's engine sends its steps to (dropping it sends each the stop word).
    pub followers: Box<dyn inferno::engine::ranks::Followers>,
    /// The following ranks, to join once the engine has stopped.
    pub threads: Vec<std::thread::JoinHandle<()>>,
}

/// Ranks 1.. of a `world`-rank group as threads on the CPU, each following rank 0's steps with
/// its own runner and pool (`engine/ranks.rs`'s words, sent through channels).
pub fn follower_threads(
    name: &str,
    world: usize,
    cfg: inferno::engine::core::EngineConfig,
    opts: inferno::load::LoadOptions,
) -> Group {
    use inferno::engine::pool::{BLOCK_SIZE, pool_groups};
    use inferno::engine::runner::Runner;
    use inferno::models::batch::KvPool;
    use std::sync::{Arc, mpsc};

    let mut ends = inferno::dist::ThreadGroup::new(world).into_iter();
    let leader: Arc<dyn inferno::dist::Collective> = Arc::new(ends.next().unwrap());
    let (txs, handles): (Vec<_>, Vec<_>) = ends
        .map(|end| {
            let (tx, rx) = mpsc::channel::<Vec<u32>>();
            let (name, opts) = (name.to_string(), opts.clone());
            let handle = std::thread::spawn(move || {
                let comm: Arc<dyn inferno::dist::Collective> = Arc::new(end);
                let model =
                    inferno::load::load_rank(&name, &opts, &Device::Cpu, comm).unwrap().model;
                let shape = model.kv_shape();
                let blocks: Vec<usize> =
                    pool_groups(&shape, &cfg.pool()).iter().map(|g| g.blocks).collect();
                let pool = KvPool::new(&shape, BLOCK_SIZE, &blocks, &Device::Cpu).unwrap();
                let mut runner = Runner::new(model, pool, shape);
                runner.follow(|| Ok(rx.recv()?)).unwrap();
            });
            (tx, handle)
        })
        .unzip();
    Group { leader, followers: Box::new(Threads(txs)), threads: handles }
}

/// Followers that are threads: each step's words go to every one of them.
struct Threads(Vec<std::sync::mpsc::Sender<Vec<u32>>>);

impl inferno::engine::ranks::Followers for Threads {
    fn send(&mut self, words: Vec<u32>) -> anyhow::Result<()> {
        for tx in &self.0 {
            tx.send(words.clone())?;
        }
        Ok(())
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        for tx in &self.0 {
            let _ = tx.send(inferno::engine::ranks::encode_stop());
        }
    }
}

/// A folder with `config` (a Gemma 3 config.json) and seeded random bf16 weights of the scales
/// gemma3_reference.rs's wide-head layouts use: norms around their `1 + w` centre, q/k norms
/// around 0.5, projections at 1/√fan-in.
pub fn random_gemma3(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let cfg = inferno::models::gemma3::Gemma3Config::from_hf_json(config).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let mut tensors = std::collections::HashMap::new();
    for (name, shape) in inferno::models::gemma3::memory::checkpoint_tensors(&cfg, "model.", false)
    {
        let n: usize = shape.iter().product();
        let (base, std) = match () {
            _ if name.ends_with("q_norm.weight") || name.ends_with("k_norm.weight") => (0.5, 0.3),
            _ if name.ends_with("norm.weight") => (0.0, 0.3),
            _ if name.contains("embed") => (0.0, 0.15),
            _ => (0.0, 1.0 / (shape[1] as f32).sqrt()),
        };
        let v: Vec<half::bf16> = (0..n)
            .map(|_| half::bf16::from_f32(base + std * rng.random_range(-1.7f32..1.7)))
            .collect();
        tensors.insert(name, Tensor::from_vec(v, shape, &Device::Cpu).unwrap());
    }
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    dir
}
