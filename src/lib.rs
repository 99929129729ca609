//! inferno: run open-weight LLMs on NVIDIA GPUs from one binary.
//!
//! The crate is laid out by concern; `main.rs` only parses the command line and hands each
//! subcommand to its module under [`commands`].
//!
//! - [`hub`]: the Hugging Face cache and the Hub download protocol.
//! - [`inspect`]: what a cached or local model is (architecture, weight format, context) without
//!   loading its weights.
//! - [`gpu`]: choosing the CUDA device; never a silent CPU fallback.
//! - [`models`]: transformer architectures, their weight loaders and KV caches.
//! - [`engine`]: from a model name to a loaded model and its tokenizer on a device.
//! - [`generate`]: model-independent generation: sampling, stop conditions, streaming detokeniser.
//! - [`chat`]: turning a conversation into a prompt (Hugging Face chat templates).
//! - [`tokenizer`]: tokenizers rebuilt from GGUF metadata.
//! - [`kernels`]: our own CUDA kernels (gpt-oss attention with sinks, MXFP4 experts), each with a CPU reference.
//! - [`serve`]: the OpenAI-compatible HTTP server (`inferno serve`) over the engine.
//! - [`commands`]: one module per subcommand.
//! - [`switches`]: every `INFERNO_*` environment variable the binary reads.

pub mod chat;
pub mod cli;
pub mod commands;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod hub;
pub mod inspect;
pub mod kernels;
pub mod load;
pub mod models;
pub mod quant;
pub mod serve;
pub mod switches;
pub mod template;
#[cfg(test)]
pub mod test_assets;
pub mod tokenizer;
pub mod util;
