//! Llama-family models (Llama 2/3.x, TinyLlama, SmolLM2, Mistral with its sliding window), from
//! HF safetensors or llama-architecture GGUF files. Qwen3 (`models/qwen3/`) runs these layers
//! in its own [`config::Variant`].

pub mod arch;
mod batched;
pub mod config;
pub mod convert;
pub mod dummy;
mod fuse;
pub mod load;
pub mod memory;
pub mod model;
pub mod shard;

pub use config::LlamaConfig;
pub use model::Llama;
