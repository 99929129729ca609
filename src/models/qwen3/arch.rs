//! Qwen3 as the registry sees it ([`crate::models::arch`]): HF configs of `qwen3`, `qwen3` GGUF
//! files; built as Llama's layers in [`VARIANT`].

use std::path::Path;

use candle_core::DType;

use super::VARIANT;
use crate::inspect::gguf::Header;
use crate::models::arch::{Architecture, Reading};
use crate::models::llama::arch::{read_gguf_as, read_hf_as};
use crate::models::memory::FileTensors;

/// The registry's entry.
pub struct Qwen3Family;

impl Architecture for Qwen3Family {
    fn model_types(&self) -> &'static [&'static str] {
        &["qwen3"]
    }

    fn gguf_architectures(&self) -> &'static [&'static str] {
        &["qwen3"]
    }

    fn read_hf(
        &self,
        config: &str,
        file: Option<&FileTensors>,
        dtype: Option<DType>,
    ) -> anyhow::Result<Reading> {
        read_hf_as(VARIANT, config, file, dtype)
    }

    fn read_gguf(
        &self,
        path: &Path,
        header: &Header,
        _dtype: Option<DType>,
        on_gpu: bool,
    ) -> anyhow::Result<Reading> {
        read_gguf_as(VARIANT, path, header, on_gpu)
    }
}
