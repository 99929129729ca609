//! What will be loaded, decided before anything is allocated: the architecture and its config,
//! the compute dtype, the context, and the bytes the weights will take on the device (from the
//! files' headers and the loaders' rules). The memory plan is computed from it, and the loader
//! builds exactly what it describes.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use candle_core::DType;

use super::plan::{MemoryPlan, Target};
use super::{LoadOptions, Source};
use crate::engine::core::{DEFAULT_TOKEN_BUDGET, EngineConfig};
use crate::engine::pool::{BLOCK_SIZE, pool_groups};
use crate::error::{ErrorKind, fail};
use crate::models::arch::{ArchConfig, Reading};
use crate::models::batch::KvDtype;
use crate::models::memory::FileTensors;
use crate::models::{checkpoint, registry};

#[derive(Debug, Clone)]
pub struct Spec {
    /// The model's config, as its architecture read it: what loading asks of the architecture.
    pub arch: Arc<dyn ArchConfig>,
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
                let file = checkpoint::file_tensors(dir)?;
                Spec::from_config(&text, kind.as_deref(), Some(&file), opts, target)
            }
            Source::Dummy(config) => {
                let (kind, text) = model_type(config)?;
                Spec::from_config(&text, kind.as_deref(), None, opts, target)
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

    /// From a config.json text, read by the architecture its `model_type` names; `file`: the
    /// checkpoint's tensors, `None` for random weights.
    fn from_config(
        text: &str,
        kind: Option<&str>,
        file: Option<&FileTensors>,
        opts: &LoadOptions,
        target: Target,
    ) -> anyhow::Result<Spec> {
        let reading = registry::for_model_type(kind)?.read_hf(text, file, opts.dtype)?;
        Spec::of(reading, opts, target)
    }

    /// A GGUF: its header is read and checked by our own reader first (every length against
    /// the file size, so a corrupt file cannot make candle's reader allocate wildly), then by
    /// the architecture its `general.architecture` names.
    fn from_gguf(path: &Path, opts: &LoadOptions, target: Target) -> anyhow::Result<Spec> {
        let header = crate::inspect::gguf::read_header(path)
            .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))?;
        let arch = registry::for_gguf(header.architecture());
        let reading = arch.read_gguf(path, &header, opts.dtype, target == Target::Gpu)?;
        Spec::of(reading, opts, target)
    }

    fn of(r: Reading, opts: &LoadOptions, target: Target) -> anyhow::Result<Spec> {
        let max_context = r.config.max_context();
        let context = context_for(max_context, opts.context)?;
        Ok(Spec {
            arch: r.config,
            dtype: r.dtype,
            kv_dtype: opts.kv_dtype,
            context,
            max_context,
            weights: r.weights,
            target,
        })
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
        let arch = self.arch.for_rank(shard)?;
        let weights = arch.weight_bytes(self.dtype);
        let a = &self.arch;
        let (vocab, hidden, tied) = (a.vocab_size(), a.hidden_size(), a.tied_embeddings());
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
        let shape = self.arch.kv_shape(self.kv_pool_dtype());
        let rope_tables = self.arch.rope_table_bytes(context);
        let workspace = self.arch.workspace_bytes(context, step, self.dtype);
        let groups = pool_groups(&shape, &EngineConfig::single(context).pool());
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

/// `model_type` of a config.json, if it names one, and its text.
fn model_type(config_path: &Path) -> anyhow::Result<(Option<String>, String)> {
    let text = std::fs::read_to_string(config_path)
        .with_context(|| format!("reading {}", config_path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| fail(ErrorKind::InvalidInput, format!("{}: {e}", config_path.display())))?;
    let kind = v.get("model_type").and_then(|t| t.as_str()).map(str::to_string);
    Ok((kind, text))
}
