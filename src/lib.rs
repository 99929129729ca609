//! inferno: run open-weight LLMs on NVIDIA GPUs from one binary.
//!
//! The crate is laid out by concern; `main.rs` only parses the command line and hands each
//! subcommand to its module under [`commands`].
//!
//! - [`hub`]: the Hugging Face cache and the Hub download protocol.
//! - [`inspect`]: what a cached or local model is (architecture, weight format, context) without
//!   loading its weights.
//! - [`gpu`]: choosing the CUDA device; never a silent CPU fallback.
//! - [`tokenizer`]: tokenizers rebuilt from GGUF metadata.
//! - [`commands`]: one module per subcommand.

pub mod cli;
pub mod commands;
pub mod error;
pub mod gpu;
pub mod hub;
pub mod inspect;
pub mod tokenizer;
pub mod util;
