//! The Llama family as the registry sees it ([`crate::models::arch`]): HF configs of `llama`
//! and `mistral` (with its sliding window), `llama` GGUF files. The [`ArchConfig`] here serves
//! every family on Llama's layers (their [`Variant`]s), which read their files with
//! [`read_hf_as`] and [`read_gguf_as`].

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::config::{LlamaConfig, Variant};
use super::load::{GgufFile, choose_dtype, load_checkpoint, load_gguf_as, read_config};
use super::model::{Llama, RopeStyle, Weights};
use super::{dummy, memory, shard};
use crate::dist::{Collective, Shard};
use crate::inspect::gguf::Header;
use crate::models::arch::{ArchConfig, Architecture, Build, Origin, Reading};
use crate::models::batch::{BatchModel, KvShape};
use crate::models::embedding::shard_ends;
use crate::models::memory::FileTensors;

/// The registry's entry.
pub struct LlamaFamily;

impl Architecture for LlamaFamily {
    fn model_types(&self) -> &'static [&'static str] {
        &["llama", "mistral"]
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["llama"]
    }

    fn read_hf(
        &self,
        config: &str,
        file: Option<&FileTensors>,
        dtype: Option<DType>,
    ) -> anyhow::Result<Reading> {
        read_hf_as(Variant::LLAMA, config, file, dtype)
    }

    fn read_gguf(
        &self,
        path: &Path,
        header: &Header,
        _dtype: Option<DType>,
        on_gpu: bool,
    ) -> anyhow::Result<Reading> {
        read_gguf_as(Variant::LLAMA, path, header, on_gpu)
    }
}

/// [`Architecture::read_hf`] for a family on Llama's layers.
pub fn read_hf_as(
    variant: Variant,
    config: &str,
    file: Option<&FileTensors>,
    dtype: Option<DType>,
) -> anyhow::Result<Reading> {
    let cfg = (variant.read_hf)(config)?;
    let dtype = choose_dtype(dtype, &cfg);
    let weights = memory::weight_bytes(&cfg, dtype, file);
    Ok(Reading { config: Arc::new(cfg), dtype, weights })
}

/// [`Architecture::read_gguf`] for a family on Llama's layers: the tensor infos give the
/// weights' bytes. GGUF models compute in f32 whatever was asked (quantized kernels take f32).
pub fn read_gguf_as(
    variant: Variant,
    path: &Path,
    header: &Header,
    on_gpu: bool,
) -> anyhow::Result<Reading> {
    let cfg = GgufFile::open(path)?.config_as(variant)?;
    let weights = memory::gguf_weight_bytes(&cfg, &header.tensors, on_gpu);
    Ok(Reading { config: Arc::new(cfg), dtype: DType::F32, weights })
}

impl ArchConfig for LlamaConfig {
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
        self.quant.as_ref().map(|q| q.label())
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
        Ok(Box::new(match b.origin {
            Origin::Random => random(self, b, Ok)?,
            _ => load_whole(self, b, b.device)?,
        }))
    }

    fn build_rank(
        &self,
        b: &Build,
        comm: Arc<dyn Collective>,
        whole_embedding: bool,
    ) -> anyhow::Result<Box<dyn BatchModel>> {
        let cpu = Device::Cpu;
        let whole = match b.origin {
            Origin::Random => {
                let shard = comm.shard();
                let model = random(self, b, |mut w| {
                    (w.embed, w.head) =
                        shard_ends(&w.embed, &w.head, shard, whole_embedding, b.device)?;
                    Ok(w)
                })?;
                return Ok(Box::new(model.with_comm(comm)));
            }
            _ => load_whole(self, b, &cpu)?,
        };
        Ok(Box::new(whole.sharded(comm, whole_embedding, b.device)?))
    }
}

/// The whole model of `b`'s checkpoint or GGUF file on `device`, its config read again by
/// `cfg`'s family (`cfg` may be a rank's slice of it).
fn load_whole(cfg: &LlamaConfig, b: &Build, device: &Device) -> anyhow::Result<Llama> {
    let variant = cfg.variant;
    match b.origin {
        Origin::Gguf(path) => {
            let mut gguf = GgufFile::open(path)?;
            let whole = gguf.config_as(variant)?;
            load_gguf_as(&mut gguf, whole, b.context, device)
        }
        Origin::Checkpoint(dir) => {
            load_checkpoint(dir, read_config(dir, variant)?, Some(b.dtype), b.context, device)
        }
        Origin::Random => random(cfg, b, Ok),
    }
}

/// Random weights of `cfg` on the device, passed through `edit` (a rank's slice of the ends).
fn random(
    cfg: &LlamaConfig,
    b: &Build,
    edit: impl FnOnce(Weights) -> anyhow::Result<Weights>,
) -> anyhow::Result<Llama> {
    let w = edit(dummy::random_weights(cfg, b.dtype, b.device)?)?;
    Llama::new(cfg.clone(), w, RopeStyle::HalfSplit, b.context, b.dtype, b.device)
}
