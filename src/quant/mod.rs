//! Quantized checkpoints in the compressed-tensors format (RedHatAI / neuralmagic, what vLLM
//! and SGLang users hold): W8A8 int8 (`int-quantized`), FP8 E4M3 with dynamic per-token
//! activations (`float-quantized`) and W4A16 (`pack-quantized`), for Llama-family models.
//!
//! - [`config`]: the `quantization_config`, which projections it covers and how.
//! - [`numerics`]: FP8 coding, per-token activation fake-quantization, 4-bit unpacking (the
//!   CPU reference).
//! - [`linear`]: one quantized projection, loaded from the checkpoint, and the CPU reference
//!   of its product.
//! - [`gguf_q8`], [`gguf_k`]: GGUF's Q8_0, Q4_K and Q6_K weights in this form (llama.cpp files
//!   on our GEMVs).
//!
//! These are the weights as data, below both the kernels that multiply them
//! (`kernels::quant_matmul`, which also stacks them for the fused products) and the models
//! that hold them; `inspect` reads the same `quantization_config` to describe a checkpoint.

pub mod config;
pub mod gguf_k;
pub mod gguf_q8;
pub mod linear;
pub mod numerics;

pub use config::{ActQuant, CtConfig, Scheme, WeightFormat};
pub use linear::QuantLinear;
