//! Transformer models. Each architecture lives in its own folder with a serde config that mirrors
//! the checkpoint's `config.json`, loaders for the weight formats it accepts, and the batched
//! forward pass the engine runs ([`batch::BatchModel`]: keys and values in the engine's paged
//! pool); it answers loading through [`arch`]'s traits and takes one line in [`registry`]. The
//! files beside the folders are what architectures share. Generation (sampling, detokenising)
//! lives outside, in `generate`.

pub mod arch;
pub mod batch;
pub mod checkpoint;
pub mod eagle3;
pub mod embedding;
pub mod gemma3;
pub mod gguf;
pub mod gpt_oss;
pub mod head;
pub mod linear;
pub mod llama;
pub mod memory;
pub mod qwen3;
pub mod random;
pub mod registry;
pub mod rope;
pub mod step_cost;
