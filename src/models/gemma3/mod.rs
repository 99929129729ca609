//! Gemma 3 text models (gemma-3-1b, and the language model of gemma-3-4b/12b/27b), from HF
//! safetensors or `gemma3` GGUF files: (1 + w) RMSNorms, four a layer; the embedding scaled by
//! √hidden; GeGLU (tanh); q/k RMSNorm before RoPE; scores scaled by
//! `query_pre_attn_scalar^-0.5`; five sliding-window layers (local RoPE base) for each global
//! one (global base, linear scaling on 4B+); the LM head tied to the embedding.

pub mod arch;
mod batched;
pub mod config;
pub mod dummy;
pub mod load;
pub mod memory;
pub mod model;
pub mod shard;

pub use config::Gemma3Config;
pub use model::Gemma3;
