//! From a model name to a loaded model on a device: resolve the name (cache id or local path),
//! tell the format apart (HF safetensors folder, GGUF file, or a bare config.json for dummy
//! weights), load it, and report what was loaded and the device memory it took.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device};

use crate::error::{ErrorKind, fail};
use crate::gpu::{self, GpuInfo};
use crate::hub::Cache;
use crate::hub::resolve::resolve_model;
use crate::models::CausalLm;
use crate::models::gpt_oss::{self, GptOssConfig};
use crate::models::llama::load::{self, GgufFile};
use crate::models::llama::model::RopeStyle;
use crate::models::llama::{LlamaConfig, dummy};

pub mod text;

/// Default KV-cache size when the model allows more (`--context` raises it).
pub const DEFAULT_CONTEXT: usize = 8192;

/// Where the weights come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A folder with config.json and safetensors.
    HfDir(PathBuf),
    /// A GGUF file.
    Gguf(PathBuf),
    /// Only a config.json: random weights (`--dummy-weights`).
    Dummy(PathBuf),
}

impl Source {
    /// Decides the format of a resolved model path.
    pub fn detect(path: &Path, dummy: bool) -> anyhow::Result<Source> {
        if dummy {
            let cfg = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
            if !cfg.is_file() {
                return Err(fail(
                    ErrorKind::NotFound,
                    format!("--dummy-weights needs a config.json: {} not found", cfg.display()),
                ));
            }
            return Ok(Source::Dummy(cfg));
        }
        if path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Ok(Source::Gguf(path.to_path_buf()));
        }
        if path.is_dir() {
            if path.join("config.json").is_file() && load::safetensors_files(path).is_ok() {
                return Ok(Source::HfDir(path.to_path_buf()));
            }
            let ggufs = gguf_files(path)?;
            match ggufs.len() {
                1 => return Ok(Source::Gguf(ggufs[0].clone())),
                n if n > 1 => {
                    let names: Vec<String> = ggufs
                        .iter()
                        .filter_map(|p| p.file_name())
                        .map(|n| n.to_string_lossy().into_owned())
                        .collect();
                    return Err(fail(
                        ErrorKind::InvalidInput,
                        format!(
                            "{} holds {n} GGUF files; name one: {}",
                            path.display(),
                            names.join(", ")
                        ),
                    ));
                }
                _ => {}
            }
        }
        Err(fail(
            ErrorKind::NotFound,
            format!("no safetensors or GGUF model in {}", path.display()),
        ))
    }
}

fn gguf_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    out.sort();
    Ok(out)
}

/// Device choice from the command line: a GPU unless `--cpu` was given explicitly.
pub fn open_device(gpu_index: usize, cpu: bool) -> anyhow::Result<(Device, Option<GpuInfo>)> {
    if cpu {
        return Ok((Device::Cpu, None));
    }
    let (dev, info) = gpu::open(gpu_index)?;
    Ok((dev, Some(info)))
}

/// Parses `--dtype`.
pub fn parse_dtype(s: &str) -> anyhow::Result<DType> {
    match s.to_ascii_lowercase().as_str() {
        "f32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "f16" | "float16" => Ok(DType::F16),
        other => Err(fail(
            ErrorKind::InvalidInput,
            format!("unknown dtype {other:?} (use f32, bf16 or f16)"),
        )),
    }
}

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub dtype: Option<DType>,
    pub context: Option<usize>,
    pub dummy: bool,
}

/// A model on its device, with what the banner and benchmarks report.
pub struct Loaded {
    pub model: Box<dyn CausalLm>,
    pub source: Source,
    pub name: String,
    pub format: String,
    pub dtype: DType,
    pub context: usize,
    pub max_context: usize,
    /// Device memory taken by loading (weights + KV cache), when measurable.
    pub device_bytes: Option<u64>,
}

/// Resolves `name` (cache id, `id@rev`, local folder or .gguf) and loads it.
pub fn load(name: &str, opts: &LoadOptions, device: &Device) -> anyhow::Result<Loaded> {
    let path = if opts.dummy && Path::new(name).exists() {
        PathBuf::from(name)
    } else {
        resolve_model(name, &Cache::from_env())?.path
    };
    let source = Source::detect(&path, opts.dummy)?;
    let before = gpu::memory(device);
    let loaded = load_source(name, source, opts, device)?;
    let after = gpu::memory(device);
    let device_bytes = match (before, after) {
        (Some((free_before, _)), Some((free_after, _))) => {
            Some(free_before.saturating_sub(free_after))
        }
        _ => None,
    };
    Ok(Loaded { device_bytes, ..loaded })
}

