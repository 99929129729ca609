//! What will be loaded, decided before anything is allocated: the architecture and its config,
//! the compute dtype, the context, and the bytes the weights will take on the device (from the
//! files' headers and the loaders' rules). The memory plan is computed from it, and the loader
//! builds exactly what it describes.

use std::path::Path;

use anyhow::Context;
use candle_core::DType;

use super::plan::{MemoryPlan, Target};
use super::{LoadOptions, Source};
use crate::engine::core::{BLOCK_SIZE, DEFAULT_TOKEN_BUDGET, EngineConfig, pool_groups};
use crate::error::{ErrorKind, fail};
use crate::models::batch::KvDtype;
use crate::models::gpt_oss::{self, GptOssConfig};
use crate::models::llama::{self, LlamaConfig, load::GgufFile};
use crate::models::memory::{FileTensors, safetensors_tensors};

/// The architecture, with its config.
#[derive(Debug, Clone)]
pub enum Arch {
    GptOss(GptOssConfig),
    Llama(LlamaConfig),
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub arch: Arch,
    pub dtype: DType,
    /// How the KV cache stores keys and values.
    pub kv_dtype: KvDtype,
    /// The KV-cache size in positions.
    pub context: usize,
    /// The context the model was trained for.
    pub max_context: usize,
    /// Bytes the weights take once loaded.
    pub weights: u64,
    pub target: Target,
}

impl Spec {
    /// Reads the config and the weights' headers of `source` (no tensor data) and decides what
    /// to load for `opts` on `target`.
    pub fn read(source: &Source, opts: &LoadOptions, target: Target) -> anyhow::Result<Spec> {
        let spec = match source {
            Source::HfDir(dir) => {
                let (kind, text) = model_type(&dir.join("config.json"))?;
                Spec::from_config(&text, &kind, Some(&checkpoint_tensors(dir)?), opts, target)
            }
            Source::Dummy(config) => {
                let (kind, text) = model_type(config)?;
                Spec::from_config(&text, &kind, None, opts, target)
            }
            Source::Gguf(path) => Spec::from_gguf(path, opts, target),
        }?;
        // The GPU reads pools of codes in the tensor-core attention kernel, which takes bf16
        // queries.
        if spec.kv_dtype != KvDtype::Compute && target == Target::Gpu && spec.dtype != DType::BF16 {
            let kv = super::plan::kv_dtype_name(spec.kv_pool_dtype());
            return Err(fail(
                ErrorKind::InvalidInput,
                format!(
                    "--kv-dtype {kv} needs bf16 compute on the GPU, and this model computes in {} \
                     (--dtype bf16, or --kv-dtype bf16)",
                    spec.dtype.as_str()
                ),
            ));
        }
        Ok(spec)
    }

    /// The KV pool's dtype.
    pub fn kv_pool_dtype(&self) -> DType {
        self.kv_dtype.pool_dtype(self.dtype)
    }

    /// From a config.json text; `file`: the checkpoint's tensors, `None` for random weights.
    fn from_config(
        text: &str,
        kind: &str,
        file: Option<&FileTensors>,
        opts: &LoadOptions,
        target: Target,
    ) -> anyhow::Result<Spec> {
        let (arch, dtype, max, weights) = match kind {
            "gpt_oss" => {
                let cfg = GptOssConfig::from_hf_json(text)?;
                let dtype = gpt_oss_dtype(opts)?;
                let weights = gpt_oss::memory::weight_bytes(&cfg, dtype, file);
                let max = cfg.max_position_embeddings;
                (Arch::GptOss(cfg), dtype, max, weights)
            }
            "llama" | "mistral" => {
                let cfg = LlamaConfig::from_hf_json(text)?;
                let dtype = llama::load::choose_dtype(opts.dtype, &cfg);
                let weights = llama::memory::weight_bytes(&cfg, dtype, file);
                let max = cfg.max_position_embeddings;
                (Arch::Llama(cfg), dtype, max, weights)
            }
            other => {
                return Err(fail(
                    ErrorKind::InvalidInput,
                    format!(
                        "unsupported architecture {other:?} (supported: llama, mistral, gpt_oss)"
                    ),
                ));
            }
        };
        let context = context_for(max, opts.context)?;
        let kv_dtype = opts.kv_dtype;
        Ok(Spec { arch, dtype, kv_dtype, context, max_context: max, weights, target })
    }

