//! The sum a tensor-parallel model takes of its ranks' partial products (o_proj's, the MLP's),
//! through the GPUs' peer memory in one launch ([`all_reduce.cu`](all_reduce.cu)).
//!
//! The same sum through NCCL is an all-gather, then additions in rank order
//! (`dist::collective::all_reduce_sum`): four launches and NCCL's protocol, 10–20 µs at a
//! decode step's few KiB, 72 times a gpt-oss-120b step. Here each rank pushes its piece into
//! every rank's buffer, raises a flag, waits for the others' flags and adds the pieces in rank
//! order: one launch of a few µs, captured in the decode graphs like any kernel. The additions
//! are the same f32 additions in the same order as the all-gather's, so the two give the same
//! bits (the fallback for vectors past a slot's size changes nothing), every rank holds the same
//! bits, and a row's sum does not depend on the batch. vLLM's and TensorRT-LLM's custom
//! all-reduces work the same way (one-shot over IPC buffers); this one keeps rank order where
//! they may add in another.
//!
//! Each rank's buffer (one allocation, shared with the other ranks as a CUDA IPC handle by
//! `dist::p2p`): a header of flags (`[BLOCKS][MAX_RANKS]` u32, raised by the ranks) and call
//! counts (`[BLOCKS]` u32, its own), then at [`DATA_OFFSET`] two slots of `world` regions of
//! `region` floats each: calls alternate between the slots, region `r` holds rank `r`'s piece.

#[cfg(feature = "cuda")]
mod gpu;
#[cfg(test)]
mod tests;

#[cfg(feature = "cuda")]
pub use gpu::{Peers, all_reduce_add_rms_norm, all_reduce_f32};

/// Ranks a buffer has flags for (`AR_MAX_RANKS` in all_reduce.cu).
pub const MAX_RANKS: usize = 8;
/// Blocks of every launch (`AR_BLOCKS`): each owns one chunk of the vector on every rank.
pub const BLOCKS: usize = 24;
/// Threads of a block (`AR_THREADS`).
pub const THREADS: usize = 512;
/// Where the slots start in a buffer (`AR_DATA_OFFSET`), past the header.
pub const DATA_OFFSET: usize = 4096;

const _: () = assert!((BLOCKS * MAX_RANKS + BLOCKS) * 4 <= DATA_OFFSET);

/// The bytes of a buffer whose regions hold `region` floats each, for `world` ranks.
pub fn buffer_bytes(world: usize, region: usize) -> usize {
    DATA_OFFSET + 2 * world * region * 4
}

/// Where the flag rank `rank` raises for block `block` sits in a buffer, in bytes.
pub fn flag_offset(block: usize, rank: usize) -> usize {
    (block * MAX_RANKS + rank) * 4
}

/// Where region `r` of slot `slot` starts in a buffer, in bytes.
pub fn region_offset(slot: usize, world: usize, r: usize, region: usize) -> usize {
    DATA_OFFSET + (slot * world + r) * region * 4
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
