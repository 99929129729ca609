//! gpt-oss as the registry sees it ([`crate::models::arch`]): HF configs of `gpt_oss` and
//! `gpt-oss` GGUF files, both loaded into the HF layout's tensors.

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::config::GptOssConfig;
use super::model::{GptOss, Weights};
use super::{dummy, gguf, load, memory, shard};
use crate::dist::{Collective, Shard};
use crate::error::{ErrorKind, fail};
use crate::inspect::gguf::Header;
use crate::models::arch::{ArchConfig, Architecture, Build, Origin, Reading};
use crate::models::batch::{BatchModel, KvShape};
use crate::models::embedding::shard_ends;
use crate::models::gguf::GgufTensors;
use crate::models::memory::FileTensors;

/// The registry's entry.
pub struct GptOssFamily;

impl Architecture for GptOssFamily {
    fn model_types(&self) -> &'static [&'static str] {
        &["gpt_oss"]
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &[gguf::ARCH]
    }

    fn read_hf(
        &self,
        config: &str,
        file: Option<&FileTensors>,
        dtype: Option<DType>,
    ) -> anyhow::Result<Reading> {
        let cfg = GptOssConfig::from_hf_json(config)?;
        let dtype = compute_dtype(dtype)?;
        let weights = memory::weight_bytes(&cfg, dtype, file);
        Ok(Reading { config: Arc::new(cfg), dtype, weights })
    }

    /// Loaded into the same tensors as the HF checkpoint (the experts repacked, Q8_0
    /// dequantized to the compute dtype), so the HF layout's byte count applies.
    fn read_gguf(
        &self,
        path: &Path,
        _header: &Header,
        dtype: Option<DType>,
        _on_gpu: bool,
    ) -> anyhow::Result<Reading> {
        let cfg = gguf::config(&GgufTensors::open(path)?)?;
        let dtype = compute_dtype(dtype)?;
        let weights = memory::weight_bytes(&cfg, dtype, None);
        Ok(Reading { config: Arc::new(cfg), dtype, weights })
    }
}

/// gpt-oss's compute dtype: bf16 unless asked; f16 is refused, it overflows gpt-oss's residual
/// stream (docs/gpt-oss.md pitfall #7).
fn compute_dtype(requested: Option<DType>) -> anyhow::Result<DType> {
    let dtype = requested.unwrap_or(DType::BF16);
    if dtype == DType::F16 {
        return Err(fail(
            ErrorKind::InvalidInput,
            "gpt-oss does not run in f16 (its activations overflow it): use bf16 or f32",
        ));
    }
    Ok(dtype)
}

impl ArchConfig for GptOssConfig {
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
        Some("mxfp4")
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
            Origin::Gguf(path) => gguf::load(path, b.dtype, b.context, b.device)?,
            Origin::Checkpoint(dir) => load::load(dir, b.dtype, b.context, b.device)?,
            Origin::Random => random(self, b, Ok)?,
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
            Origin::Gguf(path) => gguf::load(path, b.dtype, b.context, &cpu)?,
            Origin::Checkpoint(dir) => load::load(dir, b.dtype, b.context, &cpu)?,
        };
        Ok(Box::new(whole.sharded(comm, whole_embedding, b.device)?))
    }
}

/// Random weights of `cfg` on the device, passed through `edit` (a rank's slice of the ends).
fn random(
    cfg: &GptOssConfig,
    b: &Build,
    edit: impl FnOnce(Weights) -> anyhow::Result<Weights>,
) -> anyhow::Result<GptOss> {
    let w = edit(dummy::random_weights(cfg, b.dtype, b.device)?)?;
    GptOss::new(cfg.clone(), w, b.context, b.dtype, b.device)
}