    /// A GGUF: its header is read and checked by our own reader first (every length against
    /// the file size, so a corrupt file cannot make candle's reader allocate wildly). gpt-oss
    /// files go to their own loader (candle cannot open them); the rest are llama GGUFs, whose
    /// tensor infos give the weights' bytes.
    fn from_gguf(path: &Path, opts: &LoadOptions, target: Target) -> anyhow::Result<Spec> {
        let header = crate::inspect::gguf::read_header(path)
            .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))?;
        if header.architecture() == Some(gpt_oss::gguf::ARCH) {
            return Spec::from_gpt_oss_gguf(path, opts, target);
        }
        let cfg = GgufFile::open(path)?.config()?;
        let context = context_for(cfg.max_position_embeddings, opts.context)?;
        let on_gpu = target == Target::Gpu;
        let weights = llama::memory::gguf_weight_bytes(&cfg, &header.tensors, on_gpu);
        let max_context = cfg.max_position_embeddings;
        // GGUF models compute in f32 whatever was asked (quantized kernels take f32).
        Ok(Spec {
            arch: Arch::Llama(cfg),
            dtype: DType::F32,
            kv_dtype: opts.kv_dtype,
            context,
            max_context,
            weights,
            target,
        })
    }

    /// A gpt-oss GGUF: loaded into the same tensors as the HF checkpoint (the experts repacked,
    /// Q8_0 dequantized to the compute dtype), so the HF layout's byte count applies.
    fn from_gpt_oss_gguf(path: &Path, opts: &LoadOptions, target: Target) -> anyhow::Result<Spec> {
        let g = crate::models::gguf::GgufTensors::open(path)?;
        let cfg = gpt_oss::gguf::config(&g)?;
        let dtype = gpt_oss_dtype(opts)?;
        let weights = gpt_oss::memory::weight_bytes(&cfg, dtype, None);
        let max_context = cfg.max_position_embeddings;
        let context = context_for(max_context, opts.context)?;
        let kv_dtype = opts.kv_dtype;
        Ok(Spec { arch: Arch::GptOss(cfg), dtype, kv_dtype, context, max_context, weights, target })
    }

    /// What rank `shard` of a tensor-parallel model loads: its slice's config (heads, key/value
    /// heads and intermediate size per rank) and weights (`ceil(vocab / world)` rows of the
    /// embedding and of the LM head, one tensor where they are tied; the whole embedding too with
    /// `whole_embedding`), so that its plan is a GPU's.
    pub fn for_rank(
        &self,
        shard: crate::dist::Shard,
        whole_embedding: bool,
    ) -> anyhow::Result<Spec> {
        if shard.is_single() {
            return Ok(self.clone());
        }
        let size = self.dtype.size_in_bytes() as u64;
        let (arch, weights, vocab, hidden, tied) = match &self.arch {
            Arch::GptOss(cfg) => {
                let local = gpt_oss::shard::local_config(cfg, shard)?;
                let w = gpt_oss::memory::weight_bytes(&local, self.dtype, None);
                let dims = (cfg.vocab_size, cfg.hidden_size, cfg.tie_word_embeddings);
                (Arch::GptOss(local), w, dims.0, dims.1, dims.2)
            }
            Arch::Llama(cfg) => {
                let local = llama::shard::local_config(cfg, shard)?;
                let w = llama::memory::weight_bytes(&local, self.dtype, None);
                let dims = (cfg.vocab_size, cfg.hidden_size, cfg.tie_word_embeddings);
                (Arch::Llama(local), w, dims.0, dims.1, dims.2)
            }
        };
        // `weights` counts the whole table, and an untied head's whole table.
        let table = vocab as u64 * hidden as u64 * size;
        let mine = shard.vocab(vocab).1 as u64 * hidden as u64 * size;
        let ends = if tied { table } else { 2 * table };
        let embedding = if whole_embedding { table } else { mine };
        // A tied head is the embedding's rows, unless those are a view of the whole table.
        let head = if tied && !whole_embedding { 0 } else { mine };
        let weights = weights.saturating_sub(ends) + embedding + head;
        Ok(Spec { arch, weights, ..self.clone() })
    }

    /// The smallest `--tp` above `above` (2, 4 or 8) whose rank 0, the largest share, fits
    /// `free` bytes at `context`, and the bytes that share needs.
    pub fn smallest_tp(&self, context: usize, free: u64, above: usize) -> Option<(usize, u64)> {
        [2, 4, 8].into_iter().filter(|&w| w > above).find_map(|world| {
            let share = self.for_rank(crate::dist::Shard { rank: 0, world }, false).ok()?;
            let need = share.plan(context).total();
            (need <= free).then_some((world, need))
        })
    }

    /// The memory needed at `context`.
    pub fn plan(&self, context: usize) -> MemoryPlan {
        // The pool an engine of one sequence of `context` tokens allocates; the intermediates
        // of the engine's default step, which grow with its tokens.
        let step = DEFAULT_TOKEN_BUDGET;
        let (shape, rope_tables, workspace) = match &self.arch {
            Arch::GptOss(cfg) => {
                use gpt_oss::memory as m;
                (
                    m::kv_shape(cfg, self.kv_pool_dtype()),
                    m::rope_table_bytes(cfg, context),
                    m::workspace_bytes(cfg, context, step, self.dtype),
                )
            }
            Arch::Llama(cfg) => {
                use llama::memory as m;
                (
                    m::kv_shape(cfg, self.kv_pool_dtype()),
                    m::rope_table_bytes(cfg, context),
                    m::workspace_bytes(cfg, context, step, self.dtype),
                )
            }
        };
        let groups = pool_groups(&shape, &EngineConfig::single(context));
        let blocks: Vec<usize> = groups.iter().map(|g| g.blocks).collect();
        let kv_cache = shape.pool_bytes(BLOCK_SIZE, &blocks);
        MemoryPlan {
            context,
            weights: self.weights,
            kv_cache,
            kv_dtype: shape.dtype,
            rope_tables,
            workspace,
            runtime: self.target.runtime_bytes(),
            target: self.target,
        }
    }
}

