//! OpenAI gpt-oss (20b, 120b): MoE transformer with MXFP4 experts, attention sinks, alternating
//! sliding-window and full attention, YaRN RoPE. See docs/gpt-oss.md.

pub mod arch;
mod batched;
pub mod config;
pub mod dummy;
pub mod gguf;
pub mod load;
pub mod memory;
pub mod model;
pub mod shard;

pub use config::GptOssConfig;
pub use model::GptOss;