/// The KV-cache size: `--context` when given, else the model's maximum capped at
/// [`DEFAULT_CONTEXT`].
fn context_for(max_position_embeddings: usize, requested: Option<usize>) -> anyhow::Result<usize> {
    let max = max_position_embeddings.max(1);
    match requested {
        Some(0) => Err(fail(ErrorKind::InvalidInput, "--context must be positive")),
        Some(n) => {
            if n > max {
                // llama.cpp's behaviour: allowed, with a warning. Positions past the trained
                // maximum get RoPE angles the model never saw (YaRN is scaled for `max`).
                eprintln!(
                    "warning: --context {n} is beyond the {max} positions this model was trained for; output past position {max} is untested"
                );
            }
            Ok(n)
        }
        None => Ok(max.min(DEFAULT_CONTEXT)),
    }
}

/// `model_type` of a config.json (llama when absent).
fn model_type(config_path: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("{}: {e}", config_path.display())))?;
    let kind = v.get("model_type").and_then(|t| t.as_str()).unwrap_or("llama").to_string();
    Ok((kind, text))
}

type Built = (Box<dyn CausalLm>, String, DType, usize, usize);

/// A model from a config.json text and a way to get its weights (checkpoint or random).
fn build(
    text: &str,
    kind: &str,
    dir: Option<&Path>,
    opts: &LoadOptions,
    device: &Device,
) -> anyhow::Result<Built> {
    match kind {
        "gpt_oss" => {
            let cfg = GptOssConfig::from_hf_json(text)?;
            let context = context_for(cfg.max_position_embeddings, opts.context)?;
            // gpt-oss is trained in bf16; f16 overflows its residual stream (docs/gpt-oss.md
            // pitfall #7).
            let dtype = opts.dtype.unwrap_or(DType::BF16);
            if dtype == DType::F16 {
                return Err(fail(
                    ErrorKind::InvalidInput,
                    "gpt-oss does not run in f16 (its activations overflow it): use bf16 or f32",
                ));
            }
            let max = cfg.max_position_embeddings;
            let model = match dir {
                Some(dir) => gpt_oss::load::load(dir, dtype, context, device)?,
                None => {
                    let w = gpt_oss::dummy::random_weights(&cfg, dtype, device)?;
                    gpt_oss::GptOss::new(cfg, w, context, dtype, device)?
                }
            };
            let format = if dir.is_some() { "mxfp4" } else { "dummy mxfp4" };
            Ok((Box::new(model), format.into(), dtype, context, max))
        }
        "llama" | "mistral" => {
            let cfg = LlamaConfig::from_hf_json(text)?;
            let context = context_for(cfg.max_position_embeddings, opts.context)?;
            let dtype = load::choose_dtype(opts.dtype, &cfg);
            let max = cfg.max_position_embeddings;
            match dir {
                Some(dir) => {
                    let m = load::load_safetensors(dir, Some(dtype), context, device)?;
                    Ok((Box::new(m), "safetensors".into(), dtype, context, max))
                }
                None => {
                    let weights = dummy::random_weights(&cfg, dtype, device)?;
                    let m = crate::models::llama::Llama::new(
                        cfg,
                        weights,
                        RopeStyle::HalfSplit,
                        context,
                        dtype,
                        device,
                    )?;
                    Ok((Box::new(m), "dummy".into(), dtype, context, max))
                }
            }
        }
        other => Err(fail(
            ErrorKind::InvalidInput,
            format!("unsupported architecture {other:?} (supported: llama, mistral, gpt_oss)"),
        )),
    }
}

fn load_source(
    name: &str,
    source: Source,
    opts: &LoadOptions,
    device: &Device,
) -> anyhow::Result<Loaded> {
    let (model, format, dtype, context, max): Built = match &source {
        Source::HfDir(dir) => {
            let (kind, text) = model_type(&dir.join("config.json"))?;
            build(&text, &kind, Some(dir), opts, device)?
        }
        Source::Gguf(path) => {
            let mut gguf = GgufFile::open(path)?;
            let cfg = gguf.config()?;
            let context = context_for(cfg.max_position_embeddings, opts.context)?;
            let quant =
                crate::inspect::inspect(path).map(|i| i.format).unwrap_or_else(|_| "GGUF".into());
            let m = load::load_gguf(&mut gguf, context, device)?;
            (Box::new(m), quant, DType::F32, context, cfg.max_position_embeddings)
        }
        Source::Dummy(cfg_path) => {
            let (kind, text) = model_type(cfg_path)?;
            build(&text, &kind, None, opts, device)?
        }
    };
    Ok(Loaded {
        model,
        source,
        name: name.to_string(),
        format,
        dtype,
        context,
        max_context: max,
        device_bytes: None,
    })
}
