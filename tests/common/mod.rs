//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod hub_server;
pub mod one_seq;
pub mod reference;
pub mod serve;
pub mod tp;

use std::path::Path;
use std::process::{Command, Output};

/// The children of process `pid` (of all its threads).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for task in tasks.flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

/// Whether `pid` is a process that runs (not gone, not a zombie).
pub fn running(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(')').next().and_then(|r| r.trim().chars().next());
    state.is_some_and(|s| s != 'Z' && s != 'X')
}

/// Every token of an engine request, and how it finished; panics when it fails.
pub fn collect(
    mut h: inferno::engine::request::RequestHandle,
) -> (Vec<u32>, inferno::engine::request::Finish) {
    use inferno::engine::request::Event;
    let mut tokens = Vec::new();
    loop {
        match h.blocking_next() {
            Some(Event::Token(t, _)) => tokens.push(t),
            Some(Event::Finished(f)) => return (tokens, f),
            Some(Event::Failed(m)) => panic!("request failed: {m}"),
            None => panic!("the engine dropped the request"),
        }
    }
}

/// Runs the real `inferno` binary with a clean HF environment pointing at `cache`.
pub fn inferno(
    cache: &Path,
    endpoint: Option<&str>,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_inferno"));
    cmd.args(args)
        .env_remove("HF_HOME")
        .env_remove("HF_TOKEN")
        .env_remove("HUGGING_FACE_HUB_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("XDG_CACHE_HOME")
        .env("HF_TOKEN_PATH", cache.join("no-token-file"))
        .env("HF_HUB_CACHE", cache)
        .env("INFERNO_RETRY_DELAY_MS", "20");
    match endpoint {
        Some(e) => cmd.env("HF_ENDPOINT", e),
        // Nothing listens on port 9 of the loopback: any request fails fast.
        None => cmd.env("HF_ENDPOINT", "http://127.0.0.1:9"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running inferno")
}

/// `n` bytes of seeded noise: file contents that compress to nothing and differ per seed.
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A test asset (real model files fetched by a script): `$INFERNO_ASSETS/name`, else
/// `${INFERNO_CACHE:-~/.cache/inferno}/assets/name`. Panics with how to fetch it when absent:
/// tests that need real weights never pass without them. Those tests are ignored, saying what
/// they need, unless the `conformance` feature is on (scripts/test.sh turns it on).
pub fn asset(name: &str, script: &str) -> std::path::PathBuf {
    let dir =
        std::env::var_os("INFERNO_ASSETS").map(std::path::PathBuf::from).unwrap_or_else(|| {
            let cache = std::env::var_os("INFERNO_CACHE")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(|| {
                    std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/inferno")
                });
            cache.join("assets")
        });
    let path = dir.join(name);
    assert!(
        path.exists(),
        "test asset {} is missing: run `bash {script}` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// A tiny Llama with random weights, f32: a maker of identical instances.
pub fn tiny_llama(
    device: &candle_core::Device,
    context: usize,
) -> impl Fn() -> Box<dyn inferno::models::batch::BatchModel> + Send + Sync + use<> {
    use inferno::models::llama::{Llama, LlamaConfig, dummy, model::RopeStyle};
    let cfg = LlamaConfig::from_hf_json(
        r#"{"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}"#,
    )
    .expect("tiny llama config");
    let dtype = candle_core::DType::F32;
    let w = dummy::random_weights(&cfg, dtype, device).expect("random weights");
    let device = device.clone();
    move || {
        let m = Llama::new(cfg.clone(), w.clone(), RopeStyle::HalfSplit, context, dtype, &device);
        Box::new(m.expect("tiny llama"))
    }
}

/// A temporary folder removed when the test process exits. A `TempDir` in a static is never
/// dropped, so its folder would stay on disk after every run.
pub fn process_tempdir() -> std::path::PathBuf {
    use std::sync::{Mutex, Once};
    static DIRS: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
    static HOOK: Once = Once::new();
    extern "C" fn remove_all() {
        if let Ok(dirs) = DIRS.lock() {
            for d in dirs.iter() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
    // SAFETY: registers a plain function; it runs once, as the process exits.
    HOOK.call_once(|| unsafe {
        libc::atexit(remove_all);
    });
    let dir = tempfile::tempdir().expect("tempdir").keep();
    DIRS.lock().unwrap_or_else(|e| e.into_inner()).push(dir.clone());
    dir
}

/// A folder with the tiny gpt-oss checkpoint (tests/fixtures/gpt_oss_tiny) widened to the real
/// gpt-oss vocabulary (random embeddings and head) and the real gpt-oss tokenizer: harmony
/// chats end to end. Made once per test binary.
pub fn tiny_gpt_oss_full_vocab() -> std::path::PathBuf {
    use candle_core::{DType, Device, Tensor};
    use std::collections::HashMap;
    use std::path::PathBuf;
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = process_tempdir();
        let fixture =
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpt_oss_tiny"));
        let mut config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(fixture.join("config.json")).unwrap()).unwrap();
        let vocab = 201088;
        config["vocab_size"] = vocab.into();
        config["eos_token_id"] = 200002.into();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let mut tensors: HashMap<String, Tensor> =
            candle_core::safetensors::load(fixture.join("model.safetensors"), &Device::Cpu)
                .unwrap();
        // Seeded: a test that compares two greedy runs of this model then sees the same
        // near-ties on every run, so a failure replays.
        for (seed, name) in [(1, "model.embed_tokens.weight"), (2, "lm_head.weight")] {
            let t = seeded_uniform(seed, vocab * 64).reshape((vocab, 64)).unwrap();
            tensors.insert(name.to_string(), t.to_dtype(DType::BF16).unwrap());
        }
        candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
        let tok = asset("gptoss-tokenizer.json", "scripts/assets/gptoss-tokenizer.sh");
        std::fs::copy(tok, dir.join("tokenizer.json")).unwrap();
        dir
    })
    .clone()
}

/// `n` values uniform in [-√3, √3) (unit variance) from a seeded generator, on the CPU.
fn seeded_uniform(seed: u64, n: usize) -> candle_core::Tensor {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let half = 3f32.sqrt();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(-half..half)).collect();
    candle_core::Tensor::from_vec(v, n, &candle_core::Device::Cpu).unwrap()
}

/// A folder with the tiny Llama-3 checkpoint (random weights widened to Llama 2's tokenizer)
/// and the chat template `template` from tests/fixtures/chat_templates.json.
pub fn tiny_llama_with_template(template: &str) -> tempfile::TempDir {
    tiny_with_tokenizer("llama3_tiny", "llama2-tokenizer.json", template, serde_json::json!({}))
}

/// The tiny Qwen3 fixture speaking through Qwen3's real tokenizer (its `<think>` and
/// `<tool_call>` tags) and chat template, its embedding random over the whole vocabulary, with
/// room for `context` positions (plain RoPE: the fixture's YaRN is for its own 256).
pub fn tiny_qwen3_with_template(context: usize) -> tempfile::TempDir {
    // Qwen3's own ids for <|endoftext|> and <|im_end|> (the fixture's are for its 320 ids).
    let more = serde_json::json!({
        "max_position_embeddings": context, "rope_scaling": null,
        "bos_token_id": 151643, "eos_token_id": 151645,
    });
    tiny_with_tokenizer("qwen3_tiny", "qwen3-tokenizer.json", "qwen3", more)
}

/// A fixture's weights with its embedding (and LM head, when untied) replaced by random rows
/// for every id of the asset `tokenizer`, `template` from tests/fixtures/chat_templates.json,
/// and the config's keys in `more` set.
fn tiny_with_tokenizer(
    fixture: &str,
    tokenizer: &str,
    template: &str,
    more: serde_json::Value,
) -> tempfile::TempDir {
    use candle_core::{Device, Tensor};
    let dir = tempfile::tempdir().unwrap();
    let fixtures = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures"));
    let tok_path = asset(tokenizer, "scripts/assets/gptoss-tokenizer.sh");
    let tok = std::fs::read_to_string(tok_path).unwrap();
    let vocab = tokenizers::Tokenizer::from_bytes(tok.as_bytes()).unwrap().get_vocab_size(true);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(fixtures.join(fixture).join("config.json")).unwrap())
            .unwrap();
    config["vocab_size"] = vocab.into();
    for (k, v) in more.as_object().unwrap() {
        config[k] = v.clone();
    }
    let hidden = config["hidden_size"].as_u64().unwrap() as usize;
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let mut tensors = candle_core::safetensors::load(
        fixtures.join(fixture).join("model.safetensors"),
        &Device::Cpu,
    )
    .unwrap();
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        if tensors.contains_key(name) {
            let rows = Tensor::randn(0f32, 1.0, (vocab, hidden), &Device::Cpu).unwrap();
            tensors.insert(name.to_string(), rows);
        }
    }
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tok).unwrap();
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/chat_templates.json")).unwrap();
    let t = &fx["templates"][template];
    let cfg = serde_json::json!({"chat_template": t["source"], "bos_token": t["bos_token"], "eos_token": t["eos_token"]});
    std::fs::write(dir.path().join("tokenizer_config.json"), cfg.to_string()).unwrap();
    dir
}

/// The first case of tests/fixtures/chat_templates.json (transformers' renderings) for
/// `template` with a generation prompt that `pick` accepts.
pub fn template_case(
    template: &str,
    pick: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let fx: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/chat_templates.json")).unwrap();
    let found = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["template"] == template && c["add_generation_prompt"] == true && pick(c));
    found.cloned().unwrap_or_else(|| panic!("chat_templates.json has no such {template} case"))
}
