//! What a model is, read from its files without loading the weights.
//!
//! `inferno list` shows this for every cached snapshot, and later commands use it to choose a
//! loader, so it must be cheap (headers only: a 60 GB checkpoint costs a few kB of reads) and
//! must describe models we cannot run as well as those we can. Anything that makes the files
//! unusable (truncated header, missing shard, malformed `config.json`) is an error here, with a
//! message that names the file.
//!
//! A model is a directory (an HF snapshot or any local folder) holding `config.json` and
//! `*.safetensors`, or `*.gguf` files, or a single `.gguf` file. Only the top level of a
//! directory counts: gpt-oss repos keep a duplicate checkpoint in `original/` and `metal/`.

pub mod config;
pub mod gguf;
pub mod safetensors;

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::error::{ErrorKind, fail};

/// How the weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightKind {
    Safetensors,
    Gguf,
    /// `pytorch_model*.bin` (pickle): listed, never loaded.
    PytorchBin,
    /// Only configs/tokenizer, e.g. a download limited by `--include`.
    None,
}

/// A model's description, from headers and `config.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelDescription {
    /// `config.json` `model_type` (`llama`, `gpt_oss`), or GGUF `general.architecture`.
    pub architecture: Option<String>,
    /// What the weights are: `bf16`, `f16`, `f32` (dominant safetensors dtype by bytes),
    /// `mxfp4` (or another `quantization_config.quant_method`), `GGUF Q4_K_M`, `pytorch`,
    /// `no weights`.
    pub format: String,
    /// The context length the model was trained for.
    pub context_length: Option<u64>,
    pub weights: WeightKind,
    /// The weight files, sorted by name (GGUF: every `.gguf`, shards and variants alike).
    pub weight_files: Vec<PathBuf>,
}

/// Describes the model at `path`: a directory, or a single `.gguf` file.
pub fn inspect(path: &Path) -> anyhow::Result<ModelDescription> {
    let meta = std::fs::metadata(path).map_err(|e| {
        fail(ErrorKind::NotFound, format!("cannot read model at {}: {e}", path.display()))
    })?;
    if meta.is_dir() {
        return inspect_dir(path);
    }
    if has_extension(path, "gguf") {
        return inspect_gguf(None, vec![path.to_path_buf()]);
    }
    Err(fail(
        ErrorKind::InvalidInput,
        format!("{} is not a model: expected a directory or a .gguf file", path.display()),
    ))
}

/// The top-level files of a model directory, grouped by what they are.
#[derive(Debug, Default)]
struct DirFiles {
    config: Option<PathBuf>,
    safetensors_index: Option<PathBuf>,
    safetensors: Vec<PathBuf>,
    gguf: Vec<PathBuf>,
    pytorch: Vec<PathBuf>,
}

fn scan_dir(dir: &Path) -> anyhow::Result<DirFiles> {
    let mut files = DirFiles::default();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
        // Symlinks count even when dangling: a missing blob must surface as an error.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        match name.as_str() {
            "config.json" => files.config = Some(path),
            "model.safetensors.index.json" => files.safetensors_index = Some(path),
            _ if has_extension(&path, "safetensors") => files.safetensors.push(path),
            _ if has_extension(&path, "gguf") => files.gguf.push(path),
            _ if name.starts_with("pytorch_model") && has_extension(&path, "bin") => {
                files.pytorch.push(path)
            }
            _ => {}
        }
    }
    for list in [&mut files.safetensors, &mut files.gguf, &mut files.pytorch] {
        list.sort();
    }
    Ok(files)
}

fn inspect_dir(dir: &Path) -> anyhow::Result<ModelDescription> {
    let files = scan_dir(dir)?;
    let facts = match &files.config {
        Some(path) => config::read(path).context("config.json")?,
        None => config::ConfigFacts::default(),
    };
    if !files.safetensors.is_empty() {
        return inspect_safetensors(dir, &files, facts);
    }
    if !files.gguf.is_empty() {
        return inspect_gguf(Some(facts), files.gguf);
    }
    let (weights, format, weight_files) = if files.pytorch.is_empty() {
        (WeightKind::None, "no weights", vec![])
    } else {
        (WeightKind::PytorchBin, "pytorch", files.pytorch)
    };
    Ok(ModelDescription {
        architecture: facts.model_type,
        format: format.to_string(),
        context_length: facts.context_length,
        weights,
        weight_files,
    })
}

