//! Which steps give a row the same bits as a one-row step: the kernels pick their arithmetic by
//! how many rows a launch has, and only up to a size do all of them compute a row alone.
//!
//! On a GPU, with batch invariance on ([`on`]: by default in steps that verify drafts, in every
//! step with `INFERNO_BATCH_INVARIANT=1`): bf16 products of up to [`INVARIANT_ROWS`] rows take
//! our tensor-core kernels (`gemv_bf16`: the GEMV and its rows kernel, the same sums in the same
//! order for a row whatever the row count), past which cuBLAS picks its reduction by the row
//! count (with it off, from 17 rows where cuBLAS is faster); the LM head sends a row as two
//! (bf16 hi + lo), so a step keeps its rows within half of that; the quantized GEMVs run up to
//! [`GEMV_ROWS`](super::quant_matmul::GEMV_ROWS) rows; the MXFP4 MoE gives a token the same
//! bits in any batch below 128 tokens (its per-slot kernels and their slot tiles), and its
//! grouped GEMMs for more sum in another order. Attention, norms, RoPE and
//! the router compute each row alike at any size (docs/gpt-oss.md §4.4.1). f32 products go to
//! cuBLAS at any size. On the CPU every product computes a row alone (dense and GGUF float
//! weights through `cpu_matmul`, since candle's CPU matmul does not; block formats through
//! candle's per-row dot products).
//!
//! Speculative decoding keeps its verify steps within this (`engine/spec/speculator/propose.rs`):
//! a step that verifies drafts then computes each row as the one-token steps it replaces would.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::{DType, Device};

/// Rows a verify step on `device` in `dtype` may hold with every row computed as alone; `moe`:
/// the model has MXFP4 experts; `dense_bf16`: every other product's weight is dense bf16 (none
/// quantized).
pub fn invariant_rows(device: &Device, dtype: DType, moe: bool, dense_bf16: bool) -> usize {
    if !device.is_cuda() {
        return usize::MAX;
    }
    if dtype == DType::F32 {
        return 1;
    }
    // The LM head's hi + lo rows within our bf16 kernels', or the quantized GEMVs'.
    let dense = if dense_bf16 && (crate::switches::batch_invariant() != Some(false)) {
        INVARIANT_ROWS / 2
    } else {
        (16 / 2).min(super::quant_matmul::GEMV_ROWS)
    };
    if moe { dense.min(moe_slot_tokens()) } else { dense }
}

/// Set by [`require`]: every later step of the process batch invariant, as
/// `INFERNO_BATCH_INVARIANT=1` makes it.
static REQUIRED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Whether the step this thread runs verifies drafts ([`Step`]).
    static VERIFYING: Cell<bool> = const { Cell::new(false) };
}

/// Every later step of the process batch invariant, whatever `INFERNO_BATCH_INVARIANT` says
/// (tests that compare whole batches with rows alone).
pub fn require() {
    REQUIRED.store(true, Ordering::Relaxed);
}

/// While alive, this thread's products are those of a step that verifies drafts (or not).
pub struct Step {
    before: bool,
}

impl Step {
    pub fn new(verifying: bool) -> Step {
        Step { before: VERIFYING.replace(verifying) }
    }
}

impl Drop for Step {
    fn drop(&mut self) {
        VERIFYING.set(self.before);
    }
}

/// Whether bf16 products of up to `INVARIANT_ROWS` rows take our kernels now: always with
/// `INFERNO_BATCH_INVARIANT=1` or after [`require`], else never with 0, and by default (auto)
/// in steps that verify drafts, whose rows must get the bits one-row steps give them. Other steps of up
/// to 16 rows take our GEMV anyway; larger ones take cuBLAS where it is faster (up to 45% of a
/// 64-stream step, docs/performance.md).
pub fn on() -> bool {
    REQUIRED.load(Ordering::Relaxed)
        || crate::switches::batch_invariant().unwrap_or_else(|| VERIFYING.get())
}

/// Rows up to which bf16 products take our kernels (`gemv_bf16::INVARIANT_ROWS`).
#[cfg(feature = "cuda")]
const INVARIANT_ROWS: usize = super::gemv_bf16::INVARIANT_ROWS;
#[cfg(not(feature = "cuda"))]
const INVARIANT_ROWS: usize = usize::MAX;

/// Tokens a verify step may give the MoE: below its grouped GEMMs, its per-slot kernels and
/// their slot tiles give a token its alone bits (`gpu_slot_tokens_alone_equal_tokens_in_a_batch`).
fn moe_slot_tokens() -> usize {
    #[cfg(feature = "cuda")]
    return super::mxfp4_moe::GROUPED_MIN_TOKENS - 1;
    #[cfg(not(feature = "cuda"))]
    usize::MAX
}
