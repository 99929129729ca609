//! inferno's own compute kernels, for what candle lacks: gpt-oss attention with sinks (sliding
//! window, grouped-query heads), the MXFP4 mixture of experts, and the pieces that let a decode
//! step run as a CUDA graph or in fewer launches.
//!
//! Each op is a candle `CustomOp` (or an in-place op): its `cpu_fwd` is the reference, plain Rust
//! loops in f32 that follow docs/gpt-oss.md §3–4 line by line (or, for the fused decode-step
//! ops, the candle ops they replace); its `cuda_fwd` launches the kernel in the `.cu` file beside
//! it. One folder per op, `src/kernels/OP/`: `mod.rs` (the op and its CPU reference), `gpu.rs`
//! (the launches), the `.cu` files and the headers only they include, `tests.rs`. Headers that
//! several ops share live in `include/` (`common.cuh`: conversions, warp reductions and scans,
//! the PDL wait; `mma.cuh`: tensor-core fragments and `cp.async`; `activation.cuh`: the SwiGLUs;
//! `gemv.cuh`, `argmax.cuh`). Beside the folders: `launch.rs` (the one way a kernel is
//! launched), `cuda.rs` (what the launches share), `float_dispatch!` (below: the f32/bf16
//! dispatch of the ops' storages) and [`mxfp4`].
//!
//! build.rs compiles every `.cu` under `src/kernels` to a fat binary (machine code for every
//! architecture of [`crate::gpu::targets`], by default each one from sm_80 to sm_120, and PTX for the newest)
//! and generates one constant per file, `cuda::fatbin::OP::NAME`; the fat binary is embedded in
//! the binary and its module loaded on first use, with no compilation by the driver on a GPU the
//! build targets. Where an instruction is missing on an older architecture, the kernel takes
//! another path under `__CUDA_ARCH__` with the same tests (`bf16x2_mul`, `mma_e4m3`, PDL). It
//! also checks every kernel's registers and shared memory (static, from ptxas, plus the largest
//! dynamic, [`shared_memory`]) against each target's limits.
//!
//! - [`mxfp4_moe()`]: the routed experts' clamped SwiGLU MLP straight off the packed weights
//!   (tensor-core GEMVs per slot for a few tokens, the same over tiles of an expert's slots for
//!   batched decode, tensor-core GEMMs batched by expert for prefill).
//! - [`mxfp4`]: FP4/E8M0 decoding for references and tests.
//! - [`kv_fp8`]: the 8-bit KV caches' codes (E4M3, INT8) and scales (`--kv-dtype fp8|int8`), for
//!   the references and tests.
//! - [`cpu_matmul`]: products on the CPU whose rows do not depend on the batch.
//! - [`matmul_f32_out()`], [`matmul_hi_lo()`]: the LM head's product with an f32 result
//!   (cuBLAS, or our tensor-core GEMV `gemv_bf16` for decode steps' few rows), from an f32
//!   input carried as two bf16 halves.
//! - [`mxfp4_moe_routed()`]: routing (top-k, softmax over k) fused into the experts' op.
//! - [`paged_attention()`]: attention of a varlen batch (continuous batching) over a paged KV
//!   pool through per-sequence block tables, with or without sinks.
//! - [`qkv_rope_paged()`]: a varlen batch's bias, RoPE (either pairing) and pool writes in one
//!   launch.
//! - [`embed_rows()`]: the token embedding's lookup in f32, or a tensor-parallel rank's rows of
//!   it.
//! - [`argmax_rows()`], [`sample_gumbel_rows()`]: the next token of every row of a batch.
//! - [`token_mask()`](token_mask::token_mask): output constraints' masks written into a step's
//!   logits from their bit words.
//! - [`sample_rows()`]: the next token of every row by the full sampler (penalties, top-k,
//!   top-p, min-p, seeded draw), as the host sampler filters; top-k first where every row has a
//!   small top-k.
//!
//! Tests: CPU references against independent naive formulations run everywhere; GPU-vs-CPU tests
//! are `#[ignore]`d (no GPU on the build machines) and run with
//! `cargo test --release --lib kernels -- --ignored` on a GPU, or from binaries built elsewhere
//! with `scripts/gpu-tests.sh`. Register and shared-memory use per kernel and target:
//! `$OUT_DIR/kernels/OP/NAME.usage` after a build (ptxas's report).

pub mod all_reduce;
pub mod argmax;
pub mod cpu_matmul;
pub mod embed_rows;
pub mod invariance;
pub mod kv_fp8;
pub mod layer_norm_act;
pub mod matmul_f32_out;
pub mod mxfp4;
pub mod mxfp4_ggml;
pub mod mxfp4_moe;
pub mod paged_attention;
pub mod qkv_rope_paged;
pub mod quant_matmul;
pub mod router_logits;
pub mod sample;
pub mod shared_memory;
pub mod swiglu_gemv;
pub mod token_mask;

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::device_address;
#[cfg(feature = "cuda")]
mod gemv_bf16;
#[cfg(feature = "cuda")]
pub(crate) mod launch;
#[cfg(test)]
mod testing;

