//! The sum a tensor-parallel model takes of its ranks' partial products (o_proj's, the MLP's),
//! through the GPUs' peer memory in one launch ([`all_reduce.cu`](all_reduce.cu)).
//!
//! The same sum through NCCL is an all-gather, then additions in rank order
//! (`dist::collective::all_reduce_sum`): four launches and NCCL's protocol, 10–20 µs at a
//! decode step's few KiB, 72 times a gpt-oss-120b step. Here each rank pushes its piece into
//! every other rank's buffer and adds the pieces in rank order once they are there: one launch,
//! captured in the decode graphs like any kernel. A decode step's vectors (up to [`LL_FLOATS`])
//! travel as lines that carry their flag in the data, as NCCL's LL protocol does, so a piece is
//! usable as soon as it lands (one crossing of the link); longer ones as plain floats, then a
//! fence and a flag per block (half the bytes, two crossings). The additions are the same f32
//! additions in the same order as the all-gather's, so every path gives the same bits (the
//! fallback for vectors past a slot's size changes nothing), every rank holds the same bits, and
//! a row's sum does not depend on the batch. vLLM's and TensorRT-LLM's custom all-reduces work
//! the same way (one-shot over IPC buffers); this one keeps rank order where they may add in
//! another.
//!
//! Each rank's buffer (one allocation, shared with the other ranks as a CUDA IPC handle by
//! `dist::p2p`): a header of flags (`[MAX_BLOCKS][MAX_RANKS]` u32, raised by the ranks) and call
//! counts (`[MAX_BLOCKS]` u32, its own); at [`DATA_OFFSET`] two slots of `world` regions of
//! `region` floats each; then two LL slots of `world` regions of [`LL_FLOATS`] floats as lines
//! (16 bytes: value, call, value, call). Calls alternate between the slots; region `r` holds rank
//! `r`'s piece.

#[cfg(feature = "cuda")]
mod gpu;
#[cfg(test)]
mod tests;

#[cfg(feature = "cuda")]
pub use gpu::{Peers, all_gather_b32, all_reduce_add_rms_norm, all_reduce_f32, broadcast_b32};

/// Ranks a buffer has flags for (`AR_MAX_RANKS` in all_reduce.cu).
pub const MAX_RANKS: usize = 8;
/// Blocks of a launch (each owns one chunk of the vector on every rank), but for the fused sum
/// and norm's, which takes one a row from here up to [`MAX_BLOCKS`] ([`fused_blocks`]).
pub const BLOCKS: usize = 24;
/// Blocks the header keeps a flag and a count for (`AR_MAX_BLOCKS`): the largest grid.
pub const MAX_BLOCKS: usize = 128;
/// Threads of a block (`AR_THREADS`).
pub const THREADS: usize = 512;
/// Where the slots start in a buffer (`AR_DATA_OFFSET`), past the header.
pub const DATA_OFFSET: usize = 8192;
/// The longest vector that travels in LL lines (`AR_LL_FLOATS`): 22 rows of gpt-oss's 2,880.
/// Past it the lines' doubled bytes cost more than the fence and flags they spare: at 64 rows of
/// 2,880, gpt-oss-120b over two H200 decoded 0.9% slower with lines up to 192 Ki floats.
pub const LL_FLOATS: usize = 64 * 1024;
/// Bytes of one LL line: two (value, call) pairs.
pub const LL_LINE: usize = 16;

const _: () = assert!((MAX_BLOCKS * MAX_RANKS + MAX_BLOCKS) * 4 <= DATA_OFFSET);

/// The fused sum and norm's grid for `rows` rows: a block a row, at least [`BLOCKS`] (a row's
/// pieces still go out over that many) and at most [`MAX_BLOCKS`].
pub fn fused_blocks(rows: usize) -> usize {
    rows.clamp(BLOCKS, MAX_BLOCKS)
}

/// The bytes of a buffer whose regions hold `region` floats each, for `world` ranks.
pub fn buffer_bytes(world: usize, region: usize) -> usize {
    ll_offset(2, world, 0, region)
}

/// Where the flag rank `rank` raises for block `block` sits in a buffer, in bytes.
pub fn flag_offset(block: usize, rank: usize) -> usize {
    (block * MAX_RANKS + rank) * 4
}

/// Where region `r` of slot `slot` starts in a buffer, in bytes.
pub fn region_offset(slot: usize, world: usize, r: usize, region: usize) -> usize {
    DATA_OFFSET + (slot * world + r) * region * 4
}

/// The number of the call after `last` (`ar_next`): 1, 2, …, 2^32 − 2, then 1 again. Never 0,
/// which a zeroed line holds, and an even cycle, so the slots (`call & 1`) alternate across it.
pub fn next_call(last: u32) -> u32 {
    if last >= u32::MAX - 1 { 1 } else { last + 1 }
}

/// Whether a vector of `n` floats travels in LL lines.
pub fn in_lines(n: usize) -> bool {
    n <= LL_FLOATS
}

/// Where region `r` of LL slot `slot` starts in a buffer, in bytes (past the plain slots).
pub fn ll_offset(slot: usize, world: usize, r: usize, region: usize) -> usize {
    DATA_OFFSET + 2 * world * region * 4 + (slot * world + r) * LL_FLOATS / 2 * LL_LINE
}

/// A piece as the LL lines of call `call` carry it, in u32 words: each value followed by the
/// call's number.
pub fn ll_words(piece: &[f32], call: u32) -> Vec<u32> {
    piece.iter().flat_map(|v| [v.to_bits(), call]).collect()
}

/// The reference: the ranks' pieces added in rank order, in f32, as the kernel and
/// `dist::collective::all_reduce_sum` add them.
pub fn sum_in_rank_order(pieces: &[Vec<f32>]) -> Vec<f32> {
    let mut sum = pieces.first().cloned().unwrap_or_default();
    for p in &pieces[1.min(pieces.len())..] {
        for (s, v) in sum.iter_mut().zip(p) {
            *s += v;
        }
    }
    sum
}
