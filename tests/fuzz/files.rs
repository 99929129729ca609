//! The files a model comes as, from strangers: GGUF (metadata, tensor infos, offsets),
//! safetensors headers, `model.safetensors.index.json`, config.json and its
//! `quantization_config`. Each input goes through everything that reads it: the header readers,
//! `inspect` (what `list` and `doctor` show), the load spec and memory plan, the tokenizer and
//! chat template, and, when the plan is small, loading the weights on the CPU.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use inferno::inspect;
use inferno::load::{self, LoadOptions, Source, Spec, Target};
use proptest::prelude::*;
use serde_json::{Value, json};

use super::gguf_writer::{GgufDoc, gguf_doc};
use super::run::{apply, apply_json, edits, fuzz, json_edits};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel)
}

/// A model this small is loaded for real (its weights read, its tensors built).
const LOAD_BELOW: u64 = 64 << 20;

/// Everything that reads a GGUF file, on `path`; errors are fine, panics and hangs are not.
pub fn check_gguf(path: &Path) {
    if let Ok(h) = inspect::gguf::read_header(path) {
        let _ = (h.quant_label(), h.context_length(), h.dominant_tensor_type());
    }
    if let Ok((_, md)) = inspect::gguf::read_full(path) {
        let _ = inferno::tokenizer::gguf::from_gguf_metadata(&md);
    }
    let _ = inspect::inspect(path);
    check_source(Source::Gguf(path.to_path_buf()));
}

/// The loaders' reading of a model (spec, memory plan, tokenizer and template), then a real
/// load on the CPU when its weights are small.
fn check_source(source: Source) {
    let opts =
        LoadOptions { dtype: None, context: Some(64), dummy: false, kv_dtype: Default::default() };
    if let Ok(text) = load::text::load(&source) {
        let _ = text.encode_chat("hello <|im_start|> world");
    }
    let Ok(spec) = Spec::read(&source, &opts, Target::Host) else { return };
    let plan = spec.plan(spec.context);
    if spec.weights < LOAD_BELOW && plan.total() < 4 * LOAD_BELOW {
        let path = match &source {
            Source::Gguf(p) | Source::HfDir(p) | Source::Dummy(p) => p.display().to_string(),
        };
        let _ = load::load(&path, &opts, &candle_core::Device::Cpu);
    }
}

struct Seed {
    bytes: Vec<u8>,
    /// The real file's length: the edited header is written over a sparse file this long.
    len: u64,
}

/// Seeds: the two tiny GGUF fixtures, and the header of the real SmolLM2 GGUF (its 49k-token
/// vocabulary and merges) over a sparse file as long as the real one.
fn gguf_seeds() -> &'static [Seed] {
    static SEEDS: OnceLock<Vec<Seed>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut seeds: Vec<Seed> = ["llama3_tiny/model.gguf", "gpt_oss_tiny_gguf/model.gguf"]
            .iter()
            .map(|f| {
                let bytes = std::fs::read(fixture(f)).unwrap();
                Seed { len: bytes.len() as u64, bytes }
            })
            .collect();
        let smol = crate::common::asset(
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "scripts/assets/smollm2-gguf.sh",
        );
        let head = inspect::gguf::read_header(&smol).unwrap().data_offset as usize;
        let mut bytes = std::fs::read(&smol).unwrap();
        let len = bytes.len() as u64;
        bytes.truncate(head);
        seeds.push(Seed { bytes, len });
        seeds
    })
}

fn write_sparse(path: &Path, bytes: &[u8], len: u64) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
    f.set_len(len.max(bytes.len() as u64)).unwrap();
}

#[test]
#[cfg_attr(not(feature = "conformance"), ignore = "needs the SmolLM2 GGUF: scripts/test.sh")]
fn gguf_files_edited_from_real_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let seeds = gguf_seeds();
    // The SmolLM2 header is large: a third of the cases, and fewer edits land on its structure.
    let strategy = (0..seeds.len() + 1, edits(8));
    fuzz("gguf_edited", 300, Duration::from_secs(20), strategy, |(i, e)| {
        let seed = &seeds[i.min(seeds.len() - 1)];
        write_sparse(&path, &apply(&seed.bytes, &e), seed.len);
        check_gguf(&path);
        Ok(())
    });
}

#[test]
fn gguf_files_generated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let strategy = (gguf_doc(), prop::option::weighted(0.3, edits(4)));
    fuzz("gguf_generated", 1000, Duration::from_secs(20), strategy, |(doc, e): (GgufDoc, _)| {
        let bytes = doc.to_bytes();
        let bytes = match e {
            Some(e) => apply(&bytes, &e),
            None => bytes,
        };
        std::fs::write(&path, bytes).unwrap();
        check_gguf(&path);
        Ok(())
    });
}

/// The header of the tiny Llama's safetensors: (its JSON, the bytes of data after it).
fn safetensors_seed() -> (Value, u64) {
    let bytes = std::fs::read(fixture("llama3_tiny/model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + n]).unwrap(), (bytes.len() - 8 - n) as u64)
}

fn safetensors_file(header: &[u8], data_len: u64) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.resize(out.len() + data_len.min(1 << 20) as usize, 0);
    out
}

#[test]
fn safetensors_headers() {
    let (header, data_len) = safetensors_seed();
    let text = serde_json::to_vec(&header).unwrap();
    let strategy = prop_oneof![json_edits(6).prop_map(Ok), edits(6).prop_map(Err),];
    fuzz("safetensors_header", 5000, Duration::from_secs(5), strategy, |e| {
        let file = match e {
            Ok(je) => {
                safetensors_file(&serde_json::to_vec(&apply_json(&header, &je)).unwrap(), data_len)
            }
            Err(be) => apply(&safetensors_file(&text, data_len), &be),
        };
        let mut r = std::io::Cursor::new(&file);
        if let Ok(h) = inspect::safetensors::read_header_from(&mut r, file.len() as u64) {
            let _ = (h.bytes_by_dtype(), inspect::safetensors::dominant_dtype([&h]));
        }
        Ok(())
    });
}

/// Checkpoint folders whose config.json (with quantization_config) and safetensors index are
/// edited: the tiny Llama, its compressed-tensors variants and the tiny gpt-oss.
#[test]
fn model_folders() {
    const SEEDS: &[&str] = &[
        "llama3_tiny",
        "llama_ct/w4a16",
        "llama_ct/fp8_dynamic",
        "llama_ct/w8a8_int8",
        "gpt_oss_tiny",
    ];
    let strategy = (prop::sample::select(SEEDS), json_edits(5), prop::option::of(json_edits(3)));
    fuzz(
        "model_folder",
        1000,
        Duration::from_secs(20),
        strategy,
        |(seed, config_edits, index_edits)| {
            let dir = tempfile::tempdir().unwrap();
            let src = fixture(seed);
            let config: Value =
                serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
            let config = apply_json(&config, &config_edits);
            std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
            std::os::unix::fs::symlink(
                src.join("model.safetensors"),
                dir.path().join("model.safetensors"),
            )
            .unwrap();
            if let Some(e) = index_edits {
                let index = json!({"metadata": {"total_size": 1}, "weight_map": {"model.embed_tokens.weight": "model.safetensors", "lm_head.weight": "model.safetensors"}});
                let index = apply_json(&index, &e);
                std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string())
                    .unwrap();
            }
            let _ = inspect::inspect(dir.path());
            check_source(Source::HfDir(dir.path().to_path_buf()));
            Ok(())
        },
    );
}