pub use argmax::{
    argmax_rows, draw_of, draw_rows, draw_words, pick_candidates, sample_gumbel_rows,
    shard_candidates,
};
pub use embed_rows::embed_rows;
pub use layer_norm_act::{AddNorm, Normed, add_rms_norm, rms_norm, silu_mul_to};
pub use matmul_f32_out::{matmul_f32_out, matmul_hi_lo};
pub use mxfp4_moe::{Mxfp4Experts, SwiGlu, mxfp4_moe, mxfp4_moe_routed, route};
pub use paged_attention::{
    PagedAttnConfig, PagedBounds, PagedKernel, PagedLaunch, cuda_head_dim, paged_attention,
    paged_launch,
};
pub use qkv_rope_paged::{QkNorm, QkvHeads, RotaryPairs, qkv_rope_paged};
pub use quant_matmul::{quant_matmul, stack_quant, stack_rows};
pub use router_logits::router_logits;
pub use sample::{RowSampling, kept_mask, sample_rows};
pub use swiglu_gemv::matmul_swiglu_bf16;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, DType, Layout, Result, Tensor, bail};
use half::bf16;

/// `words` as a u32 tensor on `device`. On a GPU the copy goes through page-locked staging:
/// from pageable memory it would first wait for the stream to drain, which stalls a step
/// enqueued behind another (the pipelined decode's uploads).
pub fn upload_u32(words: &[u32], device: &candle_core::Device) -> Result<Tensor> {
    #[cfg(feature = "cuda")]
    if let candle_core::Device::Cuda(dev) = device {
        let slice = cuda::upload(dev, words)?;
        let len = slice.len();
        return cuda::tensor(slice, dev, &[len]).narrow(0, 0, words.len());
    }
    Tensor::new(words, device)
}

/// The ops' dtype dispatch, written once: `$body` for f32 data and again for bf16, each `$x`
/// bound to its storage's data (`$S`: `CpuStorage` or `CudaStorageSlice`, whose variants share
/// their names) and, with `|$T|`, `$T` the element type. The storages must be all f32 or all
/// bf16; anything else fails with `$err`.
macro_rules! float_dispatch {
    ($S:ident, $err:expr, ($($s:expr => $x:ident),+ $(,)?), |$T:ident| $body:expr) => {{
        #[allow(unused_parens)]
        match ($($s),+) {
            ($($S::F32($x)),+) => {
                type $T = f32;
                $body
            }
            ($($S::BF16($x)),+) => {
                type $T = half::bf16;
                $body
            }
            _ => candle_core::bail!($err),
        }
    }};
    ($S:ident, $err:expr, ($($s:expr => $x:ident),+ $(,)?), $body:expr) => {{
        #[allow(unused_parens)]
        match ($($s),+) {
            ($($S::F32($x)),+) => $body,
            ($($S::BF16($x)),+) => $body,
            _ => candle_core::bail!($err),
        }
    }};
}
pub(crate) use float_dispatch;

/// An f32 or bf16 CPU buffer, read as f32.
#[derive(Clone, Copy)]
enum F32Reader<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
}

impl<'a> F32Reader<'a> {
    fn new(storage: &'a CpuStorage, what: &str) -> Result<Self> {
        match storage {
            CpuStorage::F32(v) => Ok(Self::F32(v)),
            CpuStorage::BF16(v) => Ok(Self::Bf16(v)),
            other => bail!("{what}: expected f32 or bf16, got {:?}", other.dtype()),
        }
    }

    fn get(self, i: usize) -> f32 {
        match self {
            Self::F32(v) => v[i],
            Self::Bf16(v) => v[i].to_f32(),
        }
    }

    /// `Σ x[c] · self[at + c]`, summed in order (the reference's bits do not depend on how it
    /// is computed; the dtype is matched once per call, not per element).
    fn dot(self, at: usize, x: &[f32]) -> f32 {
        let n = x.len();
        match self {
            Self::F32(v) => x.iter().zip(&v[at..at + n]).map(|(a, b)| a * b).sum(),
            Self::Bf16(v) => x.iter().zip(&v[at..at + n]).map(|(a, b)| a * b.to_f32()).sum(),
        }
    }

    /// `out[c] += w · self[at + c]`.
    fn add_scaled(self, at: usize, w: f32, out: &mut [f32]) {
        let n = out.len();
        match self {
            Self::F32(v) => out.iter_mut().zip(&v[at..at + n]).for_each(|(o, x)| *o += w * x),
            Self::Bf16(v) => {
                out.iter_mut().zip(&v[at..at + n]).for_each(|(o, x)| *o += w * x.to_f32())
            }
        }
    }
}

/// A CPU output buffer in `dtype` (f32 or bf16) from f32 values.
fn cpu_output(values: Vec<f32>, dtype: DType) -> Result<CpuStorage> {
    match dtype {
        DType::F32 => Ok(CpuStorage::F32(values)),
        DType::BF16 => Ok(CpuStorage::BF16(values.into_iter().map(bf16::from_f32).collect())),
        other => bail!("unsupported output dtype {other:?}"),
    }
}

/// The `u8` CPU data of a contiguous tensor.
fn cpu_u8<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [u8]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::U8(v), Some((a, b))) => Ok(&v[a..b]),
        _ => bail!("{what}: expected a contiguous u8 tensor"),
    }
}

/// The `f32` CPU data of a contiguous tensor.
fn cpu_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    match (s, l.contiguous_offsets()) {
        (CpuStorage::F32(v), Some((a, b))) => Ok(&v[a..b]),
        _ => bail!("{what}: expected a contiguous f32 tensor"),
    }
}
