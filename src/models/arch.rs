//! What an architecture answers for loading, so that `load` holds no arm per architecture: each
//! folder under `models/` implements these two traits and takes one line in [`super::registry`].
//!
//! - [`Architecture`] (one static value per folder) recognises its models (`config.json`
//!   `model_type`, GGUF `general.architecture`) and reads one: its config, its compute dtype and
//!   the bytes its weights will take, from the files' headers.
//! - [`ArchConfig`] (the config it read) answers everything after: the terms of the memory plan,
//!   a tensor-parallel rank's slice, the weight format banners name, and building the model from
//!   a checkpoint, a GGUF file or random weights, whole or as one rank's slice.
//!
//! The chat format is not an architecture's: it comes with the tokenizer (harmony's control
//! tokens, a Hugging Face or GGUF chat template), and a file of one architecture may speak
//! another's format (a Mistral GGUF is `llama`).

use std::fmt::Debug;
use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};

use super::batch::{BatchModel, KvShape};
use super::memory::FileTensors;
use crate::dist::{Collective, Shard};
use crate::inspect::gguf::Header;

/// One architecture: how its models are recognised and read.
pub trait Architecture: Sync {
    /// The `config.json` `model_type`s it reads (`llama`, `mistral`).
    fn model_types(&self) -> &'static [&'static str];

    /// The GGUF `general.architecture` values it reads.
    fn gguf_architectures(&self) -> &'static [&'static str];

    /// A model from its `config.json` text: `file` holds the checkpoint's tensors (`None`: random
    /// weights in the checkpoint's layout), `dtype` is `--dtype`.
    fn read_hf(
        &self,
        config: &str,
        file: Option<&FileTensors>,
        dtype: Option<DType>,
    ) -> anyhow::Result<Reading>;

    /// A model from a GGUF file whose `header` our reader has checked; `on_gpu`: its weights go
    /// to a GPU (some layouts differ there).
    fn read_gguf(
        &self,
        path: &Path,
        header: &Header,
        dtype: Option<DType>,
        on_gpu: bool,
    ) -> anyhow::Result<Reading>;
}

/// What an [`Architecture`] read of one model, before anything is allocated.
pub struct Reading {
    pub config: Arc<dyn ArchConfig>,
    /// The compute dtype.
    pub dtype: DType,
    /// Bytes the weights take once loaded.
    pub weights: u64,
}

/// Where the weights come from, as a loader reads them.
#[derive(Debug, Clone, Copy)]
pub enum Origin<'a> {
    /// A folder with `config.json` and safetensors.
    Checkpoint(&'a Path),
    /// A GGUF file.
    Gguf(&'a Path),
    /// Random weights in the checkpoint's shapes (`--dummy-weights`).
    Random,
}

/// What to build: the weights' origin, the compute dtype, the context (RoPE tables) and the
/// device.
#[derive(Clone, Copy)]
pub struct Build<'a> {
    pub origin: Origin<'a>,
    pub dtype: DType,
    pub context: usize,
    pub device: &'a Device,
}

/// One model's config, as its architecture read it.
pub trait ArchConfig: Debug + Send + Sync {
    /// Positions the model was trained for.
    fn max_context(&self) -> usize;

    /// Rows of the embedding and the LM head.
    fn vocab_size(&self) -> usize;

    fn hidden_size(&self) -> usize;

    /// The LM head is the embedding's table.
    fn tied_embeddings(&self) -> bool;

    /// The weight format banners name for a checkpoint or random weights in its layout
    /// (`mxfp4`, a compressed-tensors scheme); `None`: plain floats.
    fn weight_format(&self) -> Option<&'static str>;

    /// Bytes of random weights in the checkpoint's layout, computing in `dtype`.
    fn weight_bytes(&self, dtype: DType) -> u64;

    /// The KV pool's layout, its values in `dtype`.
    fn kv_shape(&self, dtype: DType) -> KvShape;

    /// Bytes of the RoPE tables for `context` positions.
    fn rope_table_bytes(&self, context: usize) -> u64;

    /// Peak bytes of a step's intermediates: a chunk of `chunk` tokens at `context`, computing
    /// in `dtype`.
    fn workspace_bytes(&self, context: usize, chunk: usize, dtype: DType) -> u64;

    /// The config of rank `shard`'s slice of a tensor-parallel model (the vocabulary stays
    /// whole: the logits are gathered).
    fn for_rank(&self, shard: Shard) -> anyhow::Result<Arc<dyn ArchConfig>>;

    /// Builds the model this config describes.
    fn build(&self, b: &Build) -> anyhow::Result<Box<dyn BatchModel>>;

    /// Builds rank `comm.shard()`'s slice, this config being the rank's own ([`Self::for_rank`]):
    /// random weights made in the slice's shapes, or the checkpoint read whole on the host and
    /// sliced; the whole embedding table too with `whole_embedding`.
    fn build_rank(
        &self,
        b: &Build,
        comm: Arc<dyn Collective>,
        whole_embedding: bool,
    ) -> anyhow::Result<Box<dyn BatchModel>>;
}