fn inspect_safetensors(
    dir: &Path,
    files: &DirFiles,
    facts: config::ConfigFacts,
) -> anyhow::Result<ModelDescription> {
    if let Some(index) = &files.safetensors_index {
        check_shards(dir, index)?;
    }
    let headers = files
        .safetensors
        .iter()
        .map(|p| safetensors::read_header(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // A pre-quantized checkpoint says so in its config; its tensors' dtypes (U8 blocks for
    // MXFP4, I32 for GPTQ) would not name the format.
    let format = facts
        .quant_method
        .clone()
        .or_else(|| safetensors::dominant_dtype(&headers))
        .unwrap_or_else(|| "safetensors".to_string());
    Ok(ModelDescription {
        architecture: facts.model_type,
        format,
        context_length: facts.context_length,
        weights: WeightKind::Safetensors,
        weight_files: files.safetensors.clone(),
    })
}

/// A sharded checkpoint must have every shard its index names (a partial download may not).
fn check_shards(dir: &Path, index: &Path) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(index).with_context(|| format!("reading {}", index.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).context("model.safetensors.index.json is not valid JSON")?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .context("model.safetensors.index.json has no weight_map")?;
    let mut shards: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
    shards.sort_unstable();
    shards.dedup();
    let missing: Vec<&str> = shards.iter().copied().filter(|s| !dir.join(s).exists()).collect();
    match missing.as_slice() {
        [] => Ok(()),
        [one] => anyhow::bail!("incomplete: shard {one} is missing"),
        [first, rest @ ..] => {
            anyhow::bail!(
                "incomplete: {} of {} shards missing ({first}, …)",
                rest.len() + 1,
                shards.len()
            )
        }
    }
}

/// GGUF files, with `config.json` facts (when in a directory) as a fallback.
fn inspect_gguf(
    facts: Option<config::ConfigFacts>,
    files: Vec<PathBuf>,
) -> anyhow::Result<ModelDescription> {
    let facts = facts.unwrap_or_default();
    let mut labels: Vec<String> = Vec::new();
    let (mut architecture, mut context_length) = (None, None);
    for path in &files {
        let header = gguf::read_header(path)?;
        // Later shards of a split file carry no general.* metadata; their tensors alone would
        // give the base type (Q4_K) next to the first shard's recipe (Q4_K_M).
        if header.get_u64("split.no").is_some_and(|n| n > 0) {
            continue;
        }
        if architecture.is_none() {
            architecture = header.architecture().map(str::to_string);
            context_length = header.context_length();
        }
        if let Some(label) = header.quant_label().filter(|l| !labels.contains(l)) {
            labels.push(label);
        }
    }
    let format =
        if labels.is_empty() { "GGUF".to_string() } else { format!("GGUF {}", labels.join(", ")) };
    Ok(ModelDescription {
        architecture: architecture.or(facts.model_type),
        format,
        context_length: context_length.or(facts.context_length),
        weights: WeightKind::Gguf,
        weight_files: files,
    })
}

fn has_extension(path: &Path, ext: &str) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case(ext))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::kind_of;

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn safetensors_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(
            &d.join("config.json"),
            r#"{"model_type": "llama", "max_position_embeddings": 2048}"#,
        );
        safetensors::write_test_file(&d.join("model.safetensors"), &[("w", "BF16", &[8, 8], 2)])
            .unwrap();
        std::fs::create_dir(d.join("original")).unwrap();
        safetensors::write_test_file(
            &d.join("original/model.safetensors"),
            &[("w", "F32", &[99, 99], 4)],
        )
        .unwrap();
        let info = inspect(d).unwrap();
        assert_eq!(info.architecture.as_deref(), Some("llama"));
        assert_eq!(info.format, "bf16", "original/ is ignored");
        assert_eq!(info.context_length, Some(2048));
        assert_eq!(info.weights, WeightKind::Safetensors);
        assert_eq!(info.weight_files, vec![d.join("model.safetensors")]);
    }

    #[test]
    fn mxfp4_comes_from_the_config() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(
            &d.join("config.json"),
            r#"{"model_type": "gpt_oss", "max_position_embeddings": 131072,
                "quantization_config": {"quant_method": "mxfp4"}}"#,
        );
        safetensors::write_test_file(
            &d.join("model.safetensors"),
            &[
                ("experts.gate_up_proj_blocks", "U8", &[4, 8, 16], 1),
                ("attn.q_proj.weight", "BF16", &[8, 8], 2),
            ],
        )
        .unwrap();
        let info = inspect(d).unwrap();
        assert_eq!(
            (info.architecture.as_deref(), info.format.as_str()),
            (Some("gpt_oss"), "mxfp4")
        );
        assert_eq!(info.context_length, Some(131072));
    }

    #[test]
    fn missing_shard_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write(&d.join("config.json"), r#"{"model_type": "llama"}"#);
        write(
            &d.join("model.safetensors.index.json"),
            r#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#,
        );
        safetensors::write_test_file(
            &d.join("model-00001-of-00002.safetensors"),
            &[("a", "F16", &[4], 2)],
        )
        .unwrap();
        let err = inspect(d).unwrap_err().to_string();
        assert_eq!(err, "incomplete: shard model-00002-of-00002.safetensors is missing");
        safetensors::write_test_file(
            &d.join("model-00002-of-00002.safetensors"),
            &[("b", "F16", &[4], 2)],
        )
        .unwrap();
        assert_eq!(inspect(d).unwrap().format, "f16");
    }

    #[test]
    fn broken_config_names_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        write(&tmp.path().join("config.json"), "{oops");
        let err = format!("{:#}", inspect(tmp.path()).unwrap_err());
        assert!(err.starts_with("config.json: not valid JSON"), "{err}");
    }

    #[test]
    fn dir_without_weights() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            &tmp.path().join("config.json"),
            r#"{"model_type": "qwen3", "max_position_embeddings": 40960}"#,
        );
        let info = inspect(tmp.path()).unwrap();
        assert_eq!((info.format.as_str(), info.weights), ("no weights", WeightKind::None));
        assert_eq!(info.context_length, Some(40960));
    }

    #[test]
    fn missing_path_and_other_files() {
        let tmp = tempfile::tempdir().unwrap();
        let err = inspect(&tmp.path().join("nope")).unwrap_err();
        assert_eq!(kind_of(&err), ErrorKind::NotFound);
        let txt = tmp.path().join("notes.txt");
        write(&txt, "hi");
        assert_eq!(kind_of(&inspect(&txt).unwrap_err()), ErrorKind::InvalidInput);
    }

    #[test]
    fn gguf_file_and_dir() {
        use candle_core::quantized::{
            GgmlDType, QTensor,
            gguf_file::{self, Value},
        };
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("tiny-Q8_0.gguf");
        let t = candle_core::Tensor::zeros(
            (32, 64),
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let q = QTensor::quantize(&t, GgmlDType::Q8_0).unwrap();
        let arch = Value::String("qwen3".into());
        let ctx = Value::U64(40960);
        let meta = [("general.architecture", &arch), ("qwen3.context_length", &ctx)];
        gguf_file::write(&mut std::fs::File::create(&path).unwrap(), &meta, &[("w", &q)]).unwrap();
        let info = inspect(&path).unwrap();
        assert_eq!(info.architecture.as_deref(), Some("qwen3"));
        assert_eq!(info.format, "GGUF Q8_0");
        assert_eq!(info.context_length, Some(40960));
        assert_eq!(
            inspect(tmp.path()).unwrap(),
            info,
            "a directory of one .gguf is the same model"
        );
    }
}
