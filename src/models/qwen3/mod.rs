//! Qwen3 (dense: 0.6B to 32B): Llama's layers with q and k RMSNormed over each head before
//! RoPE, `head_dim` stated (q's width is not the hidden size on 0.6B, 4B and 32B), NeoX RoPE in
//! GGUF files too, and no BOS. The layers, loaders and memory plan are Llama's
//! (`models/llama/`), run in this family's [`config::VARIANT`]; this folder reads Qwen3's files.

pub mod arch;
pub mod config;

pub use config::VARIANT;
