//! Which steps give a row the same bits as a one-row step: the kernels pick their arithmetic by
//! how many rows a launch has, and only up to a size do all of them compute a row alone.
//!
//! On a GPU: the bf16 GEMV (`gemv_bf16`) sums each row in one order for up to 16 rows, past which
//! cuBLAS takes some products and picks its reduction by the row count; the LM head sends a row
//! as two (bf16 hi + lo), so a step keeps it on the GEMV up to 8 rows; the quantized GEMVs run
//! up to [`GEMV_ROWS`](super::quant_matmul::GEMV_ROWS) rows; the MXFP4 MoE gives a token the
//! same bits in any batch below 128 tokens (its per-slot kernels and their slot tiles), and its
//! grouped GEMMs for more sum in another order. Attention, norms, RoPE and the router compute each row
//! alike at any size (docs/gpt-oss.md §4.4.1). f32 products go to cuBLAS at any size. On the CPU
//! every product computes a row alone.
//!
//! Speculative decoding keeps its verify steps within this (`engine/core/speculate.rs`): a step
//! that verifies drafts then computes each row as the one-token steps it replaces would.

use candle_core::{DType, Device};

/// Rows a step on `device` in `dtype` may hold with every row computed as alone; `moe`: the
/// model has MXFP4 experts.
pub fn invariant_rows(device: &Device, dtype: DType, moe: bool) -> usize {
    if !device.is_cuda() {
        return usize::MAX;
    }
    if dtype == DType::F32 {
        return 1;
    }
    // The LM head's hi + lo rows within the GEMV's 16, and the quantized GEMVs'.
    let dense = (16 / 2).min(super::quant_matmul::GEMV_ROWS);
    if moe { dense.min(moe_slot_tokens()) } else { dense }
}

/// Tokens a verify step may give the MoE: below its grouped GEMMs, its per-slot kernels and
/// their slot tiles give a token its alone bits (`gpu_slot_tokens_alone_equal_tokens_in_a_batch`).
fn moe_slot_tokens() -> usize {
    #[cfg(feature = "cuda")]
    return super::mxfp4_moe::GROUPED_MIN_TOKENS - 1;
    #[cfg(not(feature = "cuda"))]
    usize::MAX
}
