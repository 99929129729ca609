//! Gemma 3 as the registry sees it ([`crate::models::arch`]): HF configs of `gemma3_text` (1B)
//! and `gemma3` (4B+, the language model of `Gemma3ForConditionalGeneration`), `gemma3` GGUF
//! files.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::config::Gemma3Config;
use super::load::{choose_dtype, gguf_config, gguf_plan, load_gguf, load_safetensors};
use super::model::Gemma3;
use super::{dummy, memory, shard};
use crate::dist::{Collective, Shard};
use crate::error::{ErrorKind, fail};
use crate::inspect::gguf::Header;
use crate::models::arch::{ArchConfig, Architecture, Build, Origin, Reading};
use crate::models::batch::{BatchModel, KvShape};
use crate::models::embedding::shard_ends;
use crate::models::gguf::GgufTensors;
use crate::models::memory::FileTensors;

/// The registry's entry.
pub struct Gemma3Family;

impl Architecture for Gemma3Family {
    fn model_types(&self) -> &'static [&'static str] {
        &["gemma3_text", "gemma3"]
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["gemma3"]
    }

    fn read_hf(
        &self,
        config: &str,
        file: Option<&FileTensors>,
        dtype: Option<DType>,
    ) -> anyhow::Result<Reading> {
        let cfg = Gemma3Config::from_hf_json(config)?;
        let dtype = choose_dtype(dtype, cfg.checkpoint_dtype.as_deref())?;
        let weights = memory::weight_bytes(&cfg, dtype, file);
        Ok(Reading { config: Arc::new(cfg), dtype, weights })
    }

    fn read_gguf(
        &self,
        path: &Path,
        header: &Header,
        dtype: Option<DType>,
        on_gpu: bool,
    ) -> anyhow::Result<Reading> {
        let cfg = gguf_config(&GgufTensors::open(path)?)?;
        let (kind, dtype) = gguf_plan(&header.tensors, dtype, on_gpu)?;
        let weights = memory::gguf_weight_bytes(&header.tensors, kind, dtype, on_gpu);
        Ok(Reading { config: Arc::new(cfg), dtype, weights })
    }
}

impl ArchConfig for Gemma3Config {
    fn max_context(&self) -> usize {
        self.max_position_embeddings
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.hidden_size
    }

    fn tied_embeddings(&self) -> bool {
        self.tie_word_embeddings
    }

    fn weight_format(&self) -> Option<&'static str> {
        None
    }

    fn weight_bytes(&self, dtype: DType) -> u64 {
        memory::weight_bytes(self, dtype, None)
    }

    fn kv_shape(&self, dtype: DType) -> KvShape {
        memory::kv_shape(self, dtype)
    }

    fn rope_table_bytes(&self, context: usize) -> u64 {
        memory::rope_table_bytes(self, context)
    }

    fn workspace_bytes(&self, context: usize, chunk: usize, dtype: DType) -> u64 {
        memory::workspace_bytes(self, context, chunk, dtype)
    }

    fn for_rank(&self, shard: Shard) -> anyhow::Result<Arc<dyn ArchConfig>> {
        Ok(Arc::new(shard::local_config(self, shard)?))
    }

    fn build(&self, b: &Build) -> anyhow::Result<Box<dyn BatchModel>> {
        gpu_head_dim(self, b)?;
        Ok(Box::new(match b.origin {
            Origin::Gguf(path) => {
                let header = crate::inspect::gguf::read_header(path)
                    .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))?;
                let (kind, _) = gguf_plan(&header.tensors, Some(b.dtype), b.device.is_cuda())?;
                load_gguf(path, (kind, b.dtype), b.context, b.device)?
            }
            Origin::Checkpoint(dir) => load_safetensors(dir, Some(b.dtype), b.context, b.device)?,
            Origin::Random => {
                let w = dummy::random_weights(self, b.dtype, b.device)?;
                Gemma3::new(self.clone(), w, b.context, b.dtype, b.device)?
            }
        }))
    }

    fn build_rank(
        &self,
        b: &Build,
        comm: Arc<dyn Collective>,
        whole_embedding: bool,
    ) -> anyhow::Result<Box<dyn BatchModel>> {
        gpu_head_dim(self, b)?;
        let cpu = Device::Cpu;
        let whole = match b.origin {
            // Random weights made in the slice's shapes (this config is the rank's), the ends
            // cut from whole random tables.
            Origin::Random => {
                let mut w = dummy::random_weights(self, b.dtype, b.device)?;
                let shard = comm.shard();
                (w.embed, w.head) =
                    shard_ends(&w.embed, &w.head, shard, whole_embedding, b.device)?;
                let model = Gemma3::new(self.clone(), w, b.context, b.dtype, b.device)?;
                return Ok(Box::new(model.with_comm(comm)));
            }
            Origin::Gguf(path) => {
                let header = crate::inspect::gguf::read_header(path)
                    .map_err(|e| fail(ErrorKind::Integrity, format!("{e:#}")))?;
                let (kind, _) = gguf_plan(&header.tensors, Some(b.dtype), false)?;
                load_gguf(path, (kind, b.dtype), b.context, &cpu)?
            }
            Origin::Checkpoint(dir) => load_safetensors(dir, Some(b.dtype), b.context, &cpu)?,
        };
        Ok(Box::new(whole.sharded(comm, whole_embedding, b.device)?))
    }
}

/// Gemma 3's head width on the GPU: the paged-attention kernels take 64 and 128, and 256 (1B, 4B,
/// 12B) in bf16 only (`kernels::cuda_head_dim`); a build they would refuse at the first step is
/// refused here in one line, before the weights are read.
fn gpu_head_dim(cfg: &Gemma3Config, b: &Build) -> anyhow::Result<()> {
    let bf16 = b.dtype == DType::BF16;
    if !b.device.is_cuda() || crate::kernels::cuda_head_dim(cfg.head_dim, bf16) {
        return Ok(());
    }
    Err(fail(
        ErrorKind::InvalidInput,
        format!(
            "Gemma 3 with head_dim {} runs on the GPU in bf16 only, not {:?}: pass --dtype bf16, or --cpu",
            cfg.head_dim, b.dtype
        ),
    ))
}
