//! inferno: run open-weight LLMs on NVIDIA GPUs from one binary.
//!
//! Layers, bottom up; a module imports only from modules before it in this order (the unit
//! test `layers_tests` checks it): [`error`], [`util`], [`switches`] (and the tests' assets)
//! under everything; [`gpu`], [`hub`], [`quant`], [`template`], [`generate`], then [`inspect`]
//! and [`tokenizer`]: devices, the cache, and the formats and host-side logic that run no model;
//! [`kernels`]; [`dist`] (tensor parallelism's shards and collectives); [`models`]; [`engine`], which batches a built model and knows no names or
//! files; [`load`], from a name to a model inside an engine (its memory plan counts the
//! engine's pool); then the front ends [`chat`], [`cli`], [`serve`], [`commands`]. A type two
//! layers share lives in the lower one, never behind a re-export.
//!
//! The crate is laid out by concern; `main.rs` only parses the command line and hands each
//! subcommand to its module under [`commands`].
//!
//! - [`hub`]: the Hugging Face cache and the Hub download protocol.
//! - [`inspect`]: what a cached or local model is (architecture, weight format, context) without
//!   loading its weights.
//! - [`gpu`]: choosing the CUDA device; never a silent CPU fallback.
//! - [`quant`]: quantized weights as data (compressed-tensors, GGUF blocks) and their CPU
//!   reference.
//! - [`kernels`]: our own CUDA kernels (gpt-oss attention with sinks, MXFP4 experts), each with a CPU reference.
//! - [`dist`]: tensor parallelism below the models: which slice a rank holds, and the
//!   collectives (NCCL, or threads on the CPU) that combine the slices.
//! - [`models`]: transformer architectures, a folder each (listed in `models::registry`): their
//!   weight loaders, memory formulas and batched forward passes.
//! - [`engine`]: the batching engine: one thread running every generation over a paged KV pool.
//! - [`load`]: from a model name to a loaded model and its tokenizer on a device.
//! - [`generate`]: model-independent generation: sampling, stop conditions, streaming detokeniser.
//! - [`template`]: Hugging Face chat templates, rendered as transformers renders them.
//! - [`chat`]: turning a conversation into a prompt and a reply into events (harmony, turns).
//! - [`tokenizer`]: tokenizers rebuilt from GGUF metadata.
//! - [`serve`]: the OpenAI-compatible HTTP server (`inferno serve`) over the engine.
//! - [`commands`]: one module per subcommand.
//! - [`switches`]: every `INFERNO_*` environment variable the binary reads.

pub mod chat;
pub mod cli;
pub mod commands;
pub mod dist;
pub mod engine;
pub mod error;
pub mod generate;
pub mod gpu;
pub mod hub;
pub mod inspect;
pub mod kernels;
#[cfg(test)]
mod layers_tests;
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