/// gpt-oss's compute dtype: bf16 unless asked; f16 is refused, it overflows gpt-oss's residual
/// stream (docs/gpt-oss.md pitfall #7).
fn gpt_oss_dtype(opts: &LoadOptions) -> anyhow::Result<DType> {
    let dtype = opts.dtype.unwrap_or(DType::BF16);
    if dtype == DType::F16 {
        return Err(fail(
            ErrorKind::InvalidInput,
            "gpt-oss does not run in f16 (its activations overflow it): use bf16 or f32",
        ));
    }
    Ok(dtype)
}

/// The tensors of a safetensors checkpoint folder, from its headers.
fn checkpoint_tensors(dir: &Path) -> anyhow::Result<FileTensors> {
    let files = crate::models::llama::load::safetensors_files(dir)?;
    let headers = files
        .iter()
        .map(|f| {
            crate::inspect::safetensors::read_header(f)
                .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(safetensors_tensors(&headers))
}

/// The KV-cache size: `--context` when given, else the model's maximum.
pub(super) fn context_for(
    max_position_embeddings: usize,
    requested: Option<usize>,
) -> anyhow::Result<usize> {
    let max = max_position_embeddings.max(1);
    match requested {
        Some(0) => Err(fail(ErrorKind::InvalidInput, "--context must be positive")),
        // Past the trained maximum is allowed (llama.cpp's behaviour), with a warning once the
        // memory plan has accepted it ([`super::load`]).
        Some(n) => Ok(n),
        None => Ok(default_context(max)),
    }
}

/// The context asked of the memory plan when none is given: the model's maximum ([`super::load`]
/// lowers it to what fits).
pub fn default_context(max_position_embeddings: usize) -> usize {
    max_position_embeddings.max(1)
}

/// `model_type` of a config.json (llama when absent).
pub(super) fn model_type(config_path: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("{}: {e}", config_path.display())))?;
    let kind = v.get("model_type").and_then(|t| t.as_str()).unwrap_or("llama").to_string();
    Ok((kind, text))
}
